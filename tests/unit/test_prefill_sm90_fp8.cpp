// FP8 attention (qkv_e4m3) on any machine: the variant compiled with NVRTC and its PTX checked for
// what the design rests on (e4m3 wgmma for both GEMMs, P quantized to e4m3 in registers, the V
// transposition's byte permutes and its hand-over to the async proxy, no spills), the refusals of
// every shape and path it does not serve, and the argument checks.
#include <doctest/doctest.h>

#include <algorithm>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "astrai/error.hpp"
#include "astrai/runtime.hpp"
#include "kernel_src/hopper_params.h"
#include "kernel_src/prefill_sm90_fp8_layout.h"
#include "runtime/compile_plan.hpp"
#include "runtime/families/prefill_launch.hpp"
#include "runtime/kernel_spec.hpp"
#include "runtime/plan/implementations.hpp"
#include "tests/support/ptx.hpp"

namespace fp8_attention_test {

using astrai::DType;
using astrai::testing::contains;
using astrai::detail::KernelKind;
using astrai::detail::KernelSpec;

// page_size 0: the contiguous prefill; else the paged one.
KernelSpec fp8_prefill(DType dtype, int group, std::uint32_t extra = 0, int page_size = 0, int head_dim = 128) {
  KernelSpec spec;
  spec.kind = page_size == 0 ? KernelKind::prefill : KernelKind::paged_prefill;
  spec.dtype = dtype;
  spec.head_dim = head_dim;
  spec.page_size = page_size;
  spec.group_size = group;
  spec.flags = astrai::kFeatureQkvE4m3 | extra;
  spec.arch = "sm_90a";
  spec.hopper = true;
  return spec;
}

// The variant compiled by NVRTC (ptxas verbose), once checked to be served on sm_90a, to carry
// `fields` in its name, and to spill nothing (or at most `spill_bytes`).
astrai::detail::CompileResult compile_unspilled(const KernelSpec& spec, const char* fields, int spill_bytes = 0) {
  REQUIRE(astrai::detail::hopper_serves(spec));
  CHECK(spec.name().find(fields) != std::string::npos);
  astrai::detail::CompileRequest request = astrai::detail::compile_request(spec);
  request.options.push_back("--ptxas-options=-v");
  auto result = astrai::detail::nvrtc_compile(request, true);
  INFO("NVRTC log: " << result.log);
  const std::regex spills(R"((\d+) bytes spill stores)");
  std::smatch match;
  REQUIRE(std::regex_search(result.log, match, spills));
  CHECK(std::stoi(match[1].str()) <= spill_bytes);
  return result;
}

// What every FP8 attention variant's PTX holds (P in e4m3): the S GEMM on m64n128k32 e4m3
// wgmmas and no 16-bit GEMM, P quantized in registers, the V transposition, TMA boxes of bytes.
void check_fp8_attention_ptx(const std::string& ptx, int page_size) {
  CHECK(contains(ptx, "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3"));
  CHECK_FALSE(contains(ptx, "k16.f32.bf16.bf16"));
  CHECK_FALSE(contains(ptx, "k16.f32.f16.f16"));
  // P quantized to e4m3 pairs; the transposition's byte permutes, then the async proxy.
  CHECK(contains(ptx, "cvt.rn.satfinite.e4m3x2.f32"));
  CHECK(contains(ptx, "prmt.b32"));
  CHECK(contains(ptx, "fence.proxy.async.shared::cta"));
  // The transposition reads and writes shared memory by its window's addresses: 4-byte loads of
  // token rows, 8-byte stores into V^T rows (a warp's lanes on different places).
  CHECK(contains(ptx, "ld.shared.b32"));
  CHECK(contains(ptx, "st.shared.v2.b32"));
  // q, K and V by 4-D TMA boxes of bytes (no 5-D box: paged V as the FP8 cache's, rows of bytes).
  CHECK(contains(ptx, "cp.async.bulk.tensor.4d"));
  CHECK_FALSE(contains(ptx, "cp.async.bulk.tensor.5d"));
  // Paged: the tail of the last page's V is cleared in the transposition (a select on the token,
  // no store of zeros by the consumers).
  if (page_size != 0) CHECK(contains(ptx, "selp.b32"));
}

// The kernel's own transposition offsets (prefill_sm90_fp8_layout.h) over a block's rounds, as
// the 96 transposing threads take them (lane l of warp w in rounds w, w + 3, ...), for a V block
// of `columns` bytes a token whose byte b of token t sits at load_at(t, b): every byte of V^T
// (`columns` rows of 128 token slots) written once, from the right token and column, in the
// order P's fragments expect; the stores conflict-free and the loads' bank conflicts counted.
template <class Task>
void check_transposition(unsigned columns, unsigned (*load_at)(unsigned, unsigned), unsigned load_conflicts) {
  constexpr unsigned kSlots = 128, kThreads = astrai::kPrefillSm90Wideners;
  // V^T byte -> 1 + (token * columns + column) of the V byte it holds (0: not written).
  std::vector<unsigned> source(columns * kSlots, 0);
  bool addresses_ok = true, once = true;
  for (unsigned t = 0; t < kThreads; ++t) {
    const unsigned lane = t % 32;
    for (unsigned round = t / 32; round < Task::kRounds; round += kThreads / 32) {
      const Task task(lane, round);
      unsigned token[2][4];
      for (unsigned u = 0; u < 4; ++u)
        for (unsigned e = 0; e < 2; ++e) {
          token[u / 2][u % 2 + 2 * e] = task.token(u, e);
          addresses_ok &= task.load_offset(u, e) == load_at(task.token(u, e), 4 * task.c);
        }
      for (unsigned j = 0; j < 4; ++j) {
        const unsigned at = task.store_offset(j);
        addresses_ok &= at == astrai::swizzle128_offset(4 * task.c + j, 16 * task.z + 8 * task.h);
        // Byte k of the 8-byte store: byte j of word k % 4 of group k / 4 (the 4 x 4 transposes).
        for (unsigned k = 0; k < 8; ++k) {
          REQUIRE(at + k < source.size());
          once &= source[at + k] == 0;
          source[at + k] = 1 + token[k / 4][k % 4] * columns + 4 * task.c + j;
        }
      }
    }
  }
  CHECK(addresses_ok);
  CHECK(once);
  // V^T row c, slot s holds column c of token sigma(s): slot 4q + b of each 16 holds
  // {2q, 2q + 1, 8 + 2q, 9 + 2q}[b] of that 16, the accumulator's column order of P.
  unsigned wrong = 0;
  for (unsigned c = 0; c < columns; ++c)
    for (unsigned slot = 0; slot < kSlots; ++slot) {
      const unsigned q = slot % 16 / 4, b = slot % 4;
      const unsigned sigma = slot / 16 * 16 + 2 * q + (b % 2) + 8 * (b / 2);
      wrong += source[astrai::swizzle128_offset(c, slot)] != 1 + sigma * columns + c;
    }
  CHECK(wrong == 0u);
  // A warp's round: the lanes of each load past the first on a bank, and each store's two
  // 16-lane phases' lanes past the first on an 8-byte bank pair.
  unsigned loads = 0, stores = 0;
  for (unsigned round = 0; round < Task::kRounds; ++round) {
    for (unsigned u = 0; u < 4; ++u)
      for (unsigned e = 0; e < 2; ++e) {
        std::vector<bool> bank(32, false);
        for (unsigned lane = 0; lane < 32; ++lane) {
          const unsigned b = Task(lane, round).load_offset(u, e) / 4 % 32;
          loads += bank[b];
          bank[b] = true;
        }
      }
    for (unsigned j = 0; j < 4; ++j)
      for (unsigned phase = 0; phase < 2; ++phase) {
        std::vector<bool> pair(16, false);
        for (unsigned lane = 16 * phase; lane < 16 * phase + 16; ++lane) {
          const unsigned b = Task(lane, round).store_offset(j) / 8 % 16;
          stores += pair[b];
          pair[b] = true;
        }
      }
  }
  CHECK(stores == 0u);
  CHECK(loads == load_conflicts);
}

// e4m3 q, k and v with unit scales (the options PrefillArgs and PagedPrefillArgs share).
void set_e4m3(astrai::AttentionOptions* options) {
  static float scales[3] = {1.f, 1.f, 1.f};
  options->qkv_dtype = astrai::KvDType::e4m3;
  options->q_scale = &scales[0];
  options->k_scale = &scales[1];
  options->v_scale = &scales[2];
}

astrai::PrefillArgs fp8_args() {
  alignas(16) static unsigned char bytes[16];
  astrai::PrefillArgs a;
  a.batch = 1;
  a.q_len = 1;
  a.kv_len = 1;
  a.n_heads = 4;
  a.n_kv_heads = 1;
  a.head_dim = 128;
  a.q = a.k = a.v = bytes;
  a.out = bytes;
  set_e4m3(&a);
  return a;
}

TEST_SUITE("hopper") {
  TEST_CASE("sm_90a FP8 attention: e4m3 wgmma on both GEMMs, P to e4m3 in registers, V transposed by the producer") {
    // Contiguous, and paged (pages of one box and of several).
    const std::pair<DType, int> cases[] = {{DType::bf16, 0}, {DType::fp16, 0}, {DType::bf16, 16}, {DType::fp16, 64}};
    for (const auto& [dtype, page_size] : cases) {
      for (int group : {1, 4, 8}) {
        const KernelSpec spec = fp8_prefill(dtype, group, 0, page_size);
        CAPTURE(spec.name());
        const auto result = compile_unspilled(spec, ".qkv_e4m3.wgmma.");
        // P V as m64n128k32 e4m3 wgmmas too (N = the head dim).
        check_fp8_attention_ptx(result.ptx, page_size);
        CHECK(contains(result.ptx, fmt::format("setmaxnreg.dec.sync.aligned.u32 {}",
                                               astrai::prefill_sm90_producer_regs(2, false, true))));
      }
    }
  }

  TEST_CASE("sm_90a FP8 attention at head_dim 256: rows of two chunks, P V as one m64n256k32 wgmma, 240 registers") {
    for (const auto& [dtype, page_size] : {std::pair{DType::bf16, 0}, {DType::fp16, 16}, {DType::bf16, 8}}) {
      for (int group : {1, 8}) {
        const KernelSpec spec = fp8_prefill(dtype, group, 0, page_size, 256);
        CAPTURE(spec.name());
        // The consumers take 240 registers (O's 128, S's 64 and P's 16 beside their state: at
        // 232 ptxas serialized the wgmmas), which leaves the producer warpgroup 24: the
        // transposition's per-lane offsets spill, stored once and loaded once a block (the
        // SASS's local loads sit before the rounds' loop, none inside it).
        const auto result = compile_unspilled(spec, ".hd256.", 64);
        check_fp8_attention_ptx(result.ptx, page_size);
        CHECK(contains(result.ptx, "wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3"));  // P V
        CHECK(contains(result.ptx, "setmaxnreg.inc.sync.aligned.u32 240"));
        CHECK(contains(result.ptx, "setmaxnreg.dec.sync.aligned.u32 24"));
      }
    }
    // Its rings: Q, two stages of K, V's bytes and V^T, all bytes, inside an SM's shared memory
    // (the 16-bit rings would not fit), and the same blocks as hd128's.
    const int smem = astrai::prefill_sm90_smem_bytes(256, 2, 128, false, astrai::kFeatureQkvE4m3);
    CHECK(smem <= 227 * 1024);
    CHECK(smem >= 128 * 256 + 3 * astrai::kPrefillSm90Stages * 128 * 256);
    CHECK(astrai::prefill_sm90_smem_bytes(256, 2, 128, false, astrai::kFeatureKvE4m3) > 227 * 1024);
    CHECK(astrai::prefill_sm90_block_n(256, 2, true) == 128);
  }

  TEST_CASE("sm_90a FP8 attention at head_dim 64: 64-byte rows, 64-byte swizzled, P V as one m64n64k32 wgmma") {
    for (const auto& [dtype, page_size] : {std::pair{DType::bf16, 0}, {DType::fp16, 16}, {DType::bf16, 64}}) {
      for (int group : {1, 6, 8}) {
        const KernelSpec spec = fp8_prefill(dtype, group, 0, page_size, 64);
        CAPTURE(spec.name());
        const auto result = compile_unspilled(spec, ".hd64.");
        check_fp8_attention_ptx(result.ptx, page_size);
        CHECK(contains(result.ptx, "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3"));  // P V
        // Three consumer warpgroups of 152 registers, as the 16-bit hd64 kernel's three (its
        // softmax weighs most), beside the transposing producer's 56.
        CHECK(contains(result.ptx, "setmaxnreg.inc.sync.aligned.u32 152"));
        CHECK(contains(result.ptx, "setmaxnreg.dec.sync.aligned.u32 56"));
      }
    }
    CHECK(astrai::prefill_sm90_consumers(64, false, astrai::kFeatureQkvE4m3) == 3);
    CHECK(astrai::prefill_sm90_consumers(128, false, astrai::kFeatureQkvE4m3) == 2);
    CHECK(astrai::prefill_sm90_consumers(64, false, astrai::kFeatureKvE4m3) == 2);
    const KernelSpec spec = fp8_prefill(DType::bf16, 4, 0, 0, 64);
    const auto names = astrai::detail::prefill_sm90_instantiations(spec, 0);
    REQUIRE(names.size() == 1);
    CHECK(names[0] == fmt::format("astrai::prefill_sm90_kernel<astrai::bf16_t, 64, 0, 4, 3, 128, {}>",
                                  astrai::kFeatureQkvE4m3));
    // The Q slot holds 128-byte rows (the epilogue's 16-bit staging), the rings 64-byte ones.
    const astrai::PrefillSm90Rings rings = astrai::prefill_sm90_rings(64, 3, 128, astrai::kFeatureQkvE4m3);
    CHECK(rings.q_slot == 192 * 128);
    CHECK(rings.k_stage == 128 * 64);
    CHECK(rings.v_stage == 128 * 64);
  }

  TEST_CASE("sm_90a FP8 attention: the V transposition writes each byte of V^T once, from its token, without bank "
            "conflicts but hd64's loads' pairs") {
    // hd128 (and each 128-byte chunk of hd256): 128-byte rows of V's bytes, every load and store
    // on its own banks. hd64: 64-byte rows, 64-byte swizzled; its stores meet no conflict, and each
    // load's 32 lanes meet in pairs (a token row is 16 banks, a load reads tokens of one parity).
    check_transposition<astrai::Fp8TransposeTask>(128, astrai::swizzle128_offset, 0);
    check_transposition<astrai::Fp8TransposeTask64>(64, astrai::swizzle64_offset,
                                                    astrai::Fp8TransposeTask64::kRounds * 8 * 16);
  }

  TEST_CASE("sm_90a FP8 attention: the byte rings' blocks and shared memory, boxes of whole rows of bytes") {
    const KernelSpec spec = fp8_prefill(DType::bf16, 4);
    const auto names = astrai::detail::prefill_sm90_instantiations(spec, 0);
    REQUIRE(names.size() == 1);
    CHECK(names[0].find(fmt::format(", {}, 512>", astrai::prefill_sm90_block_n(128, 2, true))) != std::string::npos);
    astrai::PrefillParams p{};
    p.batch = 2;
    p.q_len = 100;
    p.kv_len = 300;
    p.n_heads = 8;
    p.n_kv_heads = 2;
    // Boxes of a swizzle row of bytes: a row at hd128, a chunk of one at hd256 (the kernel issues
    // a box a chunk), hd64's 64-byte row (64-byte swizzled).
    for (int head_dim : {64, 128, 256}) {
      CAPTURE(head_dim);
      const auto maps = astrai::detail::prefill_map_shapes(p, head_dim, 0, 2, 128, false, true);
      for (const auto* shape : {&maps.q, &maps.k, &maps.v}) {
        CHECK(shape->element_bytes == 1);
        CHECK(shape->box[0] == static_cast<std::uint32_t>(std::min(head_dim, 128)));
      }
    }
    // Paged: K and V in boxes of rows of bytes, up to 16 tokens of one page (the FP8 cache's
    // boxes).
    p.total_q = 200;
    p.num_pages = 40;
    for (const auto& [page_size, head_dim] :
         {std::pair{8, 128}, {16, 128}, {64, 128}, {8, 256}, {16, 256}, {8, 64}, {16, 64}}) {
      CAPTURE(page_size);
      CAPTURE(head_dim);
      const auto paged = astrai::detail::prefill_map_shapes(p, head_dim, page_size, 2, 128, false, true);
      for (const auto* shape : {&paged.q, &paged.k, &paged.v}) {
        CHECK(shape->element_bytes == 1);
        CHECK(shape->box[0] == static_cast<std::uint32_t>(std::min(head_dim, 128)));
      }
      for (const auto* shape : {&paged.k, &paged.v}) {
        REQUIRE(shape->box.size() == 4);
        const std::uint32_t rows = static_cast<std::uint32_t>(std::min(page_size, 16));
        CHECK(shape->box[2] == rows);
      }
    }
  }

  TEST_CASE("FP8 attention is refused by name where it is not served") {
    // Other head dims, P in f16 at hd256, pages, features, and every path but the sm_90a wgmma
    // prefill.
    for (int head_dim : {96, 192})
      CHECK_FALSE(astrai::detail::hopper_serves(fp8_prefill(DType::bf16, 4, 0, 0, head_dim)));
    for (int head_dim : {64, 256}) {
      CHECK(astrai::detail::hopper_serves(fp8_prefill(DType::bf16, 4, 0, 0, head_dim)));
      CHECK_FALSE(astrai::detail::hopper_serves(fp8_prefill(DType::bf16, 4, astrai::kFeatureQkvP16, 0, head_dim)));
    }
    CHECK(astrai::detail::hopper_serves(fp8_prefill(DType::bf16, 4, astrai::kFeatureQkvP16, 16, 128)));
    CHECK_FALSE(astrai::detail::hopper_serves(fp8_prefill(DType::bf16, 4, astrai::kFeatureSoftCap)));
    CHECK(astrai::detail::hopper_serves(fp8_prefill(DType::bf16, 4, 0, 8)));
    CHECK_FALSE(astrai::detail::hopper_serves(fp8_prefill(DType::bf16, 4, astrai::kFeatureWindow, 16)));
    CHECK_FALSE(astrai::detail::hopper_serves([] {
      KernelSpec s = fp8_prefill(DType::bf16, 4, 0, 16);
      s.kind = KernelKind::paged_decode;
      return s;
    }()));
    KernelSpec portable = fp8_prefill(DType::bf16, 4);
    portable.hopper = false;
    CHECK_THROWS_WITH_AS(portable.validate(), doctest::Contains("qkv_e4m3"), astrai::InvalidArgument);
  }
}

TEST_CASE("FP8 attention's arguments: its three scales, never beside an FP8 cache, only its shape") {
  alignas(16) static float lse_rows[4] = {};
  CHECK_NOTHROW(astrai::validate_args(fp8_args()));
  for (const char* missing : {"q_scale", "k_scale", "v_scale"}) {
    astrai::PrefillArgs a = fp8_args();
    if (std::string(missing) == "q_scale") a.q_scale = nullptr;
    if (std::string(missing) == "k_scale") a.k_scale = nullptr;
    if (std::string(missing) == "v_scale") a.v_scale = nullptr;
    CHECK_THROWS_WITH_AS(astrai::validate_args(a), doctest::Contains(missing), astrai::InvalidArgument);
  }
  astrai::PrefillArgs e5m2 = fp8_args();
  e5m2.qkv_dtype = astrai::KvDType::e5m2;
  CHECK_THROWS_WITH_AS(astrai::validate_args(e5m2), doctest::Contains("qkv_dtype"), astrai::InvalidArgument);
  // Only the wgmma prefill's shape: head dim 64, 128 or 256 (P in f16 at 128), no other option,
  // no mask; refused by argument.
  astrai::PrefillArgs hd192 = fp8_args();
  hd192.head_dim = 192;
  CHECK_THROWS_WITH_AS(astrai::validate_args(hd192),
                       doctest::Contains("head_dim 192 is not served with qkv_dtype e4m3 (FP8 attention: "
                                         "float8_e4m3fn q, k and v) (allowed: 64, 128 or 256)"),
                       astrai::InvalidArgument);
  astrai::PrefillArgs hd64 = fp8_args();
  hd64.head_dim = 64;
  CHECK_NOTHROW(astrai::validate_args(hd64));
  hd64.p_fp16 = true;
  CHECK_THROWS_WITH_AS(astrai::validate_args(hd64), doctest::Contains("is not served at head_dim 64"),
                       astrai::InvalidArgument);
  astrai::PrefillArgs hd256 = fp8_args();
  hd256.head_dim = 256;
  CHECK_NOTHROW(astrai::validate_args(hd256));
  hd256.p_fp16 = true;
  CHECK_THROWS_WITH_AS(astrai::validate_args(hd256), doctest::Contains("P in f16 (p_fp16; p_dtype torch.float16 in Python) is not served at head_dim 256"),
                       astrai::InvalidArgument);
  hd256.head_dim = 128;
  CHECK_NOTHROW(astrai::validate_args(hd256));
  astrai::PrefillArgs capped = fp8_args();
  capped.logit_cap = 30.f;
  CHECK_THROWS_WITH_AS(astrai::validate_args(capped), doctest::Contains("logit_cap 30 is not served with qkv_dtype"),
                       astrai::InvalidArgument);
  astrai::PrefillArgs windowed = fp8_args();
  windowed.causal_offset = 0;
  windowed.window_left = 8;
  CHECK_THROWS_WITH_AS(astrai::validate_args(windowed), doctest::Contains("window_left 8 is not served"),
                       astrai::InvalidArgument);
  astrai::PrefillArgs masked = fp8_args();
  static bool keep[16] = {true};
  masked.mask = keep;
  CHECK_THROWS_WITH_AS(astrai::validate_args(masked), doctest::Contains("mask = "), astrai::InvalidArgument);
  astrai::PrefillArgs causal = fp8_args();
  causal.causal_offset = 0;
  causal.lse = lse_rows;
  CHECK_NOTHROW(astrai::validate_args(causal));
  // Views whose strides TMA cannot take (whole 16-byte units) are refused by name.
  astrai::PrefillArgs strided = fp8_args();
  strided.k_stride_seq = strided.n_kv_heads * strided.head_dim + 8;
  CHECK_THROWS_WITH_AS(astrai::validate_args(strided), doctest::Contains("k_stride_seq"), astrai::InvalidArgument);
  astrai::PrefillArgs padded = fp8_args();
  padded.q_stride_seq = padded.n_heads * padded.head_dim + 16;
  CHECK_NOTHROW(astrai::validate_args(padded));
  astrai::PrefillArgs stray = fp8_args();
  stray.qkv_dtype = astrai::KvDType::same;
  stray.k_scale = stray.v_scale = nullptr;
  CHECK_THROWS_WITH_AS(astrai::validate_args(stray), doctest::Contains("q_scale"), astrai::InvalidArgument);
}

}  // namespace fp8_attention_test

namespace fp8_attention_test {

astrai::PagedPrefillArgs fp8_paged_args() {
  alignas(16) static unsigned char bytes[16];
  static int indptr[2] = {0, 1}, lens[1] = {1}, table[1] = {0};
  astrai::PagedPrefillArgs a;
  a.batch = 1;
  a.total_q = 1;
  a.max_q_len = 1;
  a.n_heads = 4;
  a.n_kv_heads = 1;
  a.head_dim = 128;
  a.page_size = 16;
  a.num_pages = 1;
  a.max_pages_per_seq = 1;
  a.q = bytes;
  a.k_cache = a.v_cache = bytes;
  a.out = bytes;
  a.qo_indptr = indptr;
  a.seq_lens = lens;
  a.page_table = table;
  a.causal = true;
  set_e4m3(&a);
  return a;
}

TEST_SUITE("hopper") {
  TEST_CASE("sm_90a FP8 attention with P in f16: S on e4m3 wgmma, V widened, P V on f16 wgmma") {
    for (int page_size : {0, 16}) {
      for (DType dtype : {DType::bf16, DType::fp16}) {
        const KernelSpec spec = fp8_prefill(dtype, 4, astrai::kFeatureQkvP16, page_size);
        CAPTURE(spec.name());
        const auto result = compile_unspilled(spec, ".qkv_e4m3.p_fp16.wgmma.");
        CHECK(contains(result.ptx, "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3"));
        // P V in f16 whatever the output type (every e4m3 value is an f16 one), V by the
        // widening's conversions, and P never rounded to e4m3.
        CHECK(contains(result.ptx, "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16"));
        CHECK_FALSE(contains(result.ptx, "k16.f32.bf16.bf16"));
        CHECK(contains(result.ptx, "cvt.rn.f16x2.e4m3x2"));
        CHECK_FALSE(contains(result.ptx, "cvt.rn.satfinite.e4m3x2.f32"));
      }
    }
    // p_fp16 is FP8 attention's alone.
    KernelSpec alone = fp8_prefill(DType::bf16, 4, astrai::kFeatureQkvP16);
    alone.flags &= ~astrai::kFeatureQkvE4m3;
    CHECK_THROWS_WITH_AS(alone.validate(), doctest::Contains("needs qkv_e4m3"), astrai::InvalidArgument);
    astrai::PrefillArgs stray = fp8_args();
    stray.qkv_dtype = astrai::KvDType::same;
    stray.q_scale = stray.k_scale = stray.v_scale = nullptr;
    stray.p_fp16 = true;
    CHECK_THROWS_WITH_AS(astrai::validate_args(stray), doctest::Contains("p_fp16 is set but qkv_dtype is same"),
                         astrai::InvalidArgument);
    astrai::PrefillArgs p16 = fp8_args();
    p16.p_fp16 = true;
    CHECK_NOTHROW(astrai::validate_args(p16));
  }
}

TEST_CASE("FP8 attention over pages: only its shape, refused by argument elsewhere") {
  CHECK_NOTHROW(astrai::validate_args(fp8_paged_args()));
  astrai::PagedPrefillArgs small = fp8_paged_args();
  small.page_size = 1;
  CHECK_THROWS_WITH_AS(astrai::validate_args(small),
                       doctest::Contains("page_size 1 is not served with qkv_dtype e4m3"), astrai::InvalidArgument);
  astrai::PagedPrefillArgs hd192 = fp8_paged_args();
  hd192.head_dim = 192;
  CHECK_THROWS_WITH_AS(astrai::validate_args(hd192), doctest::Contains("head_dim 192 is not served with qkv_dtype e4m3"),
                       astrai::InvalidArgument);
  astrai::PagedPrefillArgs sink = fp8_paged_args();
  static float sinks[4] = {};
  sink.sinks = sinks;
  CHECK_THROWS_WITH_AS(astrai::validate_args(sink), doctest::Contains("sinks = "), astrai::InvalidArgument);
  astrai::PagedPrefillArgs masked = fp8_paged_args();
  static bool keep[16] = {true};
  masked.mask = keep;
  CHECK_THROWS_WITH_AS(astrai::validate_args(masked), doctest::Contains("(allowed: none; causal for a causal"),
                       astrai::InvalidArgument);
  astrai::PagedPrefillArgs strided = fp8_paged_args();
  strided.q_stride_token = strided.n_heads * strided.head_dim + 8;
  CHECK_THROWS_WITH_AS(astrai::validate_args(strided), doctest::Contains("q_stride_token"), astrai::InvalidArgument);
  astrai::PagedPrefillArgs missing = fp8_paged_args();
  missing.v_scale = nullptr;
  CHECK_THROWS_WITH_AS(astrai::validate_args(missing), doctest::Contains("v_scale"), astrai::InvalidArgument);
  astrai::PagedPrefillArgs cache8 = fp8_paged_args();
  cache8.kv_dtype = astrai::KvDType::e4m3;
  CHECK_THROWS_WITH_AS(astrai::validate_args(cache8), doctest::Contains("already e4m3"), astrai::InvalidArgument);
}

}  // namespace fp8_attention_test
