// Argument checks for every public call, run before anything is launched. Pure CPU code;
// each is defined with its family in runtime/families/<family>.cpp.
#pragma once

#include <vector>

#include "astrai/runtime.hpp"

namespace astrai::detail {

// Returns a copy with default strides filled in and scale resolved; throws InvalidArgument
// naming the argument, its value and the allowed set.
PagedDecodeArgs resolve_paged_decode_args(const PagedDecodeArgs& args);
DecodeArgs resolve_decode_args(const DecodeArgs& args);
RotaryArgs resolve_rotary_args(const RotaryArgs& args);
MergeStatesArgs resolve_merge_states_args(const MergeStatesArgs& args);
// A cascade's levels as the paged_prefill calls that compute them (checked, with the options
// each level carries), after the cascade's own checks.
struct CascadePlan {
  CascadeArgs args;
  std::vector<PagedPrefillArgs> levels;
  std::size_t workspace_bytes = 0;
};
CascadePlan resolve_cascade_args(const CascadeArgs& args);
PrefillArgs resolve_prefill_args(const PrefillArgs& args);
PagedPrefillArgs resolve_paged_prefill_args(const PagedPrefillArgs& args);

}  // namespace astrai::detail
