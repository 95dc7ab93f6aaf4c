// Argument checks of merge_states (shapes, strides, pointers, and which overlaps of an output
// with an input are in place or a race) and of cascade (its levels as paged_prefill calls, the
// options each level carries, its workspace).
#include "tests/unit/validation_support.hpp"

using namespace astrai::testing;
using astrai::MergeStatesArgs;
using astrai::CascadeArgs;
using astrai::detail::cascade_split;
using astrai::detail::resolve_cascade_args;
using astrai::detail::resolve_merge_states_args;

namespace {

// 6 rows of 4 heads of 64: a holds 3 stacked states, b one; every tensor in its own range.
MergeStatesArgs valid_merge() {
  MergeStatesArgs a;
  a.dtype = DType::bf16;
  a.rows = 6;
  a.n_heads = 4;
  a.head_dim = 64;
  a.a.v = fake_pointer<const void>(0x100000);
  a.a.lse = fake_pointer<const float>(0x200000);
  a.a.states = 3;
  a.b.v = fake_pointer<const void>(0x300000);
  a.b.lse = fake_pointer<const float>(0x400000);
  a.b.states = 1;
  a.out = fake_pointer<void>(0x500000);
  a.lse = fake_pointer<float>(0x600000);
  return a;
}

// The in-place form: out and lse are b's single state.
MergeStatesArgs in_place_on_b() {
  MergeStatesArgs a = valid_merge();
  a.out = const_cast<void*>(a.b.v);
  a.lse = const_cast<float*>(a.b.lse);
  return a;
}

// 6 decode requests of 8 query heads over 2 KV heads (hd128, pages of 16) sharing one prefix:
// level 0 one group of all 6 rows, level 1 one group a request.
CascadeArgs valid_cascade() {
  CascadeArgs a;
  a.dtype = DType::bf16;
  a.total_q = 6;
  a.n_heads = 8;
  a.n_kv_heads = 2;
  a.head_dim = 128;
  a.page_size = 16;
  a.num_pages = 64;
  a.q = fake_pointer<const void>(0x100000);
  a.k_cache = fake_pointer<const void>(0x200000);
  a.v_cache = fake_pointer<const void>(0x300000);
  a.out = fake_pointer<void>(0x400000);
  a.num_levels = 2;
  a.levels[0].groups = 1;
  a.levels[0].max_q_len = 6;
  a.levels[0].qo_indptr = fake_pointer<const std::int32_t>(0x500000);
  a.levels[0].page_table = fake_pointer<const std::int32_t>(0x510000);
  a.levels[0].max_pages_per_seq = 32;
  a.levels[0].seq_lens = fake_pointer<const std::int32_t>(0x520000);
  a.levels[1].groups = 6;
  a.levels[1].max_q_len = 1;
  a.levels[1].qo_indptr = fake_pointer<const std::int64_t>(0x530000);
  a.levels[1].page_table = fake_pointer<const std::int64_t>(0x540000);
  a.levels[1].max_pages_per_seq = 4;
  a.levels[1].seq_lens = fake_pointer<const std::int32_t>(0x550000);
  a.levels[1].causal = true;
  return a;
}

}  // namespace

TEST_SUITE("validation") {

TEST_CASE("cascade resolves each level as the paged_prefill call that computes it") {
  CascadeArgs args = valid_cascade();
  const float* sinks = fake_pointer<const float>(0x600000);
  args.sinks = sinks;
  args.logit_cap = 30.f;
  const auto plan = resolve_cascade_args(args);
  REQUIRE(plan.levels.size() == 2);
  CHECK(plan.levels[0].batch == 1);
  CHECK(plan.levels[0].max_q_len == 6);
  CHECK_FALSE(plan.levels[0].causal);
  CHECK(plan.levels[1].batch == 6);
  CHECK(plan.levels[1].causal);
  CHECK(plan.levels[1].qo_indptr.wide);
  CHECK(plan.levels[0].total_q == 6);
  CHECK(plan.levels[1].total_q == 6);
  // The soft-cap on every level, the sinks on level 0 only (they join the softmax once).
  CHECK(plan.levels[0].logit_cap == 30.f);
  CHECK(plan.levels[1].logit_cap == 30.f);
  CHECK(plan.levels[0].sinks == sinks);
  CHECK(plan.levels[1].sinks == nullptr);
  CHECK(plan.args.q_stride_token == 8 * 128);
  // Scratch: a level's output and LSE, and level 0's LSE when the caller asks for none.
  const std::size_t rows = 6 * 8;
  CHECK(plan.workspace_bytes == rows * 128 * 2 + 256 + 256);
  args.lse = fake_pointer<float>(0x700000);
  CHECK(resolve_cascade_args(args).workspace_bytes == rows * 128 * 2 + 256);
  CHECK(astrai::cascade_workspace_bytes(args, 0) == rows * 128 * 2 + 256);
  args.num_levels = 1;
  CHECK(astrai::cascade_workspace_bytes(args, 132) == 0);
}

TEST_CASE("cascade runs a level of each request's new tokens as paged_decode, and only such a level") {
  CascadeArgs args = valid_cascade();
  auto plan = resolve_cascade_args(args, 132);
  CHECK_FALSE(plan.as_decode[0]);  // level 0 is the shared prefix
  REQUIRE(plan.as_decode[1]);      // 6 groups of one row, causal
  CHECK(plan.decodes[1].batch == 6);
  CHECK(plan.decodes[1].q_len == 1);
  CHECK(plan.decodes[1].sinks == nullptr);
  // Three requests of two new tokens each: the multi-token decode, rows b * 2 and b * 2 + 1.
  args.levels[1].groups = 3;
  args.levels[1].max_q_len = 2;
  plan = resolve_cascade_args(args, 132);
  REQUIRE(plan.as_decode[1]);
  CHECK(plan.decodes[1].q_len == 2);
  CHECK(plan.decodes[1].q_stride_batch == 2 * plan.decodes[1].q_stride_seq);
  // Ragged rows (max_q_len 3 over 3 groups is 9 rows, not 6), a level that is not causal, or
  // more than 8 tokens a request: paged_prefill.
  args.levels[1].max_q_len = 3;
  CHECK_FALSE(resolve_cascade_args(args, 132).as_decode[1]);
  args = valid_cascade();
  args.levels[1].causal = false;
  CHECK_FALSE(resolve_cascade_args(args, 132).as_decode[1]);
  args = valid_cascade();
  args.total_q = 18;
  args.levels[0].max_q_len = 18;
  args.levels[1].groups = 2;
  args.levels[1].max_q_len = 9;
  CHECK_FALSE(resolve_cascade_args(args, 132).as_decode[1]);
  // Long suffixes split their keys over the SMs: their split-KV workspace joins the scratch.
  args = valid_cascade();
  args.total_q = 2;
  args.levels[0].max_q_len = 2;
  args.levels[1].groups = 2;
  args.levels[1].max_pages_per_seq = 1024;  // 16384 keys
  plan = resolve_cascade_args(args, 132);
  REQUIRE(plan.as_decode[1]);
  CHECK(plan.decode_workspace > 0);
  CHECK(plan.workspace_bytes >= plan.decode_workspace + 2 * 8 * 128 * 2);
}

TEST_CASE("cascade spreads a long shared level over the SMs in chunks, and only then") {
  // 6 rows x 4 heads a KV head: one tile on each of 2 KV heads; 32 pages of 16: two chunks of 256.
  const CascadeArgs args = valid_cascade();
  auto split = cascade_split(args, 132);
  CHECK(split.chunks == 2);
  CHECK(split.chunk_pages == 16);
  // The shape the bench compares with paged_decode: 64 requests, 32/8 heads, an 8192-token
  // prefix: 2 tiles x 8 KV heads fill 16 SMs, so 8 chunks of 64 pages (1024 keys) fill 128.
  CascadeArgs bench = args;
  bench.total_q = 64;
  bench.n_heads = 32;
  bench.n_kv_heads = 8;
  bench.levels[0].max_q_len = 64;
  bench.levels[0].max_pages_per_seq = 512;
  bench.levels[1].groups = 64;
  split = cascade_split(bench, 132);
  CHECK(split.chunks == 8);
  CHECK(split.chunk_pages == 64);
  CHECK(cascade_split(bench, 1000).chunks == 16);  // at most 16
  CHECK(cascade_split(bench, 16).chunks == 1);     // the pass fills the SMs already
  // No split: no device, sinks, one level, level 0 causal or of several groups, a short table.
  CHECK(cascade_split(args, 0).chunks == 1);
  CascadeArgs no = args;
  no.sinks = fake_pointer<const float>(0x600000);
  CHECK(cascade_split(no, 132).chunks == 1);
  no = args;
  no.num_levels = 1;
  CHECK(cascade_split(no, 132).chunks == 1);
  no = args;
  no.levels[0].causal = true;
  CHECK(cascade_split(no, 132).chunks == 1);
  no = args;
  no.levels[0].groups = 2;
  CHECK(cascade_split(no, 132).chunks == 1);
  no = args;
  no.levels[0].max_pages_per_seq = 31;  // under two chunks of 256 keys
  CHECK(cascade_split(no, 132).chunks == 1);
  // The split's scratch: q copies, the chunks' states, their offsets and lengths.
  const std::size_t rows = 6 * 8, row_bytes = 128 * 2;
  const std::size_t plain = rows * row_bytes + 256 + 256;
  CHECK(astrai::cascade_workspace_bytes(args, 132) ==
        plain + 2 * (2 * rows * row_bytes) + 512 + 256 + 256);  // 2 x 48 LSEs, 3 offsets, 2 lengths
  CHECK(resolve_cascade_args(args, 132).split.chunks == 2);
  CHECK(resolve_cascade_args(args).split.chunks == 1);
}

TEST_CASE("every cascade argument rejects a bad value and the message names it") {
  using A = CascadeArgs;
  const std::vector<BadCase<A>> cases = {
      {"num_levels", [](A& a) { a.num_levels = 0; }, {"num_levels 0 is not valid (allowed: 1..4)"}},
      {"num_levels", [](A& a) { a.num_levels = 5; }, {"num_levels 5 is not valid"}},
      {"window_left", [](A& a) { a.window_left = 128; }, {"window_left 128 is not served (allowed: -1"}},
      {"alibi_slopes", [](A& a) { a.alibi_slopes = fake_pointer<const float>(0x600000); },
       {"alibi_slopes is not served"}},
      {"total_q", [](A& a) { a.total_q = -1; }, {"total_q -1 is not valid"}},
      // A level's own checks, reported as the cascade's with the level's index.
      {"levels[1]", [](A& a) { a.levels[1].max_q_len = 7; }, {"levels[1]: max_q_len 7 is not valid for total_q 6"}},
      {"levels[0]", [](A& a) { a.levels[0].seq_lens = nullptr; }, {"levels[0]: seq_lens is null"}},
      {"levels[1]", [](A& a) { a.levels[1].groups = -1; }, {"levels[1]: batch -1"}},
      {"levels[0]", [](A& a) { a.head_dim = 100; }, {"levels[0]: head_dim 100"}},
      {"workspace", [](A& a) { a.workspace = fake_pointer<void>(0x800010); a.workspace_bytes = 1 << 20; },
       {"workspace = 0x800010 is not 256-byte aligned"}},
      {"workspace_bytes", [](A& a) { a.workspace = fake_pointer<void>(0x800000); a.workspace_bytes = 1000; },
       {"workspace_bytes 1000 is too small (allowed: >= 12800"}},
      {"workspace", [](A& a) { a.workspace = fake_pointer<void>(0x400000); a.workspace_bytes = 1 << 20; },
       {"workspace [0x400000, 0x403200) overlaps out or lse"}},
  };
  const CascadeArgs valid = valid_cascade();
  REQUIRE_NOTHROW(resolve_cascade_args(valid));
  for (const auto& c : cases)
    check_rejected(valid, c, [](const CascadeArgs& a) { return resolve_cascade_args(a); }, "cascade");
}


TEST_CASE("merge_states fills contiguous strides: [rows, states, heads, dim] sources, [rows, heads, dim] out") {
  const MergeStatesArgs r = resolve_merge_states_args(valid_merge());
  CHECK(r.a.v_stride_head == 64);
  CHECK(r.a.v_stride_state == 4 * 64);
  CHECK(r.a.v_stride_row == 3 * 4 * 64);
  CHECK(r.a.lse_stride_head == 1);
  CHECK(r.a.lse_stride_state == 4);
  CHECK(r.a.lse_stride_row == 3 * 4);
  CHECK(r.b.v_stride_row == 4 * 64);
  CHECK(r.b.lse_stride_row == 4);
  CHECK(r.out_stride_head == 64);
  CHECK(r.out_stride_row == 4 * 64);
  CHECK(r.lse_stride_head == 1);
  CHECK(r.lse_stride_row == 4);
  // Resolving twice changes nothing.
  const MergeStatesArgs again = resolve_merge_states_args(r);
  CHECK(again.a.v_stride_row == r.a.v_stride_row);
  CHECK(again.out_stride_row == r.out_stride_row);
}

TEST_CASE("every merge_states argument rejects a bad value and the message names it") {
  using A = MergeStatesArgs;
  const std::vector<BadCase<A>> cases = {
      {"dtype", [](A& a) { a.dtype = static_cast<DType>(3); }, {"dtype 3 is not valid (allowed: bf16, fp16)"}},
      {"rows", [](A& a) { a.rows = -1; }, {"rows -1 is not valid"}},
      {"n_heads", [](A& a) { a.n_heads = 0; }, {"n_heads 0 is not valid (allowed: >= 1)"}},
      {"head_dim", [](A& a) { a.head_dim = 12; }, {"head_dim 12 is not supported (allowed: 8..1024, step 8)"}},
      {"head_dim", [](A& a) { a.head_dim = 1032; }, {"head_dim 1032 is not supported"}},
      {"head_dim", [](A& a) { a.head_dim = 0; }, {"head_dim 0 is not supported"}},
      {"a.states", [](A& a) { a.a.states = 0; }, {"a.states 0 is not valid (allowed: >= 1)"}},
      {"b.states", [](A& a) { a.b.states = -1; }, {"b.states -1 is not valid (allowed: >= 0"}},
      {"a.v_stride_head", [](A& a) { a.a.v_stride_head = 60; }, {"a.v_stride_head 60 is not a multiple of 8"}},
      {"a.v_stride_state", [](A& a) { a.a.v_stride_state = -8; }, {"a.v_stride_state -8 is not valid"}},
      {"b.v_stride_row", [](A& a) { a.b.v_stride_row = 4; }, {"b.v_stride_row 4 is not a multiple of 8"}},
      {"a.lse_stride_state", [](A& a) { a.a.lse_stride_state = -1; }, {"a.lse_stride_state -1 is not valid"}},
      {"a.v", [](A& a) { a.a.v = nullptr; }, {"a.v is null"}},
      {"a.v", [](A& a) { a.a.v = fake_pointer<const void>(0x100008); }, {"is not 16-byte aligned"}},
      {"b.lse", [](A& a) { a.b.lse = nullptr; }, {"b.lse is null"}},
      {"b.lse", [](A& a) { a.b.lse = fake_pointer<const float>(0x400002); }, {"is not 4-byte aligned"}},
      {"out", [](A& a) { a.out = nullptr; }, {"out is null"}},
      {"out", [](A& a) { a.out = fake_pointer<void>(0x500004); }, {"is not 16-byte aligned"}},
      {"lse", [](A& a) { a.lse = fake_pointer<float>(0x600001); }, {"is not 4-byte aligned"}},
      {"out_stride_head", [](A& a) { a.out_stride_head = 32; }, {"out_stride_head 32 makes rows overlap"}},
      {"out_stride_row", [](A& a) { a.out_stride_row = 128; },
       {"out_stride_row 128 makes rows overlap (allowed: >= 256)"}},
      {"lse_stride_row", [](A& a) { a.lse_stride_row = 2; }, {"lse_stride_row 2 makes rows overlap (allowed: >= 4)"}},
      // An output reaching into an input without being it: a CTA could read another's result.
      {"out", [](A& a) { a.out = fake_pointer<void>(0x100000 + 64 * 2); }, {"out overlaps a.v"}},
      {"out", [](A& a) { a.out = const_cast<void*>(a.a.v); }, {"out overlaps a.v (allowed: out is a.v itself when"}},
      {"out", [](A& a) { a.out = fake_pointer<void>(0x200000); }, {"out overlaps a.lse"}},
      {"lse", [](A& a) { a.lse = fake_pointer<float>(0x300000); }, {"lse overlaps b.v"}},
      {"lse", [](A& a) { a.lse = fake_pointer<float>(0x200004); }, {"lse overlaps a.lse"}},
      {"lse", [](A& a) { a.lse = static_cast<float*>(a.out); }, {"out overlaps lse"}},
  };
  const MergeStatesArgs valid = valid_merge();
  REQUIRE_NOTHROW(resolve_merge_states_args(valid));
  for (const auto& c : cases) check_rejected(valid, c, resolve_merge_states_args, "merge_states");
}

TEST_CASE("merge_states in place: out and lse may be a source's single state, with its strides") {
  CHECK_NOTHROW(resolve_merge_states_args(in_place_on_b()));
  MergeStatesArgs on_a = valid_merge();
  on_a.a.states = 1;
  on_a.out = const_cast<void*>(on_a.a.v);
  on_a.lse = const_cast<float*>(on_a.a.lse);
  CHECK_NOTHROW(resolve_merge_states_args(on_a));
  // The same pointer with other strides is not the same tensor.
  MergeStatesArgs strided = in_place_on_b();
  strided.b.v_stride_row = 8 * 64;
  CHECK_THROWS_AS(resolve_merge_states_args(strided), astrai::InvalidArgument);
  MergeStatesArgs lse_strided = in_place_on_b();
  lse_strided.lse_stride_row = 8;
  CHECK_THROWS_AS(resolve_merge_states_args(lse_strided), astrai::InvalidArgument);
}

TEST_CASE("merge_states takes a's states alone, empty calls and unchecked strides of single dims") {
  MergeStatesArgs alone = valid_merge();
  alone.b = astrai::MergeStatesSource{};
  alone.b.states = 0;
  const MergeStatesArgs r = resolve_merge_states_args(alone);
  CHECK(r.b.states == 0);
  CHECK(r.b.v == nullptr);
  MergeStatesArgs empty = valid_merge();
  empty.rows = 0;
  empty.a.v = nullptr;
  empty.out = nullptr;
  CHECK_NOTHROW(resolve_merge_states_args(empty));
  // A dim of extent 1 is never stepped over: whatever stride it has is not checked.
  MergeStatesArgs one_head = valid_merge();
  one_head.n_heads = 1;
  one_head.a.v_stride_head = 3;
  one_head.out_stride_head = 5;
  CHECK_NOTHROW(resolve_merge_states_args(one_head));
  // Without an LSE output, its strides do not matter.
  MergeStatesArgs no_lse = valid_merge();
  no_lse.lse = nullptr;
  no_lse.lse_stride_row = 1;
  CHECK_NOTHROW(resolve_merge_states_args(no_lse));
}

}  // TEST_SUITE
