// cascade against a float64 reference over the union of each query's levels: a shared prefix,
// a middle level shared by half of the requests, and each request's own suffix (causal), with
// ragged query counts (multi-token), prefixes that end inside a page, empty levels, the soft-cap
// and sinks (counted once), a long prefix spread over the SMs in chunks, a last level of uniform
// new tokens run as paged_decode, the caller's workspace or the runtime's. Outputs poisoned first.
#include <algorithm>
#include <numeric>

#include "tests/gpu/prefill_support.hpp"

namespace astrai::gpu_test {
namespace {

struct CascadeCase {
  DType dtype = DType::bf16;
  int n_kv_heads = 2;
  int group = 4;
  int head_dim = 128;
  int page_size = 16;
  std::vector<int> q_lens;       // new query tokens per request
  std::vector<int> suffix_lens;  // each request's own KV (its new tokens included)
  int prefix_len = 100;          // level 0: every request
  int middle_len = 0;            // > 0: a middle level for the first half of the requests
  bool prefix_level = true;      // false (prefix_len 0): the suffixes alone, one level
  bool lse = true;
  bool own_workspace = false;
  CaseFeatures features;
  unsigned seed = test_seed(61);

  int batch() const { return static_cast<int>(q_lens.size()); }
  std::string describe() const {
    return fmt::format("cascade dtype={} hd={} ps={} group={} kv_heads={} prefix={} middle={} lse={} "
                       "own_workspace={} seed={} q_lens=[{}] suffix_lens=[{}]{}",
                       dtype_name(dtype), head_dim, page_size, group, n_kv_heads, prefix_len, middle_len, lse,
                       own_workspace, seed, fmt::join(q_lens, ","), fmt::join(suffix_lens, ","), features.text());
  }
};

// Pages of one KV sequence in a shared pool, handed out from a shuffled list.
struct PagedRows {
  std::vector<std::int32_t> pages;
  int len = 0;
};

void check_cascade(const CascadeCase& c) {
  std::mt19937 rng(c.seed);
  const int batch = c.batch();
  const int n_heads = c.n_kv_heads * c.group;
  const int d = c.head_dim;
  const int ps = c.page_size;
  const int half = (batch + 1) / 2;
  auto pages_of = [&](int len) { return (len + ps - 1) / ps; };
  int total_pages = pages_of(c.prefix_len) + pages_of(c.middle_len);
  for (int len : c.suffix_lens) total_pages += pages_of(len);
  const int num_pages = total_pages + 2;
  std::vector<int> physical(num_pages);
  std::iota(physical.begin(), physical.end(), 0);
  std::shuffle(physical.begin(), physical.end(), rng);
  int next = 0;
  auto take = [&](int len) {
    PagedRows rows;
    rows.len = len;
    for (int p = 0; p < pages_of(len); ++p) rows.pages.push_back(physical[next++]);
    return rows;
  };
  const PagedRows prefix = take(c.prefix_len);
  const PagedRows middle = take(c.middle_len);
  std::vector<PagedRows> suffix;
  for (int len : c.suffix_lens) suffix.push_back(take(len));

  const std::int64_t kv_token = static_cast<std::int64_t>(c.n_kv_heads) * d;
  const std::int64_t kv_page = ps * kv_token;
  const std::size_t pool_elems = static_cast<std::size_t>(num_pages) * kv_page;
  const std::vector<std::uint16_t> k_pool = random_elements(pool_elems, c.dtype, rng);
  const std::vector<std::uint16_t> v_pool = random_elements(pool_elems, c.dtype, rng);
  std::vector<std::int32_t> indptr(batch + 1, 0);
  for (int b = 0; b < batch; ++b) indptr[b + 1] = indptr[b] + c.q_lens[b];
  const int total_q = indptr[batch];
  const std::size_t q_elems = static_cast<std::size_t>(std::max(1, total_q)) * n_heads * d;
  const std::vector<std::uint16_t> q = random_elements(q_elems, c.dtype, rng);

  // One page table and length list a level, with rows of a common width.
  struct LevelHost {
    std::vector<std::int32_t> indptr, table, lens;
    int width = 1, max_q_len = 0;
    bool causal = false;
  };
  auto level_of = [&](const std::vector<const PagedRows*>& rows, const std::vector<std::int32_t>& qo, bool causal) {
    LevelHost level;
    level.indptr = qo;
    level.causal = causal;
    for (const PagedRows* r : rows) level.width = std::max<int>(level.width, static_cast<int>(r->pages.size()));
    level.table.assign(rows.size() * level.width, -1);
    for (std::size_t g = 0; g < rows.size(); ++g) {
      std::copy(rows[g]->pages.begin(), rows[g]->pages.end(), level.table.begin() + g * level.width);
      level.lens.push_back(rows[g]->len);
      level.max_q_len = std::max(level.max_q_len, qo[g + 1] - qo[g]);
    }
    return level;
  };
  std::vector<LevelHost> levels;
  if (c.prefix_level) levels.push_back(level_of({&prefix}, {0, total_q}, false));
  static const PagedRows kEmpty;
  if (c.middle_len > 0) levels.push_back(level_of({&middle, &kEmpty}, {0, indptr[half], total_q}, false));
  std::vector<const PagedRows*> own;
  for (const PagedRows& r : suffix) own.push_back(&r);
  levels.push_back(level_of(own, indptr, true));

  DeviceBuffer d_q = DeviceBuffer::from(q), d_k = DeviceBuffer::from(k_pool), d_v = DeviceBuffer::from(v_pool);
  std::vector<DeviceBuffer> level_buffers;
  CascadeArgs args;
  args.dtype = c.dtype;
  args.total_q = total_q;
  args.n_heads = n_heads;
  args.n_kv_heads = c.n_kv_heads;
  args.head_dim = d;
  args.page_size = ps;
  args.num_pages = num_pages;
  args.logit_cap = c.features.logit_cap;
  const std::vector<float> sinks = sink_values(n_heads, c.seed);
  DeviceBuffer d_sinks = DeviceBuffer::from(sinks);
  if (c.features.sinks) args.sinks = static_cast<const float*>(d_sinks.get());
  args.q = d_q.get();
  args.k_cache = d_k.get();
  args.v_cache = d_v.get();
  args.num_levels = static_cast<int>(levels.size());
  for (std::size_t l = 0; l < levels.size(); ++l) {
    level_buffers.push_back(DeviceBuffer::from(levels[l].indptr));
    level_buffers.push_back(DeviceBuffer::from(levels[l].table));
    level_buffers.push_back(DeviceBuffer::from(levels[l].lens));
    CascadeLevel& level = args.levels[l];
    level.groups = static_cast<int>(levels[l].lens.size());
    level.max_q_len = levels[l].max_q_len;
    level.qo_indptr = static_cast<const std::int32_t*>(level_buffers[3 * l].get());
    level.page_table = static_cast<const std::int32_t*>(level_buffers[3 * l + 1].get());
    level.max_pages_per_seq = levels[l].width;
    level.seq_lens = static_cast<const std::int32_t*>(level_buffers[3 * l + 2].get());
    level.causal = levels[l].causal;
  }
  DeviceBuffer d_out(q_elems * 2);
  const std::size_t lse_count = static_cast<std::size_t>(std::max(1, total_q * n_heads));
  DeviceBuffer d_lse(lse_count * sizeof(float));
  d_out.fill_byte(0xff);
  d_lse.fill_byte(0xff);
  args.out = d_out.get();
  if (c.lse) args.lse = static_cast<float*>(d_lse.get());
  // Enough for any SM count (the split of a long prefix, and its scratch, grow with it).
  DeviceBuffer workspace(std::max<std::size_t>(cascade_workspace_bytes(args, 1 << 20), 256));
  if (c.own_workspace) {
    args.workspace = workspace.get();
    args.workspace_bytes = workspace.bytes();
  }
  Runtime::get().cascade(args);
  synchronize();
  const std::vector<std::uint16_t> out = d_out.to_host<std::uint16_t>(q_elems);
  const std::vector<float> lse = d_lse.to_host<float>(lse_count);

  // The reference: each query over the keys of its levels, in one softmax (the sink once).
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  RowFeatures row_features;
  row_features.logit_cap = c.features.logit_cap;
  Verdict verdict(c.dtype);
  std::vector<char> written(q_elems, 0);
  std::vector<float> q_row(d);
  std::vector<double> want;
  for (int b = 0; b < batch; ++b) {
    std::vector<const PagedRows*> parts = {&prefix};
    if (b < half && c.middle_len > 0) parts.push_back(&middle);
    const int shared = prefix.len + (b < half ? c.middle_len : 0);
    parts.push_back(&suffix[b]);
    const int keys = shared + suffix[b].len;
    for (int kvh = 0; kvh < c.n_kv_heads; ++kvh) {
      std::vector<float> k_rows(static_cast<std::size_t>(std::max(1, keys)) * d), v_rows(k_rows.size());
      int t = 0;
      for (const PagedRows* part : parts)
        for (int j = 0; j < part->len; ++j, ++t) {
          const std::int64_t at = part->pages[j / ps] * kv_page + (j % ps) * kv_token + kvh * d;
          for (int e = 0; e < d; ++e) {
            k_rows[static_cast<std::size_t>(t) * d + e] = bits_to_float(k_pool[at + e], c.dtype);
            v_rows[static_cast<std::size_t>(t) * d + e] = bits_to_float(v_pool[at + e], c.dtype);
          }
        }
      for (int i = 0; i < c.q_lens[b]; ++i) {
        const int row = indptr[b] + i;
        // Within its own suffix, query i sits at suffix_len - q_len + i.
        const long long position = shared + static_cast<long long>(suffix[b].len) - c.q_lens[b] + i;
        std::vector<char> keep(static_cast<std::size_t>(std::max(1, keys)));
        for (int k = 0; k < keys; ++k) keep[k] = k < shared || k <= position;
        for (int h = kvh * c.group; h < (kvh + 1) * c.group; ++h) {
          const std::int64_t base = (static_cast<std::int64_t>(row) * n_heads + h) * d;
          for (int e = 0; e < d; ++e) q_row[e] = bits_to_float(q[base + e], c.dtype);
          double lse_want = 0;
          row_features.sink = c.features.sinks ? sinks[h] : -INFINITY;
          const bool non_empty = attend_row(q_row.data(), k_rows.data(), v_rows.data(), keys, keep, d, scale, &want,
                                            &lse_want, row_features);
          check_row(&verdict, c.dtype, out, base, want, non_empty,
                    c.lse ? &lse[static_cast<std::size_t>(row) * n_heads + h] : nullptr, lse_want, RowId{b, i, h});
          std::fill_n(written.begin() + base, d, 1);
        }
      }
    }
  }
  check_poison(&verdict.check, out, written);
  if (!c.lse) check_lse_untouched(&verdict.check, lse);
  report("cascade", c.dtype, c.describe(), &verdict);
}

}  // namespace

TEST_SUITE("cascade") {

TEST_CASE("cascade of a shared prefix and each request's suffix matches the reference") {
  std::mt19937 rng(test_seed(62));
  for (const int page_size : {1, 16, 64})
    for (const bool lse : {true, false}) {
      CascadeCase c;
      c.page_size = page_size;
      c.lse = lse;
      c.own_workspace = !lse;
      // Decode rows, speculative tokens, an empty suffix, a one-token suffix.
      c.q_lens = {1, 1, 4, 1, 8, 2};
      c.suffix_lens = {37, 1, 130, 0, 64, 9};
      c.prefix_len = 1 + static_cast<int>(rng() % 300);  // rarely a whole number of pages
      c.seed = rng();
      check_cascade(c);
    }
}

TEST_CASE("cascade over three levels, other head dims and groups, fp16") {
  std::mt19937 rng(test_seed(63));
  for (const int head_dim : {64, 128, 256}) {
    CascadeCase c;
    c.dtype = head_dim == 128 ? DType::fp16 : DType::bf16;
    c.head_dim = head_dim;
    c.group = head_dim == 64 ? 6 : 8;
    c.n_kv_heads = head_dim == 256 ? 1 : 2;
    c.q_lens = {1, 3, 1, 1, 5};
    c.suffix_lens = {20, 3, 1, 77, 40};
    c.prefix_len = 257;
    c.middle_len = 1 + static_cast<int>(rng() % 90);
    c.seed = rng();
    check_cascade(c);
  }
}

TEST_CASE("cascade with the soft-cap and sinks (counted once), and an empty prefix") {
  std::mt19937 rng(test_seed(64));
  for (const int prefix_len : {0, 500}) {
    CascadeCase c;
    c.features.logit_cap = 20.f;
    c.features.sinks = true;
    c.q_lens = {1, 2, 1};
    c.suffix_lens = {16, 33, 0};
    c.prefix_len = prefix_len;
    c.middle_len = 48;
    c.seed = rng();
    check_cascade(c);
  }
}

TEST_CASE("cascade spreads a long shared prefix over the SMs (chunked level 0), with the cap and 3 levels") {
  // Level 0 is split in chunks when its pass alone would leave SMs idle (cascade_split): these
  // prefixes hold 4 to 16 chunks of at least 256 keys on any GPU of 32 SMs or more, the last one
  // partial or empty.
  std::mt19937 rng(test_seed(67));
  for (const int page_size : {1, 16, 64}) {
    CascadeCase c;
    c.page_size = page_size;
    c.q_lens = {1, 4, 1, 2};
    c.suffix_lens = {30, 4, 1, 200};
    c.prefix_len = 1024 + static_cast<int>(rng() % 3000);
    c.middle_len = page_size == 16 ? 70 : 0;
    c.features.logit_cap = page_size == 64 ? 25.f : 0.f;
    c.lse = page_size != 1;
    c.own_workspace = page_size == 16;
    c.seed = rng();
    check_cascade(c);
  }
}

TEST_CASE("cascade runs a level of every request's new tokens (1 or 3 each) as paged_decode") {
  // Uniform query counts make the last level a (multi-token) paged_decode, whose split-KV
  // workspace sits in the cascade's scratch; a 6000-key suffix splits.
  std::mt19937 rng(test_seed(68));
  for (const int q_len : {1, 3}) {
    for (const bool own_workspace : {false, true}) {
      CascadeCase c;
      c.q_lens.assign(5, q_len);
      c.suffix_lens = {q_len, 100, 6000, 17, 64};
      c.prefix_len = 700;
      c.middle_len = q_len == 3 ? 33 : 0;
      c.features.logit_cap = own_workspace ? 30.f : 0.f;
      c.own_workspace = own_workspace;
      c.seed = rng();
      check_cascade(c);
    }
  }
}

TEST_CASE("cascade of one request over a long prefix, and of one level") {
  CascadeCase c;
  c.q_lens = {1};
  c.suffix_lens = {5};
  c.prefix_len = 4096;
  c.seed = test_seed(65);
  check_cascade(c);
  CascadeCase single;
  single.q_lens = {2, 1, 3};
  single.suffix_lens = {40, 1, 17};
  single.prefix_len = 0;
  single.prefix_level = false;
  single.seed = test_seed(66);
  check_cascade(single);
}

}  // TEST_SUITE

}  // namespace astrai::gpu_test
