#include "cache/cache_key.hpp"

#include <algorithm>
#include <cstring>
#include <string_view>

// Header-only use of xxHash: every function is compiled into this file, nothing is linked.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <fmt/format.h>

namespace astrai::detail {

namespace {

// Field tags of the canonical serialization. Every field is written as
//   u8 tag, u64 little-endian byte length, bytes
// and the fields always appear in the same order, so the encoding is prefix-free and two
// different inputs can never produce the same byte string (sources: unless their 128-bit
// digests collide, the same bet the key itself makes). Never renumber these; add new tags and
// bump kCacheKeySchemaVersion instead.
enum class Tag : std::uint8_t {
  schema_version = 0x01,
  source_count = 0x02,
  source_name = 0x03,
  source_bytes = 0x04,  // schema 1 only: a source's bytes; schema 2 writes source_digest
  variant_name = 0x05,
  instantiation = 0x06,
  option_count = 0x07,
  option = 0x08,
  arch = 0x09,
  nvrtc_major = 0x0a,
  nvrtc_minor = 0x0b,
  source_digest = 0x0c,  // 16 bytes: SourceDigest's high then low word, each little endian
};

// Where the canonical bytes go: a string (serialize_cache_key_inputs) or straight into the
// XXH3 state (compute_cache_key; the same bytes, without building a copy).
struct StringSink {
  std::string* out;
  void write(const void* data, std::size_t size) { out->append(static_cast<const char*>(data), size); }
};
struct HashSink {
  XXH3_state_t* state;
  void write(const void* data, std::size_t size) { XXH3_128bits_update(state, data, size); }
};

template <typename Sink> void write_field(Sink& sink, Tag tag, const void* data, std::size_t size) {
  unsigned char header[9];
  header[0] = static_cast<unsigned char>(tag);
  const std::uint64_t length = size;
  for (int i = 0; i < 8; ++i) header[1 + i] = static_cast<unsigned char>((length >> (8 * i)) & 0xffu);
  sink.write(header, sizeof header);
  if (size) sink.write(data, size);
}

template <typename Sink> void write_string_field(Sink& sink, Tag tag, std::string_view bytes) {
  write_field(sink, tag, bytes.data(), bytes.size());
}

template <typename Sink> void write_u32_field(Sink& sink, Tag tag, std::uint32_t value) {
  unsigned char encoded[4];
  for (int i = 0; i < 4; ++i) encoded[i] = static_cast<unsigned char>((value >> (8 * i)) & 0xffu);
  write_field(sink, tag, encoded, sizeof encoded);
}

template <typename Sink> void write_u64_field(Sink& sink, Tag tag, std::uint64_t value) {
  unsigned char encoded[8];
  for (int i = 0; i < 8; ++i) encoded[i] = static_cast<unsigned char>((value >> (8 * i)) & 0xffu);
  write_field(sink, tag, encoded, sizeof encoded);
}

using DigestedSource = std::pair<std::string_view, SourceDigest>;

template <typename Sink>
void write_key_fields(Sink& sink, const CacheKeyInputs& inputs, std::vector<DigestedSource> sources) {
  // Sources are written in name order (the digest as a tie-breaker for duplicate names) so the
  // order in which the caller collected them never matters.
  std::sort(sources.begin(), sources.end());
  write_u32_field(sink, Tag::schema_version, kCacheKeySchemaVersion);
  write_u64_field(sink, Tag::source_count, static_cast<std::uint64_t>(sources.size()));
  for (const DigestedSource& source : sources) {
    write_string_field(sink, Tag::source_name, source.first);
    unsigned char digest[16];
    for (int i = 0; i < 8; ++i) {
      digest[i] = static_cast<unsigned char>((source.second.high >> (8 * i)) & 0xffu);
      digest[8 + i] = static_cast<unsigned char>((source.second.low >> (8 * i)) & 0xffu);
    }
    write_field(sink, Tag::source_digest, digest, sizeof digest);
  }
  write_string_field(sink, Tag::variant_name, inputs.variant_name);
  write_string_field(sink, Tag::instantiation, inputs.instantiation);
  write_u64_field(sink, Tag::option_count, static_cast<std::uint64_t>(inputs.options.size()));
  for (const std::string& option : inputs.options) write_string_field(sink, Tag::option, option);
  write_string_field(sink, Tag::arch, inputs.arch);
  // Two's complement bit pattern, so negative (bogus) versions still serialize distinctly.
  write_u32_field(sink, Tag::nvrtc_major, static_cast<std::uint32_t>(inputs.nvrtc_major));
  write_u32_field(sink, Tag::nvrtc_minor, static_cast<std::uint32_t>(inputs.nvrtc_minor));
}

// Both ways of giving the sources become one list of (name, digest): owned sources are
// digested here, digested ones are taken as they are.
template <typename Sink> void write_key(Sink& sink, const CacheKeyInputs& inputs) {
  std::vector<DigestedSource> sources;
  if (inputs.digested_sources) {
    sources = *inputs.digested_sources;
  } else {
    sources.reserve(inputs.sources.size());
    for (const auto& source : inputs.sources) sources.emplace_back(source.first, source_digest(source.second));
  }
  write_key_fields(sink, inputs, std::move(sources));
}

}  // namespace

SourceDigest source_digest(std::string_view bytes) {
  static const char kEmpty = 0;  // XXH3 accepts a null pointer only together with a zero length
  const XXH128_hash_t hash = XXH3_128bits(bytes.empty() ? &kEmpty : bytes.data(), bytes.size());
  SourceDigest digest;
  digest.high = hash.high64;
  digest.low = hash.low64;
  return digest;
}

std::string CacheKey::hex() const { return fmt::format("{:016x}{:016x}", high, low); }

std::string serialize_cache_key_inputs(const CacheKeyInputs& inputs) {
  std::string out;
  StringSink sink{&out};
  write_key(sink, inputs);
  return out;
}

CacheKey compute_cache_key(const CacheKeyInputs& inputs) {
  XXH3_state_t state;
  XXH3_INITSTATE(&state);
  XXH3_128bits_reset(&state);
  HashSink sink{&state};
  write_key(sink, inputs);
  const XXH128_hash_t hash = XXH3_128bits_digest(&state);
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
