// Prefill attention on Hopper (sm_90a): TMA loads into an mbarrier ring, wgmma for S = Q K^T and
// O += P V, a producer warpgroup and two consumer warpgroups. Computes what prefill.cuh's
// kernel computes (same PrefillParams, same row limits, zeros and LSE -inf for empty rows) for
// the contiguous KV layout without a mask; head dims that are multiples of 64.
//
// Grid: (ceil(q_len / 128), n_heads, batch), walked backwards as in prefill.cuh; 384 threads.
// Warpgroup 0 (24 registers) has one thread issue TMA loads: Q once, then K and V blocks of
// kBlockN tokens from the last block the tile can see down to the first (blocks crossing the
// causal diagonal or the end of the KV come first, so they alone are masked), V one block
// behind K, each into a two-stage ring whose full/empty mbarriers pace producer and consumers.
// Warpgroups 1 and 2 (240 registers) own 64 query rows each. Per block: S = Q K^T is issued,
// then O += P V for the previous block; the softmax of S runs while that PV is still in flight.
// Tiles in shared memory use the 128-byte swizzle (hopper_ptx.cuh). Rows and KV positions past
// the tensor arrive as zeros (TMA fill), so they cannot produce NaN.
#pragma once

#include "hopper_params.h"
#include "hopper_ptx.cuh"
#include "prefill.cuh"

namespace astrai {

template <typename T> struct IsFp16 { static constexpr bool value = false; };
template <> struct IsFp16<fp16_t> { static constexpr bool value = true; };

// map_q: 4-D over q {head_dim, q_len, n_heads, batch}, box {64, 128, 1, 1}; map_k and map_v:
// over K and V {head_dim, kv_len, n_kv_heads, batch}, box {64, kBlockN, 1, 1}; 128-byte swizzle.
template <typename T, int kHeadDim, int kGroup>
__global__ void __launch_bounds__(384, 1)
    prefill_sm90_kernel(const __grid_constant__ PrefillParams p,
                        const __grid_constant__ sm90::TmaMap map_q,
                        const __grid_constant__ sm90::TmaMap map_k,
                        const __grid_constant__ sm90::TmaMap map_v) {
  using namespace sm90;
  using Shape = PrefillSm90Shape<kHeadDim>;
  constexpr int kBlockM = Shape::kBlockM;
  constexpr int kBlockN = Shape::kBlockN;
  constexpr int kStages = Shape::kStages;
  constexpr int kChunks = Shape::kChunks;
  constexpr bool kFp16 = IsFp16<T>::value;

  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem_q = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<unsigned long long>(smem_raw) + 1023) & ~1023ull);
  unsigned char* smem_k = smem_q + Shape::kQBytes;
  unsigned char* smem_v = smem_k + kStages * Shape::kKvBytes;
  u64* q_full = reinterpret_cast<u64*>(smem_v + kStages * Shape::kKvBytes);
  u64* k_full = q_full + 1;
  u64* k_empty = k_full + kStages;
  u64* v_full = k_empty + kStages;
  u64* v_empty = v_full + kStages;

  const int batch_index = blockIdx.z;
  const int head = blockIdx.y;
  const int kv_head = head / kGroup;
  const PrefillRequest r = prefill_request<0>(p, batch_index);
  const int m0 = prefill_tile_start<kBlockM>();
  if (m0 >= r.q_len) return;
  const int last_row = min(m0 + kBlockM, r.q_len) - 1;
  // Blocks the tile's last row can see, and the first column some row of the tile cannot.
  const int n_blocks = (prefill_row_stop(r, last_row) + kBlockN - 1) / kBlockN;
  const int mask_from = prefill_row_stop(r, m0);

  if (threadIdx.x == 0) {
    mbar_init(q_full, 1);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&k_full[s], 1);
      mbar_init(&v_full[s], 1);
      mbar_init(&k_empty[s], 256);
      mbar_init(&v_empty[s], 256);
    }
    fence_mbar_init();
  }
  __syncthreads();

  const int warpgroup = threadIdx.x / 128;
  if (warpgroup == 0) {
    setmaxnreg_dec<24>();
    if (threadIdx.x == 0 && n_blocks > 0) {
      tma_prefetch_map(&map_q);
      tma_prefetch_map(&map_k);
      tma_prefetch_map(&map_v);
      mbar_arrive_expect_tx(q_full, Shape::kQBytes);
#pragma unroll
      for (int c = 0; c < kChunks; ++c)
        tma_load_4d(smem_q + c * kBlockM * 128, &map_q, q_full, 64 * c, m0, head, batch_index);
      // Step `it` walks block n_blocks - 1 - it.
      auto load_kv = [&](const TmaMap* map, unsigned char* ring, u64* full, u64* empty, int it) {
        const int s = it % kStages;
        mbar_wait(&empty[s], ((it / kStages) & 1) ^ 1);
        mbar_arrive_expect_tx(&full[s], Shape::kKvBytes);
        const int token = (n_blocks - 1 - it) * kBlockN;
#pragma unroll
        for (int c = 0; c < kChunks; ++c)
          tma_load_4d(ring + s * Shape::kKvBytes + c * kBlockN * 128, map, &full[s], 64 * c, token,
                      kv_head, batch_index);
      };
      for (int it = 0; it < n_blocks; ++it) {
        load_kv(&map_k, smem_k, k_full, k_empty, it);
        if (it > 0) load_kv(&map_v, smem_v, v_full, v_empty, it - 1);
      }
      load_kv(&map_v, smem_v, v_full, v_empty, n_blocks - 1);
    }
    return;
  }

  setmaxnreg_inc<240>();
  const int t = threadIdx.x % 128;
  const int lane = t % 32;
  const int row0 = m0 + 64 * (warpgroup - 1) + 16 * (t / 32) + lane / 4;  // and row0 + 8
  const int stop[2] = {prefill_row_stop(r, row0), prefill_row_stop(r, row0 + 8)};

  float o[kHeadDim / 2];
  float s[kBlockN / 2];
  unsigned pa[kBlockN / 16][4];
  float row_max[2] = {negative_infinity(), negative_infinity()};
  float row_sum[2] = {0.f, 0.f};
#pragma unroll
  for (int i = 0; i < kHeadDim / 2; ++i) o[i] = 0.f;

  const unsigned q_base = smem_u32(smem_q) + (warpgroup - 1) * 64 * 128;
  auto issue_qk = [&](int stage) {
    const unsigned k_base = smem_u32(smem_k + stage * Shape::kKvBytes);
    reg_fence(s);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      const unsigned offset = (kk % 4) * 32;
      wgmma_ss<kBlockN, kFp16>(s, smem_desc(q_base + (kk / 4) * kBlockM * 128 + offset, 16, 1024),
                               smem_desc(k_base + (kk / 4) * kBlockN * 128 + offset, 16, 1024),
                               kk > 0);
    }
    wgmma_commit();
  };
  auto issue_pv = [&](int stage) {
    const unsigned v_base = smem_u32(smem_v + stage * Shape::kKvBytes);
    reg_fence(o);
    reg_fence(pa);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk)
      wgmma_rs<kHeadDim, kFp16>(o, pa[kk], smem_desc(v_base + kk * 2048, kBlockN * 128, 1024), 1);
    wgmma_commit();
  };
  // Online softmax of the block starting at column `col0`: S becomes P (f32, in s), the row
  // statistics move, and `correction` is what O must be scaled by.
  auto softmax = [&](int col0, float (&correction)[2]) {
    if (col0 + kBlockN > mask_from) {
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (col0 + 8 * j + 2 * (lane % 4) + (e & 1) >= stop[e >> 1]) s[4 * j + e] = negative_infinity();
    }
    float block_max[2] = {negative_infinity(), negative_infinity()};
#pragma unroll
    for (int j = 0; j < kBlockN / 8; ++j) {
      block_max[0] = fmaxf(block_max[0], fmaxf(s[4 * j], s[4 * j + 1]));
      block_max[1] = fmaxf(block_max[1], fmaxf(s[4 * j + 2], s[4 * j + 3]));
    }
    float neg_ref[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      block_max[h] = fmaxf(block_max[h], __shfl_xor_sync(0xffffffffu, block_max[h], 1));
      block_max[h] = fmaxf(block_max[h], __shfl_xor_sync(0xffffffffu, block_max[h], 2));
      const float new_max = fmaxf(row_max[h], block_max[h] * p.scale_log2);
      // A row that has seen nothing yet keeps -inf; 0 as its reference gives exp2(-inf) = 0.
      const float ref = new_max == negative_infinity() ? 0.f : new_max;
      correction[h] = exp2f(row_max[h] - ref);
      row_max[h] = new_max;
      row_sum[h] *= correction[h];
      neg_ref[h] = -ref;
    }
#pragma unroll
    for (int i = 0; i < kBlockN / 2; ++i) {
      s[i] = exp2f(fmaf(s[i], p.scale_log2, neg_ref[(i >> 1) & 1]));
      row_sum[(i >> 1) & 1] += s[i];
    }
  };
  // P in the register layout of wgmma's A operand: k-step kk takes s[8kk .. 8kk + 7].
  auto pack_p = [&]() {
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk)
#pragma unroll
      for (int q = 0; q < 4; ++q) pa[kk][q] = pack2<T>(s[8 * kk + 2 * q], s[8 * kk + 2 * q + 1]);
  };

  if (n_blocks > 0) {
    float correction[2];
    mbar_wait(q_full, 0);
    mbar_wait(&k_full[0], 0);
    issue_qk(0);
    wgmma_wait<0>();
    reg_fence(s);
    mbar_arrive(&k_empty[0]);
    softmax((n_blocks - 1) * kBlockN, correction);
    pack_p();
    for (int it = 1; it < n_blocks; ++it) {
      const int ks = it % kStages;
      const int vs = (it - 1) % kStages;
      mbar_wait(&k_full[ks], (it / kStages) & 1);
      issue_qk(ks);
      mbar_wait(&v_full[vs], ((it - 1) / kStages) & 1);
      issue_pv(vs);
      wgmma_wait<1>();  // S is ready; P V of the previous block still runs
      reg_fence(s);
      mbar_arrive(&k_empty[ks]);
      softmax((n_blocks - 1 - it) * kBlockN, correction);
      wgmma_wait<0>();
      reg_fence(o);
      mbar_arrive(&v_empty[vs]);
#pragma unroll
      for (int i = 0; i < kHeadDim / 2; ++i) o[i] *= correction[(i >> 1) & 1];
      pack_p();
    }
    const int vs = (n_blocks - 1) % kStages;
    mbar_wait(&v_full[vs], ((n_blocks - 1) / kStages) & 1);
    issue_pv(vs);
    wgmma_wait<0>();
    reg_fence(o);
    mbar_arrive(&v_empty[vs]);
  }

  float inverse[2];
  float lse[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float sum = row_sum[h];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const bool empty = !(sum > 0.f);
    inverse[h] = empty ? 0.f : 1.f / sum;
    lse[h] = empty ? negative_infinity() : (row_max[h] + log2f(sum)) * kLn2;
  }
  T* out = static_cast<T*>(p.out) + batch_index * p.out_stride_batch + head * p.out_stride_head;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = row0 + 8 * h;
    if (row >= r.q_len) continue;
    T* out_row = out + static_cast<long long>(r.q_start + row) * p.out_stride_seq + 2 * (lane % 4);
#pragma unroll
    for (int j = 0; j < kHeadDim / 8; ++j)
      *reinterpret_cast<unsigned*>(out_row + 8 * j) =
          pack2<T>(o[4 * j + 2 * h] * inverse[h], o[4 * j + 2 * h + 1] * inverse[h]);
    if (p.lse != nullptr && lane % 4 == 0) p.lse[(r.lse_row + row) * p.n_heads + head] = lse[h];
  }
}

}  // namespace astrai
