// GPU suite entry point: exits 77 (CTest: skipped) when no GPU is usable, saying why.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "runtime/driver_api.hpp"
#include "tests/gpu/gpu_support.hpp"

int main(int argc, char** argv) {
  std::string why;
  if (!astrai::detail::driver_available(&why)) {
    std::printf("SKIPPED: GPU suite needs a CUDA GPU: %s\n", why.c_str());
    return 77;
  }
  // Like an application using the CUDA runtime: device 0's primary context is current.
  const auto& api = astrai::detail::driver();
  CUdevice device;
  CUcontext primary;
  astrai::detail::check_cu(api.cuDeviceGet(&device, 0), "cuDeviceGet", 0);
  astrai::detail::check_cu(api.cuDevicePrimaryCtxRetain(&primary, device), "cuDevicePrimaryCtxRetain", 0);
  astrai::detail::check_cu(api.cuCtxSetCurrent(primary), "cuCtxSetCurrent", 0);
  doctest::Context context(argc, argv);
  const int result = context.run();
  if (!context.shouldExit()) astrai::gpu_test::print_worst();
  return result;
}
