// Paged and contiguous decode for sm_90a: the tensor-core decode of paged_decode.cuh (4 warps, a
// 64-token block per step, warp w taking tokens [16w, 16w + 16) of each, its own online softmax,
// the merge and the split combine) with K and V arriving by TMA instead of cp.async. Warp 0
// issues the copies of a block kStages - 1 blocks ahead (lane j one box: a page part of K or of V
// in one 64-column chunk), into a ring of stages guarded by one mbarrier each; the copy engine
// does the address work the cp.async loaders spent most of their instructions on, and deeper
// rings cost no registers. A barrier at the end of each block (the CTA's; in a wide CTA, the
// group's named barrier) frees its stage for the next issue (an empty mbarrier per stage instead,
// each warp arriving and warp 0 waiting before a refill, was no faster, then 0.2-1.5% slower on
// every bench row). The first copies leave before the Q tile loads (the latency a short split
// waits on). The copies mark their lines first to be evicted from L2: K and V are read once
// (l2_evict_first_policy).
// Launched as a programmatic dependent of the kernel before it: before its griddepcontrol.wait
// come the barrier setup, the tensor-map prefetch and L2 prefetches of the CTA's first reads
// (sequence length, Q rows, the first blocks' K and V, steered by page ids read through L2
// alone), so that a kernel ahead that lets this one start early hides their memory latency
// (batch 1 x 1024 tokens 7.19 -> 6.75 us, hd64 24/4 2.4% faster, larger shapes within noise).
//
// Shared memory: the Q tile (padded rows, as the portable kernel), then the ring aligned to
// 1024 bytes: per stage K then V, each [row bytes / 128 chunks][64 rows][128 bytes] with the
// 128-byte swizzle (16-byte piece c of row r at c ^ (r & 7)), then the barriers. An FP8 cache's
// rows are bytes (decode_sm90_kv8.cuh): chunks of 128 elements, stages of half the size; at hd64
// one chunk of 64-byte rows with the 64-byte swizzle.
//
// Tensor maps (128-byte swizzle, boxes 64 elements wide; an FP8 cache's UINT8 maps, 128, or 64
// with the 64-byte swizzle at hd64):
//   paged:      {head_dim, n_kv_heads, page_size, num_pages}, box {64, 1, min(page_size, 64), 1};
//   contiguous: {head_dim, n_kv_heads, kv_capacity, batch},   box {64, 1, 64, 1}.
// Page ids past the split's tokens, negative or past num_pages address no element: TMA writes
// zeros. Rows of a loaded page past the sequence may hold anything (0 * NaN is NaN in P V), so
// the tail block's V rows past the split are cleared; the appended token's row is written from
// new_k/new_v, as every decode kernel reads it.
#pragma once

#include "decode_sm90_kv8.cuh"

namespace astrai {

// kSplits > 1 (a wide CTA, `.wide` variants): the CTA runs the kSplits splits of its (request,
// KV head, head tile) side by side, a group of kDecodeThreads threads each with its own Q tile,
// ring and barriers (decode_sm90_wide_region_bytes), waiting on its group's named barrier;
// each group leaves its rows in a slot of its ring, and the CTA merges them by their LSEs and
// writes the output: no split workspace, no split combine launch.
template <typename T, int kHeadDim, int kPageSize, int kGroup, int kFlags, int kSplits = 1>
__global__ void __launch_bounds__(kDecodeThreads * kSplits)
    paged_decode_sm90_kernel(const __grid_constant__ PagedDecodeParams p, const __grid_constant__ sm90::TmaMap map_k,
                             const __grid_constant__ sm90::TmaMap map_v) {
  using namespace sm90;
  static_assert((kFlags & ~decode_sm90_features()) == 0, "features of the Hopper decode");
  static_assert(kSplits >= 1 && kSplits <= 4, "split groups of a wide CTA");
  constexpr bool kFp8 = has_fp8_kv<kFlags>();  // an FP8 cache: decode_sm90_kv8.cuh
  constexpr bool kScaledQ = kFp8 && IsBf16<T>::value;
  static_assert(!kFp8 || decode_sm90_serves_kv8(kHeadDim), "FP8: hd 64, 128, 256");
  using Shape = DecodeSm90Shape<kHeadDim, kPageSize, kFp8 ? 1 : 2, (kSplits > 1)>;
  constexpr int kStages = Shape::kStages;
  constexpr int kQLen = decode_q_len(kFlags);
  constexpr int kRowStride = kHeadDim + 8;
  static_assert(kSplits == 1 || decode_merge_bytes<kHeadDim>() + decode_slot_bytes<kHeadDim>() <=
                                    kStages * Shape::kStageBytes,
                "a group's slot fits its ring after the merge");

  extern __shared__ __align__(16) unsigned char smem_raw[];
  allow_dependent_grid();  // the split combine may be scheduled as CTAs free up
  // Unsigned, as threadIdx and blockIdx are: a CTA of one group compiles as the kernel always did.
  const unsigned group = kSplits == 1 ? 0u : threadIdx.x / kDecodeThreads;
  const unsigned thread = kSplits == 1 ? threadIdx.x : threadIdx.x % kDecodeThreads;
  const unsigned split = blockIdx.x * kSplits + group;
  unsigned char* region = smem_raw + group * decode_sm90_wide_region_bytes(kHeadDim);
  T* smem_q = reinterpret_cast<T*>(region);
  unsigned char* ring = group_ring<kHeadDim>(smem_raw, group);
  u64* full = reinterpret_cast<u64*>(ring + kStages * Shape::kStageBytes);
  float* slot = reinterpret_cast<float*>(ring + decode_merge_bytes<kHeadDim>());

  const int lane = thread & 31;
  const int warp = thread >> 5;
  // A wide CTA's groups meet at its merge on an mbarrier every thread arrives on once, placed
  // after region 0's ring barriers. Behind a bar.sync (0 or named) racecheck reported a group's
  // slot stores as racing with the loads of a group that had reached the barrier first: it
  // orders accesses by how many barriers each warp has passed, and each group passes its own
  // named barrier once a block of its split.
  u64* merge_done = reinterpret_cast<u64*>(group_ring<kHeadDim>(smem_raw, 0) + kStages * (Shape::kStageBytes + 8));
  static_assert(kSplits == 1 || Shape::kQBytes + 1024 + kStages * (Shape::kStageBytes + 8) + 8 <=
                                    decode_sm90_wide_region_bytes(kHeadDim),
                "a wide CTA's region 0 holds the merge's barrier");
  // Before the wait for the previous kernel (a programmatic dependent launch overlaps this with
  // its tail) only what no kernel writes: the barriers and the tensor maps.
  if (thread == 0) init_decode_sm90_barriers<kStages, kSplits>(full, merge_done, group, &map_k, &map_v);
  if constexpr (kSplits > 1) __syncthreads();  // merge_done is set up before any thread arrives

  const DecodeSm90Copy<kHeadDim, kPageSize, kFp8 ? 1 : 2, (kSplits > 1)> copy(&map_k, &map_v, lane);
  auto lookup = [&](const int* table_row, int begin, int end, int block, bool l2_only) {
    return copy.lookup(p, table_row, begin, end, block, l2_only);
  };
  // Without a window a split's tokens follow from the launch alone.
  constexpr bool kWindow = has_feature<kFlags>(kFeatureWindow);
  const int launch_begin = split * p.tokens_per_split;
  const int launch_end = min(launch_begin + p.tokens_per_split, p.kv_capacity);
  if (!kWindow) {
    // While the kernel ahead finishes: L2 prefetches of the K and V boxes of the blocks issued
    // before the loop (the Q rows and the length: prefetch_decode_start). Prefetches are hints:
    // data the kernel ahead is still writing can make one useless, never a result wrong. The
    // page ids read here (through L2 only) steer only these prefetches; the copies use ids
    // read after the wait.
    const DecodeWork tile = decode_work_tile<kGroup, kFlags>(split);
    if (warp == 0) {
      const int* table_row = KvLayout<kPageSize>::kPaged ? kv_table_row<true>(p, blockIdx.z) : nullptr;
      for (int block = 0; block < kStages - 1 && launch_begin + block * kDecodeBlockTokens < launch_end; ++block) {
        const int guess = lookup(table_row, launch_begin, launch_end, block, true);
        const int token = launch_begin + block * kDecodeBlockTokens + copy.box * Shape::kBoxRows;
        if (lane < Shape::kCopies) tma_prefetch_l2_4d(copy.map, copy.x(), tile.kv_head, copy.box_row(token), guess);
      }
    }
  }
  if constexpr (kSplits == 1)  // Q rows and length
    prefetch_decode_start<T, kHeadDim, kPageSize, kGroup, kFlags, false>(p, 32);
  else if (group == 0)  // the same for every group
    prefetch_decode_start<T, kHeadDim, kPageSize, kGroup, kFlags, false>(p, 32, thread, kDecodeThreads, split);
  wait_for_previous_grid();

  // Block 0's page ids are looked up before the sequence length arrives, not after it: one
  // memory latency less before the first copy (what a split of one or two blocks waits on).
  int page = 0;
  if (!kWindow && warp == 0)
    page = lookup(kv_table_row(p, blockIdx.z), launch_begin, launch_end, 0, false);
  const DecodeWork w = decode_work<kPageSize, kGroup, kFlags>(p, split);
  const int lookup_end = kWindow ? w.split_end : min(w.split_begin + p.tokens_per_split, p.kv_capacity);
  auto box_page = [&](int block) { return lookup(w.seq.table_row, w.split_begin, lookup_end, block, false); };
  if (kWindow && warp == 0) page = box_page(0);
  // Every thread of a wide CTA arrives on its merge's barrier, an empty split's too.
  const bool empty_split = kSplits > 1 && w.split_begin >= w.split_end;
  if constexpr (kSplits == 1) {
    if (!decode_work_begin<T, kHeadDim, kPageSize, kFlags>(p, w)) return;
  } else if (empty_split) {
    write_empty_split_slot<kHeadDim, kFlags>(p, w, slot, thread);
  } else if (KvLayout<kPageSize>::kPaged && w.head_tile == 0 && w.seq.append_token >= w.split_begin &&
             w.seq.append_token < w.split_end) {
    append_new_token<T, kHeadDim, kPageSize, kFlags>(p, w.seq, w.batch_index, w.kv_head, thread, kDecodeThreads);
  }
  if (!empty_split) {
    const int num_blocks = (w.split_end - w.split_begin + kDecodeBlockTokens - 1) / kDecodeBlockTokens;
    auto issue = [&](int block, int page) { copy.issue(ring, full, block, page, w); };
    // Page ids are looked up a block ahead of their issue, so the lookup never stalls it.
    if (warp == 0) {
      for (int block = 0; block < kStages - 1 && block < num_blocks; ++block) {
        const int next = box_page(block + 1);
        issue(block, page);
        page = next;
      }
    }
    load_decode_q_tile<T, kHeadDim, kQLen, kFp8, kFp8 && decode_sm90_kv8_swizzled_q<kHeadDim>()>(p, w, smem_q, thread);
    decode_group_sync<kSplits>();

    DecodeWarpSoftmax<kHeadDim, kFlags, kScaledQ> state;
    state.init(p, w);
    const Sm90KvScales<T, kHeadDim, kFlags> scales(p, w, smem_q, lane, state);  // 1 for a 16-bit cache
    const unsigned q_address = shared_address(smem_q + (lane & 15) * kRowStride + (lane >> 4) * 8);
    const DecodeSm90Lanes lanes(warp, lane);

    for (int block = 0; block < num_blocks; ++block) {
      if (warp == 0 && block + kStages - 1 < num_blocks) {
        const int next = box_page(block + kStages);
        issue(block + kStages - 1, page);
        page = next;
      }
      const int s = block % kStages;
      mbar_wait(&full[s], (block / kStages) & 1);
      unsigned char* k_tile = ring + s * Shape::kStageBytes;
      unsigned char* v_tile = k_tile + Shape::kTileBytes;
      const int first_token = w.split_begin + block * kDecodeBlockTokens + warp * 16;
      if (first_token < w.split_end) {
        sm90_decode_fix_tail<T, kHeadDim, kPageSize, kFlags>(p, w, k_tile, v_tile, first_token, warp, lane);
        if constexpr (kFp8) {
          sm90_kv8_block<T, kHeadDim, kFlags>(state, p, w, q_address, k_tile, v_tile, first_token, scales, warp, lane);
        } else {
          // S = Q K^T for this warp's 16 tokens.
          const unsigned k_address = shared_address(k_tile) + lanes.k_row * 128;
          float sc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
          sm90_decode_scores<T, kHeadDim, Shape::kChunkBytes>(sc, q_address, k_address, lanes.k_xor);
          unsigned pa[4];
          state.template step<T>(sc, pa, p, w, first_token);
          // O += P V.
          const unsigned v_address = shared_address(v_tile) + lanes.v_row * 128;
          sm90_decode_pv<T, kHeadDim, Shape::kChunkBytes>(state.o, pa, v_address, lanes.v_xor);
        }
      }
      decode_group_sync<kSplits>();  // every warp is done with stage s: the next block's issue refills it
    }
    // Every issued block has been waited for: the ring is free for the merge.
    merge_decode_warps<T, kHeadDim, kFlags, kFp8, kSplits, kScaledQ>(p, w, state, ring, scales.v, slot);
  }
  if constexpr (kSplits > 1) merge_wide_splits<T, kHeadDim, kQLen, kSplits>(p, w, smem_raw, merge_done);
}

}  // namespace astrai
