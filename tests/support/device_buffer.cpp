#include "tests/support/device_buffer.hpp"

namespace astrai::testing {

using detail::check_cu;
using detail::driver;

DeviceBuffer::DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
  check_cu(driver().cuMemAlloc(&pointer_, bytes), "cuMemAlloc", -1);
}

DeviceBuffer::~DeviceBuffer() {
  if (pointer_) driver().cuMemFree(pointer_);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : pointer_(other.pointer_), bytes_(other.bytes_) {
  other.pointer_ = 0;
  other.bytes_ = 0;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (pointer_) driver().cuMemFree(pointer_);
    pointer_ = other.pointer_;
    bytes_ = other.bytes_;
    other.pointer_ = 0;
    other.bytes_ = 0;
  }
  return *this;
}

void DeviceBuffer::upload(const void* host, std::size_t bytes, std::size_t offset) {
  check_cu(driver().cuMemcpyHtoD(pointer_ + offset, host, bytes), "cuMemcpyHtoD", -1);
}

void DeviceBuffer::download(void* host, std::size_t bytes, std::size_t offset) const {
  check_cu(driver().cuMemcpyDtoH(host, pointer_ + offset, bytes), "cuMemcpyDtoH", -1);
}

void DeviceBuffer::fill_byte(unsigned char value) {
  // cuMemsetD8 runs on the legacy stream and may return before it is done; a kernel on a
  // non-blocking stream would race with it, so wait here.
  check_cu(driver().cuMemsetD8(pointer_, value, bytes_), "cuMemsetD8", -1);
  check_cu(driver().cuCtxSynchronize(), "cuCtxSynchronize", -1);
}

}  // namespace astrai::testing
