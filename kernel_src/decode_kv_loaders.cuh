// Loaders of a 16-bit KV cache into the tensor-core decode's shared-memory stages (cp.async): the
// general loader (any head dim, partial blocks, the appended token), with page ids looked up per
// chunk or fetched a block ahead (small pages), and the full-block loader.
#pragma once

#include "decode_work.cuh"
#include "mma_utils.cuh"

namespace astrai {

// Page sizes below 16 look each row's page id up one block ahead (into registers), so that
// the page-table loads never stall the copies that depend on them.
template <int kPageSize>
inline constexpr bool kPrefetchPages = kPageSize > 0 && kPageSize < 16;

// The physical page of each row this thread copies in one block, looked up one block ahead
// so that the page-table loads never stall the copies that depend on them.
template <typename T, int kHeadDim, int kPageSize>
struct BlockPages {
  static constexpr int kIters = kDecodeBlockTokens * (kHeadDim / 8) / kDecodeThreads;
  int page[kIters];  // -1: past the end or an unmapped page (reads as zeros)

  __device__ __forceinline__ void fetch(const PagedDecodeParams& p, const DecodeSequence& seq,
                                        int block_start, int end) {
#pragma unroll
    for (int i = 0; i < kIters; ++i) {
      const int token = block_start + (threadIdx.x + i * kDecodeThreads) / (kHeadDim / 8);
      int value = -1;
      if (!KvLayout<kPageSize>::kPaged) {
        value = token < end ? 0 : -1;
      } else if (token < end) {
        value = KvLayout<kPageSize>::mapped_page(p, seq.table_row, token);
      }
      page[i] = value;
    }
  }
};

// The general loader: any head dim, partial blocks, the appended token. kPrefetched: page ids
// come from `pages` (fetched one block ahead) instead of being looked up here.
template <typename T, int kHeadDim, int kPageSize, bool kPrefetched>
__device__ __forceinline__ void load_kv_block_async(const PagedDecodeParams& p, T* smem_k, T* smem_v,
                                                    const DecodeSequence& seq, int batch_index,
                                                    int block_start, int end, int kv_head,
                                                    const BlockPages<T, kHeadDim, kPageSize>& pages) {
  using Tiles = PagedDecodeTiles<T, kHeadDim, kPageSize>;
  using Kv = KvLayout<kPageSize>;
#pragma unroll
  for (int i = 0; i < BlockPages<T, kHeadDim, kPageSize>::kIters; ++i) {
    const int chunk = threadIdx.x + i * kDecodeThreads;
    const int row = chunk / Tiles::kChunksPerRow;
    const int col = (chunk % Tiles::kChunksPerRow) * 8;
    const int token = block_start + row;
    // Small pages: the id fetched a block ahead. Large pages and contiguous KV: looked up here
    // (measured faster on the H200 for those; one lookup serves many rows).
    int page;
    if (kPrefetched) {
      page = pages.page[i];
    } else if (!Kv::kPaged) {
      page = token < end ? 0 : -1;
    } else {
      page = token < end ? Kv::page(p, seq.table_row, token) : -1;
      if (static_cast<unsigned>(page) >= static_cast<unsigned>(p.num_pages)) page = -1;
    }
    const T* k_row = static_cast<const T*>(p.k_cache);
    const T* v_row = static_cast<const T*>(p.v_cache);
    if (page >= 0) {
      if (token == seq.append_token) {
        k_row = static_cast<const T*>(p.new_k) + batch_index * p.new_k_stride_batch +
                kv_head * p.new_k_stride_head;
        v_row = static_cast<const T*>(p.new_v) + batch_index * p.new_v_stride_batch +
                kv_head * p.new_v_stride_head;
      } else {
        k_row += Kv::template row_offset<false>(p, page, batch_index, token) + kv_head * p.k_stride_head;
        v_row += Kv::template row_offset<true>(p, page, batch_index, token) + kv_head * p.v_stride_head;
      }
    }
    // Past the end, or an unmapped page: zero-fill without reading global memory.
    const int bytes = page >= 0 ? 16 : 0;
    cp_async_16_read_once(shared_address(smem_k + row * Tiles::kRowStride + col), k_row + (page >= 0 ? col : 0),
                          bytes);
    cp_async_16_read_once(shared_address(smem_v + row * Tiles::kRowStride + col), v_row + (page >= 0 ? col : 0),
                          bytes);
  }
}

// The loader of full blocks (no tail, no appended token) for head dims whose 16-byte chunks
// tile the CTA exactly (32, 64, 128, 256): each thread always copies the same column chunk,
// of rows kPassRows apart, so its pointers are computed once, and each page id is looked up
// once per thread and block (one block ahead, in registers) instead of once per chunk.
template <typename T, int kHeadDim, int kPageSize>
struct FullBlockLoader {
  static constexpr int kChunks = kHeadDim / 8;
  static constexpr bool kUsable = kDecodeThreads % kChunks == 0;
  static constexpr int kPassRows = kUsable ? kDecodeThreads / kChunks : 1;
  static constexpr int kPasses = kDecodeBlockTokens / kPassRows;
  // Passes whose rows share a page (split starts are multiples of the block, so rows
  // row0 + pass * kPassRows of kPageSize / kPassRows consecutive passes lie in one page).
  static constexpr int kPassesPerLookup =
      kPageSize == 0 ? kPasses
                     : (kPageSize / kPassRows < 1 ? 1
                        : (kPageSize / kPassRows > kPasses ? kPasses : kPageSize / kPassRows));
  static constexpr int kLookups = kPasses / kPassesPerLookup;

  const T* k_base;  // this thread's column of kv_head (and of the sequence, contiguous KV)
  const T* v_base;
  int row0;
  int page[kLookups];  // ids for the next block; -1: unmapped (reads as zeros)

  __device__ __forceinline__ void init(const PagedDecodeParams& p, int batch_index, int kv_head) {
    row0 = threadIdx.x / kChunks;
    const int col = (threadIdx.x % kChunks) * 8;
    k_base = static_cast<const T*>(p.k_cache) + kv_head * p.k_stride_head + col;
    v_base = static_cast<const T*>(p.v_cache) + kv_head * p.v_stride_head + col;
    k_base += KvLayout<kPageSize>::template sequence_offset<false>(p, batch_index);
    v_base += KvLayout<kPageSize>::template sequence_offset<true>(p, batch_index);
  }

  // Page ids of block `block_start` (tokens past `end` read as unmapped; unused then).
  __device__ __forceinline__ void fetch(const PagedDecodeParams& p, const DecodeSequence& seq,
                                        int block_start, int end) {
    if constexpr (KvLayout<kPageSize>::kPaged) {
#pragma unroll
      for (int l = 0; l < kLookups; ++l) {
        const int token = block_start + row0 + l * kPassesPerLookup * kPassRows;
        int id = -1;
        if (token < end) id = KvLayout<kPageSize>::mapped_page(p, seq.table_row, token);
        page[l] = id;
      }
    }
  }

  __device__ __forceinline__ void load(const PagedDecodeParams& p, unsigned smem_k, unsigned smem_v,
                                       int block_start) const {
    constexpr int kRowBytes = PagedDecodeTiles<T, kHeadDim, kPageSize>::kRowStride * 2;
    const unsigned k_dst = smem_k + row0 * kRowBytes + (threadIdx.x % kChunks) * 16;
    const unsigned v_dst = smem_v + row0 * kRowBytes + (threadIdx.x % kChunks) * 16;
#pragma unroll
    for (int l = 0; l < kLookups; ++l) {
      const int token = block_start + row0 + l * kPassesPerLookup * kPassRows;
      const T* k_src;
      const T* v_src;
      int bytes = 16;
      if (!KvLayout<kPageSize>::kPaged) {  // the sequence's offset is in the bases
        k_src = k_base + token * p.k_stride_token;
        v_src = v_base + token * p.v_stride_token;
      } else {
        const int slot = KvLayout<kPageSize>::slot(token);
        const long long id = page[l];
        k_src = k_base + id * p.k_stride_page + slot * p.k_stride_token;
        v_src = v_base + id * p.v_stride_page + slot * p.v_stride_token;
        if (page[l] < 0) {
          k_src = k_base;
          v_src = v_base;
          bytes = 0;
        }
      }
#pragma unroll
      for (int j = 0; j < kPassesPerLookup; ++j) {
        const int row_offset = (l * kPassesPerLookup + j) * kPassRows;
        const long long step = static_cast<long long>(j) * kPassRows;
        cp_async_16_read_once(k_dst + row_offset * kRowBytes, k_src + (bytes ? step * p.k_stride_token : 0), bytes);
        cp_async_16_read_once(v_dst + row_offset * kRowBytes, v_src + (bytes ? step * p.v_stride_token : 0), bytes);
      }
    }
  }
};

}  // namespace astrai
