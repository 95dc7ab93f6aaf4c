// Argument checks of prefill (contiguous KV) and paged_prefill (ragged queries, paged KV).
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

TEST_CASE("the valid prefill fixtures are accepted") {
  const PrefillArgs prefill = resolve_prefill_args(valid_prefill());
  CHECK(prefill.batch == 2);
  CHECK(prefill.q == valid_prefill().q);
  const PagedPrefillArgs paged = resolve_paged_prefill_args(valid_paged_prefill());
  CHECK(paged.total_q == 40);
  CHECK(paged.qo_indptr == valid_paged_prefill().qo_indptr);
}

TEST_CASE("every prefill argument rejects a bad value and the message names it") {
  using A = PrefillArgs;
  std::vector<BadCase<A>> cases = {
      {"dtype", [](A& a) { a.dtype = static_cast<DType>(9); }, {"dtype 9 is not valid (allowed: bf16, fp16)"}},
      {"batch", [](A& a) { a.batch = -1; }, {"batch -1 is not valid (allowed: >= 0)"}},
      {"batch", [](A& a) { a.batch = 65536; a.mask = nullptr; },
       {"batch 65536 exceeds the launch grid limit (allowed: 0..65535)"}},
      {"q_len", [](A& a) { a.q_len = -1; }, {"q_len -1 is not valid (allowed: >= 0)"}},
      {"kv_len", [](A& a) { a.kv_len = -2; }, {"kv_len -2 is not valid (allowed: >= 0)"}},
      {"n_heads", [](A& a) { a.n_heads = 0; }, {"n_heads 0 is not valid (allowed: >= 1)"}},
      {"n_heads", [](A& a) { a.n_heads = 65536; },
       {"n_heads 65536 exceeds the launch grid limit (allowed: 1..65535)"}},
      {"n_heads", [](A& a) { a.n_heads = 258; },
       {"GQA group size 129 (n_heads 258 / n_kv_heads 2) is not supported (allowed: 1..128)"}},
      {"n_kv_heads", [](A& a) { a.n_kv_heads = 0; }, {"n_kv_heads 0 is not valid (allowed: >= 1)"}},
      {"n_kv_heads", [](A& a) { a.n_kv_heads = 3; }, {"n_heads 8 is not a multiple of n_kv_heads 3"}},
      {"head_dim", [](A& a) { a.head_dim = 72; },
       {"head_dim 72 is not a multiple of 16 (allowed: 32..256, step 16)"}},
      {"head_dim", [](A& a) { a.head_dim = 16; }, {"head_dim 16 is out of range (allowed: 32..256, step 16)"}},
      {"head_dim", [](A& a) { a.head_dim = 272; }, {"head_dim 272 is out of range"}},
      {"causal_offset", [](A& a) { a.causal_offset = -2; },
       {"causal_offset -2 is not valid (allowed: -1 for non-causal, or >= 0)"}},
      {"causal_offset", [](A& a) { a.causal_offset = -3; }, {"causal_offset -3 is not valid"}},
      {"scale", [](A& a) { a.scale = kNan; }, {"scale nan is not finite"}},
      {"scale", [](A& a) { a.scale = -kInf; }, {"scale -inf is not finite"}},
      {"mask_batch", [](A& a) { a.mask_batch = 3; },
       {"mask_batch 3 is not valid (allowed: 1 to broadcast, or batch 2; 0 means batch)"}},
      {"mask_batch", [](A& a) { a.mask_batch = -1; }, {"mask_batch -1 is not valid"}},
      {"mask_q_len", [](A& a) { a.mask_q_len = 5; },
       {"mask_q_len 5 is not valid (allowed: 1 to broadcast, or q_len 100)"}},
      {"mask_q_len", [](A& a) { a.mask_q_len = 0; }, {"mask_q_len 0 is not valid"}},
      {"mask_stride_q", [](A& a) { a.mask_stride_q = -1; },
       {"mask_stride_q -1 is not valid (allowed: > 0, or 0 for contiguous)"}},
      {"mask_stride_q", [](A& a) { a.mask_q_len = 100; a.mask_stride_q = 200; },
       {"mask_stride_q 200 is smaller than kv_len 300"}},
      {"mask_stride_batch", [](A& a) { a.mask_stride_batch = -5; },
       {"mask_stride_batch -5 is not valid (allowed: > 0, or 0 for contiguous)"}},
      {"mask_stride_batch", [](A& a) { a.mask_stride_batch = 100; },
       {"mask_stride_batch 100 makes masks overlap (allowed: >= 300)"}},
      {"mask_stride_batch", [](A& a) { a.mask_q_len = 100; a.mask_stride_batch = 29999; },
       {"mask_stride_batch 29999 makes masks overlap (allowed: >= 30000)"}},
      {"q", [](A& a) { a.q = nullptr; }, {"q is null (a device pointer is required)"}},
      {"q", [](A& a) { a.q = fake_pointer<const void>(0x10008); }, {"q = 0x10008 is not 16-byte aligned"}},
      {"k", [](A& a) { a.k = nullptr; }, {"k is null"}},
      {"k", [](A& a) { a.k = fake_pointer<const void>(0x20004); }, {"k = 0x20004 is not 16-byte aligned"}},
      {"v", [](A& a) { a.v = nullptr; }, {"v is null"}},
      {"v", [](A& a) { a.v = fake_pointer<const void>(0x30002); }, {"v = 0x30002 is not 16-byte aligned"}},
      {"out", [](A& a) { a.out = nullptr; }, {"out is null"}},
      {"out", [](A& a) { a.out = fake_pointer<void>(0x40008); }, {"out = 0x40008 is not 16-byte aligned"}},
      {"lse", [](A& a) { a.lse = fake_pointer<float>(0x60002); }, {"lse = 0x60002 is not 4-byte aligned"}},
      // bhld output: heads 12800 apart, positions 128 apart, prompts 102400 apart.
      {"out_stride_seq", [](A& a) { a.out_stride_head = 12800; a.out_stride_seq = 64; a.out_stride_batch = 102400; },
       {"out_stride_seq 64 makes rows overlap (allowed: >= 128)"}},
      {"out_stride_head", [](A& a) { a.out_stride_head = 12792; a.out_stride_seq = 128; a.out_stride_batch = 102400; },
       {"out_stride_head 12792 makes rows overlap (allowed: >= 12800)"}},
      {"out_stride_batch", [](A& a) { a.out_stride_head = 12800; a.out_stride_seq = 128; a.out_stride_batch = 102392; },
       {"out_stride_batch 102392 makes rows overlap (allowed: >= 102400)"}},
  };
  // One query position of 8 heads is 1024 elements; a prompt of 100 of them 102400.
  add_row_stride_cases(&cases, "q_stride_head", &A::q_stride_head, 120, 128);
  add_row_stride_cases(&cases, "q_stride_seq", &A::q_stride_seq, 0, 0);
  add_row_stride_cases(&cases, "q_stride_batch", &A::q_stride_batch, 0, 0);
  add_row_stride_cases(&cases, "k_stride_head", &A::k_stride_head, 64, 128);
  add_row_stride_cases(&cases, "k_stride_seq", &A::k_stride_seq, 0, 0);
  add_row_stride_cases(&cases, "k_stride_batch", &A::k_stride_batch, 0, 0);
  add_row_stride_cases(&cases, "v_stride_head", &A::v_stride_head, 8, 128);
  add_row_stride_cases(&cases, "v_stride_seq", &A::v_stride_seq, 0, 0);
  add_row_stride_cases(&cases, "v_stride_batch", &A::v_stride_batch, 0, 0);
  add_row_stride_cases(&cases, "out_stride_head", &A::out_stride_head, 64, 128);
  add_row_stride_cases(&cases, "out_stride_seq", &A::out_stride_seq, 1016, 1024);
  add_row_stride_cases(&cases, "out_stride_batch", &A::out_stride_batch, 102392, 102400);

  const PrefillArgs valid = valid_prefill();
  REQUIRE_NOTHROW(resolve_prefill_args(valid));
  for (const auto& c : cases) check_rejected(valid, c, resolve_prefill_args, "prefill");
}

TEST_CASE("prefill messages are complete sentences with the allowed set") {
  PrefillArgs args = valid_prefill();
  args.causal_offset = -3;
  CHECK_THROWS_WITH_AS(resolve_prefill_args(args),
                       "prefill: causal_offset -3 is not valid (allowed: -1 for non-causal, or >= 0)",
                       astrai::InvalidArgument);
  args = valid_prefill();
  args.mask_q_len = 7;
  CHECK_THROWS_WITH_AS(resolve_prefill_args(args),
                       "prefill: mask_q_len 7 is not valid (allowed: 1 to broadcast, or q_len 100)",
                       astrai::InvalidArgument);
}

TEST_CASE("prefill fills contiguous strides and the mask shape for every value left at 0") {
  const PrefillArgs r = resolve_prefill_args(valid_prefill());
  CHECK(r.q_stride_head == 128);
  CHECK(r.q_stride_seq == 8 * 128);
  CHECK(r.q_stride_batch == 100 * 8 * 128);
  CHECK(r.k_stride_head == 128);
  CHECK(r.k_stride_seq == 2 * 128);
  CHECK(r.k_stride_batch == 300 * 2 * 128);
  CHECK(r.v_stride_head == 128);
  CHECK(r.v_stride_seq == 2 * 128);
  CHECK(r.v_stride_batch == 300 * 2 * 128);
  CHECK(r.out_stride_head == 128);
  CHECK(r.out_stride_seq == 8 * 128);
  CHECK(r.out_stride_batch == 100 * 8 * 128);
  CHECK(r.mask_batch == 2);
  CHECK(r.mask_q_len == 1);
  CHECK(r.mask_stride_q == 300);
  CHECK(r.mask_stride_batch == 300);
  CHECK(r.scale == doctest::Approx(1.0 / std::sqrt(128.0)).epsilon(1e-6));

  PrefillArgs per_query = valid_prefill();
  per_query.mask_q_len = 100;
  per_query.q_stride_seq = 2048;
  per_query.k_stride_head = 256;
  const PrefillArgs q = resolve_prefill_args(per_query);
  CHECK(q.mask_stride_q == 300);
  CHECK(q.mask_stride_batch == 100 * 300);
  CHECK(q.q_stride_batch == 100 * 2048);
  CHECK(q.k_stride_seq == 2 * 256);
  CHECK(q.k_stride_batch == 300 * 2 * 256);

  // Empty sequences still get positive strides (nothing is read through them).
  PrefillArgs empty = valid_prefill();
  empty.q_len = 0;
  empty.kv_len = 0;
  const PrefillArgs e = resolve_prefill_args(empty);
  CHECK(e.q_stride_batch == e.q_stride_seq);
  CHECK(e.k_stride_batch == e.k_stride_seq);
  CHECK(e.out_stride_batch == e.out_stride_seq);
  CHECK(e.mask_stride_q == 1);
}

TEST_CASE("prefill accepts the edges of every allowed range") {
  using A = PrefillArgs;
  check_accepted<A>(valid_prefill(), {
      {"fp16", [](A& a) { a.dtype = DType::fp16; }},
      {"head_dim 32", [](A& a) { a.head_dim = 32; }},
      {"head_dim 256", [](A& a) { a.head_dim = 256; }},
      {"non-causal", [](A& a) { a.causal_offset = -1; }},
      {"causal from 0", [](A& a) { a.causal_offset = 0; }},
      {"causal past the end", [](A& a) { a.causal_offset = std::numeric_limits<int>::max(); }},
      {"group 128", [](A& a) { a.n_heads = 256; }},
      {"MHA", [](A& a) { a.n_kv_heads = 8; }},
      {"65535 heads", [](A& a) { a.n_heads = 65535; a.n_kv_heads = 65535; }},
      {"65535 prompts", [](A& a) { a.batch = 65535; a.mask_batch = 1; }},
      {"empty KV without K and V", [](A& a) { a.kv_len = 0; a.k = nullptr; a.v = nullptr; }},
      {"no queries without pointers",
       [](A& a) { a.q_len = 0; a.q = nullptr; a.out = nullptr; a.k = nullptr; a.v = nullptr; a.mask_q_len = 1; }},
      {"empty batch without pointers",
       [](A& a) { a.batch = 0; a.q = nullptr; a.k = nullptr; a.v = nullptr; a.out = nullptr; a.mask = nullptr; }},
      {"broadcast mask", [](A& a) { a.mask_batch = 1; }},
      {"explicit mask batch", [](A& a) { a.mask_batch = 2; }},
      {"3D mask", [](A& a) { a.mask_q_len = 100; }},
      {"3D broadcast mask", [](A& a) { a.mask_batch = 1; a.mask_q_len = 100; }},
      {"odd mask address and strides", [](A& a) {
         a.mask = fake_pointer<const bool>(0x50001); a.mask_q_len = 100; a.mask_stride_q = 301;
         a.mask_stride_batch = 30101;
       }},
      {"a mask shape is ignored without a mask", [](A& a) { a.mask = nullptr; a.mask_batch = 5; a.mask_q_len = 3; }},
      {"no lse", [](A& a) { a.lse = nullptr; }},
      {"one query, short output stride",
       [](A& a) { a.q_len = 1; a.out_stride_seq = 1024; a.out_stride_batch = 1024; a.mask_q_len = 1; }},
      {"one head, dense rows", [](A& a) {
         a.n_heads = 1; a.n_kv_heads = 1; a.q_stride_head = 8; a.out_stride_head = 8; a.out_stride_seq = 128;
       }},
      {"bhld layout", [](A& a) {
         a.q_stride_head = 100 * 128; a.q_stride_seq = 128; a.q_stride_batch = 8 * 100 * 128;
         a.out_stride_head = 100 * 128; a.out_stride_seq = 128; a.out_stride_batch = 8 * 100 * 128;
       }},
      {"padded rows", [](A& a) { a.k_stride_head = 136; a.v_stride_seq = 4096; a.out_stride_head = 136; }},
  }, resolve_prefill_args);
}

TEST_CASE("every paged prefill argument rejects a bad value and the message names it") {
  using A = PagedPrefillArgs;
  std::vector<BadCase<A>> cases = {
      {"dtype", [](A& a) { a.dtype = static_cast<DType>(4); }, {"dtype 4 is not valid (allowed: bf16, fp16)"}},
      {"batch", [](A& a) { a.batch = -1; }, {"batch -1 is not valid (allowed: >= 0)"}},
      {"batch", [](A& a) { a.batch = 65536; }, {"batch 65536 exceeds the launch grid limit (allowed: 0..65535)"}},
      {"total_q", [](A& a) { a.total_q = -1; }, {"total_q -1 is not valid (allowed: >= 0)"}},
      {"max_q_len", [](A& a) { a.max_q_len = -1; }, {"max_q_len -1 is not valid (allowed: >= 0)"}},
      {"max_q_len", [](A& a) { a.max_q_len = 41; },
       {"max_q_len 41 is not valid for total_q 40 over batch 3 (allowed: 14..40)"}},
      {"max_q_len", [](A& a) { a.max_q_len = 13; }, {"max_q_len 13 is not valid for total_q 40"}},
      {"max_q_len", [](A& a) { a.max_q_len = 0; }, {"max_q_len 0 is not valid for total_q 40"}},
      {"n_heads", [](A& a) { a.n_heads = -4; }, {"n_heads -4 is not valid (allowed: >= 1)"}},
      {"n_heads", [](A& a) { a.n_heads = 258; }, {"GQA group size 129"}},
      {"n_kv_heads", [](A& a) { a.n_kv_heads = 16; }, {"n_heads 8 is not a multiple of n_kv_heads 16"}},
      {"head_dim", [](A& a) { a.head_dim = 100; }, {"head_dim 100 is not a multiple of 16"}},
      {"head_dim", [](A& a) { a.head_dim = 0; }, {"head_dim 0 is out of range"}},
      {"page_size", [](A& a) { a.page_size = 3; },
       {"page_size 3 is not supported (allowed: a power of two in 1..256)"}},
      {"page_size", [](A& a) { a.page_size = 512; }, {"page_size 512 is not supported"}},
      {"page_size", [](A& a) { a.page_size = 0; }, {"page_size 0 is not supported"}},
      {"num_pages", [](A& a) { a.num_pages = 0; }, {"num_pages 0 is not valid (allowed: >= 1)"}},
      {"max_pages_per_seq", [](A& a) { a.max_pages_per_seq = 0; },
       {"max_pages_per_seq 0 is not valid (allowed: >= 1)"}},
      {"max_pages_per_seq", [](A& a) { a.page_size = 256; a.max_pages_per_seq = 1 << 24; },
       {"max_pages_per_seq 16777216 x page_size 256 = 4294967296 tokens exceeds the limit of "
        "2147483647 tokens"}},
      {"scale", [](A& a) { a.scale = kInf; }, {"scale inf is not finite"}},
      {"page_table_stride", [](A& a) { a.page_table_stride = 4; },
       {"page_table_stride 4 is smaller than max_pages_per_seq 8"}},
      {"mask_stride_q", [](A& a) { a.mask = fake_pointer<const bool>(0x80000); a.mask_stride_q = -3; },
       {"mask_stride_q -3 is not valid (allowed: > 0, or 0 for contiguous)"}},
      {"q", [](A& a) { a.q = nullptr; }, {"q is null (a device pointer is required)"}},
      {"q", [](A& a) { a.q = fake_pointer<const void>(0x10004); }, {"q = 0x10004 is not 16-byte aligned"}},
      {"qo_indptr", [](A& a) { a.qo_indptr = nullptr; }, {"qo_indptr is null"}},
      {"qo_indptr", [](A& a) { a.qo_indptr = fake_pointer<const std::int32_t>(0x20002); },
       {"qo_indptr = 0x20002 is not 4-byte aligned"}},
      {"k_cache", [](A& a) { a.k_cache = nullptr; }, {"k_cache is null"}},
      {"k_cache", [](A& a) { a.k_cache = fake_pointer<const void>(0x30008); },
       {"k_cache = 0x30008 is not 16-byte aligned"}},
      {"v_cache", [](A& a) { a.v_cache = nullptr; }, {"v_cache is null"}},
      {"v_cache", [](A& a) { a.v_cache = fake_pointer<const void>(0x40001); },
       {"v_cache = 0x40001 is not 16-byte aligned"}},
      {"page_table", [](A& a) { a.page_table = nullptr; }, {"page_table is null"}},
      {"page_table", [](A& a) { a.page_table = fake_pointer<const std::int32_t>(0x50001); },
       {"page_table = 0x50001 is not 4-byte aligned"}},
      {"seq_lens", [](A& a) { a.seq_lens = nullptr; }, {"seq_lens is null"}},
      {"seq_lens", [](A& a) { a.seq_lens = fake_pointer<const std::int32_t>(0x60002); },
       {"seq_lens = 0x60002 is not 4-byte aligned"}},
      {"qo_indptr", [](A& a) { a.qo_indptr = fake_pointer<const std::int64_t>(0x60004); },
       {"qo_indptr = 0x60004 is not 8-byte aligned"}},
      {"req_indices", [](A& a) { a.req_indices = fake_pointer<const std::int64_t>(0x60004); },
       {"req_indices = 0x60004 is not 8-byte aligned"}},
      {"page_table_rows", [](A& a) { a.page_table_rows = 2; },
       {"page_table_rows 2 is smaller than batch 3 without req_indices"}},
      {"mask_stride_batch", [](A& a) {
         a.mask = fake_pointer<const bool>(0x80000);
         a.mask_rows_per_request = true;
       }, {"mask_stride_batch 0 is not valid"}},
      {"out", [](A& a) { a.out = nullptr; }, {"out is null"}},
      {"out", [](A& a) { a.out = fake_pointer<void>(0x70008); }, {"out = 0x70008 is not 16-byte aligned"}},
      {"lse", [](A& a) { a.lse = fake_pointer<float>(0x90001); }, {"lse = 0x90001 is not 4-byte aligned"}},
      {"out_stride_token", [](A& a) { a.out_stride_head = 40 * 128; a.out_stride_token = 120; },
       {"out_stride_token 120 makes rows overlap (allowed: >= 128)"}},
  };
  add_row_stride_cases(&cases, "q_stride_head", &A::q_stride_head, 120, 128);
  add_row_stride_cases(&cases, "q_stride_token", &A::q_stride_token, 0, 0);
  add_row_stride_cases(&cases, "k_stride_head", &A::k_stride_head, 64, 128);
  add_row_stride_cases(&cases, "k_stride_token", &A::k_stride_token, 0, 0);
  add_row_stride_cases(&cases, "k_stride_page", &A::k_stride_page, 0, 0);
  add_row_stride_cases(&cases, "v_stride_head", &A::v_stride_head, 8, 128);
  add_row_stride_cases(&cases, "v_stride_token", &A::v_stride_token, 0, 0);
  add_row_stride_cases(&cases, "v_stride_page", &A::v_stride_page, 0, 0);
  add_row_stride_cases(&cases, "out_stride_head", &A::out_stride_head, 64, 128);
  add_row_stride_cases(&cases, "out_stride_token", &A::out_stride_token, 1016, 1024);

  const PagedPrefillArgs valid = valid_paged_prefill();
  REQUIRE_NOTHROW(resolve_paged_prefill_args(valid));
  for (const auto& c : cases) check_rejected(valid, c, resolve_paged_prefill_args, "paged_prefill");
}

TEST_CASE("paged prefill fills contiguous strides for every stride left at 0") {
  const PagedPrefillArgs r = resolve_paged_prefill_args(valid_paged_prefill());
  CHECK(r.q_stride_head == 128);
  CHECK(r.q_stride_token == 8 * 128);
  CHECK(r.out_stride_head == 128);
  CHECK(r.out_stride_token == 8 * 128);
  CHECK(r.k_stride_head == 128);
  CHECK(r.k_stride_token == 2 * 128);
  CHECK(r.k_stride_page == 16 * 2 * 128);
  CHECK(r.v_stride_head == 128);
  CHECK(r.v_stride_token == 2 * 128);
  CHECK(r.v_stride_page == 16 * 2 * 128);
  CHECK(r.page_table_stride == 8);
  CHECK(r.mask_stride_q == 8 * 16);
  CHECK(r.scale == doctest::Approx(1.0 / std::sqrt(128.0)).epsilon(1e-6));

  PagedPrefillArgs explicit_inner = valid_paged_prefill();
  explicit_inner.q_stride_head = 136;
  explicit_inner.v_stride_token = 1024;
  explicit_inner.scale = 0.5f;
  const PagedPrefillArgs e = resolve_paged_prefill_args(explicit_inner);
  CHECK(e.q_stride_token == 8 * 136);
  CHECK(e.v_stride_page == 16 * 1024);
  CHECK(e.scale == 0.5f);
}

TEST_CASE("paged prefill accepts the edges of every allowed range") {
  using A = PagedPrefillArgs;
  check_accepted<A>(valid_paged_prefill(), {
      {"bf16", [](A& a) { a.dtype = DType::bf16; }},
      {"non-causal", [](A& a) { a.causal = false; }},
      {"page_size 1", [](A& a) { a.page_size = 1; }},
      {"page_size 256", [](A& a) { a.page_size = 256; }},
      {"table at the int limit", [](A& a) { a.page_size = 1; a.max_pages_per_seq = std::numeric_limits<int>::max(); }},
      {"one request holds every row", [](A& a) { a.max_q_len = 40; }},
      {"rows spread evenly", [](A& a) { a.max_q_len = 14; }},
      {"one request", [](A& a) { a.batch = 1; a.max_q_len = 40; }},
      {"no rows without pointers", [](A& a) {
         a.total_q = 0; a.max_q_len = 0; a.q = nullptr; a.qo_indptr = nullptr; a.k_cache = nullptr; a.v_cache = nullptr;
         a.page_table = nullptr; a.seq_lens = nullptr; a.out = nullptr;
       }},
      {"empty batch without pointers", [](A& a) {
         a.batch = 0; a.q = nullptr; a.qo_indptr = nullptr; a.k_cache = nullptr; a.v_cache = nullptr;
         a.page_table = nullptr; a.seq_lens = nullptr; a.out = nullptr;
       }},
      {"odd mask address and stride", [](A& a) { a.mask = fake_pointer<const bool>(0x80003); a.mask_stride_q = 77; }},
      {"aligned lse", [](A& a) { a.lse = fake_pointer<float>(0x90004); }},
      {"interleaved K/V pool", [](A& a) { a.k_stride_page = 2 * 16 * 256; a.v_stride_page = 2 * 16 * 256; }},
      {"wide page table", [](A& a) { a.page_table_stride = 4096; }},
      {"group 128", [](A& a) { a.n_heads = 256; }},
      {"head-major output", [](A& a) { a.out_stride_head = 40 * 128; a.out_stride_token = 128; }},
      {"one row, short output stride", [](A& a) { a.total_q = 1; a.max_q_len = 1; a.out_stride_token = 8; }},
  }, resolve_paged_prefill_args);
}

TEST_CASE("resolving prefill arguments twice changes nothing") {
  const PrefillArgs once = resolve_prefill_args(valid_prefill());
  const PrefillArgs twice = resolve_prefill_args(once);
  CHECK(twice.q_stride_batch == once.q_stride_batch);
  CHECK(twice.k_stride_batch == once.k_stride_batch);
  CHECK(twice.out_stride_batch == once.out_stride_batch);
  CHECK(twice.mask_batch == once.mask_batch);
  CHECK(twice.mask_stride_batch == once.mask_stride_batch);
  CHECK(twice.scale == once.scale);
  const PagedPrefillArgs paged_once = resolve_paged_prefill_args(valid_paged_prefill());
  const PagedPrefillArgs paged_twice = resolve_paged_prefill_args(paged_once);
  CHECK(paged_twice.k_stride_page == paged_once.k_stride_page);
  CHECK(paged_twice.out_stride_token == paged_once.out_stride_token);
  CHECK(paged_twice.mask_stride_q == paged_once.mask_stride_q);
  CHECK(paged_twice.scale == paged_once.scale);
}
}  // TEST_SUITE

TEST_CASE("paged prefill takes int64 tables, request rows, offsets and per-request mask rows") {
  PagedPrefillArgs a = valid_paged_prefill();
  a.page_table = fake_pointer<const std::int64_t>(0x50008);
  a.seq_lens = fake_pointer<const std::int64_t>(0x60008);
  a.qo_indptr = fake_pointer<const std::int64_t>(0x70008);
  a.req_indices = fake_pointer<const std::int32_t>(0x90000);
  a.page_table_rows = 1;  // fewer rows than requests: req_indices picks them
  a.seq_lens_are_offsets = true;
  a.mask = fake_pointer<const bool>(0x80000);
  a.mask_rows_per_request = true;
  a.mask_stride_batch = 4096;
  const PagedPrefillArgs r = resolve_paged_prefill_args(a);
  CHECK(r.page_table_rows == 1);
  CHECK(astrai::detail::index_layout_bits(r.page_table, r.req_indices, r.seq_lens, r.seq_lens_are_offsets,
                                          r.qo_indptr) ==
        (astrai::kWidePageTable | astrai::kWideSeqLens | astrai::kWideQoIndptr | astrai::kSeqLensIndptr));
}
