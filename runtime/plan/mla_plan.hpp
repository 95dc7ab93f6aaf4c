// The Plan of an MLA decode call: on sm_90a the TMA and wgmma kernel (kernel_src/mla_decode_sm90.cuh:
// 64 query rows a CTA, blocks of 64 keys) where it serves the shape, else the mma.sync kernel
// (kernel_src/mla_decode.cuh) from sm_80, whose tiling (query rows a CTA, keys a block) follows the
// device's shared memory; a split-KV plan like paged_decode's. Pure functions: the unit tests
// plan on the CPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "runtime/plan/attention_plan.hpp"

namespace astrai::detail {

// A CTA's tiling: 16 x row_groups query rows (heads, and tokens of a multi-token decode) and
// blocks of block_n keys; from the target alone (its shared memory per CTA) and the rows.
struct MlaTiling {
  int row_groups = 0;
  int block_n = 0;
  int rows() const { return 16 * row_groups; }
  int threads() const { return 64 * row_groups; }
};
MlaTiling mla_tiling(const std::string& arch, int n_heads, int q_len);

struct MlaProblem {
  DType dtype = DType::bf16;
  int batch = 0;
  int q_len = 1;
  int n_heads = 0;
  int page_size = 0;
  long long capacity = 0;  // table width x page size: what the split plan covers
  std::uint32_t kv_flags = 0;  // an FP8 cache: kFeatureKvE4m3 or kFeatureKvE5m2
  bool caller_workspace = false;
  std::size_t workspace_bytes = 0;
  bool tma_refused = false;  // the driver refused a TMA view of the cache: the portable kernel
  bool operator==(const MlaProblem& other) const;
  bool operator!=(const MlaProblem& other) const { return !(*this == other); }
};

// The variant (mla_decode.<dtype>.hd576.ps<page>.g<heads>[.kv_e4m3][.q<len>].<arch>), block, shared
// memory, grid (row tiles, batch, splits) and split plan; throws InvalidArgument when the
// variant breaks the family's rules (KernelSpec::validate: no tensor cores, ASTRAI_JIT_NO_MMA) or
// needs more shared memory than the device has.
Plan plan_mla_decode(const MlaProblem& problem, const DeviceTraits& device);

}  // namespace astrai::detail
