// What every prefill kernel (prefill.cuh, prefill_sm90.cuh) shares: a request's rows and KV as
// the CTA sees them, the row limits, the tile a CTA computes, and where a KV token lives.
//
// Query row i (request-relative) attends kv positions j < stop(i), where stop(i) = kv_len
// without a causal limit and clamp(causal_base + i + 1, 0, kv_len) with one (further filtered
// by a mask or a window where the kernel has them). A row with nothing to attend to outputs
// zeros and LSE -inf.
#pragma once

#include "astrai_common.cuh"
#include "kv_layout.cuh"

namespace astrai {

template <int kHeadDim, int kPageSize>
struct PrefillShape {
  static constexpr int kRowStride = kHeadDim + 8;     // elements; see prefill_smem_bytes
  static constexpr int kChunksPerRow = kHeadDim / 8;  // 16-byte chunks per row
  static constexpr int kPageShift = KvLayout<kPageSize>::kPageShift;
  static_assert(kHeadDim % 16 == 0 && kHeadDim >= 32 && kHeadDim <= 256, "head_dim");
  static_assert(kPageSize >= 0 && (kPageSize & (kPageSize - 1)) == 0,
                "page_size must be 0 (contiguous) or a power of two");
};

// One request as the CTA sees it, with every device-provided length made safe to use.
struct PrefillRequest {
  int q_start;      // first row of the request in the row numbering of q, out and lse
  int mask_start;   // the same in the mask's row numbering (kMaskRowsLocal: 0)
  int q_len;        // query rows of the request
  int kv_len;       // KV positions of the request
  int causal_base;  // row i sits at kv position causal_base + i (when causal)
  bool causal;
  long long lse_row;  // row of query 0 in lse
};

template <int kPageSize>
__device__ __forceinline__ PrefillRequest prefill_request(const PrefillParams& p, int batch_index) {
  PrefillRequest r;
  r.causal = p.causal_offset >= 0;
  if constexpr (kPageSize == 0) {
    r.q_start = 0;
    r.mask_start = 0;
    r.q_len = p.q_len;
    r.kv_len = p.kv_len;
    r.causal_base = p.causal_offset;
    r.lse_row = static_cast<long long>(batch_index) * p.q_len;
  } else {
    const bool wide_qo = (p.layout_bits & kWideQoIndptr) != 0;
    const int begin = load_index(p.qo_indptr, batch_index, wide_qo);
    const int end = load_index(p.qo_indptr, batch_index + 1, wide_qo);
    // A negative length or rows outside [0, total_q) make the request empty.
    const bool sane = begin >= 0 && end >= begin && end <= p.total_q;
    r.q_start = sane ? begin : 0;
    r.mask_start = (p.layout_bits & kMaskRowsLocal) != 0 ? 0 : r.q_start;
    r.q_len = sane ? end - begin : 0;
    const long long capacity = static_cast<long long>(p.max_pages_per_seq) * kPageSize;
    // A request whose page-table row is out of range has no KV (kv_table_row).
    const long long seq_len =
        kv_table_row(p, batch_index) == nullptr ? 0 : load_seq_len(p.seq_lens, batch_index, p.layout_bits);
    r.kv_len = static_cast<int>(min(max(seq_len, 0LL), capacity));
    r.causal_base = r.kv_len - r.q_len;
    r.lse_row = r.q_start;
  }
  return r;
}

// One past the last kv position row `row` may attend to (before the mask).
__device__ __forceinline__ int prefill_row_stop(const PrefillRequest& r, int row) {
  if (!r.causal) return r.kv_len;
  const long long stop = static_cast<long long>(r.causal_base) + row + 1;
  return static_cast<int>(min(max(stop, 0LL), static_cast<long long>(r.kv_len)));
}

// The CTA's tile: its first query row, head and request. Non-causal grids take the launch
// order, each (head, request) row from its last tile back (a partial tile then starts first);
// causal grids take prefill_causal_tile_place's, heaviest first across the grid.
struct PrefillTile {
  int start, head, batch_index;
};
template <int kBlockQ, typename Index>
__device__ __forceinline__ PrefillTile prefill_causal_tile(Index id, int tiles, Index heads, Index rows) {
  const PrefillTilePlace<Index> place = prefill_causal_tile_place<Index>(id, tiles, rows);
  return {place.position * kBlockQ, static_cast<int>(place.row % heads), static_cast<int>(place.row / heads)};
}
// Tile `id` (below 2^31) of the grid p.tile_order describes, in prefill_tile's order: the CTA's
// tile, or the tile a persistent CTA walks next.
template <int kBlockQ>
__device__ __forceinline__ PrefillTile prefill_tile_at(const PrefillParams& p, unsigned id) {
  const PrefillTileOrder& order = p.tile_order;
  const unsigned heads = order.heads.divisor;
  if (p.causal_offset < 0) {
    const unsigned row = fast_divide(id, order.tiles);
    const unsigned batch_index = fast_divide(row, order.heads);
    return {static_cast<int>(order.tiles.divisor - 1 - (id - row * order.tiles.divisor)) * kBlockQ,
            static_cast<int>(row - batch_index * heads), static_cast<int>(batch_index)};
  }
  const PrefillTilePlace<unsigned> place = prefill_causal_tile_place(id, order);
  const unsigned batch_index = fast_divide(place.row, order.heads);
  return {place.position * kBlockQ, static_cast<int>(place.row - batch_index * heads), static_cast<int>(batch_index)};
}
template <int kBlockQ>
__device__ __forceinline__ PrefillTile prefill_tile(const PrefillParams& p) {
  if (p.causal_offset < 0)
    return {static_cast<int>(gridDim.x - 1 - blockIdx.x) * kBlockQ, static_cast<int>(blockIdx.y),
            static_cast<int>(blockIdx.z)};
  const unsigned long long rows = static_cast<unsigned long long>(gridDim.y) * gridDim.z;
  // The placement runs before the CTA's first load: through the launch's divisors where they are
  // this grid's (and its ids below 2^31, their range), else in 32 bits wherever the grid allows.
  const PrefillTileOrder& order = p.tile_order;
  if (rows * gridDim.x < 0x80000000ull && order.tiles.divisor == gridDim.x && order.rows == rows &&
      order.heads.divisor == gridDim.y)
    return prefill_tile_at<kBlockQ>(p, blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z));
  if (rows * gridDim.x <= 0xffffffffull)
    return prefill_causal_tile<kBlockQ, unsigned>(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z),
                                                  static_cast<int>(gridDim.x), gridDim.y, static_cast<unsigned>(rows));
  const long long id = blockIdx.x + gridDim.x * (blockIdx.y + static_cast<long long>(gridDim.y) * blockIdx.z);
  return prefill_causal_tile<kBlockQ, long long>(id, static_cast<int>(gridDim.x), gridDim.y,
                                                 static_cast<long long>(rows));
}

// Element offsets of token `token` of one KV head (relative to the head's base pointers).
// Returns false, leaving the offsets at 0, for a token on a page id outside the pool.
template <int kPageSize>
__device__ __forceinline__ bool prefill_kv_offsets(const PrefillParams& p, const int* table_row,
                                                   int token, long long* k_offset,
                                                   long long* v_offset) {
  using Kv = KvLayout<kPageSize>;
  int page = 0;
  if constexpr (Kv::kPaged) {
    page = Kv::page(p, table_row, token);
    if (static_cast<unsigned>(page) >= static_cast<unsigned>(p.num_pages)) return false;
  }
  *k_offset = Kv::template token_offset<false>(p, page, token);
  *v_offset = Kv::template token_offset<true>(p, page, token);
  return true;
}

// Base pointers of the CTA's KV head (contiguous: of its request too) and its page-table row.
template <typename T, int kPageSize>
__device__ __forceinline__ void prefill_kv_bases(const PrefillParams& p, int batch_index,
                                                 int kv_head, const T** k_head,
                                                 const T** v_head, const int** table_row) {
  const T* k = static_cast<const T*>(p.k) + kv_head * p.k_stride_head;
  const T* v = static_cast<const T*>(p.v) + kv_head * p.v_stride_head;
  if constexpr (!KvLayout<kPageSize>::kPaged) {
    k += KvLayout<kPageSize>::template sequence_offset<false>(p, batch_index);
    v += KvLayout<kPageSize>::template sequence_offset<true>(p, batch_index);
    *table_row = nullptr;
  } else {
    *table_row = kv_table_row(p, batch_index);
  }
  *k_head = k;
  *v_head = v;
}

// FP8 cache: the bytes of the CTA's KV head (and request, contiguous) and its scales; the K scale
// multiplies the scores, the V scale the output.
struct PrefillKv8 {
  const unsigned char* k_head;
  const unsigned char* v_head;
  float k_scale;
  float v_scale;
};

template <int kPageSize>
__device__ __forceinline__ PrefillKv8 prefill_kv8(const PrefillParams& p, int batch_index, int kv_head) {
  PrefillKv8 kv;
  const int* table_row;
  prefill_kv_bases<unsigned char, kPageSize>(p, batch_index, kv_head, &kv.k_head, &kv.v_head, &table_row);
  kv.k_scale = kv_scale(p.features.k_scale, p.features.kv_scale_stride, kv_head);
  kv.v_scale = kv_scale(p.features.v_scale, p.features.kv_scale_stride, kv_head);
  return kv;
}

}  // namespace astrai
