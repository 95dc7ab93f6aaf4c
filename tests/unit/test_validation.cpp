#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "astrai/error.hpp"
#include "astrai/runtime.hpp"
#include "runtime/validation.hpp"

using astrai::DType;
using astrai::PagedDecodeArgs;
using astrai::RotaryArgs;
using astrai::detail::resolve_paged_decode_args;
using astrai::detail::resolve_rotary_args;

namespace {

template <typename T = void>
T* fake_pointer(std::uintptr_t address) {
  return reinterpret_cast<T*>(address);
}

// A valid call: 2 sequences, 8 query heads over 2 KV heads, head_dim 128, pages of 16 tokens.
PagedDecodeArgs valid_paged() {
  PagedDecodeArgs a;
  a.dtype = DType::bf16;
  a.batch = 2;
  a.n_heads = 8;
  a.n_kv_heads = 2;
  a.head_dim = 128;
  a.page_size = 16;
  a.num_pages = 64;
  a.max_pages_per_seq = 8;
  a.q = fake_pointer<const void>(0x10000);
  a.k_cache = fake_pointer<const void>(0x20000);
  a.v_cache = fake_pointer<const void>(0x30000);
  a.page_table = fake_pointer<const std::int32_t>(0x40000);
  a.seq_lens = fake_pointer<const std::int32_t>(0x50000);
  a.out = fake_pointer<void>(0x60000);
  return a;
}

// A valid call: x of shape [2, 4, 4, 64].
RotaryArgs valid_rotary() {
  RotaryArgs a;
  a.dtype = DType::fp16;
  a.batch = 2;
  a.seq_len = 4;
  a.n_heads = 4;
  a.head_dim = 64;
  a.x = fake_pointer<const void>(0x10000);
  a.out = fake_pointer<void>(0x20000);
  a.freqs = fake_pointer<const float>(0x30000);
  return a;
}

template <typename Args>
struct BadCase {
  const char* argument;
  std::function<void(Args&)> mutate;
  std::vector<std::string> expected;  // substrings of the message
};

// Runs `resolve` on the mutated args and checks it throws InvalidArgument with every substring.
template <typename Args, typename Resolve>
void check_rejected(const Args& valid, const BadCase<Args>& c, Resolve resolve, const char* call) {
  Args args = valid;
  c.mutate(args);
  const std::string argument = c.argument;
  CAPTURE(argument);
  std::string message;
  bool thrown = false;
  try {
    resolve(args);
  } catch (const astrai::InvalidArgument& error) {
    thrown = true;
    message = error.what();
  }
  CAPTURE(message);
  REQUIRE(thrown);
  CHECK(message.rfind(std::string(call) + ": ", 0) == 0);
  CHECK(message.find(c.argument) != std::string::npos);
  for (const auto& expected : c.expected) {
    CAPTURE(expected);
    CHECK(message.find(expected) != std::string::npos);
  }
}

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// One stride argument of PagedDecodeArgs: the negative, misaligned and (optionally) overlapping
// values, and the smallest value allowed when the rows must not overlap.
void add_stride_cases(std::vector<BadCase<PagedDecodeArgs>>* cases, const char* name,
                      std::int64_t PagedDecodeArgs::*member, std::int64_t overlap_value,
                      std::int64_t minimum) {
  cases->push_back({name, [member](PagedDecodeArgs& a) { a.*member = -8; },
                    {std::string(name) + " -8 is not valid (allowed: > 0, or 0 for contiguous)"}});
  cases->push_back({name, [member](PagedDecodeArgs& a) { a.*member = 12; },
                    {std::string(name) + " 12 is not a multiple of 8 elements"}});
  cases->push_back({name, [member](PagedDecodeArgs& a) { a.*member = 1; },
                    {std::string(name) + " 1 is not a multiple of 8 elements"}});
  if (overlap_value > 0)
    cases->push_back({name, [member, overlap_value](PagedDecodeArgs& a) { a.*member = overlap_value; },
                      {std::string(name) + " " + std::to_string(overlap_value) +
                       " makes rows overlap (allowed: >= " + std::to_string(minimum) + ")"}});
}

void add_stride_cases(std::vector<BadCase<RotaryArgs>>* cases, const char* name,
                      std::int64_t RotaryArgs::*member, std::int64_t overlap_value,
                      std::int64_t minimum) {
  cases->push_back({name, [member](RotaryArgs& a) { a.*member = -8; },
                    {std::string(name) + " -8 is not valid (allowed: > 0, or 0 for contiguous)"}});
  cases->push_back({name, [member](RotaryArgs& a) { a.*member = 20; },
                    {std::string(name) + " 20 is not a multiple of 8 elements"}});
  if (overlap_value > 0)
    cases->push_back({name, [member, overlap_value](RotaryArgs& a) { a.*member = overlap_value; },
                      {std::string(name) + " " + std::to_string(overlap_value) +
                       " makes rows overlap (allowed: >= " + std::to_string(minimum) + ")"}});
}

}  // namespace

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
      {"seq_lens", [](A& a) { a.seq_lens = nullptr; }, {"seq_lens is null"}},
      {"seq_lens", [](A& a) { a.seq_lens = fake_pointer<const std::int32_t>(0x50001); },
       {"seq_lens = 0x50001 is not 4-byte aligned"}},
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
      {"one query head, dense rows", [](A& a) { a.n_heads = 1; a.n_kv_heads = 1; a.q_stride_head = 8; a.out_stride_head = 8; a.out_stride_batch = 128; }},
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
      {"one head, dense rows", [](A& a) { a.n_heads = 1; a.x_stride_head = 8; a.out_stride_head = 8; a.out_stride_seq = 64; }},
      {"one position, short output stride", [](A& a) { a.seq_len = 1; a.out_stride_seq = 8; }},
      {"exact output stride", [](A& a) { a.out_stride_seq = 256; }},
      {"broadcast input", [](A& a) { a.x_stride_batch = 8; }},
      {"in place", [](A& a) { a.out = const_cast<void*>(a.x); }},
      {"seq-major layout", [](A& a) { a.x_stride_seq = 512; a.x_stride_batch = 256; a.out_stride_seq = 512; a.out_stride_batch = 256; }},
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

// Prefill (contiguous KV) and paged prefill (ragged queries over a paged KV cache).
namespace {

using astrai::PagedPrefillArgs;
using astrai::PrefillArgs;
using astrai::detail::resolve_paged_prefill_args;
using astrai::detail::resolve_prefill_args;

// A valid call: 2 prompts of 100 queries over 300 KV positions (a causal tail), 8 query heads
// over 2 KV heads, head_dim 128, with a [batch, kv_len] mask and an LSE output.
PrefillArgs valid_prefill() {
  PrefillArgs a;
  a.dtype = DType::bf16;
  a.batch = 2;
  a.q_len = 100;
  a.kv_len = 300;
  a.n_heads = 8;
  a.n_kv_heads = 2;
  a.head_dim = 128;
  a.causal_offset = 200;
  a.q = fake_pointer<const void>(0x10000);
  a.k = fake_pointer<const void>(0x20000);
  a.v = fake_pointer<const void>(0x30000);
  a.out = fake_pointer<void>(0x40000);
  a.mask = fake_pointer<const bool>(0x50000);
  a.lse = fake_pointer<float>(0x60000);
  return a;
}

// A valid call: 3 requests holding 40 query rows (the longest 20), pages of 16 tokens.
PagedPrefillArgs valid_paged_prefill() {
  PagedPrefillArgs a;
  a.dtype = DType::fp16;
  a.batch = 3;
  a.total_q = 40;
  a.max_q_len = 20;
  a.n_heads = 8;
  a.n_kv_heads = 2;
  a.head_dim = 128;
  a.page_size = 16;
  a.num_pages = 64;
  a.max_pages_per_seq = 8;
  a.q = fake_pointer<const void>(0x10000);
  a.qo_indptr = fake_pointer<const std::int32_t>(0x20000);
  a.k_cache = fake_pointer<const void>(0x30000);
  a.v_cache = fake_pointer<const void>(0x40000);
  a.page_table = fake_pointer<const std::int32_t>(0x50000);
  a.seq_lens = fake_pointer<const std::int32_t>(0x60000);
  a.out = fake_pointer<void>(0x70000);
  return a;
}

template <typename Args>
void add_row_stride_cases(std::vector<BadCase<Args>>* cases, const char* name,
                          std::int64_t Args::*member, std::int64_t overlap_value,
                          std::int64_t minimum) {
  cases->push_back({name, [member](Args& a) { a.*member = -8; },
                    {std::string(name) + " -8 is not valid (allowed: > 0, or 0 for contiguous)"}});
  cases->push_back({name, [member](Args& a) { a.*member = 12; },
                    {std::string(name) + " 12 is not a multiple of 8 elements"}});
  cases->push_back({name, [member](Args& a) { a.*member = 1; },
                    {std::string(name) + " 1 is not a multiple of 8 elements"}});
  if (overlap_value > 0)
    cases->push_back({name, [member, overlap_value](Args& a) { a.*member = overlap_value; },
                      {std::string(name) + " " + std::to_string(overlap_value) +
                       " makes rows overlap (allowed: >= " + std::to_string(minimum) + ")"}});
}

template <typename Args, typename Resolve>
void check_accepted(const Args& valid,
                    const std::vector<std::pair<const char*, std::function<void(Args&)>>>& accepted,
                    Resolve resolve) {
  for (const auto& [name, mutate] : accepted) {
    const std::string what = name;
    CAPTURE(what);
    Args args = valid;
    mutate(args);
    CHECK_NOTHROW(resolve(args));
  }
}

}  // namespace

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
      {"no queries without pointers", [](A& a) { a.q_len = 0; a.q = nullptr; a.out = nullptr; a.k = nullptr; a.v = nullptr; a.mask_q_len = 1; }},
      {"empty batch without pointers", [](A& a) { a.batch = 0; a.q = nullptr; a.k = nullptr; a.v = nullptr; a.out = nullptr; a.mask = nullptr; }},
      {"broadcast mask", [](A& a) { a.mask_batch = 1; }},
      {"explicit mask batch", [](A& a) { a.mask_batch = 2; }},
      {"3D mask", [](A& a) { a.mask_q_len = 100; }},
      {"3D broadcast mask", [](A& a) { a.mask_batch = 1; a.mask_q_len = 100; }},
      {"odd mask address and strides", [](A& a) { a.mask = fake_pointer<const bool>(0x50001); a.mask_q_len = 100; a.mask_stride_q = 301; a.mask_stride_batch = 30101; }},
      {"a mask shape is ignored without a mask", [](A& a) { a.mask = nullptr; a.mask_batch = 5; a.mask_q_len = 3; }},
      {"no lse", [](A& a) { a.lse = nullptr; }},
      {"one query, short output stride", [](A& a) { a.q_len = 1; a.out_stride_seq = 1024; a.out_stride_batch = 1024; a.mask_q_len = 1; }},
      {"one head, dense rows", [](A& a) { a.n_heads = 1; a.n_kv_heads = 1; a.q_stride_head = 8; a.out_stride_head = 8; a.out_stride_seq = 128; }},
      {"bhld layout", [](A& a) { a.q_stride_head = 100 * 128; a.q_stride_seq = 128; a.q_stride_batch = 8 * 100 * 128; a.out_stride_head = 100 * 128; a.out_stride_seq = 128; a.out_stride_batch = 8 * 100 * 128; }},
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
      {"no rows without pointers", [](A& a) { a.total_q = 0; a.max_q_len = 0; a.q = nullptr; a.qo_indptr = nullptr; a.k_cache = nullptr; a.v_cache = nullptr; a.page_table = nullptr; a.seq_lens = nullptr; a.out = nullptr; }},
      {"empty batch without pointers", [](A& a) { a.batch = 0; a.q = nullptr; a.qo_indptr = nullptr; a.k_cache = nullptr; a.v_cache = nullptr; a.page_table = nullptr; a.seq_lens = nullptr; a.out = nullptr; }},
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

namespace {

// A valid contiguous decode call: 2 sequences of 100 tokens, 8 query heads over 2 KV heads.
astrai::DecodeArgs valid_decode() {
  astrai::DecodeArgs a;
  a.batch = 2;
  a.kv_len = 100;
  a.n_heads = 8;
  a.n_kv_heads = 2;
  a.head_dim = 128;
  a.q = fake_pointer<const void>(0x10000);
  a.k = fake_pointer<const void>(0x20000);
  a.v = fake_pointer<const void>(0x30000);
  a.out = fake_pointer<void>(0x40000);
  return a;
}

}  // namespace

TEST_SUITE("validation") {

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
  PagedDecodeArgs paged = valid_paged();
  paged.head_dim = 72;
  CHECK_THROWS_WITH_AS(astrai::validate_args(paged),
                       "paged_decode: head_dim 72 is not a multiple of 16 (allowed: 32..256, step 16)",
                       astrai::InvalidArgument);
  RotaryArgs rotary = valid_rotary();
  rotary.head_dim = 12;
  CHECK_THROWS_AS(astrai::validate_args(rotary), astrai::InvalidArgument);
  astrai::DecodeArgs decode;
  decode.batch = 1;
  decode.head_dim = 64;
  CHECK_THROWS_AS(astrai::validate_args(decode), astrai::InvalidArgument);
  astrai::PrefillArgs prefill;
  prefill.causal_offset = -3;
  CHECK_THROWS_AS(astrai::validate_args(prefill), astrai::InvalidArgument);
  astrai::PagedPrefillArgs paged_prefill;
  paged_prefill.page_size = 6;
  CHECK_THROWS_AS(astrai::validate_args(paged_prefill), astrai::InvalidArgument);
}

}  // TEST_SUITE
