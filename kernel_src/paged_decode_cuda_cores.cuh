// The CUDA-core decode (sm_75, and ASTRAI_NO_MMA builds): warp w owns query heads w, w + 4, ...
// and walks every token with warp-wide dot products.
#pragma once

#include "decode_start.cuh"

namespace astrai {

// The end of a CUDA-core decode CTA: warp w's rows (w, w + 4, ...) normalized (the sink
// folded in, in split 0; an FP8 cache's V scale applied) and written with their LSEs.
template <typename T, int kHeadDim, int kFlags>
__device__ __forceinline__ void write_cuda_core_rows(const PagedDecodeParams& p, const DecodeWork& w,
                                                     float (&acc)[kDecodeHeadsPerTile / 4][(kHeadDim + 31) / 32],
                                                     float (&row_max)[kDecodeHeadsPerTile / 4],
                                                     float (&row_sum)[kDecodeHeadsPerTile / 4], float v_scale) {
  constexpr int kQLen = decode_q_len(kFlags);
  constexpr int kPerLane = CeilDiv<kHeadDim, 32>::value;
  constexpr int kHeadsPerWarp = kDecodeHeadsPerTile / 4;
  constexpr bool kFp8 = has_fp8_kv<kFlags>();
  const int split = w.split, batch_index = w.batch_index;
  const int rows = w.rows, first_head = w.first_head, first_row = w.first_row;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
#pragma unroll
  for (int i = 0; i < kHeadsPerWarp; ++i) {
    const int local = warp + 4 * i;
    if (local >= rows) continue;
    // The sink joins the denominator once per row: in split 0 (the combine adds the rest).
    float sink_factor = 1.f;
    if (has_feature<kFlags>(kFeatureSink) && split == 0)
      sink_factor =
          fold_sink(p.features.sinks[row_head<kQLen>(first_head, first_row, local)], &row_max[i], &row_sum[i]);
    const bool empty = !(row_sum[i] > 0.f);  // every token masked
    const float lse = empty ? negative_infinity() : (row_max[i] + __log2f(row_sum[i])) * kLn2;
    const float inverse = empty ? 0.f : (kFp8 ? sink_factor * v_scale : sink_factor) / row_sum[i];
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const int d = lane + 32 * k;
      if (d < kHeadDim)
        store_row_element<T, kHeadDim, kQLen>(p.workspace, p.out, p.out_stride_batch, p.out_stride_seq,
                                              p.out_stride_head, p.lse, p.batch, p.n_heads, split, batch_index,
                                              row_token<kQLen>(first_row, local),
                                              row_head<kQLen>(first_head, first_row, local), d, acc[i][k] * inverse,
                                              lse);
    }
  }
}

template <typename T, int kHeadDim, int kPageSize, int kGroup, int kFlags>
__device__ void paged_decode_cuda_cores(const PagedDecodeParams& p, unsigned char* smem_raw) {
  using Tiles = PagedDecodeTiles<T, kHeadDim, kPageSize>;
  constexpr int kQLen = decode_q_len(kFlags);
  constexpr int kRowStride = Tiles::kRowStride;
  constexpr int kPerLane = CeilDiv<kHeadDim, 32>::value;  // elements of a row per lane
  constexpr int kHeadsPerWarp = kDecodeHeadsPerTile / 4;

  T* smem_k = reinterpret_cast<T*>(smem_raw);
  T* smem_v = smem_k + Tiles::kStageElems;

  const DecodeWork w = decode_work<kPageSize, kGroup, kFlags>(p);
  if (!decode_work_begin<T, kHeadDim, kPageSize, kFlags>(p, w)) return;
  const DecodeSequence& seq = w.seq;
  const int kv_head = w.kv_head, batch_index = w.batch_index;
  const int rows = w.rows, first_head = w.first_head, first_row = w.first_row;
  const int window_first = w.window_first, split_begin = w.split_begin, split_end = w.split_end;
  // FP8: rows are widened as they load; the K scale multiplies q, the V scale the output.
  constexpr bool kFp8 = has_fp8_kv<kFlags>();
  constexpr bool kE5m2 = has_feature<kFlags>(kFeatureKvE5m2);
  const float k_scale = kFp8 ? kv_scale(p.features.k_scale, p.features.kv_scale_stride, kv_head) : 1.f;
  const float v_scale = kFp8 ? kv_scale(p.features.v_scale, p.features.kv_scale_stride, kv_head) : 1.f;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;

  float q[kHeadsPerWarp][kPerLane];
  float acc[kHeadsPerWarp][kPerLane];
  float row_max[kHeadsPerWarp];
  float row_sum[kHeadsPerWarp];
  int row_end[kHeadsPerWarp];           // multi-token: past the row's own query token
  int row_window_first[kHeadsPerWarp];  // multi-token: that token's window
  float row_slope[kHeadsPerWarp];       // ALiBi: the row's head's slope, log2 units
  const T* q_base = static_cast<const T*>(p.q) + batch_index * p.q_stride_batch;
#pragma unroll
  for (int i = 0; i < kHeadsPerWarp; ++i) {
    const int local = warp + 4 * i;
    const int position = seq.length - kQLen + row_token<kQLen>(first_row, local);
    row_end[i] = position + 1;
    row_window_first[i] = has_feature<kFlags>(kFeatureWindow) ? window_first_key(position, p.features) : 0;
    if constexpr (has_feature<kFlags>(kFeatureAlibi))
      row_slope[i] = local < rows ? alibi_slope_log2(p.features, row_head<kQLen>(first_head, first_row, local)) : 0.f;
    row_max[i] = negative_infinity();
    row_sum[i] = 0.f;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const int d = lane + 32 * k;
      acc[i][k] = 0.f;
      q[i][k] = (local < rows && d < kHeadDim)
                    // The scale, or with a soft-cap the tanh argument's (scale / cap).
                    ? to_float(q_base[row_token<kQLen>(first_row, local) * p.q_stride_seq +
                                      row_head<kQLen>(first_head, first_row, local) * p.q_stride_head + d]) *
                          (has_feature<kFlags>(kFeatureSoftCap) ? p.features.cap_scale : p.scale_log2)
                    : 0.f;
      if constexpr (kFp8) q[i][k] *= k_scale;
    }
  }

  for (int block_start = split_begin; block_start < split_end; block_start += kDecodeBlockTokens) {
    for (int chunk = threadIdx.x; chunk < kDecodeBlockTokens * Tiles::kChunksPerRow;
         chunk += kDecodeThreads) {
      const int row = chunk / Tiles::kChunksPerRow;
      const int col = (chunk % Tiles::kChunksPerRow) * 8;
      const int token = block_start + row;
      uint4 k_value = make_uint4(0, 0, 0, 0);
      uint4 v_value = make_uint4(0, 0, 0, 0);
      if constexpr (kFp8) {
        // The appended token as the cache receives it: quantized, then widened like the rest.
        const unsigned char* k_row;
        const unsigned char* v_row;
        if (KvLayout<kPageSize>::kPaged && token < split_end && token == seq.append_token) {
          const T* k_src = static_cast<const T*>(p.new_k) + batch_index * p.new_k_stride_batch +
                           kv_head * p.new_k_stride_head + col;
          const T* v_src = static_cast<const T*>(p.new_v) + batch_index * p.new_v_stride_batch +
                           kv_head * p.new_v_stride_head + col;
          k_value = widen_fp8x8<T, kE5m2>(quantize_fp8x4<T, kE5m2>(k_src, k_scale),
                                          quantize_fp8x4<T, kE5m2>(k_src + 4, k_scale));
          v_value = widen_fp8x8<T, kE5m2>(quantize_fp8x4<T, kE5m2>(v_src, v_scale),
                                          quantize_fp8x4<T, kE5m2>(v_src + 4, v_scale));
        } else if (token < split_end &&
                   kv_rows<unsigned char, kPageSize>(p, seq, batch_index, kv_head, token, &k_row, &v_row)) {
          const uint2 k_bytes = *reinterpret_cast<const uint2*>(k_row + col);
          const uint2 v_bytes = *reinterpret_cast<const uint2*>(v_row + col);
          k_value = widen_fp8x8<T, kE5m2>(k_bytes.x, k_bytes.y);
          v_value = widen_fp8x8<T, kE5m2>(v_bytes.x, v_bytes.y);
        }
      } else {
        const T* k_row;
        const T* v_row;
        if (token < split_end && kv_rows<T, kPageSize>(p, seq, batch_index, kv_head, token, &k_row, &v_row)) {
          k_value = *reinterpret_cast<const uint4*>(k_row + col);
          v_value = *reinterpret_cast<const uint4*>(v_row + col);
        }
      }
      *reinterpret_cast<uint4*>(smem_k + row * kRowStride + col) = k_value;
      *reinterpret_cast<uint4*>(smem_v + row * kRowStride + col) = v_value;
    }
    __syncthreads();

    const int block_tokens = min(kDecodeBlockTokens, split_end - block_start);
    for (int t = 0; t < block_tokens; ++t) {
      if ((has_feature<kFlags>(kFeatureWindow) && block_start + t < window_first) ||
          !token_kept(p, batch_index, block_start + t))
        continue;  // masked or before the window: contributes nothing
      float k_row[kPerLane];
      float v_row[kPerLane];
#pragma unroll
      for (int k = 0; k < kPerLane; ++k) {
        const int d = lane + 32 * k;
        k_row[k] = d < kHeadDim ? to_float(smem_k[t * kRowStride + d]) : 0.f;
        v_row[k] = d < kHeadDim ? to_float(smem_v[t * kRowStride + d]) : 0.f;
      }
#pragma unroll
      for (int i = 0; i < kHeadsPerWarp; ++i) {
        if (warp + 4 * i >= rows) continue;  // warp-uniform
        if (kQLen > 1 && (block_start + t >= row_end[i] ||
                          (has_feature<kFlags>(kFeatureWindow) && block_start + t < row_window_first[i])))
          continue;  // past the row's query token or before its window (warp-uniform)
        float dot = 0.f;
#pragma unroll
        for (int k = 0; k < kPerLane; ++k) dot += q[i][k] * k_row[k];
        float score = warp_all_sum(dot);
        if (has_feature<kFlags>(kFeatureSoftCap)) score = p.features.cap_log2 * fast_tanh(score);
        if constexpr (has_feature<kFlags>(kFeatureAlibi)) score += alibi_bias(row_slope[i], block_start + t, row_end[i] - 1);
        const float new_max = fmaxf(row_max[i], score);
        const float correction = exp2f(row_max[i] - new_max);
        const float weight = exp2f(score - new_max);
        row_max[i] = new_max;
        row_sum[i] = row_sum[i] * correction + weight;
#pragma unroll
        for (int k = 0; k < kPerLane; ++k) acc[i][k] = acc[i][k] * correction + weight * v_row[k];
      }
    }
    __syncthreads();
  }

  write_cuda_core_rows<T, kHeadDim, kFlags>(p, w, acc, row_max, row_sum, v_scale);
}

}  // namespace astrai
