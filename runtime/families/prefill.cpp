// prefill: attention of a block of query tokens over a contiguous KV cache
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

const KernelFamily& prefill_family() {
  static const KernelFamily family{
      KernelKind::prefill,
      "prefill",
      /*paged=*/false,
      /*grouped=*/true,
      /*warm_by_default=*/false,
      "prefill.cuh",
      [](const KernelSpec& spec) { return prefill_instantiations(spec, 0); },
      attention_limits(/*paged=*/false),
      /*supported_flags=*/attention_option_flags(KernelKind::prefill),
      attention_warm_defaults(/*paged=*/false),
      /*hopper=*/{"prefill_sm90.cuh", [](const KernelSpec& spec) { return prefill_sm90_instantiations(spec, 0); },
                  [](int head_dim, int) { return prefill_sm90_serves(head_dim, 0); }, "wgmma",
                  prefill_sm90_features(), prefill_sm90_has_wide},
  };
  return family;
}

PrefillArgs resolve_prefill_args(const PrefillArgs& input) {
  const KernelFamily& family = prefill_family();
  const char* kCall = family.name;
  PrefillArgs a = input;
  require_dtype(kCall, a.dtype);
  require_batch(kCall, a.batch);
  require_non_negative(kCall, "q_len", a.q_len);
  require_non_negative(kCall, "kv_len", a.kv_len);
  require_attention_heads(family, a.n_heads, a.n_kv_heads, a.head_dim);
  if (a.causal_offset < -1)
    fail_argument(kCall, fmt::format("causal_offset {} is not valid (allowed: -1 for non-causal, or >= 0)",
                            a.causal_offset));
  a.scale = resolve_scale(kCall, a.scale, a.head_dim);
  check_attention_options(kCall, a, {family.kind, a.causal_offset >= 0, "causal_offset >= 0"});

  const std::int64_t d = a.head_dim;
  const std::int64_t q_rows = std::max(1, a.q_len);    // q_len 0: nothing is read or written
  const std::int64_t kv_rows = std::max(1, a.kv_len);  // kv_len 0: nothing is read
  if (a.q_stride_head == 0) a.q_stride_head = d;
  if (a.q_stride_seq == 0) a.q_stride_seq = a.n_heads * a.q_stride_head;
  if (a.q_stride_batch == 0) a.q_stride_batch = q_rows * a.q_stride_seq;
  if (a.out_stride_head == 0) a.out_stride_head = d;
  if (a.out_stride_seq == 0) a.out_stride_seq = a.n_heads * a.out_stride_head;
  if (a.out_stride_batch == 0) a.out_stride_batch = q_rows * a.out_stride_seq;

  require_stride(kCall, "q_stride_head", a.q_stride_head, d, a.n_heads > 1);
  require_stride(kCall, "q_stride_seq", a.q_stride_seq, 1, false);
  require_stride(kCall, "q_stride_batch", a.q_stride_batch, 1, false);
  resolve_kv_strides(kCall, {"k_stride_batch", &a.k_stride_batch}, {"k_stride_seq", &a.k_stride_seq},
                     {"k_stride_head", &a.k_stride_head}, a.n_kv_heads, d, kv_rows);
  resolve_kv_strides(kCall, {"v_stride_batch", &a.v_stride_batch}, {"v_stride_seq", &a.v_stride_seq},
                     {"v_stride_head", &a.v_stride_head}, a.n_kv_heads, d, kv_rows);
  check_fp8_attention(kCall, a, a.scale, a.head_dim, 0, a.mask, "causal_offset",
                      {{"q_stride_head", a.q_stride_head}, {"q_stride_seq", a.q_stride_seq},
                       {"q_stride_batch", a.q_stride_batch}, {"k_stride_head", a.k_stride_head},
                       {"k_stride_seq", a.k_stride_seq}, {"k_stride_batch", a.k_stride_batch},
                       {"v_stride_head", a.v_stride_head}, {"v_stride_seq", a.v_stride_seq},
                       {"v_stride_batch", a.v_stride_batch}});
  require_stride(kCall, "out_stride_head", a.out_stride_head, 1, false);
  require_stride(kCall, "out_stride_seq", a.out_stride_seq, 1, false);
  require_stride(kCall, "out_stride_batch", a.out_stride_batch, 1, false);
  require_disjoint_rows(kCall, d, {{"out_stride_head", a.out_stride_head, a.n_heads},
                                   {"out_stride_seq", a.out_stride_seq, a.q_len},
                                   {"out_stride_batch", a.out_stride_batch, a.batch}});

  if (a.mask_batch == 0) a.mask_batch = a.batch;
  if (a.mask_stride_q == 0) a.mask_stride_q = kv_rows;
  if (a.mask_stride_batch == 0) a.mask_stride_batch = std::max(1, a.mask_q_len) * a.mask_stride_q;
  if (a.mask != nullptr) {
    if (a.mask_batch != 1 && a.mask_batch != a.batch)
      fail_argument(kCall, fmt::format("mask_batch {} is not valid (allowed: 1 to broadcast, or batch {}; 0 "
                              "means batch)", a.mask_batch, a.batch));
    if (a.mask_q_len != 1 && a.mask_q_len != a.q_len)
      fail_argument(kCall, fmt::format("mask_q_len {} is not valid (allowed: 1 to broadcast, or q_len {})",
                              a.mask_q_len, a.q_len));
    require_mask_stride(kCall, "mask_stride_q", a.mask_stride_q);
    require_mask_stride(kCall, "mask_stride_batch", a.mask_stride_batch);
    if (a.mask_q_len > 1 && a.mask_stride_q < a.kv_len)
      fail_argument(kCall, fmt::format("mask_stride_q {} is smaller than kv_len {}", a.mask_stride_q, a.kv_len));
    const std::int64_t mask_rows = (a.mask_q_len - 1) * a.mask_stride_q + a.kv_len;
    if (a.mask_batch > 1 && a.mask_stride_batch < mask_rows)
      fail_argument(kCall, fmt::format("mask_stride_batch {} makes masks overlap (allowed: >= {})",
                              a.mask_stride_batch, mask_rows));
  }

  if (1LL * a.batch * a.q_len > 0) {
    require_pointer(kCall, "q", a.q, 16);
    require_pointer(kCall, "out", a.out, 16);
    if (a.kv_len > 0) {
      require_pointer(kCall, "k", a.k, 16);
      require_pointer(kCall, "v", a.v, 16);
    }
  }
  require_optional_alignment(kCall, "lse", a.lse, 4);
  return a;
}

}  // namespace detail

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
  const detail::FeatureRequest features = detail::attention_features(args, args.scale);
  params.features = features.values;
  params.q_scale = args.q_scale;
  params.q_scale_stride = args.q_scale_per_head ? 1 : 0;
  detail::launch_prefill(*impl_, detail::prefill_family(), "cuLaunchKernel(prefill)", args.dtype, args.head_dim,
                 0, features.flags, args.q_len, params, args.stream);
}

}  // namespace astrai
