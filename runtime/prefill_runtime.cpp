// Runtime::prefill and Runtime::paged_prefill: argument checks, variant choice and launch of
// the prefill kernel (kernel_src/prefill.cuh), one template for contiguous and paged KV.
#include <algorithm>
#include <cstdint>

#include "astrai/runtime.hpp"
#include "kernel_src/kernel_params.h"
#include "runtime/kernel_spec.hpp"
#include "runtime/runtime_impl.hpp"
#include "runtime/validation.hpp"

namespace astrai {

namespace {

// The tensor-core and CUDA-core paths tile differently: which one runs on `device`.
bool prefill_uses_mma(const detail::DeviceState& device) {
  KernelSpec probe;
  probe.arch = device.arch;
  probe.force_no_mma = device.force_no_mma;
  return probe.uses_mma();
}

void launch_prefill(Runtime::Impl& impl, KernelKind kind, const char* launch_name, DType dtype,
                    int head_dim, int page_size, int max_q_len, const PrefillParams& params,
                    void* stream) {
  detail::DeviceState& device = impl.current_device();
  detail::VariantRequest request;
  request.kind = kind;
  request.dtype = dtype;
  request.head_dim = head_dim;
  request.page_size = page_size;
  request.group = params.n_heads / params.n_kv_heads;
  const bool mma = prefill_uses_mma(device);
  request.dynamic_smem = mma ? prefill_smem_bytes(head_dim) : prefill_core_smem_bytes(head_dim);
  const auto& variant = impl.variant(device, request);
  const int block_q = mma ? prefill_block_q(head_dim) : kPrefillCoreBlockQ;
  const long long q_tiles = (static_cast<long long>(max_q_len) + block_q - 1) / block_q;
  PrefillParams launch_params = params;
  impl.launch(device, variant.functions[0], launch_name,
              {static_cast<unsigned>(q_tiles), static_cast<unsigned>(params.n_heads),
               static_cast<unsigned>(params.batch)},
              kPrefillThreads, static_cast<unsigned>(request.dynamic_smem),
              static_cast<CUstream>(stream), &launch_params);
}

}  // namespace

void Runtime::prefill(const PrefillArgs& input) {
  const PrefillArgs args = detail::resolve_prefill_args(input);
  if (args.batch == 0 || args.q_len == 0) return;
  PrefillParams params{};
  params.q = args.q;
  params.q_stride_batch = args.q_stride_batch;
  params.q_stride_seq = args.q_stride_seq;
  params.q_stride_head = args.q_stride_head;
  params.k = args.k;
  params.v = args.v;
  params.k_stride_batch = args.k_stride_batch;
  params.k_stride_seq = args.k_stride_seq;
  params.k_stride_head = args.k_stride_head;
  params.v_stride_batch = args.v_stride_batch;
  params.v_stride_seq = args.v_stride_seq;
  params.v_stride_head = args.v_stride_head;
  params.out = args.out;
  params.out_stride_batch = args.out_stride_batch;
  params.out_stride_seq = args.out_stride_seq;
  params.out_stride_head = args.out_stride_head;
  params.mask = reinterpret_cast<const unsigned char*>(args.mask);
  // Size-1 mask dims broadcast through a zero stride.
  params.mask_stride_batch = args.mask_batch == 1 ? 0 : args.mask_stride_batch;
  params.mask_stride_q = args.mask_q_len == 1 ? 0 : args.mask_stride_q;
  params.lse = args.lse;
  params.batch = args.batch;
  params.q_len = args.q_len;
  params.kv_len = args.kv_len;
  params.n_heads = args.n_heads;
  params.n_kv_heads = args.n_kv_heads;
  params.causal_offset = args.causal_offset;
  params.scale_log2 = args.scale * detail::kLog2e;
  launch_prefill(*impl_, KernelKind::prefill, "cuLaunchKernel(prefill)", args.dtype, args.head_dim,
                 0, args.q_len, params, args.stream);
}

void Runtime::paged_prefill(const PagedPrefillArgs& input) {
  const PagedPrefillArgs args = detail::resolve_paged_prefill_args(input);
  if (args.batch == 0 || args.total_q == 0 || args.max_q_len == 0) return;
  PrefillParams params{};
  params.q = args.q;
  params.q_stride_batch = 0;  // rows are numbered globally through qo_indptr
  params.q_stride_seq = args.q_stride_token;
  params.q_stride_head = args.q_stride_head;
  params.k = args.k_cache;
  params.v = args.v_cache;
  params.k_stride_page = args.k_stride_page;
  params.k_stride_seq = args.k_stride_token;
  params.k_stride_head = args.k_stride_head;
  params.v_stride_page = args.v_stride_page;
  params.v_stride_seq = args.v_stride_token;
  params.v_stride_head = args.v_stride_head;
  params.out = args.out;
  params.out_stride_batch = 0;
  params.out_stride_seq = args.out_stride_token;
  params.out_stride_head = args.out_stride_head;
  params.mask = reinterpret_cast<const unsigned char*>(args.mask);
  params.mask_stride_batch = 0;
  params.mask_stride_q = args.mask_stride_q;
  params.lse = args.lse;
  params.qo_indptr = args.qo_indptr;
  params.seq_lens = args.seq_lens;
  params.page_table = args.page_table;
  params.page_table_stride = args.page_table_stride;
  params.batch = args.batch;
  params.n_heads = args.n_heads;
  params.n_kv_heads = args.n_kv_heads;
  params.total_q = args.total_q;
  params.num_pages = args.num_pages;
  params.max_pages_per_seq = args.max_pages_per_seq;
  params.causal_offset = args.causal ? 0 : -1;
  params.scale_log2 = args.scale * detail::kLog2e;
  launch_prefill(*impl_, KernelKind::paged_prefill, "cuLaunchKernel(paged_prefill)", args.dtype,
                 args.head_dim, args.page_size, args.max_q_len, params, args.stream);
}

}  // namespace astrai
