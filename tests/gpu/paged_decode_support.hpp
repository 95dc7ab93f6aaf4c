// What the paged_decode, kv_fp8 and multi-token decode GPU tests share: the shuffled page table,
// the random keep-mask, the FP8 scales, the arguments every case fills alike, the call a CUDA
// graph captures and the checks of a case scored by one Comparison. Each file keeps its own case
// struct, layouts and reference.
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "tests/gpu/gpu_support.hpp"

namespace astrai::gpu_test {

// How a case lays out its page table beyond the pages its requests need.
struct PageTableShape {
  int extra_pages = 1;        // table columns past the longest sequence (never read)
  int spare_pages = 2;        // pool pages no request uses
  int stride_padding = 0;     // table elements past max_pages in every row
  bool request_rows = false;  // 3 spare table rows; request b uses a shuffled pick (req_indices)
};

// The pages of a ragged batch, handed out in a shuffled order so that logical and physical
// order differ.
struct PageTable {
  int max_pages = 1;                      // max_pages_per_seq
  int num_pages = 0;
  int stride = 1;                         // elements between table rows
  int rows = 0;                           // table rows (page_table_rows)
  std::vector<std::int32_t> request_row;  // [batch], the table row of request b
  std::vector<std::int32_t> table;        // [max(rows, 1), stride], -1 where unused
};

// Draws from `rng` in a fixed order (the page shuffle, then the row shuffle), so a case's seed
// keeps giving the same data.
PageTable make_page_table(const std::vector<int>& seq_lens, int page_size, const PageTableShape& shape,
                          std::mt19937& rng);

// A keep-mask of `batch` rows of `row_stride` entries, about 70% kept, where row 0 keeps nothing
// (a request whose every key is masked).
std::vector<std::uint8_t> random_keep_mask(int batch, std::int64_t row_stride, std::mt19937& rng);

// Scales of an FP8 K or V cache: per tensor (one value) or per KV head, spread so that values of
// about +-1 use most of the format's finite range without saturating.
std::vector<float> kv_scales(bool per_head, int n_kv_heads, std::mt19937& rng);
inline float scale_of(const std::vector<float>& scales, int kv_head) {
  return scales.size() == 1 ? scales[0] : scales[kv_head];
}

// A paged K/V cache on the device: two pools with one set of element strides.
struct KvPool {
  const void* k = nullptr;
  const void* v = nullptr;
  std::int64_t page_stride = 0, token_stride = 0, head_stride = 0;
};

// The PagedDecodeArgs fields every paged-decode case fills alike: the case's shape and features
// (`c` has dtype, n_kv_heads, group, head_dim, page_size, batch() and features), its page
// table, lengths and K/V pool; `sinks` is passed only when the case has sinks. The caller adds
// q, out, the LSE and its own options.
template <typename Case>
PagedDecodeArgs paged_decode_args(const Case& c, const PageTable& pages, const DeviceBuffer& table,
                                  const DeviceBuffer& lens, const DeviceBuffer& sinks, const KvPool& kv) {
  PagedDecodeArgs args;
  args.dtype = c.dtype;
  args.batch = c.batch();
  args.n_heads = c.n_kv_heads * c.group;
  args.n_kv_heads = c.n_kv_heads;
  args.head_dim = c.head_dim;
  args.page_size = c.page_size;
  args.num_pages = pages.num_pages;
  args.max_pages_per_seq = pages.max_pages;
  args.logit_cap = c.features.logit_cap;
  if (c.features.sinks) args.sinks = static_cast<const float*>(sinks.get());
  args.window_left = c.features.window_left;
  args.k_cache = kv.k;
  args.v_cache = kv.v;
  args.k_stride_page = args.v_stride_page = kv.page_stride;
  args.k_stride_token = args.v_stride_token = kv.token_stride;
  args.k_stride_head = args.v_stride_head = kv.head_stride;
  args.page_table = static_cast<const std::int32_t*>(table.get());
  args.seq_lens = static_cast<const std::int32_t*>(lens.get());
  return args;
}

// paged_decode with `args` on the stream it is given: the call check_graph_replay captures.
inline std::function<void(CUstream)> paged_decode_call(PagedDecodeArgs args) {
  return [args](CUstream stream) mutable {
    args.stream = stream;
    Runtime::get().paged_decode(args);
  };
}

}  // namespace astrai::gpu_test
