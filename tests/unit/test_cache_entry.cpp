// The cache entry format: pinned bytes, round trips, and rejection of damaged entries.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cache/cache_entry.hpp"
#include "cache/cache_key.hpp"
#include "tests/support/cache_support.hpp"

using astrai::detail::BinaryKind;
using astrai::detail::CacheEntryData;
using astrai::detail::decode_entry;
using astrai::detail::encode_entry;
using astrai::detail::payload_checksum;
using astrai::testing::make_entry;
using astrai::testing::same_entry;

TEST_SUITE("cache") {

TEST_CASE("a small entry encodes to the documented, pinned bytes") {
  CacheEntryData entry;
  entry.kind = BinaryKind::cubin;
  entry.variant_name = "v";
  entry.nvrtc_version = "12.8";
  entry.payload = {'\x01', '\x02', '\x03'};
  const std::vector<char> bytes = encode_entry(entry);
  REQUIRE(bytes.size() == 48);

  const std::string covered = std::string("v12.8") + std::string("\x01\x02\x03", 3);
  // Seeded with header bytes 8..15: version 2, kind 1 (cubin), reserved zeros.
  const std::uint64_t checksum = payload_checksum(covered.data(), covered.size(), 0x0000000100000002ULL);
  std::string expected("ASTRAIJC", 8);
  expected += std::string("\x02\x00\x00\x00", 4);          // format version
  expected += std::string("\x01\x00\x00\x00", 4);          // kind + 3 zero bytes
  expected += std::string("\x03\x00\x00\x00\x00\x00\x00\x00", 8);  // payload size
  for (int i = 0; i < 8; ++i) expected.push_back(static_cast<char>((checksum >> (8 * i)) & 0xff));
  expected += std::string("\x01\x00\x00\x00", 4);          // name length
  expected += std::string("\x04\x00\x00\x00", 4);          // version length
  expected += "v12.8";
  expected += std::string("\x01\x02\x03", 3);
  CHECK(std::string(bytes.begin(), bytes.end()) == expected);

  CHECK(checksum == 0x94d34ee885ef51bcULL);  // XXH3-64 of "v12.8" {1, 2, 3}, seeded
  CHECK(payload_checksum(bytes.data(), bytes.size()) == 0x891787ce92fd87c3ULL);
}

TEST_CASE("entries round-trip through encode and decode") {
  std::vector<CacheEntryData> entries;
  entries.push_back(make_entry("paged_decode.bf16.hd128.ps16.g4.sm_90a", 1000));
  CacheEntryData ptx = make_entry("rotary.f16.sm_120", 64);
  ptx.kind = BinaryKind::ptx;
  ptx.nvrtc_version = "13.0";
  entries.push_back(ptx);
  entries.push_back(make_entry("empty_payload", 0));
  CacheEntryData unnamed = make_entry("", 5);
  unnamed.nvrtc_version.clear();
  entries.push_back(unnamed);
  entries.push_back(make_entry(std::string(4096, 'n'), 7));

  for (const auto& entry : entries) {
    const std::vector<char> bytes = encode_entry(entry);
    std::string error = "untouched";
    auto decoded = decode_entry(bytes.data(), bytes.size(), &error);
    REQUIRE(decoded.has_value());
    CHECK(same_entry(*decoded, entry));
    CHECK(decode_entry(bytes.data(), bytes.size()).has_value());  // error pointer is optional
  }
}

TEST_CASE("decode rejects an entry truncated at every length") {
  const std::vector<char> bytes = encode_entry(make_entry("trunc.sm_90", 37));
  for (std::size_t size = 0; size < bytes.size(); ++size) {
    CAPTURE(size);
    // A fresh copy of exactly `size` bytes, so the sanitizer catches any read past the end.
    std::vector<char> prefix(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(size));
    std::string error;
    CHECK_FALSE(decode_entry(size ? prefix.data() : nullptr, size, &error).has_value());
    CHECK_FALSE(error.empty());
    CHECK_FALSE(decode_entry(prefix.data(), size).has_value());
  }
}

TEST_CASE("decode rejects every single-bit flip") {
  // Entry without names: every byte is covered by the header checks or the payload checksum.
  CacheEntryData bare = make_entry("", 24);
  bare.nvrtc_version.clear();
  const std::vector<char> bare_bytes = encode_entry(bare);
  for (std::size_t bit = 0; bit < bare_bytes.size() * 8; ++bit) {
    CAPTURE(bit);
    std::vector<char> flipped = bare_bytes;
    flipped[bit / 8] = static_cast<char>(flipped[bit / 8] ^ (1 << (bit % 8)));
    CHECK_FALSE(decode_entry(flipped.data(), flipped.size()).has_value());
  }

  // With names: the checksum covers the names too, so every flip is rejected as well.
  const CacheEntryData named = make_entry("v.sm_90a", 24);
  const std::vector<char> bytes = encode_entry(named);
  for (std::size_t bit = 0; bit < bytes.size() * 8; ++bit) {
    CAPTURE(bit);
    std::vector<char> flipped = bytes;
    flipped[bit / 8] = static_cast<char>(flipped[bit / 8] ^ (1 << (bit % 8)));
    CHECK_FALSE(decode_entry(flipped.data(), flipped.size()).has_value());
  }
}

TEST_CASE("decode rejects bad magic, version, kind, reserved bytes, trailing data, long names") {
  const std::vector<char> good = encode_entry(make_entry("x.sm_89", 16));
  REQUIRE(decode_entry(good.data(), good.size()).has_value());

  auto rejected = [](std::vector<char> bytes, const std::string& reason) {
    std::string error;
    const bool ok = decode_entry(bytes.data(), bytes.size(), &error).has_value();
    CAPTURE(error);
    CHECK(error.find(reason) != std::string::npos);
    return !ok;
  };

  std::vector<char> magic = good;
  magic[0] = 'B';
  CHECK(rejected(magic, "magic"));

  std::vector<char> version = good;
  version[8] = 1;  // the previous format
  CHECK(rejected(version, "version"));
  version[8] = 2;
  version[11] = 1;
  CHECK(rejected(version, "version"));

  for (int kind : {0, 3, 255}) {
    std::vector<char> bad_kind = good;
    bad_kind[12] = static_cast<char>(kind);
    CHECK(rejected(bad_kind, "kind"));
  }
  std::vector<char> ptx_kind = good;  // 2 is a valid kind, but the checksum is seeded with it
  ptx_kind[12] = 2;
  CHECK(rejected(ptx_kind, "checksum"));

  for (int index : {13, 14, 15}) {
    std::vector<char> reserved = good;
    reserved[static_cast<std::size_t>(index)] = 1;
    CHECK(rejected(reserved, "reserved"));
  }

  std::vector<char> trailing = good;
  trailing.push_back('\0');
  CHECK(rejected(trailing, "trailing"));

  std::vector<char> checksum = good;
  checksum.back() = static_cast<char>(checksum.back() ^ 0x40);
  CHECK(rejected(checksum, "checksum"));

  CacheEntryData long_name = make_entry(std::string(4097, 'n'), 3);
  CHECK(rejected(encode_entry(long_name), "too long"));
  CacheEntryData long_version = make_entry("v", 3);
  long_version.nvrtc_version = std::string(4097, '1');
  CHECK(rejected(encode_entry(long_version), "too long"));

  // Huge length fields must not be trusted (no allocation, no overflow).
  std::vector<char> huge = good;
  std::memset(huge.data() + 16, 0xff, 8);
  CHECK(rejected(huge, "truncated"));
  std::vector<char> huge_names = good;
  std::memset(huge_names.data() + 32, 0xff, 8);
  CHECK(rejected(huge_names, "too long"));
}

TEST_CASE("decode never crashes on arbitrary bytes") {
  std::mt19937 rng(12345);
  const std::vector<char> good = encode_entry(make_entry("fuzz.sm_90", 40));
  int accepted = 0;
  for (int round = 0; round < 20000; ++round) {
    std::vector<char> bytes;
    if (round % 2 == 0) {
      bytes.resize(rng() % 128);
      for (auto& b : bytes) b = static_cast<char>(rng());
    } else {
      // Start from a valid entry, scribble over a few bytes and cut or extend it.
      bytes = good;
      const int edits = 1 + static_cast<int>(rng() % 4);
      for (int e = 0; e < edits; ++e) bytes[rng() % bytes.size()] = static_cast<char>(rng());
      if (rng() % 2) bytes.resize(rng() % (bytes.size() + 16));
    }
    auto decoded = decode_entry(bytes.data(), bytes.size());
    if (decoded) ++accepted;
  }
  CHECK(accepted < 20000);
}

}  // TEST_SUITE
