// IEEE binary16 conversions on the host, for compilers without a _Float16 type (clang 14 on
// x86). Round to nearest even, as the device converts.
#pragma once

#include <cstdint>

namespace astrai::testing {

std::uint16_t float_to_half_bits(float value);
float half_bits_to_float(std::uint16_t bits);

}  // namespace astrai::testing
