// What astrai-sm90-check's cases share: the failure count, device buffers, element
// conversions, NVRTC modules of the library's and the bench's kernels, tensor maps, launches and
// timing. Included by bench/sm90_check.cpp only.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "bench_kernels.hpp"
#include "runtime/driver_api.hpp"
#include "runtime/kernel_sources.hpp"
#include "runtime/nvrtc_compiler.hpp"
#include "runtime/tensor_map.hpp"

namespace astrai::sm90_check {

using astrai::detail::check_cu;
using astrai::detail::driver;

inline int g_failures = 0;

inline void expect(bool ok, const std::string& what) {
  fmt::print("{} {}\n", ok ? "PASS" : "FAIL", what);
  if (!ok) ++g_failures;
}

class Buffer {
 public:
  explicit Buffer(std::size_t bytes) : bytes_(bytes) {
    check_cu(driver().cuMemAlloc(&pointer_, std::max<std::size_t>(bytes, 256)), "cuMemAlloc", 0);
  }
  ~Buffer() { driver().cuMemFree(pointer_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  CUdeviceptr get() const { return pointer_; }
  void* ptr() const { return reinterpret_cast<void*>(pointer_); }
  template <typename T> void upload(const std::vector<T>& host) {
    check_cu(driver().cuMemcpyHtoD(pointer_, host.data(), host.size() * sizeof(T)), "cuMemcpyHtoD", 0);
  }
  template <typename T> std::vector<T> download(std::size_t count) const {
    std::vector<T> host(count);
    check_cu(driver().cuMemcpyDtoH(host.data(), pointer_, count * sizeof(T)), "cuMemcpyDtoH", 0);
    return host;
  }
  void poison() {
    check_cu(driver().cuMemsetD8(pointer_, 0xff, bytes_), "cuMemsetD8", 0);
    check_cu(driver().cuCtxSynchronize(), "cuCtxSynchronize", 0);
  }

 private:
  CUdeviceptr pointer_ = 0;
  std::size_t bytes_;
};

inline std::uint16_t to_bits(float value, bool fp16) {
  if (!fp16) {
    std::uint32_t bits;
    std::memcpy(&bits, &value, 4);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return static_cast<std::uint16_t>(bits >> 16);
  }
  // Inputs are in [-1, 1): normal or zero halves, round to nearest even.
  std::uint32_t bits;
  std::memcpy(&bits, &value, 4);
  const std::uint32_t sign = (bits >> 16) & 0x8000u;
  const float magnitude = std::fabs(value);
  if (magnitude < 6.1035156e-05f) return static_cast<std::uint16_t>(sign);
  int exponent;
  const float mantissa = std::frexp(magnitude, &exponent);  // [0.5, 1)
  const auto m = static_cast<std::uint32_t>(std::nearbyint(mantissa * 2048.f));  // 11 bits
  const std::uint32_t e = static_cast<std::uint32_t>(exponent + 14);
  return static_cast<std::uint16_t>(sign | ((e << 10) + (m - 1024u)));
}

inline float from_bits(std::uint16_t bits, bool fp16) {
  if (!fp16) {
    const std::uint32_t word = static_cast<std::uint32_t>(bits) << 16;
    float value;
    std::memcpy(&value, &word, 4);
    return value;
  }
  const int exponent = (bits >> 10) & 0x1f;
  const int mantissa = bits & 0x3ff;
  float value = exponent == 0 ? std::ldexp(static_cast<float>(mantissa), -24)
                              : std::ldexp(static_cast<float>(mantissa | 0x400), exponent - 25);
  if (exponent == 31) value = mantissa ? NAN : INFINITY;
  return (bits & 0x8000u) ? -value : value;
}

inline std::vector<std::uint16_t> random_bits(std::size_t count, bool fp16, std::mt19937& rng) {
  std::uniform_real_distribution<float> uniform(-1.f, 1.f);
  std::vector<std::uint16_t> out(count);
  for (auto& x : out) x = to_bits(uniform(rng), fp16);
  return out;
}

struct Module {
  CUmodule module = nullptr;
  std::vector<CUfunction> functions;
  double compile_ms = 0;
  ~Module() {
    if (module) driver().cuModuleUnload(module);
  }
};

// A request for the library's `main_file` (sm_90a) as the runtime builds one.
inline astrai::detail::CompileRequest library_request(const std::string& main_file,
                                                      const std::vector<std::string>& names) {
  astrai::detail::CompileRequest request;
  request.main_file = main_file;
  const auto& closure = astrai::detail::kernel_source_closure(main_file);  // static storage
  request.headers.assign(closure.begin(), closure.end());
  request.name_expressions = names;
  request.options = {"--std=c++17", "--gpu-architecture=sm_90a", "--device-as-default-execution-space"};
  return request;
}

// Compiles `request` with NVRTC as the runtime does; a C75xx line (wgmma serialized, setmaxnreg
// ignored) or "Performance Loss" in the log fails the check.
inline void compile(Module* out, astrai::detail::CompileRequest request, const std::string& label) {
  request.variant_name = label;
  const std::vector<std::string>& names = request.name_expressions;
  const auto start = std::chrono::steady_clock::now();
  const auto result = astrai::detail::nvrtc_compile(request, false);
  out->compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  const bool clean = result.log.find("C75") == std::string::npos &&
                     result.log.find("Performance Loss") == std::string::npos;
  expect(clean, fmt::format("{}: NVRTC log free of wgmma serialization ({:.0f} ms){}", label,
                            out->compile_ms, clean ? "" : "\n" + result.log));
  check_cu(driver().cuModuleLoadData(&out->module, result.binary.data()), "cuModuleLoadData", 0);
  for (std::size_t i = 0; i < names.size(); ++i) {
    CUfunction function = nullptr;
    const std::string& symbol = result.lowered_names.empty() ? names[i] : result.lowered_names[i];
    check_cu(driver().cuModuleGetFunction(&function, out->module, symbol.c_str()), "cuModuleGetFunction", 0);
    out->functions.push_back(function);
  }
}

// A tensor map through the runtime's encoder (128-byte swizzle), after its rules are checked.
inline CUtensorMap encode(const astrai::detail::TensorMapShape& shape, bool fp16) {
  const std::string problem = astrai::detail::tensor_map_problem(shape);
  if (!problem.empty()) throw std::runtime_error("tensor map: " + problem);
  return astrai::detail::encode_tensor_map(shape, fp16, 0, CU_TENSOR_MAP_L2_PROMOTION_L2_256B);
}

// A 16-bit tensor of 2 or more dims (innermost first) in boxes of {64, box1, 1, ...} elements.
// Strides in elements for dims 1..rank-1.
inline CUtensorMap tensor_map(const void* base, bool fp16, std::vector<std::uint64_t> dims,
                       std::vector<std::uint64_t> strides, std::uint32_t box1) {
  astrai::detail::TensorMapShape shape;
  shape.base = base;
  shape.dims = dims;
  shape.strides.assign(strides.begin(), strides.end());
  shape.box.assign(dims.size(), 1);
  shape.box[0] = 64;
  shape.box[1] = box1;
  return encode(shape, fp16);
}

struct Grid {
  unsigned x = 1, y = 1, z = 1;
};

inline void launch(CUfunction function, Grid grid, unsigned threads, unsigned smem, CUstream stream,
            std::vector<void*> params) {
  check_cu(driver().cuFuncSetAttribute(function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                       static_cast<int>(smem)),
           "cuFuncSetAttribute", 0);
  check_cu(driver().cuLaunchKernel(function, grid.x, grid.y, grid.z, threads, 1, 1, smem, stream,
                                   params.data(), nullptr),
           "cuLaunchKernel", 0);
}

// Median milliseconds of `reps` runs of `body` (one warm-up first).
template <typename Body> double time_ms(CUstream stream, int reps, Body&& body) {
  const auto& api = driver();
  CUevent start, stop;
  check_cu(api.cuEventCreate(&start, 0), "cuEventCreate", 0);
  check_cu(api.cuEventCreate(&stop, 0), "cuEventCreate", 0);
  body();
  std::vector<double> times;
  for (int i = 0; i < reps; ++i) {
    check_cu(api.cuEventRecord(start, stream), "cuEventRecord", 0);
    body();
    check_cu(api.cuEventRecord(stop, stream), "cuEventRecord", 0);
    check_cu(api.cuEventSynchronize(stop), "cuEventSynchronize", 0);
    float ms = 0;
    check_cu(api.cuEventElapsedTime(&ms, start, stop), "cuEventElapsedTime", 0);
    times.push_back(ms);
  }
  api.cuEventDestroy(start);
  api.cuEventDestroy(stop);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace astrai::sm90_check
