// rotary_emb against a float64 CPU reference, in place and out of place, 3D and 4D, strided.
#include <doctest/doctest.h>

#include <cmath>

#include <fmt/format.h>

#include "tests/gpu/gpu_support.hpp"

namespace astrai::gpu_test {
namespace {

struct RotaryCase {
  DType dtype = DType::bf16;
  int batch = 1;
  int seq_len = 1;
  int n_heads = 1;
  int head_dim = 128;
  bool in_place = false;
  bool strided = false;       // padded head and seq strides on x and out
  bool shared_freqs = false;  // one [seq, D/2, 2] table for every batch entry
  unsigned seed = test_seed(1);
  std::string describe() const {
    return fmt::format("rotary_emb dtype={} batch={} seq={} heads={} hd={} in_place={} strided={} "
                       "shared_freqs={} seed={}", dtype_name(dtype), batch, seq_len, n_heads,
                       head_dim, in_place, strided, shared_freqs, seed);
  }
};

void check_rotary(const RotaryCase& c) {
  std::mt19937 rng(c.seed);
  const int d = c.head_dim;
  const std::int64_t head_stride = d + (c.strided ? 8 : 0);
  const std::int64_t seq_stride = c.n_heads * head_stride + (c.strided ? 16 : 0);
  const std::int64_t batch_stride = c.seq_len * seq_stride;
  const std::size_t elems = std::max<std::int64_t>(8, c.batch * batch_stride);
  std::vector<std::uint16_t> x = random_elements(elems, c.dtype, rng);
  const int freq_batches = c.shared_freqs ? 1 : c.batch;
  const std::vector<float> freqs =
      random_rotations(std::max<std::size_t>(2, static_cast<std::size_t>(freq_batches) * c.seq_len * d / 2), rng);
  DeviceBuffer d_x = DeviceBuffer::from(x);
  DeviceBuffer d_out(elems * 2);
  d_out.fill_byte(0xff);
  DeviceBuffer d_freqs = DeviceBuffer::from(freqs);

  RotaryArgs args;
  args.dtype = c.dtype;
  args.batch = c.batch;
  args.seq_len = c.seq_len;
  args.n_heads = c.n_heads;
  args.head_dim = d;
  args.x = d_x.get();
  args.x_stride_batch = batch_stride;
  args.x_stride_seq = seq_stride;
  args.x_stride_head = head_stride;
  args.out = c.in_place ? d_x.get() : d_out.get();
  args.out_stride_batch = batch_stride;
  args.out_stride_seq = seq_stride;
  args.out_stride_head = head_stride;
  args.freqs = static_cast<const float*>(d_freqs.get());
  args.freqs_stride_batch = c.shared_freqs ? 0 : -1;
  Runtime::get().rotary_emb(args);
  synchronize();
  const auto out = (c.in_place ? d_x : d_out).to_host<std::uint16_t>(elems);

  // Each (batch, token, head) row within one rounding of the reference; every other element
  // untouched: the poison out of place, the input in place (padding, the buffer's tail, and
  // everything when there are no tokens).
  RowCheck check(testing::rotary_tolerance(c.dtype));
  std::vector<char> written(out.size(), 0);
  std::vector<double> want(d);
  for (int b = 0; b < c.batch; ++b)
    for (int s = 0; s < c.seq_len; ++s)
      for (int h = 0; h < c.n_heads; ++h) {
        const std::int64_t row = b * batch_stride + s * seq_stride + h * head_stride;
        for (int i = 0; i < d; i += 2) {
          const std::size_t f = (static_cast<std::size_t>(c.shared_freqs ? 0 : b) * c.seq_len + s) * d + i;
          const double x0 = bits_to_float(x[row + i], c.dtype);
          const double x1 = bits_to_float(x[row + i + 1], c.dtype);
          want[i] = x0 * freqs[f] - x1 * freqs[f + 1];
          want[i + 1] = x0 * freqs[f + 1] + x1 * freqs[f];
        }
        check.row_bits(&out[row], c.dtype, want.data(), d, true, [&] { return fmt::format("b={} s={} h={}", b, s, h); });
        std::fill_n(written.begin() + row, d, 1);
      }
  for (std::size_t i = 0; i < out.size(); ++i)
    if (!written[i] && out[i] != (c.in_place ? x[i] : std::uint16_t{0xffff})) {
      check.expect(false, [&] { return fmt::format("element {} outside every row was written", i); });
      break;
    }
  if (c.seq_len == 0 || c.batch == 0) {
    // Nothing to rotate: the check above is the case (no row compared).
    CHECK_MESSAGE(check.passed(), check.first_failure());
    return;
  }
  report_case("rotary_emb", c.dtype, c.describe(), check);
}

}  // namespace

TEST_SUITE("rotary_emb") {

TEST_CASE("rotary_emb over [tokens, heads, D] matches the reference") {
  std::mt19937 rng(test_seed(3));
  for (int head_dim : {64, 128, 256, 80, 96}) {
    for (bool in_place : {false, true}) {
      RotaryCase c;
      c.head_dim = head_dim;
      c.seq_len = 1 + rng() % 300;
      c.n_heads = 1 + rng() % 8;
      c.in_place = in_place;
      c.seed = rng();
      check_rotary(c);
    }
  }
}

TEST_CASE("rotary_emb over [batch, seq, heads, D], strided and with a shared table") {
  std::mt19937 rng(test_seed(4));
  for (DType dtype : {DType::bf16, DType::fp16}) {
    for (bool strided : {false, true}) {
      for (bool shared : {false, true}) {
        RotaryCase c;
        c.dtype = dtype;
        c.batch = 3;
        c.seq_len = 1 + rng() % 100;
        c.n_heads = 4;
        c.strided = strided;
        c.shared_freqs = shared;
        c.seed = rng();
        check_rotary(c);
      }
    }
  }
}

TEST_CASE("rotary_emb with zero tokens launches nothing and one token works") {
  RotaryCase empty;
  empty.seq_len = 0;
  check_rotary(empty);
  RotaryCase one;
  one.seq_len = 1;
  one.n_heads = 1;
  one.head_dim = 8;
  check_rotary(one);
}

TEST_CASE("rotary_emb on many tokens covers every element (grid-stride)") {
  RotaryCase c;
  c.seq_len = 20000;
  c.n_heads = 8;
  c.head_dim = 128;
  check_rotary(c);
}

TEST_CASE("rotary_emb random sweep") {
  // ASTRAI_TEST_SWEEP cases (default 8): shapes, layouts and dtypes at random.
  const unsigned seed = test_seed(5);
  std::mt19937 rng(seed);
  MESSAGE(fmt::format("rotary_emb random sweep seed {}", seed));
  const int head_dims[] = {64, 128, 256, 80, 96};
  const int total = sweep_count(8);
  for (int i = 0; i < total; ++i) {
    RotaryCase c;
    c.dtype = rng() % 2 ? DType::fp16 : DType::bf16;
    c.head_dim = head_dims[rng() % 5];
    c.batch = 1 + static_cast<int>(rng() % 3);
    c.seq_len = static_cast<int>(rng() % 400);
    c.n_heads = 1 + static_cast<int>(rng() % 8);
    c.in_place = rng() % 2 == 0;
    c.strided = rng() % 2 == 0;
    c.shared_freqs = rng() % 2 == 0;
    c.seed = rng();
    check_rotary(c);
  }
}

}  // TEST_SUITE
}  // namespace astrai::gpu_test
