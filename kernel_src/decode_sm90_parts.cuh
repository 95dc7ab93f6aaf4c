// The sm_90a decode's parts (paged_decode_sm90.cuh): its ring's shape and swizzle, warp 0's TMA
// copies, the tail block's fix-up, each split
// group's place in shared memory, the barriers' setup, the warp's S and P V steps from swizzled
// tiles, and a wide CTA's merge of its splits.
#pragma once

#include "hopper_params.h"
#include "hopper_ptx.cuh"
#include "paged_decode.cuh"

namespace astrai {

// kKvBytes: 2 for a 16-bit cache, 1 for an FP8 one, whose rows and stages are half as long. A
// tile is [chunks][64 rows][row bytes]: rows of 128 bytes with the 128-byte swizzle, but an FP8
// row at hd64 is 64 bytes, one chunk with the 64-byte swizzle (what its 64-byte boxes take).
// kWide: a group of a wide CTA (its ring may take more stages: decode_sm90_stages).
template <int kHeadDim, int kPageSize, int kKvBytes = 2, bool kWide = false>
struct DecodeSm90Shape {
  static_assert(kHeadDim % 64 == 0 && kHeadDim <= 256, "head_dim");
  static_assert(kKvBytes == 2 || kKvBytes == 1, "16-bit or FP8 elements");
  using Kv = KvLayout<kPageSize>;
  static_assert(!Kv::kPaged || kPageSize >= 16, "page_size");
  static constexpr int kStages = decode_sm90_stages(kHeadDim, kKvBytes == 1, kWide);
  static constexpr int kRowBytes = kHeadDim * kKvBytes < 128 ? kHeadDim * kKvBytes : 128;  // a box's row
  static constexpr int kChunks = kHeadDim * kKvBytes / kRowBytes;   // chunks of a row
  static constexpr int kChunkBytes = kDecodeBlockTokens * kRowBytes;  // one chunk of a block's K or V
  static constexpr int kTileBytes = kChunks * kChunkBytes;          // a block's K or V
  static constexpr int kStageBytes = 2 * kTileBytes;
  static constexpr int kBoxRows = Kv::box_rows(kDecodeBlockTokens, kDecodeBlockTokens);
  static constexpr int kBoxes = kDecodeBlockTokens / kBoxRows;  // per chunk of K or V
  static constexpr int kCopies = 2 * kChunks * kBoxes;          // boxes per block, a lane each
  static_assert(kCopies <= 32, "one lane per box");
  static constexpr int kQBytes = kDecodeHeadsPerTile * (kHeadDim + 8) * 2;
  static_assert(kStages * kStageBytes >= decode_merge_bytes<kHeadDim>(), "the merge fits in the ring");
  // The Q tile, the alignment slack, the ring and its barriers: what the host reserves.
  static_assert(kQBytes + 1024 + kStages * (kStageBytes + 8) <= decode_sm90_smem_bytes(kHeadDim, kKvBytes == 1, kWide),
                "decode_sm90_smem_bytes covers the kernel's layout");
};

// Byte offset of 16-byte piece `piece` of row `row` in a swizzled K or V tile: rows of 128 bytes
// (piece c at c ^ row % 8 of its chunk's row), or of 64 (piece c at c ^ (row / 2) % 4: the
// 64-byte swizzle XORs address bits 4-5 with bits 7-8).
template <int kChunkBytes, int kRowBytes = 128>
__device__ __forceinline__ int swizzled_offset(int row, int piece) {
  if constexpr (kRowBytes == 64) return row * 64 + (((piece & 3) ^ ((row >> 1) & 3)) << 4);
  return (piece >> 3) * kChunkBytes + row * 128 + (((piece & 7) ^ (row & 7)) << 4);
}

// Warp 0's TMA copies of a block: lane j < kCopies copies box j % kBoxes of chunk
// (j / kBoxes) % kChunks of K (of V from j >= kCopies / 2). Box coordinates: dims, KV head, row
// in the page (or token), page (or sequence).
template <int kHeadDim, int kPageSize, int kKvBytes = 2, bool kWide = false>
struct DecodeSm90Copy {
  using Shape = DecodeSm90Shape<kHeadDim, kPageSize, kKvBytes, kWide>;
  int lane, box, chunk, offset;
  const sm90::TmaMap* map;

  __device__ __forceinline__ DecodeSm90Copy(const sm90::TmaMap* map_k, const sm90::TmaMap* map_v, int lane_)
      : lane(lane_),
        box(lane_ % Shape::kBoxes),
        chunk((lane_ / Shape::kBoxes) % Shape::kChunks),
        offset((lane_ >= Shape::kCopies / 2 ? Shape::kTileBytes : 0) + chunk * Shape::kChunkBytes +
               box * Shape::kBoxRows * Shape::kRowBytes),
        map(lane_ >= Shape::kCopies / 2 ? map_v : map_k) {}

  // The box's first element of a row.
  __device__ __forceinline__ int x() const { return Shape::kRowBytes / kKvBytes * chunk; }

  __device__ __forceinline__ static int box_row(int token) { return Shape::Kv::tma_row(token); }

  // The page of this lane's box in `block` of a split starting at `begin`, looked up for tokens
  // below `end` (the table has a slot for every token below kv_capacity), else -1; contiguous:
  // the sequence. Ids of boxes past the split's real end are dropped at issue. l2_only: the
  // read ahead of the wait (see kv_table_row).
  __device__ __forceinline__ int lookup(const PagedDecodeParams& p, const int* table_row, int begin, int end, int block,
                                        bool l2_only) const {
    if constexpr (!KvLayout<kPageSize>::kPaged) {  // the box's page coordinate is the sequence
      return static_cast<int>(blockIdx.z);
    } else {
      const int token = begin + block * kDecodeBlockTokens + box * Shape::kBoxRows;
      if (lane >= Shape::kCopies || token >= end || table_row == nullptr) return -1;
      return l2_only ? table_page<true>(p, table_row, token / kPageSize) : table_page(p, table_row, token / kPageSize);
    }
  }

  // Block `block` of the split into its stage (`page`: this lane's box's, from lookup).
  __device__ __forceinline__ void issue(unsigned char* ring, sm90::u64* full, int block, int page,
                                        const DecodeWork& w) const {
    const int s = block % Shape::kStages;
    if (lane == 0) sm90::mbar_arrive_expect_tx(&full[s], Shape::kStageBytes);
    __syncwarp();
    if (lane < Shape::kCopies) {
      const int token = w.split_begin + block * kDecodeBlockTokens + box * Shape::kBoxRows;
      sm90::tma_load_4d(ring + s * Shape::kStageBytes + offset, map, &full[s], x(), w.kv_head, box_row(token),
                        token < w.split_end ? page : -1, l2_evict_first_policy());
    }
  }
};

// A block's last rows as the kernel reads them: V rows past the split cleared (a loaded page's
// rows past the sequence may hold anything, and 0 * NaN is NaN in P V), the appended token's K
// and V rows written from new_k/new_v (an FP8 cache's quantized with the head's scales, as the
// append stores them).
template <typename T, int kHeadDim, int kPageSize, int kFlags = 0>
__device__ __forceinline__ void sm90_decode_fix_tail(const PagedDecodeParams& p, const DecodeWork& w,
                                                     unsigned char* k_tile, unsigned char* v_tile, int first_token,
                                                     int warp, int lane) {
  constexpr bool kFp8 = has_fp8_kv<kFlags>();
  constexpr int kPieces = kFp8 ? kHeadDim / 16 : kHeadDim / 8;  // 16-byte pieces of a row
  using Shape = DecodeSm90Shape<kHeadDim, kPageSize, kFp8 ? 1 : 2>;
  const bool has_append = w.seq.append_token >= first_token && w.seq.append_token < first_token + 16;
  if (first_token + 16 <= w.split_end && !has_append) return;
  for (int i = lane; i < 16 * kPieces; i += 32) {
    const int r = i / kPieces;
    const int piece = i % kPieces;
    const int token = first_token + r;
    const int offset = swizzled_offset<Shape::kChunkBytes, Shape::kRowBytes>(warp * 16 + r, piece);
    if (token >= w.split_end) {
      *reinterpret_cast<uint4*>(v_tile + offset) = make_uint4(0u, 0u, 0u, 0u);
    } else if (token == w.seq.append_token) {
      const T* k_src =
          static_cast<const T*>(p.new_k) + w.batch_index * p.new_k_stride_batch + w.kv_head * p.new_k_stride_head;
      const T* v_src =
          static_cast<const T*>(p.new_v) + w.batch_index * p.new_v_stride_batch + w.kv_head * p.new_v_stride_head;
      if constexpr (kFp8) {
        constexpr bool kE5m2 = has_feature<kFlags>(kFeatureKvE5m2);
        const int head = w.kv_head;
        *reinterpret_cast<uint4*>(k_tile + offset) = quantize_fp8x16<T, kE5m2>(
            k_src + 16 * piece, kv_scale(p.features.k_scale, p.features.kv_scale_stride, head));
        *reinterpret_cast<uint4*>(v_tile + offset) = quantize_fp8x16<T, kE5m2>(
            v_src + 16 * piece, kv_scale(p.features.v_scale, p.features.kv_scale_stride, head));
      } else {
        *reinterpret_cast<uint4*>(k_tile + offset) = reinterpret_cast<const uint4*>(k_src)[piece];
        *reinterpret_cast<uint4*>(v_tile + offset) = reinterpret_cast<const uint4*>(v_src)[piece];
      }
    }
  }
  sm90::fence_proxy_async_shared();  // before a later TMA refills the stage
  __syncwarp();
}

// A wide CTA's empty split: its slot holds zeros with LSE -inf, which weigh nothing in the
// CTA's merge, or in split 0 of an empty sequence the sinks' LSE (as write_empty_rows gives the
// combine).
template <int kHeadDim, int kFlags>
__device__ __forceinline__ void write_empty_split_slot(const PagedDecodeParams& p, const DecodeWork& w, float* slot,
                                                       unsigned thread) {
  constexpr int kQLen = decode_q_len(kFlags);
  for (int i = thread; i < w.rows * kHeadDim; i += kDecodeThreads) slot[i] = 0.f;
  if (thread < w.rows)
    slot[kDecodeHeadsPerTile * kHeadDim + thread] =
        has_feature<kFlags>(kFeatureSink) && w.split == 0
            ? p.features.sinks[row_head<kQLen>(w.first_head, w.first_row, thread)]
            : negative_infinity();
}

// Group g's ring: the first 1 KB boundary (of the shared address) after the Q tile of its region
// (a CTA of one group: g = 0, the region is all of shared memory). Offset from smem_raw, not
// rounded as an integer, the pointer keeps its address space: the merge and the tail's stores
// into the ring compile to shared, not generic, accesses.
template <int kHeadDim>
__device__ __forceinline__ unsigned char* group_ring(unsigned char* smem_raw, unsigned g) {
  unsigned char* region = smem_raw + g * decode_sm90_wide_region_bytes(kHeadDim);
  const unsigned q_end = shared_address(region) + DecodeSm90Shape<kHeadDim, 0>::kQBytes;
  return region + ((q_end + 1023) & ~1023u) - shared_address(region);
}

// A wide CTA's end: once every thread has arrived on `merge_done`, each group having left its
// rows in its slot (an empty split: zeros and LSE -inf, or the sinks' LSE in split 0), the CTA
// merges each row's splits by their LSEs, as the split combine does, and writes the output and
// the LSE.
template <typename T, int kHeadDim, int kQLen, int kSplits>
__device__ __forceinline__ void merge_wide_splits(const PagedDecodeParams& p, const DecodeWork& w,
                                                  unsigned char* smem_raw, sm90::u64* merge_done) {
  using namespace sm90;
  mbar_arrive(merge_done);
  mbar_wait(merge_done, 0);
  const float* slots[kSplits];
#pragma unroll
  for (int g = 0; g < kSplits; ++g)
    slots[g] = reinterpret_cast<const float*>(group_ring<kHeadDim>(smem_raw, g) + decode_merge_bytes<kHeadDim>());
  // The group's split index of each slot is `g`; a CTA's splits cover its whole sequence.
  const SplitWorkspace direct{nullptr, nullptr, 1};
  for (int e = threadIdx.x; e < w.rows * (kHeadDim / 4); e += kSplits * kDecodeThreads) {
    const int row = e / (kHeadDim / 4);
    const int col = (e % (kHeadDim / 4)) * 4;
    float lse[kSplits];
    float max_lse = negative_infinity();
#pragma unroll
    for (int g = 0; g < kSplits; ++g) {
      lse[g] = slots[g][kDecodeHeadsPerTile * kHeadDim + row];
      max_lse = fmaxf(max_lse, lse[g]);
    }
    float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
    float total = 0.f;
#pragma unroll
    for (int g = 0; g < kSplits; ++g) {
      // Empty splits carry -inf and weigh nothing (their slot's values are never read); an
      // all-empty row outputs zeros.
      if (max_lse == negative_infinity() || lse[g] == negative_infinity()) continue;
      const float weight = __expf(lse[g] - max_lse);
      total += weight;
      const float4 v = *reinterpret_cast<const float4*>(slots[g] + row * kHeadDim + col);
      sum.x += weight * v.x;
      sum.y += weight * v.y;
      sum.z += weight * v.z;
      sum.w += weight * v.w;
    }
    const float scale = total > 0.f ? 1.f / total : 0.f;
    sum.x *= scale;
    sum.y *= scale;
    sum.z *= scale;
    sum.w *= scale;
    store_row_quad<T, kHeadDim, kQLen>(direct, p.out, p.out_stride_batch, p.out_stride_seq, p.out_stride_head, p.lse,
                                       p.batch, p.n_heads, 0, w.batch_index, row_token<kQLen>(w.first_row, row),
                                       row_head<kQLen>(w.first_head, w.first_row, row), col, sum,
                                       total > 0.f ? max_lse + __logf(total) : max_lse);
  }
}

// Before the wait for the previous kernel (only what no kernel writes): thread 0 sets up the
// ring's barriers (and a wide CTA's merge barrier, in group 0) and prefetches the tensor maps.
template <int kStages, int kSplits>
__device__ __forceinline__ void init_decode_sm90_barriers(sm90::u64* full, sm90::u64* merge_done, unsigned group,
                                                          const sm90::TmaMap* map_k, const sm90::TmaMap* map_v) {
  using namespace sm90;
  for (int s = 0; s < kStages; ++s) mbar_init(&full[s], 1);
  if (kSplits > 1 && group == 0) mbar_init(merge_done, kSplits * kDecodeThreads);
  fence_mbar_init();
  tma_prefetch_map(map_k);
  tma_prefetch_map(map_v);
}

// A lane's ldmatrix rows in a swizzled K or V tile (the fragment layouts of mma.m16n8k16) and the
// swizzle's XOR of their pieces: K rows 16w + (l / 16) 8 + l % 8, piece 2kk + (l / 8) % 2; V
// (transposed) rows 16w + ((l / 8) % 2) 8 + l % 8, piece 2dd + l / 16. Piece 2m + b of a row r
// sits at (2m) ^ (b ^ r % 8).
struct DecodeSm90Lanes {
  int k_row, k_xor, v_row, v_xor;
  __device__ __forceinline__ DecodeSm90Lanes(int warp, int lane)
      : k_row(warp * 16 + (lane >> 4) * 8 + (lane & 7)),
        k_xor(((lane >> 3) & 1) ^ (lane & 7)),
        v_row(warp * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)),
        v_xor((lane >> 4) ^ (lane & 7)) {}
};

// S = Q K^T for a warp's 16 tokens from a swizzled K tile: k_address is the lane's ldmatrix row,
// k_xor the swizzle's XOR of its pieces.
template <typename T, int kHeadDim, int kChunkBytes>
__device__ __forceinline__ void sm90_decode_scores(float (&sc)[2][4], unsigned q_address, unsigned k_address,
                                                   int k_xor) {
#pragma unroll
  for (int kk = 0; kk < kHeadDim / 16; ++kk) {
    unsigned a[4];
    unsigned b[4];
    ldmatrix_x4(a, q_address + kk * 32);
    ldmatrix_x4(b, k_address + (kk >> 2) * kChunkBytes + (((2 * (kk & 3)) ^ k_xor) << 4));
    Mma<T>::run(sc[0], a, b[0], b[1]);
    Mma<T>::run(sc[1], a, b[2], b[3]);
  }
}

// O += P V for a warp's 16 tokens from a swizzled V tile (transposing ldmatrix).
template <typename T, int kHeadDim, int kChunkBytes>
__device__ __forceinline__ void sm90_decode_pv(float (&o)[kHeadDim / 8][4], const unsigned (&pa)[4],
                                               unsigned v_address, int v_xor) {
#pragma unroll
  for (int dd = 0; dd < kHeadDim / 16; ++dd) {
    unsigned b[4];
    ldmatrix_x4_trans(b, v_address + (dd >> 2) * kChunkBytes + (((2 * (dd & 3)) ^ v_xor) << 4));
    Mma<T>::run(o[2 * dd], pa, b[0], b[1]);
    Mma<T>::run(o[2 * dd + 1], pa, b[2], b[3]);
  }
}

}  // namespace astrai
