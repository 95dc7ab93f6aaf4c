// The cache entry file format: encoding, checked decoding, and the bounds check of a kernel
// binary before it reaches the driver. Pure functions over bytes: no file, no driver.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace astrai::detail {

enum class BinaryKind : std::uint8_t { cubin = 1, ptx = 2 };

// What a compile target yields: PTX for a virtual arch ("compute_89"), a cubin otherwise.
inline BinaryKind binary_kind_for_target(std::string_view target) {
  return target.rfind("compute_", 0) == 0 ? BinaryKind::ptx : BinaryKind::cubin;
}

// An Ed25519 signature of an entry (cache/cache_signature.hpp says what it covers) and the id
// of the key that made it.
inline constexpr std::size_t kSignatureKeyIdBytes = 8;
inline constexpr std::size_t kSignatureBytes = 64;
struct EntrySignature {
  std::array<unsigned char, kSignatureKeyIdBytes> key_id{};
  std::array<unsigned char, kSignatureBytes> bytes{};
};

struct CacheEntryData {
  BinaryKind kind = BinaryKind::cubin;
  std::string variant_name;
  std::string nvrtc_version;  // "13.0"
  std::vector<char> payload;  // the cubin (or PTX text when the arch is newer than NVRTC)
  std::optional<EntrySignature> signature;  // a signed entry (format 3) carries one
};

// Entry file format (little endian), pinned by a golden test:
//   magic "ASTRAIJC" (8 bytes), u32 format version, u8 binary kind, 3 bytes zero,
//   u64 payload size, u64 XXH3-64 of everything after the header (names and payload) seeded
//   with header bytes 8..15 (version, kind, reserved) read as a little-endian u64,
//   u32 variant-name length, u32 nvrtc-version length, variant name bytes, nvrtc version bytes,
//   payload bytes.
// A signed entry is format 3: the same, followed by a trailer of the signing key's id (8 bytes)
// and the Ed25519 signature (64 bytes), which the checksum covers too. An unsigned entry is
// still written as format 2, so that older builds sharing the cache keep reading it; they see a
// signed one as another format (a miss, never damage).
inline constexpr std::uint32_t kEntryFormatVersion = 2;
inline constexpr std::uint32_t kSignedEntryFormatVersion = 3;
inline constexpr std::size_t kEntrySignatureTrailerSize = kSignatureKeyIdBytes + kSignatureBytes;
inline constexpr std::size_t kEntryHeaderSize = 40;
// Longest variant name or NVRTC version an entry may carry.
inline constexpr std::uint32_t kMaxEntryNameLength = 4096;
// Larger entry files are refused before anything is allocated (a cubin is a few MiB at most).
inline constexpr std::uint64_t kMaxEntryFileBytes = std::uint64_t{64} << 20;
std::vector<char> encode_entry(const CacheEntryData& entry);
// Returns nullopt (never throws) for anything malformed: short, wrong magic/version,
// size mismatch, checksum mismatch. `error` (optional) receives a short reason.
std::optional<CacheEntryData> decode_entry(const char* data, std::size_t size,
                                           std::string* error = nullptr);
// decode_entry for a buffer the caller gives up: the payload keeps the buffer (no copy).
std::optional<CacheEntryData> decode_entry_taking(std::vector<char>&& bytes, std::string* error);
// decode_entry for an entry file stored under `variant_name`: also checks that the entry holds
// that variant and the binary kind its target compiles to (a variant's last name component is
// its target: PTX for a compute_ target, a cubin for any other).
std::optional<CacheEntryData> decode_entry_of_variant(std::string_view variant_name,
                                                      const char* data, std::size_t size,
                                                      std::string* why);
// True for a file that starts like an entry but carries a format version other than 2 and 3:
// written by another build of the library sharing the cache. Such a file is a miss, not damage.
bool is_other_entry_format(const char* data, std::size_t size);

// Checks a kernel binary before it reaches the driver (cache/kernel_binary.cpp): PTX must end
// in NUL; a cubin must be a 64-bit little-endian ELF in which every offset and index the driver
// follows stays inside it: header, program and section tables, segments, sections, the section
// name table, section links, symbol names and sections, relocation symbols and offsets.
// Returns false with a short reason.
bool check_kernel_binary(BinaryKind kind, const char* data, std::size_t size, std::string* why);

}  // namespace astrai::detail
