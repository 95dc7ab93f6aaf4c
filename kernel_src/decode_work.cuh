// What a decode CTA works on: the tile geometry, its sequence (length, page-table row, the
// appended token), where a token's K and V rows lie, and which (query head, query token) rows
// its head tile holds.
#pragma once

#include "astrai_common.cuh"
#include "kv_layout.cuh"

namespace astrai {

template <typename T, int kHeadDim, int kPageSize>
struct PagedDecodeTiles {
  static constexpr int kRowStride = kHeadDim + 8;  // elements; see paged_decode_smem_bytes
  static constexpr int kChunksPerRow = kHeadDim / 8;  // 16-byte chunks per K/V row
  static constexpr int kStageElems = kDecodeBlockTokens * kRowStride;
  static constexpr int kPageShift = KvLayout<kPageSize>::kPageShift;
  static_assert(kHeadDim % 16 == 0 && kHeadDim >= 32 && kHeadDim <= 256, "head_dim");
};

// What one CTA needs to know about its sequence.
struct DecodeSequence {
  const int* table_row;  // paged only
  int length;            // tokens to attend to
  int append_token;      // position whose K/V come from new_k/new_v (-1: none)
};

template <int kPageSize>
__device__ __forceinline__ DecodeSequence decode_sequence(const PagedDecodeParams& p, int batch_index) {
  DecodeSequence seq;
  seq.table_row = nullptr;
  seq.length = 0;
  seq.append_token = -1;
  if (KvLayout<kPageSize>::kPaged) {
    seq.table_row = kv_table_row(p, batch_index);
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
  using Kv = KvLayout<kPageSize>;
  int page = 0;
  if (Kv::kPaged) {
    page = Kv::page(p, seq.table_row, token);
    if (static_cast<unsigned>(page) >= static_cast<unsigned>(p.num_pages)) return false;
  }
  const long long k_offset = Kv::template row_offset<false>(p, page, batch_index, token);
  const long long v_offset = Kv::template row_offset<true>(p, page, batch_index, token);
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

}  // namespace astrai
