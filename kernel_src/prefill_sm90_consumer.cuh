// The Hopper prefill's consumers (prefill_sm90.cuh): a warpgroup's 64 rows of a tile, its GEMMs
// on wgmma (S = Q K^T from shared memory, O += P V with P from registers) and the walk over the
// KV blocks the producer brings, with the online softmax in between (prefill_sm90_softmax.cuh).
#pragma once

#include "prefill_sm90_fp8.cuh"
#include "prefill_sm90_kv.cuh"
#include "prefill_sm90_softmax.cuh"
#include "prefill_sm90_tile.cuh"

namespace astrai {

// What a consumer warpgroup's functions share while it computes a tile: its GEMMs, the turns it
// takes with the other consumers, the softmax and the V tail's clearing, and the step of its walk.
// prefill_sm90_consume (prefill_sm90.cuh) owns the state; the members are references to it, as
// the kernel's lambdas held them before (the same function boundaries and the same by-reference
// state keep the compiled instructions those of the single-function kernel).
template <class C>
struct PrefillSm90Consumer {
  using T = typename C::T;
  static constexpr int kHeadDim = C::kHeadDim;
  static constexpr int kBlockN = C::kBlockN;
  static constexpr int kChunks = C::kChunks;
  static constexpr int kPackHeads = C::kPackHeads;
  // The walk's first block holds the last column the tile's last row sees; every column after it
  // is masked for every row, so that block's GEMMs stop at the next multiple of 64 (a 4096-token
  // KV in 192-token blocks would otherwise spend 3% of its MMAs on a block two-thirds empty). The
  // width is the tile's, not each consumer's: all consumers then run the same step (a width per
  // consumer was slower, and synccheck flagged a barrier it split). Both GEMMs of that block go in
  // 64-column pieces, each its own group, so one copy of the step serves every width (a copy per
  // width cost NVRTC 0.3 s at hd128; a branch in the loop's step instead cost 1-7%). 80-token
  // blocks (hd256, the wide hd128 tiles) cut their P V to 64 or keep all 80: left whole, they ran
  // 3-5% slower. The soft-cap's variants keep whole blocks (they spilled with the cut), and so do
  // persistent CTAs (the tile loop's state and the cut spilled S at hd64).
  static constexpr bool kCutFirst = !C::kCap && !C::kPersistent && !C::kQkv8;
  // Lazy rescaling (prefill_sm90_online_softmax) at head dims of 128 and more.
  static constexpr bool kLazyRescale = kHeadDim >= 128;
  // The previous block's P V is waited for after the softmax, so that the exp2s overlap it; pinned
  // there, as ptxas would move the wait above them. On the H200: hd128 -1.2% to +1.9% by shape
  // (gains on large grids), hd256 +5%; hd64 (three consumers, 128-token blocks) -3.9%, so hd64
  // waits early.
  static constexpr bool kPinPvWait = kHeadDim >= 128;

  // The tile's state: references to prefill_sm90_consume's locals.
  const PrefillParams& p;
  const PrefillSm90Smem<C>& sm;
  const PrefillTile& cta;
  const int& batch_index;
  const PrefillRequest& r;
  const int &rows, &m0, &n_blocks, &mask_from, &window_mask_until, &active;
  const int& g;
  const int& slot;
  const int& first_stage;  // the walk's first block's
  unsigned char* const& q_tile;
  const int& consumer;
  const bool& alone;
  const int& t;
  const int& lane;
  const int& row0;       // and row0 + 8
  const int (&stop)[2];  // one past the last key each row sees
  int (&first_key)[2];   // window: the first key each row sees
  const float (&score_scale)[2];  // one a row (an FP8 cache's bf16 Q rows differ), else both alike
  float (&o)[kHeadDim / 2];
  float (&s)[kBlockN / 2];
  unsigned (&pa)[kBlockN / 16][4];
  float (&row_max)[2];
  float (&row_sum)[2];
  const int& first_width;
  const unsigned& q_base;
  const float (&dot_scale)[2];  // an FP8 cache's K scale and row factors (1 else)

  // The query head of tile row `row` (the pack's first head cta.head x kPackHeads), and its
  // position.
  __device__ __forceinline__ int row_head(int row) const { return cta.head * kPackHeads + row % kPackHeads; }
  __device__ __forceinline__ static int row_position(int row) { return row / kPackHeads; }

  // Round robin: the active consumers take turns issuing their GEMMs (named barrier 1 + c is
  // consumer c's turn, 256 threads: it waits, its predecessor arrives), so that one's softmax runs
  // while the others' wgmmas keep the tensor cores busy. Consumer 0 goes first; one alone takes no
  // turns. Barrier kConsumers + 1 joins the active consumers.
  // FP8 attention takes none: its GEMMs take half the 16-bit ones' time, and a consumer waiting
  // for its turn waited longer than the order saved (on an H100, 2-4% faster without, every FP8
  // attention row but paged B8 x 512 after 7680, -0.5%).
  static constexpr bool kTakeTurns = !C::kQkv8;
  __device__ __forceinline__ void await_turn() const {
    if (kTakeTurns && !alone) sm90::named_bar_sync(1 + consumer, 256);
  }
  __device__ __forceinline__ void pass_turn() const {
    if (kTakeTurns && !alone) sm90::named_bar_arrive(consumer + 1 == active ? 1 : 2 + consumer, 256);
  }

  // S = Q K^T of the block in `stage`, columns kFirstCol .. + kWidth (registers kFirstCol / 2 ..
  // of s; the others keep what they held).
  template <int kWidth, int kFirstCol>
  __device__ __forceinline__ void issue_qk(int stage) {
    using namespace sm90;
    const unsigned k_base = shared_address(sm.k + stage * C::kKStageBytes) + kFirstCol * 128;
    reg_fence(s);
    wgmma_fence();
    if constexpr (C::kQkv8) {  // e4m3 bytes: 32 a step (prefill_sm90_fp8.cuh)
      static_assert(kWidth == 128 && kFirstCol == 0, "FP8 attention's blocks go whole");
      // Each k-step's descriptors built whole: stepping one by a 32-bit add (sm90::smem_desc_plus)
      // ran 1.7% slower on an H100 (causal B2 x 8192, twice).
      // k-step kk reads 32 bytes of chunk kk / kSteps (rows of kByteRow bytes).
      constexpr int kSteps = C::kByteRow / 32;
#pragma unroll
      for (int kk = 0; kk < kHeadDim / 32; ++kk) {
        const unsigned offset = (kk % kSteps) * 32;
        wgmma_ss_e4m3_n128(s, smem_desc_rows<C::kByteRow>(q_base + (kk / kSteps) * C::kBlockM * 128 + offset),
                           smem_desc_rows<C::kByteRow>(k_base + (kk / kSteps) * kBlockN * 128 + offset), kk > 0);
      }
      wgmma_commit();
      return;
    }
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      const unsigned offset = (kk % 4) * 32;
      wgmma_ss<kWidth, C::kMmaFp16, kFirstCol / 2>(s, smem_desc(q_base + (kk / 4) * C::kBlockM * 128 + offset, 16, 1024),
                                                smem_desc(k_base + (kk / 4) * kBlockN * 128 + offset, 16, 1024),
                                                kk > 0);
    }
    wgmma_commit();
  }
  template <int kPiece>
  __device__ __forceinline__ void issue_first_qk_piece() {
    if constexpr (kBlockN >= 64 * (kPiece + 1)) {
      if (kPiece * 64 < first_width) issue_qk<64, 64 * kPiece>(first_stage);
    }
  }
  // S of the walk's first block (stage 0) in 64-column pieces up to first_width (the mask
  // overwrites the registers left out). Each piece is its own fenced, committed group: no branch
  // between a fence and the wgmmas it covers (ptxas would serialize).
  __device__ __forceinline__ void issue_first_qk() {
    if constexpr (!kCutFirst || kBlockN % 64 != 0) {
      issue_qk<kBlockN, 0>(first_stage);
    } else {
      issue_first_qk_piece<0>();
      issue_first_qk_piece<1>();
      issue_first_qk_piece<2>();
      issue_first_qk_piece<3>();
    }
  }

  // P V of k-steps kFirstStep .. + kSteps (16 tokens each) of the block in `stage`: one group.
  template <int kFirstStep, int kSteps>
  __device__ __forceinline__ void issue_pv_steps(int stage) {
    using namespace sm90;
    const unsigned v_base = shared_address(sm.v + stage * C::kVStageBytes);
    reg_fence(o);
    reg_fence(pa);
    wgmma_fence();
    if constexpr (C::kVTransposed) {  // V^T in the stage, 32 tokens (two of these steps) a wgmma (prefill_sm90_fp8.cuh)
      static_assert(kFirstStep % 2 == 0 && kSteps % 2 == 0, "whole 32-token steps");
#pragma unroll
      for (int kk = kFirstStep / 2; kk < (kFirstStep + kSteps) / 2; ++kk)
        wgmma_rs_e4m3<kHeadDim>(o, pa[kk], smem_desc(v_base + kk * 32, 16, 1024), 1);
      wgmma_commit();
      return;
    }
    // k-step kk reads tokens 16kk.. of every chunk, where the layout put them (prefill_sm90_kv.cuh).
    using Kv = PrefillSm90Kv<C>;
#pragma unroll
    for (int kk = kFirstStep; kk < kFirstStep + kSteps; ++kk)
      wgmma_rs<kHeadDim, C::kMmaFp16>(
          o, pa[kk], smem_desc(v_base + kk * Kv::kVStepBytes, Kv::kVChunkStride, Kv::kVRowGroupStride), 1);
    wgmma_commit();
  }
  template <int kIndex>
  __device__ __forceinline__ void issue_first_pv_piece(int stage) {
    constexpr int kStep = 4 * kIndex;
    constexpr int kSteps = kBlockN / 16 - kStep < 4 ? kBlockN / 16 - kStep : 4;
    if constexpr (kSteps > 0) {
      if (kStep * 16 < first_width) issue_pv_steps<kStep, kSteps>(stage);
    }
  }
  // P V of the walk's first block in 64-token pieces up to first_width (P is 0 past it), each its
  // own group (a branch between groups, never inside one: ptxas would serialize).
  __device__ __forceinline__ void issue_first_pv(int stage) {
    issue_first_pv_piece<0>(stage);
    issue_first_pv_piece<1>(stage);
    issue_first_pv_piece<2>(stage);
    issue_first_pv_piece<3>(stage);
  }

  // Scores of the block starting at column `col0` to P, with the row statistics moved.
  __device__ __forceinline__ void softmax(int col0, float (&correction)[2]) {
    // A soft-cap takes the dots raw: an FP8 cache's K scale goes on first (else score_scale has it).
    if constexpr (C::kKv8 && C::kCap) {
#pragma unroll
      for (int i = 0; i < kBlockN / 2; ++i) s[i] *= dot_scale[(i >> 1) & 1];
    }
    prefill_sm90_mask_scores<kBlockN, C::kCap, C::kWindow>(s, col0, lane, stop, first_key, mask_from, window_mask_until,
                                                           p.features);
    if constexpr (C::kKv8 || C::kQkv8)
      prefill_sm90_online_softmax<kBlockN, kLazyRescale>(s, row_max, row_sum, score_scale, correction);
    else
      prefill_sm90_online_softmax<kBlockN, kLazyRescale>(s, row_max, row_sum, score_scale[0], correction);
  }

  // Paged KV: the block holding the end of the KV arrives with the rest of its last page, which
  // may hold anything (even NaN, and 0 * NaN is NaN in P V). Zero those V rows once (stage 0);
  // FP8 attention's transposition has cleared them (prefill_sm90_fp8.cuh), its widening not.
  __device__ __forceinline__ void clear_v_tail() {
    using Kv = PrefillSm90Kv<C>;
    const int first = r.kv_len - (n_blocks - 1) * kBlockN;  // the walk's first block is the last one
    if (!Kv::kVTailToClear || C::kVTransposed || first >= kBlockN) return;
    const int pieces = (kBlockN - first) * 8;  // 16-byte pieces per chunk
    for (int i = t + 128 * consumer; i < pieces * kChunks; i += 128 * active) {
      const int row = first + (i % pieces) / 8;
      const int chunk = i / pieces;
      *reinterpret_cast<uint4*>(sm.v + first_stage * C::kVStageBytes + Kv::v_offset(row, chunk) + (i % 8) * 16) =
          uint4{0u, 0u, 0u, 0u};
    }
    sm90::fence_proxy_async_shared();
    sm90::named_bar_sync(C::kConsumers + 1, 128 * active);
  }

  // P in the register layout of wgmma's A operand: k-step kk takes s[8kk .. 8kk + 7].
  __device__ __forceinline__ void pack_p() {
    if constexpr (C::kVTransposed) {
      prefill_sm90_pack_p_e4m3<kBlockN>(s, pa);
      return;
    }
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk)
#pragma unroll
      for (int q = 0; q < 4; ++q) pa[kk][q] = pack2<typename C::MmaT>(s[8 * kk + 2 * q], s[8 * kk + 2 * q + 1]);
  }

  // Step `it`: S of block it, P V of block it - 1. kFirstPv marks the step after a cut first
  // block: its P V goes in pieces ahead of S.
  template <bool kFirstPv>
  __device__ __forceinline__ void step(int it, float (&correction)[2], unsigned pin_word) {
    using namespace sm90;
    const int ks = (g + it) % C::kStages;
    const int vs = (g + it - 1) % C::kStages;
    mbar_wait(&sm.k_full[ks], ((g + it) / C::kStages) & 1);
    mbar_wait(&sm.v_full[vs], ((g + it - 1) / C::kStages) & 1);
    await_turn();
    if constexpr (kFirstPv) issue_first_pv(vs);
    issue_qk<kBlockN, 0>(ks);
    if constexpr (kFirstPv) {
      // An empty group (ptxas issues a null wgmma for it, fenced like any): the wait below then
      // covers S and the pieces alike.
      wgmma_fence();
      wgmma_commit();
    } else {
      issue_pv_steps<0, kBlockN / 16>(vs);
    }
    pass_turn();
    wgmma_wait<1>();  // S is ready; P V of the previous block still runs (a cut first block's is done)
    reg_fence(s);
    mbar_arrive(&sm.k_empty[ks]);
    softmax((n_blocks - 1 - it) * kBlockN, correction);
    if constexpr (kPinPvWait) pin_wait_after(pin_word, row_sum[0] + row_sum[1], lane == 0);
    wgmma_wait<0>();
    reg_fence(o);
    mbar_arrive(&sm.v_empty[vs]);
    if (!kLazyRescale || __any_sync(0xffffffffu, correction[0] != 1.f || correction[1] != 1.f)) {
#pragma unroll
      for (int i = 0; i < kHeadDim / 2; ++i) o[i] *= correction[(i >> 1) & 1];
    }
    pack_p();
  }
};

}  // namespace astrai
