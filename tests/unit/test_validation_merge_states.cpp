// Argument checks of merge_states: shapes, strides, pointers, and which overlaps of an output
// with an input are in place (allowed) or a race (refused).
#include "tests/unit/validation_support.hpp"

using namespace astrai::testing;
using astrai::MergeStatesArgs;
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

}  // namespace

TEST_SUITE("validation") {

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
      {"out_stride_row", [](A& a) { a.out_stride_row = 128; }, {"out_stride_row 128 makes rows overlap (allowed: >= 256)"}},
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
