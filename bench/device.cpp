// Device set-up, the benchmark's own kernels (fill, stream read, no-op), timing and ceilings.
#include "bench/bench.hpp"

#include "bench_kernels.hpp"
#include "kernel_src/hopper_params.h"
#include "runtime/device.hpp"
#include "runtime/kernel_sources.hpp"
#include "runtime/launch_heuristics.hpp"
#include "runtime/tensor_map.hpp"

namespace astrai::bench {

// ---------------------------------------------------------------------------------------------
// Kernels of the benchmark itself, compiled with NVRTC at start-up.

constexpr const char* kBenchKernelsName = "bench_kernels.cuh";
constexpr const char* kBenchKernels = R"(// Ceiling, fill and launch-overhead kernels of astrai-bench.
typedef unsigned long long u64;

__device__ __forceinline__ u64 bench_mix(u64 x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Uniform in [-1, 1): 24 random bits, exact in float.
__device__ __forceinline__ float bench_uniform(u64 index, u64 seed) {
  const u64 h = bench_mix(index * 0x9e3779b97f4a7c15ULL + seed);
  return static_cast<float>(static_cast<unsigned int>(h >> 40)) * (1.0f / 8388608.0f) - 1.0f;
}

extern "C" __global__ void bench_fill_bf16(unsigned short* out, u64 count, u64 seed) {
  const u64 stride = static_cast<u64>(gridDim.x) * blockDim.x;
  for (u64 i = static_cast<u64>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    unsigned int bits = __float_as_uint(bench_uniform(i, seed));
    bits += 0x7fffu + ((bits >> 16) & 1u);  // round to nearest even
    out[i] = static_cast<unsigned short>(bits >> 16);
  }
}

// Random FP8 bytes: codes 0x00..0x3f of either sign, below 2 in e4m3 and e5m2 (no NaN, no
// infinity).
extern "C" __global__ void bench_fill_fp8(unsigned char* out, u64 count, u64 seed) {
  const u64 stride = static_cast<u64>(gridDim.x) * blockDim.x;
  for (u64 i = static_cast<u64>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    const unsigned int bits = __float_as_uint(bench_uniform(i, seed));
    out[i] = static_cast<unsigned char>(((bits >> 8) & 0x3fu) | ((bits >> 24) & 0x80u));
  }
}

// (cos, sin) pairs of random angles: a rotation keeps the norm, so in-place rotary applied
// many times neither decays to zero nor overflows.
extern "C" __global__ void bench_fill_rotation(float* out, u64 pairs, u64 seed) {
  const u64 stride = static_cast<u64>(gridDim.x) * blockDim.x;
  for (u64 i = static_cast<u64>(blockIdx.x) * blockDim.x + threadIdx.x; i < pairs; i += stride) {
    float s, c;
    sincospif(bench_uniform(i, seed), &s, &c);
    out[2 * i] = c;
    out[2 * i + 1] = s;
  }
}

// Log-sum-exps in [-4, 12): a merge's weights spread over a few orders of magnitude.
extern "C" __global__ void bench_fill_lse(float* out, u64 count, u64 seed) {
  const u64 stride = static_cast<u64>(gridDim.x) * blockDim.x;
  for (u64 i = static_cast<u64>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride)
    out[i] = 4.0f + 8.0f * bench_uniform(i, seed);
}

// Reads `count` 16-byte vectors (grid-stride, four loads in flight per thread) and writes one
// word per block, so that no load can be dropped.
extern "C" __global__ void __launch_bounds__(256) bench_stream_read(const uint4* __restrict__ in,
                                                                     u64 count,
                                                                     unsigned int* __restrict__ out) {
  const u64 stride = static_cast<u64>(gridDim.x) * blockDim.x;
  u64 i = static_cast<u64>(blockIdx.x) * blockDim.x + threadIdx.x;
  unsigned int acc = 0;
  for (; i + 3 * stride < count; i += 4 * stride) {
    const uint4 a = in[i];
    const uint4 b = in[i + stride];
    const uint4 c = in[i + 2 * stride];
    const uint4 d = in[i + 3 * stride];
    acc += (a.x ^ a.y) + (a.z ^ a.w) + (b.x ^ b.y) + (b.z ^ b.w);
    acc += (c.x ^ c.y) + (c.z ^ c.w) + (d.x ^ d.y) + (d.z ^ d.w);
  }
  for (; i < count; i += stride) {
    const uint4 a = in[i];
    acc += (a.x ^ a.y) + (a.z ^ a.w);
  }
  for (int offset = 16; offset > 0; offset >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, offset);
  __shared__ unsigned int warp_sums[8];
  if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned int total = 0;
    for (unsigned int w = 0; w < blockDim.x / 32; ++w) total += warp_sums[w];
    out[blockIdx.x] = total;
  }
}

// The cheapest launch with a parameter block: the reference for host launch overhead.
extern "C" __global__ void bench_noop(unsigned int* out, int flag) {
  if (flag) out[threadIdx.x] = 1u;
}

// Only what a programmatic dependent launch does (sm_90+), in the decode kernel's order
// (allow_first: let the next grid be placed, then wait for the one before) or the split
// combine's (wait, then allow): the launch floor of a decode call.
extern "C" __global__ void bench_dependent_noop(int allow_first) {
#if __CUDA_ARCH__ >= 900
  if (allow_first) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");
  if (!allow_first) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
)";


// NVRTC target for this device: sm_XY (sm_XYa from Hopper on), or PTX for the newest arch
// NVRTC knows when the device is newer. ASTRAI_JIT_ARCH is ignored: these kernels must run here.
std::pair<std::string, bool> bench_target(int major, int minor) {
  const int number = major * 10 + minor;
  const std::vector<int> supported = astrai::detail::nvrtc_supported_archs();
  const bool known = std::find(supported.begin(), supported.end(), number) != supported.end();
  if (!known && !supported.empty() && number > supported.back())
    return {fmt::format("compute_{}", supported.back()), true};
  return {number >= 90 ? fmt::format("sm_{}a", number) : fmt::format("sm_{}", number), false};
}


void Bench::open_device() {
  const auto& api = driver();
  info_.driver_version = api.driver_version;
  check_cu(api.cuDeviceGet(&info_.device, 0), "cuDeviceGet", 0);
  // Like an application using the CUDA runtime: device 0's primary context is current.
  check_cu(api.cuDevicePrimaryCtxRetain(&info_.context, info_.device), "cuDevicePrimaryCtxRetain", 0);
  check_cu(api.cuCtxSetCurrent(info_.context), "cuCtxSetCurrent", 0);
  char name[256] = {};
  check_cu(api.cuDeviceGetName(name, sizeof name, info_.device), "cuDeviceGetName", 0);
  info_.name = name;
  auto attribute = [&](CUdevice_attribute which) {
    int value = 0;
    check_cu(api.cuDeviceGetAttribute(&value, which, info_.device), "cuDeviceGetAttribute", 0);
    return value;
  };
  info_.sms = attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
  info_.cc_major = attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
  info_.cc_minor = attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
  info_.l2_bytes = static_cast<std::size_t>(attribute(CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE));
  if (info_.l2_bytes == 0) info_.l2_bytes = kDefaultL2Bytes;
  // Informational only; some drivers report 0 for these.
  api.cuDeviceGetAttribute(&info_.sm_clock_khz, CU_DEVICE_ATTRIBUTE_CLOCK_RATE, info_.device);
  api.cuDeviceGetAttribute(&info_.mem_clock_khz, CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE, info_.device);
  api.cuDeviceGetAttribute(&info_.bus_width_bits, CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH, info_.device);
  check_cu(api.cuDeviceTotalMem(&info_.total_mem, info_.device), "cuDeviceTotalMem", 0);
  check_cu(api.cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING), "cuStreamCreate", 0);

  // What the runtime compiles for, to name variants exactly as it does.
  JitEngine probe(astrai::detail::load_env_config_from_process());
  info_.runtime_target = probe.target_for_device(info_.cc_major, info_.cc_minor);
  info_.runtime_no_mma = probe.config().no_mma && astrai::detail::arch_number(info_.runtime_target) >= 80;
  info_.runtime_no_wgmma = probe.config().no_wgmma;
  info_.runtime_prefill_tiles = probe.config().prefill_tiles;
  info_.runtime_decode_tiles = probe.config().decode_tiles;
}

void Bench::compile_kernels() {
  const auto [target, ptx_only] = bench_target(info_.cc_major, info_.cc_minor);
  info_.bench_target = target;
  astrai::detail::CompileRequest request;
  request.variant_name = "astrai-bench kernels";
  request.main_file = kBenchKernelsName;
  request.headers = {{kBenchKernelsName, kBenchKernels}};
  request.options = {"--std=c++17", "--gpu-architecture=" + target};
  request.emit_ptx_only = ptx_only;
  const auto compiled = astrai::detail::nvrtc_compile(request, false);
  const auto& api = driver();
  check_cu(api.cuModuleLoadData(&kernels_.module, compiled.binary.data()), "cuModuleLoadData(bench kernels)", 0);
  auto get = [&](const char* name) {
    CUfunction function = nullptr;
    check_cu(api.cuModuleGetFunction(&function, kernels_.module, name), name, 0);
    return function;
  };
  kernels_.fill_bf16 = get("bench_fill_bf16");
  kernels_.fill_fp8 = get("bench_fill_fp8");
  kernels_.fill_rotation = get("bench_fill_rotation");
  kernels_.fill_lse = get("bench_fill_lse");
  kernels_.stream_read = get("bench_stream_read");
  kernels_.noop = get("bench_noop");
  kernels_.dependent_noop = get("bench_dependent_noop");
  if (target != "sm_90a") return;
  astrai::detail::CompileRequest gemm =
      astrai::bench::bench_compile_request("hopper_gemm.cuh", "sm_90a", {"astrai_gemm_bf16_sm90"});
  gemm.variant_name = "astrai-bench wgmma GEMM";
  const auto hopper = astrai::detail::nvrtc_compile(gemm, false);
  check_cu(api.cuModuleLoadData(&kernels_.hopper_module, hopper.binary.data()), "cuModuleLoadData(bench GEMM)", 0);
  check_cu(api.cuModuleGetFunction(&kernels_.gemm, kernels_.hopper_module, hopper.lowered_names[0].c_str()),
           "astrai_gemm_bf16_sm90", 0);
  check_cu(api.cuFuncSetAttribute(kernels_.gemm, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                  astrai::kGemmSmemBytes),
           "cuFuncSetAttribute(bench GEMM)", 0);
}

// The matrix ceiling: C = A B^T in bf16 at 8192^3 on random data (A, B and C 128 MiB each),
// with the wgmma GEMM (sm_90a only; elsewhere the documented figure stands).
void Bench::measure_gemm() {
  if (!kernels_.gemm) {
    gemm_.error = "not measured on this target (no wgmma GEMM): documented 763 TFLOP/s used";
    return;
  }
  constexpr int kSize = 8192;
  try {
    const std::size_t elements = std::size_t{kSize} * kSize;
    DeviceBuffer a(elements * 2), b(elements * 2), c(elements * 2);
    fill_bf16(a, elements, 0x6e11);
    fill_bf16(b, elements, 0x6e12);
    sync_all();
    auto map = [&](const DeviceBuffer& buffer, std::uint32_t rows) {
      astrai::detail::TensorMapShape shape{reinterpret_cast<const void*>(buffer.get()),
                                           {kSize, kSize}, {kSize}, {64, rows}};
      return astrai::detail::encode_tensor_map(shape, false, 0, CU_TENSOR_MAP_L2_PROMOTION_L2_256B);
    };
    CUtensorMap map_a = map(a, astrai::kGemmBlockM);
    CUtensorMap map_b = map(b, astrai::kGemmBlockN);
    CUdeviceptr out = c.get();
    int m = kSize, n = kSize, k = kSize;
    void* params[] = {&map_a, &map_b, &out, &m, &n, &k};
    const unsigned grid = (kSize / astrai::kGemmBlockM) * (kSize / astrai::kGemmBlockN);
    const auto ms = time_runs(stream_, 3, std::max(10, options_.reps), [&] {
      check_cu(driver().cuLaunchKernel(kernels_.gemm, grid, 1, 1, astrai::kGemmThreads, 1, 1,
                                       astrai::kGemmSmemBytes, stream_, params, nullptr),
               "cuLaunchKernel(bench GEMM)", 0);
    });
    gemm_.ok = true;
    gemm_.ms = stats_of(ms);
    gemm_.flops = 2.0 * kSize * kSize * static_cast<double>(kSize);
    gemm_.note = "bf16 8192^3 C = A B^T, random data, TMA + wgmma (bench/kernels/hopper_gemm.cuh)";
  } catch (const std::exception& error) {
    gemm_.error = "error: " + strip_prefix(error.what());
  }
}

void Bench::launch(CUfunction function, unsigned grid, unsigned block, CUstream stream,
                   std::vector<void*> params, const char* what) {
  check_cu(driver().cuLaunchKernel(function, grid, 1, 1, block, 1, 1, 0, stream, params.data(), nullptr),
           what, 0);
}

void Bench::fill_bf16(const DeviceBuffer& buffer, std::size_t count, std::uint64_t seed) {
  CUdeviceptr pointer = buffer.get();
  unsigned long long n = count;
  unsigned long long s = seed;
  launch(kernels_.fill_bf16, static_cast<unsigned>(info_.sms * 8), kBenchThreads, stream_,
         {&pointer, &n, &s}, "cuLaunchKernel(bench_fill_bf16)");
}

void Bench::fill_fp8(const DeviceBuffer& buffer, std::size_t count, std::uint64_t seed) {
  CUdeviceptr pointer = buffer.get();
  unsigned long long n = count;
  unsigned long long s = seed;
  launch(kernels_.fill_fp8, static_cast<unsigned>(info_.sms * 8), kBenchThreads, stream_,
         {&pointer, &n, &s}, "cuLaunchKernel(bench_fill_fp8)");
}

void Bench::fill_kv(const DeviceBuffer& buffer, std::size_t count, std::uint64_t seed, KvDType kv_dtype) {
  if (kv_dtype == KvDType::same) fill_bf16(buffer, count, seed);
  else fill_fp8(buffer, count, seed);
}

void Bench::fill_rotation(const DeviceBuffer& buffer, std::size_t pairs, std::uint64_t seed) {
  CUdeviceptr pointer = buffer.get();
  unsigned long long n = pairs;
  unsigned long long s = seed;
  launch(kernels_.fill_rotation, static_cast<unsigned>(info_.sms * 8), kBenchThreads, stream_,
         {&pointer, &n, &s}, "cuLaunchKernel(bench_fill_rotation)");
}

void Bench::fill_lse(const DeviceBuffer& buffer, std::size_t count, std::uint64_t seed) {
  CUdeviceptr pointer = buffer.get();
  unsigned long long n = count;
  unsigned long long s = seed;
  launch(kernels_.fill_lse, static_cast<unsigned>(info_.sms * 8), kBenchThreads, stream_, {&pointer, &n, &s},
         "cuLaunchKernel(bench_fill_lse)");
}

std::size_t Bench::free_memory() const {
  std::size_t free = 0, total = 0;
  check_cu(driver().cuMemGetInfo(&free, &total), "cuMemGetInfo", 0);
  return free;
}

// Sets of inputs to rotate through: one when a set alone is at least twice the L2, else enough
// for three L2s, as many as fit in free memory.
int Bench::choose_sets(std::size_t set_bytes, std::size_t shared_bytes, std::vector<std::string>* notes) const {
  const std::size_t l2 = info_.l2_bytes;
  int wanted = 1;
  if (set_bytes < 2 * l2)
    wanted = static_cast<int>(std::min<std::size_t>(kMaxSets, (3 * l2 + set_bytes - 1) / std::max<std::size_t>(set_bytes, 1)));
  const std::size_t free = free_memory();
  const std::size_t usable = free > kMemoryHeadroom + shared_bytes ? free - kMemoryHeadroom - shared_bytes : 0;
  const std::size_t fit = usable / std::max<std::size_t>(set_bytes, 1);
  if (fit < 1)
    throw astrai::Error(fmt::format("needs {} of device memory for one input set, {} free",
                                    format_gib(static_cast<double>(set_bytes + shared_bytes)),
                                    format_gib(static_cast<double>(free))));
  if (fit < static_cast<std::size_t>(wanted)) {
    notes->push_back(fmt::format("only {} of {} input sets fit in memory", fit, wanted));
    wanted = static_cast<int>(fit);
  }
  if (wanted > 1) notes->push_back(fmt::format("{} input sets rotated", wanted));
  return wanted;
}

// Runs `step` warmup times and for at least kWarmupSeconds, then `reps` times back to back with an
// event between runs; returns the milliseconds of each run. The time floor is for short cases:
// three replays of a batch-1 decode take about 2 ms, too little for the clocks to leave an idle
// state, so without it a process's first row read up to 20% slow in some passes.
std::vector<double> Bench::time_runs(CUstream stream, int warmup, int reps, const std::function<void()>& step) {
  const auto& api = driver();
  const auto start = Clock::now();
  for (int i = 0; i < warmup || ms_since(start) < kWarmupSeconds * 1e3; ++i) {
    step();
    if (i + 1 >= warmup) sync_stream(stream);
  }
  std::vector<Event> events;
  events.reserve(static_cast<std::size_t>(reps) + 1);
  for (int i = 0; i <= reps; ++i) events.emplace_back();
  check_cu(api.cuEventRecord(events[0].get(), stream), "cuEventRecord", 0);
  for (int i = 0; i < reps; ++i) {
    step();
    check_cu(api.cuEventRecord(events[static_cast<std::size_t>(i) + 1].get(), stream), "cuEventRecord", 0);
  }
  check_cu(api.cuEventSynchronize(events.back().get()), "cuEventSynchronize", 0);
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    float elapsed = 0;
    check_cu(api.cuEventElapsedTime(&elapsed, events[static_cast<std::size_t>(i)].get(),
                                    events[static_cast<std::size_t>(i) + 1].get()),
             "cuEventElapsedTime", 0);
    ms.push_back(elapsed);
  }
  return ms;
}

GraphExec Bench::capture(int calls, int sets, const Call& call) {
  const auto& api = driver();
  check_cu(api.cuStreamBeginCapture(stream_, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "cuStreamBeginCapture", 0);
  CUgraph graph = nullptr;
  try {
    for (int i = 0; i < calls; ++i) call(i % sets, stream_);
  } catch (...) {
    // Leave the stream out of capture mode before reporting.
    if (api.cuStreamEndCapture(stream_, &graph) == CUDA_SUCCESS && graph) api.cuGraphDestroy(graph);
    throw;
  }
  check_cu(api.cuStreamEndCapture(stream_, &graph), "cuStreamEndCapture", 0);
  CUgraphExec exec = nullptr;
  const CUresult instantiated = api.cuGraphInstantiate(&exec, graph, 0);
  if (instantiated != CUDA_SUCCESS) {
    api.cuGraphDestroy(graph);
    check_cu(instantiated, "cuGraphInstantiate", 0);
  }
  return GraphExec(graph, exec);
}

Timing Bench::time_calls(int sets, const Call& call) {
  const auto& api = driver();
  Timing timing;
  // The first call compiles or loads the variant: timed on its own, kept out of the numbers.
  const auto start = Clock::now();
  call(0, stream_);
  sync_stream(stream_);
  timing.first_call_ms = ms_since(start);
  // One eager call per set sizes the runtime's per-stream workspace before capture.
  for (int s = 1; s < sets; ++s) call(s, stream_);
  sync_stream(stream_);

  const int calls = std::min(std::max(options_.calls, sets), kMaxCallsPerReplay);
  timing.calls = calls;
  GraphExec exec;
  try {
    exec = capture(calls, sets, call);
  } catch (const std::exception& error) {
    timing.notes.push_back("graph capture failed (" + clip(first_line(strip_prefix(error.what())), 80) +
                           "); timed back-to-back launches");
  }
  std::function<void()> step;
  if (exec) {
    timing.method = "graph";
    step = [&] { check_cu(api.cuGraphLaunch(exec.get(), stream_), "cuGraphLaunch", 0); };
  } else {
    timing.method = "launches";
    step = [&] {
      for (int i = 0; i < calls; ++i) call(i % sets, stream_);
    };
  }
  std::vector<double> per_call;
  for (double ms : time_runs(stream_, kWarmupReplays, options_.reps, step)) per_call.push_back(ms * 1e3 / calls);
  timing.us_per_call = stats_of(per_call);
  return timing;
}

std::string Bench::variant_name(KernelKind kind, int head_dim, int page_size, int group, std::uint32_t flags) const {
  KernelSpec spec;
  spec.flags = flags;
  spec.kind = kind;
  spec.dtype = DType::bf16;
  spec.head_dim = head_dim;
  spec.page_size = page_size;
  spec.group_size = group;
  spec.force_no_mma = info_.runtime_no_mma;
  spec.arch = info_.runtime_target;
  // The runtime takes the Hopper kernel for every call it serves (the bench's calls have no mask).
  spec.hopper = astrai::detail::hopper_serves(spec) && !info_.runtime_no_wgmma;
  return spec.name();
}

astrai::detail::DeviceTraits Bench::runtime_traits() const {
  astrai::detail::DeviceTraits traits;
  traits.arch = info_.runtime_target;
  traits.num_sms = info_.sms;
  traits.force_no_mma = info_.runtime_no_mma;
  traits.no_hopper = info_.runtime_no_wgmma;
  traits.decode_tiles = info_.runtime_decode_tiles;
  traits.prefill_tiles = info_.runtime_prefill_tiles;
  return traits;
}

// The runtime's plan for a prefill case (equal lengths, no mask): its variant is the case's.
std::string Bench::planned_prefill_variant(KernelKind kind, const CaseDef& def, std::uint32_t flags) const {
  astrai::detail::AttentionProblem problem;
  problem.kind = kind;
  problem.head_dim = def.head_dim;
  problem.page_size = kind == KernelKind::paged_prefill ? def.page_size : 0;
  problem.batch = def.batch;
  problem.n_heads = def.n_heads;
  problem.n_kv_heads = def.n_kv_heads;
  problem.flags = flags;
  problem.max_q_len = def.len;
  problem.total_q = 1LL * def.len * def.batch;
  return astrai::detail::plan_prefill(problem, runtime_traits()).spec.name();
}

void Bench::finish(CaseResult* result, const Timing& timing, double amount, bool compute) {
  result->us = timing.us_per_call;
  result->calls_per_replay = timing.calls;
  result->method = timing.method;
  result->first_call_ms = timing.first_call_ms;
  result->notes.insert(result->notes.end(), timing.notes.begin(), timing.notes.end());
  auto rate_at = [&](double us) { return us > 0 ? amount / (us * 1e-6) / 1e12 : 0.0; };
  result->rate = rate_at(result->us.median);
  result->rate_min = rate_at(result->us.max);
  result->rate_max = rate_at(result->us.min);
  if (compute) {
    result->metric = "TFLOP/s";
    result->flops = amount;
    result->ceiling = gemm_.ok ? "gemm (measured)" : "gemm (documented)";
    result->ceiling_value = gemm_tflops();
  } else {
    result->metric = "TB/s";
    result->bytes = amount;
    const bool rotary = result->def.kind == CaseKind::rotary || result->def.kind == CaseKind::merge_states;
    const Ceiling& ceiling = rotary ? copy_ : read_;
    result->ceiling = rotary ? "copy" : "read";
    result->ceiling_value = ceiling.tbps();
  }
  if (result->ceiling_value > 0) {
    result->percent = 100.0 * result->rate / result->ceiling_value;
    result->floor_us = amount / (result->ceiling_value * 1e12) * 1e6;
  }
  // Name the variant the runtime really loaded when it differs from the expected spelling.
  const auto loaded = Runtime::get().loaded_variants();
  if (std::find(loaded.begin(), loaded.end(), result->variant) != loaded.end()) return;
  std::string fresh;
  for (const auto& name : loaded)
    if (std::find(loaded_before_.begin(), loaded_before_.end(), name) == loaded_before_.end())
      fresh += (fresh.empty() ? "" : "+") + name;
  result->notes.push_back("expected variant " + result->variant + " is not loaded");
  if (!fresh.empty()) result->variant = fresh;
}


// ---------------------------------------------------------------------------------------------
// Ceilings

void Bench::measure_ceilings() {
  const auto& api = driver();
  const int reps = std::max(10, options_.reps);
  std::size_t bytes = kCeilingBytes;
  const std::size_t free = free_memory();
  std::string size_note;
  // The read needs one buffer, the copy a second one of the same size.
  if (2 * bytes + kMemoryHeadroom > free) {
    bytes = std::max<std::size_t>(std::size_t{256} << 20,
                                  ((free > kMemoryHeadroom ? free - kMemoryHeadroom : 0) / 2) & ~((std::size_t{1} << 28) - 1));
    size_note = fmt::format("reduced to {} by free memory", format_gib(static_cast<double>(bytes)));
  }
  DeviceBuffer source;
  try {
    source = DeviceBuffer(bytes);
    fill_bf16(source, bytes / 2, 0x5eed);
    sync_all();
  } catch (const std::exception& error) {
    read_.error = copy_.error = "error: " + strip_prefix(error.what());
    return;
  }

  try {
    // A few grid sizes; the best median is the ceiling.
    DeviceBuffer partial(static_cast<std::size_t>(info_.sms) * 16 * 4);
    CUdeviceptr in = source.get();
    unsigned long long count = bytes / 16;
    CUdeviceptr out = partial.get();
    Stats best;
    int best_blocks = 0;
    for (int blocks_per_sm : {2, 4, 8, 16}) {
      const unsigned grid = static_cast<unsigned>(info_.sms * blocks_per_sm);
      const auto ms = time_runs(stream_, 3, reps, [&] {
        launch(kernels_.stream_read, grid, kBenchThreads, stream_, {&in, &count, &out},
               "cuLaunchKernel(bench_stream_read)");
      });
      const Stats stats = stats_of(ms);
      if (best_blocks == 0 || stats.median < best.median) {
        best = stats;
        best_blocks = blocks_per_sm;
      }
    }
    read_.ok = true;
    read_.ms = best;
    read_.bytes = static_cast<double>(bytes);
    read_.note = fmt::format("{} bf16, 16-byte loads, {} CTAs/SM x {} threads", format_gib(static_cast<double>(bytes)),
                             best_blocks, kBenchThreads);
    if (!size_note.empty()) read_.note += ", " + size_note;
  } catch (const std::exception& error) {
    read_.error = "error: " + strip_prefix(error.what());
  }

  try {
    DeviceBuffer destination(bytes);
    const auto ms = time_runs(nullptr, 3, reps, [&] {
      check_cu(api.cuMemcpyDtoD(destination.get(), source.get(), bytes), "cuMemcpyDtoD", 0);
    });
    copy_.ok = true;
    copy_.ms = stats_of(ms);
    copy_.bytes = 2.0 * static_cast<double>(bytes);
    copy_.note = fmt::format("{} cuMemcpyDtoD, read + write counted", format_gib(static_cast<double>(bytes)));
    if (!size_note.empty()) copy_.note += ", " + size_note;
  } catch (const std::exception& error) {
    copy_.error = "error: " + strip_prefix(error.what());
  }
  measure_launch_floor();
  measure_gemm();
}

// What a call of one or two kernels costs with no work in them: graph replays of back-to-back
// calls, as the cases are timed, each kernel a programmatic dependent launch from sm_90 on (as
// the runtime launches its decode). Shaped as paged decode B1 x 1024 hd128 32/8 heads: 128 CTAs
// of 128 threads (16 splits x 8 KV heads), then the split combine's 32 (no shared memory).
void Bench::measure_launch_floor() {
  const bool programmatic = info_.cc_major >= 9 && info_.driver_version >= 12030;
  auto dependent = [&](unsigned grid, int allow_first, CUstream stream) {
    void* params[] = {&allow_first};
    const detail::LaunchConfig config{"bench_dependent_noop", {grid, 1, 1}, 128, 0, stream, programmatic};
    detail::launch_kernel(kernels_.dependent_noop, config, params, 0);
  };
  try {
    launch_floor_.one_us = time_calls(1, [&](int, CUstream stream) { dependent(128, 1, stream); }).us_per_call;
    launch_floor_.two_us = time_calls(1, [&](int, CUstream stream) {
                             dependent(128, 1, stream);
                             dependent(32, 0, stream);
                           }).us_per_call;
    launch_floor_.ok = true;
    launch_floor_.note = fmt::format("128 CTAs, then 32, of 128 threads, no work{}",
                                     programmatic ? ", programmatic dependent launches" : "");
  } catch (const std::exception& error) {
    launch_floor_.error = "error: " + strip_prefix(error.what());
  }
}


}  // namespace astrai::bench
