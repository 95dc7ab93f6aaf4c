// The Hopper prefill's FP8 widening (prefill_sm90.cuh, an FP8 cache): warps 1..3 of the producer
// warpgroup turn each block of cache bytes that TMA landed in a byte ring into the 16-bit tile
// the consumers' wgmmas read, in the layout a 16-bit TMA load would have left there. The scales
// stay out of it: the K scale multiplies the scores and the V scale the output, as in the
// portable kernel, so the widened values are the cache's values exactly.
#pragma once

#include "prefill_sm90_tile.cuh"

namespace astrai {

inline constexpr int kPrefillSm90Wideners = 96;  // warps 1..3 of the producer warpgroup

// Bytes b0 and b1 of `word` (selector 0x1404) or b2 and b3 (0x3424) as a bf16 pair, by bit
// placement: the byte's exponent and mantissa land under bf16's, which reads as the value times
// 2^-(127 - the format's bias), and one bf16 multiply by the inverse power restores it exactly,
// subnormals included (the multiply normalizes them). e4m3's NaN and e5m2's infinities and NaN
// come out finite: prefill_sm90_widen8 sends those words to the exact conversion. Four integer
// instructions and a multiply a pair, where the conversion through f32 (cvt, at a quarter of the
// rate) could not keep up with the GEMMs.
template <bool kE5m2, unsigned kSelector>
__device__ __forceinline__ unsigned fp8x2_to_bf16x2_placed(unsigned word) {
  constexpr int kShift = kE5m2 ? 3 : 4;
  constexpr unsigned kMagnitude = kE5m2 ? 0x0fe00fe0u : 0x07f007f0u;
  constexpr unsigned kFactor = kE5m2 ? 0x77807780u : 0x7b807b80u;  // 2^112, 2^120
  const unsigned high = byte_perm(word, 0u, kSelector);               // each byte in the top of its half
  const unsigned placed = (high & 0x80008000u) | ((high >> kShift) & kMagnitude);
  unsigned result;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(result) : "r"(placed), "r"(kFactor));
  return result;
}

// Whether a word holds a code the placement cannot widen (e4m3 NaN; e5m2 infinity or NaN).
template <bool kE5m2>
__device__ __forceinline__ unsigned fp8x4_specials(unsigned word) {
  return kE5m2 ? ((word & 0x7c7c7c7cu) + 0x04040404u) & 0x80808080u
               : ((word & 0x7f7f7f7fu) + 0x01010101u) & 0x80808080u;
}

// Eight FP8 values (two words) as eight T (one 16-byte piece), exact, NaN and infinities kept.
// f16 takes one cvt (e4m3) or byte move (e5m2) a pair and has no special case.
template <typename T, bool kE5m2>
__device__ __forceinline__ uint4 prefill_sm90_widen8(unsigned lo, unsigned hi) {
  if constexpr (is_fp16<T>()) {
    return widen_fp8x8<T, kE5m2>(lo, hi);
  } else {
    if ((fp8x4_specials<kE5m2>(lo) | fp8x4_specials<kE5m2>(hi)) != 0u) return widen_fp8x8<T, kE5m2>(lo, hi);
    return make_uint4(fp8x2_to_bf16x2_placed<kE5m2, 0x1404u>(lo), fp8x2_to_bf16x2_placed<kE5m2, 0x3424u>(lo),
                      fp8x2_to_bf16x2_placed<kE5m2, 0x1404u>(hi), fp8x2_to_bf16x2_placed<kE5m2, 0x3424u>(hi));
  }
}

// One block: the bytes at shared address `bytes` (kBlockN rows of 128 bytes, 128-byte swizzled
// as TMA landed them: piece p of row r at p ^ r % 8) into the 16-bit tile at `tile` in the
// consumers' layout: K [chunk][row][128 B], paged V [box][chunk][kBoxRows rows][128 B]
// (prefill_sm90.cuh), both swizzled the same way. A thread widens 8 bytes at a time: 16 threads
// read one row's 128 bytes, 8 write one line of a chunk, so neither access meets a bank conflict.
// Shared-window addresses: through generic pointers the accesses compile to 64-bit LD.E / ST.E.
template <class C, bool kIsV>
__device__ __forceinline__ void prefill_sm90_widen_block(unsigned bytes, unsigned tile, unsigned t) {
  static_assert(C::kHeadDim == 128, "a token's bytes are one 128-byte row");
  constexpr unsigned kPieces = C::kHeadDim / 8;
  constexpr unsigned kRowStep = kPrefillSm90Wideners / kPieces;
  constexpr unsigned kBoxRows = C::kBoxRows;
  static_assert(kPrefillSm90Wideners % kPieces == 0, "a thread keeps its piece of every row it widens");
  const unsigned piece = t % kPieces;
  const unsigned chunk = piece / 8;
  // The piece's place in a line of K, or of paged V's box.
  const unsigned chunk_offset = kIsV ? chunk * kBoxRows * 128 : chunk * C::kBlockN * 128;
#pragma unroll 2
  for (unsigned row = t / kPieces; row < C::kBlockN; row += kRowStep) {
    const unsigned swizzle = row % 8;
    const uint2 in = sm90::ld_shared_v2(bytes + row * 128 + (((piece / 2) ^ swizzle) << 4) + (piece % 2) * 8);
    const unsigned line =
        kIsV ? (row / kBoxRows) * C::kChunks * kBoxRows * 128 + (row % kBoxRows) * 128 : row * 128;
    sm90::st_shared_v4(tile + chunk_offset + line + (((piece % 8) ^ swizzle) << 4),
                       prefill_sm90_widen8<typename C::T, C::kE5m2>(in.x, in.y));
  }
}

// Ring step `step` of K or V: waits for its bytes and for the consumers to have left the 16-bit
// stage, widens, then frees the byte stage and fills the 16-bit one. The fence makes the generic
// proxy's stores visible to the wgmmas (the async proxy) that the full barrier releases.
template <class C, bool kIsV>
__device__ __forceinline__ void prefill_sm90_widen_step(const PrefillSm90Smem<C>& sm, int step, int t) {
  using namespace sm90;
  const int s = step % C::kStages;
  const unsigned parity = (step / C::kStages) & 1;
  mbar_wait(&(kIsV ? sm.v8_full : sm.k8_full)[s], parity);
  mbar_wait(&(kIsV ? sm.v_empty : sm.k_empty)[s], parity ^ 1);
  prefill_sm90_widen_block<C, kIsV>(shared_address(kIsV ? sm.v8 : sm.k8) + s * C::kKv8Bytes,
                                    shared_address(kIsV ? sm.v : sm.k) + s * C::Shape::kKvBytes, t);
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

}  // namespace astrai
