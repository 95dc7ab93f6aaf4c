// The host FP8 codec the GPU tests build their references with (tests/support/fp8.hpp): known
// codes of both formats, rounding ties to even, saturation, round trips over every code.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <random>

#include "tests/support/fp8.hpp"

using astrai::KvDType;
using astrai::testing::float_to_fp8;
using astrai::testing::fp8_max;
using astrai::testing::fp8_to_float;

TEST_SUITE("fp8") {

TEST_CASE("e4m3 codes decode to their known values") {
  CHECK(fp8_to_float(0x00, KvDType::e4m3) == 0.f);
  CHECK(std::signbit(fp8_to_float(0x80, KvDType::e4m3)));
  CHECK(fp8_to_float(0x38, KvDType::e4m3) == 1.f);
  CHECK(fp8_to_float(0xb8, KvDType::e4m3) == -1.f);
  CHECK(fp8_to_float(0x40, KvDType::e4m3) == 2.f);
  CHECK(fp8_to_float(0x3c, KvDType::e4m3) == 1.5f);
  CHECK(fp8_to_float(0x7e, KvDType::e4m3) == 448.f);              // largest finite
  CHECK(fp8_to_float(0x08, KvDType::e4m3) == std::ldexp(1.f, -6));  // smallest normal
  CHECK(fp8_to_float(0x01, KvDType::e4m3) == std::ldexp(1.f, -9));  // smallest subnormal
  CHECK(fp8_to_float(0x07, KvDType::e4m3) == std::ldexp(7.f, -9));  // largest subnormal
  CHECK(std::isnan(fp8_to_float(0x7f, KvDType::e4m3)));
  CHECK(std::isnan(fp8_to_float(0xff, KvDType::e4m3)));
  CHECK(fp8_max(KvDType::e4m3) == 448.f);
}

TEST_CASE("e5m2 codes decode to their known values (the upper byte of an f16)") {
  CHECK(fp8_to_float(0x3c, KvDType::e5m2) == 1.f);
  CHECK(fp8_to_float(0xc0, KvDType::e5m2) == -2.f);
  CHECK(fp8_to_float(0x3e, KvDType::e5m2) == 1.5f);
  CHECK(fp8_to_float(0x7b, KvDType::e5m2) == 57344.f);               // largest finite
  CHECK(fp8_to_float(0x04, KvDType::e5m2) == std::ldexp(1.f, -14));  // smallest normal
  CHECK(fp8_to_float(0x01, KvDType::e5m2) == std::ldexp(1.f, -16));  // smallest subnormal
  CHECK(fp8_to_float(0x7c, KvDType::e5m2) == INFINITY);
  CHECK(fp8_to_float(0xfc, KvDType::e5m2) == -INFINITY);
  CHECK(std::isnan(fp8_to_float(0x7d, KvDType::e5m2)));
  CHECK(fp8_max(KvDType::e5m2) == 57344.f);
}

TEST_CASE("encoding rounds to nearest, ties to even, and saturates") {
  CHECK(float_to_fp8(1.f, KvDType::e4m3) == 0x38);
  CHECK(float_to_fp8(-1.f, KvDType::e4m3) == 0xb8);
  CHECK(float_to_fp8(-0.f, KvDType::e4m3) == 0x80);
  CHECK(float_to_fp8(1.0625f, KvDType::e4m3) == 0x38);  // tie between 1 and 1.125: even (1)
  CHECK(float_to_fp8(1.1875f, KvDType::e4m3) == 0x3a);  // tie between 1.125 and 1.25: even (1.25)
  CHECK(float_to_fp8(1.07f, KvDType::e4m3) == 0x39);    // nearer 1.125
  CHECK(float_to_fp8(std::ldexp(1.f, -10), KvDType::e4m3) == 0x00);  // tie with zero: even (0)
  CHECK(float_to_fp8(std::ldexp(3.f, -10), KvDType::e4m3) == 0x02);  // tie: even (2 steps)
  CHECK(float_to_fp8(std::ldexp(15.f, -10), KvDType::e4m3) == 0x08);  // tie into the normals
  CHECK(float_to_fp8(440.f, KvDType::e4m3) == 0x7e);
  CHECK(float_to_fp8(464.f, KvDType::e4m3) == 0x7e);    // would round up past 448: saturates
  CHECK(float_to_fp8(1e6f, KvDType::e4m3) == 0x7e);
  CHECK(float_to_fp8(-1e6f, KvDType::e4m3) == 0xfe);
  CHECK(float_to_fp8(INFINITY, KvDType::e4m3) == 0x7e);
  CHECK((float_to_fp8(NAN, KvDType::e4m3) & 0x7f) == 0x7f);
  CHECK(float_to_fp8(1.f, KvDType::e5m2) == 0x3c);
  CHECK(float_to_fp8(1.125f, KvDType::e5m2) == 0x3c);   // tie between 1 and 1.25: even (1)
  CHECK(float_to_fp8(1.375f, KvDType::e5m2) == 0x3e);   // tie between 1.25 and 1.5: even (1.5)
  CHECK(float_to_fp8(60000.f, KvDType::e5m2) == 0x7b);  // past the largest finite: saturates
  CHECK(float_to_fp8(-INFINITY, KvDType::e5m2) == 0xfb);
  CHECK(float_to_fp8(std::ldexp(1.f, -17), KvDType::e5m2) == 0x00);  // tie with zero
  CHECK(float_to_fp8(std::ldexp(3.f, -17), KvDType::e5m2) == 0x02);
}

TEST_CASE("every finite code survives a round trip, and random floats land on a nearest code") {
  for (KvDType format : {KvDType::e4m3, KvDType::e5m2}) {
    CAPTURE(astrai::kv_dtype_name(format));
    for (int code = 0; code < 256; ++code) {
      const float value = fp8_to_float(static_cast<std::uint8_t>(code), format);
      if (!std::isfinite(value)) continue;
      CAPTURE(code);
      CHECK(float_to_fp8(value, format) == code);
    }
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> exponent(-20.f, 17.f);
    for (int i = 0; i < 5000; ++i) {
      const float value = (i % 2 ? -1.f : 1.f) * std::exp2(exponent(rng));
      const std::uint8_t code = float_to_fp8(value, format);
      const float got = fp8_to_float(code, format);
      CAPTURE(value);
      REQUIRE(std::isfinite(got));
      if (std::fabs(value) >= fp8_max(format)) {
        CHECK(std::fabs(got) == fp8_max(format));
        continue;
      }
      // No finite code is nearer than the chosen one.
      float nearest = INFINITY;
      for (int other = 0; other < 256; ++other) {
        const float candidate = fp8_to_float(static_cast<std::uint8_t>(other), format);
        if (std::isfinite(candidate)) nearest = std::fmin(nearest, std::fabs(candidate - value));
      }
      CHECK(std::fabs(got - value) == nearest);
    }
  }
}

}  // TEST_SUITE
