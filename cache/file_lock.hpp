// Cross-process lock on one cache key: a lock file beside the entries.
#pragma once

#include <chrono>
#include <filesystem>
#include <memory>

namespace astrai::detail {

// Exclusive lock held through flock() on a per-key lock file. A lock held by a process that
// died is released by the kernel, so a killed compile never blocks the next process; a waiter
// gives up after `max_wait` and the caller compiles anyway (the atomic rename decides).
class FileLock {
 public:
  enum class Outcome { acquired, timed_out, unavailable };

  // Tries to take the lock at `path`, polling until `max_wait` has passed.
  // `unavailable`: the lock file cannot be created (read-only dir, ...).
  static std::unique_ptr<FileLock> acquire(const std::filesystem::path& path,
                                           std::chrono::milliseconds max_wait, Outcome* outcome);
  ~FileLock();
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  FileLock(int fd, std::filesystem::path path) : fd_(fd), path_(std::move(path)) {}
  int fd_;
  std::filesystem::path path_;
};

}  // namespace astrai::detail
