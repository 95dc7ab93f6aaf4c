// The Hopper (sm_90a) path on any machine: its variants' names and limits, every variant built
// with NVRTC through the compile plan and its PTX checked for the instructions the design rests
// on (and its log for the ptxas warnings that mean wgmma was serialized or setmaxnreg ignored),
// and the tensor-map rules that send a call to the portable kernel.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <regex>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "astrai/error.hpp"
#include "bench_kernels.hpp"
#include "kernel_src/hopper_params.h"
#include "runtime/compile_plan.hpp"
#include "runtime/families/prefill_launch.hpp"
#include "runtime/kernel_sources.hpp"
#include "runtime/kernel_spec.hpp"
#include "runtime/tensor_map.hpp"
#include "tests/support/cache_support.hpp"
#include "tests/support/ptx.hpp"

using astrai::DType;
using astrai::testing::contains;
using astrai::detail::CompileRequest;
using astrai::detail::CompileResult;
using astrai::detail::KernelKind;
using astrai::detail::KernelSpec;
using astrai::detail::TensorMapShape;

namespace {

KernelSpec hopper_prefill(KernelKind kind, DType dtype, int head_dim, int page_size, int group) {
  KernelSpec spec;
  spec.kind = kind;
  spec.dtype = dtype;
  spec.head_dim = head_dim;
  spec.page_size = page_size;
  spec.group_size = group;
  spec.arch = "sm_90a";
  spec.hopper = true;
  return spec;
}

// ptxas speaks of lost performance only when a wgmma pipeline was broken.
void check_log_clean(const CompileResult& result) {
  INFO("NVRTC log: " << result.log);
  CHECK_FALSE(contains(result.log, "C75"));
  CHECK_FALSE(contains(result.log, "Performance Loss"));
}

// Bytes of spill stores in a log compiled with `--ptxas-options=-v`; -1 when it has no such line.
int spill_store_bytes(const std::string& log) {
  const std::regex line(R"((\d+) bytes spill stores)");
  std::smatch match;
  return std::regex_search(log, match, line) ? std::stoi(match[1].str()) : -1;
}

// Registers a thread of the kernel uses, from a log compiled with `--ptxas-options=-v`; -1 when
// it has no such line.
int registers_used(const std::string& log) {
  const std::regex line(R"(Used (\d+) registers)");
  std::smatch match;
  return std::regex_search(log, match, line) ? std::stoi(match[1].str()) : -1;
}

// A variant compiled with ptxas's report (registers, spills) in its log.
CompileResult compile_reporting(const KernelSpec& spec) {
  CompileRequest request = astrai::detail::compile_request(spec);
  request.options.push_back("--ptxas-options=-v");
  return astrai::detail::nvrtc_compile(request, false);
}

// The benchmark's GEMM is no family variant and no part of the library: the bench embeds it
// (bench/kernels/) and builds its request with the library headers it includes.
CompileResult compile_gemm(const std::string& arch) {
  CompileRequest request = astrai::bench::bench_compile_request("hopper_gemm.cuh", arch, {"astrai_gemm_bf16_sm90"});
  return astrai::detail::nvrtc_compile(request, true);
}

TensorMapShape good_shape(const void* base) {
  // q of [2, 100, 8, 128]: {d, q_len, heads, batch}.
  return {base, {128, 100, 8, 2}, {8 * 128, 128, 100 * 8 * 128}, {64, 128, 1, 1}};
}

}  // namespace

TEST_SUITE("hopper") {
  TEST_CASE("wgmma variants are named by their path and parse back") {
    const KernelSpec prefill = hopper_prefill(KernelKind::prefill, DType::bf16, 128, 0, 4);
    CHECK(prefill.name() == "prefill.bf16.hd128.g4.wgmma.sm_90a");
    const KernelSpec paged = hopper_prefill(KernelKind::paged_prefill, DType::fp16, 64, 16, 1);
    CHECK(paged.name() == "paged_prefill.fp16.hd64.ps16.g1.wgmma.sm_90a");
    for (const KernelSpec& spec : {prefill, paged}) {
      const KernelSpec parsed = KernelSpec::parse(spec.name());
      CHECK(parsed.hopper);
      CHECK(parsed == spec);
      CHECK(parsed.main_file() == "prefill_sm90.cuh");
    }
    KernelSpec portable = prefill;
    portable.hopper = false;
    CHECK(portable.main_file() == "prefill.cuh");
    CHECK(astrai::detail::compile_request(prefill).main_file != astrai::detail::compile_request(portable).main_file);
  }

  TEST_CASE("the wide prefill tiling is named, parsed and instantiated") {
    KernelSpec wide = hopper_prefill(KernelKind::paged_prefill, DType::bf16, 128, 16, 4);
    wide.wide = true;
    CHECK(wide.name() == "paged_prefill.bf16.hd128.ps16.g4.wgmma.wide.sm_90a");
    const KernelSpec parsed = KernelSpec::parse(wide.name());
    CHECK(parsed.wide);
    CHECK(parsed == wide);
    KernelSpec narrow = wide;
    narrow.wide = false;
    CHECK_FALSE(narrow == wide);
    // Three consumer warpgroups in 80-token blocks, against the default's two in 192.
    CHECK(wide.instantiations().front() == "astrai::prefill_sm90_kernel<astrai::bf16_t, 128, 16, 4, 3, 80, 0>");
    CHECK(narrow.instantiations().front() == "astrai::prefill_sm90_kernel<astrai::bf16_t, 128, 16, 4, 2, 192, 0>");
  }

  TEST_CASE("contiguous prefill on three consumers without features instantiates the persistent form") {
    KernelSpec hd64 = hopper_prefill(KernelKind::prefill, DType::bf16, 64, 0, 6);
    CHECK(hd64.instantiations().front() == "astrai::prefill_sm90_kernel<astrai::bf16_t, 64, 0, 6, 3, 128, 0, true>");
    KernelSpec wide = hopper_prefill(KernelKind::prefill, DType::bf16, 128, 0, 4);
    wide.wide = true;
    CHECK(wide.instantiations().front() == "astrai::prefill_sm90_kernel<astrai::bf16_t, 128, 0, 4, 3, 80, 0, true>");
    // Two consumers (no room for a second Q slot), paged KV and features keep a CTA a tile.
    KernelSpec narrow = wide;
    narrow.wide = false;
    CHECK(narrow.instantiations().front() == "astrai::prefill_sm90_kernel<astrai::bf16_t, 128, 0, 4, 2, 192, 0>");
    CHECK(hopper_prefill(KernelKind::paged_prefill, DType::bf16, 64, 16, 6).instantiations().front() ==
          "astrai::prefill_sm90_kernel<astrai::bf16_t, 64, 16, 6, 3, 128, 0>");
    KernelSpec capped = hd64;
    capped.flags = astrai::kFeatureSoftCap;
    CHECK(capped.instantiations().front() ==
          fmt::format("astrai::prefill_sm90_kernel<astrai::bf16_t, 64, 0, 6, 3, 128, {}>", astrai::kFeatureSoftCap));
    // Both Q slots and the rings fit the SM's 227 KB at the two tilings of three consumers.
    CHECK(astrai::prefill_sm90_smem_bytes(64, 3, 128, true) <= 227 * 1024);
    CHECK(astrai::prefill_sm90_smem_bytes(128, 3, 80, true) <= 227 * 1024);
  }

  TEST_CASE("a wgmma variant outside what the Hopper kernels serve is refused by name") {
    auto refused = [](const std::string& name, const std::string& why) {
      CAPTURE(name);
      CHECK_THROWS_WITH_AS(KernelSpec::parse(name), doctest::Contains(why.c_str()), astrai::InvalidArgument);
    };
    refused("prefill.bf16.hd128.g4.wgmma.sm_89", "wgmma variants exist only for sm_90a, not 'sm_89'");
    refused("prefill.bf16.hd128.g4.wgmma.sm_90", "only for sm_90a");
    refused("prefill.bf16.hd96.g4.wgmma.sm_90a", "does not serve head_dim 96");
    refused("paged_prefill.bf16.hd128.ps4.g4.wgmma.sm_90a", "does not serve head_dim 128 with page_size 4");
    refused("prefill.bf16.hd128.g4.nomma.wgmma.sm_90a", "no .nomma");
    // Each family's Hopper field is its own: decode is built on TMA, prefill on wgmma.
    refused("paged_decode.bf16.hd128.ps16.g4.wgmma.sm_90a", "unexpected field 'wgmma'");
    refused("prefill.bf16.hd128.g4.tma.sm_90a", "unexpected field 'tma'");
    refused("rotary_emb.bf16.hd128.tma.sm_90a", "unexpected field 'tma'");
    refused("paged_decode.bf16.hd128.ps16.g4.tma.sm_89", "tma variants exist only for sm_90a, not 'sm_89'");
    refused("paged_decode.bf16.hd96.ps16.g4.tma.sm_90a", "does not serve head_dim 96");
    refused("paged_decode.bf16.hd128.ps8.g4.tma.sm_90a", "does not serve head_dim 128 with page_size 8");
    // FP8 caches: rows of whole 128-byte chunks (head dims 128 and 256) or one of 64 bytes (64).
    refused("decode.bf16.hd192.g4.kv_e5m2.tma.sm_90a", "an FP8 KV cache is served at head_dim 64, 128 or 256 only");
    refused("paged_decode.bf16.hd192.ps16.g4.kv_e4m3.tma.sm_90a", "at head_dim 64, 128 or 256 only");
    // The wgmma paged prefill widens rows of 128 bytes, in one tiling; so does the decode.
    refused("paged_prefill.bf16.hd256.ps16.g4.kv_e5m2.wgmma.sm_90a", "an FP8 KV cache is served at head_dim 128 only");
    refused("paged_prefill.bf16.hd128.ps16.g4.kv_e4m3.wgmma.wide.sm_90a", "no wide tiling at head_dim 128 with an FP8");
    // The decode's wide CTAs are hd64's, an FP8 cache's too (its ring fits the 16-bit region).
    refused("paged_decode.bf16.hd128.ps16.g4.kv_e4m3.tma.wide.sm_90a", "paged_decode has no wide tiling at head_dim 128");
    for (const char* name : {"paged_decode.bf16.hd64.ps16.g6.kv_e4m3.tma.wide.sm_90a",
                             "decode.fp16.hd64.g6.kv_e5m2.tma.wide.sm_90a"})
      CHECK(KernelSpec::parse(name).name() == name);
    refused("prefill.bf16.hd128.g4.kv_e4m3.wgmma.sm_90a", "prefill does not support the feature kv_e4m3");
    // The wide tiling: hd128 prefill only, named after the path.
    refused("prefill.bf16.hd64.g4.wgmma.wide.sm_90a", "prefill has no wide tiling at head_dim 64");
    refused("prefill.bf16.hd256.g4.wgmma.wide.sm_90a", "no wide tiling at head_dim 256");
    refused("prefill.bf16.hd128.g4.wide.sm_90a", ".wide names a tiling of the sm_90a implementation only");
    refused("paged_decode.bf16.hd128.ps16.g4.tma.wide.sm_90a", "paged_decode has no wide tiling");
    refused("prefill.bf16.hd128.g4.wide.wgmma.sm_90a", "unexpected field 'wgmma'");
  }

  TEST_CASE("tma decode variants are named by their path and parse back") {
    KernelSpec paged = hopper_prefill(KernelKind::paged_decode, DType::bf16, 128, 16, 4);
    paged.flags = astrai::kFeatureSoftCap | astrai::kFeatureWindow | astrai::decode_q_len_flags(4);
    CHECK(paged.name() == "paged_decode.bf16.hd128.ps16.g4.swa.cap.q4.tma.sm_90a");
    const KernelSpec contiguous = hopper_prefill(KernelKind::decode, DType::fp16, 64, 0, 6);
    CHECK(contiguous.name() == "decode.fp16.hd64.g6.tma.sm_90a");
    for (const KernelSpec& spec : {paged, contiguous}) {
      const KernelSpec parsed = KernelSpec::parse(spec.name());
      CHECK(parsed.hopper);
      CHECK(parsed == spec);
      CHECK(parsed.main_file() == "paged_decode_sm90.cuh");
      CHECK(parsed.instantiations().size() == 2);  // the kernel and its split combine
    }
  }

  TEST_CASE("warm pairs a portable sm_90a spec with its Hopper variant exactly where one serves it") {
    KernelSpec spec = hopper_prefill(KernelKind::prefill, DType::bf16, 128, 0, 4);
    spec.hopper = false;
    CHECK(astrai::detail::hopper_serves(spec));
    spec.head_dim = 80;
    CHECK_FALSE(astrai::detail::hopper_serves(spec));
    spec.head_dim = 256;
    spec.arch = "sm_89";
    CHECK_FALSE(astrai::detail::hopper_serves(spec));
    spec.arch = "sm_90a";
    spec.force_no_mma = true;
    CHECK_FALSE(astrai::detail::hopper_serves(spec));
    KernelSpec paged = hopper_prefill(KernelKind::paged_prefill, DType::bf16, 64, 8, 1);
    paged.hopper = false;
    CHECK(astrai::detail::hopper_serves(paged));
    paged.page_size = 1;
    CHECK_FALSE(astrai::detail::hopper_serves(paged));
    KernelSpec decode = paged;
    decode.kind = KernelKind::paged_decode;
    decode.page_size = 16;
    CHECK(astrai::detail::hopper_serves(decode));
    decode.page_size = 8;  // a box per page would leave more than 32 boxes a block at hd256
    CHECK_FALSE(astrai::detail::hopper_serves(decode));
    decode.page_size = 256;
    decode.flags = astrai::kFeatureKvE4m3;  // an FP8 cache's rows of 64 bytes: one 64-byte chunk
    CHECK(astrai::detail::hopper_serves(decode));
    decode.head_dim = 128;  // whole 128-byte chunks
    CHECK(astrai::detail::hopper_serves(decode));
    decode.head_dim = 192;  // a chunk and a half: the direct path
    CHECK_FALSE(astrai::detail::hopper_serves(decode));
    decode.head_dim = 64;
    decode.flags = astrai::kFeatureSink | astrai::decode_q_len_flags(8);
    CHECK(astrai::detail::hopper_serves(decode));
    decode.head_dim = 96;
    CHECK_FALSE(astrai::detail::hopper_serves(decode));
    KernelSpec contiguous = decode;
    contiguous.kind = KernelKind::decode;
    contiguous.page_size = 0;
    contiguous.flags = 0;
    contiguous.head_dim = 192;
    CHECK(astrai::detail::hopper_serves(contiguous));
  }

  TEST_CASE("sm_90a decode variants stream K and V through TMA into an mbarrier ring and keep mma.sync") {
    const KernelSpec portable = [] {
      KernelSpec spec = hopper_prefill(KernelKind::paged_decode, DType::bf16, 128, 16, 4);
      spec.hopper = false;
      return spec;
    }();
    const auto portable_result = astrai::detail::nvrtc_compile(astrai::detail::compile_request(portable), true);
    CHECK(contains(portable_result.ptx, "cp.async.cg.shared.global"));
    CHECK_FALSE(contains(portable_result.ptx, "cp.async.bulk.tensor"));
    for (DType dtype : {DType::bf16, DType::fp16}) {
      for (const auto& [kind, head_dim, page_size, group, flags] :
           std::vector<std::tuple<KernelKind, int, int, int, std::uint32_t>>{
               {KernelKind::paged_decode, 128, 16, 4, 0},
               {KernelKind::paged_decode, 64, 16, 6, 0},
               {KernelKind::paged_decode, 256, 16, 8, 0},   // 32 boxes a block
               {KernelKind::paged_decode, 192, 32, 1, 0},
               {KernelKind::paged_decode, 128, 256, 32, 0},  // two head tiles
               {KernelKind::paged_decode, 128, 16, 4,
                astrai::kFeatureSoftCap | astrai::kFeatureSink | astrai::kFeatureWindow},
               {KernelKind::paged_decode, 64, 64, 4, astrai::decode_q_len_flags(4)},
               {KernelKind::decode, 128, 0, 4, 0},
               {KernelKind::decode, 256, 0, 2, astrai::kFeatureWindow}}) {
        KernelSpec spec = hopper_prefill(kind, dtype, head_dim, page_size, group);
        spec.flags = flags;
        CAPTURE(spec.name());
        REQUIRE(astrai::detail::hopper_serves(spec));
        const auto result = astrai::detail::nvrtc_compile(astrai::detail::compile_request(spec), true);
        // K and V are read once: their copies leave L2 first.
        CHECK(contains(result.ptx, "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                                   ".L2::cache_hint"));
        CHECK(contains(result.ptx, "createpolicy.fractional.L2::evict_first.b64"));
        CHECK(contains(result.ptx, "mbarrier.try_wait.parity.shared::cta.b64"));
        CHECK(contains(result.ptx, "mbarrier.arrive.expect_tx.shared::cta.b64"));
        CHECK(contains(result.ptx, fmt::format("mma.sync.aligned.m16n8k16.row.col.f32.{}", dtype == DType::bf16
                                                                                           ? "bf16.bf16"
                                                                                           : "f16.f16")));
        CHECK(contains(result.ptx, "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16"));
        CHECK_FALSE(contains(result.ptx, "cp.async.cg.shared.global"));  // no cp.async loader left
        CHECK(contains(result.ptx, "griddepcontrol.launch_dependents"));
        // Launched early (programmatic dependent launch): no global access before the wait.
        CHECK(astrai::testing::global_access_before_grid_wait(result.ptx) == "");
        INFO("NVRTC log: " << result.log);
        CHECK_FALSE(contains(result.log, "warning"));
      }
    }
  }

  TEST_CASE("sm_90a decode variants of an FP8 cache bring its bytes by TMA and widen them into f16 MMAs") {
    for (DType dtype : {DType::bf16, DType::fp16}) {
      for (const auto& [kind, head_dim, page_size, flags] :
           std::vector<std::tuple<KernelKind, int, int, std::uint32_t>>{
               {KernelKind::paged_decode, 128, 16, astrai::kFeatureKvE4m3},
               {KernelKind::paged_decode, 256, 16, astrai::kFeatureKvE4m3},  // 16 boxes a block
               {KernelKind::paged_decode, 128, 64, astrai::kFeatureKvE5m2 | astrai::decode_q_len_flags(4)},
               {KernelKind::paged_decode, 128, 32,
                astrai::kFeatureKvE4m3 | astrai::kFeatureSoftCap | astrai::kFeatureSink | astrai::kFeatureWindow},
               {KernelKind::decode, 128, 0, astrai::kFeatureKvE4m3 | astrai::kFeatureAlibi},
               {KernelKind::decode, 256, 0, astrai::kFeatureKvE5m2},
               // hd64: rows of 64 bytes (64-byte swizzle); AstrAI's 24/4 heads take group 6.
               {KernelKind::paged_decode, 64, 16, astrai::kFeatureKvE4m3},
               {KernelKind::paged_decode, 64, 64, astrai::kFeatureKvE5m2 | astrai::decode_q_len_flags(4)},
               {KernelKind::decode, 64, 0, astrai::kFeatureKvE4m3 | astrai::kFeatureSoftCap | astrai::kFeatureSink}}) {
        KernelSpec spec = hopper_prefill(kind, dtype, head_dim, page_size, head_dim == 64 ? 6 : 4);
        spec.flags = flags;
        CAPTURE(spec.name());
        REQUIRE(astrai::detail::hopper_serves(spec));
        CHECK(spec.name().find(".tma.sm_90a") != std::string::npos);
        const auto result = astrai::detail::nvrtc_compile(astrai::detail::compile_request(spec), true);
        const auto report = compile_reporting(spec);
        INFO("NVRTC log: " << report.log);
        CHECK(contains(result.ptx, "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                                   ".L2::cache_hint"));
        CHECK_FALSE(contains(result.ptx, "cp.async.cg.shared.global"));
        // The MMAs run in f16 on widened bytes (e4m3 by cvt; an e5m2 byte is an f16's high byte).
        CHECK(contains(result.ptx, "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"));
        if ((flags & astrai::kFeatureKvE4m3) != 0) CHECK(contains(result.ptx, "cvt.rn.f16x2.e4m3x2"));
        CHECK_FALSE(contains(result.ptx, "ldmatrix.sync.aligned.m8n8.x4.trans"));  // V read as bytes
        CHECK(astrai::testing::global_access_before_grid_wait(result.ptx) == "");
        CHECK_FALSE(contains(result.ptx, ".local"));
        // The kernel's own report: no spill, and registers that leave shared memory to set the
        // CTAs an SM runs.
        const std::size_t entry = report.log.find("Compiling entry function '_ZN6astrai24paged_decode_sm90_kernel");
        REQUIRE(entry != std::string::npos);
        const std::string kernel_report = report.log.substr(entry, report.log.find("Compile time", entry) - entry);
        CHECK(contains(kernel_report, "0 bytes spill stores"));
        const int registers = registers_used(kernel_report);
        REQUIRE(registers > 0);
        CHECK((registers + 7) / 8 * 8 <=
              65536 / (astrai::decode_sm90_ctas_per_sm(head_dim, true) * astrai::kDecodeThreads));
        CHECK_FALSE(contains(result.log, "warning"));
      }
    }
  }

  TEST_CASE("wide sm_90a decode variants: named, hd64 only, four split groups of 128 threads on named barriers") {
    KernelSpec paged = hopper_prefill(KernelKind::paged_decode, DType::bf16, 64, 16, 6);
    paged.wide = true;
    CHECK(paged.name() == "paged_decode.bf16.hd64.ps16.g6.tma.wide.sm_90a");
    CHECK(KernelSpec::parse(paged.name()) == paged);
    CHECK(paged.warm_command() ==
          "ASTRAI_JIT_DECODE_TILES=wide astrai-jit warm --arch sm_90a --kernels paged_decode --dtypes bf16 "
          "--head-dims 64 --page-sizes 16 --group-sizes 6 --hopper");
    CHECK_THROWS_WITH_AS(KernelSpec::parse("paged_decode.bf16.hd128.ps16.g4.tma.wide.sm_90a"),
                         doctest::Contains("no wide tiling at head_dim 128"), astrai::InvalidArgument);
    KernelSpec contiguous = hopper_prefill(KernelKind::decode, DType::fp16, 64, 0, 4);
    contiguous.wide = true;
    // An FP8 cache's groups too: their rings of bytes fit the 16-bit region.
    for (const std::uint32_t flags :
         {0u, astrai::kFeatureSoftCap | astrai::kFeatureSink | astrai::kFeatureWindow, astrai::decode_q_len_flags(4),
          std::uint32_t{astrai::kFeatureKvE4m3}, astrai::kFeatureKvE5m2 | astrai::kFeatureSink | astrai::decode_q_len_flags(2)}) {
      for (KernelSpec spec : {paged, contiguous}) {
        spec.flags = flags;
        CAPTURE(spec.name());
        const auto result = astrai::detail::nvrtc_compile(astrai::detail::compile_request(spec), true);
        CHECK(contains(result.ptx, ".maxntid 512, 1, 1"));
        if ((flags & astrai::kFeatureKvFp8) != 0) {
          CHECK(contains(result.ptx, "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"));
          const std::string report = compile_reporting(spec).log;
          CHECK(contains(report, "0 bytes spill stores"));
        }
        CHECK(contains(result.ptx, "bar.sync"));
        // Groups sync on their own barriers. The CTA's one barrier comes before they part (it
        // publishes the merge's mbarrier): a group reaching a CTA barrier from a second call site
        // failed synccheck on the GPU. They meet at the merge on that mbarrier, each thread
        // arriving once: behind a bar.sync, racecheck reported the merge's loads
        // (docs/decisions/0005-wide-decode-ctas.md).
        const std::string kernel = astrai::testing::entry_text(result.ptx, "paged_decode_sm90_kernel");
        CHECK(astrai::testing::cta_barriers(kernel) == 1);
        CHECK(astrai::testing::count_occurrences(kernel, "mbarrier.arrive.shared::cta.b64") == 1);
        CHECK(contains(result.ptx, "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"));
        CHECK(astrai::testing::global_access_before_grid_wait(result.ptx) == "");
        INFO("NVRTC log: " << result.log);
        CHECK_FALSE(contains(result.log, "warning"));
      }
    }
  }

  TEST_CASE("the Hopper decode's registers leave its shared memory to set how many CTAs an SM runs") {
    // The decode launch plans its splits from decode_sm90_ctas_per_sm before any variant is
    // compiled (so a call taking wide CTAs compiles only the wide one): that count must be what the
    // GPU runs. Shared memory gives 4 CTAs an SM at hd64, 2 at hd128, 1 at hd256; registers bind
    // only past 65536 / (CTAs x 128 threads) a thread (128 at hd64).
    CHECK(astrai::decode_sm90_ctas_per_sm(64) == 4);
    CHECK(astrai::decode_sm90_ctas_per_sm(128) == 2);
    CHECK(astrai::decode_sm90_ctas_per_sm(256) == 1);
    CHECK(astrai::decode_sm90_ctas_per_sm(128, true) == 4);  // an FP8 cache's half stages
    CHECK(astrai::decode_sm90_ctas_per_sm(256, true) == 2);
    CHECK(astrai::decode_sm90_ctas_per_sm(64, true) == 4);  // 28 KB each, but 128 registers a thread
    for (const int head_dim : {64, 128}) {
      for (const auto& [kind, page_size] : std::vector<std::pair<KernelKind, int>>{
               {KernelKind::decode, 0}, {KernelKind::paged_decode, 16}, {KernelKind::paged_decode, 64}}) {
        constexpr std::uint32_t kServing = astrai::kFeatureSoftCap | astrai::kFeatureSink | astrai::kFeatureWindow;
        for (const std::uint32_t flags : {0u, kServing, astrai::decode_q_len_flags(4)}) {
          KernelSpec spec = hopper_prefill(kind, DType::bf16, head_dim, page_size, 4);
          spec.flags = flags;
          CAPTURE(spec.name());
          const auto result = compile_reporting(spec);
          INFO("NVRTC log: " << result.log);
          const int registers = registers_used(result.log);
          REQUIRE(registers > 0);
          const int per_thread = 65536 / (astrai::decode_sm90_ctas_per_sm(head_dim) * astrai::kDecodeThreads);
          CHECK((registers + 7) / 8 * 8 <= per_thread);
        }
      }
    }
  }

  TEST_CASE("the sm_90a GEMM uses TMA, mbarriers, wgmma and setmaxnreg, and ptxas keeps its pipeline") {
    const auto result = compile_gemm("sm_90a");
    CHECK(contains(result.ptx, "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16"));
    CHECK(contains(result.ptx, "cp.async.bulk.tensor.2d"));
    CHECK(contains(result.ptx, "mbarrier.try_wait.parity"));
    CHECK(contains(result.ptx, "setmaxnreg.inc.sync.aligned.u32 232"));
    check_log_clean(result);
  }

  TEST_CASE("the bench's kernels stay out of the library: the GEMM and the prefill trace are the bench's") {
    CHECK_THROWS_AS(astrai::detail::kernel_source("hopper_gemm.cuh"), astrai::Error);
    CHECK_THROWS_AS(astrai::detail::kernel_source("prefill_sm90_trace.cuh"), astrai::Error);
    CHECK(contains(std::string(astrai::bench::bench_kernel_source("hopper_gemm.cuh")), "astrai_gemm_bf16_sm90"));
    CHECK_THROWS_WITH_AS(astrai::bench::bench_kernel_source("nothing.cuh"),
                         "astrai bench: no bench kernel source named 'nothing.cuh'", std::runtime_error);
  }

  TEST_CASE("the sm90 check's traced prefill compiles, and only its hooks stamp clocks") {
    const KernelSpec spec = hopper_prefill(KernelKind::prefill, DType::bf16, 128, 0, 4);
    const CompileResult plain = astrai::detail::nvrtc_compile(astrai::detail::compile_request(spec), true);
    CHECK_FALSE(contains(plain.ptx, "astrai_prefill_trace"));
    CHECK_FALSE(contains(plain.ptx, "%smid"));
    CHECK_FALSE(contains(plain.ptx, "%clock64"));
    CompileRequest traced_request = astrai::detail::compile_request(spec);
    astrai::bench::add_prefill_trace(&traced_request, 64);
    const CompileResult traced = astrai::detail::nvrtc_compile(traced_request, true);
    CHECK(contains(traced.ptx, ".global .align 8 .b8 astrai_prefill_trace[7168]"));  // 64 CTAs x 14 stamps
    CHECK(contains(traced.ptx, "%smid"));
    CHECK(contains(traced.ptx, "%clock64"));
    check_log_clean(traced);
  }

  TEST_CASE("plain sm_90 refuses the Hopper kernels: wgmma exists only on sm_90a") {
    CHECK_THROWS_AS(compile_gemm("sm_90"), astrai::CompileError);
  }

  TEST_CASE("sm_90a prefill variants (contiguous and paged) compile to wgmma SS and RS over TMA loads, unserialized") {
    for (DType dtype : {DType::bf16, DType::fp16}) {
      for (const auto& [kind, head_dim, page_size, wide] :
           std::vector<std::tuple<KernelKind, int, int, bool>>{{KernelKind::prefill, 64, 0, false},
                                                               {KernelKind::prefill, 128, 0, false},
                                                               {KernelKind::prefill, 128, 0, true},
                                                               {KernelKind::prefill, 192, 0, false},
                                                               {KernelKind::prefill, 256, 0, false},
                                                               {KernelKind::paged_prefill, 128, 8, false},
                                                               {KernelKind::paged_prefill, 128, 16, true},
                                                               {KernelKind::paged_prefill, 64, 16, false},
                                                               {KernelKind::paged_prefill, 256, 256, false}}) {
        KernelSpec spec = hopper_prefill(kind, dtype, head_dim, page_size, 4);
        spec.wide = wide;
        CAPTURE(spec.name());
        const auto result = astrai::detail::nvrtc_compile(astrai::detail::compile_request(spec), true);
        const std::string types = dtype == DType::bf16 ? "bf16.bf16" : "f16.f16";
        const int consumers = astrai::prefill_sm90_consumers(head_dim, wide);
        const int block_n = astrai::prefill_sm90_block_n(head_dim, consumers);
        const bool persistent = astrai::prefill_sm90_persistent(page_size, consumers, 0);
        CHECK(contains(result.ptx, fmt::format("wgmma.mma_async.sync.aligned.m64n{}k16.f32.{}", block_n, types)));
        CHECK(contains(result.ptx, fmt::format("wgmma.mma_async.sync.aligned.m64n{}k16.f32.{}", head_dim, types)));
        // The walk's first block issues S in 64-column pieces, only as far as its rows see
        // (persistent CTAs take it whole).
        if (block_n % 64 == 0 && !persistent)
          CHECK(contains(result.ptx, fmt::format("wgmma.mma_async.sync.aligned.m64n64k16.f32.{}", types)));
        CHECK(contains(result.ptx, "cp.async.bulk.tensor.4d"));
        CHECK(contains(result.ptx,
                       fmt::format("setmaxnreg.dec.sync.aligned.u32 {}",
                                   astrai::prefill_sm90_producer_regs(consumers, persistent))));
        CHECK(contains(result.ptx, fmt::format("setmaxnreg.inc.sync.aligned.u32 {}",
                                               astrai::prefill_sm90_consumer_regs(consumers))));
        CHECK(contains(result.ptx, fmt::format(".maxntid {}", astrai::prefill_sm90_threads(consumers))));
        // Paged V arrives in boxes of whole rows (a 5-D map), K and contiguous KV in 4-D boxes.
        CHECK(contains(result.ptx, "cp.async.bulk.tensor.5d") == (page_size > 0));
        CHECK(contains(result.ptx, "bar.sync"));  // the round robin between consumer warpgroups
        // Lazy rescaling from head dim 128: a warp vote decides whether O is rescaled; hd64
        // rescales every block (it measured slower lazy).
        CHECK(contains(result.ptx, "vote.sync.any.pred") == (head_dim >= 128));
        // From head dim 128 one lane of each warp stores its row sums before waiting for the
        // previous block's P V: the store holds that wait below the softmax in ptxas's schedule.
        const std::regex pinned_wait(
            R"(@p st\.shared\.f32 \[%r\d+\], %f\d+;\s*\}(\s|//[^\n]*)*wgmma\.wait_group\.sync\.aligned 0;)");
        CHECK(std::regex_search(result.ptx, pinned_wait) == (head_dim >= 128));
        // O leaves as 16-byte pieces of whole rows (through shared memory), not 4-byte stores:
        // the only 32-bit global stores left are the LSE's. The staging goes through explicit
        // shared-space forms (generic pointers compiled to ST.E / LD.E.128).
        CHECK(contains(result.ptx, "st.global.v4."));
        CHECK(contains(result.ptx, "stmatrix.sync.aligned.m8n8.x4.shared.b16"));
        CHECK(contains(result.ptx, "ld.shared.v4.b32"));
        CHECK_FALSE(contains(result.ptx, "st.global.u32"));
        CHECK_FALSE(contains(result.ptx, "st.global.b32"));
        check_log_clean(result);
      }
    }
  }

  TEST_CASE("sm_90a prefill variants with the soft-cap, sinks and window keep the wgmma pipeline and compile the "
            "features in") {
    const KernelSpec plain = hopper_prefill(KernelKind::prefill, DType::bf16, 128, 0, 4);
    const auto plain_result = astrai::detail::nvrtc_compile(astrai::detail::compile_request(plain), true);
    for (const auto& [kind, head_dim, page_size] : std::vector<std::tuple<KernelKind, int, int>>{
             {KernelKind::prefill, 128, 0}, {KernelKind::paged_prefill, 64, 16}, {KernelKind::prefill, 256, 0}}) {
      constexpr std::uint32_t kAll = astrai::kFeatureSoftCap | astrai::kFeatureSink | astrai::kFeatureWindow;
      for (std::uint32_t flags : {std::uint32_t{astrai::kFeatureSoftCap}, std::uint32_t{astrai::kFeatureWindow},
                                  std::uint32_t{astrai::kFeatureSink | astrai::kFeatureWindow}, kAll}) {
        KernelSpec spec = hopper_prefill(kind, DType::bf16, head_dim, page_size, 4);
        spec.flags = flags;
        CAPTURE(spec.name());
        CHECK(astrai::detail::hopper_serves(spec));
        const auto result = astrai::detail::nvrtc_compile(astrai::detail::compile_request(spec), true);
        const int consumers = astrai::prefill_sm90_consumers(head_dim);
        CHECK(contains(result.ptx, fmt::format("wgmma.mma_async.sync.aligned.m64n{}k16.f32.bf16.bf16",
                                               astrai::prefill_sm90_block_n(head_dim, consumers))));
        CHECK(contains(result.ptx, "cp.async.bulk.tensor.4d"));
        CHECK(contains(result.ptx, fmt::format("setmaxnreg.inc.sync.aligned.u32 {}",
                                               astrai::prefill_sm90_consumer_regs(consumers))));
        if (kind == KernelKind::prefill && head_dim == 128) CHECK(result.ptx.size() != plain_result.ptx.size());
        check_log_clean(result);
      }
    }
  }

  TEST_CASE("sm_90a prefill variants keep their state in registers: no spills, a few bytes with every feature") {
    // Spills cost the consumers' GEMM overlap; copies of the main step (one per first-block width)
    // once pushed the featured variants to 240 bytes.
    constexpr std::uint32_t kAll = astrai::kFeatureSoftCap | astrai::kFeatureSink | astrai::kFeatureWindow;
    for (const auto& [kind, head_dim, page_size, wide] : std::vector<std::tuple<KernelKind, int, int, bool>>{
             {KernelKind::prefill, 128, 0, false},
             {KernelKind::prefill, 128, 0, true},  // persistent, as hd64's below
             {KernelKind::prefill, 64, 0, false},
             {KernelKind::paged_prefill, 128, 16, false},
             {KernelKind::paged_prefill, 128, 16, true},
             {KernelKind::paged_prefill, 64, 16, false}}) {
      for (std::uint32_t flags : {std::uint32_t{0}, kAll}) {
        for (int group : {4, 6, 1}) {  // packed GQA tiles (a whole group, a pack of 2), and one head's
          KernelSpec spec = hopper_prefill(kind, DType::bf16, head_dim, page_size, group);
          spec.flags = flags;
          spec.wide = wide;
          CAPTURE(spec.name());
          const auto result = compile_reporting(spec);
          INFO("NVRTC log: " << result.log);
          const int spilled = spill_store_bytes(result.log);
          REQUIRE(spilled >= 0);
          CHECK(spilled <= (flags == 0 ? 0 : 32));
        }
      }
    }
  }

  TEST_CASE("packed GQA takes the most heads of a group that whole positions fill 64 tile rows with") {
    // A consumer's 64 rows must hold whole positions (the pack divides 64) of heads sharing one
    // KV head (the pack divides the group); a larger such pack would leave fewer partial tiles.
    for (int group = 1; group <= 128; ++group) {
      CAPTURE(group);
      const int pack = astrai::prefill_sm90_pack_heads(group);
      REQUIRE(pack >= 1);
      CHECK(group % pack == 0);
      CHECK(64 % pack == 0);
      for (int larger = pack + 1; larger <= 64; ++larger) CHECK_FALSE((group % larger == 0 && 64 % larger == 0));
      CHECK(astrai::prefill_sm90_packs_gqa(group) == (pack > 1));
    }
  }

  TEST_CASE("the Hopper prefill's tensor-map boxes bring exactly the bytes each of its barriers expects") {
    // A mismatch would leave a barrier waiting forever: Q's barrier expects the Q tile, each K and
    // V stage kBlockN rows of head_dim columns, brought by head_dim / 64 boxes (contiguous, paged
    // K: a box per page part and 64 columns) or by one box per page part (paged V: whole rows).
    for (int head_dim : {64, 128, 192, 256}) {
      for (int page_size : {0, 8, 16, 32, 256}) {
        for (int tiling = 0; tiling < 4; ++tiling) {
          const bool head_major = tiling % 2 == 1;
          const bool wide = tiling >= 2;
          if (wide && astrai::prefill_sm90_wide_consumers(head_dim) == 0) continue;
          CAPTURE(head_dim);
          CAPTURE(page_size);
          CAPTURE(head_major);
          CAPTURE(wide);
          // Groups 1 and 3 unpacked; 4 and 8 packed whole; 6 and 12 in packs of 2 and 4 heads.
          for (const int kv_heads : {24, 8, 6, 4, 3, 2}) {
            CAPTURE(kv_heads);
            alignas(16) static unsigned char storage[64];
            astrai::PrefillParams p{};
            p.q = p.k = p.v = p.out = storage;
            p.batch = 3;
            p.q_len = 300;
            p.kv_len = 700;
            p.total_q = 900;
            p.n_heads = 24;
            p.n_kv_heads = kv_heads;
            p.num_pages = 40;
            p.q_stride_seq = 24LL * head_dim;
            p.q_stride_head = head_dim;
            p.q_stride_batch = p.q_stride_seq * p.q_len;
            // Token-major [.., tokens, kv_heads, d] or head-major [.., kv_heads, tokens, d] K and V.
            const long long tokens = page_size > 0 ? page_size : p.kv_len;
            p.k_stride_seq = p.v_stride_seq = head_major ? head_dim : 1LL * kv_heads * head_dim;
            p.k_stride_head = p.v_stride_head = head_major ? tokens * head_dim : head_dim;
            p.k_stride_batch = p.v_stride_batch = 1LL * kv_heads * head_dim * p.kv_len;
            p.k_stride_page = p.v_stride_page = 1LL * kv_heads * head_dim * page_size;
            const int consumers = astrai::prefill_sm90_consumers(head_dim, wide);
            const int block_n = astrai::prefill_sm90_block_n(head_dim, consumers);
            const auto maps = astrai::detail::prefill_map_shapes(p, head_dim, page_size, consumers, block_n);
            for (const TensorMapShape* shape : {&maps.q, &maps.k, &maps.v})
              CHECK(astrai::detail::tensor_map_problem(*shape) == "");
            const int chunks = head_dim / 64;
            const int boxes = page_size == 0 ? 1 : block_n / std::min(page_size, 16);  // per chunk or row run
            auto box_bytes = [](const TensorMapShape& shape) {
              long long bytes = 2;
              for (std::uint32_t extent : shape.box) bytes *= extent;
              return bytes;
            };
            const long long q_bytes = static_cast<long long>(astrai::prefill_sm90_block_m(consumers)) * head_dim * 2;
            const long long kv_bytes = static_cast<long long>(block_n) * head_dim * 2;
            CHECK(box_bytes(maps.q) * chunks == q_bytes);
            CHECK(box_bytes(maps.k) * chunks * boxes == kv_bytes);
            CHECK(box_bytes(maps.v) * (page_size == 0 ? chunks : 1) * boxes == kv_bytes);
            CHECK(q_bytes + 4 * kv_bytes <= astrai::prefill_sm90_smem_bytes(head_dim, consumers, block_n));
            // Packed GQA: the Q box is a pack's heads (dim 1) at whole positions (dim 2), and the
            // grid walks packs; else one head's positions, and the grid walks query heads.
            const int group = p.n_heads / p.n_kv_heads;
            const int pack = group == 4 || group == 8 ? group : group == 6 ? 2 : group == 12 ? 4 : 1;
            const bool packed = pack > 1;
            CHECK(astrai::prefill_sm90_pack_heads(group) == pack);
            const int block_m = astrai::prefill_sm90_block_m(consumers);
            CHECK(maps.q.box[1] == static_cast<std::uint32_t>(packed ? pack : block_m));
            CHECK(maps.q.box[2] == static_cast<std::uint32_t>(packed ? block_m / pack : 1));
            CHECK(maps.q.dims[1] == static_cast<std::uint64_t>(packed ? p.n_heads : (page_size ? p.total_q : p.q_len)));
            const astrai::detail::GridSize grid = astrai::detail::prefill_sm90_grid(p, p.q_len, consumers);
            const long long rows = static_cast<long long>(p.q_len) * pack;
            CHECK(grid.x == static_cast<unsigned>((rows + block_m - 1) / block_m));
            CHECK(grid.y == static_cast<unsigned>(p.n_heads / pack));
            CHECK(grid.z == static_cast<unsigned>(p.batch));
          }
        }
      }
    }
  }

  TEST_CASE("tensor maps: what the driver accepts, and each rule that sends a call to the portable kernel") {
    alignas(16) static unsigned char storage[64];
    CHECK(astrai::detail::tensor_map_problem(good_shape(storage)) == "");
    TensorMapShape shape = good_shape(storage + 8);
    CHECK(contains(astrai::detail::tensor_map_problem(shape), "not 16-byte aligned"));
    shape = good_shape(storage);
    shape.strides[1] = 100;  // 200 bytes
    CHECK(contains(astrai::detail::tensor_map_problem(shape), "stride of dim 2 is 200 bytes"));
    shape = good_shape(storage);
    shape.strides[2] = std::int64_t{1} << 39;  // 2^40 bytes
    CHECK(contains(astrai::detail::tensor_map_problem(shape), "below 2^40"));
    shape = good_shape(storage);
    shape.dims[1] = 0;
    CHECK(contains(astrai::detail::tensor_map_problem(shape), "dim 1 has size 0"));
    shape = good_shape(storage);
    shape.box[1] = 257;
    CHECK(contains(astrai::detail::tensor_map_problem(shape), "box 1 has size 257"));
    shape = good_shape(storage);
    shape.strides.pop_back();
    CHECK(contains(astrai::detail::tensor_map_problem(shape), "rank 4 with 2 strides"));
    // An FP8 cache's map: bytes, boxes of 128, strides counted in bytes; FP8 attention's rows of
    // 64 bytes at hd64 (64-byte swizzled), no narrower, and 16-bit rows of 128 bytes only.
    shape = good_shape(storage);
    shape.box[0] = 32;
    CHECK(astrai::detail::tensor_map_problem(shape) ==
          "inner box of 32 elements (64 bytes) is not a 128-byte row");
    shape = good_shape(storage);
    shape.element_bytes = 1;
    for (std::int64_t& stride : shape.strides) stride *= 2;
    CHECK(astrai::detail::tensor_map_problem(shape) == "");
    shape.box[0] = 32;
    CHECK(astrai::detail::tensor_map_problem(shape) ==
          "inner box of 32 elements (32 bytes) is not a 128-byte row or a 64-byte one");
    shape.box[0] = 128;
    CHECK(astrai::detail::tensor_map_problem(shape) == "");
    shape.strides[0] = 136;  // not a multiple of 16 bytes, though it would be of 16-bit elements
    CHECK(contains(astrai::detail::tensor_map_problem(shape), "stride of dim 1 is 136 bytes"));
    shape = good_shape(storage);
    shape.element_bytes = 4;
    CHECK(contains(astrai::detail::tensor_map_problem(shape), "elements of 4 bytes"));
  }

  TEST_CASE("the tensor-map memo's key words change with every value an encoded map holds") {
    // A memo hit hands out a map encoded earlier: a value missing from the key would give a
    // call a map of other memory or another shape.
    alignas(16) static unsigned char storage[64];
    const TensorMapShape base = good_shape(storage);
    const auto words = astrai::detail::tensor_map_words(base);
    std::vector<TensorMapShape> changed;
    changed.push_back(good_shape(storage + 16));
    for (std::size_t i = 0; i < base.dims.size(); ++i) {
      changed.push_back(base);
      changed.back().dims[i] += 1;
      changed.push_back(base);
      changed.back().box[i] += 1;
    }
    for (std::size_t i = 0; i < base.strides.size(); ++i) {
      changed.push_back(base);
      changed.back().strides[i] += 8;
    }
    changed.push_back(base);  // the same bytes read as an FP8 cache
    changed.back().element_bytes = 1;
    TensorMapShape five = base;  // a rank-5 map whose last dim is 1 is another map
    five.dims.push_back(1);
    five.strides.push_back(2 * 100 * 8 * 128);
    five.box.push_back(1);
    changed.push_back(five);
    for (std::size_t i = 0; i < changed.size(); ++i) {
      CAPTURE(i);
      CHECK(astrai::detail::tensor_map_words(changed[i]) != words);
    }
    CHECK(astrai::detail::tensor_map_words(good_shape(storage)) == words);
  }
}
