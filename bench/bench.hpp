// astrai-bench (bench/): times the astrai-jit kernels against ceilings measured in the same run.
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
// Shared declarations of astrai-bench, split by concern: cases.cpp (the case table and each
// kernel's case), device.cpp (device set-up, the benchmark's own kernels, timing, ceilings),
// jit_figures.cpp (compile, cached load and host overhead), report.cpp (table and JSON),
// main.cpp (options and the run).
#pragma once
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
#include "base/logging.hpp"
#include "kernel_src/kernel_params.h"
#include "runtime/driver_api.hpp"
#include "runtime/env_config.hpp"
#include "runtime/jit_engine.hpp"
#include "runtime/kernel_spec.hpp"
#include "runtime/nvrtc_compiler.hpp"
#include "runtime/plan/attention_plan.hpp"
#include "tests/support/support.hpp"

extern char** environ;

namespace astrai::bench {


namespace fs = std::filesystem;
using astrai::DType;
using astrai::KvDType;
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
constexpr double kWarmupSeconds = 0.1;  // and replays for at least this long (see time_runs)
constexpr int kBenchThreads = 256;

constexpr const char* kFooter =
    "Ceilings (always measured): streaming read of a 2 GiB bf16 buffer with 16-byte loads\n"
    "(bytes read), and a 2 GiB cuMemcpyDtoD (bytes read + written); median of max(10, --reps)\n"
    "timed runs after warm-up. The bf16 GEMM ceiling is measured on sm_90a (the wgmma GEMM of\n"
    "bench/kernels/hopper_gemm.cuh, 8192^3, random data); elsewhere the documented 763 TFLOP/s.\n"
    "Launch floor: graph-replayed calls of one and of two no-op kernels shaped as paged decode\n"
    "B1 x 1024 (128 CTAs, then the split combine's 32), programmatic dependent launches from\n"
    "sm_90 on: what a batch-1 decode call costs before any work.\n"
    "\n"
    "Cases: random inputs (never zeros), rotated among buffer sets totalling >= 3x the L2 when\n"
    "one set is smaller than 2x the L2. The first call of a case (JIT compile or cache load)\n"
    "is timed separately; then a CUDA graph of --calls back-to-back calls is replayed --reps\n"
    "times, each replay between two events. Reported: median us per call and the min..max\n"
    "over replays. Rates: decode kernels TB/s over K+V read for the real lengths + Q + O +\n"
    "page table (percent of the read ceiling); rotary 2 x bytes(x) + bytes(freqs), merge_states\n"
    "the states and their LSEs read + the output and its LSE written (percent of the copy\n"
    "ceiling); prefill 4*B*H*q*kv*D FLOPs, halved when causal (percent of the GEMM ceiling).\n"
    "Feature rows (.swa, .cap, .sink) report their time over the plain row's; a window counts only\n"
    "the tokens (decode) or keys (prefill) inside it, and notes their share.\n"
    "\n"
    "Exit codes: 0 the run finished (some cases may show errors), 1 no GPU or a failure\n"
    "outside the cases, 2 usage error (bad flag, bad --filter regex, no case selected).";

// ---------------------------------------------------------------------------------------------
// Small helpers

inline std::string first_line(const std::string& text) {
  const std::size_t end = text.find('\n');
  return end == std::string::npos ? text : text.substr(0, end);
}

inline std::string strip_prefix(std::string message) {
  const std::string prefix = "astrai-jit: ";
  if (message.compare(0, prefix.size(), prefix) == 0) message.erase(0, prefix.size());
  return message;
}

inline std::string clip(const std::string& text, std::size_t width) {
  if (text.size() <= width) return text;
  return text.substr(0, width - 3) + "...";
}

inline double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

inline std::string format_gib(double bytes) { return fmt::format("{:.2f} GiB", bytes / double(1u << 30)); }

inline std::string utc_now() {
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

inline Stats stats_of(std::vector<double> values) {
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

inline Json stats_json(const Stats& stats) {
  return Json::object().set("median", stats.median).set("min", stats.min).set("max", stats.max)
      .set("count", stats.count);
}

// ---------------------------------------------------------------------------------------------
// Cases

enum class CaseKind {
  paged_decode, decode, prefill, paged_prefill, rotary, merge_states, cascade, mla_decode, jit_compile, jit_load,
  jit_host
};

// How a case compares with its ratio_to case: rate over rate, calls per second over calls per
// second (same work, e.g. tokens/s of an FP8 cache), or time over time (a feature's cost).
enum class RatioOf { rate, calls, time };

struct CaseDef {
  CaseKind kind = CaseKind::paged_decode;
  std::string kernel;  // table column "kernel"
  std::string label;   // table column "case"; name() = kernel/label is what --filter matches
  int batch = 0;
  int len = 0;  // decode: kv length (ragged: the mean); prefill: q_len = kv_len; rotary, merge: tokens
  int states = 2;  // merge_states: states merged a row
  // cascade: tokens of the prefix every request shares (len: each one's own); paged_prefill:
  // tokens cached before each request's chunk of len (the KV holds prefix + len).
  int prefix = 0;
  bool cascade_as_decode = false;  // cascade: the same requests as one plain paged_decode
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int page_size = 0;
  bool causal = false;
  bool ragged = false;       // lengths uniform in 1..2*len
  std::string ratio_to;      // another case this one is compared with
  std::string ratio_label;
  RatioOf ratio_of = RatioOf::rate;
  KvDType kv_dtype = KvDType::same;  // decode and paged_prefill cases: an FP8 cache
  bool qkv_e4m3 = false;             // prefill cases: FP8 attention, e4m3 q, k and v (.qkv_e4m3)
  bool p_fp16 = false;               // FP8 attention with P kept in f16 (.p_fp16)
  // Serving features, set up as the GPU tests do (tests/gpu/test_paged_decode.cpp).
  float logit_cap = 0.f;  // > 0: soft-cap (.cap)
  bool sinks = false;     // one random sink logit per query head (.sink)
  int window_left = -1;   // >= 0: sliding window (.swa); prefill cases with it are causal
  int q_len = 1;  // paged_decode: new query tokens per request (multi-token decode)
  // Decode cases: the cache head-major, paged [pages, kv_heads, page_size, D] (".hnd") or
  // contiguous [batch, kv_heads, len, D] (".bhld", the layout PyTorch's SDPA reads), instead of
  // token-major ([pages, page_size, kv_heads, D], [batch, len, kv_heads, D]).
  bool head_major = false;
  // paged_decode: the pool's pages in sequence order (".inorder") instead of shuffled, so that a
  // request's pages follow one another in memory (the DRAM locality a fresh allocator gives).
  bool pages_in_order = false;
  // paged_decode: each call first rotates Q in place with rotary_emb, as a layer's decode step
  // does (".rope"): the decode then starts behind another kernel than its own split combine.
  bool rope = false;

  std::string name() const { return kernel + "/" + label; }

  // The variant's feature bits; their names, joined by '.', end the label.
  std::uint32_t flags() const {
    std::uint32_t bits = 0;
    if (kv_dtype == KvDType::e4m3) bits |= kFeatureKvE4m3;
    if (kv_dtype == KvDType::e5m2) bits |= kFeatureKvE5m2;
    if (qkv_e4m3) bits |= kFeatureQkvE4m3;
    if (p_fp16) bits |= kFeatureQkvP16;
    if (window_left >= 0) bits |= kFeatureWindow;
    if (logit_cap > 0) bits |= kFeatureSoftCap;
    if (sinks) bits |= kFeatureSink;
    return bits | decode_q_len_flags(q_len);
  }

  // The feature arguments, "window_left=1024 logit_cap=30 sinks"; "" for none.
  std::string features() const {
    std::string text;
    if (window_left >= 0) text += fmt::format(" window_left={}", window_left);
    if (logit_cap > 0) text += fmt::format(" logit_cap={}", logit_cap);
    if (sinks) text += " sinks";
    return text.empty() ? text : text.substr(1);
  }

  std::string shape() const {
    switch (kind) {
      case CaseKind::paged_decode:
        if (ragged)
          return fmt::format("B{} L1..{} H{}/{} D{} ps{}", batch, 2 * len, n_heads, n_kv_heads, head_dim,
                             page_size);
        return fmt::format("B{} L{} H{}/{} D{} ps{}{}", batch, len, n_heads, n_kv_heads, head_dim, page_size,
                           q_len > 1 ? fmt::format(" q{}", q_len) : "");
      case CaseKind::decode:
        return fmt::format("B{} L{} H{}/{} D{}", batch, len, n_heads, n_kv_heads, head_dim);
      case CaseKind::prefill:
        return fmt::format("B{} S{} H{}/{} D{} {}", batch, len, n_heads, n_kv_heads, head_dim,
                           causal ? "causal" : "full");
      case CaseKind::paged_prefill:
        return fmt::format("B{} S{}{} H{}/{} D{} ps{} {}", batch, len,
                           prefix > 0 ? fmt::format(" after {}", prefix) : std::string(), n_heads, n_kv_heads,
                           head_dim, page_size, causal ? "causal" : "full");
      case CaseKind::rotary:
        return fmt::format("T{} H{} D{} in-place", len, n_heads, head_dim);
      case CaseKind::merge_states:
        return fmt::format("T{} H{} D{} {} states", len, n_heads, head_dim, states);
      case CaseKind::cascade:
        return fmt::format("B{} prefix {} + {} own H{}/{} D{} ps{}{}", batch, prefix, len, n_heads, n_kv_heads,
                           head_dim, page_size, cascade_as_decode ? " as paged_decode" : "");
      case CaseKind::mla_decode:
        return fmt::format("B{} L{} H{} q{} ps{} latent 512+64", batch, len, n_heads, q_len, page_size);
      case CaseKind::jit_compile: return "cold NVRTC compile of 5 variants, fresh cache dir (ms)";
      case CaseKind::jit_load: return "cached variant: JitEngine::get + cuModuleLoadData, fresh process (ms)";
      case CaseKind::jit_host: return "host us per hot paged_decode call vs raw cuLaunchKernel";
    }
    return "";
  }

  std::string basis() const {
    switch (kind) {
      case CaseKind::paged_decode:
      case CaseKind::decode:
      case CaseKind::mla_decode: return "TB/s, % of read ceiling";
      case CaseKind::cascade: return "TB/s of the KV read once, % of read ceiling";
      case CaseKind::prefill:
      case CaseKind::paged_prefill: return "TFLOP/s, % of the GEMM ceiling";
      case CaseKind::rotary:
      case CaseKind::merge_states: return "TB/s, % of copy ceiling";
      default: return "";
    }
  }

  bool is_jit() const {
    return kind == CaseKind::jit_compile || kind == CaseKind::jit_load || kind == CaseKind::jit_host;
  }
};


// Every case the benchmark knows, in table order.
std::vector<CaseDef> all_cases();

// Pages of every sequence, handed out from a shuffled pool so logical and physical order differ
// (or, `shuffle` false, in order: each request's pages one after another, requests in turn).
struct PagedLayout {
  std::vector<std::int32_t> lens;
  std::vector<std::int32_t> table;  // [batch, width]
  int width = 0;
  int num_pages = 0;
  std::int64_t total_tokens = 0;
  std::int64_t pages_read = 0;
};

PagedLayout make_paged_layout(std::vector<std::int32_t> lens, int page_size, std::mt19937& rng, bool shuffle = true);
// A case's seed, from its name.
std::uint64_t seed_of(const std::string& name);
// Sink logits for a case with sinks, one per query head, in the range the GPU tests use.
std::vector<float> sink_logits(const CaseDef& def);
// The decode variant the runtime launched last (on sm_90a its tiling follows the split plan,
// which the bench does not repeat), else the expected one.
std::string launched_decode_variant(const std::string& expected);

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

using testing::TempDir;

inline void sync_stream(CUstream stream) { check_cu(driver().cuStreamSynchronize(stream), "cuStreamSynchronize", 0); }

// Input set-up ends here: cuMemcpyHtoD from pageable memory runs on the legacy stream and may
// still be in flight when it returns, and the timed stream does not wait for that stream.
inline void sync_all() { check_cu(driver().cuCtxSynchronize(), "cuCtxSynchronize", 0); }

struct BenchKernels {
  CUmodule module = nullptr;
  CUmodule hopper_module = nullptr;  // sm_90a: the wgmma GEMM of bench/kernels/hopper_gemm.cuh
  CUfunction gemm = nullptr;
  CUfunction fill_bf16 = nullptr;
  CUfunction fill_fp8 = nullptr;
  CUfunction fill_rotation = nullptr;
  CUfunction fill_lse = nullptr;
  CUfunction stream_read = nullptr;
  CUfunction noop = nullptr;
  CUfunction dependent_noop = nullptr;
};


// ---------------------------------------------------------------------------------------------
// Results

struct Ceiling {
  bool ok = false;
  std::string error;
  Stats ms;             // per run
  double bytes = 0;     // counted per run (bandwidth ceilings)
  double flops = 0;     // counted per run (the GEMM ceiling)
  std::string note;
  double tflops() const { return ok && ms.median > 0 ? flops / (ms.median * 1e-3) / 1e12 : 0; }
  double tbps() const { return ok && ms.median > 0 ? bytes / (ms.median * 1e-3) / 1e12 : 0; }
  double tbps_min() const { return ok && ms.max > 0 ? bytes / (ms.max * 1e-3) / 1e12 : 0; }
  double tbps_max() const { return ok && ms.min > 0 ? bytes / (ms.min * 1e-3) / 1e12 : 0; }
};

// The per-call floor of the decode's launches: one kernel a call, and two (the split combine's).
struct LaunchFloor {
  bool ok = false;
  std::string error;
  Stats one_us, two_us;  // per call, over graph replays
  std::string note;
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
  bool runtime_no_wgmma = false;  // ASTRAI_JIT_NO_WGMMA
  astrai::detail::TileChoice runtime_prefill_tiles = astrai::detail::TileChoice::automatic;
  astrai::detail::TileChoice runtime_decode_tiles = astrai::detail::TileChoice::automatic;
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
    if (kernels_.hopper_module) driver().cuModuleUnload(kernels_.hopper_module);
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
  // Measured with the wgmma GEMM on sm_90a; elsewhere not measured (the documented figure).
  const Ceiling& gemm_ceiling() const { return gemm_; }
  const LaunchFloor& launch_floor() const { return launch_floor_; }
  double gemm_tflops() const { return gemm_.ok ? gemm_.tflops() : kDocumentedGemmTflops; }
  const JitResults& jit() const { return jit_; }
  bool context_broken() const { return context_broken_; }
  const std::string& broken_reason() const { return broken_reason_; }

 private:
  void fill_bf16(const DeviceBuffer& buffer, std::size_t count, std::uint64_t seed);
  void fill_fp8(const DeviceBuffer& buffer, std::size_t count, std::uint64_t seed);
  // A cache of `count` elements (bf16, or bytes for an FP8 cache), filled with random values.
  void fill_kv(const DeviceBuffer& buffer, std::size_t count, std::uint64_t seed, KvDType kv_dtype);
  void fill_rotation(const DeviceBuffer& buffer, std::size_t pairs, std::uint64_t seed);
  void fill_lse(const DeviceBuffer& buffer, std::size_t count, std::uint64_t seed);
  void launch(CUfunction function, unsigned grid, unsigned block, CUstream stream,
              std::vector<void*> params, const char* what);
  std::size_t free_memory() const;
  int choose_sets(std::size_t set_bytes, std::size_t shared_bytes, std::vector<std::string>* notes) const;
  std::vector<double> time_runs(CUstream stream, int warmup, int reps, const std::function<void()>& step);
  Timing time_calls(int sets, const Call& call);
  GraphExec capture(int calls, int sets, const Call& call);
  // The name of the narrow variant the runtime takes for such a call (a decode case's is the
  // variant its launch reports, which follows its split plan).
  std::string variant_name(KernelKind kind, int head_dim, int page_size, int group, std::uint32_t flags = 0) const;
  // What the runtime's plans see of the device, from the runtime's own settings.
  astrai::detail::DeviceTraits runtime_traits() const;
  // The variant the runtime's plan takes for a prefill case.
  std::string planned_prefill_variant(KernelKind kind, const CaseDef& def, std::uint32_t flags) const;
  void finish(CaseResult* result, const Timing& timing, double amount, bool compute);

  void case_paged_decode(const CaseDef& def, CaseResult* result);
  void case_decode(const CaseDef& def, CaseResult* result);
  void case_prefill(const CaseDef& def, CaseResult* result);
  void case_paged_prefill(const CaseDef& def, CaseResult* result);
  void case_rotary(const CaseDef& def, CaseResult* result);
  void case_merge_states(const CaseDef& def, CaseResult* result);
  void case_cascade(const CaseDef& def, CaseResult* result);
  void case_mla_decode(const CaseDef& def, CaseResult* result);

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
  void measure_gemm();
  void measure_launch_floor();

  Ceiling read_, copy_, gemm_;
  LaunchFloor launch_floor_;
  JitResults jit_;
  std::unique_ptr<TempDir> jit_dir_;
  bool context_broken_ = false;
  std::string broken_reason_;
  std::vector<std::string> loaded_before_;  // the runtime's variants when the case started
};


// Report (report.cpp).
std::string format_rate(double value);  // "1.23", or "-" when there is none
void print_header(const Bench& bench, const Options& options);
void print_table(const std::vector<CaseResult>& results);
void print_jit(const JitResults& jit, int compile_reps, int load_runs);
Json report_json(const Bench& bench, const Options& options, const std::vector<CaseResult>& results);
void print_error(const std::string& message);

// The child process of the cached-load figure (jit_figures.cpp).
int child_load(const std::string& dir, const std::string& variant);

}  // namespace astrai::bench
