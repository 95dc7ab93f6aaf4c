// Argument checks for every public call, run before anything is launched. Pure CPU code;
// each is defined with its family in runtime/families/<family>.cpp.
#pragma once

#include "astrai/runtime.hpp"

namespace astrai::detail {

// Returns a copy with default strides filled in and scale resolved; throws InvalidArgument
// naming the argument, its value and the allowed set.
PagedDecodeArgs resolve_paged_decode_args(const PagedDecodeArgs& args);
DecodeArgs resolve_decode_args(const DecodeArgs& args);
RotaryArgs resolve_rotary_args(const RotaryArgs& args);
MergeStatesArgs resolve_merge_states_args(const MergeStatesArgs& args);
PrefillArgs resolve_prefill_args(const PrefillArgs& args);
PagedPrefillArgs resolve_paged_prefill_args(const PagedPrefillArgs& args);

}  // namespace astrai::detail
