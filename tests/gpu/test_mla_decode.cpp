// MLA decode (absorbed form) against a float64 reference: 576-wide query rows against one latent
// KV head whose rows are both K (576) and V (their first 512 dims). Every page size the issue
// names, head counts from 1 to 128 (partial row tiles), q_len 1..8 (causal among the new tokens),
// lengths 0, 1, block and page edges and long rows through the split merge, peaked rows whose
// maximum rises along the keys, padded strides, int64 tables and offsets; outputs and LSE
// poisoned, everything outside the rows checked untouched.
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

constexpr int kMlaQk = 576;
constexpr int kMlaV = 512;

struct MlaCase {
  DType dtype = DType::bf16;
  int q_len = 1;
  int n_heads = 16;
  int page_size = 64;
  std::vector<int> seq_lens;  // the new tokens included
  int extra_pages = 1;        // table columns past the longest sequence (a wider table splits more)
  bool padded = false;        // q, out and cache rows padded, batches apart
  bool lse = true;
  bool wide_tables = false;   // int64 page table and lengths
  bool offsets = false;       // lengths as [batch + 1] offsets
  float scale = 0.07216878f;  // 1/sqrt(192), DeepSeek-V3's
  float key_ramp = 0.f;       // > 0: key t scaled by key_gain, peaked rows
  KvDType kv = KvDType::same;  // e4m3 / e5m2: an FP8 cache with one scale
  unsigned seed = test_seed(31);

  int batch() const { return static_cast<int>(seq_lens.size()); }
  std::string describe() const {
    return fmt::format("mla_decode dtype={} kv={} q_len={} heads={} ps={} extra_pages={} padded={} lse={} wide={} "
                       "offsets={} scale={} key_ramp={} seed={} lens=[{}]",
                       dtype_name(dtype), kv_dtype_name(kv), q_len, n_heads, page_size, extra_pages, padded, lse,
                       wide_tables, offsets, scale, key_ramp, seed, fmt::join(seq_lens, ","));
  }
};

template <typename T>
std::vector<T> widened_table(const std::vector<std::int32_t>& values) {
  return std::vector<T>(values.begin(), values.end());
}

void check_mla_case(const MlaCase& c, bool graph = false) {
  std::mt19937 rng(c.seed);
  const int batch = c.batch();
  const int ps = c.page_size;
  PageTableShape shape;
  shape.extra_pages = c.extra_pages;
  const PageTable pages = make_page_table(c.seq_lens, ps, shape, rng);
  const int max_pages = pages.max_pages;

  const bool fp8 = c.kv != KvDType::same;
  const std::int64_t token_stride = c.padded ? kMlaQk + 64 : kMlaQk;
  const std::int64_t page_stride = ps * token_stride + (c.padded ? 16 : 0);
  const std::size_t pool_elems = static_cast<std::size_t>(pages.num_pages) * page_stride;
  std::vector<std::uint16_t> kv = random_elements(pool_elems, c.dtype, rng);
  if (c.key_ramp > 0)
    for (int b = 0; b < batch; ++b)
      for (int t = 0; t < c.seq_lens[b]; ++t)
        scale_elements(&kv[pages.table[b * pages.stride + t / ps] * page_stride + (t % ps) * token_stride], kMlaQk,
                       key_gain(t, c.seq_lens[b], c.key_ramp), c.dtype);
  // The rows of a request's last page past its length hold NaN: no kernel may let them into P V
  // (0 x NaN is NaN), whether it loads them or not.
  if (!fp8) {
    const std::uint16_t nan_bits = c.dtype == DType::bf16 ? 0x7fc0 : 0x7e00;
    for (int b = 0; b < batch; ++b)
      for (int t = c.seq_lens[b]; t % ps != 0; ++t)
        std::fill_n(&kv[pages.table[b * pages.stride + t / ps] * page_stride + (t % ps) * token_stride], kMlaQk,
                    nan_bits);
  }
  // The cache's values as the kernel reads them: the 16-bit elements, or an FP8 cache's codes
  // times its scale (codes drawn from the same values over the scale, rounded and saturated).
  std::vector<float> kv_value(pool_elems);
  std::vector<std::uint8_t> kv8;
  const std::vector<float> kv_scale = {fp8 ? 0.25f + std::uniform_real_distribution<float>(0.f, 1.f)(rng) : 1.f};
  if (fp8) {
    kv8.resize(pool_elems);
    for (std::size_t i = 0; i < pool_elems; ++i) {
      kv8[i] = testing::float_to_fp8(bits_to_float(kv[i], c.dtype) / kv_scale[0], c.kv);
      kv_value[i] = testing::fp8_to_float(kv8[i], c.kv) * kv_scale[0];
    }
  } else {
    for (std::size_t i = 0; i < pool_elems; ++i) kv_value[i] = bits_to_float(kv[i], c.dtype);
  }

  // q [batch, q_len, heads, 576] and out [batch, q_len, heads, 512], rows padded when asked.
  const std::int64_t q_head = c.padded ? kMlaQk + 8 : kMlaQk;
  const std::int64_t q_seq = c.n_heads * q_head;
  const std::int64_t q_batch = c.q_len * q_seq + (c.padded ? 16 : 0);
  const std::int64_t o_head = c.padded ? kMlaV + 8 : kMlaV;
  const std::int64_t o_seq = c.n_heads * o_head;
  const std::int64_t o_batch = c.q_len * o_seq + (c.padded ? 16 : 0);
  const std::size_t q_elems = static_cast<std::size_t>(std::max(batch, 1)) * q_batch;
  const std::size_t o_elems = static_cast<std::size_t>(std::max(batch, 1)) * o_batch;
  const std::vector<std::uint16_t> q = random_elements(q_elems, c.dtype, rng);

  std::vector<std::int32_t> lens = c.seq_lens;
  if (c.offsets) {
    lens.assign(1, 3);  // offsets need not start at 0
    for (int len : c.seq_lens) lens.push_back(lens.back() + len);
  }
  DeviceBuffer d_kv = fp8 ? DeviceBuffer::from(kv8) : DeviceBuffer::from(kv);
  DeviceBuffer d_kv_scale = DeviceBuffer::from(kv_scale);
  DeviceBuffer d_q = DeviceBuffer::from(q);
  DeviceBuffer d_table = c.wide_tables ? DeviceBuffer::from(widened_table<std::int64_t>(pages.table)) : DeviceBuffer::from(pages.table);
  DeviceBuffer d_lens = c.wide_tables ? DeviceBuffer::from(widened_table<std::int64_t>(lens)) : DeviceBuffer::from(lens);
  const std::size_t lse_count = static_cast<std::size_t>(std::max(1, batch)) * c.q_len * c.n_heads;
  DeviceBuffer d_out(o_elems * 2);
  DeviceBuffer d_lse(lse_count * sizeof(float));
  d_out.fill_byte(0xff);  // poison: every row element must be written, nothing else
  d_lse.fill_byte(0xff);

  MlaDecodeArgs args;
  args.dtype = c.dtype;
  args.batch = batch;
  args.q_len = c.q_len;
  args.n_heads = c.n_heads;
  args.page_size = ps;
  args.num_pages = pages.num_pages;
  args.max_pages_per_seq = max_pages;
  args.page_table_stride = pages.stride;
  args.scale = c.scale;
  args.q = d_q.get();
  args.q_stride_batch = q_batch;
  args.q_stride_seq = q_seq;
  args.q_stride_head = q_head;
  args.kv_cache = d_kv.get();
  args.kv_stride_page = page_stride;
  args.kv_stride_token = token_stride;
  if (c.wide_tables) {
    args.page_table = static_cast<const std::int64_t*>(d_table.get());
    args.seq_lens = static_cast<const std::int64_t*>(d_lens.get());
  } else {
    args.page_table = static_cast<const std::int32_t*>(d_table.get());
    args.seq_lens = static_cast<const std::int32_t*>(d_lens.get());
  }
  args.seq_lens_are_offsets = c.offsets;
  if (fp8) {
    args.kv_dtype = c.kv;
    args.kv_scale = static_cast<const float*>(d_kv_scale.get());
  }
  args.out = d_out.get();
  args.out_stride_batch = o_batch;
  args.out_stride_seq = o_seq;
  args.out_stride_head = o_head;
  if (c.lse) args.lse = static_cast<float*>(d_lse.get());
  if (mma_forced_off() || device_compute_capability() < 80) {
    // No CUDA-core path: the call refuses by name and writes nothing.
    CHECK_THROWS_WITH_AS(Runtime::get().mla_decode(args), doctest::Contains("needs tensor cores"), InvalidArgument);
    CHECK(d_out.to_host<std::uint16_t>(o_elems) == std::vector<std::uint16_t>(o_elems, kPoison));
    return;
  }
  Runtime::get().mla_decode(args);
  synchronize();
  const auto out = d_out.to_host<std::uint16_t>(o_elems);
  const auto lse = d_lse.to_host<float>(lse_count);
  if (graph) {
    const auto call = [args](CUstream stream) mutable {
      args.stream = stream;
      Runtime::get().mla_decode(args);
    };
    check_graph_replay(call, &d_out, out, /*replays=*/2, c.describe());
  }

  Verdict verdict(c.dtype);
  std::vector<char> written(out.size(), 0);
  std::vector<float> rows, q_row(kMlaQk);
  std::vector<double> want;
  for (int b = 0; b < batch; ++b) {
    const int len = c.seq_lens[b];
    rows.assign(static_cast<std::size_t>(std::max(len, 1)) * kMlaQk, 0.f);
    for (int t = 0; t < len; ++t) {
      const std::int64_t base = static_cast<std::int64_t>(pages.table[b * pages.stride + t / ps]) * page_stride +
                                (t % ps) * token_stride;
      std::copy_n(kv_value.begin() + base, kMlaQk, rows.begin() + static_cast<std::size_t>(t) * kMlaQk);
    }
    for (int i = 0; i < c.q_len; ++i) {
      const std::vector<char> keep = decode_query_keep(len, c.q_len, i, -1, nullptr);
      for (int h = 0; h < c.n_heads; ++h) {
        const std::int64_t q_at = b * q_batch + i * q_seq + h * q_head;
        for (int x = 0; x < kMlaQk; ++x) q_row[x] = bits_to_float(q[q_at + x], c.dtype);
        double want_lse = 0, lse_slack = 0;
        // V is a row's first 512 dims: attention with V = K, then its first 512 outputs.
        const bool non_empty = attend_row(q_row.data(), rows.data(), rows.data(), len, keep, kMlaQk, c.scale, &want,
                                          &want_lse, {}, &lse_slack);
        want.resize(kMlaV);
        const std::int64_t o_at = b * o_batch + i * o_seq + h * o_head;
        const std::size_t lse_at = (static_cast<std::size_t>(b) * c.q_len + i) * c.n_heads + h;
        check_row(&verdict, c.dtype, out, o_at, want, non_empty, c.lse ? &lse[lse_at] : nullptr, want_lse, {b, i, h},
                  lse_slack);
        std::fill_n(written.begin() + o_at, kMlaV, 1);
      }
    }
  }
  check_poison(&verdict, out, written);
  if (!c.lse) check_lse_untouched(&verdict.check, lse);
  report("mla_decode", c.dtype, c.describe(), &verdict);
}

// Lengths at the edges: none, one, fewer keys than new tokens, the 16- and 32-key blocks and
// the page, and random ones.
std::vector<int> mla_lengths(int q_len, int page_size, std::mt19937& rng) {
  std::uniform_int_distribution<int> random(2, 700);
  std::vector<int> lens = {0, 1, q_len - 1, q_len, 15, 16, 17, 31, 32, 33, page_size + 1, random(rng), random(rng)};
  for (int& len : lens) len = std::max(len, 0);
  return lens;
}

}  // namespace

TEST_SUITE("mla_decode") {

TEST_CASE("mla_decode matches the reference: page sizes 1/16/32/64, heads 16 and 128, both dtypes") {
  std::mt19937 rng(test_seed(3101));
  for (int page_size : {1, 16, 32, 64}) {
    for (int n_heads : {16, 128}) {
      MlaCase c;
      c.page_size = page_size;
      c.n_heads = n_heads;
      c.dtype = (page_size + n_heads / 16) % 2 ? DType::fp16 : DType::bf16;
      c.seq_lens = mla_lengths(1, page_size, rng);
      c.seed = rng();
      check_mla_case(c);
    }
  }
}

TEST_CASE("mla_decode with partial row tiles: 1, 20, 40 and 100 heads, q_len 1..8") {
  std::mt19937 rng(test_seed(3102));
  struct Shape {
    int heads, q_len;
  };
  for (const Shape& shape : {Shape{1, 1}, Shape{20, 1}, Shape{40, 3}, Shape{100, 1}, Shape{16, 2}, Shape{16, 8},
                             Shape{128, 4}, Shape{1, 7}, Shape{24, 5}}) {
    MlaCase c;
    c.n_heads = shape.heads;
    c.q_len = shape.q_len;
    c.page_size = shape.heads % 2 ? 1 : 64;
    c.seq_lens = mla_lengths(shape.q_len, c.page_size, rng);
    c.seed = rng();
    check_mla_case(c);
  }
}

TEST_CASE("mla_decode splits long rows (batch 1 and 2) and merges them, multi-token too") {
  MlaCase c;
  c.seq_lens = {8192};
  check_mla_case(c);
  MlaCase two;
  two.n_heads = 128;
  two.q_len = 2;
  two.seq_lens = {5000, 3};
  two.seed = test_seed(32);
  check_mla_case(two);
  MlaCase wide;  // a wide table over short rows: most splits empty
  wide.page_size = 1;
  wide.extra_pages = 20000;
  wide.seq_lens = {7, 1, 0};
  wide.seed = test_seed(33);
  check_mla_case(wide);
}

TEST_CASE("mla_decode with peaked rows whose maximum rises along the keys") {
  for (int q_len : {1, 4}) {
    MlaCase c;
    c.q_len = q_len;
    c.scale = 1.f;
    c.key_ramp = 4.f;
    c.seq_lens = {3000, 200, 33};
    c.seed = test_seed(34 + q_len);
    check_mla_case(c);
  }
}

TEST_CASE("mla_decode with padded strides, int64 tables, offsets and without LSE") {
  std::mt19937 rng(test_seed(3103));
  for (int variant = 0; variant < 4; ++variant) {
    MlaCase c;
    c.padded = variant != 1;
    c.wide_tables = variant % 2 == 1;
    c.offsets = variant >= 2;
    c.lse = variant != 3;
    c.q_len = 1 + variant;
    c.page_size = variant == 2 ? 16 : 64;
    c.dtype = variant % 2 ? DType::fp16 : DType::bf16;
    c.seq_lens = {static_cast<int>(rng() % 900), 0, 65, static_cast<int>(rng() % 3000)};
    c.seed = rng();
    check_mla_case(c);
  }
}

TEST_CASE("mla_decode over an FP8 cache (e4m3, e5m2): every page size, q_len 1 and 3, splits, peaked rows") {
  std::mt19937 rng(test_seed(3105));
  int i = 0;
  for (KvDType kv : {KvDType::e4m3, KvDType::e5m2}) {
    for (int page_size : {1, 16, 32, 64}) {
      MlaCase c;
      c.kv = kv;
      c.page_size = page_size;
      c.n_heads = page_size == 64 ? 128 : 16;
      c.q_len = i % 3 == 1 ? 3 : 1;
      c.dtype = i % 2 ? DType::fp16 : DType::bf16;
      c.padded = i % 4 == 2;
      c.seq_lens = mla_lengths(c.q_len, page_size, rng);
      c.seed = rng();
      check_mla_case(c);
      ++i;
    }
  }
  MlaCase split;
  split.kv = KvDType::e4m3;
  split.seq_lens = {8192, 100};
  split.seed = test_seed(39);
  check_mla_case(split);
  MlaCase peaked;
  peaked.kv = KvDType::e4m3;
  peaked.scale = 1.f;
  peaked.key_ramp = 4.f;
  peaked.seq_lens = {3000, 33};
  peaked.seed = test_seed(40);
  check_mla_case(peaked);
}

TEST_CASE("mla_decode captured in a CUDA graph replays bit for bit") {
  MlaCase c;
  c.n_heads = 128;
  c.seq_lens = {4000, 17, 0};
  c.seed = test_seed(38);
  check_mla_case(c, /*graph=*/true);
}

TEST_CASE("mla_decode random sweep") {
  const unsigned seed = test_seed(3104);
  std::mt19937 rng(seed);
  MESSAGE(fmt::format("mla_decode random sweep seed {}", seed));
  const int total = 8 + sweep_count(8);
  for (int i = 0; i < total; ++i) {
    MlaCase c;
    c.dtype = rng() % 2 ? DType::fp16 : DType::bf16;
    c.q_len = rng() % 3 == 0 ? 1 + static_cast<int>(rng() % 8) : 1;
    c.n_heads = std::vector<int>{1, 16, 32, 64, 128, 24}[rng() % 6];
    c.page_size = std::vector<int>{1, 16, 32, 64}[rng() % 4];
    c.padded = rng() % 3 == 0;
    c.kv = rng() % 4 == 0 ? KvDType::e4m3 : KvDType::same;
    if (rng() % 4 == 0) {
      c.scale = 1.f;
      c.key_ramp = 4.f;
    }
    const int batch = 1 + static_cast<int>(rng() % 4);
    for (int b = 0; b < batch; ++b)
      c.seq_lens.push_back(rng() % 4 == 0 ? static_cast<int>(rng() % 10) : static_cast<int>(rng() % 3000));
    c.seed = rng();
    check_mla_case(c);
  }
}

}  // TEST_SUITE
}  // namespace astrai::gpu_test
