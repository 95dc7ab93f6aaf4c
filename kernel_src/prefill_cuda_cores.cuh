// The portable prefill's CUDA-core path (prefill.cuh under ASTRAI_NO_MMA, block_q 64): the CTA
// walks its rows in passes of 32 (8 per warp); a lane scores one token of a 32-token tile and
// accumulates a slice of the head dim.
#pragma once

#include "prefill_common.cuh"

#ifdef ASTRAI_NO_MMA
namespace astrai {

// Tokens [block_start, block_start + kPrefillCoreBlockKv) of K and V into the shared tiles, widened
// from an FP8 cache as they load; tokens at or past kv_end and on unmapped pages are zeros.
template <typename T, int kHeadDim, int kPageSize, int kFlags>
__device__ __forceinline__ void prefill_core_load_kv(const PrefillParams& p, const int* table_row, const T* k_head,
                                                     const T* v_head, const PrefillKv8& kv8, T* smem_k, T* smem_v,
                                                     int block_start, int pass_kv_end) {
  using Shape = PrefillShape<kHeadDim, kPageSize>;
  constexpr int kRowStride = Shape::kRowStride;
  constexpr int kChunksPerRow = Shape::kChunksPerRow;
  constexpr int kBlockKv = kPrefillCoreBlockKv;
  constexpr bool kFp8 = has_fp8_kv<kFlags>();
  constexpr bool kE5m2 = has_feature<kFlags>(kFeatureKvE5m2);
  for (int chunk = threadIdx.x; chunk < kBlockKv * kChunksPerRow; chunk += kPrefillThreads) {
    const int row = chunk / kChunksPerRow;
    const int col = (chunk % kChunksPerRow) * 8;
    const int token = block_start + row;
    uint4 k_value = make_uint4(0, 0, 0, 0);
    uint4 v_value = make_uint4(0, 0, 0, 0);
    long long k_offset = 0;
    long long v_offset = 0;
    if (token < pass_kv_end &&
        prefill_kv_offsets<kPageSize>(p, table_row, token, &k_offset, &v_offset)) {
      if constexpr (kFp8) {
        const uint2 k_bytes = *reinterpret_cast<const uint2*>(kv8.k_head + k_offset + col);
        const uint2 v_bytes = *reinterpret_cast<const uint2*>(kv8.v_head + v_offset + col);
        k_value = widen_fp8x8<T, kE5m2>(k_bytes.x, k_bytes.y);
        v_value = widen_fp8x8<T, kE5m2>(v_bytes.x, v_bytes.y);
      } else {
        k_value = *reinterpret_cast<const uint4*>(k_head + k_offset + col);
        v_value = *reinterpret_cast<const uint4*>(v_head + v_offset + col);
      }
    }
    *reinterpret_cast<uint4*>(smem_k + row * kRowStride + col) = k_value;
    *reinterpret_cast<uint4*>(smem_v + row * kRowStride + col) = v_value;
  }
}

// The pass's Q rows [pass_start, pass_start + pass_rows) into shared memory (rows past them zeros).
template <typename T, int kHeadDim, int kPageSize>
__device__ __forceinline__ void prefill_core_load_q(const PrefillParams& p, const PrefillRequest& r, T* smem_q,
                                                    int batch_index, int head, int pass_start, int pass_rows) {
  using Shape = PrefillShape<kHeadDim, kPageSize>;
  constexpr int kRowStride = Shape::kRowStride;
  constexpr int kChunksPerRow = Shape::kChunksPerRow;
  const T* q_rows = static_cast<const T*>(p.q) + batch_index * p.q_stride_batch +
                    static_cast<long long>(r.q_start + pass_start) * p.q_stride_seq + head * p.q_stride_head;
  for (int chunk = threadIdx.x; chunk < kPrefillCoreRows * kChunksPerRow; chunk += kPrefillThreads) {
    const int row = chunk / kChunksPerRow;
    const int col = (chunk % kChunksPerRow) * 8;
    uint4 value = make_uint4(0, 0, 0, 0);
    if (row < pass_rows) value = *reinterpret_cast<const uint4*>(q_rows + row * p.q_stride_seq + col);
    *reinterpret_cast<uint4*>(smem_q + row * kRowStride + col) = value;
  }
}

// Raw scores of the warp's rows against token `lane` of the shared K tile.
template <typename T, int kHeadDim, int kPageSize>
__device__ __forceinline__ void prefill_core_scores(const T* smem_q, const T* smem_k, int warp, int lane,
                                                    float (&s)[kPrefillCoreRowsPerWarp]) {
  using Shape = PrefillShape<kHeadDim, kPageSize>;
  constexpr int kRowStride = Shape::kRowStride;
  constexpr int kChunksPerRow = Shape::kChunksPerRow;
  constexpr int kRows = kPrefillCoreRowsPerWarp;
#pragma unroll
  for (int i = 0; i < kRows; ++i) s[i] = 0.f;
  const T* k_row = smem_k + lane * kRowStride;
#pragma unroll 2
  for (int c = 0; c < kChunksPerRow; ++c) {
    const uint4 k_packed = *reinterpret_cast<const uint4*>(k_row + c * 8);
    const unsigned k_words[4] = {k_packed.x, k_packed.y, k_packed.z, k_packed.w};
    float k_values[8];
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      k_values[2 * w] = low_half<T>(k_words[w]);
      k_values[2 * w + 1] = high_half<T>(k_words[w]);
    }
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const uint4 q_packed = *reinterpret_cast<const uint4*>(smem_q + (warp * kRows + i) * kRowStride + c * 8);
      const unsigned q_words[4] = {q_packed.x, q_packed.y, q_packed.z, q_packed.w};
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        s[i] = fmaf(low_half<T>(q_words[w]), k_values[2 * w], s[i]);
        s[i] = fmaf(high_half<T>(q_words[w]), k_values[2 * w + 1], s[i]);
      }
    }
  }
}

// O += P V over the tile's first `tile_tokens` tokens: lane owns head-dim elements lane + 32k;
// token t's weights come from lane t.
template <typename T, int kHeadDim, int kPageSize>
__device__ __forceinline__ void prefill_core_pv(const T* smem_v, const float (&weight)[kPrefillCoreRowsPerWarp],
                                                int tile_tokens, int lane,
                                                float (&acc)[kPrefillCoreRowsPerWarp][CeilDiv<kHeadDim, 32>::value]) {
  constexpr int kRowStride = PrefillShape<kHeadDim, kPageSize>::kRowStride;
  constexpr int kRows = kPrefillCoreRowsPerWarp;
  constexpr int kPerLane = CeilDiv<kHeadDim, 32>::value;
  for (int t = 0; t < tile_tokens; ++t) {
    float v_values[kPerLane];
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const int d = lane + 32 * k;
      v_values[k] = d < kHeadDim ? to_float(smem_v[t * kRowStride + d]) : 0.f;
    }
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const float w = __shfl_sync(0xffffffffu, weight[i], t);
#pragma unroll
      for (int k = 0; k < kPerLane; ++k) acc[i][k] = fmaf(w, v_values[k], acc[i][k]);
    }
  }
}

// The warp's rows normalized (sinks folded in) into out, and their LSE.
template <typename T, int kHeadDim, int kFlags>
__device__ __forceinline__ void prefill_core_store(const PrefillParams& p, const PrefillRequest& r, const PrefillKv8& kv8,
                                                   float (&acc)[kPrefillCoreRowsPerWarp][CeilDiv<kHeadDim, 32>::value],
                                                   float (&row_max)[kPrefillCoreRowsPerWarp],
                                                   float (&row_sum)[kPrefillCoreRowsPerWarp], int batch_index, int head,
                                                   int warp_row0, int warp_rows, int lane) {
  constexpr int kRows = kPrefillCoreRowsPerWarp;
  constexpr int kPerLane = CeilDiv<kHeadDim, 32>::value;
  constexpr bool kFp8 = has_fp8_kv<kFlags>();
  T* out_rows = static_cast<T*>(p.out) + batch_index * p.out_stride_batch +
                static_cast<long long>(r.q_start + warp_row0) * p.out_stride_seq +
                head * p.out_stride_head;
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    float total = warp_all_sum(row_sum[i]);
    if (i >= warp_rows) continue;
    float sink_factor = 1.f;
    if constexpr (has_feature<kFlags>(kFeatureSink))
      sink_factor = fold_sink(p.features.sinks[head], &row_max[i], &total);
    const bool empty = !(total > 0.f);
    const float inverse = empty ? 0.f : (kFp8 ? sink_factor * kv8.v_scale : sink_factor) / total;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const int d = lane + 32 * k;
      if (d < kHeadDim) out_rows[i * p.out_stride_seq + d] = from_float<T>(acc[i][k] * inverse);
    }
    if (p.lse != nullptr && lane == 0)
      p.lse[(r.lse_row + warp_row0 + i) * p.n_heads + head] =
          empty ? negative_infinity() : (row_max[i] + log2f(total)) * kLn2;
  }
}

template <typename T, int kHeadDim, int kPageSize, int kGroup, int kFlags>
__device__ void prefill_cuda_cores(const PrefillParams& p, unsigned char* smem_raw) {
  using Shape = PrefillShape<kHeadDim, kPageSize>;
  constexpr int kRowStride = Shape::kRowStride;
  constexpr int kBlockKv = kPrefillCoreBlockKv;  // one token per lane
  constexpr int kRows = kPrefillCoreRowsPerWarp;
  constexpr int kPerLane = CeilDiv<kHeadDim, 32>::value;  // head-dim elements per lane
  static_assert(kBlockKv == 32, "a lane scores one token of the tile");

  const PrefillTile tile = prefill_tile<kPrefillCoreBlockQ>(p);
  const int head = tile.head;
  const int batch_index = tile.batch_index;
  const int kv_head = head / kGroup;
  const PrefillRequest r = prefill_request<kPageSize>(p, batch_index);
  const int tile_start = tile.start;
  if (tile_start >= r.q_len) return;
  const int tile_end = min(tile_start + kPrefillCoreBlockQ, r.q_len);

  T* smem_q = reinterpret_cast<T*>(smem_raw);
  T* smem_k = smem_q + kPrefillCoreRows * kRowStride;
  T* smem_v = smem_k + kBlockKv * kRowStride;

  const T* k_head;
  const T* v_head;
  const int* table_row;
  prefill_kv_bases<T, kPageSize>(p, batch_index, kv_head, &k_head, &v_head, &table_row);
  // FP8: rows are widened as they load.
  constexpr bool kFp8 = has_fp8_kv<kFlags>();
  const PrefillKv8 kv8 =
      kFp8 ? prefill_kv8<kPageSize>(p, batch_index, kv_head) : PrefillKv8{nullptr, nullptr, 1.f, 1.f};
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const bool has_mask = p.mask != nullptr;

  for (int pass_start = tile_start; pass_start < tile_end; pass_start += kPrefillCoreRows) {
    const int pass_rows = min(kPrefillCoreRows, tile_end - pass_start);
    const int pass_kv_end = prefill_row_stop(r, pass_start + pass_rows - 1);
    __syncthreads();  // the previous pass is done with the Q rows

    prefill_core_load_q<T, kHeadDim, kPageSize>(p, r, smem_q, batch_index, head, pass_start, pass_rows);

    // This warp's rows: warp * kRows + i of the pass.
    const int warp_row0 = pass_start + warp * kRows;  // request-relative
    const int warp_rows = max(0, min(kRows, r.q_len - warp_row0));
    int stop[kRows];
    int first_key[kRows];  // window: the first key each row attends to
    int warp_max_stop = 0;
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      stop[i] = i < warp_rows ? prefill_row_stop(r, warp_row0 + i) : 0;
      if (has_feature<kFlags>(kFeatureWindow))
        first_key[i] = window_first_key(static_cast<long long>(r.causal_base) + warp_row0 + i, p.features);
      warp_max_stop = max(warp_max_stop, stop[i]);
    }
    const unsigned char* mask_base =
        has_mask ? p.mask + batch_index * p.mask_stride_batch +
                       static_cast<long long>(r.mask_start + warp_row0) * p.mask_stride_q
                 : nullptr;

    float acc[kRows][kPerLane];
    float row_max[kRows];
    float row_sum[kRows];  // this lane's tokens only; summed over the warp at the end
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      row_max[i] = negative_infinity();
      row_sum[i] = 0.f;
#pragma unroll
      for (int k = 0; k < kPerLane; ++k) acc[i][k] = 0.f;
    }

    // With a window, the pass's first row's first key bounds the range from below.
    const int pass_kv_begin =
        has_feature<kFlags>(kFeatureWindow)
            ? max(window_first_key(static_cast<long long>(r.causal_base) + pass_start, p.features), 0) / kBlockKv *
                  kBlockKv
            : 0;
    for (int block_start = pass_kv_begin; block_start < pass_kv_end; block_start += kBlockKv) {
      __syncthreads();  // every warp is done with the previous tile
      prefill_core_load_kv<T, kHeadDim, kPageSize, kFlags>(p, table_row, k_head, v_head, kv8, smem_k, smem_v,
                                                           block_start, pass_kv_end);
      __syncthreads();
      if (block_start >= warp_max_stop) continue;  // warp-uniform; the barrier is at the top

      // Scores: lane t dots token block_start + t with each of the warp's rows.
      float s[kRows];
      prefill_core_scores<T, kHeadDim, kPageSize>(smem_q, smem_k, warp, lane, s);

      if constexpr (kFp8) {  // scores as if K were dequantized
#pragma unroll
        for (int i = 0; i < kRows; ++i) s[i] *= kv8.k_scale;
      }
      const int token = block_start + lane;
      float weight[kRows];
#pragma unroll
      for (int i = 0; i < kRows; ++i) {
        bool keep = token < stop[i] && (!has_feature<kFlags>(kFeatureWindow) || token >= first_key[i]);
        if (keep && has_mask) keep = mask_base[i * p.mask_stride_q + token] != 0;
        float score = keep ? (has_feature<kFlags>(kFeatureSoftCap) ? soft_capped(s[i], p.features)
                                                                    : s[i] * p.scale_log2)
                           : negative_infinity();
        if constexpr (has_feature<kFlags>(kFeatureAlibi))
          if (keep) score += alibi_bias(alibi_slope_log2(p.features, head), token, r.causal_base + warp_row0 + i);
        float ref;
        const float correction = online_softmax_update<false>(row_max[i], row_sum[i], warp_all_max(score), ref);
        weight[i] = exp2f(score - ref);
        row_sum[i] += weight[i];
#pragma unroll
        for (int k = 0; k < kPerLane; ++k) acc[i][k] *= correction;
      }

      prefill_core_pv<T, kHeadDim, kPageSize>(smem_v, weight, min(kBlockKv, warp_max_stop - block_start), lane, acc);
    }

    prefill_core_store<T, kHeadDim, kFlags>(p, r, kv8, acc, row_max, row_sum, batch_index, head, warp_row0, warp_rows,
                                            lane);
  }
}

}  // namespace astrai
#endif  // ASTRAI_NO_MMA
