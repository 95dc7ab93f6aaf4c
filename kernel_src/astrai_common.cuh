// Device-side basics shared by every kernel: element types, conversions, small math.
// Compiled by NVRTC with no include path, so nothing here includes a CUDA header; the few
// bf16/fp16 helpers the kernels need are written out with inline PTX.
#pragma once

#include "kernel_params.h"

namespace astrai {

struct __align__(2) bf16_t { unsigned short bits; };
struct __align__(2) fp16_t { unsigned short bits; };

__device__ __forceinline__ float to_float(bf16_t value) {
  return __uint_as_float(static_cast<unsigned>(value.bits) << 16);
}

__device__ __forceinline__ float to_float(fp16_t value) {
  float result;
  asm("cvt.f32.f16 %0, %1;" : "=f"(result) : "h"(value.bits));
  return result;
}

template <typename T> __device__ __forceinline__ T from_float(float value);

template <> __device__ __forceinline__ bf16_t from_float<bf16_t>(float value) {
  bf16_t result;
#if __CUDA_ARCH__ >= 800
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(result.bits) : "f"(value));
#else
  // Round to nearest even by hand (no bf16 conversion instruction before sm_80).
  unsigned bits = __float_as_uint(value);
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0u) {
    result.bits = static_cast<unsigned short>((bits >> 16) | 0x0040u);  // keep NaN a NaN
  } else {
    bits += 0x7fffu + ((bits >> 16) & 1u);
    result.bits = static_cast<unsigned short>(bits >> 16);
  }
#endif
  return result;
}

template <> __device__ __forceinline__ fp16_t from_float<fp16_t>(float value) {
  fp16_t result;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(result.bits) : "f"(value));
  return result;
}

// Two floats rounded into one 32-bit register holding (lo, hi) elements of type T.
template <typename T> __device__ __forceinline__ unsigned pack2(float lo, float hi) {
  const T a = from_float<T>(lo);
  const T b = from_float<T>(hi);
  return static_cast<unsigned>(a.bits) | (static_cast<unsigned>(b.bits) << 16);
}

template <typename T> __device__ __forceinline__ float low_half(unsigned packed) {
  T value;
  value.bits = static_cast<unsigned short>(packed & 0xffffu);
  return to_float(value);
}

template <typename T> __device__ __forceinline__ float high_half(unsigned packed) {
  T value;
  value.bits = static_cast<unsigned short>(packed >> 16);
  return to_float(value);
}

__device__ __forceinline__ float negative_infinity() { return __int_as_float(0xff800000); }

// 1/log2(e): converts a base-2 log-sum-exp back to the natural log.
inline constexpr float kLn2 = 0.6931471805599453f;

__device__ __forceinline__ float warp_all_max(float value) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
  return value;
}

__device__ __forceinline__ float warp_all_sum(float value) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

// Programmatic dependent launch (sm_90+; no-ops elsewhere and when launched normally):
// a kernel lets its dependent be scheduled early, and the dependent waits for its results.
__device__ __forceinline__ void allow_dependent_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void wait_for_previous_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Whether a template's kFlags compiles a feature (kernel_params.h) in. A function, not a static
// member: those become device globals in the cubin of every variant.
template <int kFlags> __device__ constexpr bool has_feature(FeatureBit bit) { return (kFlags & bit) != 0; }

// Soft-capped score in log2 units from a raw dot product: cap * tanh(raw * scale / cap), times
// log2(e). tanhf, not tanh.approx: its 2^-11 relative error becomes cap * 2^-11 in the score.
__device__ __forceinline__ float soft_capped(float raw, const AttentionFeatures& f) {
  return f.cap_log2 * tanhf(raw * f.cap_scale);
}

// Folds a sink logit (natural units, as the scaled scores) into a finished row's max and sum
// (log2 units) as one more term of the denominator; returns the factor the row's unnormalized
// output takes. A row that saw no token keeps a zero output and gets the sink's LSE.
__device__ __forceinline__ float fold_sink(float sink, float* row_max, float* row_sum) {
  const float sink_log2 = sink * 1.4426950408889634f;
  const float new_max = fmaxf(*row_max, sink_log2);
  if (new_max == negative_infinity()) return 1.f;  // no token and a -inf sink: nothing changes
  const float factor = exp2f(*row_max - new_max);   // 0 when the row saw no token
  *row_sum = *row_sum * factor + exp2f(sink_log2 - new_max);
  *row_max = new_max;
  return factor;
}

// Sliding window: the first key position a query at `position` attends to (may be negative,
// or past the query when a contiguous decode's window ends before its keys).
__device__ __forceinline__ int window_first_key(long long position, const AttentionFeatures& f) {
  const long long first = position - f.window_left;
  return static_cast<int>(min(max(first, -1LL), 0x7fffffffLL));
}

template <int kA, int kB> struct CeilDiv { static constexpr int value = (kA + kB - 1) / kB; };

template <int kValue> struct Log2 { static constexpr int value = 1 + Log2<kValue / 2>::value; };
template <> struct Log2<1> { static constexpr int value = 0; };

}  // namespace astrai
