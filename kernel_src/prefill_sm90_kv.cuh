// The Hopper prefill's KV blocks by layout (prefill_sm90.cuh; kv_layout.cuh names the layouts):
// where TMA finds a block of kBlockN tokens, where its rows land in a ring stage, and so how the
// P V GEMM reads V and which rows the consumers must clear. The producer issues the boxes
// (prefill_sm90_producer.cuh, on kPaged).
//   Contiguous KV: one box a 64-column chunk holds the block's rows, all issued by lane 0, with
//     the sequence as the box's batch coordinate (Q's too). V lands as K does, [chunk][row]. A
//     CTA that walks one tile has its first K block issued with Q, by the kernel's first thread.
//   Paged KV: boxes of kBoxRows tokens (never across a page), lane j looking up the page of box
//     j and issuing it; pages past the KV length get id -1, which TMA reads as zeros, like ids
//     outside the pool. Q is ragged (batch coordinate 0). V's boxes bring whole rows, so V lands
//     [box][chunk][kBoxRows rows]; the last page's rows past the KV's end hold anything.
#pragma once

#include "prefill_sm90_tile.cuh"

namespace astrai {

template <class C, bool kPaged = C::Kv::kPaged>
struct PrefillSm90Kv;

template <class C>
struct PrefillSm90Kv<C, false> {
  static constexpr bool kPaged = false;
  static constexpr bool kFirstKWithQ = true;
  // The P V GEMM's V descriptor: a k-step's 16 rows lie 2048 bytes on, a chunk kBlockN rows on.
  static constexpr int kVStepBytes = 2048;
  static constexpr int kVChunkStride = C::kBlockN * 128;
  static constexpr int kVRowGroupStride = 1024;
  static constexpr bool kVTailToClear = false;

  // Byte offset of row `row`'s chunk `chunk` in a V stage.
  __device__ __forceinline__ static int v_offset(int row, int chunk) { return chunk * C::kBlockN * 128 + row * 128; }
  __device__ __forceinline__ static int q_batch(int batch_index) { return batch_index; }
  template <class Params>
  __device__ __forceinline__ static const int* table_row(const Params&, int) {
    return nullptr;
  }
  template <class Producer>
  __device__ __forceinline__ static int box_page(const Producer&, int) {
    return 0;
  }
  // The first thread's K block beside Q: the walk's first, into stage 0.
  __device__ __forceinline__ static void issue_first_k(unsigned char* stage, const sm90::TmaMap* map, sm90::u64* full,
                                                       const PrefillSm90Walk& first) {
    sm90::mbar_arrive_expect_tx(full, C::kKTxBytes);
#pragma unroll
    for (int c = 0; c < C::kQkChunks; ++c)
      sm90::tma_load_4d(stage + c * C::kBlockN * 128, map, full, C::kQkChunkElems * c,
                        (first.n_blocks - 1) * C::kBlockN,
                        first.cta.head / (C::kGroup / C::kPackHeads), first.cta.batch_index);
  }
};

template <class C>
struct PrefillSm90Kv<C, true> {
  static constexpr bool kPaged = true;
  static constexpr bool kFirstKWithQ = false;
  static constexpr int kBoxRows = C::kBoxRows;
  static constexpr int kChunks = C::kChunks;
  // A k-step's 16 rows lie kChunks x 2048 bytes on (whole rows a box); chunks a box's rows apart,
  // and with 8-token boxes the second 8 rows in the next box.
  static constexpr int kVStepBytes = kChunks * 2048;
  static constexpr int kVChunkStride = kBoxRows * 128;
  static constexpr int kVRowGroupStride = kBoxRows == 16 ? 1024 : kChunks * 1024;
  static constexpr bool kVTailToClear = true;

  __device__ __forceinline__ static int q_batch(int) { return 0; }
  template <class Params>
  __device__ __forceinline__ static const int* table_row(const Params& p, int batch_index) {
    return kv_table_row(p, batch_index);
  }
  // Page id of box `lane` of the block starting at `token`.
  template <class Producer>
  __device__ __forceinline__ static int box_page(const Producer& b, int token) {
    const int box_token = token + b.lane * kBoxRows;
    return b.lane < C::kBoxes && box_token < b.r.kv_len ? table_page(b.p, b.table_row, box_token / C::kPageSize)
                                                         : -1;
  }
  // Byte offset of row `row`'s chunk `chunk` in a V stage.
  __device__ __forceinline__ static int v_offset(int row, int chunk) {
    return (row / kBoxRows) * kChunks * kBoxRows * 128 + chunk * kBoxRows * 128 + (row % kBoxRows) * 128;
  }
};

}  // namespace astrai
