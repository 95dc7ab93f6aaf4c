// An FP8 cache in the Hopper paged prefill, on any machine: every variant compiled with NVRTC
// and its PTX checked for what the design rests on (TMA bringing the cache's bytes, the producer
// warpgroup widening them in shared memory, wgmma on the widened tiles, no spills), and the
// tensor-map boxes against the bytes each barrier expects.
#include <doctest/doctest.h>

#include <algorithm>
#include <regex>
#include <string>

#include <fmt/format.h>

#include "kernel_src/hopper_params.h"
#include "runtime/compile_plan.hpp"
#include "runtime/families/prefill_launch.hpp"
#include "runtime/kernel_spec.hpp"
#include "tests/support/ptx.hpp"

using astrai::DType;
using astrai::testing::contains;
using astrai::detail::KernelKind;
using astrai::detail::KernelSpec;

namespace {

KernelSpec kv8_prefill(DType dtype, std::uint32_t flags, int page_size) {
  KernelSpec spec;
  spec.kind = KernelKind::paged_prefill;
  spec.dtype = dtype;
  spec.head_dim = 128;
  spec.page_size = page_size;
  spec.group_size = 4;
  spec.flags = flags;
  spec.arch = "sm_90a";
  spec.hopper = true;
  return spec;
}

}  // namespace

TEST_SUITE("hopper") {
  TEST_CASE("sm_90a paged prefill of an FP8 cache: TMA brings bytes, the producer widens them, wgmma reads them") {
    for (DType dtype : {DType::bf16, DType::fp16}) {
      for (std::uint32_t format : {astrai::kFeatureKvE4m3, astrai::kFeatureKvE5m2}) {
        for (const auto& [page_size, features] : {std::pair<int, std::uint32_t>{16, 0u}, {8, 0u}, {64, 0u},
                                                   {16, astrai::kFeatureSoftCap | astrai::kFeatureSink |
                                                            astrai::kFeatureWindow}}) {
          KernelSpec spec = kv8_prefill(dtype, format | features, page_size);
          CAPTURE(spec.name());
          REQUIRE(astrai::detail::hopper_serves(spec));
          astrai::detail::CompileRequest request = astrai::detail::compile_request(spec);
          request.options.push_back("--ptxas-options=-v");
          const auto result = astrai::detail::nvrtc_compile(request, true);
          INFO("NVRTC log: " << result.log);
          // S over 128-token blocks and P V over the head dim, in f16 whatever the output type.
          CHECK(contains(result.ptx, "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16"));
          CHECK_FALSE(contains(result.ptx, "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16"));
          // K and V alike in 4-D boxes of whole rows of bytes (no 5-D box of 16-bit V rows).
          CHECK(contains(result.ptx, "cp.async.bulk.tensor.4d"));
          CHECK_FALSE(contains(result.ptx, "cp.async.bulk.tensor.5d"));
          // The widening reads and writes the shared window (generic pointers compiled to LD.E /
          // ST.E), then hands the tiles to the async proxy.
          CHECK(contains(result.ptx, "ld.shared.v2.b32"));
          CHECK(contains(result.ptx, "st.shared.v4.b32"));
          CHECK(contains(result.ptx, "fence.proxy.async.shared::cta"));
          // The cache widens to f16 by cvt (e4m3) or a byte move (e5m2); P goes to f16 as well.
          // (A bf16 Q tile is made f16 in place, rows scaled into range: the GPU suite's
          // queries past f16's range check it.)
          const bool e5m2 = format == astrai::kFeatureKvE5m2;
          CHECK(contains(result.ptx, "cvt.rn.f16x2.e4m3x2") == !e5m2);
          CHECK(contains(result.ptx, "cvt.rn.f16.f32"));
          // The producer warpgroup keeps registers for the widening.
          CHECK(contains(result.ptx, fmt::format("setmaxnreg.dec.sync.aligned.u32 {}",
                                                 astrai::prefill_sm90_producer_regs(2, false, true))));
          CHECK(contains(result.ptx, fmt::format("setmaxnreg.inc.sync.aligned.u32 {}",
                                                 astrai::prefill_sm90_consumer_regs(2, true))));
          CHECK(contains(result.ptx, ".maxntid 384"));
          const std::regex spills(R"((\d+) bytes spill stores)");
          std::smatch match;
          REQUIRE(std::regex_search(result.log, match, spills));
          CHECK(std::stoi(match[1].str()) <= (features == 0 ? 0 : 32));
          CHECK_FALSE(contains(result.log, "C75"));
        }
      }
    }
  }

  TEST_CASE("an FP8 cache's tensor-map boxes bring exactly the bytes of a byte-ring stage, and fit the SM") {
    for (int page_size : {8, 16, 32, 256}) {
      CAPTURE(page_size);
      astrai::PrefillParams p{};
      p.batch = 2;
      p.n_heads = 32;
      p.n_kv_heads = 8;
      p.total_q = 300;
      p.num_pages = 77;
      p.q_stride_seq = 32 * 128;
      p.q_stride_head = 128;
      p.k_stride_head = p.v_stride_head = 128 + 16;  // padded heads
      p.k_stride_seq = p.v_stride_seq = 8 * (128 + 16);
      p.k_stride_page = p.v_stride_page = page_size * 8 * (128 + 16);
      const int block_n = astrai::prefill_sm90_block_n(128, 2, true);
      const auto maps = astrai::detail::prefill_map_shapes(p, 128, page_size, 2, block_n, true);
      for (const astrai::detail::TensorMapShape* map : {&maps.k, &maps.v}) {
        CHECK(map->element_bytes == 1);
        REQUIRE(map->box.size() == 4);
        CHECK(map->box[0] == 128u);  // one 128-byte swizzle row a token
        const int rows = static_cast<int>(map->box[2]);
        CHECK(rows == std::min(page_size, 16));
        CHECK(map->box[1] == 1u);
        CHECK(map->box[3] == 1u);
        // The producer issues a box per lane (kBoxes of them, at most a warp's), and the byte
        // stage's full barrier expects kKv8Bytes = kBlockN x head_dim bytes.
        const int boxes = block_n / rows;
        CHECK(boxes <= 32);
        CHECK(1LL * boxes * map->box[0] * map->box[1] * map->box[2] * map->box[3] * map->element_bytes ==
              1LL * block_n * 128);
        CHECK(astrai::detail::tensor_map_problem(*map).empty());
      }
    }
    CHECK(astrai::prefill_sm90_smem_bytes(128, 2, 128, false, astrai::kFeatureKvE4m3) <= 227 * 1024);
    CHECK(astrai::prefill_sm90_smem_bytes(128, 2, 128, false, astrai::kFeatureKvE4m3) >
          astrai::prefill_sm90_smem_bytes(128, 2, 128, false) + 4 * 128 * 128 - 1);
  }
}
