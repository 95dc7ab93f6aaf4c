// Argument checks of rotary_emb, and resolving twice.
#include "tests/unit/validation_support.hpp"

using namespace astrai::testing;
using astrai::detail::resolve_decode_args;
using astrai::detail::resolve_paged_decode_args;
using astrai::detail::resolve_paged_prefill_args;
using astrai::detail::resolve_prefill_args;
using astrai::detail::resolve_rotary_args;

TEST_SUITE("validation") {

TEST_CASE("the valid rotary fixture is accepted") {
  const RotaryArgs resolved = resolve_rotary_args(valid_rotary());
  CHECK(resolved.seq_len == 4);
  CHECK(resolved.x == valid_rotary().x);
}

TEST_CASE("every rotary argument rejects a bad value and the message names it") {
  using A = RotaryArgs;
  std::vector<BadCase<A>> cases = {
      {"dtype", [](A& a) { a.dtype = static_cast<DType>(3); }, {"dtype 3 is not valid (allowed: bf16, fp16)"}},
      {"batch", [](A& a) { a.batch = -1; }, {"batch -1 is not valid (allowed: >= 0)"}},
      {"seq_len", [](A& a) { a.seq_len = -1; }, {"seq_len -1 is not valid (allowed: >= 0)"}},
      {"n_heads", [](A& a) { a.n_heads = 0; }, {"n_heads 0 is not valid (allowed: >= 1)"}},
      {"n_heads", [](A& a) { a.n_heads = -3; }, {"n_heads -3 is not valid"}},
      {"head_dim", [](A& a) { a.head_dim = 4; }, {"head_dim 4 is not supported (allowed: 8..512, step 8)"}},
      {"head_dim", [](A& a) { a.head_dim = 12; }, {"head_dim 12 is not supported"}},
      {"head_dim", [](A& a) { a.head_dim = 520; }, {"head_dim 520 is not supported"}},
      {"head_dim", [](A& a) { a.head_dim = 0; }, {"head_dim 0 is not supported"}},
      {"head_dim", [](A& a) { a.head_dim = -8; }, {"head_dim -8 is not supported"}},
      {"freqs_stride_seq", [](A& a) { a.freqs_stride_seq = 32; },
       {"freqs_stride_seq 32 is not valid (allowed: a multiple of 4 floats, >= head_dim 64)"}},
      {"freqs_stride_seq", [](A& a) { a.freqs_stride_seq = 66; }, {"freqs_stride_seq 66 is not valid"}},
      {"freqs_stride_seq", [](A& a) { a.freqs_stride_seq = -4; }, {"freqs_stride_seq -4 is not valid"}},
      {"freqs_stride_batch", [](A& a) { a.freqs_stride_batch = -2; },
       {"freqs_stride_batch -2 is not valid (allowed: 0 to share, -1 for contiguous"}},
      {"freqs_stride_batch", [](A& a) { a.freqs_stride_batch = 6; }, {"freqs_stride_batch 6 is not valid"}},
      {"x", [](A& a) { a.x = nullptr; }, {"x is null (a device pointer is required)"}},
      {"x", [](A& a) { a.x = fake_pointer<const void>(0x10004); }, {"x = 0x10004 is not 16-byte aligned"}},
      {"out", [](A& a) { a.out = nullptr; }, {"out is null"}},
      {"out", [](A& a) { a.out = fake_pointer<void>(0x20008); }, {"out = 0x20008 is not 16-byte aligned"}},
      {"freqs", [](A& a) { a.freqs = nullptr; }, {"freqs is null"}},
      {"freqs", [](A& a) { a.freqs = fake_pointer<const float>(0x30008); },
       {"freqs = 0x30008 is not 16-byte aligned"}},
  };
  // 4 heads of 64 make one position 256 elements long.
  add_stride_cases(&cases, "x_stride_head", &A::x_stride_head, 32, 64);
  add_stride_cases(&cases, "x_stride_seq", &A::x_stride_seq, 0, 0);
  add_stride_cases(&cases, "x_stride_batch", &A::x_stride_batch, 0, 0);
  add_stride_cases(&cases, "out_stride_head", &A::out_stride_head, 56, 64);
  add_stride_cases(&cases, "out_stride_seq", &A::out_stride_seq, 128, 256);
  add_stride_cases(&cases, "out_stride_batch", &A::out_stride_batch, 0, 0);

  const RotaryArgs valid = valid_rotary();
  REQUIRE_NOTHROW(resolve_rotary_args(valid));
  for (const auto& c : cases) check_rejected(valid, c, resolve_rotary_args, "rotary_emb");
}

TEST_CASE("rotary fills contiguous strides for every stride left at its default") {
  const RotaryArgs r = resolve_rotary_args(valid_rotary());
  CHECK(r.x_stride_head == 64);
  CHECK(r.x_stride_seq == 4 * 64);
  CHECK(r.x_stride_batch == 4 * 4 * 64);
  CHECK(r.out_stride_head == 64);
  CHECK(r.out_stride_seq == 4 * 64);
  CHECK(r.out_stride_batch == 4 * 4 * 64);
  CHECK(r.freqs_stride_seq == 64);
  CHECK(r.freqs_stride_batch == 4 * 64);
}

TEST_CASE("rotary keeps a shared frequency table and explicit strides") {
  RotaryArgs args = valid_rotary();
  args.freqs_stride_batch = 0;
  args.freqs_stride_seq = 128;
  args.x_stride_seq = 512;
  args.out_stride_head = 128;
  const RotaryArgs r = resolve_rotary_args(args);
  CHECK(r.freqs_stride_batch == 0);
  CHECK(r.freqs_stride_seq == 128);
  CHECK(r.x_stride_seq == 512);
  CHECK(r.x_stride_batch == 4 * 512);
  CHECK(r.out_stride_seq == 4 * 128);
  CHECK(r.out_stride_batch == 4 * 4 * 128);

  RotaryArgs contiguous = valid_rotary();
  contiguous.freqs_stride_seq = 96;
  CHECK(resolve_rotary_args(contiguous).freqs_stride_batch == 4 * 96);
}

TEST_CASE("rotary with nothing to do accepts null pointers") {
  RotaryArgs empty_batch = valid_rotary();
  empty_batch.batch = 0;
  empty_batch.x = nullptr;
  empty_batch.out = nullptr;
  empty_batch.freqs = nullptr;
  CHECK_NOTHROW(resolve_rotary_args(empty_batch));

  RotaryArgs empty_seq = valid_rotary();
  empty_seq.seq_len = 0;
  empty_seq.x = nullptr;
  empty_seq.out = nullptr;
  empty_seq.freqs = nullptr;
  const RotaryArgs r = resolve_rotary_args(empty_seq);
  CHECK(r.x_stride_batch == 8);
  CHECK(r.out_stride_batch == 8);
  CHECK(r.freqs_stride_batch == 0);

  // One position still needs its pointers.
  RotaryArgs one = valid_rotary();
  one.batch = 1;
  one.seq_len = 1;
  one.freqs = nullptr;
  CHECK_THROWS_WITH_AS(resolve_rotary_args(one), doctest::Contains("freqs is null"),
                       astrai::InvalidArgument);
}

TEST_CASE("rotary accepts the edges of every allowed range") {
  using A = RotaryArgs;
  const std::vector<std::pair<const char*, std::function<void(A&)>>> accepted = {
      {"bf16", [](A& a) { a.dtype = DType::bf16; }},
      {"head_dim 8", [](A& a) { a.head_dim = 8; }},
      {"head_dim 512", [](A& a) { a.head_dim = 512; }},
      {"one head, dense rows",
       [](A& a) { a.n_heads = 1; a.x_stride_head = 8; a.out_stride_head = 8; a.out_stride_seq = 64; }},
      {"one position, short output stride", [](A& a) { a.seq_len = 1; a.out_stride_seq = 8; }},
      {"exact output stride", [](A& a) { a.out_stride_seq = 256; }},
      {"broadcast input", [](A& a) { a.x_stride_batch = 8; }},
      {"in place", [](A& a) { a.out = const_cast<void*>(a.x); }},
      {"seq-major layout",
       [](A& a) { a.x_stride_seq = 512; a.x_stride_batch = 256; a.out_stride_seq = 512; a.out_stride_batch = 256; }},
      {"shared frequency table", [](A& a) { a.freqs_stride_batch = 0; }},
      {"padded frequency rows", [](A& a) { a.freqs_stride_seq = 68; a.freqs_stride_batch = 4 * 68; }},
  };
  for (const auto& [name, mutate] : accepted) {
    const std::string what = name;
    CAPTURE(what);
    RotaryArgs args = valid_rotary();
    mutate(args);
    CHECK_NOTHROW(resolve_rotary_args(args));
  }
}

TEST_CASE("resolving never changes an already resolved argument set") {
  const PagedDecodeArgs paged_once = resolve_paged_decode_args(valid_paged());
  const PagedDecodeArgs paged_twice = resolve_paged_decode_args(paged_once);
  CHECK(paged_twice.q_stride_batch == paged_once.q_stride_batch);
  CHECK(paged_twice.k_stride_page == paged_once.k_stride_page);
  CHECK(paged_twice.v_stride_page == paged_once.v_stride_page);
  CHECK(paged_twice.out_stride_batch == paged_once.out_stride_batch);
  CHECK(paged_twice.scale == paged_once.scale);
  const RotaryArgs rotary_once = resolve_rotary_args(valid_rotary());
  const RotaryArgs rotary_twice = resolve_rotary_args(rotary_once);
  CHECK(rotary_twice.x_stride_batch == rotary_once.x_stride_batch);
  CHECK(rotary_twice.freqs_stride_batch == rotary_once.freqs_stride_batch);
}
}  // TEST_SUITE
