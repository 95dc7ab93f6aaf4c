// MLA decode on the CPU: its argument checks (each bad value named), its plan (the tiling by the
// target's shared memory, the split plan, the caller's workspace) and the workspace bound.
#include <doctest/doctest.h>

#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "kernel_src/hopper_params.h"
#include "kernel_src/kernel_params.h"
#include "runtime/compile_plan.hpp"
#include "runtime/launch_heuristics.hpp"
#include "runtime/nvrtc_compiler.hpp"
#include "runtime/plan/implementations.hpp"
#include "runtime/plan/mla_plan.hpp"
#include "tests/support/ptx.hpp"
#include "tests/unit/validation_support.hpp"

using namespace astrai;
using namespace astrai::detail;
using astrai::testing::BadCase;
using astrai::testing::check_rejected;
using astrai::testing::fake_pointer;

namespace {

// 2 requests of one token, 16 heads, pages of 64, 8 pages a request.
MlaDecodeArgs valid_mla() {
  MlaDecodeArgs a;
  a.batch = 2;
  a.n_heads = 16;
  a.page_size = 64;
  a.num_pages = 32;
  a.max_pages_per_seq = 8;
  a.scale = 0.0721f;
  a.q = fake_pointer<const void>(0x100000);
  a.kv_cache = fake_pointer<const void>(0x200000);
  a.page_table = fake_pointer<const std::int32_t>(0x300000);
  a.seq_lens = fake_pointer<const std::int32_t>(0x400000);
  a.out = fake_pointer<void>(0x500000);
  return a;
}

DeviceTraits device(const char* arch, int sms = 132) {
  DeviceTraits traits;
  traits.arch = arch;
  traits.num_sms = sms;
  return traits;
}

MlaProblem problem(int batch, int heads, int q_len, long long capacity, int page_size = 64) {
  MlaProblem p;
  p.batch = batch;
  p.n_heads = heads;
  p.q_len = q_len;
  p.page_size = page_size;
  p.capacity = capacity;
  return p;
}

int mla_occurrences(const std::string& text, const std::string& needle) {
  int count = 0;
  for (std::size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + needle.size())) ++count;
  return count;
}

}  // namespace

TEST_SUITE("mla_decode") {

TEST_CASE("mla_decode fills contiguous strides: q [b, t, h, 576], cache [pages, ps, 576], out [b, t, h, 512]") {
  MlaDecodeArgs a = valid_mla();
  a.q_len = 3;
  const MlaDecodeArgs r = resolve_mla_decode_args(a);
  CHECK(r.q_stride_head == 576);
  CHECK(r.q_stride_seq == 16 * 576);
  CHECK(r.q_stride_batch == 3 * 16 * 576);
  CHECK(r.kv_stride_token == 576);
  CHECK(r.kv_stride_page == 64 * 576);
  CHECK(r.out_stride_head == 512);
  CHECK(r.out_stride_seq == 16 * 512);
  CHECK(r.out_stride_batch == 3 * 16 * 512);
  CHECK(r.page_table_stride == 8);
}

TEST_CASE("every mla_decode argument rejects a bad value and the message names it") {
  using A = MlaDecodeArgs;
  const std::vector<BadCase<A>> cases = {
      {"dtype", [](A& a) { a.dtype = static_cast<DType>(3); }, {"dtype 3 is not valid"}},
      {"batch", [](A& a) { a.batch = -1; }, {"batch -1"}},
      {"q_len", [](A& a) { a.q_len = 0; }, {"q_len 0 is not valid (allowed: 1..8)"}},
      {"q_len", [](A& a) { a.q_len = 9; }, {"q_len 9 is not valid (allowed: 1..8)"}},
      {"n_heads", [](A& a) { a.n_heads = 0; }, {"n_heads 0 is not supported (allowed: 1..128)"}},
      {"n_heads", [](A& a) { a.n_heads = 129; }, {"n_heads 129 is not supported"}},
      {"page_size", [](A& a) { a.page_size = 128; }, {"page_size 128"}},
      {"page_size", [](A& a) { a.page_size = 24; }, {"page_size 24"}},
      {"num_pages", [](A& a) { a.num_pages = 0; }, {"num_pages 0"}},
      {"max_pages_per_seq", [](A& a) { a.max_pages_per_seq = 0; }, {"max_pages_per_seq 0"}},
      {"scale", [](A& a) { a.scale = 0.f; }, {"scale 0 is not valid", "1/sqrt(192)"}},
      {"scale", [](A& a) { a.scale = -1.f; }, {"scale -1 is not valid"}},
      {"scale", [](A& a) { a.scale = std::numeric_limits<float>::infinity(); }, {"scale inf is not valid"}},
      {"scale", [](A& a) { a.scale = std::numeric_limits<float>::quiet_NaN(); }, {"scale nan is not valid"}},
      {"page_table_stride", [](A& a) { a.page_table_stride = 4; }, {"page_table_stride 4 is smaller"}},
      {"q_stride_head", [](A& a) { a.q_stride_head = 500; }, {"q_stride_head 500"}},
      {"q_stride_head", [](A& a) { a.q_stride_head = 580; }, {"q_stride_head 580 is not a multiple of 8"}},
      {"kv_stride_token", [](A& a) { a.kv_stride_token = 577; }, {"kv_stride_token 577 is not a multiple of 8"}},
      {"kv_stride_page", [](A& a) { a.kv_stride_page = -8; }, {"kv_stride_page -8"}},
      {"out_stride_head", [](A& a) { a.out_stride_head = 256; }, {"out_stride_head 256"}},
      {"out_stride_batch", [](A& a) { a.out_stride_batch = 512; }, {"out_stride_batch 512"}},
      {"q", [](A& a) { a.q = nullptr; }, {"q is null"}},
      {"q", [](A& a) { a.q = fake_pointer<const void>(0x100008); }, {"is not 16-byte aligned"}},
      {"kv_cache", [](A& a) { a.kv_cache = nullptr; }, {"kv_cache is null"}},
      {"out", [](A& a) { a.out = fake_pointer<void>(0x500002); }, {"is not 16-byte aligned"}},
      {"page_table", [](A& a) { a.page_table = nullptr; }, {"page_table is null"}},
      {"seq_lens", [](A& a) { a.seq_lens = nullptr; }, {"seq_lens is null"}},
      {"lse", [](A& a) { a.lse = fake_pointer<float>(0x600001); }, {"is not 4-byte aligned"}},
      {"workspace", [](A& a) { a.workspace_bytes = 64; }, {"workspace_bytes 64 with a null workspace"}},
      {"max_pages_per_seq", [](A& a) { a.max_pages_per_seq = 1 << 30; }, {"exceeds the limit"}},
      {"kv_dtype", [](A& a) { a.kv_dtype = static_cast<KvDType>(7); }, {"kv_dtype 7 is not valid"}},
      {"kv_scale", [](A& a) { a.kv_scale = fake_pointer<const float>(0x700000); },
       {"kv_scale = 0x700000 is set but kv_dtype is same"}},
      {"kv_scale", [](A& a) { a.kv_dtype = KvDType::e4m3; }, {"kv_scale is null"}},
      {"kv_scale", [](A& a) {
         a.kv_dtype = KvDType::e5m2;
         a.kv_scale = fake_pointer<const float>(0x700002);
       }, {"kv_scale", "is not 4-byte aligned"}},
      {"kv_stride_token", [](A& a) {
         a.kv_dtype = KvDType::e4m3;
         a.kv_scale = fake_pointer<const float>(0x700000);
         a.kv_stride_token = 584;
       }, {"kv_stride_token 584 is not a multiple of 16 elements"}},
  };
  const MlaDecodeArgs valid = valid_mla();
  REQUIRE_NOTHROW(resolve_mla_decode_args(valid));
  for (const auto& c : cases) check_rejected(valid, c, resolve_mla_decode_args, "mla_decode");
}

TEST_CASE("an empty batch needs no pointers") {
  MlaDecodeArgs a = valid_mla();
  a.batch = 0;
  a.q = nullptr;
  a.kv_cache = nullptr;
  a.out = nullptr;
  a.page_table = nullptr;
  a.seq_lens = nullptr;
  CHECK_NOTHROW(resolve_mla_decode_args(a));
}

TEST_CASE("the MLA tiling follows the target's shared memory and the rows") {
  // 160 KB targets: up to 64 rows a CTA and blocks of 32 keys; 99 KB targets: 32 rows, 16 keys.
  for (const char* arch : {"sm_80", "sm_90a", "sm_100"}) {
    CAPTURE(arch);
    CHECK(mla_tiling(arch, 128, 1).rows() == 64);
    CHECK(mla_tiling(arch, 128, 1).block_n == 32);
    CHECK(mla_tiling(arch, 16, 1).rows() == 16);
    CHECK(mla_tiling(arch, 16, 3).rows() == 48);
    CHECK(mla_tiling(arch, 1, 1).rows() == 16);
    CHECK(mla_decode_smem_bytes(64, 32) <= 163 * 1024);
  }
  for (const char* arch : {"sm_86", "sm_89", "sm_120"}) {
    CAPTURE(arch);
    CHECK(mla_tiling(arch, 128, 1).rows() == 32);
    CHECK(mla_tiling(arch, 128, 1).block_n == 16);
    CHECK(mla_decode_smem_bytes(32, 16) <= 99 * 1024);
  }
  CHECK(mla_tiling("sm_90a", 20, 1).threads() == 128);  // 2 row groups of 16, two warps each
}

TEST_CASE("the MLA plan: variant, grid over row tiles, requests and splits, and its workspace") {
  DeviceTraits portable = device("sm_90a");
  portable.no_hopper = true;  // ASTRAI_JIT_NO_WGMMA
  const Plan big = plan_mla_decode(problem(64, 128, 1, 8192), portable);
  CHECK(big.spec.name() == "mla_decode.bf16.hd576.ps64.g128.sm_90a");
  CHECK(big.implementation->id == ImplementationId::portable_mla_decode);
  CHECK(big.block == 256);
  CHECK(big.smem == mla_decode_smem_bytes(64, 32));
  CHECK(big.grid.x == 2);
  CHECK(big.grid.y == 64);
  CHECK_FALSE(big.split_kv());  // 128 CTAs on 132 SMs: one wave already
  CHECK(big.workspace_bytes == 0);
  CHECK(big.describe().find("ASTRAI_JIT_NO_WGMMA is set") != std::string::npos);

  // sm_90a: the TMA and wgmma kernel, 64 rows a CTA in 384 threads.
  const Plan hopper = plan_mla_decode(problem(64, 128, 1, 8192), device("sm_90a"));
  CHECK(hopper.spec.name() == "mla_decode.bf16.hd576.ps64.g128.wgmma.sm_90a");
  CHECK(hopper.implementation->id == ImplementationId::sm90_wgmma_mla_decode);
  CHECK(hopper.block == kMlaSm90Threads);
  CHECK(hopper.smem == mla_sm90_smem_bytes());
  CHECK(mla_sm90_smem_bytes() <= 227 * 1024);
  CHECK(hopper.grid.x == 2);
  CHECK(hopper.grid.y == 64);
  // Pages under 16 tokens, or an FP8 cache: the portable kernel, and the plan says why.
  const Plan small_pages = plan_mla_decode(problem(64, 128, 1, 8192, 1), device("sm_90a"));
  CHECK(small_pages.implementation->id == ImplementationId::portable_mla_decode);
  CHECK(small_pages.describe().find("pages are under 16 tokens") != std::string::npos);
  for (const char* arch : {"sm_80", "sm_89", "sm_100"})
    CHECK(plan_mla_decode(problem(64, 128, 1, 8192), device(arch)).implementation->id ==
          ImplementationId::portable_mla_decode);

  // Batch 1: the keys split across the SMs, and the workspace holds every split's rows.
  const Plan one = plan_mla_decode(problem(1, 16, 2, 32768), device("sm_90a"));
  CHECK(one.spec.name() == "mla_decode.bf16.hd576.ps64.g16.q2.wgmma.sm_90a");
  CHECK(one.grid.x == 1);  // 16 heads x 2 tokens: one tile of 64 rows
  CHECK(one.split_kv());
  CHECK(one.grid.z == static_cast<unsigned>(one.split.num_splits));
  CHECK(one.split.tokens_per_split % kMlaSm90BlockN == 0);  // splits start on a block
  CHECK(1LL * one.split.num_splits * one.split.tokens_per_split >= 32768);
  CHECK(one.workspace_bytes >= static_cast<std::size_t>(one.split.num_splits) * 32 * 512 * 4);

  // A caller's workspace too small for any split: one split, no workspace.
  MlaProblem capped = problem(1, 16, 2, 32768);
  capped.caller_workspace = true;
  capped.workspace_bytes = 1024;
  CHECK_FALSE(plan_mla_decode(capped, device("sm_90a")).split_kv());

  // No tensor cores: refused by name, never a wrong path.
  DeviceTraits forced = device("sm_90a");
  forced.force_no_mma = true;
  CHECK_THROWS_WITH_AS(plan_mla_decode(problem(1, 16, 1, 64), forced), doctest::Contains("needs tensor cores"),
                       InvalidArgument);
  CHECK_THROWS_AS(plan_mla_decode(problem(1, 16, 1, 64), device("sm_75")), InvalidArgument);
}

TEST_CASE("the MLA split plan weighs each split's partials: batch 1 x 8192 takes 32 splits of 4 blocks, not 64 of 2") {
  // 128 heads: two tiles of 64 rows a request. Each split CTA writes 64 x 512 f32 of partials
  // that the combine reads back, which the plan weighs against the blocks it streams.
  const auto splits = [](int batch, long long capacity) {
    return plan_mla_decode(problem(batch, 128, 1, capacity), device("sm_90a")).split.num_splits;
  };
  CHECK(splits(1, 8192) == 32);
  CHECK(splits(1, 32768) == 64);
  CHECK(splits(4, 8192) == 16);
  CHECK(splits(8, 4096) == 8);
  CHECK(splits(64, 8192) == 1);
  // Without the partials' weight the plain decode model takes 64 splits of 2 blocks at batch 1.
  CHECK(plan_decode_splits(1, 1, 2, 8192, 132).num_splits == 64);
  // The combine reads MLA's 512-wide rows as four 128-column slices; the decode's rows whole.
  CHECK(combine_column_slices(kMlaVDim) == 4);
  for (int head_dim : {64, 80, 128, 256}) CHECK(combine_column_slices(head_dim) == 1);
}

TEST_CASE("a target whose tiling needs more shared memory than the GPU has is refused by name") {
  DeviceTraits ada_as_ampere = device("compute_80", 128);
  ada_as_ampere.max_smem_per_cta = 101376;  // an sm_89's 99 KB, running compute_80 PTX
  CHECK_THROWS_WITH_AS(plan_mla_decode(problem(8, 128, 1, 4096), ada_as_ampere),
                       doctest::Contains("needs 155648 bytes of shared memory a CTA, this GPU offers 101376"),
                       InvalidArgument);
  DeviceTraits ada = device("sm_89", 128);
  ada.max_smem_per_cta = 101376;
  CHECK(plan_mla_decode(problem(8, 128, 1, 4096), ada).smem <= 101376);
  DeviceTraits h100 = device("sm_90a");
  h100.max_smem_per_cta = 232448;
  CHECK(plan_mla_decode(problem(8, 128, 1, 4096), h100).smem == mla_sm90_smem_bytes());
}

TEST_CASE("an FP8 cache is its own variant, with byte stages and a widened tile") {
  MlaProblem p = problem(2, 128, 1, 4096);
  p.kv_flags = kFeatureKvE4m3;
  const Plan plan = plan_mla_decode(p, device("sm_90a"));
  CHECK(plan.spec.name() == "mla_decode.bf16.hd576.ps64.g128.kv_e4m3.sm_90a");
  CHECK(plan.smem == mla_decode_smem_bytes(64, 32, true));
  CHECK(mla_decode_smem_bytes(64, 32, true) == 64 * 1168 + 2 * 32 * 576 + 32 * 1168 + 64 * 40 * 2 + 64 * 16);
  p.kv_flags = kFeatureKvE5m2;
  p.q_len = 2;
  CHECK(plan_mla_decode(p, device("sm_89")).spec.name() == "mla_decode.bf16.hd576.ps64.g128.kv_e5m2.q2.sm_89");
  CHECK(mla_decode_smem_bytes(32, 16, true) <= 99 * 1024);
  MlaDecodeArgs a = valid_mla();
  a.kv_dtype = KvDType::e4m3;
  a.kv_scale = fake_pointer<const float>(0x700000);
  CHECK_NOTHROW(resolve_mla_decode_args(a));
}

TEST_CASE("mla_decode_workspace_bytes bounds every plan of the shape") {
  MlaDecodeArgs a = valid_mla();
  a.batch = 1;
  a.max_pages_per_seq = 512;  // 32768 keys
  for (int sms : {8, 78, 132}) {
    const std::size_t bound = mla_decode_workspace_bytes(a, sms);
    CHECK(bound > 0);
    for (const char* arch : {"sm_80", "sm_89", "sm_90a"}) {
      MlaProblem p = problem(1, 16, 1, 32768);
      CHECK(plan_mla_decode(p, device(arch, sms)).workspace_bytes <= bound);
    }
  }
}

TEST_CASE("the sm_90a MLA variants compile to wgmma over TMA boxes, unserialized and unspilled") {
  for (const char* dtype : {"bf16", "fp16"}) {
    for (const auto& [page_size, q_len] : std::vector<std::pair<int, int>>{{64, 1}, {16, 2}, {32, 8}}) {
      const KernelSpec spec = KernelSpec::parse(fmt::format("mla_decode.{}.hd576.ps{}.g16{}.wgmma.sm_90a", dtype,
                                                            page_size, q_len > 1 ? fmt::format(".q{}", q_len) : ""));
      CAPTURE(spec.name());
      astrai::detail::CompileRequest request = astrai::detail::compile_request(spec);
      request.options.push_back("--ptxas-options=-v");
      const auto result = astrai::detail::nvrtc_compile(request, true);
      const std::string types = std::string(dtype) == "bf16" ? "bf16.bf16" : "f16.f16";
      const std::string kernel = astrai::testing::entry_text(result.ptx, "mla_decode_sm90_kernel");
      REQUIRE_FALSE(kernel.empty());
      // A consumer's half of S (32 keys) over 576 dims: 36 k-steps of m64n32k16; P V: 4 k-steps of
      // m64n256k16 (its 256 dims), P and V from shared memory.
      CHECK(mla_occurrences(kernel, "wgmma.mma_async.sync.aligned.m64n32k16.f32." + types) == 36);
      CHECK(mla_occurrences(kernel, "wgmma.mma_async.sync.aligned.m64n256k16.f32." + types) == 4);
      CHECK(astrai::testing::contains(kernel, "cp.async.bulk.tensor.4d"));
      CHECK(astrai::testing::contains(kernel, fmt::format("setmaxnreg.dec.sync.aligned.u32 {}",
                                                          astrai::prefill_sm90_producer_regs(2, false))));
      CHECK(astrai::testing::contains(kernel, fmt::format("setmaxnreg.inc.sync.aligned.u32 {}",
                                                          astrai::prefill_sm90_consumer_regs(2))));
      CHECK(astrai::testing::contains(kernel, fmt::format(".maxntid {}", astrai::kMlaSm90Threads)));
      CHECK_FALSE(astrai::testing::contains(kernel, ".local"));
      INFO("NVRTC log: " << result.log);
      CHECK_FALSE(astrai::testing::contains(result.log, "Performance Loss"));  // a serialized wgmma pipeline
      CHECK(astrai::testing::contains(result.log, " 0 bytes spill stores"));
    }
  }
  // Not below sm_90a, not for an FP8 cache, not for pages under 16 tokens.
  CHECK_THROWS_AS(KernelSpec::parse("mla_decode.bf16.hd576.ps64.g16.wgmma.sm_89"), InvalidArgument);
  CHECK_THROWS_AS(KernelSpec::parse("mla_decode.bf16.hd576.ps64.g16.kv_e4m3.wgmma.sm_90a"), InvalidArgument);
  CHECK_THROWS_AS(KernelSpec::parse("mla_decode.bf16.hd576.ps1.g16.wgmma.sm_90a"), InvalidArgument);
}

}  // TEST_SUITE
