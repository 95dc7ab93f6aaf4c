// The Hopper (sm_90a) kernels compile with NVRTC on any machine: every one is built here, its
// PTX checked for the instructions its design rests on, and its log for the ptxas warnings
// that mean wgmma was serialized or setmaxnreg ignored (C75xx).
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include <fmt/format.h>

#include "astrai/error.hpp"
#include "kernel_src/hopper_params.h"
#include "runtime/kernel_sources.hpp"
#include "runtime/nvrtc_compiler.hpp"

using astrai::detail::CompileRequest;
using astrai::detail::CompileResult;
using astrai::detail::kernel_source_closure;
using astrai::detail::nvrtc_compile;

namespace {

CompileResult compile_sm90(const std::string& main_file, const std::vector<std::string>& names,
                           const std::string& arch = "sm_90a") {
  CompileRequest request;
  request.variant_name = main_file;
  request.main_file = main_file;
  const auto& closure = kernel_source_closure(main_file);
  request.headers.assign(closure.begin(), closure.end());
  request.name_expressions = names;
  request.options = {"--std=c++17", "--gpu-architecture=" + arch, "--device-as-default-execution-space"};
  return nvrtc_compile(request, true);
}

bool contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

// ptxas speaks of lost performance only when a wgmma pipeline was broken.
void check_log_clean(const CompileResult& result) {
  INFO("NVRTC log: " << result.log);
  CHECK_FALSE(contains(result.log, "C75"));
  CHECK_FALSE(contains(result.log, "Performance Loss"));
}

}  // namespace

TEST_SUITE("hopper") {
  TEST_CASE("the sm_90a GEMM uses TMA, mbarriers, wgmma and setmaxnreg, and ptxas keeps its pipeline") {
    const auto result = compile_sm90("hopper_gemm.cuh", {"astrai_gemm_bf16_sm90"});
    CHECK(contains(result.ptx, "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16"));
    CHECK(contains(result.ptx, "cp.async.bulk.tensor.2d"));
    CHECK(contains(result.ptx, "mbarrier.try_wait.parity"));
    CHECK(contains(result.ptx, "setmaxnreg.inc.sync.aligned.u32 232"));
    check_log_clean(result);
  }

  TEST_CASE("sm_90a prefill variants (contiguous and paged) compile to wgmma SS and RS over TMA loads, without serialization") {
    for (const char* type : {"bf16_t", "fp16_t"}) {
      for (const auto& [head_dim, page_size] :
           std::vector<std::pair<int, int>>{{64, 0}, {128, 0}, {192, 0}, {256, 0}, {128, 8}, {64, 16}, {256, 256}}) {
        const std::string name =
            fmt::format("astrai::prefill_sm90_kernel<astrai::{}, {}, {}, 4>", type, head_dim, page_size);
        CAPTURE(name);
        const auto result = compile_sm90("prefill_sm90.cuh", {name});
        const std::string types = std::string(type) == "bf16_t" ? "bf16.bf16" : "f16.f16";
        const int block_n = astrai::prefill_sm90_block_n(head_dim);
        CHECK(contains(result.ptx, fmt::format("wgmma.mma_async.sync.aligned.m64n{}k16.f32.{}", block_n, types)));
        CHECK(contains(result.ptx, fmt::format("wgmma.mma_async.sync.aligned.m64n{}k16.f32.{}", head_dim, types)));
        CHECK(contains(result.ptx, "cp.async.bulk.tensor.4d"));
        CHECK(contains(result.ptx, "setmaxnreg.dec.sync.aligned.u32 24"));
        check_log_clean(result);
      }
    }
  }

  TEST_CASE("plain sm_90 refuses the Hopper kernels: wgmma exists only on sm_90a") {
    CHECK_THROWS_AS(compile_sm90("hopper_gemm.cuh", {"astrai_gemm_bf16_sm90"}, "sm_90"), astrai::CompileError);
  }
}
