// Prefill attention: a block of query rows per request against a contiguous (kPageSize 0) or
// paged KV cache, with causal limits, an optional bool mask and an optional LSE output.
//
// Grid: (ceil(q_len / block_q), n_heads, batch); 128 threads. A CTA owns block_q query rows of
// one query head of one request (prefill_common.cuh: the rows' limits and the tile order).
// Tensor-core path (block_q = prefill_block_q(head_dim)): prefill_mma.cuh. CUDA-core path
// (ASTRAI_NO_MMA, block_q 64): prefill_cuda_cores.cuh.
#pragma once

#include "prefill_common.cuh"
#include "prefill_cuda_cores.cuh"
#include "prefill_mma.cuh"

namespace astrai {

// Two CTAs per SM: asking for three on Hopper (168 registers, a few spills at head dim 128)
// measured slower (H200: 267 -> 248-252 TFLOP/s).
template <typename T, int kHeadDim, int kPageSize, int kGroup, int kFlags>
__global__ void __launch_bounds__(kPrefillThreads, 2) prefill_kernel(const PrefillParams p) {
  static_assert((kFlags & ~kPortableFeatures) == 0, "prefill feature bits");
  static_assert(!has_feature<kFlags>(kFeatureKvE4m3) || !has_feature<kFlags>(kFeatureKvE5m2), "one FP8 format");
  extern __shared__ __align__(16) unsigned char smem_raw[];
#ifndef ASTRAI_NO_MMA
  prefill_mma<T, kHeadDim, kPageSize, kGroup, kFlags>(p, smem_raw);
#else
  prefill_cuda_cores<T, kHeadDim, kPageSize, kGroup, kFlags>(p, smem_raw);
#endif
}

}  // namespace astrai
