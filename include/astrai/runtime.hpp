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

namespace astrai {

enum class DType { bf16, fp16 };
const char* dtype_name(DType dtype);

// Paged decode attention: one new query token per sequence against a paged KV cache.
struct PagedDecodeArgs {
  DType dtype = DType::bf16;
  int batch = 0;
  int n_heads = 0;       // query heads; a multiple of n_kv_heads
  int n_kv_heads = 0;
  int head_dim = 0;      // multiple of 16 in [32, 256]
  int page_size = 0;     // power of two in [1, 256]
  int num_pages = 0;     // pages in the pool; page ids outside [0, num_pages) read as zeros
  int max_pages_per_seq = 0;  // width of the page table
  float scale = 0.f;     // <= 0 means 1/sqrt(head_dim)

  const void* q = nullptr;  // [batch, n_heads, head_dim]
  std::int64_t q_stride_batch = 0, q_stride_head = 0;
  const void* k_cache = nullptr;  // [num_pages, page_size, n_kv_heads, head_dim]
  std::int64_t k_stride_page = 0, k_stride_token = 0, k_stride_head = 0;
  const void* v_cache = nullptr;  // same shape as k_cache
  std::int64_t v_stride_page = 0, v_stride_token = 0, v_stride_head = 0;
  const std::int32_t* page_table = nullptr;  // [batch, max_pages_per_seq] logical -> physical
  std::int64_t page_table_stride = 0;        // elements between rows (0: max_pages_per_seq)
  const std::int32_t* seq_lens = nullptr;    // [batch], the current token included; read on
                                             // the device, clamped to [0, table capacity]
  void* out = nullptr;  // [batch, n_heads, head_dim]
  std::int64_t out_stride_batch = 0, out_stride_head = 0;

  void* stream = nullptr;  // CUstream
  // Optional caller-owned split-KV workspace (device memory, 16-byte aligned). When null, the
  // runtime uses its own per-stream workspace, allocated on the first call that needs it and
  // grown only by calls needing more (never during CUDA graph capture).
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
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

// Bytes of split-KV workspace a paged_decode call of this shape needs on a device with
// `num_sms` multiprocessors (0 if it runs unsplit). Lets callers provide their own.
std::size_t paged_decode_workspace_bytes(const PagedDecodeArgs& args, int num_sms);

class Runtime {
 public:
  // The process-wide runtime. Reads the ASTRAI_JIT_* environment once, on first use.
  static Runtime& get();

  void paged_decode(const PagedDecodeArgs& args);
  void rotary_emb(const RotaryArgs& args);

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
