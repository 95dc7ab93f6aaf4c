// The portable prefill's tensor-core steps (prefill_mma.cuh): a warp's S = Q K^T over a KV
// block, the features and masks applied to S, the online softmax, O += P V and the epilogue.
// Per thread: rows 16m + g + 8h of each m-tile m (g = lane / 4, h = 0, 1), columns 2t, 2t + 1 of
// each n8 tile (t = lane % 4), as mma.m16n8k16's accumulators lay them out.
#pragma once

#include "mma_utils.cuh"
#include "prefill_common.cuh"

#ifndef ASTRAI_NO_MMA
namespace astrai {

template <typename T_, int kHeadDim_, int kFlags_>
struct PrefillMmaTiles {
  using T = T_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kFlags = kFlags_;
  static constexpr int kRowStride = kHeadDim + 8;          // elements, as PrefillShape's
  static constexpr int kMTiles = prefill_m_tiles(kHeadDim);  // 16-row MMA tiles per warp
  static constexpr int kWarpRows = 16 * kMTiles;
  static constexpr int kBlockKv = prefill_block_kv(kHeadDim);
  static constexpr int kSTiles = kBlockKv / 8;   // n8 tiles of S per m-tile (16 rows x kBlockKv)
  static constexpr int kOTiles = kHeadDim / 8;   // n8 tiles of O per m-tile (16 rows x kHeadDim)
  static constexpr int kKSteps = kHeadDim / 16;  // k16 steps of Q K^T
  static_assert(kBlockKv % 16 == 0, "KV tile");
  // The soft-cap and ALiBi put the scores in log2 units before the softmax; otherwise the scale
  // is folded into its exponent.
  static constexpr bool kScoresInLog2 = has_feature<kFlags>(kFeatureSoftCap) || has_feature<kFlags>(kFeatureAlibi);
  using S = float[kMTiles][kSTiles][4];
  using O = float[kMTiles][kOTiles][4];
  using Rows = float[kMTiles][2];
};

// S = Q K^T: kMTiles x 16 rows x kBlockKv tokens; each K fragment feeds every m-tile.
template <class C>
__device__ __forceinline__ void prefill_mma_scores(typename C::S& s, unsigned q_address, unsigned k_address) {
  using T = typename C::T;
  constexpr int kRowStride = C::kRowStride;
#pragma unroll
  for (int m = 0; m < C::kMTiles; ++m)
#pragma unroll
    for (int j = 0; j < C::kSTiles; ++j) s[m][j][0] = s[m][j][1] = s[m][j][2] = s[m][j][3] = 0.f;
#pragma unroll
  for (int kk = 0; kk < C::kKSteps; ++kk) {
    unsigned a[C::kMTiles][4];
#pragma unroll
    for (int m = 0; m < C::kMTiles; ++m) ldmatrix_x4(a[m], q_address + (m * 16 * kRowStride + kk * 16) * 2);
#pragma unroll
    for (int nn = 0; nn < C::kSTiles / 2; ++nn) {
      unsigned b[4];
      ldmatrix_x4(b, k_address + (nn * 16 * kRowStride + kk * 16) * 2);
#pragma unroll
      for (int m = 0; m < C::kMTiles; ++m) {
        Mma<T>::run(s[m][2 * nn], a[m], b[0], b[1]);
        Mma<T>::run(s[m][2 * nn + 1], a[m], b[2], b[3]);
      }
    }
  }
}

// The score features, in order: an FP8 cache's K scale (scores as if K were dequantized), the
// soft-cap (before the masks: tanh would lift a masked -inf to -cap; capped scores are in log2
// units already), ALiBi (scores in log2 units plus each key's bias).
template <class C>
__device__ __forceinline__ void prefill_mma_score_features(typename C::S& s, const PrefillParams& p, float k_scale,
                                                           int head, int block_start, int quad_col,
                                                           const int (&query_position)[C::kMTiles][2]) {
  constexpr int kFlags = C::kFlags;
  if constexpr (has_fp8_kv<kFlags>()) {
#pragma unroll
    for (int m = 0; m < C::kMTiles; ++m)
#pragma unroll
      for (int j = 0; j < C::kSTiles; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[m][j][e] *= k_scale;
  }
  if constexpr (has_feature<kFlags>(kFeatureSoftCap)) {
#pragma unroll
    for (int m = 0; m < C::kMTiles; ++m)
#pragma unroll
      for (int j = 0; j < C::kSTiles; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[m][j][e] = soft_capped(s[m][j][e], p.features);
  }
  if constexpr (has_feature<kFlags>(kFeatureAlibi)) {
    const float slope = alibi_slope_log2(p.features, head);
#pragma unroll
    for (int m = 0; m < C::kMTiles; ++m)
#pragma unroll
      for (int j = 0; j < C::kSTiles; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          s[m][j][e] = (has_feature<kFlags>(kFeatureSoftCap) ? s[m][j][e] : s[m][j][e] * p.scale_log2) +
                       alibi_bias(slope, block_start + j * 8 + quad_col * 2 + (e & 1), query_position[m][e >> 1]);
  }
}

// Scores of keys a row does not see become -inf: the causal limit and KV tail (stop), the
// window (first_key) and the explicit mask.
template <class C>
__device__ __forceinline__ void prefill_mma_mask(typename C::S& s, int block_start, int quad_col,
                                                 const int (&stop)[C::kMTiles][2],
                                                 const int (&first_key)[C::kMTiles][2],
                                                 const unsigned char* const (&mask_row)[C::kMTiles][2], bool has_mask) {
  constexpr bool kWindow = has_feature<C::kFlags>(kFeatureWindow);
#pragma unroll
  for (int m = 0; m < C::kMTiles; ++m)
#pragma unroll
    for (int j = 0; j < C::kSTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e >> 1;
        const int token = block_start + j * 8 + quad_col * 2 + (e & 1);
        bool keep = token < stop[m][h] && (!kWindow || token >= first_key[m][h]);
        if (keep && has_mask) keep = __ldg(mask_row[m][h] + token) != 0;
        if (!keep) s[m][j][e] = negative_infinity();
      }
}

// Online softmax on each thread's rows (a row's four threads form a quad): S becomes P, the row
// maxima (log2 units) and this thread's partial sums move, and O is rescaled when a maximum moved.
template <class C>
__device__ __forceinline__ void prefill_mma_softmax(typename C::S& s, typename C::O& o, typename C::Rows& row_max,
                                                    typename C::Rows& row_sum, float scale_log2) {
  float correction[C::kMTiles][2];
  bool moved = false;
#pragma unroll
  for (int m = 0; m < C::kMTiles; ++m) {
    float tile_max[2] = {negative_infinity(), negative_infinity()};
#pragma unroll
    for (int j = 0; j < C::kSTiles; ++j) {
      tile_max[0] = fmaxf(tile_max[0], fmaxf(s[m][j][0], s[m][j][1]));
      tile_max[1] = fmaxf(tile_max[1], fmaxf(s[m][j][2], s[m][j][3]));
    }
    float neg_ref[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      tile_max[h] = quad_max(tile_max[h]);
      // The scale turns S into log2 units (the soft-cap has done it when compiled in).
      float ref;
      correction[m][h] = online_softmax_update<false>(
          row_max[m][h], row_sum[m][h], C::kScoresInLog2 ? tile_max[h] : tile_max[h] * scale_log2, ref);
      moved = moved || correction[m][h] != 1.f;
      neg_ref[h] = -ref;
    }
#pragma unroll
    for (int j = 0; j < C::kSTiles; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[m][j][e] = C::kScoresInLog2 ? exp2f(s[m][j][e] + neg_ref[e >> 1])
                                      : exp2f(fmaf(s[m][j][e], scale_log2, neg_ref[e >> 1]));
        row_sum[m][e >> 1] += s[m][j][e];
      }
    }
  }
  // Skipped while no row's max moves (most blocks once the maxima settle).
  if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
    for (int m = 0; m < C::kMTiles; ++m)
#pragma unroll
      for (int n = 0; n < C::kOTiles; ++n) {
        o[m][n][0] *= correction[m][0];
        o[m][n][1] *= correction[m][0];
        o[m][n][2] *= correction[m][1];
        o[m][n][3] *= correction[m][1];
      }
  }
}

// O += P V: two n8 tiles of P make the A fragment of one k16 step over tokens; each V fragment
// feeds every m-tile.
template <class C>
__device__ __forceinline__ void prefill_mma_pv(const typename C::S& s, typename C::O& o, unsigned v_address) {
  using T = typename C::T;
  constexpr int kRowStride = C::kRowStride;
#pragma unroll
  for (int kk = 0; kk < C::kBlockKv / 16; ++kk) {
    unsigned pa[C::kMTiles][4];
#pragma unroll
    for (int m = 0; m < C::kMTiles; ++m) {
      pa[m][0] = pack2<T>(s[m][2 * kk][0], s[m][2 * kk][1]);
      pa[m][1] = pack2<T>(s[m][2 * kk][2], s[m][2 * kk][3]);
      pa[m][2] = pack2<T>(s[m][2 * kk + 1][0], s[m][2 * kk + 1][1]);
      pa[m][3] = pack2<T>(s[m][2 * kk + 1][2], s[m][2 * kk + 1][3]);
    }
#pragma unroll
    for (int dd = 0; dd < C::kHeadDim / 16; ++dd) {
      unsigned b[4];
      ldmatrix_x4_trans(b, v_address + (kk * 16 * kRowStride + dd * 16) * 2);
#pragma unroll
      for (int m = 0; m < C::kMTiles; ++m) {
        Mma<T>::run(o[m][2 * dd], pa[m], b[0], b[1]);
        Mma<T>::run(o[m][2 * dd + 1], pa[m], b[2], b[3]);
      }
    }
  }
}

// The warp's rows normalized (sinks folded in; an FP8 cache's V scale), staged in its own Q rows
// (no other warp reads them) and written as full 16-byte row chunks; their LSE.
template <class C>
__device__ __forceinline__ void prefill_mma_epilogue(const PrefillParams& p, const PrefillRequest& r, typename C::O& o,
                                                     typename C::Rows& row_max, typename C::Rows& row_sum,
                                                     typename C::T* stage_rows, float v_scale, int batch_index,
                                                     int head, int warp_row0, int warp_rows, int lane) {
  using T = typename C::T;
  constexpr int kRowStride = C::kRowStride;
  constexpr int kChunksPerRow = C::kHeadDim / 8;
  const int quad_row = lane >> 2;
  const int quad_col = lane & 3;
  __syncwarp();
#pragma unroll
  for (int m = 0; m < C::kMTiles; ++m) {
    float inverse[2];
    float lse[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float sum = row_sum[m][h];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      float sink_factor = 1.f;
      if constexpr (has_feature<C::kFlags>(kFeatureSink))
        sink_factor = fold_sink(p.features.sinks[head], &row_max[m][h], &sum);
      const bool empty = !(sum > 0.f);
      inverse[h] = empty ? 0.f : (has_fp8_kv<C::kFlags>() ? sink_factor * v_scale : sink_factor) / sum;
      lse[h] = empty ? negative_infinity() : (row_max[m][h] + log2f(sum)) * kLn2;
    }
    T* rows = stage_rows + 16 * m * kRowStride;
#pragma unroll
    for (int n = 0; n < C::kOTiles; ++n) {
      const int col = n * 8 + quad_col * 2;
      *reinterpret_cast<unsigned*>(rows + quad_row * kRowStride + col) =
          pack2<T>(o[m][n][0] * inverse[0], o[m][n][1] * inverse[0]);
      *reinterpret_cast<unsigned*>(rows + (quad_row + 8) * kRowStride + col) =
          pack2<T>(o[m][n][2] * inverse[1], o[m][n][3] * inverse[1]);
    }
    if (p.lse != nullptr && quad_col == 0) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = 16 * m + quad_row + 8 * h;
        if (row < warp_rows) p.lse[(r.lse_row + warp_row0 + row) * p.n_heads + head] = lse[h];
      }
    }
  }
  __syncwarp();
  T* out_rows = static_cast<T*>(p.out) + batch_index * p.out_stride_batch +
                static_cast<long long>(r.q_start + warp_row0) * p.out_stride_seq + head * p.out_stride_head;
  for (int chunk = lane; chunk < C::kWarpRows * kChunksPerRow; chunk += 32) {
    const int row = chunk / kChunksPerRow;
    const int col = (chunk % kChunksPerRow) * 8;
    if (row < warp_rows)
      *reinterpret_cast<uint4*>(out_rows + row * p.out_stride_seq + col) =
          *reinterpret_cast<const uint4*>(stage_rows + row * kRowStride + col);
  }
}

}  // namespace astrai
#endif  // ASTRAI_NO_MMA
