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

long long decode_span_tokens(long long capacity, std::uint32_t flags, int window_left) {
  if ((flags & kFeatureWindow) == 0) return capacity;
  return std::min<long long>(capacity, std::max(window_left, 0) + 1LL + (kDecodeBlockTokens - 1));
}

FeatureRequest attention_features(float scale, float logit_cap, const float* sinks, int window_left) {
  FeatureRequest request;
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
