#include "runtime/families/attention_features.hpp"

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

FeatureRequest attention_features(float scale, float logit_cap, const float* sinks) {
  FeatureRequest request;
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
