// The Q tile of a tensor-core decode CTA.
#pragma once

#include "decode_kv8_layout.cuh"
#include "decode_work.cuh"

namespace astrai {

// The direct FP8 path's tile of bf16 rows: each row rounded to f16, scaled into its range first
// where it is past it, with the row's score factor in its padding (kv8_q_row_exponent). A row's
// chunks lie in kChunksPerRow adjacent lanes of one warp, which find the row's maximum together.
template <typename T, int kHeadDim, int kQLen, bool kSwizzled>
__device__ __forceinline__ void load_decode_q_tile_scaled(const PagedDecodeParams& p, const DecodeWork& w,
                                                          T* smem_q, unsigned thread) {
  constexpr int kRowStride = kHeadDim + 8;
  constexpr int kChunksPerRow = kHeadDim / 8;
  static_assert(32 % kChunksPerRow == 0 && kDecodeHeadsPerTile * kChunksPerRow % kDecodeThreads == 0,
                "a row's chunks in one warp, every lane through the same iterations");
  const T* q = static_cast<const T*>(p.q) + w.batch_index * p.q_stride_batch;
  for (int chunk = thread; chunk < kDecodeHeadsPerTile * kChunksPerRow; chunk += kDecodeThreads) {
    const int row = chunk / kChunksPerRow;
    const int col = (chunk % kChunksPerRow) * 8;
    float values[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    float row_max = 0.f;
    if (row < w.rows) {
      const T* q_row = q + row_token<kQLen>(w.first_row, row) * p.q_stride_seq +
                       row_head<kQLen>(w.first_head, w.first_row, row) * p.q_stride_head;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        values[i] = to_float(q_row[kv8_q_dim<kHeadDim, kSwizzled>(col + i)]);
        row_max = fmaxf(row_max, fabsf(values[i]));
      }
    }
#pragma unroll
    for (int offset = kChunksPerRow / 2; offset > 0; offset >>= 1)
      row_max = fmaxf(row_max, __shfl_xor_sync(0xffffffffu, row_max, offset));
    const int exponent = kv8_q_row_exponent(row_max);
    if (col == 0) *kv8_q_row_factor<T, kHeadDim>(smem_q, row) = ldexpf(1.f, exponent);
#pragma unroll
    for (int i = 0; i < 8; ++i) values[i] = ldexpf(values[i], -exponent);
    unsigned words[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) words[i] = pack2<fp16_t>(kv8_q_value(values[2 * i]), kv8_q_value(values[2 * i + 1]));
    *reinterpret_cast<uint4*>(smem_q + row * kRowStride + col) = make_uint4(words[0], words[1], words[2], words[3]);
  }
}

// The Q tile of a decode CTA in shared memory: 16 rows of kRowStride elements (query heads, or
// (head, token) pairs), rows past the tile zero-filled. kDirect: f16, the dims in the direct FP8
// path's fragment order (kv8_q_dim; kSwizzled: the sm_90a decode's); bf16 rows scaled into f16's
// range (load_decode_q_tile_scaled).
template <typename T, int kHeadDim, int kQLen, bool kDirect, bool kSwizzled = false>
__device__ __forceinline__ void load_decode_q_tile(const PagedDecodeParams& p, const DecodeWork& w, T* smem_q,
                                                   unsigned thread = threadIdx.x) {
  if constexpr (kDirect && IsBf16<T>::value) {
    load_decode_q_tile_scaled<T, kHeadDim, kQLen, kSwizzled>(p, w, smem_q, thread);
    return;
  }
  constexpr int kRowStride = kHeadDim + 8;
  constexpr int kChunksPerRow = kHeadDim / 8;
  const T* q = static_cast<const T*>(p.q) + w.batch_index * p.q_stride_batch;
  for (int chunk = thread; chunk < kDecodeHeadsPerTile * kChunksPerRow; chunk += kDecodeThreads) {
    const int row = chunk / kChunksPerRow;
    const int col = (chunk % kChunksPerRow) * 8;
    uint4 value = make_uint4(0, 0, 0, 0);
    if (row < w.rows) {
      const T* q_row = q + row_token<kQLen>(w.first_row, row) * p.q_stride_seq +
                       row_head<kQLen>(w.first_head, w.first_row, row) * p.q_stride_head;
      if constexpr (kDirect) {  // fp16: in f16's range by its type
        unsigned words[4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
          words[i] = pack2<fp16_t>(kv8_q_value(to_float(q_row[kv8_q_dim<kHeadDim, kSwizzled>(col + 2 * i)])),
                                   kv8_q_value(to_float(q_row[kv8_q_dim<kHeadDim, kSwizzled>(col + 2 * i + 1)])));
        value = make_uint4(words[0], words[1], words[2], words[3]);
      } else {
        value = *reinterpret_cast<const uint4*>(q_row + col);
      }
    }
    *reinterpret_cast<uint4*>(smem_q + row * kRowStride + col) = value;
  }
}

}  // namespace astrai
