#include "runtime/families/arg_checks.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "kernel_src/kernel_params.h"

namespace astrai::detail {

namespace {

// Largest grid y / z extent: every launch puts heads and batch there.
constexpr int kMaxGridYZ = 65535;

}  // namespace

void fail_argument(const char* call, const std::string& message) {
  throw InvalidArgument(fmt::format("{}: {}", call, message));
}

void require_dtype(const char* call, DType dtype) {
  if (dtype != DType::bf16 && dtype != DType::fp16)
    fail_argument(call, fmt::format("dtype {} is not valid (allowed: bf16, fp16)", static_cast<int>(dtype)));
}

void require_pointer(const char* call, const char* name, const void* pointer, std::size_t alignment) {
  if (pointer == nullptr) fail_argument(call, fmt::format("{} is null (a device pointer is required)", name));
  if (reinterpret_cast<std::uintptr_t>(pointer) % alignment != 0)
    fail_argument(call, fmt::format("{} = {} is not {}-byte aligned", name, pointer, alignment));
}

void require_optional_alignment(const char* call, const char* name, const void* pointer,
                                std::size_t alignment) {
  if (pointer != nullptr && reinterpret_cast<std::uintptr_t>(pointer) % alignment != 0)
    fail_argument(call, fmt::format("{} = {} is not {}-byte aligned", name, pointer, alignment));
}

void require_index_table(const char* call, const char* name, const IndexTable& table) {
  require_pointer(call, name, table.data, static_cast<std::size_t>(table.element_bytes()));
}

void require_optional_index_table(const char* call, const char* name, const IndexTable& table) {
  require_optional_alignment(call, name, table.data, static_cast<std::size_t>(table.element_bytes()));
}

void resolve_table_rows(const char* call, int* page_table_rows, int batch, const IndexTable& req_indices) {
  require_optional_index_table(call, "req_indices", req_indices);
  if (*page_table_rows == 0) *page_table_rows = batch;
  if (*page_table_rows < 0)
    fail_argument(call, fmt::format("page_table_rows {} is not valid (allowed: >= 0; 0 means batch)",
                                    *page_table_rows));
  if (req_indices == nullptr && *page_table_rows < batch)
    fail_argument(call, fmt::format("page_table_rows {} is smaller than batch {} without req_indices",
                                    *page_table_rows, batch));
}

unsigned index_layout_bits(const IndexTable& page_table, const IndexTable& req_indices, const IndexTable& seq_lens,
                           bool seq_lens_are_offsets, const IndexTable& qo_indptr) {
  return (page_table.wide ? kWidePageTable : 0u) | (req_indices.wide ? kWideReqIndices : 0u) |
         (seq_lens.wide ? kWideSeqLens : 0u) | (qo_indptr.wide ? kWideQoIndptr : 0u) |
         (seq_lens_are_offsets ? kSeqLensIndptr : 0u);
}

void require_stride(const char* call, const char* name, std::int64_t stride, std::int64_t minimum,
                    bool check_minimum) {
  if (stride <= 0)
    fail_argument(call, fmt::format("{} {} is not valid (allowed: > 0, or 0 for contiguous)", name, stride));
  if (stride % 8 != 0)
    fail_argument(call, fmt::format("{} {} is not a multiple of 8 elements (rows must stay 16-byte aligned)",
                                    name, stride));
  if (check_minimum && stride < minimum)
    fail_argument(call, fmt::format("{} {} makes rows overlap (allowed: >= {})", name, stride, minimum));
}

void resolve_kv_strides(const char* call, StrideField outer, StrideField row, StrideField head, int kv_heads,
                        std::int64_t head_dim, std::int64_t rows) {
  if (*head.value == 0) *head.value = head_dim;
  if (*row.value == 0) *row.value = kv_heads * *head.value;
  if (*outer.value == 0) *outer.value = rows * *row.value;
  require_stride(call, head.name, *head.value, head_dim, kv_heads > 1);
  require_stride(call, row.name, *row.value, 1, false);
  require_stride(call, outer.name, *outer.value, 1, false);
}

void resolve_token_strides(const char* call, StrideField batch, StrideField head, int heads,
                           std::int64_t head_dim, int disjoint_batch) {
  if (*head.value == 0) *head.value = head_dim;
  if (*batch.value == 0) *batch.value = heads * *head.value;
  require_stride(call, head.name, *head.value, head_dim, heads > 1);
  const bool disjoint = disjoint_batch > 1;
  require_stride(call, batch.name, *batch.value, disjoint ? (heads - 1) * *head.value + head_dim : 1, disjoint);
}

void resolve_query_strides(const char* call, StrideField batch, StrideField seq, StrideField head, int heads,
                           std::int64_t head_dim, int q_len, int disjoint_batch) {
  if (q_len == 1) {
    resolve_token_strides(call, batch, head, heads, head_dim, disjoint_batch);
    if (*seq.value == 0) *seq.value = heads * *head.value;
    return;
  }
  if (*head.value == 0) *head.value = head_dim;
  if (*seq.value == 0) *seq.value = heads * *head.value;
  if (*batch.value == 0) *batch.value = q_len * *seq.value;
  require_stride(call, head.name, *head.value, head_dim, heads > 1);
  require_stride(call, seq.name, *seq.value, 1, false);
  require_stride(call, batch.name, *batch.value, 1, false);
  if (disjoint_batch > 0)
    require_disjoint_rows(call, head_dim, {{head.name, *head.value, heads}, {seq.name, *seq.value, q_len},
                                           {batch.name, *batch.value, disjoint_batch}});
}

void require_mask_stride(const char* call, const char* name, std::int64_t stride) {
  if (stride <= 0)
    fail_argument(call, fmt::format("{} {} is not valid (allowed: > 0, or 0 for contiguous)", name, stride));
}

void require_positive(const char* call, const char* name, long long value) {
  if (value < 1) fail_argument(call, fmt::format("{} {} is not valid (allowed: >= 1)", name, value));
}

void require_non_negative(const char* call, const char* name, long long value) {
  if (value < 0) fail_argument(call, fmt::format("{} {} is not valid (allowed: >= 0)", name, value));
}

void require_batch(const char* call, int batch) {
  if (batch < 0) fail_argument(call, fmt::format("batch {} is not valid (allowed: >= 0)", batch));
  if (batch > kMaxGridYZ)
    fail_argument(call, fmt::format("batch {} exceeds the launch grid limit (allowed: 0..{})", batch,
                                    kMaxGridYZ));
}

void require_attention_heads(const KernelFamily& family, int n_heads, int n_kv_heads, int head_dim) {
  const char* call = family.name;
  const FamilyLimits& limits = family.limits;
  require_positive(call, "n_heads", n_heads);
  require_positive(call, "n_kv_heads", n_kv_heads);
  if (n_heads > kMaxGridYZ)
    fail_argument(call, fmt::format("n_heads {} exceeds the launch grid limit (allowed: 1..{})", n_heads,
                                    kMaxGridYZ));
  if (n_heads % n_kv_heads != 0)
    fail_argument(call, fmt::format("n_heads {} is not a multiple of n_kv_heads {} (GQA needs n_heads % "
                                    "n_kv_heads == 0)", n_heads, n_kv_heads));
  if (!limits.group_ok(n_heads / n_kv_heads))
    fail_argument(call, fmt::format("GQA group size {} (n_heads {} / n_kv_heads {}) is not supported "
                                    "(allowed: {})", n_heads / n_kv_heads, n_heads, n_kv_heads,
                                    limits.group_allowed()));
  if (head_dim % limits.head_dim.step != 0)
    fail_argument(call, fmt::format("head_dim {} is not a multiple of {} (allowed: {})", head_dim,
                                    limits.head_dim.step, limits.head_dim.allowed()));
  if (!limits.head_dim.contains(head_dim))
    fail_argument(call, fmt::format("head_dim {} is out of range (allowed: {})", head_dim,
                                    limits.head_dim.allowed()));
}

void require_page_size(const KernelFamily& family, int page_size) {
  if (!family.limits.page_size_ok(page_size))
    fail_argument(family.name, fmt::format("page_size {} is not supported (allowed: {})", page_size,
                                           family.limits.page_size_allowed()));
}

float resolve_scale(const char* call, float scale, int head_dim) {
  if (!std::isfinite(scale))
    fail_argument(call, fmt::format("scale {} is not finite (allowed: > 0, or <= 0 for 1/sqrt(head_dim))",
                                    scale));
  return scale > 0.f ? scale : 1.f / std::sqrt(static_cast<float>(head_dim));
}

void require_disjoint_rows(const char* call, std::int64_t head_dim, std::vector<RowDim> dims) {
  std::stable_sort(dims.begin(), dims.end(),
                   [](const RowDim& x, const RowDim& y) { return x.stride < y.stride; });
  std::int64_t span = head_dim;
  for (const RowDim& dim : dims) {
    if (dim.extent <= 1) continue;
    if (dim.stride < span)
      fail_argument(call, fmt::format("{} {} makes rows overlap (allowed: >= {})", dim.name, dim.stride, span));
    span += (dim.extent - 1) * dim.stride;
  }
}

ByteSpan byte_span(const void* data, std::int64_t element_bytes, std::int64_t row_elements,
                   std::initializer_list<SpanDim> dims) {
  std::int64_t last = row_elements;
  for (const SpanDim& dim : dims) {
    if (dim.extent == 0) return {};
    last += (dim.extent - 1) * dim.stride;
  }
  const auto begin = reinterpret_cast<std::uintptr_t>(data);
  return {begin, begin + static_cast<std::uintptr_t>(last * element_bytes)};
}

}  // namespace astrai::detail
