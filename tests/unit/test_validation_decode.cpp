// Argument checks of paged_decode and decode, and of every public call before a GPU is touched.
#include "kernel_src/kernel_params.h"
#include "runtime/families/arg_checks.hpp"
#include "tests/unit/validation_support.hpp"

using namespace astrai::testing;
using astrai::detail::resolve_decode_args;
using astrai::detail::resolve_paged_decode_args;
using astrai::detail::resolve_paged_prefill_args;
using astrai::detail::resolve_prefill_args;
using astrai::detail::resolve_rotary_args;

TEST_SUITE("validation") {

TEST_CASE("the valid paged decode fixture is accepted") {
  const PagedDecodeArgs resolved = resolve_paged_decode_args(valid_paged());
  CHECK(resolved.batch == 2);
  CHECK(resolved.q == valid_paged().q);
}

TEST_CASE("every paged decode argument rejects a bad value and the message names it") {
  using A = PagedDecodeArgs;
  std::vector<BadCase<A>> cases = {
      {"dtype", [](A& a) { a.dtype = static_cast<DType>(7); }, {"dtype 7 is not valid (allowed: bf16, fp16)"}},
      {"batch", [](A& a) { a.batch = -1; }, {"batch -1 is not valid (allowed: >= 0)"}},
      {"n_heads", [](A& a) { a.n_heads = 0; }, {"n_heads 0 is not valid (allowed: >= 1)"}},
      {"n_heads", [](A& a) { a.n_heads = -4; }, {"n_heads -4 is not valid"}},
      {"n_kv_heads", [](A& a) { a.n_kv_heads = 0; }, {"n_kv_heads 0 is not valid (allowed: >= 1)"}},
      {"n_kv_heads", [](A& a) { a.n_kv_heads = -2; }, {"n_kv_heads -2 is not valid"}},
      {"n_kv_heads", [](A& a) { a.n_kv_heads = 3; },
       {"n_heads 8 is not a multiple of n_kv_heads 3"}},
      {"n_kv_heads", [](A& a) { a.n_kv_heads = 16; },
       {"n_heads 8 is not a multiple of n_kv_heads 16"}},
      {"n_heads", [](A& a) { a.n_heads = 258; },
       {"GQA group size 129 (n_heads 258 / n_kv_heads 2) is not supported (allowed: 1..128)"}},
      {"head_dim", [](A& a) { a.head_dim = 72; }, {"head_dim 72 is not a multiple of 16 (allowed: 32..256, step 16)"}},
      {"head_dim", [](A& a) { a.head_dim = 16; }, {"head_dim 16 is out of range (allowed: 32..256, step 16)"}},
      {"head_dim", [](A& a) { a.head_dim = 272; }, {"head_dim 272 is out of range"}},
      {"head_dim", [](A& a) { a.head_dim = 0; }, {"head_dim 0 is out of range"}},
      {"head_dim", [](A& a) { a.head_dim = -32; }, {"head_dim -32 is out of range"}},
      {"page_size", [](A& a) { a.page_size = 3; },
       {"page_size 3 is not supported (allowed: a power of two in 1..256)"}},
      {"page_size", [](A& a) { a.page_size = 512; }, {"page_size 512 is not supported"}},
      {"page_size", [](A& a) { a.page_size = 0; }, {"page_size 0 is not supported"}},
      {"page_size", [](A& a) { a.page_size = -16; }, {"page_size -16 is not supported"}},
      {"num_pages", [](A& a) { a.num_pages = 0; }, {"num_pages 0 is not valid (allowed: >= 1)"}},
      {"num_pages", [](A& a) { a.num_pages = -5; }, {"num_pages -5 is not valid"}},
      {"max_pages_per_seq", [](A& a) { a.max_pages_per_seq = 0; },
       {"max_pages_per_seq 0 is not valid (allowed: >= 1)"}},
      {"max_pages_per_seq", [](A& a) { a.max_pages_per_seq = 1 << 27; },
       {"max_pages_per_seq 134217728 x page_size 16 = 2147483648 tokens exceeds the limit of "
        "2147467264 tokens"}},
      // 2^31 - 1 tokens fit an int but not the split plan's rounding to whole blocks.
      {"max_pages_per_seq", [](A& a) { a.page_size = 1; a.max_pages_per_seq = std::numeric_limits<int>::max(); },
       {"max_pages_per_seq 2147483647 x page_size 1 = 2147483647 tokens exceeds the limit"}},
      {"max_pages_per_seq", [](A& a) { a.page_size = 256; a.max_pages_per_seq = 8388545; },
       {"max_pages_per_seq 8388545 x page_size 256 = 2147467520 tokens exceeds the limit"}},
      {"scale", [](A& a) { a.scale = kNan; }, {"scale nan is not finite"}},
      {"scale", [](A& a) { a.scale = kInf; }, {"scale inf is not finite"}},
      {"scale", [](A& a) { a.scale = -kInf; }, {"scale -inf is not finite"}},
      {"page_table_stride", [](A& a) { a.page_table_stride = 4; },
       {"page_table_stride 4 is smaller than max_pages_per_seq 8"}},
      {"page_table_stride", [](A& a) { a.page_table_stride = -8; },
       {"page_table_stride -8 is smaller than max_pages_per_seq 8"}},
      {"q", [](A& a) { a.q = nullptr; }, {"q is null (a device pointer is required)"}},
      {"q", [](A& a) { a.q = fake_pointer<const void>(0x10008); }, {"q = 0x10008 is not 16-byte aligned"}},
      {"k_cache", [](A& a) { a.k_cache = nullptr; }, {"k_cache is null"}},
      {"k_cache", [](A& a) { a.k_cache = fake_pointer<const void>(0x20002); },
       {"k_cache = 0x20002 is not 16-byte aligned"}},
      {"v_cache", [](A& a) { a.v_cache = nullptr; }, {"v_cache is null"}},
      {"v_cache", [](A& a) { a.v_cache = fake_pointer<const void>(0x30004); },
       {"v_cache = 0x30004 is not 16-byte aligned"}},
      {"page_table", [](A& a) { a.page_table = nullptr; }, {"page_table is null"}},
      {"page_table", [](A& a) { a.page_table = fake_pointer<const std::int32_t>(0x40002); },
       {"page_table = 0x40002 is not 4-byte aligned"}},
      {"seq_lens", [](A& a) { a.seq_lens = fake_pointer<const std::int32_t>(0x50001); },
       {"seq_lens = 0x50001 is not 4-byte aligned"}},
      {"seq_lens", [](A& a) { a.seq_lens = fake_pointer<const std::int64_t>(0x50004); },
       {"seq_lens = 0x50004 is not 8-byte aligned"}},
      {"page_table", [](A& a) { a.page_table = fake_pointer<const std::int64_t>(0x40004); },
       {"page_table = 0x40004 is not 8-byte aligned"}},
      {"seq_lens_are_offsets", [](A& a) {
         a.seq_lens = nullptr;
         a.seq_lens_are_offsets = true;
       }, {"seq_lens_are_offsets is set but seq_lens is null"}},
      {"out", [](A& a) { a.out = nullptr; }, {"out is null"}},
      {"out", [](A& a) { a.out = fake_pointer<void>(0x60008); }, {"out = 0x60008 is not 16-byte aligned"}},
      {"workspace", [](A& a) { a.workspace = fake_pointer<void>(0x70008); },
       {"workspace = 0x70008 is not 16-byte aligned"}},
      {"workspace", [](A& a) { a.workspace = fake_pointer<void>(0x70001); },
       {"workspace = 0x70001 is not 16-byte aligned"}},
  };
  // Strides: query and output rows of one sequence are 128 elements (head_dim) apart at least;
  // 8 query heads make one output sequence 1024 elements long.
  add_stride_cases(&cases, "q_stride_head", &A::q_stride_head, 120, 128);
  add_stride_cases(&cases, "q_stride_batch", &A::q_stride_batch, 0, 0);
  add_stride_cases(&cases, "k_stride_head", &A::k_stride_head, 64, 128);
  add_stride_cases(&cases, "k_stride_token", &A::k_stride_token, 0, 0);
  add_stride_cases(&cases, "k_stride_page", &A::k_stride_page, 0, 0);
  add_stride_cases(&cases, "v_stride_head", &A::v_stride_head, 8, 128);
  add_stride_cases(&cases, "v_stride_token", &A::v_stride_token, 0, 0);
  add_stride_cases(&cases, "v_stride_page", &A::v_stride_page, 0, 0);
  add_stride_cases(&cases, "out_stride_head", &A::out_stride_head, 64, 128);
  add_stride_cases(&cases, "out_stride_batch", &A::out_stride_batch, 1016, 1024);

  const PagedDecodeArgs valid = valid_paged();
  REQUIRE_NOTHROW(resolve_paged_decode_args(valid));
  for (const auto& c : cases) check_rejected(valid, c, resolve_paged_decode_args, "paged_decode");
}

TEST_CASE("paged decode messages are complete sentences with the allowed set") {
  PagedDecodeArgs args = valid_paged();
  args.page_size = 3;
  CHECK_THROWS_WITH_AS(resolve_paged_decode_args(args),
                       "paged_decode: page_size 3 is not supported (allowed: a power of two in 1..256)",
                       astrai::InvalidArgument);
  args = valid_paged();
  args.out_stride_batch = 1016;
  CHECK_THROWS_WITH_AS(resolve_paged_decode_args(args),
                       "paged_decode: out_stride_batch 1016 makes rows overlap (allowed: >= 1024)",
                       astrai::InvalidArgument);
}

TEST_CASE("paged decode fills contiguous strides for every stride left at 0") {
  const PagedDecodeArgs r = resolve_paged_decode_args(valid_paged());
  CHECK(r.q_stride_head == 128);
  CHECK(r.q_stride_batch == 8 * 128);
  CHECK(r.out_stride_head == 128);
  CHECK(r.out_stride_batch == 8 * 128);
  CHECK(r.k_stride_head == 128);
  CHECK(r.k_stride_token == 2 * 128);
  CHECK(r.k_stride_page == 16 * 2 * 128);
  CHECK(r.v_stride_head == 128);
  CHECK(r.v_stride_token == 2 * 128);
  CHECK(r.v_stride_page == 16 * 2 * 128);
  CHECK(r.page_table_stride == 8);
}

TEST_CASE("paged decode derives outer default strides from explicit inner ones") {
  PagedDecodeArgs args = valid_paged();
  args.q_stride_head = 136;
  args.k_stride_head = 256;
  args.v_stride_token = 1024;
  args.out_stride_head = 192;
  args.page_table_stride = 11;
  const PagedDecodeArgs r = resolve_paged_decode_args(args);
  CHECK(r.q_stride_head == 136);
  CHECK(r.q_stride_batch == 8 * 136);
  CHECK(r.k_stride_token == 2 * 256);
  CHECK(r.k_stride_page == 16 * 2 * 256);
  CHECK(r.v_stride_head == 128);
  CHECK(r.v_stride_token == 1024);
  CHECK(r.v_stride_page == 16 * 1024);
  CHECK(r.out_stride_batch == 8 * 192);
  CHECK(r.page_table_stride == 11);
}

TEST_CASE("a scale of zero or below becomes one over the square root of head_dim") {
  for (int head_dim : {32, 64, 128, 256}) {
    for (float scale : {0.f, -1.f, -0.f}) {
      PagedDecodeArgs args = valid_paged();
      args.head_dim = head_dim;
      args.scale = scale;
      CAPTURE(head_dim);
      CAPTURE(scale);
      CHECK(resolve_paged_decode_args(args).scale ==
            doctest::Approx(1.0 / std::sqrt(static_cast<double>(head_dim))).epsilon(1e-6));
    }
  }
  PagedDecodeArgs explicit_scale = valid_paged();
  explicit_scale.scale = 0.25f;
  CHECK(resolve_paged_decode_args(explicit_scale).scale == 0.25f);
}

TEST_CASE("a paged decode batch of 0 accepts null pointers") {
  PagedDecodeArgs args = valid_paged();
  args.batch = 0;
  args.q = nullptr;
  args.k_cache = nullptr;
  args.v_cache = nullptr;
  args.page_table = nullptr;
  args.seq_lens = nullptr;
  args.out = nullptr;
  CHECK_NOTHROW(resolve_paged_decode_args(args));
  // The shape is still checked.
  args.head_dim = 72;
  CHECK_THROWS_AS(resolve_paged_decode_args(args), astrai::InvalidArgument);
}

TEST_CASE("paged decode accepts the edges of every allowed range") {
  using A = PagedDecodeArgs;
  const std::vector<std::pair<const char*, std::function<void(A&)>>> accepted = {
      {"fp16", [](A& a) { a.dtype = DType::fp16; }},
      {"head_dim 32", [](A& a) { a.head_dim = 32; }},
      {"head_dim 256", [](A& a) { a.head_dim = 256; }},
      {"page_size 1", [](A& a) { a.page_size = 1; }},
      {"page_size 256", [](A& a) { a.page_size = 256; }},
      {"group 128", [](A& a) { a.n_heads = 256; }},
      {"MHA", [](A& a) { a.n_kv_heads = 8; }},
      {"one query head, dense rows", [](A& a) {
         a.n_heads = 1; a.n_kv_heads = 1; a.q_stride_head = 8; a.out_stride_head = 8; a.out_stride_batch = 128;
       }},
      {"one KV head, dense rows", [](A& a) { a.n_kv_heads = 1; a.k_stride_head = 8; a.v_stride_head = 8; }},
      {"one sequence, short output stride", [](A& a) { a.batch = 1; a.out_stride_batch = 8; }},
      {"broadcast query", [](A& a) { a.q_stride_batch = 8; }},
      {"exact output stride", [](A& a) { a.out_stride_batch = 1024; }},
      {"wide page table", [](A& a) { a.page_table_stride = 4096; }},
      {"table at the token limit", [](A& a) { a.page_size = 1; a.max_pages_per_seq = 2147467264; }},
      {"table at the token limit, big pages", [](A& a) { a.page_size = 256; a.max_pages_per_seq = 8388544; }},
      {"aligned workspace", [](A& a) { a.workspace = fake_pointer<void>(0x70010); }},
      {"256-byte aligned workspace", [](A& a) { a.workspace = fake_pointer<void>(0x70100); }},
      {"any stream", [](A& a) { a.stream = fake_pointer<void>(0x1234); }},
  };
  for (const auto& [name, mutate] : accepted) {
    const std::string what = name;
    CAPTURE(what);
    PagedDecodeArgs args = valid_paged();
    mutate(args);
    CHECK_NOTHROW(resolve_paged_decode_args(args));
  }
}

TEST_CASE("every decode argument rejects a bad value and the message names it") {
  using A = astrai::DecodeArgs;
  const std::vector<BadCase<A>> cases = {
      {"dtype", [](A& a) { a.dtype = static_cast<DType>(5); }, {"dtype 5 is not valid (allowed: bf16, fp16)"}},
      {"batch", [](A& a) { a.batch = -2; }, {"batch -2 is not valid (allowed: >= 0)"}},
      {"kv_len", [](A& a) { a.kv_len = -1; }, {"kv_len -1 is not valid (allowed: >= 0)"}},
      {"n_heads", [](A& a) { a.n_heads = 0; }, {"n_heads 0 is not valid (allowed: >= 1)"}},
      {"n_kv_heads", [](A& a) { a.n_kv_heads = 3; }, {"n_heads 8 is not a multiple of n_kv_heads 3"}},
      {"head_dim", [](A& a) { a.head_dim = 72; }, {"head_dim 72 is not a multiple of 16 (allowed: 32..256, step 16)"}},
      {"head_dim", [](A& a) { a.head_dim = 288; }, {"head_dim 288 is out of range (allowed: 32..256, step 16)"}},
      {"causal_offset", [](A& a) { a.causal_offset = -2; },
       {"causal_offset -2 is not valid (allowed: -1 for no limit, or >= 0)"}},
      {"scale", [](A& a) { a.scale = kNan; }, {"is not finite"}},
      {"scale", [](A& a) { a.scale = kInf; }, {"scale inf is not finite"}},
      {"q_stride_head", [](A& a) { a.q_stride_head = 12; }, {"q_stride_head 12 is not a multiple of 8 elements"}},
      {"k_stride_seq", [](A& a) { a.k_stride_seq = -8; }, {"k_stride_seq -8 is not valid"}},
      {"v_stride_head", [](A& a) { a.v_stride_head = 64; }, {"v_stride_head 64 makes rows overlap (allowed: >= 128)"}},
      {"out_stride_batch", [](A& a) { a.out_stride_batch = 128; },
       {"out_stride_batch 128 makes rows overlap (allowed: >= 1024)"}},
      {"mask_stride_batch", [](A& a) {
         a.mask = fake_pointer<const bool>(0x50000);
         a.mask_stride_batch = 50;
       }, {"mask_stride_batch 50 is smaller than kv_len 100"}},
      {"q", [](A& a) { a.q = nullptr; }, {"q is null (a device pointer is required)"}},
      {"k", [](A& a) { a.k = fake_pointer<const void>(0x20008); }, {"is not 16-byte aligned"}},
      {"v", [](A& a) { a.v = nullptr; }, {"v is null"}},
      {"out", [](A& a) { a.out = fake_pointer<void>(0x40002); }, {"is not 16-byte aligned"}},
      {"lse", [](A& a) { a.lse = fake_pointer<float>(0x60002); }, {"is not 4-byte aligned"}},
      {"workspace", [](A& a) { a.workspace = fake_pointer<void>(0x70004); }, {"is not 16-byte aligned"}},
  };
  REQUIRE_NOTHROW(astrai::detail::resolve_decode_args(valid_decode()));
  for (const auto& c : cases) check_rejected(valid_decode(), c, astrai::detail::resolve_decode_args, "decode");
}

TEST_CASE("decode fills contiguous strides, keeps kv_len 0 free of K/V pointers") {
  const auto a = astrai::detail::resolve_decode_args(valid_decode());
  CHECK(a.q_stride_head == 128);
  CHECK(a.q_stride_batch == 8 * 128);
  CHECK(a.k_stride_seq == 2 * 128);
  CHECK(a.k_stride_batch == 100 * 2 * 128);
  CHECK(a.mask_stride_batch == 100);
  CHECK(a.scale == doctest::Approx(1.0 / std::sqrt(128.0)));
  astrai::DecodeArgs empty = valid_decode();
  empty.kv_len = 0;
  empty.k = nullptr;
  empty.v = nullptr;
  CHECK_NOTHROW(astrai::detail::resolve_decode_args(empty));
}

TEST_CASE("the paged decode extras reject bad values and the message names them") {
  using A = PagedDecodeArgs;
  const std::vector<BadCase<A>> cases = {
      {"page_table_rows", [](A& a) { a.page_table_rows = -1; },
       {"page_table_rows -1 is not valid (allowed: >= 0; 0 means batch)"}},
      {"page_table_rows", [](A& a) { a.page_table_rows = 1; },
       {"page_table_rows 1 is smaller than batch 2 without req_indices"}},
      {"req_indices", [](A& a) { a.req_indices = fake_pointer<const std::int32_t>(0x70002); },
       {"is not 4-byte aligned"}},
      {"req_indices", [](A& a) { a.req_indices = fake_pointer<const std::int64_t>(0x70004); },
       {"is not 8-byte aligned"}},
      {"mask_stride_batch", [](A& a) {
         a.mask = fake_pointer<const bool>(0x80000);
         a.mask_stride_batch = 100;
       }, {"mask_stride_batch 100 is smaller than the mask row length 128"}},
      {"new_v", [](A& a) { a.new_k = fake_pointer<const void>(0x90000); },
       {"the fused append needs both or neither"}},
      {"new_k_stride_head", [](A& a) {
         a.new_k = fake_pointer<const void>(0x90000);
         a.new_v = fake_pointer<const void>(0xa0000);
         a.new_k_stride_head = 12;
       }, {"new_k_stride_head 12 is not a multiple of 8 elements"}},
      {"new_v", [](A& a) {
         a.new_k = fake_pointer<const void>(0x90000);
         a.new_v = fake_pointer<const void>(0xa0004);
       }, {"new_v = ", "is not 16-byte aligned"}},
      {"lse", [](A& a) { a.lse = fake_pointer<float>(0xb0001); }, {"is not 4-byte aligned"}},
  };
  for (const auto& c : cases) check_rejected(valid_paged(), c, resolve_paged_decode_args, "paged_decode");
}

TEST_CASE("bad arguments to every public call throw InvalidArgument before any GPU is touched") {
  // On a machine without a GPU, reaching the driver would throw CudaError instead.
  auto& runtime = astrai::Runtime::get();
  astrai::DecodeArgs decode = valid_decode();
  decode.head_dim = 72;
  CHECK_THROWS_AS(runtime.decode(decode), astrai::InvalidArgument);
  PagedDecodeArgs paged = valid_paged();
  paged.page_size = 3;
  CHECK_THROWS_AS(runtime.paged_decode(paged), astrai::InvalidArgument);
  RotaryArgs rotary = valid_rotary();
  rotary.head_dim = 12;
  CHECK_THROWS_AS(runtime.rotary_emb(rotary), astrai::InvalidArgument);
  astrai::PrefillArgs prefill;
  prefill.batch = 1;
  prefill.q_len = 4;
  prefill.kv_len = 4;
  prefill.n_heads = 2;
  prefill.n_kv_heads = 2;
  prefill.head_dim = 64;
  prefill.causal_offset = -3;
  CHECK_THROWS_AS(runtime.prefill(prefill), astrai::InvalidArgument);
  astrai::PagedPrefillArgs paged_prefill;
  paged_prefill.batch = 1;
  paged_prefill.n_heads = 2;
  paged_prefill.n_kv_heads = 2;
  paged_prefill.head_dim = 64;
  paged_prefill.page_size = 6;
  CHECK_THROWS_AS(runtime.paged_prefill(paged_prefill), astrai::InvalidArgument);
}
TEST_CASE("validate_args checks as the call would, without a GPU or the runtime") {
  CHECK_NOTHROW(astrai::validate_args(valid_paged()));
  CHECK_NOTHROW(astrai::validate_args(valid_rotary()));
  CHECK_NOTHROW(astrai::validate_args(valid_decode()));
  CHECK_NOTHROW(astrai::validate_args(valid_prefill()));
  CHECK_NOTHROW(astrai::validate_args(valid_paged_prefill()));
  PagedDecodeArgs paged = valid_paged();
  paged.head_dim = 72;
  CHECK_THROWS_WITH_AS(astrai::validate_args(paged),
                       "paged_decode: head_dim 72 is not a multiple of 16 (allowed: 32..256, step 16)",
                       astrai::InvalidArgument);
  RotaryArgs rotary = valid_rotary();
  rotary.head_dim = 12;
  CHECK_THROWS_AS(astrai::validate_args(rotary), astrai::InvalidArgument);
  astrai::DecodeArgs decode = valid_decode();
  decode.n_heads = 0;
  CHECK_THROWS_AS(astrai::validate_args(decode), astrai::InvalidArgument);
  PrefillArgs prefill = valid_prefill();
  prefill.causal_offset = -3;
  CHECK_THROWS_AS(astrai::validate_args(prefill), astrai::InvalidArgument);
  PagedPrefillArgs paged_prefill = valid_paged_prefill();
  paged_prefill.page_size = 6;
  CHECK_THROWS_AS(astrai::validate_args(paged_prefill), astrai::InvalidArgument);
}

}  // TEST_SUITE

TEST_CASE("paged decode takes int32 or int64 index tables, lengths or offsets, or no lengths") {
  PagedDecodeArgs a = valid_paged();
  a.page_table = fake_pointer<const std::int64_t>(0x40008);
  a.req_indices = fake_pointer<const std::int64_t>(0x70008);
  a.seq_lens = fake_pointer<const std::int64_t>(0x50008);
  a.seq_lens_are_offsets = true;
  PagedDecodeArgs r = resolve_paged_decode_args(a);
  CHECK(r.page_table.wide);
  CHECK(r.req_indices.wide);
  CHECK(r.seq_lens.wide);
  CHECK(r.seq_lens_are_offsets);
  CHECK(astrai::detail::index_layout_bits(r.page_table, r.req_indices, r.seq_lens, r.seq_lens_are_offsets) ==
        (astrai::kWidePageTable | astrai::kWideReqIndices | astrai::kWideSeqLens | astrai::kSeqLensIndptr));
  // No lengths: every request fills its table row.
  a = valid_paged();
  a.seq_lens = nullptr;
  r = resolve_paged_decode_args(a);
  CHECK(r.seq_lens == nullptr);
  CHECK(astrai::detail::index_layout_bits(r.page_table, r.req_indices, r.seq_lens, false) == 0u);
}
