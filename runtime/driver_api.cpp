#include "runtime/driver_api.hpp"

#include <dlfcn.h>

#include <cstring>
#include <mutex>

#include <fmt/format.h>

#include "astrai/error.hpp"

namespace astrai::detail {

namespace {

struct DriverState {
  DriverApi api;
  bool loaded = false;
  std::string error;
};

// cuda.h maps a few names onto differently named entry points; ask for the one whose
// signature decltype(&name) gives us.
const char* driver_symbol_name(const char* name) {
  if (std::strcmp(name, "cuGraphInstantiate") == 0) return "cuGraphInstantiateWithFlags";
  return name;
}

// CUDA 13 added new ABIs (extra context arguments) under the old names of these functions
// while cuda.h keeps the old signature for the plain name: ask for the old ABI explicitly.
int driver_symbol_version(const char* name, int newest) {
  if (std::strcmp(name, "cuCtxSynchronize") == 0 || std::strcmp(name, "cuCtxGetDevice") == 0) return 2000;
  if (std::strcmp(name, "cuStreamGetCtx") == 0) return 9020;
  return newest;
}

DriverState load_driver() {
  DriverState state;
  void* handle = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* why = ::dlerror();
    state.error = fmt::format("libcuda.so.1 could not be loaded ({})", why ? why : "unknown");
    return state;
  }
  using GetProcAddress = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
  auto get_proc = reinterpret_cast<GetProcAddress>(::dlsym(handle, "cuGetProcAddress_v2"));
  auto get_version = reinterpret_cast<CUresult (*)(int*)>(::dlsym(handle, "cuDriverGetVersion"));
  if (!get_proc || !get_version) {
    state.error = "libcuda.so.1 is too old (no cuGetProcAddress_v2; CUDA 12 or newer is needed)";
    return state;
  }
  get_version(&state.api.driver_version);
  // Ask for the entry points of the toolkit we were built with, or of the driver if older.
  const int wanted = state.api.driver_version < CUDA_VERSION ? state.api.driver_version : CUDA_VERSION;
#define ASTRAI_LOAD_DRIVER_FUNCTION(name)                                                      \
  {                                                                                            \
    void* pointer = nullptr;                                                                   \
    CUdriverProcAddressQueryResult status;                                                     \
    if (get_proc(driver_symbol_name(#name), &pointer, driver_symbol_version(#name, wanted), CU_GET_PROC_ADDRESS_DEFAULT, &status) != CUDA_SUCCESS \
        || !pointer) {                                                                         \
      state.error = "the CUDA driver has no entry point " #name;                               \
      return state;                                                                            \
    }                                                                                          \
    state.api.name = reinterpret_cast<decltype(state.api.name)>(pointer);                     \
  }
  ASTRAI_DRIVER_FUNCTIONS(ASTRAI_LOAD_DRIVER_FUNCTION)
#undef ASTRAI_LOAD_DRIVER_FUNCTION
  const CUresult init = state.api.cuInit(0);
  if (init != CUDA_SUCCESS) {
    const char* name = nullptr;
    state.api.cuGetErrorName(init, &name);
    state.error = fmt::format("cuInit failed with {}: no usable GPU", name ? name : "?");
    return state;
  }
  int count = 0;
  if (state.api.cuDeviceGetCount(&count) != CUDA_SUCCESS || count == 0) {
    state.error = "no CUDA device is visible";
    return state;
  }
  state.loaded = true;
  return state;
}

const DriverState& driver_state() {
  static const DriverState state = load_driver();
  return state;
}

}  // namespace

const DriverApi& driver() {
  const DriverState& state = driver_state();
  if (!state.loaded)
    throw CudaError(fmt::format("astrai-jit: this call needs a GPU, but {}", state.error),
                    static_cast<int>(CUDA_ERROR_NO_DEVICE));
  return state.api;
}

bool driver_available(std::string* why) {
  const DriverState& state = driver_state();
  if (why) *why = state.error;
  return state.loaded;
}

std::string cu_result_name(CUresult result) {
  const DriverState& state = driver_state();
  const char* name = nullptr;
  if (state.api.cuGetErrorName && state.api.cuGetErrorName(result, &name) == CUDA_SUCCESS && name)
    return name;
  return fmt::format("CUresult {}", static_cast<int>(result));
}

void check_cu(CUresult result, const char* call, int device) {
  if (result == CUDA_SUCCESS) return;
  const DriverState& state = driver_state();
  const char* description = nullptr;
  if (state.api.cuGetErrorString) state.api.cuGetErrorString(result, &description);
  throw CudaError(fmt::format("astrai-jit: {} failed with {} ({}) on device {}", call,
                              cu_result_name(result), description ? description : "no description",
                              device),
                  static_cast<int>(result));
}

}  // namespace astrai::detail
