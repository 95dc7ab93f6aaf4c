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

constexpr std::uint16_t kPoison = 0xffff;

inline std::vector<float> to_floats(const std::vector<std::uint16_t>& bits, DType dtype) {
  std::vector<float> values(bits.size());
  for (std::size_t i = 0; i < bits.size(); ++i) values[i] = bits_to_float(bits[i], dtype);
  return values;
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

// Everything one case checks: output rows and LSE values against the reference (by dtype,
// tests/support/numerics), and exact expectations (zeros and -inf for empty rows, poison left
// alone outside the rows).
struct Verdict {
  explicit Verdict(DType dtype) : dtype(dtype), check(testing::attention_tolerance(dtype)) {}
  DType dtype;
  RowCheck check;
};

struct RowId {
  int b, i, h;
  std::string text() const { return fmt::format("b={} i={} h={}", b, i, h); }
};

// Compares one output row (and its LSE, when lse_got is set) with the reference.
inline void check_row(Verdict* verdict, DType dtype, const std::vector<std::uint16_t>& out,
               std::int64_t out_base, const std::vector<double>& want, bool non_empty,
               const float* lse_got, double lse_want, RowId id, double lse_slack = 0) {
  const auto where = [&] { return id.text(); };
  verdict->check.row_bits(out.data() + out_base, dtype, want.data(), static_cast<int>(want.size()), non_empty, where);
  if (lse_got != nullptr) verdict->check.lse(*lse_got, lse_want, where, lse_slack);
}

// Every element of `out` that no row owns (padding between heads, tokens and batches, the
// buffer's tail) must still hold the poison.
inline void check_poison(RowCheck* check, const std::vector<std::uint16_t>& out, const std::vector<char>& written) {
  for (std::size_t i = 0; i < out.size(); ++i)
    if (!written[i] && out[i] != kPoison) {
      check->expect(false, [&] { return fmt::format("element {} outside every output row was written", i); });
      return;
    }
}
inline void check_poison(Verdict* verdict, const std::vector<std::uint16_t>& out, const std::vector<char>& written) {
  check_poison(&verdict->check, out, written);
}

// An LSE buffer the call was not given must keep its poison (0xff bytes: NaN).
inline void check_lse_untouched(RowCheck* check, const std::vector<float>& lse) {
  for (std::size_t i = 0; i < lse.size(); ++i) {
    std::uint32_t bits;
    std::memcpy(&bits, &lse[i], 4);
    if (bits != 0xffffffffu) {
      check->expect(false, [&] { return fmt::format("LSE {} written by a call without an LSE output", i); });
      return;
    }
  }
}

inline void report(const std::string& kernel, DType dtype, const std::string& description, Verdict* v) {
  report_case(kernel, dtype, description, v->check);
}

// One entry of a random sweep's variant list.
struct Variant {
  DType dtype;
  int head_dim;
  int group;
  int page_size;  // paged only
};

}  // namespace astrai::gpu_test
