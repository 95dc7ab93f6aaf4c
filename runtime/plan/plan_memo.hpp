// The last plan a launcher made on this thread, kept while calls repeat their problem on the
// same device: plans are pure functions of the two, so the hot path compares a few fields
// instead of planning. One per launcher (a thread_local of it), whatever its problem type.
#pragma once

#include "runtime/plan/attention_plan.hpp"

namespace astrai::detail {

template <typename Problem>
class PlanMemo {
 public:
  // The plan of `problem` on `device`: the memo's when both match, else make()'s, which is then
  // kept and logged (log_plan: once per distinct description).
  template <typename Make>
  const Plan& get(const void* device, const Problem& problem, Make&& make) {
    if (device_ == nullptr || device_ != device || !(problem_ == problem)) {
      plan_ = make();
      problem_ = problem;
      device_ = device;
      log_plan(plan_);
    }
    return plan_;
  }

 private:
  const void* device_ = nullptr;
  Problem problem_{};
  Plan plan_;
};

}  // namespace astrai::detail
