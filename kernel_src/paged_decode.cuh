// Paged decode attention: one query token per sequence against a paged KV cache.
//
// Grid: (num_splits, n_kv_heads * head_tiles, batch); 128 threads. A CTA owns one KV head of
// one sequence over one split of its tokens, and up to 16 query heads of that KV head's GQA
// group (the M rows of the MMA tile), so K and V are read from memory once per group.
// Tensor-core path (paged_decode_mma.cuh): K/V blocks of 64 tokens stream through shared memory
// with cp.async (double buffered); warp w takes tokens [16w, 16w+16) of each block, keeps its
// own online softmax state, and the four warps merge at the end. An FP8 cache at head dim
// 64/128/256 takes the direct path instead (Kv8Direct: each warp streams its own rows' bytes
// through a ring and reads them straight into f16 MMA fragments). CUDA-core path
// (paged_decode_cuda_cores.cuh, ASTRAI_NO_MMA): warp w owns query heads w, w+4, ... and walks
// every token with warp-wide dot products.
// kPageSize 0 instantiates the contiguous-KV decode: token t of sequence b at
// b * stride_page + t * stride_token.
// Multi-token decode (kFlags' q_len field, speculative verification): the rows of a KV head
// are (query head, query token) pairs, cut into 16-row head tiles like a large group's heads,
// so K and V are still read once per tile; each row masks the keys past its own token.
//
// The rooms the paths are composed of:
//   decode_work.cuh          a CTA's work: tiles, sequence, page-table lookups, K/V rows, head rows
//   decode_append.cuh        the fused append (16-bit, or FP8 quantized)
//   decode_start.cuh         a CTA's start: empty splits, the append, the L2 prefetches
//   decode_kv_loaders.cuh    16-bit cache loaders (general, pages fetched ahead, full blocks)
//   decode_kv8_layout.cuh    the direct FP8 path's ring layout and permutations
//   decode_kv8_loaders.cuh   FP8 cache loaders (staged, and the direct path's step loader)
//   decode_q_tile.cuh        the Q tile
//   decode_softmax.cuh       a warp's online softmax
//   decode_mma_steps.cuh     a warp's S = Q K^T and O += P V from 16-bit tiles
//   decode_merge.cuh         the four warps' merge and the rows' output
//   attention_combine.cuh    the split combine (and how a finished row is stored)
// The sm_90a TMA decode (paged_decode_sm90.cuh, decode_sm90_parts.cuh) shares them.
#pragma once

#include "astrai_common.cuh"
#include "attention_combine.cuh"
#include "mma_utils.cuh"
#include "decode_work.cuh"
#include "decode_append.cuh"
#include "decode_start.cuh"
#ifndef ASTRAI_NO_MMA
#include "paged_decode_mma.cuh"
#else
#include "paged_decode_cuda_cores.cuh"
#endif

namespace astrai {

// The kernel's work, for its two entries below.
template <typename T, int kHeadDim, int kPageSize, int kGroup, int kFlags>
__device__ __forceinline__ void paged_decode_entry(const PagedDecodeParams& p) {
  static_assert((kFlags & ~(kPortableFeatures | kFeatureQLenField)) == 0, "paged decode feature bits");
  static_assert(!has_feature<kFlags>(kFeatureKvE4m3) || !has_feature<kFlags>(kFeatureKvE5m2), "one FP8 format");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  allow_dependent_grid();  // the split combine may be scheduled as CTAs free up
  // Not with an FP8 cache: its kernel then compiled to other code (hd64: 96 -> 80 registers) that
  // read 7.9% slower at hd64 24/4, batch 32 x 4096 tokens (H200).
  if constexpr (!has_fp8_kv<kFlags>()) prefetch_decode_start<T, kHeadDim, kPageSize, kGroup, kFlags, true>(p, 0);
  wait_for_previous_grid();  // launched as a dependent of the kernel before it (sm_90+)
#ifndef ASTRAI_NO_MMA
  paged_decode_mma<T, kHeadDim, kPageSize, kGroup, kFlags>(p, smem_raw);
#else
  paged_decode_cuda_cores<T, kHeadDim, kPageSize, kGroup, kFlags>(p, smem_raw);
#endif
}

template <typename T, int kHeadDim, int kPageSize, int kGroup, int kFlags>
__global__ void __launch_bounds__(kDecodeThreads) paged_decode_kernel(const PagedDecodeParams p) {
  paged_decode_entry<T, kHeadDim, kPageSize, kGroup, kFlags>(p);
}

// The direct FP8 path with bf16 Q at head dim 128 on tensor cores (decode_entry_holds_4_ctas):
// the score factors of Q rows scaled into f16's range took ptxas from 128 to 148 registers, 3
// CTAs an SM instead of 4, 4% slower at batch 64 x 8192 (H200); held to 4 CTAs it needs no spill.
template <typename T, int kHeadDim, int kPageSize, int kGroup, int kFlags>
__global__ void __launch_bounds__(kDecodeThreads, 4) paged_decode_kernel_4ctas(const PagedDecodeParams p) {
  paged_decode_entry<T, kHeadDim, kPageSize, kGroup, kFlags>(p);
}

}  // namespace astrai
