// The end of a tensor-core decode CTA: the four warps' softmax states merged, and the tile's
// rows written to the output or the split workspace.
#pragma once

#include "attention_combine.cuh"
#include "decode_kv8_layout.cuh"
#include "decode_softmax.cuh"

namespace astrai {

// Merges the four warps' softmax states through shared memory (`merge`: at least
// decode_merge_bytes(kHeadDim), free by now) and writes the tile's rows: to the output, or to
// the split workspace with their LSE. kPermuted: O's columns come in the direct FP8 path's
// order (kv8_out_dim). out_scale: the V scale of an FP8 cache.
template <int kHeadDim>
constexpr int decode_merge_bytes() {
  return (4 * (kHeadDim + 8) + 8) * kDecodeHeadsPerTile * 4;
}

// A wide CTA (the Hopper decode's, paged_decode_sm90.cuh) runs kGroups splits side by side, a
// group of kDecodeThreads threads each: a group waits for its own threads only (named barrier
// 1 + group; barrier 0 is the CTA's).
template <int kGroups>
__device__ __forceinline__ void decode_group_sync() {
  if constexpr (kGroups == 1) {
    __syncthreads();
  } else {
    asm volatile("bar.sync %0, %1;\n" ::"r"(1 + static_cast<int>(threadIdx.x) / kDecodeThreads), "r"(kDecodeThreads)
                 : "memory");
  }
}

// A wide CTA's slot for one group's rows: their normalized values, then their LSEs (natural log).
template <int kHeadDim>
constexpr int decode_slot_bytes() {
  return kDecodeHeadsPerTile * (kHeadDim + 1) * 4;
}

// Row `row`'s warp weights (normalization, sink and V scale folded in) and its LSE, written
// over its maxima and sums. Worked out per element instead, the statistics made a serial chain of
// each thread's elements (batch 1's merge).
template <int kHeadDim, int kFlags>
__device__ __forceinline__ void merge_row_weights(const PagedDecodeParams& p, const DecodeWork& w, float* merge_max,
                                                  float* merge_sum, int row, float out_scale) {
  constexpr int kQLen = decode_q_len(kFlags);
  float max_all = negative_infinity();
#pragma unroll
  for (int v = 0; v < 4; ++v) max_all = fmaxf(max_all, merge_max[v * kDecodeHeadsPerTile + row]);
  float weight[4];
  float total = 0.f;
#pragma unroll
  for (int v = 0; v < 4; ++v) {
    const float m = merge_max[v * kDecodeHeadsPerTile + row];
    weight[v] = (m == negative_infinity()) ? 0.f : fast_exp2(m - max_all);
    total += weight[v] * merge_sum[v * kDecodeHeadsPerTile + row];
  }
  float factor = out_scale;
  // The sink joins the denominator once per row: in split 0 (the combine adds the rest).
  if (has_feature<kFlags>(kFeatureSink) && w.split == 0)
    factor *= fold_sink(p.features.sinks[row_head<kQLen>(w.first_head, w.first_row, row)], &max_all, &total);
  // Nothing kept (every token masked): zeros and -inf, never NaN.
  const bool empty = !(total > 0.f);
  const float scale = empty ? 0.f : factor / total;
#pragma unroll
  for (int v = 0; v < 4; ++v) merge_max[v * kDecodeHeadsPerTile + row] = weight[v] * scale;
  merge_sum[row] = empty ? negative_infinity() : (max_all + __log2f(total)) * kLn2;
}

// The direct FP8 path's rows (columns permuted, kv8_out_dim): an element at a time.
template <typename T, int kHeadDim, int kQLen>
__device__ __forceinline__ void write_merged_elements(const PagedDecodeParams& p, const DecodeWork& w,
                                                      const float* merge_o, const float* merge_max,
                                                      const float* merge_sum, unsigned thread) {
  constexpr int kMergeStride = kHeadDim + 8;
  // The FP8 direct path's columns are permuted: an element at a time, not unrolled (unrolled,
  // ptxas fits its kernel into 80 registers with spills: hd64 24/4 with pages of 1 ran 4.2% slower).
  const int elements = w.rows * kHeadDim;
#pragma unroll 1
  for (int e = thread; e < elements; e += kDecodeThreads) {
    const int row = e / kHeadDim;
    const int col = e % kHeadDim;
    float value = 0.f;
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      const float weight = merge_max[v * kDecodeHeadsPerTile + row];
      // A warp that saw no token weighs zero and never lets its O through.
      value += weight != 0.f ? weight * merge_o[(v * kDecodeHeadsPerTile + row) * kMergeStride + col] : 0.f;
    }
    store_row_element<T, kHeadDim, kQLen>(p.workspace, p.out, p.out_stride_batch, p.out_stride_seq,
                                          p.out_stride_head, p.lse, p.batch, p.n_heads, w.split, w.batch_index,
                                          row_token<kQLen>(w.first_row, row),
                                          row_head<kQLen>(w.first_head, w.first_row, row), col, value,
                                          merge_sum[row]);
  }
}

template <typename T, int kHeadDim, int kFlags, bool kPermuted, int kGroups = 1, bool kRowScaled = false>
__device__ __forceinline__ void merge_decode_warps(const PagedDecodeParams& p, const DecodeWork& w,
                                                   DecodeWarpSoftmax<kHeadDim, kFlags, kRowScaled>& state, void* merge,
                                                   float out_scale, float* slot = nullptr) {
  constexpr int kQLen = decode_q_len(kFlags);
  const unsigned thread = kGroups == 1 ? threadIdx.x : threadIdx.x % kDecodeThreads;
  const int lane = thread & 31;
  const int warp = thread >> 5;
  const int quad_row = lane >> 2;
  const int quad_col = lane & 3;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    state.row_sum[r] += __shfl_xor_sync(0xffffffffu, state.row_sum[r], 1);
    state.row_sum[r] += __shfl_xor_sync(0xffffffffu, state.row_sum[r], 2);
  }
  // Rows padded by 8 floats: the float2 stores of a half-warp then hit 32 distinct banks.
  constexpr int kMergeStride = kHeadDim + 8;
  float* merge_o = static_cast<float*>(merge);                          // [4][16][kMergeStride]
  float* merge_max = merge_o + 4 * kDecodeHeadsPerTile * kMergeStride;  // [4][16]
  float* merge_sum = merge_max + 4 * kDecodeHeadsPerTile;              // [4][16]
  {
    float* mine = merge_o + warp * kDecodeHeadsPerTile * kMergeStride;
#pragma unroll
    for (int n = 0; n < kHeadDim / 8; ++n) {
      if constexpr (kPermuted) {
#pragma unroll
        for (int e = 0; e < 4; ++e)
          mine[(quad_row + (e >> 1) * 8) * kMergeStride + kv8_out_dim<kHeadDim>(n, quad_col * 2 + (e & 1))] =
              state.o[n][e];
      } else {
        const int col = n * 8 + quad_col * 2;
        *reinterpret_cast<float2*>(mine + quad_row * kMergeStride + col) = make_float2(state.o[n][0], state.o[n][1]);
        *reinterpret_cast<float2*>(mine + (quad_row + 8) * kMergeStride + col) =
            make_float2(state.o[n][2], state.o[n][3]);
      }
    }
    if (quad_col == 0) {
      merge_max[warp * kDecodeHeadsPerTile + quad_row] = state.row_max[0];
      merge_max[warp * kDecodeHeadsPerTile + quad_row + 8] = state.row_max[1];
      merge_sum[warp * kDecodeHeadsPerTile + quad_row] = state.row_sum[0];
      merge_sum[warp * kDecodeHeadsPerTile + quad_row + 8] = state.row_sum[1];
    }
  }
  decode_group_sync<kGroups>();

  // Each row's warp weights and LSE, a thread a row; then the elements.
  if (thread < w.rows) merge_row_weights<kHeadDim, kFlags>(p, w, merge_max, merge_sum, thread, out_scale);
  decode_group_sync<kGroups>();

  // merge_o holds the columns in order whatever kPermuted: a wide CTA's group reads it by quads
  // into its slot (its 128 registers a thread leave room for the unrolled loop).
  if constexpr (!kPermuted || kGroups > 1) {
    // Four adjacent columns a thread: a float4 read of each warp's row and one 16-byte store
    // of the partial row. Stored a float at a time, batch 1's call took 0.36 us longer.
    const int quads = w.rows * (kHeadDim / 4);
#pragma unroll 4
    for (int e = thread; e < quads; e += kDecodeThreads) {
      const int row = e / (kHeadDim / 4);
      const int col = (e % (kHeadDim / 4)) * 4;
      float4 value = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int v = 0; v < 4; ++v) {
        const float weight = merge_max[v * kDecodeHeadsPerTile + row];
        const float4 o =
            *reinterpret_cast<const float4*>(merge_o + (v * kDecodeHeadsPerTile + row) * kMergeStride + col);
        // A warp that saw no token weighs zero and never lets its O through.
        value.x += weight != 0.f ? weight * o.x : 0.f;
        value.y += weight != 0.f ? weight * o.y : 0.f;
        value.z += weight != 0.f ? weight * o.z : 0.f;
        value.w += weight != 0.f ? weight * o.w : 0.f;
      }
      if (kGroups > 1) {  // to the group's slot, for the CTA's merge of its splits
        *reinterpret_cast<float4*>(slot + row * kHeadDim + col) = value;
        if (col == 0) slot[kDecodeHeadsPerTile * kHeadDim + row] = merge_sum[row];
        continue;
      }
      store_row_quad<T, kHeadDim, kQLen>(p.workspace, p.out, p.out_stride_batch, p.out_stride_seq, p.out_stride_head,
                                         p.lse, p.batch, p.n_heads, w.split, w.batch_index,
                                         row_token<kQLen>(w.first_row, row),
                                         row_head<kQLen>(w.first_head, w.first_row, row), col, value, merge_sum[row]);
    }
  } else {
    write_merged_elements<T, kHeadDim, kQLen>(p, w, merge_o, merge_max, merge_sum, thread);
  }
}

}  // namespace astrai
