// File and descriptor helpers of the disk cache. Every cache path is opened relative to its
// parent's descriptor, never through a symbolic link, and judged by fstat on what was opened.
// All retry EINTR; none throws.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cache/cache_trust.hpp"

namespace astrai::detail {

std::string errno_text(int error);

// Writes all of `data`. Returns 0 or an errno value.
int write_all(int fd, const char* data, std::size_t size);

// Reads the whole regular file behind `fd` (size from fstat, at most kMaxEntryFileBytes, else
// refused before any allocation). A file that grows while we read is refused too.
bool read_entry_fd(int fd, const struct stat& info, std::vector<char>* out, std::string* why);

// Random bits for temp file names (unique across threads and processes).
std::uint64_t random_u64();

// Sets mtime (our "last used" time) and atime to now. Failures are ignored.
void touch_fd(int fd);

// The modification time of `info` on the std::filesystem clock.
std::filesystem::file_time_type file_time(const struct stat& info);

bool same_file(const struct stat& a, std::uint64_t device, std::uint64_t inode);

// An owned descriptor, closed on destruction.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  int get() const { return fd_; }
  // Gives up ownership: the caller closes the descriptor.
  int release() { return std::exchange(fd_, -1); }
  explicit operator bool() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

int openat_retry(int dir_fd, const char* name, int flags, mode_t mode = 0);

enum class OpenStatus { ok, missing, refused, failed };

struct DirResult {
  OpenStatus status = OpenStatus::failed;
  Fd fd;
  struct stat status_info {};
  bool created = false;
  std::string why;
};

// Opens (and with `create`, first makes) the directory `name` below `parent_fd` without
// following a symbolic link at `name`.
DirResult open_dir_at(int parent_fd, const char* name, bool create, mode_t mode);

// A shared cache's directories are setgid and group-writable. Directories we have just created
// get those bits (the umask removes them); existing directories are left as they are.
void share_directory(DirResult* dir, const CacheTrust& trust);

// The path to open for a directory or file that must not be reached through a symbolic link
// at its last component: lexically normalized, without a trailing separator. O_NOFOLLOW only
// guards the last component, and in "LINK/", "LINK/." or "LINK/x/.." that is not LINK, so
// open() would follow the link; normalized, the last component is LINK itself.
std::filesystem::path normalize_for_open(const std::filesystem::path& path);

// Opens the file `path` to append to it (created 0600), safely in a directory others can reach
// (ASTRAI_JIT_RECORD): the parent directory is opened without following a symbolic link at its
// last component (a planted directory link would lead into someone else's files) and must be
// ours or root's, writable by nobody else unless sticky (like /tmp); the file is opened from
// it without following a link and must be a regular file of ours with a single name (a hard
// link planted in a shared directory would point elsewhere). Returns the descriptor, or -1 with
// the reason in `why`.
int open_private_append(const std::filesystem::path& path, std::string* why);

// mkdir -p for the directories above a cache root (private: 0700, as XDG asks for
// ~/.cache). Errors are left for the open of the root to report.
void make_parents(const std::filesystem::path& root);

// Calls `visit(name)` for each name in the directory open as `dir_fd` (the descriptor stays
// ours: the listing uses a duplicate).
template <typename Visit>
void for_each_name(int dir_fd, Visit&& visit) {
  const int copy = ::fcntl(dir_fd, F_DUPFD_CLOEXEC, 0);
  if (copy < 0) return;
  DIR* listing = ::fdopendir(copy);
  if (listing == nullptr) {
    ::close(copy);
    return;
  }
  while (const struct dirent* item = ::readdir(listing)) {
    const std::string_view name(item->d_name);
    if (name == "." || name == "..") continue;
    visit(std::string(name));
  }
  ::closedir(listing);
}

}  // namespace astrai::detail
