// The serving features the attention calls share (logit soft-cap, sinks): their argument checks, and
// the variant bits and run-time values a call asks for. Each feature is a compile-time switch of
// the templates (kernel_src/kernel_params.h), so a call without one runs the plain variant.
#pragma once

#include <cstdint>

#include "kernel_src/kernel_params.h"

namespace astrai::detail {

// The feature bits of a call's variant and the values its params carry.
struct FeatureRequest {
  std::uint32_t flags = 0;
  AttentionFeatures values{};
};

// logit_cap: finite and >= 0 (0: no soft-cap).
void require_logit_cap(const char* call, float logit_cap);

// What a checked call asks for; `scale` is the resolved softmax scale, `sinks` null for none.
FeatureRequest attention_features(float scale, float logit_cap, const float* sinks);

}  // namespace astrai::detail
