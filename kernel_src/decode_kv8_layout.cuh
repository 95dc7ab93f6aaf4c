// The direct FP8 path's layout: how each warp's ring holds K and V bytes, and the permutations
// of Q's dims and O's columns that let the bytes go straight into MMA fragments.
#pragma once

#include "astrai_common.cuh"

namespace astrai {

// FP8 cache read straight into MMA fragments (head dims 64, 128, 256; kv8_direct_head_dim).
// Each warp owns a ring of kv8_stages K+V stages holding the 16 rows of its steps (tokens
// [16 w, 16 w + 16) of each 64-token block), so the pipeline needs __syncwarp only.
//  - S = Q K^T: lane (g, t) reads 16 bytes of K rows g and g + 8 per 64 dims and uses word s of
//    them as the k16 step s: the fragment's k order is a permutation of the dims, and the Q tile
//    is stored in the same permutation (kv8_q_dim), so the dot products are unchanged.
//  - O = P V: lane (g, t) reads kVBytes of V rows 2t, 2t+1, 2t+8, 2t+9 (the tokens of its
//    fragment) at dims [128 h + g kVBytes, ...): its dim i is row g of n8 tile h kVBytes + i,
//    so the output's columns come out permuted (kv8_out_dim undoes it in the merge).
// Stage bytes are XOR-swizzled by 16-byte chunk so that both read patterns hit distinct banks.
// The MMAs run in f16 for either dtype: every e4m3/e5m2 value is an f16 value, so a pair widens
// in one instruction (bf16 would take three conversions a pair, at a quarter of the issue rate,
// which bounded the kernel below the bandwidth), and P is more precise in f16. Q is rounded to
// f16 (exact for bf16 values of magnitude 2^-14..65504; a row with larger ones is scaled by a power
// of two first and its scores scaled back, kv8_q_row_exponent; NaN stays NaN).
template <int kHeadDim>
struct Kv8Direct {
  static constexpr bool kUsable = kv8_direct_head_dim(kHeadDim);
  static constexpr int kStages = kv8_stages(kHeadDim);
  static constexpr int kRows = 16;                            // one warp's step
  static constexpr int kTileBytes = kRows * kHeadDim;         // K (or V) of one step
  static constexpr int kStageBytes = 2 * kTileBytes;
  static constexpr int kWarpBytes = kStages * kStageBytes;
  static constexpr int kChunksPerRow = kHeadDim / 16;
  static constexpr int kChunksPerLane = kRows * kChunksPerRow / 32;
  static constexpr int kVBytes = kHeadDim >= 128 ? 16 : kHeadDim / 8;  // V bytes of one row per lane and part
  static constexpr int kVParts = kHeadDim / 8 / kVBytes;

  // Byte offset of 16-byte chunk `chunk` of row `row` in a tile.
  static __device__ __forceinline__ int offset(int row, int chunk) {
    const int linear = row * kHeadDim + chunk * 16;
    // Head dim 64 (two rows a 128-byte line): rows 2t of lines t = 0..3 to distinct chunks.
    // Wider rows: rows g, g + 1 to opposite half-lines, and rows 0, 2, 4, 6 apart.
    const int swizzle = kHeadDim == 64 ? ((row >> 1) & 3) << 1 : ((row & 1) << 2) ^ (((row >> 1) & 3) << 1);
    return linear ^ (swizzle << 4);
  }
};

// f16 of a query value for the direct path (see Kv8Direct): saturating, NaN kept. Rows past
// f16's range are scaled into it first (kv8_q_row_exponent), so only inf saturates.
__device__ __forceinline__ float kv8_q_value(float value) {
  return value > 65504.f ? 65504.f : value < -65504.f ? -65504.f : value;
}

template <typename T> struct IsBf16 { static constexpr bool value = false; };
template <> struct IsBf16<bf16_t> { static constexpr bool value = true; };

// Where the direct path's Q tile keeps a row's score factor 2^e: the first word of the row's
// padding (the tile's rows are kHeadDim + 8 elements apart; the MMAs read only the first kHeadDim).
template <typename T, int kHeadDim>
__device__ __forceinline__ float* kv8_q_row_factor(T* smem_q, int row) {
  return reinterpret_cast<float*>(smem_q + row * (kHeadDim + 8) + kHeadDim);
}

// The factors that turn a lane's raw direct-path scores (rows g and g + 8) into scores against
// dequantized K of the unscaled Q: the K scale, times 2^e where the row was scaled (bf16 only).
// Reads the tile after the barrier that publishes it.
template <typename T, int kHeadDim>
__device__ __forceinline__ void kv8_score_scales(T* smem_q, int quad_row, float k_scale, float (&scales)[2]) {
  if constexpr (IsBf16<T>::value) {
    scales[0] = k_scale * *kv8_q_row_factor<T, kHeadDim>(smem_q, quad_row);
    scales[1] = k_scale * *kv8_q_row_factor<T, kHeadDim>(smem_q, quad_row + 8);
  }
}

// An FP8 cache's raw scores (a warp's rows g and g + 8) as if K were dequantized and Q unscaled:
// times the K scale; a scaled bf16 row's factors (kScaledQ, score_scale: kv8_score_scales) ride
// with the softmax scale instead, except before a soft-cap, which needs the true scores.
template <int kFlags, bool kScaledQ>
__device__ __forceinline__ void kv8_scale_scores(float (&s)[2][4], float k_scale, const float (&score_scale)[2]) {
  if constexpr (!kScaledQ) {
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[j][e] *= k_scale;
  } else if constexpr (has_feature<kFlags>(kFeatureSoftCap)) {
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[j][e] *= score_scale[e >> 1];
  }
}

// The dim of Q stored at column `column` of the direct path's Q tile (see Kv8Direct): lane t
// reads 16-byte piece 4h + t of a K row for the 64 dims h. kSwizzled, the sm_90a decode's order
// (its TMA lays rows out with the 128-byte swizzle, piece c of row r at c ^ r % 8): piece
// 8 (h / 2) + 2t + h % 2, so that a quarter-warp's loads (rows g, g + 1, the same t) land on 8
// distinct 16-byte bank groups.
template <int kHeadDim, bool kSwizzled = false>
__device__ __forceinline__ int kv8_q_dim(int column) {
  const int step = column >> 4;  // k16 step
  const int k = column & 15;     // the fragment's k index: lane t holds 2t, 2t+1, 2t+8, 2t+9
  if constexpr (kSwizzled) {
    const int group = step >> 2;
    const int piece = (group >> 1) * 8 + ((k & 7) >> 1) * 2 + (group & 1);
    return piece * 16 + (step & 3) * 4 + (k >> 3) * 2 + (k & 1);
  }
  return (step >> 2) * 64 + ((k & 7) >> 1) * 16 + (step & 3) * 4 + (k >> 3) * 2 + (k & 1);
}

template <typename T, bool kF16> struct MmaType { using type = T; };
template <typename T> struct MmaType<T, true> { using type = fp16_t; };

// The output dim of accumulator n8 tile `tile`, column `column` on the direct path.
template <int kHeadDim>
__device__ __forceinline__ int kv8_out_dim(int tile, int column) {
  constexpr int kVBytes = Kv8Direct<kHeadDim>::kVBytes;
  return (tile / kVBytes) * 128 + column * kVBytes + tile % kVBytes;
}

}  // namespace astrai
