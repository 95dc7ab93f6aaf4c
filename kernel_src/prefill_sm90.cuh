// Prefill attention on Hopper (sm_90a): TMA loads into an mbarrier ring, wgmma for S = Q K^T and
// O += P V, a producer warpgroup and two consumer warpgroups (three at hd64, and in hd128's wide
// tiling). Computes what prefill.cuh's kernel computes (same PrefillParams, same row limits, zeros
// and LSE -inf for empty rows) without a mask, for contiguous KV (kPageSize 0) and paged KV with
// pages of 8 tokens or more; head dims that are multiples of 64.
//
// Grid: (ceil(q_len / kBlockM), n_heads, batch), in prefill.cuh's tile order; with packed GQA
// (hopper_params.h) (ceil(q_len x pack / kBlockM), n_heads / pack, batch); persistent variants
// (kPersistent, below) a CTA an SM walking that grid's tiles. 128 threads a warpgroup.
// Warpgroup 0 (prefill_sm90_producer_regs registers) has one thread issue TMA loads: Q once (before
// the CTA's first barrier, with the first K block when KV is contiguous), then K and V blocks of
// kBlockN tokens from the last block the tile can see down to the first (blocks crossing the causal
// diagonal or the end of the KV come first, so they alone are masked), V one block behind K, each
// into a two-stage ring whose full/empty mbarriers pace producer and consumers. The kConsumers
// warpgroups after it (2 or 3, hopper_params.h) own 64 query rows each (those whose rows all lie
// past the request's end leave at once). Per block: S = Q K^T is issued, then O += P V for the
// previous block, waited for after the softmax of S (sm90::pin_wait_after keeps ptxas from moving
// the wait up; not at hd64, where waiting early is faster); the softmax also hides behind the other
// consumers' GEMMs: they take turns issuing (round robin). The walk's first block (the KV's end, or
// the causal diagonal) is cut to the columns the tile's rows see, in steps of 64. O leaves through
// the consumer's rows of the Q tile, as 16-byte pieces of whole rows.
// kConsumersArg and kBlockNArg override the tiling (hopper_params.h) for tuning.
// Tiles in shared memory use the 128-byte swizzle (hopper_ptx.cuh). Rows and KV positions past
// the tensor arrive as zeros (TMA fill), so they cannot produce NaN.
#pragma once

// Roles: prefill_sm90_tile.cuh (configuration, shared memory, tile scheduler),
// prefill_sm90_producer.cuh (TMA loads), prefill_sm90_consumer.cuh (wgmma GEMMs and the walk),
// prefill_sm90_softmax.cuh (masks, online softmax), prefill_sm90_epilogue.cuh (O and LSE).
#include "prefill_sm90_consumer.cuh"
#include "prefill_sm90_epilogue.cuh"
#include "prefill_sm90_fp8.cuh"
#include "prefill_sm90_producer.cuh"
#include "prefill_sm90_tile.cuh"
#include "prefill_sm90_widen.cuh"

namespace astrai {

// A consumer warpgroup's tile `w`, whose Q is in slot `slot` (its barrier's phase `q_parity`) and
// whose walk's first block takes ring step g: its rows' limits and registers, the walk over the KV
// blocks (per block: S = Q K^T is issued, then O += P V for the previous block, waited for after
// the softmax of S; the softmax also hides behind the other consumers' GEMMs), then the epilogue.
// The roles' functions reach this function's locals through `c`.
template <class C>
__device__ __forceinline__ void prefill_sm90_consume(const PrefillParams& p, const PrefillSm90Smem<C>& sm,
                                                     const PrefillSm90Walk& w, const int& warpgroup, int g, int slot,
                                                     unsigned q_parity) {
  using Role = PrefillSm90Consumer<C>;
  constexpr int kBlockN = C::kBlockN;
  const PrefillTile& cta = w.cta;
  const int batch_index = cta.batch_index;
  const PrefillRequest& r = w.r;
  const int rows = w.rows;
  const int m0 = cta.start;
  const int last_position = w.last_position;
  const int n_blocks = w.n_blocks;
  const int mask_from = w.mask_from;
  const int block_count = w.block_count;
  const int window_mask_until = w.window_mask_until;
  const int active = w.active;
  const int first_stage = g % C::kStages;
  unsigned char* const q_tile = sm.q + slot * C::kQSlotBytes;
  const int consumer = warpgroup - 1;
  const bool alone = active == 1;
  const int t = threadIdx.x % 128;
  const int lane = t % 32;
  const int row0 = m0 + 64 * consumer + 16 * (t / 32) + lane / 4;  // and row0 + 8
  const int stop[2] = {prefill_row_stop(r, Role::row_position(row0)),
                       prefill_row_stop(r, Role::row_position(row0 + 8))};
  int first_key[2] = {0, 0};
  if (C::kWindow)
    for (int h = 0; h < 2; ++h)
      first_key[h] =
          window_first_key(static_cast<long long>(r.causal_base) + Role::row_position(row0 + 8 * h), p.features);
  // Scores arrive raw; with a soft-cap they leave the cap already in log2 units. An FP8 cache's
  // raw dots take its K scale and, with a bf16 Q scaled into f16's range, each row's factor
  // (prefill_sm90_widen_q): before a soft-cap (dot_scale), else with the softmax scale.
  const float k_scale =
      C::kKv8 ? kv_scale(p.features.k_scale, p.features.kv_scale_stride, cta.head / (C::kGroup / C::kPackHeads)) : 1.f;
  float dot_scale[2] = {k_scale, k_scale};
  float score_scale[2];
  score_scale[0] = score_scale[1] = C::kCap ? 1.f : C::kKv8 ? p.scale_log2 * k_scale : p.scale_log2;
  if constexpr (C::kQkv8) {  // the dots are of q's and k's bytes: both scales, q's by the row's head
    const float qk_scale = p.scale_log2 * kv_scale(p.features.k_scale, p.features.kv_scale_stride,
                                                   cta.head / (C::kGroup / C::kPackHeads));
    for (int h = 0; h < 2; ++h)
      score_scale[h] = qk_scale * kv_scale(p.q_scale, p.q_scale_stride,
                                           cta.head * C::kPackHeads + (row0 + 8 * h) % C::kPackHeads);
  }

  float o[C::kHeadDim / 2];
  float s[kBlockN / 2];
  unsigned pa[kBlockN / 16][4];
  float row_max[2] = {negative_infinity(), negative_infinity()};
  float row_sum[2] = {0.f, 0.f};
#pragma unroll
  for (int i = 0; i < C::kHeadDim / 2; ++i) o[i] = 0.f;
  const int first_width =
      Role::kCutFirst ? min(kBlockN, (prefill_row_stop(r, last_position) - (n_blocks - 1) * kBlockN + 63) / 64 * 64)
                      : kBlockN;
  const unsigned q_base = shared_address(q_tile) + consumer * 64 * C::kQRowBytes;
  Role c{
      p,      sm,        cta,         batch_index, r,      rows,     m0,      n_blocks, mask_from,   window_mask_until,
      active, g,         slot,        first_stage, q_tile, consumer, alone,   t,        lane,        row0,
      stop,   first_key, score_scale, o,           s,      pa,       row_max, row_sum,  first_width, q_base,
      dot_scale};
  const unsigned pin_word = shared_address(sm.warp_words + threadIdx.x / 32);
  if (block_count > 0) {
    float correction[2];
    if (consumer == active - 1) c.pass_turn();
    ASTRAI_PREFILL_STAMP(threadIdx.x == 128, 10);  // consumer 0 is ready to wait for Q and K
    sm90::mbar_wait(&sm.q_full[slot], q_parity);
    if constexpr (C::kKv8 && !C::kFp16) {
      float factor[2];
      prefill_sm90_widen_q<C>(q_base, consumer, t, factor);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        dot_scale[h] *= factor[h];
        if (!C::kCap) score_scale[h] *= factor[h];
      }
    }
    ASTRAI_PREFILL_STAMP(threadIdx.x == 128, 11);  // Q arrived
    sm90::mbar_wait(&sm.k_full[first_stage], (g / C::kStages) & 1);
    ASTRAI_PREFILL_STAMP(threadIdx.x == 128, 1);  // Q and the first K block have arrived
    c.await_turn();
    c.issue_first_qk();
    c.pass_turn();
    sm90::wgmma_wait<0>();
    sm90::reg_fence(s);
    sm90::mbar_arrive(&sm.k_empty[first_stage]);
    c.softmax((n_blocks - 1) * kBlockN, correction);
    c.pack_p();
    ASTRAI_PREFILL_STAMP(threadIdx.x == 128, 2);  // the first block's softmax is done
    if (block_count > 1) {
      sm90::mbar_wait(&sm.v_full[first_stage], (g / C::kStages) & 1);
      c.clear_v_tail();
    }
    // The loop's step has no branch between its GEMMs (one there cost 1-7%): a cut first block
    // gets its own copy of the step.
    int it = 1;
    if (block_count > 1 && first_width < kBlockN) c.template step<true>(it++, correction, pin_word);
    for (; it < block_count; ++it) c.template step<false>(it, correction, pin_word);
    const int vs = (g + block_count - 1) % C::kStages;
    sm90::mbar_wait(&sm.v_full[vs], ((g + block_count - 1) / C::kStages) & 1);
    if (block_count == 1) c.clear_v_tail();
    c.await_turn();
    if (block_count == 1) {
      c.issue_first_pv(vs);
    } else {
      c.template issue_pv_steps<0, kBlockN / 16>(vs);
    }
    // Every wait on a turn barrier meets one arrival: the last active consumer's opening arrival
    // stands in for its last one.
    if (consumer != active - 1) c.pass_turn();
    sm90::wgmma_wait<0>();
    sm90::reg_fence(o);
    sm90::mbar_arrive(&sm.v_empty[vs]);
    ASTRAI_PREFILL_STAMP(threadIdx.x == 128, 3);  // the last P V is done
  } else if constexpr (C::kPersistent) {
    // Nothing to walk, but the producer's plain arrival is still waited for: consumers that
    // skipped it could finish two empty tiles of a slot before the producer's wait on q_empty,
    // completing two of its phases so that the parity wait never returns (a hang), and could
    // pass a later tile's q_full wait on the skipped phase's parity before its Q has landed.
    sm90::mbar_wait(&sm.q_full[slot], q_parity);
  }
  prefill_sm90_epilogue(c);
}

// Tensor maps (128-byte swizzle, boxes 64 elements wide):
//   map_q: contiguous {head_dim, q_len, n_heads, batch}, paged {head_dim, total_q, n_heads, 1};
//          box {64, kBlockM, 1, 1}. Packed GQA: {head_dim, n_heads, q_len or total_q, batch or 1},
//          box {64, pack, kBlockM / pack, 1}.
//   map_k, map_v: contiguous {head_dim, kv_len, n_kv_heads, batch}, box {64, kBlockN, 1, 1}.
//   map_k paged: {head_dim, n_kv_heads, page_size, num_pages}, box {64, 1, R, 1}, R = min(page_size, 16).
//   map_v paged: {64, page_size, head_dim / 64, n_kv_heads, num_pages} (the third dim steps 64
//          columns), box {64, R, head_dim / 64, 1, 1}: one box brings R whole rows.
// Shared-memory tiles: Q and K [chunk][row][128 B]; V contiguous the same, V paged [box][chunk]
// [R rows][128 B] (half the boxes of K at hd128; P V's descriptors step through either).
// kPersistent (contiguous KV, three consumers, no features): the launch holds a CTA an SM or
// fewer, and each CTA walks tiles of p.tile_order's grid (prefill_sm90_persistent_tile). Q has
// two slots, so that the next tile's Q and first K blocks load while this tile's last blocks and
// stores run: short causal prompts (16 requests of 1024 tokens) spent 17-18% of their cycles
// waiting for a tile's first loads.
template <typename T, int kHeadDim, int kPageSize, int kGroup, int kConsumersArg = prefill_sm90_consumers(kHeadDim),
          int kBlockNArg = prefill_sm90_block_n(kHeadDim, kConsumersArg), int kFlags = 0, bool kPersistent = false>
__global__ void __launch_bounds__(prefill_sm90_threads(kConsumersArg), 1)
    prefill_sm90_kernel(const __grid_constant__ PrefillParams p, const __grid_constant__ sm90::TmaMap map_q,
                        const __grid_constant__ sm90::TmaMap map_k, const __grid_constant__ sm90::TmaMap map_v) {
  using namespace sm90;
  using C = PrefillSm90Config<T, kHeadDim, kPageSize, kGroup, kConsumersArg, kBlockNArg, kFlags, kPersistent>;
  ASTRAI_PREFILL_CLOCK(trace_start);  // the CTA starts (stored by thread 0 once Q is issued)
  // The maps' descriptors are fetched first: every load of the tile waits for them.
  if (threadIdx.x == 0) {
    tma_prefetch_map(&map_q);
    tma_prefetch_map(&map_k);
    tma_prefetch_map(&map_v);
  }
  // Shared memory as prefill_sm90_smem_bytes (hopper_params.h) counts it: kQSlots Q tiles, the K
  // and V rings, their mbarriers, from the first 1024-byte boundary (the swizzle atom).
  extern __shared__ unsigned char smem_raw[];
  unsigned char* const smem_q = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<unsigned long long>(smem_raw) + 1023) & ~1023ull);  // kQSlots tiles
  unsigned char* const smem_k = smem_q + C::kQSlots * C::kQSlotBytes;
  unsigned char* const smem_v = smem_k + C::kStages * C::kKStageBytes;
  // An FP8 cache's byte rings, and FP8 attention's V one (prefill_sm90_rings; none else).
  unsigned char* const smem_k8 = smem_v + C::kStages * C::kVStageBytes;
  unsigned char* const smem_v8 = smem_k8 + C::kStages * C::kK8StageBytes;
  u64* const q_full = reinterpret_cast<u64*>(smem_v8 + C::kStages * C::kV8StageBytes);  // one a Q slot
  u64* const k_full = q_full + C::kQSlots;
  u64* const k_empty = k_full + C::kStages;
  u64* const v_full = k_empty + C::kStages;
  u64* const v_empty = v_full + C::kStages;
  unsigned* const warp_words = reinterpret_cast<unsigned*>(v_empty + C::kStages);
  u64* const q_empty = reinterpret_cast<u64*>(warp_words + C::kThreads / 32);
  u64* const k8_full = q_empty + (kPersistent ? C::kQSlots : 0);  // an FP8 cache's byte rings'
  u64* const k8_empty = k8_full + C::kStages;
  u64* const v8_full = k8_empty + C::kStages;
  u64* const v8_empty = v8_full + C::kStages;
  const PrefillSm90Smem<C> sm{smem_q,     smem_k,  smem_v,  q_full,   k_full,  k_empty, v_full, v_empty,
                              warp_words, q_empty, smem_k8, smem_v8, k8_full, k8_empty, v8_full, v8_empty};
  const unsigned persistent_tiles = prefill_sm90_persistent_tiles(p);
  // The CTA's tile (persistent: its first; the walks recompute it, not to hold it in registers).
  const PrefillSm90Walk first =
      prefill_sm90_walk<C>(p, kPersistent ? prefill_tile_at<C::kBlockM>(p, blockIdx.x) : prefill_tile<C::kBlockM>(p));
  if (!kPersistent && first.cta.start >= first.rows) return;

  if (threadIdx.x == 0) {
    ASTRAI_PREFILL_CLOCK(trace_placed);
    for (int q = 0; q < C::kQSlots; ++q) {
      mbar_init(&sm.q_full[q], 1);
      if constexpr (kPersistent) mbar_init(&sm.q_empty[q], 128 * C::kConsumers);
    }
    for (int s = 0; s < C::kStages; ++s) {
      // TMA fills a 16-bit stage (one arrival with its bytes), or with an FP8 cache the wideners.
      // (FP8 attention: TMA fills K's, the transposition V's.)
      mbar_init(&sm.k_full[s], C::kKv8 ? kPrefillSm90Wideners : 1);
      mbar_init(&sm.v_full[s], C::kByteRings ? kPrefillSm90Wideners : 1);
      mbar_init(&sm.k_empty[s], 128 * first.active);
      mbar_init(&sm.v_empty[s], 128 * first.active);
      if constexpr (C::kByteRings) {
        mbar_init(&sm.k8_full[s], 1);
        mbar_init(&sm.v8_full[s], 1);
        mbar_init(&sm.k8_empty[s], kPrefillSm90Wideners);
        mbar_init(&sm.v8_empty[s], kPrefillSm90Wideners);
      }
    }
    fence_mbar_init();
    ASTRAI_PREFILL_CLOCK(trace_barriers);
    // Q is issued by the thread that initialized its barrier, before the CTA's barrier and the
    // register hand-over: its latency is most of a short tile's start (18% of the cycles of 16
    // causal requests of 1024 tokens). Persistent CTAs issue theirs in the producer's walk.
    if (!kPersistent && first.block_count > 0) {
      prefill_sm90_issue_q<C>(sm, &map_q, first, 0);
      ASTRAI_PREFILL_STAMP(true, 8);  // Q issued
      // Contiguous KV: the walk's first K block too (prefill_sm90_kv.cuh).
      if constexpr (PrefillSm90Kv<C>::kFirstKWithQ) {
        PrefillSm90Kv<C>::issue_first_k(smem_k, &map_k, &k_full[0], first);
        ASTRAI_PREFILL_STAMP(true, 9);  // the first K block issued
      }
    }
    ASTRAI_PREFILL_STAMP_AT(true, 0, trace_start);
    ASTRAI_PREFILL_STAMP_AT(true, 12, trace_placed);
    ASTRAI_PREFILL_STAMP_AT(true, 13, trace_barriers);
  }
  __syncthreads();

  const int warpgroup = threadIdx.x / 128;
  if (warpgroup == 0) {
    setmaxnreg_dec<C::kProducerRegs>();
    // Warp 0 streams K and V (a CTA-a-tile kernel: its one tile's; persistent: tile after tile),
    // and in persistent CTAs warp 1 loads Q: tile k's into slot k % 2 as soon as the consumers'
    // stores of tile k - 2 have left it, early in tile k - 1's walk. With an FP8 cache warps 1..3
    // widen the blocks warp 0 brings.
    const int lane = threadIdx.x;
    if constexpr (C::kKv8) {
      if (threadIdx.x >= 32) {
        if (first.block_count > 0) prefill_sm90_widen_walk<C>(sm, first, 0, threadIdx.x - 32);
        return;
      }
    } else if constexpr (C::kP16) {
      if (threadIdx.x >= 32) {
        if (first.block_count > 0) prefill_sm90_widen_v_walk<C>(sm, first, 0, threadIdx.x - 32);
        return;
      }
    } else if constexpr (C::kQkv8) {
      if (threadIdx.x >= 32) {
        if (first.block_count > 0) prefill_sm90_transpose_walk<C>(sm, first, 0, threadIdx.x - 32);
        return;
      }
    }
    if (threadIdx.x >= (kPersistent ? 64 : 32)) return;
    if constexpr (!kPersistent) {
      if (first.block_count > 0) prefill_sm90_produce_walk<C>(p, sm, &map_k, &map_v, lane, first, 0);
    } else if (threadIdx.x == 32) {
      for (int k = 0; prefill_sm90_persistent_tile(k) < persistent_tiles; ++k) {
        const int slot = k % 2;
        mbar_wait(&sm.q_empty[slot], ((k / 2) & 1) ^ 1);
        const PrefillSm90Walk w =
            prefill_sm90_walk<C>(p, prefill_tile_at<C::kBlockM>(p, prefill_sm90_persistent_tile(k)));
        if (w.block_count > 0)
          prefill_sm90_issue_q<C>(sm, &map_q, w, slot);
        else
          mbar_arrive(&sm.q_full[slot]);  // nothing to walk: the consumers only store
      }
    } else if (lane == 0) {
      int g = 0;
      for (int k = 0; prefill_sm90_persistent_tile(k) < persistent_tiles; ++k) {
        const PrefillSm90Walk w =
            prefill_sm90_walk<C>(p, prefill_tile_at<C::kBlockM>(p, prefill_sm90_persistent_tile(k)));
        if (w.block_count > 0) prefill_sm90_produce_walk<C>(p, sm, &map_k, &map_v, lane, w, g);
        g += w.block_count;
      }
    }
    return;
  }

  if (!kPersistent && warpgroup > first.active) return;
  setmaxnreg_inc<C::kConsumerRegs>();
  if constexpr (!kPersistent) {
    prefill_sm90_consume<C>(p, sm, first, warpgroup, 0, 0, 0);
  } else {
    int g = 0;
    for (int k = 0; prefill_sm90_persistent_tile(k) < persistent_tiles; ++k) {
      const PrefillSm90Walk w =
          prefill_sm90_walk<C>(p, prefill_tile_at<C::kBlockM>(p, prefill_sm90_persistent_tile(k)));
      prefill_sm90_consume<C>(p, sm, w, warpgroup, g, k % 2, (k / 2) & 1);
      g += w.block_count;
    }
  }
}

}  // namespace astrai
