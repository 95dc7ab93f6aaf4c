// paged_prefill: prefill over a paged KV cache with a ragged batch of queries (chunked prefill)
// (kernel_src/prefill.cuh). Descriptor, argument checks and launch.
#include <algorithm>
#include <cstdint>
#include <limits>

#include <fmt/format.h>

#include "runtime/families/arg_checks.hpp"
#include "runtime/families/attention_features.hpp"
#include "kernel_src/hopper_params.h"
#include "runtime/families/prefill_launch.hpp"
#include "runtime/validation.hpp"

namespace astrai {

namespace detail {

const KernelFamily& paged_prefill_family() {
  static const KernelFamily family{
      KernelKind::paged_prefill,
      "paged_prefill",
      /*paged=*/true,
      /*grouped=*/true,
      /*warm_by_default=*/false,
      "prefill.cuh",
      [](const KernelSpec& spec) { return prefill_instantiations(spec, spec.page_size); },
      attention_limits(/*paged=*/true),
      /*supported_flags=*/attention_option_flags(KernelKind::paged_prefill),
      attention_warm_defaults(/*paged=*/true),
      /*hopper=*/{"prefill_sm90.cuh",
                  [](const KernelSpec& spec) { return prefill_sm90_instantiations(spec, spec.page_size); },
                  [](int head_dim, int page_size) { return prefill_sm90_serves(head_dim, page_size); }, "wgmma",
                  prefill_sm90_features(), prefill_sm90_has_wide},
  };
  return family;
}

PagedPrefillArgs resolve_paged_prefill_args(const PagedPrefillArgs& input) {
  const KernelFamily& family = paged_prefill_family();
  const char* kCall = family.name;
  PagedPrefillArgs a = input;
  require_dtype(kCall, a.dtype);
  require_batch(kCall, a.batch);
  require_non_negative(kCall, "total_q", a.total_q);
  require_non_negative(kCall, "max_q_len", a.max_q_len);
  if (a.batch > 0 && a.total_q > 0) {
    // Some request holds at least total_q / batch rows and none more than total_q.
    const int lowest = static_cast<int>((1LL * a.total_q + a.batch - 1) / a.batch);
    if (a.max_q_len < lowest || a.max_q_len > a.total_q)
      fail_argument(kCall, fmt::format("max_q_len {} is not valid for total_q {} over batch {} (allowed: "
                              "{}..{})", a.max_q_len, a.total_q, a.batch, lowest, a.total_q));
  }
  require_attention_heads(family, a.n_heads, a.n_kv_heads, a.head_dim);
  require_page_size(family, a.page_size);
  require_positive(kCall, "num_pages", a.num_pages);
  require_positive(kCall, "max_pages_per_seq", a.max_pages_per_seq);
  const std::int64_t capacity = static_cast<std::int64_t>(a.max_pages_per_seq) * a.page_size;
  if (capacity > std::numeric_limits<int>::max())
    fail_argument(kCall, fmt::format("max_pages_per_seq {} x page_size {} = {} tokens exceeds the limit of {} "
                            "tokens", a.max_pages_per_seq, a.page_size, capacity,
                            std::numeric_limits<int>::max()));
  a.scale = resolve_scale(kCall, a.scale, a.head_dim);
  check_attention_options(kCall, a, {family.kind, a.causal, "causal = true"});

  const std::int64_t d = a.head_dim;
  if (a.q_stride_head == 0) a.q_stride_head = d;
  if (a.q_stride_token == 0) a.q_stride_token = a.n_heads * a.q_stride_head;
  if (a.out_stride_head == 0) a.out_stride_head = d;
  if (a.out_stride_token == 0) a.out_stride_token = a.n_heads * a.out_stride_head;
  if (a.page_table_stride == 0) a.page_table_stride = a.max_pages_per_seq;
  // Rows numbered per request may share one row (stride 0 broadcasts it over the request's
  // queries); rows across the batch default to contiguous.
  if (a.mask_stride_q == 0 && !a.mask_rows_per_request) a.mask_stride_q = capacity;

  require_stride(kCall, "q_stride_head", a.q_stride_head, d, a.n_heads > 1);
  require_stride(kCall, "q_stride_token", a.q_stride_token, 1, false);
  resolve_kv_strides(kCall, {"k_stride_page", &a.k_stride_page}, {"k_stride_token", &a.k_stride_token},
                     {"k_stride_head", &a.k_stride_head}, a.n_kv_heads, d, a.page_size);
  resolve_kv_strides(kCall, {"v_stride_page", &a.v_stride_page}, {"v_stride_token", &a.v_stride_token},
                     {"v_stride_head", &a.v_stride_head}, a.n_kv_heads, d, a.page_size);
  require_stride(kCall, "out_stride_head", a.out_stride_head, 1, false);
  require_stride(kCall, "out_stride_token", a.out_stride_token, 1, false);
  require_disjoint_rows(kCall, d, {{"out_stride_head", a.out_stride_head, a.n_heads},
                                   {"out_stride_token", a.out_stride_token, a.total_q}});
  if (a.page_table_stride < a.max_pages_per_seq)
    fail_argument(kCall, fmt::format("page_table_stride {} is smaller than max_pages_per_seq {}",
                            a.page_table_stride, a.max_pages_per_seq));
  if (a.mask != nullptr && !a.mask_rows_per_request) require_mask_stride(kCall, "mask_stride_q", a.mask_stride_q);
  if (a.mask != nullptr && a.mask_rows_per_request && a.mask_stride_q < 0)
    fail_argument(kCall, fmt::format("mask_stride_q {} is not valid (allowed: >= 0; 0 shares one row)",
                                     a.mask_stride_q));
  check_fp8_attention(kCall, a, a.scale, a.head_dim, a.page_size, a.mask, "causal",
                      {{"q_stride_head", a.q_stride_head}, {"q_stride_token", a.q_stride_token},
                       {"k_stride_page", a.k_stride_page}, {"k_stride_token", a.k_stride_token},
                       {"k_stride_head", a.k_stride_head}, {"v_stride_page", a.v_stride_page},
                       {"v_stride_token", a.v_stride_token}, {"v_stride_head", a.v_stride_head}});
  require_fp8_strides(kCall, a,
                      {{"k_stride_page", a.k_stride_page}, {"k_stride_token", a.k_stride_token},
                       {"k_stride_head", a.k_stride_head}, {"v_stride_page", a.v_stride_page},
                       {"v_stride_token", a.v_stride_token}, {"v_stride_head", a.v_stride_head}});

  if (1LL * a.batch * a.total_q > 0) {
    require_pointer(kCall, "q", a.q, 16);
    require_pointer(kCall, "k_cache", a.k_cache, 16);
    require_pointer(kCall, "v_cache", a.v_cache, 16);
    require_pointer(kCall, "out", a.out, 16);
    require_index_table(kCall, "qo_indptr", a.qo_indptr);
    require_index_table(kCall, "seq_lens", a.seq_lens);
    require_index_table(kCall, "page_table", a.page_table);
  }
  resolve_table_rows(kCall, &a.page_table_rows, a.batch, a.req_indices);
  if (a.mask != nullptr && a.mask_rows_per_request)
    require_mask_stride(kCall, "mask_stride_batch", a.mask_stride_batch);
  require_optional_alignment(kCall, "lse", a.lse, 4);
  return a;
}

}  // namespace detail

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
  params.mask_stride_batch = args.mask_rows_per_request ? args.mask_stride_batch : 0;
  params.mask_stride_q = args.mask_stride_q;
  params.lse = args.lse;
  params.qo_indptr = detail::index_pointer(args.qo_indptr);
  params.seq_lens = detail::index_pointer(args.seq_lens);
  params.page_table = detail::index_pointer(args.page_table);
  params.page_table_stride = args.page_table_stride;
  params.req_indices = detail::index_pointer(args.req_indices);
  params.page_table_rows = args.page_table_rows;
  params.layout_bits = detail::index_layout_bits(args.page_table, args.req_indices, args.seq_lens,
                                                 args.seq_lens_are_offsets, args.qo_indptr) |
                       (args.mask_rows_per_request ? kMaskRowsLocal : 0u);
  params.batch = args.batch;
  params.n_heads = args.n_heads;
  params.n_kv_heads = args.n_kv_heads;
  params.total_q = args.total_q;
  params.num_pages = args.num_pages;
  params.max_pages_per_seq = args.max_pages_per_seq;
  params.causal_offset = args.causal ? 0 : -1;
  params.scale_log2 = args.scale * detail::kLog2e;
  const detail::FeatureRequest features = detail::attention_features(args, args.scale);
  params.features = features.values;
  params.q_scale = args.q_scale;
  params.q_scale_stride = args.q_scale_per_head ? 1 : 0;
  detail::launch_prefill(*impl_, detail::paged_prefill_family(), "cuLaunchKernel(paged_prefill)", args.dtype,
                 args.head_dim, args.page_size, features.flags, args.max_q_len, params, args.stream);
}

}  // namespace astrai
