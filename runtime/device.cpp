#include "runtime/device.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "base/logging.hpp"
#include "runtime/jit_engine.hpp"

namespace astrai::detail {

namespace {

// Releases run at process exit too, when the driver may already be shutting down: they
// ignore results and never throw.
void pop_context() {
  CUcontext popped = nullptr;
  driver().cuCtxPopCurrent(&popped);
}

CUdevice device_handle(int ordinal) {
  CUdevice device = 0;
  check_cu(driver().cuDeviceGet(&device, ordinal), "cuDeviceGet", ordinal);
  return device;
}

int device_attribute(CUdevice device, CUdevice_attribute attribute, int ordinal) {
  int value = 0;
  check_cu(driver().cuDeviceGetAttribute(&value, attribute, device), "cuDeviceGetAttribute", ordinal);
  return value;
}

// A compact, allocation-free identity of a variant on one device (whose arch is fixed).
std::uint64_t variant_id(const KernelSpec& spec) {
  return (static_cast<std::uint64_t>(spec.kind) << 56) | (static_cast<std::uint64_t>(spec.dtype) << 52) |
         (static_cast<std::uint64_t>(spec.head_dim & 0xfff) << 40) |
         (static_cast<std::uint64_t>(spec.page_size & 0xfff) << 28) |
         (static_cast<std::uint64_t>(spec.group_size & 0xff) << 20) | (spec.flags & 0xfffffu) |
         (static_cast<std::uint64_t>(spec.hopper) << 60) | (static_cast<std::uint64_t>(spec.wide) << 61);
}

}  // namespace

ScopedContext::ScopedContext(CUcontext context, int ordinal) {
  check_cu(driver().cuCtxPushCurrent(context), "cuCtxPushCurrent", ordinal);
}

ScopedContext::~ScopedContext() { pop_context(); }

PrimaryContext::PrimaryContext(CUdevice device, int ordinal) : device_(device) {
  check_cu(driver().cuDevicePrimaryCtxRetain(&context_, device), "cuDevicePrimaryCtxRetain", ordinal);
}

PrimaryContext::~PrimaryContext() { driver().cuDevicePrimaryCtxRelease(device_); }

ModuleHandle::ModuleHandle(CUcontext context, const void* image, const std::string& variant, int ordinal)
    : context_(context) {
  ScopedContext scope(context, ordinal);
  check_cu(driver().cuModuleLoadData(&module_, image), fmt::format("cuModuleLoadData({})", variant).c_str(),
           ordinal);
}

ModuleHandle::~ModuleHandle() {
  const auto& api = driver();
  if (api.cuCtxPushCurrent(context_) != CUDA_SUCCESS) return;
  api.cuModuleUnload(module_);
  pop_context();
}

DeviceAllocation::DeviceAllocation(CUcontext context, std::size_t bytes, int ordinal)
    : context_(context), bytes_(bytes) {
  ScopedContext scope(context, ordinal);
  check_cu(driver().cuMemAlloc(&pointer_, bytes), fmt::format("cuMemAlloc({} bytes)", bytes).c_str(), ordinal);
}

DeviceAllocation::~DeviceAllocation() {
  const auto& api = driver();
  if (api.cuCtxPushCurrent(context_) != CUDA_SUCCESS) return;
  api.cuMemFree(pointer_);
  pop_context();
}

CUdeviceptr WorkspacePool::acquire(CUstream stream, std::size_t bytes, const char* call) {
  {
    std::shared_lock<std::shared_mutex> read_lock(mutex_);
    auto it = current_.find(stream);
    if (it != current_.end() && it->second && it->second->bytes() >= bytes) return it->second->get();
  }
  std::unique_lock<std::shared_mutex> lock(mutex_);
  std::unique_ptr<DeviceAllocation>& slot = current_[stream];
  if (slot && slot->bytes() >= bytes) return slot->get();
  CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
  check_cu(driver().cuStreamIsCapturing(stream, &capture), "cuStreamIsCapturing", ordinal_);
  if (capture != CU_STREAM_CAPTURE_STATUS_NONE)
    throw Error(fmt::format("{}: the split-KV workspace must grow to {} bytes while the stream is "
                            "being captured; make one call of this shape before capturing, or "
                            "pass args.workspace", call, bytes));
  // Grow geometrically; keep the old buffer alive (a captured graph may still point at it).
  const std::size_t new_bytes = std::max(bytes, slot ? slot->bytes() * 2 : std::size_t{0});
  auto grown = std::make_unique<DeviceAllocation>(context_, new_bytes, ordinal_);
  if (slot) retired_.push_back(std::move(slot));
  slot = std::move(grown);
  return slot->get();
}

Device::Device(int ordinal, const JitEngine& engine)
    : ordinal_(ordinal),
      device_(device_handle(ordinal)),
      primary_(device_, ordinal),
      workspaces_(primary_.get(), ordinal) {
  const int major = device_attribute(device_, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, ordinal);
  const int minor = device_attribute(device_, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, ordinal);
  traits_.num_sms = device_attribute(device_, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, ordinal);
  traits_.arch = engine.target_for_device(major, minor);
  traits_.max_smem_per_cta = device_attribute(device_, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, ordinal);
  traits_.force_no_mma = engine.config().no_mma && arch_number(traits_.arch) >= 80;
  traits_.no_hopper = engine.config().no_wgmma;
  traits_.decode_tiles = engine.config().decode_tiles;
  traits_.prefill_tiles = engine.config().prefill_tiles;
  // The kernels wait for their predecessor (griddepcontrol) only when compiled for sm_90 or newer;
  // PTX of an older virtual arch (ASTRAI_JIT_ARCH=compute_80 on Hopper) has no wait, so it must
  // not be launched early.
  programmatic_launch_ = major >= 9 && arch_number(traits_.arch) >= 90 && driver().driver_version >= 12030;
  log(LogLevel::debug, "device {}: sm_{}{}, {} SMs, target {}{}{}", ordinal, major, minor, traits_.num_sms,
      traits_.arch, traits_.force_no_mma ? " (ASTRAI_JIT_NO_MMA)" : "",
      traits_.no_hopper && traits_.arch == "sm_90a" ? " (ASTRAI_JIT_NO_WGMMA)" : "");
}

const LoadedVariant& Device::variant(JitEngine& engine, const KernelSpec& request, KernelShape shape) {
  const std::uint64_t id = variant_id(request);
  {
    std::shared_lock<std::shared_mutex> lock(variants_mutex_);
    auto it = variants_.find(id);
    if (it != variants_.end()) return *it->second;
  }
  KernelSpec spec = request;
  spec.force_no_mma = traits_.force_no_mma;
  spec.arch = traits_.arch;
  auto compiled = engine.get(spec);

  std::unique_lock<std::shared_mutex> lock(variants_mutex_);
  auto it = variants_.find(id);
  if (it != variants_.end()) return *it->second;
  const auto& api = driver();
  auto loaded = std::make_unique<LoadedVariant>(context(), compiled->binary.data(), spec.name(), ordinal_);
  ScopedContext scope(context(), ordinal_);
  for (std::size_t i = 0; i < compiled->symbols.size() && i < loaded->functions.size(); ++i) {
    check_cu(api.cuModuleGetFunction(&loaded->functions[i], loaded->module.get(), compiled->symbols[i].c_str()),
             "cuModuleGetFunction", ordinal_);
  }
  if (shape.dynamic_smem > 48 * 1024) {
    check_cu(api.cuFuncSetAttribute(loaded->functions[0], CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                    shape.dynamic_smem),
             fmt::format("cuFuncSetAttribute({}, shared memory {} bytes)", loaded->name, shape.dynamic_smem)
                 .c_str(),
             ordinal_);
  }
  int per_sm = 0;
  if (api.cuOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, loaded->functions[0], shape.threads,
                                                      static_cast<std::size_t>(shape.dynamic_smem)) !=
          CUDA_SUCCESS ||
      per_sm < 1)
    per_sm = 1;
  loaded->resident_ctas = per_sm * traits_.num_sms;
  const LoadedVariant& result = *loaded;
  variants_.emplace(id, std::move(loaded));
  return result;
}

void Device::launch(CUfunction function, const LaunchConfig& config, void* params) const {
  void* arguments[] = {params};
  launch(function, config, arguments);
}

void Device::launch(CUfunction function, const LaunchConfig& config, void** arguments) const {
  LaunchConfig supported = config;
  supported.programmatic_dependent = config.programmatic_dependent && programmatic_launch_;
  launch_kernel(function, supported, arguments, ordinal_);
}

void launch_kernel(CUfunction function, const LaunchConfig& config, void** arguments, int ordinal) {
  const auto& api = driver();
  if (!config.programmatic_dependent) {
    check_cu(api.cuLaunchKernel(function, config.grid.x, config.grid.y, config.grid.z, config.block, 1, 1,
                                config.smem, config.stream, arguments, nullptr),
             config.name, ordinal);
    return;
  }
  CUlaunchAttribute attribute{};
  attribute.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
  attribute.value.programmaticStreamSerializationAllowed = 1;
  CUlaunchConfig launch{};
  launch.gridDimX = config.grid.x;
  launch.gridDimY = config.grid.y;
  launch.gridDimZ = config.grid.z;
  launch.blockDimX = config.block;
  launch.blockDimY = launch.blockDimZ = 1;
  launch.sharedMemBytes = config.smem;
  launch.hStream = config.stream;
  launch.attrs = &attribute;
  launch.numAttrs = 1;
  check_cu(api.cuLaunchKernelEx(&launch, function, arguments, nullptr), config.name, ordinal);
}

void Device::append_variant_names(std::vector<std::string>* names) const {
  std::shared_lock<std::shared_mutex> lock(variants_mutex_);
  for (const auto& [id, variant] : variants_) names->push_back(variant->name);
}

Device& DeviceRegistry::current(const JitEngine& engine) {
  const auto& api = driver();
  CUcontext context = nullptr;
  check_cu(api.cuCtxGetCurrent(&context), "cuCtxGetCurrent", -1);
  CUdevice device = 0;
  if (context) check_cu(api.cuCtxGetDevice(&device), "cuCtxGetDevice", -1);
  Device& state = at(static_cast<int>(device), engine);
  if (!context) {
    check_cu(api.cuCtxSetCurrent(state.context()), "cuCtxSetCurrent", state.ordinal());
  } else if (context != state.context()) {
    throw CudaError(fmt::format("astrai-jit: the current context on device {} is not its primary "
                                "context; kernels run in the primary context (the one the CUDA "
                                "runtime and PyTorch use)", state.ordinal()),
                    static_cast<int>(CUDA_ERROR_INVALID_CONTEXT));
  }
  return state;
}

Device& DeviceRegistry::at(int ordinal, const JitEngine& engine) {
  if (ordinal >= 0 && ordinal < kMaxDevices) {
    if (Device* ready = ready_[static_cast<std::size_t>(ordinal)].load(std::memory_order_acquire)) return *ready;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (devices_.empty()) {
    int count = 0;
    check_cu(driver().cuDeviceGetCount(&count), "cuDeviceGetCount", -1);
    devices_.resize(static_cast<std::size_t>(count));
  }
  if (ordinal < 0 || ordinal >= static_cast<int>(devices_.size()))
    throw CudaError(fmt::format("astrai-jit: device {} does not exist", ordinal),
                    static_cast<int>(CUDA_ERROR_INVALID_DEVICE));
  auto& slot = devices_[static_cast<std::size_t>(ordinal)];
  if (!slot) {
    slot = std::make_unique<Device>(ordinal, engine);
    if (ordinal < kMaxDevices)
      ready_[static_cast<std::size_t>(ordinal)].store(slot.get(), std::memory_order_release);
  }
  return *slot;
}

std::vector<std::string> DeviceRegistry::loaded_variant_names() const {
  std::vector<std::string> names;
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& device : devices_)
    if (device) device->append_variant_names(&names);
  return names;
}

}  // namespace astrai::detail
