// The serving options of the attention calls (astrai::AttentionOptions: logit soft-cap, sinks,
// sliding window, FP8 KV cache) as one table: each row is an option's variant bit and name
// field, the families that serve it, its argument check and the values it puts in the kernels'
// params. Each option is a compile-time switch of the templates (kernel_src/kernel_params.h),
// so a call without one runs the plain variant. Adding a feature is a row here, a field of
// AttentionOptions and AttentionFeatures, and the kernels' hook (docs/architecture.md).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "astrai/runtime.hpp"
#include "kernel_src/kernel_params.h"
#include "runtime/kernel_family.hpp"

namespace astrai::detail {

// What an option's check needs to know of the call.
struct OptionContext {
  KernelKind kind;
  // Whether the call gives its queries positions (a window needs them), and the argument that
  // does, for the message ("causal_offset >= 0"); empty when the call always has them.
  bool has_positions = true;
  const char* positions_argument = "";
};

struct AttentionOption {
  const char* name;        // the variant name field and `warm --features` spelling: "cap"
  std::uint32_t bit;       // its feature bit (kernel_src/kernel_params.h)
  std::uint32_t families;  // the kinds that serve it: bits 1 << KernelKind
  bool (*requested)(const AttentionOptions& options);
  // Checks the option's fields whether or not it is requested (a scale without an FP8 cache is
  // refused too); null when there is nothing to check beyond `requested`.
  void (*check)(const char* call, const AttentionOptions& options, const OptionContext& context);
  // Its run-time values in the kernels' params; `scale` is the call's resolved softmax scale.
  void (*fill)(const AttentionOptions& options, float scale, AttentionFeatures* values);
};

// Every option, in the order their fields appear in a variant name.
const std::vector<AttentionOption>& attention_options();

// The feature bits the options a family serves may set (a family's supported_flags is these,
// with paged_decode's multi-token q_len field besides).
std::uint32_t attention_option_flags(KernelKind kind);

// The feature bits of a call's variant and the values its params carry.
struct FeatureRequest {
  std::uint32_t flags = 0;
  AttentionFeatures values{};
};

// Runs every option's check, and refuses by name an option the call's family does not serve.
void check_attention_options(const char* call, const AttentionOptions& options, const OptionContext& context);
// What a checked call asks for; `scale` is the resolved softmax scale.
FeatureRequest attention_features(const AttentionOptions& options, float scale);

// The options among `flags` that a call requests, as it spelled them ("logit_cap 30, window_left
// 8"), for a refusal.
std::string requested_option_values(const AttentionOptions& options, std::uint32_t flags);

// FP8 rows are one byte an element and copied 16 bytes at a time: every K/V stride a multiple
// of 16 elements (called with the resolved strides).
void require_fp8_strides(const char* call, const AttentionOptions& options,
                         std::initializer_list<std::pair<const char*, std::int64_t>> strides);

// Tokens a decode split plan must cover: the table capacity, or with a window (window_left >= 0)
// the blocks its keys can touch (window_left + q_len keys from a block boundary on).
long long decode_span_tokens(long long capacity, int window_left, int q_len = 1);

}  // namespace astrai::detail
