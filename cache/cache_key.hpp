// The content hash that names a cache entry: XXH3-128 over a canonical serialization of
// everything that determines the compiled binary, and nothing machine-specific.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace astrai::detail {

// Bump when the serialization below or the meaning of any field changes.
// 2: a source is keyed by the XXH3-128 digest of its bytes (source_digest) instead of the bytes,
//    so that the embedded sources' digests can be computed when the library is built.
inline constexpr std::uint32_t kCacheKeySchemaVersion = 2;

// What the key holds of one source file: XXH3-128 of its exact bytes. Any change to the bytes
// changes it (as it changed the key when the key hashed the bytes themselves: the key is an
// XXH3-128 too). The embedded kernel sources carry theirs, computed at build time by
// tools/embed/embed_kernel_sources.cpp with this same function.
struct SourceDigest {
  std::uint64_t high = 0;
  std::uint64_t low = 0;
  bool operator==(const SourceDigest& other) const { return high == other.high && low == other.low; }
  bool operator!=(const SourceDigest& other) const { return !(*this == other); }
  bool operator<(const SourceDigest& other) const {
    return high != other.high ? high < other.high : low < other.low;
  }
};
SourceDigest source_digest(std::string_view bytes);

struct CacheKeyInputs {
  std::string variant_name;  // readable spec, e.g. "paged_decode.bf16.hd128.ps16.g4.sm_90a"
  std::string instantiation;  // the template name expression NVRTC instantiates
  // Every kernel_src file the program includes: (file name, exact bytes), digested when the
  // key is computed. Order-independent: the key sorts them by name.
  std::vector<std::pair<std::string, std::string>> sources;
  // When set, used instead of `sources`: (file name, source_digest of its bytes), the digests
  // already known (the runtime's embedded sources carry theirs). Keys exactly like `sources`
  // holding the same files.
  const std::vector<std::pair<std::string_view, SourceDigest>>* digested_sources = nullptr;
  std::vector<std::string> options;  // normalized NVRTC options (order kept: order matters)
  std::string arch;                  // target with suffix: "sm_90a", "sm_89", "compute_90"
  int nvrtc_major = 0;
  int nvrtc_minor = 0;
};

struct CacheKey {
  std::uint64_t high = 0;
  std::uint64_t low = 0;
  std::string hex() const;  // 32 lowercase hex digits, high first
  bool operator==(const CacheKey& other) const { return high == other.high && low == other.low; }
  bool operator!=(const CacheKey& other) const { return !(*this == other); }
};

// Canonical byte serialization that the key hashes (exposed for tests and debugging).
std::string serialize_cache_key_inputs(const CacheKeyInputs& inputs);
CacheKey compute_cache_key(const CacheKeyInputs& inputs);

// XXH3-64 of a payload, used as the entry checksum.
std::uint64_t payload_checksum(const void* data, std::size_t size);
// XXH3-64 with a seed (the entry checksum seeds with its header's version and kind bytes).
std::uint64_t payload_checksum(const void* data, std::size_t size, std::uint64_t seed);

}  // namespace astrai::detail
