#include "runtime/validation.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <fmt/format.h>

#include "kernel_src/kernel_params.h"

namespace astrai::detail {

namespace {

// Largest page-table capacity whose split plan stays in 32-bit token arithmetic: a plan rounds
// the capacity up to whole blocks and may add up to kMaxSplits - 1 blocks of slack, and the
// kernel computes split_begin + tokens_per_split in int.
constexpr long long kMaxTableTokens =
    (std::numeric_limits<int>::max() / kDecodeBlockTokens - (kMaxSplits - 1)) * 1LL * kDecodeBlockTokens;

bool is_power_of_two(long long value) { return value > 0 && (value & (value - 1)) == 0; }

[[noreturn]] void fail(const char* call, const std::string& message) {
  throw InvalidArgument(fmt::format("{}: {}", call, message));
}

void require_dtype(const char* call, DType dtype) {
  if (dtype != DType::bf16 && dtype != DType::fp16)
    fail(call, fmt::format("dtype {} is not valid (allowed: bf16, fp16)", static_cast<int>(dtype)));
}

void require_pointer(const char* call, const char* name, const void* pointer, std::size_t alignment) {
  if (pointer == nullptr) fail(call, fmt::format("{} is null (a device pointer is required)", name));
  if (reinterpret_cast<std::uintptr_t>(pointer) % alignment != 0)
    fail(call, fmt::format("{} = {} is not {}-byte aligned", name, pointer, alignment));
}

// Rows are read as 16-byte vectors, so every stride must keep rows 16-byte aligned.
void require_stride(const char* call, const char* name, std::int64_t stride, std::int64_t minimum,
                    bool check_minimum) {
  if (stride <= 0) fail(call, fmt::format("{} {} is not valid (allowed: > 0, or 0 for contiguous)", name, stride));
  if (stride % 8 != 0)
    fail(call, fmt::format("{} {} is not a multiple of 8 elements (rows must stay 16-byte aligned)",
                           name, stride));
  if (check_minimum && stride < minimum)
    fail(call, fmt::format("{} {} makes rows overlap (allowed: >= {})", name, stride, minimum));
}

void require_positive(const char* call, const char* name, long long value) {
  if (value < 1) fail(call, fmt::format("{} {} is not valid (allowed: >= 1)", name, value));
}

// Largest grid y / z extent: every launch puts heads and batch there.
constexpr int kMaxGridYZ = 65535;

void require_attention_heads(const char* call, int n_heads, int n_kv_heads, int head_dim) {
  require_positive(call, "n_heads", n_heads);
  require_positive(call, "n_kv_heads", n_kv_heads);
  if (n_heads > kMaxGridYZ)
    fail(call, fmt::format("n_heads {} exceeds the launch grid limit (allowed: 1..{})", n_heads,
                           kMaxGridYZ));
  if (n_heads % n_kv_heads != 0)
    fail(call, fmt::format("n_heads {} is not a multiple of n_kv_heads {} (GQA needs n_heads % "
                           "n_kv_heads == 0)", n_heads, n_kv_heads));
  if (n_heads / n_kv_heads > 128)
    fail(call, fmt::format("GQA group size {} (n_heads {} / n_kv_heads {}) is not supported "
                           "(allowed: 1..128)", n_heads / n_kv_heads, n_heads, n_kv_heads));
  if (head_dim % 16 != 0)
    fail(call, fmt::format("head_dim {} is not a multiple of 16 (allowed: 32..256, step 16)", head_dim));
  if (head_dim < 32 || head_dim > 256)
    fail(call, fmt::format("head_dim {} is out of range (allowed: 32..256, step 16)", head_dim));
}

void require_batch(const char* call, int batch) {
  if (batch < 0) fail(call, fmt::format("batch {} is not valid (allowed: >= 0)", batch));
  if (batch > kMaxGridYZ)
    fail(call, fmt::format("batch {} exceeds the launch grid limit (allowed: 0..{})", batch, kMaxGridYZ));
}

void require_non_negative(const char* call, const char* name, long long value) {
  if (value < 0) fail(call, fmt::format("{} {} is not valid (allowed: >= 0)", name, value));
}

}  // namespace

PagedDecodeArgs resolve_paged_decode_args(const PagedDecodeArgs& input) {
  constexpr const char* kCall = "paged_decode";
  PagedDecodeArgs a = input;
  require_dtype(kCall, a.dtype);
  require_batch(kCall, a.batch);
  require_attention_heads(kCall, a.n_heads, a.n_kv_heads, a.head_dim);
  if (!is_power_of_two(a.page_size) || a.page_size > 256)
    fail(kCall, fmt::format("page_size {} is not supported (allowed: a power of two in 1..256)", a.page_size));
  require_positive(kCall, "num_pages", a.num_pages);
  require_positive(kCall, "max_pages_per_seq", a.max_pages_per_seq);
  if (1LL * a.max_pages_per_seq * a.page_size > kMaxTableTokens)
    fail(kCall, fmt::format("max_pages_per_seq {} x page_size {} = {} tokens exceeds the limit of {} "
                            "tokens", a.max_pages_per_seq, a.page_size,
                            1LL * a.max_pages_per_seq * a.page_size, kMaxTableTokens));
  if (!std::isfinite(a.scale))
    fail(kCall, fmt::format("scale {} is not finite (allowed: > 0, or <= 0 for 1/sqrt(head_dim))", a.scale));
  if (a.scale <= 0.f) a.scale = 1.f / std::sqrt(static_cast<float>(a.head_dim));

  const std::int64_t d = a.head_dim;
  if (a.q_stride_head == 0) a.q_stride_head = d;
  if (a.q_stride_batch == 0) a.q_stride_batch = a.n_heads * a.q_stride_head;
  if (a.out_stride_head == 0) a.out_stride_head = d;
  if (a.out_stride_batch == 0) a.out_stride_batch = a.n_heads * a.out_stride_head;
  if (a.k_stride_head == 0) a.k_stride_head = d;
  if (a.k_stride_token == 0) a.k_stride_token = a.n_kv_heads * a.k_stride_head;
  if (a.k_stride_page == 0) a.k_stride_page = a.page_size * a.k_stride_token;
  if (a.v_stride_head == 0) a.v_stride_head = d;
  if (a.v_stride_token == 0) a.v_stride_token = a.n_kv_heads * a.v_stride_head;
  if (a.v_stride_page == 0) a.v_stride_page = a.page_size * a.v_stride_token;
  if (a.page_table_stride == 0) a.page_table_stride = a.max_pages_per_seq;

  require_stride(kCall, "q_stride_head", a.q_stride_head, d, a.n_heads > 1);
  require_stride(kCall, "q_stride_batch", a.q_stride_batch, 1, false);
  require_stride(kCall, "k_stride_head", a.k_stride_head, d, a.n_kv_heads > 1);
  require_stride(kCall, "k_stride_token", a.k_stride_token, 1, false);
  require_stride(kCall, "k_stride_page", a.k_stride_page, 1, false);
  require_stride(kCall, "v_stride_head", a.v_stride_head, d, a.n_kv_heads > 1);
  require_stride(kCall, "v_stride_token", a.v_stride_token, 1, false);
  require_stride(kCall, "v_stride_page", a.v_stride_page, 1, false);
  // Outputs must not overlap, or blocks would race on them.
  require_stride(kCall, "out_stride_head", a.out_stride_head, d, a.n_heads > 1);
  require_stride(kCall, "out_stride_batch", a.out_stride_batch,
                 (a.n_heads - 1) * a.out_stride_head + d, a.batch > 1);
  if (a.page_table_stride < a.max_pages_per_seq)
    fail(kCall, fmt::format("page_table_stride {} is smaller than max_pages_per_seq {}",
                            a.page_table_stride, a.max_pages_per_seq));

  if (a.batch > 0) {
    require_pointer(kCall, "q", a.q, 16);
    require_pointer(kCall, "k_cache", a.k_cache, 16);
    require_pointer(kCall, "v_cache", a.v_cache, 16);
    require_pointer(kCall, "out", a.out, 16);
    require_pointer(kCall, "page_table", a.page_table, 4);
    require_pointer(kCall, "seq_lens", a.seq_lens, 4);
  }
  // The documented contract (astrai/runtime.hpp) is 16-byte alignment; the kernels read and
  // write the workspace as floats.
  if (a.page_table_rows == 0) a.page_table_rows = a.batch;
  if (a.page_table_rows < 0)
    fail(kCall, fmt::format("page_table_rows {} is not valid (allowed: >= 0; 0 means batch)", a.page_table_rows));
  if (a.req_indices == nullptr && a.page_table_rows < a.batch)
    fail(kCall, fmt::format("page_table_rows {} is smaller than batch {} without req_indices",
                            a.page_table_rows, a.batch));
  if (a.req_indices != nullptr && reinterpret_cast<std::uintptr_t>(a.req_indices) % 4 != 0)
    fail(kCall, fmt::format("req_indices = {} is not 4-byte aligned", static_cast<const void*>(a.req_indices)));
  const std::int64_t capacity = static_cast<std::int64_t>(a.max_pages_per_seq) * a.page_size;
  if (a.mask_stride_batch == 0) a.mask_stride_batch = capacity;
  if (a.mask != nullptr && a.batch > 1 && a.mask_stride_batch < capacity)
    fail(kCall, fmt::format("mask_stride_batch {} is smaller than the mask row length {} "
                            "(max_pages_per_seq x page_size)", a.mask_stride_batch, capacity));
  if (a.mask_stride_batch < 0)
    fail(kCall, fmt::format("mask_stride_batch {} is not valid (allowed: >= 0)", a.mask_stride_batch));
  if ((a.new_k == nullptr) != (a.new_v == nullptr))
    fail(kCall, fmt::format("new_k = {} and new_v = {}: the fused append needs both or neither",
                            a.new_k, a.new_v));
  if (a.new_k != nullptr) {
    if (a.new_k_stride_head == 0) a.new_k_stride_head = d;
    if (a.new_k_stride_batch == 0) a.new_k_stride_batch = a.n_kv_heads * a.new_k_stride_head;
    if (a.new_v_stride_head == 0) a.new_v_stride_head = d;
    if (a.new_v_stride_batch == 0) a.new_v_stride_batch = a.n_kv_heads * a.new_v_stride_head;
    require_stride(kCall, "new_k_stride_head", a.new_k_stride_head, d, a.n_kv_heads > 1);
    require_stride(kCall, "new_k_stride_batch", a.new_k_stride_batch, 1, false);
    require_stride(kCall, "new_v_stride_head", a.new_v_stride_head, d, a.n_kv_heads > 1);
    require_stride(kCall, "new_v_stride_batch", a.new_v_stride_batch, 1, false);
    require_pointer(kCall, "new_k", a.new_k, 16);
    require_pointer(kCall, "new_v", a.new_v, 16);
  }
  if (a.lse != nullptr && reinterpret_cast<std::uintptr_t>(a.lse) % 4 != 0)
    fail(kCall, fmt::format("lse = {} is not 4-byte aligned", static_cast<void*>(a.lse)));
  if (a.workspace != nullptr && reinterpret_cast<std::uintptr_t>(a.workspace) % 16 != 0)
    fail(kCall, fmt::format("workspace = {} is not 16-byte aligned", a.workspace));
  return a;
}

DecodeArgs resolve_decode_args(const DecodeArgs& input) {
  constexpr const char* kCall = "decode";
  DecodeArgs a = input;
  require_dtype(kCall, a.dtype);
  require_batch(kCall, a.batch);
  require_non_negative(kCall, "kv_len", a.kv_len);
  require_attention_heads(kCall, a.n_heads, a.n_kv_heads, a.head_dim);
  if (a.causal_offset < -1)
    fail(kCall, fmt::format("causal_offset {} is not valid (allowed: -1 for no limit, or >= 0)", a.causal_offset));
  if (!std::isfinite(a.scale))
    fail(kCall, fmt::format("scale {} is not finite (allowed: > 0, or <= 0 for 1/sqrt(head_dim))", a.scale));
  if (a.scale <= 0.f) a.scale = 1.f / std::sqrt(static_cast<float>(a.head_dim));
  const std::int64_t d = a.head_dim;
  if (a.q_stride_head == 0) a.q_stride_head = d;
  if (a.q_stride_batch == 0) a.q_stride_batch = a.n_heads * a.q_stride_head;
  if (a.out_stride_head == 0) a.out_stride_head = d;
  if (a.out_stride_batch == 0) a.out_stride_batch = a.n_heads * a.out_stride_head;
  if (a.k_stride_head == 0) a.k_stride_head = d;
  if (a.k_stride_seq == 0) a.k_stride_seq = a.n_kv_heads * a.k_stride_head;
  if (a.k_stride_batch == 0) a.k_stride_batch = std::max<std::int64_t>(1, a.kv_len) * a.k_stride_seq;
  if (a.v_stride_head == 0) a.v_stride_head = d;
  if (a.v_stride_seq == 0) a.v_stride_seq = a.n_kv_heads * a.v_stride_head;
  if (a.v_stride_batch == 0) a.v_stride_batch = std::max<std::int64_t>(1, a.kv_len) * a.v_stride_seq;
  if (a.mask_stride_batch == 0) a.mask_stride_batch = a.kv_len;
  require_stride(kCall, "q_stride_head", a.q_stride_head, d, a.n_heads > 1);
  require_stride(kCall, "q_stride_batch", a.q_stride_batch, 1, false);
  require_stride(kCall, "k_stride_head", a.k_stride_head, d, a.n_kv_heads > 1);
  require_stride(kCall, "k_stride_seq", a.k_stride_seq, 1, false);
  require_stride(kCall, "k_stride_batch", a.k_stride_batch, 1, false);
  require_stride(kCall, "v_stride_head", a.v_stride_head, d, a.n_kv_heads > 1);
  require_stride(kCall, "v_stride_seq", a.v_stride_seq, 1, false);
  require_stride(kCall, "v_stride_batch", a.v_stride_batch, 1, false);
  require_stride(kCall, "out_stride_head", a.out_stride_head, d, a.n_heads > 1);
  require_stride(kCall, "out_stride_batch", a.out_stride_batch, (a.n_heads - 1) * a.out_stride_head + d,
                 a.batch > 1);
  if (a.mask != nullptr && a.batch > 1 && a.mask_stride_batch < a.kv_len)
    fail(kCall, fmt::format("mask_stride_batch {} is smaller than kv_len {}", a.mask_stride_batch, a.kv_len));
  if (a.mask_stride_batch < 0)
    fail(kCall, fmt::format("mask_stride_batch {} is not valid (allowed: >= 0)", a.mask_stride_batch));
  if (a.batch > 0) {
    require_pointer(kCall, "q", a.q, 16);
    require_pointer(kCall, "out", a.out, 16);
    if (a.kv_len > 0) {
      require_pointer(kCall, "k", a.k, 16);
      require_pointer(kCall, "v", a.v, 16);
    }
  }
  if (a.lse != nullptr && reinterpret_cast<std::uintptr_t>(a.lse) % 4 != 0)
    fail(kCall, fmt::format("lse = {} is not 4-byte aligned", static_cast<void*>(a.lse)));
  if (a.workspace != nullptr && reinterpret_cast<std::uintptr_t>(a.workspace) % 16 != 0)
    fail(kCall, fmt::format("workspace = {} is not 16-byte aligned", a.workspace));
  return a;
}

RotaryArgs resolve_rotary_args(const RotaryArgs& input) {
  constexpr const char* kCall = "rotary_emb";
  RotaryArgs a = input;
  require_dtype(kCall, a.dtype);
  if (a.batch < 0) fail(kCall, fmt::format("batch {} is not valid (allowed: >= 0)", a.batch));
  if (a.seq_len < 0) fail(kCall, fmt::format("seq_len {} is not valid (allowed: >= 0)", a.seq_len));
  require_positive(kCall, "n_heads", a.n_heads);
  if (a.head_dim % 8 != 0 || a.head_dim < 8 || a.head_dim > 512)
    fail(kCall, fmt::format("head_dim {} is not supported (allowed: 8..512, step 8)", a.head_dim));
  const std::int64_t d = a.head_dim;
  if (a.x_stride_head == 0) a.x_stride_head = d;
  if (a.x_stride_seq == 0) a.x_stride_seq = a.n_heads * a.x_stride_head;
  if (a.x_stride_batch == 0) a.x_stride_batch = static_cast<std::int64_t>(a.seq_len) * a.x_stride_seq;
  if (a.out_stride_head == 0) a.out_stride_head = d;
  if (a.out_stride_seq == 0) a.out_stride_seq = a.n_heads * a.out_stride_head;
  if (a.out_stride_batch == 0) a.out_stride_batch = static_cast<std::int64_t>(a.seq_len) * a.out_stride_seq;
  if (a.freqs_stride_seq == 0) a.freqs_stride_seq = d;
  if (a.freqs_stride_batch == -1) a.freqs_stride_batch = static_cast<std::int64_t>(a.seq_len) * a.freqs_stride_seq;
  if (a.x_stride_batch == 0) a.x_stride_batch = 8;  // seq_len 0: nothing is read
  if (a.out_stride_batch == 0) a.out_stride_batch = 8;

  require_stride(kCall, "x_stride_head", a.x_stride_head, d, a.n_heads > 1);
  require_stride(kCall, "x_stride_seq", a.x_stride_seq, 1, false);
  require_stride(kCall, "x_stride_batch", a.x_stride_batch, 1, false);
  require_stride(kCall, "out_stride_head", a.out_stride_head, d, a.n_heads > 1);
  require_stride(kCall, "out_stride_seq", a.out_stride_seq, (a.n_heads - 1) * a.out_stride_head + d,
                 a.seq_len > 1);
  require_stride(kCall, "out_stride_batch", a.out_stride_batch, 1, false);
  if (a.freqs_stride_seq < d || a.freqs_stride_seq % 4 != 0)
    fail(kCall, fmt::format("freqs_stride_seq {} is not valid (allowed: a multiple of 4 floats, "
                            ">= head_dim {})", a.freqs_stride_seq, d));
  if (a.freqs_stride_batch < 0 || a.freqs_stride_batch % 4 != 0)
    fail(kCall, fmt::format("freqs_stride_batch {} is not valid (allowed: 0 to share, -1 for "
                            "contiguous, or a non-negative multiple of 4 floats)", a.freqs_stride_batch));
  if (1LL * a.batch * a.seq_len > 0) {
    require_pointer(kCall, "x", a.x, 16);
    require_pointer(kCall, "out", a.out, 16);
    require_pointer(kCall, "freqs", a.freqs, 16);
  }
  return a;
}

namespace {


float resolve_scale(const char* call, float scale, int head_dim) {
  if (!std::isfinite(scale))
    fail(call, fmt::format("scale {} is not finite (allowed: > 0, or <= 0 for 1/sqrt(head_dim))", scale));
  return scale > 0.f ? scale : 1.f / std::sqrt(static_cast<float>(head_dim));
}

// Byte-addressed (bool) mask strides: any positive value; 0 was replaced by its default.
void require_mask_stride(const char* call, const char* name, std::int64_t stride) {
  if (stride <= 0)
    fail(call, fmt::format("{} {} is not valid (allowed: > 0, or 0 for contiguous)", name, stride));
}

// Output rows of head_dim elements must not overlap, or blocks would race on them. Sorted by
// stride, each dimension must step past everything the smaller ones span, so any layout (blhd,
// bhld, ...) is accepted as long as it is one-to-one.
struct RowDim {
  const char* name;
  std::int64_t stride;
  std::int64_t extent;
};

void require_disjoint_rows(const char* call, std::int64_t head_dim, std::vector<RowDim> dims) {
  std::stable_sort(dims.begin(), dims.end(),
                   [](const RowDim& x, const RowDim& y) { return x.stride < y.stride; });
  std::int64_t span = head_dim;
  for (const RowDim& dim : dims) {
    if (dim.extent <= 1) continue;
    if (dim.stride < span)
      fail(call, fmt::format("{} {} makes rows overlap (allowed: >= {})", dim.name, dim.stride, span));
    span += (dim.extent - 1) * dim.stride;
  }
}

void require_optional_alignment(const char* call, const char* name, const void* pointer,
                                std::size_t alignment) {
  if (pointer != nullptr && reinterpret_cast<std::uintptr_t>(pointer) % alignment != 0)
    fail(call, fmt::format("{} = {} is not {}-byte aligned", name, pointer, alignment));
}

}  // namespace

PrefillArgs resolve_prefill_args(const PrefillArgs& input) {
  constexpr const char* kCall = "prefill";
  PrefillArgs a = input;
  require_dtype(kCall, a.dtype);
  require_batch(kCall, a.batch);
  require_non_negative(kCall, "q_len", a.q_len);
  require_non_negative(kCall, "kv_len", a.kv_len);
  require_attention_heads(kCall, a.n_heads, a.n_kv_heads, a.head_dim);
  if (a.causal_offset < -1)
    fail(kCall, fmt::format("causal_offset {} is not valid (allowed: -1 for non-causal, or >= 0)",
                            a.causal_offset));
  a.scale = resolve_scale(kCall, a.scale, a.head_dim);

  const std::int64_t d = a.head_dim;
  const std::int64_t q_rows = std::max(1, a.q_len);    // q_len 0: nothing is read or written
  const std::int64_t kv_rows = std::max(1, a.kv_len);  // kv_len 0: nothing is read
  if (a.q_stride_head == 0) a.q_stride_head = d;
  if (a.q_stride_seq == 0) a.q_stride_seq = a.n_heads * a.q_stride_head;
  if (a.q_stride_batch == 0) a.q_stride_batch = q_rows * a.q_stride_seq;
  if (a.k_stride_head == 0) a.k_stride_head = d;
  if (a.k_stride_seq == 0) a.k_stride_seq = a.n_kv_heads * a.k_stride_head;
  if (a.k_stride_batch == 0) a.k_stride_batch = kv_rows * a.k_stride_seq;
  if (a.v_stride_head == 0) a.v_stride_head = d;
  if (a.v_stride_seq == 0) a.v_stride_seq = a.n_kv_heads * a.v_stride_head;
  if (a.v_stride_batch == 0) a.v_stride_batch = kv_rows * a.v_stride_seq;
  if (a.out_stride_head == 0) a.out_stride_head = d;
  if (a.out_stride_seq == 0) a.out_stride_seq = a.n_heads * a.out_stride_head;
  if (a.out_stride_batch == 0) a.out_stride_batch = q_rows * a.out_stride_seq;

  require_stride(kCall, "q_stride_head", a.q_stride_head, d, a.n_heads > 1);
  require_stride(kCall, "q_stride_seq", a.q_stride_seq, 1, false);
  require_stride(kCall, "q_stride_batch", a.q_stride_batch, 1, false);
  require_stride(kCall, "k_stride_head", a.k_stride_head, d, a.n_kv_heads > 1);
  require_stride(kCall, "k_stride_seq", a.k_stride_seq, 1, false);
  require_stride(kCall, "k_stride_batch", a.k_stride_batch, 1, false);
  require_stride(kCall, "v_stride_head", a.v_stride_head, d, a.n_kv_heads > 1);
  require_stride(kCall, "v_stride_seq", a.v_stride_seq, 1, false);
  require_stride(kCall, "v_stride_batch", a.v_stride_batch, 1, false);
  require_stride(kCall, "out_stride_head", a.out_stride_head, 1, false);
  require_stride(kCall, "out_stride_seq", a.out_stride_seq, 1, false);
  require_stride(kCall, "out_stride_batch", a.out_stride_batch, 1, false);
  require_disjoint_rows(kCall, d, {{"out_stride_head", a.out_stride_head, a.n_heads},
                                   {"out_stride_seq", a.out_stride_seq, a.q_len},
                                   {"out_stride_batch", a.out_stride_batch, a.batch}});

  if (a.mask_batch == 0) a.mask_batch = a.batch;
  if (a.mask_stride_q == 0) a.mask_stride_q = kv_rows;
  if (a.mask_stride_batch == 0) a.mask_stride_batch = std::max(1, a.mask_q_len) * a.mask_stride_q;
  if (a.mask != nullptr) {
    if (a.mask_batch != 1 && a.mask_batch != a.batch)
      fail(kCall, fmt::format("mask_batch {} is not valid (allowed: 1 to broadcast, or batch {}; 0 "
                              "means batch)", a.mask_batch, a.batch));
    if (a.mask_q_len != 1 && a.mask_q_len != a.q_len)
      fail(kCall, fmt::format("mask_q_len {} is not valid (allowed: 1 to broadcast, or q_len {})",
                              a.mask_q_len, a.q_len));
    require_mask_stride(kCall, "mask_stride_q", a.mask_stride_q);
    require_mask_stride(kCall, "mask_stride_batch", a.mask_stride_batch);
    if (a.mask_q_len > 1 && a.mask_stride_q < a.kv_len)
      fail(kCall, fmt::format("mask_stride_q {} is smaller than kv_len {}", a.mask_stride_q, a.kv_len));
    const std::int64_t mask_rows = (a.mask_q_len - 1) * a.mask_stride_q + a.kv_len;
    if (a.mask_batch > 1 && a.mask_stride_batch < mask_rows)
      fail(kCall, fmt::format("mask_stride_batch {} makes masks overlap (allowed: >= {})",
                              a.mask_stride_batch, mask_rows));
  }

  if (1LL * a.batch * a.q_len > 0) {
    require_pointer(kCall, "q", a.q, 16);
    require_pointer(kCall, "out", a.out, 16);
    if (a.kv_len > 0) {
      require_pointer(kCall, "k", a.k, 16);
      require_pointer(kCall, "v", a.v, 16);
    }
  }
  require_optional_alignment(kCall, "lse", a.lse, 4);
  return a;
}

PagedPrefillArgs resolve_paged_prefill_args(const PagedPrefillArgs& input) {
  constexpr const char* kCall = "paged_prefill";
  PagedPrefillArgs a = input;
  require_dtype(kCall, a.dtype);
  require_batch(kCall, a.batch);
  require_non_negative(kCall, "total_q", a.total_q);
  require_non_negative(kCall, "max_q_len", a.max_q_len);
  if (a.batch > 0 && a.total_q > 0) {
    // Some request holds at least total_q / batch rows and none more than total_q.
    const int lowest = static_cast<int>((1LL * a.total_q + a.batch - 1) / a.batch);
    if (a.max_q_len < lowest || a.max_q_len > a.total_q)
      fail(kCall, fmt::format("max_q_len {} is not valid for total_q {} over batch {} (allowed: "
                              "{}..{})", a.max_q_len, a.total_q, a.batch, lowest, a.total_q));
  }
  require_attention_heads(kCall, a.n_heads, a.n_kv_heads, a.head_dim);
  if (!is_power_of_two(a.page_size) || a.page_size > 256)
    fail(kCall, fmt::format("page_size {} is not supported (allowed: a power of two in 1..256)", a.page_size));
  require_positive(kCall, "num_pages", a.num_pages);
  require_positive(kCall, "max_pages_per_seq", a.max_pages_per_seq);
  const std::int64_t capacity = static_cast<std::int64_t>(a.max_pages_per_seq) * a.page_size;
  if (capacity > std::numeric_limits<int>::max())
    fail(kCall, fmt::format("max_pages_per_seq {} x page_size {} = {} tokens exceeds the limit of {} "
                            "tokens", a.max_pages_per_seq, a.page_size, capacity,
                            std::numeric_limits<int>::max()));
  a.scale = resolve_scale(kCall, a.scale, a.head_dim);

  const std::int64_t d = a.head_dim;
  if (a.q_stride_head == 0) a.q_stride_head = d;
  if (a.q_stride_token == 0) a.q_stride_token = a.n_heads * a.q_stride_head;
  if (a.out_stride_head == 0) a.out_stride_head = d;
  if (a.out_stride_token == 0) a.out_stride_token = a.n_heads * a.out_stride_head;
  if (a.k_stride_head == 0) a.k_stride_head = d;
  if (a.k_stride_token == 0) a.k_stride_token = a.n_kv_heads * a.k_stride_head;
  if (a.k_stride_page == 0) a.k_stride_page = a.page_size * a.k_stride_token;
  if (a.v_stride_head == 0) a.v_stride_head = d;
  if (a.v_stride_token == 0) a.v_stride_token = a.n_kv_heads * a.v_stride_head;
  if (a.v_stride_page == 0) a.v_stride_page = a.page_size * a.v_stride_token;
  if (a.page_table_stride == 0) a.page_table_stride = a.max_pages_per_seq;
  if (a.mask_stride_q == 0) a.mask_stride_q = capacity;

  require_stride(kCall, "q_stride_head", a.q_stride_head, d, a.n_heads > 1);
  require_stride(kCall, "q_stride_token", a.q_stride_token, 1, false);
  require_stride(kCall, "k_stride_head", a.k_stride_head, d, a.n_kv_heads > 1);
  require_stride(kCall, "k_stride_token", a.k_stride_token, 1, false);
  require_stride(kCall, "k_stride_page", a.k_stride_page, 1, false);
  require_stride(kCall, "v_stride_head", a.v_stride_head, d, a.n_kv_heads > 1);
  require_stride(kCall, "v_stride_token", a.v_stride_token, 1, false);
  require_stride(kCall, "v_stride_page", a.v_stride_page, 1, false);
  require_stride(kCall, "out_stride_head", a.out_stride_head, 1, false);
  require_stride(kCall, "out_stride_token", a.out_stride_token, 1, false);
  require_disjoint_rows(kCall, d, {{"out_stride_head", a.out_stride_head, a.n_heads},
                                   {"out_stride_token", a.out_stride_token, a.total_q}});
  if (a.page_table_stride < a.max_pages_per_seq)
    fail(kCall, fmt::format("page_table_stride {} is smaller than max_pages_per_seq {}",
                            a.page_table_stride, a.max_pages_per_seq));
  if (a.mask != nullptr) require_mask_stride(kCall, "mask_stride_q", a.mask_stride_q);

  if (1LL * a.batch * a.total_q > 0) {
    require_pointer(kCall, "q", a.q, 16);
    require_pointer(kCall, "k_cache", a.k_cache, 16);
    require_pointer(kCall, "v_cache", a.v_cache, 16);
    require_pointer(kCall, "out", a.out, 16);
    require_pointer(kCall, "qo_indptr", a.qo_indptr, 4);
    require_pointer(kCall, "seq_lens", a.seq_lens, 4);
    require_pointer(kCall, "page_table", a.page_table, 4);
  }
  require_optional_alignment(kCall, "lse", a.lse, 4);
  return a;
}

}  // namespace astrai::detail
