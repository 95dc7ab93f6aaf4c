#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "astrai/error.hpp"
#include "kernel_src/kernel_params.h"
#include "runtime/compile_plan.hpp"
#include "runtime/kernel_sources.hpp"
#include "runtime/kernel_spec.hpp"
#include "runtime/nvrtc_compiler.hpp"
#include "tests/support/specs.hpp"
#include "tests/support/ptx.hpp"

using astrai::DType;
using astrai::testing::contains;
using astrai::testing::is_elf;
using astrai::detail::BinaryKind;
using astrai::detail::CompileRequest;
using astrai::detail::CompileResult;
using astrai::detail::KernelKind;
using astrai::detail::KernelSpec;
using astrai::testing::paged_decode_spec;
using astrai::testing::rotary_spec;
using astrai::detail::nvrtc_compile;

namespace {

KernelSpec prefill(KernelKind kind, DType dtype, int head_dim, int page_size, int group,
                   const std::string& arch, bool no_mma = false) {
  return astrai::testing::make_spec(kind, dtype, head_dim, kind == KernelKind::paged_prefill ? page_size : 0,
                                    group, arch, no_mma);
}

// The request the JIT engine builds for a spec.
CompileRequest request_for(const KernelSpec& spec) { return astrai::detail::compile_request(spec); }

bool binary_contains(const std::vector<char>& binary, const std::string& needle) {
  return std::search(binary.begin(), binary.end(), needle.begin(), needle.end()) != binary.end();
}

// Compiles `spec` and checks what every successful compile must give.
CompileResult compile_and_check(const KernelSpec& spec) {
  const CompileRequest request = request_for(spec);
  CompileResult result = nvrtc_compile(request, true);
  CHECK(result.kind == BinaryKind::cubin);
  CHECK(is_elf(result.binary));
  REQUIRE(result.lowered_names.size() == request.name_expressions.size());
  for (const auto& lowered : result.lowered_names) {
    CAPTURE(lowered);
    CHECK(lowered.rfind("_Z", 0) == 0);  // a mangled C++ name
    CHECK(contains(result.ptx, ".entry " + lowered));
    CHECK(binary_contains(result.binary, lowered));
  }
  CHECK(contains(result.ptx, ".target " + spec.arch));
  CHECK(contains(result.source, "#include \"" + spec.main_file() + "\""));
  return result;
}

void check_tensor_core_ptx(const std::string& ptx) {
  CHECK(contains(ptx, "mma.sync.aligned.m16n8k16"));
  CHECK(contains(ptx, "ldmatrix"));
  CHECK(contains(ptx, "cp.async"));
}

void check_cuda_core_ptx(const std::string& ptx) {
  CHECK_FALSE(contains(ptx, "mma.sync"));
  CHECK_FALSE(contains(ptx, "ldmatrix"));
  CHECK_FALSE(contains(ptx, "cp.async"));
}

const std::vector<std::string> kArchs = {"sm_75", "sm_80", "sm_86", "sm_89", "sm_90a"};

}  // namespace

TEST_SUITE("kernel_compile") {

TEST_CASE("NVRTC knows every arch the sweep compiles for") {
  const auto archs = astrai::detail::nvrtc_supported_archs();
  REQUIRE_FALSE(archs.empty());
  CHECK(std::is_sorted(archs.begin(), archs.end()));
  for (int arch : {75, 80, 86, 89, 90}) {
    CAPTURE(arch);
    CHECK(std::find(archs.begin(), archs.end(), arch) != archs.end());
  }
  const auto version = astrai::detail::nvrtc_version();
  CHECK(version.major >= 12);
  CHECK(version.text() == std::to_string(version.major) + "." + std::to_string(version.minor));
}

TEST_CASE("ahead of griddepcontrol.wait only L2 prefetches and L2-only reads pass") {
  using astrai::testing::global_access_before_grid_wait;
  const auto entry = [](const std::string& body) { return ".entry k(\n" + body + "}\n"; };
  const std::string wait = "griddepcontrol.wait;\n";
  CHECK(global_access_before_grid_wait(entry(wait + "ld.global.nc.u32 %r1, [%rd1];\n")) == "");
  CHECK(global_access_before_grid_wait(entry("prefetch.global.L2 [%rd1];\nld.global.cg.s32 %r1, [%rd2];\n"
                                             "cp.async.bulk.prefetch.tensor.4d.L2.global.tile [%rd3, {%r1}];\n" +
                                             wait + "st.global.u32 [%rd1], %r1;\n")) == "");
  CHECK(global_access_before_grid_wait(entry("ld.global.nc.u32 %r1, [%rd1];\n" + wait)) == "k: ld.global");
  CHECK(global_access_before_grid_wait(entry("ld.global.cg.s32 %r1, [%rd2];\nld.global.u32 %r2, [%rd1];\n" + wait)) ==
        "k: ld.global");
  CHECK(global_access_before_grid_wait(
            entry("cp.async.bulk.tensor.4d.shared::cluster.global.tile [%r1], [%rd3, {%r1}], [%r2];\n" + wait)) ==
        "k: cp.async.bulk");
  CHECK(global_access_before_grid_wait(entry("st.global.u32 [%rd1], %r1;\n")) == "k: st.global");

  using astrai::testing::occurs_before_grid_wait;
  const std::string prefetch = "prefetch.global.L2 [%rd1];\n";
  CHECK(occurs_before_grid_wait(entry(prefetch + wait), "prefetch.global.L2"));
  CHECK_FALSE(occurs_before_grid_wait(entry(wait + prefetch), "prefetch.global.L2"));
  CHECK(occurs_before_grid_wait(entry(wait) + entry(prefetch), "prefetch.global.L2"));  // never waits
}

TEST_CASE("paged decode compiles for every arch with tensor cores from sm_80 on") {
  for (const auto& arch : kArchs) {
    for (const KernelSpec& spec : {paged_decode_spec(DType::bf16, 128, 16, 4, arch),
                                   paged_decode_spec(DType::fp16, 64, 1, 6, arch)}) {
      CAPTURE(spec.name());
      const CompileResult result = compile_and_check(spec);
      if (arch == "sm_75") check_cuda_core_ptx(result.ptx);
      else check_tensor_core_ptx(result.ptx);
      // The split combine is a programmatic dependent launch from sm_90 on: the attention
      // kernel releases it and the combine waits for the attention kernel's results.
      const bool hopper = astrai::detail::arch_number(arch) >= 90;
      CHECK(contains(result.ptx, "griddepcontrol.launch_dependents") == hopper);
      CHECK(contains(result.ptx, "griddepcontrol.wait") == hopper);
      // Both kernels are launched early from sm_90 on: neither may touch memory before its wait,
      // and the decode prefetches its first reads into L2 meanwhile.
      if (hopper) CHECK(astrai::testing::global_access_before_grid_wait(result.ptx) == "");
      CHECK(astrai::testing::occurs_before_grid_wait(result.ptx, "prefetch.global.L2") == hopper);
      // K and V are read once: with tensor cores their copies leave L2 first.
      CHECK(contains(result.ptx, "cp.async.cg.shared.global.L2::cache_hint") == (arch != "sm_75"));
      CHECK(contains(result.ptx, "createpolicy.fractional.L2::evict_first.b64") == (arch != "sm_75"));
    }
  }
}

TEST_CASE("a forced CUDA-core variant on sm_90a uses no tensor-core instructions") {
  const KernelSpec spec = paged_decode_spec(DType::bf16, 128, 16, 4, "sm_90a", true);
  REQUIRE_FALSE(spec.uses_mma());
  const CompileResult result = compile_and_check(spec);
  check_cuda_core_ptx(result.ptx);
}

TEST_CASE("paged decode compiles across head dims, page sizes, groups and dtypes") {
  // Tensor-core path on one arch, and the CUDA-core path on sm_75 for the odd shapes.
  const std::vector<KernelSpec> specs = {
      paged_decode_spec(DType::bf16, 32, 1, 1, "sm_86"),    paged_decode_spec(DType::fp16, 32, 16, 20, "sm_86"),
      paged_decode_spec(DType::fp16, 80, 16, 6, "sm_86"),   paged_decode_spec(DType::bf16, 80, 1, 20, "sm_86"),
      paged_decode_spec(DType::bf16, 256, 1, 6, "sm_86"),   paged_decode_spec(DType::fp16, 256, 16, 1, "sm_86"),
      paged_decode_spec(DType::fp16, 80, 1, 20, "sm_75"),   paged_decode_spec(DType::bf16, 256, 16, 6, "sm_75"),
      paged_decode_spec(DType::bf16, 32, 16, 20, "sm_75"),
  };
  for (const auto& spec : specs) {
    CAPTURE(spec.name());
    const CompileResult result = compile_and_check(spec);
    if (spec.uses_mma()) check_tensor_core_ptx(result.ptx);
    else check_cuda_core_ptx(result.ptx);
  }
}

TEST_CASE("prefill and paged prefill compile for every arch with tensor cores from sm_80 on") {
  for (const auto& arch : kArchs) {
    for (KernelKind kind : {KernelKind::prefill, KernelKind::paged_prefill}) {
      const KernelSpec spec = prefill(kind, DType::bf16, 128, 16, 4, arch);
      CAPTURE(spec.name());
      const CompileResult result = compile_and_check(spec);
      CHECK(result.lowered_names.size() == 1);
      CHECK_FALSE(contains(result.log, "warning"));
      if (arch == "sm_75") {
        check_cuda_core_ptx(result.ptx);
      } else {
        CHECK(contains(result.ptx, "mma.sync"));
        check_tensor_core_ptx(result.ptx);
      }
    }
  }
}

TEST_CASE("a forced CUDA-core prefill on sm_90a uses no tensor-core instructions") {
  for (KernelKind kind : {KernelKind::prefill, KernelKind::paged_prefill}) {
    const KernelSpec spec = prefill(kind, DType::bf16, 128, 16, 4, "sm_90a", true);
    CAPTURE(spec.name());
    REQUIRE_FALSE(spec.uses_mma());
    const CompileResult result = compile_and_check(spec);
    CHECK_FALSE(contains(result.log, "warning"));
    check_cuda_core_ptx(result.ptx);
  }
}

TEST_CASE("prefill compiles across head dims, page sizes, groups and dtypes") {
  const std::vector<KernelSpec> specs = {
      prefill(KernelKind::prefill, DType::fp16, 32, 0, 1, "sm_86"),
      prefill(KernelKind::prefill, DType::bf16, 80, 0, 6, "sm_86"),
      prefill(KernelKind::prefill, DType::fp16, 256, 0, 8, "sm_86"),
      prefill(KernelKind::paged_prefill, DType::bf16, 64, 1, 16, "sm_86"),
      prefill(KernelKind::paged_prefill, DType::fp16, 96, 64, 1, "sm_86"),
      prefill(KernelKind::paged_prefill, DType::bf16, 256, 8, 4, "sm_86"),
      prefill(KernelKind::prefill, DType::fp16, 80, 0, 6, "sm_75"),
      prefill(KernelKind::paged_prefill, DType::bf16, 256, 1, 16, "sm_75"),
  };
  for (const auto& spec : specs) {
    CAPTURE(spec.name());
    const CompileResult result = compile_and_check(spec);
    CHECK_FALSE(contains(result.log, "warning"));
    if (spec.uses_mma()) check_tensor_core_ptx(result.ptx);
    else check_cuda_core_ptx(result.ptx);
  }
}

// Every attention family with `flags`, on the tensor-core path (sm_90a, sm_80), the forced
// CUDA-core path (sm_90a .nomma) and the native one (sm_75), across dtypes and head dims.
std::vector<KernelSpec> feature_specs(std::uint32_t flags) {
  std::vector<KernelSpec> specs;
  for (KernelKind kind : {KernelKind::paged_decode, KernelKind::decode, KernelKind::prefill,
                          KernelKind::paged_prefill}) {
    const bool paged = kind == KernelKind::paged_decode || kind == KernelKind::paged_prefill;
    specs.push_back(astrai::testing::make_spec(kind, DType::bf16, 128, paged ? 16 : 0, 4, "sm_90a"));
    specs.push_back(astrai::testing::make_spec(kind, DType::fp16, 80, paged ? 1 : 0, 6, "sm_80"));
    specs.push_back(astrai::testing::make_spec(kind, DType::bf16, 64, paged ? 1 : 0, 6, "sm_90a", true));
    specs.push_back(astrai::testing::make_spec(kind, DType::fp16, 256, paged ? 8 : 0, 1, "sm_75"));
  }
  for (KernelSpec& spec : specs) spec.flags = flags;
  return specs;
}

// PTX with the kernels' mangled names (which carry the template arguments) taken out.
std::string ptx_without_names(const CompileResult& result) {
  std::string ptx = result.ptx;
  for (const auto& name : result.lowered_names)
    for (std::size_t at = ptx.find(name); at != std::string::npos; at = ptx.find(name, at))
      ptx.replace(at, name.size(), "kernel");
  return ptx;
}

// Compiles each variant with its feature bits and checks the path's instructions, that the
// feature adds no warning to the plain variant's log, and that it compiles code in (the PTX
// differs from the plain variant's in more than the kernel names).
CompileResult check_feature_variant(const KernelSpec& spec) {
  const CompileResult result = compile_and_check(spec);
  if (spec.uses_mma()) check_tensor_core_ptx(result.ptx);
  else check_cuda_core_ptx(result.ptx);
  KernelSpec plain = spec;
  plain.flags = 0;
  const CompileResult plain_result = nvrtc_compile(request_for(plain), true);
  CHECK(contains(result.log, "warning") == contains(plain_result.log, "warning"));
  CHECK(ptx_without_names(result) != ptx_without_names(plain_result));
  return result;
}

void check_feature_compiles(std::uint32_t flags) {
  for (const KernelSpec& spec : feature_specs(flags)) {
    CAPTURE(spec.name());
    check_feature_variant(spec);
  }
}

TEST_CASE("soft-cap variants of every attention family compile on both paths") {
  check_feature_compiles(astrai::kFeatureSoftCap);
}

TEST_CASE("sink variants of every attention family compile on both paths, alone and with the soft-cap") {
  check_feature_compiles(astrai::kFeatureSink);
  check_feature_compiles(astrai::kFeatureSink | astrai::kFeatureSoftCap);
}

TEST_CASE("sliding-window variants of every attention family compile on both paths, alone and with every feature") {
  check_feature_compiles(astrai::kFeatureWindow);
  check_feature_compiles(astrai::kFeatureWindow | astrai::kFeatureSink | astrai::kFeatureSoftCap);
}

TEST_CASE("ALiBi variants of every attention family compile on both paths, alone and with the other options") {
  check_feature_compiles(astrai::kFeatureAlibi);
  check_feature_compiles(astrai::kFeatureAlibi | astrai::kFeatureWindow | astrai::kFeatureSink |
                         astrai::kFeatureSoftCap);
  // The TMA decode serves it through the shared softmax; FP8 caches and multi-token decode too.
  for (const char* name : {"paged_decode.bf16.hd128.ps16.g4.alibi.tma.sm_90a",
                           "decode.fp16.hd64.g6.alibi.tma.wide.sm_90a",
                           "paged_decode.bf16.hd128.ps16.g4.kv_e4m3.alibi.sm_89",
                           "paged_decode.fp16.hd64.ps1.g6.alibi.q4.sm_80",
                           "paged_prefill.bf16.hd128.ps16.g4.kv_e5m2.swa.alibi.sm_90a"}) {
    CAPTURE(name);
    check_feature_variant(KernelSpec::parse(name));
  }
}

// The FP8 KV variants: paged_decode, decode and paged_prefill, both formats, on sm_75 (CUDA
// cores), sm_80 (tensor cores, bit-level FP8 conversions), sm_89 and sm_90a (the cvt
// instructions) and sm_90a .nomma, with `extra` feature bits; dtypes and head dims vary.
std::vector<KernelSpec> fp8_specs(std::uint32_t format, std::uint32_t extra) {
  struct Target {
    const char* arch;
    bool no_mma;
  };
  const Target targets[] = {{"sm_75", false}, {"sm_80", false}, {"sm_89", false}, {"sm_90a", false}, {"sm_90a", true}};
  const int head_dims[] = {128, 64, 80, 256, 128};
  std::vector<KernelSpec> specs;
  int i = 0;
  for (KernelKind kind : {KernelKind::paged_decode, KernelKind::decode, KernelKind::paged_prefill}) {
    for (const Target& target : targets) {
      const bool paged = kind != KernelKind::decode;
      const DType dtype = (i % 2 == 0) ? DType::bf16 : DType::fp16;
      KernelSpec spec = astrai::testing::make_spec(kind, dtype, head_dims[i % 5], paged ? (i % 3 == 0 ? 1 : 16) : 0,
                                                   i % 2 == 0 ? 4 : 6, target.arch, target.no_mma);
      spec.flags = format | extra;
      specs.push_back(spec);
      ++i;
    }
  }
  return specs;
}

void check_fp8_compiles(std::uint32_t format, std::uint32_t extra) {
  const bool e5m2 = format == astrai::kFeatureKvE5m2;
  for (const KernelSpec& spec : fp8_specs(format, extra)) {
    CAPTURE(spec.name());
    CHECK_NOTHROW(spec.validate());
    const CompileResult result = check_feature_variant(spec);
    // e4m3 widens with cvt from sm_89 on and bit by bit (an f16x2 multiply) before; e5m2 is a
    // byte permute everywhere. The fused append (paged_decode only) quantizes with cvt from
    // sm_89 on.
    const bool native = astrai::detail::arch_number(spec.arch) >= 89;
    CHECK(contains(result.ptx, "cvt.rn.f16x2.e4m3x2") == (native && !e5m2));
    if (!e5m2) CHECK(contains(result.ptx, "mul.rn.f16x2") == !native);
    if (e5m2) CHECK(contains(result.ptx, "prmt.b32"));
    // The decode over an FP8 cache does not prefetch ahead of its wait: with the prefetches
    // ptxas gave it other code, 7.9% slower at hd64
    // (docs/decisions/0002-programmatic-dependent-launch.md).
    if (spec.kind != KernelKind::paged_prefill) {
      CHECK_FALSE(astrai::testing::occurs_before_grid_wait(result.ptx, "prefetch.global.L2"));
      // Nor are its copies hinted out of L2 first: the hint moved its rows by -1.1% to +1.0%,
      // no gain for the code it adds (docs/decisions/0004-kv-leaves-l2-first.md).
      CHECK_FALSE(contains(result.ptx, "L2::cache_hint"));
    }
    if (spec.kind == KernelKind::paged_decode) {
      CHECK(contains(result.ptx, e5m2 ? "cvt.rn.satfinite.e5m2x2.f32" : "cvt.rn.satfinite.e4m3x2.f32") == native);
    } else {
      CHECK_FALSE(contains(result.ptx, "satfinite"));
    }
  }
}

TEST_CASE("FP8 KV variants (e4m3) of paged_decode, decode and paged_prefill compile on both paths") {
  check_fp8_compiles(astrai::kFeatureKvE4m3, 0);
}

TEST_CASE("FP8 KV variants (e5m2) of paged_decode, decode and paged_prefill compile on both paths") {
  check_fp8_compiles(astrai::kFeatureKvE5m2, 0);
}

TEST_CASE("FP8 KV variants compile with the window, soft-cap and sinks") {
  check_fp8_compiles(astrai::kFeatureKvE4m3, astrai::kFeatureWindow | astrai::kFeatureSoftCap | astrai::kFeatureSink);
  check_fp8_compiles(astrai::kFeatureKvE5m2, astrai::kFeatureWindow | astrai::kFeatureSink);
}

TEST_CASE("rotary embedding compiles for every arch, both dtypes and two head dims") {
  for (std::size_t i = 0; i < kArchs.size(); ++i) {
    // Alternate dtypes and head dims over the archs so every combination appears.
    const DType dtype = i % 2 == 0 ? DType::bf16 : DType::fp16;
    for (int head_dim : {64, 128}) {
      const DType other = dtype == DType::bf16 ? DType::fp16 : DType::bf16;
      const KernelSpec spec = rotary_spec(head_dim == 64 ? dtype : other, head_dim, kArchs[i]);
      CAPTURE(spec.name());
      const CompileResult result = compile_and_check(spec);
      CHECK_FALSE(contains(result.ptx, "mma.sync"));
      // From sm_90 on it lets the decode after it start early (programmatic dependent launch).
      CHECK(contains(result.ptx, "griddepcontrol.launch_dependents") == (kArchs[i] == "sm_90a"));
    }
  }
}

TEST_CASE("merge_states compiles for every arch, both dtypes and head dims 8 to 1024") {
  const std::vector<int> head_dims = {8, 24, 128, 512, 1024};
  for (std::size_t i = 0; i < kArchs.size(); ++i) {
    const int head_dim = head_dims[i % head_dims.size()];
    for (const DType dtype : {DType::bf16, DType::fp16}) {
      KernelSpec spec = rotary_spec(dtype, head_dim, kArchs[i]);
      spec.kind = astrai::detail::KernelKind::merge_states;
      CAPTURE(spec.name());
      const CompileResult result = compile_and_check(spec);
      // One 16-byte load a state and one 16-byte store an item, whatever the head dim.
      CHECK(contains(result.ptx, "ld.global.v4.u32"));
      CHECK(contains(result.ptx, "st.global.v4.b32"));
      // The in-place LSE barrier: the warp's when no item straddles two warps, else the CTA's.
      const bool item_in_warp = 32 % (head_dim / 8) == 0;
      CHECK(contains(result.ptx, "bar.warp.sync") == item_in_warp);
      CHECK(contains(result.ptx, "bar.sync") == !item_in_warp);
      CHECK(contains(result.ptx, "ex2.approx"));
      CHECK_FALSE(contains(result.ptx, "mma.sync"));
      CHECK(contains(result.ptx, "griddepcontrol.wait") == (kArchs[i] == "sm_90a"));
    }
  }
}

TEST_CASE("mla_decode compiles from sm_80 on tensor cores, every page size, q_len and tiling; refuses below") {
  struct Case {
    DType dtype;
    int page_size, heads, q_len;
  };
  const std::vector<Case> cases = {{DType::bf16, 64, 128, 1}, {DType::fp16, 1, 16, 2}, {DType::bf16, 16, 20, 8},
                                   {DType::fp16, 32, 1, 1}};
  for (std::size_t i = 1; i < kArchs.size(); ++i) {
    const Case& c = cases[i - 1];
    KernelSpec spec;
    spec.kind = astrai::detail::KernelKind::mla_decode;
    spec.dtype = c.dtype;
    spec.head_dim = 576;
    spec.page_size = c.page_size;
    spec.group_size = c.heads;
    spec.flags = astrai::decode_q_len_flags(c.q_len);
    spec.arch = kArchs[i];
    CAPTURE(spec.name());
    REQUIRE_NOTHROW(spec.validate());
    const CompileResult result = compile_and_check(spec);
    check_tensor_core_ptx(result.ptx);
    CHECK(contains(result.ptx, "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16"));  // V as the B operand
    CHECK(contains(result.ptx, "cp.async.cg.shared.global"));
    CHECK(contains(result.ptx, "ex2.approx"));
    CHECK(contains(result.ptx, "griddepcontrol.wait") == (kArchs[i] == "sm_90a"));
    KernelSpec no_mma = spec;
    no_mma.force_no_mma = true;
    CHECK_THROWS_WITH_AS(no_mma.validate(), doctest::Contains("needs tensor cores"), astrai::InvalidArgument);
    // The FP8 cache: byte stages widened to 16-bit rows (exact conversions) before the same math.
    KernelSpec fp8 = spec;
    fp8.flags |= i % 2 ? astrai::kFeatureKvE5m2 : astrai::kFeatureKvE4m3;
    CAPTURE(fp8.name());
    const CompileResult widened = compile_and_check(fp8);
    check_tensor_core_ptx(widened.ptx);
    const bool native = astrai::detail::arch_number(kArchs[i]) >= 89;
    if (native && i % 2 == 0) CHECK(contains(widened.ptx, "cvt.rn.f16x2.e4m3x2"));
  }
  KernelSpec turing = KernelSpec::parse("mla_decode.bf16.hd576.ps64.g16.sm_80");
  turing.arch = "sm_75";
  CHECK_THROWS_WITH_AS(turing.validate(), doctest::Contains("needs tensor cores"), astrai::InvalidArgument);
  CHECK_THROWS_AS(KernelSpec::parse("mla_decode.bf16.hd512.ps64.g16.sm_90a"), astrai::InvalidArgument);
  CHECK_THROWS_AS(KernelSpec::parse("mla_decode.bf16.hd576.ps128.g16.sm_90a"), astrai::InvalidArgument);
}

TEST_CASE("a compute target yields PTX text instead of a cubin") {
  const KernelSpec spec = rotary_spec(DType::bf16, 64, "compute_90");
  const CompileRequest request = request_for(spec);
  REQUIRE(request.emit_ptx_only);
  const CompileResult result = nvrtc_compile(request, false);
  CHECK(result.kind == BinaryKind::ptx);
  REQUIRE_FALSE(result.binary.empty());
  CHECK(result.binary.back() == '\0');  // the driver takes it as a C string
  const std::string text(result.binary.data());
  CHECK(contains(text, ".target sm_90"));  // PTX names the virtual arch by its sm_ number
  REQUIRE(result.lowered_names.size() == 1);
  CHECK(contains(text, ".entry " + result.lowered_names[0]));
  CHECK_FALSE(is_elf(result.binary));
}

TEST_CASE("a compute_80 FP8 variant is PTX with tensor cores and the pre-sm_89 conversions") {
  // What ASTRAI_JIT_ARCH=compute_80 runs on an sm_89 or sm_90 GPU.
  const KernelSpec spec = KernelSpec::parse("paged_decode.bf16.hd128.ps16.g4.kv_e4m3.compute_80");
  const CompileRequest request = request_for(spec);
  REQUIRE(request.emit_ptx_only);
  const CompileResult result = nvrtc_compile(request, false);
  CHECK(result.kind == BinaryKind::ptx);
  REQUIRE_FALSE(result.binary.empty());
  CHECK(result.binary.back() == '\0');
  const std::string text(result.binary.data());
  CHECK(contains(text, ".target sm_80"));
  check_tensor_core_ptx(text);
  CHECK_FALSE(contains(text, "cvt.rn.f16x2.e4m3x2"));
  CHECK_FALSE(contains(text, "satfinite"));
  CHECK(contains(text, "mul.rn.f16x2"));
}

TEST_CASE("a compile without the PTX request returns no PTX text") {
  const CompileResult result = nvrtc_compile(request_for(rotary_spec(DType::fp16, 64, "sm_80")), false);
  CHECK(result.ptx.empty());
  CHECK(is_elf(result.binary));
}

TEST_CASE("a name expression for a missing template fails with a CompileError carrying the log") {
  CompileRequest request = request_for(rotary_spec(DType::bf16, 64, "sm_80"));
  request.variant_name = "broken.variant.sm_80";
  request.name_expressions = {"astrai::no_such_kernel<astrai::bf16_t, 64>"};
  bool thrown = false;
  try {
    nvrtc_compile(request, true);
  } catch (const astrai::CompileError& error) {
    thrown = true;
    CHECK(error.variant() == "broken.variant.sm_80");
    CHECK(error.options() == "--std=c++17 --gpu-architecture=sm_80 --device-as-default-execution-space");
    CHECK_FALSE(error.log().empty());
    CHECK(contains(error.log(), "no_such_kernel"));
    const std::string message = error.what();
    CHECK(contains(message, "broken.variant.sm_80"));
    CHECK(contains(message, "--gpu-architecture=sm_80"));
    CHECK(contains(message, error.log()));
  }
  CHECK(thrown);
}

TEST_CASE("a syntax error in a header is reported as a CompileError derived from astrai::Error") {
  CompileRequest request;
  request.variant_name = "syntax.sm_86";
  request.main_file = "bad.cuh";
  request.headers = {{"bad.cuh", "namespace astrai { this is not C++; }\n"}};
  request.options = {"--std=c++17", "--gpu-architecture=sm_86"};
  CHECK_THROWS_AS(nvrtc_compile(request, false), astrai::Error);
  try {
    nvrtc_compile(request, false);
    FAIL("the compile should have failed");
  } catch (const astrai::CompileError& error) {
    CHECK(error.variant() == "syntax.sm_86");
    CHECK(error.options() == "--std=c++17 --gpu-architecture=sm_86");
    CHECK(contains(error.log(), "bad.cuh"));
  }
}

}  // TEST_SUITE
