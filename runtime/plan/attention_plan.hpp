// The Plan: the one place that decides how an attention call runs. A call's checked arguments
// become a normalized AttentionProblem; with the device's traits, plan_attention picks the
// implementation (runtime/plan/implementations.hpp, in preference order), its configuration,
// the split-KV plan, grid, block and shared memory, and the variant that holds the kernel. The
// launchers execute plans; `warm`, the strict-mode hint, the bench and the checks ask the same
// functions, so no site re-derives a choice. Pure functions of their inputs: the unit tests plan
// on the CPU with hand-made traits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "astrai/runtime.hpp"
#include "runtime/env_config.hpp"
#include "runtime/kernel_spec.hpp"
#include "runtime/launch_heuristics.hpp"

namespace astrai::detail {

struct GridSize {
  unsigned x, y, z;
};

// What a plan needs of the device; Device::traits() fills it, tests write it by hand.
struct DeviceTraits {
  std::string arch;             // compile target: "sm_90a", "sm_89"
  int num_sms = 0;
  int max_smem_per_cta = 0;     // the GPU's opt-in shared memory a CTA, bytes (0: unknown, the target's)
  bool force_no_mma = false;    // ASTRAI_JIT_NO_MMA on an arch with tensor cores
  bool no_hopper = false;       // ASTRAI_JIT_NO_WGMMA
  TileChoice decode_tiles = TileChoice::automatic;   // ASTRAI_JIT_DECODE_TILES
  TileChoice prefill_tiles = TileChoice::automatic;  // ASTRAI_JIT_PREFILL_TILES

  bool uses_mma() const { return target_uses_mma(arch, force_no_mma); }
  // Hopper implementations allowed: an sm_90a target, tensor cores on, no ASTRAI_JIT_NO_WGMMA.
  bool uses_hopper() const { return arch == "sm_90a" && uses_mma() && !no_hopper; }
};

// One attention call, normalized: the variant's fields and the sizes the plan depends on. Two
// problems that compare equal get the same plan (the launchers memoize on it).
struct AttentionProblem {
  KernelKind kind = KernelKind::paged_decode;
  DType dtype = DType::bf16;
  int head_dim = 0;
  int page_size = 0;       // 0: contiguous KV
  int batch = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  std::uint32_t flags = 0;  // feature bits (kernel_src/kernel_params.h), the decode q_len field included
  bool masked = false;      // a mask tensor is passed
  // Decode: the tokens a split plan covers (decode_span_tokens of the table capacity) and the
  // caller's workspace, which caps the split count (0 bytes with a null workspace: none).
  long long span = 0;
  bool caller_workspace = false;
  std::size_t workspace_bytes = 0;
  // Prefill: the longest request's query rows and every request's rows summed.
  int max_q_len = 0;
  long long total_q = 0;
  // Set by a launcher when the Hopper implementation cannot take the call's tensors (a TMA
  // view the driver refuses): the plan passes it over with that reason.
  bool hopper_refused = false;

  int group() const { return n_kv_heads > 0 ? n_heads / n_kv_heads : 0; }
  bool operator==(const AttentionProblem& other) const;
  bool operator!=(const AttentionProblem& other) const { return !(*this == other); }
};

struct Implementation;

// An implementation the plan did not take, and why (static text: plans are made on the hot path).
struct PassedOver {
  const Implementation* implementation = nullptr;
  const char* reason = nullptr;
};

struct Plan {
  const Implementation* implementation = nullptr;
  KernelSpec spec;      // the variant holding the kernel (its Hopper and tiling fields set)
  int block = 0;        // threads per CTA
  int smem = 0;         // dynamic shared memory bytes
  GridSize grid{1, 1, 1};
  GridSize tiles{1, 1, 1};  // prefill: the tile grid (the launch grid too, unless persistent)
  // Decode: the split-KV plan (one split: no workspace, no combine) and the workspace it needs.
  DecodeSplitPlan split;
  std::size_t workspace_bytes = 0;
  int head_tiles = 0;   // decode: CTAs per (request, KV head)
  // Prefill on sm_90a: consumer warpgroups, KV rows a step, CTAs that walk the tile grid.
  int consumers = 0;
  int block_n = 0;
  bool persistent = false;
  PassedOver passed_over[2];  // better implementations not taken, in preference order
  int passed_over_count = 0;

  bool split_kv() const { return split.num_splits > 1; }
  // "paged_decode.bf16.hd128.ps16.g4.tma.sm_90a (sm90_tma_decode), grid 4x8x64, block 128, smem
  // 41984, 4 splits; passed over: ..." for logs, strict-mode messages and `astrai-jit plan`.
  std::string describe() const;
};

// CTAs of a portable variant the device runs at once, given its block and shared memory: the
// runtime loads the variant and asks the driver; the bench and tests give a model. Called only
// for implementations whose occupancy is not fixed by their shared memory.
using OccupancyQuery = std::function<int(const KernelSpec& spec, int block, int smem)>;

// The plan of a decode or paged_decode call.
Plan plan_decode(const AttentionProblem& problem, const DeviceTraits& device, const OccupancyQuery& occupancy);
// The plan of a prefill or paged_prefill call.
Plan plan_prefill(const AttentionProblem& problem, const DeviceTraits& device);
// Either, by the problem's kind (attention kinds only).
Plan plan_attention(const AttentionProblem& problem, const DeviceTraits& device, const OccupancyQuery& occupancy);

// Logs a plan once per distinct description at debug level (ASTRAI_JIT_LOG=debug), with the
// implementations it passed over and why; a plan that fell back (passed over one) is logged at
// info level, so that a user can see why a call does not take the fast path.
void log_plan(const Plan& plan);

// The occupancy model used where no driver answers (bench naming, `astrai-jit plan`): the CTAs
// that shared memory alone allows, at most 16 an SM.
int modeled_resident_ctas(const DeviceTraits& device, int smem);

}  // namespace astrai::detail
