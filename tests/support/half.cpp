#include "tests/support/half.hpp"

#include <cmath>
#include <cstring>

namespace astrai::testing {

std::uint16_t float_to_half_bits(float value) {
  std::uint32_t x = 0;
  std::memcpy(&x, &value, 4);
  const std::uint16_t sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  const std::uint32_t magnitude = x & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);  // NaN
  if (magnitude < 0x38800000u) {
    // Below the smallest normal half (2^-14): a multiple of 2^-24, rounded to even. A result
    // of 1024 is the smallest normal, whose encoding is the same number.
    const float scaled = std::fabs(value) * 16777216.0f;  // exact: a power of two
    return static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>(std::nearbyint(scaled)));
  }
  const std::uint32_t exponent = (magnitude >> 23) - 127 + 15;
  const std::uint32_t mantissa = magnitude & 0x7fffffu;
  std::uint32_t half = (exponent << 10) | (mantissa >> 13);
  const std::uint32_t rest = mantissa & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;  // a carry moves the exponent
  if (half >= 0x7c00u) half = 0x7c00u;                               // overflow: infinity
  return static_cast<std::uint16_t>(sign | half);
}

float half_bits_to_float(std::uint16_t bits) {
  const bool negative = (bits & 0x8000u) != 0;
  const int exponent = (bits >> 10) & 0x1f;
  const int mantissa = bits & 0x3ff;
  float magnitude = 0.f;
  if (exponent == 0) magnitude = std::ldexp(static_cast<float>(mantissa), -24);
  else if (exponent == 31) magnitude = mantissa ? std::nanf("") : INFINITY;
  else magnitude = std::ldexp(static_cast<float>(mantissa + 1024), exponent - 25);
  return negative ? -magnitude : magnitude;
}

}  // namespace astrai::testing
