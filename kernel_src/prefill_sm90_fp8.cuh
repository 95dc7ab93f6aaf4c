// The Hopper prefill's FP8 attention (prefill_sm90.cuh, kFeatureQkvE4m3): Q, K and V in e4m3,
// both GEMMs on e4m3 wgmma (k32 a step), P quantized to e4m3 for the second one. (With
// kFeatureQkvP16, P stays in f16 and V is widened to f16 instead, as an FP8 cache's is:
// prefill_sm90_widen.cuh; nothing below serves that variant but the first GEMM.)
//   S = Q K^T: the Q and K tiles are TMA's bytes, K-major and 128-byte swizzled, one 128-byte
//     chunk a row at hd128, two at hd256: the same bytes a 16-bit tile of half the head dim has,
//     so the descriptors walk them as the 16-bit GEMM does, 32 bytes a step.
//   O += P V: FP8 wgmma takes B K-major only, so V (its rows are tokens) is transposed: warps
//     1-3 of the producer warpgroup turn each V block TMA landed in the byte ring into V^T (a
//     128-byte row of tokens for each of the head dim's columns) in the V stage.
//   P stays in the registers the S accumulator left it in. The accumulator's columns of a
//     thread (2q, 2q+1, 8+2q, 9+2q of each 16, q = lane % 4) are not the A fragment's (4q..4q+3),
//     so instead of moving P between lanes the transposition permutes V's tokens the same way:
//     A slot 4q + b of each 16 holds P column sigma(4q + b) = {2q, 2q+1, 8+2q, 9+2q}[b], and
//     V^T's column 4q + b of each 16 holds token sigma(4q + b). The sum over tokens is the same.
// The scales stay out of the tiles: q's and k's multiply the scores, v's the output.
#pragma once

#include "prefill_sm90_fp8_layout.h"
#include "prefill_sm90_tile.cuh"
#include "prefill_sm90_widen.cuh"

namespace astrai {

// One V block: the bytes at shared address `bytes` (kBlockN token rows of kHeadDim bytes) into
// V^T at `tile` (kHeadDim rows of kBlockN token bytes), tokens permuted as the header says; with
// kCheck, tokens from `valid` on become zeros (a page's rows past the KV's end hold anything, even
// NaN, and 0 * NaN is NaN in P V). Each lane of the 3 transposing warps takes a task a round
// (Fp8TransposeTask, prefill_sm90_fp8_layout.h): 8 four-byte loads, byte transposes, 4 eight-byte
// stores. A load's 32 lanes read one bank each, and a store's 16-lane phase writes 16 different
// 8-byte places of their rows' swizzle (z ^ row % 8 differs over 8 lanes, h over the other 8), so
// neither meets a bank conflict. (Lanes on one column and consecutive slots wrote 2 pieces: 16-way
// conflicts that held the kernel below the bf16 one's rate. Addresses computed whole for each
// access, with a check of each token, took a third of the kernel's issued instructions.)
// At hd256 each of the head dim's two 128-byte chunks is such a block: the bytes' chunk c (TMA
// lands a block chunk by chunk, kBlockN rows each) becomes V^T's rows 128c .. 128c + 127. At hd64
// V's rows are 64 bytes, 64-byte swizzled, and V^T has 64 rows (Fp8TransposeTask64).
template <class C, bool kCheck>
__device__ __forceinline__ void prefill_sm90_transpose_block(unsigned bytes, unsigned tile, unsigned t,
                                                             unsigned valid) {
  static_assert(C::kBlockN == 128, "V^T rows of one 128-byte swizzle row");
  static_assert(kPrefillSm90Wideners % 32 == 0, "whole warps, each lane on its column in every round");
  using Task = typename Select<C::kByteRow == 64, Fp8TransposeTask64, Fp8TransposeTask>::type;
  constexpr unsigned kChunkRounds = Task::kRounds;  // a round: 32 tasks of 8 tokens and 4 columns
  constexpr unsigned kRounds = C::kByteChunks * kChunkRounds;
  const unsigned lane = t % 32;
  for (unsigned round = t / 32; round < kRounds; round += kPrefillSm90Wideners / 32) {
    const unsigned chunk = round / kChunkRounds;
    const unsigned from = bytes + chunk * C::kBlockN * 128, to = tile + chunk * 128 * 128;
    const Task task(lane, round % kChunkRounds);
    unsigned x[2][4];
#pragma unroll
    for (unsigned u = 0; u < 4; ++u)
#pragma unroll
      for (unsigned e = 0; e < 2; ++e) {
        unsigned& word = x[u / 2][u % 2 + 2 * e];
        const unsigned at = from + task.load_offset(u, e);
        if constexpr (kCheck)
          word = task.token(u, e) < valid ? sm90::ld_shared_u32(at) : 0u;
        else
          word = sm90::ld_shared_u32(at);
      }
    unsigned out[4][2];  // [column j][qq]: V^T row 4c + j, slots 16z + 8h + 4qq .. + 3
#pragma unroll
    for (unsigned qq = 0; qq < 2; ++qq) {
      // Byte j of each of the four tokens, in token order: the 4 x 4 byte block transposed.
      const unsigned* v = x[qq];
      const unsigned lo01 = __byte_perm(v[0], v[1], 0x5140), lo23 = __byte_perm(v[2], v[3], 0x5140);
      const unsigned hi01 = __byte_perm(v[0], v[1], 0x7362), hi23 = __byte_perm(v[2], v[3], 0x7362);
      out[0][qq] = __byte_perm(lo01, lo23, 0x5410);
      out[1][qq] = __byte_perm(lo01, lo23, 0x7632);
      out[2][qq] = __byte_perm(hi01, hi23, 0x5410);
      out[3][qq] = __byte_perm(hi01, hi23, 0x7632);
    }
#pragma unroll
    for (unsigned j = 0; j < 4; ++j)
      sm90::st_shared_v2(to + task.store_offset(j), make_uint2(out[j][0], out[j][1]));
  }
}

// V's ring step `step`: waits for its bytes and for the consumers to have left the V stage,
// transposes (`valid` tokens of KV), frees the byte stage and fills the V stage (the fence hands
// the generic proxy's stores to the wgmmas).
template <class C>
__device__ __forceinline__ void prefill_sm90_transpose_step(const PrefillSm90Smem<C>& sm, int step, int t,
                                                            unsigned valid) {
  using namespace sm90;
  const int s = step % C::kStages;
  const unsigned parity = (step / C::kStages) & 1;
  mbar_wait(&sm.v8_full[s], parity);
  mbar_wait(&sm.v_empty[s], parity ^ 1);
  const unsigned from = shared_address(sm.v8) + s * C::kV8StageBytes;
  const unsigned to = shared_address(sm.v) + s * C::kVStageBytes;
  if (valid < C::kBlockN)  // a page's tail: the walk's first block only
    prefill_sm90_transpose_block<C, true>(from, to, t, valid);
  else
    prefill_sm90_transpose_block<C, false>(from, to, t, valid);
  fence_proxy_async_shared();
  mbar_arrive(&sm.v8_empty[s]);
  mbar_arrive(&sm.v_full[s]);
}

// The V blocks of tile `w`'s walk (first ring step g), in the producer's order. The first holds
// the end of the KV: paged, the rest of its last page comes with it, which the transposition
// clears (contiguous KV: TMA's zeros past the sequence).
template <class C>
__device__ __forceinline__ void prefill_sm90_transpose_walk(const PrefillSm90Smem<C>& sm, const PrefillSm90Walk& w,
                                                            int g, int t) {
  const int tail = w.r.kv_len - (w.n_blocks - 1) * C::kBlockN;
  const unsigned first_valid = C::Kv::kPaged && tail < C::kBlockN ? static_cast<unsigned>(tail) : C::kBlockN;
  for (int it = 0; it < w.block_count; ++it)
    prefill_sm90_transpose_step<C>(sm, g + it, t, it == 0 ? first_valid : C::kBlockN);
}

// Four values as e4m3 bytes, the first in the lowest (saturated to +-448; NaN kept).
__device__ __forceinline__ unsigned pack_e4m3x4(float v0, float v1, float v2, float v3) {
  unsigned short lo, hi;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(lo) : "f"(v1), "f"(v0));
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(hi) : "f"(v3), "f"(v2));
  return static_cast<unsigned>(lo) | (static_cast<unsigned>(hi) << 16);
}

// P of a block (the S accumulator s, kBlockN / 2 registers) as the A fragments of the P V
// GEMM's kBlockN / 32 steps, in the accumulator's own column order (the header's sigma).
template <int kBlockN>
__device__ __forceinline__ void prefill_sm90_pack_p_e4m3(const float (&s)[kBlockN / 2], unsigned (&pa)[kBlockN / 16][4]) {
#pragma unroll
  for (int kc = 0; kc < kBlockN / 32; ++kc) {
    const float* v = s + 16 * kc;
    pa[kc][0] = pack_e4m3x4(v[0], v[1], v[4], v[5]);
    pa[kc][1] = pack_e4m3x4(v[2], v[3], v[6], v[7]);
    pa[kc][2] = pack_e4m3x4(v[8], v[9], v[12], v[13]);
    pa[kc][3] = pack_e4m3x4(v[10], v[11], v[14], v[15]);
  }
}

}  // namespace astrai
