// Paged decode attention: one query token per sequence against a paged KV cache.
//
// Grid: (num_splits, n_kv_heads * head_tiles, batch); 128 threads. A CTA owns one KV head of
// one sequence over one split of its tokens, and up to 16 query heads of that KV head's GQA
// group (the M rows of the MMA tile), so K and V are read from memory once per group.
// Tensor-core path: K/V blocks of 64 tokens stream through shared memory with cp.async
// (double buffered); warp w takes tokens [16w, 16w+16) of each block, keeps its own online
// softmax state, and the four warps merge at the end. An FP8 cache at head dim 64/128/256 takes
// the direct path instead (Kv8Direct: each warp streams its own rows' bytes through a ring and
// reads them straight into f16 MMA fragments). CUDA-core path (ASTRAI_NO_MMA): warp w
// owns query heads w, w+4, ... and walks every token with warp-wide dot products.
// kPageSize 0 instantiates the contiguous-KV decode: token t of sequence b at
// b * stride_page + t * stride_token.
// Multi-token decode (kFlags' q_len field, speculative verification): the rows of a KV head
// are (query head, query token) pairs, cut into 16-row head tiles like a large group's heads,
// so K and V are still read once per tile; each row masks the keys past its own token.
#pragma once

#include "astrai_common.cuh"
#include "attention_combine.cuh"
#include "mma_utils.cuh"

namespace astrai {

template <typename T, int kHeadDim, int kPageSize>
struct PagedDecodeTiles {
  static constexpr int kRowStride = kHeadDim + 8;  // elements; see paged_decode_smem_bytes
  static constexpr int kChunksPerRow = kHeadDim / 8;  // 16-byte chunks per K/V row
  static constexpr int kStageElems = kDecodeBlockTokens * kRowStride;
  static constexpr int kPageShift = Log2<(kPageSize > 0 ? kPageSize : 1)>::value;
  static_assert(kHeadDim % 16 == 0 && kHeadDim >= 32 && kHeadDim <= 256, "head_dim");
  static_assert((kPageSize & (kPageSize - 1)) == 0, "page_size must be a power of two");
};

// What one CTA needs to know about its sequence.
struct DecodeSequence {
  const int* table_row;  // paged only
  int length;            // tokens to attend to
  int append_token;      // position whose K/V come from new_k/new_v (-1: none)
};

// The page-table row of a request (paged KV), null for a row index outside the table.
// kL2Only: read through L2 alone (ld.global.cg), for a read ahead of the wait for the previous
// kernel that must leave no L1 line behind.
template <bool kL2Only = false>
__device__ __forceinline__ const int* decode_table_row(const PagedDecodeParams& p, int batch_index) {
  const bool wide_rows = (p.layout_bits & kWideReqIndices) != 0;
  const int row = p.req_indices ? load_index<kL2Only>(p.req_indices, batch_index, wide_rows) : batch_index;
  return row < 0 || row >= p.page_table_rows
             ? nullptr
             : index_at(p.page_table, row * p.page_table_stride, (p.layout_bits & kWidePageTable) != 0);
}

// Entry `logical` of a page-table row (decode_table_row): an int32 entry, or the low half of an
// int64 one. One lookup a token at small pages: a shift, where choosing the width per lookup cost
// a third of the ps1 decode's speed. Ids of 2^31 and above are never valid, and read as
// negative (out of range) up to 2^32.
template <bool kL2Only = false>
__device__ __forceinline__ int table_page(const PagedDecodeParams& p, const int* table_row, int logical) {
  static_assert(kWidePageTable == 1u, "the bit is the shift");
  const int* entry = table_row + (static_cast<long long>(logical) << (p.layout_bits & kWidePageTable));
  return kL2Only ? __ldcg(entry) : __ldg(entry);
}

template <int kPageSize>
__device__ __forceinline__ DecodeSequence decode_sequence(const PagedDecodeParams& p, int batch_index) {
  DecodeSequence seq;
  seq.table_row = nullptr;
  seq.length = 0;
  seq.append_token = -1;
  if (kPageSize > 0) {
    seq.table_row = decode_table_row(p, batch_index);
    if (seq.table_row == nullptr) return seq;  // bad row: empty, never out of bounds
  }
  const int length = p.seq_lens ? load_seq_len(p.seq_lens, batch_index, p.layout_bits) : p.kv_capacity;
  seq.length = min(max(length, 0), p.kv_capacity);
  if (p.new_k != nullptr && seq.length > 0) seq.append_token = seq.length - 1;
  return seq;
}

// Start of token `token`'s K and V rows for one KV head; false when its page id is out of range
// (the row then reads as zeros).
template <typename T, int kPageSize>
__device__ __forceinline__ bool kv_rows(const PagedDecodeParams& p, const DecodeSequence& seq,
                                        int batch_index, int kv_head, int token, const T** k_row,
                                        const T** v_row) {
  if (token == seq.append_token) {
    *k_row = static_cast<const T*>(p.new_k) + batch_index * p.new_k_stride_batch +
             kv_head * p.new_k_stride_head;
    *v_row = static_cast<const T*>(p.new_v) + batch_index * p.new_v_stride_batch +
             kv_head * p.new_v_stride_head;
    return true;
  }
  long long k_offset;
  long long v_offset;
  if (kPageSize == 0) {
    k_offset = batch_index * p.k_stride_page + token * p.k_stride_token;
    v_offset = batch_index * p.v_stride_page + token * p.v_stride_token;
  } else {
    const int page = table_page(p, seq.table_row, token >> PagedDecodeTiles<T, 32, kPageSize>::kPageShift);
    if (static_cast<unsigned>(page) >= static_cast<unsigned>(p.num_pages)) return false;
    const int slot = token & (kPageSize - 1);
    k_offset = page * p.k_stride_page + slot * p.k_stride_token;
    v_offset = page * p.v_stride_page + slot * p.v_stride_token;
  }
  *k_row = static_cast<const T*>(p.k_cache) + k_offset + kv_head * p.k_stride_head;
  *v_row = static_cast<const T*>(p.v_cache) + v_offset + kv_head * p.v_stride_head;
  return true;
}

// Multi-token decode: a KV head's kGroup * kQLen rows are (query head, query token) pairs,
// head-major (row r is token r % kQLen of the group's head r / kQLen); a head tile takes 16 of
// them from first_row = head_tile * 16 on, and first_head = kv_head * kGroup + first_row. With
// one token a row is a query head.
template <int kQLen>
__device__ __forceinline__ int row_head(int first_head, int first_row, int row) {
  return kQLen == 1 ? first_head + row : first_head - first_row + (first_row + row) / kQLen;
}
template <int kQLen>
__device__ __forceinline__ int row_token(int first_row, int row) {
  return kQLen == 1 ? 0 : (first_row + row) % kQLen;
}

__device__ __forceinline__ bool token_kept(const PagedDecodeParams& p, int batch_index, int token) {
  return p.mask == nullptr || p.mask[batch_index * p.mask_stride_batch + token];
}

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
  const int token = seq.append_token;
  const int page = table_page(p, seq.table_row, token >> PagedDecodeTiles<T, 32, kPageSize>::kPageShift);
  if (static_cast<unsigned>(page) >= static_cast<unsigned>(p.num_pages)) return;
  const int slot = token & (kPageSize - 1);
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

// Rows of a split that holds no token: zeros and LSE -inf, or with sinks (kSink) the sink's
// LSE in split 0, which carries each row's sink term.
template <typename T, int kHeadDim, int kQLen, bool kSink = false>
__device__ void write_empty_rows(const PagedDecodeParams& p, int split, int batch_index,
                                 int first_head, int first_row, int rows) {
  for (int e = threadIdx.x; e < rows * kHeadDim; e += blockDim.x) {
    const int head = row_head<kQLen>(first_head, first_row, e / kHeadDim);
    store_row_element<T, kHeadDim, kQLen>(p.workspace, p.out, p.out_stride_batch, p.out_stride_seq,
                                          p.out_stride_head, p.lse, p.batch, p.n_heads, split, batch_index,
                                          row_token<kQLen>(first_row, e / kHeadDim), head, e % kHeadDim, 0.f,
                                          kSink && split == 0 ? p.features.sinks[head] : negative_infinity());
  }
}

// What one CTA of the decode kernels attends to: one KV head's head tile (up to 16 rows) over
// one split of one sequence's tokens. Grid: (split, kv_head * head_tiles + head_tile, batch).
struct DecodeWork {
  DecodeSequence seq;
  int split, kv_head, head_tile, batch_index;
  int rows;          // rows of this head tile: query heads, or (head, token) pairs
  int first_head;    // the query head of row 0
  int first_row;     // of the KV head's kGroup * kQLen rows
  int window_first;  // the (first query token's) window's first key; 0 without a window
  int split_begin, split_end;
};

// The fields of DecodeWork that follow from the launch alone (no memory read): split, KV head,
// head tile and its rows.
template <int kGroup, int kFlags>
__device__ __forceinline__ DecodeWork decode_work_tile(unsigned split = blockIdx.x) {
  constexpr int kQLen = decode_q_len(kFlags);
  constexpr int kHeadTiles = CeilDiv<kGroup * kQLen, kDecodeHeadsPerTile>::value;
  DecodeWork w;
  w.split = split;
  w.kv_head = blockIdx.y / kHeadTiles;
  w.head_tile = blockIdx.y % kHeadTiles;
  w.batch_index = blockIdx.z;
  w.rows = min(kDecodeHeadsPerTile, kGroup * kQLen - w.head_tile * kDecodeHeadsPerTile);
  w.first_head = w.kv_head * kGroup + w.head_tile * kDecodeHeadsPerTile;
  w.first_row = w.head_tile * kDecodeHeadsPerTile;
  return w;
}

template <int kPageSize, int kGroup, int kFlags>
__device__ __forceinline__ DecodeWork decode_work(const PagedDecodeParams& p, unsigned split = blockIdx.x) {
  constexpr int kQLen = decode_q_len(kFlags);
  DecodeWork w = decode_work_tile<kGroup, kFlags>(split);
  w.seq = decode_sequence<kPageSize>(p, w.batch_index);
  // With a window the splits cover only the blocks from the window's first key on (the split
  // plan is sized for the window), so the time follows the window, not the length. With
  // several query tokens, the first token's window.
  w.window_first = has_feature<kFlags>(kFeatureWindow) ? window_first_key(w.seq.length - kQLen, p.features) : 0;
  const int span_begin =
      has_feature<kFlags>(kFeatureWindow) ? max(w.window_first, 0) / kDecodeBlockTokens * kDecodeBlockTokens : 0;
  w.split_begin = span_begin + w.split * p.tokens_per_split;
  w.split_end = min(w.seq.length, w.split_begin + p.tokens_per_split);
  return w;
}

// The start every decode kernel shares: a split with no token writes its empty rows and ends
// the CTA (false); the CTA owning the appended token writes it into the cache.
template <typename T, int kHeadDim, int kPageSize, int kFlags>
__device__ __forceinline__ bool decode_work_begin(const PagedDecodeParams& p, const DecodeWork& w) {
  if (w.split_begin >= w.split_end) {
    write_empty_rows<T, kHeadDim, decode_q_len(kFlags), has_feature<kFlags>(kFeatureSink)>(
        p, w.split, w.batch_index, w.first_head, w.first_row, w.rows);
    return false;
  }
  if (kPageSize > 0 && w.head_tile == 0 && w.seq.append_token >= w.split_begin && w.seq.append_token < w.split_end)
    append_new_token<T, kHeadDim, kPageSize, kFlags>(p, w.seq, w.batch_index, w.kv_head);
  return true;
}

// While the kernel ahead finishes (a programmatic dependent launch, sm_90+): L2 prefetches of
// what a decode CTA reads first. Threads from `first_thread` on take the CTA's Q rows and the
// last thread its sequence length; with kKvRows every thread also takes a K or V row of the
// split's first block (one of 64 tokens each; the Hopper kernel prefetches its TMA boxes
// instead). Prefetches are hints: data the kernel ahead is still writing can make one useless,
// never a result wrong. Page ids are read through L2 alone (no stale L1 line outlives the wait)
// and steer only these prefetches. With a window the split's tokens depend on the length, so
// only Q and the length are prefetched.
template <typename T, int kHeadDim, int kPageSize, int kGroup, int kFlags, bool kKvRows>
__device__ __forceinline__ void prefetch_decode_start(const PagedDecodeParams& p, int first_thread,
                                                      unsigned thread = threadIdx.x,
                                                      unsigned threads = blockDim.x, unsigned split = blockIdx.x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int kQLen = decode_q_len(kFlags);
  const DecodeWork tile = decode_work_tile<kGroup, kFlags>(split);
  constexpr int kRowLines = (kHeadDim * static_cast<int>(sizeof(T)) + 127) / 128;  // 128-byte lines of a row
  const int i = static_cast<int>(thread) - first_thread;
  if (i >= 0 && i < tile.rows * kRowLines) {
    const int row = i / kRowLines;
    const T* q_row = static_cast<const T*>(p.q) + blockIdx.z * p.q_stride_batch +
                     row_token<kQLen>(tile.first_row, row) * p.q_stride_seq +
                     row_head<kQLen>(tile.first_head, tile.first_row, row) * p.q_stride_head;
    prefetch_l2(reinterpret_cast<const unsigned char*>(q_row) + (i % kRowLines) * 128);
  }
  if (thread == threads - 1 && p.seq_lens != nullptr)
    prefetch_l2(index_at(p.seq_lens, blockIdx.z, (p.layout_bits & kWideSeqLens) != 0));
  if constexpr (kKvRows && !has_feature<kFlags>(kFeatureWindow)) {
    static_assert(kDecodeThreads == 2 * kDecodeBlockTokens, "a thread per K or V row of a block");
    static_assert(!has_fp8_kv<kFlags>(), "FP8 caches take no prefetches (run 100: their decode ran slower)");
    const int split_begin = static_cast<int>(split) * p.tokens_per_split;
    const int token = split_begin + static_cast<int>(thread) % kDecodeBlockTokens;
    if (token >= min(split_begin + p.tokens_per_split, p.kv_capacity)) return;
    const bool is_v = thread >= kDecodeBlockTokens;
    long long offset;
    if constexpr (kPageSize == 0) {
      offset = blockIdx.z * (is_v ? p.v_stride_page : p.k_stride_page) +
               token * (is_v ? p.v_stride_token : p.k_stride_token);
    } else {
      const int* table_row = decode_table_row<true>(p, blockIdx.z);
      if (table_row == nullptr) return;
      const int page = table_page<true>(p, table_row, token / kPageSize);
      if (static_cast<unsigned>(page) >= static_cast<unsigned>(p.num_pages)) return;
      offset = page * (is_v ? p.v_stride_page : p.k_stride_page) +
               (token % kPageSize) * (is_v ? p.v_stride_token : p.k_stride_token);
    }
    offset += tile.kv_head * (is_v ? p.v_stride_head : p.k_stride_head);
    const T* kv_row = static_cast<const T*>(is_v ? p.v_cache : p.k_cache) + offset;
#pragma unroll
    for (int line = 0; line < kRowLines; ++line)
      prefetch_l2(reinterpret_cast<const unsigned char*>(kv_row) + line * 128);
  }
#endif
}

#ifndef ASTRAI_NO_MMA

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
      if (kPageSize == 0) {
        value = token < end ? 0 : -1;
      } else if (token < end) {
        value = table_page(p, seq.table_row, token >> PagedDecodeTiles<T, kHeadDim, kPageSize>::kPageShift);
        if (static_cast<unsigned>(value) >= static_cast<unsigned>(p.num_pages)) value = -1;
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
    } else if (kPageSize == 0) {
      page = token < end ? 0 : -1;
    } else {
      page = token < end ? table_page(p, seq.table_row, token >> Tiles::kPageShift) : -1;
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
      } else if (kPageSize == 0) {
        k_row += batch_index * p.k_stride_page + token * p.k_stride_token + kv_head * p.k_stride_head;
        v_row += batch_index * p.v_stride_page + token * p.v_stride_token + kv_head * p.v_stride_head;
      } else {
        const int slot = token & (kPageSize > 0 ? kPageSize - 1 : 0);
        k_row += page * p.k_stride_page + slot * p.k_stride_token + kv_head * p.k_stride_head;
        v_row += page * p.v_stride_page + slot * p.v_stride_token + kv_head * p.v_stride_head;
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
    if (kPageSize == 0) {
      k_base += batch_index * p.k_stride_page;
      v_base += batch_index * p.v_stride_page;
    }
  }

  // Page ids of block `block_start` (tokens past `end` read as unmapped; unused then).
  __device__ __forceinline__ void fetch(const PagedDecodeParams& p, const DecodeSequence& seq,
                                        int block_start, int end) {
    if constexpr (kPageSize > 0) {
#pragma unroll
      for (int l = 0; l < kLookups; ++l) {
        const int token = block_start + row0 + l * kPassesPerLookup * kPassRows;
        int id = -1;
        if (token < end) {
          id = table_page(p, seq.table_row, token >> PagedDecodeTiles<T, kHeadDim, kPageSize>::kPageShift);
          if (static_cast<unsigned>(id) >= static_cast<unsigned>(p.num_pages)) id = -1;
        }
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
      if (kPageSize == 0) {
        k_src = k_base + token * p.k_stride_token;
        v_src = v_base + token * p.v_stride_token;
      } else {
        const int slot = token & (kPageSize - 1);
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
    if (kPageSize > 0 && token == seq.append_token && token < end) {  // contiguous decode appends nothing
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

// FP8 cache read straight into MMA fragments (head dims 64, 128, 256; kv8_direct_head_dim).
// Each warp owns a ring of kv8_stages K+V stages holding the 16 rows of its steps (tokens
// [16 w, 16 w + 16) of each 64-token block), so the pipeline needs __syncwarp only.
//  - S = Q K^T: lane (g, t) reads 16 bytes of K rows g and g + 8 per 64 dims and uses word s of
//    them as the k16 step s: the fragment's k order is a permutation of the dims, and the Q tile
//    is stored in the same permutation (kv8_q_dim), so the dot products are unchanged.
//  - O = P V: lane (g, t) reads kVBytes of V rows 2t, 2t+1, 2t+8, 2t+9 (the tokens of its
//    fragment) at dims [128 h + g kVBytes, ...): its dim i is row g of n8 tile h kVBytes + i,
//    so the output's columns come out permuted (kv8_out_dim undoes it in the merge).
// Stage bytes are XOR-swizzled by 16-byte chunk so that both read patterns hit distinct banks.
// The MMAs run in f16 for either dtype: every e4m3/e5m2 value is an f16 value, so a pair widens
// in one instruction (bf16 would take three conversions a pair, at a quarter of the issue rate,
// which bounded the kernel below the bandwidth), and P is more precise in f16. Q is rounded to
// f16 (exact for bf16 values of magnitude 2^-14..65504; larger ones saturate, NaN stays NaN).
template <int kHeadDim>
struct Kv8Direct {
  static constexpr bool kUsable = kv8_direct_head_dim(kHeadDim);
  static constexpr int kStages = kv8_stages(kHeadDim);
  static constexpr int kRows = 16;                            // one warp's step
  static constexpr int kTileBytes = kRows * kHeadDim;         // K (or V) of one step
  static constexpr int kStageBytes = 2 * kTileBytes;
  static constexpr int kWarpBytes = kStages * kStageBytes;
  static constexpr int kChunksPerRow = kHeadDim / 16;
  static constexpr int kChunksPerLane = kRows * kChunksPerRow / 32;
  static constexpr int kVBytes = kHeadDim >= 128 ? 16 : kHeadDim / 8;  // V bytes of one row per lane and part
  static constexpr int kVParts = kHeadDim / 8 / kVBytes;

  // Byte offset of 16-byte chunk `chunk` of row `row` in a tile.
  static __device__ __forceinline__ int offset(int row, int chunk) {
    const int linear = row * kHeadDim + chunk * 16;
    // Head dim 64 (two rows a 128-byte line): rows 2t of lines t = 0..3 to distinct chunks.
    // Wider rows: rows g, g + 1 to opposite half-lines, and rows 0, 2, 4, 6 apart.
    const int swizzle = kHeadDim == 64 ? ((row >> 1) & 3) << 1 : ((row & 1) << 2) ^ (((row >> 1) & 3) << 1);
    return linear ^ (swizzle << 4);
  }
};

// f16 of a query value for the direct path (see Kv8Direct): saturating, NaN kept.
__device__ __forceinline__ float kv8_q_value(float value) {
  return value > 65504.f ? 65504.f : value < -65504.f ? -65504.f : value;
}

// The dim of Q stored at column `column` of the direct path's Q tile (see Kv8Direct).
template <int kHeadDim>
__device__ __forceinline__ int kv8_q_dim(int column) {
  const int step = column >> 4;  // k16 step
  const int k = column & 15;     // the fragment's k index: lane t holds 2t, 2t+1, 2t+8, 2t+9
  return (step >> 2) * 64 + ((k & 7) >> 1) * 16 + (step & 3) * 4 + (k >> 3) * 2 + (k & 1);
}

template <typename T, bool kF16> struct MmaType { using type = T; };
template <typename T> struct MmaType<T, true> { using type = fp16_t; };

// The output dim of accumulator n8 tile `tile`, column `column` on the direct path.
template <int kHeadDim>
__device__ __forceinline__ int kv8_out_dim(int tile, int column) {
  constexpr int kVBytes = Kv8Direct<kHeadDim>::kVBytes;
  return (tile / kVBytes) * 128 + column * kVBytes + tile % kVBytes;
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
    if (kPageSize == 0) {
      k_base += batch_index * p.k_stride_page;
      v_base += batch_index * p.v_stride_page;
    }
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
    if (lane < 16 && token < end) {
      if (kPageSize == 0) {
        id = 0;
      } else {
        id = table_page(p, seq.table_row, token >> Log2<(kPageSize > 0 ? kPageSize : 1)>::value);
        if (static_cast<unsigned>(id) >= static_cast<unsigned>(p.num_pages)) id = -1;
      }
    }
    page = id;
  }

  // Issues the step from `first` into the K tile at `stage` (V follows it), with the page ids
  // looked up last; rows past `end` and on unmapped pages read as zeros.
  __device__ __forceinline__ void issue(const PagedDecodeParams& p, const DecodeSequence& seq, int batch_index,
                                        int kv_head, unsigned char* stage, int first, int end, int step_page,
                                        float k_scale, float v_scale) const {
    if (kPageSize > 0 && static_cast<unsigned>(seq.append_token - first) < 16u) {  // warp-uniform, rare
      issue_with_append(p, seq, batch_index, kv_head, stage, first, end, step_page, k_scale, v_scale);
      return;
    }
    const unsigned stage_address = shared_address(stage);
    if constexpr (kPageSize >= 16) {
      // The page holds the whole step (steps start at multiples of 16): one id, row strides.
      const int id = __shfl_sync(0xffffffffu, step_page, 0);
      const int slot = (first & (kPageSize - 1)) + row0;
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
      if (kPageSize == 0) {
        k_offset = static_cast<long long>(token) * k_stride_token;
        v_offset = static_cast<long long>(token) * v_stride_token;
        valid = token < end;
      } else {
        const int id = __shfl_sync(0xffffffffu, step_page, row);
        const int slot = token & (kPageSize > 0 ? kPageSize - 1 : 0);
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
      const int slot = token & (kPageSize > 0 ? kPageSize - 1 : 0);
      const long long k_offset = static_cast<long long>(id) * p.k_stride_page + slot * k_stride_token;
      const long long v_offset = static_cast<long long>(id) * p.v_stride_page + slot * v_stride_token;
      cp_async_16(shared_address(k_dst), valid ? k_base + k_offset : k_base, valid ? 16 : 0);
      cp_async_16(shared_address(v_dst), valid ? v_base + v_offset : v_base, valid ? 16 : 0);
    }
  }
};

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

// One warp's online softmax over its 16-token steps (tensor-core decode kernels): the O
// accumulator of its 16 rows (m16n8 tiles: rows g and g + 8 of lane (g, t)) and their running
// max and sum, in log2 units.
template <int kHeadDim, int kFlags>
struct DecodeWarpSoftmax {
  static constexpr int kQLen = decode_q_len(kFlags);
  static constexpr int kNTiles = kHeadDim / 8;  // n8 tiles of O
  float o[kNTiles][4];
  float row_max[2];
  float row_sum[2];
  // Multi-token: rows g and g + 8 attend to keys up to their own token's position, and from
  // that position's window on.
  int row_end[2];
  int row_window_first[2];

  __device__ __forceinline__ void init(const PagedDecodeParams& p, const DecodeWork& w) {
    const int quad_row = (threadIdx.x & 31) >> 2;
#pragma unroll
    for (int n = 0; n < kNTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      row_max[r] = negative_infinity();
      row_sum[r] = 0.f;
      const int position = w.seq.length - kQLen + row_token<kQLen>(w.first_row, quad_row + 8 * r);
      row_end[r] = position + 1;
      row_window_first[r] = has_feature<kFlags>(kFeatureWindow) ? window_first_key(position, p.features) : 0;
    }
  }

  // Turns the raw scores s of tokens [first_token, first_token + 16) (two n8 tiles of S) into P:
  // scaled or capped, masked, folded into the running max and sum, O rescaled when a max
  // moved. Returns P as the A fragment of the P V MMA, in PType.
  template <typename PType>
  __device__ __forceinline__ void step(float (&s)[2][4], unsigned (&pa)[4], const PagedDecodeParams& p,
                                       const DecodeWork& w, int first_token) {
    const int quad_col = threadIdx.x & 3;
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        s[j][e] = has_feature<kFlags>(kFeatureSoftCap) ? soft_capped(s[j][e], p.features) : s[j][e] * p.scale_log2;
    // Only the tail, the window's first step, multi-token rows' own ends and masked calls test
    // each token (this thread's rows decide; warp-uniform in the common cases).
    const bool whole =
        first_token + 16 <= w.split_end && p.mask == nullptr &&
        (kQLen == 1 || first_token + 16 <= min(row_end[0], row_end[1])) &&
        (!has_feature<kFlags>(kFeatureWindow) ||
         first_token >= (kQLen == 1 ? w.window_first : max(row_window_first[0], row_window_first[1])));
    if (!whole) {
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int token = first_token + j * 8 + quad_col * 2 + (e & 1);
          if (!(token < w.split_end && (kQLen == 1 || token < row_end[e >> 1]) &&
                (!has_feature<kFlags>(kFeatureWindow) ||
                 token >= (kQLen == 1 ? w.window_first : row_window_first[e >> 1])) &&
                token_kept(p, w.batch_index, token)))
            s[j][e] = negative_infinity();
        }
    }
    float tile_max[2] = {negative_infinity(), negative_infinity()};
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) tile_max[e >> 1] = fmaxf(tile_max[e >> 1], s[j][e]);
    float correction[2];
    float reference[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
      const float new_max = fmaxf(row_max[r], tile_max[r]);
      // A row masked so far keeps max -inf; measure from 0 then so that no inf - inf appears.
      reference[r] = new_max == negative_infinity() ? 0.f : new_max;
      correction[r] = fast_exp2(row_max[r] - reference[r]);
      row_max[r] = new_max;
      row_sum[r] *= correction[r];
    }
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[j][e] = fast_exp2(s[j][e] - reference[e >> 1]);
        row_sum[e >> 1] += s[j][e];
      }
    }
    // Once the running maxima settle, most steps change no row's max: skip the rescale then.
    if (__any_sync(0xffffffffu, correction[0] != 1.f || correction[1] != 1.f)) {
#pragma unroll
      for (int n = 0; n < kNTiles; ++n) {
        o[n][0] *= correction[0];
        o[n][1] *= correction[0];
        o[n][2] *= correction[1];
        o[n][3] *= correction[1];
      }
    }
    // The S accumulators are already laid out as the A fragment of a k16 MMA.
    pa[0] = pack2<PType>(s[0][0], s[0][1]);
    pa[1] = pack2<PType>(s[0][2], s[0][3]);
    pa[2] = pack2<PType>(s[1][0], s[1][1]);
    pa[3] = pack2<PType>(s[1][2], s[1][3]);
  }
};

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

template <typename T, int kHeadDim, int kFlags, bool kPermuted, int kGroups = 1>
__device__ __forceinline__ void merge_decode_warps(const PagedDecodeParams& p, const DecodeWork& w,
                                                   DecodeWarpSoftmax<kHeadDim, kFlags>& state, void* merge,
                                                   float out_scale, float* slot = nullptr) {
  static_assert(kGroups == 1 || !kPermuted, "wide CTAs: 16-bit caches only");
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

  // Each row's warp weights (normalization, sink and V scale folded in) and its LSE, a thread a
  // row, written over the maxima and sums; then the elements. Worked out per element instead,
  // the statistics made a serial chain of each thread's elements (batch 1's merge).
  if (thread < w.rows) {
    const int row = thread;
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
  decode_group_sync<kGroups>();

  if constexpr (!kPermuted) {
    // Four adjacent columns a thread: a float4 read of each warp's row and one 16-byte store
    // of the partial row. Stored a float at a time, batch 1's call took 0.36 us longer (run 114).
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
    // The FP8 direct path's columns are permuted: an element at a time, not unrolled (unrolled,
    // ptxas fits its kernel into 80 registers with spills: hd64 24/4 pages of 1 4.2% slower, run 110).
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
}

template <typename T, int kHeadDim, int kPageSize, int kGroup, int kFlags>
__device__ void paged_decode_mma(const PagedDecodeParams& p, unsigned char* smem_raw) {
  using Tiles = PagedDecodeTiles<T, kHeadDim, kPageSize>;
  constexpr int kQLen = decode_q_len(kFlags);
  constexpr int kRowStride = Tiles::kRowStride;

  // An FP8 cache widens each block into one K and one V tile of T; its bytes stream through
  // byte stages after them (see paged_decode_smem_bytes).
  constexpr bool kFp8 = has_fp8_kv<kFlags>();
  constexpr bool kE5m2 = has_feature<kFlags>(kFeatureKvE5m2);
  using Direct = Kv8Direct<kHeadDim>;
  constexpr bool kDirect = kFp8 && Direct::kUsable;  // no widened tiles: the rings follow the Q tile
  constexpr int kTileStages = kDirect ? 0 : kFp8 ? 1 : kDecodeStages;
  constexpr int kStageBytes = kDecodeBlockTokens * kHeadDim;  // one FP8 stage of K or of V
  T* smem_q = reinterpret_cast<T*>(smem_raw);
  T* smem_k = smem_q + kDecodeHeadsPerTile * kRowStride;
  T* smem_v = smem_k + kTileStages * Tiles::kStageElems;
  unsigned char* smem_kv8 = reinterpret_cast<unsigned char*>(smem_v + kTileStages * Tiles::kStageElems);

  const DecodeWork w = decode_work<kPageSize, kGroup, kFlags>(p);
  if (!decode_work_begin<T, kHeadDim, kPageSize, kFlags>(p, w)) return;
  const DecodeSequence& seq = w.seq;
  const int batch_index = w.batch_index, kv_head = w.kv_head;
  const int split_begin = w.split_begin, split_end = w.split_end;
  // FP8: the K scale multiplies the scores, the V scale the output.
  const float k_scale = kFp8 ? kv_scale(p.features.k_scale, p.features.kv_scale_stride, kv_head) : 1.f;
  const float v_scale = kFp8 ? kv_scale(p.features.v_scale, p.features.kv_scale_stride, kv_head) : 1.f;
  load_decode_q_tile<T, kHeadDim, kQLen, kDirect>(p, w, smem_q);

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int quad_row = lane >> 2;  // accumulator row g (and g + 8)
  const int quad_col = lane & 3;   // accumulator column pair 2t, 2t + 1
  DecodeWarpSoftmax<kHeadDim, kFlags> state;
  state.init(p, w);

  // Per-lane ldmatrix addresses (see the fragment layouts of mma.m16n8k16).
  const unsigned q_address =
      shared_address(smem_q + (lane & 15) * kRowStride + (lane >> 4) * 8);
  const int k_lane_offset = (warp * 16 + (lane >> 4) * 8 + (lane & 7)) * kRowStride + ((lane >> 3) & 1) * 8;
  const int v_lane_offset = (warp * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * kRowStride + (lane >> 4) * 8;

  const int num_blocks = (split_end - split_begin + kDecodeBlockTokens - 1) / kDecodeBlockTokens;
  using Loader = FullBlockLoader<T, kHeadDim, kPageSize>;
  // Head dims the full-block loader cannot tile keep the general loader, with page ids fetched
  // a block ahead for small pages.
  constexpr bool kGeneralPrefetch = !Loader::kUsable && kPrefetchPages<kPageSize>;
  Loader loader;
  BlockPages<T, kHeadDim, kPageSize> pages;
  // Copies block `block_start` into `stage` and looks up the page ids of the block after it.
  auto issue_block = [&](int block_start, int stage) {
    if constexpr (kFp8) {
      load_kv8_block_async<T, kHeadDim, kPageSize, kE5m2>(p, smem_kv8 + 2 * stage * kStageBytes,
                                                          smem_kv8 + (2 * stage + 1) * kStageBytes, seq, batch_index,
                                                          block_start, split_end, kv_head, k_scale, v_scale);
      cp_async_commit();
      return;
    }
    T* k_stage = smem_k + stage * Tiles::kStageElems;
    T* v_stage = smem_v + stage * Tiles::kStageElems;
    if constexpr (Loader::kUsable) {
      const bool full = block_start + kDecodeBlockTokens <= split_end &&
                        !(seq.append_token >= block_start && seq.append_token < block_start + kDecodeBlockTokens);
      if (full)
        loader.load(p, shared_address(k_stage), shared_address(v_stage), block_start);
      else
        load_kv_block_async<T, kHeadDim, kPageSize, false>(p, k_stage, v_stage, seq, batch_index,
                                                           block_start, split_end, kv_head, pages);
      cp_async_commit();
      loader.fetch(p, seq, block_start + kDecodeBlockTokens, split_end);
    } else {
      load_kv_block_async<T, kHeadDim, kPageSize, kGeneralPrefetch>(p, k_stage, v_stage, seq, batch_index,
                                                                    block_start, split_end, kv_head, pages);
      cp_async_commit();
      if (kGeneralPrefetch) pages.fetch(p, seq, block_start + kDecodeBlockTokens, split_end);
    }
  };
  // Direct path: this warp's ring and its steps' first tokens.
  unsigned char* ring = smem_kv8 + warp * Direct::kWarpBytes;
  const int warp_begin = split_begin + warp * Direct::kRows;
  Kv8StepLoader<T, kHeadDim, kPageSize, kE5m2> step_loader{};
  auto issue_step = [&](int step) {
    const int first = warp_begin + step * kDecodeBlockTokens;
    const int page = step_loader.page;
    step_loader.lookup(p, seq, first + kDecodeBlockTokens, split_end, lane);  // a step ahead
    if (first < split_end)
      step_loader.issue(p, seq, batch_index, kv_head, ring + (step % Direct::kStages) * Direct::kStageBytes, first,
                        split_end, page, k_scale, v_scale);
    cp_async_commit();  // empty groups keep the wait count uniform
  };
  // Direct path: this lane's fragment offsets in a stage: K rows g and g + 8 (dims mod 128; the
  // rest of a row lies at multiples of 128 bytes), V rows 2t, 2t+1, 2t+8, 2t+9.
  int k_read[2][2];
  int v_read[4];
  if constexpr (kDirect) {
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int half = 0; half < 2; ++half) k_read[r][half] = Direct::offset(quad_row + 8 * r, 4 * half + quad_col);
#pragma unroll
    for (int r = 0; r < 4; ++r)
      v_read[r] = Direct::offset(2 * quad_col + (r & 1) + (r >> 1) * 8, quad_row * Direct::kVBytes / 16) +
                  quad_row * Direct::kVBytes % 16;
    __syncthreads();  // the Q tile
    step_loader.init(p, batch_index, kv_head, lane);
    step_loader.lookup(p, seq, warp_begin, split_end, lane);
#pragma unroll
    for (int step = 0; step + 1 < Direct::kStages; ++step) issue_step(step);
  } else {
    if constexpr (kFp8) {
    } else if constexpr (Loader::kUsable) {
      loader.init(p, batch_index, kv_head);
      loader.fetch(p, seq, split_begin, split_end);
    } else if (kGeneralPrefetch) {
      pages.fetch(p, seq, split_begin, split_end);
    }
    issue_block(split_begin, 0);
  }

  for (int block = 0; block < num_blocks; ++block) {
    const int stage = block & 1;
    const int block_start = split_begin + block * kDecodeBlockTokens;
    if constexpr (kDirect) {
      issue_step(block + Direct::kStages - 1);
      cp_async_wait<Direct::kStages - 1>();
      __syncwarp();
    } else {
      if (block + 1 < num_blocks) {
        issue_block(block_start + kDecodeBlockTokens, stage ^ 1);
        cp_async_wait<1>();
      } else {
        cp_async_wait<0>();
      }
      __syncthreads();
    }
    if constexpr (kFp8 && !kDirect) {
      widen_fp8_tile<T, kHeadDim, kRowStride, kDecodeBlockTokens, kDecodeThreads, kE5m2>(
          smem_kv8 + 2 * stage * kStageBytes, smem_k);
      widen_fp8_tile<T, kHeadDim, kRowStride, kDecodeBlockTokens, kDecodeThreads, kE5m2>(
          smem_kv8 + (2 * stage + 1) * kStageBytes, smem_v);
      __syncthreads();
    }
    const int tile_stage = kFp8 ? 0 : stage;

    const int warp_first_token = block_start + warp * 16;
    if (warp_first_token < split_end) {
      const unsigned k_address = shared_address(smem_k + tile_stage * Tiles::kStageElems + k_lane_offset);
      const unsigned v_address = shared_address(smem_v + tile_stage * Tiles::kStageElems + v_lane_offset);
      const unsigned char* k_bytes = ring + (block % Direct::kStages) * Direct::kStageBytes;
      const unsigned char* v_bytes = k_bytes + Direct::kTileBytes;

      // S = Q K^T for this warp's 16 tokens.
      float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
      if constexpr (kDirect) {
#pragma unroll
        for (int h = 0; h < kHeadDim / 64; ++h) {
          const uint4 k0 = *reinterpret_cast<const uint4*>(k_bytes + k_read[0][h & 1] + 128 * (h >> 1));
          const uint4 k1 = *reinterpret_cast<const uint4*>(k_bytes + k_read[1][h & 1] + 128 * (h >> 1));
          const unsigned w0[4] = {k0.x, k0.y, k0.z, k0.w};
          const unsigned w1[4] = {k1.x, k1.y, k1.z, k1.w};
#pragma unroll
          for (int step = 0; step < 4; ++step) {
            unsigned a[4];
            ldmatrix_x4(a, q_address + (4 * h + step) * 32);
            Mma<fp16_t>::run(s[0], a, fp8x2_to_f16x2<kE5m2>(w0[step]), fp8x2_to_f16x2<kE5m2>(w0[step] >> 16));
            Mma<fp16_t>::run(s[1], a, fp8x2_to_f16x2<kE5m2>(w1[step]), fp8x2_to_f16x2<kE5m2>(w1[step] >> 16));
          }
        }
      } else {
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
      if constexpr (kFp8) {  // scores as if K were dequantized
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[j][e] *= k_scale;
      }

      // O += P V.
      unsigned pa[4];
      state.template step<typename MmaType<T, kDirect>::type>(s, pa, p, w, warp_first_token);  // f16 on the direct path
      if constexpr (kDirect) {
        // Rows 2t, 2t+1 give each dim's first token pair, rows 2t+8, 2t+9 its second.
#pragma unroll
        for (int part = 0; part < Direct::kVParts; ++part) {
          uint4 rows_v[4];
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            const unsigned char* source = v_bytes + v_read[r] + 128 * part;
            if constexpr (Direct::kVBytes == 16) {
              rows_v[r] = *reinterpret_cast<const uint4*>(source);
            } else {
              const uint2 half = *reinterpret_cast<const uint2*>(source);
              rows_v[r] = make_uint4(half.x, half.y, 0u, 0u);
            }
          }
          const unsigned a_words[4] = {rows_v[0].x, rows_v[0].y, rows_v[0].z, rows_v[0].w};
          const unsigned b_words[4] = {rows_v[1].x, rows_v[1].y, rows_v[1].z, rows_v[1].w};
          const unsigned c_words[4] = {rows_v[2].x, rows_v[2].y, rows_v[2].z, rows_v[2].w};
          const unsigned d_words[4] = {rows_v[3].x, rows_v[3].y, rows_v[3].z, rows_v[3].w};
#pragma unroll
          for (int word = 0; word < Direct::kVBytes / 4; ++word) {
            // Token pairs of dims 4 word + 0..3: [a0 b0 a1 b1] and [a2 b2 a3 b3], likewise c, d.
            const unsigned first[2] = {byte_perm(a_words[word], b_words[word], 0x5140u),
                                       byte_perm(a_words[word], b_words[word], 0x7362u)};
            const unsigned second[2] = {byte_perm(c_words[word], d_words[word], 0x5140u),
                                        byte_perm(c_words[word], d_words[word], 0x7362u)};
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const int tile = part * Direct::kVBytes + 4 * word + i;
              const int shift = (i & 1) * 16;
              Mma<fp16_t>::run(state.o[tile], pa, fp8x2_to_f16x2<kE5m2>(first[i >> 1] >> shift),
                               fp8x2_to_f16x2<kE5m2>(second[i >> 1] >> shift));
            }
          }
        }
      } else {
#pragma unroll
        for (int dd = 0; dd < kHeadDim / 16; ++dd) {
          unsigned b[4];
          ldmatrix_x4_trans(b, v_address + dd * 32);
          Mma<T>::run(state.o[2 * dd], pa, b[0], b[1]);
          Mma<T>::run(state.o[2 * dd + 1], pa, b[2], b[3]);
        }
      }
    }
    // The stage is refilled by the next iteration's prefetch: this warp's own (direct) or any.
    if constexpr (kDirect)
      __syncwarp();
    else
      __syncthreads();
  }
  if constexpr (kDirect) {
    cp_async_wait<0>();
    __syncthreads();  // the merge below reuses every warp's ring
    static_assert(decode_merge_bytes<kHeadDim>() <= 4 * Direct::kWarpBytes, "the merge fits in the rings");
  }
  // The K/V stages (on the direct path the rings, which start there too) are free now.
  merge_decode_warps<T, kHeadDim, kFlags, kDirect>(p, w, state, smem_k, v_scale);
}

#else  // ASTRAI_NO_MMA

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
  const int split = w.split, kv_head = w.kv_head, batch_index = w.batch_index;
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
  const T* q_base = static_cast<const T*>(p.q) + batch_index * p.q_stride_batch;
#pragma unroll
  for (int i = 0; i < kHeadsPerWarp; ++i) {
    const int local = warp + 4 * i;
    const int position = seq.length - kQLen + row_token<kQLen>(first_row, local);
    row_end[i] = position + 1;
    row_window_first[i] = has_feature<kFlags>(kFeatureWindow) ? window_first_key(position, p.features) : 0;
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
        if (kPageSize > 0 && token < split_end && token == seq.append_token) {
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

#endif  // ASTRAI_NO_MMA

template <typename T, int kHeadDim, int kPageSize, int kGroup, int kFlags>
__global__ void __launch_bounds__(kDecodeThreads) paged_decode_kernel(const PagedDecodeParams p) {
  static_assert((kFlags & ~(kFeatureSoftCap | kFeatureSink | kFeatureWindow | kFeatureKvE4m3 | kFeatureKvE5m2 |
                            kFeatureQLenField)) == 0,
                "paged decode feature bits");
  static_assert(!has_feature<kFlags>(kFeatureKvE4m3) || !has_feature<kFlags>(kFeatureKvE5m2), "one FP8 format");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  allow_dependent_grid();  // the split combine may be scheduled as CTAs free up
  // Not with an FP8 cache: its kernel then compiled to other code (hd64: 96 -> 80 registers) that
  // read 7.9% slower at hd64 24/4 B32 x 4096 (run 100, docs/device-notes.md).
  if constexpr (!has_fp8_kv<kFlags>()) prefetch_decode_start<T, kHeadDim, kPageSize, kGroup, kFlags, true>(p, 0);
  wait_for_previous_grid();  // launched as a dependent of the kernel before it (sm_90+)
#ifndef ASTRAI_NO_MMA
  paged_decode_mma<T, kHeadDim, kPageSize, kGroup, kFlags>(p, smem_raw);
#else
  paged_decode_cuda_cores<T, kHeadDim, kPageSize, kGroup, kFlags>(p, smem_raw);
#endif
}

}  // namespace astrai
