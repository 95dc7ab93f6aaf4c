// The portable prefill's tensor-core path (prefill.cuh; sm_75 and later, not under
// ASTRAI_NO_MMA): warp w owns 16 * kMTiles rows, as kMTiles MMA tiles of 16 rows that share every
// K and V fragment read from shared memory; K/V tiles stream through shared memory with cp.async
// (double buffered); S = Q K^T and O += P V run on mma.sync with an online softmax per row.
#pragma once

#include "mma_utils.cuh"
#include "prefill_common.cuh"
#include "prefill_mma_steps.cuh"

#ifndef ASTRAI_NO_MMA
namespace astrai {

// How a thread copies a KV block: 16-byte column x % kChunksPerRow of rows x / kChunksPerRow +
// i * kRowsPerPass, so its source pointers advance by a fixed step. Paged KV: passes whose rows
// share a page (blocks start at multiples of kBlockKv) share one page-id lookup, and the ids of
// the next block are fetched while the current one is computed.
template <int kHeadDim, int kPageSize, int kBlockKv>
struct PrefillKvCopy {
  static constexpr int kChunksPerRow = kHeadDim / 8;
  static constexpr int kRowsPerPass = kPrefillThreads / kChunksPerRow;
  static constexpr int kPasses = CeilDiv<kBlockKv, kRowsPerPass>::value;
  // Rows of consecutive passes stay in one page only when the passes tile the block exactly.
  static constexpr bool kExact = kRowsPerPass * kChunksPerRow == kPrefillThreads &&
                                 kBlockKv % kRowsPerPass == 0;
  static constexpr int kPassesPerLookup =
      !kExact || kPageSize < kRowsPerPass ? 1
      : (kPageSize / kRowsPerPass > kPasses ? kPasses : kPageSize / kRowsPerPass);
  static constexpr int kLookups = kPageSize == 0 ? 1 : CeilDiv<kPasses, kPassesPerLookup>::value;
};

// Page ids (-1: past the end or unmapped) of the rows this thread copies in one block.
template <int kHeadDim, int kPageSize, int kBlockKv>
struct PrefillPageIds {
  using Copy = PrefillKvCopy<kHeadDim, kPageSize, kBlockKv>;
  int id[Copy::kLookups];

  __device__ __forceinline__ void fetch(const PrefillParams& p, const int* table_row,
                                        int block_start, int kv_end) {
    if constexpr (KvLayout<kPageSize>::kPaged) {
      const int row0 = threadIdx.x / Copy::kChunksPerRow;
#pragma unroll
      for (int l = 0; l < Copy::kLookups; ++l) {
        const int token = block_start + row0 + l * Copy::kPassesPerLookup * Copy::kRowsPerPass;
        int page = -1;
        if (token < kv_end) page = KvLayout<kPageSize>::mapped_page(p, table_row, token);
        id[l] = page;
      }
    }
  }
};

// Issues the cp.async copies of KV tokens [block_start, block_start + kBlockKv) into one
// stage; tokens at or past kv_end and tokens on unmapped pages are zero-filled (a zero V row
// keeps 0 * garbage from turning into NaN). `pages` holds the block's page ids (paged KV).
template <typename T, int kHeadDim, int kPageSize, int kBlockKv>
__device__ __forceinline__ void prefill_load_kv_async(const PrefillParams& p, const T* k_head,
                                                      const T* v_head,
                                                      const PrefillPageIds<kHeadDim, kPageSize, kBlockKv>& pages,
                                                      T* smem_k, T* smem_v, int block_start,
                                                      int kv_end) {
  using Shape = PrefillShape<kHeadDim, kPageSize>;
  using Copy = PrefillKvCopy<kHeadDim, kPageSize, kBlockKv>;
  constexpr int kRowsPerPass = Copy::kRowsPerPass;
  const int row0 = threadIdx.x / Shape::kChunksPerRow;
  const int col = (threadIdx.x % Shape::kChunksPerRow) * 8;
  if (row0 >= kRowsPerPass) return;  // head dims whose rows do not tile 128 threads evenly
  const unsigned k_dst = shared_address(smem_k + row0 * Shape::kRowStride + col);
  const unsigned v_dst = shared_address(smem_v + row0 * Shape::kRowStride + col);
  if constexpr (kPageSize == 0) {
    const T* k_src = k_head + static_cast<long long>(block_start + row0) * p.k_stride_seq + col;
    const T* v_src = v_head + static_cast<long long>(block_start + row0) * p.v_stride_seq + col;
    const long long k_step = kRowsPerPass * p.k_stride_seq;
    const long long v_step = kRowsPerPass * p.v_stride_seq;
#pragma unroll
    for (int i = 0; i < Copy::kPasses; ++i) {
      const int row = row0 + i * kRowsPerPass;
      if (kBlockKv % kRowsPerPass != 0 && row >= kBlockKv) break;
      const bool valid = block_start + row < kv_end;
      const unsigned offset = i * kRowsPerPass * Shape::kRowStride * 2;
      cp_async_16(k_dst + offset, valid ? k_src : k_head, valid ? 16 : 0);
      cp_async_16(v_dst + offset, valid ? v_src : v_head, valid ? 16 : 0);
      k_src += k_step;
      v_src += v_step;
    }
  } else {
#pragma unroll
    for (int l = 0; l < Copy::kLookups; ++l) {
      const int first_pass = l * Copy::kPassesPerLookup;
      const int first_token = block_start + row0 + first_pass * kRowsPerPass;
      const long long page = pages.id[l];
      // PagedKv::slot written out: through the call NVVM scheduled this loop's address
      // arithmetic otherwise (other PTX for the same math).
      const int slot = first_token & (kPageSize - 1);
      const T* k_src = k_head + page * p.k_stride_page + slot * p.k_stride_seq + col;
      const T* v_src = v_head + page * p.v_stride_page + slot * p.v_stride_seq + col;
#pragma unroll
      for (int j = 0; j < Copy::kPassesPerLookup; ++j) {
        const int row = row0 + (first_pass + j) * kRowsPerPass;
        if (first_pass + j >= Copy::kPasses || (kBlockKv % kRowsPerPass != 0 && row >= kBlockKv)) break;
        const bool valid = page >= 0 && block_start + row < kv_end;
        const long long step = static_cast<long long>(j) * kRowsPerPass;
        const unsigned offset = (first_pass + j) * kRowsPerPass * Shape::kRowStride * 2;
        cp_async_16(k_dst + offset, valid ? k_src + step * p.k_stride_seq : k_head, valid ? 16 : 0);
        cp_async_16(v_dst + offset, valid ? v_src + step * p.v_stride_seq : v_head, valid ? 16 : 0);
      }
    }
  }
}

// FP8 cache: copies the bytes of KV tokens [block_start, block_start + kBlockKv) (kHeadDim
// bytes a row, 16 a chunk) into a byte stage; tokens at or past kv_end and on unmapped pages are
// zero-filled.
template <int kHeadDim, int kPageSize, int kBlockKv>
__device__ __forceinline__ void prefill_load_kv8_async(const PrefillParams& p, const unsigned char* k_head,
                                                       const unsigned char* v_head, const int* table_row,
                                                       unsigned char* stage_k, unsigned char* stage_v,
                                                       int block_start, int kv_end) {
  constexpr int kChunksPerRow = kHeadDim / 16;
#pragma unroll 2
  for (int chunk = threadIdx.x; chunk < kBlockKv * kChunksPerRow; chunk += kPrefillThreads) {
    const int row = chunk / kChunksPerRow;
    const int col = (chunk % kChunksPerRow) * 16;
    const int token = block_start + row;
    long long k_offset = 0;
    long long v_offset = 0;
    const bool valid = token < kv_end && prefill_kv_offsets<kPageSize>(p, table_row, token, &k_offset, &v_offset);
    cp_async_16(shared_address(stage_k + row * kHeadDim + col), valid ? k_head + k_offset + col : k_head,
                valid ? 16 : 0);
    cp_async_16(shared_address(stage_v + row * kHeadDim + col), valid ? v_head + v_offset + col : v_head,
                valid ? 16 : 0);
  }
}

// Per-thread rows (m-tile m, half h): 16m + g + 8h of the warp's, from warp_row0. Their stops
// (0 for rows past the request), first keys (window), positions (ALiBi) and mask rows.
template <class C>
__device__ __forceinline__ void prefill_mma_row_limits(const PrefillParams& p, const PrefillRequest& r, int batch_index,
                                                       int warp_row0, int warp_rows, int quad_row,
                                                       int (&stop)[C::kMTiles][2], int (&first_key)[C::kMTiles][2],
                                                       int (&query_position)[C::kMTiles][2],
                                                       const unsigned char* (&mask_row)[C::kMTiles][2]) {
#pragma unroll
  for (int m = 0; m < C::kMTiles; ++m) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = 16 * m + quad_row + 8 * h;
      stop[m][h] = row < warp_rows ? prefill_row_stop(r, warp_row0 + row) : 0;
      if (has_feature<C::kFlags>(kFeatureWindow))
        first_key[m][h] = window_first_key(static_cast<long long>(r.causal_base) + warp_row0 + row, p.features);
      query_position[m][h] = r.causal_base + warp_row0 + row;
      mask_row[m][h] = p.mask == nullptr
                           ? nullptr
                           : p.mask + batch_index * p.mask_stride_batch +
                                 static_cast<long long>(r.mask_start + warp_row0 + row) * p.mask_stride_q;
    }
  }
}

// The Q tile by cp.async, rows past the request zero-filled; it lands with the first K/V stage.
template <typename T, int kHeadDim, int kPageSize, int kBlockQ>
__device__ __forceinline__ void prefill_mma_load_q(const PrefillParams& p, const PrefillRequest& r, T* smem_q,
                                                   int batch_index, int head, int tile_start, int tile_rows) {
  constexpr int kRowStride = PrefillShape<kHeadDim, kPageSize>::kRowStride;
  constexpr int kChunksPerRow = PrefillShape<kHeadDim, kPageSize>::kChunksPerRow;
  static_assert(kBlockQ * kChunksPerRow % kPrefillThreads == 0, "Q tile copy");
  const T* q_rows = static_cast<const T*>(p.q) + batch_index * p.q_stride_batch +
                    static_cast<long long>(r.q_start + tile_start) * p.q_stride_seq + head * p.q_stride_head;
#pragma unroll
  for (int i = 0; i < kBlockQ * kChunksPerRow / kPrefillThreads; ++i) {
    const int chunk = threadIdx.x + i * kPrefillThreads;
    const int row = chunk / kChunksPerRow;
    const int col = (chunk % kChunksPerRow) * 8;
    const bool valid = row < tile_rows;
    cp_async_16(shared_address(smem_q + row * kRowStride + col), q_rows + (valid ? row * p.q_stride_seq : 0) + col,
                valid ? 16 : 0);
  }
}

template <typename T, int kHeadDim, int kPageSize, int kGroup, int kFlags>
__device__ void prefill_mma(const PrefillParams& p, unsigned char* smem_raw) {
  using Shape = PrefillShape<kHeadDim, kPageSize>;
  using C = PrefillMmaTiles<T, kHeadDim, kFlags>;
  constexpr int kRowStride = Shape::kRowStride;
  constexpr int kMTiles = C::kMTiles;
  constexpr int kWarpRows = C::kWarpRows;
  constexpr int kBlockQ = prefill_block_q(kHeadDim);
  constexpr int kBlockKv = C::kBlockKv;
  constexpr int kStageElems = kBlockKv * kRowStride;
  static_assert(kRowStride == C::kRowStride, "the steps' row stride");
  static_assert(kBlockQ == 4 * kWarpRows, "four warps cover the Q tile");

  const PrefillTile tile = prefill_tile<kBlockQ>(p);
  const int head = tile.head;
  const int batch_index = tile.batch_index;
  const int kv_head = head / kGroup;
  const PrefillRequest r = prefill_request<kPageSize>(p, batch_index);
  const int tile_start = tile.start;
  if (tile_start >= r.q_len) return;
  const int tile_rows = min(kBlockQ, r.q_len - tile_start);
  // Stops grow with the row, so the tile's last row bounds the KV range of the whole CTA.
  const int kv_end = prefill_row_stop(r, tile_start + tile_rows - 1);
  // With a window, the first row's first key bounds the range from below (block aligned).
  const int kv_begin = has_feature<kFlags>(kFeatureWindow)
                           ? max(window_first_key(static_cast<long long>(r.causal_base) + tile_start, p.features), 0) /
                                 kBlockKv * kBlockKv
                           : 0;
  const int num_blocks = has_feature<kFlags>(kFeatureWindow) ? max(0, (kv_end - kv_begin + kBlockKv - 1) / kBlockKv)
                                                             : (kv_end + kBlockKv - 1) / kBlockKv;

  // [K stage 0][K stage 1][V stage 0][V stage 1][Q tile]. At the end each warp stages its
  // output rows in its own Q rows. An FP8 cache: [K tile][V tile][Q tile][K bytes 0][K bytes 1]
  // [V bytes 0][V bytes 1], each block widened from its byte stages into the K and V tiles.
  constexpr bool kFp8 = has_fp8_kv<kFlags>();
  constexpr bool kE5m2 = has_feature<kFlags>(kFeatureKvE5m2);
  constexpr int kTileStages = kFp8 ? 1 : kPrefillStages;
  constexpr int kStageBytes = kBlockKv * kHeadDim;  // one FP8 stage of K or of V
  T* smem_k = reinterpret_cast<T*>(smem_raw);
  T* smem_v = smem_k + kTileStages * kStageElems;
  T* smem_q = smem_v + kTileStages * kStageElems;
  unsigned char* smem_k8 = reinterpret_cast<unsigned char*>(smem_q + kBlockQ * kRowStride);
  unsigned char* smem_v8 = smem_k8 + kPrefillStages * kStageBytes;

  const T* k_head;
  const T* v_head;
  const int* table_row;
  prefill_kv_bases<T, kPageSize>(p, batch_index, kv_head, &k_head, &v_head, &table_row);
  const PrefillKv8 kv8 =
      kFp8 ? prefill_kv8<kPageSize>(p, batch_index, kv_head) : PrefillKv8{nullptr, nullptr, 1.f, 1.f};

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int quad_col = lane & 3;   // accumulator columns 2t and 2t + 1
  const int warp_row0 = tile_start + warp * kWarpRows;  // request-relative
  const int warp_rows = max(0, min(kWarpRows, r.q_len - warp_row0));

  int stop[kMTiles][2];
  int first_key[kMTiles][2];
  int query_position[kMTiles][2];
  const unsigned char* mask_row[kMTiles][2];
  prefill_mma_row_limits<C>(p, r, batch_index, warp_row0, warp_rows, lane >> 2, stop, first_key, query_position,
                            mask_row);
  // Tiles entirely below every row's stop need no masking; tiles at or past the last stop
  // hold nothing for this warp.
  const int warp_min_stop = warp_rows == kWarpRows ? prefill_row_stop(r, warp_row0) : 0;
  const int warp_max_stop = warp_rows > 0 ? prefill_row_stop(r, warp_row0 + warp_rows - 1) : 0;
  // Window: blocks before the warp's first row's first key hold nothing for it; blocks before
  // its last row's first key need masking.
  const int warp_min_first = has_feature<kFlags>(kFeatureWindow)
                                 ? window_first_key(static_cast<long long>(r.causal_base) + warp_row0, p.features)
                                 : 0;
  const int warp_max_first =
      has_feature<kFlags>(kFeatureWindow) && warp_rows > 0
          ? window_first_key(static_cast<long long>(r.causal_base) + warp_row0 + warp_rows - 1, p.features)
          : 0;
  const bool has_mask = p.mask != nullptr;

  float o[kMTiles][C::kOTiles][4];
  float row_max[kMTiles][2];  // scaled by scale_log2
  float row_sum[kMTiles][2];  // this thread's columns only; summed over the quad at the end
#pragma unroll
  for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
    for (int n = 0; n < C::kOTiles; ++n) o[m][n][0] = o[m][n][1] = o[m][n][2] = o[m][n][3] = 0.f;
    row_max[m][0] = row_max[m][1] = negative_infinity();
    row_sum[m][0] = row_sum[m][1] = 0.f;
  }

  PrefillPageIds<kHeadDim, kPageSize, kBlockKv> pages;
  const unsigned q_address =
      shared_address(smem_q + (warp * kWarpRows + (lane & 15)) * kRowStride + (lane >> 4) * 8);
  const int k_lane_offset = ((lane >> 4) * 8 + (lane & 7)) * kRowStride + ((lane >> 3) & 1) * 8;
  const int v_lane_offset = (((lane >> 3) & 1) * 8 + (lane & 7)) * kRowStride + (lane >> 4) * 8;

  // The block from `start` into stage `stage` by cp.async (16-bit: its page ids fetched before,
  // the next block's fetched after, in flight meanwhile).
  auto load_block = [&](int start, int stage) {
    if constexpr (kFp8) {
      prefill_load_kv8_async<kHeadDim, kPageSize, kBlockKv>(p, kv8.k_head, kv8.v_head, table_row,
                                                            smem_k8 + stage * kStageBytes, smem_v8 + stage * kStageBytes,
                                                            start, kv_end);
      cp_async_commit();
    } else {
      prefill_load_kv_async<T, kHeadDim, kPageSize, kBlockKv>(p, k_head, v_head, pages, smem_k + stage * kStageElems,
                                                              smem_v + stage * kStageElems, start, kv_end);
      cp_async_commit();
      pages.fetch(p, table_row, start + kBlockKv, kv_end);
    }
  };
  if (num_blocks > 0) {
    prefill_mma_load_q<T, kHeadDim, kPageSize, kBlockQ>(p, r, smem_q, batch_index, head, tile_start, tile_rows);
    if constexpr (!kFp8) pages.fetch(p, table_row, kv_begin, kv_end);
    load_block(kv_begin, 0);
  }

  for (int block = 0; block < num_blocks; ++block) {
    const int stage = block & 1;
    const int block_start = kv_begin + block * kBlockKv;
    if (block + 1 < num_blocks) {
      load_block(block_start + kBlockKv, stage ^ 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if constexpr (kFp8) {
      widen_fp8_tile<T, kHeadDim, kRowStride, kBlockKv, kPrefillThreads, kE5m2>(smem_k8 + stage * kStageBytes, smem_k);
      widen_fp8_tile<T, kHeadDim, kRowStride, kBlockKv, kPrefillThreads, kE5m2>(smem_v8 + stage * kStageBytes, smem_v);
      __syncthreads();
    }
    const int tile_stage = kFp8 ? 0 : stage;

    if (block_start < warp_max_stop &&
        (!has_feature<kFlags>(kFeatureWindow) || block_start + kBlockKv > warp_min_first)) {  // warp-uniform
      const unsigned k_address = shared_address(smem_k + tile_stage * kStageElems + k_lane_offset);
      const unsigned v_address = shared_address(smem_v + tile_stage * kStageElems + v_lane_offset);

      float s[kMTiles][C::kSTiles][4];
      prefill_mma_scores<C>(s, q_address, k_address);
      prefill_mma_score_features<C>(s, p, kv8.k_scale, head, block_start, quad_col, query_position);
      // Causal limit, KV tail, rows past the request and the explicit mask, where a row may meet one.
      if (has_mask || block_start + kBlockKv > warp_min_stop ||
          (has_feature<kFlags>(kFeatureWindow) && block_start < warp_max_first))
        prefill_mma_mask<C>(s, block_start, quad_col, stop, first_key, mask_row, has_mask);
      prefill_mma_softmax<C>(s, o, row_max, row_sum, p.scale_log2);
      prefill_mma_pv<C>(s, o, v_address);
    }
    __syncthreads();  // the stage is refilled by the next iteration's prefetch
  }

  prefill_mma_epilogue<C>(p, r, o, row_max, row_sum, smem_q + warp * kWarpRows * kRowStride, kv8.v_scale,
                          batch_index, head, warp_row0, warp_rows, lane);
}

}  // namespace astrai
#endif  // ASTRAI_NO_MMA
