#include "runtime/plan/mla_plan.hpp"

#include <algorithm>
#include <tuple>

#include <fmt/format.h>

#include "astrai/error.hpp"
#include "kernel_src/hopper_params.h"
#include "kernel_src/kernel_params.h"
#include "runtime/plan/implementations.hpp"

namespace astrai::detail {

namespace {

// Targets whose CTAs may take 160 KB of shared memory (A100, Orin, Hopper, Blackwell data
// center); the others offer about 99 KB.
bool large_shared_memory(const std::string& arch) {
  const int number = arch_number(arch);
  return number == 80 || number == 87 || number == 90 || number == 100 || number == 103 || number == 110;
}

const Implementation& portable_mla() {
  static const Implementation implementation{ImplementationId::portable_mla_decode, "portable_mla_decode", false,
                                             true, nullptr, nullptr};
  return implementation;
}

const Implementation& sm90_mla() {
  static const Implementation implementation{ImplementationId::sm90_wgmma_mla_decode, "sm90_wgmma_mla_decode", true,
                                             true, nullptr, nullptr};
  return implementation;
}

// Why the sm_90a kernel does not serve the call; null when it does.
const char* mla_sm90_refusal(const MlaProblem& problem, const DeviceTraits& device) {
  if (device.no_hopper && device.arch == "sm_90a" && device.uses_mma()) return "ASTRAI_JIT_NO_WGMMA is set";
  if (const char* why = hopper_shape_refusal(KernelKind::mla_decode, kMlaQkDim, problem.page_size,
                                             decode_q_len_flags(problem.q_len) | problem.kv_flags, device.arch,
                                             device.force_no_mma))
    return why;
  if (problem.tma_refused) return "the driver refused a TMA view of the cache";
  return nullptr;
}

}  // namespace

MlaTiling mla_tiling(const std::string& arch, int n_heads, int q_len) {
  const bool large = large_shared_memory(arch);
  const int rows = std::max(n_heads, 1) * std::max(q_len, 1);
  MlaTiling tiling;
  tiling.row_groups = std::clamp((rows + 15) / 16, 1, large ? 4 : 2);
  tiling.block_n = large ? 32 : 16;
  return tiling;
}

bool MlaProblem::operator==(const MlaProblem& o) const {
  return std::tie(dtype, batch, q_len, n_heads, page_size, capacity, kv_flags, caller_workspace, workspace_bytes,
                  tma_refused) == std::tie(o.dtype, o.batch, o.q_len, o.n_heads, o.page_size, o.capacity, o.kv_flags,
                                           o.caller_workspace, o.workspace_bytes, o.tma_refused);
}

Plan plan_mla_decode(const MlaProblem& problem, const DeviceTraits& device) {
  Plan plan;
  const char* sm90_refusal = mla_sm90_refusal(problem, device);
  plan.implementation = sm90_refusal == nullptr ? &sm90_mla() : &portable_mla();
  if (sm90_refusal != nullptr && device.arch == "sm_90a") plan.passed_over[plan.passed_over_count++] = {&sm90_mla(), sm90_refusal};
  plan.spec.hopper = sm90_refusal == nullptr;
  plan.spec.kind = KernelKind::mla_decode;
  plan.spec.dtype = problem.dtype;
  plan.spec.head_dim = kMlaQkDim;
  plan.spec.page_size = problem.page_size;
  plan.spec.group_size = problem.n_heads;
  plan.spec.flags = decode_q_len_flags(problem.q_len) | problem.kv_flags;
  plan.spec.arch = device.arch;
  plan.spec.force_no_mma = device.force_no_mma;
  plan.spec.validate();  // the family's rules: tensor cores (no CUDA-core path), heads, page sizes
  const MlaTiling tiling = mla_tiling(device.arch, problem.n_heads, problem.q_len);
  const int rows_per_cta = plan.spec.hopper ? kMlaSm90Rows : tiling.rows();
  plan.block = plan.spec.hopper ? kMlaSm90Threads : tiling.threads();
  plan.block_n = plan.spec.hopper ? kMlaSm90BlockN : tiling.block_n;
  plan.smem = plan.spec.hopper ? mla_sm90_smem_bytes()
                               : mla_decode_smem_bytes(tiling.rows(), tiling.block_n, problem.kv_flags != 0);
  // The tiling follows the compile target; a target chosen for another GPU (ASTRAI_JIT_ARCH=
  // compute_80 on an sm_89) may ask for more than this one has.
  if (device.max_smem_per_cta > 0 && plan.smem > device.max_smem_per_cta)
    throw InvalidArgument(fmt::format("mla_decode: the {} variant's tiling needs {} bytes of shared memory a CTA, "
                                      "this GPU offers {} (allowed: a target of the GPU's own shared memory; "
                                      "leave ASTRAI_JIT_ARCH unset or name the GPU's own target)",
                                      device.arch, plan.smem, device.max_smem_per_cta));
  const int row_tiles = (problem.n_heads * problem.q_len + rows_per_cta - 1) / rows_per_cta;
  // One CTA an SM (its shared memory); the split plan fills the SMs a few times over. A split
  // CTA's partials (its rows x 512 f32, written and read back) are 3.6 blocks of latent cache at
  // 64 rows; the plan weighs them twice that, the weight that on the H100 picked the fastest
  // split count of a workspace-capped sweep at batch 1, 4 and 8 (32 of 128 blocks at 8192
  // tokens, 24.8 us against 28.0 with 64; 64 of 512 at 32768).
  const double partial_bytes = 2.0 * rows_per_cta * kMlaVDim * sizeof(float);
  const double block_bytes = static_cast<double>(kDecodeBlockTokens) * kMlaQkDim * 2;
  plan.split = plan_decode_splits(problem.batch, 1, row_tiles, problem.capacity, std::max(device.num_sms, 1),
                                  2.0 * partial_bytes / block_bytes);
  if (problem.caller_workspace)
    plan.split = cap_decode_splits(plan.split, problem.capacity, problem.workspace_bytes, problem.batch,
                                   problem.n_heads * problem.q_len, kMlaVDim);
  plan.workspace_bytes = decode_workspace_bytes(plan.split, problem.batch, problem.n_heads * problem.q_len, kMlaVDim);
  plan.grid = {static_cast<unsigned>(row_tiles), static_cast<unsigned>(problem.batch),
               static_cast<unsigned>(plan.split.num_splits)};
  return plan;
}

}  // namespace astrai::detail
