// What the GPU checks compare with, on the CPU: element conversions, the float64 attention row,
// the error bounds by dtype and quantity, and the per-row checker that turns a kernel's output
// into a verdict. No driver needed, so the unit suite feeds the checker deliberately wrong
// outputs (tests/unit/test_numerics.cpp) and shows that each bound catches them.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "astrai/runtime.hpp"

namespace astrai::testing {

// Host-side element conversions (round to nearest even), matching the device's.
std::uint16_t float_to_element(float value, DType dtype);
float element_to_float(std::uint16_t bits, DType dtype);

// A scaled score as the soft-cap leaves it, in float64 (cap 0: unchanged).
double soft_capped(double score, double logit_cap);

// The serving features a reference row applies (the window is part of `keep`).
struct RowFeatures {
  double logit_cap = 0;     // > 0: scores become cap * tanh(s / cap)
  double sink = -INFINITY;  // a logit joining the denominator only (-inf: none)
  double alibi_slope = 0;   // ALiBi: score j gains slope * (j - query_position) after the cap
  long long query_position = 0;
};

// Softmax attention of one query row over n KV rows (row-major [n][d] floats) in float64.
// Returns false, with zeros and LSE -inf, when keep selects nothing and there is no sink.
// `lse_slack`, when set, receives how far a correct kernel's LSE may stray beyond lse_tolerance
// through its f32 scores (lse_score_slack).
bool attend_row(const float* q, const float* k, const float* v, int n, const std::vector<char>& keep, int d,
                double scale, std::vector<double>* out, double* lse, const RowFeatures& features = {},
                double* lse_slack = nullptr);

// How far a correct kernel's output may be from the float64 reference.
//   row:  ||got - want|| / ||want|| over one output row (one query row and head).
//   elem: |got - want| <= elem_rel * |want| + elem_row * rms(want row), every element.
struct Tolerance {
  double row = 0;
  double elem_rel = 0;
  double elem_row = 0;
  // The output format's spacing near zero: below its smallest normal value (fp16: 2^-14) the
  // rounding error stops shrinking with the value, so no relative bound holds there (rows a
  // heavy sink leaves near 1e-7). One spacing of the subnormals, per element (and sqrt(d) of it
  // in a row's norm).
  double floor = 0;
};

// The unit roundoff of the output dtype: 2^-8 for bf16 (8 significant bits), 2^-11 for fp16.
double unit_roundoff(DType dtype);

// Attention outputs (see numerics.cpp for the derivation): bf16 1e-2 a row, fp16 2e-3.
Tolerance attention_tolerance(DType dtype);
// Rotary outputs: one rounding of an f32 value, u |want| at most.
Tolerance rotary_tolerance(DType dtype);
// The LSE (natural log, f32): 2e-5 + 2e-6 |want|.
double lse_tolerance(double want);
// The LSE moves by the softmax-weighted error of the scores. A score summed in f32 over d
// products whose partial sums wander as far as sqrt(sum_c (q_c k_c)^2) is off by about that times
// 2^-24 sqrt(d): nothing next to lse_tolerance on unit-scale data, but a small score made of large
// products is not: an fp16 MLA row (576 dims, 3 keys of gain up to 3.7 at scale 1, LSE 1.39) came
// out 2.6e-5 off on both MLA kernels alike, over lse_tolerance's 2.3e-5.
// Returns 4x that, weighted by the row's probabilities p_j; `weighted_magnitude` is
// sum_j p_j |scale| sqrt(sum_c (q_c k_jc)^2).
double lse_score_slack(double weighted_magnitude, int d);

// Checks a case's output rows and LSE values one by one. Locations are formatted only for the
// first failure (`where` is called then).
class RowCheck {
 public:
  explicit RowCheck(Tolerance tolerance) : tolerance_(tolerance) {}

  // One output row of d elements. non_empty false: a row with nothing to attend to, which
  // must be exactly zero.
  void row(const float* got, const double* want, int d, bool non_empty, const std::function<std::string()>& where);
  // One row given as raw output elements (bf16 or fp16 bits).
  void row_bits(const std::uint16_t* got, DType dtype, const double* want, int d, bool non_empty,
                const std::function<std::string()>& where);
  // The LSE of a row: -inf exactly when want is -inf, else within lse_tolerance(want) + slack
  // (attend_row's lse_slack).
  void lse(float got, double want, const std::function<std::string()>& where, double slack = 0);
  // A check with a yes/no answer (poison left alone, a cache byte, ...).
  void expect(bool ok, const std::function<std::string()>& what);

  bool passed() const { return failures_ == 0; }
  std::size_t failures() const { return failures_; }
  const std::string& first_failure() const { return first_failure_; }
  std::size_t rows() const { return rows_; }
  std::size_t empty_rows() const { return empty_rows_; }
  std::size_t elements() const { return elements_; }
  std::size_t lse_values() const { return lse_values_; }
  double worst_row() const { return worst_row_; }      // largest row relative norm (rows above the floor)
  std::size_t floor_rows() const { return floor_rows_; }  // rows small enough to be judged by the floor
  double worst_elem() const { return worst_elem_; }    // largest |err| / element bound
  double worst_lse() const { return worst_lse_; }      // largest LSE |err|
  double max_abs_error() const { return max_abs_; }
  const Tolerance& tolerance() const { return tolerance_; }
  // "rows 120 (3 empty, 0 under the format's floor) worst row 2.1e-03 of 1.0e-02, element 0.31 of
  // its bound, lse 4.8e-06 (120)"
  std::string summary() const;

 private:
  void fail(const std::function<std::string()>& what);

  Tolerance tolerance_;
  std::size_t failures_ = 0;
  std::string first_failure_;
  std::size_t rows_ = 0, empty_rows_ = 0, floor_rows_ = 0, elements_ = 0, lse_values_ = 0;
  double worst_row_ = 0, worst_elem_ = 0, worst_lse_ = 0, max_abs_ = 0;
};

// The base seed of the GPU suites' random data: ASTRAI_TEST_SEED when set (decimal), else a
// fixed default, so that a plain run repeats and scripts/gpu/run_gpu_suite.sh varies it per run.
unsigned base_seed();
// The seed of a case or sweep whose fixed seed was `fixed`: the same as `fixed` under the
// default base seed, mixed with the base seed otherwise.
unsigned test_seed(unsigned fixed);

// ASTRAI_REQUIRE_GPU=1: this is a GPU runner, so what would skip (no GPU, exit 77, an empty
// filter) must fail instead.
bool gpu_required();

}  // namespace astrai::testing
