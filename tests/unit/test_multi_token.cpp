// Multi-token paged decode (the ".q2" .. ".q8" field, speculative verification): variant names,
// what each family accepts, the argument checks, the split plan's rows, and the compiles of
// every q_len on both paths (the plain variant must not change).
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include <fmt/format.h>

#include "kernel_src/kernel_params.h"
#include "runtime/compile_plan.hpp"
#include "runtime/families/attention_features.hpp"
#include "runtime/kernel_spec.hpp"
#include "runtime/nvrtc_compiler.hpp"
#include "tests/support/specs.hpp"
#include "tests/unit/validation_support.hpp"

using astrai::DType;
using astrai::InvalidArgument;
using astrai::detail::CompileResult;
using astrai::detail::KernelKind;
using astrai::detail::KernelSpec;
using astrai::testing::rejection;

namespace {

KernelSpec paged_spec(int q_len, std::uint32_t flags = 0, const std::string& arch = "sm_90a", bool no_mma = false,
                      DType dtype = DType::bf16, int head_dim = 128, int page_size = 16, int group = 4) {
  KernelSpec spec = astrai::testing::paged_decode_spec(dtype, head_dim, page_size, group, arch, no_mma);
  spec.flags = flags | astrai::decode_q_len_flags(q_len);
  return spec;
}

bool contains(const std::string& text, const std::string& needle) { return text.find(needle) != std::string::npos; }

}  // namespace

TEST_SUITE("multi_token") {

TEST_CASE("q_len is a field of the template flags: 0 for one token, q_len - 1 in bits 5..7") {
  CHECK(astrai::decode_q_len_flags(1) == 0u);
  CHECK(astrai::decode_q_len_flags(2) == 0x20u);
  CHECK(astrai::decode_q_len_flags(8) == 0xe0u);
  for (int q_len = 1; q_len <= astrai::kMaxDecodeQLen; ++q_len) {
    CAPTURE(q_len);
    CHECK(astrai::decode_q_len(astrai::decode_q_len_flags(q_len)) == q_len);
    CHECK(astrai::decode_q_len(astrai::decode_q_len_flags(q_len) | astrai::kFeatureSink | astrai::kFeatureKvE4m3) ==
          q_len);
    // The field shares no bit with the one-bit features.
    const unsigned bits = astrai::kFeatureSoftCap | astrai::kFeatureSink | astrai::kFeatureWindow |
                          astrai::kFeatureKvE4m3 | astrai::kFeatureKvE5m2;
    CHECK((astrai::decode_q_len_flags(q_len) & bits) == 0u);
  }
}

TEST_CASE("a multi-token variant is named .q2 .. .q8 after the other features, and parses back") {
  const char* kNames[] = {"q2", "q3", "q4", "q5", "q6", "q7", "q8"};
  for (int q_len = 2; q_len <= 8; ++q_len) {
    const KernelSpec spec = paged_spec(q_len);
    CAPTURE(spec.name());
    CHECK(spec.name() == std::string("paged_decode.bf16.hd128.ps16.g4.") + kNames[q_len - 2] + ".sm_90a");
    CHECK_NOTHROW(spec.validate());
    CHECK(KernelSpec::parse(spec.name()) == spec);
    CHECK(KernelSpec::parse(spec.name()).flags == spec.flags);
  }
  const KernelSpec all = paged_spec(4, astrai::kFeatureKvE4m3 | astrai::kFeatureWindow | astrai::kFeatureSoftCap |
                                           astrai::kFeatureSink, "sm_89", true);
  CHECK(all.name() == "paged_decode.bf16.hd128.ps16.g4.kv_e4m3.swa.cap.sink.q4.nomma.sm_89");
  CHECK(KernelSpec::parse(all.name()) == all);
  CHECK(all.warm_command() ==
        "astrai-jit warm --arch sm_89 --kernels paged_decode --dtypes bf16 --head-dims 128 --page-sizes 16 "
        "--group-sizes 4 --features kv_e4m3+swa+cap+sink+q4 --no-mma");
}

TEST_CASE("a plain variant keeps its name, flags and instantiations; a .qN variant adds the token combine") {
  const KernelSpec plain = paged_spec(1);
  CHECK(plain.flags == 0u);
  CHECK(plain.name() == "paged_decode.bf16.hd128.ps16.g4.sm_90a");
  CHECK(plain.instantiations() == std::vector<std::string>{"astrai::paged_decode_kernel<astrai::bf16_t, 128, 16, 4, 0>",
                                                           "astrai::split_combine_kernel<astrai::bf16_t, 128>"});
  CHECK(paged_spec(4).instantiations() ==
        std::vector<std::string>{"astrai::paged_decode_kernel<astrai::bf16_t, 128, 16, 4, 96>",
                                 "astrai::split_combine_tokens_kernel<astrai::bf16_t, 128, 4>"});
  CHECK(paged_spec(8, astrai::kFeatureKvE5m2, "sm_80", false, DType::fp16, 64, 1, 6).instantiations() ==
        std::vector<std::string>{"astrai::paged_decode_kernel<astrai::fp16_t, 64, 1, 6, 240>",
                                 "astrai::split_combine_tokens_kernel<astrai::fp16_t, 64, 8>"});
}

TEST_CASE("bad q_len fields are refused by name: q0, q1, q9, two of them, out of order") {
  CHECK_THROWS_WITH_AS(KernelSpec::parse("paged_decode.bf16.hd128.ps16.g4.q9.sm_90a"),
                       doctest::Contains("unexpected field 'q9'"), InvalidArgument);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("paged_decode.bf16.hd128.ps16.g4.q0.sm_90a"),
                       doctest::Contains("unexpected field 'q0'"), InvalidArgument);
  // One token is the plain variant, which has no field.
  CHECK_THROWS_WITH_AS(KernelSpec::parse("paged_decode.bf16.hd128.ps16.g4.q1.sm_90a"),
                       doctest::Contains("unexpected field 'q1'"), InvalidArgument);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("paged_decode.bf16.hd128.ps16.g4.q2.q4.sm_90a"),
                       doctest::Contains("'q4' is a second q_len field"), InvalidArgument);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("paged_decode.bf16.hd128.ps16.g4.q4.q4.sm_90a"),
                       doctest::Contains("'q4' is a second q_len field"), InvalidArgument);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("paged_decode.bf16.hd128.ps16.g4.q4.sink.sm_90a"),
                       doctest::Contains("not the canonical spelling 'paged_decode.bf16.hd128.ps16.g4.sink.q4.sm_90a'"),
                       InvalidArgument);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("paged_decode.bf16.hd128.ps16.g4.nomma.q4.sm_90a"),
                       doctest::Contains("unexpected field 'q4'"), InvalidArgument);
  CHECK(astrai::detail::find_kernel_feature("q9") == nullptr);
  CHECK(astrai::detail::find_kernel_feature("q1") == nullptr);
  REQUIRE(astrai::detail::find_kernel_feature("q3") != nullptr);
  CHECK(astrai::detail::find_kernel_feature("q3")->bit == astrai::decode_q_len_flags(3));
}

TEST_CASE("only paged_decode takes a q_len field; the other families refuse it by name") {
  for (KernelKind kind : {KernelKind::decode, KernelKind::prefill, KernelKind::paged_prefill}) {
    const bool paged = kind == KernelKind::paged_prefill;
    KernelSpec spec = astrai::testing::make_spec(kind, DType::bf16, 128, paged ? 16 : 0, 4, "sm_90a");
    spec.flags = astrai::decode_q_len_flags(4);
    CAPTURE(spec.name());
    CHECK(contains(rejection(spec), std::string(spec.family().name) + " does not support the feature q4 (allowed: "));
    CHECK_FALSE(contains(rejection(spec), "q2..q8"));
  }
  KernelSpec rotary = astrai::testing::rotary_spec(DType::bf16, 64, "sm_90a");
  rotary.flags = astrai::decode_q_len_flags(2);
  CHECK(rejection(rotary) ==
        "rotary_emb.bf16.hd64.q2.sm_90a: rotary_emb does not support the feature q2 (allowed: none)");
  CHECK(astrai::detail::supported_feature_names(astrai::detail::paged_decode_family().supported_flags) ==
        "kv_e4m3, kv_e5m2, swa, cap, sink, alibi, q2..q8");
  CHECK(astrai::detail::feature_names(astrai::kFeatureSink | astrai::decode_q_len_flags(6), "+") == "sink+q6");
}

TEST_CASE("paged_decode checks q_len and refuses the fused append with several tokens, by name") {
  using namespace astrai::testing;
  for (int bad : {0, 9, -1}) {
    CAPTURE(bad);
    check_rejected<PagedDecodeArgs>(valid_paged(), {"q_len", [bad](PagedDecodeArgs& a) { a.q_len = bad; },
                                                    {"q_len " + std::to_string(bad) + " is not valid (allowed: 1..8)"}},
                                    astrai::detail::resolve_paged_decode_args, "paged_decode");
  }
  check_rejected<PagedDecodeArgs>(
      valid_paged(),
      {"new_k",
       [](PagedDecodeArgs& a) {
         a.q_len = 3;
         a.new_k = fake_pointer<const void>(0x70000);
         a.new_v = fake_pointer<const void>(0x71000);
       },
       {"new_k = 0x70000 is set with q_len 3: the fused append writes one token",
        "write the 3 new tokens' K/V into the cache before the call"}},
      astrai::detail::resolve_paged_decode_args, "paged_decode");
  PagedDecodeArgs one = valid_paged();
  one.new_k = fake_pointer<const void>(0x70000);
  one.new_v = fake_pointer<const void>(0x71000);
  CHECK_NOTHROW(astrai::detail::resolve_paged_decode_args(one));
  for (int q_len = 1; q_len <= 8; ++q_len) {
    PagedDecodeArgs args = valid_paged();
    args.q_len = q_len;
    CHECK_NOTHROW(astrai::detail::resolve_paged_decode_args(args));
  }
}

TEST_CASE("multi-token q and out are [batch, q_len, n_heads, head_dim]: contiguous defaults, any one-to-one layout") {
  using namespace astrai::testing;
  PagedDecodeArgs args = valid_paged();  // 8 heads of 128
  args.q_len = 4;
  const PagedDecodeArgs resolved = astrai::detail::resolve_paged_decode_args(args);
  CHECK(resolved.q_stride_head == 128);
  CHECK(resolved.q_stride_seq == 8 * 128);
  CHECK(resolved.q_stride_batch == 4 * 8 * 128);
  CHECK(resolved.out_stride_head == 128);
  CHECK(resolved.out_stride_seq == 8 * 128);
  CHECK(resolved.out_stride_batch == 4 * 8 * 128);
  // One token: the batch stride stays the single-token one.
  const PagedDecodeArgs single = astrai::detail::resolve_paged_decode_args(valid_paged());
  CHECK(single.q_stride_batch == 8 * 128);
  CHECK(single.out_stride_batch == 8 * 128);
  // bhld: [batch, n_heads, q_len, head_dim] passed as strides.
  PagedDecodeArgs bhld = args;
  bhld.q_stride_seq = bhld.out_stride_seq = 128;
  bhld.q_stride_head = bhld.out_stride_head = 4 * 128;
  bhld.q_stride_batch = bhld.out_stride_batch = 8 * 4 * 128;
  CHECK_NOTHROW(astrai::detail::resolve_paged_decode_args(bhld));
  check_rejected<PagedDecodeArgs>(args, {"out_stride_seq", [](PagedDecodeArgs& a) { a.out_stride_seq = 128; },
                                         {"out_stride_seq 128 makes rows overlap (allowed: >= 1024)"}},
                                  astrai::detail::resolve_paged_decode_args, "paged_decode");
  check_rejected<PagedDecodeArgs>(args, {"out_stride_batch", [](PagedDecodeArgs& a) { a.out_stride_batch = 8 * 128; },
                                         {"out_stride_batch 1024 makes rows overlap (allowed: >= 4096)"}},
                                  astrai::detail::resolve_paged_decode_args, "paged_decode");
  check_rejected<PagedDecodeArgs>(args, {"q_stride_seq", [](PagedDecodeArgs& a) { a.q_stride_seq = 12; },
                                         {"q_stride_seq 12 is not a multiple of 8 elements"}},
                                  astrai::detail::resolve_paged_decode_args, "paged_decode");
  check_rejected<PagedDecodeArgs>(args, {"q_stride_head", [](PagedDecodeArgs& a) { a.q_stride_head = 64; },
                                         {"q_stride_head 64 makes rows overlap (allowed: >= 128)"}},
                                  astrai::detail::resolve_paged_decode_args, "paged_decode");
  // Query tokens may share rows of q (inputs are only read), as a batch may.
  PagedDecodeArgs shared = args;
  shared.q_stride_seq = 8 * 128;
  shared.q_stride_batch = 8 * 128;
  CHECK_NOTHROW(astrai::detail::resolve_paged_decode_args(shared));
}

TEST_CASE("the split plan and workspace cover q_len rows per query head; a window's span grows by q_len - 1") {
  using astrai::detail::decode_span_tokens;
  CHECK(decode_span_tokens(8192, -1, 4) == 8192);
  CHECK(decode_span_tokens(8192, 127, 4) == decode_span_tokens(8192, 127) + 3);
  CHECK(decode_span_tokens(100, 4096, 4) == 100);
  astrai::PagedDecodeArgs args = astrai::testing::valid_paged();  // group 4: 4 rows, 16 rows at q_len 4
  args.batch = 1;
  args.max_pages_per_seq = 4096;
  args.num_pages = 8192;
  const std::size_t one = astrai::paged_decode_workspace_bytes(args, 132);
  args.q_len = 4;  // still one head tile per KV head: the same plan, four times the rows
  const std::size_t four = astrai::paged_decode_workspace_bytes(args, 132);
  REQUIRE(one > 0);
  CHECK(four > 3 * one);
  CHECK(four <= 4 * one);
}

}  // TEST_SUITE

namespace {

using astrai::detail::nvrtc_compile;

CompileResult compile(const KernelSpec& spec) {
  const CompileResult result = nvrtc_compile(astrai::detail::compile_request(spec), true);
  CHECK(result.lowered_names.size() == 2);
  CHECK(contains(result.ptx, ".target " + spec.arch));
  CHECK_FALSE(contains(result.log, "warning"));
  if (spec.uses_mma()) {
    CHECK(contains(result.ptx, "mma.sync.aligned.m16n8k16"));
    CHECK(contains(result.ptx, "ldmatrix"));
  } else {
    CHECK_FALSE(contains(result.ptx, "mma.sync"));
    CHECK_FALSE(contains(result.ptx, "ldmatrix"));
  }
  return result;
}

struct Target {
  const char* arch;
  bool no_mma;
};
const Target kTargets[] = {{"sm_75", false}, {"sm_80", false}, {"sm_89", false}, {"sm_90a", false}, {"sm_90a", true}};

}  // namespace

TEST_SUITE("multi_token") {

TEST_CASE("every .q2 .. .q8 variant compiles for every arch and .nomma, without warnings") {
  // Shapes vary with q_len: one head tile (g4 x q4), two (g8 x q4), a partial second (g6 x q3),
  // three (g20 x q2), one head of eight tokens (g1 x q8), odd head dims and both page sizes.
  struct Shape {
    int q_len;
    DType dtype;
    int head_dim;
    int page_size;
    int group;
  };
  const Shape kShapes[] = {{2, DType::fp16, 64, 1, 20}, {3, DType::bf16, 128, 16, 6}, {4, DType::bf16, 128, 16, 4},
                           {5, DType::fp16, 80, 16, 1}, {6, DType::bf16, 256, 1, 2},  {7, DType::fp16, 96, 8, 3},
                           {8, DType::bf16, 128, 1, 8}};
  int i = 0;
  for (const Target& target : kTargets) {
    const KernelSpec plain = paged_spec(1, 0, target.arch, target.no_mma);
    const CompileResult plain_result = compile(plain);
    for (const Shape& shape : kShapes) {
      // Every q_len on every target; the shapes rotate over the targets.
      const Shape& other = kShapes[(i++) % 7];
      const KernelSpec spec = paged_spec(shape.q_len, 0, target.arch, target.no_mma, other.dtype, other.head_dim,
                                         other.page_size, other.group);
      CAPTURE(spec.name());
      CHECK_NOTHROW(spec.validate());
      const CompileResult result = compile(spec);
      CHECK(contains(result.lowered_names.at(1), "split_combine_tokens_kernel"));
    }
    // The same shape as the plain variant compiles different code (the per-row limits).
    const CompileResult q4 = compile(paged_spec(4, 0, target.arch, target.no_mma));
    CHECK(q4.ptx != plain_result.ptx);
  }
}

TEST_CASE("multi-token variants compile with an FP8 cache and with the window, soft-cap and sinks") {
  const std::uint32_t kExtras[] = {astrai::kFeatureKvE4m3, astrai::kFeatureKvE5m2 | astrai::kFeatureWindow,
                                   astrai::kFeatureWindow | astrai::kFeatureSoftCap | astrai::kFeatureSink,
                                   astrai::kFeatureKvE4m3 | astrai::kFeatureWindow | astrai::kFeatureSink,
                                   astrai::kFeatureKvE5m2 | astrai::kFeatureSoftCap};
  int i = 0;
  for (const Target& target : kTargets) {
    const std::uint32_t extra = kExtras[i];
    const KernelSpec spec = paged_spec(2 + i, extra, target.arch, target.no_mma, i % 2 ? DType::fp16 : DType::bf16,
                                       i % 2 ? 64 : 128, i % 2 ? 1 : 16, i == 1 ? 8 : 4);
    ++i;
    CAPTURE(spec.name());
    CHECK_NOTHROW(spec.validate());
    const CompileResult result = compile(spec);
    if (extra & (astrai::kFeatureKvE4m3 | astrai::kFeatureKvE5m2)) {
      const bool native = astrai::detail::arch_number(spec.arch) >= 89;
      if (extra & astrai::kFeatureKvE4m3) CHECK(contains(result.ptx, "cvt.rn.f16x2.e4m3x2") == native);
      else CHECK(contains(result.ptx, "prmt.b32"));
    }
  }
}

TEST_CASE("a plain variant compiles no multi-token code: its combine kernel and params are the single-token ones") {
  // The plain kernels compile to the same instructions as before the multi-token field (the
  // attention kernel's params only grew at the end; scripts/bench/compare_plain_ptx.sh compares two
  // builds). Here: the q_len field is all that selects the multi-token code.
  for (const Target& target : {kTargets[1], kTargets[4]}) {
    CAPTURE(target.arch);
    const CompileResult plain = compile(paged_spec(1, 0, target.arch, target.no_mma));
    CHECK(contains(plain.lowered_names.at(1), "split_combine_kernel"));
    CHECK_FALSE(contains(plain.ptx, "split_combine_tokens_kernel"));
    CHECK(contains(plain.ptx, fmt::format("{}_param_0[{}]", plain.lowered_names.at(1), sizeof(astrai::CombineParams))));
    const CompileResult q4 = compile(paged_spec(4, 0, target.arch, target.no_mma));
    CHECK(contains(q4.ptx, fmt::format("{}_param_0[{}]", q4.lowered_names.at(1), sizeof(astrai::TokenCombineParams))));
    for (const CompileResult* result : {&plain, &q4})
      CHECK(contains(result->ptx, fmt::format("{}_param_0[{}]", result->lowered_names.at(0),
                                              sizeof(astrai::PagedDecodeParams))));
  }
}

}  // TEST_SUITE
