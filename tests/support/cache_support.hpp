// Helpers shared by the cache tests: made-up keys and entries, engine configurations, the files
// below a cache directory, log output, and the log level for a scope.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "base/logging.hpp"
#include "cache/cache_entry.hpp"
#include "cache/cache_key.hpp"
#include "runtime/env_config.hpp"
#include "tests/support/support.hpp"

namespace astrai::testing {

// Key number `n`; keys of different numbers fall into different shard directories.
detail::CacheKey make_key(std::uint64_t n);

// A cubin entry of `payload_size` bytes whose pattern depends on `seed`.
detail::CacheEntryData make_entry(const std::string& variant, std::size_t payload_size = 64,
                                  unsigned seed = 1);

// An entry a load would accept: a variant payload (one symbol) holding a minimal cubin (an ELF
// header and nothing else), its text depending on `seed`.
detail::CacheEntryData make_loadable_entry(const std::string& variant, unsigned seed = 1);

bool same_entry(const detail::CacheEntryData& a, const detail::CacheEntryData& b);

// An engine configuration whose cache is at `dir`, in `mode`; everything else default.
detail::EnvConfig config_for(const std::filesystem::path& dir,
                             detail::CacheMode mode = detail::CacheMode::read_write);

// Every regular file below `dir`, sorted (directories are not listed).
std::vector<std::filesystem::path> all_files(const std::filesystem::path& dir);

// Everything below `dir` (links not followed) with file contents and link targets: a file
// created, written or removed anywhere below it changes the snapshot.
std::map<std::string, std::string> snapshot(const std::filesystem::path& dir);

// Temp files (".tmp-*") below `dir`: writers that did not finish.
std::size_t count_temp_files(const std::filesystem::path& dir);

// How often `needle` occurs in `text` (overlapping occurrences count).
std::size_t count_occurrences(const std::string& text, const std::string& needle);

// Sets the modification time (the cache's "last used" time) to `age` ago.
void set_age(const std::filesystem::path& path, std::chrono::seconds age);

// Sets the log level for the scope; tests that expect warnings keep them out of the output.
class QuietLog {
 public:
  explicit QuietLog(detail::LogLevel level = detail::LogLevel::off);
  ~QuietLog();
  QuietLog(const QuietLog&) = delete;
  QuietLog& operator=(const QuietLog&) = delete;

 private:
  detail::LogLevel old_;
};

// Collects the log for the scope (warnings and above).
class LogCapture {
 public:
  explicit LogCapture(const std::filesystem::path& file);
  ~LogCapture() { finish(); }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;
  std::string finish();

 private:
  detail::LogLevel old_level_;
  StderrCapture capture_;
};

}  // namespace astrai::testing
