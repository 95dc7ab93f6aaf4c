// How every decode CTA starts: the rows of an empty split, the fused append, and the L2
// prefetches issued while the kernel ahead finishes.
#pragma once

#include "attention_combine.cuh"
#include "decode_append.cuh"
#include "decode_work.cuh"

namespace astrai {

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

// The start every decode kernel shares: a split with no token writes its empty rows and ends
// the CTA (false); the CTA owning the appended token writes it into the cache.
template <typename T, int kHeadDim, int kPageSize, int kFlags>
__device__ __forceinline__ bool decode_work_begin(const PagedDecodeParams& p, const DecodeWork& w) {
  if (w.split_begin >= w.split_end) {
    write_empty_rows<T, kHeadDim, decode_q_len(kFlags), has_feature<kFlags>(kFeatureSink)>(
        p, w.split, w.batch_index, w.first_head, w.first_row, w.rows);
    return false;
  }
  if (KvLayout<kPageSize>::kPaged && w.head_tile == 0 && w.seq.append_token >= w.split_begin &&
      w.seq.append_token < w.split_end)
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
    static_assert(!has_fp8_kv<kFlags>(), "FP8 caches take no prefetches (their decode ran slower)");
    const int split_begin = static_cast<int>(split) * p.tokens_per_split;
    const int token = split_begin + static_cast<int>(thread) % kDecodeBlockTokens;
    if (token >= min(split_begin + p.tokens_per_split, p.kv_capacity)) return;
    const bool is_v = thread >= kDecodeBlockTokens;
    long long offset;
    if constexpr (!KvLayout<kPageSize>::kPaged) {
      offset = blockIdx.z * (is_v ? p.v_stride_page : p.k_stride_page) +
               token * (is_v ? p.v_stride_token : p.k_stride_token);
    } else {
      const int* table_row = kv_table_row<true>(p, blockIdx.z);
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

}  // namespace astrai
