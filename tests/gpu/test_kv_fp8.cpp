// FP8 KV caches (e4m3, e5m2) in paged_decode, decode and paged_prefill against a float64
// reference over the dequantized cache (fp8_to_float(code) * scale), output poisoned first.
// The fused append must write exactly the host codec's bytes and attend to them.
//
// The kernels widen and quantize FP8 with cvt from sm_89 on and with bit operations before.
// To run the pre-sm_89 conversions on an sm_89 or sm_90 GPU (an H200), compile PTX for an older
// virtual arch, which the driver finishes for the device (variants named ...compute_80):
//   ASTRAI_JIT_ARCH=compute_80 build/tests/astrai_gpu_tests -ts=kv_fp8
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

using testing::float_to_fp8;
using testing::fp8_to_float;

enum class Fp8Call { paged_decode, decode, paged_prefill };

const char* call_name(Fp8Call call) {
  return call == Fp8Call::paged_decode ? "paged_decode" : call == Fp8Call::decode ? "decode" : "paged_prefill";
}

struct Fp8Case {
  Fp8Call call = Fp8Call::paged_decode;
  DType dtype = DType::bf16;
  KvDType format = KvDType::e4m3;
  int head_dim = 128;
  int n_kv_heads = 2;
  int group = 4;
  int page_size = 16;            // paged calls
  std::vector<int> seq_lens;     // KV length per request (decode: every request uses kv_len)
  std::vector<int> q_lens;       // paged_prefill: query rows per request
  int kv_len = 0;                // decode
  int causal_offset = -1;        // decode
  bool per_head = false;         // one scale per KV head, else one per tensor
  bool padded = false;           // K/V head strides padded by 16 bytes, Q/out by 8 elements
  bool append = false;           // paged_decode: fused append, quantized into the cache
  bool lse = true;
  float scale = 0.f;             // 0: 1/sqrt(head_dim); 1 gives peaked rows
  float q_magnitude = 1.f;       // odd query heads' values scaled by it (bf16 past f16's range)
  CaseFeatures features;
  unsigned seed = test_seed(1);

  int batch() const { return static_cast<int>(seq_lens.size()); }
  std::string describe() const {
    return fmt::format("{} kv={} dtype={} hd={} ps={} kv_heads={} group={} per_head={} padded={} append={} "
                       "seed={} lens=[{}]{}{}{}", call_name(call), kv_dtype_name(format), dtype_name(dtype), head_dim,
                       call == Fp8Call::decode ? 0 : page_size, n_kv_heads, group, per_head, padded, append, seed,
                       fmt::join(seq_lens, ","),
                       q_lens.empty() ? "" : fmt::format(" q_lens=[{}]", fmt::join(q_lens, ",")),
                       call == Fp8Call::decode ? fmt::format(" kv_len={} causal_offset={}", kv_len, causal_offset) : "",
                       (scale > 0 ? fmt::format(" scale={}", scale) : "") +
                           (q_magnitude != 1.f ? fmt::format(" q_magnitude={}", q_magnitude) : "") + features.text());
  }
};

// Q of `elements` elements, heads `head_stride` apart: random values, every odd head's scaled by
// q_magnitude.
std::vector<std::uint16_t> make_query(std::size_t elements, std::int64_t head_stride, int n_heads, const Fp8Case& c,
                                      std::mt19937& rng) {
  std::vector<std::uint16_t> q = random_elements(elements, c.dtype, rng);
  if (c.q_magnitude != 1.f) {
    for (std::size_t i = 0; i < q.size(); ++i)
      if (i / static_cast<std::size_t>(head_stride) % n_heads % 2 == 1)
        q[i] = float_to_bits(bits_to_float(q[i], c.dtype) * c.q_magnitude, c.dtype);
  }
  return q;
}

// A cache of `rows` rows of n_kv_heads heads (head stride `head_stride` bytes): random values
// in [-1, 1) quantized with the head's scale; bytes between heads are random too.
std::vector<std::uint8_t> make_cache(std::size_t bytes, const Fp8Case& c, const std::vector<float>& scales,
                                     std::int64_t head_stride, std::mt19937& rng) {
  std::uniform_real_distribution<float> uniform(-1.f, 1.f);
  std::vector<std::uint8_t> cache(bytes);
  for (std::size_t i = 0; i < bytes; ++i) {
    const int kv_head = static_cast<int>((i / head_stride) % c.n_kv_heads);
    cache[i] = float_to_fp8(uniform(rng) / scale_of(scales, kv_head), c.format);
  }
  return cache;
}

// Dequantized rows [n][d] of one KV head: `offset(t)` is the byte offset of token t's row.
template <typename Offset>
std::vector<float> dequantized_rows(const std::vector<std::uint8_t>& cache, int n, int d, float scale,
                                    KvDType format, Offset offset) {
  std::vector<float> rows(static_cast<std::size_t>(std::max(n, 1)) * d, 0.f);
  for (int t = 0; t < n; ++t) {
    const std::int64_t base = offset(t);
    for (int i = 0; i < d; ++i)
      rows[static_cast<std::size_t>(t) * d + i] = fp8_to_float(cache[base + i], format) * scale;
  }
  return rows;
}

// Compares one query row's output and LSE with the reference, and marks the row written.
void compare_row(RowCheck* check, std::vector<char>* written, const std::vector<std::uint16_t>& out,
                 std::int64_t out_base, const std::vector<float>& lse, std::int64_t lse_index, bool check_lse,
                 DType dtype, const std::vector<double>& want, bool non_empty, double want_lse,
                 const std::string& where) {
  const auto at = [&] { return where; };
  check->row_bits(&out[out_base], dtype, want.data(), static_cast<int>(want.size()), non_empty, at);
  std::fill_n(written->begin() + out_base, want.size(), 1);
  if (check_lse) check->lse(lse[lse_index], want_lse, at);
}

double case_scale(const Fp8Case& c) { return c.scale > 0 ? c.scale : 1.0 / std::sqrt(static_cast<double>(c.head_dim)); }

RowCheck run_paged_decode(const Fp8Case& c) {
  std::mt19937 rng(c.seed);
  const int batch = c.batch();
  const int n_heads = c.n_kv_heads * c.group;
  const int d = c.head_dim;
  const int ps = c.page_size;
  const PageTable pages = make_page_table(c.seq_lens, ps, PageTableShape(), rng);
  const int max_pages = pages.max_pages;
  const int num_pages = pages.num_pages;
  const std::vector<std::int32_t>& table = pages.table;

  const std::int64_t head_stride = d + (c.padded ? 16 : 0);
  const std::int64_t token_stride = c.n_kv_heads * head_stride;
  const std::int64_t page_stride = ps * token_stride;
  const std::size_t pool_bytes = static_cast<std::size_t>(num_pages) * page_stride;
  const std::vector<float> k_scales = kv_scales(c.per_head, c.n_kv_heads, rng);
  const std::vector<float> v_scales = kv_scales(c.per_head, c.n_kv_heads, rng);
  std::vector<std::uint8_t> k_pool = make_cache(pool_bytes, c, k_scales, head_stride, rng);
  std::vector<std::uint8_t> v_pool = make_cache(pool_bytes, c, v_scales, head_stride, rng);

  const std::int64_t q_head_stride = d + (c.padded ? 8 : 0);
  const std::int64_t q_batch_stride = n_heads * q_head_stride;
  const std::vector<std::uint16_t> q = make_query(std::max(1, batch) * q_batch_stride, q_head_stride, n_heads, c, rng);
  const std::size_t out_elems = static_cast<std::size_t>(std::max(1, batch)) * q_batch_stride;
  // The appended token: values in [-1, 1), and per row one beyond the K range and one far
  // beyond the V range, so that the quantization saturates.
  const std::int64_t new_batch_stride = c.n_kv_heads * static_cast<std::int64_t>(d);
  std::vector<std::uint16_t> new_k, new_v;
  if (c.append) {
    new_k = random_elements(std::max(1, batch) * new_batch_stride, c.dtype, rng);
    new_v = random_elements(std::max(1, batch) * new_batch_stride, c.dtype, rng);
    for (std::int64_t row = 0; row < std::max(1, batch) * c.n_kv_heads; ++row) {
      new_k[row * d] = float_to_bits(row % 2 ? -6.f : 6.f, c.dtype);
      new_v[row * d + 1] = float_to_bits(row % 2 ? 1000.f : -1000.f, c.dtype);
    }
  }

  DeviceBuffer d_q = DeviceBuffer::from(q);
  DeviceBuffer d_k = DeviceBuffer::from(k_pool);
  DeviceBuffer d_v = DeviceBuffer::from(v_pool);
  DeviceBuffer d_table = DeviceBuffer::from(table);
  DeviceBuffer d_lens = DeviceBuffer::from(c.seq_lens);
  DeviceBuffer d_k_scales = DeviceBuffer::from(k_scales);
  DeviceBuffer d_v_scales = DeviceBuffer::from(v_scales);
  DeviceBuffer d_new_k = DeviceBuffer::from(new_k);
  DeviceBuffer d_new_v = DeviceBuffer::from(new_v);
  const std::vector<float> sinks = sink_values(n_heads, c.seed);
  DeviceBuffer d_sinks = DeviceBuffer::from(sinks);
  DeviceBuffer d_out(out_elems * 2);
  d_out.fill_byte(0xff);
  DeviceBuffer d_lse(std::max(1, batch * n_heads) * sizeof(float));
  d_lse.fill_byte(0xff);

  const KvPool pool{d_k.get(), d_v.get(), page_stride, token_stride, head_stride};
  PagedDecodeArgs args = paged_decode_args(c, pages, d_table, d_lens, d_sinks, pool);
  args.scale = c.scale;
  args.kv_dtype = c.format;
  args.k_scale = static_cast<const float*>(d_k_scales.get());
  args.v_scale = static_cast<const float*>(d_v_scales.get());
  args.kv_scale_per_head = c.per_head;
  args.q = d_q.get();
  args.q_stride_batch = q_batch_stride;
  args.q_stride_head = q_head_stride;
  args.out = d_out.get();
  args.out_stride_batch = q_batch_stride;
  args.out_stride_head = q_head_stride;
  if (c.append) {
    args.new_k = d_new_k.get();
    args.new_v = d_new_v.get();
  }
  if (c.lse) args.lse = static_cast<float*>(d_lse.get());
  Runtime::get().paged_decode(args);
  synchronize();
  const auto out = d_out.to_host<std::uint16_t>(out_elems);
  const auto lse = d_lse.to_host<float>(std::max(1, batch * n_heads));

  RowCheck check(testing::attention_tolerance(c.dtype));
  std::vector<char> written(out.size(), 0);
  auto slot_offset = [&](int b, int t, int kv_head) {
    return static_cast<std::int64_t>(table[b * max_pages + t / ps]) * page_stride + (t % ps) * token_stride +
           kv_head * head_stride;
  };
  if (c.append) {
    // The cache holds the host codec's bytes of new / scale at slot seq_len - 1, and nothing
    // else changed.
    const auto k_after = d_k.to_host<std::uint8_t>(pool_bytes);
    const auto v_after = d_v.to_host<std::uint8_t>(pool_bytes);
    for (int b = 0; b < batch; ++b) {
      const int t = c.seq_lens[b] - 1;
      if (t < 0) continue;
      for (int kvh = 0; kvh < c.n_kv_heads; ++kvh)
        for (int i = 0; i < d; ++i) {
          const std::int64_t at = slot_offset(b, t, kvh) + i;
          const std::int64_t from = b * new_batch_stride + kvh * d + i;
          k_pool[at] = float_to_fp8(bits_to_float(new_k[from], c.dtype) / scale_of(k_scales, kvh), c.format);
          v_pool[at] = float_to_fp8(bits_to_float(new_v[from], c.dtype) / scale_of(v_scales, kvh), c.format);
        }
    }
    check.expect(k_after == k_pool && v_after == v_pool, [&] {
      std::size_t first = 0;
      while (first < pool_bytes && k_after[first] == k_pool[first] && v_after[first] == v_pool[first]) ++first;
      return fmt::format("cache after the append differs at byte {}: K {:#04x} want {:#04x}, V {:#04x} want {:#04x}",
                         first, k_after[first], k_pool[first], v_after[first], v_pool[first]);
    });
  }

  const double scale = case_scale(c);
  std::vector<double> want;
  for (int b = 0; b < batch; ++b) {
    const int len = c.seq_lens[b];
    for (int kvh = 0; kvh < c.n_kv_heads; ++kvh) {
      auto offset = [&](int t) { return slot_offset(b, t, kvh); };
      const std::vector<float> k = dequantized_rows(k_pool, len, d, scale_of(k_scales, kvh), c.format, offset);
      const std::vector<float> v = dequantized_rows(v_pool, len, d, scale_of(v_scales, kvh), c.format, offset);
      std::vector<char> keep(std::max(len, 1), 0);
      for (int t = 0; t < len; ++t) keep[t] = c.features.window_left < 0 || t >= len - 1 - c.features.window_left;
      for (int h = kvh * c.group; h < (kvh + 1) * c.group; ++h) {
        std::vector<float> q_row(d);
        for (int i = 0; i < d; ++i) q_row[i] = bits_to_float(q[b * q_batch_stride + h * q_head_stride + i], c.dtype);
        RowFeatures features;
        features.logit_cap = c.features.logit_cap;
        if (c.features.sinks) features.sink = sinks[h];
        double want_lse = 0;
        const bool non_empty =
            attend_row(q_row.data(), k.data(), v.data(), len, keep, d, scale, &want, &want_lse, features);
        compare_row(&check, &written, out, b * q_batch_stride + h * q_head_stride, lse, b * n_heads + h, c.lse,
                    c.dtype, want, non_empty, want_lse, fmt::format("b={} h={}", b, h));
      }
    }
  }
  check_poison(&check, out, written);
  if (!c.lse) check_lse_untouched(&check, lse);
  return check;
}

RowCheck run_decode(const Fp8Case& c) {
  std::mt19937 rng(c.seed);
  const int batch = c.batch();
  const int n_heads = c.n_kv_heads * c.group;
  const int d = c.head_dim;
  const std::int64_t head_stride = d + (c.padded ? 16 : 0);
  const std::int64_t seq_stride = c.n_kv_heads * head_stride;
  const std::int64_t batch_stride = std::max(1, c.kv_len) * seq_stride;
  const std::size_t cache_bytes = static_cast<std::size_t>(std::max(1, batch)) * batch_stride;
  const std::vector<float> k_scales = kv_scales(c.per_head, c.n_kv_heads, rng);
  const std::vector<float> v_scales = kv_scales(c.per_head, c.n_kv_heads, rng);
  const std::vector<std::uint8_t> k_cache = make_cache(cache_bytes, c, k_scales, head_stride, rng);
  const std::vector<std::uint8_t> v_cache = make_cache(cache_bytes, c, v_scales, head_stride, rng);
  const std::int64_t q_batch_stride = static_cast<std::int64_t>(n_heads) * d;
  const std::vector<std::uint16_t> q = make_query(std::max(1, batch) * q_batch_stride, d, n_heads, c, rng);
  const std::size_t out_elems = std::max<std::size_t>(1, batch * q_batch_stride);
  const std::vector<float> sinks = sink_values(n_heads, c.seed);

  DeviceBuffer d_q = DeviceBuffer::from(q);
  DeviceBuffer d_k = DeviceBuffer::from(k_cache);
  DeviceBuffer d_v = DeviceBuffer::from(v_cache);
  DeviceBuffer d_k_scales = DeviceBuffer::from(k_scales);
  DeviceBuffer d_v_scales = DeviceBuffer::from(v_scales);
  DeviceBuffer d_sinks = DeviceBuffer::from(sinks);
  DeviceBuffer d_out(out_elems * 2);
  d_out.fill_byte(0xff);
  DeviceBuffer d_lse(std::max(1, batch * n_heads) * sizeof(float));
  d_lse.fill_byte(0xff);

  DecodeArgs args;
  args.dtype = c.dtype;
  args.batch = batch;
  args.kv_len = c.kv_len;
  args.n_heads = n_heads;
  args.n_kv_heads = c.n_kv_heads;
  args.head_dim = d;
  args.logit_cap = c.features.logit_cap;
  args.scale = c.scale;
  if (c.features.sinks) args.sinks = static_cast<const float*>(d_sinks.get());
  args.window_left = c.features.window_left;
  args.causal_offset = c.causal_offset;
  args.kv_dtype = c.format;
  args.k_scale = static_cast<const float*>(d_k_scales.get());
  args.v_scale = static_cast<const float*>(d_v_scales.get());
  args.kv_scale_per_head = c.per_head;
  args.q = d_q.get();
  args.k = d_k.get();
  args.v = d_v.get();
  args.k_stride_batch = args.v_stride_batch = batch_stride;
  args.k_stride_seq = args.v_stride_seq = seq_stride;
  args.k_stride_head = args.v_stride_head = head_stride;
  args.out = d_out.get();
  if (c.lse) args.lse = static_cast<float*>(d_lse.get());
  Runtime::get().decode(args);
  synchronize();
  const auto out = d_out.to_host<std::uint16_t>(out_elems);
  const auto lse = d_lse.to_host<float>(std::max(1, batch * n_heads));

  RowCheck check(testing::attention_tolerance(c.dtype));
  std::vector<char> written(out.size(), 0);
  const double scale = case_scale(c);
  // The query sits at causal_offset (kv_len - 1 without one) and sees [0, min(kv_len, c + 1)).
  const long long position = c.causal_offset < 0 ? c.kv_len - 1LL : c.causal_offset;
  const int visible = c.causal_offset < 0 ? c.kv_len : std::min(c.kv_len, c.causal_offset + 1);
  std::vector<double> want;
  for (int b = 0; b < batch; ++b) {
    for (int kvh = 0; kvh < c.n_kv_heads; ++kvh) {
      auto offset = [&](int t) { return b * batch_stride + t * seq_stride + kvh * head_stride; };
      const std::vector<float> k = dequantized_rows(k_cache, c.kv_len, d, scale_of(k_scales, kvh), c.format, offset);
      const std::vector<float> v = dequantized_rows(v_cache, c.kv_len, d, scale_of(v_scales, kvh), c.format, offset);
      std::vector<char> keep(std::max(c.kv_len, 1), 0);
      for (int t = 0; t < visible; ++t)
        keep[t] = c.features.window_left < 0 || t >= position - c.features.window_left;
      for (int h = kvh * c.group; h < (kvh + 1) * c.group; ++h) {
        std::vector<float> q_row(d);
        for (int i = 0; i < d; ++i) q_row[i] = bits_to_float(q[b * q_batch_stride + h * d + i], c.dtype);
        RowFeatures features;
        features.logit_cap = c.features.logit_cap;
        if (c.features.sinks) features.sink = sinks[h];
        double want_lse = 0;
        const bool non_empty =
            attend_row(q_row.data(), k.data(), v.data(), c.kv_len, keep, d, scale, &want, &want_lse, features);
        compare_row(&check, &written, out, b * q_batch_stride + h * d, lse, b * n_heads + h, c.lse, c.dtype, want,
                    non_empty, want_lse, fmt::format("b={} h={}", b, h));
      }
    }
  }
  check_poison(&check, out, written);
  if (!c.lse) check_lse_untouched(&check, lse);
  return check;
}

RowCheck run_paged_prefill(const Fp8Case& c) {
  std::mt19937 rng(c.seed);
  const int batch = c.batch();
  const int n_heads = c.n_kv_heads * c.group;
  const int d = c.head_dim;
  const int ps = c.page_size;
  std::vector<std::int32_t> indptr(batch + 1, 0);
  for (int b = 0; b < batch; ++b) indptr[b + 1] = indptr[b] + c.q_lens[b];
  const int total_q = indptr[batch];
  const int max_q_len = batch ? *std::max_element(c.q_lens.begin(), c.q_lens.end()) : 0;
  const PageTable pages = make_page_table(c.seq_lens, ps, PageTableShape(), rng);
  const int max_pages = pages.max_pages;
  const int num_pages = pages.num_pages;
  const std::vector<std::int32_t>& table = pages.table;

  const std::int64_t head_stride = d + (c.padded ? 16 : 0);
  const std::int64_t token_stride = c.n_kv_heads * head_stride;
  const std::int64_t page_stride = ps * token_stride;
  const std::size_t pool_bytes = static_cast<std::size_t>(num_pages) * page_stride;
  const std::vector<float> k_scales = kv_scales(c.per_head, c.n_kv_heads, rng);
  const std::vector<float> v_scales = kv_scales(c.per_head, c.n_kv_heads, rng);
  const std::vector<std::uint8_t> k_pool = make_cache(pool_bytes, c, k_scales, head_stride, rng);
  const std::vector<std::uint8_t> v_pool = make_cache(pool_bytes, c, v_scales, head_stride, rng);
  const std::int64_t q_token_stride = static_cast<std::int64_t>(n_heads) * d;
  const std::vector<std::uint16_t> q = make_query(std::max(1, total_q) * q_token_stride, d, n_heads, c, rng);
  const std::size_t out_elems = static_cast<std::size_t>(std::max(1, total_q)) * q_token_stride;
  const std::vector<float> sinks = sink_values(n_heads, c.seed);

  DeviceBuffer d_q = DeviceBuffer::from(q);
  DeviceBuffer d_k = DeviceBuffer::from(k_pool);
  DeviceBuffer d_v = DeviceBuffer::from(v_pool);
  DeviceBuffer d_table = DeviceBuffer::from(table);
  DeviceBuffer d_lens = DeviceBuffer::from(c.seq_lens);
  DeviceBuffer d_indptr = DeviceBuffer::from(indptr);
  DeviceBuffer d_k_scales = DeviceBuffer::from(k_scales);
  DeviceBuffer d_v_scales = DeviceBuffer::from(v_scales);
  DeviceBuffer d_sinks = DeviceBuffer::from(sinks);
  DeviceBuffer d_out(out_elems * 2);
  d_out.fill_byte(0xff);
  DeviceBuffer d_lse(std::max(1, total_q * n_heads) * sizeof(float));
  d_lse.fill_byte(0xff);

  PagedPrefillArgs args;
  args.dtype = c.dtype;
  args.batch = batch;
  args.total_q = total_q;
  args.max_q_len = max_q_len;
  args.n_heads = n_heads;
  args.n_kv_heads = c.n_kv_heads;
  args.head_dim = d;
  args.page_size = ps;
  args.num_pages = num_pages;
  args.max_pages_per_seq = max_pages;
  args.logit_cap = c.features.logit_cap;
  args.scale = c.scale;
  if (c.features.sinks) args.sinks = static_cast<const float*>(d_sinks.get());
  args.window_left = c.features.window_left;
  args.causal = true;
  args.kv_dtype = c.format;
  args.k_scale = static_cast<const float*>(d_k_scales.get());
  args.v_scale = static_cast<const float*>(d_v_scales.get());
  args.kv_scale_per_head = c.per_head;
  args.q = d_q.get();
  args.qo_indptr = static_cast<const std::int32_t*>(d_indptr.get());
  args.k_cache = d_k.get();
  args.v_cache = d_v.get();
  args.k_stride_page = args.v_stride_page = page_stride;
  args.k_stride_token = args.v_stride_token = token_stride;
  args.k_stride_head = args.v_stride_head = head_stride;
  args.page_table = static_cast<const std::int32_t*>(d_table.get());
  args.seq_lens = static_cast<const std::int32_t*>(d_lens.get());
  args.out = d_out.get();
  if (c.lse) args.lse = static_cast<float*>(d_lse.get());
  Runtime::get().paged_prefill(args);
  synchronize();
  const auto out = d_out.to_host<std::uint16_t>(out_elems);
  const auto lse = d_lse.to_host<float>(std::max(1, total_q * n_heads));

  RowCheck check(testing::attention_tolerance(c.dtype));
  std::vector<char> written(out.size(), 0);
  const double scale = case_scale(c);
  std::vector<double> want;
  for (int b = 0; b < batch; ++b) {
    const int len = c.seq_lens[b];
    for (int kvh = 0; kvh < c.n_kv_heads; ++kvh) {
      auto offset = [&](int t) {
        return static_cast<std::int64_t>(table[b * max_pages + t / ps]) * page_stride + (t % ps) * token_stride +
               kvh * head_stride;
      };
      const std::vector<float> k = dequantized_rows(k_pool, len, d, scale_of(k_scales, kvh), c.format, offset);
      const std::vector<float> v = dequantized_rows(v_pool, len, d, scale_of(v_scales, kvh), c.format, offset);
      for (int i = 0; i < c.q_lens[b]; ++i) {
        const long long position = len - c.q_lens[b] + i;  // causal: keys [.., position]
        std::vector<char> keep(std::max(len, 1), 0);
        for (int t = 0; t < len; ++t)
          keep[t] = t <= position && (c.features.window_left < 0 || t >= position - c.features.window_left);
        const std::int64_t row = indptr[b] + i;
        for (int h = kvh * c.group; h < (kvh + 1) * c.group; ++h) {
          std::vector<float> q_row(d);
          for (int e = 0; e < d; ++e) q_row[e] = bits_to_float(q[row * q_token_stride + h * d + e], c.dtype);
          RowFeatures features;
          features.logit_cap = c.features.logit_cap;
          if (c.features.sinks) features.sink = sinks[h];
          double want_lse = 0;
          const bool non_empty =
              attend_row(q_row.data(), k.data(), v.data(), len, keep, d, scale, &want, &want_lse, features);
          compare_row(&check, &written, out, row * q_token_stride + h * d, lse, row * n_heads + h, c.lse, c.dtype,
                      want, non_empty, want_lse, fmt::format("b={} row={} h={}", b, i, h));
        }
      }
    }
  }
  check_poison(&check, out, written);
  if (!c.lse) check_lse_untouched(&check, lse);
  return check;
}

void check_case(const Fp8Case& c) {
  const RowCheck check = c.call == Fp8Call::paged_decode ? run_paged_decode(c)
                         : c.call == Fp8Call::decode     ? run_decode(c)
                                                         : run_paged_prefill(c);
  report_case(std::string(call_name(c.call)) + " fp8", c.dtype, c.describe(), check);
}

std::vector<int> ragged_lengths(int page_size, std::mt19937& rng) {
  std::uniform_int_distribution<int> length(2, 900);
  return {0, 1, std::max(2, page_size - 1), page_size, page_size + 1, length(rng), length(rng)};
}

}  // namespace

TEST_SUITE("kv_fp8") {

TEST_CASE("paged_decode with an FP8 KV cache matches the dequantized reference (e4m3, e5m2, both dtypes)") {
  std::mt19937 rng(test_seed(8001));
  for (KvDType format : {KvDType::e4m3, KvDType::e5m2}) {
    for (int head_dim : {64, 128, 256, 80}) {
      for (int page_size : {1, 16}) {
        Fp8Case c;
        c.format = format;
        c.dtype = head_dim == 80 || page_size == 1 ? DType::fp16 : DType::bf16;
        c.head_dim = head_dim;
        c.page_size = page_size;
        c.group = head_dim == 64 ? 6 : 4;
        c.per_head = page_size == 16;
        c.padded = head_dim == 128;
        c.seq_lens = ragged_lengths(page_size, rng);
        c.seq_lens.push_back(9000);  // split: the combine merges FP8 partial results
        c.seed = rng();
        check_case(c);
      }
    }
  }
}

TEST_CASE("paged_decode FP8 fused append writes the quantized token (saturating) and attends to it") {
  std::mt19937 rng(test_seed(8002));
  for (KvDType format : {KvDType::e4m3, KvDType::e5m2}) {
    for (int page_size : {1, 8, 16, 64}) {
      Fp8Case c;
      c.format = format;
      c.dtype = page_size == 8 ? DType::fp16 : DType::bf16;
      c.page_size = page_size;
      c.head_dim = page_size == 64 ? 64 : 128;
      c.group = page_size == 64 ? 6 : 4;
      c.append = true;
      c.per_head = page_size != 1;
      c.padded = page_size == 16;
      c.seq_lens = ragged_lengths(page_size, rng);
      c.seq_lens.push_back(5000);
      c.seed = rng();
      check_case(c);
    }
  }
}

TEST_CASE("paged_decode FP8 with a sliding window, sinks and the soft-cap (gpt-oss and Gemma shapes)") {
  std::mt19937 rng(test_seed(8003));
  for (int window : {0, 15, 16, 100, 5000}) {
    Fp8Case c;
    c.format = window % 2 ? KvDType::e5m2 : KvDType::e4m3;
    c.page_size = window == 15 ? 1 : 16;
    c.head_dim = 64;
    c.group = 8;
    c.features.window_left = window;
    c.features.sinks = true;
    c.features.logit_cap = window == 100 ? 5.f : 0.f;
    c.append = window == 16;
    c.per_head = true;
    c.seq_lens = ragged_lengths(c.page_size, rng);
    c.seq_lens.push_back(3000 + static_cast<int>(rng() % 500));
    c.seed = rng();
    check_case(c);
  }
}

TEST_CASE("decode with an FP8 KV cache: causal offsets, windows, per-tensor and per-head scales") {
  std::mt19937 rng(test_seed(8004));
  struct Shape {
    int kv_len;
    int causal_offset;
    int window;
  };
  const Shape shapes[] = {{1, -1, -1}, {777, -1, -1}, {4096, 1000, -1}, {300, 500, 64}, {20000, -1, 2048}, {0, -1, -1}};
  int i = 0;
  for (const Shape& shape : shapes) {
    Fp8Case c;
    c.call = Fp8Call::decode;
    c.format = i % 2 ? KvDType::e5m2 : KvDType::e4m3;
    c.dtype = i % 3 == 1 ? DType::fp16 : DType::bf16;
    c.head_dim = i % 2 ? 128 : 64;
    c.group = i % 2 ? 4 : 6;
    c.kv_len = shape.kv_len;
    c.causal_offset = shape.causal_offset;
    c.features.window_left = shape.window;
    c.features.sinks = i == 4;
    c.per_head = i % 2 == 0;
    c.padded = i == 2;
    c.seq_lens.assign(3, 0);  // batch 3; decode reads kv_len for every request
    c.seed = rng();
    check_case(c);
    ++i;
  }
}

TEST_CASE("paged_prefill with an FP8 KV cache: ragged chunks, page edges, windows") {
  std::mt19937 rng(test_seed(8005));
  for (KvDType format : {KvDType::e4m3, KvDType::e5m2}) {
    for (int head_dim : {64, 128, 256}) {
      for (int page_size : {1, 16}) {
        Fp8Case c;
        c.call = Fp8Call::paged_prefill;
        c.format = format;
        c.dtype = head_dim == 256 ? DType::fp16 : DType::bf16;
        c.head_dim = head_dim;
        c.page_size = page_size;
        c.group = head_dim == 64 ? 6 : 4;
        c.per_head = page_size == 16;
        c.padded = head_dim == 128 && page_size == 1;
        c.features.window_left = head_dim == 64 ? 40 : -1;
        c.features.sinks = head_dim == 256;
        // Ragged: a fresh prompt, a chunk of a longer prompt, a decode-like row, an empty one.
        c.q_lens = {150, 33, 1, 0, 70};
        c.seq_lens = {150, 33 + static_cast<int>(rng() % 600), 1 + static_cast<int>(rng() % 300), 5, 70 + page_size};
        c.seed = rng();
        check_case(c);
      }
    }
  }
}

TEST_CASE("FP8 caches with peaked rows (scale 1): paged_decode through the split merge, decode, paged_prefill") {
  std::mt19937 rng(test_seed(8006));
  for (Fp8Call call : {Fp8Call::paged_decode, Fp8Call::decode, Fp8Call::paged_prefill}) {
    for (KvDType format : {KvDType::e4m3, KvDType::e5m2}) {
      Fp8Case c;
      c.call = call;
      c.format = format;
      c.dtype = format == KvDType::e5m2 ? DType::fp16 : DType::bf16;
      c.scale = 1.f;  // scores spread over +-10 (head dim 128): few keys carry each row
      c.per_head = format == KvDType::e4m3;
      c.features.sinks = call == Fp8Call::paged_decode;
      if (call == Fp8Call::decode) {
        c.kv_len = 20000;  // split
        c.seq_lens.assign(2, 0);
      } else if (call == Fp8Call::paged_prefill) {
        c.q_lens = {150, 1, 33};
        c.seq_lens = {150, 900, 33 + static_cast<int>(rng() % 600)};
      } else {
        c.seq_lens = ragged_lengths(16, rng);
        c.seq_lens.push_back(20000);
      }
      c.seed = rng();
      check_case(c);
    }
  }
}

TEST_CASE("FP8 caches with bf16 queries past f16's range: scaled into it, never saturated") {
  // The direct path's MMAs run in f16: a bf16 row with values past 65504 must go in scaled by a
  // power of two, its scores scaled back. Odd heads' values reach q_magnitude, and the scale
  // brings their scores to O(1), so a row saturated at 65504 would be far off; even heads sit in
  // the same tiles at ordinary magnitudes (scores near 0).
  std::mt19937 rng(test_seed(8007));
  for (Fp8Call call : {Fp8Call::paged_decode, Fp8Call::decode, Fp8Call::paged_prefill}) {
    for (int head_dim : {64, 128, 256}) {
      Fp8Case c;
      c.call = call;
      c.head_dim = head_dim;
      c.format = head_dim == 128 ? KvDType::e5m2 : KvDType::e4m3;
      c.per_head = head_dim != 64;
      c.q_magnitude = head_dim == 64 ? 7.0e4f : head_dim == 128 ? 3.0e6f : 1.0e5f;
      c.scale = static_cast<float>(3.0 / (std::sqrt(static_cast<double>(head_dim)) * c.q_magnitude));
      if (call == Fp8Call::decode) {
        c.kv_len = head_dim == 128 ? 5000 : 300;  // 5000: split
        c.seq_lens.assign(2, 0);
      } else if (call == Fp8Call::paged_prefill) {
        c.q_lens = {20, 1};
        c.seq_lens = {40, 300};
      } else {
        c.seq_lens = {1, 37, 3000 + static_cast<int>(rng() % 100)};
      }
      c.seed = static_cast<unsigned>(rng());
      check_case(c);
    }
  }
}

TEST_CASE("on sm_90a an FP8 cache at head dims 64, 128 and 256 streams through the TMA decode, every feature on it") {
  if (!sm90a_target()) return not_run("FP8 TMA decode case: needs an sm_90a target");
  std::mt19937 rng(test_seed(8008));
  const bool hopper = !mma_forced_off() && !wgmma_forced_off();
  struct Shape {
    Fp8Call call;
    int head_dim, page_size;
    KvDType format;
    DType dtype;
    const char* variant;  // the sm_90a variant the call must load
  };
  const Shape shapes[] = {
      {Fp8Call::paged_decode, 128, 16, KvDType::e4m3, DType::bf16, "paged_decode.bf16.hd128.ps16.g4.kv_e4m3.swa.tma."},
      {Fp8Call::paged_decode, 128, 64, KvDType::e5m2, DType::fp16, "paged_decode.fp16.hd128.ps64.g4.kv_e5m2.cap.sink.tma."},
      {Fp8Call::paged_decode, 256, 32, KvDType::e4m3, DType::bf16, "paged_decode.bf16.hd256.ps32.g4.kv_e4m3.sink.tma."},
      {Fp8Call::decode, 128, 0, KvDType::e5m2, DType::bf16, "decode.bf16.hd128.g4.kv_e5m2.swa.sink.tma."},
      {Fp8Call::decode, 256, 0, KvDType::e4m3, DType::fp16, "decode.fp16.hd256.g4.kv_e4m3.swa.cap.tma."},
      // hd64's rows of 64 bytes (64-byte swizzle), at AstrAI's 24/4 heads.
      {Fp8Call::paged_decode, 64, 16, KvDType::e4m3, DType::bf16, "paged_decode.bf16.hd64.ps16.g6.kv_e4m3.swa.tma."},
      {Fp8Call::paged_decode, 64, 64, KvDType::e5m2, DType::fp16, "paged_decode.fp16.hd64.ps64.g6.kv_e5m2.cap.sink.tma."},
      {Fp8Call::decode, 64, 0, KvDType::e4m3, DType::bf16, "decode.bf16.hd64.g6.kv_e4m3.sink.tma."}};
  for (const Shape& shape : shapes) {
    Fp8Case c;
    c.call = shape.call;
    c.head_dim = shape.head_dim;
    c.group = shape.head_dim == 64 ? 6 : 4;
    c.page_size = shape.page_size;
    c.format = shape.format;
    c.dtype = shape.dtype;
    const std::string variant = shape.variant;
    c.features.window_left = variant.find(".swa") != std::string::npos ? 100 : -1;
    c.features.logit_cap = variant.find(".cap") != std::string::npos ? 4.f : 0.f;
    c.features.sinks = variant.find(".sink") != std::string::npos;
    c.per_head = shape.head_dim == 128;
    c.padded = shape.format == KvDType::e5m2;
    if (shape.call == Fp8Call::decode) {
      c.kv_len = shape.head_dim == 256 ? 65 : 4100;  // block edges, and a split run
      c.causal_offset = shape.head_dim == 256 ? 30 : -1;
      c.seq_lens.assign(2, 0);
    } else {
      // Around pages and 64-token blocks, an empty request, a split one; the fused append.
      c.append = shape.page_size == 16;
      c.seq_lens = {1, shape.page_size - 1, shape.page_size + 1, 63, 64, 65, 0, 5000 + static_cast<int>(rng() % 64)};
    }
    c.seed = rng();
    check_case(c);
    CHECK(loaded_variants_named(variant) == (hopper ? 1 : 0));
  }
}

TEST_CASE("on sm_90a an FP8 cache at head dim 128 runs the wgmma paged prefill, widened in shared memory") {
  if (!sm90a_target()) return not_run("FP8 wgmma paged prefill case: needs an sm_90a target");
  std::mt19937 rng(test_seed(8009));
  const bool hopper = !mma_forced_off() && !wgmma_forced_off();
  struct Shape {
    int page_size;
    KvDType format;
    DType dtype;
    const char* variant;  // the sm_90a variant the call must load
  };
  const Shape shapes[] = {{16, KvDType::e4m3, DType::bf16, "paged_prefill.bf16.hd128.ps16.g4.kv_e4m3.wgmma."},
                          {8, KvDType::e5m2, DType::bf16, "paged_prefill.bf16.hd128.ps8.g4.kv_e5m2.swa.sink.wgmma."},
                          {64, KvDType::e4m3, DType::fp16, "paged_prefill.fp16.hd128.ps64.g4.kv_e4m3.cap.wgmma."},
                          {32, KvDType::e5m2, DType::fp16, "paged_prefill.fp16.hd128.ps32.g4.kv_e5m2.swa.cap.sink.wgmma."}};
  for (const Shape& shape : shapes) {
    Fp8Case c;
    c.call = Fp8Call::paged_prefill;
    c.page_size = shape.page_size;
    c.format = shape.format;
    c.dtype = shape.dtype;
    const std::string variant = shape.variant;
    c.features.window_left = variant.find(".swa") != std::string::npos ? 150 : -1;
    c.features.logit_cap = variant.find(".cap") != std::string::npos ? 5.f : 0.f;
    c.features.sinks = variant.find(".sink") != std::string::npos;
    c.per_head = shape.page_size != 16;
    c.padded = shape.format == KvDType::e5m2;
    // Rows around the 64-row consumer tiles and the 128-token blocks, an empty chunk, a chunk
    // after a prefix that ends inside a page, and one past several blocks.
    c.q_lens = {1, 63, 64, 65, 0, 129, 200, 7};
    c.seq_lens = {1, 63 + shape.page_size - 1, 64, 65 + 128, 5, 129 + 3 * shape.page_size + 1, 200 + 400,
                  7 + static_cast<int>(rng() % 900)};
    c.seed = rng();
    check_case(c);
    CHECK(loaded_variants_named(variant) == (hopper ? 1 : 0));
  }
}

TEST_CASE("kv_fp8 random sweep") {
  // ASTRAI_TEST_SWEEP cases (default 8) over the variants the cases above compiled.
  const unsigned seed = test_seed(8007);
  std::mt19937 rng(seed);
  MESSAGE(fmt::format("kv_fp8 random sweep seed {}", seed));
  const int total = sweep_count(8);
  for (int i = 0; i < total; ++i) {
    Fp8Case c;
    c.call = static_cast<Fp8Call>(rng() % 3);
    c.format = rng() % 2 ? KvDType::e5m2 : KvDType::e4m3;
    c.head_dim = 128;
    c.group = 4;
    c.per_head = rng() % 2 == 0;
    c.scale = rng() % 3 == 0 ? 1.f : 0.f;
    if (c.call == Fp8Call::decode) {
      c.kv_len = static_cast<int>(rng() % 6000);
      c.causal_offset = rng() % 2 ? -1 : static_cast<int>(rng() % (c.kv_len + 2));
      c.seq_lens.assign(1 + rng() % 3, 0);
    } else {
      const int batch = 1 + static_cast<int>(rng() % 4);
      for (int b = 0; b < batch; ++b) {
        const int q_len = c.call == Fp8Call::paged_prefill ? static_cast<int>(rng() % 100) : 0;
        c.q_lens.push_back(q_len);
        c.seq_lens.push_back(q_len + static_cast<int>(rng() % 3000));
      }
      if (c.call == Fp8Call::paged_decode) c.q_lens.clear();
    }
    c.seed = rng();
    check_case(c);
  }
}

}  // TEST_SUITE
}  // namespace astrai::gpu_test
