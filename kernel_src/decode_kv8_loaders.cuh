// Loaders of an FP8 KV cache: the staged loader (a block's bytes into a byte stage, widened to
// the element type afterwards) and the direct path's per-warp step loader.
#pragma once

#include "decode_kv8_layout.cuh"
#include "decode_work.cuh"
#include "mma_utils.cuh"

namespace astrai {

// FP8 cache: copies the bytes of block `block_start` (kHeadDim bytes a row, 16 a chunk) into a
// byte stage; rows past `end` and on unmapped pages are zero-filled. The appended token's row is
// quantized from new_k/new_v here, into the bytes the cache receives.
template <typename T, int kHeadDim, int kPageSize, bool kE5m2>
__device__ __forceinline__ void load_kv8_block_async(const PagedDecodeParams& p, unsigned char* stage_k,
                                                     unsigned char* stage_v, const DecodeSequence& seq,
                                                     int batch_index, int block_start, int end, int kv_head,
                                                     float k_scale, float v_scale) {
  constexpr int kChunksPerRow = kHeadDim / 16;
#pragma unroll 2
  for (int chunk = threadIdx.x; chunk < kDecodeBlockTokens * kChunksPerRow; chunk += kDecodeThreads) {
    const int row = chunk / kChunksPerRow;
    const int col = (chunk % kChunksPerRow) * 16;
    const int token = block_start + row;
    unsigned char* k_dst = stage_k + row * kHeadDim + col;
    unsigned char* v_dst = stage_v + row * kHeadDim + col;
    if (KvLayout<kPageSize>::kPaged && token == seq.append_token && token < end) {  // contiguous: no append
      const T* k_src = static_cast<const T*>(p.new_k) + batch_index * p.new_k_stride_batch +
                       kv_head * p.new_k_stride_head + col;
      const T* v_src = static_cast<const T*>(p.new_v) + batch_index * p.new_v_stride_batch +
                       kv_head * p.new_v_stride_head + col;
      *reinterpret_cast<uint4*>(k_dst) = quantize_fp8x16<T, kE5m2>(k_src, k_scale);
      *reinterpret_cast<uint4*>(v_dst) = quantize_fp8x16<T, kE5m2>(v_src, v_scale);
      continue;
    }
    const unsigned char* k_base = static_cast<const unsigned char*>(p.k_cache);
    const unsigned char* v_base = static_cast<const unsigned char*>(p.v_cache);
    const unsigned char* k_row = k_base;
    const unsigned char* v_row = v_base;
    const bool valid =
        token < end && kv_rows<unsigned char, kPageSize>(p, seq, batch_index, kv_head, token, &k_row, &v_row);
    // An invalid row copies 0 bytes (zero fill) from the pool's base, a valid address.
    cp_async_16(shared_address(k_dst), valid ? k_row + col : k_base, valid ? 16 : 0);
    cp_async_16(shared_address(v_dst), valid ? v_row + col : v_base, valid ? 16 : 0);
  }
}

// Direct path: the loader of one warp's steps (16 rows of K and V from token `first`). Lane l
// always copies chunk l % kChunksPerRow of rows l / kChunksPerRow + i kRowStep, so its column
// pointers and stage offsets are computed once; page ids are looked up a step ahead (lane l < 16:
// row l's). The step holding the appended token quantizes that row from new_k/new_v.
template <typename T, int kHeadDim, int kPageSize, bool kE5m2>
struct Kv8StepLoader {
  using Layout = Kv8Direct<kHeadDim>;
  static constexpr int kRowStep = 32 / Layout::kChunksPerRow;
  const unsigned char* k_base;  // this lane's column of kv_head (contiguous KV: of the sequence)
  const unsigned char* v_base;
  int row0;
  int chunk;
  int dst[Layout::kChunksPerLane];  // swizzled offsets in a K tile
  int page;                         // of row `lane` of the next step to issue; -1: none
  long long k_stride_token;
  long long v_stride_token;
  long long k_row_step;  // kRowStep rows
  long long v_row_step;

  __device__ __forceinline__ void init(const PagedDecodeParams& p, int batch_index, int kv_head, int lane) {
    row0 = lane / Layout::kChunksPerRow;
    chunk = lane % Layout::kChunksPerRow;
#pragma unroll
    for (int i = 0; i < Layout::kChunksPerLane; ++i) dst[i] = Layout::offset(row0 + i * kRowStep, chunk);
    k_base = static_cast<const unsigned char*>(p.k_cache) + kv_head * p.k_stride_head + chunk * 16;
    v_base = static_cast<const unsigned char*>(p.v_cache) + kv_head * p.v_stride_head + chunk * 16;
    k_base += KvLayout<kPageSize>::template sequence_offset<false>(p, batch_index);
    v_base += KvLayout<kPageSize>::template sequence_offset<true>(p, batch_index);
    k_stride_token = p.k_stride_token;
    v_stride_token = p.v_stride_token;
    k_row_step = kRowStep * k_stride_token;
    v_row_step = kRowStep * v_stride_token;
  }

  // Page id of row `lane` of the step from token `first` (-1 past `end`, unmapped, lanes >= 16).
  __device__ __forceinline__ void lookup(const PagedDecodeParams& p, const DecodeSequence& seq, int first, int end,
                                         int lane) {
    const int token = first + lane;
    int id = -1;
    if (lane < 16 && token < end) id = KvLayout<kPageSize>::mapped_page(p, seq.table_row, token);
    page = id;
  }

  // The pipeline's start: the first kStages - 1 steps from `warp_begin` issued.
  __device__ __forceinline__ void start(const PagedDecodeParams& p, const DecodeSequence& seq, int batch_index,
                                        int kv_head, unsigned char* ring, int warp_begin, int end, int lane,
                                        float k_scale, float v_scale) {
    init(p, batch_index, kv_head, lane);
    lookup(p, seq, warp_begin, end, lane);
#pragma unroll
    for (int step = 0; step + 1 < Layout::kStages; ++step)
      issue_step(p, seq, batch_index, kv_head, ring, warp_begin, step, end, lane, k_scale, v_scale);
  }

  // Issues step `step` of the warp's steps from `warp_begin` into its slot of `ring` (an empty
  // commit group past `end`, so that the wait count stays uniform) and looks up the page ids of
  // the step after it.
  __device__ __forceinline__ void issue_step(const PagedDecodeParams& p, const DecodeSequence& seq, int batch_index,
                                             int kv_head, unsigned char* ring, int warp_begin, int step, int end,
                                             int lane, float k_scale, float v_scale) {
    const int first = warp_begin + step * kDecodeBlockTokens;
    const int step_page = page;
    lookup(p, seq, first + kDecodeBlockTokens, end, lane);  // a step ahead
    if (first < end)
      issue(p, seq, batch_index, kv_head, ring + (step % Layout::kStages) * Layout::kStageBytes, first, end,
            step_page, k_scale, v_scale);
    cp_async_commit();
  }

  // Issues the step from `first` into the K tile at `stage` (V follows it), with the page ids
  // looked up last; rows past `end` and on unmapped pages read as zeros.
  __device__ __forceinline__ void issue(const PagedDecodeParams& p, const DecodeSequence& seq, int batch_index,
                                        int kv_head, unsigned char* stage, int first, int end, int step_page,
                                        float k_scale, float v_scale) const {
    if (KvLayout<kPageSize>::kPaged && static_cast<unsigned>(seq.append_token - first) < 16u) {  // warp-uniform
      issue_with_append(p, seq, batch_index, kv_head, stage, first, end, step_page, k_scale, v_scale);
      return;
    }
    const unsigned stage_address = shared_address(stage);
    if constexpr (kPageSize >= 16) {
      // The page holds the whole step (steps start at multiples of 16): one id, row strides.
      const int id = __shfl_sync(0xffffffffu, step_page, 0);
      const int slot = KvLayout<kPageSize>::slot(first) + row0;
      const unsigned char* k_row = k_base + static_cast<long long>(id) * p.k_stride_page + slot * k_stride_token;
      const unsigned char* v_row = v_base + static_cast<long long>(id) * p.v_stride_page + slot * v_stride_token;
#pragma unroll
      for (int i = 0; i < Layout::kChunksPerLane; ++i) {
        const bool valid = id >= 0 && first + row0 + i * kRowStep < end;
        cp_async_16(stage_address + dst[i], valid ? k_row + i * k_row_step : k_base, valid ? 16 : 0);
        cp_async_16(stage_address + Layout::kTileBytes + dst[i], valid ? v_row + i * v_row_step : v_base,
                    valid ? 16 : 0);
      }
    } else {
      issue_rows(p, stage_address, first, end, step_page);
    }
  }

  // Pages smaller than the step, and contiguous KV: each row's own offset.
  __device__ __forceinline__ void issue_rows(const PagedDecodeParams& p, unsigned stage_address, int first, int end,
                                             int step_page) const {
#pragma unroll
    for (int i = 0; i < Layout::kChunksPerLane; ++i) {
      const int row = row0 + i * kRowStep;
      const int token = first + row;
      long long k_offset;
      long long v_offset;
      bool valid;
      if (!KvLayout<kPageSize>::kPaged) {  // the sequence's offset is in the bases
        k_offset = static_cast<long long>(token) * k_stride_token;
        v_offset = static_cast<long long>(token) * v_stride_token;
        valid = token < end;
      } else {
        const int id = __shfl_sync(0xffffffffu, step_page, row);
        const int slot = KvLayout<kPageSize>::slot(token);
        k_offset = static_cast<long long>(id) * p.k_stride_page + slot * k_stride_token;
        v_offset = static_cast<long long>(id) * p.v_stride_page + slot * v_stride_token;
        valid = id >= 0;  // -1 past `end` too
      }
      cp_async_16(stage_address + dst[i], valid ? k_base + k_offset : k_base, valid ? 16 : 0);
      cp_async_16(stage_address + Layout::kTileBytes + dst[i], valid ? v_base + v_offset : v_base, valid ? 16 : 0);
    }
  }

  __device__ __forceinline__ void issue_with_append(const PagedDecodeParams& p, const DecodeSequence& seq,
                                                 int batch_index, int kv_head, unsigned char* stage, int first,
                                                 int end, int step_page, float k_scale, float v_scale) const {
#pragma unroll
    for (int i = 0; i < Layout::kChunksPerLane; ++i) {
      const int row = row0 + i * kRowStep;
      const int token = first + row;
      const int id = __shfl_sync(0xffffffffu, step_page, row);
      unsigned char* k_dst = stage + dst[i];
      unsigned char* v_dst = k_dst + Layout::kTileBytes;
      if (token == seq.append_token && token < end) {
        const T* k_src = static_cast<const T*>(p.new_k) + batch_index * p.new_k_stride_batch +
                         kv_head * p.new_k_stride_head + chunk * 16;
        const T* v_src = static_cast<const T*>(p.new_v) + batch_index * p.new_v_stride_batch +
                         kv_head * p.new_v_stride_head + chunk * 16;
        *reinterpret_cast<uint4*>(k_dst) = quantize_fp8x16<T, kE5m2>(k_src, k_scale);
        *reinterpret_cast<uint4*>(v_dst) = quantize_fp8x16<T, kE5m2>(v_src, v_scale);
        continue;
      }
      const bool valid = id >= 0 && token < end;
      const int slot = KvLayout<kPageSize>::slot(token);
      const long long k_offset = static_cast<long long>(id) * p.k_stride_page + slot * k_stride_token;
      const long long v_offset = static_cast<long long>(id) * p.v_stride_page + slot * v_stride_token;
      cp_async_16(shared_address(k_dst), valid ? k_base + k_offset : k_base, valid ? 16 : 0);
      cp_async_16(shared_address(v_dst), valid ? v_base + v_offset : v_base, valid ? 16 : 0);
    }
  }
};

}  // namespace astrai
