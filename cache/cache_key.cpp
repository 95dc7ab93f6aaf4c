#include "cache/cache_key.hpp"

#include <algorithm>
#include <cstring>

// Header-only use of xxHash: every function is compiled into this file, nothing is linked.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <fmt/format.h>

namespace astrai::detail {

namespace {

// Field tags of the canonical serialization. Every field is written as
//   u8 tag, u64 little-endian byte length, bytes
// and the fields always appear in the same order, so the encoding is prefix-free and two
// different inputs can never produce the same byte string. Never renumber these; add new tags
// and bump kCacheKeySchemaVersion instead.
enum class Tag : std::uint8_t {
  schema_version = 0x01,
  source_count = 0x02,
  source_name = 0x03,
  source_bytes = 0x04,
  variant_name = 0x05,
  instantiation = 0x06,
  option_count = 0x07,
  option = 0x08,
  arch = 0x09,
  nvrtc_major = 0x0a,
  nvrtc_minor = 0x0b,
};

void append_u64_le(std::string& out, std::uint64_t value) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xffu));
}

void append_u32_le(std::string& out, std::uint32_t value) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xffu));
}

void append_field(std::string& out, Tag tag, const char* data, std::size_t size) {
  out.push_back(static_cast<char>(tag));
  append_u64_le(out, static_cast<std::uint64_t>(size));
  out.append(data, size);
}

void append_bytes_field(std::string& out, Tag tag, const std::string& bytes) {
  append_field(out, tag, bytes.data(), bytes.size());
}

void append_u32_field(std::string& out, Tag tag, std::uint32_t value) {
  std::string encoded;
  append_u32_le(encoded, value);
  append_bytes_field(out, tag, encoded);
}

void append_u64_field(std::string& out, Tag tag, std::uint64_t value) {
  std::string encoded;
  append_u64_le(encoded, value);
  append_bytes_field(out, tag, encoded);
}

}  // namespace

std::string CacheKey::hex() const { return fmt::format("{:016x}{:016x}", high, low); }

std::string serialize_cache_key_inputs(const CacheKeyInputs& inputs) {
  // Sources are hashed in name order (bytes as a tie-breaker for duplicate names) so the
  // order in which the caller collected them never matters.
  using Source = std::pair<std::string, std::string>;
  std::vector<const Source*> sources;
  sources.reserve(inputs.sources.size());
  std::size_t total = 64;
  for (const Source& source : inputs.sources) {
    sources.push_back(&source);
    total += 18 + source.first.size() + source.second.size();
  }
  std::sort(sources.begin(), sources.end(),
            [](const Source* a, const Source* b) { return *a < *b; });
  total += inputs.variant_name.size() + inputs.instantiation.size() + inputs.arch.size();
  for (const std::string& option : inputs.options) total += 9 + option.size();

  std::string out;
  out.reserve(total + 64);
  append_u32_field(out, Tag::schema_version, kCacheKeySchemaVersion);
  append_u64_field(out, Tag::source_count, static_cast<std::uint64_t>(sources.size()));
  for (const Source* source : sources) {
    append_bytes_field(out, Tag::source_name, source->first);
    append_bytes_field(out, Tag::source_bytes, source->second);
  }
  append_bytes_field(out, Tag::variant_name, inputs.variant_name);
  append_bytes_field(out, Tag::instantiation, inputs.instantiation);
  append_u64_field(out, Tag::option_count, static_cast<std::uint64_t>(inputs.options.size()));
  for (const std::string& option : inputs.options) append_bytes_field(out, Tag::option, option);
  append_bytes_field(out, Tag::arch, inputs.arch);
  // Two's complement bit pattern, so negative (bogus) versions still serialize distinctly.
  append_u32_field(out, Tag::nvrtc_major, static_cast<std::uint32_t>(inputs.nvrtc_major));
  append_u32_field(out, Tag::nvrtc_minor, static_cast<std::uint32_t>(inputs.nvrtc_minor));
  return out;
}

CacheKey compute_cache_key(const CacheKeyInputs& inputs) {
  const std::string bytes = serialize_cache_key_inputs(inputs);
  const XXH128_hash_t hash = XXH3_128bits(bytes.data(), bytes.size());
  CacheKey key;
  key.high = hash.high64;
  key.low = hash.low64;
  return key;
}

std::uint64_t payload_checksum(const void* data, std::size_t size) {
  // XXH3 accepts a null pointer only together with a zero length.
  static const char kEmpty = 0;
  if (size == 0) data = &kEmpty;
  return XXH3_64bits(data, size);
}

std::uint64_t payload_checksum(const void* data, std::size_t size, std::uint64_t seed) {
  static const char kEmpty = 0;
  if (size == 0) data = &kEmpty;
  return XXH3_64bits_withSeed(data, size, seed);
}

}  // namespace astrai::detail
