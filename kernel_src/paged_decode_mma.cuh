// The tensor-core decode (sm_80+): K/V blocks of 64 tokens stream through shared memory, warp w
// takes tokens [16w, 16w + 16) of each with its own online softmax, and the four warps merge.
#pragma once

#include "decode_kv8_loaders.cuh"
#include "decode_kv_loaders.cuh"
#include "decode_merge.cuh"
#include "decode_mma_steps.cuh"
#include "decode_q_tile.cuh"
#include "decode_softmax.cuh"
#include "decode_start.cuh"
#include "mma_utils.cuh"

namespace astrai {

// The shared-memory layout of the tensor-core decode (see paged_decode_smem_bytes): the Q tile,
// then the K and V tiles of T (two stages each; one with an FP8 cache, which widens each block
// into them; none on the direct path), then an FP8 cache's byte stages or the direct path's rings.
// (No static members: every one an instantiated class has becomes a global of the PTX.)
template <int kHeadDim, int kFlags>
constexpr bool mma_decode_direct() {
  return has_fp8_kv<kFlags>() && kv8_direct_head_dim(kHeadDim);
}
template <typename T, int kHeadDim, int kPageSize, int kFlags>
struct MmaDecodeSmem {
  using Tiles = PagedDecodeTiles<T, kHeadDim, kPageSize>;
  T* q;
  T* k;
  T* v;
  unsigned char* kv8;

  __device__ __forceinline__ explicit MmaDecodeSmem(unsigned char* smem_raw) {
    constexpr int kTileStages = mma_decode_direct<kHeadDim, kFlags>() ? 0 : has_fp8_kv<kFlags>() ? 1 : kDecodeStages;
    q = reinterpret_cast<T*>(smem_raw);
    k = q + kDecodeHeadsPerTile * Tiles::kRowStride;
    v = k + kTileStages * Tiles::kStageElems;
    kv8 = reinterpret_cast<unsigned char*>(v + kTileStages * Tiles::kStageElems);
  }

  // An FP8 cache staged: the byte stage `stage` widened into the K and V tiles.
  __device__ __forceinline__ void widen_kv8_stage(int stage) const {
    constexpr bool kE5m2 = has_feature<kFlags>(kFeatureKvE5m2);
    constexpr int kStageBytes = kDecodeBlockTokens * kHeadDim;
    widen_fp8_tile<T, kHeadDim, Tiles::kRowStride, kDecodeBlockTokens, kDecodeThreads, kE5m2>(
        kv8 + 2 * stage * kStageBytes, k);
    widen_fp8_tile<T, kHeadDim, Tiles::kRowStride, kDecodeBlockTokens, kDecodeThreads, kE5m2>(
        kv8 + (2 * stage + 1) * kStageBytes, v);
    __syncthreads();
  }
};

// Copies block `block_start` into `stage` (cp.async, one commit group) and looks up the page ids
// of the block after it: an FP8 cache into its byte stage; a 16-bit cache by the full-block
// loader where it can (no tail, no appended token), else by the general loader, with page ids
// fetched a block ahead for small pages at head dims the full-block loader cannot tile.
template <typename T, int kHeadDim, int kPageSize, int kFlags>
__device__ __forceinline__ void issue_kv_block(const PagedDecodeParams& p, const DecodeWork& w,
                                               const MmaDecodeSmem<T, kHeadDim, kPageSize, kFlags>& smem,
                                               FullBlockLoader<T, kHeadDim, kPageSize>& loader,
                                               BlockPages<T, kHeadDim, kPageSize>& pages, float k_scale,
                                               float v_scale, int block_start, int stage) {
  using Tiles = PagedDecodeTiles<T, kHeadDim, kPageSize>;
  using Loader = FullBlockLoader<T, kHeadDim, kPageSize>;
  constexpr bool kGeneralPrefetch = !Loader::kUsable && kPrefetchPages<kPageSize>;
  constexpr int kStageBytes = kDecodeBlockTokens * kHeadDim;  // one FP8 stage of K or of V
  const DecodeSequence& seq = w.seq;
  const int split_end = w.split_end;
  if constexpr (has_fp8_kv<kFlags>()) {
    load_kv8_block_async<T, kHeadDim, kPageSize, has_feature<kFlags>(kFeatureKvE5m2)>(
        p, smem.kv8 + 2 * stage * kStageBytes, smem.kv8 + (2 * stage + 1) * kStageBytes, seq, w.batch_index,
        block_start, split_end, w.kv_head, k_scale, v_scale);
    cp_async_commit();
    return;
  }
  T* k_stage = smem.k + stage * Tiles::kStageElems;
  T* v_stage = smem.v + stage * Tiles::kStageElems;
  if constexpr (Loader::kUsable) {
    const bool full = block_start + kDecodeBlockTokens <= split_end &&
                      !(seq.append_token >= block_start && seq.append_token < block_start + kDecodeBlockTokens);
    if (full)
      loader.load(p, shared_address(k_stage), shared_address(v_stage), block_start);
    else
      load_kv_block_async<T, kHeadDim, kPageSize, false>(p, k_stage, v_stage, seq, w.batch_index, block_start,
                                                         split_end, w.kv_head, pages);
    cp_async_commit();
    loader.fetch(p, seq, block_start + kDecodeBlockTokens, split_end);
  } else {
    load_kv_block_async<T, kHeadDim, kPageSize, kGeneralPrefetch>(p, k_stage, v_stage, seq, w.batch_index,
                                                                  block_start, split_end, w.kv_head, pages);
    cp_async_commit();
    if (kGeneralPrefetch) pages.fetch(p, seq, block_start + kDecodeBlockTokens, split_end);
  }
}

// The loaders' page ids of the split's first block (a 16-bit cache).
template <typename T, int kHeadDim, int kPageSize, int kFlags>
__device__ __forceinline__ void first_block_pages(const PagedDecodeParams& p, const DecodeWork& w,
                                                  FullBlockLoader<T, kHeadDim, kPageSize>& loader,
                                                  BlockPages<T, kHeadDim, kPageSize>& pages) {
  using Loader = FullBlockLoader<T, kHeadDim, kPageSize>;
  if constexpr (has_fp8_kv<kFlags>()) {
  } else if constexpr (Loader::kUsable) {
    loader.init(p, w.batch_index, w.kv_head);
    loader.fetch(p, w.seq, w.split_begin, w.split_end);
  } else if (!Loader::kUsable && kPrefetchPages<kPageSize>) {
    pages.fetch(p, w.seq, w.split_begin, w.split_end);
  }
}

// FP8 K as B fragments: S += Q K^T over the 64 dims `group` of the Q tile, from 16 bytes of each
// of the lane's K rows g and g + 8, word s of them the k16 step s (the Q tile's columns hold the
// dims in that order: kv8_q_dim).
template <bool kE5m2>
__device__ __forceinline__ void kv8_scores_group(float (&s)[2][4], unsigned q_address, int group, const uint4& k0,
                                                 const uint4& k1) {
  const unsigned w0[4] = {k0.x, k0.y, k0.z, k0.w};
  const unsigned w1[4] = {k1.x, k1.y, k1.z, k1.w};
#pragma unroll
  for (int step = 0; step < 4; ++step) {
    unsigned a[4];
    ldmatrix_x4(a, q_address + (4 * group + step) * 32);
    Mma<fp16_t>::run(s[0], a, fp8x2_to_f16x2<kE5m2>(w0[step]), fp8x2_to_f16x2<kE5m2>(w0[step] >> 16));
    Mma<fp16_t>::run(s[1], a, fp8x2_to_f16x2<kE5m2>(w1[step]), fp8x2_to_f16x2<kE5m2>(w1[step] >> 16));
  }
}

// Direct FP8 path: S = Q K^T for the warp's 16 tokens, K's bytes widened to f16 pairs as the
// B fragments (k_read: this lane's offsets in the stage, kv8_fragment_offsets).
template <int kHeadDim, bool kE5m2>
__device__ __forceinline__ void kv8_direct_scores(float (&s)[2][4], unsigned q_address, const unsigned char* k_bytes,
                                                  const int (&k_read)[2][2]) {
#pragma unroll
  for (int h = 0; h < kHeadDim / 64; ++h) {
    const uint4 k0 = *reinterpret_cast<const uint4*>(k_bytes + k_read[0][h & 1] + 128 * (h >> 1));
    const uint4 k1 = *reinterpret_cast<const uint4*>(k_bytes + k_read[1][h & 1] + 128 * (h >> 1));
    kv8_scores_group<kE5m2>(s, q_address, h, k0, k1);
  }
}

// FP8 V as B fragments: O += P V for the n8 tiles of `part`, from kVBytes of V rows 2t, 2t+1,
// 2t+8, 2t+9 (rows_v, the lane's tokens), regrouped into token pairs per dim and widened to f16
// (the output's columns come out permuted: kv8_out_dim).
template <int kHeadDim, bool kE5m2>
__device__ __forceinline__ void kv8_pv_part(float (&o)[kHeadDim / 8][4], const unsigned (&pa)[4], int part,
                                            const uint4 (&rows_v)[4]) {
  using Direct = Kv8Direct<kHeadDim>;
  const unsigned a_words[4] = {rows_v[0].x, rows_v[0].y, rows_v[0].z, rows_v[0].w};
  const unsigned b_words[4] = {rows_v[1].x, rows_v[1].y, rows_v[1].z, rows_v[1].w};
  const unsigned c_words[4] = {rows_v[2].x, rows_v[2].y, rows_v[2].z, rows_v[2].w};
  const unsigned d_words[4] = {rows_v[3].x, rows_v[3].y, rows_v[3].z, rows_v[3].w};
#pragma unroll
  for (int word = 0; word < Direct::kVBytes / 4; ++word) {
    // Token pairs of dims 4 word + 0..3: [a0 b0 a1 b1] and [a2 b2 a3 b3], likewise c, d.
    const unsigned first[2] = {byte_perm(a_words[word], b_words[word], 0x5140u),
                               byte_perm(a_words[word], b_words[word], 0x7362u)};
    const unsigned second[2] = {byte_perm(c_words[word], d_words[word], 0x5140u),
                                byte_perm(c_words[word], d_words[word], 0x7362u)};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int tile = part * Direct::kVBytes + 4 * word + i;
      const int shift = (i & 1) * 16;
      Mma<fp16_t>::run(o[tile], pa, fp8x2_to_f16x2<kE5m2>(first[i >> 1] >> shift),
                       fp8x2_to_f16x2<kE5m2>(second[i >> 1] >> shift));
    }
  }
}

// Direct FP8 path: O += P V, V's bytes regrouped into token pairs per dim and widened to f16 as
// the B fragments (v_read: this lane's four rows in the stage).
template <int kHeadDim, bool kE5m2>
__device__ __forceinline__ void kv8_direct_pv(float (&o)[kHeadDim / 8][4], const unsigned (&pa)[4],
                                              const unsigned char* v_bytes, const int (&v_read)[4]) {
  using Direct = Kv8Direct<kHeadDim>;
  // Rows 2t, 2t+1 give each dim's first token pair, rows 2t+8, 2t+9 its second.
#pragma unroll
  for (int part = 0; part < Direct::kVParts; ++part) {
    uint4 rows_v[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const unsigned char* source = v_bytes + v_read[r] + 128 * part;
      if constexpr (Direct::kVBytes == 16) {
        rows_v[r] = *reinterpret_cast<const uint4*>(source);
      } else {
        const uint2 half = *reinterpret_cast<const uint2*>(source);
        rows_v[r] = make_uint4(half.x, half.y, 0u, 0u);
      }
    }
    kv8_pv_part<kHeadDim, kE5m2>(o, pa, part, rows_v);
  }
}

// Three data paths share the loop: a 16-bit cache (two stages of K and V tiles, cp.async), an
// FP8 cache staged (its bytes copied, then widened into one K and one V tile of T) and an FP8
// cache read directly (each warp streams its own rows' bytes through a ring, __syncwarp only).
template <typename T, int kHeadDim, int kPageSize, int kGroup, int kFlags>
__device__ void paged_decode_mma(const PagedDecodeParams& p, unsigned char* smem_raw) {
  using Tiles = PagedDecodeTiles<T, kHeadDim, kPageSize>;
  using Smem = MmaDecodeSmem<T, kHeadDim, kPageSize, kFlags>;
  constexpr int kQLen = decode_q_len(kFlags);
  constexpr int kRowStride = Tiles::kRowStride;
  constexpr bool kFp8 = has_fp8_kv<kFlags>();
  constexpr bool kE5m2 = has_feature<kFlags>(kFeatureKvE5m2);
  using Direct = Kv8Direct<kHeadDim>;
  constexpr bool kDirect = kFp8 && Direct::kUsable;  // as mma_decode_direct
  constexpr bool kScaledQ = kDirect && IsBf16<T>::value;  // Q rows scaled into f16's range
  const Smem smem(smem_raw);

  const DecodeWork w = decode_work<kPageSize, kGroup, kFlags>(p);
  if (!decode_work_begin<T, kHeadDim, kPageSize, kFlags>(p, w)) return;
  const DecodeSequence& seq = w.seq;
  const int batch_index = w.batch_index, kv_head = w.kv_head;
  const int split_begin = w.split_begin, split_end = w.split_end;
  // FP8: the K scale multiplies the scores, the V scale the output.
  const float k_scale = kFp8 ? kv_scale(p.features.k_scale, p.features.kv_scale_stride, kv_head) : 1.f;
  const float v_scale = kFp8 ? kv_scale(p.features.v_scale, p.features.kv_scale_stride, kv_head) : 1.f;
  load_decode_q_tile<T, kHeadDim, kQLen, kDirect>(p, w, smem.q);

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int quad_row = lane >> 2;  // accumulator row g (and g + 8)
  const int quad_col = lane & 3;   // accumulator column pair 2t, 2t + 1
  DecodeWarpSoftmax<kHeadDim, kFlags, kScaledQ> state;
  state.init(p, w);

  // Per-lane ldmatrix addresses (see the fragment layouts of mma.m16n8k16).
  const unsigned q_address =
      shared_address(smem.q + (lane & 15) * kRowStride + (lane >> 4) * 8);
  const int k_lane_offset = (warp * 16 + (lane >> 4) * 8 + (lane & 7)) * kRowStride + ((lane >> 3) & 1) * 8;
  const int v_lane_offset = (warp * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * kRowStride + (lane >> 4) * 8;

  const int num_blocks = (split_end - split_begin + kDecodeBlockTokens - 1) / kDecodeBlockTokens;
  using Loader = FullBlockLoader<T, kHeadDim, kPageSize>;
  Loader loader;
  BlockPages<T, kHeadDim, kPageSize> pages;
  // Lambdas, not calls in the path that uses them: a lambda's body is instantiated on every path,
  // and so are the loaders' static members and the quantizer it reaches, which the PTX lists
  // in the order of their instantiation (a call on one path only gave the same code in other bytes).
  auto issue_block = [&](int block_start, int stage) {
    issue_kv_block<T, kHeadDim, kPageSize, kFlags>(p, w, smem, loader, pages, k_scale, v_scale, block_start, stage);
  };
  // Direct path: this warp's ring and its steps' first tokens.
  unsigned char* ring = smem.kv8 + warp * Direct::kWarpBytes;
  const int warp_begin = split_begin + warp * Direct::kRows;
  Kv8StepLoader<T, kHeadDim, kPageSize, kE5m2> step_loader{};
  auto issue_step = [&](int step) {  // a lambda for the same reason
    step_loader.issue_step(p, seq, batch_index, kv_head, ring, warp_begin, step, split_end, lane, k_scale, v_scale);
  };
  int k_read[2][2];  // direct path: this lane's fragment offsets in a stage
  int v_read[4];
  float score_scale[2] = {k_scale, k_scale};  // kScaledQ: the raw scores' factors, rows g and g + 8
  if constexpr (kDirect) {
    kv8_fragment_offsets<kHeadDim>(k_read, v_read, quad_row, quad_col);
    __syncthreads();  // the Q tile
    kv8_score_scales<T, kHeadDim>(smem.q, quad_row, k_scale, score_scale);
    if constexpr (kScaledQ) state.set_row_scales(p, score_scale);
    step_loader.start(p, seq, batch_index, kv_head, ring, warp_begin, split_end, lane, k_scale, v_scale);
  } else {
    first_block_pages<T, kHeadDim, kPageSize, kFlags>(p, w, loader, pages);
    issue_block(split_begin, 0);
  }

  for (int block = 0; block < num_blocks; ++block) {
    const int stage = block & 1;
    const int block_start = split_begin + block * kDecodeBlockTokens;
    if constexpr (kDirect) {
      issue_step(block + Direct::kStages - 1);
      cp_async_wait<Direct::kStages - 1>();
      __syncwarp();
    } else {
      if (block + 1 < num_blocks) {
        issue_block(block_start + kDecodeBlockTokens, stage ^ 1);
        cp_async_wait<1>();
      } else {
        cp_async_wait<0>();
      }
      __syncthreads();
    }
    if constexpr (kFp8 && !kDirect) smem.widen_kv8_stage(stage);
    const int tile_stage = kFp8 ? 0 : stage;

    const int warp_first_token = block_start + warp * 16;
    if (warp_first_token < split_end) {
      const unsigned k_address = shared_address(smem.k + tile_stage * Tiles::kStageElems + k_lane_offset);
      const unsigned v_address = shared_address(smem.v + tile_stage * Tiles::kStageElems + v_lane_offset);
      const unsigned char* k_bytes = ring + (block % Direct::kStages) * Direct::kStageBytes;
      const unsigned char* v_bytes = k_bytes + Direct::kTileBytes;

      // S = Q K^T for this warp's 16 tokens.
      float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
      if constexpr (kDirect) {
        kv8_direct_scores<kHeadDim, kE5m2>(s, q_address, k_bytes, k_read);
      } else {
        decode_scores_mma<T, kHeadDim>(s, q_address, k_address);
      }
      if constexpr (kFp8) kv8_scale_scores<kFlags, kScaledQ>(s, k_scale, score_scale);

      // O += P V.
      unsigned pa[4];
      state.template step<typename MmaType<T, kDirect>::type>(s, pa, p, w, warp_first_token);  // f16 on the direct path
      if constexpr (kDirect) {
        kv8_direct_pv<kHeadDim, kE5m2>(state.o, pa, v_bytes, v_read);
      } else {
        decode_pv_mma<T, kHeadDim>(state.o, pa, v_address);
      }
    }
    // The stage is refilled by the next iteration's prefetch: this warp's own (direct) or any.
    if constexpr (kDirect)
      __syncwarp();
    else
      __syncthreads();
  }
  if constexpr (kDirect) {
    cp_async_wait<0>();
    __syncthreads();  // the merge below reuses every warp's ring
    static_assert(decode_merge_bytes<kHeadDim>() <= 4 * Direct::kWarpBytes, "the merge fits in the rings");
  }
  // The K/V stages (on the direct path the rings, which start there too) are free now.
  merge_decode_warps<T, kHeadDim, kFlags, kDirect>(p, w, state, smem.k, v_scale);
}

}  // namespace astrai
