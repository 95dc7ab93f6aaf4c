// Split-KV support: how a finished row is written, and the log-sum-exp merge of the splits
// (lse_merge.cuh's rules over the split workspace).
#pragma once

#include "astrai_common.cuh"
#include "lse_merge.cuh"

namespace astrai {

// Where a finished row (batch_index, token of kQLen, head) goes: its row among the split
// workspace's rows, its first element in `out`, and its entry in the final LSE.
template <int kQLen>
__device__ __forceinline__ long long split_row(int split, int batch, int batch_index, int token, int n_heads,
                                               int head) {
  return ((static_cast<long long>(split) * batch + batch_index) * kQLen + token) * n_heads + head;
}

template <typename T>
__device__ __forceinline__ T* out_row(void* out, long long out_stride_batch, long long out_stride_seq,
                                      long long out_stride_head, int batch_index, int token, int head) {
  return static_cast<T*>(out) + batch_index * out_stride_batch + token * out_stride_seq + head * out_stride_head;
}

template <int kQLen>
__device__ __forceinline__ int final_lse_row(int batch_index, int token, int n_heads, int head) {
  return (batch_index * kQLen + token) * n_heads + head;
}

// Writes element `col` of one finished (normalized) row, query token `token` of kQLen (the
// multi-token decode; 0 of 1 otherwise). With one split the result goes straight to `out`;
// otherwise to the split workspace with its log-sum-exp (natural log, -inf for a split that
// saw no token, so the merge gives it zero weight).
template <typename T, int kHeadDim, int kQLen = 1>
__device__ __forceinline__ void store_row_element(const SplitWorkspace& workspace, void* out,
                                                  long long out_stride_batch, long long out_stride_seq,
                                                  long long out_stride_head, float* final_lse,
                                                  int batch, int n_heads, int split,
                                                  int batch_index, int token, int head, int col, float value,
                                                  float lse) {
  if (workspace.num_splits > 1) {
    const long long row = split_row<kQLen>(split, batch, batch_index, token, n_heads, head);
    workspace.partial_out[row * kHeadDim + col] = value;
    if (col == 0) workspace.partial_lse[row] = lse;
  } else {
    T* dst = out_row<T>(out, out_stride_batch, out_stride_seq, out_stride_head, batch_index, token, head);
    dst[col] = from_float<T>(value);
    if (final_lse != nullptr && col == 0) final_lse[final_lse_row<kQLen>(batch_index, token, n_heads, head)] = lse;
  }
}

// Four adjacent elements [col, col + 4) of one finished row, as store_row_element (col a
// multiple of 4): the workspace takes them as one 16-byte store.
template <typename T, int kHeadDim, int kQLen = 1>
__device__ __forceinline__ void store_row_quad(const SplitWorkspace& workspace, void* out, long long out_stride_batch,
                                               long long out_stride_seq, long long out_stride_head, float* final_lse,
                                               int batch, int n_heads, int split, int batch_index, int token,
                                               int head, int col, float4 value, float lse) {
  static_assert(kHeadDim % 4 == 0, "whole quads a row");
  if (workspace.num_splits > 1) {
    const long long row = split_row<kQLen>(split, batch, batch_index, token, n_heads, head);
    *reinterpret_cast<float4*>(workspace.partial_out + row * kHeadDim + col) = value;
    if (col == 0) workspace.partial_lse[row] = lse;
  } else {
    T* dst = out_row<T>(out, out_stride_batch, out_stride_seq, out_stride_head, batch_index, token, head) + col;
    dst[0] = from_float<T>(value.x);
    dst[1] = from_float<T>(value.y);
    dst[2] = from_float<T>(value.z);
    dst[3] = from_float<T>(value.w);
    if (final_lse != nullptr && col == 0) final_lse[final_lse_row<kQLen>(batch_index, token, n_heads, head)] = lse;
  }
}

// The combine's tiling: a CTA's slice of a row (combine_column_slices) is read as float4
// columns by this many lanes, and the CTA's 128 threads form combine_groups groups of them.
constexpr int combine_lanes(int head_dim) { return head_dim / combine_column_slices(head_dim) / 4; }
constexpr int combine_groups(int head_dim) { return 128 / combine_lanes(head_dim) > 0 ? 128 / combine_lanes(head_dim) : 1; }

// One CTA per (batch, head) row, or (batch, token, head) with kQLen query tokens, and column
// slice (blockIdx.y): out = sum_s w_s * partial_s with w_s = exp(lse_s - lse). The slice is read
// as float4 columns; groups of threads take every kGroups-th split so that long split lists
// (batch 1, long contexts) are read in parallel, then the groups are summed. Each slice's CTA
// weighs the splits itself (a few hundred bytes of LSEs); slice 0 writes the merged LSE. The
// kernel owns the shared arrays.
template <typename T, int kHeadDim, int kQLen>
__device__ __forceinline__ void combine_split_row(const CombineParams& p, long long out_stride_seq, float* weights,
                                                  float& inverse_total,
                                                  float4 (*group_sums)[combine_lanes(kHeadDim)]) {
  constexpr int kLanesPerRow = kHeadDim / 4;  // float4 columns of a whole row
  constexpr int kLanes = combine_lanes(kHeadDim);  // of this CTA's slice
  constexpr int kGroups = combine_groups(kHeadDim);
  static_assert(kHeadDim % 4 == 0 && kLanes <= 128, "combine tiling");
  const int slice = combine_column_slices(kHeadDim) > 1 ? static_cast<int>(blockIdx.y) : 0;
  wait_for_previous_grid();  // launched as a dependent of the attention kernel (sm_90+)
  allow_dependent_grid();    // the next call's attention kernel may be placed; it waits for us
  const int row = blockIdx.x;
  const int batch_token = row / p.n_heads;  // batch_index * kQLen + token
  const int batch_index = batch_token / kQLen;
  const int token = batch_token % kQLen;
  const int head = row % p.n_heads;
  const int num_splits = p.workspace.num_splits;
  const long long rows_per_split = static_cast<long long>(p.batch) * kQLen * p.n_heads;
  const int group = threadIdx.x / kLanes;
  const int lane = threadIdx.x % kLanes;
  const float4* column = reinterpret_cast<const float4*>(p.workspace.partial_out) + slice * kLanes + lane;
  auto partial = [&](int s) { return column[(s * rows_per_split + row) * kLanesPerRow]; };

  // Each group's first kHeld splits are read before the weights are known, so that their
  // latency overlaps the log-sum-exp pass (batch 1 has a few splits a group, all of them held).
  constexpr int kHeld = 4;
  float4 held[kHeld];
#pragma unroll
  for (int i = 0; i < kHeld; ++i) {
    const int s = group + i * kGroups;
    held[i] = group < kGroups && s < num_splits ? partial(s) : make_float4(0.f, 0.f, 0.f, 0.f);
  }

  if (threadIdx.x < 32) {
    // Every LSE is read once, all at the same time, and kept for the weights.
    constexpr int kLsePerLane = kMaxSplits / 32;
    static_assert(kMaxSplits % 32 == 0, "a whole number of LSEs a lane");
    float lse[kLsePerLane];
    float max_lse = negative_infinity();
#pragma unroll
    for (int i = 0; i < kLsePerLane; ++i) {
      const int s = threadIdx.x + 32 * i;
      lse[i] = s < num_splits ? p.workspace.partial_lse[s * rows_per_split + row] : negative_infinity();
      max_lse = fmaxf(max_lse, lse[i]);
    }
    max_lse = warp_all_max(max_lse);
    float total = 0.f;
#pragma unroll
    for (int i = 0; i < kLsePerLane; ++i) {
      const int s = threadIdx.x + 32 * i;
      if (s >= num_splits) break;
      const float w = lse_merge_weight(lse[i], max_lse);
      weights[s] = w;
      total += w;
    }
    total = warp_all_sum(total);
    if (threadIdx.x == 0) {
      inverse_total = lse_merge_inverse(total);
      if (p.lse && slice == 0) p.lse[row] = merged_lse(max_lse, total);
    }
  }
  __syncthreads();

  if (group < kGroups) {
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    auto add = [&](int s, const float4& v) { add_weighted(acc, weights[s], v); };
#pragma unroll
    for (int i = 0; i < kHeld; ++i)
      if (group + i * kGroups < num_splits) add(group + i * kGroups, held[i]);
#pragma unroll 4
    for (int s = group + kHeld * kGroups; s < num_splits; s += kGroups) add(s, partial(s));
    group_sums[group][lane] = acc;
  }
  __syncthreads();

  if (threadIdx.x < kLanes) {
    float4 sum = group_sums[0][threadIdx.x];
#pragma unroll
    for (int g = 1; g < kGroups; ++g) {
      const float4 part = group_sums[g][threadIdx.x];
      sum.x += part.x;
      sum.y += part.y;
      sum.z += part.z;
      sum.w += part.w;
    }
    T* dst = static_cast<T*>(p.out) + batch_index * p.out_stride_batch +
             token * out_stride_seq + head * p.out_stride_head + (slice * kLanes + threadIdx.x) * 4;
    const float scale = inverse_total;
    dst[0] = from_float<T>(sum.x * scale);
    dst[1] = from_float<T>(sum.y * scale);
    dst[2] = from_float<T>(sum.z * scale);
    dst[3] = from_float<T>(sum.w * scale);
  }
}

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(128) split_combine_kernel(const CombineParams p) {
  __shared__ float weights[kMaxSplits];
  __shared__ float inverse_total;
  __shared__ float4 group_sums[combine_groups(kHeadDim)][combine_lanes(kHeadDim)];
  combine_split_row<T, kHeadDim, 1>(p, 0, weights, inverse_total, group_sums);
}

// The multi-token decode's combine: the rows of kQLen query tokens per request.
template <typename T, int kHeadDim, int kQLen>
__global__ void __launch_bounds__(128) split_combine_tokens_kernel(const TokenCombineParams p) {
  __shared__ float weights[kMaxSplits];
  __shared__ float inverse_total;
  __shared__ float4 group_sums[combine_groups(kHeadDim)][combine_lanes(kHeadDim)];
  combine_split_row<T, kHeadDim, kQLen>(p.rows, p.out_stride_seq, weights, inverse_total, group_sums);
}

}  // namespace astrai
