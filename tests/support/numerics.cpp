#include "tests/support/numerics.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "tests/support/half.hpp"

namespace astrai::testing {

std::uint16_t float_to_element(float value, DType dtype) {
  if (dtype == DType::bf16) {
    std::uint32_t bits;
    std::memcpy(&bits, &value, 4);
    if (std::isnan(value)) return 0x7fc0;
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return static_cast<std::uint16_t>(bits >> 16);
  }
  return float_to_half_bits(value);
}

float element_to_float(std::uint16_t bits, DType dtype) {
  if (dtype == DType::bf16) {
    const std::uint32_t wide = static_cast<std::uint32_t>(bits) << 16;
    float value;
    std::memcpy(&value, &wide, 4);
    return value;
  }
  return half_bits_to_float(bits);
}

double soft_capped(double score, double logit_cap) {
  return logit_cap > 0 ? logit_cap * std::tanh(score / logit_cap) : score;
}

bool attend_row(const float* q, const float* k, const float* v, int n, const std::vector<char>& keep, int d,
                double scale, std::vector<double>* out, double* lse, const RowFeatures& features,
                double* lse_slack) {
  std::vector<double> scores(static_cast<std::size_t>(std::max(n, 1)));
  std::vector<double> magnitudes(lse_slack != nullptr ? scores.size() : 0);
  double max_score = -INFINITY;
  for (int j = 0; j < n; ++j) {
    if (!keep[j]) continue;
    double dot = 0, squares = 0;
    const float* k_row = k + static_cast<std::size_t>(j) * d;
    for (int c = 0; c < d; ++c) {
      const double product = static_cast<double>(q[c]) * k_row[c];
      dot += product;
      squares += product * product;
    }
    if (lse_slack != nullptr) magnitudes[j] = std::fabs(scale) * std::sqrt(squares);
    scores[j] = soft_capped(dot * scale, features.logit_cap) +
                features.alibi_slope * static_cast<double>(j - features.query_position);
    max_score = std::max(max_score, scores[j]);
  }
  max_score = std::max(max_score, features.sink);
  out->assign(d, 0.0);
  if (lse_slack != nullptr) *lse_slack = 0;
  if (max_score == -INFINITY) {
    *lse = -INFINITY;
    return false;
  }
  double total = features.sink > -INFINITY ? std::exp(features.sink - max_score) : 0.0;
  for (int j = 0; j < n; ++j) {
    if (!keep[j]) continue;
    const double w = std::exp(scores[j] - max_score);
    total += w;
    const float* v_row = v + static_cast<std::size_t>(j) * d;
    for (int c = 0; c < d; ++c) (*out)[c] += w * v_row[c];
  }
  for (int c = 0; c < d; ++c) (*out)[c] /= total;
  *lse = max_score + std::log(total);
  if (lse_slack != nullptr) {
    double weighted = 0;
    for (int j = 0; j < n; ++j)
      if (keep[j]) weighted += std::exp(scores[j] - *lse) * magnitudes[j];
    *lse_slack = lse_score_slack(weighted, d);
  }
  return true;
}

double unit_roundoff(DType dtype) { return dtype == DType::bf16 ? 0x1p-8 : 0x1p-11; }

// Where a correct kernel's output error comes from, with u the dtype's unit roundoff: the
// scores and the softmax are f32 (errors near 2^-22, negligible here); the probabilities P are
// rounded to the MMA's 16-bit type before P V (each weight off by at most u relative: the row
// off by at most u in norm, about 0.4 u rms as the errors are random); the f32 split partials
// are merged in f32; the result is rounded once more (at most u per element, about 0.4 u rms).
// So a row's relative norm error is about 0.6 u rms and at most about 1.6 u (a row of two keys,
// P's rounding and the output's adding up): the row bound is 2.5 u for bf16 (9.8e-3, taken as
// 1e-2) and 4 u for fp16 (2e-3), whose u is small enough that the f32 terms start to count. The
// emulation in tests/unit/test_numerics.cpp reaches 0.9 u (bf16) and 0.7 u (fp16). An element
// may be off by u |want| (its rounding) plus P's rounding, whose size follows the row's
// magnitude, not the element's: 4 u (|want| + rms).
Tolerance attention_tolerance(DType dtype) {
  const double u = unit_roundoff(dtype);
  Tolerance t;
  t.row = dtype == DType::bf16 ? 1e-2 : 2e-3;
  t.elem_rel = 4 * u;
  t.elem_row = 4 * u;
  t.floor = dtype == DType::bf16 ? 0x1p-133 : 0x1p-24;
  return t;
}

// x0 c - x1 s in f32, rounded once: u |want| at most, with a hair (2^-10 of it, and 2^-16 of
// the row's rms for values that cancel) for the f32 evaluation before the rounding.
Tolerance rotary_tolerance(DType dtype) {
  const double u = unit_roundoff(dtype);
  Tolerance t;
  t.row = u;
  t.elem_rel = u * (1 + 0x1p-10);
  t.elem_row = 0x1p-16;
  t.floor = dtype == DType::bf16 ? 0x1p-133 : 0x1p-24;
  return t;
}

// The LSE is m + log(l) in f32: scores off by |s| 2^-24 sqrt(d) (f32 dot products), ex2/lg2
// approximations near 2^-22, the sum l over up to a few hundred blocks and splits at 2^-24 a
// step. That is about 5e-6 + 5e-7 |lse| at worst (the Hopper prefill measured 8.7e-7 at |lse|
// near 5); the bound is 4x that.
double lse_tolerance(double want) { return 2e-5 + 2e-6 * std::fabs(want); }

double lse_score_slack(double weighted_magnitude, int d) {
  return 4 * 0x1p-24 * std::sqrt(static_cast<double>(std::max(d, 1))) * weighted_magnitude;
}

void RowCheck::fail(const std::function<std::string()>& what) {
  if (failures_++ == 0) first_failure_ = what();
}

void RowCheck::row(const float* got, const double* want, int d, bool non_empty,
                   const std::function<std::string()>& where) {
  ++rows_;
  elements_ += static_cast<std::size_t>(d);
  if (!non_empty) {
    ++empty_rows_;
    for (int c = 0; c < d; ++c)
      if (got[c] != 0.f) {
        fail([&] { return fmt::format("{} d={}: a row with nothing to attend to gave {}", where(), c, got[c]); });
        return;
      }
    return;
  }
  double sum_sq_want = 0;
  for (int c = 0; c < d; ++c) sum_sq_want += want[c] * want[c];
  const double rms = d > 0 ? std::sqrt(sum_sq_want / d) : 0.0;
  double sum_sq_err = 0;
  int first_bad = -1;
  for (int c = 0; c < d; ++c) {
    if (!std::isfinite(got[c])) {
      sum_sq_err = INFINITY;
      if (first_bad < 0) first_bad = c;
      continue;
    }
    const double err = std::fabs(got[c] - want[c]);
    sum_sq_err += err * err;
    max_abs_ = std::max(max_abs_, err);
    const double bound = tolerance_.elem_rel * std::fabs(want[c]) + tolerance_.elem_row * rms + tolerance_.floor;
    const double ratio = bound > 0 ? err / bound : (err > 0 ? INFINITY : 0.0);
    worst_elem_ = std::max(worst_elem_, ratio);
    if (ratio > 1 && first_bad < 0) first_bad = c;
  }
  // A row whose reference is exactly zero (every kept value zero) must come out zero.
  const double rel = sum_sq_want > 0 ? std::sqrt(sum_sq_err / sum_sq_want) : (sum_sq_err > 0 ? INFINITY : 0.0);
  // A row so small that the format's floor allows more than the relative bound is judged by the
  // floor; its relative error says nothing of the kernel and stays out of the worst row.
  const bool under_floor = tolerance_.row * std::sqrt(sum_sq_want) < tolerance_.floor * std::sqrt(d);
  if (under_floor && std::isfinite(sum_sq_err))
    ++floor_rows_;
  else
    worst_row_ = std::max(worst_row_, rel);
  if (first_bad >= 0) {
    fail([&] {
      return fmt::format("{} d={}: got {} want {:.6g} (bound {:.3g}; row rms {:.3g})", where(), first_bad,
                         got[first_bad], want[first_bad],
                         tolerance_.elem_rel * std::fabs(want[first_bad]) + tolerance_.elem_row * rms +
                             tolerance_.floor,
                         rms);
    });
  } else if (!(rel <= tolerance_.row) &&
             !(std::sqrt(sum_sq_err) <= tolerance_.row * std::sqrt(sum_sq_want) + tolerance_.floor * std::sqrt(d))) {
    fail([&] { return fmt::format("{}: row relative error {:.3g} > {:.3g}", where(), rel, tolerance_.row); });
  }
}

void RowCheck::row_bits(const std::uint16_t* got, DType dtype, const double* want, int d, bool non_empty,
                        const std::function<std::string()>& where) {
  std::vector<float> values(static_cast<std::size_t>(std::max(d, 0)));
  for (int c = 0; c < d; ++c) values[c] = element_to_float(got[c], dtype);
  row(values.data(), want, d, non_empty, where);
}

void RowCheck::lse(float got, double want, const std::function<std::string()>& where, double slack) {
  ++lse_values_;
  if (std::isinf(want) && want < 0) {
    if (!(std::isinf(got) && got < 0)) fail([&] { return fmt::format("{} lse: got {} want -inf", where(), got); });
    return;
  }
  const double err = std::isfinite(got) ? std::fabs(got - want) : INFINITY;
  worst_lse_ = std::max(worst_lse_, err);
  const double bound = lse_tolerance(want) + slack;
  if (!(err <= bound))
    fail([&] {
      return fmt::format("{} lse: got {:.9g} want {:.9g} (|err| {:.3g} > {:.3g})", where(), got, want, err, bound);
    });
}

void RowCheck::expect(bool ok, const std::function<std::string()>& what) {
  if (!ok) fail(what);
}

std::string RowCheck::summary() const {
  return fmt::format("rows {} ({} empty, {} under the format's floor) worst row {:.2e} of {:.1e}, element {:.2f} of "
                     "its bound, lse {:.2e} ({})",
                     rows_, empty_rows_, floor_rows_, worst_row_, tolerance_.row, worst_elem_, worst_lse_, lse_values_);
}

namespace {
constexpr unsigned kDefaultSeed = 0;
}

unsigned base_seed() {
  const char* value = std::getenv("ASTRAI_TEST_SEED");
  if (!value || !*value) return kDefaultSeed;
  return static_cast<unsigned>(std::strtoul(value, nullptr, 10));
}

unsigned test_seed(unsigned fixed) {
  const unsigned base = base_seed();
  if (base == kDefaultSeed) return fixed;
  // splitmix64's finalizer: nearby seeds give unrelated streams.
  std::uint64_t x = (static_cast<std::uint64_t>(base) << 32) ^ fixed;
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return static_cast<unsigned>(x ^ (x >> 31));
}

bool gpu_required() {
  const char* value = std::getenv("ASTRAI_REQUIRE_GPU");
  return value && (std::string(value) == "1" || std::string(value) == "true");
}

}  // namespace astrai::testing
