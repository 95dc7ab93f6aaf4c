// merge_states: attention states (normalized rows with their LSEs, lse_merge.cuh) of disjoint
// key sets merged into the attention over all of them, e.g. a shared prefix's pass and each
// request's own suffix (cascade attention), or partial passes a caller splits itself.
// Each thread owns 8 elements (one 16-byte vector) of one (row, head) item and reads that
// vector of every state with the state's LSE (read by each of the item's threads: one
// broadcast line), merging online.
#pragma once

#include "astrai_common.cuh"
#include "lse_merge.cuh"

namespace astrai {

// acc * rescale, where a zero factor (states outweighed past float's range) drops acc whatever
// it holds, as a zero weight does in add_weighted.
__device__ __forceinline__ float rescaled(float acc, float rescale) { return rescale != 0.f ? acc * rescale : 0.f; }

// Folds two states (LSEs s0, s1; an absent second one has LSE -inf) into the running merge of an
// item's earlier states: the running maximum moves to the largest LSE seen and what was summed so
// far is rescaled to it. Each state is so read once, its LSE with its vector, with no pass over
// the LSEs first, and the loads of a pair are in flight together.
template <typename T>
__device__ __forceinline__ void fold_pair(float (&acc)[8], float& max_lse, float& total, float s0, const uint4& v0,
                                          float s1, const uint4& v1) {
  const float top = fmaxf(max_lse, fmaxf(s0, s1));
  if (top == negative_infinity()) return;  // every state so far is empty
  const float rescale = lse_merge_weight(max_lse, top);
  const float w0 = lse_merge_weight(s0, top);
  const float w1 = lse_merge_weight(s1, top);
  max_lse = top;
  total = rescaled(total, rescale) + w0 + w1;
  const unsigned a_words[4] = {v0.x, v0.y, v0.z, v0.w};
  const unsigned b_words[4] = {v1.x, v1.y, v1.z, v1.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    float lo = add_weighted(rescaled(acc[2 * j], rescale), w0, low_half<T>(a_words[j]));
    float hi = add_weighted(rescaled(acc[2 * j + 1], rescale), w0, high_half<T>(a_words[j]));
    acc[2 * j] = add_weighted(lo, w1, low_half<T>(b_words[j]));
    acc[2 * j + 1] = add_weighted(hi, w1, high_half<T>(b_words[j]));
  }
}

// Folds a source's states of one item into the running merge, two at a time.
template <typename T>
__device__ __forceinline__ void fold_source(const MergeSourceParams& s, int row, int head, int vector,
                                            float (&acc)[8], float& max_lse, float& total) {
  const float* lse = s.lse + row * s.lse_stride_row + head * s.lse_stride_head;
  const T* v = static_cast<const T*>(s.v) + row * s.v_stride_row + head * s.v_stride_head + vector * 8;
  for (int i = 0; i < s.states; i += 2) {
    const float s0 = lse[0];
    const uint4 v0 = *reinterpret_cast<const uint4*>(v);
    float s1 = negative_infinity();
    uint4 v1 = make_uint4(0u, 0u, 0u, 0u);
    if (i + 1 < s.states) {
      s1 = lse[s.lse_stride_state];
      v1 = *reinterpret_cast<const uint4*>(v + s.v_stride_state);
    }
    fold_pair<T>(acc, max_lse, total, s0, v0, s1, v1);
    lse += 2 * s.lse_stride_state;
    v += 2 * s.v_stride_state;
  }
}

// A grid-stride loop over the (row, head) items, kMergeStatesThreads / (kHeadDim / 8) of them a CTA
// per pass. Bandwidth-bound: kMergeStatesCtasPerSm CTAs an SM (40 registers a thread, none
// spilled) keep enough loads in flight.
// out and lse may be the very tensors of a source's single state (in place): each thread reads
// its own vector before writing it, and a barrier keeps an item's LSE from being overwritten
// before all of the item's threads have read it (the warp's, when no item straddles two warps).
template <typename T, int kHeadDim>
__global__ void __launch_bounds__(kMergeStatesThreads, kMergeStatesCtasPerSm)
    merge_states_kernel(const MergeStatesParams p) {
  constexpr int kVectors = kHeadDim / 8;
  constexpr int kItemsPerCta = kMergeStatesThreads / kVectors;
  constexpr bool kItemInWarp = 32 % kVectors == 0;
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
      fold_source<T>(p.a, row, head, vector, acc, max_lse, total);
      fold_source<T>(p.b, row, head, vector, acc, max_lse, total);
    }
    if constexpr (kItemInWarp) {
      __syncwarp();
    } else {
      __syncthreads();
    }
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
