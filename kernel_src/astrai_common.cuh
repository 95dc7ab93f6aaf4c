// Device-side basics shared by every kernel: element types, conversions, small math.
// Compiled by NVRTC with no include path, so nothing here includes a CUDA header; the few
// bf16/fp16 helpers the kernels need are written out with inline PTX.
#pragma once

#include "kernel_params.h"

namespace astrai {

struct __align__(2) bf16_t { unsigned short bits; };
struct __align__(2) fp16_t { unsigned short bits; };

// Entry i of an index table the caller passed as int32 or int64 (LayoutBit). An int64 entry
// outside the int range reads as -1, which every reader takes as out of range. kL2Only: through
// L2 alone (ld.global.cg), for reads ahead of the wait for the previous kernel.
template <bool kL2Only = false>
__device__ __forceinline__ int load_index(const int* table, long long i, bool wide) {
  if (wide) {
    const long long* entry = reinterpret_cast<const long long*>(table) + i;
    const long long value = kL2Only ? __ldcg(entry) : __ldg(entry);
    return value == static_cast<int>(value) ? static_cast<int>(value) : -1;
  }
  return kL2Only ? __ldcg(table + i) : __ldg(table + i);
}

// The table entry `offset` elements in (a row's start), as the pointer load_index takes.
__device__ __forceinline__ const int* index_at(const int* table, long long offset, bool wide) {
  return wide ? reinterpret_cast<const int*>(reinterpret_cast<const long long*>(table) + offset) : table + offset;
}

// Request b's KV length from seq_lens, or from two neighbouring offsets (kSeqLensIndptr; a
// negative start or a decreasing pair reads as 0).
template <bool kL2Only = false>
__device__ __forceinline__ int load_seq_len(const int* seq_lens, int b, unsigned layout_bits) {
  const bool wide = (layout_bits & kWideSeqLens) != 0;
  if ((layout_bits & kSeqLensIndptr) == 0) return load_index<kL2Only>(seq_lens, b, wide);
  const int begin = load_index<kL2Only>(seq_lens, b, wide);
  const int end = load_index<kL2Only>(seq_lens, b + 1, wide);
  return begin < 0 || end < begin ? 0 : end - begin;
}

// The 32-bit shared-memory address that PTX's .shared operands (cp.async, ldmatrix, mbarrier,
// TMA, wgmma descriptors) take.
__device__ __forceinline__ unsigned shared_address(const void* pointer) {
  return static_cast<unsigned>(__cvta_generic_to_shared(pointer));
}

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

// A 16-byte global store, spelled out: a uint4 assembled from separate words (or from
// ld_shared_v4's result) compiles to four 4-byte stores.
__device__ __forceinline__ void st_global_v4(void* pointer, uint4 v) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(pointer), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
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

// An L2 prefetch of the 128-byte line holding `address` (global memory): a hint, the one kind
// of read a dependent may issue before wait_for_previous_grid (with ld.global.cg).
__device__ __forceinline__ void prefetch_l2(const void* address) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(address));
}

// An L2 cache policy (sm_80+) that makes the lines a load brings the first to be evicted: for
// data read once, like a decode's K and V, so that streaming it does not push out of L2 what is
// read again (the page table, Q, the split workspace): the H200 decode at hd64 24/4 ran 3.4-4.3%
// faster with it, batch 1 x 32768 tokens 5.6-5.9%. Made at each load: held in a register across the decode's loop
// instead, it cost the contiguous hd64 kernel 16 registers.
__device__ __forceinline__ unsigned long long l2_evict_first_policy() {
  unsigned long long policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}

// Whether a template's kFlags compiles a feature (kernel_params.h) in. A function, not a static
// member: those become device globals in the cubin of every variant.
template <int kFlags> __device__ constexpr bool has_feature(FeatureBit bit) { return (kFlags & bit) != 0; }

// 2^x on the special-function unit, subnormal results flushed (they weigh nothing in a softmax).
// One instruction: exp2f without fast math adds a range test and a squaring around it.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// The online softmax's shared steps (scores in log2 units), one row at a time.
// A row's maximum over the four threads of an MMA quad, each holding its own columns of the row.
__device__ __forceinline__ float quad_max(float value) {
  value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, 1));
  return fmaxf(value, __shfl_xor_sync(0xffffffffu, value, 2));
}

// What a row's exponents are measured from once its maximum is `row_max`: 0 while the row has
// seen no key (max -inf), so that exp2(-inf - 0) = 0 where -inf - -inf would give NaN.
__device__ __forceinline__ float softmax_reference(float row_max) {
  return row_max == negative_infinity() ? 0.f : row_max;
}

// A row's running maximum meets a block's maximum `block_max`: the maximum moves, the running
// sum is rescaled, and the factor that rescales what else was accumulated (O) is returned, with
// the block's reference in `reference`. kFastExp2: the correction through fast_exp2, else exp2f.
template <bool kFastExp2 = true>
__device__ __forceinline__ float online_softmax_update(float& row_max, float& row_sum, float block_max,
                                                       float& reference) {
  const float new_max = fmaxf(row_max, block_max);
  reference = softmax_reference(new_max);
  const float correction = kFastExp2 ? fast_exp2(row_max - reference) : exp2f(row_max - reference);
  row_max = new_max;
  row_sum *= correction;
  return correction;
}

// tanh(x) = 1 - 2 / (e^(2|x|) + 1) with the sign put back, through ex2.approx and rcp.approx:
// an absolute error near 2^-21 (tanh.approx's 2^-11 relative error is too coarse for a
// soft-capped score; tanhf's branches cost more than the rest of the softmax). Infinities give
// +-1, NaN stays NaN.
__device__ __forceinline__ float fast_tanh(float x) {
  float power;
  float inverse;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(power) : "f"(fabsf(x) * 2.8853900817779268f));  // 2 log2(e)
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(inverse) : "f"(power + 1.f));
  return copysignf(1.f - 2.f * inverse, x);
}

// Soft-capped score in log2 units from a raw dot product: cap * tanh(raw * scale / cap), times
// log2(e); the score's error is cap * 2^-21.
__device__ __forceinline__ float soft_capped(float raw, const AttentionFeatures& f) {
  return f.cap_log2 * fast_tanh(raw * f.cap_scale);
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

// ALiBi (kFeatureAlibi): a head's slope in the log2 units of the scores, and the bias of the key
// at `key` for the query at `query`: slope * (key - query), added after the soft-cap.
__device__ __forceinline__ float alibi_slope_log2(const AttentionFeatures& f, int head) {
  return f.alibi_slopes[head] * 1.4426950408889634f;
}
__device__ __forceinline__ float alibi_bias(float slope_log2, int key, int query) {
  return slope_log2 * static_cast<float>(key - query);
}

// Sliding window: the first key position a query at `position` attends to (may be negative,
// or past the query when a contiguous decode's window ends before its keys).
__device__ __forceinline__ int window_first_key(long long position, const AttentionFeatures& f) {
  const long long first = position - f.window_left;
  return static_cast<int>(min(max(first, -1LL), 0x7fffffffLL));
}

// FP8 KV cache (kFeatureKvE4m3 / kFeatureKvE5m2): whether a variant's K/V are bytes, and which.
template <int kFlags> __device__ constexpr bool has_fp8_kv() {
  return has_feature<kFlags>(kFeatureKvE4m3) || has_feature<kFlags>(kFeatureKvE5m2);
}

__device__ __forceinline__ unsigned byte_perm(unsigned a, unsigned b, unsigned selector) {
  unsigned result;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(result) : "r"(a), "r"(b), "r"(selector));
  return result;
}

// Bytes 0 and 1 of `pair` (two FP8 values) widened to an f16x2 (low, high). Exact: every e4m3
// and e5m2 value is an f16 value. e5m2 is the upper byte of an f16. e4m3 (bias 7) placed as
// f16 bits 13..7 reads as its value times 2^-8, subnormals included, and the f16 multiply by
// 2^8 restores it exactly; 0x7f / 0xff (e4m3's NaN) are set apart.
template <bool kE5m2>
__device__ __forceinline__ unsigned fp8x2_to_f16x2(unsigned pair) {
  if (kE5m2) return byte_perm(pair, 0u, 0x1404u);
  unsigned result;
#if __CUDA_ARCH__ >= 890
  asm("{\n .reg .b16 pair;\n cvt.u16.u32 pair, %1;\n cvt.rn.f16x2.e4m3x2 %0, pair;\n}" : "=r"(result) : "r"(pair));
#else
  const unsigned placed = ((pair & 0x7fu) << 7) | ((pair & 0x80u) << 8) | ((pair & 0x7f00u) << 15) |
                          ((pair & 0x8000u) << 16);
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(result) : "r"(placed), "r"(0x5c005c00u));  // x 256
  if ((pair & 0x7fu) == 0x7fu) result |= 0x7fffu;
  if ((pair & 0x7f00u) == 0x7f00u) result |= 0x7fff0000u;
#endif
  return result;
}

// A function, not a static member (those become device globals in every cubin).
template <typename T> __device__ constexpr bool is_fp16() { return false; }
template <> __device__ constexpr bool is_fp16<fp16_t>() { return true; }

// Two FP8 values as a (low, high) pair of T, exact.
template <typename T, bool kE5m2>
__device__ __forceinline__ unsigned fp8x2_to_pair(unsigned pair) {
  const unsigned halves = fp8x2_to_f16x2<kE5m2>(pair);
  if constexpr (is_fp16<T>()) {
    return halves;
  } else {
    // Through f32; the value is a bf16 value, so its upper 16 bits are the bf16.
    const float lo = low_half<fp16_t>(halves);
    const float hi = high_half<fp16_t>(halves);
    return byte_perm(__float_as_uint(lo), __float_as_uint(hi), 0x7632u);
  }
}

template <bool kE5m2> __device__ __forceinline__ float fp8_to_float(unsigned byte) {
  return low_half<fp16_t>(fp8x2_to_f16x2<kE5m2>(byte));
}

// A float rounded to the nearest FP8 value (ties to even), saturating: beyond the largest
// finite value (448 e4m3, 57344 e5m2), infinities included, gives that value; NaN stays NaN.
template <bool kE5m2> __device__ __forceinline__ unsigned float_to_fp8(float value) {
#if __CUDA_ARCH__ >= 890
  unsigned short pair;
  if (kE5m2)
    asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(0.f), "f"(value));
  else
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(0.f), "f"(value));
  return pair & 0xffu;
#else
  constexpr int kMantissa = kE5m2 ? 2 : 3;
  constexpr int kBias = kE5m2 ? 15 : 7;
  constexpr int kMaxCode = kE5m2 ? 0x7b : 0x7e;
  const unsigned bits = __float_as_uint(value);
  const unsigned sign = (bits >> 24) & 0x80u;
  const unsigned magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return sign | 0x7fu;  // NaN
  int code;
  if (magnitude < static_cast<unsigned>(128 - kBias) << 23) {
    // Below the smallest normal: multiples of the subnormal step, rounded to even.
    code = static_cast<int>(rintf(__uint_as_float(magnitude) * __uint_as_float((127 + kBias - 1 + kMantissa) << 23)));
  } else {
    const unsigned rounded = magnitude + ((1u << (22 - kMantissa)) - 1u) + ((magnitude >> (23 - kMantissa)) & 1u);
    const int exponent = static_cast<int>(rounded >> 23) - 127 + kBias;
    code = (exponent << kMantissa) | static_cast<int>((rounded >> (23 - kMantissa)) & ((1u << kMantissa) - 1u));
  }
  return sign | static_cast<unsigned>(min(code, kMaxCode));
#endif
}

// A bf16 Q row whose largest magnitude is past f16's range goes into f16 MMAs (an FP8 cache's
// widened K and V are f16) scaled by 2^-e (a power of two: only exponents move, so the rounding
// to f16 stays exact), and its scores are multiplied by 2^e: the scores are the unscaled row's,
// whatever its range. e = 0 for rows in range (every fp16 row) and for inf or NaN rows, which no
// scale mends.
__device__ __forceinline__ int kv8_q_row_exponent(float row_max) {
  if (!(row_max > 65504.f) || !(row_max <= 3.4e38f)) return 0;
  int exponent;
  frexpf(row_max / 65504.f, &exponent);  // = m 2^exponent, m in [0.5, 1): row_max 2^-exponent < 65504
  return exponent;
}

// Eight FP8 values (two words) as eight T (one 16-byte chunk), exact.
template <typename T, bool kE5m2>
__device__ __forceinline__ uint4 widen_fp8x8(unsigned lo, unsigned hi) {
  return make_uint4(fp8x2_to_pair<T, kE5m2>(lo), fp8x2_to_pair<T, kE5m2>(lo >> 16),
                    fp8x2_to_pair<T, kE5m2>(hi), fp8x2_to_pair<T, kE5m2>(hi >> 16));
}

// Widens a stage of FP8 rows (kHeadDim bytes a row) into a tile of T rows (kRowStride elements
// a row), 16 values per thread and step.
template <typename T, int kHeadDim, int kRowStride, int kRows, int kThreads, bool kE5m2>
__device__ __forceinline__ void widen_fp8_tile(const unsigned char* stage, T* tile) {
  constexpr int kChunksPerRow = kHeadDim / 16;
#pragma unroll 2
  for (int chunk = threadIdx.x; chunk < kRows * kChunksPerRow; chunk += kThreads) {
    const int row = chunk / kChunksPerRow;
    const int col = (chunk % kChunksPerRow) * 16;
    const uint4 bytes = *reinterpret_cast<const uint4*>(stage + row * kHeadDim + col);
    uint4* dst = reinterpret_cast<uint4*>(tile + row * kRowStride + col);
    dst[0] = widen_fp8x8<T, kE5m2>(bytes.x, bytes.y);
    dst[1] = widen_fp8x8<T, kE5m2>(bytes.z, bytes.w);
  }
}

// Four elements of T quantized to FP8 (value / scale, rounded, saturated) in one word.
template <typename T, bool kE5m2>
__device__ __forceinline__ unsigned quantize_fp8x4(const T* values, float scale) {
  return float_to_fp8<kE5m2>(to_float(values[0]) / scale) | (float_to_fp8<kE5m2>(to_float(values[1]) / scale) << 8) |
         (float_to_fp8<kE5m2>(to_float(values[2]) / scale) << 16) |
         (float_to_fp8<kE5m2>(to_float(values[3]) / scale) << 24);
}

// Sixteen elements of T quantized to FP8 in one 16-byte chunk (an appended token's piece of a row).
// Not inlined: the loaders' unrolled loops hold many calls, each 16 IEEE divisions, for the one
// appended token; inlined, they doubled the FP8 kernels' PTX and took their compile from under
// 1 s to 4-5.5 s at hd256 (the registers of the kernels stay within 2 either way).
template <typename T, bool kE5m2>
__device__ __noinline__ uint4 quantize_fp8x16(const T* values, float scale) {
  return make_uint4(quantize_fp8x4<T, kE5m2>(values, scale), quantize_fp8x4<T, kE5m2>(values + 4, scale),
                    quantize_fp8x4<T, kE5m2>(values + 8, scale), quantize_fp8x4<T, kE5m2>(values + 12, scale));
}

// The FP8 scale of a KV head: one per tensor (stride 0) or one per head.
__device__ __forceinline__ float kv_scale(const float* scales, int stride, int kv_head) {
  return __ldg(scales + kv_head * stride);
}

template <int kA, int kB> struct CeilDiv { static constexpr int value = (kA + kB - 1) / kB; };

// A if kCondition, else B (no <type_traits> under NVRTC).
template <bool kCondition, typename A, typename B> struct Select { using type = A; };
template <typename A, typename B> struct Select<false, A, B> { using type = B; };

template <int kValue> struct Log2 { static constexpr int value = 1 + Log2<kValue / 2>::value; };
template <> struct Log2<1> { static constexpr int value = 0; };

}  // namespace astrai
