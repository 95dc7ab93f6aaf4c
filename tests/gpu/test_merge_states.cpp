// merge_states against a float64 reference: pairs and stacked states, in place, strided, every
// head dim from 8 to 1024, LSEs with -inf (empty states holding NaN values), rows of empty
// states only, huge gaps and large magnitudes; outputs poisoned, everything outside the rows
// checked untouched.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "tests/gpu/gpu_support.hpp"

namespace astrai::gpu_test {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// One f32 rounding of a sum of weighted f32 values, then one rounding to the output format: u
// |want|, and for the weights (ex2.approx of an f32 argument, a few 1e-6 relative) and the sum
// a small fraction of the row's size, which covers states that cancel.
testing::Tolerance merge_tolerance(DType dtype) {
  const double u = testing::unit_roundoff(dtype);
  testing::Tolerance t;
  t.row = 2 * u;
  t.elem_rel = u * (1 + 0x1p-8);
  t.elem_row = 0x1p-12;
  t.floor = dtype == DType::bf16 ? 0x1p-133 : 0x1p-24;
  return t;
}

enum class LseKind { mixed, all_empty, huge_gaps, large };

struct MergeCase {
  DType dtype = DType::bf16;
  int rows = 7;
  int n_heads = 3;
  int head_dim = 128;
  int a_states = 1;
  int b_states = 1;  // 0: a alone
  int in_place = 0;  // 1: out and lse are a's; 2: b's (that source has one state)
  bool strided = false;
  bool with_lse = true;
  LseKind lse_kind = LseKind::mixed;
  unsigned seed = test_seed(11);
  std::string describe() const {
    return fmt::format("merge_states dtype={} rows={} heads={} hd={} states={}+{} in_place={} strided={} "
                       "lse_out={} lse_kind={} seed={}",
                       dtype_name(dtype), rows, n_heads, head_dim, a_states, b_states, in_place, strided, with_lse,
                       static_cast<int>(lse_kind), seed);
  }
};

// A source's host copy and its layout (element strides).
struct Source {
  int states = 0;
  std::int64_t v_head = 0, v_state = 0, v_row = 0;
  std::int64_t l_head = 0, l_state = 0, l_row = 0;
  std::vector<std::uint16_t> v;
  std::vector<float> lse;
  std::int64_t v_at(int r, int s, int h) const { return r * v_row + s * v_state + h * v_head; }
  std::int64_t l_at(int r, int s, int h) const { return r * l_row + s * l_state + h * l_head; }
};

float random_lse(LseKind kind, std::mt19937& rng) {
  std::uniform_real_distribution<float> unit(0.f, 1.f);
  const float pick = unit(rng);
  switch (kind) {
    case LseKind::all_empty:
      return kNegInf;
    case LseKind::huge_gaps:  // weights far below f32's range next to ordinary ones
      return pick < 0.5f ? -300.f + 20.f * unit(rng) : 5.f * unit(rng);
    case LseKind::large:
      return (pick < 0.5f ? -1.f : 1.f) * 1.0e4f + 4.f * unit(rng);
    case LseKind::mixed:
    default:
      return pick < 0.15f ? kNegInf : -6.f + 20.f * unit(rng);
  }
}

Source make_source(const MergeCase& c, int states, std::mt19937& rng) {
  Source s;
  s.states = states;
  if (states == 0) return s;
  const int pad = c.strided ? 8 : 0;
  s.v_head = c.head_dim + pad;
  s.v_state = c.n_heads * s.v_head + pad;
  s.v_row = states * s.v_state + 2 * pad;
  s.l_head = c.strided ? 2 : 1;
  s.l_state = c.n_heads * s.l_head + (c.strided ? 1 : 0);
  s.l_row = states * s.l_state + (c.strided ? 3 : 0);
  s.v = random_elements(static_cast<std::size_t>(std::max<std::int64_t>(8, c.rows * s.v_row)), c.dtype, rng);
  s.lse.assign(static_cast<std::size_t>(std::max<std::int64_t>(1, c.rows * s.l_row)), 0.f);
  const std::uint16_t nan_bits = c.dtype == DType::bf16 ? 0x7fc0 : 0x7e00;
  for (int r = 0; r < c.rows; ++r)
    for (int st = 0; st < states; ++st)
      for (int h = 0; h < c.n_heads; ++h) {
        const float lse = random_lse(c.lse_kind, rng);
        s.lse[s.l_at(r, st, h)] = lse;
        // An empty state's values are never to be read into the result: NaN shows it if they are.
        if (lse == kNegInf) std::fill_n(s.v.begin() + s.v_at(r, st, h), c.head_dim, nan_bits);
      }
  return s;
}

MergeStatesSource device_source(const Source& s, const DeviceBuffer& v, const DeviceBuffer& lse) {
  MergeStatesSource d;
  d.states = s.states;
  if (s.states == 0) return d;
  d.v = v.get();
  d.lse = static_cast<const float*>(lse.get());
  d.v_stride_row = s.v_row;
  d.v_stride_state = s.v_state;
  d.v_stride_head = s.v_head;
  d.lse_stride_row = s.l_row;
  d.lse_stride_state = s.l_state;
  d.lse_stride_head = s.l_head;
  return d;
}

void check_merge(const MergeCase& c) {
  std::mt19937 rng(c.seed);
  const int d = c.head_dim;
  const Source a = make_source(c, c.a_states, rng);
  const Source b = make_source(c, c.b_states, rng);
  DeviceBuffer a_v = DeviceBuffer::from(a.v), a_lse = DeviceBuffer::from(a.lse);
  DeviceBuffer b_v = DeviceBuffer::from(b.v), b_lse = DeviceBuffer::from(b.lse);

  // Out of place: out [rows, heads, d] and lse [rows, heads] (padded when strided), poisoned.
  // In place: the source whose single state out and lse are.
  const Source* target = c.in_place == 1 ? &a : c.in_place == 2 ? &b : nullptr;
  const std::int64_t out_head = target ? target->v_head : d + (c.strided ? 8 : 0);
  const std::int64_t out_row = target ? target->v_row : c.n_heads * out_head + (c.strided ? 16 : 0);
  const std::int64_t lse_head = target ? target->l_head : 1;
  const std::int64_t lse_row = target ? target->l_row : c.n_heads + (c.strided ? 5 : 0);
  const std::size_t out_elems = static_cast<std::size_t>(std::max<std::int64_t>(8, c.rows * out_row));
  const std::size_t lse_elems = static_cast<std::size_t>(std::max<std::int64_t>(1, c.rows * lse_row));
  DeviceBuffer out_buffer(out_elems * 2), lse_buffer(lse_elems * 4);
  out_buffer.fill_byte(0xff);
  lse_buffer.fill_byte(0xff);
  DeviceBuffer& out_v = c.in_place == 1 ? a_v : c.in_place == 2 ? b_v : out_buffer;
  DeviceBuffer& out_lse = c.in_place == 1 ? a_lse : c.in_place == 2 ? b_lse : lse_buffer;

  MergeStatesArgs args;
  args.dtype = c.dtype;
  args.rows = c.rows;
  args.n_heads = c.n_heads;
  args.head_dim = d;
  args.a = device_source(a, a_v, a_lse);
  args.b = device_source(b, b_v, b_lse);
  args.out = out_v.get();
  args.out_stride_row = out_row;
  args.out_stride_head = out_head;
  args.lse = c.with_lse ? static_cast<float*>(out_lse.get()) : nullptr;
  args.lse_stride_row = lse_row;
  args.lse_stride_head = lse_head;
  Runtime::get().merge_states(args);
  synchronize();
  const std::size_t got_elems = target ? target->v.size() : out_elems;
  const std::size_t got_lse_elems = target ? target->lse.size() : lse_elems;
  const auto got = out_v.to_host<std::uint16_t>(got_elems);
  const auto got_lse = out_lse.to_host<float>(got_lse_elems);

  RowCheck check(merge_tolerance(c.dtype));
  std::vector<char> written(got.size(), 0), lse_written(got_lse.size(), 0);
  std::vector<double> want(d);
  for (int r = 0; r < c.rows; ++r)
    for (int h = 0; h < c.n_heads; ++h) {
      double max_lse = -INFINITY;
      for (const Source* s : {&a, &b})
        for (int st = 0; st < s->states; ++st) max_lse = std::max<double>(max_lse, s->lse[s->l_at(r, st, h)]);
      std::fill(want.begin(), want.end(), 0.0);
      double total = 0;
      if (max_lse != -INFINITY)
        for (const Source* s : {&a, &b})
          for (int st = 0; st < s->states; ++st) {
            const double lse = s->lse[s->l_at(r, st, h)];
            if (lse == -INFINITY) continue;
            const double w = std::exp(lse - max_lse);
            total += w;
            for (int i = 0; i < d; ++i) want[i] += w * bits_to_float(s->v[s->v_at(r, st, h) + i], c.dtype);
          }
      for (double& value : want) value = total > 0 ? value / total : 0.0;
      const std::int64_t at = r * out_row + h * out_head;
      auto where = [&] { return fmt::format("row={} head={}", r, h); };
      check.row_bits(&got[at], c.dtype, want.data(), d, total > 0, where);
      std::fill_n(written.begin() + at, d, 1);
      if (c.with_lse) {
        const std::int64_t l = r * lse_row + h * lse_head;
        check.lse(got_lse[l], total > 0 ? max_lse + std::log(total) : -INFINITY, where);
        lse_written[l] = 1;
      }
    }
  // Everything else as it was: the poison, or in place the source's other elements.
  const std::vector<std::uint16_t>& before = target ? target->v : b.v;
  const std::vector<float>& lse_before = target ? target->lse : b.lse;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!written[i] && got[i] != (c.in_place ? before[i] : std::uint16_t{0xffff})) {
      check.expect(false, [&] { return fmt::format("element {} outside every row was written", i); });
      break;
    }
  for (std::size_t i = 0; i < got_lse.size(); ++i) {
    std::uint32_t got_bits, want_bits = 0xffffffffu;
    std::memcpy(&got_bits, &got_lse[i], 4);
    if (c.in_place) std::memcpy(&want_bits, &lse_before[i], 4);
    if (!lse_written[i] && got_bits != want_bits) {
      check.expect(false, [&] { return fmt::format("LSE element {} outside every row was written", i); });
      break;
    }
  }
  report_case("merge_states", c.dtype, c.describe(), check);
}

}  // namespace

TEST_SUITE("merge_states") {

TEST_CASE("merge_states of two states matches the reference at every head dim") {
  std::mt19937 rng(test_seed(21));
  for (const int head_dim : {8, 24, 64, 128, 256, 512, 1024})
    for (const DType dtype : {DType::bf16, DType::fp16}) {
      MergeCase c;
      c.dtype = dtype;
      c.head_dim = head_dim;
      c.rows = 1 + static_cast<int>(rng() % 40);
      c.n_heads = 1 + static_cast<int>(rng() % 9);
      c.seed = rng();
      check_merge(c);
    }
}

TEST_CASE("merge_states over stacked states, alone and with a second source") {
  std::mt19937 rng(test_seed(22));
  for (const int states : {1, 2, 5, 17, 64})
    for (const int b_states : {0, 1, 3}) {
      MergeCase c;
      c.dtype = rng() % 2 ? DType::bf16 : DType::fp16;
      c.head_dim = (states % 2) ? 128 : 64;
      c.a_states = states;
      c.b_states = b_states;
      c.rows = 1 + static_cast<int>(rng() % 20);
      c.n_heads = 1 + static_cast<int>(rng() % 8);
      c.seed = rng();
      check_merge(c);
    }
}

TEST_CASE("merge_states in place, strided, and without an LSE output") {
  std::mt19937 rng(test_seed(23));
  for (const int in_place : {0, 1, 2})
    for (const bool strided : {false, true})
      for (const bool with_lse : {true, false}) {
        MergeCase c;
        c.dtype = rng() % 2 ? DType::bf16 : DType::fp16;
        c.head_dim = 8 * (1 + static_cast<int>(rng() % 40));
        c.a_states = in_place == 1 ? 1 : 1 + static_cast<int>(rng() % 4);
        c.b_states = in_place == 2 ? 1 : static_cast<int>(rng() % 3);
        c.in_place = in_place;
        c.strided = strided;
        c.with_lse = with_lse;
        c.rows = 1 + static_cast<int>(rng() % 50);
        c.n_heads = 1 + static_cast<int>(rng() % 6);
        c.seed = rng();
        check_merge(c);
      }
}

TEST_CASE("merge_states with empty states only, huge gaps and large LSEs") {
  std::mt19937 rng(test_seed(24));
  for (const LseKind kind : {LseKind::all_empty, LseKind::huge_gaps, LseKind::large})
    for (const DType dtype : {DType::bf16, DType::fp16}) {
      MergeCase c;
      c.dtype = dtype;
      c.lse_kind = kind;
      c.a_states = 3;
      c.b_states = 2;
      c.rows = 1 + static_cast<int>(rng() % 30);
      c.n_heads = 1 + static_cast<int>(rng() % 5);
      c.seed = rng();
      check_merge(c);
    }
}

TEST_CASE("merge_states with no rows writes nothing, and one row of one head works") {
  for (const int rows : {0, 1}) {
    MergeCase c;
    c.rows = rows;
    c.n_heads = 1;
    c.head_dim = 512;
    check_merge(c);
  }
}

TEST_CASE("merge_states over many rows loops its grid") {
  MergeCase c;
  c.rows = 40000;
  c.n_heads = 8;
  c.head_dim = 128;
  c.seed = test_seed(25);
  check_merge(c);
}

}  // TEST_SUITE

}  // namespace astrai::gpu_test
