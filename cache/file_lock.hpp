// Cross-process lock on one cache key: a lock file beside the entries.
#pragma once

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>

#include "cache/cache_trust.hpp"

namespace astrai::detail {

// Exclusive lock held through flock() on a per-key lock file. A lock held by a process that
// died is released by the kernel, so a killed compile never blocks the next process; a waiter
// gives up after `max_wait` and the caller compiles anyway (the atomic rename decides).
class FileLock {
 public:
  enum class Outcome { acquired, timed_out, unavailable };

  // Tries to take the lock at `path`, polling until `max_wait` has passed.
  // `unavailable`: the lock file cannot be created (read-only dir, ...).
  // The lock file is opened read-only (flock needs no write access), created with mode 0600,
  // and never through a symbolic link.
  static std::unique_ptr<FileLock> acquire(const std::filesystem::path& path,
                                           std::chrono::milliseconds max_wait, Outcome* outcome);
  // Same, for the file `name` in the directory open as `dir_fd`, created with `trust`'s file
  // mode. A lock file that `trust` refuses (another user's, group-writable, not a regular
  // file) is `unavailable`: nobody else can make us wait. A wait longer than a few seconds is
  // logged at warn, once per acquire.
  static std::unique_ptr<FileLock> acquire_at(int dir_fd, const std::string& name,
                                              const CacheTrust& trust,
                                              std::chrono::milliseconds max_wait,
                                              Outcome* outcome, std::string* why = nullptr);
  ~FileLock();
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  FileLock(int fd, std::filesystem::path path) : fd_(fd), path_(std::move(path)) {}
  int fd_;
  std::filesystem::path path_;
};

}  // namespace astrai::detail
