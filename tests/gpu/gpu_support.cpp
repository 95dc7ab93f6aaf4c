#include "tests/gpu/gpu_support.hpp"

#include <doctest/doctest.h>

#include "tests/support/half.hpp"

#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>

#include <fmt/format.h>

#include "runtime/env_config.hpp"

namespace astrai::gpu_test {

using detail::check_cu;
using detail::driver;

std::string CaseFeatures::text() const {
  std::string text;
  if (logit_cap > 0) text += fmt::format(" cap={}", logit_cap);
  if (sinks) text += " sinks";
  if (window_left >= 0) text += fmt::format(" window_left={}", window_left);
  if (alibi) text += " alibi";
  return text;
}

std::vector<float> alibi_values(int n_heads) {
  std::vector<float> values(static_cast<std::size_t>(std::max(n_heads, 1)));
  for (int h = 0; h < n_heads; ++h) values[h] = std::exp2(-8.f * (h + 1) / n_heads);
  return values;
}

std::vector<float> sink_values(int n_heads, unsigned seed) {
  std::mt19937 rng(seed ^ 0x5eedu);
  std::uniform_real_distribution<float> logit(-2.f, 7.f);
  std::vector<float> values(static_cast<std::size_t>(std::max(n_heads, 1)));
  for (auto& value : values) value = logit(rng);
  values[0] = -INFINITY;
  return values;
}

void synchronize() { check_cu(driver().cuCtxSynchronize(), "cuCtxSynchronize", -1); }

std::vector<std::uint16_t> random_elements(std::size_t count, DType dtype, std::mt19937& rng) {
  std::uniform_real_distribution<float> uniform(-1.f, 1.f);
  std::vector<std::uint16_t> values(count);
  for (auto& value : values) value = float_to_bits(uniform(rng), dtype);
  return values;
}

std::vector<float> random_rotations(std::size_t pairs, std::mt19937& rng) {
  std::uniform_real_distribution<double> angle(-100.0, 100.0);
  std::vector<float> table(2 * pairs);
  for (std::size_t i = 0; i < pairs; ++i) {
    const double a = angle(rng);
    table[2 * i] = static_cast<float>(std::cos(a));
    table[2 * i + 1] = static_cast<float>(std::sin(a));
  }
  return table;
}

void scale_elements(std::uint16_t* at, std::int64_t count, float gain, DType dtype) {
  for (std::int64_t i = 0; i < count; ++i) at[i] = float_to_bits(bits_to_float(at[i], dtype) * gain, dtype);
}

void check_graph_replay(const std::function<void(CUstream)>& call, DeviceBuffer* out,
                        const std::vector<std::uint16_t>& eager_out, int replays, const std::string& description) {
  const auto& api = driver();
  CUstream stream;
  check_cu(api.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate", -1);
  call(stream);
  check_cu(api.cuStreamSynchronize(stream), "cuStreamSynchronize", -1);
  out->fill_byte(0xff);
  CUgraph graph;
  CUgraphExec exec;
  check_cu(api.cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "cuStreamBeginCapture", -1);
  call(stream);
  check_cu(api.cuStreamEndCapture(stream, &graph), "cuStreamEndCapture", -1);
  check_cu(api.cuGraphInstantiate(&exec, graph, 0), "cuGraphInstantiate", -1);
  for (int replay = 0; replay < replays; ++replay) {
    out->fill_byte(0xff);
    check_cu(api.cuGraphLaunch(exec, stream), "cuGraphLaunch", -1);
    check_cu(api.cuStreamSynchronize(stream), "cuStreamSynchronize", -1);
    const auto replayed = out->to_host<std::uint16_t>(eager_out.size());
    CHECK_MESSAGE(replayed == eager_out, "graph replay differs from the eager call: " << description);
  }
  api.cuGraphExecDestroy(exec);
  api.cuGraphDestroy(graph);
  api.cuStreamDestroy(stream);
}

namespace {
struct Worst {
  std::size_t cases = 0, rows = 0, failures = 0;
  double row = 0, elem = 0, lse = 0, row_bound = 0;
};
std::mutex worst_mutex;
std::map<std::string, Worst> worst;
std::vector<std::string> not_run_list;
std::size_t case_count = 0;
}  // namespace

void report_case(const std::string& kernel, DType dtype, const std::string& description, const RowCheck& check) {
  {
    std::lock_guard<std::mutex> lock(worst_mutex);
    ++case_count;
    auto& entry = worst[fmt::format("{} {}", kernel, dtype_name(dtype))];
    ++entry.cases;
    entry.rows += check.rows();
    entry.failures += check.failures();
    entry.row = std::max(entry.row, check.worst_row());
    entry.elem = std::max(entry.elem, check.worst_elem());
    entry.lse = std::max(entry.lse, check.worst_lse());
    entry.row_bound = check.tolerance().row;
  }
  INFO(description);
  MESSAGE(fmt::format("{} -> {}", description, check.summary()));
  CHECK_MESSAGE(check.passed(), check.first_failure());
}

void not_run(const std::string& what) {
  MESSAGE("NOT RUN: " << what);
  std::lock_guard<std::mutex> lock(worst_mutex);
  not_run_list.push_back(what);
}

void print_worst() {
  std::lock_guard<std::mutex> lock(worst_mutex);
  std::printf("worst errors per kernel and dtype (%s path; row: relative norm of a row, elem: share of the "
              "element bound, lse: |err|):\n", mma_forced_off() ? "CUDA-core, ASTRAI_JIT_NO_MMA" : "tensor-core");
  for (const auto& [name, w] : worst)
    std::printf("  %-24s cases %zu rows %zu failures %zu row %.2e (bound %.1e) elem %.2f lse %.2e\n", name.c_str(),
                w.cases, w.rows, w.failures, w.row, w.row_bound, w.elem, w.lse);
  for (const auto& what : not_run_list) std::printf("NOT RUN: %s\n", what.c_str());
  std::printf("cases run: %zu (ASTRAI_TEST_SEED=%u)\n", case_count, testing::base_seed());
}

int sweep_count(int fallback) {
  const char* value = std::getenv("ASTRAI_TEST_SWEEP");
  if (!value || !*value) return fallback;
  return std::max(0, std::atoi(value));
}

namespace {

bool env_flag(const char* name) {
  const char* value = std::getenv(name);
  return value && (std::string(value) == "1" || std::string(value) == "true");
}

}  // namespace

bool mma_forced_off() { return env_flag("ASTRAI_JIT_NO_MMA"); }
bool wgmma_forced_off() { return env_flag("ASTRAI_JIT_NO_WGMMA"); }
bool wide_tiles_forced() {
  return astrai::detail::load_env_config_from_process().prefill_tiles == astrai::detail::TileChoice::wide;
}

int device_compute_capability() {
  CUdevice device = 0;
  check_cu(driver().cuDeviceGet(&device, 0), "cuDeviceGet", 0);
  int major = 0, minor = 0;
  check_cu(driver().cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device),
           "cuDeviceGetAttribute", 0);
  check_cu(driver().cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device),
           "cuDeviceGetAttribute", 0);
  return major * 10 + minor;
}

bool sm90a_target() {
  if (device_compute_capability() != 90) return false;
  const char* value = std::getenv("ASTRAI_JIT_ARCH");
  if (!value || !*value) return true;
  return detail::normalize_arch(value) == std::optional<std::string>("sm_90a");
}

int loaded_variants_named(const std::string& part) {
  int found = 0;
  for (const auto& name : Runtime::get().loaded_variants()) found += name.find(part) != std::string::npos;
  return found;
}

}  // namespace astrai::gpu_test
