// The Hopper prefill's configuration, shared-memory layout and tile scheduler (prefill_sm90.cuh):
// which tile a CTA computes, what its walk over the KV covers, and in which order persistent
// CTAs take their tiles.
#pragma once

#include "hopper_params.h"
#include "hopper_ptx.cuh"
#include "prefill.cuh"

// Diagnostic hooks: clock stamps of a CTA's phases. They compile to nothing unless a header
// given to the compile defines them first (only the bench's sm90 check does, never the runtime).
#ifndef ASTRAI_PREFILL_CLOCK
#define ASTRAI_PREFILL_CLOCK(name) \
  do {                             \
  } while (0)
#endif
#ifndef ASTRAI_PREFILL_STAMP_AT
#define ASTRAI_PREFILL_STAMP_AT(condition, slot, value) \
  do {                                                  \
  } while (0)
#endif
#define ASTRAI_PREFILL_STAMP(condition, slot) ASTRAI_PREFILL_STAMP_AT(condition, slot, clock64())

namespace astrai {

// A number as a type, for generic code (a GEMM's width or a tile's piece, known at compile time).
template <int N>
struct Constant {
  static constexpr int value = N;
};

// Everything a role of the kernel knows at compile time, from the kernel's template arguments.
template <typename T_, int kHeadDim_, int kPageSize_, int kGroup_, int kConsumersArg, int kBlockNArg, int kFlags_,
          bool kPersistent_>
struct PrefillSm90Config {
  using T = T_;
  using Shape = PrefillSm90Shape<kHeadDim_, kConsumersArg, kBlockNArg>;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kPageSize = kPageSize_;
  static constexpr int kGroup = kGroup_;
  static constexpr int kFlags = kFlags_;
  static constexpr bool kPersistent = kPersistent_;
  static constexpr int kConsumers = Shape::kConsumers;
  static constexpr int kBlockM = Shape::kBlockM;
  static constexpr int kBlockN = Shape::kBlockN;
  static constexpr int kStages = Shape::kStages;
  static constexpr int kChunks = Shape::kChunks;
  static constexpr bool kFp16 = IsFp16<T>::value;
  using Kv = KvLayout<kPageSize>;
  // Tokens per TMA box of K and V (prefill_sm90_kv.cuh): a block's, or 16 at most of a page's.
  static constexpr int kBoxRows = Kv::box_rows(kBlockN, 16);
  static constexpr int kBoxes = kBlockN / kBoxRows;
  static_assert(kBoxes <= 32 && kBlockN % kBoxRows == 0, "paged boxes");
  static constexpr bool kCap = (kFlags & kFeatureSoftCap) != 0;
  static constexpr bool kWindow = (kFlags & kFeatureWindow) != 0;
  static constexpr bool kSink = (kFlags & kFeatureSink) != 0;
  static_assert((kFlags & ~prefill_sm90_features()) == 0, "features of the Hopper prefill");
  // Packed GQA (hopper_params.h): tile row R is query head R % kPackHeads of the CTA's pack at
  // position R / kPackHeads; the grid's second dimension then walks packs of heads.
  static constexpr int kPackHeads = prefill_sm90_pack_heads(kGroup);
  static constexpr bool kPack = kPackHeads > 1;
  static_assert(!kPersistent || prefill_sm90_persistent(kPageSize, kConsumers, kFlags),
                "persistent CTAs: contiguous KV, three consumers, no features (hopper_params.h)");
  static constexpr int kQSlots = kPersistent ? 2 : 1;
  static constexpr int kThreads = prefill_sm90_threads(kConsumers);
  // An FP8 cache (prefill_sm90_widen.cuh): TMA lands its bytes in rings of their own, which the
  // producer warpgroup's warps 1-3 widen into the f16 rings the consumers read.
  static constexpr bool kKv8 = (kFlags & kFeatureKvFp8) != 0;
  static constexpr bool kE5m2 = (kFlags & kFeatureKvE5m2) != 0;
  static constexpr int kKv8Bytes = kBlockN * kHeadDim;  // one FP8 block of K or V
  // FP8 attention keeping P in f16 (kFeatureQkvP16): P V on f16 wgmma, V widened to f16 as an
  // FP8 cache's is (prefill_sm90_widen.cuh) rather than transposed.
  static constexpr bool kP16 = (kFlags & kFeatureQkvE4m3) != 0 && (kFlags & kFeatureQkvP16) != 0;
  // The 16-bit GEMMs' type: f16 with an FP8 cache or P16 (prefill_sm90_widen.cuh), else T.
  static constexpr bool kMmaFp16 = kFp16 || kKv8 || kP16;
  using MmaT = typename Select<kMmaFp16, fp16_t, T>::type;
  static_assert(!kKv8 || (kPageSize >= 8 && prefill_sm90_serves_kv8(kHeadDim) &&
                          kBlockN == prefill_sm90_block_n(kHeadDim, kConsumers, true)),
                "an FP8 cache: paged, hd128, 128-token blocks (hopper_params.h)");
  // FP8 attention (prefill_sm90_fp8.cuh): Q and K tiles of bytes go to e4m3 wgmmas as TMA landed
  // them; V's bytes land in the byte ring, and the producer warpgroup's warps 1-3 transpose them
  // into the V stage (FP8 wgmma reads B K-major only), or with P16 widen them.
  static constexpr bool kQkv8 = (kFlags & kFeatureQkvE4m3) != 0;
  static_assert(!kQkv8 || (prefill_sm90_serves_qkv8(kHeadDim, kPageSize, kFlags) && !kPersistent &&
                           kBlockN == prefill_sm90_block_n(kHeadDim, kConsumers, true)),
                "FP8 attention: hd64, 128 or 256, pages of 8 tokens or more, 128-token blocks, no other feature "
                "(hopper_params.h)");
  static constexpr bool kVTransposed = kQkv8 && !kP16;  // else V is widened (P16) or 16-bit already
  static constexpr bool kByteRings = kKv8 || kQkv8;
  // Rows of bytes (FP8 attention's Q and K, the byte rings) as TMA boxes: 128-byte chunks, each
  // 128-byte swizzled, or at hd64 one 64-byte row, 64-byte swizzled (the box's width sets the
  // swizzle: runtime/tensor_map.cpp; the descriptors follow it).
  static constexpr int kByteRow = kHeadDim < 128 ? kHeadDim : 128;
  static constexpr int kByteChunks = kHeadDim / kByteRow;
  static_assert(kByteRow == 64 || kByteRow == 128, "rows of bytes: one 64-byte row or 128-byte chunks");
  // Q and K rows as TMA boxes: 64 16-bit elements a 128-byte chunk, or FP8 attention's chunks of
  // bytes; and where a consumer's 64 rows of Q start (rows of kQRowBytes a chunk).
  static constexpr int kQkChunkElems = kQkv8 ? kByteRow : 64;
  static constexpr int kQkChunks = kHeadDim / kQkChunkElems;
  static constexpr int kQRowBytes = kQkv8 ? kByteRow : 128;
  static constexpr int kQTxBytes = kQkv8 ? kBlockM * kHeadDim : Shape::kQBytes;
  static constexpr int kKTxBytes = kByteRings ? kKv8Bytes : Shape::kKvBytes;
  // A Q slot's and the ring stages' bytes (prefill_sm90_rings, hopper_params.h).
  static constexpr PrefillSm90Rings kRings = prefill_sm90_rings(kHeadDim, kConsumers, kBlockN, kFlags);
  static constexpr int kQSlotBytes = kRings.q_slot;
  static constexpr int kKStageBytes = kRings.k_stage;
  static constexpr int kVStageBytes = kRings.v_stage;
  static constexpr int kK8StageBytes = kRings.k8_stage;
  static constexpr int kV8StageBytes = kRings.v8_stage;
  static_assert(prefill_sm90_smem_bytes(kHeadDim, kConsumers, kBlockN, kPersistent, kFlags) <= 227 * 1024,
                "the tiles and rings fit an SM's shared memory");
  static constexpr int kProducerRegs = prefill_sm90_producer_regs(kConsumers, kPersistent, kByteRings, kHeadDim);
  static constexpr int kConsumerRegs = prefill_sm90_consumer_regs(kConsumers, kByteRings, kHeadDim);
};

// Shared memory: kQSlots Q tiles, the K and V rings, then their mbarriers (prefill_sm90_smem_bytes
// in hopper_params.h counts the same), all from the first 1024-byte boundary (the swizzle atom).
// The kernel carves it (prefill_sm90.cuh); the roles see its pointers through this view.
template <class C>
struct PrefillSm90Smem {
  unsigned char* const& q;  // kQSlots tiles
  unsigned char* const& k;
  unsigned char* const& v;
  sm90::u64* const& q_full;  // one a Q slot
  sm90::u64* const& k_full;
  sm90::u64* const& k_empty;
  sm90::u64* const& v_full;
  sm90::u64* const& v_empty;
  unsigned* const& warp_words;  // sm90::pin_wait_after's
  sm90::u64* const& q_empty;    // persistent: a Q slot's (the consumers' stores are done with it)
  // An FP8 cache's byte rings and their barriers (kKv8 only; other variants never touch them).
  unsigned char* const& k8;
  unsigned char* const& v8;
  sm90::u64* const& k8_full;
  sm90::u64* const& k8_empty;
  sm90::u64* const& v8_full;
  sm90::u64* const& v8_empty;
};

// What a tile walks.
struct PrefillSm90Walk {
  PrefillTile cta;
  PrefillRequest r;
  int rows;           // the request's tile rows
  int last_position;  // of the tile's last row
  int n_blocks;       // blocks the tile's last row can see
  int mask_from;      // the first column some row of the tile cannot see
  int first_block, block_count, window_mask_until;
  int active;  // consumers with rows to compute
};

template <class C>
__device__ __forceinline__ PrefillSm90Walk prefill_sm90_walk(const PrefillParams& p, const PrefillTile& cta) {
  constexpr int kPackHeads = C::kPackHeads;
  constexpr int kBlockN = C::kBlockN;
  PrefillSm90Walk w;
  w.cta = cta;
  w.r = prefill_request<C::kPageSize>(p, cta.batch_index);
  w.rows = w.r.q_len * kPackHeads;
  const int m0 = cta.start;
  w.last_position = (min(m0 + C::kBlockM, w.rows) - 1) / kPackHeads;
  w.n_blocks = (prefill_row_stop(w.r, w.last_position) + kBlockN - 1) / kBlockN;
  w.mask_from = prefill_row_stop(w.r, m0 / kPackHeads);
  // A window starts the walk at the first row's first key (block aligned); blocks before the
  // last row's first key are masked like the diagonal's. Rows whose window starts past the KV
  // leave nothing to walk.
  w.first_block =
      C::kWindow
          ? max(window_first_key(static_cast<long long>(w.r.causal_base) + m0 / kPackHeads, p.features), 0) / kBlockN
          : 0;
  w.block_count = C::kPersistent && m0 >= w.rows ? 0 : w.n_blocks - w.first_block;
  w.window_mask_until =
      C::kWindow ? window_first_key(static_cast<long long>(w.r.causal_base) + w.last_position, p.features) : 0;
  // Consumers whose 64 rows all lie past the request's end (in the last tile of a length that
  // is not a multiple of kBlockM) have nothing to compute: they leave at once, and the stages'
  // empty barriers, the turns and the V tail's clearing count only the others. Computing those
  // rows anyway cost B4 x 4096 in 192-row tiles 3% of its MMAs, causal B2 x 8192 1.6%.
  // Persistent CTAs keep every consumer: the barriers' counts hold for all their tiles.
  w.active = C::kPersistent ? C::kConsumers : min(C::kConsumers, (w.rows - m0 + 63) / 64);
  return w;
}

// Persistent CTAs (kPersistent): the launch holds a CTA an SM or fewer, and each CTA walks tiles
// of p.tile_order's grid in prefill_tile_at's order. Tiles come heaviest first; a CTA takes one
// from each row of gridDim.x tiles, from the row's start and end in turn, so that the CTAs'
// shares weigh alike (taking the same place in every row gave a CTA the heaviest tile of each
// band). The CTA's k-th tile, and the grid's tile count (the walk ends at the first k past it).
__device__ __forceinline__ unsigned prefill_sm90_persistent_tile(int k) {
  return k * gridDim.x + (k % 2 == 0 ? blockIdx.x : gridDim.x - 1 - blockIdx.x);
}
__device__ __forceinline__ unsigned prefill_sm90_persistent_tiles(const PrefillParams& p) {
  return p.tile_order.tiles.divisor * p.tile_order.rows;
}

}  // namespace astrai
