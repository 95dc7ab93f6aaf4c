// Fixtures and checks shared by the argument-validation tests (one file per family group).
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "astrai/error.hpp"
#include "astrai/runtime.hpp"
#include "runtime/validation.hpp"

namespace astrai::testing {

using astrai::DType;
using astrai::DecodeArgs;
using astrai::PagedDecodeArgs;
using astrai::PagedPrefillArgs;
using astrai::PrefillArgs;
using astrai::RotaryArgs;

template <typename T = void>
T* fake_pointer(std::uintptr_t address) {
  return reinterpret_cast<T*>(address);
}

// A valid call: 2 sequences, 8 query heads over 2 KV heads, head_dim 128, pages of 16 tokens.
inline PagedDecodeArgs valid_paged() {
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
inline RotaryArgs valid_rotary() {
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
inline void add_stride_cases(std::vector<BadCase<PagedDecodeArgs>>* cases, const char* name,
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

inline void add_stride_cases(std::vector<BadCase<RotaryArgs>>* cases, const char* name,
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

// A valid call: 2 prompts of 100 queries over 300 KV positions (a causal tail), 8 query heads
// over 2 KV heads, head_dim 128, with a [batch, kv_len] mask and an LSE output.
inline PrefillArgs valid_prefill() {
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
inline PagedPrefillArgs valid_paged_prefill() {
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

// A valid contiguous decode call: 2 sequences of 100 tokens, 8 query heads over 2 KV heads.
inline astrai::DecodeArgs valid_decode() {
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

}  // namespace astrai::testing
