// The fused append: the new token's K and V written into its cache slot, as they are (16-bit
// caches) or quantized with the head's scales (FP8 caches).
#pragma once

#include "decode_work.cuh"

namespace astrai {

// An appended element as an FP8 cache stores it: value / scale, rounded and saturated.
template <typename T, bool kE5m2>
__device__ __forceinline__ unsigned quantize_kv(T value, float scale) {
  return float_to_fp8<kE5m2>(to_float(value) / scale);
}

// Fused append into an FP8 cache: new_k/new_v quantized with the head's scales. Every CTA
// attends to the same quantized bytes (kv8_append_row), so the cache and the result agree.
template <typename T, int kHeadDim, bool kE5m2>
__device__ void append_new_token_fp8(const PagedDecodeParams& p, int batch_index, int kv_head,
                                     long long k_offset, long long v_offset, unsigned thread, unsigned threads) {
  unsigned char* k_dst = static_cast<unsigned char*>(const_cast<void*>(p.k_cache)) + k_offset;
  unsigned char* v_dst = static_cast<unsigned char*>(const_cast<void*>(p.v_cache)) + v_offset;
  const T* k_src = static_cast<const T*>(p.new_k) + batch_index * p.new_k_stride_batch +
                   kv_head * p.new_k_stride_head;
  const T* v_src = static_cast<const T*>(p.new_v) + batch_index * p.new_v_stride_batch +
                   kv_head * p.new_v_stride_head;
  const float k_scale = kv_scale(p.features.k_scale, p.features.kv_scale_stride, kv_head);
  const float v_scale = kv_scale(p.features.v_scale, p.features.kv_scale_stride, kv_head);
  for (int i = thread; i < kHeadDim; i += threads) {
    k_dst[i] = static_cast<unsigned char>(quantize_kv<T, kE5m2>(k_src[i], k_scale));
    v_dst[i] = static_cast<unsigned char>(quantize_kv<T, kE5m2>(v_src[i], v_scale));
  }
}

// Fused append: the CTA that owns the new token (head tile 0 of its split) writes new_k/new_v
// into the cache slot. Every CTA reads the new token from new_k/new_v, never from the cache,
// so the write races with no read. `thread` of `threads` take part (a wide CTA's split group).
template <typename T, int kHeadDim, int kPageSize, int kFlags = 0>
__device__ void append_new_token(const PagedDecodeParams& p, const DecodeSequence& seq,
                                 int batch_index, int kv_head, unsigned thread = threadIdx.x,
                                 unsigned threads = blockDim.x) {
  using Kv = KvLayout<kPageSize>;
  const int token = seq.append_token;
  const int page = Kv::page(p, seq.table_row, token);
  if (static_cast<unsigned>(page) >= static_cast<unsigned>(p.num_pages)) return;
  const int slot = Kv::slot(token);  // a paged cache's: the contiguous decode appends nothing
  if constexpr (has_fp8_kv<kFlags>()) {
    append_new_token_fp8<T, kHeadDim, has_feature<kFlags>(kFeatureKvE5m2)>(
        p, batch_index, kv_head, page * p.k_stride_page + slot * p.k_stride_token + kv_head * p.k_stride_head,
        page * p.v_stride_page + slot * p.v_stride_token + kv_head * p.v_stride_head, thread, threads);
    return;
  }
  T* k_dst = static_cast<T*>(const_cast<void*>(p.k_cache)) + page * p.k_stride_page +
             slot * p.k_stride_token + kv_head * p.k_stride_head;
  T* v_dst = static_cast<T*>(const_cast<void*>(p.v_cache)) + page * p.v_stride_page +
             slot * p.v_stride_token + kv_head * p.v_stride_head;
  const T* k_src = static_cast<const T*>(p.new_k) + batch_index * p.new_k_stride_batch +
                   kv_head * p.new_k_stride_head;
  const T* v_src = static_cast<const T*>(p.new_v) + batch_index * p.new_v_stride_batch +
                   kv_head * p.new_v_stride_head;
  for (int chunk = thread; chunk < kHeadDim / 8; chunk += threads) {
    reinterpret_cast<uint4*>(k_dst)[chunk] = reinterpret_cast<const uint4*>(k_src)[chunk];
    reinterpret_cast<uint4*>(v_dst)[chunk] = reinterpret_cast<const uint4*>(v_src)[chunk];
  }
}

}  // namespace astrai
