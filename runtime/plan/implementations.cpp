#include "runtime/plan/implementations.hpp"

#include <algorithm>

#include "kernel_src/hopper_params.h"
#include "kernel_src/kernel_params.h"

namespace astrai::detail {

// Why the family's Hopper template has no variant for this shape, target and features.
const char* hopper_shape_refusal(KernelKind kind, int head_dim, int page_size, std::uint32_t flags,
                                 const std::string& arch, bool force_no_mma) {
  const HopperImplementation& hopper = kernel_family(kind).hopper;
  if (hopper.main_file == nullptr) return "the family has no sm_90a implementation";
  if (arch != "sm_90a") return "the target is not sm_90a";
  if (force_no_mma) return "tensor cores are off (ASTRAI_JIT_NO_MMA)";
  if ((flags & kFeatureKvFp8) != 0) {
    // The contiguous prefill takes no FP8 cache at all (its arguments refuse one).
    if (kind == KernelKind::mla_decode || kind == KernelKind::prefill) return "an FP8 KV cache is not served";
    if (is_decode_kind(kind) && !decode_sm90_serves_kv8(head_dim))
      return "an FP8 KV cache is served at head_dim 64, 128 or 256 only";
    if (!is_decode_kind(kind) && !prefill_sm90_serves_kv8(head_dim))
      return "an FP8 KV cache is served at head_dim 128 only";
  }
  if ((flags & kFeatureQkvE4m3) != 0 && !((kind == KernelKind::prefill || kind == KernelKind::paged_prefill) &&
                                          prefill_sm90_serves_qkv8(head_dim, page_size, flags)))
    return "FP8 attention is served at head_dim 64, 128 or 256 (P in f16 at 128 only), contiguous or in pages of "
           "8 tokens or more, with no other feature";
  if ((flags & ~hopper.supported_flags) != 0) return "a requested feature is not served";
  if (!hopper.serves(head_dim, page_size)) {
    if (kind == KernelKind::mla_decode) return "pages are under 16 tokens";
    return is_decode_kind(kind) ? "head_dim is not a multiple of 64 up to 256, or pages are under 16 tokens"
                                : "head_dim is not 64, 128, 192 or 256, or pages are under 8 tokens";
  }
  return nullptr;
}

namespace {

// Whether the family's Hopper implementation has a wide tiling for this head dim and these
// features (HopperImplementation::has_wide: the one rule the plan, warm and the variant checks share).
bool hopper_has_wide(const AttentionProblem& problem) {
  const auto has_wide = kernel_family(problem.kind).hopper.has_wide;
  return has_wide != nullptr && has_wide(problem.head_dim, problem.flags);
}

const char* hopper_refusal(const AttentionProblem& problem, const DeviceTraits& device) {
  if (device.no_hopper && device.arch == "sm_90a" && device.uses_mma()) return "ASTRAI_JIT_NO_WGMMA is set";
  if (const char* why = hopper_shape_refusal(problem.kind, problem.head_dim, problem.page_size, problem.flags,
                                             device.arch, device.force_no_mma))
    return why;
  if (problem.masked) return "a mask is not served";
  if (problem.hopper_refused) return "the driver refused a TMA view of the call's tensors";
  return nullptr;
}

KernelSpec problem_spec(const AttentionProblem& problem, const DeviceTraits& device, bool hopper) {
  KernelSpec spec;
  spec.kind = problem.kind;
  spec.dtype = problem.dtype;
  spec.head_dim = problem.head_dim;
  spec.page_size = problem.page_size;
  spec.group_size = problem.group();
  spec.flags = problem.flags;
  spec.force_no_mma = device.force_no_mma;
  spec.arch = device.arch;
  spec.hopper = hopper;
  return spec;
}

// The split plan, workspace and grid both decode implementations share, from the CTAs the
// device runs at once. A wide CTA (sm_90a) runs a (request, KV head, head tile)'s splits side by
// side and merges them itself: no workspace, no combine launch.
void plan_decode_grid(const AttentionProblem& problem, const DeviceTraits& device, int resident_ctas, Plan* plan) {
  const int q_len = decode_q_len(problem.flags);
  plan->head_tiles = (problem.group() * q_len + kDecodeHeadsPerTile - 1) / kDecodeHeadsPerTile;
  DecodeSplitPlan split =
      plan_decode_splits(problem.batch, problem.n_kv_heads, plan->head_tiles, problem.span, resident_ctas);
  const long long columns = 1LL * problem.batch * problem.n_kv_heads * plan->head_tiles;
  plan->spec.wide = plan->spec.hopper && hopper_has_wide(problem) &&
                    decode_takes_wide_ctas(device.decode_tiles, split, columns, device.num_sms, kDecodeSm90WideSplits);
  if (plan->spec.wide) {
    plan->block = kDecodeThreads * kDecodeSm90WideSplits;
    plan->smem = kDecodeSm90WideSplits * decode_sm90_wide_region_bytes(problem.head_dim);
    split = wide_cta_plan(problem.span, kDecodeSm90WideSplits);
  } else if (problem.caller_workspace) {
    // A caller's workspace bounds the split count (fewer, longer splits) rather than failing: it
    // is what makes the call safe under CUDA graph capture, whatever stream captures it.
    split = cap_decode_splits(split, problem.span, problem.workspace_bytes, problem.batch, problem.n_heads * q_len,
                              problem.head_dim);
  }
  plan->split = split;
  // x: a CTA per workspace split (1 for wide CTAs, which merge their splits themselves).
  const int splits = plan->spec.wide ? 1 : split.num_splits;
  plan->split.num_splits = splits;
  plan->workspace_bytes =
      splits > 1 ? decode_workspace_bytes(split, problem.batch, problem.n_heads * q_len, problem.head_dim) : 0;
  plan->grid = {static_cast<unsigned>(splits), static_cast<unsigned>(problem.n_kv_heads * plan->head_tiles),
                static_cast<unsigned>(problem.batch)};
}

const char* configure_sm90_decode(const AttentionProblem& problem, const DeviceTraits& device,
                                  const OccupancyQuery&, Plan* plan) {
  plan->spec = problem_spec(problem, device, true);
  plan->block = kDecodeThreads;
  const bool fp8 = (problem.flags & kFeatureKvFp8) != 0;
  plan->smem = decode_sm90_smem_bytes(problem.head_dim, fp8);
  // Its occupancy follows from its shared memory (its __launch_bounds__ keeps registers within
  // it), so the plan needs no compiled variant: a call that takes wide CTAs compiles only those.
  plan_decode_grid(problem, device, decode_sm90_ctas_per_sm(problem.head_dim, fp8) * device.num_sms, plan);
  return nullptr;
}

const char* configure_portable_decode(const AttentionProblem& problem, const DeviceTraits& device,
                                      const OccupancyQuery& occupancy, Plan* plan) {
  plan->spec = problem_spec(problem, device, false);
  plan->block = kDecodeThreads;
  plan->smem = paged_decode_smem_bytes(problem.head_dim, (problem.flags & kFeatureKvFp8) != 0);
  const int resident = occupancy ? occupancy(plan->spec, plan->block, plan->smem)
                                 : modeled_resident_ctas(device, plan->smem);
  plan_decode_grid(problem, device, std::max(resident, 1), plan);
  return nullptr;
}

const char* sm90_prefill_refusal(const AttentionProblem& problem, const DeviceTraits& device) {
  if (const char* why = hopper_refusal(problem, device)) return why;
  // Packed GQA tiles hold a pack of heads: a tile row per head and position, whose count must
  // stay within the kernel's int.
  if (1LL * problem.max_q_len * prefill_sm90_pack_heads(problem.group()) > (1LL << 30))
    return "the query rows of a packed head group exceed 2^30";
  return nullptr;
}

const char* configure_sm90_prefill(const AttentionProblem& problem, const DeviceTraits& device,
                                   const OccupancyQuery&, Plan* plan) {
  plan->spec = problem_spec(problem, device, true);
  const bool kv8 = (problem.flags & (kFeatureKvFp8 | kFeatureQkvE4m3)) != 0;  // byte rings
  // hopper_has_wide is false with an FP8 cache: its byte rings leave no room for the wide tiles' Q.
  plan->spec.wide = hopper_has_wide(problem) &&
                    prefill_sm90_takes_wide_tiles(device.prefill_tiles, problem.head_dim, problem.max_q_len,
                                                  problem.total_q, problem.n_heads, problem.n_kv_heads, problem.batch,
                                                  device.num_sms);
  plan->consumers = prefill_sm90_consumers(problem.head_dim, plan->spec.wide, problem.flags);
  plan->block_n = prefill_sm90_block_n(problem.head_dim, plan->consumers, kv8);
  plan->block = prefill_sm90_threads(plan->consumers);
  plan->persistent = prefill_sm90_persistent(problem.page_size, plan->consumers, problem.flags);
  plan->smem =
      prefill_sm90_smem_bytes(problem.head_dim, plan->consumers, plan->block_n, plan->persistent, problem.flags);
  const GridSize tiles = prefill_sm90_tile_grid(problem.max_q_len, problem.n_heads, problem.group(), problem.batch,
                                                plan->consumers);
  // Persistent: a CTA an SM (or a tile), each walking tiles of that grid. Their tile ids are
  // 31-bit (fast_divide's range).
  const long long count = 1LL * tiles.x * tiles.y * tiles.z;
  if (plan->persistent && count >= (1LL << 31)) return "the tile grid exceeds 2^31 tiles";
  plan->tiles = tiles;
  plan->grid = plan->persistent ? GridSize{static_cast<unsigned>(std::min<long long>(count, device.num_sms)), 1, 1}
                                : tiles;
  return nullptr;
}

}  // namespace

GridSize prefill_sm90_tile_grid(int max_q_len, int n_heads, int group, int batch, int consumers) {
  const int pack = prefill_sm90_pack_heads(group);
  const long long rows = 1LL * max_q_len * pack;
  const int block_m = prefill_sm90_block_m(consumers);
  return {static_cast<unsigned>((rows + block_m - 1) / block_m), static_cast<unsigned>(n_heads / pack),
          static_cast<unsigned>(batch)};
}

namespace {

// The portable kernels read 16-bit q, K and V: FP8 attention has only the Hopper kernel.
const char* portable_refusal(const AttentionProblem& problem, const DeviceTraits&) {
  if ((problem.flags & kFeatureQkvE4m3) != 0) return "FP8 attention (qkv_dtype e4m3) runs on sm_90a's wgmma prefill only";
  return nullptr;
}

const char* configure_portable_prefill(const AttentionProblem& problem, const DeviceTraits& device,
                                       const OccupancyQuery&, Plan* plan) {
  plan->spec = problem_spec(problem, device, false);
  // The tensor-core and CUDA-core paths tile differently.
  const bool mma = device.uses_mma();
  plan->block = kPrefillThreads;
  plan->smem = mma ? prefill_smem_bytes(problem.head_dim, (problem.flags & kFeatureKvFp8) != 0)
                   : prefill_core_smem_bytes(problem.head_dim);
  const int block_q = mma ? prefill_block_q(problem.head_dim) : kPrefillCoreBlockQ;
  plan->grid = {static_cast<unsigned>((1LL * problem.max_q_len + block_q - 1) / block_q),
                static_cast<unsigned>(problem.n_heads), static_cast<unsigned>(problem.batch)};
  plan->tiles = plan->grid;
  return nullptr;
}

const Implementation kSm90Decode{ImplementationId::sm90_tma_decode, "sm90_tma_decode", true, true, hopper_refusal,
                                 configure_sm90_decode};
const Implementation kSm90Prefill{ImplementationId::sm90_wgmma_prefill, "sm90_wgmma_prefill", true, false,
                                  sm90_prefill_refusal, configure_sm90_prefill};
const Implementation kPortableDecode{ImplementationId::portable_decode, "portable_decode", false, true,
                                     portable_refusal, configure_portable_decode};
const Implementation kPortablePrefill{ImplementationId::portable_prefill, "portable_prefill", false, false,
                                      portable_refusal, configure_portable_prefill};

}  // namespace

const std::vector<const Implementation*>& implementations() {
  static const std::vector<const Implementation*> all = {&kSm90Decode, &kSm90Prefill, &kPortableDecode,
                                                         &kPortablePrefill};
  return all;
}

const Implementation& implementation(ImplementationId id) {
  for (const Implementation* candidate : implementations())
    if (candidate->id == id) return *candidate;
  return kPortableDecode;  // unreachable: every id has an entry
}

const char* hopper_variant_refusal(const KernelSpec& spec) {
  return hopper_shape_refusal(spec.kind, spec.head_dim, spec.page_size, spec.flags, spec.arch, spec.force_no_mma);
}

bool hopper_serves(const KernelSpec& spec) { return hopper_variant_refusal(spec) == nullptr; }

}  // namespace astrai::detail
