// The argument checks every family's resolve_*_args uses: each throws InvalidArgument naming
// the call, the argument, its value and what is allowed. Shape limits come from the family
// descriptor, so a spec and the call that needs it accept the same values.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "astrai/runtime.hpp"
#include "runtime/kernel_family.hpp"

namespace astrai::detail {

[[noreturn]] void fail_argument(const char* call, const std::string& message);

void require_dtype(const char* call, DType dtype);
// A non-null device pointer aligned to `alignment` bytes.
void require_pointer(const char* call, const char* name, const void* pointer, std::size_t alignment);
// A pointer that may be null, and is aligned when it is not.
void require_optional_alignment(const char* call, const char* name, const void* pointer,
                                std::size_t alignment);
// Rows are read as 16-byte vectors, so every stride must keep rows 16-byte aligned; with
// `check_minimum`, rows must also not overlap (stride >= minimum).
void require_stride(const char* call, const char* name, std::int64_t stride, std::int64_t minimum,
                    bool check_minimum);
// Strides of a K or V tensor [outer, rows, kv heads, head_dim] (outer: pages or batch): each
// 0 takes the contiguous value (`rows` rows per outer index), then each is checked as above;
// heads must not overlap.
struct StrideField {
  const char* name;
  std::int64_t* value;
};
void resolve_kv_strides(const char* call, StrideField outer, StrideField row, StrideField head, int kv_heads,
                        std::int64_t head_dim, std::int64_t rows);
// Strides of a one-token-per-sequence tensor [batch, heads, head_dim] (decode's q and out, the
// appended K/V): each 0 takes the contiguous value, then each is checked; heads must not
// overlap, and when `disjoint_batch` > 1 (an output's batch) neither may batch rows.
void resolve_token_strides(const char* call, StrideField batch, StrideField head, int heads,
                           std::int64_t head_dim, int disjoint_batch);
// The same with query tokens, [batch, q_len, heads, head_dim] (multi-token decode's q and out):
// q_len 1 is resolve_token_strides (the token stride only takes its contiguous value); more
// tokens check each stride, and for an output (`disjoint_batch` > 0) that no two rows overlap.
void resolve_query_strides(const char* call, StrideField batch, StrideField seq, StrideField head, int heads,
                           std::int64_t head_dim, int q_len, int disjoint_batch);
// A required index table: non-null and aligned to its element width.
void require_index_table(const char* call, const char* name, const IndexTable& table);
// An optional one: aligned when given.
void require_optional_index_table(const char* call, const char* name, const IndexTable& table);
// The page-table rows a call may read (0 resolves to batch): without req_indices, one per request.
void resolve_table_rows(const char* call, int* page_table_rows, int batch, const IndexTable& req_indices);
// The LayoutBit flags (kernel_params.h) of a call's index tables.
unsigned index_layout_bits(const IndexTable& page_table, const IndexTable& req_indices, const IndexTable& seq_lens,
                           bool seq_lens_are_offsets, const IndexTable& qo_indptr = {});
inline const int* index_pointer(const IndexTable& table) { return static_cast<const int*>(table.data); }
// Byte-addressed (bool) mask strides: any positive value.
void require_mask_stride(const char* call, const char* name, std::int64_t stride);
void require_positive(const char* call, const char* name, long long value);
void require_non_negative(const char* call, const char* name, long long value);
// Batch in 0..65535 (the launch grid's y/z limit).
void require_batch(const char* call, int batch);
// Heads (GQA group within the family's limit, heads within the grid) and head_dim.
void require_attention_heads(const KernelFamily& family, int n_heads, int n_kv_heads, int head_dim);
void require_page_size(const KernelFamily& family, int page_size);
// A finite scale; <= 0 resolves to 1/sqrt(head_dim).
float resolve_scale(const char* call, float scale, int head_dim);

// Output rows of head_dim elements must not overlap, or blocks would race on them. Sorted by
// stride, each dimension must step past everything the smaller ones span, so any layout (blhd,
// bhld, ...) is accepted as long as it is one-to-one.
struct RowDim {
  const char* name;
  std::int64_t stride;
  std::int64_t extent;
};
void require_disjoint_rows(const char* call, std::int64_t head_dim, std::vector<RowDim> dims);

// The bytes a tensor's elements span, [begin, end): rows of `row_elements` elements stepped over
// by `dims` (extent, stride in elements); empty when a dimension is.
struct ByteSpan {
  std::uintptr_t begin = 0;
  std::uintptr_t end = 0;
  bool overlaps(const ByteSpan& other) const { return begin < other.end && other.begin < end; }
};
struct SpanDim {
  std::int64_t extent;
  std::int64_t stride;
};
ByteSpan byte_span(const void* data, std::int64_t element_bytes, std::int64_t row_elements,
                   std::initializer_list<SpanDim> dims);

}  // namespace astrai::detail
