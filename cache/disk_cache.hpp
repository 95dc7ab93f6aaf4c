// On-disk cache of compiled kernels. Usable without a driver or GPU.
//
// Layout under the cache root:
//   v1/<first two hex digits>/<32-hex key>.<variant name>.cubin   entry (header + payload)
//   v1/locks/<32-hex key>.lock                                   per-key compile lock
// An entry is published atomically: written to a temp file in the same directory, fsynced,
// then renamed into place. Readers verify the header and the payload checksum; a damaged entry
// is removed (one warning) and treated as a miss.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "cache/cache_key.hpp"
#include "cache/file_lock.hpp"

namespace astrai::detail {

enum class CacheMode { read_write, read_only, off };

enum class BinaryKind : std::uint8_t { cubin = 1, ptx = 2 };

struct CacheEntryData {
  BinaryKind kind = BinaryKind::cubin;
  std::string variant_name;
  std::string nvrtc_version;  // "13.0"
  std::vector<char> payload;  // the cubin (or PTX text when the arch is newer than NVRTC)
};

struct CacheEntryInfo {
  std::filesystem::path path;
  std::string key_hex;
  std::string variant_name;
  std::uint64_t size_bytes = 0;
  std::filesystem::file_time_type last_used;
  bool valid = false;  // header and checksum verified (only filled by verify())
};

struct CacheStats {
  std::uint64_t entries = 0;
  std::uint64_t total_bytes = 0;
};

// Entry file format (little endian), pinned by a golden test:
//   magic "ASTRAIJC" (8 bytes), u32 format version, u8 binary kind, 3 bytes zero,
//   u64 payload size, u64 XXH3-64 of everything after the header (names and payload) seeded
//   with header bytes 8..15 (version, kind, reserved) read as a little-endian u64,
//   u32 variant-name length, u32 nvrtc-version length, variant name bytes, nvrtc version bytes,
//   payload bytes.
inline constexpr std::uint32_t kEntryFormatVersion = 2;
std::vector<char> encode_entry(const CacheEntryData& entry);
// Returns nullopt (never throws) for anything malformed: short, wrong magic/version,
// size mismatch, checksum mismatch. `error` (optional) receives a short reason.
std::optional<CacheEntryData> decode_entry(const char* data, std::size_t size,
                                           std::string* error = nullptr);

class DiskCache {
 public:
  // `max_bytes` 0 = unlimited. An unusable directory (cannot create, read-only, a file)
  // degrades to memory-only: every operation becomes a miss / no-op, with one warning.
  DiskCache(std::filesystem::path root, CacheMode mode, std::uint64_t max_bytes);

  const std::filesystem::path& root() const { return root_; }
  CacheMode mode() const { return mode_; }
  bool usable_for_read() const;
  bool usable_for_write() const;

  // Hit: entry verified, access time refreshed (for LRU). Damaged entry: removed, warning,
  // nullopt. Entry whose variant name differs from `variant_name`: treated as damaged.
  std::optional<CacheEntryData> load(const CacheKey& key, const std::string& variant_name);

  // Atomic publish (temp + fsync + rename). Never throws for I/O problems: returns false and
  // degrades to memory-only with one warning (read-only dir, disk full, vanished dir).
  // Prunes to max_bytes afterwards when a cap is set.
  bool store(const CacheKey& key, const CacheEntryData& entry);

  // Per-key cross-process lock; nullptr when locking is impossible or timed out (the caller
  // compiles anyway). Stale locks of dead processes never block (flock is released on exit).
  std::unique_ptr<FileLock> lock_key(const CacheKey& key, std::chrono::milliseconds max_wait);

  bool contains(const CacheKey& key, const std::string& variant_name) const;
  std::filesystem::path entry_path(const CacheKey& key, const std::string& variant_name) const;

  std::vector<CacheEntryInfo> list() const;
  CacheStats stats() const;
  // Checks every entry; removes damaged ones when `repair`. Returns all entries with `valid`.
  std::vector<CacheEntryInfo> verify(bool repair);
  // Removes least-recently-used entries until the total is <= max_bytes. Returns bytes freed.
  std::uint64_t prune(std::uint64_t max_bytes);
  // Removes every entry, lock and temp file under the versioned root. Returns entries removed.
  std::uint64_t clear();

 private:
  void degrade(const std::string& why);
  std::filesystem::path root_;
  std::filesystem::path entries_dir_;  // root_/v1
  CacheMode mode_;
  std::uint64_t max_bytes_;
  mutable std::mutex mutex_;
  bool degraded_ = false;
};

}  // namespace astrai::detail
