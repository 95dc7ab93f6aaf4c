// The launch paged_decode and decode share: both run kernel_src/paged_decode.cuh (decode with
// page size 0), with the same split plan, workspace and split-combine kernel.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "astrai/runtime.hpp"
#include "kernel_src/kernel_params.h"
#include "runtime/families/attention_features.hpp"
#include "runtime/runtime_impl.hpp"

namespace astrai::detail {

// Head dims (and features) whose Hopper decode has wide CTAs too (HopperImplementation::has_wide):
// hd64, whose four split groups fit an SM, with a 16-bit or an FP8 cache.
bool decode_sm90_has_wide_tiling(int head_dim, std::uint32_t flags);

// What differs between paged and contiguous decode at launch time.
struct DecodeLaunch {
  const KernelFamily& family;
  DType dtype;
  int head_dim;
  int page_size;  // 0 for contiguous decode
  CUstream stream;
  void* workspace;  // caller-provided, or null for the runtime's own
  std::size_t workspace_bytes;
  std::uint32_t flags = 0;  // the family's feature bits this call compiles in
};

// Picks the split plan from the capacity, places the workspace, launches the attention kernel
// (on sm_90a the Hopper one where it serves the call) and, when split, the combine kernel (a
// programmatic dependent launch where supported).
void launch_decode(Runtime::Impl& impl, const DecodeLaunch& launch, PagedDecodeParams params);
// The split workspace of num_splits x `rows` rows of head_dim floats at `base`: the partial
// outputs, then (256-byte aligned) their LSEs, as decode_workspace_bytes sizes it.
SplitWorkspace split_workspace_at(CUdeviceptr base, int num_splits, std::size_t rows, int head_dim);

// Where the split combine writes: rows (batch, token, head) of q_len tokens.
struct CombineTarget {
  float* lse;
  void* out;
  long long out_stride_batch, out_stride_seq, out_stride_head;
  int batch, n_heads, q_len;
  int head_dim;  // of the rows (the combine's grid has a CTA per row and column slice)
};
// The split combine (a variant's second kernel) of `workspace` into `target`, a programmatic
// dependent of the attention kernel: merging in the attention kernel instead (the last split CTA
// of each column, with per-stream counters) measured slower, batch 1 x 1024 7.17 -> 8.16 us a
// call, since the dependent launch overlaps the next call's start (docs/decisions/0001).
void launch_split_combine(Device& device, CUfunction combine, const SplitWorkspace& workspace,
                          const CombineTarget& target, CUstream stream, const char* name);

// The variant of the attention kernel launch_decode last launched on this thread (empty before
// the first): the bench names it, since a Hopper call's tiling follows its split plan.
const std::string& last_decode_variant();

// The fields paged and contiguous decode fill alike: query, output, LSE, mask, shape, scale
// and the features' values (their bits go to DecodeLaunch::flags).
template <typename Args>
PagedDecodeParams common_decode_params(const Args& args, const FeatureRequest& features) {
  PagedDecodeParams params{};
  params.features = features.values;
  params.q = args.q;
  params.q_stride_batch = args.q_stride_batch;
  params.q_stride_head = args.q_stride_head;
  params.mask = args.mask;
  params.mask_stride_batch = args.mask_stride_batch;
  params.lse = args.lse;
  params.out = args.out;
  params.out_stride_batch = args.out_stride_batch;
  params.out_stride_head = args.out_stride_head;
  params.batch = args.batch;
  params.n_heads = args.n_heads;
  params.n_kv_heads = args.n_kv_heads;
  params.scale_log2 = args.scale * kLog2e;
  return params;
}

// Instantiations of kernel_src/paged_decode.cuh: the attention kernel (page size 0 selects
// contiguous addressing), then the split combine.
std::vector<std::string> decode_instantiations(const KernelSpec& spec, int page_size);
// The same for the Hopper decode (kernel_src/paged_decode_sm90.cuh: K and V by TMA).
std::vector<std::string> decode_sm90_instantiations(const KernelSpec& spec, int page_size);

}  // namespace astrai::detail
