// The serving features the attention calls share (logit soft-cap, sinks, sliding window): their argument checks, and
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

// window_left: -1 (none) or >= 0; `causal` says whether the call has query positions (a
// window needs them), `limit` names the argument that gives them in the message.
void require_window(const char* call, int window_left, bool causal, const char* limit);

// What a checked call asks for; `scale` is the resolved softmax scale, `sinks` null for none,
// `window_left` -1 for none (contiguous decode may pass a shifted value, see PagedDecodeParams).
FeatureRequest attention_features(float scale, float logit_cap, const float* sinks, int window_left);

// Tokens a decode split plan must cover: the table capacity, or with a window the blocks its
// keys can touch (window_left + 1 keys from a block boundary on).
long long decode_span_tokens(long long capacity, std::uint32_t flags, int window_left);

}  // namespace astrai::detail
