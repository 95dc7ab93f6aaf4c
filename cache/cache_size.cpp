#include "cache/cache_size.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "cache/cache_fs.hpp"

namespace astrai::detail {

namespace {

// Fixed width, so that a new count always overwrites the whole old one (no truncate needed,
// and a write cut short cannot leave a shorter number that still parses).
constexpr const char* kFormat = "astrai-jit size v1 {:020} {:020}\n";
constexpr std::size_t kRecordSize = 19 + 20 + 1 + 20 + 1;
constexpr std::chrono::milliseconds kPoll{2};

bool parse_number(const char* text, std::uint64_t* value) {
  *value = 0;
  for (int i = 0; i < 20; ++i) {
    if (text[i] < '0' || text[i] > '9') return false;
    const std::uint64_t digit = static_cast<std::uint64_t>(text[i] - '0');
    if (*value > (UINT64_MAX - digit) / 10) return false;
    *value = *value * 10 + digit;
  }
  return true;
}

}  // namespace

std::unique_ptr<SizeLedger> SizeLedger::open(int v1_fd, const CacheTrust& trust, bool create,
                                             std::chrono::milliseconds max_wait, Opened* opened,
                                             std::string* why) {
  *opened = Opened::failed;
  const auto deadline = std::chrono::steady_clock::now() + max_wait;
  // A retry only when the file was removed or replaced between our open and our lock.
  for (int attempt = 0; attempt < 8; ++attempt) {
    const int flags = O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | (create ? O_CREAT : 0);
    Fd fd(openat_retry(v1_fd, kSizeFileName, flags, trust.file_mode()));
    if (!fd) {
      if (errno == ENOENT) *opened = Opened::missing;
      if (errno == ELOOP) {
        *opened = Opened::refused;
        *why = "a symbolic link";
      }
      return nullptr;
    }
    struct stat status {};
    if (::fstat(fd.get(), &status) != 0) return nullptr;
    std::string problem = !S_ISREG(status.st_mode) ? std::string("not a regular file")
                                                   : trust.check(status);
    if (problem.empty() && trust.openable_by_others(status))
      problem = fmt::format("openable by other users (mode {:04o})", status.st_mode & 07777);
    if (!problem.empty()) {
      *opened = Opened::refused;
      *why = problem;
      return nullptr;
    }
    // The umask may have removed the group bits a shared cache needs.
    if (trust.shared() && status.st_uid == ::geteuid()) ::fchmod(fd.get(), trust.file_mode());
    for (;;) {
      if (::flock(fd.get(), LOCK_EX | LOCK_NB) == 0) break;
      if (errno == EINTR) continue;
      if (errno != EWOULDBLOCK) return nullptr;
      if (std::chrono::steady_clock::now() >= deadline) {
        *opened = Opened::busy;
        return nullptr;
      }
      std::this_thread::sleep_for(kPoll);
    }
    struct stat named {};
    if (::fstatat(v1_fd, kSizeFileName, &named, AT_SYMLINK_NOFOLLOW) == 0 &&
        named.st_dev == status.st_dev && named.st_ino == status.st_ino) {
      *opened = Opened::ok;
      return std::unique_ptr<SizeLedger>(new SizeLedger(fd.release()));
    }
  }
  return nullptr;
}

bool SizeLedger::read(Count* count) const {
  char text[kRecordSize + 1] = {};
  ssize_t got = 0;
  do got = ::pread(fd_, text, sizeof text, 0);
  while (got < 0 && errno == EINTR);
  if (got != static_cast<ssize_t>(kRecordSize)) return false;
  return std::memcmp(text, "astrai-jit size v1 ", 19) == 0 && text[39] == ' ' &&
         text[60] == '\n' && parse_number(text + 19, &count->total_bytes) &&
         parse_number(text + 40, &count->updates);
}

void SizeLedger::write(const Count& count) {
  const std::string text = fmt::format(kFormat, count.total_bytes, count.updates);
  ssize_t wrote = 0;
  do wrote = ::pwrite(fd_, text.data(), text.size(), 0);
  while (wrote < 0 && errno == EINTR);
  // A short write leaves a record that does not parse: the next capped store scans.
  if (wrote != static_cast<ssize_t>(text.size())) (void)::ftruncate(fd_, 0);
}

SizeLedger::~SizeLedger() {
  ::flock(fd_, LOCK_UN);
  ::close(fd_);
}

void drop_size_ledger(int v1_fd, const CacheTrust& trust) {
  struct stat status {};
  if (::fstatat(v1_fd, kSizeFileName, &status, AT_SYMLINK_NOFOLLOW) == 0 &&
      S_ISREG(status.st_mode) && trust.check(status).empty())
    ::unlinkat(v1_fd, kSizeFileName, 0);
}

}  // namespace astrai::detail
