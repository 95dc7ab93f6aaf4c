// Runtime internals shared by the launch code of each kernel family (runtime/*.cpp):
// per-device state, variant loading, workspaces and launches.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "astrai/runtime.hpp"
#include "kernel_src/kernel_params.h"
#include "runtime/driver_api.hpp"
#include "runtime/jit_engine.hpp"
#include "runtime/logging.hpp"

namespace astrai {

using detail::check_cu;
using detail::driver;
using detail::KernelKind;
using detail::KernelSpec;

namespace detail {

constexpr float kLog2e = 1.4426950408889634f;

// What a call needs compiled and loaded; arch and the no-MMA switch come from the device.
struct VariantRequest {
  KernelKind kind = KernelKind::paged_decode;
  DType dtype = DType::bf16;
  int head_dim = 0;
  int page_size = 0;
  int group = 0;
  std::uint32_t flags = 0;
  int dynamic_smem = 0;  // bytes of dynamic shared memory the first kernel is launched with
  int threads = 128;     // threads per CTA of the first kernel (for the occupancy query)

  // A compact, allocation-free identity of the variant on one device.
  std::uint64_t id() const {
    return (static_cast<std::uint64_t>(kind) << 56) | (static_cast<std::uint64_t>(dtype) << 52) |
           (static_cast<std::uint64_t>(head_dim & 0xfff) << 40) |
           (static_cast<std::uint64_t>(page_size & 0xfff) << 28) |
           (static_cast<std::uint64_t>(group & 0xff) << 20) | (flags & 0xfffffu);
  }
};

struct LoadedVariant {
  std::string name;
  int resident_ctas = 0;  // CTAs of the first kernel the device runs at once
  CUmodule module = nullptr;
  std::array<CUfunction, 2> functions{};  // main kernel, then the split combine (if any)
};

struct Workspace {
  CUdeviceptr pointer = 0;
  std::size_t bytes = 0;
};

struct GridSize {
  unsigned x, y, z;
};

struct DeviceState {
  int ordinal = 0;
  CUdevice device = 0;
  CUcontext primary = nullptr;
  int num_sms = 0;
  std::string arch;
  bool force_no_mma = false;
  // Hopper and newer with a driver that captures it in graphs (12.3+): the split combine is
  // launched as a programmatic dependent of the attention kernel (PDL), so its launch and
  // ramp overlap the attention kernel's last wave.
  bool programmatic_launch = false;
  std::shared_mutex variants_mutex;
  std::unordered_map<std::uint64_t, std::unique_ptr<LoadedVariant>> variants;
  std::shared_mutex workspace_mutex;
  std::unordered_map<CUstream, Workspace> workspaces;
  std::vector<CUdeviceptr> retired;  // outgrown workspaces: a captured graph may still use them
};

}  // namespace detail

struct Runtime::Impl {
  using DeviceState = detail::DeviceState;
  using LoadedVariant = detail::LoadedVariant;
  using GridSize = detail::GridSize;

  detail::JitEngine engine;
  std::mutex devices_mutex;
  std::vector<std::unique_ptr<DeviceState>> devices;  // guarded by devices_mutex
  // Lock-free view of the devices already set up, for the hot path.
  static constexpr int kMaxDevices = 64;
  std::array<std::atomic<DeviceState*>, kMaxDevices> ready_devices{};

  explicit Impl(detail::EnvConfig config) : engine(std::move(config)) {}

  ~Impl() {
    // The driver may already be torn down at process exit; release best effort, never throw.
    std::string why;
    if (!detail::driver_available(&why)) return;
    const auto& api = driver();
    for (auto& device : devices) {
      if (!device) continue;
      if (api.cuCtxPushCurrent(device->primary) != CUDA_SUCCESS) continue;
      for (auto& [id, variant] : device->variants) api.cuModuleUnload(variant->module);
      for (auto& [stream, workspace] : device->workspaces) api.cuMemFree(workspace.pointer);
      for (CUdeviceptr pointer : device->retired) api.cuMemFree(pointer);
      CUcontext popped;
      api.cuCtxPopCurrent(&popped);
      api.cuDevicePrimaryCtxRelease(device->device);
    }
  }

  // The device of the calling thread's current context (device 0's primary context if none).
  DeviceState& current_device() {
    const auto& api = driver();
    CUcontext context = nullptr;
    check_cu(api.cuCtxGetCurrent(&context), "cuCtxGetCurrent", -1);
    CUdevice device = 0;
    if (context) check_cu(api.cuCtxGetDevice(&device), "cuCtxGetDevice", -1);
    DeviceState& state = device_state(static_cast<int>(device));
    if (!context) {
      check_cu(api.cuCtxSetCurrent(state.primary), "cuCtxSetCurrent", state.ordinal);
    } else if (context != state.primary) {
      throw CudaError(fmt::format("astrai-jit: the current context on device {} is not its primary "
                                  "context; kernels run in the primary context (the one the CUDA "
                                  "runtime and PyTorch use)", state.ordinal),
                      static_cast<int>(CUDA_ERROR_INVALID_CONTEXT));
    }
    return state;
  }

  DeviceState& device_state(int ordinal) {
    if (ordinal >= 0 && ordinal < kMaxDevices) {
      if (DeviceState* ready = ready_devices[static_cast<std::size_t>(ordinal)].load(std::memory_order_acquire))
        return *ready;
    }
    std::lock_guard<std::mutex> lock(devices_mutex);
    if (devices.empty()) {
      int count = 0;
      check_cu(driver().cuDeviceGetCount(&count), "cuDeviceGetCount", -1);
      devices.resize(static_cast<std::size_t>(count));
    }
    if (ordinal < 0 || ordinal >= static_cast<int>(devices.size()))
      throw CudaError(fmt::format("astrai-jit: device {} does not exist", ordinal),
                      static_cast<int>(CUDA_ERROR_INVALID_DEVICE));
    auto& slot = devices[static_cast<std::size_t>(ordinal)];
    if (!slot) {
      const auto& api = driver();
      auto state = std::make_unique<DeviceState>();
      state->ordinal = ordinal;
      check_cu(api.cuDeviceGet(&state->device, ordinal), "cuDeviceGet", ordinal);
      int major = 0, minor = 0;
      check_cu(api.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, state->device),
               "cuDeviceGetAttribute", ordinal);
      check_cu(api.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, state->device),
               "cuDeviceGetAttribute", ordinal);
      check_cu(api.cuDeviceGetAttribute(&state->num_sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
                                        state->device),
               "cuDeviceGetAttribute", ordinal);
      check_cu(api.cuDevicePrimaryCtxRetain(&state->primary, state->device),
               "cuDevicePrimaryCtxRetain", ordinal);
      state->arch = engine.target_for_device(major, minor);
      state->force_no_mma = engine.config().no_mma && detail::arch_number(state->arch) >= 80;
      state->programmatic_launch = major >= 9 && api.driver_version >= 12030;
      detail::log(detail::LogLevel::debug, "device {}: sm_{}{}, {} SMs, target {}{}", ordinal, major,
                  minor, state->num_sms, state->arch, state->force_no_mma ? " (ASTRAI_JIT_NO_MMA)" : "");
      slot = std::move(state);
      if (ordinal < kMaxDevices)
        ready_devices[static_cast<std::size_t>(ordinal)].store(slot.get(), std::memory_order_release);
    }
    return *slot;
  }

  // Hot path: a shared (uncontended) lock and a hash lookup. Cold path: JIT + module load.
  const LoadedVariant& variant(DeviceState& device, const detail::VariantRequest& request) {
    const std::uint64_t id = request.id();
    {
      std::shared_lock<std::shared_mutex> lock(device.variants_mutex);
      auto it = device.variants.find(id);
      if (it != device.variants.end()) return *it->second;
    }
    KernelSpec spec;
    spec.kind = request.kind;
    spec.dtype = request.dtype;
    spec.head_dim = request.head_dim;
    spec.page_size = request.page_size;
    spec.group_size = request.group;
    spec.flags = request.flags;
    spec.force_no_mma = device.force_no_mma;
    spec.arch = device.arch;
    auto compiled = engine.get(spec);

    std::unique_lock<std::shared_mutex> lock(device.variants_mutex);
    auto it = device.variants.find(id);
    if (it != device.variants.end()) return *it->second;
    const auto& api = driver();
    auto loaded = std::make_unique<LoadedVariant>();
    loaded->name = spec.name();
    check_cu(api.cuCtxPushCurrent(device.primary), "cuCtxPushCurrent", device.ordinal);
    struct PopGuard {
      ~PopGuard() {
        CUcontext popped;
        driver().cuCtxPopCurrent(&popped);
      }
    } pop_guard;
    check_cu(api.cuModuleLoadData(&loaded->module, compiled->binary.data()),
             fmt::format("cuModuleLoadData({})", loaded->name).c_str(), device.ordinal);
    for (std::size_t i = 0; i < compiled->symbols.size() && i < loaded->functions.size(); ++i) {
      check_cu(api.cuModuleGetFunction(&loaded->functions[i], loaded->module, compiled->symbols[i].c_str()),
               "cuModuleGetFunction", device.ordinal);
    }
    if (request.dynamic_smem > 48 * 1024) {
      const int smem = request.dynamic_smem;
      check_cu(api.cuFuncSetAttribute(loaded->functions[0],
                                      CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem),
               fmt::format("cuFuncSetAttribute({}, shared memory {} bytes)", loaded->name, smem).c_str(),
               device.ordinal);
    }
    int per_sm = 0;
    if (api.cuOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, loaded->functions[0],
                                                        static_cast<int>(request.threads),
                                                        static_cast<std::size_t>(request.dynamic_smem)) !=
            CUDA_SUCCESS ||
        per_sm < 1)
      per_sm = 1;
    loaded->resident_ctas = per_sm * device.num_sms;
    const LoadedVariant& result = *loaded;
    device.variants.emplace(id, std::move(loaded));
    return result;
  }

  CUdeviceptr workspace(DeviceState& device, CUstream stream, std::size_t bytes, const char* call) {
    {
      std::shared_lock<std::shared_mutex> read_lock(device.workspace_mutex);
      auto it = device.workspaces.find(stream);
      if (it != device.workspaces.end() && it->second.bytes >= bytes) return it->second.pointer;
    }
    std::unique_lock<std::shared_mutex> lock(device.workspace_mutex);
    detail::Workspace& workspace = device.workspaces[stream];
    if (workspace.bytes >= bytes) return workspace.pointer;
    const auto& api = driver();
    CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
    check_cu(api.cuStreamIsCapturing(stream, &capture), "cuStreamIsCapturing", device.ordinal);
    if (capture != CU_STREAM_CAPTURE_STATUS_NONE)
      throw Error(fmt::format("{}: the split-KV workspace must grow to {} bytes while the stream is "
                              "being captured; make one call of this shape before capturing, or "
                              "pass args.workspace", call, bytes));
    // Grow geometrically; keep the old buffer alive (a captured graph may still point at it).
    const std::size_t new_bytes = std::max(bytes, workspace.bytes * 2);
    CUdeviceptr pointer = 0;
    check_cu(api.cuMemAlloc(&pointer, new_bytes), fmt::format("cuMemAlloc({} bytes)", new_bytes).c_str(),
             device.ordinal);
    if (workspace.pointer) device.retired.push_back(workspace.pointer);
    workspace.pointer = pointer;
    workspace.bytes = new_bytes;
    return pointer;
  }

  void launch(DeviceState& device, CUfunction function, const char* name, GridSize grid,
              unsigned threads, unsigned smem, CUstream stream, void* params) {
    void* arguments[] = {params};
    check_cu(driver().cuLaunchKernel(function, grid.x, grid.y, grid.z, threads, 1, 1, smem, stream,
                                     arguments, nullptr),
             name, device.ordinal);
  }

  // A launch that may start before the previous kernel on `stream` finishes (where the device
  // supports it); the kernel must wait for that kernel's results (griddepcontrol.wait).
  void launch_dependent(DeviceState& device, CUfunction function, const char* name, GridSize grid,
                        unsigned threads, unsigned smem, CUstream stream, void* params) {
    if (!device.programmatic_launch) return launch(device, function, name, grid, threads, smem, stream, params);
    void* arguments[] = {params};
    CUlaunchAttribute attribute{};
    attribute.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attribute.value.programmaticStreamSerializationAllowed = 1;
    CUlaunchConfig config{};
    config.gridDimX = grid.x;
    config.gridDimY = grid.y;
    config.gridDimZ = grid.z;
    config.blockDimX = threads;
    config.blockDimY = config.blockDimZ = 1;
    config.sharedMemBytes = smem;
    config.hStream = stream;
    config.attrs = &attribute;
    config.numAttrs = 1;
    check_cu(driver().cuLaunchKernelEx(&config, function, arguments, nullptr), name, device.ordinal);
  }

};


}  // namespace astrai
