#include "cache/cache_fs.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <ctime>
#include <exception>
#include <functional>
#include <random>
#include <string_view>
#include <system_error>
#include <thread>

#include <fmt/format.h>

#include "cache/cache_entry.hpp"

namespace astrai::detail {

namespace fs = std::filesystem;

std::string errno_text(int error) { return std::generic_category().message(error); }

int write_all(int fd, const char* data, std::size_t size) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return EIO;
    data += n;
    size -= static_cast<std::size_t>(n);
  }
  return 0;
}

namespace {

// Reads the whole file behind `fd`. Returns false with a reason for read errors and files
// larger than kMaxEntryFileBytes.
bool read_all(int fd, std::uint64_t size_hint, std::vector<char>* out, std::string* why) {
  // Straight into `out` (no bounce buffer): a cached load sits on the path of a first call.
  out->clear();
  std::size_t used = 0;
  try {
    out->resize(static_cast<std::size_t>(std::min(size_hint, kMaxEntryFileBytes)) + 1);
  } catch (const std::exception&) {
    *why = "out of memory";
    return false;
  }
  for (;;) {
    if (used == out->size()) {  // the file grew past its stat size
      if (out->size() > kMaxEntryFileBytes) {
        *why = "file too large";
        return false;
      }
      try {
        out->resize(std::min<std::size_t>(out->size() * 2, kMaxEntryFileBytes + 1));
      } catch (const std::exception&) {
        *why = "out of memory";
        return false;
      }
    }
    const ssize_t n = ::read(fd, out->data() + used, out->size() - used);
    if (n < 0) {
      if (errno == EINTR) continue;
      *why = "read failed: " + errno_text(errno);
      return false;
    }
    if (n == 0) {
      out->resize(used);
      return true;
    }
    used += static_cast<std::size_t>(n);
  }
}

}  // namespace

bool read_entry_fd(int fd, const struct stat& info, std::vector<char>* out, std::string* why) {
  if (info.st_size < 0 || static_cast<std::uint64_t>(info.st_size) > kMaxEntryFileBytes) {
    *why = fmt::format("file of {} bytes is larger than the {} MiB limit",
                       static_cast<long long>(info.st_size), kMaxEntryFileBytes >> 20);
    return false;
  }
  return read_all(fd, static_cast<std::uint64_t>(info.st_size), out, why);
}


std::uint64_t random_u64() {
  thread_local std::mt19937_64 engine = [] {
    std::uint64_t seed = static_cast<std::uint64_t>(
        std::chrono::high_resolution_clock::now().time_since_epoch().count());
    seed ^= static_cast<std::uint64_t>(::getpid()) << 32;
    seed ^= static_cast<std::uint64_t>(std::hash<std::thread::id>()(std::this_thread::get_id()));
    try {
      std::random_device device;
      seed ^= (static_cast<std::uint64_t>(device()) << 32) ^ device();
    } catch (const std::exception&) {
      // No entropy source: the clock, pid and thread id above are unique enough.
    }
    return std::mt19937_64(seed);
  }();
  return engine();
}

// Explicit times give full resolution but need ownership; "now" (null) only needs write
// permission.
void touch_fd(int fd) {
  struct timespec times[2];
  if (::clock_gettime(CLOCK_REALTIME, &times[0]) == 0) {
    times[1] = times[0];
    if (::futimens(fd, times) == 0) return;
  }
  ::futimens(fd, nullptr);
}

fs::file_time_type file_time(const struct stat& info) {
  const auto since_epoch = std::chrono::seconds(info.st_mtim.tv_sec) +
                           std::chrono::nanoseconds(info.st_mtim.tv_nsec);
  const auto system = std::chrono::system_clock::time_point(
      std::chrono::duration_cast<std::chrono::system_clock::duration>(since_epoch));
  // C++17 has no clock_cast: map through the distance from "now" on both clocks.
  return fs::file_time_type::clock::now() +
         std::chrono::duration_cast<fs::file_time_type::duration>(
             system - std::chrono::system_clock::now());
}

bool same_file(const struct stat& a, std::uint64_t device, std::uint64_t inode) {
  return static_cast<std::uint64_t>(a.st_dev) == device &&
         static_cast<std::uint64_t>(a.st_ino) == inode;
}

int openat_retry(int dir_fd, const char* name, int flags, mode_t mode) {
  for (;;) {
    const int fd = ::openat(dir_fd, name, flags, mode);
    if (fd >= 0 || errno != EINTR) return fd;
  }
}

DirResult open_dir_at(int parent_fd, const char* name, bool create, mode_t mode) {
  DirResult result;
  if (create) {
    if (::mkdirat(parent_fd, name, mode) == 0) {
      result.created = true;
    } else if (errno != EEXIST) {
      const int error = errno;
      result.status = error == ENOENT ? OpenStatus::missing : OpenStatus::failed;
      result.why = "cannot create: " + errno_text(error);
      return result;
    }
  }
  const int fd = openat_retry(parent_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    const int error = errno;
    if (error == ENOENT) {
      result.status = OpenStatus::missing;
      result.why = "does not exist";
      return result;
    }
    struct stat link {};
    if (error == ELOOP ||
        (::fstatat(parent_fd, name, &link, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(link.st_mode))) {
      result.status = OpenStatus::refused;
      result.why = "a symbolic link (never followed)";
      return result;
    }
    result.status = OpenStatus::failed;
    result.why = error == ENOTDIR ? std::string("not a directory") : errno_text(error);
    return result;
  }
  result.fd = Fd(fd);
  if (::fstat(fd, &result.status_info) != 0) {
    result.why = "cannot stat: " + errno_text(errno);
    result.fd.reset();
    return result;
  }
  result.status = OpenStatus::ok;
  return result;
}

void share_directory(DirResult* dir, const CacheTrust& trust) {
  // Only directories we just made: turning an existing private directory into a shared one
  // would hand its contents to the whole group behind its owner's back.
  if (!trust.shared() || !dir->fd || !dir->created) return;
  struct stat& info = dir->status_info;
  // Never "repair" a directory others could write: it stays refused.
  if (info.st_uid != ::geteuid() || (info.st_mode & S_IWOTH)) return;
  if (info.st_gid != trust.group() && ::fchown(dir->fd.get(), static_cast<uid_t>(-1), trust.group()) != 0)
    return;
  if ((info.st_mode & 07777) != trust.directory_mode())
    ::fchmod(dir->fd.get(), trust.directory_mode());
  ::fstat(dir->fd.get(), &info);
}

namespace {

// Whether lexically_normal() would return `text` unchanged and it has no trailing separator:
// no empty, "." or ".." component and no doubled or trailing '/'. Most cache paths are so, and
// their check is cheaper than the normalization (on the path of every engine's construction).
bool already_normal(const std::string& text) {
  if (text.empty() || text.back() == '/') return false;
  std::size_t start = text[0] == '/' ? 1 : 0;
  while (start <= text.size()) {
    const std::size_t end = std::min(text.find('/', start), text.size());
    const std::string_view component(text.data() + start, end - start);
    if (component.empty() || component == "." || component == "..") return false;
    start = end + 1;
  }
  return true;
}

}  // namespace

fs::path normalize_for_open(const fs::path& path) {
  if (already_normal(path.native())) return path;
  fs::path normal = path.lexically_normal();
  while (!normal.empty() && !normal.has_filename() && normal != normal.root_path())
    normal = normal.parent_path();
  return normal;
}

int open_private_append(const fs::path& path, std::string* why) {
  const fs::path normal = normalize_for_open(path);
  const fs::path name = normal.filename();
  if (name.empty() || name == "." || name == "..") {
    *why = "not a file name";
    return -1;
  }
  const fs::path parent = normal.has_parent_path() ? normal.parent_path() : fs::path(".");
  DirResult dir = open_dir_at(AT_FDCWD, parent.c_str(), false, 0);
  if (dir.status != OpenStatus::ok) {
    *why = fmt::format("directory {}: {}", parent.string(), dir.why);
    return -1;
  }
  const struct stat& info = dir.status_info;
  std::string refused = CacheTrust::owner_only().check(info);
  // A sticky directory of ours or root's (/tmp) is fine: nobody else can rename or remove our
  // file in it, and a file they create there is not ours and is refused below.
  const bool trusted_owner = info.st_uid == ::geteuid() || info.st_uid == 0;
  if (!refused.empty() && trusted_owner && (info.st_mode & S_ISVTX)) refused.clear();
  if (!refused.empty()) {
    *why = fmt::format("directory {}: {}", parent.string(), refused);
    return -1;
  }
  const int fd = openat_retry(dir.fd.get(), name.c_str(),
                              O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK,
                              0600);
  if (fd < 0) {
    *why = errno == ELOOP ? std::string("a symbolic link (never followed)") : errno_text(errno);
    return -1;
  }
  struct stat file {};
  if (::fstat(fd, &file) != 0 || !S_ISREG(file.st_mode) || file.st_nlink != 1 ||
      file.st_uid != ::geteuid()) {
    ::close(fd);
    *why = "not a regular file of ours with a single link";
    return -1;
  }
  return fd;
}

void make_parents(const fs::path& root) {
  fs::path partial;
  const fs::path parent = root.parent_path();
  for (const auto& part : parent) {
    partial /= part;
    if (partial == partial.root_path()) continue;
    if (::mkdir(partial.c_str(), 0700) != 0 && errno != EEXIST) return;
  }
}

}  // namespace astrai::detail
