// Internals shared by the disk cache's sources (disk_cache.cpp: open, load, store, locks;
// disk_cache_maintenance.cpp: scan, list, verify, prune, clear): the names of files on disk,
// and the opened directory chain.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "cache/cache_fs.hpp"
#include "cache/disk_cache.hpp"

namespace astrai::detail {

// Longest variant name that still fits a 255-byte file name: "<32 hex>.<variant>.cubin".
inline constexpr std::size_t kMaxVariantNameOnDisk = 255 - 32 - 1 - 6;

inline constexpr std::string_view kEntrySuffix = ".cubin";
inline constexpr std::string_view kTempPrefix = ".tmp-";
inline constexpr std::string_view kLockSuffix = ".lock";
inline constexpr std::chrono::hours kStaleTempAge{1};
// How long a store waits for the running size's lock (held for a store's update, or for one
// scan of the cache) before it counts by scanning instead.
inline constexpr std::chrono::milliseconds kSizeLedgerWait{2000};

inline bool is_lower_hex(std::string_view text) {
  return std::all_of(text.begin(), text.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

inline bool starts_with(std::string_view text, std::string_view prefix) {
  return text.size() >= prefix.size() && text.substr(0, prefix.size()) == prefix;
}

inline bool ends_with(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.substr(text.size() - suffix.size()) == suffix;
}

// A variant name becomes part of a file name, so it must be one safe path component.
inline bool is_valid_variant_for_path(const std::string& name) {
  if (name.empty() || name.size() > kMaxVariantNameOnDisk) return false;
  for (char c : name) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f || c == '/' || c == '\\') return false;
  }
  return true;
}

// Parses "<32 hex>.<variant>.cubin". Temp files, locks and anything else do not match.
inline bool parse_entry_file_name(std::string_view name, std::string* key_hex,
                                  std::string* variant) {
  if (name.size() <= 32 + 1 + kEntrySuffix.size()) return false;
  if (!is_lower_hex(name.substr(0, 32)) || name[32] != '.' || !ends_with(name, kEntrySuffix))
    return false;
  *key_hex = std::string(name.substr(0, 32));
  *variant = std::string(name.substr(33, name.size() - 33 - kEntrySuffix.size()));
  return true;
}

inline bool is_shard_dir_name(std::string_view name) {
  return name.size() == 2 && is_lower_hex(name);
}

// One warning per refused path, naming it and the reason.
void warn_refused(const std::filesystem::path& path, const std::string& why);

struct DiskCache::Chain {
  OpenStatus status = OpenStatus::failed;
  std::string why;
  // The directory that failed (or the deepest one opened), as a level below the root: its path
  // (DiskCache::where) is only built for a message or a file operation's error, never on a hit.
  enum class Level { root, v1, sub } level = Level::root;
  std::string sub_name;  // the directory below v1, when one was asked for
  CacheTrust trust;
  Fd root, v1, sub;
};

// ---------------------------------------------------------------------------------------------
// Directory scan shared by list / stats / verify / prune / clear. Files that vanish while we
// look are skipped; nothing is followed through a symbolic link; no filesystem error escapes.
struct DiskCache::Scan {
  std::vector<CacheEntryInfo> entries;
  std::vector<CacheEntryInfo> temps;  // path, last_used, device, inode
};

}  // namespace astrai::detail
