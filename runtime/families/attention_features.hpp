// The serving features the attention calls share (logit soft-cap, sinks, sliding window, FP8 KV
// cache): their argument checks, and
// the variant bits and run-time values a call asks for. Each feature is a compile-time switch of
// the templates (kernel_src/kernel_params.h), so a call without one runs the plain variant.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <utility>

#include "astrai/runtime.hpp"
#include "kernel_src/kernel_params.h"

namespace astrai::detail {

// A call's KV cache element type and FP8 scales (the fields every *Args with an FP8 cache has).
struct KvCacheRequest {
  KvDType kv_dtype = KvDType::same;
  const float* k_scale = nullptr;
  const float* v_scale = nullptr;
  bool per_head = false;
  bool fp8() const { return kv_dtype != KvDType::same; }
};
template <typename Args> KvCacheRequest kv_cache_request(const Args& args) {
  return {args.kv_dtype, args.k_scale, args.v_scale, args.kv_scale_per_head};
}

// kv_dtype a known value; with FP8, both scales set and 4-byte aligned; without, neither set.
void require_kv_cache(const char* call, const KvCacheRequest& kv);
// FP8 rows are one byte an element and copied 16 bytes at a time: every K/V stride a multiple
// of 16 elements (called with the resolved strides).
void require_fp8_strides(const char* call, const KvCacheRequest& kv, std::initializer_list<std::pair<const char*, std::int64_t>> strides);

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
FeatureRequest attention_features(float scale, float logit_cap, const float* sinks, int window_left,
                                  const KvCacheRequest& kv = {});

// Tokens a decode split plan must cover: the table capacity, or with a window (window_left >= 0)
// the blocks its keys can touch (window_left + q_len keys from a block boundary on).
long long decode_span_tokens(long long capacity, int window_left, int q_len = 1);

}  // namespace astrai::detail
