// What the prefill and paged_prefill GPU tests share (and the multi-token decode test): the
// float64 reference of one query row, the per-case verdict (output, LSE, poison outside the
// written rows) and the variant lists' element type.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include <fmt/format.h>

#include "tests/gpu/gpu_support.hpp"

namespace astrai::gpu_test {

constexpr double kTolerance = 1e-2;  // |err| <= 1e-2 + 1e-2 |ref|, and norm-rel <= 1e-2
constexpr std::uint16_t kPoison = 0xffff;

inline std::vector<float> to_floats(const std::vector<std::uint16_t>& bits, DType dtype) {
  std::vector<float> values(bits.size());
  for (std::size_t i = 0; i < bits.size(); ++i) values[i] = bits_to_float(bits[i], dtype);
  return values;
}

// The serving features a reference row applies (the window is part of `keep`).
struct RowFeatures {
  double logit_cap = 0;     // > 0: scores become cap * tanh(s / cap)
  double sink = -INFINITY;  // a logit joining the denominator only (-inf: none)
};

// Softmax attention of one query row over n KV rows (row-major [n][d] floats) in float64.
// Returns false, with zeros and LSE -inf, when keep selects nothing and there is no sink.
inline bool attend_row(const float* q, const float* k, const float* v, int n, const std::vector<char>& keep,
                int d, double scale, std::vector<double>* out, double* lse, const RowFeatures& features = {}) {
  std::vector<double> scores(static_cast<std::size_t>(std::max(n, 1)));
  double max_score = -INFINITY;
  for (int j = 0; j < n; ++j) {
    if (!keep[j]) continue;
    double dot = 0;
    const float* k_row = k + static_cast<std::size_t>(j) * d;
    for (int c = 0; c < d; ++c) dot += static_cast<double>(q[c]) * k_row[c];
    scores[j] = soft_capped(dot * scale, features.logit_cap);
    max_score = std::max(max_score, scores[j]);
  }
  max_score = std::max(max_score, features.sink);
  out->assign(d, 0.0);
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
  return true;
}

// The keys a decode query attends to when it is token i of q_len new tokens over `len` keys
// (the new tokens included): positions [0, len - q_len + i], from that position's window on
// (window_left >= 0), where `mask` (null: none) keeps them. q_len 1 is the single-token decode.
inline std::vector<char> decode_query_keep(int len, int q_len, int i, int window_left, const std::uint8_t* mask) {
  std::vector<char> keep(static_cast<std::size_t>(std::max(len, 1)), 0);
  const long long position = static_cast<long long>(len) - q_len + i;
  for (int t = 0; t < len; ++t)
    keep[t] = t <= position && (window_left < 0 || t >= position - window_left) && (mask == nullptr || mask[t] != 0);
  return keep;
}

// Everything one case checks: output elements, LSE values, and exact expectations (zeros and
// -inf for empty rows, poison left alone outside the rows).
struct Verdict {
  Comparison out;
  Comparison lse;
  std::size_t exact_failures = 0;
  std::string first_exact_failure;
  std::size_t empty_rows = 0;

  void exact_failure(const std::string& what) {
    if (exact_failures++ == 0) first_exact_failure = what;
  }
};

struct RowId {
  int b, i, h;
  std::string text() const { return fmt::format("b={} i={} h={}", b, i, h); }
};

// Compares one output row (and its LSE) with the reference. Locations are formatted only for
// failures (there are millions of elements).
inline void check_row(Verdict* verdict, DType dtype, const std::vector<std::uint16_t>& out,
               std::int64_t out_base, const std::vector<double>& want, bool non_empty,
               const float* lse_got, double lse_want, RowId id) {
  static const std::string kNowhere;
  const int d = static_cast<int>(want.size());
  for (int c = 0; c < d; ++c) {
    const double got = bits_to_float(out[out_base + c], dtype);
    if (non_empty) {
      const bool ok = std::isfinite(got) &&
                      std::fabs(got - want[c]) <= kTolerance + kTolerance * std::fabs(want[c]);
      accumulate(&verdict->out, got, want[c], kTolerance, kTolerance,
                 ok ? kNowhere : fmt::format("{} d={}", id.text(), c));
    } else if (got != 0.0) {
      verdict->exact_failure(
          fmt::format("{} d={}: a row with nothing to attend to gave {}", id.text(), c, got));
    }
  }
  if (!non_empty) ++verdict->empty_rows;
  if (lse_got == nullptr) return;
  if (non_empty) {
    const bool ok = std::isfinite(*lse_got) &&
                    std::fabs(*lse_got - lse_want) <= kTolerance + kTolerance * std::fabs(lse_want);
    accumulate(&verdict->lse, *lse_got, lse_want, kTolerance, kTolerance,
               ok ? kNowhere : id.text() + " lse");
  } else if (!(std::isinf(*lse_got) && *lse_got < 0)) {
    verdict->exact_failure(
        fmt::format("{}: LSE of an empty row is {} (want -inf)", id.text(), *lse_got));
  }
}

// Every element of `out` that no row owns must still hold the poison.
inline void check_poison(Verdict* verdict, const std::vector<std::uint16_t>& out,
                  const std::vector<char>& written) {
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (!written[i] && out[i] != kPoison) {
      verdict->exact_failure(fmt::format("element {} outside every output row was written", i));
      return;
    }
  }
}

inline void report(const std::string& kernel, DType dtype, const std::string& description, Verdict* v) {
  finish(&v->out);
  finish(&v->lse);
  note_worst(kernel, dtype, v->out);
  INFO(description);
  MESSAGE(fmt::format("{} -> max|err| {:.3g} norm-rel {:.3g} lse max|err| {:.3g} empty rows {}",
                      description, v->out.max_abs_error, v->out.norm_rel_error,
                      v->lse.max_abs_error, v->empty_rows));
  CHECK_MESSAGE(v->out.failures == 0, v->out.first_failure);
  CHECK_MESSAGE(v->lse.failures == 0, v->lse.first_failure);
  CHECK_MESSAGE(v->exact_failures == 0, v->first_exact_failure);
  CHECK(v->out.norm_rel_error <= kTolerance);
}

// One entry of a random sweep's variant list.
struct Variant {
  DType dtype;
  int head_dim;
  int group;
  int page_size;  // paged only
};

}  // namespace astrai::gpu_test
