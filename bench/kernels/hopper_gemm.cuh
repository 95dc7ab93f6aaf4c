// bf16 GEMM on Hopper (sm_90a): C[M, N] = A[M, K] * B[N, K]^T, f32 accumulation, bf16 out.
// The benchmark's matrix ceiling, measured rather than quoted, and the proof that the
// descriptors and the TMA/mbarrier pipeline of hopper_ptx.cuh are right.
//
// Grid: one CTA per 128 x 256 tile of C (M % 128 == 0, N % 256 == 0, K % 64 == 0), tiles ordered
// in bands of 8 row-tiles so that CTAs running together share A and B in L2. 384 threads:
// warpgroup 0 produces (one thread issues TMA loads of 64-wide K slices into a 4-stage ring),
// warpgroups 1 and 2 consume (each owns 64 rows of the tile: m64n256k16 wgmma, SS).
#pragma once

#include "hopper_params.h"
#include "hopper_ptx.cuh"

// map_a: 2-D over A (dims {K, M}, box {64, 128}); map_b: over B (dims {K, N}, box {64, 256});
// both with the 128-byte swizzle.
extern "C" __global__ void __launch_bounds__(384, 1)
    astrai_gemm_bf16_sm90(const __grid_constant__ astrai::sm90::TmaMap map_a,
                          const __grid_constant__ astrai::sm90::TmaMap map_b, unsigned short* c,
                          int m, int n, int k) {
  using namespace astrai;
  using namespace astrai::sm90;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<unsigned long long>(smem_raw) + 1023) & ~1023ull);
  unsigned char* ring_a = smem;
  unsigned char* ring_b = smem + kGemmStages * kGemmStageBytesA;
  u64* full = reinterpret_cast<u64*>(ring_b + kGemmStages * kGemmStageBytesB);
  u64* empty = full + kGemmStages;

  constexpr int kBandM = 8;  // row-tiles per band
  const int tiles_m = m / kGemmBlockM;
  const int tiles_n = n / kGemmBlockN;
  const int band = blockIdx.x / (kBandM * tiles_n);
  const int band_rows = min(kBandM, tiles_m - band * kBandM);  // the last band may be short
  const int in_band = blockIdx.x - band * kBandM * tiles_n;
  const int tile_m = band * kBandM + in_band % band_rows;
  const int tile_n = in_band / band_rows;
  const int k_blocks = k / kGemmBlockK;
  const int warpgroup = threadIdx.x / 128;

  if (threadIdx.x == 0) {
    for (int s = 0; s < kGemmStages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], 2 * 128);
    }
    fence_mbar_init();
  }
  __syncthreads();

  if (warpgroup == 0) {
    setmaxnreg_dec<40>();
    if (threadIdx.x == 0) {
      tma_prefetch_map(&map_a);
      tma_prefetch_map(&map_b);
      for (int kb = 0; kb < k_blocks; ++kb) {
        const int s = kb % kGemmStages;
        mbar_wait(&empty[s], ((kb / kGemmStages) & 1) ^ 1);
        mbar_arrive_expect_tx(&full[s], kGemmStageBytesA + kGemmStageBytesB);
        tma_load_2d(ring_a + s * kGemmStageBytesA, &map_a, &full[s], kb * kGemmBlockK, tile_m * kGemmBlockM);
        tma_load_2d(ring_b + s * kGemmStageBytesB, &map_b, &full[s], kb * kGemmBlockK, tile_n * kGemmBlockN);
      }
    }
  } else {
    setmaxnreg_inc<232>();
    float acc[kGemmBlockN / 2];
#pragma unroll
    for (int i = 0; i < kGemmBlockN / 2; ++i) acc[i] = 0.0f;
    const int rows_offset = (warpgroup - 1) * 64 * 128;  // this warpgroup's 64 rows of A
    for (int kb = 0; kb < k_blocks; ++kb) {
      const int s = kb % kGemmStages;
      mbar_wait(&full[s], (kb / kGemmStages) & 1);
      const unsigned a_base = shared_address(ring_a + s * kGemmStageBytesA) + rows_offset;
      const unsigned b_base = shared_address(ring_b + s * kGemmStageBytesB);
      reg_fence(acc);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kGemmBlockK / 16; ++kk)
        wgmma_ss<kGemmBlockN, false>(acc, smem_desc(a_base + kk * 32, 16, 1024),
                                     smem_desc(b_base + kk * 32, 16, 1024), 1);
      wgmma_commit();
      reg_fence(acc);
      // Keep one group in flight: the previous slice's readers are done once this returns.
      wgmma_wait<1>();
      reg_fence(acc);
      if (kb > 0) mbar_arrive(&empty[(kb - 1) % kGemmStages]);
    }
    wgmma_wait<0>();
    reg_fence(acc);

    const int t = threadIdx.x % 128;
    const int row = tile_m * kGemmBlockM + (warpgroup - 1) * 64 + 16 * (t / 32) + (t % 32) / 4;
    const int col0 = tile_n * kGemmBlockN + 2 * (t % 4);
#pragma unroll
    for (int j = 0; j < kGemmBlockN / 8; ++j) {
      unsigned lo, hi;
      asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(lo) : "f"(acc[4 * j + 1]), "f"(acc[4 * j]));
      asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(hi) : "f"(acc[4 * j + 3]), "f"(acc[4 * j + 2]));
      const long long col = col0 + 8 * j;
      *reinterpret_cast<unsigned*>(c + static_cast<long long>(row) * n + col) = lo;
      *reinterpret_cast<unsigned*>(c + static_cast<long long>(row + 8) * n + col) = hi;
    }
  }
}
