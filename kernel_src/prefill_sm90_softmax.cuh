// The Hopper prefill's scores and online softmax (prefill_sm90.cuh), on a consumer thread's part
// of a wgmma accumulator: columns 8j + 2 (lane % 4) + {0, 1} of rows lane / 4 and lane / 4 + 8 of
// its warp's 16, registers s[4j .. 4j + 3] (the first two the upper row's).
#pragma once

#include "prefill_common.cuh"

namespace astrai {

// The soft-cap (scores then in log2 units) and the masks of the block starting at column `col0`:
// columns a row cannot see become -inf (after the cap: tanh would lift -inf to -cap). What limits
// the thread's two rows: each row's stop (one past its last key) and, with a window, its first
// key; and the tile's: the first column some row cannot see, and (window) the column up to which
// some row's window starts later. Blocks inside both bounds need no mask.
template <int kBlockN, bool kCap, bool kWindow>
__device__ __forceinline__ void prefill_sm90_mask_scores(float (&s)[kBlockN / 2], int col0, int lane,
                                                         const int (&stop)[2], const int (&first_key)[2], int mask_from,
                                                         int window_mask_until, const AttentionFeatures& f) {
  if constexpr (kCap) {
#pragma unroll
    for (int i = 0; i < kBlockN / 2; ++i) s[i] = soft_capped(s[i], f);
  }
  if (col0 + kBlockN > mask_from || (kWindow && col0 < window_mask_until)) {
#pragma unroll
    for (int j = 0; j < kBlockN / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int token = col0 + 8 * j + 2 * (lane % 4) + (e & 1);
        if (token >= stop[e >> 1] || (kWindow && token < first_key[e >> 1])) s[4 * j + e] = negative_infinity();
      }
  }
}

// Online softmax of one block: S becomes P (f32, in s), the row statistics move, and `correction`
// is what O must be scaled by (exactly 1 when a row's reference stayed). row_max is in log2 units
// (score_scale brings S there; 1 when the cap did), row_sum the thread's columns only.
// Lazy rescaling (kLazyRescale, the head dims of 128 and more): a row's reference moves only when
// the block's maximum passes it by more than kMaxSlack (log2 units), so P stays below 2^kMaxSlack
// (in range for f32 sums and 16-bit P) and after the first blocks O is seldom rescaled: the caller
// skips the rescale when no row of the warp moved. On the H200 it gained 0.4-1.5% at hd128 and
// 5-6% at hd256, and lost 2.5% at hd64 (three consumers, 32 O registers a thread), which
// rescales every block.
// score_scale: one for both rows, or one a row (a float[2]).
__device__ __forceinline__ float row_score_scale(float scale, int) { return scale; }
__device__ __forceinline__ float row_score_scale(const float (&scales)[2], int h) { return scales[h]; }
template <int kBlockN, bool kLazyRescale, typename Scale>
__device__ __forceinline__ void prefill_sm90_online_softmax(float (&s)[kBlockN / 2], float (&row_max)[2],
                                                            float (&row_sum)[2], const Scale& score_scale,
                                                            float (&correction)[2]) {
  constexpr float kMaxSlack = 8.f;
  // Row maxima and sums in kPartials interleaved chains: one chain a row is 24 and 48 links long
  // at hd128's 192 columns, on the consumer's critical path (two gained 1-3% there, and lost 1.5%
  // at hd64's 128 columns with 3 consumers' registers; at 80-token blocks two moved -1.9% to
  // +0.8% by head dim, so they keep one).
  constexpr int kPartials = kBlockN >= 192 ? 2 : 1;
  float partial_max[2][kPartials];
#pragma unroll
  for (int q = 0; q < kPartials; ++q) partial_max[0][q] = partial_max[1][q] = negative_infinity();
#pragma unroll
  for (int j = 0; j < kBlockN / 8; ++j) {
    float& max0 = partial_max[0][j % kPartials];
    float& max1 = partial_max[1][j % kPartials];
    max0 = fmaxf(max0, fmaxf(s[4 * j], s[4 * j + 1]));
    max1 = fmaxf(max1, fmaxf(s[4 * j + 2], s[4 * j + 3]));
  }
  float block_max[2] = {partial_max[0][0], partial_max[1][0]};
#pragma unroll
  for (int q = 1; q < kPartials; ++q)
    for (int h = 0; h < 2; ++h) block_max[h] = fmaxf(block_max[h], partial_max[h][q]);
  float neg_ref[2];
  float partial_sum[2][kPartials] = {};
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    block_max[h] = quad_max(block_max[h]);
    const float block_top = block_max[h] * row_score_scale(score_scale, h);
    const bool move = kLazyRescale ? block_top > row_max[h] + kMaxSlack : true;
    const float new_max = kLazyRescale ? (move ? block_top : row_max[h]) : fmaxf(row_max[h], block_top);
    const float ref = softmax_reference(new_max);
    correction[h] = move ? fast_exp2(row_max[h] - ref) : 1.f;
    row_max[h] = new_max;
    partial_sum[h][0] = row_sum[h] * correction[h];
    neg_ref[h] = -ref;
  }
#pragma unroll
  for (int i = 0; i < kBlockN / 2; ++i) {
    s[i] = fast_exp2(fmaf(s[i], row_score_scale(score_scale, (i >> 1) & 1), neg_ref[(i >> 1) & 1]));
    partial_sum[(i >> 1) & 1][(i >> 2) % kPartials] += s[i];
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    row_sum[h] = partial_sum[h][0];
#pragma unroll
    for (int q = 1; q < kPartials; ++q) row_sum[h] += partial_sum[h][q];
  }
}

}  // namespace astrai
