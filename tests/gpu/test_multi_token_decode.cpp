// Multi-token paged decode (q_len 1..8 causal query tokens per request, speculative
// verification) against a float64 reference: query token i of request b sits at position
// seq_len - q_len + i and attends to the keys up to it. Outputs and the LSE are poisoned first;
// elements outside every output row must keep the poison. Bf16/fp16 and FP8 caches.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "tests/gpu/gpu_support.hpp"
#include "tests/gpu/paged_decode_support.hpp"
#include "tests/gpu/prefill_support.hpp"
#include "tests/support/fp8.hpp"

namespace astrai::gpu_test {
namespace {

struct MultiTokenCase {
  DType dtype = DType::bf16;
  KvDType kv = KvDType::same;  // e4m3 / e5m2: an FP8 cache
  bool per_head = false;       // FP8: one scale per KV head
  int q_len = 4;
  int n_kv_heads = 2;
  int group = 4;
  int head_dim = 128;
  int page_size = 16;
  std::vector<int> seq_lens;   // the new tokens included
  int extra_pages = 1;         // table columns past the longest sequence: a wider table splits more
  bool bhld = false;           // q and out [batch, n_heads, q_len, head_dim], rows padded
  bool mask = false;           // a random keep-mask per request; request 0 keeps nothing
  bool lse = true;
  float scale = 0.f;           // 0: 1/sqrt(head_dim)
  float key_ramp = 0.f;        // > 0 (16-bit caches): key t scaled by key_gain, peaked rows
  CaseFeatures features;
  unsigned seed = test_seed(1);

  int batch() const { return static_cast<int>(seq_lens.size()); }
  int n_heads() const { return n_kv_heads * group; }
  bool fp8() const { return kv != KvDType::same; }
  std::string describe() const {
    return fmt::format("paged_decode q_len={} dtype={}{} hd={} ps={} kv_heads={} group={} extra_pages={} bhld={} "
                       "mask={} lse={} seed={} lens=[{}]{}{}",
                       q_len, dtype_name(dtype),
                       fp8() ? fmt::format(" kv={}{}", kv_dtype_name(kv), per_head ? "/head" : "") : "",
                       head_dim, page_size, n_kv_heads, group, extra_pages, bhld, mask, lse, seed,
                       fmt::join(seq_lens, ","),
                       (scale > 0 ? fmt::format(" scale={}", scale) : "") +
                           (key_ramp > 0 ? fmt::format(" key_ramp={}", key_ramp) : ""),
                       features.text());
  }
};

// Strides of q and out, [batch, q_len, n_heads, head_dim] by default or, with bhld,
// [batch, n_heads, q_len, head_dim]; rows padded by 8 elements and batches by 16 in both.
struct QueryLayout {
  std::int64_t batch, seq, head, elements;
};

QueryLayout query_layout(const MultiTokenCase& c) {
  const std::int64_t row = c.head_dim + 8;
  QueryLayout layout{};
  if (c.bhld) {
    layout.seq = row;
    layout.head = c.q_len * row;
    layout.batch = c.n_heads() * layout.head + 16;
  } else {
    layout.head = row;
    layout.seq = c.n_heads() * row;
    layout.batch = c.q_len * layout.seq + 16;
  }
  layout.elements = std::max(1, c.batch()) * layout.batch;
  return layout;
}

// Runs one case and checks every output row, its LSE and the poison around the rows. With
// `graph`, the call is also captured in a CUDA graph and replayed twice: the same bits.
void check_case(const MultiTokenCase& c, bool graph = false) {
  std::mt19937 rng(c.seed);
  const int batch = c.batch();
  const int n_heads = c.n_heads();
  const int d = c.head_dim;
  const int ps = c.page_size;
  PageTableShape shape;
  shape.extra_pages = c.extra_pages;
  const PageTable pages = make_page_table(c.seq_lens, ps, shape, rng);
  const int max_pages = pages.max_pages;
  const int num_pages = pages.num_pages;
  const std::vector<std::int32_t>& table = pages.table;

  // The cache, [num_pages, page_size, n_kv_heads, head_dim] with heads padded by 16 elements,
  // and its values as the kernel reads them (dequantized for FP8).
  const std::int64_t head_stride = d + 16;
  const std::int64_t token_stride = c.n_kv_heads * head_stride;
  const std::int64_t page_stride = ps * token_stride;
  const std::size_t pool_elems = static_cast<std::size_t>(num_pages) * page_stride;
  const std::vector<float> k_scales = kv_scales(c.per_head, c.n_kv_heads, rng);
  const std::vector<float> v_scales = kv_scales(c.per_head, c.n_kv_heads, rng);
  std::vector<std::uint16_t> k16, v16;
  std::vector<std::uint8_t> k8, v8;
  std::vector<float> k_value(pool_elems), v_value(pool_elems);
  if (c.fp8()) {
    std::uniform_real_distribution<float> uniform(-1.f, 1.f);
    k8.resize(pool_elems);
    v8.resize(pool_elems);
    for (std::size_t i = 0; i < pool_elems; ++i) {
      const int kv_head = static_cast<int>((i / head_stride) % c.n_kv_heads);
      k8[i] = testing::float_to_fp8(uniform(rng) / scale_of(k_scales, kv_head), c.kv);
      v8[i] = testing::float_to_fp8(uniform(rng) / scale_of(v_scales, kv_head), c.kv);
      k_value[i] = testing::fp8_to_float(k8[i], c.kv) * scale_of(k_scales, kv_head);
      v_value[i] = testing::fp8_to_float(v8[i], c.kv) * scale_of(v_scales, kv_head);
    }
  } else {
    k16 = random_elements(pool_elems, c.dtype, rng);
    v16 = random_elements(pool_elems, c.dtype, rng);
    if (c.key_ramp > 0)
      for (int b = 0; b < batch; ++b)
        for (int t = 0; t < c.seq_lens[b]; ++t)
          for (int kvh = 0; kvh < c.n_kv_heads; ++kvh)
            scale_elements(&k16[table[b * max_pages + t / ps] * page_stride + (t % ps) * token_stride +
                                kvh * head_stride],
                           d, key_gain(t, c.seq_lens[b], c.key_ramp), c.dtype);
    for (std::size_t i = 0; i < pool_elems; ++i) {
      k_value[i] = bits_to_float(k16[i], c.dtype);
      v_value[i] = bits_to_float(v16[i], c.dtype);
    }
  }

  const QueryLayout layout = query_layout(c);
  const std::vector<std::uint16_t> q = random_elements(layout.elements, c.dtype, rng);
  const std::int64_t capacity = static_cast<std::int64_t>(max_pages) * ps;
  const std::vector<std::uint8_t> mask =
      c.mask ? random_keep_mask(batch, capacity, rng) : std::vector<std::uint8_t>();
  const std::vector<float> sinks = sink_values(n_heads, c.seed);

  DeviceBuffer d_k = c.fp8() ? DeviceBuffer::from(k8) : DeviceBuffer::from(k16);
  DeviceBuffer d_v = c.fp8() ? DeviceBuffer::from(v8) : DeviceBuffer::from(v16);
  DeviceBuffer d_q = DeviceBuffer::from(q);
  DeviceBuffer d_table = DeviceBuffer::from(table);
  DeviceBuffer d_lens = DeviceBuffer::from(c.seq_lens);
  DeviceBuffer d_mask = DeviceBuffer::from(mask);
  DeviceBuffer d_sinks = DeviceBuffer::from(sinks);
  DeviceBuffer d_k_scales = DeviceBuffer::from(k_scales);
  DeviceBuffer d_v_scales = DeviceBuffer::from(v_scales);
  const std::size_t lse_count = static_cast<std::size_t>(std::max(1, batch)) * c.q_len * n_heads;
  DeviceBuffer d_out(layout.elements * 2);
  DeviceBuffer d_lse(lse_count * sizeof(float));
  d_out.fill_byte(0xff);  // poison: every row element must be written, nothing else
  d_lse.fill_byte(0xff);

  const KvPool pool{d_k.get(), d_v.get(), page_stride, token_stride, head_stride};
  PagedDecodeArgs args = paged_decode_args(c, pages, d_table, d_lens, d_sinks, pool);
  args.scale = c.scale;
  if (c.fp8()) {
    args.kv_dtype = c.kv;
    args.k_scale = static_cast<const float*>(d_k_scales.get());
    args.v_scale = static_cast<const float*>(d_v_scales.get());
    args.kv_scale_per_head = c.per_head;
  }
  args.q_len = c.q_len;
  args.q = d_q.get();
  args.q_stride_batch = layout.batch;
  args.q_stride_seq = layout.seq;
  args.q_stride_head = layout.head;
  args.out = d_out.get();
  args.out_stride_batch = layout.batch;
  args.out_stride_seq = layout.seq;
  args.out_stride_head = layout.head;
  if (c.mask) {
    args.mask = static_cast<const bool*>(d_mask.get());
    args.mask_stride_batch = capacity;
  }
  if (c.lse) args.lse = static_cast<float*>(d_lse.get());
  Runtime::get().paged_decode(args);
  synchronize();
  const auto out = d_out.to_host<std::uint16_t>(layout.elements);
  const auto lse = d_lse.to_host<float>(lse_count);

  if (graph) check_graph_replay(paged_decode_call(args), &d_out, out, /*replays=*/2, c.describe());

  Verdict verdict(c.dtype);
  std::vector<char> written(out.size(), 0);
  const double scale = c.scale > 0 ? c.scale : 1.0 / std::sqrt(static_cast<double>(d));
  std::vector<float> k_rows, v_rows, q_row(d);
  std::vector<double> want;
  for (int b = 0; b < batch; ++b) {
    const int len = c.seq_lens[b];
    for (int kvh = 0; kvh < c.n_kv_heads; ++kvh) {
      // This request's keys and values of one KV head, [len][d].
      k_rows.assign(static_cast<std::size_t>(std::max(len, 1)) * d, 0.f);
      v_rows.assign(k_rows.size(), 0.f);
      for (int t = 0; t < len; ++t) {
        const std::int64_t base = static_cast<std::int64_t>(table[b * max_pages + t / ps]) * page_stride +
                                  (t % ps) * token_stride + kvh * head_stride;
        std::copy_n(k_value.begin() + base, d, k_rows.begin() + static_cast<std::size_t>(t) * d);
        std::copy_n(v_value.begin() + base, d, v_rows.begin() + static_cast<std::size_t>(t) * d);
      }
      for (int i = 0; i < c.q_len; ++i) {
        const std::vector<char> keep = decode_query_keep(len, c.q_len, i, c.features.window_left,
                                                         c.mask ? &mask[b * capacity] : nullptr);
        for (int h = kvh * c.group; h < (kvh + 1) * c.group; ++h) {
          const std::int64_t row = b * layout.batch + i * layout.seq + h * layout.head;
          for (int x = 0; x < d; ++x) q_row[x] = bits_to_float(q[row + x], c.dtype);
          RowFeatures features;
          features.logit_cap = c.features.logit_cap;
          if (c.features.sinks) features.sink = sinks[h];
          double want_lse = 0;
          const bool non_empty = attend_row(q_row.data(), k_rows.data(), v_rows.data(), len, keep, d, scale, &want,
                                            &want_lse, features);
          const std::size_t lse_at = (static_cast<std::size_t>(b) * c.q_len + i) * n_heads + h;
          check_row(&verdict, c.dtype, out, row, want, non_empty, c.lse ? &lse[lse_at] : nullptr, want_lse, {b, i, h});
          std::fill_n(written.begin() + row, d, 1);
        }
      }
    }
  }
  check_poison(&verdict, out, written);
  if (!c.lse) check_lse_untouched(&verdict.check, lse);
  report("paged_decode.q", c.dtype, c.describe(), &verdict);
}

// Lengths around q_len (fewer keys than new tokens, exactly as many), around the 64-token
// pipeline block and the page, and random ones.
std::vector<int> lengths(int q_len, int page_size, std::mt19937& rng) {
  std::uniform_int_distribution<int> random(2, 900);
  std::vector<int> lens = {0, 1, q_len - 1, q_len, q_len + 1, 63, 64, 65, page_size + q_len - 1, random(rng),
                           random(rng)};
  for (int& len : lens) len = std::max(len, 0);
  return lens;
}

}  // namespace

TEST_SUITE("multi_token") {

TEST_CASE("multi-token paged_decode matches the reference: q_len 1..8, GQA groups 1/4/8, page sizes 1 and 16") {
  std::mt19937 rng(test_seed(2026));
  for (int q_len : {1, 2, 3, 4, 5, 8}) {
    for (int group : {1, 4, 8}) {
      for (int page_size : {1, 16}) {
        MultiTokenCase c;
        c.q_len = q_len;
        c.group = group;
        c.n_kv_heads = group == 1 ? 3 : 2;
        c.page_size = page_size;
        c.dtype = (q_len + group) % 2 ? DType::fp16 : DType::bf16;
        c.head_dim = page_size == 1 ? 64 : 128;
        c.seq_lens = lengths(q_len, page_size, rng);
        c.seed = rng();
        check_case(c);
      }
    }
  }
}

TEST_CASE("multi-token paged_decode fills partial and several head tiles (group x q_len past 16 rows)") {
  std::mt19937 rng(test_seed(2027));
  struct Shape {
    int group, q_len, head_dim;
  };
  // 18 rows (one full tile and 2 rows), 40 rows (3 tiles), 64 rows (4 tiles), 7 rows, 48 rows.
  for (const Shape& shape :
       {Shape{6, 3, 128}, Shape{20, 2, 64}, Shape{8, 8, 128}, Shape{1, 7, 80}, Shape{16, 3, 256}}) {
    MultiTokenCase c;
    c.group = shape.group;
    c.q_len = shape.q_len;
    c.head_dim = shape.head_dim;
    c.n_kv_heads = 2;
    c.seq_lens = lengths(shape.q_len, 16, rng);
    c.seed = rng();
    check_case(c);
  }
}

TEST_CASE("multi-token paged_decode splits long sequences and merges q_len rows per head") {
  MultiTokenCase c;  // group 4 x q4: one tile, K and V read once
  c.n_kv_heads = 8;
  c.seq_lens = {32768, 3, 0, 5000, 4};
  check_case(c);
  MultiTokenCase two;  // group 8 x q4: two tiles
  two.group = 8;
  two.seq_lens = {20000, 1, 64};
  two.seed = test_seed(2);
  check_case(two);
  MultiTokenCase wide;  // a wide table over short sequences: most splits empty for every row
  wide.q_len = 8;
  wide.group = 1;
  wide.page_size = 1;
  wide.head_dim = 64;
  wide.extra_pages = 30000;
  wide.seq_lens = {7, 8, 9, 200};
  wide.seed = test_seed(3);
  check_case(wide);
}

TEST_CASE("multi-token paged_decode with bhld q and out, padded rows, and without LSE") {
  std::mt19937 rng(test_seed(2028));
  for (int q_len : {2, 6}) {
    for (int page_size : {1, 16}) {
      MultiTokenCase c;
      c.q_len = q_len;
      c.page_size = page_size;
      c.bhld = true;
      c.lse = page_size == 16;
      c.group = q_len == 2 ? 8 : 4;
      c.seq_lens = lengths(q_len, page_size, rng);
      c.seq_lens.push_back(9000);
      c.seed = rng();
      check_case(c);
    }
  }
}

TEST_CASE("multi-token paged_decode with a mask shared by a request's tokens, one request fully masked") {
  std::mt19937 rng(test_seed(2029));
  for (int page_size : {1, 16}) {
    MultiTokenCase c;
    c.page_size = page_size;
    c.q_len = page_size == 1 ? 3 : 4;
    c.group = page_size == 1 ? 6 : 4;
    c.mask = true;
    c.seq_lens = lengths(c.q_len, page_size, rng);
    c.seq_lens.insert(c.seq_lens.begin(), 300);  // request 0 keeps nothing: zeros, LSE -inf
    c.seq_lens.push_back(20000);                 // split: the combine merges masked splits
    c.seed = rng();
    check_case(c);
  }
}

TEST_CASE("multi-token paged_decode with a sliding window per query, sinks and the soft-cap") {
  std::mt19937 rng(test_seed(2030));
  // Windows shorter than q_len, around the page and the block, longer than the sequence.
  for (int window : {0, 1, 3, 15, 16, 17, 63, 100, 1000, 5000}) {
    for (int q_len : {2, 4, 8}) {
      MultiTokenCase c;
      c.q_len = q_len;
      c.page_size = window % 2 ? 16 : 1;
      c.group = q_len == 8 ? 1 : 4;
      c.head_dim = c.page_size == 1 ? 64 : 128;
      c.features.window_left = window;
      c.features.sinks = (window + q_len) % 3 == 0;  // sinks + window, as gpt-oss
      c.features.logit_cap = window == 16 ? 5.f : 0.f;
      c.scale = c.features.logit_cap > 0 ? 1.f : 0.f;
      c.seq_lens = lengths(q_len, c.page_size, rng);
      c.seq_lens.push_back(3000 + static_cast<int>(rng() % 200));
      c.seed = rng();
      check_case(c);
    }
  }
  MultiTokenCase split;  // a window over a long table: several splits, all inside the window
  split.n_kv_heads = 1;
  split.group = 8;
  split.q_len = 4;
  split.features.window_left = 8191;
  split.features.sinks = true;
  split.features.logit_cap = 5.f;
  split.seq_lens = {60000, 8192, 8195, 100, 2};
  split.seed = test_seed(11);
  check_case(split);
}

TEST_CASE("multi-token paged_decode with attention sinks: rows with nothing to attend to give LSE = sink") {
  std::mt19937 rng(test_seed(2031));
  for (int q_len : {3, 8}) {
    for (bool cap : {false, true}) {
      MultiTokenCase c;
      c.q_len = q_len;
      c.group = 6;
      c.page_size = cap ? 1 : 16;
      c.features.sinks = true;
      c.features.logit_cap = cap ? 5.f : 0.f;
      c.seq_lens = {0, 1, 2, q_len - 1, q_len, 40000};
      c.seed = rng();
      check_case(c);
    }
  }
}

TEST_CASE("multi-token paged_decode over an FP8 cache (e4m3, e5m2), per tensor and per head, with the window") {
  std::mt19937 rng(test_seed(2032));
  for (KvDType kv : {KvDType::e4m3, KvDType::e5m2}) {
    for (int group : {4, 8}) {
      for (int page_size : {1, 16}) {
        MultiTokenCase c;
        c.kv = kv;
        c.per_head = page_size == 16;
        c.q_len = group == 4 ? 4 : 3;
        c.group = group;
        c.page_size = page_size;
        c.dtype = group == 8 ? DType::fp16 : DType::bf16;
        c.head_dim = page_size == 1 ? 64 : 128;
        c.features.window_left = group == 8 && page_size == 16 ? 200 : -1;
        c.features.sinks = kv == KvDType::e5m2 && group == 4;
        c.seq_lens = lengths(c.q_len, page_size, rng);
        c.seq_lens.push_back(12000);
        c.seed = rng();
        check_case(c);
      }
    }
  }
  MultiTokenCase bhld;
  bhld.kv = KvDType::e4m3;
  bhld.q_len = 8;
  bhld.group = 2;
  bhld.bhld = true;
  bhld.seq_lens = {5, 8, 9, 4097};
  bhld.seed = test_seed(7);
  check_case(bhld);
}

TEST_CASE("multi-token paged_decode with peaked rows whose maximum rises along the keys, through the split merge") {
  std::mt19937 rng(test_seed(2033));
  for (int q_len : {2, 5}) {
    for (float ramp : {2.f, 6.f}) {
      MultiTokenCase c;
      c.q_len = q_len;
      c.dtype = ramp > 3.f ? DType::fp16 : DType::bf16;
      c.scale = 1.f;
      c.key_ramp = ramp;
      c.features.sinks = q_len == 5;
      c.seq_lens = lengths(q_len, 16, rng);
      c.seq_lens.push_back(30000);  // split: the merge rescales earlier, lower splits
      c.seed = rng();
      check_case(c);
    }
  }
}

TEST_CASE("multi-token paged_decode captured in a CUDA graph replays bit for bit") {
  MultiTokenCase c;
  c.seq_lens = {3000, 17, 2, 0};
  c.seed = test_seed(5);
  check_case(c, /*graph=*/true);
  MultiTokenCase everything;
  everything.q_len = 6;
  everything.group = 8;
  everything.page_size = 1;
  everything.head_dim = 64;
  everything.mask = true;
  everything.kv = KvDType::e4m3;
  everything.features.window_left = 700;
  everything.features.sinks = true;
  everything.seq_lens = {40000, 64, 5};
  everything.seed = test_seed(6);
  check_case(everything, /*graph=*/true);
}

TEST_CASE("multi-token paged_decode random sweep") {
  // 16 random cases over pooled variants, then ASTRAI_TEST_SWEEP more (default 16).
  const unsigned seed = test_seed(4242);
  std::mt19937 rng(seed);
  MESSAGE(fmt::format("multi-token random sweep seed {}", seed));
  const int total = 16 + sweep_count(16);
  for (int i = 0; i < total; ++i) {
    MultiTokenCase c;
    c.q_len = 1 + static_cast<int>(rng() % 8);
    c.group = std::vector<int>{1, 4, 8}[rng() % 3];
    c.n_kv_heads = 1 + static_cast<int>(rng() % 3);
    c.page_size = rng() % 2 ? 16 : 1;
    c.head_dim = c.page_size == 1 ? 64 : 128;
    c.bhld = rng() % 4 == 0;
    c.mask = rng() % 4 == 0;
    c.kv = rng() % 5 == 0 ? KvDType::e4m3 : KvDType::same;
    c.features.window_left = rng() % 3 == 0 ? static_cast<int>(rng() % 300) : -1;
    c.features.sinks = rng() % 4 == 0;
    if (!c.fp8() && rng() % 4 == 0) {  // a peaked row now and then
      c.scale = 1.f;
      c.key_ramp = 4.f;
    }
    const int batch = 1 + static_cast<int>(rng() % 5);
    for (int b = 0; b < batch; ++b)
      c.seq_lens.push_back(rng() % 3 == 0 ? static_cast<int>(rng() % 10) : static_cast<int>(rng() % 2000));
    c.seed = rng();
    check_case(c);
  }
}

}  // TEST_SUITE
}  // namespace astrai::gpu_test
