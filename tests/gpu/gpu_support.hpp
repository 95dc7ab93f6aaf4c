// Helpers for the GPU suite: device buffers, host bf16/fp16 conversion, random data, checks.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "astrai/runtime.hpp"
#include "runtime/driver_api.hpp"

namespace astrai::gpu_test {

// Device memory owned for the scope of a test case.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return reinterpret_cast<void*>(pointer_); }
  std::size_t bytes() const { return bytes_; }
  void upload(const void* host, std::size_t bytes, std::size_t offset = 0);
  void download(void* host, std::size_t bytes, std::size_t offset = 0) const;
  void fill_byte(unsigned char value);

  template <typename T> static DeviceBuffer from(const std::vector<T>& host) {
    DeviceBuffer buffer(std::max<std::size_t>(host.size() * sizeof(T), 16));
    if (!host.empty()) buffer.upload(host.data(), host.size() * sizeof(T));
    return buffer;
  }
  template <typename T> std::vector<T> to_host(std::size_t count) const {
    std::vector<T> host(count);
    if (count) download(host.data(), count * sizeof(T));
    return host;
  }

 private:
  CUdeviceptr pointer_ = 0;
  std::size_t bytes_ = 0;
};

void synchronize();

// Host-side element conversions (round to nearest even), matching the device's.
std::uint16_t float_to_bits(float value, DType dtype);
float bits_to_float(std::uint16_t bits, DType dtype);

// Random values in [-1, 1) rounded to the dtype, as raw bits.
std::vector<std::uint16_t> random_elements(std::size_t count, DType dtype, std::mt19937& rng);

// Elementwise |got - want| <= atol + rtol * |want| over every element, NaN never passes.
struct Comparison {
  std::size_t checked = 0;
  std::size_t failures = 0;
  double max_abs_error = 0;
  double max_rel_error = 0;   // max |err| / max(|want|, 1e-3) over elements
  double norm_rel_error = 0;  // ||got - want|| / ||want||
  std::string first_failure;
  double sum_sq_error = 0;
  double sum_sq_reference = 0;
};
void accumulate(Comparison* comparison, double got, double want, double atol, double rtol,
                const std::string& where);
void finish(Comparison* comparison);

// Records the worst errors of the run (printed at the end of the suite).
void note_worst(const std::string& kernel, DType dtype, const Comparison& comparison);
void print_worst();

bool mma_forced_off();

// Extra cases for the random sweeps: ASTRAI_TEST_SWEEP, else `fallback`.
int sweep_count(int fallback);

}  // namespace astrai::gpu_test
