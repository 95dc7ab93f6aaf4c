// The GPU suites' comparisons (tests/support/numerics) fed on the CPU: an emulated kernel that
// rounds where the kernels round (scores and softmax in f32, P to the 16-bit type before P V,
// split partials merged in f32, one final rounding) must pass, across dtypes, head dims, long
// and peaked rows, splits and features; the same emulation with a bug (output scaled by 0.97, a
// split dropped, the window shifted, the sink left out, a quarter of the tokens dropped) must
// fail. Mutation checks for the checker itself: a bound that passes a wrong kernel is no bound.
#include <doctest/doctest.h>

#include <algorithm>
#include <cfenv>
#include <cmath>
#include <random>

#include <fmt/format.h>

#include "tests/support/numerics.hpp"
#include "tests/support/support.hpp"

namespace astrai::testing {
namespace {

enum class Bug { none, scaled, dropped_split, shifted_window, missing_sink, dropped_quarter, one_element, lse_off };

struct RowCase {
  DType dtype = DType::bf16;
  int n = 500;            // keys
  int d = 128;
  int splits = 1;         // KV splits merged through their LSE, as the split-KV combine
  double scale = 0;       // 0: 1/sqrt(d)
  float key_ramp = 0;     // > 0: key j scaled by 1 + ramp * j / n (maxima rise along the walk)
  bool cancel = false;    // keys nearly orthogonal to q: large products, scores near 0
  bool chop = false;      // scores summed by f32 adds rounded toward zero (tensor cores truncate)
  int window_left = -1;
  double logit_cap = 0;
  double sink = -INFINITY;
  unsigned seed = 1;
  std::string text() const {
    return fmt::format("{} n={} d={} splits={} scale={} ramp={} cancel={} chop={} window={} cap={} sink={} seed={}",
                       dtype_name(dtype), n, d, splits, scale, key_ramp, cancel, chop, window_left, logit_cap, sink, seed);
  }
};

struct RowData {
  std::vector<float> q, k, v;
};

RowData make_row_data(const RowCase& c) {
  std::mt19937 rng(c.seed);
  std::uniform_real_distribution<float> uniform(-1.f, 1.f);
  auto draw = [&](std::size_t count) {
    std::vector<float> values(count);
    for (auto& x : values) x = element_to_float(float_to_element(uniform(rng), c.dtype), c.dtype);
    return values;
  };
  RowData data{draw(c.d), draw(static_cast<std::size_t>(c.n) * c.d), draw(static_cast<std::size_t>(c.n) * c.d)};
  if (c.key_ramp > 0)
    for (int j = 0; j < c.n; ++j)
      for (int e = 0; e < c.d; ++e) {
        float& x = data.k[static_cast<std::size_t>(j) * c.d + e];
        x = element_to_float(float_to_element(x * (1.f + c.key_ramp * j / c.n), c.dtype), c.dtype);
      }
  if (c.cancel)  // k_j minus its projection on q (then rounded): the dot product nearly cancels
    for (int j = 0; j < c.n; ++j) {
      float* k = data.k.data() + static_cast<std::size_t>(j) * c.d;
      double kq = 0, qq = 0;
      for (int e = 0; e < c.d; ++e) {
        kq += static_cast<double>(k[e]) * data.q[e];
        qq += static_cast<double>(data.q[e]) * data.q[e];
      }
      for (int e = 0; e < c.d; ++e)
        k[e] = element_to_float(float_to_element(static_cast<float>(k[e] - kq / qq * data.q[e]), c.dtype), c.dtype);
    }
  return data;
}

// The last query position sees keys [n - 1 - window_left, n - 1].
std::vector<char> window_keep(int n, int window_left) {
  std::vector<char> keep(static_cast<std::size_t>(std::max(n, 1)), 0);
  for (int j = 0; j < n; ++j) keep[j] = window_left < 0 || j >= n - 1 - window_left;
  return keep;
}

struct KernelRow {
  std::vector<float> out;  // rounded to the dtype
  float lse = 0;
};

// A score's dot product in f32: serial adds rounded to nearest, or as a tensor core's k-steps at
// worst: each step's 16 products summed, then added to the f32 accumulator rounded toward zero
// (errors that do not cancel).
float score_dot(const float* q, const float* k, int d, bool chop) {
  if (!chop) {
    float dot = 0;
    for (int e = 0; e < d; ++e) dot += q[e] * k[e];
    return dot;
  }
  const int mode = std::fegetround();
  volatile float dot = 0;  // each add rounded in the mode of its time, never folded
  for (int e = 0; e < d; e += 16) {
    double step = 0;
    for (int x = e; x < std::min(d, e + 16); ++x) step += static_cast<double>(q[x]) * k[x];
    const float rounded = static_cast<float>(step);
    std::fesetround(FE_TOWARDZERO);
    dot = dot + rounded;
    std::fesetround(mode);
  }
  return dot;
}

// A kernel's arithmetic for one row, with `bug` injected.
KernelRow emulate_kernel(const RowCase& c, const RowData& data, Bug bug) {
  const double scale = c.scale > 0 ? c.scale : 1.0 / std::sqrt(static_cast<double>(c.d));
  std::vector<char> keep = window_keep(c.n, c.window_left);
  if (bug == Bug::shifted_window) {  // the window of the position before: one key early at each end
    keep = window_keep(c.n - 1, c.window_left);
    keep.resize(static_cast<std::size_t>(std::max(c.n, 1)), 0);
  }
  if (bug == Bug::dropped_quarter)
    for (int j = 0; j < c.n; j += 4) keep[j] = 0;
  const float sink = bug == Bug::missing_sink ? -INFINITY : static_cast<float>(c.sink);
  const int per_split = (c.n + c.splits - 1) / c.splits;
  std::vector<std::vector<float>> partial_out;
  std::vector<float> partial_lse;
  for (int s = 0; s < c.splits; ++s) {
    if (bug == Bug::dropped_split && s == c.splits - 1) break;
    float m = s == 0 ? sink : -INFINITY;  // split 0 carries the sink
    std::vector<float> scores(static_cast<std::size_t>(per_split), -INFINITY);
    for (int j = s * per_split; j < std::min(c.n, (s + 1) * per_split); ++j) {
      if (!keep[j]) continue;
      const float dot = score_dot(data.q.data(), data.k.data() + static_cast<std::size_t>(j) * c.d, c.d, c.chop);
      float score = dot * static_cast<float>(scale);
      if (c.logit_cap > 0) score = static_cast<float>(c.logit_cap) * std::tanh(score / static_cast<float>(c.logit_cap));
      scores[j - s * per_split] = score;
      m = std::max(m, score);
    }
    std::vector<float> acc(c.d, 0.f);
    float l = (s == 0 && sink > -INFINITY) ? std::exp(sink - m) : 0.f;
    for (int j = s * per_split; j < std::min(c.n, (s + 1) * per_split); ++j) {
      const float score = scores[j - s * per_split];
      if (score == -INFINITY) continue;
      const float p = std::exp(score - m);
      l += p;
      const float p16 = element_to_float(float_to_element(p, c.dtype), c.dtype);  // the MMA's operand
      for (int e = 0; e < c.d; ++e) acc[e] += p16 * data.v[static_cast<std::size_t>(j) * c.d + e];
    }
    if (l == 0.f) continue;
    for (auto& x : acc) x /= l;
    partial_out.push_back(acc);
    partial_lse.push_back(m + std::log(l));
  }
  KernelRow row;
  row.out.assign(c.d, 0.f);
  if (partial_lse.empty()) {
    row.lse = -INFINITY;
    return row;
  }
  const float top = *std::max_element(partial_lse.begin(), partial_lse.end());
  float total = 0;
  for (std::size_t s = 0; s < partial_lse.size(); ++s) {
    const float w = std::exp(partial_lse[s] - top);
    total += w;
    for (int e = 0; e < c.d; ++e) row.out[e] += w * partial_out[s][e];
  }
  for (auto& x : row.out) {
    x /= total;
    if (bug == Bug::scaled) x *= 0.97f;
    x = element_to_float(float_to_element(x, c.dtype), c.dtype);
  }
  if (bug == Bug::one_element) row.out[c.d / 2] = row.out[c.d / 2] * 1.5f + 0.01f;
  row.lse = top + std::log(total);
  if (bug == Bug::lse_off) row.lse += 2e-4f;
  return row;
}

// The checker's verdict on one row of the emulated kernel.
RowCheck check_emulated(const RowCase& c, Bug bug, DType checked_as) {
  const RowData data = make_row_data(c);
  RowFeatures features;
  features.logit_cap = c.logit_cap;
  features.sink = c.sink;
  const double scale = c.scale > 0 ? c.scale : 1.0 / std::sqrt(static_cast<double>(c.d));
  std::vector<double> want;
  double want_lse = 0, lse_slack = 0;
  const bool non_empty = attend_row(data.q.data(), data.k.data(), data.v.data(), c.n, window_keep(c.n, c.window_left),
                                    c.d, scale, &want, &want_lse, features, &lse_slack);
  const KernelRow got = emulate_kernel(c, data, bug);
  RowCheck check(attention_tolerance(checked_as));
  check.row(got.out.data(), want.data(), c.d, non_empty, [&] { return c.text(); });
  check.lse(got.lse, want_lse, [&] { return c.text(); }, lse_slack);
  return check;
}

// Correct rows over the shapes the suites use: short and long, flat and peaked, split, with
// the features; both dtypes and the head dims at the ends of the range.
std::vector<RowCase> correct_cases() {
  std::vector<RowCase> cases;
  unsigned seed = 100;
  for (DType dtype : {DType::bf16, DType::fp16})
    for (int d : {32, 128, 256, 576})
      for (int n : {1, 2, 17, 900, 5000}) {
        RowCase c;
        c.dtype = dtype;
        c.d = d;
        c.n = n;
        c.splits = n >= 900 ? 4 : 1;
        c.seed = seed++;
        cases.push_back(c);
        c.scale = 1.0;  // peaked: scores spread over +-10 and more
        c.key_ramp = 5.f;
        c.seed = seed++;
        cases.push_back(c);
        c.scale = 0;
        c.key_ramp = 0;
        c.sink = n % 2 ? 7.0 : -2.0;
        c.logit_cap = n == 900 ? 4.0 : 0.0;
        c.window_left = n > 17 ? n / 3 : -1;
        c.seed = seed++;
        cases.push_back(c);
      }
  // MLA's 576 dims with keys of gain up to 5 at scale 1 that nearly cancel against q: scores
  // near 0, so the LSE is small, while the f32 sums wander far (lse_score_slack's case).
  for (DType dtype : {DType::bf16, DType::fp16})
    for (int n : {1, 3, 17})
      for (int round = 0; round < 8; ++round) {
        RowCase c;
        c.dtype = dtype;
        c.d = 576;
        c.n = n;
        c.scale = 1.0;
        c.key_ramp = 4.f;
        c.cancel = true;
        c.chop = round % 2 == 1;
        c.seed = seed++;
        cases.push_back(c);
      }
  return cases;
}

}  // namespace

TEST_SUITE("numerics") {

TEST_CASE("an emulated correct kernel passes every bound: dtypes, head dims, long, peaked and split rows") {
  double worst_row[2] = {0, 0};
  double worst_lse = 0;
  for (const RowCase& c : correct_cases()) {
    CAPTURE(c.text());
    const RowCheck check = check_emulated(c, Bug::none, c.dtype);
    CHECK_MESSAGE(check.passed(), check.first_failure());
    worst_row[c.dtype == DType::fp16] = std::max(worst_row[c.dtype == DType::fp16], check.worst_row());
    worst_lse = std::max(worst_lse, check.worst_lse());
  }
  // Margins: the emulation's worst row stays well inside each bound (the bounds are not at the
  // edge of what a correct kernel gives), and not far below it (they are not 100x loose).
  MESSAGE(fmt::format("worst row bf16 {:.2e} fp16 {:.2e}, lse {:.2e}", worst_row[0], worst_row[1], worst_lse));
  CHECK(worst_row[0] < 0.6 * attention_tolerance(DType::bf16).row);
  CHECK(worst_row[1] < 0.6 * attention_tolerance(DType::fp16).row);
  CHECK(worst_row[0] > attention_tolerance(DType::bf16).row / 20);
}

TEST_CASE("the checker fails an output scaled by 0.97 in both dtypes, short and long rows") {
  for (DType dtype : {DType::bf16, DType::fp16})
    for (int n : {1, 64, 30000}) {
      RowCase c;
      c.dtype = dtype;
      c.n = n;
      c.splits = n > 1000 ? 8 : 1;
      CAPTURE(c.text());
      CHECK(check_emulated(c, Bug::none, dtype).passed());
      CHECK_FALSE(check_emulated(c, Bug::scaled, dtype).passed());
    }
}

TEST_CASE("the checker fails a dropped split, on rows flat and peaked") {
  for (float ramp : {0.f, 5.f}) {
    RowCase c;
    c.n = 20000;
    c.splits = 4;
    c.key_ramp = ramp;
    c.scale = ramp > 0 ? 1.0 : 0.0;
    CAPTURE(c.text());
    CHECK(check_emulated(c, Bug::none, c.dtype).passed());
    CHECK_FALSE(check_emulated(c, Bug::dropped_split, c.dtype).passed());
  }
}

TEST_CASE("the checker fails a window shifted by one key, up to windows of 4096") {
  for (int window : {0, 1, 100, 4095}) {
    RowCase c;
    c.n = 6000;
    c.splits = 3;
    c.window_left = window;
    CAPTURE(c.text());
    CHECK(check_emulated(c, Bug::none, c.dtype).passed());
    CHECK_FALSE(check_emulated(c, Bug::shifted_window, c.dtype).passed());
  }
}

TEST_CASE("the checker fails a missing sink, one that outweighs the row and one that weighs 1e-4 of it") {
  for (double sink : {7.0, -2.0}) {
    RowCase c;
    c.n = 1000;
    c.sink = sink;
    CAPTURE(c.text());
    CHECK(check_emulated(c, Bug::none, c.dtype).passed());
    // A light sink barely moves the output, but the LSE by exp(-2) / 1000: its bound sees it.
    CHECK_FALSE(check_emulated(c, Bug::missing_sink, c.dtype).passed());
  }
}

TEST_CASE("the checker fails a quarter of the tokens dropped on a 30000-token row") {
  RowCase c;
  c.n = 30000;
  c.splits = 8;
  CHECK(check_emulated(c, Bug::none, c.dtype).passed());
  CHECK_FALSE(check_emulated(c, Bug::dropped_quarter, c.dtype).passed());
}

TEST_CASE("the checker fails one wrong element and an LSE off by 2e-4, which a row norm alone would pass") {
  RowCase c;
  c.n = 300;
  const RowCheck element = check_emulated(c, Bug::one_element, c.dtype);
  CHECK_FALSE(element.passed());
  CHECK(element.first_failure().find(fmt::format("d={}", c.d / 2)) != std::string::npos);
  CHECK_FALSE(check_emulated(c, Bug::lse_off, c.dtype).passed());
  // The score slack of MLA-width rows whose large products cancel stays under that error too.
  RowCase cancel;
  cancel.n = 17;
  cancel.d = 576;
  cancel.scale = 1.0;
  cancel.key_ramp = 4.f;
  cancel.cancel = cancel.chop = true;
  CHECK(check_emulated(cancel, Bug::none, cancel.dtype).passed());
  CHECK_FALSE(check_emulated(cancel, Bug::lse_off, cancel.dtype).passed());
}

TEST_CASE("fp16's bound is tighter than bf16's: a bf16-accurate result fails as fp16") {
  RowCase c;
  c.n = 700;
  c.dtype = DType::bf16;
  CHECK(check_emulated(c, Bug::none, DType::bf16).passed());
  CHECK_FALSE(check_emulated(c, Bug::none, DType::fp16).passed());
  CHECK(attention_tolerance(DType::fp16).row < attention_tolerance(DType::bf16).row);
}

TEST_CASE("rows are judged one by one: a halved long row fails beside a one-token row") {
  // A 1-token row (outputs near 1) and a 32768-token row (outputs near 0.003): pooled in one
  // norm, halving the long row moved it by 1e-3; per row it is off by 50%.
  RowCase short_row;
  short_row.n = 1;
  RowCase long_row;
  long_row.n = 32768;
  long_row.splits = 8;
  long_row.seed = 2;
  RowCheck check(attention_tolerance(DType::bf16));
  for (const RowCase* c : {&short_row, &long_row}) {
    const RowData data = make_row_data(*c);
    std::vector<double> want;
    double lse = 0;
    attend_row(data.q.data(), data.k.data(), data.v.data(), c->n, window_keep(c->n, -1), c->d,
               1.0 / std::sqrt(c->d), &want, &lse);
    KernelRow got = emulate_kernel(*c, data, Bug::none);
    if (c == &long_row)
      for (auto& x : got.out) x *= 0.5f;
    check.row(got.out.data(), want.data(), c->d, true, [&] { return c->text(); });
  }
  CHECK_FALSE(check.passed());
  CHECK(check.first_failure().find("n=32768") != std::string::npos);
}

TEST_CASE("an empty row must be exactly zero with LSE -inf, and NaN never passes") {
  RowCheck check(attention_tolerance(DType::bf16));
  const float zeros[4] = {0, 0, 0, 0};
  const double want[4] = {0, 0, 0, 0};
  check.row(zeros, want, 4, false, [] { return "empty"; });
  check.lse(-INFINITY, -INFINITY, [] { return "empty"; });
  CHECK(check.passed());
  const float poison[4] = {0, NAN, 0, 0};
  check.row(poison, want, 4, false, [] { return "poisoned"; });
  CHECK_FALSE(check.passed());
  RowCheck nan(attention_tolerance(DType::bf16));
  const double ones[4] = {1, 1, 1, 1};
  const float got[4] = {1, 1, NAN, 1};
  nan.row(got, ones, 4, true, [] { return "nan"; });
  CHECK_FALSE(nan.passed());
  RowCheck lse(attention_tolerance(DType::bf16));
  lse.lse(3.f, -INFINITY, [] { return "lse"; });
  lse.lse(NAN, 3.0, [] { return "lse"; });
  CHECK(lse.failures() == 2);
}

TEST_CASE("rotary bounds pass one rounding and fail a rotation off by 1e-2 radians") {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> uniform(-1.f, 1.f);
  for (DType dtype : {DType::bf16, DType::fp16}) {
    const int d = 128;
    std::vector<double> want(d);
    std::vector<float> rounded(d), rotated_off(d);
    for (int i = 0; i < d; i += 2) {
      const float x0 = uniform(rng), x1 = uniform(rng);
      const double angle = uniform(rng) * 100.0;
      const float c = static_cast<float>(std::cos(angle)), s = static_cast<float>(std::sin(angle));
      want[i] = static_cast<double>(x0) * c - static_cast<double>(x1) * s;
      want[i + 1] = static_cast<double>(x0) * s + static_cast<double>(x1) * c;
      rounded[i] = element_to_float(float_to_element(x0 * c - x1 * s, dtype), dtype);
      rounded[i + 1] = element_to_float(float_to_element(x0 * s + x1 * c, dtype), dtype);
      const double c2 = std::cos(angle + 1e-2), s2 = std::sin(angle + 1e-2);
      rotated_off[i] = element_to_float(float_to_element(static_cast<float>(x0 * c2 - x1 * s2), dtype), dtype);
      rotated_off[i + 1] = element_to_float(float_to_element(static_cast<float>(x0 * s2 + x1 * c2), dtype), dtype);
    }
    RowCheck good(rotary_tolerance(dtype)), bad(rotary_tolerance(dtype));
    good.row(rounded.data(), want.data(), d, true, [] { return "rotary"; });
    bad.row(rotated_off.data(), want.data(), d, true, [] { return "rotary off"; });
    CAPTURE(dtype_name(dtype));
    CHECK_MESSAGE(good.passed(), good.first_failure());
    CHECK_FALSE(bad.passed());
  }
}

TEST_CASE("fp16 rows below the format's normal range pass their rounding and fail two spacings off") {
  // A heavy sink leaves outputs near 1e-7, where fp16's spacing is 2^-24 whatever the value.
  std::vector<double> want(64);
  std::vector<float> rounded(64), off(64);
  std::mt19937 gen(5);
  std::uniform_real_distribution<double> dist(-4e-7, 4e-7);
  for (int c = 0; c < 64; ++c) {
    want[c] = dist(gen);
    rounded[c] = element_to_float(float_to_element(static_cast<float>(want[c]), DType::fp16), DType::fp16);
    off[c] = rounded[c] + 2 * 0x1p-24f;
  }
  RowCheck good(attention_tolerance(DType::fp16));
  good.row(rounded.data(), want.data(), 64, true, [] { return std::string("rounded"); });
  CHECK_MESSAGE(good.passed(), good.first_failure());
  // Such a row is counted apart: its relative error (the rounding's, large at this size) is not
  // reported as the worst row, which stays the worst of the rows the relative bound judges.
  CHECK(good.floor_rows() == 1);
  CHECK(good.worst_row() == 0.0);
  RowCheck bad(attention_tolerance(DType::fp16));
  bad.row(off.data(), want.data(), 64, true, [] { return std::string("two spacings off"); });
  CHECK_FALSE(bad.passed());
}

TEST_CASE("test seeds: the fixed seed by default, mixed with ASTRAI_TEST_SEED when set") {
  {
    ScopedEnv unset("ASTRAI_TEST_SEED", nullptr);
    CHECK(test_seed(17) == 17u);
  }
  ScopedEnv seed("ASTRAI_TEST_SEED", "12345");
  CHECK(base_seed() == 12345u);
  const unsigned mixed = test_seed(17);
  CHECK(mixed != 17u);
  CHECK(test_seed(17) == mixed);
  CHECK(test_seed(18) != mixed);
}

}  // TEST_SUITE
}  // namespace astrai::testing
