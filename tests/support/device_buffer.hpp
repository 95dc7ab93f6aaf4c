// Device memory for tests and harnesses, freed when the buffer goes away.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

#include "runtime/driver_api.hpp"

namespace astrai::testing {

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

}  // namespace astrai::testing
