#include <doctest/doctest.h>

#include <algorithm>
#include <functional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cache/cache_key.hpp"

using astrai::detail::CacheKey;
using astrai::detail::CacheKeyInputs;
using astrai::detail::compute_cache_key;
using astrai::detail::payload_checksum;
using astrai::detail::serialize_cache_key_inputs;
using astrai::detail::source_digest;
using astrai::detail::SourceDigest;

namespace {

CacheKeyInputs golden_inputs() {
  CacheKeyInputs inputs;
  inputs.variant_name = "paged_decode.bf16.hd128.ps16.g4.sm_90a";
  inputs.instantiation = "astrai::paged_decode_kernel<__nv_bfloat16, 128, 16, 4>";
  inputs.sources = {
      {"paged_decode.cuh", "#pragma once\n#include \"astrai_common.cuh\"\n// decode\n"},
      {"astrai_common.cuh", "#pragma once\n#define ASTRAI_WARP 32\n"},
  };
  inputs.options = {"-std=c++17", "--gpu-architecture=sm_90a", "-default-device",
                    "-DASTRAI_HEAD_DIM=128"};
  inputs.arch = "sm_90a";
  inputs.nvrtc_major = 12;
  inputs.nvrtc_minor = 8;
  return inputs;
}

}  // namespace

TEST_SUITE("cache") {

TEST_CASE("the cache key of a fixed input is pinned") {
  const CacheKeyInputs inputs = golden_inputs();
  // If either value changes, the on-disk naming changed: bump kCacheKeySchemaVersion.
  // Schema 1 (the sources' bytes) gave 462 bytes and 04f75d0721ed1fd4eb02c1df23e07e5c; schema
  // 2 holds a 16-byte digest a source instead of its bytes.
  CHECK(serialize_cache_key_inputs(inputs).size() == 406);
  CHECK(compute_cache_key(inputs).hex() == "2c026aea9ff5cb5dd6d2fe5c94a2bcdc");
  CHECK(astrai::detail::kCacheKeySchemaVersion == 2);
}

TEST_CASE("the serialization starts with the tagged schema version in little endian") {
  const std::string bytes = serialize_cache_key_inputs(golden_inputs());
  const std::string expected_prefix("\x01\x04\x00\x00\x00\x00\x00\x00\x00\x02\x00\x00\x00", 13);
  REQUIRE(bytes.size() > expected_prefix.size());
  CHECK(bytes.compare(0, expected_prefix.size(), expected_prefix) == 0);
}

TEST_CASE("the key hex is 32 lowercase digits, high word first") {
  CacheKey key;
  key.high = 0x0123456789abcdefULL;
  key.low = 0xfedcba9876543210ULL;
  CHECK(key.hex() == "0123456789abcdeffedcba9876543210");
  CHECK(CacheKey{}.hex() == std::string(32, '0'));
  CacheKey small;
  small.low = 0xa;
  CHECK(small.hex() == "0000000000000000000000000000000a");

  const std::string hex = compute_cache_key(golden_inputs()).hex();
  CHECK(hex.size() == 32);
  CHECK(std::all_of(hex.begin(), hex.end(),
                    [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }));
}

TEST_CASE("the key is deterministic and ignores the order in which sources are given") {
  const CacheKeyInputs inputs = golden_inputs();
  CHECK(compute_cache_key(inputs) == compute_cache_key(inputs));

  CacheKeyInputs reversed = inputs;
  std::reverse(reversed.sources.begin(), reversed.sources.end());
  CHECK(serialize_cache_key_inputs(reversed) == serialize_cache_key_inputs(inputs));
  CHECK(compute_cache_key(reversed) == compute_cache_key(inputs));

  CacheKeyInputs three = inputs;
  three.sources.push_back({"mma_utils.cuh", "// mma\n"});
  CacheKeyInputs three_shuffled = three;
  std::swap(three_shuffled.sources[0], three_shuffled.sources[2]);
  CHECK(compute_cache_key(three_shuffled) == compute_cache_key(three));
}

TEST_CASE("changing any input changes the key") {
  const CacheKeyInputs base = golden_inputs();
  const CacheKey base_key = compute_cache_key(base);

  std::vector<std::pair<std::string, std::function<void(CacheKeyInputs&)>>> changes = {
      {"first source bytes", [](CacheKeyInputs& in) { in.sources[0].second += " "; }},
      {"second source bytes", [](CacheKeyInputs& in) { in.sources[1].second[0] = '/'; }},
      {"a source name", [](CacheKeyInputs& in) { in.sources[0].first = "paged_decode2.cuh"; }},
      {"an added source", [](CacheKeyInputs& in) { in.sources.push_back({"extra.cuh", ""}); }},
      {"a removed source", [](CacheKeyInputs& in) { in.sources.pop_back(); }},
      {"no sources", [](CacheKeyInputs& in) { in.sources.clear(); }},
      {"variant", [](CacheKeyInputs& in) { in.variant_name += "x"; }},
      {"instantiation", [](CacheKeyInputs& in) { in.instantiation.back() = ' '; }},
      {"option 0", [](CacheKeyInputs& in) { in.options[0] = "-std=c++20"; }},
      {"option 1", [](CacheKeyInputs& in) { in.options[1] = "--gpu-architecture=sm_90"; }},
      {"option 2", [](CacheKeyInputs& in) { in.options[2] = "-default-devic"; }},
      {"option 3", [](CacheKeyInputs& in) { in.options[3] = "-DASTRAI_HEAD_DIM=64"; }},
      {"option order", [](CacheKeyInputs& in) { std::swap(in.options[0], in.options[1]); }},
      {"an added option", [](CacheKeyInputs& in) { in.options.push_back("-lineinfo"); }},
      {"an empty option", [](CacheKeyInputs& in) { in.options.push_back(""); }},
      {"arch without suffix", [](CacheKeyInputs& in) { in.arch = "sm_90"; }},
      {"another arch", [](CacheKeyInputs& in) { in.arch = "sm_89"; }},
      {"nvrtc major", [](CacheKeyInputs& in) { in.nvrtc_major = 13; }},
      {"nvrtc minor", [](CacheKeyInputs& in) { in.nvrtc_minor = 9; }},
      {"major and minor swapped",
       [](CacheKeyInputs& in) { std::swap(in.nvrtc_major, in.nvrtc_minor); }},
      // Moving bytes across a field boundary must not produce the same serialization.
      {"name/bytes boundary",
       [](CacheKeyInputs& in) {
         in.sources[0].first += in.sources[0].second.substr(0, 1);
         in.sources[0].second.erase(0, 1);
       }},
      {"variant/instantiation boundary",
       [](CacheKeyInputs& in) {
         in.variant_name += in.instantiation.substr(0, 1);
         in.instantiation.erase(0, 1);
       }},
      {"option boundary",
       [](CacheKeyInputs& in) {
         in.options[0] += in.options[1].substr(0, 1);
         in.options[1].erase(0, 1);
       }},
      {"options merged", [](CacheKeyInputs& in) {
         in.options[0] += in.options[1];
         in.options.erase(in.options.begin() + 1);
       }},
  };

  std::set<std::string> seen = {base_key.hex()};
  for (auto& entry : changes) {
    // A named variable, not a structured binding: clang 14 cannot capture those in CAPTURE.
    const auto& what = entry.first;
    auto& change = entry.second;
    CAPTURE(what);
    CacheKeyInputs changed = base;
    change(changed);
    CHECK(serialize_cache_key_inputs(changed) != serialize_cache_key_inputs(base));
    const CacheKey key = compute_cache_key(changed);
    CHECK(key != base_key);
    CHECK(seen.insert(key.hex()).second);  // every change gives its own key
  }
}

TEST_CASE("sources given as digests key exactly like owned sources") {
  // The runtime keys its embedded sources by the digests computed when the library was built;
  // the bytes and the key must be those of the same sources held as strings.
  const CacheKeyInputs owned = golden_inputs();
  std::vector<std::pair<std::string_view, SourceDigest>> digested;
  for (auto it = owned.sources.rbegin(); it != owned.sources.rend(); ++it)
    digested.emplace_back(it->first, source_digest(it->second));  // another order: the key sorts
  CacheKeyInputs viewed = owned;
  viewed.sources.clear();
  viewed.digested_sources = &digested;
  CHECK(serialize_cache_key_inputs(viewed) == serialize_cache_key_inputs(owned));
  CHECK(compute_cache_key(viewed) == compute_cache_key(owned));
  // The digests are what is hashed: another source text gives another key.
  digested[0].second = source_digest("#pragma once\n#define ASTRAI_WARP 64\n");
  CHECK(compute_cache_key(viewed) != compute_cache_key(owned));
}

TEST_CASE("a source digest is XXH3-128 of the exact bytes") {
  // Reference value of XXH3-128 (seed 0) for empty input, from the xxHash test vectors.
  const SourceDigest empty = source_digest("");
  CHECK(empty.high == 0x99AA06D3014798D8ULL);
  CHECK(empty.low == 0x6001C324468D497FULL);
  CHECK(source_digest(std::string_view()) == empty);
  CHECK(source_digest("#pragma once\n") == source_digest(std::string("#pragma once\n")));
  CHECK(source_digest("#pragma once\n") != source_digest("#pragma once \n"));
  CHECK(source_digest(std::string_view("a\0b", 3)) != source_digest(std::string_view("a\0c", 3)));
}

TEST_CASE("the payload checksum is XXH3-64") {
  // Reference value of XXH3-64 (seed 0) for empty input, from the xxHash test vectors.
  CHECK(payload_checksum(nullptr, 0) == 0x2D06800538D394C2ULL);
  CHECK(payload_checksum("", 0) == 0x2D06800538D394C2ULL);
  const std::string abc = "abc";
  const std::string abd = "abd";
  CHECK(payload_checksum(abc.data(), abc.size()) == payload_checksum(abc.data(), abc.size()));
  CHECK(payload_checksum(abc.data(), abc.size()) != payload_checksum(abd.data(), abd.size()));
}

}  // TEST_SUITE
