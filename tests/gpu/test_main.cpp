// GPU suite entry point: exits 77 (CTest: skipped) when no GPU is usable, saying why, unless
// ASTRAI_REQUIRE_GPU=1 (a GPU runner: scripts/gpu/run_gpu_suite.sh sets it), where a missing GPU, and a
// filter that leaves no test case to run, fail the run instead.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <atomic>
#include <cstdio>

#include "runtime/driver_api.hpp"
#include "tests/gpu/gpu_support.hpp"

namespace {

std::atomic<int> test_cases_started{0};

// Counts the test cases that ran (doctest's own summary is not available to main).
struct CaseCounter : doctest::IReporter {
  explicit CaseCounter(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats&) override {}
  void test_case_start(const doctest::TestCaseData&) override { ++test_cases_started; }
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};
REGISTER_LISTENER("astrai_case_counter", 1, CaseCounter);

}  // namespace

int main(int argc, char** argv) {
  const bool required = astrai::testing::gpu_required();
  std::string why;
  if (!astrai::detail::driver_available(&why)) {
    if (required) {
      std::printf("FAILED: ASTRAI_REQUIRE_GPU=1 but no CUDA GPU is usable: %s\n", why.c_str());
      return 1;
    }
    std::printf("SKIPPED: GPU suite needs a CUDA GPU: %s\n", why.c_str());
    return 77;
  }
  // The data's seed first, so that a failing run can be repeated (ASTRAI_TEST_SEED=...).
  std::printf("ASTRAI_TEST_SEED=%u\n", astrai::testing::base_seed());
  // Like an application using the CUDA runtime: device 0's primary context is current.
  const auto& api = astrai::detail::driver();
  CUdevice device;
  CUcontext primary;
  astrai::detail::check_cu(api.cuDeviceGet(&device, 0), "cuDeviceGet", 0);
  astrai::detail::check_cu(api.cuDevicePrimaryCtxRetain(&primary, device), "cuDevicePrimaryCtxRetain", 0);
  astrai::detail::check_cu(api.cuCtxSetCurrent(primary), "cuCtxSetCurrent", 0);
  doctest::Context context(argc, argv);
  int result = context.run();
  if (context.shouldExit()) return result;
  astrai::gpu_test::print_worst();
  std::printf("test cases run: %d\n", test_cases_started.load());
  if (required && test_cases_started.load() == 0) {
    std::printf("FAILED: ASTRAI_REQUIRE_GPU=1 and the filter left no test case to run\n");
    result = result ? result : 1;
  }
  return result;
}
