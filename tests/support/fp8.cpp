#include "tests/support/fp8.hpp"

#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>

namespace astrai::testing {

namespace {

struct Format {
  int mantissa_bits;
  int bias;
  int max_code;  // largest finite magnitude code
};

Format format_of(KvDType format) {
  if (format == KvDType::e4m3) return {3, 7, 0x7e};
  if (format == KvDType::e5m2) return {2, 15, 0x7b};
  throw std::invalid_argument("not an FP8 format");
}

}  // namespace

float fp8_to_float(std::uint8_t code, KvDType format) {
  const Format f = format_of(format);
  const int magnitude = code & 0x7f;
  const float sign = (code & 0x80) ? -1.f : 1.f;
  const int exponent = magnitude >> f.mantissa_bits;
  const int mantissa = magnitude & ((1 << f.mantissa_bits) - 1);
  if (format == KvDType::e4m3 && magnitude == 0x7f) return std::numeric_limits<float>::quiet_NaN();
  if (format == KvDType::e5m2 && exponent == 31)
    return mantissa == 0 ? sign * std::numeric_limits<float>::infinity() : std::numeric_limits<float>::quiet_NaN();
  if (exponent == 0) return sign * std::ldexp(static_cast<float>(mantissa), 1 - f.bias - f.mantissa_bits);
  return sign * std::ldexp(static_cast<float>((1 << f.mantissa_bits) + mantissa), exponent - f.bias - f.mantissa_bits);
}

std::uint8_t float_to_fp8(float value, KvDType format) {
  const Format f = format_of(format);
  const std::uint8_t sign = std::signbit(value) ? 0x80 : 0x00;
  if (std::isnan(value)) return sign | 0x7f;
  const double magnitude = std::fabs(static_cast<double>(value));
  // Candidates are the codes 0..max_code, increasing in value: the nearest wins, a tie goes to
  // the even code (its last mantissa bit clear), and anything past the largest saturates to it.
  int low = 0;
  int high = f.max_code;
  if (magnitude >= fp8_to_float(static_cast<std::uint8_t>(f.max_code), format)) return sign | f.max_code;
  while (high - low > 1) {  // largest code whose value is <= magnitude
    const int middle = (low + high) / 2;
    if (fp8_to_float(static_cast<std::uint8_t>(middle), format) <= magnitude) low = middle;
    else high = middle;
  }
  const double below = fp8_to_float(static_cast<std::uint8_t>(low), format);
  const double above = fp8_to_float(static_cast<std::uint8_t>(low + 1), format);
  int code = low;
  if (magnitude - below > above - magnitude) code = low + 1;
  else if (magnitude - below == above - magnitude && (low & 1) != 0) code = low + 1;
  if (magnitude == below) code = low;
  return static_cast<std::uint8_t>(sign | code);
}

float fp8_max(KvDType format) { return fp8_to_float(static_cast<std::uint8_t>(format_of(format).max_code), format); }

}  // namespace astrai::testing
