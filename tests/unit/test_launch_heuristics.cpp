#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "astrai/runtime.hpp"
#include "kernel_src/kernel_params.h"
#include "runtime/families/decode_launch.hpp"
#include "runtime/launch_heuristics.hpp"
#include "runtime/validation.hpp"

using astrai::detail::decode_workspace_bytes;
using astrai::detail::DecodeSplitPlan;
using astrai::detail::plan_decode_splits;
using astrai::detail::prefill_prefers_wide_tiles;
using astrai::detail::merge_states_grid_size;
using astrai::detail::rotary_grid_size;

namespace {

bool same_plan(const DecodeSplitPlan& a, const DecodeSplitPlan& b) {
  return a.num_splits == b.num_splits && a.tokens_per_split == b.tokens_per_split;
}

long long ceil_div(long long a, long long b) { return (a + b - 1) / b; }

// The largest page-table capacity (max_pages_per_seq x page_size) that validation accepts.
constexpr long long kMaxCapacity = 2147467264LL;  // 2^31 - 2^14

astrai::PagedDecodeArgs paged_args(int batch, int page_size, int max_pages_per_seq) {
  astrai::PagedDecodeArgs args;
  args.batch = batch;
  args.n_heads = 8;
  args.n_kv_heads = 1;
  args.head_dim = 128;
  args.page_size = page_size;
  args.num_pages = 1;
  args.max_pages_per_seq = max_pages_per_seq;
  args.q = reinterpret_cast<const void*>(0x10000);
  args.k_cache = reinterpret_cast<const void*>(0x20000);
  args.v_cache = reinterpret_cast<const void*>(0x30000);
  args.page_table = reinterpret_cast<const std::int32_t*>(0x40000);
  args.seq_lens = reinterpret_cast<const std::int32_t*>(0x50000);
  args.out = reinterpret_cast<void*>(0x60000);
  return args;
}

}  // namespace

TEST_SUITE("launch_heuristics") {

TEST_CASE("split plans cover the table capacity in whole token blocks without empty splits") {
  int plans = 0;
  for (int batch : {1, 2, 3, 8, 32, 128, 512})
    for (int kv_heads : {1, 2, 8, 32})
      for (int head_tiles : {1, 2, 8})
        for (long long capacity : {1LL, 15LL, 64LL, 65LL, 1000LL, 4096LL, 32768LL, 131072LL,
                                   1LL << 21, kMaxCapacity})
          for (int sms : {1, 46, 108, 132}) {
            const DecodeSplitPlan plan = plan_decode_splits(batch, kv_heads, head_tiles, capacity, sms);
            CAPTURE(batch);
            CAPTURE(kv_heads);
            CAPTURE(head_tiles);
            CAPTURE(capacity);
            CAPTURE(sms);
            CAPTURE(plan.num_splits);
            CAPTURE(plan.tokens_per_split);
            ++plans;
            REQUIRE(plan.num_splits >= 1);
            REQUIRE(plan.num_splits <= astrai::kMaxSplits);
            REQUIRE(plan.tokens_per_split > 0);
            REQUIRE(plan.tokens_per_split % astrai::kDecodeBlockTokens == 0);
            REQUIRE(1LL * plan.num_splits * plan.tokens_per_split >= capacity);
            // The last split starts inside the table: no split is empty.
            REQUIRE(1LL * (plan.num_splits - 1) * plan.tokens_per_split < capacity);
            // The kernel computes split_begin + tokens_per_split in int.
            REQUIRE(1LL * plan.num_splits * plan.tokens_per_split <= std::numeric_limits<int>::max());
            // Never more splits than about four waves of resident CTAs need.
            const long long base = 1LL * batch * kv_heads * head_tiles;
            REQUIRE(plan.num_splits <= std::max(1LL, ceil_div(4LL * sms, base)));
          }
  CHECK(plans == 7 * 4 * 3 * 10 * 4);
}

TEST_CASE("the largest table validation accepts plans within 32-bit token arithmetic") {
  astrai::PagedDecodeArgs largest = paged_args(1, 1, static_cast<int>(kMaxCapacity));
  REQUIRE_NOTHROW(astrai::detail::resolve_paged_decode_args(largest));
  astrai::PagedDecodeArgs too_large = paged_args(1, 1, static_cast<int>(kMaxCapacity + 1));
  REQUIRE_THROWS_AS(astrai::detail::resolve_paged_decode_args(too_large), astrai::InvalidArgument);

  // Worst cases: one split (no slack but the rounding) and every split count up to kMaxSplits.
  for (int sms = 1; sms <= 200; ++sms) {
    for (long long capacity : {kMaxCapacity, kMaxCapacity - 1, kMaxCapacity - 64 * 255 + 1}) {
      const DecodeSplitPlan plan = plan_decode_splits(1, 1, 1, capacity, sms);
      CAPTURE(sms);
      CAPTURE(capacity);
      REQUIRE(plan.tokens_per_split > 0);
      REQUIRE(1LL * plan.num_splits * plan.tokens_per_split >= capacity);
      REQUIRE(1LL * plan.num_splits * plan.tokens_per_split <= std::numeric_limits<int>::max());
    }
  }
  const DecodeSplitPlan unsplit = plan_decode_splits(1024, 8, 1, kMaxCapacity, 132);
  CHECK(unsplit.num_splits == 1);
  CHECK(unsplit.tokens_per_split == kMaxCapacity);
}

TEST_CASE("a long table with few CTAs is split to fill the GPU at least once") {
  for (int sms : {46, 108, 132})
    for (int batch : {1, 2, 4})
      for (int kv_heads : {1, 2, 8}) {
        const long long base = 1LL * batch * kv_heads;
        const long long wanted = ceil_div(4LL * sms, base);
        const long long capacity = 1LL << 20;  // many more blocks than splits
        const DecodeSplitPlan plan = plan_decode_splits(batch, kv_heads, 1, capacity, sms);
        CAPTURE(sms);
        CAPTURE(batch);
        CAPTURE(kv_heads);
        CHECK(plan.num_splits > 1);
        CHECK(10 * plan.num_splits * base >= 9 * sms);  // at least 90% of one wave
        CHECK(plan.num_splits <= std::min<long long>(wanted, astrai::kMaxSplits));
      }
}

TEST_CASE("split plans are pinned for a few typical shapes") {
  // One sequence, one KV head, 132 resident CTAs, 2^20 tokens (16384 blocks): one full wave
  // of 132 splits of 125 blocks beats two waves of 256 splits of 64 blocks.
  DecodeSplitPlan plan = plan_decode_splits(1, 1, 1, 1 << 20, 132);
  CHECK(plan.num_splits == 132);
  CHECK(plan.tokens_per_split == 125 * 64);
  // 8 CTAs, 64 blocks: 16 splits of 4 blocks fill one wave (128 of 132); 32 splits of 2 would
  // need two waves.
  plan = plan_decode_splits(1, 8, 1, 4096, 132);
  CHECK(plan.num_splits == 16);
  CHECK(plan.tokens_per_split == 256);
  // Llama-3-8B decode at batch 64 x 8192 tokens with 3 CTAs per SM (396 resident): 512 CTAs
  // unsplit leave a second wave 30% full; 3 splits fill four waves almost exactly.
  plan = plan_decode_splits(64, 8, 1, 8192, 396);
  CHECK(plan.num_splits == 3);
  // A table of one block cannot be split.
  plan = plan_decode_splits(1, 1, 1, 64, 132);
  CHECK(plan.num_splits == 1);
  CHECK(plan.tokens_per_split == 64);
  // An empty table still gets one block.
  plan = plan_decode_splits(1, 1, 1, 0, 132);
  CHECK(plan.num_splits == 1);
  CHECK(plan.tokens_per_split == 64);
}

TEST_CASE("a batch that fills the GPU on its own runs unsplit") {
  for (int sms : {1, 46, 132}) {
    for (int head_tiles : {1, 2}) {
      // batch x kv_heads x head_tiles >= 2 x SMs.
      const int batch = 2 * sms;
      const DecodeSplitPlan plan = plan_decode_splits(batch, 1, head_tiles, 1LL << 20, sms);
      CAPTURE(sms);
      CHECK(plan.num_splits == 1);
      CHECK(plan.tokens_per_split >= (1 << 20));
      CHECK(decode_workspace_bytes(plan, batch, 8, 128) == 0);
    }
  }
  CHECK(plan_decode_splits(256, 8, 1, 32768, 132).num_splits == 1);
  CHECK(plan_decode_splits(1, 1, 1, 32768, 132).num_splits > 1);
}

TEST_CASE("the plan depends on the table capacity only, never on the current lengths") {
  // The same inputs always give the same plan.
  const DecodeSplitPlan first = plan_decode_splits(2, 4, 1, 8192, 108);
  for (int i = 0; i < 10; ++i) {
    plan_decode_splits(1 + i, 1, 1, 64LL * (i + 1), 46);  // unrelated calls in between
    CHECK(same_plan(plan_decode_splits(2, 4, 1, 8192, 108), first));
  }
  // Capacities inside the same 64-token block plan alike.
  CHECK(same_plan(plan_decode_splits(1, 2, 1, 1000, 132), plan_decode_splits(1, 2, 1, 1024, 132)));
  CHECK(same_plan(plan_decode_splits(1, 2, 1, 961, 132), plan_decode_splits(1, 2, 1, 1024, 132)));
  // One more token is one more block, which this shape spends on one more split.
  CHECK_FALSE(same_plan(plan_decode_splits(1, 2, 1, 1025, 132), plan_decode_splits(1, 2, 1, 1024, 132)));

  // Through the public API: the workspace size follows page_size x max_pages_per_seq, whatever
  // split of that product and whatever the sequence lengths are (they live on the device).
  const std::size_t reference = astrai::paged_decode_workspace_bytes(paged_args(2, 16, 256), 132);
  CHECK(reference > 0);
  CHECK(astrai::paged_decode_workspace_bytes(paged_args(2, 1, 4096), 132) == reference);
  CHECK(astrai::paged_decode_workspace_bytes(paged_args(2, 256, 16), 132) == reference);
  astrai::PagedDecodeArgs other_lengths = paged_args(2, 16, 256);
  other_lengths.seq_lens = reinterpret_cast<const std::int32_t*>(0x90000);
  other_lengths.num_pages = 4096;
  CHECK(astrai::paged_decode_workspace_bytes(other_lengths, 132) == reference);
  // It bounds the workspace of every plan the runtime can pick, whatever the occupancy.
  std::size_t largest = 0;
  for (int per_sm = 1; per_sm <= 16; ++per_sm) {
    const DecodeSplitPlan plan = plan_decode_splits(2, 1, 1, 4096, per_sm * 132);
    CHECK(reference >= decode_workspace_bytes(plan, 2, 8, 128));
    largest = std::max(largest, decode_workspace_bytes(plan, 2, 8, 128));
  }
  CHECK(reference == largest);
  // A larger table does change the plan.
  CHECK(astrai::paged_decode_workspace_bytes(paged_args(2, 16, 8), 132) != reference);
}

TEST_CASE("workspace is zero when unsplit and follows the documented formula otherwise") {
  DecodeSplitPlan unsplit;
  unsplit.num_splits = 1;
  unsplit.tokens_per_split = 4096;
  CHECK(decode_workspace_bytes(unsplit, 64, 32, 128) == 0);

  DecodeSplitPlan four;
  four.num_splits = 4;
  four.tokens_per_split = 128;
  // rows = 4 x 2 x 8 = 64; outputs 64 x 128 floats = 32768 bytes (already a multiple of 256);
  // LSEs 64 floats.
  CHECK(decode_workspace_bytes(four, 2, 8, 128) == 32768 + 256);

  DecodeSplitPlan three;
  three.num_splits = 3;
  three.tokens_per_split = 64;
  // rows = 9; outputs 9 x 32 x 4 = 1152 bytes, padded to 1280 so the LSEs start aligned; 36 bytes of LSEs.
  CHECK(decode_workspace_bytes(three, 1, 3, 32) == 1280 + 36);

  for (int splits : {2, 5, 17, 256})
    for (int batch : {1, 3, 64})
      for (int heads : {1, 7, 32})
        for (int head_dim : {32, 80, 256}) {
          DecodeSplitPlan plan;
          plan.num_splits = splits;
          plan.tokens_per_split = 64;
          const std::size_t rows = static_cast<std::size_t>(splits) * batch * heads;
          const std::size_t out_bytes = rows * head_dim * 4;
          const std::size_t padded = (out_bytes + 255) / 256 * 256;
          CAPTURE(splits);
          CAPTURE(batch);
          CAPTURE(heads);
          CAPTURE(head_dim);
          CHECK(decode_workspace_bytes(plan, batch, heads, head_dim) == padded + rows * 4);
          CHECK(padded % 256 == 0);
          CHECK(padded - out_bytes < 256);
        }
}

TEST_CASE("the merge_states grid takes 128 / (head_dim / 8) items a CTA up to 16 CTAs an SM") {
  CHECK(merge_states_grid_size(0, 128, 132) == 1);
  CHECK(merge_states_grid_size(8, 128, 132) == 1);    // 8 items of 16 vectors fill one CTA
  CHECK(merge_states_grid_size(9, 128, 132) == 2);
  CHECK(merge_states_grid_size(128, 8, 132) == 1);    // one thread an item
  CHECK(merge_states_grid_size(3, 1024, 132) == 3);   // an item a CTA
  CHECK(merge_states_grid_size(42, 24, 132) == 1);    // 3 vectors an item: 42 items a CTA
  CHECK(merge_states_grid_size(1LL << 40, 128, 132) == astrai::kMergeStatesCtasPerSm * 132);
  CHECK(merge_states_grid_size(1LL << 40, 128, 0) == astrai::kMergeStatesCtasPerSm);
  for (const int head_dim : {8, 64, 128, 512, 1024})
    for (const long long items : {1LL, 7LL, 1000LL, 1LL << 20}) {
      const long long per_cta = 128 / (head_dim / 8);
      const int grid = merge_states_grid_size(items, head_dim, 132);
      CAPTURE(head_dim);
      CAPTURE(items);
      CHECK(grid >= 1);
      CHECK(grid <= astrai::kMergeStatesCtasPerSm * 132);
      if (grid < astrai::kMergeStatesCtasPerSm * 132) {
        CHECK(per_cta * grid >= items);
        CHECK(per_cta * (grid - 1) < items);
      }
    }
}

TEST_CASE("the rotary grid covers the vectors up to a cap of a few waves") {
  CHECK(rotary_grid_size(0, 132) == 1);
  CHECK(rotary_grid_size(1, 132) == 1);
  CHECK(rotary_grid_size(256, 132) == 1);
  CHECK(rotary_grid_size(257, 132) == 2);
  CHECK(rotary_grid_size(256LL * 100, 132) == 100);
  CHECK(rotary_grid_size(1LL << 40, 132) == 8 * 132);
  CHECK(rotary_grid_size(1LL << 40, 0) == 8);  // an unknown SM count still gives a grid
  CHECK(rotary_grid_size(1LL << 40, -5) == 8);
  for (long long vectors : {1LL, 255LL, 1000LL, 65536LL, 270336LL, 1LL << 30})
    for (int sms : {1, 46, 132}) {
      const int grid = rotary_grid_size(vectors, sms);
      CAPTURE(vectors);
      CAPTURE(sms);
      CHECK(grid >= 1);
      CHECK(grid <= 8 * sms);
      if (grid < 8 * sms) {
        CHECK(256LL * grid >= vectors);        // one thread per vector
        CHECK(256LL * (grid - 1) < vectors);   // no idle CTA
      }
    }
}

TEST_CASE("the Hopper prefill takes 192-row tiles on the measured large grids and 128-row ones on small") {
  // 32 heads on the H200's 132 SMs, the shapes both tilings were timed on
  // (docs/decisions/0011-wide-prefill-tiles.md).
  auto wide = [](int q, int heads, int batch, int sms) {
    return prefill_prefers_wide_tiles(q, 1LL * q * batch, heads, batch, sms, 128, 192);
  };
  CHECK(wide(4096, 32, 4, 132));          // 2816 wide tiles (21 waves): faster wide
  CHECK(wide(8192, 32, 2, 132));          // 2752: faster wide
  CHECK(wide(12288, 32, 1, 132));         // 2048 (15.5 waves): faster wide
  CHECK(wide(8192, 32, 1, 132));          // 1376 (10.4 waves): a tie in bursts, faster at the power cap
  CHECK_FALSE(wide(4096, 32, 1, 132));    // 704 (5.3 waves): -4% to -6% wide
  CHECK_FALSE(wide(4224, 32, 1, 132));    // 704: -5% wide
  CHECK_FALSE(wide(2048, 32, 1, 132));    // 352 (2.7 waves): -3% wide
  CHECK_FALSE(wide(512, 32, 1, 132));     // 96 tiles: -28% wide
  // Rows a short query leaves empty: q 200 pads to 384 rows wide, 256 narrow, however large the grid.
  CHECK_FALSE(wide(200, 32, 4096, 132));
  CHECK(wide(384, 32, 4096, 132));  // 384 rows either way
  // The wave bound: 10 waves of wide tiles exactly (33 tiles x 40 heads on 132 SMs), and one SM more.
  CHECK(wide(192 * 33, 40, 1, 132));
  CHECK_FALSE(wide(192 * 33, 40, 1, 133));
  // Ragged requests keep the narrow tiles: every short one would pad a 192-row tile.
  CHECK(prefill_prefers_wide_tiles(8192, 14746, 32, 2, 132, 128, 192));        // 90% of 2 x 8192 rows
  CHECK_FALSE(prefill_prefers_wide_tiles(8192, 14745, 32, 2, 132, 128, 192));  // just under
  CHECK_FALSE(prefill_prefers_wide_tiles(8192, 8192 + 64 * 31, 32, 32, 132, 128, 192));
  // Nothing to launch, or an unknown device: the default tiling.
  for (int bad : {0, -1}) {
    CHECK_FALSE(wide(bad, 32, 4, 132));
    CHECK_FALSE(wide(4096, bad, 4, 132));
    CHECK_FALSE(wide(4096, 32, bad, 132));
    CHECK_FALSE(wide(4096, 32, 4, bad));
    CHECK_FALSE(prefill_prefers_wide_tiles(4096, 4096, 32, 1, 132, bad, 192));
  }
  // No overflow at the limits of the arguments.
  CHECK(prefill_prefers_wide_tiles(1 << 30, (1LL << 30) * (1 << 20), 1024, 1 << 20, 132, 128, 192) ==
        (((1LL << 30) + 191) / 192 * 192 * 100 <= ((1LL << 30) + 127) / 128 * 128 * 104));
}

TEST_CASE("the prefill tiling switch overrides the grid, and head dims without a wide tiling never take it") {
  using astrai::detail::TileChoice;
  using astrai::detail::prefill_sm90_takes_wide_tiles;
  // A large grid (B4 x 4096, 32/8 heads) and a small one (B1 x 512).
  for (int head_dim : {64, 128, 256}) {
    const bool has_wide = head_dim == 128;
    CHECK(prefill_sm90_takes_wide_tiles(TileChoice::automatic, head_dim, 4096, 4 * 4096, 32, 8, 4, 132) == has_wide);
    CHECK_FALSE(prefill_sm90_takes_wide_tiles(TileChoice::automatic, head_dim, 512, 512, 32, 8, 1, 132));
    CHECK(prefill_sm90_takes_wide_tiles(TileChoice::wide, head_dim, 512, 512, 32, 8, 1, 132) == has_wide);
    CHECK_FALSE(prefill_sm90_takes_wide_tiles(TileChoice::narrow, head_dim, 4096, 4 * 4096, 32, 8, 4, 132));
  }
  // The automatic choice is prefill_prefers_wide_tiles's with the kernel's own tile heights.
  CHECK(prefill_sm90_takes_wide_tiles(TileChoice::automatic, 128, 192 * 33, 192 * 33, 40, 40, 1, 132));
  CHECK_FALSE(prefill_sm90_takes_wide_tiles(TileChoice::automatic, 128, 192 * 33, 192 * 33, 40, 40, 1, 133));
  // ... on the grid the kernel launches: 100 prompts of 96 tokens, 32/8 heads. One head's 96 rows
  // fill half a wide tile (so the narrow tiling wins on padding); packed, a KV head's 384 rows
  // fill 2 wide tiles or 3 narrow ones, 1600 wide CTAs (over 10 waves).
  CHECK(prefill_sm90_takes_wide_tiles(TileChoice::automatic, 128, 96, 9600, 32, 8, 100, 132));
  CHECK_FALSE(prefill_sm90_takes_wide_tiles(TileChoice::automatic, 128, 96, 9600, 32, 32, 100, 132));
}

TEST_CASE("the Hopper decode takes wide CTAs when its columns fit one wave and split 2 to 4 ways") {
  using astrai::detail::decode_takes_wide_ctas;
  using astrai::detail::TileChoice;
  using astrai::detail::wide_cta_plan;
  const auto plan = [](int splits) {
    DecodeSplitPlan p;
    p.num_splits = splits;
    p.tokens_per_split = 1024;
    return p;
  };
  // hd64 24/4 B32 x 4096: 128 columns on 132 SMs, the planner's 4 splits.
  CHECK(decode_takes_wide_ctas(TileChoice::automatic, plan(4), 128, 132, 4));
  CHECK(decode_takes_wide_ctas(TileChoice::automatic, plan(2), 132, 132, 4));
  CHECK_FALSE(decode_takes_wide_ctas(TileChoice::automatic, plan(4), 133, 132, 4));  // two waves
  CHECK_FALSE(decode_takes_wide_ctas(TileChoice::automatic, plan(1), 128, 132, 4));  // unsplit
  CHECK_FALSE(decode_takes_wide_ctas(TileChoice::automatic, plan(16), 8, 132, 4));   // batch 1
  CHECK(decode_takes_wide_ctas(TileChoice::wide, plan(1), 4096, 132, 4));
  CHECK_FALSE(decode_takes_wide_ctas(TileChoice::narrow, plan(4), 128, 132, 4));
  // A wide CTA's splits cover the capacity in whole blocks, in `wide_splits` parts.
  for (long long capacity : {1LL, 63LL, 64LL, 65LL, 4096LL, 4097LL, kMaxCapacity}) {
    CAPTURE(capacity);
    const DecodeSplitPlan wide = wide_cta_plan(capacity, 4);
    CHECK(wide.num_splits == 4);
    CHECK(wide.tokens_per_split % astrai::kDecodeBlockTokens == 0);
    CHECK(4LL * wide.tokens_per_split >= capacity);
    CHECK(4LL * (wide.tokens_per_split - astrai::kDecodeBlockTokens) < capacity);
  }
}

TEST_CASE("a divisor fixed at launch divides exactly by multiply and shift, for dividends below 2^31") {
  std::mt19937 rng(7);
  std::vector<unsigned> divisors = {1, 2, 3, 5, 6, 7, 11, 24, 96, 641, 65535, 65536, 65537, 1u << 30, (1u << 31) - 1,
                                    1u << 31};
  for (int i = 0; i < 200; ++i) divisors.push_back(1 + rng() % 0x7fffffffu);
  for (const unsigned divisor : divisors) {
    CAPTURE(divisor);
    const astrai::FastDivisor fast = astrai::make_fast_divisor(divisor);
    std::vector<unsigned> dividends = {0, 1, divisor - 1, divisor, 0x7ffffffeu, 0x7fffffffu};
    if (divisor < 0x40000000u) {
      dividends.push_back(divisor + 1);
      dividends.push_back(2 * divisor - 1);
      dividends.push_back(0x7fffffffu / divisor * divisor);
      dividends.push_back(0x7fffffffu / divisor * divisor - 1);
    }
    for (int i = 0; i < 2000; ++i) dividends.push_back(rng() % 0x80000000u);
    int wrong = 0;
    for (const unsigned dividend : dividends)
      if (dividend < 0x80000000u && astrai::fast_divide(dividend, fast) != dividend / divisor) ++wrong;
    CHECK(wrong == 0);
  }
}

TEST_CASE("causal prefill grids through the launch's divisors: heads and requests split as the grid has them") {
  for (const unsigned tiles : {1u, 4u, 11u, 22u, 43u})
    for (const unsigned heads : {1u, 3u, 12u})
      for (const unsigned batch : {1u, 5u, 16u}) {
        CAPTURE(tiles);
        CAPTURE(heads);
        CAPTURE(batch);
        const astrai::PrefillTileOrder order = astrai::prefill_tile_order(tiles, heads, batch);
        bool same = true;
        for (unsigned id = 0; id < tiles * heads * batch; ++id) {
          const auto want = astrai::prefill_causal_tile_place(static_cast<long long>(id), static_cast<int>(tiles),
                                                              static_cast<long long>(heads * batch));
          const auto got = astrai::prefill_causal_tile_place(id, order);
          const unsigned batch_index = astrai::fast_divide(got.row, order.heads);
          if (got.position != want.position || got.row != want.row || batch_index != want.row / heads ||
              got.row - batch_index * heads != want.row % heads)
            same = false;
        }
        CHECK(same);
      }
}

TEST_CASE("causal prefill grids take every tile once, heaviest bands first, a band's rows one after another") {
  const int band_count = astrai::kPrefillCausalBands;
  for (const int tiles : {1, 2, 3, 5, 11, 22, 43, 64}) {
    for (const long long rows : {1LL, 3LL, 32LL, 128LL}) {
      CAPTURE(tiles);
      CAPTURE(rows);
      std::vector<int> seen(static_cast<std::size_t>(tiles * rows), 0);
      int highest_rank = -1;  // rank: the place in the order of falling weight (the diagonal's first)
      long long previous_row = 0;
      bool rows_together = true;
      bool heaviest_first = true;
      bool in_grid = true;
      bool same_in_32_bits = true;
      bool same_through_divisors = true;
      for (long long id = 0; id < tiles * rows; ++id) {
        const astrai::PrefillTilePlace<long long> place = astrai::prefill_causal_tile_place(id, tiles, rows);
        // The kernels' 32-bit form (grids under 2^32 CTAs) places every CTA the same.
        const astrai::PrefillTilePlace<unsigned> narrow =
            astrai::prefill_causal_tile_place<unsigned>(static_cast<unsigned>(id), tiles, static_cast<unsigned>(rows));
        if (narrow.position != place.position || narrow.row != place.row) same_in_32_bits = false;
        // And through the launch's divisors (rows taken as heads x 1 request).
        const astrai::PrefillTilePlace<unsigned> fast = astrai::prefill_causal_tile_place(
            static_cast<unsigned>(id), astrai::prefill_tile_order(tiles, static_cast<unsigned>(rows), 1));
        if (fast.position != place.position || fast.row != place.row) same_through_divisors = false;
        if (place.position < 0 || place.position >= tiles || place.row < 0 || place.row >= rows) {
          in_grid = false;
          continue;
        }
        ++seen[static_cast<std::size_t>(place.row * tiles + place.position)];
        const int rank = tiles - 1 - place.position;
        // Within a band the rows come one after another; the row goes back only where the
        // next band starts, at ranks past all that came before.
        if (place.row < previous_row && rank <= highest_rank) rows_together = false;
        // No tile starts a band or more ahead of the heaviest-first order.
        if (rank - id / rows >= (tiles + band_count - 1) / band_count) heaviest_first = false;
        highest_rank = std::max(highest_rank, rank);
        previous_row = place.row;
      }
      REQUIRE(in_grid);
      CHECK(rows_together);
      CHECK(heaviest_first);
      CHECK(same_in_32_bits);
      CHECK(same_through_divisors);
      CHECK(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
      CHECK(astrai::prefill_causal_tile_place(0LL, tiles, rows).position == tiles - 1);
    }
  }
}

}  // TEST_SUITE

TEST_CASE("a caller's workspace caps the split count to what it holds, covering the whole span") {
  using astrai::detail::cap_decode_splits;

  for (const long long span : {64LL, 1000LL, 4096LL, 32768LL, 131072LL}) {
    const auto plan = plan_decode_splits(1, 4, 1, span, 132 * 4);
    const std::size_t need = decode_workspace_bytes(plan, 1, 24, 64);
    for (const std::size_t bytes : {need, need / 2, need / 5, std::size_t{1000}, std::size_t{0}}) {
      CAPTURE(span);
      CAPTURE(bytes);
      const auto capped = cap_decode_splits(plan, span, bytes, 1, 24, 64);
      CHECK(capped.num_splits <= plan.num_splits);
      CHECK(decode_workspace_bytes(capped, 1, 24, 64) <= bytes);
      // Every token of the span is in some split, and no split is empty.
      CHECK(1LL * capped.num_splits * capped.tokens_per_split >= span);
      CHECK(1LL * (capped.num_splits - 1) * capped.tokens_per_split < std::max(span, 1LL));
      CHECK(capped.tokens_per_split % astrai::kDecodeBlockTokens == 0);
      if (bytes >= need) CHECK(capped.num_splits == plan.num_splits);
    }
  }
}

TEST_CASE("the split workspace's layout fits what decode_workspace_bytes sized, outputs then aligned LSEs") {
  for (int head_dim : {64, 128, 512}) {
    for (int splits : {2, 7, 256}) {
      for (int rows : {1, 3, 40}) {
        CAPTURE(head_dim);
        CAPTURE(splits);
        CAPTURE(rows);
        DecodeSplitPlan plan;
        plan.num_splits = splits;
        plan.tokens_per_split = 64;
        const std::size_t bytes = decode_workspace_bytes(plan, rows, 1, head_dim);
        const CUdeviceptr base = 1 << 20;
        const astrai::SplitWorkspace ws = astrai::detail::split_workspace_at(base, splits, rows, head_dim);
        const auto out = reinterpret_cast<std::uintptr_t>(ws.partial_out);
        const auto lse = reinterpret_cast<std::uintptr_t>(ws.partial_lse);
        CHECK(out == base);
        CHECK(ws.num_splits == splits);
        CHECK((lse - base) % 256 == 0);
        CHECK(lse - base >= static_cast<std::uintptr_t>(splits) * rows * head_dim * 4);  // the outputs fit
        CHECK(lse + static_cast<std::uintptr_t>(splits) * rows * 4 == base + bytes);       // the LSEs end it
      }
    }
  }
}
