// Parameter structs shared by the host runtime and the device kernels. Plain C++ with no
// includes, so NVRTC compiles it without any header search path. Strides are in elements.
#pragma once

namespace astrai {

// Feature bits of the attention templates (their kFlags argument; a variant name spells each as
// a field: ".kv_e4m3", ".swa", ".cap", ".sink", ".q4"). A variant without a bit compiles none of its code.
// An enum, not constants: namespace-scope constants become device globals in every cubin.
enum FeatureBit : unsigned {
  kFeatureSoftCap = 1u,  // logit soft-cap: s -> cap * tanh(s / cap)
  kFeatureSink = 2u,     // a per-head logit joining the softmax denominator only
  kFeatureWindow = 4u,   // sliding window: a query at position p attends to [p - window_left, p]
  kFeatureKvE4m3 = 8u,   // FP8 KV cache, e4m3 bytes (value = fp8 * scale); q and out keep T
  kFeatureKvE5m2 = 16u,  // FP8 KV cache, e5m2 bytes; excludes kFeatureKvE4m3
  kFeatureKvFp8 = kFeatureKvE4m3 | kFeatureKvE5m2,  // either FP8 format: a mask, not a feature
  // Multi-token decode (paged decode only), a field rather than a bit: q_len - 1 in bits 5..7,
  // the new query tokens per request (named ".q2" .. ".q8"); 0 is the single-token decode.
  kFeatureQLenField = 7u << 5,
  kFeatureAlibi = 1u << 8,  // ALiBi: a per-head linear bias by key distance, slope * (key - query)
  // FP8 attention (the Hopper prefill): q, k and v in e4m3 (value = fp8 * scale), both GEMMs on
  // FP8 operands, P quantized to e4m3; out keeps T. Scales: k_scale and v_scale as an FP8 cache's,
  // q_scale per tensor or per query head.
  kFeatureQkvE4m3 = 1u << 9,
  // With kFeatureQkvE4m3: P stays in f16 for P V (V widened to f16) instead of e4m3, for callers
  // who need P's probabilities under 2^-10 or more than e4m3's 4 significant bits.
  kFeatureQkvP16 = 1u << 10,
  // Every serving option the portable kernels compute (their static_asserts check against it).
  kPortableFeatures = kFeatureSoftCap | kFeatureSink | kFeatureWindow | kFeatureKvE4m3 | kFeatureKvE5m2 | kFeatureAlibi,
};
enum DecodeQLen : int { kDecodeQLenShift = 5, kMaxDecodeQLen = 8 };

// How a call lays out its index tables and mask (a params struct's `layout_bits`). Index tables
// (page tables, request rows, lengths, query offsets) are the caller's own tensors, int32 or
// int64, read in place: a kWide* bit says that table holds int64 elements. kSeqLensIndptr:
// seq_lens holds [batch + 1] offsets (a request's length is the difference of two neighbours, as
// in a ragged kv_indptr). kMaskRowsLocal (paged prefill): mask rows are numbered within each
// request ([batch, q_len, kv] masks) rather than across the batch ([total_q, kv]).
enum LayoutBit : unsigned {
  kWidePageTable = 1u,
  kWideReqIndices = 2u,
  kWideSeqLens = 4u,
  kWideQoIndptr = 8u,
  kSeqLensIndptr = 16u,
  kMaskRowsLocal = 32u,
};

// The q_len a decode template's kFlags carries (1 without the field), and the field of a q_len.
constexpr int decode_q_len(unsigned flags) {
  return static_cast<int>((flags & kFeatureQLenField) >> kDecodeQLenShift) + 1;
}
constexpr unsigned decode_q_len_flags(int q_len) {
  return (static_cast<unsigned>(q_len - 1) << kDecodeQLenShift) & kFeatureQLenField;
}

// The run-time values of the features, the same in every attention params struct. Scores are
// kept in log2 units (raw dot * scale * log2(e)) inside the kernels.
struct AttentionFeatures {
  float cap_scale;      // soft-cap: softmax scale / logit_cap (raw dot -> tanh argument)
  float cap_log2;       // soft-cap: logit_cap * log2(e)
  const float* sinks;   // sinks: [n_heads] f32 logits in the units of the scaled scores
  int window_left;      // window: a query at position p attends to keys p - window_left .. p
  const float* k_scale;  // FP8 KV: f32 dequantization scale of K, [1] or [n_kv_heads]
  const float* v_scale;  // FP8 KV: the same for V
  int kv_scale_stride;   // FP8 KV: 0 one scale per tensor, 1 one per KV head
  const float* alibi_slopes;  // ALiBi: [n_heads] f32 slopes in the units of the scaled scores
};

// Split-KV partial results live in a float workspace (multi-token decode: n_heads becomes
// q_len x n_heads rows, token-major):
//   partial_out [num_splits, batch, n_heads, head_dim]   unnormalized-then-rescaled outputs
//   partial_lse [num_splits, batch, n_heads]              log-sum-exp (natural log) per row
struct SplitWorkspace {
  float* partial_out;
  float* partial_lse;
  int num_splits;
};

// Multi-token decode (q_len > 1): q, out and the LSE gain a token dimension, [batch, q_len,
// n_heads, ...]; query token i of request b sits at position seq_len - q_len + i and attends to
// the keys up to it. The split workspace then holds q_len * n_heads rows per request.
struct PagedDecodeParams {
  const void* q;                 // [batch, n_heads, head_dim]; multi-token [batch, q_len, n_heads, head_dim]
  long long q_stride_batch;
  long long q_stride_head;
  // Paged: [num_pages, page_size, n_kv_heads, head_dim]. Contiguous decode (page size 0):
  // [batch, kv_len, n_kv_heads, head_dim] with the batch stride in *_stride_page.
  const void* k_cache;
  const void* v_cache;
  long long k_stride_page;
  long long k_stride_token;
  long long k_stride_head;
  long long v_stride_page;
  long long v_stride_token;
  long long v_stride_head;
  const int* page_table;         // [table_rows, max_pages_per_seq] logical -> physical page
  long long page_table_stride;   // elements between rows
  const int* req_indices;        // [batch] row of page_table per request; null: row b
  int page_table_rows;           // rows outside [0, page_table_rows) make the request empty
  const int* seq_lens;           // [batch], the current token included; null: kv_capacity
  unsigned layout_bits;          // LayoutBit: int64 tables, seq_lens as offsets
  int kv_capacity;               // tokens a sequence can hold (table width x page size, or
                                 // the contiguous kv length); seq_lens are clamped to it
  const bool* mask;              // optional [batch, mask_stride_batch], true = keep
  long long mask_stride_batch;
  const void* new_k;             // optional fused append: [batch, n_kv_heads, head_dim]
  const void* new_v;
  long long new_k_stride_batch;
  long long new_k_stride_head;
  long long new_v_stride_batch;
  long long new_v_stride_head;
  float* lse;                    // optional [batch, n_heads] natural-log LSE
  void* out;                     // [batch, n_heads, head_dim]
  long long out_stride_batch;
  long long out_stride_head;
  int batch;
  int n_heads;
  int n_kv_heads;
  int num_pages;                 // page ids outside [0, num_pages) read as zeros, never out of bounds
  int max_pages_per_seq;
  int tokens_per_split;          // multiple of the kernel's token block
  float scale_log2;              // softmax scale * log2(e)
  SplitWorkspace workspace;      // used when workspace.num_splits > 1
  // Read only by variants with feature bits. The window is taken from the query's position
  // seq_len - 1 (contiguous decode folds a causal offset past kv_len into window_left; a
  // negative value then leaves nothing to attend to).
  AttentionFeatures features;
  long long q_stride_seq;        // multi-token only: between the query tokens of a request
  long long out_stride_seq;      // multi-token only
};

// Tiling shared by the host launcher and the paged decode kernel.
inline constexpr int kDecodeThreads = 128;     // 4 warps
inline constexpr int kDecodeBlockTokens = 64;  // tokens per pipeline stage (16 per warp)
inline constexpr int kDecodeHeadsPerTile = 16; // query heads of one KV head per CTA (the MMA M tile)
inline constexpr int kDecodeStages = 2;
inline constexpr int kMaxSplits = 256;
// The split combine reads a row of 512 columns or more (a multiple of 128) in slices of 128, one
// CTA a slice: a row of 512 (MLA's V) read by one CTA's 128 threads left too few loads in flight
// to cover the latency of 64 splits' partials. Narrower rows keep a CTA a row: at hd256 two slices
// measured no gain (batch 1 x 32768, within +0.5%).
inline constexpr int kCombineSliceColumns = 128;
constexpr int combine_column_slices(int head_dim) {
  return head_dim >= 4 * kCombineSliceColumns && head_dim % kCombineSliceColumns == 0
             ? head_dim / kCombineSliceColumns
             : 1;
}
// An FP8 cache with head dim 64, 128 or 256 (tensor-core path) is read straight from its
// bytes into MMA fragments: each warp streams its own 16 rows a step through a ring of
// kv8_stages(head_dim) K+V stages, with no widened tile and no CTA barrier in the loop. Other
// head dims widen each block into a K and a V tile of T (see paged_decode.cuh).
constexpr bool kv8_direct_head_dim(int head_dim) { return head_dim == 64 || head_dim == 128 || head_dim == 256; }
constexpr int kv8_stages(int head_dim) { return head_dim == 64 ? 4 : 3; }  // 4 CTAs an SM at 128
// Dynamic shared memory of the paged decode kernel: a Q tile plus K and V stages, each row
// padded by 16 bytes so ldmatrix reads of 8 rows hit 8 different bank groups. FP8: the Q tile
// plus the per-warp byte rings (direct head dims), or byte stages plus one widened K and V tile.
// The CUDA-core path widens as it loads (no byte stages) and needs no more.
constexpr int paged_decode_smem_bytes(int head_dim, bool fp8_kv = false) {
  return !fp8_kv ? (kDecodeHeadsPerTile + 2 * kDecodeStages * kDecodeBlockTokens) * (head_dim + 8) * 2
         : kv8_direct_head_dim(head_dim)
             ? kDecodeHeadsPerTile * (head_dim + 8) * 2 + kDecodeThreads / 32 * kv8_stages(head_dim) * 2 * 16 * head_dim
             : (kDecodeHeadsPerTile + 2 * kDecodeBlockTokens) * (head_dim + 8) * 2 +
                   2 * kDecodeStages * kDecodeBlockTokens * head_dim;
}

struct CombineParams {
  SplitWorkspace workspace;
  float* lse;                    // optional [batch, n_heads]
  void* out;                     // [batch, n_heads, head_dim]
  long long out_stride_batch;
  long long out_stride_head;
  int batch;
  int n_heads;
};

// The multi-token decode's combine: rows (batch, token, head) of q_len tokens per request.
struct TokenCombineParams {
  CombineParams rows;            // lse [batch, q_len, n_heads], out [batch, q_len, n_heads, head_dim]
  long long out_stride_seq;
};

// merge_states (merge_states.cuh): a source of attention states, values [rows, states,
// n_heads, head_dim] of the call's dtype and their LSEs [rows, states, n_heads] (f32, natural
// log), strides in elements.
struct MergeSourceParams {
  const void* v;
  const float* lse;
  long long v_stride_row;
  long long v_stride_state;
  long long v_stride_head;
  long long lse_stride_row;
  long long lse_stride_state;
  long long lse_stride_head;
  int states;                    // 0: the source adds nothing
};

// An enum: no device global. The kernel is built for kMergeStatesCtasPerSm resident CTAs an SM
// (its register bound), and the grid holds at most that many an SM, so that none waits for a slot.
enum MergeStatesLaunch : int { kMergeStatesThreads = 128, kMergeStatesCtasPerSm = 12 };

struct MergeStatesParams {
  MergeSourceParams a;
  MergeSourceParams b;
  void* out;                     // [rows, n_heads, head_dim]; may be a's or b's single state
  long long out_stride_row;
  long long out_stride_head;
  float* lse;                    // optional [rows, n_heads]; may be a's or b's single state
  long long lse_stride_row;
  long long lse_stride_head;
  int rows;
  int n_heads;
};

// cascade's split of a shared level into chunks of its keys (merge_states.cuh): the chunks'
// query offsets and lengths, and one copy of q's rows a chunk (chunk s's group reads copy s).
struct CascadeChunkParams {
  const int* seq_lens;           // the level's one length (int32, or int64 when wide)
  int* indptr;                   // [chunks + 1]: s * rows
  int* lens;                     // [chunks]: the level's keys in chunk s
  const void* q;                 // [rows, n_heads, head_dim], strided
  void* q_copies;                // [chunks, rows, n_heads, head_dim], contiguous
  long long q_stride_token;
  long long q_stride_head;
  int rows;
  int n_heads;
  int chunks;
  int chunk_tokens;
  int capacity;                  // tokens the level's table row holds: its length is clamped to it
  int wide;
};

// MLA decode (mla_decode.cuh), the absorbed form DeepSeek-V2/V3 serve: each query row is a
// 576-wide vector (512 latent dims, then 64 rotary dims) against one shared latent KV head whose
// rows are [latent 512 | rope 64]; V is a row's first 512 dims, so K and V are one cache.
enum MlaDims : int { kMlaQkDim = 576, kMlaVDim = 512 };
struct MlaDecodeParams {
  const void* q;                 // [batch, q_len, n_heads, 576]
  long long q_stride_batch;
  long long q_stride_seq;
  long long q_stride_head;
  const void* kv_cache;          // [num_pages, page_size, 576], rows contiguous
  long long kv_stride_page;
  long long kv_stride_token;
  const int* page_table;         // [batch, max_pages_per_seq] logical -> physical page
  long long page_table_stride;
  const int* seq_lens;           // [batch] (or [batch + 1] offsets), the new tokens included
  unsigned layout_bits;          // LayoutBit: int64 tables, seq_lens as offsets
  int kv_capacity;               // max_pages_per_seq x page_size: longer lengths are clamped
  int num_pages;                 // page ids outside [0, num_pages) read as zeros
  float* lse;                    // optional [batch, q_len, n_heads] natural-log LSE
  void* out;                     // [batch, q_len, n_heads, 512]
  long long out_stride_batch;
  long long out_stride_seq;
  long long out_stride_head;
  int batch;
  int n_heads;
  int tokens_per_split;          // multiple of the kernel's token block
  float scale_log2;              // softmax scale * log2(e)
  SplitWorkspace workspace;      // rows (split, batch, token, head) of 512 floats
  const float* kv_scale;         // FP8 cache (kFeatureKvE4m3 / kFeatureKvE5m2): [1] f32, value = fp8 * scale
};
// Shared memory of an MLA decode CTA: the query rows, two stages of KV rows (576 wide, padded
// by 16 bytes so ldmatrix rows fall in distinct banks), the probabilities and the row exchange.
// An FP8 cache stages its rows as bytes (two stages of 576-byte rows) and widens each block into
// one tile of 16-bit rows.
constexpr int mla_row_bytes() { return (kMlaQkDim + 8) * 2; }
constexpr int mla_kv_bytes(int block_n, bool fp8) {
  return fp8 ? 2 * block_n * kMlaQkDim + block_n * mla_row_bytes() : 2 * block_n * mla_row_bytes();
}
constexpr int mla_decode_smem_bytes(int rows, int block_n, bool fp8 = false) {
  return rows * mla_row_bytes() + mla_kv_bytes(block_n, fp8) + rows * (block_n + 8) * 2 + 4 * rows * 4;
}

struct RotaryParams {
  const void* x;                 // [batch, seq, n_heads, head_dim] (batch 1 for the 3D form)
  long long x_stride_batch;
  long long x_stride_seq;
  long long x_stride_head;
  void* out;                     // same shape as x; may alias x (in place)
  long long out_stride_batch;
  long long out_stride_seq;
  long long out_stride_head;
  const float* freqs;            // [batch or 1, seq, head_dim / 2, 2] as (cos, sin) pairs
  long long freqs_stride_batch;  // 0 broadcasts one table over the batch
  long long freqs_stride_seq;
  int batch;
  int seq_len;
  int n_heads;
};

// Division by a number fixed at launch, as a multiply and a shift that the host works out
// (Granlund and Montgomery's method): on the GPU a 32-bit division is a reciprocal on the MUFU
// pipe and its fix-ups. A causal CTA, whose tile order is a chain of such divisions, had its tile
// about 780 cycles later than a non-causal one in a traced H200 run; the divisors made short
// prompts' prefill 1-2% faster. Exact for dividends below 2^31
// and divisors from 1 to 2^31.
struct FastDivisor {
  unsigned divisor;
  unsigned multiplier;  // ceil(2^shift / divisor)
  unsigned shift;       // 31 + ceil(log2(divisor))
};
constexpr FastDivisor make_fast_divisor(unsigned divisor) {
  if (divisor == 0) return {0, 0, 0};
  unsigned log2 = 0;
  while ((1ull << log2) < divisor) ++log2;
  const unsigned shift = 31 + log2;
  return {divisor, static_cast<unsigned>(((1ull << shift) + divisor - 1) / divisor), shift};
}
constexpr unsigned fast_divide(unsigned dividend, const FastDivisor& d) {
  return static_cast<unsigned>((static_cast<unsigned long long>(dividend) * d.multiplier) >> d.shift);
}

// A prefill grid of tiles {tiles, heads, batch} and the divisors of its tile order
// (prefill_tile_at in prefill.cuh; prefill_causal_tile_place below). Every launch sets them
// (prefill_tile_order): a kernel launched a CTA a tile uses them only where they are its grid's, a
// persistent one walks the grid they describe.
struct PrefillTileOrder {
  FastDivisor tiles;      // the grid's first dimension
  unsigned rows;          // its second times its third
  FastDivisor band_ctas;  // CTAs in a whole band: its width times rows
  FastDivisor band;       // a whole band's width
  FastDivisor last_band;  // the last band's width
  FastDivisor heads;      // the grid's second dimension
};

// Prefill attention, contiguous KV (kPageSize 0) or paged KV with a ragged batch of queries.
// Query row i of request b reads q + b * q_stride_batch + (q_start_b + i) * q_stride_seq, where
// q_start_b is 0 for the contiguous form and qo_indptr[b] for the paged one (whose
// q_stride_batch is 0); out, the mask and lse follow the same row numbering.
struct PrefillParams {
  const void* q;                 // [batch, q_len, n_heads, head_dim] or [total_q, n_heads, head_dim]
  long long q_stride_batch;
  long long q_stride_seq;
  long long q_stride_head;
  // Contiguous: [batch, kv_len, n_kv_heads, head_dim], batch stride in *_stride_batch.
  // Paged: [num_pages, page_size, n_kv_heads, head_dim], page stride in *_stride_page.
  const void* k;
  const void* v;
  long long k_stride_batch;
  long long k_stride_page;
  long long k_stride_seq;
  long long k_stride_head;
  long long v_stride_batch;
  long long v_stride_page;
  long long v_stride_seq;
  long long v_stride_head;
  void* out;                     // like q
  long long out_stride_batch;
  long long out_stride_seq;
  long long out_stride_head;
  // Optional bool mask (nonzero = keep): row i of request b over kv positions starts at
  // mask + b * mask_stride_batch + (q_start_b + i) * mask_stride_q (kMaskRowsLocal: without
  // q_start_b); a stride of 0 broadcasts.
  const unsigned char* mask;
  long long mask_stride_batch;
  long long mask_stride_q;
  float* lse;                    // optional natural-log LSE, [rows, n_heads], -inf for empty rows
  const int* qo_indptr;          // paged: [batch + 1] query rows per request
  const int* seq_lens;           // paged: [batch] KV length, clamped to the table capacity
  const int* page_table;         // paged: [table_rows, page_table_stride] logical -> physical page
  long long page_table_stride;
  const int* req_indices;        // paged, optional: [batch] row of page_table per request; null: row b
  int page_table_rows;           // rows outside [0, page_table_rows) make the request empty
  unsigned layout_bits;          // LayoutBit: int64 tables, seq_lens as offsets, mask rows
  int batch;
  int q_len;                     // contiguous: rows per request
  int kv_len;                    // contiguous: KV length of every request
  int n_heads;
  int n_kv_heads;
  int total_q;                   // paged: rows of q; indptr values outside [0, total_q] read as empty
  int num_pages;                 // paged: page ids outside [0, num_pages) read as zeros
  int max_pages_per_seq;
  // Contiguous: -1 non-causal, else the absolute position of the first query row. Paged: -1
  // non-causal, 0 causal (the last query row of a request sits at its last KV position).
  int causal_offset;
  float scale_log2;              // softmax scale * log2(e)
  AttentionFeatures features;    // read only by variants with feature bits (the window needs a
                                 // causal limit: row i sits at its causal position)
  PrefillTileOrder tile_order;   // the grid of tiles (prefill_tile_order): launched, or walked
                                 // by persistent CTAs
  // FP8 attention (kFeatureQkvE4m3): q's f32 dequantization scale, [1] or [n_heads] (stride 0 or
  // 1); K's and V's are the features' k_scale and v_scale. Last, so that no other member moves.
  const float* q_scale;
  int q_scale_stride;
};

// Tiling shared by the host launcher and the prefill kernel.
inline constexpr int kPrefillThreads = 128;    // 4 warps
inline constexpr int kPrefillStages = 2;
// Tensor-core path: each warp owns prefill_m_tiles(head_dim) MMA tiles of 16 query rows. Two up
// to head dim 128, so that every K and V fragment read from shared memory feeds two MMAs (the
// kernel is bound by shared-memory reads with one); wider heads keep one (O would not fit).
constexpr int prefill_m_tiles(int head_dim) { return head_dim <= 128 ? 2 : 1; }
constexpr int prefill_block_q(int head_dim) { return 64 * prefill_m_tiles(head_dim); }
// KV tokens per pipeline stage: 32 beside two 16-row O tiles of head dim 80..128 (registers),
// and for wide heads (two stages within 99 KB on sm_86/sm_89).
constexpr int prefill_block_kv(int head_dim) { return head_dim <= 64 ? 64 : 32; }
// The Q tile and double-buffered K and V tiles, each row padded by 16 bytes so that ldmatrix
// reads of 8 rows hit 8 different bank groups.
// An FP8 cache streams its bytes through the stages and widens each block into one K and one V
// tile of T.
constexpr int prefill_smem_bytes(int head_dim, bool fp8_kv = false) {
  return fp8_kv ? (prefill_block_q(head_dim) + 2 * prefill_block_kv(head_dim)) * (head_dim + 8) * 2 +
                      2 * kPrefillStages * prefill_block_kv(head_dim) * head_dim
                : (prefill_block_q(head_dim) + 2 * kPrefillStages * prefill_block_kv(head_dim)) *
                      (head_dim + 8) * 2;
}
// CUDA-core path (ASTRAI_NO_MMA): 64 query rows per CTA, walked in passes of 32 (8 per warp)
// against single-buffered K and V tiles of 32 tokens (one token per lane).
inline constexpr int kPrefillCoreBlockQ = 64;
inline constexpr int kPrefillCoreRowsPerWarp = 8;
inline constexpr int kPrefillCoreRows = 4 * kPrefillCoreRowsPerWarp;
inline constexpr int kPrefillCoreBlockKv = 32;
constexpr int prefill_core_smem_bytes(int head_dim) {
  return (kPrefillCoreRows + 2 * kPrefillCoreBlockKv) * (head_dim + 8) * 2;
}

// The order in which a causal prefill grid {tiles, heads, requests} takes its tiles: CTA `id`
// (the grid's linear index) gets its tile position (the tile's first row is position x its
// rows) and its row (head + heads x request). In the launch order (row after row, each from its
// last tile back) the last rows' heaviest tiles would start in the last wave and trail the
// grid. So positions are taken in kPrefillCausalBands bands from the diagonal down, each band
// row by row, so that the CTAs running together still share their K and V: heaviest first
// across the grid. Non-causal grids keep the launch order (prefill_tile in prefill.cuh): taking
// the rows' partial tiles last timed up to 2.4% slower.
inline constexpr int kPrefillCausalBands = 4;
// Index is the integer type of the grid's CTA ids: unsigned where the grid has under 2^32 CTAs
// (the kernels then divide in 32 bits: a 64-bit division is a call on the GPU), long long else.
template <typename Index>
struct PrefillTilePlace {
  int position;
  Index row;
};
template <typename Index>
constexpr PrefillTilePlace<Index> prefill_causal_tile_place(Index id, int tiles, Index rows) {
  const int band = (tiles + kPrefillCausalBands - 1) / kPrefillCausalBands;
  const int first = static_cast<int>(id / (static_cast<Index>(band) * rows)) * band;
  const int width = band < tiles - first ? band : tiles - first;
  const Index in_band = id - static_cast<Index>(first) * rows;
  const int rank = first + static_cast<int>(in_band % static_cast<Index>(width));
  return {tiles - 1 - rank, in_band / static_cast<Index>(width)};
}
constexpr PrefillTileOrder prefill_tile_order(unsigned tiles, unsigned heads, unsigned batch) {
  const unsigned band = (tiles + kPrefillCausalBands - 1) / kPrefillCausalBands;
  const unsigned bands = band == 0 ? 0 : (tiles + band - 1) / band;
  const unsigned rows = heads * batch;
  return {make_fast_divisor(tiles),
          rows,
          make_fast_divisor(band * rows),
          make_fast_divisor(band),
          make_fast_divisor(tiles - (bands == 0 ? 0 : bands - 1) * band),
          make_fast_divisor(heads)};
}
// prefill_causal_tile_place through the launch's divisors (ids below 2^31).
constexpr PrefillTilePlace<unsigned> prefill_causal_tile_place(unsigned id, const PrefillTileOrder& order) {
  const unsigned first = fast_divide(id, order.band_ctas) * order.band.divisor;
  const FastDivisor& width = order.band.divisor < order.tiles.divisor - first ? order.band : order.last_band;
  const unsigned in_band = id - first * order.rows;
  const unsigned row = fast_divide(in_band, width);
  const unsigned rank = first + (in_band - row * width.divisor);
  return {static_cast<int>(order.tiles.divisor - 1 - rank), row};
}

}  // namespace astrai
