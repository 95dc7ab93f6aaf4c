// Parameter structs shared by the host runtime and the device kernels. Plain C++ with no
// includes, so NVRTC compiles it without any header search path. Strides are in elements.
#pragma once

namespace astrai {

// Split-KV partial results live in a float workspace:
//   partial_out [num_splits, batch, n_heads, head_dim]   unnormalized-then-rescaled outputs
//   partial_lse [num_splits, batch, n_heads]              log-sum-exp (natural log) per row
struct SplitWorkspace {
  float* partial_out;
  float* partial_lse;
  int num_splits;
};

struct PagedDecodeParams {
  const void* q;                 // [batch, n_heads, head_dim]
  long long q_stride_batch;
  long long q_stride_head;
  const void* k_cache;           // [num_pages, page_size, n_kv_heads, head_dim]
  const void* v_cache;           // same shape as k_cache
  long long k_stride_page;
  long long k_stride_token;
  long long k_stride_head;
  long long v_stride_page;
  long long v_stride_token;
  long long v_stride_head;
  const int* page_table;         // [table_rows, max_pages_per_seq] logical -> physical page
  long long page_table_stride;   // elements between rows
  const int* seq_lens;           // [batch], the current token included
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
};

// Tiling shared by the host launcher and the paged decode kernel.
constexpr int kDecodeThreads = 128;     // 4 warps
constexpr int kDecodeBlockTokens = 64;  // tokens per pipeline stage (16 per warp)
constexpr int kDecodeHeadsPerTile = 16; // query heads of one KV head per CTA (the MMA M tile)
constexpr int kDecodeStages = 2;
constexpr int kMaxSplits = 256;
// Dynamic shared memory of the paged decode kernel: a Q tile plus K and V stages, each row
// padded by 16 bytes so ldmatrix reads of 8 rows hit 8 different bank groups.
constexpr int paged_decode_smem_bytes(int head_dim) {
  return (kDecodeHeadsPerTile + 2 * kDecodeStages * kDecodeBlockTokens) * (head_dim + 8) * 2;
}

struct CombineParams {
  SplitWorkspace workspace;
  void* out;                     // [batch, n_heads, head_dim]
  long long out_stride_batch;
  long long out_stride_head;
  int batch;
  int n_heads;
};

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

}  // namespace astrai
