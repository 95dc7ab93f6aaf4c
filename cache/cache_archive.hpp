// Moving cache entries between machines: `astrai-jit cache export` and `cache import`, and the
// bounded reader of manifest files (`warm --manifest`, `export --manifest`).
//
// Archive format (little endian): magic "ASTRAIJA", u32 archive version, u32 zero, u64 entry
// count; per entry: u32 file-name length, the entry's file name ("<32 hex>.<variant>.cubin"),
// u64 entry size, the entry file's bytes (header and checksum included, see cache_entry.hpp);
// then the end magic "ASTRAIJZ" and the entry count again (a truncated archive is noticed).
// Import checks the whole archive (end marker and count included) and every entry like a load
// does (its checksum, names, kind, the payload's symbols and binary) before anything is stored:
// a damaged archive imports nothing. Whether to trust the archive's origin is the importer's
// decision: import only archives you would run code from, or set ASTRAI_JIT_TRUSTED_KEYS so
// that the cache takes only entries signed by a key you trust (`export --sign`).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "cache/disk_cache.hpp"

namespace astrai::detail {

inline constexpr std::uint32_t kArchiveVersion = 1;
inline constexpr std::uint64_t kMaxArchiveEntries = 1u << 20;

// Manifest limits: a manifest is a short list of variant names.
inline constexpr std::uint64_t kMaxManifestBytes = std::uint64_t{16} << 20;
inline constexpr std::size_t kMaxManifestLine = 1024;
// Text from a file that is echoed in a message is cut to this many characters.
inline constexpr std::size_t kMaxEchoedText = 120;

struct ManifestLine {
  int number = 0;
  std::string text;  // comment (from '#') removed, trimmed, never empty
};

// Reads a manifest: a regular file (a FIFO or device is refused) of at most kMaxManifestBytes,
// lines of at most kMaxManifestLine characters. Throws astrai::InvalidArgument naming the file
// (and line) otherwise.
std::vector<ManifestLine> read_manifest_lines(const std::filesystem::path& path);

// `text` cut to kMaxEchoedText characters ("..." appended) with control characters escaped,
// safe to print in a message.
std::string echo_text(const std::string& text);

struct ArchiveReport {
  std::uint64_t entries = 0;  // exported, or imported
  std::uint64_t bytes = 0;
  std::vector<std::string> problems;  // one line per skipped entry or missing variant
};

// Writes the cache's sound entries (all of them, or those of `variants` when not empty) to
// `output` atomically (temp file beside it, then rename; a symbolic link at `output` is
// replaced, never written through). Throws astrai::Error when the archive cannot be written.
// With `sign`, each entry is signed with it in the archive (the cache itself is not changed).
ArchiveReport export_cache(const DiskCache& cache, const std::vector<std::string>& variants,
                           const std::filesystem::path& output, const SigningKey* sign = nullptr);

// Checks every entry of the archive, then stores them all into `cache`. Throws
// astrai::InvalidArgument when `input` is not a readable regular file, astrai::Error when it is
// not a sound archive (bad magic, version, sizes or end marker, an entry that fails its checks);
// then nothing is stored. An entry whose place holds a file the trust rule refuses is reported
// in `problems` and not stored; the others are.
ArchiveReport import_archive(DiskCache& cache, const std::filesystem::path& input);

}  // namespace astrai::detail
