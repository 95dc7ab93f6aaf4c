// FP8 (OCP e4m3 and e5m2) conversions on the host, as the kernels convert: decoding is exact;
// encoding rounds to nearest even and saturates at the largest finite value (448 for e4m3,
// 57344 for e5m2; infinities too), NaN stays NaN (e4m3 has no infinity).
#pragma once

#include <cstdint>

#include "astrai/runtime.hpp"

namespace astrai::testing {

// `format` is e4m3 or e5m2 (KvDType::same is not an FP8 format).
float fp8_to_float(std::uint8_t code, KvDType format);
std::uint8_t float_to_fp8(float value, KvDType format);
// The largest finite value of a format.
float fp8_max(KvDType format);

}  // namespace astrai::testing
