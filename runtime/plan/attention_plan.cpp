#include "runtime/plan/attention_plan.hpp"

#include <algorithm>
#include <tuple>

#include <fmt/format.h>

#include "astrai/error.hpp"
#include "base/logging.hpp"
#include "kernel_src/hopper_params.h"
#include "runtime/plan/implementations.hpp"

namespace astrai::detail {

namespace {

auto problem_fields(const AttentionProblem& p) {
  return std::tie(p.kind, p.dtype, p.head_dim, p.page_size, p.batch, p.n_heads, p.n_kv_heads, p.flags, p.masked,
                  p.span, p.caller_workspace, p.workspace_bytes, p.max_q_len, p.total_q, p.hopper_refused);
}

Plan plan_with(const AttentionProblem& problem, const DeviceTraits& device, const OccupancyQuery& occupancy,
               bool decode) {
  Plan plan;
  for (const Implementation* candidate : implementations()) {
    if (candidate->decode != decode) continue;
    const char* why = candidate->refuses(problem, device);
    if (why == nullptr) why = candidate->configure(problem, device, occupancy, &plan);
    if (why == nullptr) {
      plan.implementation = candidate;
      return plan;
    }
    // Start the next candidate from a clean plan that keeps the reasons so far.
    Plan next;
    next.passed_over_count = plan.passed_over_count;
    std::copy(plan.passed_over, plan.passed_over + plan.passed_over_count, next.passed_over);
    if (next.passed_over_count < 2) next.passed_over[next.passed_over_count++] = {candidate, why};
    plan = std::move(next);
  }
  // The portable implementations serve every checked problem.
  throw Error(fmt::format("astrai-jit: no implementation serves this {} call", kernel_kind_name(problem.kind)));
}

}  // namespace

bool AttentionProblem::operator==(const AttentionProblem& other) const {
  return problem_fields(*this) == problem_fields(other);
}

std::string Plan::describe() const {
  std::string text = fmt::format("{} ({}), grid {}x{}x{}, block {}, smem {}", spec.name(),
                                 implementation != nullptr ? implementation->name : "none", grid.x, grid.y, grid.z,
                                 block, smem);
  if (split_kv()) text += fmt::format(", {} splits of {} tokens", split.num_splits, split.tokens_per_split);
  if (persistent) text += ", persistent";
  for (int i = 0; i < passed_over_count; ++i)
    text += fmt::format("{} {}: {}", i == 0 ? "; passed over" : ",", passed_over[i].implementation->name,
                        passed_over[i].reason);
  return text;
}

Plan plan_decode(const AttentionProblem& problem, const DeviceTraits& device, const OccupancyQuery& occupancy) {
  return plan_with(problem, device, occupancy, true);
}

Plan plan_prefill(const AttentionProblem& problem, const DeviceTraits& device) {
  return plan_with(problem, device, nullptr, false);
}

Plan plan_attention(const AttentionProblem& problem, const DeviceTraits& device, const OccupancyQuery& occupancy) {
  if (!is_attention_kind(problem.kind))
    throw Error(fmt::format("astrai-jit: {} has one implementation and no attention plan",
                            kernel_kind_name(problem.kind)));
  return is_decode_kind(problem.kind) ? plan_decode(problem, device, occupancy) : plan_prefill(problem, device);
}

void log_plan(const Plan& plan) {
  // Only a plan that passed over an implementation the device could run is news at info level;
  // a portable plan on a GPU without Hopper kernels is not.
  const bool fell_back = plan.passed_over_count > 0 && plan.spec.arch == "sm_90a";
  const LogLevel level = fell_back ? LogLevel::info : LogLevel::debug;
  if (!Logger::instance().enabled(level)) return;
  const std::string text = plan.describe();
  log_once(level, "plan " + text, "plan: {}", text);
}

int modeled_resident_ctas(const DeviceTraits& device, int smem) {
  const int per_sm = std::clamp(kSm90SmemPerSm / std::max(smem + kSm90SmemReservedPerCta, 1), 1, 16);
  return per_sm * std::max(device.num_sms, 1);
}

}  // namespace astrai::detail
