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
MlaDecodeArgs resolve_mla_decode_args(const MlaDecodeArgs& args);
// How a cascade's shared level 0 (one group over the keys every row sees, not causal) is
// spread over a device's SMs: its keys cut into `chunks` chunks of `chunk_pages` pages, each a
// group of one paged_prefill over `chunks` copies of q's rows, the chunks' states then merged.
// A single group's pass runs on only (row tiles x KV heads) CTAs. chunks 1: no split.
struct CascadeSplit {
  int chunks = 1;
  int chunk_pages = 0;
};
// At most 16 chunks of at least 256 keys, enough that the pass fills the SMs once. No split
// without `num_sms` (0), with sinks (a sink joins the softmax once, and every chunk's pass
// would add it), with one level, or when level 0 is not one non-causal group.
CascadeSplit cascade_split(const CascadeArgs& args, int num_sms);

// A cascade's levels as the paged_prefill calls that compute them (checked, with the options
// each level carries), after the cascade's own checks; the split of level 0 for `num_sms`
// multiprocessors (0: none) and the workspace it all needs.
struct CascadePlan {
  CascadeArgs args;
  std::vector<PagedPrefillArgs> levels;
  // Levels of q_len rows a group holding each request's new tokens run as paged_decode instead.
  std::vector<bool> as_decode;
  std::vector<PagedDecodeArgs> decodes;  // resolved where as_decode
  CascadeSplit split;
  std::size_t decode_workspace = 0;  // the decode levels' split-KV workspace, in the scratch
  std::size_t workspace_bytes = 0;
};
CascadePlan resolve_cascade_args(const CascadeArgs& args, int num_sms = 0);
// The split, the decode levels' workspace and the scratch of a resolved plan for `num_sms`
// multiprocessors, and the caller's workspace checked against them (resolve_cascade_args ends
// with it; a launch sizes again once it knows the device).
void size_cascade_plan(CascadePlan* plan, int num_sms);
PrefillArgs resolve_prefill_args(const PrefillArgs& args);
PagedPrefillArgs resolve_paged_prefill_args(const PagedPrefillArgs& args);

}  // namespace astrai::detail
