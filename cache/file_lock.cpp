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
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>
#include <thread>

#include <fmt/format.h>

#include "base/logging.hpp"
#include "cache/cache_fs.hpp"

namespace astrai::detail {

namespace {

constexpr std::chrono::milliseconds kPollInterval{5};
// A wait this long is worth a warning: a compile of ours stalls behind another process.
constexpr std::chrono::seconds kSlowWait{5};

void set_outcome(FileLock::Outcome* outcome, FileLock::Outcome value) {
  if (outcome) *outcome = value;
}

int open_lock_file(int dir_fd, const char* name, mode_t mode) {
  // Read-only: flock needs no write access, and a lock file is never written.
  return openat_retry(dir_fd, name, O_RDONLY | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC,
                      mode);
}

// Replaces the lock file `name`, which users we do not trust could open (and so hold its flock
// for ever: older versions created lock files 0644), by a fresh one of the right mode, renamed
// over it. A chmod would not do: a descriptor opened before it stays valid. Returns the
// new file's descriptor, or -1 with `why` set. A process waiting on the old file may get its
// lock too, once: the two compile the same key, which is harmless (the atomic rename decides).
int replace_exposed_lock_file(int dir_fd, const std::string& name, const CacheTrust& trust,
                              std::string* why) {
  std::string temp;
  int fd = -1;
  for (int attempt = 0; attempt < 16 && fd < 0; ++attempt) {
    temp = fmt::format(".tmp-lock-{}-{:016x}", static_cast<long>(::getpid()), random_u64());
    fd = openat_retry(dir_fd, temp.c_str(),
                      O_RDONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC,
                      trust.file_mode());
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) {
    *why = "cannot create a replacement: " + errno_text(errno);
    return -1;
  }
  struct stat status {};
  if (trust.shared()) ::fchmod(fd, trust.file_mode());  // the umask may remove group bits
  if (::fstat(fd, &status) != 0)
    *why = "cannot stat the replacement: " + errno_text(errno);
  else if (trust.openable_by_others(status))
    *why = fmt::format("the replacement has mode {:04o}", status.st_mode & 07777);
  else if (::renameat(dir_fd, temp.c_str(), dir_fd, name.c_str()) != 0)
    *why = "cannot replace it: " + errno_text(errno);
  else
    return fd;
  ::close(fd);
  ::unlinkat(dir_fd, temp.c_str(), 0);
  return -1;
}

}  // namespace

std::unique_ptr<FileLock> FileLock::acquire(const std::filesystem::path& path,
                                            std::chrono::milliseconds max_wait,
                                            Outcome* outcome) {
  set_outcome(outcome, Outcome::unavailable);
  if (path.empty() || path.filename().empty()) return nullptr;
  const std::filesystem::path parent = path.has_parent_path() ? path.parent_path() : ".";
  std::error_code ignored;  // openat() below reports the real problem
  std::filesystem::create_directories(parent, ignored);
  const int dir_fd = ::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) return nullptr;
  auto lock = acquire_at(dir_fd, path.filename().string(), CacheTrust::owner_only(), max_wait,
                         outcome);
  ::close(dir_fd);
  return lock;
}

std::unique_ptr<FileLock> FileLock::acquire_at(int dir_fd, const std::string& name,
                                               const CacheTrust& trust,
                                               std::chrono::milliseconds max_wait,
                                               Outcome* outcome, std::string* why) {
  set_outcome(outcome, Outcome::unavailable);
  int fd = open_lock_file(dir_fd, name.c_str(), trust.file_mode());
  if (fd < 0) {
    if (why) *why = errno == ELOOP ? "a symbolic link" : errno_text(errno);
    return nullptr;
  }
  struct stat status {};
  std::string problem;
  if (::fstat(fd, &status) != 0)
    problem = errno_text(errno);
  else if (!S_ISREG(status.st_mode))
    problem = "not a regular file";
  else
    problem = trust.check(status);
  if (!problem.empty()) {
    ::close(fd);
    if (why) *why = problem;
    return nullptr;
  }
  if (trust.openable_by_others(status)) {
    const mode_t old_mode = status.st_mode & 07777;
    ::close(fd);
    std::string failure;
    fd = replace_exposed_lock_file(dir_fd, name, trust, &failure);
    if (fd < 0 || ::fstat(fd, &status) != 0) {
      // Never wait on a lock others can hold: compile without it (the atomic rename decides).
      if (fd >= 0) ::close(fd);
      if (why) *why = fmt::format("openable by other users (mode {:04o}); {}", old_mode, failure);
      return nullptr;
    }
    log_once(LogLevel::warn, "exposed-lock-file",
             "compile lock {} could be opened by other users (mode {:04o}), who could hold it and "
             "stall every compile of its kernel; replaced it with a private one (this warning is "
             "given once)",
             name, old_mode);
  }

  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + max_wait;
  bool warned = false;
  bool reopened = false;
  for (;;) {
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {
      set_outcome(outcome, Outcome::acquired);
      if (warned)
        log(LogLevel::warn, "got compile lock {} after {:.1f} s", name,
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      return std::unique_ptr<FileLock>(new FileLock(fd, name));
    }
    const int error = errno;
    if (error == EINTR) continue;
    if (error == EBADF && !reopened) {
      reopened = true;
      // NFS emulates flock with byte-range locks, which need a descriptor open for writing:
      // reopen the same file (never through a link) read-write, once.
      const int writable = ::openat(dir_fd, name.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC);
      struct stat again {};
      if (writable >= 0 && ::fstat(writable, &again) == 0 && again.st_dev == status.st_dev &&
          again.st_ino == status.st_ino) {
        ::close(fd);
        fd = writable;
        continue;
      }
      if (writable >= 0) ::close(writable);
    }
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
    if (!warned && now - start >= kSlowWait) {
      warned = true;
      log(LogLevel::warn,
          "waiting for compile lock {} held by another process (up to {} s, then compiling "
          "without it)",
          name, std::chrono::duration_cast<std::chrono::seconds>(max_wait).count());
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
