// Per-key compile lock built on flock(2).
//
// Why flock and not a lock-by-existence file (O_EXCL) or fcntl record locks:
//  * The kernel drops an flock lock when the last descriptor of its open file description is
//    closed, and a dying process closes all of its descriptors, so a holder killed with
//    SIGKILL (or crashing) releases the lock at once. There are no stale locks to detect,
//    no pid files and no timeouts to guess. The descriptor is opened with O_CLOEXEC so a
//    program started by the holder does not keep the lock alive after the holder is gone
//    (a plain fork() without exec would still share it until the child exits).
//  * The lock belongs to the open file description, not the process, so two FileLock objects
//    in the same process exclude each other just like two processes do.
// The lock file is never unlinked: a waiter that already opened it would otherwise lock an
// orphaned inode while a newcomer creates and locks a fresh file under the same name, and both
// would believe they hold the lock. An empty file per key is a negligible cost.
#include "cache/file_lock.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>
#include <thread>

namespace astrai::detail {

namespace {

constexpr std::chrono::milliseconds kPollInterval{5};

void set_outcome(FileLock::Outcome* outcome, FileLock::Outcome value) {
  if (outcome) *outcome = value;
}

int open_lock_file(const std::filesystem::path& path) {
  for (;;) {
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd >= 0 || errno != EINTR) return fd;
  }
}

}  // namespace

std::unique_ptr<FileLock> FileLock::acquire(const std::filesystem::path& path,
                                            std::chrono::milliseconds max_wait,
                                            Outcome* outcome) {
  set_outcome(outcome, Outcome::unavailable);
  if (path.empty()) return nullptr;
  if (path.has_parent_path()) {
    std::error_code ignored;  // open() below reports the real problem
    std::filesystem::create_directories(path.parent_path(), ignored);
  }
  const int fd = open_lock_file(path);
  if (fd < 0) return nullptr;

  const auto deadline = std::chrono::steady_clock::now() + max_wait;
  for (;;) {
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {
      set_outcome(outcome, Outcome::acquired);
      return std::unique_ptr<FileLock>(new FileLock(fd, path));
    }
    const int error = errno;
    if (error == EINTR) continue;
    if (error != EWOULDBLOCK) {
      // ENOLCK and friends: the file system cannot lock at all.
      ::close(fd);
      return nullptr;
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      ::close(fd);
      set_outcome(outcome, Outcome::timed_out);
      return nullptr;
    }
    const auto remaining = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now);
    std::this_thread::sleep_for(remaining < kPollInterval ? remaining + std::chrono::milliseconds(1)
                                                          : kPollInterval);
  }
}

FileLock::~FileLock() {
  if (fd_ >= 0) {
    ::flock(fd_, LOCK_UN);
    ::close(fd_);
  }
}

}  // namespace astrai::detail
