// One warp's 16-token step of the tensor-core decode from 16-bit K and V tiles in shared memory
// (ldmatrix): S = Q K^T and O += P V; and the direct FP8 path's fragment offsets (its products
// stay inline in paged_decode_mma: called as functions, they compiled to reordered PTX).
#pragma once

#include "decode_kv8_layout.cuh"
#include "mma_utils.cuh"

namespace astrai {

// S = Q K^T for 16 tokens: q_address and k_address are this lane's ldmatrix addresses of the Q
// tile and of the warp's 16 K rows (rows of kHeadDim + 8 elements).
template <typename T, int kHeadDim>
__device__ __forceinline__ void decode_scores_mma(float (&s)[2][4], unsigned q_address, unsigned k_address) {
#pragma unroll
  for (int kk = 0; kk < kHeadDim / 16; ++kk) {
    unsigned a[4];
    unsigned b[4];
    ldmatrix_x4(a, q_address + kk * 32);
    ldmatrix_x4(b, k_address + kk * 32);
    Mma<T>::run(s[0], a, b[0], b[1]);
    Mma<T>::run(s[1], a, b[2], b[3]);
  }
}

// O += P V for 16 tokens: v_address is this lane's (transposing) ldmatrix address of the warp's
// 16 V rows.
template <typename T, int kHeadDim>
__device__ __forceinline__ void decode_pv_mma(float (&o)[kHeadDim / 8][4], const unsigned (&pa)[4],
                                              unsigned v_address) {
#pragma unroll
  for (int dd = 0; dd < kHeadDim / 16; ++dd) {
    unsigned b[4];
    ldmatrix_x4_trans(b, v_address + dd * 32);
    Mma<T>::run(o[2 * dd], pa, b[0], b[1]);
    Mma<T>::run(o[2 * dd + 1], pa, b[2], b[3]);
  }
}

// Direct path: this lane's fragment offsets in a stage: K rows g and g + 8 (dims mod 128; the
// rest of a row lies at multiples of 128 bytes), V rows 2t, 2t+1, 2t+8, 2t+9.
template <int kHeadDim>
__device__ __forceinline__ void kv8_fragment_offsets(int (&k_read)[2][2], int (&v_read)[4], int quad_row,
                                                     int quad_col) {
  using Direct = Kv8Direct<kHeadDim>;
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int half = 0; half < 2; ++half) k_read[r][half] = Direct::offset(quad_row + 8 * r, 4 * half + quad_col);
#pragma unroll
  for (int r = 0; r < 4; ++r)
    v_read[r] = Direct::offset(2 * quad_col + (r & 1) + (r >> 1) * 8, quad_row * Direct::kVBytes / 16) +
                quad_row * Direct::kVBytes % 16;
}

}  // namespace astrai
