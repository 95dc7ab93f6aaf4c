#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "astrai/error.hpp"
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
