// The Hopper prefill's producer (prefill_sm90.cuh): TMA loads of Q and of the K and V blocks of a
// tile's walk into the mbarrier rings the consumers drain.
#pragma once

#include "prefill_sm90_kv.cuh"

namespace astrai {

// Q of tile `w` into slot `slot`. Packed: the map is {head_dim, heads, positions, batch}, its box
// the pack's heads at kBlockM / kPackHeads positions, which lands as the tile's rows in packed
// order.
template <class C>
__device__ __forceinline__ void prefill_sm90_issue_q(const PrefillSm90Smem<C>& sm, const sm90::TmaMap* map_q,
                                                     const PrefillSm90Walk& w, int slot) {
  using namespace sm90;
  unsigned char* q = sm.q + slot * C::kQSlotBytes;
  const int batch = PrefillSm90Kv<C>::q_batch(w.cta.batch_index);
  mbar_arrive_expect_tx(&sm.q_full[slot], C::kQTxBytes);
#pragma unroll
  for (int c = 0; c < C::kQkChunks; ++c) {
    if constexpr (C::kPack)
      tma_load_4d(q + c * C::kBlockM * 128, map_q, &sm.q_full[slot], C::kQkChunkElems * c,
                  w.cta.head * C::kPackHeads, w.r.q_start + w.cta.start / C::kPackHeads, batch);
    else
      tma_load_4d(q + c * C::kBlockM * 128, map_q, &sm.q_full[slot], C::kQkChunkElems * c,
                  w.r.q_start + w.cta.start, w.cta.head, batch);
  }
}

// The K and V loads of one tile's walk (prefill_sm90_produce_walk, below, holds the walk's values;
// these are references to them); the layout's boxes (prefill_sm90_kv.cuh). Lane 0 issues every
// barrier operation.
template <class C>
struct PrefillSm90Producer {
  using Kv = PrefillSm90Kv<C>;
  const PrefillParams& p;
  const int& lane;
  const int& g;  // the ring step of the walk's first block
  const int& batch_index;
  const int& kv_head;
  const PrefillRequest& r;
  const int& n_blocks;
  const int* const& table_row;

  // Page id of box `lane` of the block starting at `token` (contiguous: unused).
  __device__ __forceinline__ int box_page(int token) const { return Kv::box_page(*this, token); }

  // Step `it` walks block n_blocks - 1 - it. `is_v`: paged V's boxes bring whole rows.
  __device__ __forceinline__ void load_kv(const sm90::TmaMap* map, unsigned char* ring, sm90::u64* full,
                                          sm90::u64* empty, int it, int page, bool is_v) const {
    using namespace sm90;
    // The ring's stage (prefill_sm90_rings): a byte ring's, or K's, or V's where TMA fills it.
    constexpr int kKBytes = C::kKv8 ? C::kK8StageBytes : C::kKStageBytes;
    constexpr int kVBytes = C::kByteRings ? C::kV8StageBytes : C::kVStageBytes;
    const int s = (g + it) % C::kStages;
    const int token = (n_blocks - 1 - it) * C::kBlockN;
    unsigned char* stage = ring + s * (is_v ? kVBytes : kKBytes);
    if (lane == 0) {
      mbar_wait(&empty[s], (((g + it) / C::kStages) & 1) ^ 1);
      mbar_arrive_expect_tx(&full[s], C::kKTxBytes);
    }
    // The layout's boxes (prefill_sm90_kv.cuh), issued here: behind a call of the layout's, NVVM
    // ordered the stage's address arithmetic otherwise.
    if constexpr (!Kv::kPaged) {
      if (lane == 0)
#pragma unroll
        for (int c = 0; c < C::kQkChunks; ++c)
          tma_load_4d(stage + c * C::kBlockN * 128, map, &full[s], C::kQkChunkElems * c, token, kv_head,
                      batch_index);
    } else {
      // Each lane issues its own box: one thread issuing them all was the bottleneck. An FP8
      // cache's boxes (K and V alike) bring rows of bytes, a swizzle row each (kByteRow), into
      // the byte rings (FP8 attention's K into the K ring, where the wgmmas read them), chunk by
      // chunk as contiguous KV's land (one chunk at hd64 and hd128).
      constexpr int kBoxRows = C::kBoxRows;
      __syncwarp();
      const int row = C::Kv::tma_row(token + lane * kBoxRows);
      if constexpr (C::kByteRings) {
        if (lane < C::kBoxes)
#pragma unroll
          for (int c = 0; c < C::kByteChunks; ++c)
            tma_load_4d(stage + c * C::kBlockN * 128 + lane * kBoxRows * C::kByteRow, map, &full[s], C::kByteRow * c,
                        kv_head, row, page);
      } else if (lane < C::kBoxes && is_v) {
        tma_load_5d(stage + lane * C::kChunks * kBoxRows * 128, map, &full[s], 0, row, 0, kv_head, page);
      } else if (lane < C::kBoxes) {
#pragma unroll
        for (int c = 0; c < C::kChunks; ++c)
          tma_load_4d(stage + c * C::kBlockN * 128 + lane * kBoxRows * 128, map, &full[s], 64 * c, kv_head, row, page);
      }
    }
  }
};

// The loads of tile `w`'s walk, whose first block takes ring step g: K one block ahead of V.
template <class C>
__device__ __forceinline__ void prefill_sm90_produce_walk(const PrefillParams& p, const PrefillSm90Smem<C>& sm,
                                                          const sm90::TmaMap* map_k, const sm90::TmaMap* map_v,
                                                          const int& lane, const PrefillSm90Walk& w, int g) {
  const int batch_index = w.cta.batch_index;
  const int kv_head = w.cta.head / (C::kGroup / C::kPackHeads);  // kGroup / kPackHeads packs a KV head
  const PrefillRequest& r = w.r;
  const int n_blocks = w.n_blocks;
  const int block_count = w.block_count;
  const int* table_row = PrefillSm90Kv<C>::table_row(p, batch_index);
  const PrefillSm90Producer<C> loads{p, lane, g, batch_index, kv_head, r, n_blocks, table_row};
  // Page ids are fetched a block ahead: the lookup's latency hides behind the waits.
  int page = loads.box_page((n_blocks - 1) * C::kBlockN);
  int previous_page = 0;
  // An FP8 cache's bytes go to their own rings, which the widening drains (prefill_sm90_widen.cuh);
  // FP8 attention's V bytes too, which the transposition drains (prefill_sm90_fp8.cuh).
  constexpr bool kVBytes = C::kByteRings;
  unsigned char* const k_ring = C::kKv8 ? sm.k8 : sm.k;
  unsigned char* const v_ring = kVBytes ? sm.v8 : sm.v;
  sm90::u64* const k_full = C::kKv8 ? sm.k8_full : sm.k_full;
  sm90::u64* const k_empty = C::kKv8 ? sm.k8_empty : sm.k_empty;
  sm90::u64* const v_full = kVBytes ? sm.v8_full : sm.v_full;
  sm90::u64* const v_empty = kVBytes ? sm.v8_empty : sm.v_empty;
  for (int it = 0; it < block_count; ++it) {
    const int next_page = it + 1 < block_count ? loads.box_page((n_blocks - 2 - it) * C::kBlockN) : 0;
    // The first K block may have gone out with Q (prefill_sm90_kv.cuh).
    constexpr bool kFirstKIssued = !C::kPersistent && PrefillSm90Kv<C>::kFirstKWithQ;
    if (!kFirstKIssued || it > 0) loads.load_kv(map_k, k_ring, k_full, k_empty, it, page, false);
    ASTRAI_PREFILL_STAMP(!kFirstKIssued && it == 0 && lane == 0, 9);  // the first K block issued
    if (it > 0) loads.load_kv(map_v, v_ring, v_full, v_empty, it - 1, previous_page, true);
    previous_page = page;
    page = next_page;
  }
  loads.load_kv(map_v, v_ring, v_full, v_empty, block_count - 1, previous_page, true);
}

}  // namespace astrai
