#include "tests/gpu/paged_decode_support.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include "tests/gpu/prefill_support.hpp"

namespace astrai::gpu_test {

PageTable make_page_table(const std::vector<int>& seq_lens, int page_size, const PageTableShape& shape,
                          std::mt19937& rng) {
  PageTable pages;
  const int batch = static_cast<int>(seq_lens.size());
  const int max_len = batch ? *std::max_element(seq_lens.begin(), seq_lens.end()) : 0;
  pages.max_pages = std::max(1, (max_len + page_size - 1) / page_size + shape.extra_pages);
  int used_pages = 0;
  for (int len : seq_lens) used_pages += (len + page_size - 1) / page_size;
  pages.num_pages = used_pages + shape.spare_pages;

  std::vector<int> physical(pages.num_pages);
  std::iota(physical.begin(), physical.end(), 0);
  std::shuffle(physical.begin(), physical.end(), rng);
  pages.stride = pages.max_pages + shape.stride_padding;
  pages.rows = shape.request_rows ? batch + 3 : batch;
  pages.request_row.resize(batch);
  std::iota(pages.request_row.begin(), pages.request_row.end(), 0);
  if (shape.request_rows) {
    std::vector<std::int32_t> rows(pages.rows);
    std::iota(rows.begin(), rows.end(), 0);
    std::shuffle(rows.begin(), rows.end(), rng);
    for (int b = 0; b < batch; ++b) pages.request_row[b] = rows[b];
  }
  pages.table.assign(static_cast<std::size_t>(std::max(1, pages.rows)) * pages.stride, -1);
  int next = 0;
  for (int b = 0; b < batch; ++b)
    for (int p = 0; p < (seq_lens[b] + page_size - 1) / page_size; ++p)
      pages.table[pages.request_row[b] * pages.stride + p] = physical[next++];
  return pages;
}

std::vector<std::uint8_t> random_keep_mask(int batch, std::int64_t row_stride, std::mt19937& rng) {
  std::vector<std::uint8_t> mask(std::max<std::size_t>(1, batch * row_stride));
  std::bernoulli_distribution keep(0.7);
  for (auto& m : mask) m = keep(rng) ? 1 : 0;
  for (std::int64_t t = 0; batch > 0 && t < row_stride; ++t) mask[t] = 0;
  return mask;
}

std::vector<float> kv_scales(bool per_head, int n_kv_heads, std::mt19937& rng) {
  std::uniform_real_distribution<float> spread(0.004f, 0.012f);
  std::vector<float> scales(per_head ? n_kv_heads : 1);
  for (auto& s : scales) s = spread(rng);
  return scales;
}

}  // namespace astrai::gpu_test
