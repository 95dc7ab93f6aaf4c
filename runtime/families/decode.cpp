// decode: one query token per sequence over a contiguous KV cache. It runs the paged decode
// kernel with page size 0 (contiguous addressing). Descriptor, argument checks and launch.
#include <algorithm>

#include <fmt/format.h>

#include "kernel_src/hopper_params.h"
#include "runtime/families/arg_checks.hpp"
#include "runtime/families/attention_features.hpp"
#include "runtime/families/decode_launch.hpp"
#include "runtime/validation.hpp"

namespace astrai {

namespace detail {

const KernelFamily& decode_family() {
  static const KernelFamily family{
      KernelKind::decode,
      "decode",
      /*paged=*/false,
      /*grouped=*/true,
      /*warm_by_default=*/false,
      "paged_decode.cuh",
      [](const KernelSpec& spec) { return decode_instantiations(spec, 0); },
      attention_limits(/*paged=*/false),
      /*supported_flags=*/attention_option_flags(KernelKind::decode),
      attention_warm_defaults(/*paged=*/false),
      /*hopper=*/{"paged_decode_sm90.cuh", [](const KernelSpec& spec) { return decode_sm90_instantiations(spec, 0); },
                  [](int head_dim, int) { return decode_sm90_serves(head_dim, 0); }, "tma", decode_sm90_features(),
                  decode_sm90_has_wide_tiling},
  };
  return family;
}

DecodeArgs resolve_decode_args(const DecodeArgs& input) {
  const KernelFamily& family = decode_family();
  const char* kCall = family.name;
  DecodeArgs a = input;
  require_dtype(kCall, a.dtype);
  require_batch(kCall, a.batch);
  require_non_negative(kCall, "kv_len", a.kv_len);
  require_attention_heads(family, a.n_heads, a.n_kv_heads, a.head_dim);
  if (a.causal_offset < -1)
    fail_argument(kCall, fmt::format("causal_offset {} is not valid (allowed: -1 for no limit, or >= 0)",
                                     a.causal_offset));
  a.scale = resolve_scale(kCall, a.scale, a.head_dim);
  check_attention_options(kCall, a, {family.kind});
  // ALiBi measures from the query's position, which the kernel takes as its last key's: a query
  // past the keys would shift every bias of its row (and its LSE).
  if (a.alibi_slopes != nullptr && a.causal_offset >= a.kv_len)
    fail_argument(kCall, fmt::format("alibi_slopes with causal_offset {} past kv_len {}: the query must sit at a "
                                     "key position (allowed: causal_offset -1 or < kv_len)", a.causal_offset, a.kv_len));
  const std::int64_t d = a.head_dim;
  if (a.mask_stride_batch == 0) a.mask_stride_batch = a.kv_len;
  resolve_token_strides(kCall, {"q_stride_batch", &a.q_stride_batch}, {"q_stride_head", &a.q_stride_head},
                        a.n_heads, d, 0);
  resolve_kv_strides(kCall, {"k_stride_batch", &a.k_stride_batch}, {"k_stride_seq", &a.k_stride_seq},
                     {"k_stride_head", &a.k_stride_head}, a.n_kv_heads, d, std::max<std::int64_t>(1, a.kv_len));
  resolve_kv_strides(kCall, {"v_stride_batch", &a.v_stride_batch}, {"v_stride_seq", &a.v_stride_seq},
                     {"v_stride_head", &a.v_stride_head}, a.n_kv_heads, d, std::max<std::int64_t>(1, a.kv_len));
  // Outputs must not overlap, or blocks would race on them.
  resolve_token_strides(kCall, {"out_stride_batch", &a.out_stride_batch}, {"out_stride_head", &a.out_stride_head},
                        a.n_heads, d, a.batch);
  require_fp8_strides(kCall, a,
                      {{"k_stride_batch", a.k_stride_batch}, {"k_stride_seq", a.k_stride_seq},
                       {"k_stride_head", a.k_stride_head}, {"v_stride_batch", a.v_stride_batch},
                       {"v_stride_seq", a.v_stride_seq}, {"v_stride_head", a.v_stride_head}});
  if (a.mask != nullptr && a.batch > 1 && a.mask_stride_batch < a.kv_len)
    fail_argument(kCall, fmt::format("mask_stride_batch {} is smaller than kv_len {}", a.mask_stride_batch,
                                     a.kv_len));
  if (a.mask_stride_batch < 0)
    fail_argument(kCall, fmt::format("mask_stride_batch {} is not valid (allowed: >= 0)", a.mask_stride_batch));
  if (a.batch > 0) {
    require_pointer(kCall, "q", a.q, 16);
    require_pointer(kCall, "out", a.out, 16);
    if (a.kv_len > 0) {
      require_pointer(kCall, "k", a.k, 16);
      require_pointer(kCall, "v", a.v, 16);
    }
  }
  require_optional_alignment(kCall, "lse", a.lse, 4);
  require_optional_alignment(kCall, "workspace", a.workspace, 16);
  return a;
}

}  // namespace detail

void Runtime::decode(const DecodeArgs& input) {
  const DecodeArgs args = detail::resolve_decode_args(input);
  if (args.batch == 0) return;
  const detail::FeatureRequest features = detail::attention_features(args, args.scale);
  PagedDecodeParams params = detail::common_decode_params(args, features);
  params.k_cache = args.k;
  params.v_cache = args.v;
  params.k_stride_page = args.k_stride_batch;
  params.k_stride_token = args.k_stride_seq;
  params.k_stride_head = args.k_stride_head;
  params.v_stride_page = args.v_stride_batch;
  params.v_stride_token = args.v_stride_seq;
  params.v_stride_head = args.v_stride_head;
  // The causal offset only shortens the range: the query at position c sees [0, c].
  params.kv_capacity = args.causal_offset < 0 ? args.kv_len : std::min(args.kv_len, args.causal_offset + 1);
  // The kernel measures the window from kv_capacity - 1; a causal offset past kv_len puts the
  // query further on, which shortens the window (-1: it ends before the keys, nothing is kept).
  if (args.window_left >= 0) {
    const long long position = args.causal_offset < 0 ? args.kv_len - 1LL : args.causal_offset;
    const long long shifted = args.window_left - (position - (params.kv_capacity - 1LL));
    params.features.window_left = static_cast<int>(std::max(shifted, -1LL));
  }
  params.num_pages = 0;
  detail::launch_decode(*impl_,
                        {detail::decode_family(), args.dtype, args.head_dim, 0,
                         static_cast<CUstream>(args.stream), args.workspace, args.workspace_bytes, features.flags},
                        params);
}

}  // namespace astrai
