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
  return text;
}

std::vector<float> sink_values(int n_heads, unsigned seed) {
  std::mt19937 rng(seed ^ 0x5eedu);
  std::uniform_real_distribution<float> logit(-2.f, 7.f);
  std::vector<float> values(static_cast<std::size_t>(std::max(n_heads, 1)));
  for (auto& value : values) value = logit(rng);
  values[0] = -INFINITY;
  return values;
}

double soft_capped(double score, double logit_cap) {
  return logit_cap > 0 ? logit_cap * std::tanh(score / logit_cap) : score;
}

void synchronize() { check_cu(driver().cuCtxSynchronize(), "cuCtxSynchronize", -1); }

std::uint16_t float_to_bits(float value, DType dtype) {
  if (dtype == DType::bf16) {
    std::uint32_t bits;
    std::memcpy(&bits, &value, 4);
    if (std::isnan(value)) return 0x7fc0;
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return static_cast<std::uint16_t>(bits >> 16);
  }
  return testing::float_to_half_bits(value);
}

float bits_to_float(std::uint16_t bits, DType dtype) {
  if (dtype == DType::bf16) {
    const std::uint32_t wide = static_cast<std::uint32_t>(bits) << 16;
    float value;
    std::memcpy(&value, &wide, 4);
    return value;
  }
  return testing::half_bits_to_float(bits);
}

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

void accumulate(Comparison* c, double got, double want, double atol, double rtol,
                const std::string& where) {
  ++c->checked;
  const double error = std::fabs(got - want);
  const bool ok = std::isfinite(got) && error <= atol + rtol * std::fabs(want);
  if (!ok) {
    if (c->failures == 0)
      c->first_failure = fmt::format("{}: got {} want {} (|err| {:.3g})", where, got, want, error);
    ++c->failures;
  }
  if (!std::isfinite(got)) {
    c->max_abs_error = INFINITY;
    return;
  }
  c->max_abs_error = std::max(c->max_abs_error, error);
  c->max_rel_error = std::max(c->max_rel_error, error / std::max(std::fabs(want), 1e-3));
  c->sum_sq_error += error * error;
  c->sum_sq_reference += want * want;
}

void finish(Comparison* c) {
  c->norm_rel_error = c->sum_sq_reference > 0 ? std::sqrt(c->sum_sq_error / c->sum_sq_reference)
                                              : std::sqrt(c->sum_sq_error);
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
std::mutex worst_mutex;
std::map<std::string, Comparison> worst;
}  // namespace

void note_worst(const std::string& kernel, DType dtype, const Comparison& comparison) {
  std::lock_guard<std::mutex> lock(worst_mutex);
  auto& entry = worst[fmt::format("{} {}", kernel, dtype_name(dtype))];
  entry.checked += comparison.checked;
  entry.failures += comparison.failures;
  entry.max_abs_error = std::max(entry.max_abs_error, comparison.max_abs_error);
  entry.norm_rel_error = std::max(entry.norm_rel_error, comparison.norm_rel_error);
}

void print_worst() {
  std::lock_guard<std::mutex> lock(worst_mutex);
  std::printf("worst errors per kernel and dtype (%s path):\n",
              mma_forced_off() ? "CUDA-core, ASTRAI_JIT_NO_MMA" : "tensor-core");
  for (const auto& [name, c] : worst)
    std::printf("  %-20s elements %zu failures %zu max|err| %.3g max norm-rel %.3g\n", name.c_str(),
                c.checked, c.failures, c.max_abs_error, c.norm_rel_error);
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
