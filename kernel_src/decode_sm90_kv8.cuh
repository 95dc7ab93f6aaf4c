// An FP8 cache on the sm_90a decode (paged_decode_sm90.cuh): TMA brings the cache's bytes, half
// a 16-bit row's, into the ring, and each warp reads its 16 tokens' bytes straight into f16 MMA
// fragments as the portable direct path does (decode_kv8_layout.cuh: the MMAs run in f16, Q
// rounded to f16 and bf16 rows scaled into its range, P in f16, the K scale on the scores and the
// V scale on the output). Only the addresses differ. Rows of 128-byte chunks (hd128, hd256) come
// with the 128-byte swizzle: piece c of row r lies at c ^ r % 8 of its line, so the Q tile takes
// the swizzled order of kv8_q_dim, and the V reads (piece g of rows 2t, 2t+1, 2t+8, 2t+9) are
// spread by the swizzle itself. hd64's rows of 64 bytes come with the 64-byte swizzle (piece c of
// row r at c ^ (r / 2) % 4): lanes (g, t) of a quarter-warp read piece t of rows g, g + 1, one
// 128-byte line, so the Q tile keeps the direct path's order; the V reads (8 bytes of even rows,
// or of odd ones, a half-warp's) meet in pairs: a row's parity sets its half of the line, which
// no swizzle of 64-byte rows moves.
#pragma once

#include "decode_sm90_parts.cuh"

namespace astrai {

// Whether the Q tile takes the swizzled order of kv8_q_dim (rows of 128-byte chunks).
template <int kHeadDim>
constexpr bool decode_sm90_kv8_swizzled_q() {
  return kHeadDim % 128 == 0;
}

// An FP8 cache's scales for a warp (all 1 for a 16-bit cache): the K scale on the scores (with a
// scaled bf16 Q row's factor, which the softmax takes with its scale), the V scale on the output.
template <typename T, int kHeadDim, int kFlags>
struct Sm90KvScales {
  float k = 1.f;
  float v = 1.f;
  float score[2] = {1.f, 1.f};  // rows g and g + 8 (kv8_score_scales)

  template <bool kScaledQ>
  __device__ __forceinline__ Sm90KvScales(const PagedDecodeParams& p, const DecodeWork& w, T* smem_q, int lane,
                                          DecodeWarpSoftmax<kHeadDim, kFlags, kScaledQ>& state) {
    if constexpr (has_fp8_kv<kFlags>()) {
      k = kv_scale(p.features.k_scale, p.features.kv_scale_stride, w.kv_head);
      v = kv_scale(p.features.v_scale, p.features.kv_scale_stride, w.kv_head);
      score[0] = score[1] = k;
      kv8_score_scales<T, kHeadDim>(smem_q, lane >> 2, k, score);
      if constexpr (kScaledQ) state.set_row_scales(p, score);
    }
  }
};

// S = Q K^T for the warp's 16 tokens from a swizzled FP8 K tile: lane (g, t) reads, of rows
// 16 warp + g and + 8, piece 2t + h % 2 of chunk h / 2 for the 64 dims h (Q in the swizzled
// order of kv8_q_dim), or at hd64 piece t (Q in the direct path's order).
template <int kHeadDim, bool kE5m2>
__device__ __forceinline__ void sm90_kv8_scores(float (&s)[2][4], unsigned q_address, const unsigned char* k_tile,
                                                int warp, int lane) {
  const int g = lane >> 2;
  const int t = lane & 3;
  if constexpr (kHeadDim == 64) {
    // Rows g and g + 8 share their swizzle ((g + 8) / 2 % 4 = g / 2 % 4).
    const unsigned char* row = k_tile + (warp * 16 + g) * 64 + ((t ^ ((g >> 1) & 3)) << 4);
    const uint4 k0 = *reinterpret_cast<const uint4*>(row);
    const uint4 k1 = *reinterpret_cast<const uint4*>(row + 8 * 64);
    kv8_scores_group<kE5m2>(s, q_address, 0, k0, k1);
  } else {
    constexpr int kChunkBytes = kDecodeBlockTokens * 128;
    const unsigned char* row = k_tile + (warp * 16 + g) * 128;
#pragma unroll
    for (int h = 0; h < kHeadDim / 64; ++h) {
      const int offset = (h >> 1) * kChunkBytes + (((2 * t + (h & 1)) ^ g) << 4);  // rows g and g + 8 alike
      const uint4 k0 = *reinterpret_cast<const uint4*>(row + offset);
      const uint4 k1 = *reinterpret_cast<const uint4*>(row + 8 * 128 + offset);
      kv8_scores_group<kE5m2>(s, q_address, h, k0, k1);
    }
  }
}

// O += P V for the warp's 16 tokens from a swizzled FP8 V tile: lane (g, t) reads, of rows 2t,
// 2t+1, 2t+8, 2t+9, piece g of each 128-dim chunk, or at hd64 bytes 8g..8g+7 (output columns
// permuted: kv8_out_dim).
template <int kHeadDim, bool kE5m2>
__device__ __forceinline__ void sm90_kv8_pv(float (&o)[kHeadDim / 8][4], const unsigned (&pa)[4],
                                            const unsigned char* v_tile, int warp, int lane) {
  constexpr int kChunkBytes = kDecodeBlockTokens * 128;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int rows[4] = {warp * 16 + 2 * t, warp * 16 + 2 * t + 1, warp * 16 + 2 * t + 8, warp * 16 + 2 * t + 9};
  uint4 rows_v[4];
  if constexpr (kHeadDim == 64) {
    static_assert(Kv8Direct<kHeadDim>::kVBytes == 8 && Kv8Direct<kHeadDim>::kVParts == 1,
                  "a lane's V bytes are half a 16-byte piece");
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const uint2 half = *reinterpret_cast<const uint2*>(v_tile + rows[r] * 64 +
                                                         ((((g >> 1) ^ (rows[r] >> 1)) & 3) << 4) + (g & 1) * 8);
      rows_v[r] = make_uint4(half.x, half.y, 0u, 0u);
    }
    kv8_pv_part<kHeadDim, kE5m2>(o, pa, 0, rows_v);
  } else {
    static_assert(Kv8Direct<kHeadDim>::kVBytes == 16 && Kv8Direct<kHeadDim>::kVParts == kHeadDim / 128,
                  "a lane's V bytes a part are one 16-byte piece of a chunk");
#pragma unroll
    for (int part = 0; part < kHeadDim / 128; ++part) {
#pragma unroll
      for (int r = 0; r < 4; ++r)
        rows_v[r] = *reinterpret_cast<const uint4*>(v_tile + part * kChunkBytes + rows[r] * 128 +
                                                    ((g ^ (rows[r] & 7)) << 4));
      kv8_pv_part<kHeadDim, kE5m2>(o, pa, part, rows_v);
    }
  }
}

// One block's work for a warp on an FP8 cache: S from the K bytes, the scores as if K were
// dequantized (kv8_scale_scores), the softmax step in f16, O += P V.
template <typename T, int kHeadDim, int kFlags, bool kScaledQ>
__device__ __forceinline__ void sm90_kv8_block(DecodeWarpSoftmax<kHeadDim, kFlags, kScaledQ>& state,
                                               const PagedDecodeParams& p, const DecodeWork& w, unsigned q_address,
                                               const unsigned char* k_tile, const unsigned char* v_tile,
                                               int first_token, const Sm90KvScales<T, kHeadDim, kFlags>& scales,
                                               int warp, int lane) {
  constexpr bool kE5m2 = has_feature<kFlags>(kFeatureKvE5m2);
  float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
  sm90_kv8_scores<kHeadDim, kE5m2>(s, q_address, k_tile, warp, lane);
  kv8_scale_scores<kFlags, kScaledQ>(s, scales.k, scales.score);
  unsigned pa[4];
  state.template step<fp16_t>(s, pa, p, w, first_token);
  sm90_kv8_pv<kHeadDim, kE5m2>(state.o, pa, v_tile, warp, lane);
}

}  // namespace astrai
