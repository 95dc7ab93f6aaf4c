// Tiling of the Hopper (sm_90a) kernels, shared by the host launchers and the kernels.
#pragma once

#include "kernel_params.h"

namespace astrai {

// bf16 GEMM (bench/kernels/hopper_gemm.cuh): 128 x 256 tiles of C, 64-wide K slices in a 4-stage ring.
inline constexpr int kGemmBlockM = 128;
inline constexpr int kGemmBlockN = 256;
inline constexpr int kGemmBlockK = 64;
inline constexpr int kGemmStages = 4;
inline constexpr int kGemmThreads = 384;
inline constexpr int kGemmStageBytesA = kGemmBlockM * kGemmBlockK * 2;
inline constexpr int kGemmStageBytesB = kGemmBlockN * kGemmBlockK * 2;
// The ring, its barriers, and 1 KB to align the ring to the swizzle atom by hand.
inline constexpr int kGemmSmemBytes = kGemmStages * (kGemmStageBytesA + kGemmStageBytesB) + 1024 + 1024;

// Prefill (prefill_sm90.cuh): a producer warpgroup and two or three consumer warpgroups of 64
// query rows each, K and V blocks two deep.
inline constexpr int kPrefillSm90Stages = 2;  // K and V blocks in flight, each
// Threads that widen an FP8 cache's bytes or transpose FP8 attention's V: warps 1..3 of the
// producer warpgroup.
inline constexpr int kPrefillSm90Wideners = 96;

// Consumer warpgroups: three at hd64, whose softmax weighs most against its GEMMs (a third
// warpgroup's softmax hides behind two others' GEMMs), two at larger head dims, whose O tile needs
// the registers. On the H200, hd64 causal 2 x 8192 ran at 465-473 TFLOP/s with three against
// 420-428 with two. hd128 with three: the wide tiling below.
constexpr int prefill_sm90_consumers(int head_dim) { return head_dim <= 64 ? 3 : 2; }
// The wide tiling beside the default, where one exists (else 0): three consumers at hd128, 192
// query rows a CTA in 80-token blocks. 192 rows share each K/V block, a third less traffic from
// L2 per FLOP, which the power cap rewards on large grids (sustained +1.0-1.9% on the H200, paged
// +3.4%); but 96 tiles on 132 SMs (one request, q 512 x kv 32768) ran at 505 TFLOP/s against
// about 700 with the default, so the launch picks it by grid (launch_heuristics.hpp).
constexpr int prefill_sm90_wide_consumers(int head_dim) { return head_dim == 128 ? 3 : 0; }
constexpr int prefill_sm90_consumers(int head_dim, bool wide) {
  return wide ? prefill_sm90_wide_consumers(head_dim) : prefill_sm90_consumers(head_dim);
}
// With the variant's features: an FP8 cache's and FP8 attention's byte rings take two consumers
// (at hd128 and hd256 a third would leave each too few registers beside the transposing or
// widening producer's), but FP8 attention at hd64 three, as the 16-bit hd64 kernel: its softmax
// weighs most, and O, S and P of 64 dims and 128 tokens fit the 152 registers three leave.
constexpr int prefill_sm90_consumers(int head_dim, bool wide, unsigned flags) {
  if ((flags & kFeatureQkvE4m3) != 0 && head_dim == 64) return 3;
  return (flags & (kFeatureKvFp8 | kFeatureQkvE4m3)) != 0 ? 2 : prefill_sm90_consumers(head_dim, wide);
}
constexpr int prefill_sm90_threads(int consumers) { return 128 * (consumers + 1); }
constexpr int prefill_sm90_block_m(int consumers) { return 64 * consumers; }  // query rows per CTA

// Registers per thread after setmaxnreg: the producer warpgroup gives up what the consumers'
// S, P and O tiles need. The pool is what the launch allocated (65536 / threads, rounded down to
// 8, under __launch_bounds__(threads, 1)), not more: asking for more makes setmaxnreg.inc wait
// forever.
// Persistent CTAs' producers walk tiles (their loop state spilled at 24): with three consumers
// they take the 8 a thread that the consumers leave in the pool (two leave none).
// An FP8 cache's producer warpgroup also widens the cache's bytes (prefill_sm90_widen.cuh) and
// takes 56 a thread (at 40 its walk's addresses spilled); its consumers' 128-token blocks fit 224.
// FP8 attention at hd256: the consumers' O (128), S (64) and P (16) need 240 (at 232 ptxas
// serialized the wgmmas), which leaves the transposing producer 24 (a few of its per-lane
// offsets spill, loaded once a block).
constexpr int prefill_sm90_producer_regs(int consumers, bool persistent, bool kv8 = false, int head_dim = 128) {
  return kv8 ? (head_dim == 256 ? 24 : 56) : persistent && consumers == 3 ? 32 : 24;
}
constexpr int prefill_sm90_launch_regs(int consumers) { return 65536 / prefill_sm90_threads(consumers) / 8 * 8; }
constexpr int prefill_sm90_consumer_regs(int consumers, bool kv8 = false, int head_dim = 128) {
  return kv8 ? (consumers == 3 ? 152 : head_dim == 256 ? 240 : 224) : consumers == 2 ? 240 : 160;
}
static_assert(128 * prefill_sm90_producer_regs(2, true) + 256 * prefill_sm90_consumer_regs(2) <=
                  prefill_sm90_threads(2) * prefill_sm90_launch_regs(2),
              "setmaxnreg asks for more registers than the launch holds");
static_assert(128 * prefill_sm90_producer_regs(3, true) + 384 * prefill_sm90_consumer_regs(3) <=
                  prefill_sm90_threads(3) * prefill_sm90_launch_regs(3),
              "setmaxnreg asks for more registers than the launch holds");
static_assert(128 * prefill_sm90_producer_regs(2, false, true) + 256 * prefill_sm90_consumer_regs(2, true) <=
                  prefill_sm90_threads(2) * prefill_sm90_launch_regs(2),
              "setmaxnreg asks for more registers than the launch holds");
static_assert(128 * prefill_sm90_producer_regs(2, false, true, 256) + 256 * prefill_sm90_consumer_regs(2, true, 256) <=
                  prefill_sm90_threads(2) * prefill_sm90_launch_regs(2),
              "setmaxnreg asks for more registers than the launch holds");
static_assert(128 * prefill_sm90_producer_regs(3, false, true, 64) + 384 * prefill_sm90_consumer_regs(3, true, 64) <=
                  prefill_sm90_threads(3) * prefill_sm90_launch_regs(3),
              "setmaxnreg asks for more registers than the launch holds");

// KV tokens per block: S (block_n / 2 registers a thread) and P (block_n / 4) beside O
// (head_dim / 2), and Q with two stages of K and V inside 227 KB. On the H200, with two
// consumers hd64 192 beat 128 by 5%,
// hd128 192 beat 176 by 1.0% (non-causal) and 1.5% (causal), hd256 80 beat 64 by 6%. Three
// consumers (160 registers) hold S of 128 tokens at hd64 and of 80 beside hd128's O.
// An FP8 cache's blocks are 128 tokens: its bytes' rings must fit beside the 16-bit ones.
constexpr int prefill_sm90_block_n(int head_dim, int consumers, bool kv8 = false) {
  return kv8 ? 128 : consumers == 3 ? (head_dim <= 64 ? 128 : 80) : head_dim <= 128 ? 192 : 80;
}

// A Q slot's and each ring stage's bytes, by variant. 16-bit: Q, K and V tiles of 16-bit
// elements. An FP8 cache: those, and the rings of its bytes (k8, v8) that TMA lands and the
// widening drains. FP8 attention: Q and K tiles of bytes, as TMA landed them for the wgmmas; V's
// bytes in the v8 ring, and in the V ring their transposition (bytes), or with P in f16 their
// widening (16-bit); no k8 ring.
struct PrefillSm90Rings {
  int q_slot, k_stage, v_stage, k8_stage, v8_stage;
};
// FP8 attention's Q slot holds at least a 128-byte row a query: the epilogue stages O's 16-bit
// rows through it, 64 columns a pass (hd64's 64-byte rows of q would leave it half that).
constexpr PrefillSm90Rings prefill_sm90_rings(int head_dim, int consumers, int block_n, unsigned flags) {
  const int q_bytes = prefill_sm90_block_m(consumers) * head_dim;
  const int bytes = block_n * head_dim;  // a block of K or V, one byte an element
  if ((flags & kFeatureQkvE4m3) != 0)
    return {prefill_sm90_block_m(consumers) * (head_dim < 128 ? 128 : head_dim), bytes,
            (flags & kFeatureQkvP16) != 0 ? 2 * bytes : bytes, 0, bytes};
  if ((flags & kFeatureKvFp8) != 0) return {2 * q_bytes, 2 * bytes, 2 * bytes, bytes, bytes};
  return {2 * q_bytes, 2 * bytes, 2 * bytes, 0, 0};
}

// Q (two slots in a persistent CTA), the rings (above), their mbarriers (a full one per Q slot,
// a full and an empty one per stage of K and of V, and of the byte rings where there are any), a
// word per warp (sm90::pin_wait_after), persistent CTAs' empty barrier per Q slot, and 1 KB to
// align the tiles by hand. `flags`: the variant's features (the rings depend on kFeatureKvFp8,
// kFeatureQkvE4m3 and kFeatureQkvP16).
constexpr int prefill_sm90_smem_bytes(int head_dim, int consumers, int block_n, bool persistent = false,
                                      unsigned flags = 0) {
  const PrefillSm90Rings r = prefill_sm90_rings(head_dim, consumers, block_n, flags);
  const int q_slots = persistent ? 2 : 1;
  const bool byte_rings = r.v8_stage != 0;
  return q_slots * r.q_slot + kPrefillSm90Stages * (r.k_stage + r.v_stage + r.k8_stage + r.v8_stage) +
         8 * (q_slots + 4 * kPrefillSm90Stages) + 4 * prefill_sm90_threads(consumers) / 32 +
         (persistent ? 8 * q_slots : 0) + 1024 + (byte_rings ? 8 * 4 * kPrefillSm90Stages : 0);
}

// Persistent CTAs (prefill_sm90.cuh): a CTA an SM walks tiles, the next tile's Q and first K
// blocks loading under this one's last blocks and stores. Against a CTA a tile (H200, burst /
// sustained): hd64 24/4 heads causal 16 x 1024 +5.5% / +3.2%, hd128 16 x 1024 (wide) +3.9% /
// +2.8%, non-causal B4 x 4096 (wide) +1.5% / +1.4%; causal B2 x 8192 -1.6% / -0.4% (wide hd128)
// and -2.9% / -1.7% (hd64), where the walk's first block, taken whole, weighs. Their two Q slots
// fit beside three consumers' rings (hd64, hd128's wide tiles), not two's; contiguous KV without
// features only.
constexpr bool prefill_sm90_persistent(int page_size, int consumers, unsigned flags) {
  return page_size == 0 && consumers == 3 && flags == 0;
}

template <int kHeadDim, int kConsumers_, int kBlockN_>
struct PrefillSm90Shape {
  static_assert(kHeadDim % 64 == 0 && kHeadDim >= 64 && kHeadDim <= 256, "head_dim");
  static_assert(kConsumers_ == 2 || kConsumers_ == 3, "consumer warpgroups");
  static_assert(kBlockN_ % 16 == 0 && kBlockN_ <= 256, "block_n");
  static constexpr int kConsumers = kConsumers_;
  static constexpr int kConsumerRegs = prefill_sm90_consumer_regs(kConsumers);
  static constexpr int kBlockM = prefill_sm90_block_m(kConsumers);
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kStages = kPrefillSm90Stages;
  static constexpr int kChunks = kHeadDim / 64;  // 128-byte column chunks per row
  static constexpr int kQBytes = kBlockM * kHeadDim * 2;
  static constexpr int kKvBytes = kBlockN * kHeadDim * 2;  // one K or V block
};

// Packed GQA: a tile's rows are a pack of query heads sharing a KV head, at each of its positions
// (packed row position x pack + head), so those heads share its K and V blocks in one CTA. A
// request's rows then end in one partial tile per pack instead of one per query head, and under
// a causal limit a tile spans pack times fewer positions, so its diagonal block masks less. The
// pack must divide 64, so that every consumer's 64 rows hold whole positions: it is the largest
// power of two dividing the group, up to 64 (the whole group of 4 or 8; 2 heads of a group of 6,
// 4 of 12; 1, no packing, for odd groups).
constexpr int prefill_sm90_pack_heads(int group) {
  int pack = 1;
  while (pack < 64 && group % (2 * pack) == 0) pack *= 2;
  return pack;
}
constexpr bool prefill_sm90_packs_gqa(int group) { return prefill_sm90_pack_heads(group) > 1; }

// Serving features the Hopper prefill computes: the soft-cap, sinks, the sliding window, and an
// FP8 cache (paged, at the head dims of prefill_sm90_serves_kv8), widened in shared memory.
constexpr unsigned prefill_sm90_features() {
  return kFeatureSoftCap | kFeatureSink | kFeatureWindow | kFeatureKvE4m3 | kFeatureKvE5m2 | kFeatureQkvE4m3 |
         kFeatureQkvP16;
}
// FP8 attention (kFeatureQkvE4m3, prefill_sm90_fp8.cuh): head dim 64, 128 or 256, contiguous KV
// or an e4m3 cache in pages of 8 tokens or more (the FP8 cache's boxes), no other feature but P
// in f16 (kFeatureQkvP16) at hd128; its tiles are the FP8 cache's (128-token blocks, a byte ring
// for V, two consumers; three at hd64: prefill_sm90_consumers). hd256's rings take 224 KB of bytes; P in f16 would widen V into 64 KB
// more than an SM has. hd64's rows of bytes are 64 bytes, 64-byte swizzled (TMA's box and the
// descriptors' mode follow the row); P in f16 there would need the widening's 64-byte form.
constexpr bool prefill_sm90_serves_qkv8(int head_dim, int page_size, unsigned flags) {
  const bool p16 = (flags & kFeatureQkvP16) != 0;
  return (head_dim == 128 || ((head_dim == 64 || head_dim == 256) && !p16)) && (page_size == 0 || page_size >= 8) &&
         (flags & ~(kFeatureQkvE4m3 | kFeatureQkvP16)) == 0;
}
// Head dims whose FP8 rows are one 128-byte swizzle row (the TMA box of the cache's bytes), and
// whose rings fit: 128.
constexpr bool prefill_sm90_serves_kv8(int head_dim) { return head_dim == 128; }

// Head dims the Hopper prefill serves (others take the portable kernel).
constexpr bool prefill_sm90_head_dim(int head_dim) {
  return head_dim == 64 || head_dim == 128 || head_dim == 192 || head_dim == 256;
}

// Decode (paged_decode_sm90.cuh): the tensor-core decode's 4 warps and 64-token blocks, K and V
// brought by TMA into a ring of 3 stages of 2 x 64 x head_dim elements: 4 CTAs an SM at hd64
// (shared memory), 2 at hd128, 1 beyond. Measured on the H200: hd128 with 2 stages (3 CTAs)
// moved -1.9 to +2.6 points by shape, and with 6 stages at 1 CTA fell to 71.5% of the read. With
// its copies leaving L2 first, 3 stages read the contiguous hd64 24/4 heads 32 x 4096 4.6% faster
// than 2 (whose 80 registers allowed 6 CTAs an SM, which read less) and the paged one 0.5%; 4
// stages (3 CTAs an SM) read the paged one 5.0% slower. At 2 splits (half the CTA slots) the paged
// hd64 row took 0.8% longer than at 4: each SM's rate, not the grid's tail, sets it.
inline constexpr int kDecodeSm90Stages = 3;

// A stage: a block's K and V rows.
constexpr int decode_sm90_stage_bytes(int head_dim, bool fp8 = false) {
  return 2 * kDecodeBlockTokens * head_dim * (fp8 ? 1 : 2);
}

// Stages of the ring: kDecodeSm90Stages, but 5 in the wide CTAs of an FP8 cache at hd64 (stages of
// 8 KB; each group's 44 KB stays within the 16-bit region). Measured on an H100 (hd64 24/4 e4m3,
// pages of 16, B32 x 4096): wide CTAs of 5 stages 31.6-31.8 us; a split a CTA 33.1-33.2 us at 3
// stages, 38.3 at 5 and 41.1-41.6 at 6 (decision 0029).
constexpr int decode_sm90_stages(int head_dim, bool fp8 = false, bool wide = false) {
  return fp8 && wide && head_dim == 64 ? 5 : kDecodeSm90Stages;
}

// The Q tile (rows of head_dim + 8 elements), 1 KB to align the ring by hand, the ring, and a
// full barrier per stage. An FP8 cache's stages hold half the bytes, for twice the CTAs an SM
// (with the 16-bit ring's bytes, 2 CTAs at hd128, it read 4% slower than the portable direct
// path's 4: decision 0029). `wide`: one group of a wide CTA.
constexpr int decode_sm90_smem_bytes(int head_dim, bool fp8 = false, bool wide = false) {
  return kDecodeHeadsPerTile * (head_dim + 8) * 2 + 1024 +
         decode_sm90_stages(head_dim, fp8, wide) * (decode_sm90_stage_bytes(head_dim, fp8) + 8);
}

// CTAs of the Hopper decode (one split group a CTA) an SM holds: its 228 KB of shared memory, 1 KB
// of it reserved a CTA (4 at hd64, 2 at hd128, 1 beyond), and at most 4 by registers: the
// variants use up to 128 a thread (hd64's 94-122; a unit test holds them there), which is what
// bounds an FP8 cache's hd64 CTAs (28 KB of shared memory). So the launch plans its splits from
// this count before any variant is compiled, and a call that takes wide CTAs compiles only the
// wide variant.
inline constexpr int kSm90SmemPerSm = 228 * 1024;
inline constexpr int kSm90SmemReservedPerCta = 1024;
inline constexpr int kDecodeSm90MaxRegs = 128;
constexpr int decode_sm90_ctas_per_sm(int head_dim, bool fp8 = false) {
  const int by_smem = kSm90SmemPerSm / (decode_sm90_smem_bytes(head_dim, fp8) + kSm90SmemReservedPerCta);
  const int by_regs = 65536 / (kDecodeSm90MaxRegs * kDecodeThreads);
  const int by_threads = 2048 / kDecodeThreads;
  const int most = by_regs < by_threads ? by_regs : by_threads;
  return by_smem < most ? by_smem : most;
}

// Splits a wide Hopper decode CTA (`.wide` variants) runs side by side, each in a region of
// decode_sm90_smem_bytes and 8 bytes (region 0's hold the merge's mbarrier) rounded up to 128
// bytes (its Q tile takes 16-byte stores): at hd64 four fit an SM's 227 KB of shared memory.
inline constexpr int kDecodeSm90WideSplits = 4;
constexpr int decode_sm90_wide_region_bytes(int head_dim) {
  return (decode_sm90_smem_bytes(head_dim) + 8 + 127) / 128 * 128;
}
constexpr bool decode_sm90_has_wide(int head_dim) {
  return head_dim % 64 == 0 && kDecodeSm90WideSplits * decode_sm90_wide_region_bytes(head_dim) <= 227 * 1024;
}

// Features the Hopper decode computes; an FP8 cache (decode_sm90_kv8.cuh) at the head dims of
// decode_sm90_serves_kv8, in CTAs of one split.
constexpr unsigned decode_sm90_features() {
  return kFeatureSoftCap | kFeatureSink | kFeatureWindow | kFeatureQLenField | kFeatureAlibi | kFeatureKvE4m3 |
         kFeatureKvE5m2;
}
constexpr bool decode_sm90_serves_kv8(int head_dim) { return head_dim == 64 || head_dim == 128 || head_dim == 256; }

// Head dims whose rows are whole 128-byte swizzle chunks; contiguous KV or pages of 16 tokens
// or more (a box per page and chunk; 32 boxes a block at most).
constexpr bool decode_sm90_serves(int head_dim, int page_size) {
  return head_dim % 64 == 0 && head_dim <= 256 && (page_size == 0 || page_size >= 16);
}

// MLA decode (mla_decode_sm90.cuh): a producer warpgroup and two consumer warpgroups over 64
// query rows (heads, and tokens of a multi-token decode) of one request; blocks of 64 latent
// rows of 576 dims by TMA, two deep; Q resident. Each consumer computes half of the block's S
// (32 keys), and half of O (256 of V's 512 dims: 128 accumulators a thread) from the whole P,
// which they share through a tile. Registers as the prefill's two-consumer split.
inline constexpr int kMlaSm90Rows = 64;
inline constexpr int kMlaSm90BlockN = 64;
inline constexpr int kMlaSm90Stages = 2;
inline constexpr int kMlaSm90Threads = 384;
inline constexpr int kMlaSm90TileBytes = 64 * kMlaQkDim * 2;  // Q, or a block of K (V its first 512 dims)
static_assert(kMlaSm90Rows == 64 && kMlaSm90BlockN == 64, "one tile size serves Q and the KV blocks");
inline constexpr int kMlaSm90PBytes = kMlaSm90Rows * kMlaSm90BlockN * 2;  // P, one 128-byte row a query row
// The Q tile, the KV ring, P, the ring's full and empty barriers, the rows' exchange (two floats
// a row), and 1 KB to align the tiles by hand.
constexpr int mla_sm90_smem_bytes() {
  return 1024 + (1 + kMlaSm90Stages) * kMlaSm90TileBytes + kMlaSm90PBytes + 16 * kMlaSm90Stages + 8 * kMlaSm90Rows;
}
static_assert(mla_sm90_smem_bytes() <= 227 * 1024, "a CTA an SM");
// Page sizes the TMA boxes serve (a box is a page's rows, at most a block's); smaller pages take
// the portable kernel.
constexpr bool mla_sm90_serves(int page_size, unsigned kv_flags) {
  return page_size >= 16 && page_size <= 1024 && (page_size & (page_size - 1)) == 0 && kv_flags == 0;
}

}  // namespace astrai
