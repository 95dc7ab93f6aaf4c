// Where a token's K and V rows lie in a cache, as a type: the loaders say what they copy, the
// layout says from where. KvLayout<kPageSize> names it (0: contiguous); decode and prefill
// kernels share it, each reading its own params' strides (page_stride and the rest below).
//   ContiguousKv: [batch, kv_len, n_kv_heads, head_dim]; a sequence's rows follow its batch row
//     (sequence_stride). No table, and no fused append.
//   PagedKv<kPageSize>: the request's page-table row maps page token >> log2(kPageSize) to a page
//     of the pool (kPageSize a power of two; the flat pool's token table is kPageSize 1).
// A loader marks a row that reads as zeros with page id -1: past the end, or an id outside the
// pool (`mapped_page`).
// The Hopper kernels' TMA boxes take their coordinates from the layout too: a box of `box_rows`
// tokens starts at row `tma_row(token)` of its page (contiguous: of its sequence, whose index
// is the box's page coordinate).
#pragma once

#include "astrai_common.cuh"

namespace astrai {

// K's (kV false) or V's strides, in elements: of a page (both params structs name it alike), of
// a token within its page (or sequence), and of a sequence in a contiguous cache (the decode keeps
// it in the page stride, the prefill in its batch stride: those two differ by struct).
template <bool kV, typename Params>
__device__ __forceinline__ long long page_stride(const Params& p) {
  return kV ? p.v_stride_page : p.k_stride_page;
}
template <bool kV>
__device__ __forceinline__ long long token_stride(const PagedDecodeParams& p) {
  return kV ? p.v_stride_token : p.k_stride_token;
}
template <bool kV>
__device__ __forceinline__ long long sequence_stride(const PagedDecodeParams& p) {
  return kV ? p.v_stride_page : p.k_stride_page;
}
template <bool kV>
__device__ __forceinline__ long long token_stride(const PrefillParams& p) {
  return kV ? p.v_stride_seq : p.k_stride_seq;
}
template <bool kV>
__device__ __forceinline__ long long sequence_stride(const PrefillParams& p) {
  return kV ? p.v_stride_batch : p.k_stride_batch;
}

// The page-table row of a request (paged KV), null for a row index outside the table:
// req_indices picks the row when given. kL2Only: read through L2 alone (ld.global.cg), for a
// read ahead of the wait for the previous kernel that must leave no L1 line behind.
template <bool kL2Only = false, typename Params>
__device__ __forceinline__ const int* kv_table_row(const Params& p, int batch_index) {
  const bool wide_rows = (p.layout_bits & kWideReqIndices) != 0;
  const int row = p.req_indices ? load_index<kL2Only>(p.req_indices, batch_index, wide_rows) : batch_index;
  return row < 0 || row >= p.page_table_rows
             ? nullptr
             : index_at(p.page_table, row * p.page_table_stride, (p.layout_bits & kWidePageTable) != 0);
}

// Entry `logical` of a page-table row (kv_table_row): an int32 entry, or the low half of an
// int64 one. One lookup a token at small pages: a shift, where choosing the width per lookup cost
// a third of the ps1 decode's speed. Ids of 2^31 and above are never valid, and read as
// negative (out of range) up to 2^32.
template <bool kL2Only = false, typename Params>
__device__ __forceinline__ int table_page(const Params& p, const int* table_row, int logical) {
  static_assert(kWidePageTable == 1u, "the bit is the shift");
  const int* entry = table_row + (static_cast<long long>(logical) << (p.layout_bits & kWidePageTable));
  return kL2Only ? __ldcg(entry) : __ldg(entry);
}

template <int kPageSize>
struct PagedKv {
  static_assert(kPageSize > 0 && (kPageSize & (kPageSize - 1)) == 0, "page_size must be a power of two");
  static constexpr bool kPaged = true;
  static constexpr int kPageShift = Log2<kPageSize>::value;

  // The page id of `token` (before the end) in its table row, unchecked: an id outside the pool
  // (unsigned id >= num_pages) reads as zeros. The callers compare it in place (a helper returning
  // that comparison as a bool made NVVM write it mirrored: other PTX for the same kernel).
  template <bool kL2Only = false, typename Params>
  __device__ __forceinline__ static int page(const Params& p, const int* table_row, int token) {
    return table_page<kL2Only>(p, table_row, token >> kPageShift);
  }
  // `page` of token, -1 when its id lies outside the pool.
  template <typename Params>
  __device__ __forceinline__ static int mapped_page(const Params& p, const int* table_row, int token) {
    int id = page(p, table_row, token);
    if (static_cast<unsigned>(id) >= static_cast<unsigned>(p.num_pages)) id = -1;
    return id;
  }
  __device__ __forceinline__ static int slot(int token) { return token & (kPageSize - 1); }
  // A box never crosses a page: kPageSize rows, max_rows at most.
  static constexpr int box_rows(int /*block*/, int max_rows) { return kPageSize < max_rows ? kPageSize : max_rows; }
  __device__ __forceinline__ static int tma_row(int token) { return token % kPageSize; }
  // The offset of token's K (kV false) or V row, of KV head 0, on `page`, relative to the
  // sequence's rows (sequence_offset: a page's rows are the pool's).
  template <bool kV, typename Params>
  __device__ __forceinline__ static long long token_offset(const Params& p, int page, int token) {
    const int in_page = slot(token);
    return page * page_stride<kV>(p) + in_page * token_stride<kV>(p);
  }
  // The same from the cache's start: for pages, the same offset.
  template <bool kV, typename Params>
  __device__ __forceinline__ static long long row_offset(const Params& p, int page, int /*batch_index*/, int token) {
    return token_offset<kV>(p, page, token);
  }
  // What every K or V row of a sequence is offset by before its page: nothing.
  template <bool kV, typename Params>
  __device__ __forceinline__ static long long sequence_offset(const Params&, int /*batch_index*/) {
    return 0;
  }
};

struct ContiguousKv {
  static constexpr bool kPaged = false;
  static constexpr int kPageShift = 0;

  // One page, the sequence: id 0 for every token before the end.
  template <bool kL2Only = false, typename Params>
  __device__ __forceinline__ static int page(const Params&, const int*, int) { return 0; }
  template <typename Params>
  __device__ __forceinline__ static int mapped_page(const Params&, const int*, int) { return 0; }
  __device__ __forceinline__ static int slot(int token) { return token; }
  // A block's rows are one box.
  static constexpr int box_rows(int block, int /*max_rows*/) { return block; }
  __device__ __forceinline__ static int tma_row(int token) { return token; }
  template <bool kV, typename Params>
  __device__ __forceinline__ static long long row_offset(const Params& p, int /*page*/, int batch_index, int token) {
    return batch_index * sequence_stride<kV>(p) + token * token_stride<kV>(p);
  }
  template <bool kV, typename Params>
  __device__ __forceinline__ static long long token_offset(const Params& p, int /*page*/, int token) {
    return token * token_stride<kV>(p);
  }
  template <bool kV, typename Params>
  __device__ __forceinline__ static long long sequence_offset(const Params& p, int batch_index) {
    return batch_index * sequence_stride<kV>(p);
  }
};

template <int kPageSize>
struct KvLayoutOf {
  using Type = PagedKv<kPageSize>;
};
template <>
struct KvLayoutOf<0> {
  using Type = ContiguousKv;
};
template <int kPageSize>
using KvLayout = typename KvLayoutOf<kPageSize>::Type;

}  // namespace astrai
