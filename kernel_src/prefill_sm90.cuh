// Prefill attention on Hopper (sm_90a): TMA loads into an mbarrier ring, wgmma for S = Q K^T and
// O += P V, a producer warpgroup and two consumer warpgroups (three at hd64, and in hd128's wide
// tiling). Computes what prefill.cuh's kernel computes (same PrefillParams, same row limits, zeros
// and LSE -inf for empty rows) without a mask, for contiguous KV (kPageSize 0) and paged KV with
// pages of 8 tokens or more; head dims that are multiples of 64.
//
// Grid: (ceil(q_len / kBlockM), n_heads, batch), in prefill.cuh's tile order; with packed GQA
// (hopper_params.h) (ceil(q_len x pack / kBlockM), n_heads / pack, batch); persistent variants
// (kPersistent, below) a CTA an SM walking that grid's tiles. 128 threads a warpgroup.
// Warpgroup 0 (prefill_sm90_producer_regs registers) has one thread issue TMA loads: Q once (before
// the CTA's first barrier, with the first K block when KV is contiguous), then K and V blocks of
// kBlockN tokens from the last block the tile can see down to the first (blocks crossing the causal
// diagonal or the end of the KV come first, so they alone are masked), V one block behind K, each
// into a two-stage ring whose full/empty mbarriers pace producer and consumers. The kConsumers
// warpgroups after it (2 or 3, hopper_params.h) own 64 query rows each (those whose rows all lie
// past the request's end leave at once). Per block: S = Q K^T is issued, then O += P V for the
// previous block, waited for after the softmax of S (sm90::pin_wait_after keeps ptxas from moving
// the wait up; not at hd64, where waiting early is faster); the softmax also hides behind the other
// consumers' GEMMs: they take turns issuing (round robin). The walk's first block (the KV's end, or
// the causal diagonal) is cut to the columns the tile's rows see, in steps of 64. O leaves through
// the consumer's rows of the Q tile, as 16-byte pieces of whole rows.
// kConsumersArg and kBlockNArg override the tiling (hopper_params.h) for tuning.
// Tiles in shared memory use the 128-byte swizzle (hopper_ptx.cuh). Rows and KV positions past
// the tensor arrive as zeros (TMA fill), so they cannot produce NaN.
#pragma once

#include "hopper_params.h"
#include "hopper_ptx.cuh"
#include "prefill.cuh"

namespace astrai {

template <typename T> struct IsFp16 { static constexpr bool value = false; };
template <> struct IsFp16<fp16_t> { static constexpr bool value = true; };
// A number as a type, for generic lambdas (a GEMM's width or a tile's piece, known at compile time).
template <int N> struct Constant { static constexpr int value = N; };

// Diagnostics: with ASTRAI_PREFILL_TRACE defined (to the number of CTAs traced; only
// astrai-sm90-check --trace does so, never the runtime), each CTA writes SM clock stamps of its
// phases and its SM id, so the check tool can say where a tile's time goes.
#ifdef ASTRAI_PREFILL_TRACE
// C linkage: the check tool looks the array up by its plain name.
// Slots: 0 start, 1 Q and the first K block arrived, 2 first softmax done, 3 last P V done, 4-6 each
// consumer's stores issued, 7 the SM, 8 Q issued, 9 the first K block issued, 10 consumer 0 ready to
// wait for them, 11 Q arrived, 12 the tile placed (thread 0 about to set up the barriers), 13 the
// barriers set up.
extern "C" __device__ unsigned long long astrai_prefill_trace[ASTRAI_PREFILL_TRACE][14];
// Stamp `slot` of the CTA's tile with `value` (slot 0 also records the SM).
__device__ __forceinline__ void prefill_trace(int slot, unsigned long long value) {
  const unsigned index = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  if (index >= ASTRAI_PREFILL_TRACE) return;
  astrai_prefill_trace[index][slot] = value;
  if (slot == 0) {
    unsigned sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    astrai_prefill_trace[index][7] = sm;
  }
}
// A clock read kept in a register, for stamps whose stores would otherwise delay what they time.
#define ASTRAI_PREFILL_CLOCK(name) const unsigned long long name = clock64()
#define ASTRAI_PREFILL_STAMP_AT(condition, slot, value) \
  do {                                                  \
    if (condition) prefill_trace(slot, value);          \
  } while (0)
#else
#define ASTRAI_PREFILL_CLOCK(name) \
  do {                             \
  } while (0)
#define ASTRAI_PREFILL_STAMP_AT(condition, slot, value) \
  do {                                                  \
  } while (0)
#endif
#define ASTRAI_PREFILL_STAMP(condition, slot) ASTRAI_PREFILL_STAMP_AT(condition, slot, clock64())

// Tensor maps (128-byte swizzle, boxes 64 elements wide):
//   map_q: contiguous {head_dim, q_len, n_heads, batch}, paged {head_dim, total_q, n_heads, 1};
//          box {64, kBlockM, 1, 1}. Packed GQA: {head_dim, n_heads, q_len or total_q, batch or 1},
//          box {64, pack, kBlockM / pack, 1}.
//   map_k, map_v: contiguous {head_dim, kv_len, n_kv_heads, batch}, box {64, kBlockN, 1, 1}.
//   map_k paged: {head_dim, n_kv_heads, page_size, num_pages}, box {64, 1, R, 1}, R = min(page_size, 16).
//   map_v paged: {64, page_size, head_dim / 64, n_kv_heads, num_pages} (the third dim steps 64
//          columns), box {64, R, head_dim / 64, 1, 1}: one box brings R whole rows.
// Shared-memory tiles: Q and K [chunk][row][128 B]; V contiguous the same, V paged [box][chunk]
// [R rows][128 B] (half the boxes of K at hd128; P V's descriptors step through either).
// kPersistent (contiguous KV, three consumers, no features): the launch holds a CTA an SM or
// fewer, and each CTA walks tiles of p.tile_order's grid in prefill_tile_at's order
// (persistent_tile below). Q has two slots, so that the next tile's Q and first K blocks load
// while this tile's last blocks and stores run: short causal prompts (AstrAI's B16 x 1024) spent
// 17-18% of their cycles waiting for a tile's first loads (runs 157-161).
template <typename T, int kHeadDim, int kPageSize, int kGroup, int kConsumersArg = prefill_sm90_consumers(kHeadDim),
          int kBlockNArg = prefill_sm90_block_n(kHeadDim, kConsumersArg), int kFlags = 0, bool kPersistent = false>
__global__ void __launch_bounds__(prefill_sm90_threads(kConsumersArg), 1)
    prefill_sm90_kernel(const __grid_constant__ PrefillParams p,
                        const __grid_constant__ sm90::TmaMap map_q,
                        const __grid_constant__ sm90::TmaMap map_k,
                        const __grid_constant__ sm90::TmaMap map_v) {
  using namespace sm90;
  ASTRAI_PREFILL_CLOCK(trace_start);  // the CTA starts (stored by thread 0 once Q is issued)
  // The maps' descriptors are fetched first: every load of the tile waits for them.
  if (threadIdx.x == 0) {
    tma_prefetch_map(&map_q);
    tma_prefetch_map(&map_k);
    tma_prefetch_map(&map_v);
  }
  using Shape = PrefillSm90Shape<kHeadDim, kConsumersArg, kBlockNArg>;
  constexpr int kConsumers = Shape::kConsumers;
  constexpr int kBlockM = Shape::kBlockM;
  constexpr int kBlockN = Shape::kBlockN;
  constexpr int kStages = Shape::kStages;
  constexpr int kChunks = Shape::kChunks;
  constexpr bool kFp16 = IsFp16<T>::value;
  // Tokens per TMA box of paged K and V (a box never crosses a page).
  constexpr int kBoxRows = kPageSize == 0 ? kBlockN : (kPageSize < 16 ? kPageSize : 16);
  constexpr int kBoxes = kBlockN / kBoxRows;
  static_assert(kBoxes <= 32 && kBlockN % kBoxRows == 0, "paged boxes");
  constexpr bool kCap = has_feature<kFlags>(kFeatureSoftCap);
  constexpr bool kWindow = has_feature<kFlags>(kFeatureWindow);
  static_assert((kFlags & ~prefill_sm90_features()) == 0, "features of the Hopper prefill");
  // Packed GQA (hopper_params.h): tile row R is query head R % kPackHeads of the CTA's pack at
  // position R / kPackHeads; the grid's second dimension then walks packs of heads.
  constexpr int kPackHeads = prefill_sm90_pack_heads(kGroup);
  constexpr bool kPack = kPackHeads > 1;
  static_assert(!kPersistent || prefill_sm90_persistent(kPageSize, kConsumers, kFlags),
                "persistent CTAs: contiguous KV, three consumers, no features (hopper_params.h)");
  constexpr int kQSlots = kPersistent ? 2 : 1;

  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem_q = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<unsigned long long>(smem_raw) + 1023) & ~1023ull);  // kQSlots tiles
  unsigned char* smem_k = smem_q + kQSlots * Shape::kQBytes;
  unsigned char* smem_v = smem_k + kStages * Shape::kKvBytes;
  u64* q_full = reinterpret_cast<u64*>(smem_v + kStages * Shape::kKvBytes);  // one a Q slot
  u64* k_full = q_full + kQSlots;
  u64* k_empty = k_full + kStages;
  u64* v_full = k_empty + kStages;
  u64* v_empty = v_full + kStages;
  unsigned* warp_words = reinterpret_cast<unsigned*>(v_empty + kStages);  // sm90::pin_wait_after's
  // Persistent: a Q slot's empty barrier (the consumers' stores are done with it).
  u64* q_empty = reinterpret_cast<u64*>(warp_words + prefill_sm90_threads(kConsumers) / 32);
  // Persistent: the CTA's k-th tile. Tiles come heaviest first; a CTA takes one from each row of
  // gridDim.x tiles, from the row's start and end in turn, so that the CTAs' shares weigh alike
  // (taking the same place in every row gave a CTA the heaviest tile of each band).
  const unsigned persistent_tiles = p.tile_order.tiles.divisor * p.tile_order.rows;
  auto persistent_tile = [&](int k) {
    return k * gridDim.x + (k % 2 == 0 ? blockIdx.x : gridDim.x - 1 - blockIdx.x);
  };

  // What a tile walks.
  struct TileWalk {
    PrefillTile cta;
    PrefillRequest r;
    int rows;           // the request's tile rows
    int last_position;  // of the tile's last row
    int n_blocks;       // blocks the tile's last row can see
    int mask_from;      // the first column some row of the tile cannot see
    int first_block, block_count, window_mask_until;
    int active;  // consumers with rows to compute
  };
  auto walk_of = [&](const PrefillTile& cta) {
    TileWalk w;
    w.cta = cta;
    w.r = prefill_request<kPageSize>(p, cta.batch_index);
    w.rows = w.r.q_len * kPackHeads;
    const int m0 = cta.start;
    w.last_position = (min(m0 + kBlockM, w.rows) - 1) / kPackHeads;
    w.n_blocks = (prefill_row_stop(w.r, w.last_position) + kBlockN - 1) / kBlockN;
    w.mask_from = prefill_row_stop(w.r, m0 / kPackHeads);
    // A window starts the walk at the first row's first key (block aligned); blocks before the
    // last row's first key are masked like the diagonal's. Rows whose window starts past the KV
    // leave nothing to walk.
    w.first_block =
        kWindow ? max(window_first_key(static_cast<long long>(w.r.causal_base) + m0 / kPackHeads, p.features), 0) /
                      kBlockN
                : 0;
    w.block_count = kPersistent && m0 >= w.rows ? 0 : w.n_blocks - w.first_block;
    w.window_mask_until =
        kWindow ? window_first_key(static_cast<long long>(w.r.causal_base) + w.last_position, p.features) : 0;
    // Consumers whose 64 rows all lie past the request's end (in the last tile of a length that
    // is not a multiple of kBlockM) have nothing to compute: they leave at once, and the stages'
    // empty barriers, the turns and the V tail's clearing count only the others. Computing those
    // rows anyway cost B4 x 4096 in 192-row tiles 3% of its MMAs, causal B2 x 8192 1.6%.
    // Persistent CTAs keep every consumer: the barriers' counts hold for all their tiles.
    w.active = kPersistent ? kConsumers : min(kConsumers, (w.rows - m0 + 63) / 64);
    return w;
  };
  // The CTA's tile (persistent: its first; the walks recompute it, not to hold it in registers).
  const TileWalk first = walk_of(kPersistent ? prefill_tile_at<kBlockM>(p, blockIdx.x) : prefill_tile<kBlockM>(p));
  if (!kPersistent && first.cta.start >= first.rows) return;

  // Q of tile `w` into slot `slot`. Packed: the map is {head_dim, heads, positions, batch}, its
  // box the pack's heads at kBlockM / kPackHeads positions, which lands as the tile's rows in
  // packed order.
  auto issue_q = [&](const TileWalk& w, int slot) {
    unsigned char* q = smem_q + slot * Shape::kQBytes;
    mbar_arrive_expect_tx(&q_full[slot], Shape::kQBytes);
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      if constexpr (kPack)
        tma_load_4d(q + c * kBlockM * 128, &map_q, &q_full[slot], 64 * c, w.cta.head * kPackHeads,
                    w.r.q_start + w.cta.start / kPackHeads, kPageSize == 0 ? w.cta.batch_index : 0);
      else
        tma_load_4d(q + c * kBlockM * 128, &map_q, &q_full[slot], 64 * c, w.r.q_start + w.cta.start, w.cta.head,
                    kPageSize == 0 ? w.cta.batch_index : 0);
    }
  };

  if (threadIdx.x == 0) {
    ASTRAI_PREFILL_CLOCK(trace_placed);
    for (int q = 0; q < kQSlots; ++q) {
      mbar_init(&q_full[q], 1);
      if constexpr (kPersistent) mbar_init(&q_empty[q], 128 * kConsumers);
    }
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&k_full[s], 1);
      mbar_init(&v_full[s], 1);
      mbar_init(&k_empty[s], 128 * first.active);
      mbar_init(&v_empty[s], 128 * first.active);
    }
    fence_mbar_init();
    ASTRAI_PREFILL_CLOCK(trace_barriers);
    // Q is issued by the thread that initialized its barrier, before the CTA's barrier and the
    // register hand-over: its latency is most of a short tile's start (run 157: 18% of the
    // cycles of AstrAI's B16 x 1024 rows). Persistent CTAs issue theirs in the producer's walk.
    if (!kPersistent && first.block_count > 0) {
      issue_q(first, 0);
      ASTRAI_PREFILL_STAMP(true, 8);  // Q issued
      // Contiguous KV: the walk's first K block too (stage 0, whose empty barrier is fresh).
      if constexpr (kPageSize == 0) {
        mbar_arrive_expect_tx(&k_full[0], Shape::kKvBytes);
#pragma unroll
        for (int c = 0; c < kChunks; ++c)
          tma_load_4d(smem_k + c * kBlockN * 128, &map_k, &k_full[0], 64 * c, (first.n_blocks - 1) * kBlockN,
                      first.cta.head / (kGroup / kPackHeads), first.cta.batch_index);
        ASTRAI_PREFILL_STAMP(true, 9);  // the first K block issued
      }
    }
    ASTRAI_PREFILL_STAMP_AT(true, 0, trace_start);
    ASTRAI_PREFILL_STAMP_AT(true, 12, trace_placed);
    ASTRAI_PREFILL_STAMP_AT(true, 13, trace_barriers);
  }
  __syncthreads();

  const int warpgroup = threadIdx.x / 128;
  if (warpgroup == 0) {
    setmaxnreg_dec<prefill_sm90_producer_regs(kConsumers, kPersistent)>();
    // Warp 0 produces; lane 0 issues every barrier operation. Contiguous KV: one box per
    // 64-column chunk and block, from lane 0. Paged KV: boxes of kBoxRows tokens (never across a
    // page), lane j looking up the page of box j and issuing it; pages past the KV length get id
    // -1, which TMA reads as zeros, like ids outside the pool.
    const int lane = threadIdx.x;
    if (threadIdx.x >= (kPersistent ? 64 : 32)) return;
    // The loads of tile `w`'s walk, whose first block takes ring step g.
    auto produce = [&](const TileWalk& w, int g) {
      const int batch_index = w.cta.batch_index;
      const int kv_head = w.cta.head / (kGroup / kPackHeads);  // kGroup / kPackHeads packs a KV head
      const PrefillRequest& r = w.r;
      const int n_blocks = w.n_blocks;
      const int block_count = w.block_count;
      const int* table_row = kPageSize == 0 ? nullptr : prefill_table_row(p, batch_index);
      // Page id of box `lane` of the block starting at `token` (contiguous: unused).
      auto box_page = [&](int token) {
        if constexpr (kPageSize == 0) {
          return 0;
        } else {
          const int box_token = token + lane * kBoxRows;
          return lane < kBoxes && box_token < r.kv_len ? prefill_page(p, table_row, box_token / kPageSize) : -1;
        }
      };
      // Step `it` walks block n_blocks - 1 - it. `is_v`: paged V's boxes bring whole rows.
      auto load_kv = [&](const TmaMap* map, unsigned char* ring, u64* full, u64* empty, int it, int page,
                         bool is_v) {
        const int s = (g + it) % kStages;
        const int token = (n_blocks - 1 - it) * kBlockN;
        unsigned char* stage = ring + s * Shape::kKvBytes;
        if (lane == 0) {
          mbar_wait(&empty[s], (((g + it) / kStages) & 1) ^ 1);
          mbar_arrive_expect_tx(&full[s], Shape::kKvBytes);
        }
        if constexpr (kPageSize == 0) {
          if (lane == 0)
#pragma unroll
            for (int c = 0; c < kChunks; ++c)
              tma_load_4d(stage + c * kBlockN * 128, map, &full[s], 64 * c, token, kv_head, batch_index);
        } else {
          // Each lane issues its own box: one thread issuing them all was the bottleneck.
          __syncwarp();
          const int row = (token + lane * kBoxRows) % kPageSize;
          if (lane < kBoxes && is_v) {
            tma_load_5d(stage + lane * kChunks * kBoxRows * 128, map, &full[s], 0, row, 0, kv_head, page);
          } else if (lane < kBoxes) {
#pragma unroll
            for (int c = 0; c < kChunks; ++c)
              tma_load_4d(stage + c * kBlockN * 128 + lane * kBoxRows * 128, map, &full[s], 64 * c, kv_head, row,
                          page);
          }
        }
      };
      // Page ids are fetched a block ahead: the lookup's latency hides behind the waits.
      int page = box_page((n_blocks - 1) * kBlockN);
      int previous_page = 0;
      for (int it = 0; it < block_count; ++it) {
        const int next_page = it + 1 < block_count ? box_page((n_blocks - 2 - it) * kBlockN) : 0;
        if (kPersistent || kPageSize != 0 || it > 0) load_kv(&map_k, smem_k, k_full, k_empty, it, page, false);
        ASTRAI_PREFILL_STAMP(kPageSize != 0 && it == 0 && lane == 0, 9);  // the first K block issued
        if (it > 0) load_kv(&map_v, smem_v, v_full, v_empty, it - 1, previous_page, true);
        previous_page = page;
        page = next_page;
      }
      load_kv(&map_v, smem_v, v_full, v_empty, block_count - 1, previous_page, true);
    };
    if constexpr (!kPersistent) {
      if (first.block_count > 0) produce(first, 0);
    } else if (threadIdx.x == 32) {
      // Warp 1 loads Q: tile k's into slot k % 2 as soon as the consumers' stores of tile k - 2
      // have left it, early in tile k - 1's walk.
      for (int k = 0; persistent_tile(k) < persistent_tiles; ++k) {
        const int slot = k % 2;
        mbar_wait(&q_empty[slot], ((k / 2) & 1) ^ 1);
        const TileWalk w = walk_of(prefill_tile_at<kBlockM>(p, persistent_tile(k)));
        if (w.block_count > 0)
          issue_q(w, slot);
        else
          mbar_arrive(&q_full[slot]);  // nothing to walk: the consumers only store
      }
    } else if (lane == 0) {
      // Warp 0 streams K and V through the ring, tile after tile.
      int g = 0;
      for (int k = 0; persistent_tile(k) < persistent_tiles; ++k) {
        const TileWalk w = walk_of(prefill_tile_at<kBlockM>(p, persistent_tile(k)));
        if (w.block_count > 0) produce(w, g);
        g += w.block_count;
      }
    }
    return;
  }

  if (!kPersistent && warpgroup > first.active) return;
  setmaxnreg_inc<Shape::kConsumerRegs>();
  // Tile `w`, whose Q is in slot `slot` (its barrier's phase `q_parity`) and whose walk's first
  // block takes ring step g.
  auto consume = [&](const TileWalk& w, int g, int slot, unsigned q_parity) {
    const PrefillTile& cta = w.cta;
    const int batch_index = cta.batch_index;
    const PrefillRequest& r = w.r;
    const int rows = w.rows;
    const int m0 = cta.start;
    const int last_position = w.last_position;
    const int n_blocks = w.n_blocks;
    const int mask_from = w.mask_from;
    const int block_count = w.block_count;
    const int window_mask_until = w.window_mask_until;
    const int active = w.active;
    const int first_stage = g % kStages;  // the walk's first block's
    unsigned char* const q_tile = smem_q + slot * Shape::kQBytes;
    // The query head of tile row `row` (the pack's first head cta.head x kPackHeads), and its
    // position.
    auto row_head = [&](int row) { return cta.head * kPackHeads + row % kPackHeads; };
    auto row_position = [](int row) { return row / kPackHeads; };
    // Round robin: the active consumers take turns issuing their GEMMs (named barrier 1 + c is
    // consumer c's turn, 256 threads: it waits, its predecessor arrives), so that one's softmax
    // runs while the others' wgmmas keep the tensor cores busy. Consumer 0 goes first; one alone
    // takes no turns. Barrier kConsumers + 1 joins the active consumers.
    const int consumer = warpgroup - 1;
    const bool alone = active == 1;
    auto await_turn = [&] {
      if (!alone) named_bar_sync(1 + consumer, 256);
    };
    auto pass_turn = [&] {
      if (!alone) named_bar_arrive(consumer + 1 == active ? 1 : 2 + consumer, 256);
    };
    const int t = threadIdx.x % 128;
    const int lane = t % 32;
    const int row0 = m0 + 64 * consumer + 16 * (t / 32) + lane / 4;  // and row0 + 8
    const int stop[2] = {prefill_row_stop(r, row_position(row0)), prefill_row_stop(r, row_position(row0 + 8))};
    int first_key[2] = {0, 0};  // window: the first key each row attends to
    if (kWindow)
      for (int h = 0; h < 2; ++h)
        first_key[h] =
            window_first_key(static_cast<long long>(r.causal_base) + row_position(row0 + 8 * h), p.features);
    // Scores arrive raw; with a soft-cap they leave the cap already in log2 units.
    const float score_scale = kCap ? 1.f : p.scale_log2;

    float o[kHeadDim / 2];
    float s[kBlockN / 2];
    unsigned pa[kBlockN / 16][4];
    float row_max[2] = {negative_infinity(), negative_infinity()};
    float row_sum[2] = {0.f, 0.f};
#pragma unroll
    for (int i = 0; i < kHeadDim / 2; ++i) o[i] = 0.f;

    // The walk's first block holds the last column the tile's last row sees; every column after
    // it is masked for every row, so that block's GEMMs stop at the next multiple of 64 (a 4096-token
    // KV in 192-token blocks would otherwise spend 3% of its MMAs on a block two-thirds empty). The
    // width is the tile's, not each consumer's: all consumers then run the same step (a width per
    // consumer was slower, and synccheck flagged a barrier it split; docs/device-notes.md, run 66).
    // Both GEMMs of that block go in 64-column pieces, each its own group, so one copy of the step
    // serves every width (a copy per width cost NVRTC 0.3 s at hd128; a branch in the loop's step
    // instead cost 1-7%, run 81). 80-token blocks (hd256, the wide hd128 tiles) cut their P V to
    // 64 or keep all 80: left whole, they ran 3-5% slower (run 83). The soft-cap's variants keep
    // whole blocks (they spilled with the cut).
    // Persistent CTAs keep whole blocks too: the tile loop's state and the cut spilled S at hd64.
    constexpr bool kCutFirst = !kCap && !kPersistent;
    const int first_width =
        kCutFirst ? min(kBlockN, (prefill_row_stop(r, last_position) - (n_blocks - 1) * kBlockN + 63) / 64 * 64)
                  : kBlockN;
    const unsigned q_base = shared_address(q_tile) + consumer * 64 * 128;
    // S = Q K^T of the block in `stage`, columns `first_col` .. + width (registers first_col / 2 ..
    // of s; the others keep what they held).
    auto issue_qk = [&](int stage, auto width, auto first_col) {
      constexpr int kFirstCol = decltype(first_col)::value;
      const unsigned k_base = shared_address(smem_k + stage * Shape::kKvBytes) + kFirstCol * 128;
      reg_fence(s);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kHeadDim / 16; ++kk) {
        const unsigned offset = (kk % 4) * 32;
        wgmma_ss<decltype(width)::value, kFp16, kFirstCol / 2>(
            s, smem_desc(q_base + (kk / 4) * kBlockM * 128 + offset, 16, 1024),
            smem_desc(k_base + (kk / 4) * kBlockN * 128 + offset, 16, 1024), kk > 0);
      }
      wgmma_commit();
    };
    // S of the walk's first block (stage 0) in 64-column pieces up to first_width (the mask
    // overwrites the registers left out). Each piece is its own fenced, committed group: no branch
    // between a fence and the wgmmas it covers (ptxas would serialize).
    auto issue_first_qk = [&] {
      if constexpr (!kCutFirst || kBlockN % 64 != 0) {
        issue_qk(first_stage, Constant<kBlockN>(), Constant<0>());
      } else {
        auto issue_piece = [&](auto piece) {
          constexpr int kPiece = decltype(piece)::value;
          if (kPiece * 64 < first_width) issue_qk(first_stage, Constant<64>(), Constant<64 * kPiece>());
        };
        issue_piece(Constant<0>());
        if constexpr (kBlockN >= 128) issue_piece(Constant<1>());
        if constexpr (kBlockN >= 192) issue_piece(Constant<2>());
        if constexpr (kBlockN >= 256) issue_piece(Constant<3>());
      }
    };
    // P V of k-steps first_step .. + steps (16 tokens each) of the block in `stage`: one group.
    auto issue_pv_steps = [&](int stage, auto first_step, auto steps) {
      const unsigned v_base = shared_address(smem_v + stage * Shape::kKvBytes);
      reg_fence(o);
      reg_fence(pa);
      wgmma_fence();
      // k-step kk reads tokens 16kk.. of every chunk: contiguous, chunks kBlockN rows apart; paged,
      // chunks a box's rows apart, and with 8-token boxes the second 8 rows in the next box.
      constexpr int kChunkStride = kPageSize == 0 ? kBlockN * 128 : kBoxRows * 128;
      constexpr int kRowGroupStride = kPageSize == 0 || kBoxRows == 16 ? 1024 : kChunks * 1024;
      constexpr int kFirstStep = decltype(first_step)::value;
#pragma unroll
      for (int kk = kFirstStep; kk < kFirstStep + decltype(steps)::value; ++kk)
        wgmma_rs<kHeadDim, kFp16>(o, pa[kk],
                                  smem_desc(v_base + kk * (kPageSize == 0 ? 2048 : kChunks * 2048), kChunkStride,
                                            kRowGroupStride),
                                  1);
      wgmma_commit();
    };
    // P V of the walk's first block in 64-token pieces up to first_width (P is 0 past it), each its
    // own group (a branch between groups, never inside one: ptxas would serialize).
    auto issue_first_pv = [&](int stage) {
      auto piece = [&](auto index) {
        constexpr int kStep = 4 * decltype(index)::value;
        constexpr int kSteps = kBlockN / 16 - kStep < 4 ? kBlockN / 16 - kStep : 4;
        if constexpr (kSteps > 0) {
          if (kStep * 16 < first_width) issue_pv_steps(stage, Constant<kStep>(), Constant<kSteps>());
        }
      };
      piece(Constant<0>());
      piece(Constant<1>());
      piece(Constant<2>());
      piece(Constant<3>());
    };
    // Online softmax of the block starting at column `col0`: S becomes P (f32, in s), the row
    // statistics move, and `correction` is what O must be scaled by (exactly 1 when a row's
    // reference stayed).
    // Lazy rescaling at head dims of 128 and more: a row's reference moves only when the block's
    // maximum passes it by more than kMaxSlack (log2 units), so P stays below 2^kMaxSlack (in range
    // for f32 sums and 16-bit P) and after the first blocks O is seldom rescaled: the step skips the
    // rescale when no row of the warp moved. Runs 72-73: hd128 non-causal +0.7-1.5%, causal
    // +0.4-0.6%, hd256 +5-6%; at hd64 (three consumers, 32 O registers a thread) -2.5%, so hd64
    // rescales every block as before (docs/device-notes.md).
    constexpr bool kLazyRescale = kHeadDim >= 128;
    constexpr float kMaxSlack = 8.f;
    auto softmax = [&](int col0, float (&correction)[2]) {
      if constexpr (kCap) {
#pragma unroll
        for (int i = 0; i < kBlockN / 2; ++i) s[i] = soft_capped(s[i], p.features);
      }
      if (col0 + kBlockN > mask_from || (kWindow && col0 < window_mask_until)) {
#pragma unroll
        for (int j = 0; j < kBlockN / 8; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int token = col0 + 8 * j + 2 * (lane % 4) + (e & 1);
            if (token >= stop[e >> 1] || (kWindow && token < first_key[e >> 1])) s[4 * j + e] = negative_infinity();
          }
      }
      // Row maxima and sums in kPartials interleaved chains: one chain a row is 24 and 48 links long
      // at hd128's 192 columns, on the consumer's critical path (two: +1-3% there; at hd64's 128
      // columns, with 3 consumers' registers, -1.5%; docs/device-notes.md, run 68). At 80-token
      // blocks two chains measured -0.4% to -1.9% (wide hd128) and +0.1% to +0.8% (hd256; run 90).
      constexpr int kPartials = kBlockN >= 192 ? 2 : 1;
      float partial_max[2][kPartials];
#pragma unroll
      for (int q = 0; q < kPartials; ++q) partial_max[0][q] = partial_max[1][q] = negative_infinity();
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j) {
        float& max0 = partial_max[0][j % kPartials];
        float& max1 = partial_max[1][j % kPartials];
        max0 = fmaxf(max0, fmaxf(s[4 * j], s[4 * j + 1]));
        max1 = fmaxf(max1, fmaxf(s[4 * j + 2], s[4 * j + 3]));
      }
      float block_max[2] = {partial_max[0][0], partial_max[1][0]};
#pragma unroll
      for (int q = 1; q < kPartials; ++q)
        for (int h = 0; h < 2; ++h) block_max[h] = fmaxf(block_max[h], partial_max[h][q]);
      float neg_ref[2];
      float partial_sum[2][kPartials] = {};
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        block_max[h] = fmaxf(block_max[h], __shfl_xor_sync(0xffffffffu, block_max[h], 1));
        block_max[h] = fmaxf(block_max[h], __shfl_xor_sync(0xffffffffu, block_max[h], 2));
        const float block_top = block_max[h] * score_scale;
        const bool move = kLazyRescale ? block_top > row_max[h] + kMaxSlack : true;
        const float new_max = kLazyRescale ? (move ? block_top : row_max[h]) : fmaxf(row_max[h], block_top);
        // A row that has seen nothing yet keeps -inf; 0 as its reference gives exp2(-inf) = 0.
        const float ref = new_max == negative_infinity() ? 0.f : new_max;
        correction[h] = move ? fast_exp2(row_max[h] - ref) : 1.f;
        row_max[h] = new_max;
        partial_sum[h][0] = row_sum[h] * correction[h];
        neg_ref[h] = -ref;
      }
#pragma unroll
      for (int i = 0; i < kBlockN / 2; ++i) {
        s[i] = fast_exp2(fmaf(s[i], score_scale, neg_ref[(i >> 1) & 1]));
        partial_sum[(i >> 1) & 1][(i >> 2) % kPartials] += s[i];
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        row_sum[h] = partial_sum[h][0];
#pragma unroll
        for (int q = 1; q < kPartials; ++q) row_sum[h] += partial_sum[h][q];
      }
    };
    // Paged KV: the block holding the end of the KV arrives with the rest of its last page, which
    // may hold anything (even NaN, and 0 * NaN is NaN in P V). Zero those V rows once (stage 0).
    auto clear_v_tail = [&] {
      const int first = r.kv_len - (n_blocks - 1) * kBlockN;  // the walk's first block is the last one
      if (kPageSize == 0 || first >= kBlockN) return;
      const int pieces = (kBlockN - first) * 8;  // 16-byte pieces per chunk
      for (int i = t + 128 * consumer; i < pieces * kChunks; i += 128 * active) {
        const int row = first + (i % pieces) / 8;
        const int chunk = i / pieces;
        // Paged V: [box][chunk][kBoxRows rows] (the contiguous layout never reaches here).
        const int offset =
            (row / kBoxRows) * kChunks * kBoxRows * 128 + chunk * kBoxRows * 128 + (row % kBoxRows) * 128;
        *reinterpret_cast<uint4*>(smem_v + first_stage * Shape::kKvBytes + offset + (i % 8) * 16) =
            uint4{0u, 0u, 0u, 0u};
      }
      fence_proxy_async_shared();
      named_bar_sync(kConsumers + 1, 128 * active);
    };
    // P in the register layout of wgmma's A operand: k-step kk takes s[8kk .. 8kk + 7].
    auto pack_p = [&]() {
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk)
#pragma unroll
        for (int q = 0; q < 4; ++q) pa[kk][q] = pack2<T>(s[8 * kk + 2 * q], s[8 * kk + 2 * q + 1]);
    };

    // The previous block's P V is waited for after the softmax, so that the exp2s overlap it; pinned
    // there, as ptxas would move the wait above them. Run 84 (docs/device-notes.md): hd128 +0.4% to
    // +1.9% on large grids (-1.2% to +1.4% on one-request shapes), hd256 +5%; hd64 (three consumers,
    // 128-token blocks) -3.9%, so hd64 waits early.
    constexpr bool kPinPvWait = kHeadDim >= 128;
    const unsigned pin_word = shared_address(warp_words + threadIdx.x / 32);
    if (block_count > 0) {
      float correction[2];
      if (consumer == active - 1) pass_turn();
      ASTRAI_PREFILL_STAMP(threadIdx.x == 128, 10);  // consumer 0 is ready to wait for Q and K
      mbar_wait(&q_full[slot], q_parity);
      ASTRAI_PREFILL_STAMP(threadIdx.x == 128, 11);  // Q arrived
      mbar_wait(&k_full[first_stage], (g / kStages) & 1);
      ASTRAI_PREFILL_STAMP(threadIdx.x == 128, 1);  // Q and the first K block have arrived
      await_turn();
      issue_first_qk();
      pass_turn();
      wgmma_wait<0>();
      reg_fence(s);
      mbar_arrive(&k_empty[first_stage]);
      softmax((n_blocks - 1) * kBlockN, correction);
      pack_p();
      ASTRAI_PREFILL_STAMP(threadIdx.x == 128, 2);  // the first block's softmax is done
      // Step `it`: S of block it, P V of block it - 1. `first` marks the step after a cut first
      // block: its P V goes in pieces ahead of S.
      auto step = [&](int it, auto first) {
        constexpr bool first_pv = decltype(first)::value;
        const int ks = (g + it) % kStages;
        const int vs = (g + it - 1) % kStages;
        mbar_wait(&k_full[ks], ((g + it) / kStages) & 1);
        mbar_wait(&v_full[vs], ((g + it - 1) / kStages) & 1);
        await_turn();
        if constexpr (first_pv) issue_first_pv(vs);
        issue_qk(ks, Constant<kBlockN>(), Constant<0>());
        if constexpr (first_pv) {
          // An empty group (ptxas issues a null wgmma for it, fenced like any): the wait below
          // then covers S and the pieces alike.
          wgmma_fence();
          wgmma_commit();
        } else {
          issue_pv_steps(vs, Constant<0>(), Constant<kBlockN / 16>());
        }
        pass_turn();
        wgmma_wait<1>();  // S is ready; P V of the previous block still runs (a cut first block's is done)
        reg_fence(s);
        mbar_arrive(&k_empty[ks]);
        softmax((n_blocks - 1 - it) * kBlockN, correction);
        if constexpr (kPinPvWait) pin_wait_after(pin_word, row_sum[0] + row_sum[1], lane == 0);
        wgmma_wait<0>();
        reg_fence(o);
        mbar_arrive(&v_empty[vs]);
        if (!kLazyRescale || __any_sync(0xffffffffu, correction[0] != 1.f || correction[1] != 1.f)) {
#pragma unroll
          for (int i = 0; i < kHeadDim / 2; ++i) o[i] *= correction[(i >> 1) & 1];
        }
        pack_p();
      };
      if (block_count > 1) {
        mbar_wait(&v_full[first_stage], (g / kStages) & 1);
        clear_v_tail();
      }
      // The loop's step has no branch between its GEMMs (one there cost 1-7%, run 81): a cut first
      // block gets its own copy of the step.
      int it = 1;
      if (block_count > 1 && first_width < kBlockN) step(it++, Constant<true>());
      for (; it < block_count; ++it) step(it, Constant<false>());
      const int vs = (g + block_count - 1) % kStages;
      mbar_wait(&v_full[vs], ((g + block_count - 1) / kStages) & 1);
      if (block_count == 1) clear_v_tail();
      await_turn();
      if (block_count == 1) {
        issue_first_pv(vs);
      } else {
        issue_pv_steps(vs, Constant<0>(), Constant<kBlockN / 16>());
      }
      // Every wait on a turn barrier meets one arrival: the last active consumer's opening arrival
      // stands in for its last one.
      if (consumer != active - 1) pass_turn();
      wgmma_wait<0>();
      reg_fence(o);
      mbar_arrive(&v_empty[vs]);
      ASTRAI_PREFILL_STAMP(threadIdx.x == 128, 3);  // the last P V is done
    }

    float inverse[2];
    float lse[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float sum = row_sum[h];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      float sink_factor = 1.f;
      if constexpr (has_feature<kFlags>(kFeatureSink))
        sink_factor = fold_sink(p.features.sinks[row_head(row0 + 8 * h)], &row_max[h], &sum);
      const bool empty = !(sum > 0.f);
      inverse[h] = empty ? 0.f : sink_factor / sum;
      lse[h] = empty ? negative_infinity() : (row_max[h] + log2f(sum)) * kLn2;
    }
    T* out = static_cast<T*>(p.out) + batch_index * p.out_stride_batch;
    auto out_row = [&](int row) {
      return out + static_cast<long long>(r.q_start + row_position(row)) * p.out_stride_seq +
             static_cast<long long>(row_head(row)) * p.out_stride_head;
    };
    // O leaves through shared memory: each warp writes its 16 rows into its own rows of the Q tile
    // (its consumer's S GEMMs are done with them) in the accumulator's layout, then reads them back
    // as 16-byte pieces of whole rows, so that a store instruction fills whole output rows instead
    // of 16 bytes in each of eight. Rows are 16-byte aligned: the runtime requires it of `out` and
    // its strides (runtime/families/arg_checks.cpp).
    {
      const int warp = t / 32;
      // Piece j (8 columns) of row rho of the warp's 16: in the Q tile's chunk j / 8, its place in
      // the 128-byte row swizzled by the row, so that a tile's 8 rows meet 8 different bank groups,
      // and so do a row's 8 pieces when read.
      const unsigned staging = shared_address(q_tile) + (64 * consumer + 16 * warp) * 128;
      auto piece = [&](int rho, int j) {
        return staging + (j / 8) * kBlockM * 128 + rho * 128 + ((j ^ rho) % 8) * 16;
      };
      fence_proxy_async_shared();  // the generic proxy's stores follow the async proxy's reads of Q
      // Tiles (j, rows 0-7), (j, rows 8-15), (j + 1, rows 0-7), (j + 1, rows 8-15): lane l
      // addresses row l % 8 of tile l / 8.
      const int tile = lane / 8;
#pragma unroll
      for (int j = 0; j < kHeadDim / 8; j += 2)
        stmatrix_x4(piece(lane % 8 + 8 * (tile % 2), j + tile / 2),
                    pack2<T>(o[4 * j] * inverse[0], o[4 * j + 1] * inverse[0]),
                    pack2<T>(o[4 * j + 2] * inverse[1], o[4 * j + 3] * inverse[1]),
                    pack2<T>(o[4 * j + 4] * inverse[0], o[4 * j + 5] * inverse[0]),
                    pack2<T>(o[4 * j + 6] * inverse[1], o[4 * j + 7] * inverse[1]));
      __syncwarp();
      constexpr int kPiecesPerRow = kHeadDim / 8;
      const int first_row = m0 + 64 * consumer + 16 * warp;
#pragma unroll
      for (int k = 0; k < 16 * kPiecesPerRow / 32; ++k) {
        const int rho = (lane + 32 * k) / kPiecesPerRow;
        const int j = (lane + 32 * k) % kPiecesPerRow;
        if (first_row + rho < rows) st_global_v4(out_row(first_row + rho) + 8 * j, ld_shared_v4(piece(rho, j)));
      }
    }
    if (p.lse != nullptr && lane % 4 == 0) {
#pragma unroll
      for (int h = 0; h < 2; ++h)
        if (row0 + 8 * h < rows)
          p.lse[(r.lse_row + row_position(row0 + 8 * h)) * p.n_heads + row_head(row0 + 8 * h)] = lse[h];
    }
    ASTRAI_PREFILL_STAMP(t == 0, 4 + consumer);  // each consumer's stores are issued
    if constexpr (kPersistent) {
      fence_proxy_async_shared();  // the next tile's Q load follows this tile's reads of the slot
      mbar_arrive(&q_empty[slot]);
    }
  };

  if constexpr (!kPersistent) {
    consume(first, 0, 0, 0);
  } else {
    int g = 0;
    for (int k = 0; persistent_tile(k) < persistent_tiles; ++k) {
      const TileWalk w = walk_of(prefill_tile_at<kBlockM>(p, persistent_tile(k)));
      consume(w, g, k % 2, (k / 2) & 1);
      g += w.block_count;
    }
  }
}

}  // namespace astrai
