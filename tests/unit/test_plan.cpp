// The Plan on the CPU: which implementation each problem gets on which device, why the others
// were passed over, and that the configuration follows the kernels' own tiling constants.
#include <doctest/doctest.h>

#include <string>

#include "kernel_src/hopper_params.h"
#include "kernel_src/kernel_params.h"
#include "runtime/plan/attention_plan.hpp"
#include "runtime/plan/implementations.hpp"
#include "runtime/plan/plan_memo.hpp"

using namespace astrai;
using namespace astrai::detail;


namespace {

DeviceTraits h200() {
  DeviceTraits device;
  device.arch = "sm_90a";
  device.num_sms = 132;
  return device;
}

DeviceTraits ada() {
  DeviceTraits device;
  device.arch = "sm_89";
  device.num_sms = 128;
  return device;
}

AttentionProblem decode_problem(int batch, long long span, int head_dim = 128, int page_size = 16) {
  AttentionProblem problem;
  problem.kind = KernelKind::paged_decode;
  problem.head_dim = head_dim;
  problem.page_size = page_size;
  problem.batch = batch;
  problem.n_heads = 32;
  problem.n_kv_heads = 8;
  problem.span = span;
  return problem;
}

AttentionProblem prefill_problem(int batch, int q_len, int head_dim = 128) {
  AttentionProblem problem;
  problem.kind = KernelKind::prefill;
  problem.head_dim = head_dim;
  problem.batch = batch;
  problem.n_heads = 32;
  problem.n_kv_heads = 8;
  problem.max_q_len = q_len;
  problem.total_q = 1LL * q_len * batch;
  return problem;
}

// An occupancy the test controls, counting the questions.
struct FixedOccupancy {
  int per_sm = 4;
  int asked = 0;
  OccupancyQuery query(int num_sms) {
    return [this, num_sms](const KernelSpec&, int, int) {
      ++asked;
      return per_sm * num_sms;
    };
  }
};

std::string reason_of(const Plan& plan, ImplementationId id) {
  for (int i = 0; i < plan.passed_over_count; ++i)
    if (plan.passed_over[i].implementation->id == id) return plan.passed_over[i].reason;
  return "";
}

}  // namespace

TEST_CASE("plan: sm_90a decode takes the TMA decode, and says why not where it cannot") {
  FixedOccupancy occupancy;
  const Plan plan = plan_decode(decode_problem(64, 8192), h200(), occupancy.query(132));
  REQUIRE(plan.implementation != nullptr);
  CHECK(plan.implementation->id == ImplementationId::sm90_tma_decode);
  CHECK(plan.spec.hopper);
  CHECK(plan.spec.name().find(".tma.") != std::string::npos);
  CHECK(plan.passed_over_count == 0);
  CHECK(occupancy.asked == 0);  // its occupancy follows from its shared memory

  AttentionProblem masked = decode_problem(64, 8192);
  masked.masked = true;
  const Plan portable = plan_decode(masked, h200(), occupancy.query(132));
  CHECK(portable.implementation->id == ImplementationId::portable_decode);
  CHECK_FALSE(portable.spec.hopper);
  CHECK(reason_of(portable, ImplementationId::sm90_tma_decode) == "a mask is not served");
  CHECK(occupancy.asked == 1);
  CHECK(portable.describe().find("passed over sm90_tma_decode: a mask is not served") != std::string::npos);

  // An FP8 cache: the TMA decode at head dims 64, 128 and 256 (a split a CTA at this batch); else
  // the direct path.
  AttentionProblem fp8 = decode_problem(64, 8192, 192);
  fp8.flags = kFeatureKvE4m3;
  CHECK(reason_of(plan_decode(fp8, h200(), occupancy.query(132)), ImplementationId::sm90_tma_decode) ==
        "an FP8 KV cache is served at head_dim 64, 128 or 256 only");
  for (const int head_dim : {64, 128, 256}) {
    AttentionProblem served = decode_problem(64, 8192, head_dim);
    served.flags = kFeatureKvE5m2;
    const Plan tma = plan_decode(served, h200(), occupancy.query(132));
    CHECK(tma.implementation->id == ImplementationId::sm90_tma_decode);
    CHECK_FALSE(tma.spec.wide);
    CHECK(tma.spec.name().find(".kv_e5m2.tma.sm_90a") != std::string::npos);
    CHECK(tma.smem == decode_sm90_smem_bytes(head_dim, true));
    CHECK(tma.smem < decode_sm90_smem_bytes(head_dim));
  }
  // AstrAI's hd64 24/4 heads, B32 x 4096: 128 (request, KV head) columns in 4 splits take wide
  // CTAs, an FP8 cache's as the bf16 one's (its groups' 5 stages within the 16-bit region); B64
  // has more columns than SMs and runs a split a CTA.
  for (const std::uint32_t flags : {0u, std::uint32_t{kFeatureKvE4m3}}) {
    AttentionProblem astrai = decode_problem(32, 4096, 64);
    astrai.n_heads = 24;
    astrai.n_kv_heads = 4;
    astrai.flags = flags;
    const Plan wide = plan_decode(astrai, h200(), occupancy.query(132));
    CAPTURE(wide.spec.name());
    CHECK(wide.spec.wide);
    CHECK(wide.block == 512);
    CHECK(wide.workspace_bytes == 0);
    CHECK(wide.smem == 4 * decode_sm90_wide_region_bytes(64));
    astrai.batch = 64;
    CHECK_FALSE(plan_decode(astrai, h200(), occupancy.query(132)).spec.wide);
  }
  static_assert(decode_sm90_smem_bytes(64, true, true) <= decode_sm90_wide_region_bytes(64), "an FP8 group fits");

  DeviceTraits no_hopper = h200();
  no_hopper.no_hopper = true;
  CHECK(reason_of(plan_decode(decode_problem(64, 8192), no_hopper, occupancy.query(132)),
                  ImplementationId::sm90_tma_decode) == "ASTRAI_JIT_NO_WGMMA is set");
  CHECK(reason_of(plan_decode(decode_problem(64, 8192, 128, 8), h200(), occupancy.query(132)),
                  ImplementationId::sm90_tma_decode)
            .find("pages are under 16 tokens") != std::string::npos);

  const Plan on_ada = plan_decode(decode_problem(64, 8192), ada(), occupancy.query(128));
  CHECK(on_ada.implementation->id == ImplementationId::portable_decode);
  CHECK(on_ada.spec.arch == "sm_89");
  CHECK(reason_of(on_ada, ImplementationId::sm90_tma_decode) == "the target is not sm_90a");

  AttentionProblem refused = decode_problem(64, 8192);
  refused.hopper_refused = true;
  CHECK(plan_decode(refused, h200(), occupancy.query(132)).implementation->id == ImplementationId::portable_decode);
}

TEST_CASE("plan: the decode split plan, grid and workspace follow the split heuristics") {
  FixedOccupancy occupancy;
  const AttentionProblem problem = decode_problem(1, 32768);
  const Plan plan = plan_decode(problem, ada(), occupancy.query(128));
  const int head_tiles = (4 + kDecodeHeadsPerTile - 1) / kDecodeHeadsPerTile;
  const DecodeSplitPlan expected = plan_decode_splits(1, 8, head_tiles, 32768, 4 * 128);
  CHECK(plan.split.num_splits == expected.num_splits);
  CHECK(plan.split.tokens_per_split == expected.tokens_per_split);
  REQUIRE(plan.split_kv());
  CHECK(plan.grid.x == static_cast<unsigned>(expected.num_splits));
  CHECK(plan.grid.y == 8u * head_tiles);
  CHECK(plan.grid.z == 1u);
  CHECK(plan.block == kDecodeThreads);
  CHECK(plan.smem == paged_decode_smem_bytes(128));
  CHECK(plan.workspace_bytes == decode_workspace_bytes(expected, 1, 32, 128));

  // A caller's workspace too small for two splits: one split, no workspace.
  AttentionProblem capped = problem;
  capped.caller_workspace = true;
  capped.workspace_bytes = 16;
  const Plan one = plan_decode(capped, ada(), occupancy.query(128));
  CHECK(one.split.num_splits == 1);
  CHECK(one.workspace_bytes == 0);
  CHECK(one.grid.x == 1u);
}

TEST_CASE("plan: wide Hopper decode CTAs where the heuristic takes them, and never by ASTRAI_JIT_DECODE_TILES=narrow") {
  FixedOccupancy occupancy;
  // hd64 24/4 B32 x 4096: the shape wide CTAs were built for.
  AttentionProblem problem = decode_problem(32, 4096, 64, 16);
  problem.n_heads = 24;
  problem.n_kv_heads = 4;
  const Plan plan = plan_decode(problem, h200(), occupancy.query(132));
  REQUIRE(plan.implementation->id == ImplementationId::sm90_tma_decode);
  const DecodeSplitPlan narrow = plan_decode_splits(32, 4, 1, 4096, decode_sm90_ctas_per_sm(64) * 132);
  const bool wide = decode_takes_wide_ctas(TileChoice::automatic, narrow, 32LL * 4, 132, kDecodeSm90WideSplits);
  CHECK(plan.spec.wide == wide);
  if (plan.spec.wide) {
    CHECK(plan.block == kDecodeThreads * kDecodeSm90WideSplits);
    CHECK(plan.smem == kDecodeSm90WideSplits * decode_sm90_wide_region_bytes(64));
    CHECK(plan.grid.x == 1u);
    CHECK(plan.workspace_bytes == 0);
    CHECK(plan.spec.name().find(".tma.wide.") != std::string::npos);
  }
  DeviceTraits narrow_only = h200();
  narrow_only.decode_tiles = TileChoice::narrow;
  CHECK_FALSE(plan_decode(problem, narrow_only, occupancy.query(132)).spec.wide);
  DeviceTraits wide_only = h200();
  wide_only.decode_tiles = TileChoice::wide;
  CHECK(plan_decode(problem, wide_only, occupancy.query(132)).spec.wide);
}

TEST_CASE("plan: prefill takes the wgmma kernel on sm_90a with its tiling, persistence and grid") {
  const AttentionProblem problem = prefill_problem(2, 8192);
  const Plan plan = plan_prefill(problem, h200());
  REQUIRE(plan.implementation->id == ImplementationId::sm90_wgmma_prefill);
  const bool wide = prefill_sm90_takes_wide_tiles(TileChoice::automatic, 128, 8192, 2LL * 8192, 32, 8, 2, 132);
  CHECK(plan.spec.wide == wide);
  CHECK(plan.consumers == prefill_sm90_consumers(128, wide));
  CHECK(plan.block == prefill_sm90_threads(plan.consumers));
  CHECK(plan.block_n == prefill_sm90_block_n(128, plan.consumers));
  CHECK(plan.persistent == prefill_sm90_persistent(0, plan.consumers, 0));
  CHECK(plan.smem == prefill_sm90_smem_bytes(128, plan.consumers, plan.block_n, plan.persistent));
  const GridSize tiles = prefill_sm90_tile_grid(8192, 32, 4, 2, plan.consumers);
  CHECK(plan.tiles.x == tiles.x);
  CHECK(plan.tiles.y == tiles.y);
  CHECK(plan.tiles.z == tiles.z);
  if (plan.persistent) {
    CHECK(plan.grid.x == 132u);
    CHECK(plan.grid.y == 1u);
  }

  AttentionProblem masked = problem;
  masked.masked = true;
  const Plan portable = plan_prefill(masked, h200());
  CHECK(portable.implementation->id == ImplementationId::portable_prefill);
  CHECK(portable.block == kPrefillThreads);
  CHECK(portable.grid.x == static_cast<unsigned>((8192 + prefill_block_q(128) - 1) / prefill_block_q(128)));
  CHECK(portable.grid.y == 32u);
  CHECK(reason_of(portable, ImplementationId::sm90_wgmma_prefill) == "a mask is not served");

  AttentionProblem hd96 = prefill_problem(2, 512, 96);
  CHECK(reason_of(plan_prefill(hd96, h200()), ImplementationId::sm90_wgmma_prefill).find("head_dim") !=
        std::string::npos);

  DeviceTraits turing;
  turing.arch = "sm_75";
  turing.num_sms = 40;
  const Plan cores = plan_prefill(problem, turing);
  CHECK(cores.smem == prefill_core_smem_bytes(128));
  CHECK(cores.grid.x == static_cast<unsigned>((8192 + kPrefillCoreBlockQ - 1) / kPrefillCoreBlockQ));
}

TEST_CASE("plan: equal problems plan alike, and every field of a problem is part of its identity") {
  FixedOccupancy occupancy;
  const AttentionProblem a = decode_problem(8, 4096);
  AttentionProblem b = a;
  CHECK(a == b);
  CHECK(plan_decode(a, h200(), occupancy.query(132)).describe() ==
        plan_decode(b, h200(), occupancy.query(132)).describe());
  b.workspace_bytes = 1;
  CHECK(a != b);
  b = a;
  b.hopper_refused = true;
  CHECK(a != b);
  b = a;
  b.total_q = 7;
  CHECK(a != b);
}

TEST_CASE("plan: the registry's variant check agrees with the plans") {
  KernelSpec spec;
  spec.kind = KernelKind::prefill;
  spec.head_dim = 128;
  spec.group_size = 4;
  spec.arch = "sm_90a";
  CHECK(hopper_serves(spec));
  spec.flags = kFeatureKvE4m3;
  CHECK_FALSE(hopper_serves(spec));
  CHECK(std::string(hopper_variant_refusal(spec)) == "an FP8 KV cache is not served");
  spec.kind = KernelKind::paged_decode;  // the TMA decode reads FP8 rows of 64, 128 or 256 bytes
  spec.page_size = 16;
  CHECK(hopper_serves(spec));
  spec.head_dim = 64;
  CHECK(hopper_serves(spec));
  spec.head_dim = 192;
  CHECK(std::string(hopper_variant_refusal(spec)) == "an FP8 KV cache is served at head_dim 64, 128 or 256 only");
  spec.head_dim = 128;
  // The wgmma paged prefill widens an FP8 cache's rows of 128 bytes in shared memory.
  spec.kind = KernelKind::paged_prefill;
  CHECK(hopper_serves(spec));
  spec.head_dim = 64;
  CHECK(std::string(hopper_variant_refusal(spec)) == "an FP8 KV cache is served at head_dim 128 only");
  spec.head_dim = 128;
  spec.kind = KernelKind::prefill;
  spec.page_size = 0;
  spec.flags = 0;
  spec.kind = KernelKind::rotary_emb;
  CHECK_FALSE(hopper_serves(spec));
  for (const Implementation* candidate : implementations()) CHECK(&implementation(candidate->id) == candidate);
}

TEST_CASE("plan: ALiBi runs on the TMA decode (its softmax has the hook) and on the portable prefill") {
  FixedOccupancy occupancy;
  AttentionProblem decode = decode_problem(64, 8192);
  decode.flags = kFeatureAlibi;
  CHECK(plan_decode(decode, h200(), occupancy.query(132)).implementation->id == ImplementationId::sm90_tma_decode);
  AttentionProblem prefill = prefill_problem(2, 4096);
  prefill.flags = kFeatureAlibi;
  const Plan plan = plan_prefill(prefill, h200());
  CHECK(plan.implementation->id == ImplementationId::portable_prefill);
  CHECK(reason_of(plan, ImplementationId::sm90_wgmma_prefill) == "a requested feature is not served");
  CHECK(plan.spec.name() == "prefill.bf16.hd128.g4.alibi.sm_90a");
}

TEST_CASE("a launcher's plan memo plans again only when the problem or the device changes") {
  PlanMemo<AttentionProblem> memo;
  int made = 0;
  AttentionProblem problem = decode_problem(4, 4096);
  const auto make = [&] {
    ++made;
    return plan_decode(problem, h200(), [](const KernelSpec&, int, int) { return 2; });
  };
  const int device_a = 0, device_b = 0;
  const Plan& first = memo.get(&device_a, problem, make);
  CHECK(made == 1);
  CHECK(&memo.get(&device_a, problem, make) == &first);
  CHECK(made == 1);
  problem.batch = 8;
  CHECK(memo.get(&device_a, problem, make).spec.name() == first.spec.name());
  CHECK(made == 2);
  memo.get(&device_b, problem, make);
  CHECK(made == 3);
  problem.hopper_refused = true;
  CHECK_FALSE(memo.get(&device_b, problem, make).spec.hopper);
  CHECK(made == 4);
}

TEST_CASE("plan: an FP8 cache's paged prefill runs the wgmma kernel at hd128 (one tiling), the portable one else") {
  AttentionProblem paged = prefill_problem(2, 8192);
  paged.kind = KernelKind::paged_prefill;
  paged.page_size = 16;
  paged.flags = kFeatureKvE4m3;
  const Plan plan = plan_prefill(paged, h200());
  CHECK(plan.implementation->id == ImplementationId::sm90_wgmma_prefill);
  CHECK_FALSE(plan.spec.wide);  // B2 x 8192 takes the wide tiles with a 16-bit cache
  CHECK(plan.consumers == 2);
  CHECK(plan.block_n == 128);
  CHECK(plan.smem == astrai::prefill_sm90_smem_bytes(128, 2, 128, false, astrai::kFeatureKvE4m3));
  CHECK(plan.smem <= 227 * 1024);
  CHECK(plan.spec.name() == "paged_prefill.bf16.hd128.ps16.g4.kv_e4m3.wgmma.sm_90a");
  paged.flags = 0;
  CHECK(plan_prefill(paged, h200()).spec.wide);
  paged.flags = kFeatureKvE5m2;
  paged.head_dim = 64;
  const Plan hd64 = plan_prefill(paged, h200());
  CHECK(hd64.implementation->id == ImplementationId::portable_prefill);
  CHECK(reason_of(hd64, ImplementationId::sm90_wgmma_prefill) == "an FP8 KV cache is served at head_dim 128 only");
  paged.head_dim = 128;
  paged.page_size = 4;  // boxes of whole pages: 8 tokens or more
  CHECK(plan_prefill(paged, h200()).implementation->id == ImplementationId::portable_prefill);
}
