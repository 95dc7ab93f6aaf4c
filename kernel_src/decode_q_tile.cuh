// The Q tile of a tensor-core decode CTA.
#pragma once

#include "decode_kv8_layout.cuh"
#include "decode_work.cuh"

namespace astrai {

// The Q tile of a decode CTA in shared memory: 16 rows of kRowStride elements (query heads, or
// (head, token) pairs), rows past the tile zero-filled. kDirect: f16, the dims in the direct FP8
// path's fragment order (kv8_q_dim).
template <typename T, int kHeadDim, int kQLen, bool kDirect>
__device__ __forceinline__ void load_decode_q_tile(const PagedDecodeParams& p, const DecodeWork& w, T* smem_q,
                                                   unsigned thread = threadIdx.x) {
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
      if constexpr (kDirect) {
        unsigned words[4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
          words[i] = pack2<fp16_t>(kv8_q_value(to_float(q_row[kv8_q_dim<kHeadDim>(col + 2 * i)])),
                                   kv8_q_value(to_float(q_row[kv8_q_dim<kHeadDim>(col + 2 * i + 1)])));
        value = make_uint4(words[0], words[1], words[2], words[3]);
      } else {
        value = *reinterpret_cast<const uint4*>(q_row + col);
      }
    }
    *reinterpret_cast<uint4*>(smem_q + row * kRowStride + col) = value;
  }
}

}  // namespace astrai
