// What the paged_decode, kv_fp8 and multi-token decode GPU tests share: the shuffled page table,
// the random keep-mask, the FP8 scales, the CUDA graph replay and the checks of a case scored by
// one Comparison. Each file keeps its own case struct, layouts and reference.
#pragma once

#include <cstdint>
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

// Captures `args` in a CUDA graph on a fresh stream (after an eager call there, which sizes its
// workspace) and replays it twice over a re-poisoned `out`: each replay must give `eager_out`
// bit for bit.
void check_graph_replay(PagedDecodeArgs args, DeviceBuffer* out, const std::vector<std::uint16_t>& eager_out,
                        const std::string& description);

// A row with nothing to attend to must report an LSE of -inf exactly; any other row within
// 2e-3 + 1e-3 |want|.
void compare_lse(Comparison* comparison, double got, double want, const std::string& where);

// The padding after each of the [batch][n_heads] output rows (columns head_dim..head_stride)
// must still hold the poison: nothing was written out of bounds.
void check_row_padding(Comparison* comparison, const std::vector<std::uint16_t>& out, int batch, int n_heads,
                       std::int64_t batch_stride, std::int64_t head_stride, int head_dim);

// The verdict of a case scored by one Comparison: no failed element and a norm-rel error
// within the tolerance.
void check_comparison(const std::string& description, const Comparison& comparison);

}  // namespace astrai::gpu_test
