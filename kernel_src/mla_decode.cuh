// MLA decode, absorbed form (kernel_params.h's MlaDecodeParams): every query head of a request
// reads the same latent KV rows, so a CTA takes kRowGroups x 16 query rows (heads, and tokens
// of a multi-token decode, token-major) and streams the request's KV blocks once for all of
// them: S = Q K^T over 576 dims, then O += P V over V's 512 dims, on mma.sync (sm_80+).
//
// The 8 warps of a 64-row CTA pair up: warp (g, h) owns query rows 16g..16g+15 and, of each
// block, the key columns of half h for the scores and V's dims 256h..256h+255 for the output,
// so a thread's output accumulators are 16 x 256 / 32 = 128 floats. The pair shares its rows'
// maxima through shared memory (both halves then rescale by the same factor) and the
// probabilities through a tile that both read as the A operand of P V; each half keeps its own
// partial row sums, added once at the end.
#pragma once

#include "astrai_common.cuh"
#include "attention_combine.cuh"
#include "mma_utils.cuh"

#ifndef ASTRAI_NO_MMA
namespace astrai {

template <typename T, int kRowGroups, int kBlockN, bool kFp8 = false>
struct MlaTile {
  using Type = T;
  static constexpr int kBlock = kBlockN;
  static constexpr int kRows = 16 * kRowGroups;
  static constexpr int kThreads = 64 * kRowGroups;  // two warps per 16 rows
  static constexpr int kRowBytes = mla_row_bytes();
  static constexpr int kChunks = kMlaQkDim / 8;     // 16-byte pieces of a row
  static constexpr int kHalfN = kBlockN / 2;        // key columns of a warp's scores
  static constexpr int kScoreTiles = kHalfN / 8;
  static constexpr int kOutTiles = kMlaVDim / 2 / 8;  // n8 tiles of a warp's 256 output dims
  static constexpr int kPRowBytes = (kBlockN + 8) * 2;
  static constexpr int kKvOffset = kRows * kRowBytes;
  // What a stage holds as loaded: 16-bit rows, or an FP8 cache's 576-byte rows, which are
  // widened into the one 16-bit tile at kTileOffset before the block's math.
  static constexpr int kElementBytes = kFp8 ? 1 : 2;
  static constexpr int kLoadRowBytes = kFp8 ? kMlaQkDim : kRowBytes;
  static constexpr int kLoadChunks = kMlaQkDim * kElementBytes / 16;
  static constexpr int kStageBytes = kBlockN * kLoadRowBytes;
  static constexpr int kTileOffset = kKvOffset + 2 * kStageBytes;  // FP8 only
  static constexpr int kPOffset = kKvOffset + mla_kv_bytes(kBlockN, kFp8);
  static constexpr int kRedOffset = kPOffset + kRows * kPRowBytes;
  static_assert(kBlockN == 16 || kBlockN == 32, "blocks of 16 or 32 keys");
  static_assert(kRowGroups >= 1 && kRowGroups <= 4, "16 to 64 query rows a CTA");
  static_assert(kRedOffset + 4 * kRows * 4 == mla_decode_smem_bytes(kRows, kBlockN, kFp8),
                "host and kernel layouts agree");
};

// What a CTA covers: request b's query rows [row0, row0 + kRows) of rows_total, and its keys
// [begin, end) of the request's `len` (one split of them).
struct MlaWork {
  int b, row0, rows_total, len, begin, end;
};

template <int kPageSize, int kElementBytes>
__device__ __forceinline__ const void* mla_kv_row(const MlaDecodeParams& p, int b, int key, bool* valid) {
  const bool wide = (p.layout_bits & kWidePageTable) != 0;
  const int logical = key / kPageSize;
  const int page = load_index(p.page_table, b * p.page_table_stride + logical, wide);
  *valid = page >= 0 && page < p.num_pages;
  const long long offset = static_cast<long long>(page) * p.kv_stride_page + (key % kPageSize) * p.kv_stride_token;
  return static_cast<const unsigned char*>(p.kv_cache) + (*valid ? offset : 0) * kElementBytes;
}

// Query rows of the tile into shared memory; rows past the request's read as zeros.
template <int kQLen, typename Tile>
__device__ __forceinline__ void mla_load_q(const MlaDecodeParams& p, const MlaWork& w, unsigned sq) {
  for (int i = threadIdx.x; i < Tile::kRows * Tile::kChunks; i += Tile::kThreads) {
    const int local = i / Tile::kChunks;
    const int chunk = i % Tile::kChunks;
    const int row = w.row0 + local;
    const bool live = row < w.rows_total;
    const int token = live ? row / p.n_heads : 0;
    const int head = live ? row % p.n_heads : 0;
    const auto* src = static_cast<const typename Tile::Type*>(p.q) + w.b * p.q_stride_batch + token * p.q_stride_seq +
                   head * p.q_stride_head + chunk * 8;
    cp_async_16(sq + local * Tile::kRowBytes + chunk * 16, src, live ? 16 : 0);
  }
}

// Keys [first, first + Tile::kBlock) into a stage; keys at or past w.end, and pages outside the
// pool, read as zeros (their scores are masked, and zero V rows add nothing).
template <int kPageSize, typename Tile>
__device__ __forceinline__ void mla_load_block(const MlaDecodeParams& p, const MlaWork& w, int first, unsigned stage) {
  for (int i = threadIdx.x; i < Tile::kBlock * Tile::kLoadChunks; i += Tile::kThreads) {
    const int local = i / Tile::kLoadChunks;
    const int chunk = i % Tile::kLoadChunks;
    const int key = first + local;
    bool valid = false;
    const void* row = key < w.end ? mla_kv_row<kPageSize, Tile::kElementBytes>(p, w.b, key, &valid) : p.kv_cache;
    cp_async_16(stage + local * Tile::kLoadRowBytes + chunk * 16, static_cast<const unsigned char*>(row) + chunk * 16,
                valid ? 16 : 0);
  }
}

// The last key row `local` of the tile may see: all of them for a single-token decode, its own
// position for token t of kQLen (keys up to len - kQLen + t); -1 for a row past the request's.
template <int kQLen>
__device__ __forceinline__ int mla_row_limit(const MlaDecodeParams& p, const MlaWork& w, int local) {
  const int row = w.row0 + local;
  if (row >= w.rows_total) return -1;
  return kQLen == 1 ? w.len - 1 : w.len - kQLen + row / p.n_heads;
}

// This warp's scores of a block: its 16 rows against its half of the block's keys, over 576 dims.
template <typename Tile>
__device__ __forceinline__ void mla_scores(unsigned sq, unsigned stage, int group, int half,
                                           float (&s)[Tile::kScoreTiles][4]) {
  const int lane = threadIdx.x % 32;
  const unsigned a_row = sq + (group * 16 + lane % 16) * Tile::kRowBytes + (lane / 16) * 16;
#pragma unroll
  for (int t = 0; t < Tile::kScoreTiles; ++t) s[t][0] = s[t][1] = s[t][2] = s[t][3] = 0.f;
  if constexpr (Tile::kScoreTiles == 2) {
    // One x4 load: keys 0-7 and 8-15 of the half, each at dims k and k + 8.
    const unsigned b_row = stage + (half * 16 + (lane / 16) * 8 + lane % 8) * Tile::kRowBytes + ((lane / 8) % 2) * 16;
#pragma unroll 4
    for (int k = 0; k < kMlaQkDim / 16; ++k) {
      unsigned a[4], b[4];
      ldmatrix_x4(a, a_row + k * 32);
      ldmatrix_x4(b, b_row + k * 32);
      Mma<typename Tile::Type>::run(s[0], a, b[0], b[1]);
      Mma<typename Tile::Type>::run(s[1], a, b[2], b[3]);
    }
  } else {
    // One x4 load: the half's 8 keys at dims k, k + 8, k + 16 and k + 24 (two steps).
    const unsigned b_row = stage + (half * 8 + lane % 8) * Tile::kRowBytes + (lane / 8) * 16;
#pragma unroll 2
    for (int k = 0; k < kMlaQkDim / 16; k += 2) {
      unsigned a0[4], a1[4], b[4];
      ldmatrix_x4(a0, a_row + k * 32);
      ldmatrix_x4(a1, a_row + (k + 1) * 32);
      ldmatrix_x4(b, b_row + k * 32);
      Mma<typename Tile::Type>::run(s[0], a0, b[0], b[1]);
      Mma<typename Tile::Type>::run(s[0], a1, b[2], b[3]);
    }
  }
}

// O += P V for this warp's rows and its 256 output dims, P from the shared probability tile.
template <typename Tile>
__device__ __forceinline__ void mla_accumulate(unsigned sp, unsigned stage, int group, int half,
                                               float (&o)[Tile::kOutTiles][4]) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int kt = 0; kt < Tile::kBlock / 16; ++kt) {
    unsigned a[4];
    ldmatrix_x4(a, sp + (group * 16 + lane % 16) * Tile::kPRowBytes + kt * 32 + (lane / 16) * 16);
    const unsigned v_row =
        stage + (kt * 16 + lane % 8 + ((lane / 8) % 2) * 8) * Tile::kRowBytes + half * (kMlaVDim / 2) * 2 + (lane / 16) * 16;
#pragma unroll
    for (int n = 0; n < Tile::kOutTiles / 2; ++n) {
      unsigned b[4];
      ldmatrix_x4_trans(b, v_row + n * 32);
      Mma<typename Tile::Type>::run(o[2 * n], a, b[0], b[1]);
      Mma<typename Tile::Type>::run(o[2 * n + 1], a, b[2], b[3]);
    }
  }
}

// One block's online softmax for this warp's rows: keys past a row's limit are masked, the
// halves' row maxima are shared (so both rescale by the same factor), the output is rescaled
// by the change of maximum, and the probabilities go to the shared tile as T. `first` is the
// first key of this warp's half of the block; m and l are the rows' maximum (log2 units) and
// this thread's partial sum.
template <typename Tile>
__device__ __forceinline__ void mla_softmax(float (&s)[Tile::kScoreTiles][4], int first, const int (&limit)[2],
                                            float scale_log2, float (&m)[2], float (&l)[2],
                                            float (&o)[Tile::kOutTiles][4], float* red_max, unsigned char* sp,
                                            int group, int half) {
  const int lane = threadIdx.x % 32;
  float block_max[2] = {negative_infinity(), negative_infinity()};
#pragma unroll
  for (int t = 0; t < Tile::kScoreTiles; ++t)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = first + t * 8 + 2 * (lane % 4) + (e & 1);
      s[t][e] = key <= limit[e >> 1] ? s[t][e] * scale_log2 : negative_infinity();
      block_max[e >> 1] = fmaxf(block_max[e >> 1], s[t][e]);
    }
  const int row[2] = {group * 16 + lane / 4, group * 16 + lane / 4 + 8};
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    block_max[i] = quad_max(block_max[i]);
    if (lane % 4 == 0) red_max[half * Tile::kRows + row[i]] = block_max[i];
  }
  __syncthreads();
  float alpha[2], base[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    alpha[i] = online_softmax_update(m[i], l[i], fmaxf(red_max[row[i]], red_max[Tile::kRows + row[i]]), base[i]);
  }
#pragma unroll
  for (int n = 0; n < Tile::kOutTiles; ++n) {
    o[n][0] *= alpha[0];
    o[n][1] *= alpha[0];
    o[n][2] *= alpha[1];
    o[n][3] *= alpha[1];
  }
#pragma unroll
  for (int t = 0; t < Tile::kScoreTiles; ++t)
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float p0 = fast_exp2(s[t][2 * i] - base[i]);
      const float p1 = fast_exp2(s[t][2 * i + 1] - base[i]);
      l[i] += p0 + p1;
      const int col = half * Tile::kHalfN + t * 8 + 2 * (lane % 4);
      *reinterpret_cast<unsigned*>(sp + row[i] * Tile::kPRowBytes + col * 2) = pack2<typename Tile::Type>(p0, p1);
    }
}

// The finished rows: the halves' sums added, the output normalized (and an FP8 cache's V
// scale applied) and written to `out` (and the LSE), or with several splits to the split
// workspace for the combine. An empty row is zeros with an LSE of -inf.
template <int kQLen, typename Tile>
__device__ __forceinline__ void mla_store(const MlaDecodeParams& p, const MlaWork& w, const float (&m)[2],
                                          float (&l)[2], const float (&o)[Tile::kOutTiles][4], float* red_sum,
                                          float v_scale, int group, int half) {
  const int lane = threadIdx.x % 32;
  const int row[2] = {group * 16 + lane / 4, group * 16 + lane / 4 + 8};
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
    if (lane % 4 == 0) red_sum[half * Tile::kRows + row[i]] = l[i];
  }
  __syncthreads();
  const bool split = p.workspace.num_splits > 1;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = w.row0 + row[i];
    if (r >= w.rows_total) continue;
    const int token = r / p.n_heads;
    const int head = r % p.n_heads;
    const float total = red_sum[row[i]] + red_sum[Tile::kRows + row[i]];
    const float inverse = lse_merge_inverse(total) * v_scale;
    const float lse = total > 0.f ? (m[i] + __log2f(total)) * 0.69314718f : negative_infinity();
    const int col = half * (kMlaVDim / 2) + 2 * (lane % 4);
    if (split) {
      const long long at = split_row<kQLen>(blockIdx.z, p.batch, w.b, token, p.n_heads, head);
      float* dst = p.workspace.partial_out + at * kMlaVDim + col;
#pragma unroll
      for (int n = 0; n < Tile::kOutTiles; ++n)
        *reinterpret_cast<float2*>(dst + n * 8) = make_float2(o[n][2 * i] * inverse, o[n][2 * i + 1] * inverse);
      if (half == 0 && lane % 4 == 0) p.workspace.partial_lse[at] = lse;
    } else {
      auto* dst = out_row<typename Tile::Type>(p.out, p.out_stride_batch, p.out_stride_seq, p.out_stride_head, w.b,
                                               token, head) + col;
#pragma unroll
      for (int n = 0; n < Tile::kOutTiles; ++n)
        *reinterpret_cast<unsigned*>(dst + n * 8) =
            pack2<typename Tile::Type>(o[n][2 * i] * inverse, o[n][2 * i + 1] * inverse);
      if (p.lse != nullptr && half == 0 && lane % 4 == 0) p.lse[final_lse_row<kQLen>(w.b, token, p.n_heads, head)] = lse;
    }
  }
}

// Grid: (query-row tiles, batch, splits); block: 64 x kRowGroups threads; shared memory
// mla_decode_smem_bytes(16 x kRowGroups, kBlockN, FP8). Two stages of KV blocks are in flight.
// kFlags: an FP8 cache (kFeatureKvE4m3 or kFeatureKvE5m2), widened exactly to T a block at a
// time; its scale multiplies the scores and the output, not each element.
template <typename T, int kPageSize, int kQLen, int kRowGroups, int kBlockN, unsigned kFlags>
__global__ void __launch_bounds__(64 * kRowGroups, 1) mla_decode_kernel(const MlaDecodeParams p) {
  constexpr bool kFp8 = has_fp8_kv<kFlags>();
  constexpr bool kE5m2 = has_feature<kFlags>(kFeatureKvE5m2);
  static_assert((kFlags & ~(kFeatureKvE4m3 | kFeatureKvE5m2)) == 0, "MLA decode's features: an FP8 cache");
  using Tile = MlaTile<T, kRowGroups, kBlockN, kFp8>;
  static_assert(kQLen >= 1 && kQLen <= kMaxDecodeQLen, "q_len 1..8");
  extern __shared__ __align__(128) unsigned char smem[];
  wait_for_previous_grid();  // a no-op unless launched as a programmatic dependent
  allow_dependent_grid();
  MlaWork w;
  w.b = blockIdx.y;
  w.row0 = blockIdx.x * Tile::kRows;
  w.rows_total = kQLen * p.n_heads;
  w.len = min(max(load_seq_len(p.seq_lens, w.b, p.layout_bits), 0), p.kv_capacity);
  w.begin = blockIdx.z * p.tokens_per_split;
  w.end = min(w.len, w.begin + p.tokens_per_split);
  const int blocks = w.end > w.begin ? (w.end - w.begin + kBlockN - 1) / kBlockN : 0;
  const int warp = threadIdx.x / 32;
  const int group = warp / 2;
  const int half = warp % 2;
  const unsigned sq = shared_address(smem);
  const unsigned kv = sq + Tile::kKvOffset;
  float* red = reinterpret_cast<float*>(smem + Tile::kRedOffset);
  if (blocks > 0) {
    mla_load_q<kQLen, Tile>(p, w, sq);
    mla_load_block<kPageSize, Tile>(p, w, w.begin, kv);
  }
  cp_async_commit();
  if (blocks > 1) mla_load_block<kPageSize, Tile>(p, w, w.begin + kBlockN, kv + Tile::kStageBytes);
  cp_async_commit();

  const float kv_scale = kFp8 ? __ldg(p.kv_scale) : 1.f;
  const float score_scale = p.scale_log2 * kv_scale;
  const int lane = threadIdx.x % 32;
  int limit[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) limit[i] = min(mla_row_limit<kQLen>(p, w, group * 16 + lane / 4 + 8 * i), w.end - 1);
  float o[Tile::kOutTiles][4];
#pragma unroll
  for (int n = 0; n < Tile::kOutTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m[2] = {negative_infinity(), negative_infinity()};
  float l[2] = {0.f, 0.f};
  for (int j = 0; j < blocks; ++j) {
    cp_async_wait<1>();
    __syncthreads();  // block j (and the query rows) landed for every thread
    const unsigned loaded = kv + (j & 1) * Tile::kStageBytes;
    unsigned stage = loaded;
    if constexpr (kFp8) {
      widen_fp8_tile<T, kMlaQkDim, kMlaQkDim + 8, kBlockN, Tile::kThreads, kE5m2>(
          smem + Tile::kKvOffset + (j & 1) * Tile::kStageBytes, reinterpret_cast<T*>(smem + Tile::kTileOffset));
      __syncthreads();  // the tile is whole and the byte stage free: refill it now
      if (j + 2 < blocks) mla_load_block<kPageSize, Tile>(p, w, w.begin + (j + 2) * kBlockN, loaded);
      cp_async_commit();
      stage = sq + Tile::kTileOffset;
    }
    float s[Tile::kScoreTiles][4];
    mla_scores<Tile>(sq, stage, group, half, s);
    mla_softmax<Tile>(s, w.begin + j * kBlockN + half * Tile::kHalfN, limit, score_scale, m, l, o, red,
                      smem + Tile::kPOffset, group, half);
    __syncthreads();  // the probability tile is whole
    mla_accumulate<Tile>(sq + Tile::kPOffset, stage, group, half, o);
    __syncthreads();  // every warp is done with the stage (or the widened tile) before it is refilled
    if constexpr (!kFp8) {
      if (j + 2 < blocks) mla_load_block<kPageSize, Tile>(p, w, w.begin + (j + 2) * kBlockN, stage);
      cp_async_commit();
    }
  }
  cp_async_wait<0>();
  mla_store<kQLen, Tile>(p, w, m, l, o, red + 2 * Tile::kRows, kv_scale, group, half);
}

}  // namespace astrai
#endif  // ASTRAI_NO_MMA
