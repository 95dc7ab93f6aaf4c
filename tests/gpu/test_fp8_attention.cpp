// FP8 attention (qkv_dtype e4m3: q, k and v in e4m3, both GEMMs on FP8 operands, P quantized
// to e4m3) in the sm_90a wgmma prefill, against a float64 reference built from the dequantized
// q, k and v. The one rounding the reference lacks is P's: e4m3 keeps 4 significant bits, so an
// output element may move by about 2^-4 of the values it averages (bounded below); the LSE comes
// from the unquantized P and stays tight. Peaked rows (each query aimed at one key) make a
// misplaced P column or V row show as a wrong row, not as noise.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include <fmt/format.h>

#include "tests/gpu/gpu_support.hpp"
#include "tests/support/device_buffer.hpp"
#include "tests/support/fp8.hpp"

namespace astrai::gpu_test {
namespace {

using testing::float_to_fp8;
using testing::fp8_to_float;

struct Fp8AttentionCase {
  DType dtype = DType::bf16;
  int batch = 1, q_len = 1, kv_len = 1, n_heads = 4, n_kv_heads = 1;
  int causal_offset = -1;
  bool per_head_q = false, per_head_kv = false;
  bool peaked = false;    // each query row aimed at one key
  float outlier = 8.f;    // a few values this many times the rest
  unsigned seed = 1;
  int page_size = 0;      // paged_prefill over pages of this many tokens (0: prefill)
  bool causal = true;     // paged: the q rows are the KV's last
  int kv_shrink = 0;      // paged: request b's KV is kv_len - b * kv_shrink tokens (down to 0)
  bool p16 = false;       // P kept in f16 for P V (p_fp16)
  int head_dim = 128;
};

// The LSE's allowance for the e4m3 GEMM's accumulation, of the largest sum of |q_d k_d|.
constexpr double kScoreSumBits = 1.0 / 64;

// Values of one tensor as e4m3 codes with their scales (one, or one per head of `heads`): the
// largest magnitude of each scale's slice lands on 448.
struct Quantized {
  std::vector<std::uint8_t> codes;
  std::vector<float> scales;
  float value(std::size_t i, int head) const {
    return fp8_to_float(codes[i], KvDType::e4m3) * scales[scales.size() == 1 ? 0 : head];
  }
};

Quantized quantize(const std::vector<float>& x, int heads, int head_dim, bool per_head) {
  Quantized q;
  q.scales.assign(per_head ? heads : 1, 0.f);
  for (std::size_t i = 0; i < x.size(); ++i) {
    const int h = per_head ? static_cast<int>(i / head_dim) % heads : 0;
    q.scales[h] = std::max(q.scales[h], std::fabs(x[i]) / 448.f);
  }
  for (float& s : q.scales) s = s > 0.f ? s : 1.f;
  q.codes.resize(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const int h = per_head ? static_cast<int>(i / head_dim) % heads : 0;
    q.codes[i] = float_to_fp8(x[i] / q.scales[h], KvDType::e4m3);
  }
  return q;
}

// Request b's lengths: contiguous, every request's; paged, kv_len shrinks by kv_shrink a request
// (down to 0) and q rows are at most its KV (the new tokens are the KV's last).
int kv_len_of(const Fp8AttentionCase& c, int b) {
  return c.page_size == 0 ? c.kv_len : std::max(c.kv_len - b * c.kv_shrink, 0);
}
int q_len_of(const Fp8AttentionCase& c, int b) {
  return c.page_size == 0 ? c.q_len : std::min(c.q_len, kv_len_of(c, b));
}
// The last key query row i of request b sees (-1: none).
int last_key(const Fp8AttentionCase& c, int b, int i) {
  const int kv = kv_len_of(c, b);
  if (c.page_size != 0) return c.causal ? kv - q_len_of(c, b) + i : kv - 1;
  return c.causal_offset >= 0 ? std::min(kv - 1, c.causal_offset + i) : kv - 1;
}

// The inputs as the reference sees them: q rows [total_q][heads][d], K and V [batch][kv_len][kv
// heads][d] (request b's rows from b * kv_len, its own length kv_len_of), as e4m3 codes.
struct Inputs {
  std::vector<int> q_start;  // [batch + 1]
  Quantized q, k, v;
};

Inputs make_inputs(const Fp8AttentionCase& c, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> unit(0.f, 1.f);
  Inputs in;
  in.q_start.assign(c.batch + 1, 0);
  for (int b = 0; b < c.batch; ++b) in.q_start[b + 1] = in.q_start[b] + q_len_of(c, b);
  const std::size_t q_count = static_cast<std::size_t>(in.q_start[c.batch]) * c.n_heads * c.head_dim;
  const std::size_t kv_count = static_cast<std::size_t>(c.batch) * c.kv_len * c.n_kv_heads * c.head_dim;
  auto draw = [&](std::size_t n) {
    std::vector<float> x(n);
    for (float& v : x) v = normal(rng) * (unit(rng) < 0.002f ? c.outlier : 1.f);
    return x;
  };
  std::vector<float> k = draw(kv_count), v = draw(kv_count), q = draw(q_count);
  const int group = c.n_heads / c.n_kv_heads;
  if (c.peaked) {
    // q = 2.5 k_j + noise for a key j the row sees: its score stands well above the others.
    for (int b = 0; b < c.batch; ++b)
      for (int i = 0; i < q_len_of(c, b); ++i) {
        const int last = last_key(c, b, i);
        if (last < 0) continue;
        for (int h = 0; h < c.n_heads; ++h) {
          const int j = static_cast<int>(rng() % (last + 1));
          for (int d = 0; d < c.head_dim; ++d)
            q[((static_cast<std::size_t>(in.q_start[b]) + i) * c.n_heads + h) * c.head_dim + d] =
                2.5f * k[((static_cast<std::size_t>(b) * c.kv_len + j) * c.n_kv_heads + h / group) * c.head_dim + d] +
                0.1f * normal(rng);
        }
      }
  }
  in.q = quantize(q, c.n_heads, c.head_dim, c.per_head_q);
  in.k = quantize(k, c.n_kv_heads, c.head_dim, c.per_head_kv);
  in.v = quantize(v, c.n_kv_heads, c.head_dim, c.per_head_kv);
  return in;
}

// K's or V's codes in pages of `page_size` tokens [pages][page_size][kv heads][d], request b's
// pages at table row b in a shuffled order; the slots past each request's end hold NaN codes
// (0x7f), which no output may show.
std::vector<std::uint8_t> paged_codes(const Fp8AttentionCase& c, const std::vector<std::uint8_t>& codes,
                                      const std::vector<int>& table, int pages_per_seq) {
  const std::size_t row = static_cast<std::size_t>(c.n_kv_heads) * c.head_dim;
  std::vector<std::uint8_t> pages(table.size() * c.page_size * row, 0x7f);
  for (int b = 0; b < c.batch; ++b)
    for (int j = 0; j < kv_len_of(c, b); ++j) {
      const std::size_t page = static_cast<std::size_t>(table[static_cast<std::size_t>(b) * pages_per_seq + j / c.page_size]);
      std::copy_n(codes.begin() + (static_cast<std::size_t>(b) * c.kv_len + j) * row, row,
                  pages.begin() + (page * c.page_size + j % c.page_size) * row);
    }
  return pages;
}

// Runs the kernel (contiguous prefill or paged_prefill) into out [total_q][heads][d] and lse
// [total_q][heads], both poisoned first.
void run_kernel(const Fp8AttentionCase& c, const Inputs& in, std::mt19937& rng, DeviceBuffer& out_dev,
                DeviceBuffer& lse_dev) {
  DeviceBuffer q_dev = DeviceBuffer::from(in.q.codes);
  DeviceBuffer q_scale = DeviceBuffer::from(in.q.scales), k_scale = DeviceBuffer::from(in.k.scales),
               v_scale = DeviceBuffer::from(in.v.scales);
  AttentionOptions o;
  o.qkv_dtype = KvDType::e4m3;
  o.q_scale = static_cast<const float*>(q_scale.get());
  o.q_scale_per_head = c.per_head_q;
  o.k_scale = static_cast<const float*>(k_scale.get());
  o.v_scale = static_cast<const float*>(v_scale.get());
  o.kv_scale_per_head = c.per_head_kv;
  o.p_fp16 = c.p16;
  if (c.page_size == 0) {
    DeviceBuffer k_dev = DeviceBuffer::from(in.k.codes), v_dev = DeviceBuffer::from(in.v.codes);
    PrefillArgs a;
    static_cast<AttentionOptions&>(a) = o;
    a.dtype = c.dtype;
    a.batch = c.batch;
    a.q_len = c.q_len;
    a.kv_len = c.kv_len;
    a.n_heads = c.n_heads;
    a.n_kv_heads = c.n_kv_heads;
    a.head_dim = c.head_dim;
    a.causal_offset = c.causal_offset;
    a.q = q_dev.get();
    a.k = k_dev.get();
    a.v = v_dev.get();
    a.out = out_dev.get();
    a.lse = static_cast<float*>(lse_dev.get());
    Runtime::get().prefill(a);
    synchronize();
    return;
  }
  const int pages_per_seq = std::max((c.kv_len + c.page_size - 1) / c.page_size, 1);
  std::vector<int> table(static_cast<std::size_t>(c.batch) * pages_per_seq);
  for (std::size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int>(i);
  std::shuffle(table.begin(), table.end(), rng);
  std::vector<int> lens(c.batch);
  for (int b = 0; b < c.batch; ++b) lens[b] = kv_len_of(c, b);
  DeviceBuffer k_dev = DeviceBuffer::from(paged_codes(c, in.k.codes, table, pages_per_seq));
  DeviceBuffer v_dev = DeviceBuffer::from(paged_codes(c, in.v.codes, table, pages_per_seq));
  DeviceBuffer table_dev = DeviceBuffer::from(table), lens_dev = DeviceBuffer::from(lens),
               indptr_dev = DeviceBuffer::from(in.q_start);
  PagedPrefillArgs a;
  static_cast<AttentionOptions&>(a) = o;
  a.dtype = c.dtype;
  a.batch = c.batch;
  a.total_q = in.q_start[c.batch];
  a.max_q_len = 0;
  for (int b = 0; b < c.batch; ++b) a.max_q_len = std::max(a.max_q_len, q_len_of(c, b));
  a.n_heads = c.n_heads;
  a.n_kv_heads = c.n_kv_heads;
  a.head_dim = c.head_dim;
  a.page_size = c.page_size;
  a.num_pages = static_cast<int>(table.size());
  a.max_pages_per_seq = pages_per_seq;
  a.causal = c.causal;
  a.q = q_dev.get();
  a.k_cache = k_dev.get();
  a.v_cache = v_dev.get();
  a.qo_indptr = static_cast<const int*>(indptr_dev.get());
  a.seq_lens = static_cast<const int*>(lens_dev.get());
  a.page_table = static_cast<const int*>(table_dev.get());
  a.out = out_dev.get();
  a.lse = static_cast<float*>(lse_dev.get());
  Runtime::get().paged_prefill(a);
  synchronize();
}

void run_case(const Fp8AttentionCase& c) {
  CAPTURE(fmt::format("hd{} B{} q{} kv{} heads {}/{} page {} causal_offset {} causal {} shrink {} per-head q {} "
                      "kv {} peaked {} {}{}", c.head_dim, c.batch, c.q_len, c.kv_len, c.n_heads, c.n_kv_heads, c.page_size,
                      c.causal_offset, c.causal, c.kv_shrink, c.per_head_q, c.per_head_kv, c.peaked,
                      c.dtype == DType::bf16 ? "bf16" : "fp16", c.p16 ? " p16" : ""));
  std::mt19937 rng(c.seed);
  const Inputs in = make_inputs(c, rng);
  const std::size_t rows = static_cast<std::size_t>(in.q_start[c.batch]) * c.n_heads;
  DeviceBuffer out_dev(std::max<std::size_t>(rows * c.head_dim * 2, 16));
  out_dev.fill_byte(0xff);
  DeviceBuffer lse_dev(std::max<std::size_t>(rows * 4, 16));
  lse_dev.fill_byte(0xff);
  run_kernel(c, in, rng, out_dev, lse_dev);
  const std::vector<std::uint16_t> out = out_dev.to_host<std::uint16_t>(rows * c.head_dim);
  const std::vector<float> lse = lse_dev.to_host<float>(rows);

  const int group = c.n_heads / c.n_kv_heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  const double p_bound = c.p16 ? 0.004 : 0.0625;
  double worst = 0, worst_lse = 0, sum_sq = 0, ref_sq = 0;
  int failures = 0;
  std::vector<double> s(static_cast<std::size_t>(std::max(c.kv_len, 1)));
  for (int b = 0; b < c.batch; ++b)
    for (int i = 0; i < q_len_of(c, b); ++i)
      for (int h = 0; h < c.n_heads; ++h) {
        const int kvh = h / group;
        const std::size_t row = (static_cast<std::size_t>(in.q_start[b]) + i) * c.n_heads + h;
        const std::size_t q_row = row * c.head_dim;
        const int last = last_key(c, b, i);
        auto kv_row = [&](int j) {
          return ((static_cast<std::size_t>(b) * c.kv_len + j) * c.n_kv_heads + kvh) * c.head_dim;
        };
        double top = -INFINITY;
        double magnitude = 0;  // the largest sum of |q_d k_d| (scaled) over the row's keys
        for (int j = 0; j <= last; ++j) {
          double dot = 0, dot_abs = 0;
          for (int d = 0; d < c.head_dim; ++d) {
            const double product = double(in.q.value(q_row + d, h)) * in.k.value(kv_row(j) + d, kvh);
            dot += product;
            dot_abs += std::fabs(product);
          }
          magnitude = std::max(magnitude, dot_abs * scale);
          s[j] = dot * scale;
          top = std::max(top, s[j]);
        }
        double total = 0;
        for (int j = 0; j <= last; ++j) total += std::exp(s[j] - top);
        // Each output element against the reference; the bound: P's rounding (e4m3: 2^-4 of each
        // weight at most; f16: 2^-11, with room for the sum's order) over the values averaged,
        // plus the output format's rounding.
        double v_max = 0;
        for (int d = 0; d < c.head_dim; ++d) {
          double want = 0;
          for (int j = 0; j <= last; ++j) {
            const double value = in.v.value(kv_row(j) + d, kvh);
            want += std::exp(s[j] - top) / total * value;
            v_max = std::max(v_max, std::fabs(value));
          }
          const double got = bits_to_float(out[q_row + d], c.dtype);
          const double error = std::fabs(got - (last < 0 ? 0.0 : want));
          const double bound = p_bound * v_max + 2 * testing::unit_roundoff(c.dtype) * std::fabs(want) + 1e-6;
          worst = std::max(worst, v_max > 0 ? error / v_max : error);
          sum_sq += error * error;
          ref_sq += want * want;
          if (!(error <= bound) && failures++ < 5)
            FAIL_CHECK(fmt::format("b={} i={} h={} d={}: got {} want {} (bound {})", b, i, h, d, got, want, bound));
        }
        const double lse_want = last < 0 ? -INFINITY : top + std::log(total);
        if (last < 0) {
          CHECK(std::isinf(lse[row]));
        } else {
          const double lse_error = std::fabs(lse[row] - lse_want);
          worst_lse = std::max(worst_lse, lse_error);
          // The tensor cores sum e4m3 products with fewer bits than f32 keeps, so a row's scores
          // (and its LSE) come out low by a share of the sum of their terms' magnitudes; a shift
          // common to the row's scores leaves O alone, not the LSE.
          if (!(lse_error <= 2e-3 + 1e-5 * std::fabs(lse_want) + kScoreSumBits * magnitude) && failures++ < 5)
            FAIL_CHECK(fmt::format("b={} i={} h={}: LSE {} want {}", b, i, h, lse[row], lse_want));
        }
      }
  // On average the roundings cancel: the RMS error stays well under the per-element bound.
  const double rms = ref_sq > 0 ? std::sqrt(sum_sq / ref_sq) : 0;
  MESSAGE(fmt::format("max error {:.3g} of the row's largest |v|, RMS error {:.3g} of the output's, LSE {:.3g}",
                      worst, rms, worst_lse));
  CHECK(rms < (c.p16 ? 0.005 : 0.03));
  CHECK(failures == 0);
}

}  // namespace

// A suite of its own, so that the GPU suite's prefill jobs and their sanitizers name it (a test
// outside every suite ran only in the job that turns tensor cores off, where it does not run).
TEST_SUITE("fp8_attention") {

TEST_CASE("FP8 attention on sm_90a: e4m3 q, k and v through both wgmma GEMMs against the dequantized reference") {
  if (!sm90a_target()) return not_run("FP8 attention: needs an sm_90a target");
  if (mma_forced_off() || wgmma_forced_off()) return not_run("FP8 attention: the wgmma prefill is turned off");
  std::mt19937 rng(test_seed(9011));
  // Tile edges: 64-row consumer tiles, 128-row CTAs, 128-token blocks; a kv of 1, ragged causal
  // offsets, GQA groups 1, 4 and 8, per-tensor and per-head scales, both output types.
  const Fp8AttentionCase cases[] = {
      {DType::bf16, 1, 1, 1, 4, 1, -1, false, false, false},
      {DType::bf16, 2, 129, 129, 8, 2, 0, false, false, false},
      {DType::bf16, 1, 200, 333, 4, 4, 333 - 200, true, true, false},
      {DType::fp16, 2, 64, 1000, 16, 2, -1, false, true, false},
      {DType::bf16, 1, 256, 256, 8, 1, 0, true, false, true},
      {DType::fp16, 3, 65, 127, 4, 1, 127 - 65, false, false, true},
      {DType::bf16, 1, 1024, 1024, 8, 8, 0, false, false, false},
  };
  for (Fp8AttentionCase c : cases) {
    c.seed = rng();
    run_case(c);
  }
  CHECK(loaded_variants_named(".qkv_e4m3.wgmma.") > 0);
}

TEST_CASE("FP8 attention over pages on sm_90a: e4m3 q and cache, ragged requests, NaN past each request's end") {
  if (!sm90a_target()) return not_run("FP8 attention: needs an sm_90a target");
  if (mma_forced_off() || wgmma_forced_off()) return not_run("FP8 attention: the wgmma prefill is turned off");
  std::mt19937 rng(test_seed(9013));
  // Pages of one box (8, 16 tokens) and of several (64); requests whose KV ends mid-page and
  // mid-block, one with no KV at all; chunked prefill (q shorter than the KV) and whole prompts.
  auto paged = [](DType dtype, int batch, int q_len, int kv_len, int heads, int kv_heads, int page, bool causal,
                  int shrink, bool per_head, bool peaked) {
    Fp8AttentionCase c;
    c.dtype = dtype;
    c.batch = batch;
    c.q_len = q_len;
    c.kv_len = kv_len;
    c.n_heads = heads;
    c.n_kv_heads = kv_heads;
    c.page_size = page;
    c.causal = causal;
    c.kv_shrink = shrink;
    c.per_head_q = c.per_head_kv = per_head;
    c.peaked = peaked;
    return c;
  };
  const Fp8AttentionCase cases[] = {
      paged(DType::bf16, 1, 1, 1, 4, 1, 16, true, 0, false, false),
      paged(DType::bf16, 3, 100, 333, 8, 2, 16, true, 111, false, true),
      paged(DType::fp16, 2, 129, 257, 4, 4, 8, true, 100, true, false),
      paged(DType::bf16, 4, 64, 1000, 16, 2, 64, true, 250, false, false),
      paged(DType::bf16, 2, 37, 200, 8, 1, 64, false, 63, true, true),
      paged(DType::fp16, 2, 300, 300, 4, 1, 16, true, 1, false, true),
      paged(DType::bf16, 3, 50, 100, 4, 1, 16, true, 50, false, false),  // the last request: no KV, no rows
  };
  for (Fp8AttentionCase c : cases) {
    c.seed = rng();
    run_case(c);
  }
  CHECK(loaded_variants_named("paged_prefill.bf16.hd128.ps16.g4.qkv_e4m3.wgmma.") > 0);
}

TEST_CASE("FP8 attention at head_dims 64 and 256 on sm_90a: rows of 64 bytes and of two chunks, contiguous and "
          "over pages") {
  if (!sm90a_target()) return not_run("FP8 attention: needs an sm_90a target");
  if (mma_forced_off() || wgmma_forced_off()) return not_run("FP8 attention: the wgmma prefill is turned off");
  std::mt19937 rng(test_seed(9019));
  // Tile edges as at hd128 (64-row consumers, 128-token blocks), both chunks of each row checked
  // by peaked rows; pages of one box and of several, requests ending mid-page, one with no KV.
  Fp8AttentionCase contiguous{DType::bf16, 2, 129, 300, 8, 2, 300 - 129, false, true, true};
  Fp8AttentionCase full{DType::fp16, 1, 64, 1000, 4, 1, -1, true, false, false};
  Fp8AttentionCase square{DType::bf16, 1, 256, 256, 8, 8, 0, false, false, false};
  Fp8AttentionCase paged = contiguous;
  paged.batch = 3;
  paged.page_size = 16;
  paged.kv_shrink = 111;
  Fp8AttentionCase small_pages{DType::fp16, 2, 129, 257, 4, 4, -1, true, true, false};
  small_pages.page_size = 8;
  small_pages.kv_shrink = 100;
  Fp8AttentionCase long_pages{DType::bf16, 3, 50, 100, 4, 1, -1, false, false, true};
  long_pages.page_size = 64;
  long_pages.kv_shrink = 50;  // the last request: no KV, no rows
  long_pages.causal = false;
  // hd64 with AstrAI's heads too (24/4: a group of 6, two heads packed to a row position).
  Fp8AttentionCase astrai_heads{DType::bf16, 2, 300, 300, 24, 4, 0, true, true, true};
  for (int head_dim : {64, 256}) {
    for (Fp8AttentionCase c : {contiguous, full, square, paged, small_pages, long_pages, astrai_heads}) {
      c.head_dim = head_dim;
      c.seed = rng();
      run_case(c);
    }
  }
  for (int head_dim : {64, 256}) {
    CHECK(loaded_variants_named(fmt::format("prefill.bf16.hd{}.g4.qkv_e4m3.wgmma.", head_dim)) > 0);
    CHECK(loaded_variants_named(fmt::format("paged_prefill.bf16.hd{}.ps16.g4.qkv_e4m3.wgmma.", head_dim)) > 0);
  }
}

TEST_CASE("FP8 attention with P in f16 on sm_90a: V widened, P V on f16 wgmma, a tighter bound") {
  if (!sm90a_target()) return not_run("FP8 attention: needs an sm_90a target");
  if (mma_forced_off() || wgmma_forced_off()) return not_run("FP8 attention: the wgmma prefill is turned off");
  std::mt19937 rng(test_seed(9017));
  Fp8AttentionCase contiguous{DType::bf16, 2, 129, 300, 8, 2, 300 - 129, false, true, true};
  Fp8AttentionCase full{DType::fp16, 1, 64, 1000, 4, 1, -1, true, false, false};
  Fp8AttentionCase paged = contiguous;
  paged.page_size = 16;
  paged.kv_shrink = 123;
  for (Fp8AttentionCase c : {contiguous, full, paged}) {
    c.p16 = true;
    c.seed = rng();
    run_case(c);
  }
  CHECK(loaded_variants_named(".qkv_e4m3.p_fp16.wgmma.") > 0);
}

TEST_CASE("FP8 attention refuses by name what it does not serve") {
  PrefillArgs a;
  a.batch = 1;
  a.q_len = 1;
  a.kv_len = 1;
  a.n_heads = 1;
  a.n_kv_heads = 1;
  a.head_dim = 128;
  a.qkv_dtype = KvDType::e4m3;
  // No scales: refused before any launch, the first one checked named (k_scale, as an FP8
  // cache's scales are checked first).
  CHECK_THROWS_WITH_AS(Runtime::get().prefill(a), doctest::Contains("k_scale is null"), InvalidArgument);
}

}  // TEST_SUITE

}  // namespace astrai::gpu_test
