// astrai-jit public API: attention kernels compiled at first use for the GPU in the process.
//
//   #include <astrai/runtime.hpp>
//   astrai::PagedDecodeArgs args;  ...fill pointers, shapes and strides...
//   astrai::Runtime::get().paged_decode(args);
//
// Every call is stream-ordered: it launches on `args.stream` (a CUstream / cudaStream_t; null
// is the legacy default stream) in the device's primary context and never synchronizes the
// host. All pointers are device pointers. Strides are in elements; a stride of 0 means
// "contiguous" (derived from the shape). Arguments are checked before anything is launched;
// a bad one throws astrai::InvalidArgument naming it, its value and what is allowed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "astrai/error.hpp"
#include "astrai/export.hpp"

namespace astrai {

enum class DType { bf16, fp16 };
ASTRAI_API const char* dtype_name(DType dtype);

// Element type of a KV cache: the call's dtype, or FP8 (one byte an element, e4m3 or e5m2)
// dequantized in the kernel as fp8_to_f32(x) * scale. q, out and the LSE keep their types.
enum class KvDType { same, e4m3, e5m2 };
ASTRAI_API const char* kv_dtype_name(KvDType kv_dtype);  // "same", "e4m3", "e5m2"

// A device index table (page table, request rows, lengths, offsets) of int32 or int64
// elements, read in place by the kernels: callers keep the width their tensors have. Converts
// from either pointer type, so `args.page_table = table` takes an int32 or an int64 table. An
// int64 row index, length or offset outside the int range reads as out of range (an empty
// request); page ids are read from the low 32 bits of an int64 entry (valid ids are below 2^31).
struct IndexTable {
  const void* data = nullptr;
  bool wide = false;  // int64 elements
  constexpr IndexTable() = default;
  constexpr IndexTable(std::nullptr_t) {}  // NOLINT: implicit, as a pointer's null is
  constexpr IndexTable(const std::int32_t* table) : data(table) {}  // NOLINT
  constexpr IndexTable(const std::int64_t* table) : data(table), wide(table != nullptr) {}  // NOLINT
  constexpr int element_bytes() const { return wide ? 8 : 4; }
  friend constexpr bool operator==(const IndexTable& t, std::nullptr_t) { return t.data == nullptr; }
  friend constexpr bool operator!=(const IndexTable& t, std::nullptr_t) { return t.data != nullptr; }
  friend constexpr bool operator==(const IndexTable& a, const IndexTable& b) {
    return a.data == b.data && a.wide == b.wide;
  }
  friend constexpr bool operator!=(const IndexTable& a, const IndexTable& b) { return !(a == b); }
};

// The serving options every attention call shares: each one set selects a variant compiled
// with that feature (a field of its name), and a call without any runs the plain variant. The
// *Args structs of the attention calls derive from this block, so `args.logit_cap = 30.f` reads
// the same on each; a call whose family does not serve an option refuses it by name.
struct AttentionOptions {
  // Logit soft-cap (Gemma 2): > 0 turns each scaled score s into logit_cap * tanh(s / logit_cap)
  // before the softmax (the LSE uses the capped scores); 0: none. Runs the ".cap" variant.
  float logit_cap = 0.f;
  // Optional attention sinks (gpt-oss): f32 [n_heads] device logits, one per query head, in the
  // units of the scaled scores (not soft-capped). Each joins its row's softmax denominator only:
  // out = sum_j e^(s_j - m) v_j / (e^(sink - m) + sum_j e^(s_j - m)); the LSE includes it, and a
  // row with nothing to attend to outputs zeros with LSE = sink. Runs the ".sink" variant.
  const float* sinks = nullptr;
  // Sliding window: >= 0 makes a query at position p attend to keys [p - window_left, p] only
  // (with a mask, by AND); -1: none. Needs query positions (decode: the last token; prefill: a
  // causal offset; paged prefill: causal). Runs the ".swa" variant, whose reads cover the
  // window, not the whole KV: its time follows the window.
  int window_left = -1;
  // FP8 KV cache (decode, paged_decode, paged_prefill): e4m3 or e5m2 makes the K and V caches one
  // byte an element (strides still in elements, now multiples of 16), read as
  // fp8_to_f32(x) * scale. k_scale and v_scale are f32 device pointers, required then (and
  // refused otherwise): one value, or with kv_scale_per_head one per KV head ([n_kv_heads]).
  // Runs the ".kv_e4m3" / ".kv_e5m2" variant. paged_decode's fused append quantizes new_k /
  // new_v with these scales (round to nearest even, saturating at the format's largest finite
  // value) and attends to the quantized token.
  KvDType kv_dtype = KvDType::same;
  const float* k_scale = nullptr;
  const float* v_scale = nullptr;
  bool kv_scale_per_head = false;
  // ALiBi (BLOOM, MPT): f32 [n_heads] device slopes, one per query head. The scaled (and
  // soft-capped) score of a query at position i against the key at position j gains
  // slope * (j - i) before the softmax; the LSE includes it. Needs query positions (as a window
  // does). Runs the ".alibi" variant.
  const float* alibi_slopes = nullptr;
  // FP8 attention (prefill and paged_prefill on sm_90a, head_dim 128): e4m3 makes q, k and v
  // one byte an element, read as fp8_to_f32(x) * scale: q_scale (one value, or with
  // q_scale_per_head one per query head), k_scale and v_scale as an FP8 cache's; out keeps dtype.
  // Both GEMMs run on FP8 operands, P quantized to e4m3. Runs the ".qkv_e4m3" variant.
  KvDType qkv_dtype = KvDType::same;
  const float* q_scale = nullptr;
  bool q_scale_per_head = false;
  // FP8 attention only: P stays in f16 for P V (V widened to f16) instead of rounding to e4m3,
  // at the cost of the second GEMM's FP8 rate. Runs the ".qkv_e4m3.p_fp16" variant.
  bool p_fp16 = false;
};

// Paged decode attention: one new query token per sequence against a paged KV cache.
struct PagedDecodeArgs : AttentionOptions {
  DType dtype = DType::bf16;
  int batch = 0;
  int n_heads = 0;       // query heads; a multiple of n_kv_heads
  int n_kv_heads = 0;
  int head_dim = 0;      // multiple of 16 in [32, 256]
  int page_size = 0;     // power of two in [1, 256]
  int num_pages = 0;     // pages in the pool; page ids outside [0, num_pages) read as zeros
  int max_pages_per_seq = 0;  // width of the page table
  float scale = 0.f;     // <= 0 means 1/sqrt(head_dim)
  // The serving options (AttentionOptions): logit_cap, sinks, window_left (the query at
  // position p = seq_len - 1), kv_dtype, k_scale, v_scale, kv_scale_per_head.
  // Multi-token decode (speculative verification): q_len new query tokens per request, 1..8,
  // the same for every request. q, out and the LSE gain a token dimension ([batch, q_len,
  // n_heads, ...]); seq_len counts the new tokens, and query token i sits at position
  // seq_len - q_len + i and attends to keys [0, seq_len - q_len + i] (causal among the new
  // tokens; the window, mask, sinks and soft-cap apply to each query row as to a single one).
  // Where seq_len < q_len the first tokens have nothing to attend to: zeros, LSE -inf (or the
  // sink). q_len > 1 runs the ".q<q_len>" variant and takes no fused append (new_k / new_v).
  int q_len = 1;

  const void* q = nullptr;  // [batch, n_heads, head_dim]; q_len > 1: [batch, q_len, n_heads, head_dim]
  std::int64_t q_stride_batch = 0, q_stride_seq = 0, q_stride_head = 0;  // q_stride_seq: q_len > 1 only
  const void* k_cache = nullptr;  // [num_pages, page_size, n_kv_heads, head_dim]
  std::int64_t k_stride_page = 0, k_stride_token = 0, k_stride_head = 0;
  const void* v_cache = nullptr;  // same shape as k_cache
  std::int64_t v_stride_page = 0, v_stride_token = 0, v_stride_head = 0;
  IndexTable page_table;               // [batch, max_pages_per_seq] logical -> physical
  std::int64_t page_table_stride = 0;  // elements between rows (0: max_pages_per_seq)
  // [batch], the current token included; read on the device, clamped to [0, table capacity].
  // Null: every request fills its table row (max_pages_per_seq * page_size tokens).
  IndexTable seq_lens;
  // seq_lens holds [batch + 1] offsets instead (a ragged kv_indptr): request b's length is
  // seq_lens[b + 1] - seq_lens[b].
  bool seq_lens_are_offsets = false;
  void* out = nullptr;  // like q
  std::int64_t out_stride_batch = 0, out_stride_seq = 0, out_stride_head = 0;

  // Optional: the row of page_table each request uses (AstrAI's req_pool_indices), [batch].
  // Null: request b uses row b. page_table_rows bounds the rows (0: batch); a row index outside
  // [0, page_table_rows) makes that request empty (zeros) instead of reading out of bounds.
  IndexTable req_indices;
  int page_table_rows = 0;
  // Optional mask, [batch, max_pages_per_seq * page_size] bool, true = keep (one row per request,
  // shared by its q_len query tokens); a row with nothing kept outputs zeros.
  const bool* mask = nullptr;
  std::int64_t mask_stride_batch = 0;  // 0: max_pages_per_seq * page_size
  // Optional fused append: the new token's K and V, [batch, n_kv_heads, head_dim]. They are
  // used for position seq_len - 1 and written into the cache at that slot in the same call.
  const void* new_k = nullptr;
  const void* new_v = nullptr;
  std::int64_t new_k_stride_batch = 0, new_k_stride_head = 0;
  std::int64_t new_v_stride_batch = 0, new_v_stride_head = 0;
  // Optional output: natural-log log-sum-exp of each query row's scaled scores, f32
  // [batch, n_heads] (q_len > 1: [batch, q_len, n_heads]); -inf for a row with nothing to attend to.
  float* lse = nullptr;

  void* stream = nullptr;  // CUstream
  // Optional caller-owned split-KV workspace (device memory, 16-byte aligned). When null, the
  // runtime uses its own per-stream workspace, allocated on the first call that needs it and
  // grown only by calls needing more (never during CUDA graph capture, so a stream captured
  // before it made a call of the shape needs this). One smaller than
  // paged_decode_workspace_bytes caps the split count to what fits (one split needs none).
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
};

// Decode attention over a contiguous KV cache: one query token per sequence.
struct DecodeArgs : AttentionOptions {
  DType dtype = DType::bf16;
  int batch = 0;
  int kv_len = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;  // multiple of 16 in [32, 256]
  float scale = 0.f;  // <= 0 means 1/sqrt(head_dim)
  // The serving options (AttentionOptions), as for paged_decode; the window's query sits at
  // causal_offset, or kv_len - 1 without one.
  // -1: attend to all kv_len; >= 0: the query sits at that absolute position and attends to
  // [0, min(kv_len, causal_offset + 1)).
  int causal_offset = -1;
  const void* q = nullptr;  // [batch, 1, n_heads, head_dim]
  std::int64_t q_stride_batch = 0, q_stride_head = 0;
  const void* k = nullptr;  // [batch, kv_len, n_kv_heads, head_dim]
  std::int64_t k_stride_batch = 0, k_stride_seq = 0, k_stride_head = 0;
  const void* v = nullptr;  // same shape as k
  std::int64_t v_stride_batch = 0, v_stride_seq = 0, v_stride_head = 0;
  void* out = nullptr;  // like q
  std::int64_t out_stride_batch = 0, out_stride_head = 0;
  const bool* mask = nullptr;  // optional [batch, kv_len] (or [batch, 1, kv_len]), true = keep
  std::int64_t mask_stride_batch = 0;  // 0: kv_len
  float* lse = nullptr;  // optional f32 [batch, n_heads], natural log; -inf for empty rows
  void* stream = nullptr;
  void* workspace = nullptr;  // optional split-KV workspace, as for paged_decode
  std::size_t workspace_bytes = 0;
};

// Prefill attention over a contiguous KV cache.
struct PrefillArgs : AttentionOptions {
  DType dtype = DType::bf16;
  int batch = 0;
  int q_len = 0;
  int kv_len = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;  // multiple of 16 in [32, 256]
  float scale = 0.f;
  // The serving options (AttentionOptions) but an FP8 cache: query row i sits at position
  // causal_offset + i, so a window needs causal_offset >= 0.
  // -1: non-causal. >= 0: absolute position of the first query token; query row i attends to
  // kv positions j <= causal_offset + i (a fresh prompt uses kv_len - q_len). Values below -1
  // are refused: they would leave the first rows with nothing to attend to.
  int causal_offset = -1;
  const void* q = nullptr;  // [batch, q_len, n_heads, head_dim]
  std::int64_t q_stride_batch = 0, q_stride_seq = 0, q_stride_head = 0;
  const void* k = nullptr;  // [batch, kv_len, n_kv_heads, head_dim]
  std::int64_t k_stride_batch = 0, k_stride_seq = 0, k_stride_head = 0;
  const void* v = nullptr;
  std::int64_t v_stride_batch = 0, v_stride_seq = 0, v_stride_head = 0;
  void* out = nullptr;  // like q
  std::int64_t out_stride_batch = 0, out_stride_seq = 0, out_stride_head = 0;
  // Optional mask [mask_batch, mask_q_len, kv_len] bool, true = keep. mask_batch is 1 or batch
  // (0: batch); mask_q_len is 1 (the [batch, kv_len] form, broadcast over queries) or q_len.
  const bool* mask = nullptr;
  int mask_batch = 0;
  int mask_q_len = 1;
  std::int64_t mask_stride_batch = 0, mask_stride_q = 0;  // 0: contiguous
  float* lse = nullptr;  // optional f32 [batch, q_len, n_heads]
  void* stream = nullptr;
};

// Prefill over a paged KV cache with a ragged batch of queries (chunked prefill).
struct PagedPrefillArgs : AttentionOptions {
  DType dtype = DType::bf16;
  int batch = 0;
  int total_q = 0;    // rows of q; must equal qo_indptr[batch]
  int max_q_len = 0;  // the longest request's query count (sizes the grid)
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int page_size = 0;
  int num_pages = 0;
  int max_pages_per_seq = 0;
  float scale = 0.f;
  // The serving options (AttentionOptions): a window needs causal (each query's position).
  // Causal per request: query i of request b sits at position seq_lens[b] - q_len_b + i and
  // attends to kv positions j <= that. false: every query attends to all seq_lens[b] tokens.
  bool causal = true;
  const void* q = nullptr;  // [total_q, n_heads, head_dim]
  std::int64_t q_stride_token = 0, q_stride_head = 0;
  IndexTable qo_indptr;  // [batch + 1], device
  const void* k_cache = nullptr;  // [num_pages, page_size, n_kv_heads, head_dim]
  std::int64_t k_stride_page = 0, k_stride_token = 0, k_stride_head = 0;
  const void* v_cache = nullptr;
  std::int64_t v_stride_page = 0, v_stride_token = 0, v_stride_head = 0;
  IndexTable page_table;  // [rows, max_pages_per_seq]
  std::int64_t page_table_stride = 0;
  // Optional: the row of page_table each request uses ([batch], AstrAI's req_pool_indices), as
  // for paged_decode. Null: request b uses row b.
  IndexTable req_indices;
  int page_table_rows = 0;  // 0: batch
  IndexTable seq_lens;      // [batch], KV length including the new tokens
  bool seq_lens_are_offsets = false;  // seq_lens holds [batch + 1] offsets (a kv_indptr)
  void* out = nullptr;  // like q
  std::int64_t out_stride_token = 0, out_stride_head = 0;
  // Optional [total_q, mask_stride_q] over kv positions. With mask_rows_per_request, row i of
  // request b is at mask + b * mask_stride_batch + i * mask_stride_q instead ([batch, q_len, kv]).
  const bool* mask = nullptr;
  std::int64_t mask_stride_q = 0;  // 0: max_pages_per_seq * page_size
  bool mask_rows_per_request = false;
  std::int64_t mask_stride_batch = 0;  // with mask_rows_per_request
  float* lse = nullptr;  // optional f32 [total_q, n_heads]
  void* stream = nullptr;
};

// Rotary embedding over interleaved pairs, x of shape [batch, seq, n_heads, head_dim]
// (use batch = 1 for the [tokens, n_heads, head_dim] form). freqs holds (cos, sin) in f32 as
// [batch, seq, head_dim / 2, 2]; freqs_stride_batch = 0 shares one table across the batch.
// out may equal x (in place).
struct RotaryArgs {
  DType dtype = DType::bf16;
  int batch = 1;
  int seq_len = 0;
  int n_heads = 0;
  int head_dim = 0;  // multiple of 8 in [8, 512]
  const void* x = nullptr;
  std::int64_t x_stride_batch = 0, x_stride_seq = 0, x_stride_head = 0;
  void* out = nullptr;
  std::int64_t out_stride_batch = 0, out_stride_seq = 0, out_stride_head = 0;
  const float* freqs = nullptr;
  std::int64_t freqs_stride_batch = -1;  // -1: contiguous ([batch, seq, D/2, 2]); 0: shared
  std::int64_t freqs_stride_seq = 0;     // 0: head_dim
  void* stream = nullptr;
};

// merge_states: attention states of disjoint key sets merged into the attention over all of
// them (the shared-prefix and per-request passes of cascade attention, or a caller's own
// partial passes). A state is a normalized row with its LSE (natural log, as the attention
// calls write it); merged, o = sum_i w_i o_i / sum_i w_i with w_i = exp(lse_i - max lse) and
// lse = max + log(sum w). A state with LSE -inf (it saw no key) weighs nothing, whatever its
// values; a row whose states are all empty is zeros with LSE -inf.
//
// One source: values [rows, states, n_heads, head_dim] in the call's dtype, LSEs [rows, states,
// n_heads] in f32. A stride of 0 takes the contiguous value.
struct MergeStatesSource {
  const void* v = nullptr;
  const float* lse = nullptr;
  int states = 1;  // b may have 0: a's states merged alone
  std::int64_t v_stride_row = 0, v_stride_state = 0, v_stride_head = 0;
  std::int64_t lse_stride_row = 0, lse_stride_state = 0, lse_stride_head = 0;
};

// Merges every state of a and of b into out [rows, n_heads, head_dim] (and its LSE [rows,
// n_heads] when lse is given). out may be a's or b's values when that source has one state, and
// lse its LSEs (in place, with the same strides); out and lse overlap no input otherwise.
struct MergeStatesArgs {
  DType dtype = DType::bf16;
  int rows = 0;
  int n_heads = 0;
  int head_dim = 0;  // multiple of 8 in [8, 1024]
  MergeStatesSource a;
  MergeStatesSource b;
  void* out = nullptr;
  std::int64_t out_stride_row = 0, out_stride_head = 0;
  float* lse = nullptr;  // optional
  std::int64_t lse_stride_row = 0, lse_stride_head = 0;
  void* stream = nullptr;
};

// Cascade attention: requests that share KV prefixes (a system prompt, few-shot examples, a
// search tree) read each shared part once. The KV is cut into levels; level l holds `groups`
// page-table rows, and the query rows [qo_indptr[g], qo_indptr[g + 1]) of q attend to row g's
// seq_lens[g] tokens. Typically level 0 has one group (every request's queries over the shared
// prefix: one pass reads it for all of them, on tensor cores) and the last level one group a
// request (its own suffix, which ends with its new tokens: causal). Each level runs as a
// paged_prefill into its own output and LSE, and the levels merge by LSE (merge_states), so the
// result is the attention of each query over the union of its levels' keys.
struct CascadeLevel {
  int groups = 0;
  int max_q_len = 0;      // the largest group's query rows (sizes the grid)
  IndexTable qo_indptr;   // [groups + 1] offsets into q's rows, device
  IndexTable page_table;  // [groups, max_pages_per_seq], device
  int max_pages_per_seq = 0;
  std::int64_t page_table_stride = 0;  // 0: max_pages_per_seq
  IndexTable seq_lens;    // [groups] tokens, device
  // true: query i of a group of q_len rows sits at position seq_lens[g] - q_len + i of this
  // level's keys and attends to those up to it (the level holding the new tokens); false: every
  // query attends to all of the group's keys (a prefix that precedes every query).
  bool causal = false;
};

inline constexpr int kMaxCascadeLevels = 4;

// The serving options: the soft-cap and an FP8 cache apply to every level; sinks join the
// softmax once (level 0's pass carries them). A window and ALiBi need each key's distance to
// its query across levels and are refused.
struct CascadeArgs : AttentionOptions {
  DType dtype = DType::bf16;
  int total_q = 0;  // rows of q
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int page_size = 0;
  int num_pages = 0;
  float scale = 0.f;  // <= 0 means 1/sqrt(head_dim)
  const void* q = nullptr;  // [total_q, n_heads, head_dim]
  std::int64_t q_stride_token = 0, q_stride_head = 0;
  const void* k_cache = nullptr;  // [num_pages, page_size, n_kv_heads, head_dim], one pool for every level
  std::int64_t k_stride_page = 0, k_stride_token = 0, k_stride_head = 0;
  const void* v_cache = nullptr;
  std::int64_t v_stride_page = 0, v_stride_token = 0, v_stride_head = 0;
  int num_levels = 0;  // 1..kMaxCascadeLevels
  CascadeLevel levels[kMaxCascadeLevels];
  void* out = nullptr;  // like q
  std::int64_t out_stride_token = 0, out_stride_head = 0;
  float* lse = nullptr;  // optional f32 [total_q, n_heads]
  // Scratch for the levels' partial results (cascade_workspace_bytes); null: the runtime's own
  // per-stream workspace (which grows outside CUDA graph capture only).
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
  void* stream = nullptr;
};

// MLA decode in the absorbed form (DeepSeek-V2/V3/R1, Kimi K2): every query head attends to one
// shared latent KV head. A query row is 576 wide (the 512-dim latent part, then the 64 rotary
// dims); a cache row is [latent 512 | rope 64] and V is its first 512 dims, so keys and values
// are one paged cache. out[b, t, h] = softmax(scale * q[b, t, h] . K^T) V over the request's
// keys, 512 wide. Multi-token decode (MTP, speculative verification) as in paged_decode: query
// token i of q_len sits at position seq_len - q_len + i and sees the keys up to it.
struct MlaDecodeArgs {
  DType dtype = DType::bf16;
  int batch = 0;
  int q_len = 1;          // 1..8 query tokens per request
  int n_heads = 0;        // query heads, 1..128 (the model's heads on this GPU)
  int page_size = 0;      // power of two in [1, 64]
  int num_pages = 0;      // pages in the pool; page ids outside [0, num_pages) read as zeros
  int max_pages_per_seq = 0;  // width of the page table
  // The model's softmax scale, required: the absorbed form's head is 576 wide but the model's
  // scale is not 1/sqrt(576) (DeepSeek-V3: 1/sqrt(192), times its YaRN factor squared).
  float scale = 0.f;

  const void* q = nullptr;  // [batch, q_len, n_heads, 576]
  std::int64_t q_stride_batch = 0, q_stride_seq = 0, q_stride_head = 0;
  const void* kv_cache = nullptr;  // [num_pages, page_size, 576], each row contiguous
  std::int64_t kv_stride_page = 0, kv_stride_token = 0;
  IndexTable page_table;               // [batch, max_pages_per_seq] logical -> physical
  std::int64_t page_table_stride = 0;  // elements between rows (0: max_pages_per_seq)
  // [batch], the new tokens included; read on the device, clamped to [0, table capacity].
  IndexTable seq_lens;
  bool seq_lens_are_offsets = false;  // seq_lens holds [batch + 1] offsets (a kv_indptr)
  void* out = nullptr;  // [batch, q_len, n_heads, 512]
  std::int64_t out_stride_batch = 0, out_stride_seq = 0, out_stride_head = 0;
  // Optional: natural-log LSE of each query row's scaled scores, f32 [batch, q_len, n_heads]
  // contiguous; -inf for a row with nothing to attend to (its output is zeros).
  float* lse = nullptr;
  // An FP8 cache (one byte an element; strides multiples of 16): value = fp8 * (*kv_scale), one
  // f32 scale for the latent head; q and out keep dtype.
  KvDType kv_dtype = KvDType::same;
  const float* kv_scale = nullptr;

  void* stream = nullptr;  // CUstream
  // Optional caller-owned split-KV workspace, as paged_decode's (mla_decode_workspace_bytes).
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
};

// Bytes of split-KV workspace that is always enough for an mla_decode call of this shape on a
// device with `num_sms` multiprocessors (0 if it never splits).
ASTRAI_API std::size_t mla_decode_workspace_bytes(const MlaDecodeArgs& args, int num_sms);

// Bytes of workspace a cascade call needs on a device with `num_sms` multiprocessors (0 with one
// level); a long shared level 0 is spread over the SMs, with scratch of its own.
ASTRAI_API std::size_t cascade_workspace_bytes(const CascadeArgs& args, int num_sms);

// Bytes of split-KV workspace that is always enough for a paged_decode (or, with the same
// shape, decode) call on a device with `num_sms` multiprocessors, whatever the kernel's
// occupancy turns out to be (0 if it never splits). Lets callers provide their own workspace.
ASTRAI_API std::size_t paged_decode_workspace_bytes(const PagedDecodeArgs& args, int num_sms);

// The argument checks of the matching Runtime call, on their own: throws InvalidArgument as
// that call would, touches no GPU and does not start the runtime (pointers are checked for
// null and alignment only). For bindings that report every argument error before asking
// which device a pointer is on.
ASTRAI_API void validate_args(const PagedDecodeArgs& args);
ASTRAI_API void validate_args(const DecodeArgs& args);
ASTRAI_API void validate_args(const PrefillArgs& args);
ASTRAI_API void validate_args(const PagedPrefillArgs& args);
ASTRAI_API void validate_args(const RotaryArgs& args);
ASTRAI_API void validate_args(const MergeStatesArgs& args);
ASTRAI_API void validate_args(const CascadeArgs& args);
ASTRAI_API void validate_args(const MlaDecodeArgs& args);

class ASTRAI_API Runtime {
 public:
  // The process-wide runtime. Reads the ASTRAI_JIT_* environment once, on first use.
  static Runtime& get();

  void decode(const DecodeArgs& args);
  void prefill(const PrefillArgs& args);
  void paged_decode(const PagedDecodeArgs& args);
  void paged_prefill(const PagedPrefillArgs& args);
  void rotary_emb(const RotaryArgs& args);
  void merge_states(const MergeStatesArgs& args);
  void cascade(const CascadeArgs& args);
  void mla_decode(const MlaDecodeArgs& args);

  // The readable variant names this process has loaded so far (for logs and tests).
  std::vector<std::string> loaded_variants() const;

  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  struct Impl;

 private:
  Runtime();
  std::unique_ptr<Impl> impl_;
};

}  // namespace astrai
