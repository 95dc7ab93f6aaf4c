// astrai-bench: times the astrai-jit kernels against ceilings measured in the same run.
//
//   astrai-bench [--filter REGEX] [--reps N] [--calls N] [--json FILE]
//   astrai-bench --list [--filter REGEX]
//
// Ceilings first (a streaming read of 2 GiB with 16-byte loads and a 2 GiB cuMemcpyDtoD, both
// compiled or issued here), then every selected case: random inputs, rotated among enough
// buffer sets to defeat the L2, one warm-up call outside the numbers (JIT compile or cache
// load), then a CUDA graph of back-to-back calls replayed --reps times and timed with events.
// JIT figures (cold compile, cached load in a fresh process, host overhead of a hot call) are
// cases too. A case that fails prints "error: <message>" and the run goes on.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <regex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "astrai/error.hpp"
#include "astrai/runtime.hpp"
#include "runtime/driver_api.hpp"
#include "runtime/env_config.hpp"
#include "runtime/jit_engine.hpp"
#include "runtime/kernel_spec.hpp"
#include "runtime/logging.hpp"
#include "runtime/nvrtc_compiler.hpp"

extern char** environ;

namespace {

namespace fs = std::filesystem;
using astrai::DType;
using astrai::Runtime;
using astrai::detail::check_cu;
using astrai::detail::driver;
using astrai::detail::EnvConfig;
using astrai::detail::JitEngine;
using astrai::detail::KernelKind;
using astrai::detail::KernelSpec;
using Clock = std::chrono::steady_clock;

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;

constexpr double kDocumentedGemmTflops = 763.0;  // bf16 8192^3, ../shared/spec/performance.md
constexpr std::size_t kCeilingBytes = std::size_t{2} << 30;  // 2 GiB
constexpr std::size_t kDefaultL2Bytes = std::size_t{60} << 20;
constexpr std::size_t kMemoryHeadroom = std::size_t{768} << 20;  // left for the runtime
constexpr int kMaxSets = 512;
constexpr int kMaxCallsPerReplay = 1024;
constexpr int kWarmupReplays = 3;
constexpr int kBenchThreads = 256;

constexpr const char* kFooter =
    "Ceilings (always measured): streaming read of a 2 GiB bf16 buffer with 16-byte loads\n"
    "(bytes read), and a 2 GiB cuMemcpyDtoD (bytes read + written); median of max(10, --reps)\n"
    "timed runs after warm-up. The bf16 GEMM ceiling is the documented 763 TFLOP/s.\n"
    "\n"
    "Cases: random inputs (never zeros), rotated among buffer sets totalling >= 3x the L2 when\n"
    "one set is smaller than 2x the L2. The first call of a case (JIT compile or cache load)\n"
    "is timed separately; then a CUDA graph of --calls back-to-back calls is replayed --reps\n"
    "times, each replay between two events. Reported: median us per call and the min..max\n"
    "over replays. Rates: decode kernels TB/s over K+V read for the real lengths + Q + O +\n"
    "page table (percent of the read ceiling); rotary 2 x bytes(x) + bytes(freqs) (percent of\n"
    "the copy ceiling); prefill 4*B*H*q*kv*D FLOPs, halved when causal (percent of 763).\n"
    "\n"
    "Exit codes: 0 the run finished (some cases may show errors), 1 no GPU or a failure\n"
    "outside the cases, 2 usage error (bad flag, bad --filter regex, no case selected).";

// ---------------------------------------------------------------------------------------------
// Small helpers

std::string first_line(const std::string& text) {
  const std::size_t end = text.find('\n');
  return end == std::string::npos ? text : text.substr(0, end);
}

std::string strip_prefix(std::string message) {
  const std::string prefix = "astrai-jit: ";
  if (message.compare(0, prefix.size(), prefix) == 0) message.erase(0, prefix.size());
  return message;
}

std::string clip(const std::string& text, std::size_t width) {
  if (text.size() <= width) return text;
  return text.substr(0, width - 3) + "...";
}

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

std::string format_gib(double bytes) { return fmt::format("{:.2f} GiB", bytes / double(1u << 30)); }

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  if (::gmtime_r(&now, &utc) == nullptr) return "?";
  char text[32];
  if (std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &utc) == 0) return "?";
  return text;
}

struct Stats {
  double median = 0, min = 0, max = 0;
  int count = 0;
};

Stats stats_of(std::vector<double> values) {
  Stats stats;
  if (values.empty()) return stats;
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  stats.count = static_cast<int>(n);
  stats.min = values.front();
  stats.max = values.back();
  stats.median = n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
  return stats;
}

// ---------------------------------------------------------------------------------------------
// A minimal JSON value, enough to write the report.

class Json {
 public:
  static Json object() { return Json(Kind::object); }
  static Json array() { return Json(Kind::array); }
  Json() = default;
  Json(double value) : kind_(Kind::number), number_(value) {}  // NOLINT: implicit on purpose
  Json(int value) : Json(static_cast<double>(value)) {}
  Json(std::int64_t value) : Json(static_cast<double>(value)) {}
  Json(std::uint64_t value) : Json(static_cast<double>(value)) {}
  Json(bool value) : kind_(Kind::boolean), boolean_(value) {}
  Json(std::string value) : kind_(Kind::string), text_(std::move(value)) {}
  Json(const char* value) : Json(std::string(value)) {}

  Json& set(const std::string& key, Json value) {
    members_.emplace_back(key, std::move(value));
    return *this;
  }
  Json& push(Json value) {
    items_.push_back(std::move(value));
    return *this;
  }

  std::string dump() const {
    std::string out;
    write(&out, 0);
    out += '\n';
    return out;
  }

 private:
  enum class Kind { null, boolean, number, string, array, object };
  explicit Json(Kind kind) : kind_(kind) {}

  static void quote(std::string* out, const std::string& text) {
    *out += '"';
    for (const char c : text) {
      switch (c) {
        case '"': *out += "\\\""; break;
        case '\\': *out += "\\\\"; break;
        case '\n': *out += "\\n"; break;
        case '\r': *out += "\\r"; break;
        case '\t': *out += "\\t"; break;
        default:
          if (static_cast<unsigned char>(c) < 0x20) *out += fmt::format("\\u{:04x}", static_cast<int>(c));
          else *out += c;
      }
    }
    *out += '"';
  }

  void write(std::string* out, int indent) const {
    const std::string pad(static_cast<std::size_t>(indent + 2), ' ');
    const std::string close(static_cast<std::size_t>(indent), ' ');
    switch (kind_) {
      case Kind::null: *out += "null"; break;
      case Kind::boolean: *out += boolean_ ? "true" : "false"; break;
      case Kind::number:
        if (!std::isfinite(number_)) *out += "null";
        else if (number_ == std::floor(number_) && std::fabs(number_) < 1e15)
          *out += fmt::format("{}", static_cast<long long>(number_));
        else *out += fmt::format("{}", number_);
        break;
      case Kind::string: quote(out, text_); break;
      case Kind::array:
        if (items_.empty()) { *out += "[]"; break; }
        *out += "[\n";
        for (std::size_t i = 0; i < items_.size(); ++i) {
          *out += pad;
          items_[i].write(out, indent + 2);
          *out += i + 1 < items_.size() ? ",\n" : "\n";
        }
        *out += close + "]";
        break;
      case Kind::object:
        if (members_.empty()) { *out += "{}"; break; }
        *out += "{\n";
        for (std::size_t i = 0; i < members_.size(); ++i) {
          *out += pad;
          quote(out, members_[i].first);
          *out += ": ";
          members_[i].second.write(out, indent + 2);
          *out += i + 1 < members_.size() ? ",\n" : "\n";
        }
        *out += close + "}";
        break;
    }
  }

  Kind kind_ = Kind::null;
  double number_ = 0;
  bool boolean_ = false;
  std::string text_;
  std::vector<Json> items_;
  std::vector<std::pair<std::string, Json>> members_;
};

Json stats_json(const Stats& stats) {
  return Json::object().set("median", stats.median).set("min", stats.min).set("max", stats.max)
      .set("count", stats.count);
}

// ---------------------------------------------------------------------------------------------
// Cases

enum class CaseKind { paged_decode, decode, prefill, paged_prefill, rotary, jit_compile, jit_load, jit_host };

struct CaseDef {
  CaseKind kind = CaseKind::paged_decode;
  std::string kernel;  // table column "kernel"
  std::string label;   // table column "case"; name() = kernel/label is what --filter matches
  int batch = 0;
  int len = 0;  // decode: kv length (ragged: the mean); prefill: q_len = kv_len; rotary: tokens
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int page_size = 0;
  bool causal = false;
  bool ragged = false;       // lengths uniform in 1..2*len
  std::string ratio_to;      // another case this one is compared with (rate over rate)
  std::string ratio_label;

  std::string name() const { return kernel + "/" + label; }

  std::string shape() const {
    switch (kind) {
      case CaseKind::paged_decode:
        if (ragged)
          return fmt::format("B{} L1..{} H{}/{} D{} ps{}", batch, 2 * len, n_heads, n_kv_heads, head_dim,
                             page_size);
        return fmt::format("B{} L{} H{}/{} D{} ps{}", batch, len, n_heads, n_kv_heads, head_dim, page_size);
      case CaseKind::decode:
        return fmt::format("B{} L{} H{}/{} D{}", batch, len, n_heads, n_kv_heads, head_dim);
      case CaseKind::prefill:
        return fmt::format("B{} S{} H{}/{} D{} {}", batch, len, n_heads, n_kv_heads, head_dim,
                           causal ? "causal" : "full");
      case CaseKind::paged_prefill:
        return fmt::format("B{} S{} H{}/{} D{} ps{} {}", batch, len, n_heads, n_kv_heads, head_dim,
                           page_size, causal ? "causal" : "full");
      case CaseKind::rotary:
        return fmt::format("T{} H{} D{} in-place", len, n_heads, head_dim);
      case CaseKind::jit_compile: return "cold NVRTC compile of 5 variants, fresh cache dir (ms)";
      case CaseKind::jit_load: return "cached variant: JitEngine::get + cuModuleLoadData, fresh process (ms)";
      case CaseKind::jit_host: return "host us per hot paged_decode call vs raw cuLaunchKernel";
    }
    return "";
  }

  std::string basis() const {
    switch (kind) {
      case CaseKind::paged_decode:
      case CaseKind::decode: return "TB/s, % of read ceiling";
      case CaseKind::prefill:
      case CaseKind::paged_prefill: return "TFLOP/s, % of documented GEMM";
      case CaseKind::rotary: return "TB/s, % of copy ceiling";
      default: return "";
    }
  }

  bool is_jit() const {
    return kind == CaseKind::jit_compile || kind == CaseKind::jit_load || kind == CaseKind::jit_host;
  }
};

std::vector<CaseDef> all_cases() {
  std::vector<CaseDef> cases;
  auto paged_decode = [&](int head_dim, int heads, int kv_heads, int page, int batch, int len,
                          bool ragged, std::string ratio_to, std::string ratio_label) {
    CaseDef c;
    c.kind = CaseKind::paged_decode;
    c.kernel = "paged_decode";
    c.label = fmt::format("hd{}{}.ps{}.B{}xL{}{}", head_dim,
                          heads == 32 && kv_heads == 8 ? std::string()
                                                       : fmt::format(".h{}kv{}", heads, kv_heads),
                          page, batch, len, ragged ? ".ragged" : "");
    c.batch = batch;
    c.len = len;
    c.n_heads = heads;
    c.n_kv_heads = kv_heads;
    c.head_dim = head_dim;
    c.page_size = page;
    c.ragged = ragged;
    c.ratio_to = std::move(ratio_to);
    c.ratio_label = std::move(ratio_label);
    cases.push_back(c);
  };
  const std::string uniform = "paged_decode/hd128.ps16.B32xL4096";
  const std::string astrai16 = "paged_decode/hd64.h24kv4.ps16.B32xL4096";
  paged_decode(128, 32, 8, 16, 64, 8192, false, "", "");
  paged_decode(128, 32, 8, 16, 16, 32768, false, "", "");
  paged_decode(128, 32, 8, 16, 32, 4096, false, "", "");
  paged_decode(128, 32, 8, 16, 1, 1024, false, "", "");
  paged_decode(128, 32, 8, 16, 1, 32768, false, "", "");
  paged_decode(128, 32, 8, 1, 32, 4096, false, uniform, "TB/s vs ps16");
  paged_decode(128, 32, 8, 16, 32, 4096, true, uniform, "TB/s vs uniform");
  paged_decode(64, 24, 4, 16, 32, 4096, false, "", "");
  paged_decode(64, 24, 4, 1, 32, 4096, false, astrai16, "TB/s vs ps16");

  auto decode = [&](int batch, int len) {
    CaseDef c;
    c.kind = CaseKind::decode;
    c.kernel = "decode";
    c.label = fmt::format("hd128.B{}xL{}", batch, len);
    c.batch = batch;
    c.len = len;
    c.n_heads = 32;
    c.n_kv_heads = 8;
    c.head_dim = 128;
    cases.push_back(c);
  };
  decode(64, 8192);
  decode(32, 4096);
  decode(1, 1024);

  auto prefill = [&](CaseKind kind, int head_dim, bool causal, int batch, int len, int page) {
    CaseDef c;
    c.kind = kind;
    c.kernel = kind == CaseKind::prefill ? "prefill" : "paged_prefill";
    c.label = fmt::format("hd{}{}.{}.B{}x{}", head_dim, page ? fmt::format(".ps{}", page) : std::string(),
                          causal ? "causal" : "full", batch, len);
    c.batch = batch;
    c.len = len;
    c.n_heads = 32;
    c.n_kv_heads = 8;
    c.head_dim = head_dim;
    c.page_size = page;
    c.causal = causal;
    if (kind == CaseKind::paged_prefill) {
      c.ratio_to = "prefill/hd128.causal.B2x8192";
      c.ratio_label = "TFLOP/s vs prefill";
    }
    cases.push_back(c);
  };
  prefill(CaseKind::prefill, 128, true, 2, 8192, 0);
  prefill(CaseKind::prefill, 128, false, 4, 4096, 0);
  prefill(CaseKind::prefill, 64, true, 2, 8192, 0);
  prefill(CaseKind::prefill, 256, true, 2, 8192, 0);
  prefill(CaseKind::paged_prefill, 128, true, 2, 8192, 16);

  auto rotary = [&](int tokens) {
    CaseDef c;
    c.kind = CaseKind::rotary;
    c.kernel = "rotary_emb";
    c.label = fmt::format("hd128.T{}", tokens);
    c.len = tokens;
    c.batch = 1;
    c.n_heads = 32;
    c.head_dim = 128;
    cases.push_back(c);
  };
  rotary(16384);
  rotary(64);

  auto jit = [&](CaseKind kind, const char* label) {
    CaseDef c;
    c.kind = kind;
    c.kernel = "jit";
    c.label = label;
    cases.push_back(c);
  };
  jit(CaseKind::jit_compile, "compile");
  jit(CaseKind::jit_load, "load");
  jit(CaseKind::jit_host, "host_overhead");
  return cases;
}

// ---------------------------------------------------------------------------------------------
// Options

struct Options {
  std::string filter;
  int reps = 30;
  int calls = 20;
  int compile_reps = 3;
  int load_runs = 5;
  std::string json_path;
  bool list = false;
  std::vector<std::string> child_load;  // <cache dir> <variant>
};

// ---------------------------------------------------------------------------------------------
// Driver-side RAII

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes) : bytes_(std::max<std::size_t>(bytes, 256)) {
    check_cu(driver().cuMemAlloc(&pointer_, bytes_),
             fmt::format("cuMemAlloc({})", format_gib(static_cast<double>(bytes_))).c_str(), 0);
  }
  ~DeviceBuffer() {
    if (pointer_) driver().cuMemFree(pointer_);
  }
  DeviceBuffer(DeviceBuffer&& other) noexcept : pointer_(other.pointer_), bytes_(other.bytes_) {
    other.pointer_ = 0;
    other.bytes_ = 0;
  }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    std::swap(pointer_, other.pointer_);
    std::swap(bytes_, other.bytes_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  CUdeviceptr get() const { return pointer_; }
  void* ptr() const { return reinterpret_cast<void*>(pointer_); }
  template <typename T> T* as() const { return reinterpret_cast<T*>(pointer_); }
  std::size_t bytes() const { return bytes_; }

  template <typename T> static DeviceBuffer from(const std::vector<T>& host) {
    DeviceBuffer buffer(host.size() * sizeof(T));
    if (!host.empty())
      check_cu(driver().cuMemcpyHtoD(buffer.pointer_, host.data(), host.size() * sizeof(T)), "cuMemcpyHtoD", 0);
    return buffer;
  }

 private:
  CUdeviceptr pointer_ = 0;
  std::size_t bytes_ = 0;
};

class Event {
 public:
  Event() { check_cu(driver().cuEventCreate(&event_, CU_EVENT_DEFAULT), "cuEventCreate", 0); }
  ~Event() {
    if (event_) driver().cuEventDestroy(event_);
  }
  Event(Event&& other) noexcept : event_(other.event_) { other.event_ = nullptr; }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  Event& operator=(Event&&) = delete;
  CUevent get() const { return event_; }

 private:
  CUevent event_ = nullptr;
};

class GraphExec {
 public:
  GraphExec() = default;
  GraphExec(CUgraph graph, CUgraphExec exec) : graph_(graph), exec_(exec) {}
  ~GraphExec() { reset(); }
  GraphExec(GraphExec&& other) noexcept : graph_(other.graph_), exec_(other.exec_) {
    other.graph_ = nullptr;
    other.exec_ = nullptr;
  }
  GraphExec& operator=(GraphExec&& other) noexcept {
    if (this != &other) {
      reset();
      std::swap(graph_, other.graph_);
      std::swap(exec_, other.exec_);
    }
    return *this;
  }
  GraphExec(const GraphExec&) = delete;
  GraphExec& operator=(const GraphExec&) = delete;
  CUgraphExec get() const { return exec_; }
  explicit operator bool() const { return exec_ != nullptr; }

 private:
  void reset() {
    if (exec_) driver().cuGraphExecDestroy(exec_);
    if (graph_) driver().cuGraphDestroy(graph_);
    exec_ = nullptr;
    graph_ = nullptr;
  }
  CUgraph graph_ = nullptr;
  CUgraphExec exec_ = nullptr;
};

class TempDir {
 public:
  TempDir() {
    std::error_code ec;
    fs::path base = fs::temp_directory_path(ec);
    if (ec) base = "/tmp";
    std::string pattern = (base / "astrai-bench-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr)
      throw astrai::Error(fmt::format("cannot create a temporary directory under {}", base.string()));
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

void sync_stream(CUstream stream) { check_cu(driver().cuStreamSynchronize(stream), "cuStreamSynchronize", 0); }

// Input set-up ends here: cuMemcpyHtoD from pageable memory runs on the legacy stream and may
// still be in flight when it returns, and the timed stream does not wait for that stream.
void sync_all() { check_cu(driver().cuCtxSynchronize(), "cuCtxSynchronize", 0); }

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
)";

struct BenchKernels {
  CUmodule module = nullptr;
  CUfunction fill_bf16 = nullptr;
  CUfunction fill_rotation = nullptr;
  CUfunction stream_read = nullptr;
  CUfunction noop = nullptr;
};

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

// ---------------------------------------------------------------------------------------------
// Results

struct Ceiling {
  bool ok = false;
  std::string error;
  Stats ms;             // per run
  double bytes = 0;     // counted per run
  std::string note;
  double tbps() const { return ok && ms.median > 0 ? bytes / (ms.median * 1e-3) / 1e12 : 0; }
  double tbps_min() const { return ok && ms.max > 0 ? bytes / (ms.max * 1e-3) / 1e12 : 0; }
  double tbps_max() const { return ok && ms.min > 0 ? bytes / (ms.min * 1e-3) / 1e12 : 0; }
};

struct CaseResult {
  CaseDef def;
  std::string status = "ok";  // ok | error | skipped
  std::string error;
  std::string variant;
  Stats us;                   // per call, over replays
  std::string metric;         // "TB/s" | "TFLOP/s"
  double rate = 0;            // at the median time
  double rate_min = 0, rate_max = 0;
  std::string ceiling;        // "read" | "copy" | "gemm (documented)"
  double ceiling_value = 0;
  double percent = 0;         // 0 when there is no ceiling
  double bytes = 0;           // per call, memory-bound cases
  double flops = 0;           // per call, prefill
  double floor_us = 0;        // bytes or flops over the ceiling
  int sets = 1;
  int calls_per_replay = 0;
  std::string method;         // "graph" | "launches"
  double first_call_ms = 0;   // the warm-up call (JIT compile or cache load + run)
  std::optional<double> ratio;
  std::vector<std::string> notes;
};

struct CompileFigure {
  std::string variant;
  std::string error;
  Stats ms;
};

struct JitResults {
  bool compile_run = false;
  std::vector<CompileFigure> compiles;
  bool load_run = false;
  std::string load_variant;
  std::string load_error;
  Stats load_ms, load_get_ms, load_module_ms;
  bool host_run = false;
  std::string host_error;
  std::string host_variant;
  Stats runtime_us, raw_us;
  int launches_per_call = 1;
  int host_calls = 0;
};

// ---------------------------------------------------------------------------------------------
// The benchmark

struct DeviceInfo {
  CUdevice device = 0;
  CUcontext context = nullptr;
  std::string name;
  int sms = 0;
  int cc_major = 0, cc_minor = 0;
  std::size_t total_mem = 0;
  std::size_t l2_bytes = 0;
  int sm_clock_khz = 0, mem_clock_khz = 0, bus_width_bits = 0;
  int driver_version = 0;
  std::string bench_target;
  std::string runtime_target;  // what the runtime compiles for (ASTRAI_JIT_ARCH honored)
  bool runtime_no_mma = false;
};

using Call = std::function<void(int set, CUstream stream)>;

struct Timing {
  Stats us_per_call;
  int calls = 0;
  std::string method;
  double first_call_ms = 0;
  std::vector<std::string> notes;
};

class Bench {
 public:
  explicit Bench(const Options& options) : options_(options) {}
  ~Bench() {
    if (stream_) driver().cuStreamDestroy(stream_);
    if (kernels_.module) driver().cuModuleUnload(kernels_.module);
    if (info_.context) driver().cuDevicePrimaryCtxRelease(info_.device);
  }
  Bench(const Bench&) = delete;
  Bench& operator=(const Bench&) = delete;

  void open_device();
  void compile_kernels();
  void measure_ceilings();
  CaseResult run_case(const CaseDef& def, const std::map<std::string, CaseResult>& earlier);
  void run_jit(const CaseDef& def);

  const DeviceInfo& info() const { return info_; }
  const Ceiling& read_ceiling() const { return read_; }
  const Ceiling& copy_ceiling() const { return copy_; }
  const JitResults& jit() const { return jit_; }
  bool context_broken() const { return context_broken_; }
  const std::string& broken_reason() const { return broken_reason_; }

 private:
  void fill_bf16(const DeviceBuffer& buffer, std::size_t count, std::uint64_t seed);
  void fill_rotation(const DeviceBuffer& buffer, std::size_t pairs, std::uint64_t seed);
  void launch(CUfunction function, unsigned grid, unsigned block, CUstream stream,
              std::vector<void*> params, const char* what);
  std::size_t free_memory() const;
  int choose_sets(std::size_t set_bytes, std::size_t shared_bytes, std::vector<std::string>* notes) const;
  std::vector<double> time_runs(CUstream stream, int warmup, int reps, const std::function<void()>& step);
  Timing time_calls(int sets, const Call& call);
  GraphExec capture(int calls, int sets, const Call& call);
  std::string variant_name(KernelKind kind, int head_dim, int page_size, int group) const;
  void finish(CaseResult* result, const Timing& timing, double amount, bool compute);

  void case_paged_decode(const CaseDef& def, CaseResult* result);
  void case_decode(const CaseDef& def, CaseResult* result);
  void case_prefill(const CaseDef& def, CaseResult* result);
  void case_paged_prefill(const CaseDef& def, CaseResult* result);
  void case_rotary(const CaseDef& def, CaseResult* result);

  void jit_compile();
  void jit_load();
  void jit_host();
  const fs::path& jit_dir();
  EnvConfig jit_config(bool force_compile);
  KernelSpec jit_spec(KernelKind kind, int head_dim, int page_size, int group) const;

  Options options_;
  DeviceInfo info_;
  BenchKernels kernels_;
  CUstream stream_ = nullptr;
  Ceiling read_, copy_;
  JitResults jit_;
  std::unique_ptr<TempDir> jit_dir_;
  bool context_broken_ = false;
  std::string broken_reason_;
  std::vector<std::string> loaded_before_;  // the runtime's variants when the case started
};

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
  kernels_.fill_rotation = get("bench_fill_rotation");
  kernels_.stream_read = get("bench_stream_read");
  kernels_.noop = get("bench_noop");
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

void Bench::fill_rotation(const DeviceBuffer& buffer, std::size_t pairs, std::uint64_t seed) {
  CUdeviceptr pointer = buffer.get();
  unsigned long long n = pairs;
  unsigned long long s = seed;
  launch(kernels_.fill_rotation, static_cast<unsigned>(info_.sms * 8), kBenchThreads, stream_,
         {&pointer, &n, &s}, "cuLaunchKernel(bench_fill_rotation)");
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

// Runs `step` warmup times, then `reps` times back to back with an event between runs; returns
// the milliseconds of each run.
std::vector<double> Bench::time_runs(CUstream stream, int warmup, int reps, const std::function<void()>& step) {
  const auto& api = driver();
  for (int i = 0; i < warmup; ++i) step();
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

std::string Bench::variant_name(KernelKind kind, int head_dim, int page_size, int group) const {
  KernelSpec spec;
  spec.kind = kind;
  spec.dtype = DType::bf16;
  spec.head_dim = head_dim;
  spec.page_size = page_size;
  spec.group_size = group;
  spec.force_no_mma = info_.runtime_no_mma;
  spec.arch = info_.runtime_target;
  return spec.name();
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
    result->ceiling = "gemm (documented)";
    result->ceiling_value = kDocumentedGemmTflops;
  } else {
    result->metric = "TB/s";
    result->bytes = amount;
    const bool rotary = result->def.kind == CaseKind::rotary;
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

// Pages of every sequence, handed out from a shuffled pool so logical and physical order differ.
struct PagedLayout {
  std::vector<std::int32_t> lens;
  std::vector<std::int32_t> table;  // [batch, width]
  int width = 0;
  int num_pages = 0;
  std::int64_t total_tokens = 0;
  std::int64_t pages_read = 0;
};

PagedLayout make_paged_layout(std::vector<std::int32_t> lens, int page_size, std::mt19937& rng) {
  PagedLayout layout;
  layout.lens = std::move(lens);
  int max_len = 1;
  for (int len : layout.lens) {
    max_len = std::max(max_len, len);
    layout.total_tokens += len;
    layout.pages_read += (len + page_size - 1) / page_size;
  }
  layout.width = (max_len + page_size - 1) / page_size;
  layout.num_pages = static_cast<int>(std::max<std::int64_t>(1, layout.pages_read));
  std::vector<std::int32_t> physical(static_cast<std::size_t>(layout.num_pages));
  std::iota(physical.begin(), physical.end(), 0);
  std::shuffle(physical.begin(), physical.end(), rng);
  const std::size_t batch = layout.lens.size();
  layout.table.assign(batch * static_cast<std::size_t>(layout.width), 0);
  std::size_t next = 0;
  for (std::size_t b = 0; b < batch; ++b) {
    const int pages = (layout.lens[b] + page_size - 1) / page_size;
    for (int p = 0; p < pages; ++p) layout.table[b * layout.width + static_cast<std::size_t>(p)] = physical[next++];
  }
  return layout;
}

std::uint64_t seed_of(const std::string& name) { return std::hash<std::string>{}(name) | 1u; }

void Bench::case_paged_decode(const CaseDef& def, CaseResult* result) {
  std::mt19937 rng(static_cast<std::uint32_t>(seed_of(def.name())));
  std::vector<std::int32_t> lens(static_cast<std::size_t>(def.batch), def.len);
  if (def.ragged) {
    std::uniform_int_distribution<int> length(1, 2 * def.len);
    for (auto& len : lens) len = length(rng);
  }
  const PagedLayout layout = make_paged_layout(lens, def.page_size, rng);
  if (def.ragged)
    result->notes.push_back(fmt::format("mean length {:.0f}",
                                        static_cast<double>(layout.total_tokens) / def.batch));
  const int group = def.n_heads / def.n_kv_heads;
  result->variant = variant_name(KernelKind::paged_decode, def.head_dim, def.page_size, group);

  const std::size_t pool_elems = static_cast<std::size_t>(layout.num_pages) * def.page_size * def.n_kv_heads * def.head_dim;
  const std::size_t q_elems = static_cast<std::size_t>(def.batch) * def.n_heads * def.head_dim;
  const std::size_t set_bytes = 2 * pool_elems * 2 + 2 * q_elems * 2;
  const std::size_t shared_bytes = (layout.table.size() + layout.lens.size()) * 4;
  const int sets = choose_sets(set_bytes, shared_bytes, &result->notes);
  result->sets = sets;

  struct Set {
    DeviceBuffer k, v, q, out;
  };
  std::vector<Set> buffers;
  for (int s = 0; s < sets; ++s) {
    Set set{DeviceBuffer(pool_elems * 2), DeviceBuffer(pool_elems * 2), DeviceBuffer(q_elems * 2),
            DeviceBuffer(q_elems * 2)};
    const std::uint64_t seed = seed_of(def.name()) + 4u * static_cast<std::uint64_t>(s);
    fill_bf16(set.k, pool_elems, seed);
    fill_bf16(set.v, pool_elems, seed + 1);
    fill_bf16(set.q, q_elems, seed + 2);
    fill_bf16(set.out, q_elems, seed + 3);
    buffers.push_back(std::move(set));
  }
  const DeviceBuffer table = DeviceBuffer::from(layout.table);
  const DeviceBuffer seq_lens = DeviceBuffer::from(layout.lens);
  sync_all();

  astrai::PagedDecodeArgs base;
  base.dtype = DType::bf16;
  base.batch = def.batch;
  base.n_heads = def.n_heads;
  base.n_kv_heads = def.n_kv_heads;
  base.head_dim = def.head_dim;
  base.page_size = def.page_size;
  base.num_pages = layout.num_pages;
  base.max_pages_per_seq = layout.width;
  base.page_table = table.as<const std::int32_t>();
  base.seq_lens = seq_lens.as<const std::int32_t>();
  const Call call = [&](int s, CUstream stream) {
    astrai::PagedDecodeArgs args = base;
    const Set& set = buffers[static_cast<std::size_t>(s)];
    args.q = set.q.ptr();
    args.k_cache = set.k.ptr();
    args.v_cache = set.v.ptr();
    args.out = set.out.ptr();
    args.stream = stream;
    Runtime::get().paged_decode(args);
  };
  const Timing timing = time_calls(sets, call);
  const double kv_bytes = static_cast<double>(layout.total_tokens) * def.n_kv_heads * def.head_dim * 2 * 2;
  const double bytes = kv_bytes + 2.0 * static_cast<double>(q_elems) * 2 +
                       static_cast<double>(layout.pages_read) * 4 + static_cast<double>(def.batch) * 4;
  finish(result, timing, bytes, false);
}

void Bench::case_decode(const CaseDef& def, CaseResult* result) {
  const int group = def.n_heads / def.n_kv_heads;
  result->variant = variant_name(KernelKind::decode, def.head_dim, 0, group);
  const std::size_t kv_elems = static_cast<std::size_t>(def.batch) * def.len * def.n_kv_heads * def.head_dim;
  const std::size_t q_elems = static_cast<std::size_t>(def.batch) * def.n_heads * def.head_dim;
  const std::size_t set_bytes = 2 * kv_elems * 2 + 2 * q_elems * 2;
  const int sets = choose_sets(set_bytes, 0, &result->notes);
  result->sets = sets;
  struct Set {
    DeviceBuffer k, v, q, out;
  };
  std::vector<Set> buffers;
  for (int s = 0; s < sets; ++s) {
    Set set{DeviceBuffer(kv_elems * 2), DeviceBuffer(kv_elems * 2), DeviceBuffer(q_elems * 2),
            DeviceBuffer(q_elems * 2)};
    const std::uint64_t seed = seed_of(def.name()) + 4u * static_cast<std::uint64_t>(s);
    fill_bf16(set.k, kv_elems, seed);
    fill_bf16(set.v, kv_elems, seed + 1);
    fill_bf16(set.q, q_elems, seed + 2);
    fill_bf16(set.out, q_elems, seed + 3);
    buffers.push_back(std::move(set));
  }
  sync_all();
  astrai::DecodeArgs base;
  base.dtype = DType::bf16;
  base.batch = def.batch;
  base.kv_len = def.len;
  base.n_heads = def.n_heads;
  base.n_kv_heads = def.n_kv_heads;
  base.head_dim = def.head_dim;
  const Call call = [&](int s, CUstream stream) {
    astrai::DecodeArgs args = base;
    const Set& set = buffers[static_cast<std::size_t>(s)];
    args.q = set.q.ptr();
    args.k = set.k.ptr();
    args.v = set.v.ptr();
    args.out = set.out.ptr();
    args.stream = stream;
    Runtime::get().decode(args);
  };
  const Timing timing = time_calls(sets, call);
  const double bytes = 2.0 * static_cast<double>(kv_elems) * 2 + 2.0 * static_cast<double>(q_elems) * 2;
  finish(result, timing, bytes, false);
}

double attention_flops(const CaseDef& def) {
  const double flops = 4.0 * def.batch * def.n_heads * static_cast<double>(def.len) * def.len * def.head_dim;
  return def.causal ? flops / 2 : flops;
}

void Bench::case_prefill(const CaseDef& def, CaseResult* result) {
  const int group = def.n_heads / def.n_kv_heads;
  result->variant = variant_name(KernelKind::prefill, def.head_dim, 0, group);
  const std::size_t q_elems = static_cast<std::size_t>(def.batch) * def.len * def.n_heads * def.head_dim;
  const std::size_t kv_elems = static_cast<std::size_t>(def.batch) * def.len * def.n_kv_heads * def.head_dim;
  const std::size_t set_bytes = 2 * q_elems * 2 + 2 * kv_elems * 2;
  const int sets = choose_sets(set_bytes, 0, &result->notes);
  result->sets = sets;
  struct Set {
    DeviceBuffer q, k, v, out;
  };
  std::vector<Set> buffers;
  for (int s = 0; s < sets; ++s) {
    Set set{DeviceBuffer(q_elems * 2), DeviceBuffer(kv_elems * 2), DeviceBuffer(kv_elems * 2),
            DeviceBuffer(q_elems * 2)};
    const std::uint64_t seed = seed_of(def.name()) + 4u * static_cast<std::uint64_t>(s);
    fill_bf16(set.q, q_elems, seed);
    fill_bf16(set.k, kv_elems, seed + 1);
    fill_bf16(set.v, kv_elems, seed + 2);
    fill_bf16(set.out, q_elems, seed + 3);
    buffers.push_back(std::move(set));
  }
  sync_all();
  astrai::PrefillArgs base;
  base.dtype = DType::bf16;
  base.batch = def.batch;
  base.q_len = def.len;
  base.kv_len = def.len;
  base.n_heads = def.n_heads;
  base.n_kv_heads = def.n_kv_heads;
  base.head_dim = def.head_dim;
  base.causal_offset = def.causal ? 0 : -1;  // a fresh prompt: kv_len - q_len
  const Call call = [&](int s, CUstream stream) {
    astrai::PrefillArgs args = base;
    const Set& set = buffers[static_cast<std::size_t>(s)];
    args.q = set.q.ptr();
    args.k = set.k.ptr();
    args.v = set.v.ptr();
    args.out = set.out.ptr();
    args.stream = stream;
    Runtime::get().prefill(args);
  };
  const Timing timing = time_calls(sets, call);
  finish(result, timing, attention_flops(def), true);
}

void Bench::case_paged_prefill(const CaseDef& def, CaseResult* result) {
  std::mt19937 rng(static_cast<std::uint32_t>(seed_of(def.name())));
  const PagedLayout layout =
      make_paged_layout(std::vector<std::int32_t>(static_cast<std::size_t>(def.batch), def.len), def.page_size, rng);
  const int group = def.n_heads / def.n_kv_heads;
  result->variant = variant_name(KernelKind::paged_prefill, def.head_dim, def.page_size, group);
  const int total_q = def.batch * def.len;
  std::vector<std::int32_t> qo_indptr(static_cast<std::size_t>(def.batch) + 1);
  for (int b = 0; b <= def.batch; ++b) qo_indptr[static_cast<std::size_t>(b)] = b * def.len;
  const std::size_t pool_elems = static_cast<std::size_t>(layout.num_pages) * def.page_size * def.n_kv_heads * def.head_dim;
  const std::size_t q_elems = static_cast<std::size_t>(total_q) * def.n_heads * def.head_dim;
  const std::size_t set_bytes = 2 * pool_elems * 2 + 2 * q_elems * 2;
  const std::size_t shared_bytes = (layout.table.size() + layout.lens.size() + qo_indptr.size()) * 4;
  const int sets = choose_sets(set_bytes, shared_bytes, &result->notes);
  result->sets = sets;
  struct Set {
    DeviceBuffer q, k, v, out;
  };
  std::vector<Set> buffers;
  for (int s = 0; s < sets; ++s) {
    Set set{DeviceBuffer(q_elems * 2), DeviceBuffer(pool_elems * 2), DeviceBuffer(pool_elems * 2),
            DeviceBuffer(q_elems * 2)};
    const std::uint64_t seed = seed_of(def.name()) + 4u * static_cast<std::uint64_t>(s);
    fill_bf16(set.q, q_elems, seed);
    fill_bf16(set.k, pool_elems, seed + 1);
    fill_bf16(set.v, pool_elems, seed + 2);
    fill_bf16(set.out, q_elems, seed + 3);
    buffers.push_back(std::move(set));
  }
  const DeviceBuffer table = DeviceBuffer::from(layout.table);
  const DeviceBuffer seq_lens = DeviceBuffer::from(layout.lens);
  const DeviceBuffer indptr = DeviceBuffer::from(qo_indptr);
  sync_all();
  astrai::PagedPrefillArgs base;
  base.dtype = DType::bf16;
  base.batch = def.batch;
  base.total_q = total_q;
  base.max_q_len = def.len;
  base.n_heads = def.n_heads;
  base.n_kv_heads = def.n_kv_heads;
  base.head_dim = def.head_dim;
  base.page_size = def.page_size;
  base.num_pages = layout.num_pages;
  base.max_pages_per_seq = layout.width;
  base.causal = def.causal;
  base.qo_indptr = indptr.as<const std::int32_t>();
  base.page_table = table.as<const std::int32_t>();
  base.seq_lens = seq_lens.as<const std::int32_t>();
  const Call call = [&](int s, CUstream stream) {
    astrai::PagedPrefillArgs args = base;
    const Set& set = buffers[static_cast<std::size_t>(s)];
    args.q = set.q.ptr();
    args.k_cache = set.k.ptr();
    args.v_cache = set.v.ptr();
    args.out = set.out.ptr();
    args.stream = stream;
    Runtime::get().paged_prefill(args);
  };
  const Timing timing = time_calls(sets, call);
  finish(result, timing, attention_flops(def), true);
}

void Bench::case_rotary(const CaseDef& def, CaseResult* result) {
  result->variant = variant_name(KernelKind::rotary_emb, def.head_dim, 0, 0);
  const std::size_t x_elems = static_cast<std::size_t>(def.len) * def.n_heads * def.head_dim;
  const std::size_t pairs = static_cast<std::size_t>(def.len) * (def.head_dim / 2);
  const std::size_t set_bytes = x_elems * 2 + pairs * 8;
  const int sets = choose_sets(set_bytes, 0, &result->notes);
  result->sets = sets;
  struct Set {
    DeviceBuffer x, freqs;
  };
  std::vector<Set> buffers;
  for (int s = 0; s < sets; ++s) {
    Set set{DeviceBuffer(x_elems * 2), DeviceBuffer(pairs * 8)};
    const std::uint64_t seed = seed_of(def.name()) + 2u * static_cast<std::uint64_t>(s);
    fill_bf16(set.x, x_elems, seed);
    fill_rotation(set.freqs, pairs, seed + 1);
    buffers.push_back(std::move(set));
  }
  sync_all();
  astrai::RotaryArgs base;
  base.dtype = DType::bf16;
  base.batch = 1;
  base.seq_len = def.len;
  base.n_heads = def.n_heads;
  base.head_dim = def.head_dim;
  const Call call = [&](int s, CUstream stream) {
    astrai::RotaryArgs args = base;
    const Set& set = buffers[static_cast<std::size_t>(s)];
    args.x = set.x.ptr();
    args.out = set.x.ptr();  // in place
    args.freqs = set.freqs.as<const float>();
    args.stream = stream;
    Runtime::get().rotary_emb(args);
  };
  const Timing timing = time_calls(sets, call);
  const double bytes = 2.0 * static_cast<double>(x_elems) * 2 + static_cast<double>(pairs) * 8;
  finish(result, timing, bytes, false);
}

CaseResult Bench::run_case(const CaseDef& def, const std::map<std::string, CaseResult>& earlier) {
  CaseResult result;
  result.def = def;
  if (context_broken_) {
    result.status = "skipped";
    result.error = "skipped: the CUDA context is unusable after an earlier error (" + broken_reason_ + ")";
    return result;
  }
  try {
    loaded_before_ = Runtime::get().loaded_variants();
    switch (def.kind) {
      case CaseKind::paged_decode: case_paged_decode(def, &result); break;
      case CaseKind::decode: case_decode(def, &result); break;
      case CaseKind::prefill: case_prefill(def, &result); break;
      case CaseKind::paged_prefill: case_paged_prefill(def, &result); break;
      case CaseKind::rotary: case_rotary(def, &result); break;
      default: break;
    }
  } catch (const std::exception& error) {
    result.status = "error";
    result.error = "error: " + strip_prefix(error.what());
    // A fault in a kernel leaves the context unusable for every later case: say so once.
    const CUresult state = driver().cuCtxSynchronize();
    if (state != CUDA_SUCCESS) {
      context_broken_ = true;
      broken_reason_ = astrai::detail::cu_result_name(state);
    }
  }
  if (result.status == "ok" && !def.ratio_to.empty()) {
    auto it = earlier.find(def.ratio_to);
    if (it != earlier.end() && it->second.status == "ok" && it->second.rate > 0)
      result.ratio = result.rate / it->second.rate;
    else if (it == earlier.end())
      result.notes.push_back("select " + def.ratio_to + " too for the ratio");
  }
  return result;
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
}

// ---------------------------------------------------------------------------------------------
// JIT figures

const fs::path& Bench::jit_dir() {
  if (!jit_dir_) jit_dir_ = std::make_unique<TempDir>();
  return jit_dir_->path();
}

EnvConfig Bench::jit_config(bool force_compile) {
  EnvConfig config;
  config.cache_dir = jit_dir();
  config.cache_mode = astrai::detail::CacheMode::read_write;
  config.force_compile = force_compile;
  config.log_level = astrai::detail::Logger::instance().level();
  return config;
}

KernelSpec Bench::jit_spec(KernelKind kind, int head_dim, int page_size, int group) const {
  return KernelSpec::parse(variant_name(kind, head_dim, page_size, group));
}

void Bench::run_jit(const CaseDef& def) {
  if (context_broken_) {
    const std::string skipped = "skipped: the CUDA context is unusable after an earlier error (" + broken_reason_ + ")";
    if (def.kind == CaseKind::jit_compile) {
      jit_.compile_run = true;
      jit_.compiles.push_back({"-", skipped, {}});
    } else if (def.kind == CaseKind::jit_load) {
      jit_.load_run = true;
      jit_.load_error = skipped;
    } else if (def.kind == CaseKind::jit_host) {
      jit_.host_run = true;
      jit_.host_error = skipped;
    }
    return;
  }
  switch (def.kind) {
    case CaseKind::jit_compile: jit_compile(); break;
    case CaseKind::jit_load: jit_load(); break;
    case CaseKind::jit_host: jit_host(); break;
    default: break;
  }
}

void Bench::jit_compile() {
  jit_.compile_run = true;
  const std::vector<std::tuple<KernelKind, int, int, int>> variants = {
      {KernelKind::paged_decode, 128, 16, 4}, {KernelKind::paged_decode, 64, 1, 6},
      {KernelKind::decode, 128, 0, 4},        {KernelKind::prefill, 128, 0, 4},
      {KernelKind::rotary_emb, 128, 0, 0}};
  for (const auto& [kind, head_dim, page_size, group] : variants) {
    CompileFigure figure;
    figure.variant = variant_name(kind, head_dim, page_size, group);
    fmt::print(stderr, "  compiling {} x{}\n", figure.variant, options_.compile_reps);
    try {
      const KernelSpec spec = KernelSpec::parse(figure.variant);
      std::vector<double> ms;
      for (int rep = 0; rep < options_.compile_reps; ++rep) {
        // A fresh engine each time: nothing in memory, and the disk cache is bypassed.
        JitEngine engine(jit_config(true));
        astrai::detail::VariantSource source = astrai::detail::VariantSource::memory;
        const auto start = Clock::now();
        engine.get(spec, &source);
        ms.push_back(ms_since(start));
        if (source != astrai::detail::VariantSource::compiled)
          throw astrai::Error("the engine did not compile (served from a cache)");
      }
      figure.ms = stats_of(ms);
    } catch (const std::exception& error) {
      figure.error = "error: " + first_line(strip_prefix(error.what()));
    }
    jit_.compiles.push_back(figure);
  }
}

struct ChildOutput {
  int status = -1;
  std::string text;
};

ChildOutput run_self(const std::vector<std::string>& arguments) {
  ChildOutput output;
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw astrai::Error("pipe2 failed");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  std::vector<std::string> storage = arguments;
  std::vector<char*> argv;
  for (auto& argument : storage) argv.push_back(argument.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int spawned = ::posix_spawn(&pid, "/proc/self/exe", &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  if (spawned != 0) {
    ::close(fds[0]);
    throw astrai::Error(fmt::format("posix_spawn(/proc/self/exe) failed: {}", std::strerror(spawned)));
  }
  char buffer[4096];
  for (;;) {
    const ssize_t got = ::read(fds[0], buffer, sizeof buffer);
    if (got > 0) output.text.append(buffer, static_cast<std::size_t>(got));
    else if (got == 0 || errno != EINTR) break;
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  output.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  return output;
}

std::optional<double> field_value(const std::string& text, const std::string& key) {
  const std::size_t at = text.find(key + "=");
  if (at == std::string::npos) return std::nullopt;
  char* end = nullptr;
  const char* begin = text.c_str() + at + key.size() + 1;
  const double value = std::strtod(begin, &end);
  if (end == begin) return std::nullopt;
  return value;
}

void Bench::jit_load() {
  jit_.load_run = true;
  try {
    // The variant must be in the temporary cache: compiled by jit/compile, else here (untimed).
    const KernelSpec spec = jit_spec(KernelKind::paged_decode, 128, 16, 4);
    jit_.load_variant = spec.name();
    {
      JitEngine engine(jit_config(false));
      engine.get(spec);
    }
    std::vector<double> total, get, module;
    for (int run = 0; run < options_.load_runs; ++run) {
      const ChildOutput child = run_self({"astrai-bench", "--child-load", jit_dir().string(), spec.name()});
      const auto load_ms = field_value(child.text, "load_ms");
      const auto get_ms = field_value(child.text, "get_ms");
      const auto module_ms = field_value(child.text, "module_ms");
      if (child.status != 0 || !load_ms || !get_ms || !module_ms)
        throw astrai::Error(fmt::format("child process exited with {}: {}", child.status,
                                        child.text.empty() ? "no output" : first_line(child.text)));
      total.push_back(*load_ms);
      get.push_back(*get_ms);
      module.push_back(*module_ms);
    }
    jit_.load_ms = stats_of(total);
    jit_.load_get_ms = stats_of(get);
    jit_.load_module_ms = stats_of(module);
  } catch (const std::exception& error) {
    jit_.load_error = "error: " + first_line(strip_prefix(error.what()));
  }
}

void Bench::jit_host() {
  jit_.host_run = true;
  try {
    const auto& api = driver();
    CaseDef def;
    def.batch = 1;
    def.len = 1024;
    def.n_heads = 32;
    def.n_kv_heads = 8;
    def.head_dim = 128;
    def.page_size = 16;
    std::mt19937 rng(7);
    const PagedLayout layout = make_paged_layout({def.len}, def.page_size, rng);
    jit_.host_variant = variant_name(KernelKind::paged_decode, def.head_dim, def.page_size, 4);
    const std::size_t pool_elems = static_cast<std::size_t>(layout.num_pages) * def.page_size * def.n_kv_heads * def.head_dim;
    const std::size_t q_elems = static_cast<std::size_t>(def.n_heads) * def.head_dim;
    DeviceBuffer k(pool_elems * 2), v(pool_elems * 2), q(q_elems * 2), out(q_elems * 2);
    fill_bf16(k, pool_elems, 11);
    fill_bf16(v, pool_elems, 12);
    fill_bf16(q, q_elems, 13);
    const DeviceBuffer table = DeviceBuffer::from(layout.table);
    const DeviceBuffer seq_lens = DeviceBuffer::from(layout.lens);
    DeviceBuffer noop_out(1024);
    sync_all();
    astrai::PagedDecodeArgs args;
    args.batch = 1;
    args.n_heads = def.n_heads;
    args.n_kv_heads = def.n_kv_heads;
    args.head_dim = def.head_dim;
    args.page_size = def.page_size;
    args.num_pages = layout.num_pages;
    args.max_pages_per_seq = layout.width;
    args.q = q.ptr();
    args.k_cache = k.ptr();
    args.v_cache = v.ptr();
    args.page_table = table.as<const std::int32_t>();
    args.seq_lens = seq_lens.as<const std::int32_t>();
    args.out = out.ptr();
    args.stream = stream_;
    jit_.launches_per_call = astrai::paged_decode_workspace_bytes(args, info_.sms) > 0 ? 2 : 1;

    CUdeviceptr noop_pointer = noop_out.get();
    int flag = 0;
    void* noop_params[] = {&noop_pointer, &flag};
    auto raw_launch = [&] {
      check_cu(api.cuLaunchKernel(kernels_.noop, 1, 1, 1, 32, 1, 1, 0, stream_, noop_params, nullptr),
               "cuLaunchKernel(bench_noop)", 0);
    };
    auto runtime_call = [&] { Runtime::get().paged_decode(args); };
    for (int i = 0; i < 100; ++i) {
      runtime_call();
      raw_launch();
    }
    sync_stream(stream_);

    // Batches short enough that the launch queue never fills (the host would then wait for the
    // GPU); the stream is drained between batches, outside the timed loops.
    constexpr int kBatches = 25;
    constexpr int kCallsPerBatch = 200;
    std::vector<double> runtime_us, raw_us;
    for (int batch = 0; batch < kBatches; ++batch) {
      auto start = Clock::now();
      for (int i = 0; i < kCallsPerBatch; ++i) runtime_call();
      runtime_us.push_back(ms_since(start) * 1e3 / kCallsPerBatch);
      sync_stream(stream_);
      start = Clock::now();
      for (int i = 0; i < kCallsPerBatch; ++i) raw_launch();
      raw_us.push_back(ms_since(start) * 1e3 / kCallsPerBatch);
      sync_stream(stream_);
    }
    jit_.runtime_us = stats_of(runtime_us);
    jit_.raw_us = stats_of(raw_us);
    jit_.host_calls = kBatches * kCallsPerBatch;
  } catch (const std::exception& error) {
    jit_.host_error = "error: " + first_line(strip_prefix(error.what()));
  }
}

// `astrai-bench --child-load DIR VARIANT`: one cached load in a fresh process. Prints
// "load_ms=... get_ms=... module_ms=... source=disk" on stdout.
int child_load(const std::string& dir, const std::string& variant) {
  try {
    std::string why;
    if (!astrai::detail::driver_available(&why)) {
      fmt::print(stderr, "astrai-bench: error: --child-load needs a CUDA GPU, but {}\n", why);
      return kExitFailed;
    }
    const auto& api = driver();
    CUdevice device = 0;
    CUcontext context = nullptr;
    check_cu(api.cuDeviceGet(&device, 0), "cuDeviceGet", 0);
    check_cu(api.cuDevicePrimaryCtxRetain(&context, device), "cuDevicePrimaryCtxRetain", 0);
    check_cu(api.cuCtxSetCurrent(context), "cuCtxSetCurrent", 0);
    const KernelSpec spec = KernelSpec::parse(variant);

    const auto start = Clock::now();
    EnvConfig config;
    config.cache_dir = dir;
    config.cache_mode = astrai::detail::CacheMode::read_only;
    JitEngine engine(config);
    astrai::detail::VariantSource source = astrai::detail::VariantSource::memory;
    const auto compiled = engine.get(spec, &source);
    const double get_ms = ms_since(start);
    const auto module_start = Clock::now();
    CUmodule module = nullptr;
    check_cu(api.cuModuleLoadData(&module, compiled->binary.data()), "cuModuleLoadData", 0);
    for (const auto& symbol : compiled->symbols) {
      CUfunction function = nullptr;
      check_cu(api.cuModuleGetFunction(&function, module, symbol.c_str()), "cuModuleGetFunction", 0);
    }
    const double module_ms = ms_since(module_start);
    const double load_ms = ms_since(start);
    api.cuModuleUnload(module);
    api.cuDevicePrimaryCtxRelease(device);
    if (source != astrai::detail::VariantSource::disk) {
      fmt::print("error: {} was not served from the cache in {}\n", variant, dir);
      return kExitFailed;
    }
    fmt::print("load_ms={:.3f} get_ms={:.3f} module_ms={:.3f} source=disk\n", load_ms, get_ms, module_ms);
    return kExitOk;
  } catch (const std::exception& error) {
    fmt::print("error: {}\n", first_line(strip_prefix(error.what())));
    return kExitFailed;
  }
}

// ---------------------------------------------------------------------------------------------
// Report

std::string format_rate(double value) { return value > 0 ? fmt::format("{:.2f}", value) : "-"; }

void print_header(const Bench& bench, const Options& options) {
  const DeviceInfo& info = bench.info();
  fmt::print("astrai-bench  {}\n", utc_now());
  fmt::print("device   {}, {} SMs, sm_{}{} (runtime target {}{}, bench kernels {}), {}, L2 {:.0f} MiB\n",
             info.name, info.sms, info.cc_major, info.cc_minor, info.runtime_target,
             info.runtime_no_mma ? " no-mma" : "", info.bench_target,
             format_gib(static_cast<double>(info.total_mem)), static_cast<double>(info.l2_bytes) / (1 << 20));
  std::string clocks;
  if (info.sm_clock_khz > 0) clocks += fmt::format(", SM clock {} MHz", info.sm_clock_khz / 1000);
  if (info.mem_clock_khz > 0 && info.bus_width_bits > 0)
    clocks += fmt::format(", memory {} MHz x {} bit (nominal {:.2f} TB/s)", info.mem_clock_khz / 1000,
                          info.bus_width_bits, 2.0 * info.mem_clock_khz * 1e3 * info.bus_width_bits / 8 / 1e12);
  fmt::print("driver   CUDA {}.{}, NVRTC {}{}\n", info.driver_version / 1000, (info.driver_version % 1000) / 10,
             astrai::detail::nvrtc_version().text(), clocks);
  fmt::print("method   median of {} graph replays of >= {} back-to-back calls (CUDA events), spread = min..max;\n"
             "         inputs random, rotated to >= 3x L2 when smaller than 2x L2; first call (JIT) excluded\n",
             options.reps, options.calls);
  fmt::print("ceilings\n");
  auto ceiling_line = [](const char* name, const Ceiling& ceiling) {
    if (!ceiling.ok) {
      fmt::print("  {:<16} {}\n", name, ceiling.error);
      return;
    }
    fmt::print("  {:<16} {:>6.2f} TB/s  ({:.2f}..{:.2f}, {:.3f} ms median of {})  {}\n", name, ceiling.tbps(),
               ceiling.tbps_min(), ceiling.tbps_max(), ceiling.ms.median, ceiling.ms.count, ceiling.note);
  };
  ceiling_line("streaming read", bench.read_ceiling());
  ceiling_line("device copy", bench.copy_ceiling());
  fmt::print("  {:<16} {:>6.0f} TFLOP/s  documented (performance.md, bf16 GEMM 8192^3), not measured\n",
             "bf16 GEMM", kDocumentedGemmTflops);
}

void print_table(const std::vector<CaseResult>& results) {
  if (results.empty()) return;
  const char* format = "{:<13} {:<28} {:<40} {:<28} {:>10} {:>15} {:>7}  {:<19} {}\n";
  fmt::print("\n");
  fmt::print(format, "kernel", "case", "variant", "shape", "us/call", "rate", "% ceil", "spread us", "notes");
  for (const auto& r : results) {
    if (r.status != "ok") {
      fmt::print("{:<13} {:<28} {:<40} {:<28} {}\n", r.def.kernel, r.def.label, r.variant, r.def.shape(),
                 clip(first_line(r.error), 120));
      continue;
    }
    std::vector<std::string> notes;
    if (r.ratio) notes.push_back(fmt::format("{:.2f}x {}", *r.ratio, r.def.ratio_label));
    for (const auto& note : r.notes) notes.push_back(note);
    if (r.method != "graph") notes.push_back("method: " + r.method);
    std::string joined;
    for (const auto& note : notes) joined += (joined.empty() ? "" : "; ") + note;
    fmt::print(format, r.def.kernel, r.def.label, r.variant, r.def.shape(), fmt::format("{:.2f}", r.us.median),
               fmt::format("{} {}", format_rate(r.rate), r.metric),
               r.percent > 0 ? fmt::format("{:.1f}%", r.percent) : "-",
               fmt::format("{:.2f}..{:.2f}", r.us.min, r.us.max), joined);
  }
}

void print_jit(const JitResults& jit, int compile_reps, int load_runs) {
  if (!jit.compile_run && !jit.load_run && !jit.host_run) return;
  fmt::print("\nJIT\n");
  for (const auto& figure : jit.compiles) {
    if (!figure.error.empty()) {
      fmt::print("  cold compile    {:<40} {}\n", figure.variant, clip(figure.error, 120));
      continue;
    }
    fmt::print("  cold compile    {:<40} {:>9.1f} ms  median of {} ({:.1f}..{:.1f})\n", figure.variant,
               figure.ms.median, compile_reps, figure.ms.min, figure.ms.max);
  }
  if (jit.load_run) {
    if (!jit.load_error.empty())
      fmt::print("  cached load     {:<40} {}\n", jit.load_variant, clip(jit.load_error, 120));
    else
      fmt::print("  cached load     {:<40} {:>9.2f} ms  median of {} fresh processes ({:.2f}..{:.2f}): "
                 "JitEngine::get {:.2f} + module load {:.2f}\n",
                 jit.load_variant, jit.load_ms.median, load_runs, jit.load_ms.min, jit.load_ms.max,
                 jit.load_get_ms.median, jit.load_module_ms.median);
  }
  if (jit.host_run) {
    if (!jit.host_error.empty()) {
      fmt::print("  host overhead   {:<40} {}\n", jit.host_variant, clip(jit.host_error, 120));
    } else {
      fmt::print("  host overhead   {:<40} {:>9.2f} us  per hot paged_decode call ({} launch{}), B1 L1024\n",
                 jit.host_variant, jit.runtime_us.median, jit.launches_per_call,
                 jit.launches_per_call > 1 ? "es" : "");
      fmt::print("  host overhead   {:<40} {:>9.2f} us  per raw cuLaunchKernel (trivial kernel)\n", "bench_noop",
                 jit.raw_us.median);
      fmt::print("  host overhead   {:<40} {:>9.2f} us  runtime - launches x raw (median of {} batches of 200 "
                 "calls, no sync inside)\n",
                 "difference", jit.runtime_us.median - jit.launches_per_call * jit.raw_us.median,
                 jit.runtime_us.count);
    }
  }
}

Json ceiling_json(const Ceiling& ceiling, const char* what) {
  Json json = Json::object();
  json.set("what", what);
  if (!ceiling.ok) return json.set("status", "error").set("error", ceiling.error);
  return json.set("status", "ok")
      .set("tbps", ceiling.tbps())
      .set("tbps_min", ceiling.tbps_min())
      .set("tbps_max", ceiling.tbps_max())
      .set("bytes", ceiling.bytes)
      .set("ms", stats_json(ceiling.ms))
      .set("note", ceiling.note);
}

Json report_json(const Bench& bench, const Options& options, const std::vector<CaseResult>& results) {
  const DeviceInfo& info = bench.info();
  Json json = Json::object();
  json.set("tool", "astrai-bench").set("timestamp", utc_now());
  json.set("device", Json::object()
                         .set("name", info.name)
                         .set("sms", info.sms)
                         .set("compute_capability", fmt::format("{}.{}", info.cc_major, info.cc_minor))
                         .set("runtime_target", info.runtime_target)
                         .set("runtime_no_mma", info.runtime_no_mma)
                         .set("bench_target", info.bench_target)
                         .set("total_memory_bytes", static_cast<std::uint64_t>(info.total_mem))
                         .set("l2_bytes", static_cast<std::uint64_t>(info.l2_bytes))
                         .set("sm_clock_mhz", info.sm_clock_khz / 1000)
                         .set("memory_clock_mhz", info.mem_clock_khz / 1000)
                         .set("memory_bus_bits", info.bus_width_bits)
                         .set("driver_cuda_version", fmt::format("{}.{}", info.driver_version / 1000,
                                                                 (info.driver_version % 1000) / 10))
                         .set("nvrtc_version", astrai::detail::nvrtc_version().text()));
  json.set("settings", Json::object()
                           .set("filter", options.filter)
                           .set("reps", options.reps)
                           .set("calls_per_replay_min", options.calls)
                           .set("warmup_replays", kWarmupReplays)
                           .set("compile_reps", options.compile_reps)
                           .set("load_runs", options.load_runs));
  json.set("ceilings", Json::object()
                           .set("read", ceiling_json(bench.read_ceiling(), "streaming read, 16-byte loads"))
                           .set("copy", ceiling_json(bench.copy_ceiling(), "cuMemcpyDtoD, read + write"))
                           .set("gemm", Json::object()
                                            .set("what", "bf16 GEMM 8192^3, documented in performance.md")
                                            .set("status", "documented")
                                            .set("tflops", kDocumentedGemmTflops)));
  Json cases = Json::array();
  for (const auto& r : results) {
    Json item = Json::object();
    item.set("name", r.def.name()).set("kernel", r.def.kernel).set("case", r.def.label)
        .set("variant", r.variant).set("shape", r.def.shape()).set("status", r.status);
    if (r.status != "ok") {
      item.set("error", r.error);
      cases.push(std::move(item));
      continue;
    }
    item.set("us_per_call", stats_json(r.us))
        .set("metric", r.metric)
        .set("rate", r.rate)
        .set("rate_min", r.rate_min)
        .set("rate_max", r.rate_max)
        .set("ceiling", r.ceiling)
        .set("ceiling_value", r.ceiling_value)
        .set("percent_of_ceiling", r.percent > 0 ? Json(r.percent) : Json())
        .set("floor_us", r.floor_us > 0 ? Json(r.floor_us) : Json());
    if (r.metric == "TB/s") item.set("bytes_per_call", r.bytes);
    else item.set("flops_per_call", r.flops);
    item.set("input_sets", r.sets)
        .set("calls_per_replay", r.calls_per_replay)
        .set("method", r.method)
        .set("first_call_ms", r.first_call_ms);
    if (r.ratio)
      item.set("ratio", Json::object().set("to", r.def.ratio_to).set("what", r.def.ratio_label).set("value", *r.ratio));
    Json notes = Json::array();
    for (const auto& note : r.notes) notes.push(note);
    item.set("notes", std::move(notes));
    cases.push(std::move(item));
  }
  json.set("cases", std::move(cases));

  const JitResults& jit = bench.jit();
  Json jit_json = Json::object();
  if (jit.compile_run) {
    Json compiles = Json::array();
    for (const auto& figure : jit.compiles) {
      Json item = Json::object().set("variant", figure.variant);
      if (figure.error.empty()) item.set("status", "ok").set("ms", stats_json(figure.ms));
      else item.set("status", "error").set("error", figure.error);
      compiles.push(std::move(item));
    }
    jit_json.set("cold_compile", std::move(compiles));
  }
  if (jit.load_run) {
    Json load = Json::object().set("variant", jit.load_variant);
    if (jit.load_error.empty())
      load.set("status", "ok").set("ms", stats_json(jit.load_ms)).set("get_ms", stats_json(jit.load_get_ms))
          .set("module_load_ms", stats_json(jit.load_module_ms));
    else load.set("status", "error").set("error", jit.load_error);
    jit_json.set("cached_load_fresh_process", std::move(load));
  }
  if (jit.host_run) {
    Json host = Json::object().set("variant", jit.host_variant);
    if (jit.host_error.empty())
      host.set("status", "ok")
          .set("runtime_call_us", stats_json(jit.runtime_us))
          .set("raw_launch_us", stats_json(jit.raw_us))
          .set("launches_per_call", jit.launches_per_call)
          .set("overhead_us", jit.runtime_us.median - jit.launches_per_call * jit.raw_us.median)
          .set("calls", jit.host_calls);
    else host.set("status", "error").set("error", jit.host_error);
    jit_json.set("host_overhead", std::move(host));
  }
  json.set("jit", std::move(jit_json));
  return json;
}

void print_error(const std::string& message) {
  fmt::print(stderr, "astrai-bench: error: {}\n", strip_prefix(message));
}

int run(const Options& options, const std::vector<CaseDef>& selected) {
  std::string why;
  if (!astrai::detail::driver_available(&why)) {
    print_error("timing needs a CUDA GPU, but " + why + " (--list and --help work without one)");
    return kExitFailed;
  }
  Bench bench(options);
  try {
    bench.open_device();
    bench.compile_kernels();
  } catch (const astrai::ConfigError& error) {
    print_error(error.what());
    return kExitUsage;
  } catch (const std::exception& error) {
    print_error(error.what());
    return kExitFailed;
  }
  fmt::print(stderr, "measuring ceilings\n");
  bench.measure_ceilings();
  print_header(bench, options);
  std::fflush(stdout);

  std::vector<CaseResult> results;
  std::map<std::string, CaseResult> by_name;
  int index = 0;
  for (const auto& def : selected) {
    ++index;
    fmt::print(stderr, "[{}/{}] {}\n", index, selected.size(), def.name());
    if (def.is_jit()) {
      bench.run_jit(def);
      continue;
    }
    CaseResult result = bench.run_case(def, by_name);
    if (result.status == "ok")
      fmt::print(stderr, "        {:.2f} us/call, {} {}\n", result.us.median, format_rate(result.rate), result.metric);
    else
      fmt::print(stderr, "        {}\n", first_line(result.error));
    by_name[def.name()] = result;
    results.push_back(std::move(result));
  }
  print_table(results);
  print_jit(bench.jit(), options.compile_reps, options.load_runs);
  if (bench.context_broken())
    fmt::print("\nnote: the CUDA context became unusable ({}); later cases were skipped\n", bench.broken_reason());

  if (!options.json_path.empty()) {
    const std::string text = report_json(bench, options, results).dump();
    std::ofstream out(options.json_path, std::ios::binary | std::ios::trunc);
    out << text;
    out.close();
    if (!out) {
      print_error("cannot write " + options.json_path);
      return kExitFailed;
    }
    fmt::print(stderr, "wrote {}\n", options.json_path);
  }
  return kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  CLI::App app{"astrai-bench: times the astrai-jit kernels on GPU 0 against bandwidth ceilings "
               "measured in the same run"};
  app.name("astrai-bench");
  app.footer(kFooter);
  app.add_option("--filter", options.filter, "Run only the cases whose name matches this regex "
                                              "(ECMAScript, searched anywhere in the name)");
  app.add_option("--reps", options.reps, "Timed graph replays per case (ceilings use at least 10)")
      ->check(CLI::Range(1, 100000));
  app.add_option("--calls", options.calls, "Back-to-back calls captured in one graph (at least one per input set)")
      ->check(CLI::Range(1, kMaxCallsPerReplay));
  app.add_option("--compile-reps", options.compile_reps, "Cold compiles per variant for jit/compile")
      ->check(CLI::Range(1, 100));
  app.add_option("--load-runs", options.load_runs, "Fresh processes for jit/load")->check(CLI::Range(1, 100));
  app.add_option("--json", options.json_path, "Also write the results as JSON to this file");
  app.add_flag("--list", options.list, "List the cases (after --filter) and exit; needs no GPU");
  app.add_option("--child-load", options.child_load,
                 "Internal: time one cached load (JitEngine::get + cuModuleLoadData) of VARIANT from "
                 "cache DIR and print it")
      ->expected(2)
      ->type_name("DIR VARIANT")
      ->group("Internal");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error) == 0 ? kExitOk : kExitUsage;
  }

  if (!options.child_load.empty()) return child_load(options.child_load[0], options.child_load[1]);

  {
    const EnvConfig config = [] {
      try {
        return astrai::detail::load_env_config_from_process();
      } catch (const astrai::ConfigError&) {
        return EnvConfig{};  // reported again, as an error, when the runtime starts
      }
    }();
    astrai::detail::Logger::instance().set_level(config.log_level);
  }

  std::vector<CaseDef> selected;
  try {
    const std::regex pattern(options.filter, std::regex::ECMAScript);
    for (const auto& def : all_cases())
      if (options.filter.empty() || std::regex_search(def.name(), pattern)) selected.push_back(def);
  } catch (const std::regex_error& error) {
    print_error(fmt::format("--filter '{}' is not a valid regular expression: {}", options.filter, error.what()));
    return kExitUsage;
  }
  if (selected.empty()) {
    print_error(fmt::format("no case matches --filter '{}' (see --list)", options.filter));
    return kExitUsage;
  }

  if (options.list) {
    for (const auto& def : selected)
      fmt::print("{}\n", def.basis().empty() ? fmt::format("{:<42} {}", def.name(), def.shape())
                                              : fmt::format("{:<42} {:<34} {}", def.name(), def.shape(), def.basis()));
    return kExitOk;
  }
  try {
    return run(options, selected);
  } catch (const std::exception& error) {
    print_error(error.what());
    return kExitFailed;
  }
}
