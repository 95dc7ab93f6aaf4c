// The serving features of the attention families (kernel_src/kernel_params.h feature bits):
// variant names, what each family accepts, the checks of their arguments, the strict hint.
// Their compiles are in test_kernel_compile.cpp.
#include <doctest/doctest.h>

#include <string>

#include "kernel_src/kernel_params.h"
#include "runtime/families/attention_features.hpp"
#include "runtime/kernel_spec.hpp"
#include "tests/support/specs.hpp"
#include "tests/unit/validation_support.hpp"

using astrai::DType;
using astrai::InvalidArgument;
using astrai::detail::KernelKind;
using astrai::detail::KernelSpec;
using astrai::testing::rejection;
using astrai::testing::make_spec;

namespace {

KernelSpec with_flags(KernelSpec spec, std::uint32_t flags) {
  spec.flags = flags;
  return spec;
}

const KernelKind kAttentionKinds[] = {KernelKind::paged_decode, KernelKind::decode, KernelKind::prefill,
                                      KernelKind::paged_prefill};

KernelSpec attention_spec(KernelKind kind, const std::string& arch = "sm_90a", bool no_mma = false) {
  const bool paged = kind == KernelKind::paged_decode || kind == KernelKind::paged_prefill;
  return make_spec(kind, DType::bf16, 128, paged ? 16 : 0, 4, arch, no_mma);
}

}  // namespace

TEST_SUITE("features") {

TEST_CASE("a feature is a named field of the variant name, before .nomma and the arch") {
  const KernelSpec cap = with_flags(attention_spec(KernelKind::paged_decode), astrai::kFeatureSoftCap);
  CHECK(cap.name() == "paged_decode.bf16.hd128.ps16.g4.cap.sm_90a");
  CHECK(with_flags(attention_spec(KernelKind::prefill, "sm_89", true), astrai::kFeatureSoftCap).name() ==
        "prefill.bf16.hd128.g4.cap.nomma.sm_89");
  CHECK(with_flags(attention_spec(KernelKind::decode), astrai::kFeatureSoftCap).name() ==
        "decode.bf16.hd128.g4.cap.sm_90a");
  CHECK(KernelSpec::parse(cap.name()) == cap);
  CHECK(KernelSpec::parse(cap.name()).flags == astrai::kFeatureSoftCap);
  // Bits no feature names stay distinct and parseable (and are refused by validate()).
  CHECK(with_flags(attention_spec(KernelKind::paged_decode), 0x800 | astrai::kFeatureSoftCap).name() ==
        "paged_decode.bf16.hd128.ps16.g4.cap.f800.sm_90a");
}

TEST_CASE("several features appear in the fixed order of kernel_features()") {
  const KernelSpec both = with_flags(attention_spec(KernelKind::paged_prefill),
                                     astrai::kFeatureSoftCap | astrai::kFeatureSink);
  CHECK(both.name() == "paged_prefill.bf16.hd128.ps16.g4.cap.sink.sm_90a");
  CHECK(KernelSpec::parse(both.name()) == both);
  CHECK(with_flags(attention_spec(KernelKind::decode), astrai::kFeatureSink).name() ==
        "decode.bf16.hd128.g4.sink.sm_90a");
  CHECK_THROWS_WITH_AS(KernelSpec::parse("paged_prefill.bf16.hd128.ps16.g4.sink.cap.sm_90a"),
                       doctest::Contains("not the canonical spelling "
                                         "'paged_prefill.bf16.hd128.ps16.g4.cap.sink.sm_90a'"),
                       InvalidArgument);
  CHECK(rejection(with_flags(astrai::testing::rotary_spec(DType::bf16, 64, "sm_90a"),
                             astrai::kFeatureSoftCap | astrai::kFeatureSink)) ==
        "rotary_emb.bf16.hd64.cap.sink.sm_90a: rotary_emb does not support the features cap, sink (allowed: none)");
  CHECK(with_flags(attention_spec(KernelKind::paged_decode), astrai::kFeatureSink | astrai::kFeatureSoftCap)
            .warm_command()
            .find(" --features cap+sink") != std::string::npos);
}

TEST_CASE("the window is the first feature field, and every family takes all three") {
  const std::uint32_t all = astrai::kFeatureWindow | astrai::kFeatureSoftCap | astrai::kFeatureSink;
  for (KernelKind kind : kAttentionKinds) {
    const KernelSpec spec = with_flags(attention_spec(kind, "sm_89", true), all);
    CAPTURE(spec.name());
    CHECK(spec.name().find(".swa.cap.sink.nomma.sm_89") != std::string::npos);
    CHECK_NOTHROW(spec.validate());
    CHECK(KernelSpec::parse(spec.name()) == spec);
    CHECK(spec.warm_command().find(" --features swa+cap+sink --no-mma") != std::string::npos);
  }
  CHECK(with_flags(attention_spec(KernelKind::paged_decode), astrai::kFeatureWindow | astrai::kFeatureSink).name() ==
        "paged_decode.bf16.hd128.ps16.g4.swa.sink.sm_90a");
}

TEST_CASE("every attention call checks window_left; prefill calls need a causal limit for it") {
  using namespace astrai::testing;
  const char* kRange = "window_left -2 is not valid (allowed: -1 for no window, or >= 0)";
  check_rejected<PagedDecodeArgs>(valid_paged(),
                                  {"window_left", [](PagedDecodeArgs& a) { a.window_left = -2; }, {kRange}},
                                  astrai::detail::resolve_paged_decode_args, "paged_decode");
  check_rejected<DecodeArgs>(valid_decode(), {"window_left", [](DecodeArgs& a) { a.window_left = -2; }, {kRange}},
                             astrai::detail::resolve_decode_args, "decode");
  check_rejected<PrefillArgs>(valid_prefill(), {"window_left", [](PrefillArgs& a) { a.window_left = -2; }, {kRange}},
                              astrai::detail::resolve_prefill_args, "prefill");
  check_rejected<PagedPrefillArgs>(valid_paged_prefill(),
                                   {"window_left", [](PagedPrefillArgs& a) { a.window_left = -2; }, {kRange}},
                                   astrai::detail::resolve_paged_prefill_args, "paged_prefill");
  check_rejected<PrefillArgs>(valid_prefill(),
                              {"window_left", [](PrefillArgs& a) { a.window_left = 64; a.causal_offset = -1; },
                               {"window_left 64 needs query positions: set causal_offset >= 0"}},
                              astrai::detail::resolve_prefill_args, "prefill");
  check_rejected<PagedPrefillArgs>(valid_paged_prefill(),
                                   {"window_left", [](PagedPrefillArgs& a) { a.window_left = 0; a.causal = false; },
                                    {"window_left 0 needs query positions: set causal = true"}},
                                   astrai::detail::resolve_paged_prefill_args, "paged_prefill");
  DecodeArgs decode = valid_decode();
  decode.window_left = 0;
  decode.causal_offset = -1;  // the query sits at kv_len - 1
  CHECK_NOTHROW(astrai::detail::resolve_decode_args(decode));
  PrefillArgs prefill = valid_prefill();
  prefill.window_left = 4096;
  CHECK_NOTHROW(astrai::detail::resolve_prefill_args(prefill));
}

TEST_CASE("a windowed decode plans its splits over the window, so its workspace follows the window") {
  using astrai::detail::decode_span_tokens;
  CHECK(decode_span_tokens(8192, -1) == 8192);
  CHECK(decode_span_tokens(8192, 127) == 127 + 1 + astrai::kDecodeBlockTokens - 1);
  CHECK(decode_span_tokens(8192, 0) == astrai::kDecodeBlockTokens);
  CHECK(decode_span_tokens(100, 4096) == 100);
  astrai::PagedDecodeArgs args = astrai::testing::valid_paged();
  args.batch = 1;
  args.max_pages_per_seq = 4096;  // 65536 tokens
  args.num_pages = 8192;
  const std::size_t full = astrai::paged_decode_workspace_bytes(args, 132);
  args.window_left = 255;
  const std::size_t windowed = astrai::paged_decode_workspace_bytes(args, 132);
  CHECK(full > 0);
  CHECK(windowed < full);
}

TEST_CASE("every attention call checks that sinks is 4-byte aligned") {
  using namespace astrai::testing;
  const auto* bad = fake_pointer<const float>(0x70002);
  const char* kExpected = "sinks = 0x70002 is not 4-byte aligned";
  check_rejected<PagedDecodeArgs>(valid_paged(), {"sinks", [bad](PagedDecodeArgs& a) { a.sinks = bad; }, {kExpected}},
                                  astrai::detail::resolve_paged_decode_args, "paged_decode");
  check_rejected<DecodeArgs>(valid_decode(), {"sinks", [bad](DecodeArgs& a) { a.sinks = bad; }, {kExpected}},
                             astrai::detail::resolve_decode_args, "decode");
  check_rejected<PrefillArgs>(valid_prefill(), {"sinks", [bad](PrefillArgs& a) { a.sinks = bad; }, {kExpected}},
                              astrai::detail::resolve_prefill_args, "prefill");
  check_rejected<PagedPrefillArgs>(valid_paged_prefill(),
                                   {"sinks", [bad](PagedPrefillArgs& a) { a.sinks = bad; }, {kExpected}},
                                   astrai::detail::resolve_paged_prefill_args, "paged_prefill");
  PagedDecodeArgs paged = valid_paged();
  paged.sinks = fake_pointer<const float>(0x70004);
  CHECK_NOTHROW(astrai::detail::resolve_paged_decode_args(paged));
}

TEST_CASE("a plain variant keeps its name and instantiation (no feature field, flags 0)") {
  CHECK(attention_spec(KernelKind::paged_decode).name() == "paged_decode.bf16.hd128.ps16.g4.sm_90a");
  CHECK(attention_spec(KernelKind::paged_decode).instantiations().front() ==
        "astrai::paged_decode_kernel<astrai::bf16_t, 128, 16, 4, 0>");
  CHECK(attention_spec(KernelKind::prefill).instantiations().front() ==
        "astrai::prefill_kernel<astrai::bf16_t, 128, 0, 4, 0>");
  CHECK(with_flags(attention_spec(KernelKind::paged_prefill), astrai::kFeatureSoftCap).instantiations().front() ==
        "astrai::prefill_kernel<astrai::bf16_t, 128, 16, 4, 1>");
}

TEST_CASE("feature names that are repeated, misordered or unknown are refused") {
  CHECK_THROWS_WITH_AS(KernelSpec::parse("paged_decode.bf16.hd128.ps16.g4.cap.cap.sm_90a"),
                       doctest::Contains("feature 'cap' given twice"), InvalidArgument);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("paged_decode.bf16.hd128.ps16.g4.capped.sm_90a"),
                       doctest::Contains("unexpected field 'capped'"), InvalidArgument);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("paged_decode.bf16.hd128.ps16.g4.nomma.cap.sm_90a"),
                       doctest::Contains("unexpected field 'cap'"), InvalidArgument);
  CHECK_THROWS_WITH_AS(KernelSpec::parse("paged_decode.bf16.hd128.ps16.g4.f1.sm_90a"),
                       doctest::Contains("not the canonical spelling 'paged_decode.bf16.hd128.ps16.g4.cap.sm_90a'"),
                       InvalidArgument);
}

TEST_CASE("every attention family takes the soft-cap, sinks and window; the Hopper kernels serve them, rotary_emb "
          "refuses them by name") {
  for (KernelKind kind : kAttentionKinds) {
    const KernelSpec spec = with_flags(attention_spec(kind), astrai::kFeatureSoftCap | astrai::kFeatureSink);
    CAPTURE(spec.name());
    CHECK_NOTHROW(spec.validate());
    CHECK(astrai::detail::hopper_serves(spec));
    KernelSpec hopper = with_flags(spec, astrai::kFeatureSoftCap | astrai::kFeatureSink | astrai::kFeatureWindow);
    hopper.hopper = true;
    const bool prefill = kind == KernelKind::prefill || kind == KernelKind::paged_prefill;
    CHECK(hopper.name().find(prefill ? ".swa.cap.sink.wgmma." : ".swa.cap.sink.tma.") != std::string::npos);
    CHECK_NOTHROW(hopper.validate());
  }
  const KernelSpec rotary = with_flags(astrai::testing::rotary_spec(DType::bf16, 64, "sm_90a"),
                                       astrai::kFeatureSoftCap);
  CHECK(rejection(rotary) ==
        "rotary_emb.bf16.hd64.cap.sm_90a: rotary_emb does not support the feature cap (allowed: none)");
  CHECK(rejection(with_flags(attention_spec(KernelKind::decode), 0x800)) ==
        "decode.bf16.hd128.g4.f800.sm_90a: flags 0x800 name no feature (allowed: kv_e4m3, kv_e5m2, swa, cap, sink, alibi)");
}

TEST_CASE("the strict hint's warm command selects the features") {
  const KernelSpec spec = with_flags(attention_spec(KernelKind::paged_prefill), astrai::kFeatureSoftCap);
  CHECK(spec.warm_command() ==
        "astrai-jit warm --arch sm_90a --kernels paged_prefill --dtypes bf16 --head-dims 128 --page-sizes 16 "
        "--group-sizes 4 --features cap --no-hopper");
}

TEST_CASE("every attention call checks logit_cap: finite and >= 0") {
  using namespace astrai::testing;
  const char* kExpected = "is not valid (allowed: 0 for no soft-cap, or a finite value > 0)";
  for (float bad : {-1.f, kNan, kInf, -kInf}) {
    CAPTURE(bad);
    check_rejected<PagedDecodeArgs>(valid_paged(), {"logit_cap", [bad](PagedDecodeArgs& a) { a.logit_cap = bad; },
                                                    {kExpected}},
                                    astrai::detail::resolve_paged_decode_args, "paged_decode");
    check_rejected<DecodeArgs>(valid_decode(), {"logit_cap", [bad](DecodeArgs& a) { a.logit_cap = bad; }, {kExpected}},
                               astrai::detail::resolve_decode_args, "decode");
    check_rejected<PrefillArgs>(valid_prefill(), {"logit_cap", [bad](PrefillArgs& a) { a.logit_cap = bad; },
                                                  {kExpected}},
                                astrai::detail::resolve_prefill_args, "prefill");
    check_rejected<PagedPrefillArgs>(valid_paged_prefill(),
                                     {"logit_cap", [bad](PagedPrefillArgs& a) { a.logit_cap = bad; }, {kExpected}},
                                     astrai::detail::resolve_paged_prefill_args, "paged_prefill");
  }
  PagedDecodeArgs paged = valid_paged();
  paged.logit_cap = 30.f;
  CHECK_NOTHROW(astrai::detail::resolve_paged_decode_args(paged));
  PrefillArgs prefill = valid_prefill();
  prefill.logit_cap = 50.f;
  CHECK_NOTHROW(astrai::detail::resolve_prefill_args(prefill));
}

TEST_CASE("an FP8 KV cache is the first feature field: .kv_e4m3 or .kv_e5m2, names parse back") {
  const KernelSpec e4m3 = with_flags(attention_spec(KernelKind::paged_decode), astrai::kFeatureKvE4m3);
  CHECK(e4m3.name() == "paged_decode.bf16.hd128.ps16.g4.kv_e4m3.sm_90a");
  CHECK(KernelSpec::parse(e4m3.name()) == e4m3);
  // The direct FP8 path with bf16 Q at head dim 128 runs the entry held to 4 CTAs an SM; fp16,
  // other head dims and the CUDA-core path the plain one.
  CHECK(e4m3.instantiations().front() == "astrai::paged_decode_kernel_4ctas<astrai::bf16_t, 128, 16, 4, 8>");
  KernelSpec fp16 = e4m3;
  fp16.dtype = astrai::DType::fp16;
  CHECK(fp16.instantiations().front() == "astrai::paged_decode_kernel<astrai::fp16_t, 128, 16, 4, 8>");
  KernelSpec hd64 = e4m3;
  hd64.head_dim = 64;
  CHECK(hd64.instantiations().front() == "astrai::paged_decode_kernel<astrai::bf16_t, 64, 16, 4, 8>");
  const KernelSpec cores = with_flags(attention_spec(KernelKind::paged_decode, "sm_89", true), astrai::kFeatureKvE4m3);
  CHECK(cores.instantiations().front() == "astrai::paged_decode_kernel<astrai::bf16_t, 128, 16, 4, 8>");
  const std::uint32_t all = astrai::kFeatureKvE5m2 | astrai::kFeatureWindow | astrai::kFeatureSoftCap |
                            astrai::kFeatureSink;
  for (KernelKind kind : {KernelKind::paged_decode, KernelKind::decode, KernelKind::paged_prefill}) {
    const KernelSpec spec = with_flags(attention_spec(kind, "sm_89", true), all);
    CAPTURE(spec.name());
    CHECK(spec.name().find(".kv_e5m2.swa.cap.sink.nomma.sm_89") != std::string::npos);
    CHECK_NOTHROW(spec.validate());
    CHECK(KernelSpec::parse(spec.name()) == spec);
    CHECK(spec.warm_command().find(" --features kv_e5m2+swa+cap+sink --no-mma") != std::string::npos);
  }
  CHECK(with_flags(attention_spec(KernelKind::decode, "sm_80"), astrai::kFeatureKvE4m3).name() ==
        "decode.bf16.hd128.g4.kv_e4m3.sm_80");
  CHECK_THROWS_WITH_AS(KernelSpec::parse("paged_decode.bf16.hd128.ps16.g4.swa.kv_e4m3.sm_90a"),
                       doctest::Contains("not the canonical spelling "
                                         "'paged_decode.bf16.hd128.ps16.g4.kv_e4m3.swa.sm_90a'"),
                       InvalidArgument);
}

TEST_CASE("kv_e4m3 with kv_e5m2 is refused by name, as a spec, a variant name and a warm set") {
  const KernelSpec both =
      with_flags(attention_spec(KernelKind::paged_decode), astrai::kFeatureKvE4m3 | astrai::kFeatureKvE5m2);
  CHECK(both.name() == "paged_decode.bf16.hd128.ps16.g4.kv_e4m3.kv_e5m2.sm_90a");
  CHECK(rejection(both) == "paged_decode.bf16.hd128.ps16.g4.kv_e4m3.kv_e5m2.sm_90a: the features kv_e4m3 and "
                           "kv_e5m2 exclude each other (a KV cache has one element type)");
  CHECK_THROWS_WITH_AS(KernelSpec::parse("paged_prefill.bf16.hd128.ps16.g4.kv_e4m3.kv_e5m2.sm_90a"),
                       doctest::Contains("kv_e4m3 and kv_e5m2 exclude each other"), InvalidArgument);
  CHECK(astrai::detail::feature_conflict(astrai::kFeatureKvE4m3 | astrai::kFeatureSink).empty());
}

TEST_CASE("prefill and rotary_emb refuse an FP8 cache by name; the wgmma paged prefill serves it at hd128") {
  CHECK(rejection(with_flags(attention_spec(KernelKind::prefill), astrai::kFeatureKvE4m3)) ==
        "prefill.bf16.hd128.g4.kv_e4m3.sm_90a: prefill does not support the feature kv_e4m3 (allowed: swa, cap, sink, qkv_e4m3, p_fp16, alibi)");
  CHECK(rejection(with_flags(astrai::testing::rotary_spec(DType::bf16, 64, "sm_90a"), astrai::kFeatureKvE5m2)) ==
        "rotary_emb.bf16.hd64.kv_e5m2.sm_90a: rotary_emb does not support the feature kv_e5m2 (allowed: none)");
  KernelSpec wgmma = with_flags(attention_spec(KernelKind::paged_prefill), astrai::kFeatureKvE4m3);
  CHECK(astrai::detail::hopper_serves(wgmma));
  CHECK(wgmma.warm_command().find("--no-hopper") != std::string::npos);
  wgmma.hopper = true;
  CHECK(rejection(wgmma).empty());
  // One tiling: the byte rings leave no room for the wide tiles' Q.
  wgmma.wide = true;
  CHECK(rejection(wgmma) == "paged_prefill.bf16.hd128.ps16.g4.kv_e4m3.wgmma.wide.sm_90a: paged_prefill has no "
                            "wide tiling at head_dim 128 with an FP8 cache");
  wgmma.wide = false;
  // Other head dims take the portable kernel, by name.
  wgmma.head_dim = 64;
  CHECK(rejection(wgmma) == "paged_prefill.bf16.hd64.ps16.g4.kv_e4m3.wgmma.sm_90a: the sm_90a implementation does "
                            "not serve it: an FP8 KV cache is served at head_dim 128 only");
}

TEST_CASE("an FP8 variant needs less shared memory than the plain one, and fits 99 KB where the plain one does") {
  for (int head_dim = 32; head_dim <= 256; head_dim += 16) {
    CAPTURE(head_dim);
    CHECK(astrai::paged_decode_smem_bytes(head_dim, true) < astrai::paged_decode_smem_bytes(head_dim));
    CHECK(astrai::prefill_smem_bytes(head_dim, true) < astrai::prefill_smem_bytes(head_dim));
    CHECK(astrai::prefill_smem_bytes(head_dim, true) <= 99 * 1024);
  }
}

namespace {

template <typename Args>
void set_fp8(Args& a, astrai::KvDType kv_dtype = astrai::KvDType::e4m3) {
  a.kv_dtype = kv_dtype;
  a.k_scale = astrai::testing::fake_pointer<const float>(0x71000);
  a.v_scale = astrai::testing::fake_pointer<const float>(0x72000);
}

// The FP8 argument checks every call with an FP8 cache makes; `stride` names a K/V stride
// whose value 136 (a padded head) is refused for FP8.
template <typename Args, typename Resolve>
void check_fp8_arguments(const Args& valid, Resolve resolve, const char* call, std::int64_t Args::*stride,
                         const char* stride_name) {
  using astrai::KvDType;
  using astrai::testing::check_rejected;
  using astrai::testing::fake_pointer;
  Args fp8 = valid;
  set_fp8(fp8);
  CHECK_NOTHROW(resolve(fp8));
  fp8.kv_dtype = KvDType::e5m2;
  fp8.kv_scale_per_head = true;
  CHECK_NOTHROW(resolve(fp8));
  check_rejected<Args>(valid, {"kv_dtype", [](Args& a) { a.kv_dtype = static_cast<KvDType>(7); },
                               {"kv_dtype 7 is not valid (allowed: same, e4m3, e5m2)"}},
                       resolve, call);
  check_rejected<Args>(valid, {"k_scale", [](Args& a) { set_fp8(a); a.k_scale = nullptr; },
                               {"k_scale is null (a device pointer is required)"}},
                       resolve, call);
  check_rejected<Args>(valid, {"v_scale", [](Args& a) { set_fp8(a, KvDType::e5m2); a.v_scale = nullptr; },
                               {"v_scale is null"}},
                       resolve, call);
  check_rejected<Args>(valid, {"v_scale", [](Args& a) { set_fp8(a); a.v_scale = fake_pointer<const float>(0x72002); },
                               {"v_scale = 0x72002 is not 4-byte aligned"}},
                       resolve, call);
  check_rejected<Args>(valid, {"k_scale", [](Args& a) { a.k_scale = fake_pointer<const float>(0x71000); },
                               {"k_scale = 0x71000 is set but kv_dtype is same"}},
                       resolve, call);
  check_rejected<Args>(valid, {"kv_scale_per_head", [](Args& a) { a.kv_scale_per_head = true; },
                               {"kv_scale_per_head is set but kv_dtype is same"}},
                       resolve, call);
  check_rejected<Args>(valid, {stride_name, [stride](Args& a) { set_fp8(a); a.*stride = 136; },
                               {std::string(stride_name) + " 136 is not a multiple of 16 elements (an FP8 cache's "
                                                           "rows must stay 16-byte aligned)"}},
                       resolve, call);
  Args padded = valid;  // the same stride is fine for a 16-bit cache
  padded.*stride = 136;
  CHECK_NOTHROW(resolve(padded));
}

}  // namespace

TEST_CASE("paged_decode, decode and paged_prefill check an FP8 cache's type, scales and strides") {
  using namespace astrai::testing;
  check_fp8_arguments(valid_paged(), astrai::detail::resolve_paged_decode_args, "paged_decode",
                      &PagedDecodeArgs::k_stride_head, "k_stride_head");
  check_fp8_arguments(valid_decode(), astrai::detail::resolve_decode_args, "decode", &DecodeArgs::v_stride_head,
                      "v_stride_head");
  check_fp8_arguments(valid_paged_prefill(), astrai::detail::resolve_paged_prefill_args, "paged_prefill",
                      &PagedPrefillArgs::k_stride_head, "k_stride_head");
  PagedDecodeArgs token = valid_paged();
  set_fp8(token);
  token.k_stride_token = 2 * 136;  // a multiple of 16, but its heads are not
  token.k_stride_head = 136;
  CHECK_THROWS_WITH_AS(astrai::detail::resolve_paged_decode_args(token),
                       doctest::Contains("k_stride_head 136 is not a multiple of 16"), InvalidArgument);
}

TEST_CASE("an FP8 call asks for its variant bit and carries its scales") {
  using astrai::KvDType;
  const float* k = astrai::testing::fake_pointer<const float>(0x71000);
  const float* v = astrai::testing::fake_pointer<const float>(0x72000);
  astrai::AttentionOptions options;
  const auto plain = astrai::detail::attention_features(options, 0.125f);
  CHECK(plain.flags == 0);
  options.kv_dtype = KvDType::e4m3;
  options.k_scale = k;
  options.v_scale = v;
  options.kv_scale_per_head = true;
  options.window_left = 64;
  const auto e4m3 = astrai::detail::attention_features(options, 0.125f);
  CHECK(e4m3.flags == (astrai::kFeatureKvE4m3 | astrai::kFeatureWindow));
  CHECK(e4m3.values.k_scale == k);
  CHECK(e4m3.values.v_scale == v);
  CHECK(e4m3.values.kv_scale_stride == 1);
  CHECK(e4m3.values.window_left == 64);
  options.kv_dtype = KvDType::e5m2;
  options.kv_scale_per_head = false;
  options.window_left = -1;
  const auto e5m2 = astrai::detail::attention_features(options, 0.125f);
  CHECK(e5m2.flags == astrai::kFeatureKvE5m2);
  CHECK(e5m2.values.kv_scale_stride == 0);
  CHECK(std::string(astrai::kv_dtype_name(KvDType::e5m2)) == "e5m2");
}

TEST_CASE("the options table: names the variant fields, sets the families' bits, refuses unserved options by name") {
  using astrai::detail::attention_option_flags;
  using astrai::detail::KernelKind;
  // Each option's bit is a distinct single bit, and its name is the variant field of that bit.
  std::uint32_t seen = 0;
  for (const auto& option : astrai::detail::attention_options()) {
    CAPTURE(option.name);
    CHECK((option.bit & (option.bit - 1)) == 0u);
    CHECK((seen & option.bit) == 0u);
    seen |= option.bit;
    const auto* feature = astrai::detail::find_kernel_feature(option.name);
    REQUIRE(feature != nullptr);
    CHECK(feature->bit == option.bit);
  }
  // The families' supported bits are the table's (paged_decode adds its q_len field).
  CHECK(astrai::detail::kernel_family(KernelKind::prefill).supported_flags == attention_option_flags(KernelKind::prefill));
  CHECK(astrai::detail::kernel_family(KernelKind::paged_decode).supported_flags ==
        (attention_option_flags(KernelKind::paged_decode) | astrai::kFeatureQLenField));
  CHECK((attention_option_flags(KernelKind::prefill) & astrai::kFeatureKvE4m3) == 0u);
  CHECK((attention_option_flags(KernelKind::paged_prefill) & astrai::kFeatureKvE4m3) != 0u);
  CHECK(attention_option_flags(KernelKind::rotary_emb) == 0u);

  // Contiguous prefill reads the model's own K and V: an FP8 cache is refused by name.
  astrai::AttentionOptions fp8;
  fp8.kv_dtype = astrai::KvDType::e4m3;
  fp8.k_scale = astrai::testing::fake_pointer<const float>(0x71000);
  fp8.v_scale = astrai::testing::fake_pointer<const float>(0x72000);
  CHECK_THROWS_WITH_AS(astrai::detail::check_attention_options("prefill", fp8, {KernelKind::prefill}),
                       doctest::Contains("kv_dtype e4m3 is not served by prefill"), InvalidArgument);
  CHECK_NOTHROW(astrai::detail::check_attention_options("paged_prefill", fp8, {KernelKind::paged_prefill}));
  astrai::AttentionOptions window;
  window.window_left = 8;
  CHECK_THROWS_WITH_AS(
      astrai::detail::check_attention_options("prefill", window, {KernelKind::prefill, false, "causal_offset >= 0"}),
      doctest::Contains("window_left 8 needs query positions: set causal_offset >= 0"), InvalidArgument);
}

TEST_CASE("ALiBi: a variant field, its checks, and the plan's implementations") {
  using astrai::detail::KernelKind;
  const KernelSpec spec = KernelSpec::parse("paged_decode.bf16.hd128.ps16.g4.swa.sink.alibi.sm_89");
  CHECK(spec.flags == (astrai::kFeatureWindow | astrai::kFeatureSink | astrai::kFeatureAlibi));
  CHECK_THROWS_AS(KernelSpec::parse("paged_decode.bf16.hd128.ps16.g4.alibi.swa.sm_89"), InvalidArgument);
  const float* slopes = astrai::testing::fake_pointer<const float>(0x73000);
  astrai::AttentionOptions alibi;
  alibi.alibi_slopes = slopes;
  const auto request = astrai::detail::attention_features(alibi, 0.125f);
  CHECK(request.flags == astrai::kFeatureAlibi);
  CHECK(request.values.alibi_slopes == slopes);
  // It needs query positions, as a window does; a misaligned pointer is refused by name.
  CHECK_THROWS_WITH_AS(
      astrai::detail::check_attention_options("prefill", alibi, {KernelKind::prefill, false, "causal_offset >= 0"}),
      doctest::Contains("needs query positions: set causal_offset >= 0"), InvalidArgument);
  astrai::AttentionOptions misaligned;
  misaligned.alibi_slopes = astrai::testing::fake_pointer<const float>(0x73002);
  CHECK_THROWS_WITH_AS(astrai::detail::check_attention_options("decode", misaligned, {KernelKind::decode}),
                       doctest::Contains("alibi_slopes"), InvalidArgument);
  // Contiguous decode: the query must sit at a key position.
  astrai::DecodeArgs decode = astrai::testing::valid_decode();
  decode.alibi_slopes = slopes;
  decode.causal_offset = decode.kv_len;
  CHECK_THROWS_WITH_AS(astrai::validate_args(decode), doctest::Contains("past kv_len"), InvalidArgument);
  decode.causal_offset = decode.kv_len - 1;
  CHECK_NOTHROW(astrai::validate_args(decode));
}

}  // TEST_SUITE
