// astrai::Runtime: argument checks, per-device module loading, workspace, and launches.
#include "astrai/runtime.hpp"

#include <array>
#include <cmath>
#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>

#include <fmt/format.h>

#include "kernel_src/kernel_params.h"
#include "runtime/driver_api.hpp"
#include "runtime/jit_engine.hpp"
#include "runtime/launch_heuristics.hpp"
#include "runtime/logging.hpp"
#include "runtime/validation.hpp"

namespace astrai {

using detail::check_cu;
using detail::driver;
using detail::KernelKind;
using detail::KernelSpec;

namespace {

constexpr float kLog2e = 1.4426950408889634f;

// A compact, allocation-free identity of a variant on one device (arch is per device).
std::uint64_t variant_id(KernelKind kind, DType dtype, int head_dim, int page_size, int group) {
  return (static_cast<std::uint64_t>(kind) << 56) | (static_cast<std::uint64_t>(dtype) << 48) |
         (static_cast<std::uint64_t>(head_dim) << 32) | (static_cast<std::uint64_t>(page_size) << 16) |
         static_cast<std::uint64_t>(group);
}

struct LoadedVariant {
  std::string name;
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
  std::shared_mutex variants_mutex;
  std::unordered_map<std::uint64_t, std::unique_ptr<LoadedVariant>> variants;
  std::mutex workspace_mutex;
  std::unordered_map<CUstream, Workspace> workspaces;
  std::vector<CUdeviceptr> retired;  // outgrown workspaces: a captured graph may still use them
};

}  // namespace

struct Runtime::Impl {
  detail::JitEngine engine;
  std::mutex devices_mutex;
  std::vector<std::unique_ptr<DeviceState>> devices;

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
      detail::log(detail::LogLevel::debug, "device {}: sm_{}{}, {} SMs, target {}{}", ordinal, major,
                  minor, state->num_sms, state->arch, state->force_no_mma ? " (ASTRAI_JIT_NO_MMA)" : "");
      slot = std::move(state);
    }
    return *slot;
  }

  // Hot path: a shared (uncontended) lock and a hash lookup. Cold path: JIT + module load.
  const LoadedVariant& variant(DeviceState& device, KernelKind kind, DType dtype, int head_dim,
                               int page_size, int group) {
    const std::uint64_t id = variant_id(kind, dtype, head_dim, page_size, group);
    {
      std::shared_lock<std::shared_mutex> lock(device.variants_mutex);
      auto it = device.variants.find(id);
      if (it != device.variants.end()) return *it->second;
    }
    KernelSpec spec;
    spec.kind = kind;
    spec.dtype = dtype;
    spec.head_dim = head_dim;
    spec.page_size = page_size;
    spec.group_size = group;
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
    if (kind == KernelKind::paged_decode) {
      const int smem = paged_decode_smem_bytes(head_dim);
      check_cu(api.cuFuncSetAttribute(loaded->functions[0],
                                      CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem),
               fmt::format("cuFuncSetAttribute({}, shared memory {} bytes)", loaded->name, smem).c_str(),
               device.ordinal);
    }
    const LoadedVariant& result = *loaded;
    device.variants.emplace(id, std::move(loaded));
    return result;
  }

  CUdeviceptr workspace(DeviceState& device, CUstream stream, std::size_t bytes, const char* call) {
    std::lock_guard<std::mutex> lock(device.workspace_mutex);
    Workspace& workspace = device.workspaces[stream];
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

};

std::size_t paged_decode_workspace_bytes(const PagedDecodeArgs& input, int num_sms) {
  const PagedDecodeArgs args = detail::resolve_paged_decode_args(input);
  const int group = args.n_heads / args.n_kv_heads;
  const int head_tiles = (group + kDecodeHeadsPerTile - 1) / kDecodeHeadsPerTile;
  const auto plan = detail::plan_decode_splits(args.batch, args.n_kv_heads, head_tiles,
                                               1LL * args.max_pages_per_seq * args.page_size, num_sms);
  return detail::decode_workspace_bytes(plan, args.batch, args.n_heads, args.head_dim);
}

Runtime& Runtime::get() {
  static Runtime runtime;
  return runtime;
}

Runtime::Runtime() {
  detail::EnvConfig config = detail::load_env_config_from_process();
  detail::Logger::instance().set_level(config.log_level);
  for (const auto& name : config.unknown_variables)
    detail::log_once(detail::LogLevel::warn, "unknown-env-" + name,
                     "unknown environment variable {} ignored (known: ASTRAI_JIT_CACHE_DIR, "
                     "ASTRAI_JIT_CACHE, ASTRAI_JIT_FORCE_COMPILE, ASTRAI_JIT_STRICT, "
                     "ASTRAI_JIT_RECORD, ASTRAI_JIT_MAX_CACHE_SIZE, ASTRAI_JIT_LOG, ASTRAI_JIT_ARCH, "
                     "ASTRAI_JIT_NO_MMA, ASTRAI_JIT_DUMP)", name);
  impl_ = std::make_unique<Impl>(std::move(config));
}

Runtime::~Runtime() = default;

std::vector<std::string> Runtime::loaded_variants() const {
  std::vector<std::string> names;
  std::lock_guard<std::mutex> lock(impl_->devices_mutex);
  for (const auto& device : impl_->devices) {
    if (!device) continue;
    std::shared_lock<std::shared_mutex> variants_lock(device->variants_mutex);
    for (const auto& [id, variant] : device->variants) names.push_back(variant->name);
  }
  return names;
}

void Runtime::paged_decode(const PagedDecodeArgs& input) {
  const PagedDecodeArgs args = detail::resolve_paged_decode_args(input);
  if (args.batch == 0) return;
  DeviceState& device = impl_->current_device();
  const int group = args.n_heads / args.n_kv_heads;
  const auto& variant = impl_->variant(device, KernelKind::paged_decode, args.dtype, args.head_dim,
                                       args.page_size, group);
  const int head_tiles = (group + kDecodeHeadsPerTile - 1) / kDecodeHeadsPerTile;
  const auto plan = detail::plan_decode_splits(args.batch, args.n_kv_heads, head_tiles,
                                               1LL * args.max_pages_per_seq * args.page_size,
                                               device.num_sms);
  CUstream stream = static_cast<CUstream>(args.stream);

  PagedDecodeParams params{};
  params.q = args.q;
  params.q_stride_batch = args.q_stride_batch;
  params.q_stride_head = args.q_stride_head;
  params.k_cache = args.k_cache;
  params.v_cache = args.v_cache;
  params.k_stride_page = args.k_stride_page;
  params.k_stride_token = args.k_stride_token;
  params.k_stride_head = args.k_stride_head;
  params.v_stride_page = args.v_stride_page;
  params.v_stride_token = args.v_stride_token;
  params.v_stride_head = args.v_stride_head;
  params.page_table = args.page_table;
  params.page_table_stride = args.page_table_stride;
  params.seq_lens = args.seq_lens;
  params.out = args.out;
  params.out_stride_batch = args.out_stride_batch;
  params.out_stride_head = args.out_stride_head;
  params.batch = args.batch;
  params.n_heads = args.n_heads;
  params.n_kv_heads = args.n_kv_heads;
  params.num_pages = args.num_pages;
  params.max_pages_per_seq = args.max_pages_per_seq;
  params.tokens_per_split = plan.tokens_per_split;
  params.scale_log2 = args.scale * kLog2e;
  params.workspace.num_splits = plan.num_splits;

  if (plan.num_splits > 1) {
    const std::size_t bytes = detail::decode_workspace_bytes(plan, args.batch, args.n_heads, args.head_dim);
    CUdeviceptr base = 0;
    if (args.workspace) {
      if (args.workspace_bytes < bytes)
        throw InvalidArgument(fmt::format("paged_decode: workspace_bytes {} is too small (this shape "
                                          "needs >= {}; see paged_decode_workspace_bytes)",
                                          args.workspace_bytes, bytes));
      base = reinterpret_cast<CUdeviceptr>(args.workspace);
    } else {
      base = impl_->workspace(device, stream, bytes, "paged_decode");
    }
    const std::size_t rows = static_cast<std::size_t>(plan.num_splits) * args.batch * args.n_heads;
    const std::size_t out_bytes = ((rows * args.head_dim * sizeof(float) + 255) / 256) * 256;
    params.workspace.partial_out = reinterpret_cast<float*>(base);
    params.workspace.partial_lse = reinterpret_cast<float*>(base + out_bytes);
  }

  impl_->launch(device, variant.functions[0], "cuLaunchKernel(paged_decode)",
                {static_cast<unsigned>(plan.num_splits),
                 static_cast<unsigned>(args.n_kv_heads * head_tiles), static_cast<unsigned>(args.batch)},
                kDecodeThreads, static_cast<unsigned>(paged_decode_smem_bytes(args.head_dim)), stream,
                &params);
  if (plan.num_splits > 1) {
    CombineParams combine{};
    combine.workspace = params.workspace;
    combine.out = args.out;
    combine.out_stride_batch = args.out_stride_batch;
    combine.out_stride_head = args.out_stride_head;
    combine.batch = args.batch;
    combine.n_heads = args.n_heads;
    impl_->launch(device, variant.functions[1], "cuLaunchKernel(split_combine)",
                  {static_cast<unsigned>(args.batch * args.n_heads), 1, 1}, 128, 0, stream, &combine);
  }
}

void Runtime::rotary_emb(const RotaryArgs& input) {
  const RotaryArgs args = detail::resolve_rotary_args(input);
  const long long vectors = 1LL * args.batch * args.seq_len * args.n_heads * (args.head_dim / 8);
  if (vectors == 0) return;
  DeviceState& device = impl_->current_device();
  const auto& variant = impl_->variant(device, KernelKind::rotary_emb, args.dtype, args.head_dim, 0, 0);
  RotaryParams params{};
  params.x = args.x;
  params.x_stride_batch = args.x_stride_batch;
  params.x_stride_seq = args.x_stride_seq;
  params.x_stride_head = args.x_stride_head;
  params.out = args.out;
  params.out_stride_batch = args.out_stride_batch;
  params.out_stride_seq = args.out_stride_seq;
  params.out_stride_head = args.out_stride_head;
  params.freqs = args.freqs;
  params.freqs_stride_batch = args.freqs_stride_batch;
  params.freqs_stride_seq = args.freqs_stride_seq;
  params.batch = args.batch;
  params.seq_len = args.seq_len;
  params.n_heads = args.n_heads;
  impl_->launch(device, variant.functions[0], "cuLaunchKernel(rotary_emb)",
                {static_cast<unsigned>(detail::rotary_grid_size(vectors, device.num_sms)), 1, 1}, 256, 0,
                static_cast<CUstream>(args.stream), &params);
}

}  // namespace astrai
