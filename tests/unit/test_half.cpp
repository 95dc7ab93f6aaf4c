#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>

#include "tests/support/half.hpp"

using astrai::testing::float_to_half_bits;
using astrai::testing::half_bits_to_float;

namespace {

std::uint32_t float_bits(float value) {
  std::uint32_t bits = 0;
  std::memcpy(&bits, &value, 4);
  return bits;
}

}  // namespace

TEST_SUITE("half") {

TEST_CASE("half conversions round to nearest even at the known edges") {
  CHECK(float_to_half_bits(1.0f) == 0x3c00);
  CHECK(float_to_half_bits(-2.0f) == 0xc000);
  CHECK(float_to_half_bits(0.0f) == 0x0000);
  CHECK(float_to_half_bits(-0.0f) == 0x8000);
  CHECK(float_to_half_bits(65504.0f) == 0x7bff);        // largest finite
  CHECK(float_to_half_bits(65519.0f) == 0x7bff);        // below the halfway point
  CHECK(float_to_half_bits(65520.0f) == 0x7c00);        // halfway: to even, which overflows
  CHECK(float_to_half_bits(INFINITY) == 0x7c00);
  CHECK(float_to_half_bits(-INFINITY) == 0xfc00);
  CHECK(float_to_half_bits(std::ldexp(1.0f, -24)) == 0x0001);       // smallest subnormal
  CHECK(float_to_half_bits(std::ldexp(1.0f, -25)) == 0x0000);       // tie, to even (zero)
  CHECK(float_to_half_bits(std::ldexp(3.0f, -25)) == 0x0002);       // tie, to even (two)
  CHECK(float_to_half_bits(std::ldexp(1.0f, -14)) == 0x0400);       // smallest normal
  CHECK(float_to_half_bits(std::ldexp(1023.5f, -24)) == 0x0400);    // rounds up into normals
  CHECK(float_to_half_bits(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);  // tie, to even
  CHECK(float_to_half_bits(1.0f + std::ldexp(3.0f, -11)) == 0x3c02);  // tie, to even
  const std::uint16_t nan = float_to_half_bits(NAN);
  CHECK((nan & 0x7c00) == 0x7c00);
  CHECK((nan & 0x03ff) != 0);

  CHECK(half_bits_to_float(0x3c00) == 1.0f);
  CHECK(half_bits_to_float(0x7bff) == 65504.0f);
  CHECK(half_bits_to_float(0x0001) == std::ldexp(1.0f, -24));
  CHECK(half_bits_to_float(0x8000) == 0.0f);
  CHECK(std::signbit(half_bits_to_float(0x8000)));
  CHECK(std::isinf(half_bits_to_float(0x7c00)));
  CHECK(std::isnan(half_bits_to_float(0x7e00)));
}

TEST_CASE("every half survives a round trip through float") {
  for (std::uint32_t bits = 0; bits < 0x10000; ++bits) {
    const auto half = static_cast<std::uint16_t>(bits);
    if ((half & 0x7c00) == 0x7c00 && (half & 0x03ff) != 0) continue;  // NaN payloads
    CHECK(float_to_half_bits(half_bits_to_float(half)) == half);
  }
}

#if defined(__FLT16_MAX__) && !defined(__clang__)
TEST_CASE("half conversions agree with the compiler's _Float16") {
  for (std::uint32_t bits = 0; bits < 0x10000; ++bits) {
    const auto half = static_cast<std::uint16_t>(bits);
    _Float16 reference;
    std::memcpy(&reference, &half, 2);
    const float want = static_cast<float>(reference);
    const float got = half_bits_to_float(half);
    if (std::isnan(want)) {
      CHECK(std::isnan(got));
      continue;
    }
    CHECK(float_bits(got) == float_bits(want));
    // The neighbours of every half and the midpoint to the next one exercise the rounding.
    float midpoint = want;
    if ((half & 0x7fff) < 0x7bff) {
      _Float16 next;
      const auto next_bits = static_cast<std::uint16_t>(half + 1);
      std::memcpy(&next, &next_bits, 2);
      midpoint = (want + static_cast<float>(next)) / 2;  // exact in float
    }
    for (const float probe : {want, std::nextafter(want, INFINITY), std::nextafter(want, -INFINITY), midpoint}) {
      const _Float16 converted = static_cast<_Float16>(probe);
      std::uint16_t expected = 0;
      std::memcpy(&expected, &converted, 2);
      CHECK(float_to_half_bits(probe) == expected);
    }
  }
  std::mt19937 rng(7);
  std::uniform_int_distribution<std::uint32_t> any;
  for (int i = 0; i < 200000; ++i) {
    std::uint32_t raw = any(rng);
    float probe = 0.f;
    std::memcpy(&probe, &raw, 4);
    if (std::isnan(probe)) continue;
    const _Float16 converted = static_cast<_Float16>(probe);
    std::uint16_t expected = 0;
    std::memcpy(&expected, &converted, 2);
    CHECK(float_to_half_bits(probe) == expected);
  }
}
#endif

}  // TEST_SUITE
