// The tensor-core decode (sm_80+): K/V blocks of 64 tokens stream through shared memory, warp w
// takes tokens [16w, 16w + 16) of each with its own online softmax, and the four warps merge.
#pragma once

#include "decode_kv8_loaders.cuh"
#include "decode_kv_loaders.cuh"
#include "decode_merge.cuh"
#include "decode_q_tile.cuh"
#include "decode_softmax.cuh"
#include "decode_start.cuh"
#include "mma_utils.cuh"

namespace astrai {

template <typename T, int kHeadDim, int kPageSize, int kGroup, int kFlags>
__device__ void paged_decode_mma(const PagedDecodeParams& p, unsigned char* smem_raw) {
  using Tiles = PagedDecodeTiles<T, kHeadDim, kPageSize>;
  constexpr int kQLen = decode_q_len(kFlags);
  constexpr int kRowStride = Tiles::kRowStride;

  // An FP8 cache widens each block into one K and one V tile of T; its bytes stream through
  // byte stages after them (see paged_decode_smem_bytes).
  constexpr bool kFp8 = has_fp8_kv<kFlags>();
  constexpr bool kE5m2 = has_feature<kFlags>(kFeatureKvE5m2);
  using Direct = Kv8Direct<kHeadDim>;
  constexpr bool kDirect = kFp8 && Direct::kUsable;  // no widened tiles: the rings follow the Q tile
  constexpr int kTileStages = kDirect ? 0 : kFp8 ? 1 : kDecodeStages;
  constexpr int kStageBytes = kDecodeBlockTokens * kHeadDim;  // one FP8 stage of K or of V
  T* smem_q = reinterpret_cast<T*>(smem_raw);
  T* smem_k = smem_q + kDecodeHeadsPerTile * kRowStride;
  T* smem_v = smem_k + kTileStages * Tiles::kStageElems;
  unsigned char* smem_kv8 = reinterpret_cast<unsigned char*>(smem_v + kTileStages * Tiles::kStageElems);

  const DecodeWork w = decode_work<kPageSize, kGroup, kFlags>(p);
  if (!decode_work_begin<T, kHeadDim, kPageSize, kFlags>(p, w)) return;
  const DecodeSequence& seq = w.seq;
  const int batch_index = w.batch_index, kv_head = w.kv_head;
  const int split_begin = w.split_begin, split_end = w.split_end;
  // FP8: the K scale multiplies the scores, the V scale the output.
  const float k_scale = kFp8 ? kv_scale(p.features.k_scale, p.features.kv_scale_stride, kv_head) : 1.f;
  const float v_scale = kFp8 ? kv_scale(p.features.v_scale, p.features.kv_scale_stride, kv_head) : 1.f;
  load_decode_q_tile<T, kHeadDim, kQLen, kDirect>(p, w, smem_q);

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int quad_row = lane >> 2;  // accumulator row g (and g + 8)
  const int quad_col = lane & 3;   // accumulator column pair 2t, 2t + 1
  DecodeWarpSoftmax<kHeadDim, kFlags> state;
  state.init(p, w);

  // Per-lane ldmatrix addresses (see the fragment layouts of mma.m16n8k16).
  const unsigned q_address =
      shared_address(smem_q + (lane & 15) * kRowStride + (lane >> 4) * 8);
  const int k_lane_offset = (warp * 16 + (lane >> 4) * 8 + (lane & 7)) * kRowStride + ((lane >> 3) & 1) * 8;
  const int v_lane_offset = (warp * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * kRowStride + (lane >> 4) * 8;

  const int num_blocks = (split_end - split_begin + kDecodeBlockTokens - 1) / kDecodeBlockTokens;
  using Loader = FullBlockLoader<T, kHeadDim, kPageSize>;
  // Head dims the full-block loader cannot tile keep the general loader, with page ids fetched
  // a block ahead for small pages.
  constexpr bool kGeneralPrefetch = !Loader::kUsable && kPrefetchPages<kPageSize>;
  Loader loader;
  BlockPages<T, kHeadDim, kPageSize> pages;
  // Copies block `block_start` into `stage` and looks up the page ids of the block after it.
  auto issue_block = [&](int block_start, int stage) {
    if constexpr (kFp8) {
      load_kv8_block_async<T, kHeadDim, kPageSize, kE5m2>(p, smem_kv8 + 2 * stage * kStageBytes,
                                                          smem_kv8 + (2 * stage + 1) * kStageBytes, seq, batch_index,
                                                          block_start, split_end, kv_head, k_scale, v_scale);
      cp_async_commit();
      return;
    }
    T* k_stage = smem_k + stage * Tiles::kStageElems;
    T* v_stage = smem_v + stage * Tiles::kStageElems;
    if constexpr (Loader::kUsable) {
      const bool full = block_start + kDecodeBlockTokens <= split_end &&
                        !(seq.append_token >= block_start && seq.append_token < block_start + kDecodeBlockTokens);
      if (full)
        loader.load(p, shared_address(k_stage), shared_address(v_stage), block_start);
      else
        load_kv_block_async<T, kHeadDim, kPageSize, false>(p, k_stage, v_stage, seq, batch_index,
                                                           block_start, split_end, kv_head, pages);
      cp_async_commit();
      loader.fetch(p, seq, block_start + kDecodeBlockTokens, split_end);
    } else {
      load_kv_block_async<T, kHeadDim, kPageSize, kGeneralPrefetch>(p, k_stage, v_stage, seq, batch_index,
                                                                    block_start, split_end, kv_head, pages);
      cp_async_commit();
      if (kGeneralPrefetch) pages.fetch(p, seq, block_start + kDecodeBlockTokens, split_end);
    }
  };
  // Direct path: this warp's ring and its steps' first tokens.
  unsigned char* ring = smem_kv8 + warp * Direct::kWarpBytes;
  const int warp_begin = split_begin + warp * Direct::kRows;
  Kv8StepLoader<T, kHeadDim, kPageSize, kE5m2> step_loader{};
  auto issue_step = [&](int step) {
    const int first = warp_begin + step * kDecodeBlockTokens;
    const int page = step_loader.page;
    step_loader.lookup(p, seq, first + kDecodeBlockTokens, split_end, lane);  // a step ahead
    if (first < split_end)
      step_loader.issue(p, seq, batch_index, kv_head, ring + (step % Direct::kStages) * Direct::kStageBytes, first,
                        split_end, page, k_scale, v_scale);
    cp_async_commit();  // empty groups keep the wait count uniform
  };
  // Direct path: this lane's fragment offsets in a stage: K rows g and g + 8 (dims mod 128; the
  // rest of a row lies at multiples of 128 bytes), V rows 2t, 2t+1, 2t+8, 2t+9.
  int k_read[2][2];
  int v_read[4];
  if constexpr (kDirect) {
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int half = 0; half < 2; ++half) k_read[r][half] = Direct::offset(quad_row + 8 * r, 4 * half + quad_col);
#pragma unroll
    for (int r = 0; r < 4; ++r)
      v_read[r] = Direct::offset(2 * quad_col + (r & 1) + (r >> 1) * 8, quad_row * Direct::kVBytes / 16) +
                  quad_row * Direct::kVBytes % 16;
    __syncthreads();  // the Q tile
    step_loader.init(p, batch_index, kv_head, lane);
    step_loader.lookup(p, seq, warp_begin, split_end, lane);
#pragma unroll
    for (int step = 0; step + 1 < Direct::kStages; ++step) issue_step(step);
  } else {
    if constexpr (kFp8) {
    } else if constexpr (Loader::kUsable) {
      loader.init(p, batch_index, kv_head);
      loader.fetch(p, seq, split_begin, split_end);
    } else if (kGeneralPrefetch) {
      pages.fetch(p, seq, split_begin, split_end);
    }
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
    if constexpr (kFp8 && !kDirect) {
      widen_fp8_tile<T, kHeadDim, kRowStride, kDecodeBlockTokens, kDecodeThreads, kE5m2>(
          smem_kv8 + 2 * stage * kStageBytes, smem_k);
      widen_fp8_tile<T, kHeadDim, kRowStride, kDecodeBlockTokens, kDecodeThreads, kE5m2>(
          smem_kv8 + (2 * stage + 1) * kStageBytes, smem_v);
      __syncthreads();
    }
    const int tile_stage = kFp8 ? 0 : stage;

    const int warp_first_token = block_start + warp * 16;
    if (warp_first_token < split_end) {
      const unsigned k_address = shared_address(smem_k + tile_stage * Tiles::kStageElems + k_lane_offset);
      const unsigned v_address = shared_address(smem_v + tile_stage * Tiles::kStageElems + v_lane_offset);
      const unsigned char* k_bytes = ring + (block % Direct::kStages) * Direct::kStageBytes;
      const unsigned char* v_bytes = k_bytes + Direct::kTileBytes;

      // S = Q K^T for this warp's 16 tokens.
      float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
      if constexpr (kDirect) {
#pragma unroll
        for (int h = 0; h < kHeadDim / 64; ++h) {
          const uint4 k0 = *reinterpret_cast<const uint4*>(k_bytes + k_read[0][h & 1] + 128 * (h >> 1));
          const uint4 k1 = *reinterpret_cast<const uint4*>(k_bytes + k_read[1][h & 1] + 128 * (h >> 1));
          const unsigned w0[4] = {k0.x, k0.y, k0.z, k0.w};
          const unsigned w1[4] = {k1.x, k1.y, k1.z, k1.w};
#pragma unroll
          for (int step = 0; step < 4; ++step) {
            unsigned a[4];
            ldmatrix_x4(a, q_address + (4 * h + step) * 32);
            Mma<fp16_t>::run(s[0], a, fp8x2_to_f16x2<kE5m2>(w0[step]), fp8x2_to_f16x2<kE5m2>(w0[step] >> 16));
            Mma<fp16_t>::run(s[1], a, fp8x2_to_f16x2<kE5m2>(w1[step]), fp8x2_to_f16x2<kE5m2>(w1[step] >> 16));
          }
        }
      } else {
#pragma unroll
        for (int kk = 0; kk < kHeadDim / 16; ++kk) {
          unsigned a[4];
          unsigned b[4];
          ldmatrix_x4(a, q_address + kk * 32);
          ldmatrix_x4(b, k_address + kk * 32);
          Mma<T>::run(s[0], a, b[0], b[1]);
          Mma<T>::run(s[1], a, b[2], b[3]);
        }
      }
      if constexpr (kFp8) {  // scores as if K were dequantized
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[j][e] *= k_scale;
      }

      // O += P V.
      unsigned pa[4];
      state.template step<typename MmaType<T, kDirect>::type>(s, pa, p, w, warp_first_token);  // f16 on the direct path
      if constexpr (kDirect) {
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
              Mma<fp16_t>::run(state.o[tile], pa, fp8x2_to_f16x2<kE5m2>(first[i >> 1] >> shift),
                               fp8x2_to_f16x2<kE5m2>(second[i >> 1] >> shift));
            }
          }
        }
      } else {
#pragma unroll
        for (int dd = 0; dd < kHeadDim / 16; ++dd) {
          unsigned b[4];
          ldmatrix_x4_trans(b, v_address + dd * 32);
          Mma<T>::run(state.o[2 * dd], pa, b[0], b[1]);
          Mma<T>::run(state.o[2 * dd + 1], pa, b[2], b[3]);
        }
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
  merge_decode_warps<T, kHeadDim, kFlags, kDirect>(p, w, state, smem_k, v_scale);
}

}  // namespace astrai
