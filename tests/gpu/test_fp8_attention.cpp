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
};

constexpr int kHeadDim = 128;

// Values of one tensor as e4m3 codes with their scales (one, or one per head of `heads`): the
// largest magnitude of each scale's slice lands on 448.
struct Quantized {
  std::vector<std::uint8_t> codes;
  std::vector<float> scales;
  float value(std::size_t i, int head) const {
    return fp8_to_float(codes[i], KvDType::e4m3) * scales[scales.size() == 1 ? 0 : head];
  }
};

Quantized quantize(const std::vector<float>& x, int heads, bool per_head) {
  Quantized q;
  q.scales.assign(per_head ? heads : 1, 0.f);
  for (std::size_t i = 0; i < x.size(); ++i) {
    const int h = per_head ? static_cast<int>(i / kHeadDim) % heads : 0;
    q.scales[h] = std::max(q.scales[h], std::fabs(x[i]) / 448.f);
  }
  for (float& s : q.scales) s = s > 0.f ? s : 1.f;
  q.codes.resize(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const int h = per_head ? static_cast<int>(i / kHeadDim) % heads : 0;
    q.codes[i] = float_to_fp8(x[i] / q.scales[h], KvDType::e4m3);
  }
  return q;
}

void run_case(const Fp8AttentionCase& c) {
  CAPTURE(fmt::format("B{} q{} kv{} heads {}/{} causal_offset {} per-head q {} kv {} peaked {} {}", c.batch, c.q_len,
                      c.kv_len, c.n_heads, c.n_kv_heads, c.causal_offset, c.per_head_q, c.per_head_kv, c.peaked,
                      c.dtype == DType::bf16 ? "bf16" : "fp16"));
  std::mt19937 rng(c.seed);
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> unit(0.f, 1.f);
  const std::size_t q_count = static_cast<std::size_t>(c.batch) * c.q_len * c.n_heads * kHeadDim;
  const std::size_t kv_count = static_cast<std::size_t>(c.batch) * c.kv_len * c.n_kv_heads * kHeadDim;
  auto draw = [&](std::size_t n) {
    std::vector<float> x(n);
    for (float& v : x) v = normal(rng) * (unit(rng) < 0.002f ? c.outlier : 1.f);
    return x;
  };
  std::vector<float> k = draw(kv_count), v = draw(kv_count), q = draw(q_count);
  const int group = c.n_heads / c.n_kv_heads;
  if (c.peaked && c.kv_len > 0) {
    // q = 2.5 k_j + noise for a key j the row sees: its score stands well above the others.
    for (int b = 0; b < c.batch; ++b)
      for (int i = 0; i < c.q_len; ++i) {
        const int last = c.causal_offset >= 0 ? std::min(c.kv_len - 1, c.causal_offset + i) : c.kv_len - 1;
        if (last < 0) continue;
        for (int h = 0; h < c.n_heads; ++h) {
          const int j = static_cast<int>(rng() % (last + 1));
          for (int d = 0; d < kHeadDim; ++d)
            q[((static_cast<std::size_t>(b) * c.q_len + i) * c.n_heads + h) * kHeadDim + d] =
                2.5f * k[((static_cast<std::size_t>(b) * c.kv_len + j) * c.n_kv_heads + h / group) * kHeadDim + d] +
                0.1f * normal(rng);
        }
      }
  }
  const Quantized qq = quantize(q, c.n_heads, c.per_head_q);
  const Quantized kq = quantize(k, c.n_kv_heads, c.per_head_kv);
  const Quantized vq = quantize(v, c.n_kv_heads, c.per_head_kv);

  DeviceBuffer q_dev = DeviceBuffer::from(qq.codes), k_dev = DeviceBuffer::from(kq.codes),
               v_dev = DeviceBuffer::from(vq.codes);
  DeviceBuffer q_scale = DeviceBuffer::from(qq.scales), k_scale = DeviceBuffer::from(kq.scales),
               v_scale = DeviceBuffer::from(vq.scales);
  DeviceBuffer out_dev(std::max<std::size_t>(q_count * 2, 16));
  out_dev.fill_byte(0xff);
  const std::size_t rows = static_cast<std::size_t>(c.batch) * c.q_len * c.n_heads;
  DeviceBuffer lse_dev(std::max<std::size_t>(rows * 4, 16));
  lse_dev.fill_byte(0xff);

  PrefillArgs a;
  a.dtype = c.dtype;
  a.batch = c.batch;
  a.q_len = c.q_len;
  a.kv_len = c.kv_len;
  a.n_heads = c.n_heads;
  a.n_kv_heads = c.n_kv_heads;
  a.head_dim = kHeadDim;
  a.causal_offset = c.causal_offset;
  a.q = q_dev.get();
  a.k = k_dev.get();
  a.v = v_dev.get();
  a.out = out_dev.get();
  a.lse = static_cast<float*>(lse_dev.get());
  a.qkv_dtype = KvDType::e4m3;
  a.q_scale = static_cast<const float*>(q_scale.get());
  a.q_scale_per_head = c.per_head_q;
  a.k_scale = static_cast<const float*>(k_scale.get());
  a.v_scale = static_cast<const float*>(v_scale.get());
  a.kv_scale_per_head = c.per_head_kv;
  Runtime::get().prefill(a);
  synchronize();
  const std::vector<std::uint16_t> out = out_dev.to_host<std::uint16_t>(q_count);
  const std::vector<float> lse = lse_dev.to_host<float>(rows);

  const double scale = 1.0 / std::sqrt(static_cast<double>(kHeadDim));
  double worst = 0, worst_lse = 0, sum_sq = 0, ref_sq = 0;
  int failures = 0;
  std::vector<double> s(static_cast<std::size_t>(std::max(c.kv_len, 1)));
  for (int b = 0; b < c.batch; ++b)
    for (int i = 0; i < c.q_len; ++i)
      for (int h = 0; h < c.n_heads; ++h) {
        const int kvh = h / group;
        const std::size_t q_row = ((static_cast<std::size_t>(b) * c.q_len + i) * c.n_heads + h) * kHeadDim;
        const int last = c.causal_offset >= 0 ? std::min(c.kv_len - 1, c.causal_offset + i) : c.kv_len - 1;
        double top = -INFINITY;
        for (int j = 0; j <= last; ++j) {
          const std::size_t k_row = ((static_cast<std::size_t>(b) * c.kv_len + j) * c.n_kv_heads + kvh) * kHeadDim;
          double dot = 0;
          for (int d = 0; d < kHeadDim; ++d) dot += double(qq.value(q_row + d, h)) * kq.value(k_row + d, kvh);
          s[j] = dot * scale;
          top = std::max(top, s[j]);
        }
        double total = 0;
        for (int j = 0; j <= last; ++j) total += std::exp(s[j] - top);
        // Each output element against the reference; the bound: P's e4m3 rounding (2^-4 of each
        // weight at most) over the values averaged, plus the output format's rounding.
        double v_max = 0;
        for (int d = 0; d < kHeadDim; ++d) {
          double want = 0;
          for (int j = 0; j <= last; ++j) {
            const std::size_t v_row = ((static_cast<std::size_t>(b) * c.kv_len + j) * c.n_kv_heads + kvh) * kHeadDim;
            const double value = vq.value(v_row + d, kvh);
            want += std::exp(s[j] - top) / total * value;
            v_max = std::max(v_max, std::fabs(value));
          }
          const double got = bits_to_float(out[q_row + d], c.dtype);
          const double error = std::fabs(got - (last < 0 ? 0.0 : want));
          const double bound = 0.0625 * v_max + 2 * testing::unit_roundoff(c.dtype) * std::fabs(want) + 1e-6;
          worst = std::max(worst, v_max > 0 ? error / v_max : error);
          sum_sq += error * error;
          ref_sq += want * want;
          if (!(error <= bound) && failures++ < 5)
            FAIL_CHECK(fmt::format("b={} i={} h={} d={}: got {} want {} (bound {})", b, i, h, d, got, want, bound));
        }
        const std::size_t row = (static_cast<std::size_t>(b) * c.q_len + i) * c.n_heads + h;
        const double lse_want = last < 0 ? -INFINITY : top + std::log(total);
        if (last < 0) {
          CHECK(std::isinf(lse[row]));
        } else {
          const double lse_error = std::fabs(lse[row] - lse_want);
          worst_lse = std::max(worst_lse, lse_error);
          if (!(lse_error <= 2e-3 + 1e-5 * std::fabs(lse_want)) && failures++ < 5)
            FAIL_CHECK(fmt::format("b={} i={} h={}: LSE {} want {}", b, i, h, lse[row], lse_want));
        }
      }
  // On average the roundings cancel: the RMS error stays well under the per-element bound.
  const double rms = ref_sq > 0 ? std::sqrt(sum_sq / ref_sq) : 0;
  MESSAGE(fmt::format("max error {:.3g} of the row's largest |v|, RMS error {:.3g} of the output's, LSE {:.3g}",
                      worst, rms, worst_lse));
  CHECK(rms < 0.03);
  CHECK(failures == 0);
}

}  // namespace

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

TEST_CASE("FP8 attention refuses by name what it does not serve") {
  PrefillArgs a;
  a.batch = 1;
  a.q_len = 1;
  a.kv_len = 1;
  a.n_heads = 1;
  a.n_kv_heads = 1;
  a.head_dim = kHeadDim;
  a.qkv_dtype = KvDType::e4m3;
  // No scales: refused before any launch.
  CHECK_THROWS_WITH_AS(Runtime::get().prefill(a), doctest::Contains("q_scale"), InvalidArgument);
}

}  // namespace astrai::gpu_test
