// The tensor-core decode's online softmax, one state per warp.
#pragma once

#include "decode_work.cuh"

namespace astrai {

// One warp's online softmax over its 16-token steps (tensor-core decode kernels): the O
// accumulator of its 16 rows (m16n8 tiles: rows g and g + 8 of lane (g, t)) and their running
// max and sum, in log2 units.
template <int kHeadDim, int kFlags, bool kRowScaled = false>
struct DecodeWarpSoftmax {
  static constexpr int kQLen = decode_q_len(kFlags);
  static constexpr int kNTiles = kHeadDim / 8;  // n8 tiles of O
  float o[kNTiles][4];
  float row_max[2];
  float row_sum[2];
  // Multi-token: rows g and g + 8 attend to keys up to their own token's position, and from
  // that position's window on.
  int row_end[2];
  int row_window_first[2];
  float row_slope[2];  // ALiBi: the row's head's slope, log2 units
  float row_scale[2];  // kRowScaled: each row's factor from raw scores to log2 units (set_row_scales)

  // kRowScaled (the direct FP8 path's scaled Q rows): the raw scores of rows g and g + 8 carry
  // factors of their own (the K scale and the row's power of two), applied with the softmax scale.
  __device__ __forceinline__ void set_row_scales(const PagedDecodeParams& p, const float (&factor)[2]) {
    row_scale[0] = factor[0] * p.scale_log2;
    row_scale[1] = factor[1] * p.scale_log2;
  }

  __device__ __forceinline__ void init(const PagedDecodeParams& p, const DecodeWork& w) {
    const int quad_row = (threadIdx.x & 31) >> 2;
#pragma unroll
    for (int n = 0; n < kNTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      row_max[r] = negative_infinity();
      row_sum[r] = 0.f;
      const int position = w.seq.length - kQLen + row_token<kQLen>(w.first_row, quad_row + 8 * r);
      row_end[r] = position + 1;
      row_window_first[r] = has_feature<kFlags>(kFeatureWindow) ? window_first_key(position, p.features) : 0;
      if constexpr (has_feature<kFlags>(kFeatureAlibi)) {
        const int row = quad_row + 8 * r;  // rows past the tile's (padding) read no slope
        row_slope[r] = row < w.rows ? alibi_slope_log2(p.features, row_head<kQLen>(w.first_head, w.first_row, row))
                                    : 0.f;
      }
    }
  }

  // Turns the raw scores s of tokens [first_token, first_token + 16) (two n8 tiles of S) into P:
  // scaled or capped, masked, folded into the running max and sum, O rescaled when a max
  // moved. Returns P as the A fragment of the P V MMA, in PType.
  template <typename PType>
  __device__ __forceinline__ void step(float (&s)[2][4], unsigned (&pa)[4], const PagedDecodeParams& p,
                                       const DecodeWork& w, int first_token) {
    const int quad_col = threadIdx.x & 3;
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        s[j][e] = has_feature<kFlags>(kFeatureSoftCap) ? soft_capped(s[j][e], p.features)
                  : kRowScaled                         ? s[j][e] * row_scale[e >> 1]
                                                       : s[j][e] * p.scale_log2;
    if constexpr (has_feature<kFlags>(kFeatureAlibi)) {
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          s[j][e] += alibi_bias(row_slope[e >> 1], first_token + j * 8 + quad_col * 2 + (e & 1), row_end[e >> 1] - 1);
    }
    // Only the tail, the window's first step, multi-token rows' own ends and masked calls test
    // each token (this thread's rows decide; warp-uniform in the common cases).
    const bool whole =
        first_token + 16 <= w.split_end && p.mask == nullptr &&
        (kQLen == 1 || first_token + 16 <= min(row_end[0], row_end[1])) &&
        (!has_feature<kFlags>(kFeatureWindow) ||
         first_token >= (kQLen == 1 ? w.window_first : max(row_window_first[0], row_window_first[1])));
    if (!whole) {
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int token = first_token + j * 8 + quad_col * 2 + (e & 1);
          if (!(token < w.split_end && (kQLen == 1 || token < row_end[e >> 1]) &&
                (!has_feature<kFlags>(kFeatureWindow) ||
                 token >= (kQLen == 1 ? w.window_first : row_window_first[e >> 1])) &&
                token_kept(p, w.batch_index, token)))
            s[j][e] = negative_infinity();
        }
    }
    float tile_max[2] = {negative_infinity(), negative_infinity()};
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) tile_max[e >> 1] = fmaxf(tile_max[e >> 1], s[j][e]);
    float correction[2];
    float reference[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      correction[r] = online_softmax_update(row_max[r], row_sum[r], quad_max(tile_max[r]), reference[r]);
    }
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[j][e] = fast_exp2(s[j][e] - reference[e >> 1]);
        row_sum[e >> 1] += s[j][e];
      }
    }
    // Once the running maxima settle, most steps change no row's max: skip the rescale then.
    if (__any_sync(0xffffffffu, correction[0] != 1.f || correction[1] != 1.f)) {
#pragma unroll
      for (int n = 0; n < kNTiles; ++n) {
        o[n][0] *= correction[0];
        o[n][1] *= correction[0];
        o[n][2] *= correction[1];
        o[n][3] *= correction[1];
      }
    }
    // The S accumulators are already laid out as the A fragment of a k16 MMA.
    pa[0] = pack2<PType>(s[0][0], s[0][1]);
    pa[1] = pack2<PType>(s[0][2], s[0][3]);
    pa[2] = pack2<PType>(s[1][0], s[1][1]);
    pa[3] = pack2<PType>(s[1][2], s[1][3]);
  }
};

}  // namespace astrai
