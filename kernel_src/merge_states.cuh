// merge_states: attention states (normalized rows with their LSEs, lse_merge.cuh) of disjoint
// key sets merged into the attention over all of them, e.g. a shared prefix's pass and each
// request's own suffix (cascade attention), or partial passes a caller splits itself.
// Each thread owns 8 elements (one 16-byte vector) of one (row, head) item and reads that
// vector of every state; the item's LSEs are read by each of its threads (one broadcast line).
#pragma once

#include "astrai_common.cuh"
#include "lse_merge.cuh"

namespace astrai {

// The largest LSE of one item over a source's states.
__device__ __forceinline__ float source_max_lse(const MergeSourceParams& s, int row, int head, float max_lse) {
  const float* lse = s.lse + row * s.lse_stride_row + head * s.lse_stride_head;
  for (int i = 0; i < s.states; ++i) max_lse = fmaxf(max_lse, lse[i * s.lse_stride_state]);
  return max_lse;
}

// Adds a source's states of one item, weighted, to this thread's 8 accumulators and their
// weights to `total`. Every vector is read, whatever its weight, so that the reads of a
// thread's states are in flight together; a zero weight keeps an empty state's values out.
template <typename T>
__device__ __forceinline__ void add_source_states(const MergeSourceParams& s, int row, int head, int vector,
                                                  float max_lse, float (&acc)[8], float& total) {
  const float* lse = s.lse + row * s.lse_stride_row + head * s.lse_stride_head;
  const T* v = static_cast<const T*>(s.v) + row * s.v_stride_row + head * s.v_stride_head + vector * 8;
#pragma unroll 4
  for (int i = 0; i < s.states; ++i) {
    const uint4 packed = *reinterpret_cast<const uint4*>(v + i * s.v_stride_state);
    const float w = lse_merge_weight(lse[i * s.lse_stride_state], max_lse);
    total += w;
    const unsigned words[4] = {packed.x, packed.y, packed.z, packed.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      acc[2 * j] = add_weighted(acc[2 * j], w, low_half<T>(words[j]));
      acc[2 * j + 1] = add_weighted(acc[2 * j + 1], w, high_half<T>(words[j]));
    }
  }
}

// A grid-stride loop over the (row, head) items, kMergeStatesThreads / (kHeadDim / 8) of them a CTA
// per pass. out and lse may be the very tensors of a source's single state (in place): each
// thread reads its own vector before writing it, and the CTA's barrier keeps an item's LSE from
// being overwritten before all of the item's threads have read it.
template <typename T, int kHeadDim>
__global__ void __launch_bounds__(kMergeStatesThreads) merge_states_kernel(const MergeStatesParams p) {
  constexpr int kVectors = kHeadDim / 8;
  constexpr int kItemsPerCta = kMergeStatesThreads / kVectors;
  static_assert(kHeadDim % 8 == 0 && kItemsPerCta >= 1, "head_dim: a multiple of 8 up to 8 * kMergeStatesThreads");
  wait_for_previous_grid();  // a no-op unless launched as a programmatic dependent
  allow_dependent_grid();
  const int slot = threadIdx.x / kVectors;
  const int vector = threadIdx.x % kVectors;
  const long long items = static_cast<long long>(p.rows) * p.n_heads;
  for (long long first = static_cast<long long>(blockIdx.x) * kItemsPerCta; first < items;
       first += static_cast<long long>(gridDim.x) * kItemsPerCta) {
    const long long item = first + slot;
    const bool active = slot < kItemsPerCta && item < items;
    const int row = active ? static_cast<int>(item / p.n_heads) : 0;
    const int head = active ? static_cast<int>(item % p.n_heads) : 0;
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    float total = 0.f;
    float max_lse = negative_infinity();
    if (active) {
      max_lse = source_max_lse(p.b, row, head, source_max_lse(p.a, row, head, max_lse));
      add_source_states<T>(p.a, row, head, vector, max_lse, acc, total);
      add_source_states<T>(p.b, row, head, vector, max_lse, acc, total);
    }
    __syncthreads();
    if (active) {
      const float inverse = lse_merge_inverse(total);
      unsigned words[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) words[j] = pack2<T>(acc[2 * j] * inverse, acc[2 * j + 1] * inverse);
      T* out = static_cast<T*>(p.out) + row * p.out_stride_row + head * p.out_stride_head + vector * 8;
      st_global_v4(out, make_uint4(words[0], words[1], words[2], words[3]));
      if (p.lse != nullptr && vector == 0)
        p.lse[row * p.lse_stride_row + head * p.lse_stride_head] = merged_lse(max_lse, total);
    }
  }
}

// cascade's split of a shared level (runtime/families/cascade.cpp): writes the chunks' query
// offsets and lengths (block 0) and copies q's rows once a chunk, so that one paged_prefill
// over `chunks` groups reads the level's keys on `chunks` times more CTAs; merge_states then
// merges the chunks' states.
template <typename T, int kHeadDim>
__global__ void __launch_bounds__(kMergeStatesThreads) cascade_chunks_kernel(const CascadeChunkParams p) {
  constexpr int kVectors = kHeadDim / 8;
  wait_for_previous_grid();
  allow_dependent_grid();
  if (blockIdx.x == 0 && static_cast<int>(threadIdx.x) <= p.chunks) {
    const int s = threadIdx.x;
    p.indptr[s] = s * p.rows;
    if (s < p.chunks) {
      // An int64 length outside the int range reads as -1: no keys.
      const int len = min(load_index(p.seq_lens, 0, p.wide != 0), p.capacity);
      const long long left = static_cast<long long>(len) - static_cast<long long>(s) * p.chunk_tokens;
      p.lens[s] = static_cast<int>(max(0LL, min(left, static_cast<long long>(p.chunk_tokens))));
    }
  }
  const long long per_copy = static_cast<long long>(p.rows) * p.n_heads * kVectors;
  const long long total = per_copy * p.chunks;
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long within = i % per_copy;
    const int vector = static_cast<int>(within % kVectors);
    const long long row_head = within / kVectors;
    const int head = static_cast<int>(row_head % p.n_heads);
    const long long row = row_head / p.n_heads;
    const T* src = static_cast<const T*>(p.q) + row * p.q_stride_token + head * p.q_stride_head + vector * 8;
    st_global_v4(static_cast<T*>(p.q_copies) + i * 8, *reinterpret_cast<const uint4*>(src));
  }
}

}  // namespace astrai
