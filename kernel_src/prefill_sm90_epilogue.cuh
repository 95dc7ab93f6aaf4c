// The Hopper prefill's epilogue (prefill_sm90.cuh): a consumer's rows of O normalized (with the
// sinks folded in), stored through shared memory as whole rows, and their LSE.
#pragma once

#include "prefill_sm90_consumer.cuh"

namespace astrai {

template <class C>
__device__ __forceinline__ void prefill_sm90_epilogue(PrefillSm90Consumer<C>& c) {
  using namespace sm90;
  using T = typename C::T;
  constexpr int kHeadDim = C::kHeadDim;
  const PrefillParams& p = c.p;
  const int& lane = c.lane;
  float inverse[2];
  float lse[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float sum = c.row_sum[h];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    float sink_factor = 1.f;
    if constexpr (C::kSink) sink_factor = fold_sink(p.features.sinks[c.row_head(c.row0 + 8 * h)], &c.row_max[h], &sum);
    const bool empty = !(sum > 0.f);
    inverse[h] = empty ? 0.f : sink_factor / sum;
    // An FP8 cache's V scale goes on the output (the widened V holds the cache's values), and
    // FP8 attention's (P V ran on V's bytes).
    if constexpr (C::kKv8 || C::kQkv8)
      inverse[h] *= kv_scale(p.features.v_scale, p.features.kv_scale_stride, c.cta.head / (C::kGroup / C::kPackHeads));
    lse[h] = empty ? negative_infinity() : (c.row_max[h] + log2f(sum)) * kLn2;
  }
  T* out = static_cast<T*>(p.out) + c.batch_index * p.out_stride_batch;
  auto out_row = [&](int row) {
    return out + static_cast<long long>(c.r.q_start + c.row_position(row)) * p.out_stride_seq +
           static_cast<long long>(c.row_head(row)) * p.out_stride_head;
  };
  // O leaves through shared memory: each warp writes its 16 rows into its own rows of the Q tile
  // (its consumer's S GEMMs are done with them) in the accumulator's layout, then reads them back
  // as 16-byte pieces of whole rows, so that a store instruction fills whole output rows instead
  // of 16 bytes in each of eight. Rows are 16-byte aligned: the runtime requires it of `out` and
  // its strides (runtime/families/arg_checks.cpp).
  {
    const int warp = c.t / 32;
    // Piece j (8 columns) of row rho of the warp's 16: in the Q tile's chunk j / 8, its place in
    // the 128-byte row swizzled by the row, so that a tile's 8 rows meet 8 different bank groups,
    // and so do a row's 8 pieces when read.
    const unsigned staging = shared_address(c.q_tile) + (64 * c.consumer + 16 * warp) * 128;
    auto piece = [&](int rho, int j) {
      return staging + (j / 8) * C::kBlockM * 128 + rho * 128 + ((j ^ rho) % 8) * 16;
    };
    fence_proxy_async_shared();  // the generic proxy's stores follow the async proxy's reads of Q
    // Tiles (j, rows 0-7), (j, rows 8-15), (j + 1, rows 0-7), (j + 1, rows 8-15): lane l
    // addresses row l % 8 of tile l / 8. A pass stages the 64-column chunks the Q slot holds: all
    // of them, or with FP8 attention's slot of bytes half, in two passes.
    const int tile = lane / 8;
    const float(&o)[kHeadDim / 2] = c.o;
    constexpr int kPassColumns = 64 * (C::kQSlotBytes / (C::kBlockM * 128));
    static_assert(kHeadDim % kPassColumns == 0, "whole passes");
    constexpr int kPiecesPerRow = kPassColumns / 8;
    const int first_row = c.m0 + 64 * c.consumer + 16 * warp;
#pragma unroll
    for (int pass = 0; pass < kHeadDim / kPassColumns; ++pass) {
      if (pass > 0) __syncwarp();  // the last pass's reads are done with the staging rows
#pragma unroll
      for (int jj = 0; jj < kPiecesPerRow; jj += 2) {
        const int j = pass * kPiecesPerRow + jj;
        stmatrix_x4(piece(lane % 8 + 8 * (tile % 2), jj + tile / 2),
                    pack2<T>(o[4 * j] * inverse[0], o[4 * j + 1] * inverse[0]),
                    pack2<T>(o[4 * j + 2] * inverse[1], o[4 * j + 3] * inverse[1]),
                    pack2<T>(o[4 * j + 4] * inverse[0], o[4 * j + 5] * inverse[0]),
                    pack2<T>(o[4 * j + 6] * inverse[1], o[4 * j + 7] * inverse[1]));
      }
      __syncwarp();
#pragma unroll
      for (int k = 0; k < 16 * kPiecesPerRow / 32; ++k) {
        const int rho = (lane + 32 * k) / kPiecesPerRow;
        const int j = (lane + 32 * k) % kPiecesPerRow;
        if (first_row + rho < c.rows)
          st_global_v4(out_row(first_row + rho) + pass * kPassColumns + 8 * j, ld_shared_v4(piece(rho, j)));
      }
    }
  }
  if (p.lse != nullptr && lane % 4 == 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h)
      if (c.row0 + 8 * h < c.rows)
        p.lse[(c.r.lse_row + c.row_position(c.row0 + 8 * h)) * p.n_heads + c.row_head(c.row0 + 8 * h)] = lse[h];
  }
  ASTRAI_PREFILL_STAMP(c.t == 0, 4 + c.consumer);  // each consumer's stores are issued
  if constexpr (C::kPersistent) {
    fence_proxy_async_shared();  // the next tile's Q load follows this tile's reads of the slot
    mbar_arrive(&c.sm.q_empty[c.slot]);
  }
}

}  // namespace astrai
