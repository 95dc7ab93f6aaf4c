// paged_decode: one new query token per sequence (or q_len of them, multi-token decode)
// against a paged KV cache (kernel_src/paged_decode.cuh). Descriptor, argument checks and launch.
#include <algorithm>
#include <limits>

#include <fmt/format.h>

#include "kernel_src/hopper_params.h"
#include "runtime/families/arg_checks.hpp"
#include "runtime/families/attention_features.hpp"
#include "runtime/families/decode_launch.hpp"
#include "runtime/launch_heuristics.hpp"
#include "runtime/validation.hpp"

namespace astrai {

namespace detail {

const KernelFamily& paged_decode_family() {
  static const KernelFamily family{
      KernelKind::paged_decode,
      "paged_decode",
      /*paged=*/true,
      /*grouped=*/true,
      /*warm_by_default=*/true,
      "paged_decode.cuh",
      [](const KernelSpec& spec) { return decode_instantiations(spec, spec.page_size); },
      attention_limits(/*paged=*/true),
      /*supported_flags=*/attention_option_flags(KernelKind::paged_decode) | kFeatureQLenField,
      attention_warm_defaults(/*paged=*/true),
      /*hopper=*/{"paged_decode_sm90.cuh",
                  [](const KernelSpec& spec) { return decode_sm90_instantiations(spec, spec.page_size); },
                  [](int head_dim, int page_size) { return decode_sm90_serves(head_dim, page_size); }, "tma",
                  decode_sm90_features(), decode_sm90_has_wide_tiling},
  };
  return family;
}

namespace {

// Largest page-table capacity whose split plan stays in 32-bit token arithmetic: a plan rounds
// the capacity up to whole blocks and may add up to kMaxSplits - 1 blocks of slack, and the
// kernel computes split_begin + tokens_per_split in int.
constexpr long long kMaxTableTokens =
    (std::numeric_limits<int>::max() / kDecodeBlockTokens - (kMaxSplits - 1)) * 1LL * kDecodeBlockTokens;

}  // namespace

PagedDecodeArgs resolve_paged_decode_args(const PagedDecodeArgs& input) {
  const KernelFamily& family = paged_decode_family();
  const char* kCall = family.name;
  PagedDecodeArgs a = input;
  require_dtype(kCall, a.dtype);
  require_batch(kCall, a.batch);
  require_attention_heads(family, a.n_heads, a.n_kv_heads, a.head_dim);
  require_page_size(family, a.page_size);
  require_positive(kCall, "num_pages", a.num_pages);
  require_positive(kCall, "max_pages_per_seq", a.max_pages_per_seq);
  if (1LL * a.max_pages_per_seq * a.page_size > kMaxTableTokens)
    fail_argument(kCall, fmt::format("max_pages_per_seq {} x page_size {} = {} tokens exceeds the limit of {} "
                                     "tokens", a.max_pages_per_seq, a.page_size,
                                     1LL * a.max_pages_per_seq * a.page_size, kMaxTableTokens));
  a.scale = resolve_scale(kCall, a.scale, a.head_dim);
  check_attention_options(kCall, a, {family.kind});
  if (a.q_len < 1 || a.q_len > kMaxDecodeQLen)
    fail_argument(kCall, fmt::format("q_len {} is not valid (allowed: 1..{})", a.q_len, int{kMaxDecodeQLen}));

  const std::int64_t d = a.head_dim;
  if (a.page_table_stride == 0) a.page_table_stride = a.max_pages_per_seq;

  resolve_query_strides(kCall, {"q_stride_batch", &a.q_stride_batch}, {"q_stride_seq", &a.q_stride_seq},
                        {"q_stride_head", &a.q_stride_head}, a.n_heads, d, a.q_len, 0);
  resolve_kv_strides(kCall, {"k_stride_page", &a.k_stride_page}, {"k_stride_token", &a.k_stride_token},
                     {"k_stride_head", &a.k_stride_head}, a.n_kv_heads, d, a.page_size);
  resolve_kv_strides(kCall, {"v_stride_page", &a.v_stride_page}, {"v_stride_token", &a.v_stride_token},
                     {"v_stride_head", &a.v_stride_head}, a.n_kv_heads, d, a.page_size);
  // Outputs must not overlap, or blocks would race on them.
  resolve_query_strides(kCall, {"out_stride_batch", &a.out_stride_batch}, {"out_stride_seq", &a.out_stride_seq},
                        {"out_stride_head", &a.out_stride_head}, a.n_heads, d, a.q_len, a.batch);
  if (a.page_table_stride < a.max_pages_per_seq)
    fail_argument(kCall, fmt::format("page_table_stride {} is smaller than max_pages_per_seq {}",
                                     a.page_table_stride, a.max_pages_per_seq));
  require_fp8_strides(kCall, a,
                      {{"k_stride_page", a.k_stride_page}, {"k_stride_token", a.k_stride_token},
                       {"k_stride_head", a.k_stride_head}, {"v_stride_page", a.v_stride_page},
                       {"v_stride_token", a.v_stride_token}, {"v_stride_head", a.v_stride_head}});

  if (a.batch > 0) {
    require_pointer(kCall, "q", a.q, 16);
    require_pointer(kCall, "k_cache", a.k_cache, 16);
    require_pointer(kCall, "v_cache", a.v_cache, 16);
    require_pointer(kCall, "out", a.out, 16);
    require_index_table(kCall, "page_table", a.page_table);
  }
  require_optional_index_table(kCall, "seq_lens", a.seq_lens);
  if (a.seq_lens_are_offsets && a.seq_lens == nullptr)
    fail_argument(kCall, "seq_lens_are_offsets is set but seq_lens is null (allowed: [batch + 1] offsets)");
  resolve_table_rows(kCall, &a.page_table_rows, a.batch, a.req_indices);
  const std::int64_t capacity = static_cast<std::int64_t>(a.max_pages_per_seq) * a.page_size;
  if (a.mask_stride_batch == 0) a.mask_stride_batch = capacity;
  if (a.mask != nullptr && a.batch > 1 && a.mask_stride_batch < capacity)
    fail_argument(kCall, fmt::format("mask_stride_batch {} is smaller than the mask row length {} "
                                     "(max_pages_per_seq x page_size)", a.mask_stride_batch, capacity));
  if (a.mask_stride_batch < 0)
    fail_argument(kCall, fmt::format("mask_stride_batch {} is not valid (allowed: >= 0)", a.mask_stride_batch));
  if ((a.new_k == nullptr) != (a.new_v == nullptr))
    fail_argument(kCall, fmt::format("new_k = {} and new_v = {}: the fused append needs both or neither",
                                     a.new_k, a.new_v));
  if (a.new_k != nullptr && a.q_len > 1)
    fail_argument(kCall, fmt::format("new_k = {} is set with q_len {}: the fused append writes one token (allowed "
                                     "with q_len 1; write the {} new tokens' K/V into the cache before the call)",
                                     a.new_k, a.q_len, a.q_len));
  if (a.new_k != nullptr) {
    resolve_token_strides(kCall, {"new_k_stride_batch", &a.new_k_stride_batch},
                          {"new_k_stride_head", &a.new_k_stride_head}, a.n_kv_heads, d, 0);
    resolve_token_strides(kCall, {"new_v_stride_batch", &a.new_v_stride_batch},
                          {"new_v_stride_head", &a.new_v_stride_head}, a.n_kv_heads, d, 0);
    require_pointer(kCall, "new_k", a.new_k, 16);
    require_pointer(kCall, "new_v", a.new_v, 16);
  }
  require_optional_alignment(kCall, "lse", a.lse, 4);
  // The documented contract (astrai/runtime.hpp) is 16-byte alignment; the kernels read and
  // write the workspace as floats.
  require_optional_alignment(kCall, "workspace", a.workspace, 16);
  return a;
}

}  // namespace detail

std::size_t paged_decode_workspace_bytes(const PagedDecodeArgs& input, int num_sms) {
  const PagedDecodeArgs args = detail::resolve_paged_decode_args(input);
  const int group = args.n_heads / args.n_kv_heads;
  // Multi-token decode: each KV head's rows are its group's (head, token) pairs.
  const int head_tiles = (group * args.q_len + kDecodeHeadsPerTile - 1) / kDecodeHeadsPerTile;
  const long long span =
      detail::decode_span_tokens(1LL * args.max_pages_per_seq * args.page_size, args.window_left, args.q_len);
  // The plan depends on the kernel's occupancy, known once it is loaded: take the largest
  // workspace over every occupancy a 128-thread CTA can have.
  std::size_t bytes = 0;
  for (int per_sm = 1; per_sm <= 16; ++per_sm) {
    const auto plan = detail::plan_decode_splits(args.batch, args.n_kv_heads, head_tiles, span, per_sm * num_sms);
    bytes = std::max(bytes, detail::decode_workspace_bytes(plan, args.batch, args.n_heads * args.q_len,
                                                           args.head_dim));
  }
  return bytes;
}

void Runtime::paged_decode(const PagedDecodeArgs& input) {
  const PagedDecodeArgs args = detail::resolve_paged_decode_args(input);
  if (args.batch == 0) return;
  detail::FeatureRequest features = detail::attention_features(args, args.scale);
  features.flags |= decode_q_len_flags(args.q_len);
  PagedDecodeParams params = detail::common_decode_params(args, features);
  params.q_stride_seq = args.q_stride_seq;
  params.out_stride_seq = args.out_stride_seq;
  params.k_cache = args.k_cache;
  params.v_cache = args.v_cache;
  params.k_stride_page = args.k_stride_page;
  params.k_stride_token = args.k_stride_token;
  params.k_stride_head = args.k_stride_head;
  params.v_stride_page = args.v_stride_page;
  params.v_stride_token = args.v_stride_token;
  params.v_stride_head = args.v_stride_head;
  params.page_table = detail::index_pointer(args.page_table);
  params.page_table_stride = args.page_table_stride;
  params.req_indices = detail::index_pointer(args.req_indices);
  params.page_table_rows = args.page_table_rows;
  params.seq_lens = detail::index_pointer(args.seq_lens);
  params.layout_bits =
      detail::index_layout_bits(args.page_table, args.req_indices, args.seq_lens, args.seq_lens_are_offsets);
  params.kv_capacity = args.max_pages_per_seq * args.page_size;
  params.new_k = args.new_k;
  params.new_v = args.new_v;
  params.new_k_stride_batch = args.new_k_stride_batch;
  params.new_k_stride_head = args.new_k_stride_head;
  params.new_v_stride_batch = args.new_v_stride_batch;
  params.new_v_stride_head = args.new_v_stride_head;
  params.num_pages = args.num_pages;
  params.max_pages_per_seq = args.max_pages_per_seq;
  detail::launch_decode(*impl_,
                        {detail::paged_decode_family(), args.dtype, args.head_dim, args.page_size,
                         static_cast<CUstream>(args.stream), args.workspace, args.workspace_bytes, features.flags},
                        params);
}

}  // namespace astrai
