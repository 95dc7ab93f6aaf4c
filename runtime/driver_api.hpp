// The only place that touches the CUDA driver. libcuda is loaded lazily with dlopen and its
// entry points resolved with cuGetProcAddress, so nothing links against it: the library, the
// CLI and the unit tests run on machines without a driver or GPU.
#pragma once

#include <cuda.h>

#include <string>

namespace astrai::detail {

struct DriverApi {
#define ASTRAI_DRIVER_FUNCTIONS(X)                                                             \
  X(cuInit) X(cuDriverGetVersion) X(cuGetErrorName) X(cuGetErrorString) X(cuDeviceGet)         \
  X(cuDeviceGetCount) X(cuDeviceGetName) X(cuDeviceGetAttribute) X(cuDeviceTotalMem)           \
  X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease) X(cuCtxGetCurrent)                  \
  X(cuCtxSetCurrent) X(cuCtxGetDevice) X(cuCtxPushCurrent) X(cuCtxPopCurrent)                  \
  X(cuCtxSynchronize) X(cuModuleLoadData) X(cuModuleUnload) X(cuModuleGetFunction)             \
  X(cuModuleGetGlobal)                                                                          \
  X(cuFuncSetAttribute) X(cuFuncGetAttribute) X(cuLaunchKernel) X(cuLaunchKernelEx)           \
  X(cuMemAlloc) X(cuMemFree)                                                                   \
  X(cuMemcpyHtoD) X(cuMemcpyDtoH) X(cuMemcpyDtoD) X(cuMemsetD8) X(cuMemsetD32)                 \
  X(cuMemsetD8Async) X(cuStreamCreate) X(cuStreamDestroy) X(cuStreamSynchronize)               \
  X(cuStreamIsCapturing) X(cuStreamBeginCapture) X(cuStreamEndCapture) X(cuGraphInstantiate)   \
  X(cuGraphLaunch) X(cuGraphDestroy) X(cuGraphExecDestroy) X(cuEventCreate) X(cuEventRecord)   \
  X(cuEventSynchronize) X(cuEventElapsedTime) X(cuEventDestroy) X(cuStreamGetCtx)              \
  X(cuMemGetInfo) X(cuPointerGetAttribute) X(cuOccupancyMaxActiveBlocksPerMultiprocessor)     \
  X(cuTensorMapEncodeTiled)

#define ASTRAI_DECLARE_DRIVER_FUNCTION(name) decltype(&::name) name = nullptr;
  ASTRAI_DRIVER_FUNCTIONS(ASTRAI_DECLARE_DRIVER_FUNCTION)
#undef ASTRAI_DECLARE_DRIVER_FUNCTION

  int driver_version = 0;  // e.g. 13000
};

// The loaded driver, initialized once (thread-safe). Throws CudaError when libcuda.so.1 is
// missing or cuInit fails (no GPU): "astrai-jit: no CUDA driver: ...".
const DriverApi& driver();
// True when a driver loads and at least one GPU is visible; never throws.
bool driver_available(std::string* why = nullptr);

// Name of a CUresult ("CUDA_ERROR_OUT_OF_MEMORY"), or its number when no driver is loaded.
std::string cu_result_name(CUresult result);

// Throws CudaError naming the call, the result and the device ordinal (-1: not device-bound).
void check_cu(CUresult result, const char* call, int device);

}  // namespace astrai::detail
