#include "runtime/families/attention_features.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "runtime/families/arg_checks.hpp"
#include "runtime/runtime_impl.hpp"

namespace astrai::detail {

void require_logit_cap(const char* call, float logit_cap) {
  if (!std::isfinite(logit_cap) || logit_cap < 0.f)
    fail_argument(call, fmt::format("logit_cap {} is not valid (allowed: 0 for no soft-cap, or a finite "
                                    "value > 0)", logit_cap));
}

void require_window(const char* call, int window_left, bool causal, const char* limit) {
  if (window_left < -1)
    fail_argument(call, fmt::format("window_left {} is not valid (allowed: -1 for no window, or >= 0)",
                                    window_left));
  if (window_left >= 0 && !causal)
    fail_argument(call, fmt::format("window_left {} needs query positions: set {}", window_left, limit));
}

void require_kv_cache(const char* call, const KvCacheRequest& kv) {
  if (kv.kv_dtype != KvDType::same && kv.kv_dtype != KvDType::e4m3 && kv.kv_dtype != KvDType::e5m2)
    fail_argument(call, fmt::format("kv_dtype {} is not valid (allowed: same, e4m3, e5m2)",
                                    static_cast<int>(kv.kv_dtype)));
  if (!kv.fp8()) {
    for (const auto& [name, scale] : {std::pair{"k_scale", kv.k_scale}, std::pair{"v_scale", kv.v_scale}})
      if (scale != nullptr)
        fail_argument(call, fmt::format("{} = {} is set but kv_dtype is same (scales belong to an FP8 cache: "
                                        "kv_dtype e4m3 or e5m2)", name, static_cast<const void*>(scale)));
    if (kv.per_head)
      fail_argument(call, "kv_scale_per_head is set but kv_dtype is same (scales belong to an FP8 cache)");
    return;
  }
  require_pointer(call, "k_scale", kv.k_scale, 4);
  require_pointer(call, "v_scale", kv.v_scale, 4);
}

void require_fp8_strides(const char* call, const KvCacheRequest& kv,
                         std::initializer_list<std::pair<const char*, std::int64_t>> strides) {
  if (!kv.fp8()) return;
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

FeatureRequest attention_features(float scale, float logit_cap, const float* sinks, int window_left,
                                  const KvCacheRequest& kv) {
  FeatureRequest request;
  if (kv.fp8()) {
    request.flags |= kv.kv_dtype == KvDType::e4m3 ? kFeatureKvE4m3 : kFeatureKvE5m2;
    request.values.k_scale = kv.k_scale;
    request.values.v_scale = kv.v_scale;
    request.values.kv_scale_stride = kv.per_head ? 1 : 0;
  }
  if (window_left >= 0) {
    request.flags |= kFeatureWindow;
    request.values.window_left = window_left;
  }
  if (sinks != nullptr) {
    request.flags |= kFeatureSink;
    request.values.sinks = sinks;
  }
  if (logit_cap > 0.f) {
    request.flags |= kFeatureSoftCap;
    request.values.cap_scale = scale / logit_cap;
    request.values.cap_log2 = logit_cap * kLog2e;
  }
  return request;
}

}  // namespace astrai::detail
