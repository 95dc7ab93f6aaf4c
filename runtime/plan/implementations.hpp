// The implementations of the attention families, as rooms: each says which problems it serves
// on which device (or why not), and configures a plan for those it takes. plan_attention asks
// them in preference order (implementations()) and takes the first that serves. A new
// implementation (sm_100, say) is one more entry here, a template of its own in kernel_src/,
// and its launch; no other site chooses.
#pragma once

#include <vector>

#include "runtime/plan/attention_plan.hpp"

namespace astrai::detail {

enum class ImplementationId {
  sm90_tma_decode,     // kernel_src/paged_decode_sm90.cuh: K and V by TMA, wide CTAs
  sm90_wgmma_prefill,  // kernel_src/prefill_sm90.cuh: TMA and wgmma, persistent CTAs
  portable_decode,     // kernel_src/paged_decode.cuh: mma.sync from sm_80, CUDA cores below
  portable_prefill,    // kernel_src/prefill.cuh: mma.sync from sm_80, CUDA cores below
  portable_mla_decode, // kernel_src/mla_decode.cuh: its own Plan (mla_plan.hpp), not in implementations()
  sm90_wgmma_mla_decode, // kernel_src/mla_decode_sm90.cuh: TMA and wgmma, its own Plan as portable_mla_decode's
};

struct Implementation {
  ImplementationId id;
  const char* name;   // "sm90_tma_decode": in plans, logs and `astrai-jit plan`
  bool hopper;        // compiled from the family's Hopper template (the variant's ".tma" / ".wgmma")
  bool decode;        // serves the decode kinds (else the prefill kinds)
  // Why it does not serve the problem on the device; null when it does.
  const char* (*refuses)(const AttentionProblem& problem, const DeviceTraits& device);
  // Fills the plan's variant, configuration, split plan and grid for a problem it serves; a
  // reason (and the plan untouched past its variant) when the configuration finds a limit the
  // shape check cannot see.
  const char* (*configure)(const AttentionProblem& problem, const DeviceTraits& device,
                           const OccupancyQuery& occupancy, Plan* plan);
};

// Every implementation, in preference order (the Hopper ones before the portable ones).
const std::vector<const Implementation*>& implementations();
const Implementation& implementation(ImplementationId id);

// The sm90 prefill's tile grid: (tiles of the longest request, heads or packs of heads, requests);
// with packed GQA (prefill_sm90_pack_heads) a tile holds a pack's heads at block_m / pack positions.
GridSize prefill_sm90_tile_grid(int max_q_len, int n_heads, int group, int batch, int consumers);

// Why the Hopper implementation of `spec`'s family does not serve the variant's shape, target
// and features (null when it does): whether a Hopper variant of it exists. Used by `warm` (which
// variants a shape may need), the strict-mode hint and the variant-name checks.
// (hopper_serves, in runtime/kernel_spec.hpp, is its yes or no.)
const char* hopper_variant_refusal(const KernelSpec& spec);

// The same from the shape's fields, for families that plan without an AttentionProblem (MLA).
const char* hopper_shape_refusal(KernelKind kind, int head_dim, int page_size, std::uint32_t flags,
                                 const std::string& arch, bool force_no_mma);

}  // namespace astrai::detail
