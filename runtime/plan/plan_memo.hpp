// The last plan a launcher made on this thread, for one device and problem: a plan is a pure
// function of the two, so the hot path compares a few fields instead of planning.
#pragma once

#include "runtime/plan/attention_plan.hpp"

namespace astrai::detail {

struct PlanMemo {
  const void* device = nullptr;
  AttentionProblem problem;
  Plan plan;

  // The memo's plan when `asked` on `device_key` is what it holds, else planner(asked), kept
  // (and logged once, log_plan).
  template <typename Planner>
  const Plan& get(const void* device_key, const AttentionProblem& asked, Planner&& planner) {
    if (device != device_key || problem != asked) {
      plan = planner(asked);
      problem = asked;
      device = device_key;
      log_plan(plan);
    }
    return plan;
  }
};

}  // namespace astrai::detail
