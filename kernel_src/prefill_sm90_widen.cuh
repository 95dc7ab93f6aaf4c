// The Hopper prefill's FP8 widening (prefill_sm90.cuh, an FP8 cache). The GEMMs of such a variant
// run in f16 whatever the output type: every e4m3 and e5m2 value is an f16 value, widened by one
// cvt (e4m3) or byte move (e5m2) a pair, NaN and infinities kept. Warps 1..3 of the producer
// warpgroup turn each block of cache bytes that TMA landed in a byte ring into the f16 tile the
// consumers' wgmmas read, in the layout a 16-bit TMA load would have left there. A bf16 Q tile is
// made f16 by its consumer, each row scaled into f16's range by a power of two that its scores
// take back (kv8_q_row_exponent, as the FP8 decode does). The scales stay out of the tiles: the K
// scale multiplies the scores and the V scale the output, so the widened values are the cache's.
// (bf16 tiles cost five instructions a pair, by bit placement and a multiply; that widening held
// the kernel to 0.57x the bf16 cache's rate on an H100.)
#pragma once

#include "prefill_sm90_tile.cuh"

namespace astrai {

// One block: the bytes at shared address `bytes` (kBlockN rows of 128 bytes, 128-byte swizzled
// as TMA landed them: piece p of row r at p ^ r % 8) into the f16 tile at `tile` in the
// consumers' layout: K [chunk][row][128 B], paged V [box][chunk][kBoxRows rows][128 B]
// (prefill_sm90.cuh), both swizzled the same way. Thread t widens 8-byte piece t % 16 of rows
// t / 16, + 6, + 12, ...: 16 threads read one row's 128 bytes, 8 write one line of a chunk, so
// neither access meets a bank conflict. Loads go four at a time ahead of their conversions and
// stores: one warp a scheduler has no other way to cover their latency.
// Shared-window addresses: through generic pointers the accesses compile to 64-bit LD.E / ST.E.
template <class C, bool kIsV>
struct PrefillSm90Widening {
  static_assert(C::kHeadDim == 128, "a token's bytes are one 128-byte row");
  static constexpr unsigned kPieces = C::kHeadDim / 8;
  static constexpr unsigned kRowStep = kPrefillSm90Wideners / kPieces;
  static constexpr unsigned kBatch = 4;
  static constexpr unsigned kBoxRows = C::kBoxRows;
  static_assert(kPrefillSm90Wideners % kPieces == 0, "a thread keeps its piece of every row it widens");
  // Batches whose rows all lie in the block, whatever the thread's first row.
  static constexpr unsigned kFullBatches = C::kBlockN / (kBatch * kRowStep);

  unsigned bytes, tile;
  unsigned piece, chunk_offset;  // the thread's piece, and its chunk's place in a line

  __device__ __forceinline__ unsigned source(unsigned row) const {
    return bytes + row * 128 + (((piece / 2) ^ (row % 8)) << 4) + (piece % 2) * 8;
  }
  __device__ __forceinline__ unsigned target(unsigned row) const {
    const unsigned line = kIsV ? (row / kBoxRows) * C::kChunks * kBoxRows * 128 + (row % kBoxRows) * 128 : row * 128;
    return tile + chunk_offset + line + (((piece % 8) ^ (row % 8)) << 4);
  }
  // Rows row0, + kRowStep, ... (kBatch of them; kGuarded: those inside the block).
  template <bool kGuarded>
  __device__ __forceinline__ void batch(unsigned row0) const {
    uint2 in[kBatch];
#pragma unroll
    for (unsigned j = 0; j < kBatch; ++j)
      if (!kGuarded || row0 + j * kRowStep < C::kBlockN) in[j] = sm90::ld_shared_v2(source(row0 + j * kRowStep));
#pragma unroll
    for (unsigned j = 0; j < kBatch; ++j)
      if (!kGuarded || row0 + j * kRowStep < C::kBlockN)
        sm90::st_shared_v4(target(row0 + j * kRowStep), widen_fp8x8<fp16_t, C::kE5m2>(in[j].x, in[j].y));
  }
};

template <class C, bool kIsV>
__device__ __forceinline__ void prefill_sm90_widen_block(unsigned bytes, unsigned tile, unsigned t) {
  using W = PrefillSm90Widening<C, kIsV>;
  // The thread's addresses are worked out again each block (a few instructions): left loop
  // invariant, they were hoisted out of the walk and spilled from the widening's registers.
  asm volatile("mov.u32 %0, %0;" : "+r"(t));
  const unsigned piece = t % W::kPieces;
  const W w{bytes, tile, piece, (piece / 8) * (kIsV ? W::kBoxRows : C::kBlockN) * 128};
  const unsigned first_row = t / W::kPieces;
#pragma unroll 1
  for (unsigned b = 0; b < W::kFullBatches; ++b) w.template batch<false>(first_row + b * W::kBatch * W::kRowStep);
  w.template batch<true>(first_row + W::kFullBatches * W::kBatch * W::kRowStep);
}

// Ring step `step` of K or V: waits for its bytes and for the consumers to have left the f16
// stage, widens, then frees the byte stage and fills the f16 one. The fence makes the generic
// proxy's stores visible to the wgmmas (the async proxy) that the full barrier releases.
template <class C, bool kIsV>
__device__ __forceinline__ void prefill_sm90_widen_step(const PrefillSm90Smem<C>& sm, int step, int t) {
  using namespace sm90;
  const int s = step % C::kStages;
  const unsigned parity = (step / C::kStages) & 1;
  mbar_wait(&(kIsV ? sm.v8_full : sm.k8_full)[s], parity);
  mbar_wait(&(kIsV ? sm.v_empty : sm.k_empty)[s], parity ^ 1);
  prefill_sm90_widen_block<C, kIsV>(shared_address(kIsV ? sm.v8 : sm.k8) + s * C::kKv8Bytes,
                                    shared_address(kIsV ? sm.v : sm.k) + s * (kIsV ? C::kVStageBytes : C::kKStageBytes), t);
  fence_proxy_async_shared();
  mbar_arrive(&(kIsV ? sm.v8_empty : sm.k8_empty)[s]);
  mbar_arrive(&(kIsV ? sm.v_full : sm.k_full)[s]);
}

// The blocks of tile `w`'s walk (first ring step g), in the producer's order: K one block ahead
// of V.
template <class C>
__device__ __forceinline__ void prefill_sm90_widen_walk(const PrefillSm90Smem<C>& sm, const PrefillSm90Walk& w, int g,
                                                        int t) {
  for (int it = 0; it < w.block_count; ++it) {
    prefill_sm90_widen_step<C, false>(sm, g + it, t);
    if (it > 0) prefill_sm90_widen_step<C, true>(sm, g + it - 1, t);
  }
  prefill_sm90_widen_step<C, true>(sm, g + w.block_count - 1, t);
}

// FP8 attention keeping P in f16 (C::kP16): V's blocks only, K going to the e4m3 wgmmas as TMA
// landed it.
template <class C>
__device__ __forceinline__ void prefill_sm90_widen_v_walk(const PrefillSm90Smem<C>& sm, const PrefillSm90Walk& w,
                                                          int g, int t) {
  for (int it = 0; it < w.block_count; ++it) prefill_sm90_widen_step<C, true>(sm, g + it, t);
}

// A consumer's 64 rows of a bf16 Q tile made f16 in place (FP8 cache variants with bf16 q), each
// row scaled by 2^-e (kv8_q_row_exponent) so that its largest magnitude fits f16. Thread t holds
// the rows of its wgmma accumulator (16 (t / 32) + (t % 32) / 4, and + 8), the four threads of a
// quad a row's pieces q and q + 4 of each 64-column chunk (q = t % 4); `factor` gets each row's
// 2^e, the scores' factor. The Q tile is [chunk][kBlockM rows][128 B], 128-byte swizzled. Its
// rows are this consumer's alone: a barrier of its 128 threads publishes them to its wgmmas.
template <class C>
__device__ __forceinline__ void prefill_sm90_widen_q(unsigned q_base, int consumer, int t, float (&factor)[2]) {
  using namespace sm90;
  const int quad = t % 4;
  const int row0 = 16 * (t / 32) + (t % 32) / 4;
  uint4 pieces[2][C::kChunks][2];
  float row_max[2] = {0.f, 0.f};
  auto address = [&](int h, int chunk, int k) {
    const int row = row0 + 8 * h;  // of the consumer's 64; q_base is its first row's
    return q_base + chunk * C::kBlockM * 128 + row * 128 + (((quad + 4 * k) ^ (row % 8)) << 4);
  };
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int chunk = 0; chunk < C::kChunks; ++chunk)
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        pieces[h][chunk][k] = ld_shared_v4(address(h, chunk, k));
        const unsigned* words = &pieces[h][chunk][k].x;
#pragma unroll
        for (int i = 0; i < 4; ++i)
          row_max[h] = fmaxf(row_max[h], fmaxf(fabsf(low_half<bf16_t>(words[i])), fabsf(high_half<bf16_t>(words[i]))));
      }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    row_max[h] = quad_max(row_max[h]);
    const int exponent = kv8_q_row_exponent(row_max[h]);
    factor[h] = ldexpf(1.f, exponent);
    const float scale = ldexpf(1.f, -exponent);
#pragma unroll
    for (int chunk = 0; chunk < C::kChunks; ++chunk)
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        uint4 piece = pieces[h][chunk][k];
        unsigned* words = &piece.x;
#pragma unroll
        for (int i = 0; i < 4; ++i)
          words[i] = pack2<fp16_t>(low_half<bf16_t>(words[i]) * scale, high_half<bf16_t>(words[i]) * scale);
        st_shared_v4(address(h, chunk, k), piece);
      }
  }
  fence_proxy_async_shared();
  named_bar_sync(C::kConsumers + 2 + consumer, 128);
}

}  // namespace astrai
