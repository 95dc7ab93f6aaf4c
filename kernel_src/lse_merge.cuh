// Merging attention states by their log-sum-exp. A state is a normalized output row o_i with
// its LSE s_i (natural log) over the keys it saw; the states of disjoint key sets merge into
//   o = sum_i w_i o_i / sum_i w_i,  w_i = exp(s_i - max_j s_j),  s = max_j s_j + log(sum_i w_i),
// which is the attention over the union of their keys. A state that saw no key carries
// s = -inf and weighs nothing; when every state is empty the merged row is zeros with LSE -inf.
// The split-KV combine (attention_combine.cuh) and the merge_states family (merge_states.cuh)
// are built on these.
#pragma once

#include "astrai_common.cuh"

namespace astrai {

// w_i of a state with LSE `lse` among states whose largest LSE is `max_lse`.
__device__ __forceinline__ float lse_merge_weight(float lse, float max_lse) {
  return max_lse == negative_infinity() ? 0.f : __expf(lse - max_lse);
}

// 1 / sum_i w_i, or 0 when every state is empty (their rows then add up to zeros).
__device__ __forceinline__ float lse_merge_inverse(float total) { return total > 0.f ? 1.f / total : 0.f; }

// The merged LSE.
__device__ __forceinline__ float merged_lse(float max_lse, float total) {
  return total > 0.f ? max_lse + __logf(total) : negative_infinity();
}

// acc + w * v, where a zero weight never lets a non-finite value of an empty state through.
__device__ __forceinline__ float add_weighted(float acc, float w, float v) { return acc + (w != 0.f ? w * v : 0.f); }

__device__ __forceinline__ void add_weighted(float4& acc, float w, const float4& v) {
  acc.x = add_weighted(acc.x, w, v.x);
  acc.y = add_weighted(acc.y, w, v.y);
  acc.z = add_weighted(acc.z, w, v.z);
  acc.w = add_weighted(acc.w, w, v.w);
}

}  // namespace astrai
