#include "runtime/families/attention_features.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "runtime/families/arg_checks.hpp"
#include "runtime/runtime_impl.hpp"

namespace astrai::detail {

namespace {

constexpr std::uint32_t kind_bit(KernelKind kind) { return 1u << static_cast<unsigned>(kind); }
constexpr std::uint32_t kAttention = kind_bit(KernelKind::paged_decode) | kind_bit(KernelKind::decode) |
                                     kind_bit(KernelKind::prefill) | kind_bit(KernelKind::paged_prefill);
// An FP8 cache is read by the decode kernels and the paged prefill (chunked prefill against the
// cache); contiguous prefill takes the model's own K and V.
constexpr std::uint32_t kFp8Kinds = kAttention & ~kind_bit(KernelKind::prefill);

bool fp8(const AttentionOptions& o) { return o.kv_dtype != KvDType::same; }

void check_cap(const char* call, const AttentionOptions& o, const OptionContext&) {
  if (!std::isfinite(o.logit_cap) || o.logit_cap < 0.f)
    fail_argument(call, fmt::format("logit_cap {} is not valid (allowed: 0 for no soft-cap, or a finite "
                                    "value > 0)", o.logit_cap));
}

void check_sinks(const char* call, const AttentionOptions& o, const OptionContext&) {
  require_optional_alignment(call, "sinks", o.sinks, 4);
}

void check_alibi(const char* call, const AttentionOptions& o, const OptionContext& context) {
  require_optional_alignment(call, "alibi_slopes", o.alibi_slopes, 4);
  if (o.alibi_slopes != nullptr && !context.has_positions)
    fail_argument(call, fmt::format("alibi_slopes = {} needs query positions: set {}",
                                    static_cast<const void*>(o.alibi_slopes), context.positions_argument));
}

void check_window(const char* call, const AttentionOptions& o, const OptionContext& context) {
  if (o.window_left < -1)
    fail_argument(call, fmt::format("window_left {} is not valid (allowed: -1 for no window, or >= 0)",
                                    o.window_left));
  if (o.window_left >= 0 && !context.has_positions)
    fail_argument(call, fmt::format("window_left {} needs query positions: set {}", o.window_left,
                                    context.positions_argument));
}

// The FP8 fields of both formats: a known kv_dtype; with FP8 both scales, 4-byte aligned;
// without, neither (nor per-head scales).
void check_kv_cache(const char* call, const AttentionOptions& o, const OptionContext&) {
  if (o.kv_dtype != KvDType::same && o.kv_dtype != KvDType::e4m3 && o.kv_dtype != KvDType::e5m2)
    fail_argument(call, fmt::format("kv_dtype {} is not valid (allowed: same, e4m3, e5m2)",
                                    static_cast<int>(o.kv_dtype)));
  if (!fp8(o) && o.qkv_dtype == KvDType::same) {
    for (const auto& [name, scale] : {std::pair{"k_scale", o.k_scale}, std::pair{"v_scale", o.v_scale}})
      if (scale != nullptr)
        fail_argument(call, fmt::format("{} = {} is set but kv_dtype is same (scales belong to an FP8 cache: "
                                        "kv_dtype e4m3 or e5m2)", name, static_cast<const void*>(scale)));
    if (o.kv_scale_per_head)
      fail_argument(call, "kv_scale_per_head is set but kv_dtype is same (scales belong to an FP8 cache)");
    return;
  }
  require_pointer(call, "k_scale", o.k_scale, 4);
  require_pointer(call, "v_scale", o.v_scale, 4);
}

void fill_kv_cache(const AttentionOptions& o, float, AttentionFeatures* values) {
  values->k_scale = o.k_scale;
  values->v_scale = o.v_scale;
  values->kv_scale_stride = o.kv_scale_per_head ? 1 : 0;
}

// FP8 attention: e4m3 only, with its three scales (4-byte aligned), never beside an FP8 cache.
void check_qkv8(const char* call, const AttentionOptions& o, const OptionContext&) {
  if (o.qkv_dtype == KvDType::same) {
    if (o.q_scale != nullptr)
      fail_argument(call, fmt::format("q_scale = {} is set but qkv_dtype is same (it scales e4m3 queries)",
                                      static_cast<const void*>(o.q_scale)));
    if (o.q_scale_per_head) fail_argument(call, "q_scale_per_head is set but qkv_dtype is same (no q_scale)");
    return;
  }
  if (o.qkv_dtype != KvDType::e4m3)
    fail_argument(call, fmt::format("qkv_dtype {} is not valid (allowed: same, e4m3)", kv_dtype_name(o.qkv_dtype)));
  if (fp8(o)) fail_argument(call, "qkv_dtype e4m3 with an FP8 kv_dtype: q, k and v are already e4m3");
  require_pointer(call, "q_scale", o.q_scale, 4);
  require_pointer(call, "k_scale", o.k_scale, 4);
  require_pointer(call, "v_scale", o.v_scale, 4);
}

// P in f16 is FP8 attention's option.
void check_p16(const char* call, const AttentionOptions& o, const OptionContext&) {
  if (o.p_fp16 && o.qkv_dtype != KvDType::e4m3)
    fail_argument(call, fmt::format("p_fp16 is set but qkv_dtype is {} (allowed: with qkv_dtype e4m3 only: it keeps "
                                    "FP8 attention's P in f16)", kv_dtype_name(o.qkv_dtype)));
}

// The option's value as the call spelled it, for a refusal.
std::string option_value(const AttentionOption& option, const AttentionOptions& o) {
  if (option.bit == kFeatureSoftCap) return fmt::format("logit_cap {}", o.logit_cap);
  if (option.bit == kFeatureSink) return fmt::format("sinks = {}", static_cast<const void*>(o.sinks));
  if (option.bit == kFeatureWindow) return fmt::format("window_left {}", o.window_left);
  if (option.bit == kFeatureAlibi) return fmt::format("alibi_slopes = {}", static_cast<const void*>(o.alibi_slopes));
  if (option.bit == kFeatureQkvE4m3) return fmt::format("qkv_dtype {}", kv_dtype_name(o.qkv_dtype));
  if (option.bit == kFeatureQkvP16) return "p_fp16";
  return fmt::format("kv_dtype {}", kv_dtype_name(o.kv_dtype));
}

}  // namespace

std::string requested_option_values(const AttentionOptions& options, std::uint32_t flags) {
  std::string values;
  for (const AttentionOption& option : attention_options())
    if ((option.bit & flags) != 0 && option.requested(options))
      values += (values.empty() ? "" : ", ") + option_value(option, options);
  return values;
}

const std::vector<AttentionOption>& attention_options() {
  static const std::vector<AttentionOption> options = {
      {"kv_e4m3", kFeatureKvE4m3, kFp8Kinds, [](const AttentionOptions& o) { return o.kv_dtype == KvDType::e4m3; },
       check_kv_cache, fill_kv_cache},
      {"kv_e5m2", kFeatureKvE5m2, kFp8Kinds, [](const AttentionOptions& o) { return o.kv_dtype == KvDType::e5m2; },
       nullptr, fill_kv_cache},
      {"swa", kFeatureWindow, kAttention, [](const AttentionOptions& o) { return o.window_left >= 0; }, check_window,
       [](const AttentionOptions& o, float, AttentionFeatures* v) { v->window_left = o.window_left; }},
      {"cap", kFeatureSoftCap, kAttention, [](const AttentionOptions& o) { return o.logit_cap > 0.f; }, check_cap,
       [](const AttentionOptions& o, float scale, AttentionFeatures* v) {
         v->cap_scale = scale / o.logit_cap;
         v->cap_log2 = o.logit_cap * kLog2e;
       }},
      {"sink", kFeatureSink, kAttention, [](const AttentionOptions& o) { return o.sinks != nullptr; }, check_sinks,
       [](const AttentionOptions& o, float, AttentionFeatures* v) { v->sinks = o.sinks; }},
      {"qkv_e4m3", kFeatureQkvE4m3, kind_bit(KernelKind::prefill) | kind_bit(KernelKind::paged_prefill),
       [](const AttentionOptions& o) { return o.qkv_dtype == KvDType::e4m3; }, check_qkv8, fill_kv_cache},  // q_scale: PrefillParams's own
      {"p_fp16", kFeatureQkvP16, kind_bit(KernelKind::prefill) | kind_bit(KernelKind::paged_prefill),
       [](const AttentionOptions& o) { return o.p_fp16; }, check_p16, [](const AttentionOptions&, float, AttentionFeatures*) {}},
      {"alibi", kFeatureAlibi, kAttention, [](const AttentionOptions& o) { return o.alibi_slopes != nullptr; },
       check_alibi, [](const AttentionOptions& o, float, AttentionFeatures* v) { v->alibi_slopes = o.alibi_slopes; }},
  };
  return options;
}

std::uint32_t attention_option_flags(KernelKind kind) {
  std::uint32_t flags = 0;
  for (const AttentionOption& option : attention_options())
    if ((option.families & kind_bit(kind)) != 0) flags |= option.bit;
  return flags;
}

void check_attention_options(const char* call, const AttentionOptions& options, const OptionContext& context) {
  for (const AttentionOption& option : attention_options()) {
    if (option.check != nullptr) option.check(call, options, context);
    if (option.requested(options) && (option.families & kind_bit(context.kind)) == 0)
      fail_argument(call, fmt::format("{} is not served by {} (its options: {})", option_value(option, options),
                                      call, supported_feature_names(attention_option_flags(context.kind))));
  }
}

FeatureRequest attention_features(const AttentionOptions& options, float scale) {
  FeatureRequest request;
  for (const AttentionOption& option : attention_options()) {
    if (!option.requested(options)) continue;
    request.flags |= option.bit;
    option.fill(options, scale, &request.values);
  }
  return request;
}

void require_fp8_strides(const char* call, const AttentionOptions& options,
                         std::initializer_list<std::pair<const char*, std::int64_t>> strides) {
  if (!fp8(options)) return;
  for (const auto& [name, stride] : strides)
    if (stride % 16 != 0)
      fail_argument(call, fmt::format("{} {} is not a multiple of 16 elements (an FP8 cache's rows must stay "
                                      "16-byte aligned)", name, stride));
}

long long decode_span_tokens(long long capacity, int window_left, int q_len) {
  if (window_left < 0) return capacity;
  // From the first query token's window on: q_len - 1 more keys for the later tokens.
  return std::min<long long>(capacity, window_left + 1LL * q_len + (kDecodeBlockTokens - 1));
}

}  // namespace astrai::detail
