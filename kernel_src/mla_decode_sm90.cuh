// MLA decode on sm_90a (absorbed form, as mla_decode.cuh computes it): 64 query rows of one
// request a CTA (heads, and tokens of a multi-token decode, token-major; rows past the request's
// are zeros and stored nowhere), its latent rows in blocks of 64 by TMA into a two-stage ring,
// S = Q K^T and O += P V on wgmma. Q stays in shared memory for the whole walk, so each block is
// read from shared memory by the tensor cores alone, where the mma.sync kernel re-reads Q and
// the block with ldmatrix for every 16 rows.
//
// Warpgroup 0: one thread issues a block's boxes (a page's rows of one 64-column chunk each;
// pages outside the pool or keys past the split give zeros) once the consumers have released its
// stage. Consumer warpgroup c (1 and 2 are c = 0, 1) computes S over 576 dims for the block's keys
// 32c .. 32c + 31, shares its rows' block maxima with the other (both then rescale by the same
// factor), writes its half of P to a shared tile, and adds P V over all 64 keys into its half of
// O: V's dims 256c .. 256c + 255, the chunks 4c .. 4c + 3 of the block's rows. Each keeps the
// partial sums of its keys; they are added once, at the end. The tail block's V rows past the
// split are zeroed before P V (a page's rows past the sequence may hold anything, and 0 * NaN is
// NaN).
//
// Shared memory (mla_sm90_smem_bytes): from the first 1024-byte boundary, the Q tile, then the
// stages, each [9 chunks of 64 columns][64 rows][128 bytes], then P [64 rows][64 keys], all with
// the 128-byte swizzle (16-byte piece c of row r at c ^ (r % 8)); then the barriers and the rows'
// exchange (two floats a row).
// Tensor map: {576, 1, page_size, num_pages} (the decode's paged layout with one KV head), box
// {64, 1, min(page_size, 64), 1}.
#pragma once

#include "hopper_params.h"
#include "hopper_ptx.cuh"
#include "mla_decode.cuh"

namespace astrai {

template <int kPageSize>
struct MlaSm90Shape {
  static constexpr int kChunks = kMlaQkDim / 64;                 // 64-column chunks of a row
  static constexpr int kChunkBytes = kMlaSm90BlockN * 128;       // one chunk of a tile
  static constexpr int kBoxRows = kPageSize < kMlaSm90BlockN ? kPageSize : kMlaSm90BlockN;
  static constexpr int kBoxes = kMlaSm90BlockN / kBoxRows;       // boxes of a chunk
  static constexpr int kVChunks = kMlaVDim / 64 / 2;             // a consumer's chunks of V
  static_assert(kChunks * kChunkBytes == kMlaSm90TileBytes, "a tile is 9 chunks of 64 rows");
  static_assert(mla_sm90_serves(kPageSize, 0u), "pages of 16 tokens or more");
};

// The Q tile: rows [w.row0, w.row0 + 64) into the swizzled layout by the 256 consumer threads
// (`thread` 0..255); rows past the request's are zeros. Then visible to the tensor cores.
template <typename T>
__device__ __forceinline__ void mla_sm90_load_q(const MlaDecodeParams& p, const MlaWork& w, unsigned char* smem_q,
                                                int thread) {
  constexpr int kPieces = kMlaQkDim / 8;  // 16-byte pieces of a row
  for (int i = thread; i < kMlaSm90Rows * kPieces; i += 256) {
    const int local = i / kPieces;
    const int piece = i % kPieces;
    const int row = w.row0 + local;
    uint4 value = make_uint4(0u, 0u, 0u, 0u);
    if (row < w.rows_total) {
      const T* src = static_cast<const T*>(p.q) + w.b * p.q_stride_batch + (row / p.n_heads) * p.q_stride_seq +
                     (row % p.n_heads) * p.q_stride_head;
      value = __ldg(reinterpret_cast<const uint4*>(src) + piece);
    }
    *reinterpret_cast<uint4*>(smem_q + (piece / 8) * MlaSm90Shape<64>::kChunkBytes + local * 128 +
                              (((piece % 8) ^ (local % 8)) << 4)) = value;
  }
  sm90::fence_proxy_async_shared();  // the generic stores before the wgmma reads
  sm90::named_bar_sync(1, 256);
}

// Warpgroup 0's walk: block j into stage j % 2 once the consumers released it (j >= 2).
template <int kPageSize>
__device__ __forceinline__ void mla_sm90_produce(const MlaDecodeParams& p, const MlaWork& w, const sm90::TmaMap* map,
                                                 unsigned char* ring, sm90::u64* full, sm90::u64* empty, int blocks) {
  using Shape = MlaSm90Shape<kPageSize>;
  const bool wide = (p.layout_bits & kWidePageTable) != 0;
  for (int j = 0; j < blocks; ++j) {
    const int s = j % kMlaSm90Stages;
    sm90::mbar_wait(&empty[s], ((j / kMlaSm90Stages) & 1) ^ 1);
    sm90::mbar_arrive_expect_tx(&full[s], kMlaSm90TileBytes);
    const int first = w.begin + j * kMlaSm90BlockN;
    for (int box = 0; box < Shape::kBoxes; ++box) {
      const int key = first + box * Shape::kBoxRows;
      // Past the split, or a page outside the pool: a coordinate TMA fills with zeros.
      const int page = key < w.end ? load_index(p.page_table, w.b * p.page_table_stride + key / kPageSize, wide) : -1;
#pragma unroll
      for (int c = 0; c < Shape::kChunks; ++c)
        sm90::tma_load_4d(ring + s * kMlaSm90TileBytes + c * Shape::kChunkBytes + box * Shape::kBoxRows * 128, map,
                          &full[s], 64 * c, 0, key % kPageSize, page);
    }
  }
}

// A consumer's half of the block's S: its 64 rows against keys 32c .. 32c + 31 over 576 dims (36
// k-steps of m64n32k16, both operands from shared memory).
template <bool kFp16>
__device__ __forceinline__ void mla_sm90_scores(float (&s)[16], unsigned q_base, unsigned kv_base, int consumer) {
  using namespace sm90;
  const unsigned k_base = kv_base + consumer * 32 * 128;
  reg_fence(s);
  wgmma_fence();
  // 72 descriptors a block: each stepped from the tile's first by an add (smem_desc_plus).
  const u64 q_desc = smem_desc(q_base, 16, 1024), k_desc = smem_desc(k_base, 16, 1024);
#pragma unroll
  for (int kk = 0; kk < kMlaQkDim / 16; ++kk) {
    const unsigned offset = (kk / 4) * MlaSm90Shape<64>::kChunkBytes + (kk % 4) * 32;
    wgmma_ss<32, kFp16>(s, smem_desc_plus(q_desc, offset), smem_desc_plus(k_desc, offset), kk > 0);
  }
  wgmma_commit();
  wgmma_wait<0>();
  reg_fence(s);
}

// The block's online softmax on a thread's two rows (r and r + 8 of its warp's 16; the quad of
// a row holds its 32 keys of the consumer's half): keys past a row's limit masked, the rows' block
// maxima exchanged through `red` (barrier 1: both consumers' S reads of the stage are done after
// it), the maxima and this half's partial sums moved, O rescaled, and P written to its half of
// the shared tile as T.
template <typename T>
__device__ __forceinline__ void mla_sm90_softmax(float (&s)[16], int first_key, const int (&limit)[2], float scale_log2,
                                                 float (&m)[2], float (&l)[2], float (&o)[128], float* red,
                                                 unsigned char* p_tile, int consumer, int t) {
  const int lane = t % 32;
  const int row[2] = {16 * (t / 32) + lane / 4, 16 * (t / 32) + lane / 4 + 8};
  float block_max[2] = {negative_infinity(), negative_infinity()};
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = first_key + 32 * consumer + 8 * j + 2 * (lane % 4) + (e & 1);
      s[4 * j + e] = key <= limit[e >> 1] ? s[4 * j + e] * scale_log2 : negative_infinity();
      block_max[e >> 1] = fmaxf(block_max[e >> 1], s[4 * j + e]);
    }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    block_max[i] = quad_max(block_max[i]);
    if (lane % 4 == 0) red[consumer * kMlaSm90Rows + row[i]] = block_max[i];
  }
  sm90::named_bar_sync(1, 256);
  float base[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float alpha = online_softmax_update(m[i], l[i], fmaxf(red[row[i]], red[kMlaSm90Rows + row[i]]), base[i]);
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      o[4 * j + 2 * i] *= alpha;
      o[4 * j + 2 * i + 1] *= alpha;
    }
  }
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float p0 = fast_exp2(s[4 * j + 2 * i] - base[i]);
      const float p1 = fast_exp2(s[4 * j + 2 * i + 1] - base[i]);
      l[i] += p0 + p1;
      const int piece = 4 * consumer + j;  // 16-byte piece of the row: keys 8 piece ..
      *reinterpret_cast<unsigned*>(p_tile + row[i] * 128 + ((piece ^ (row[i] % 8)) << 4) + (lane % 4) * 4) =
          pack2<T>(p0, p1);
    }
}

// The tail block: rows `valid` .. 63 of this consumer's V chunks zeroed (after both consumers'
// S reads of the stage: the softmax's barrier; before the P V: the kernel's).
__device__ __forceinline__ void mla_sm90_clear_tail(unsigned char* stage, int valid, int consumer, int t) {
  using Shape = MlaSm90Shape<64>;
  for (int i = t; i < (kMlaSm90BlockN - valid) * Shape::kVChunks * 8; i += 128) {
    const int row = valid + i / (Shape::kVChunks * 8);
    const int chunk = Shape::kVChunks * consumer + (i / 8) % Shape::kVChunks;
    *reinterpret_cast<uint4*>(stage + chunk * Shape::kChunkBytes + row * 128 + (i % 8) * 16) =
        make_uint4(0u, 0u, 0u, 0u);
  }
}

// O += P V for this consumer's 256 dims: four k16 steps over the block's keys, P K-major and V
// N-major from shared memory (V's chunks 8 KB apart, 8-row groups 1 KB apart).
template <bool kFp16>
__device__ __forceinline__ void mla_sm90_accumulate(float (&o)[128], unsigned p_base, unsigned v_base) {
  using namespace sm90;
  reg_fence(o);
  wgmma_fence();
  const u64 p_desc = smem_desc(p_base, 16, 1024), v_desc = smem_desc(v_base, MlaSm90Shape<64>::kChunkBytes, 1024);
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
    wgmma_ss_tb<256, kFp16>(o, smem_desc_plus(p_desc, kk * 32), smem_desc_plus(v_desc, kk * 2048), 1);
  wgmma_commit();
  wgmma_wait<0>();
  reg_fence(o);
}

// The consumer's rows finished: sums over the quad, O normalized into `out` (and the LSE, by
// consumer 0), or with several splits into the split workspace for the combine. An empty row is
// zeros with an LSE of -inf.
template <typename T, int kQLen>
__device__ __forceinline__ void mla_sm90_store(const MlaDecodeParams& p, const MlaWork& w, const float (&m)[2],
                                               float (&l)[2], const float (&o)[128], float* red, int consumer, int t) {
  const int lane = t % 32;
  const bool split = p.workspace.num_splits > 1;
  // The halves' partial sums added (after the last block's barrier every read of `red` is done).
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
    if (lane % 4 == 0) red[consumer * kMlaSm90Rows + 16 * (t / 32) + lane / 4 + 8 * i] = l[i];
  }
  sm90::named_bar_sync(1, 256);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int local = 16 * (t / 32) + lane / 4 + 8 * i;
    l[i] = red[local] + red[kMlaSm90Rows + local];
    const int r = w.row0 + local;
    if (r >= w.rows_total) continue;
    const int token = r / p.n_heads;
    const int head = r % p.n_heads;
    const float inverse = lse_merge_inverse(l[i]);
    const float lse = l[i] > 0.f ? (m[i] + __log2f(l[i])) * 0.69314718f : negative_infinity();
    const int col = 256 * consumer + 2 * (lane % 4);
    if (split) {
      const long long at = split_row<kQLen>(blockIdx.z, p.batch, w.b, token, p.n_heads, head);
      float* dst = p.workspace.partial_out + at * kMlaVDim + col;
#pragma unroll
      for (int j = 0; j < 32; ++j)
        *reinterpret_cast<float2*>(dst + 8 * j) = make_float2(o[4 * j + 2 * i] * inverse, o[4 * j + 2 * i + 1] * inverse);
      if (consumer == 0 && lane % 4 == 0) p.workspace.partial_lse[at] = lse;
    } else {
      T* dst = out_row<T>(p.out, p.out_stride_batch, p.out_stride_seq, p.out_stride_head, w.b, token, head) + col;
#pragma unroll
      for (int j = 0; j < 32; ++j)
        *reinterpret_cast<unsigned*>(dst + 8 * j) = pack2<T>(o[4 * j + 2 * i] * inverse, o[4 * j + 2 * i + 1] * inverse);
      if (p.lse != nullptr && consumer == 0 && lane % 4 == 0) p.lse[final_lse_row<kQLen>(w.b, token, p.n_heads, head)] = lse;
    }
  }
}

// Grid: (64-row tiles of the request's rows, batch, splits); 384 threads; mla_sm90_smem_bytes().
template <typename T, int kPageSize, int kQLen>
__global__ void __launch_bounds__(kMlaSm90Threads, 1)
    mla_decode_sm90_kernel(const __grid_constant__ MlaDecodeParams p, const __grid_constant__ sm90::TmaMap map_kv) {
  using namespace sm90;
  static_assert(kQLen >= 1 && kQLen <= kMaxDecodeQLen, "q_len 1..8");
  constexpr bool kFp16 = IsFp16<T>::value;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* const smem_q =
      reinterpret_cast<unsigned char*>((reinterpret_cast<unsigned long long>(smem_raw) + 1023) & ~1023ull);
  unsigned char* const ring = smem_q + kMlaSm90TileBytes;
  unsigned char* const p_tile = ring + kMlaSm90Stages * kMlaSm90TileBytes;
  u64* const full = reinterpret_cast<u64*>(p_tile + kMlaSm90PBytes);
  u64* const empty = full + kMlaSm90Stages;
  float* const red = reinterpret_cast<float*>(empty + kMlaSm90Stages);
  if (threadIdx.x == 0) {
    tma_prefetch_map(&map_kv);
    for (int s = 0; s < kMlaSm90Stages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], 256);
    }
    fence_mbar_init();
  }
  wait_for_previous_grid();  // a no-op unless launched as a programmatic dependent
  allow_dependent_grid();
  MlaWork w;
  w.b = blockIdx.y;
  w.row0 = blockIdx.x * kMlaSm90Rows;
  w.rows_total = kQLen * p.n_heads;
  w.len = min(max(load_seq_len(p.seq_lens, w.b, p.layout_bits), 0), p.kv_capacity);
  w.begin = blockIdx.z * p.tokens_per_split;
  w.end = min(w.len, w.begin + p.tokens_per_split);
  const int blocks = w.end > w.begin ? (w.end - w.begin + kMlaSm90BlockN - 1) / kMlaSm90BlockN : 0;
  __syncthreads();  // the barriers are initialized

  if (threadIdx.x < 128) {
    setmaxnreg_dec<prefill_sm90_producer_regs(2, false)>();
    if (threadIdx.x == 0) mla_sm90_produce<kPageSize>(p, w, &map_kv, ring, full, empty, blocks);
    return;
  }
  setmaxnreg_inc<prefill_sm90_consumer_regs(2)>();
  const int consumer = threadIdx.x / 128 - 1;
  const int t = threadIdx.x % 128;
  const int lane = t % 32;
  if (blocks > 0) mla_sm90_load_q<T>(p, w, smem_q, threadIdx.x - 128);
  int limit[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) limit[i] = min(mla_row_limit<kQLen>(p, w, 16 * (t / 32) + lane / 4 + 8 * i), w.end - 1);
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  float m[2] = {negative_infinity(), negative_infinity()};
  float l[2] = {0.f, 0.f};
  const unsigned q_base = shared_address(smem_q);
  for (int j = 0; j < blocks; ++j) {
    const int s = j % kMlaSm90Stages;
    mbar_wait(&full[s], (j / kMlaSm90Stages) & 1);
    unsigned char* const stage = ring + s * kMlaSm90TileBytes;
    float sc[16];
    mla_sm90_scores<kFp16>(sc, q_base, shared_address(stage), consumer);
    const int first_key = w.begin + j * kMlaSm90BlockN;
    mla_sm90_softmax<T>(sc, first_key, limit, p.scale_log2, m, l, o, red, p_tile, consumer, t);
    if (first_key + kMlaSm90BlockN > w.end) mla_sm90_clear_tail(stage, w.end - first_key, consumer, t);
    fence_proxy_async_shared();  // P (and a cleared tail) before the wgmma reads
    named_bar_sync(1, 256);      // both halves of P are written
    mla_sm90_accumulate<kFp16>(o, shared_address(p_tile), shared_address(stage) + consumer *
                                                                  MlaSm90Shape<kPageSize>::kVChunks *
                                                                  MlaSm90Shape<kPageSize>::kChunkBytes);
    mbar_arrive(&empty[s]);
  }
  mla_sm90_store<T, kQLen>(p, w, m, l, o, red, consumer, t);
}

}  // namespace astrai
