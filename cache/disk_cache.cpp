#include "cache/disk_cache.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <functional>
#include <random>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>

#include "base/logging.hpp"

namespace astrai::detail {

namespace fs = std::filesystem;

namespace {

// ---------------------------------------------------------------------------------------------
// Entry encoding

constexpr char kMagic[8] = {'A', 'S', 'T', 'R', 'A', 'I', 'J', 'C'};
// magic(8) version(4) kind(1) reserved(3) payload size(8) checksum(8) name len(4) version len(4)
constexpr std::size_t kHeaderSize = 40;
constexpr std::uint32_t kMaxNameLength = 4096;

// Longest variant name that still fits a 255-byte file name: "<32 hex>.<variant>.cubin".
constexpr std::size_t kMaxVariantNameOnDisk = 255 - 32 - 1 - 6;

constexpr std::string_view kEntrySuffix = ".cubin";
constexpr std::string_view kTempPrefix = ".tmp-";
constexpr std::string_view kLockSuffix = ".lock";
constexpr std::chrono::hours kStaleTempAge{1};

void put_u32(std::vector<char>& out, std::uint32_t value) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xffu));
}

void put_u64(std::vector<char>& out, std::uint64_t value) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xffu));
}

// Grows `out` and copies into the new tail. GCC 12 misreads vector::insert of a range after
// reserve() as a write past a zero-sized region (-Wstringop-overflow); this says the same
// thing without the false alarm.
void put_bytes(std::vector<char>& out, const char* data, std::size_t size) {
  if (size == 0) return;
  const std::size_t at = out.size();
  out.resize(at + size);
  std::memcpy(out.data() + at, data, size);
}

std::uint32_t get_u32(const unsigned char* p) {
  std::uint32_t value = 0;
  for (int i = 3; i >= 0; --i) value = (value << 8) | p[i];
  return value;
}

std::uint64_t get_u64(const unsigned char* p) {
  std::uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | p[i];
  return value;
}

// ---------------------------------------------------------------------------------------------
// Names on disk

bool is_lower_hex(std::string_view text) {
  return std::all_of(text.begin(), text.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

bool starts_with(std::string_view text, std::string_view prefix) {
  return text.size() >= prefix.size() && text.substr(0, prefix.size()) == prefix;
}

bool ends_with(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.substr(text.size() - suffix.size()) == suffix;
}

// A variant name becomes part of a file name, so it must be one safe path component.
bool is_valid_variant_for_path(const std::string& name) {
  if (name.empty() || name.size() > kMaxVariantNameOnDisk) return false;
  for (char c : name) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f || c == '/' || c == '\\') return false;
  }
  return true;
}

// Parses "<32 hex>.<variant>.cubin". Temp files, locks and anything else do not match.
bool parse_entry_file_name(std::string_view name, std::string* key_hex, std::string* variant) {
  if (name.size() <= 32 + 1 + kEntrySuffix.size()) return false;
  if (!is_lower_hex(name.substr(0, 32)) || name[32] != '.' || !ends_with(name, kEntrySuffix))
    return false;
  *key_hex = std::string(name.substr(0, 32));
  *variant = std::string(name.substr(33, name.size() - 33 - kEntrySuffix.size()));
  return true;
}

bool is_shard_dir_name(std::string_view name) { return name.size() == 2 && is_lower_hex(name); }

std::string errno_text(int error) { return std::generic_category().message(error); }

// ---------------------------------------------------------------------------------------------
// Low-level file helpers (all retry EINTR, none throws)

// Returns 0 or an errno value.
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

// Sets mtime (our "last used" time) and atime to now. Explicit times give full resolution but
// need ownership; "now" (null) only needs write permission. Failures are ignored.
void touch_fd(int fd) {
  struct timespec times[2];
  if (::clock_gettime(CLOCK_REALTIME, &times[0]) == 0) {
    times[1] = times[0];
    if (::futimens(fd, times) == 0) return;
  }
  ::futimens(fd, nullptr);
}

// ---------------------------------------------------------------------------------------------
// Descriptors. Every cache path is opened relative to its parent's descriptor, never through a
// symbolic link, and judged by fstat on what was opened.

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
  explicit operator bool() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

int openat_retry(int dir_fd, const char* name, int flags, mode_t mode = 0) {
  for (;;) {
    const int fd = ::openat(dir_fd, name, flags, mode);
    if (fd >= 0 || errno != EINTR) return fd;
  }
}

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

// A shared cache's directories are setgid and group-writable. Directories of ours get those
// bits when we create them (the umask removes them) or find them missing.
void share_directory(DirResult* dir, const CacheTrust& trust) {
  if (!trust.shared() || !dir->fd) return;
  struct stat& info = dir->status_info;
  // Never "repair" a directory others could write: it stays refused.
  if (info.st_uid != ::geteuid() || (info.st_mode & S_IWOTH)) return;
  if (info.st_gid != trust.group() && ::fchown(dir->fd.get(), static_cast<uid_t>(-1), trust.group()) != 0)
    return;
  if ((info.st_mode & 07777) != trust.directory_mode())
    ::fchmod(dir->fd.get(), trust.directory_mode());
  ::fstat(dir->fd.get(), &info);
}

// mkdir -p for the directories above a cache root (private: 0700, as XDG asks for
// ~/.cache). Errors are left for the open of the root to report.
void make_parents(const fs::path& root) {
  fs::path partial;
  const fs::path parent = root.parent_path();
  for (const auto& part : parent) {
    partial /= part;
    if (partial == partial.root_path()) continue;
    if (::mkdir(partial.c_str(), 0700) != 0 && errno != EEXIST) return;
  }
}

bool same_file(const struct stat& a, std::uint64_t device, std::uint64_t inode) {
  return static_cast<std::uint64_t>(a.st_dev) == device &&
         static_cast<std::uint64_t>(a.st_ino) == inode;
}

// Reads the whole regular file behind `fd` (size from fstat, at most kMaxEntryFileBytes, else
// refused before any allocation). A file that grows while we read is refused too.
bool read_entry_fd(int fd, const struct stat& info, std::vector<char>* out, std::string* why) {
  if (info.st_size < 0 || static_cast<std::uint64_t>(info.st_size) > kMaxEntryFileBytes) {
    *why = fmt::format("file of {} bytes is larger than the {} MiB limit",
                       static_cast<long long>(info.st_size), kMaxEntryFileBytes >> 20);
    return false;
  }
  return read_all(fd, static_cast<std::uint64_t>(info.st_size), out, why);
}

}  // namespace

// =============================================================================================
// Entry format

std::vector<char> encode_entry(const CacheEntryData& entry) {
  std::vector<char> out;
  out.reserve(kHeaderSize + entry.variant_name.size() + entry.nvrtc_version.size() +
              entry.payload.size());
  put_bytes(out, kMagic, sizeof kMagic);
  put_u32(out, kEntryFormatVersion);
  out.push_back(static_cast<char>(entry.kind));
  out.push_back(0);
  out.push_back(0);
  out.push_back(0);
  put_u64(out, static_cast<std::uint64_t>(entry.payload.size()));
  const std::size_t checksum_at = out.size();
  put_u64(out, 0);
  put_u32(out, static_cast<std::uint32_t>(entry.variant_name.size()));
  put_u32(out, static_cast<std::uint32_t>(entry.nvrtc_version.size()));
  put_bytes(out, entry.variant_name.data(), entry.variant_name.size());
  put_bytes(out, entry.nvrtc_version.data(), entry.nvrtc_version.size());
  put_bytes(out, entry.payload.data(), entry.payload.size());
  // The checksum covers the names and the payload, seeded with the version and kind bytes, so
  // no flipped bit outside the checksum field itself goes unnoticed.
  const std::uint64_t checksum =
      payload_checksum(out.data() + kHeaderSize, out.size() - kHeaderSize,
                       get_u64(reinterpret_cast<const unsigned char*>(out.data()) + 8));
  for (int i = 0; i < 8; ++i) out[checksum_at + i] = static_cast<char>((checksum >> (8 * i)) & 0xffu);
  return out;
}

namespace {

// Where the parts of a valid entry file lie.
struct EntryLayout {
  BinaryKind kind = BinaryKind::cubin;
  std::size_t name_offset = 0;
  std::size_t name_length = 0;
  std::size_t version_length = 0;
  std::size_t payload_offset = 0;
  std::size_t payload_size = 0;
};

// Checks an entry file (header, sizes, checksum); the reason goes to *error on failure.
bool parse_entry(const char* data, std::size_t size, EntryLayout* layout, std::string* error) {
  auto fail = [error](const char* why) {
    if (error) {
      try {
        *error = why;
      } catch (const std::exception&) {
      }
    }
    return false;
  };
  if (data == nullptr) return fail("no data");
  if (size < kHeaderSize) return fail("truncated header");
  const auto* bytes = reinterpret_cast<const unsigned char*>(data);
  if (std::memcmp(bytes, kMagic, sizeof kMagic) != 0) return fail("bad magic");
  if (get_u32(bytes + 8) != kEntryFormatVersion) return fail("unsupported format version");
  const unsigned kind = bytes[12];
  if (kind != static_cast<unsigned>(BinaryKind::cubin) &&
      kind != static_cast<unsigned>(BinaryKind::ptx))
    return fail("unknown binary kind");
  if (bytes[13] != 0 || bytes[14] != 0 || bytes[15] != 0) return fail("nonzero reserved bytes");
  const std::uint64_t payload_size = get_u64(bytes + 16);
  const std::uint64_t checksum = get_u64(bytes + 24);
  const std::uint32_t name_length = get_u32(bytes + 32);
  const std::uint32_t version_length = get_u32(bytes + 36);
  if (name_length > kMaxNameLength) return fail("variant name too long");
  if (version_length > kMaxNameLength) return fail("nvrtc version too long");

  // All comparisons below are against sizes already known to fit: no overflow possible.
  const std::uint64_t body = size - kHeaderSize;
  const std::uint64_t strings = std::uint64_t{name_length} + version_length;
  if (strings > body) return fail("truncated names");
  const std::uint64_t available = body - strings;
  if (payload_size > available) return fail("truncated payload");
  if (payload_size < available) return fail("trailing bytes after payload");

  const char* name = data + kHeaderSize;
  if (payload_checksum(name, static_cast<std::size_t>(body), get_u64(bytes + 8)) != checksum)
    return fail("checksum mismatch");
  layout->kind = static_cast<BinaryKind>(kind);
  layout->name_offset = kHeaderSize;
  layout->name_length = name_length;
  layout->version_length = version_length;
  layout->payload_offset = kHeaderSize + static_cast<std::size_t>(strings);
  layout->payload_size = static_cast<std::size_t>(payload_size);
  return true;
}

// decode_entry for a buffer the caller gives up: the payload keeps the buffer (no copy).
std::optional<CacheEntryData> decode_entry_taking(std::vector<char>&& bytes, std::string* error) {
  EntryLayout layout;
  if (!parse_entry(bytes.data(), bytes.size(), &layout, error)) return std::nullopt;
  CacheEntryData entry;
  entry.kind = layout.kind;
  const char* name = bytes.data() + layout.name_offset;
  entry.variant_name.assign(name, layout.name_length);
  entry.nvrtc_version.assign(name + layout.name_length, layout.version_length);
  entry.payload = std::move(bytes);
  entry.payload.erase(entry.payload.begin(),
                      entry.payload.begin() + static_cast<std::ptrdiff_t>(layout.payload_offset));
  return entry;
}

}  // namespace

std::optional<CacheEntryData> decode_entry(const char* data, std::size_t size,
                                           std::string* error) {
  EntryLayout layout;
  if (!parse_entry(data, size, &layout, error)) return std::nullopt;
  try {
    CacheEntryData entry;
    entry.kind = layout.kind;
    const char* name = data + layout.name_offset;
    entry.variant_name.assign(name, layout.name_length);
    entry.nvrtc_version.assign(name + layout.name_length, layout.version_length);
    const char* payload = data + layout.payload_offset;
    entry.payload.assign(payload, payload + layout.payload_size);
    return entry;
  } catch (const std::exception&) {
    if (error) *error = "out of memory";
    return std::nullopt;
  }
}

bool is_other_entry_format(const char* data, std::size_t size) {
  if (data == nullptr || size < 12 || std::memcmp(data, kMagic, sizeof kMagic) != 0) return false;
  return get_u32(reinterpret_cast<const unsigned char*>(data) + 8) != kEntryFormatVersion;
}

bool check_kernel_binary(BinaryKind kind, const char* data, std::size_t size, std::string* why) {
  auto fail = [why](const char* reason) {
    if (why) *why = reason;
    return false;
  };
  if (data == nullptr || size == 0) return fail("empty binary");
  if (kind == BinaryKind::ptx) {
    if (data[size - 1] != '\0') return fail("PTX text does not end in NUL");
    return true;
  }
  if (kind != BinaryKind::cubin) return fail("unknown binary kind");
  // Fields of Elf64_Ehdr read by offset (the payload has no alignment guarantee).
  constexpr std::size_t kElfHeaderSize = 64;
  constexpr std::size_t kSectionHeaderSize = 64;
  constexpr std::size_t kProgramHeaderSize = 56;
  const auto* bytes = reinterpret_cast<const unsigned char*>(data);
  if (size < kElfHeaderSize) return fail("cubin shorter than an ELF header");
  if (bytes[0] != 0x7f || bytes[1] != 'E' || bytes[2] != 'L' || bytes[3] != 'F')
    return fail("cubin is not an ELF file");
  if (bytes[4] != 2 || bytes[5] != 1) return fail("cubin is not 64-bit little-endian ELF");
  auto u16 = [bytes](std::size_t at) {
    return static_cast<std::uint16_t>(bytes[at] | (bytes[at + 1] << 8));
  };
  const std::uint64_t program_offset = get_u64(bytes + 32);
  const std::uint64_t section_offset = get_u64(bytes + 40);
  const std::uint16_t header_size = u16(52);
  const std::uint16_t program_entry = u16(54);
  const std::uint16_t program_count = u16(56);
  const std::uint16_t section_entry = u16(58);
  const std::uint16_t section_count = u16(60);
  if (header_size < kElfHeaderSize || header_size > size) return fail("bad ELF header size");
  // Table bounds: offsets and counts are 64-bit and 16-bit, so the products cannot overflow.
  auto table_inside = [size](std::uint64_t offset, std::uint64_t count, std::uint64_t entry) {
    return offset <= size && count * entry <= size - offset;
  };
  if (program_count > 0 &&
      (program_entry != kProgramHeaderSize ||
       !table_inside(program_offset, program_count, program_entry)))
    return fail("ELF program header table lies outside the cubin");
  if (section_count > 0 &&
      (section_entry != kSectionHeaderSize ||
       !table_inside(section_offset, section_count, section_entry)))
    return fail("ELF section table lies outside the cubin");
  constexpr std::uint32_t kNoBits = 8;  // SHT_NOBITS: occupies no file space
  for (std::uint16_t i = 0; i < section_count; ++i) {
    const unsigned char* section = bytes + section_offset + std::uint64_t{i} * kSectionHeaderSize;
    const std::uint32_t type = get_u32(section + 4);
    const std::uint64_t offset = get_u64(section + 24);
    const std::uint64_t length = get_u64(section + 32);
    if (type == kNoBits) continue;
    if (offset > size || length > size - offset) return fail("an ELF section lies outside the cubin");
  }
  return true;
}

// =============================================================================================
// DiskCache

struct DiskCache::Chain {
  OpenStatus status = OpenStatus::failed;
  std::string why;
  fs::path where;  // the path that failed (or the deepest one opened)
  CacheTrust trust;
  Fd root, v1, sub;
};

DiskCache::Chain DiskCache::open_chain(const char* sub, bool create) const {
  Chain chain;
  if (root_.empty()) {
    chain.why = "no cache directory";
    return chain;
  }
  chain.where = root_;
  auto stop = [&chain](DirResult& dir, const fs::path& where, const std::string& reason) {
    chain.status = dir.status == OpenStatus::ok ? OpenStatus::refused : dir.status;
    chain.why = reason.empty() ? dir.why : reason;
    chain.where = where;
    return std::move(chain);
  };

  // The root: its own last component is never followed (directories above it may be links,
  // e.g. a home directory on another volume).
  const CacheTrust private_trust = CacheTrust::owner_only();
  mode_t root_mode = sharing_.enabled() ? 02770 : 0700;
  if (create) make_parents(root_);
  DirResult root = open_dir_at(AT_FDCWD, root_.c_str(), create, root_mode);
  if (root.status != OpenStatus::ok) return stop(root, root_, {});
  switch (sharing_.kind) {
    case CacheSharing::Kind::off: chain.trust = private_trust; break;
    case CacheSharing::Kind::directory_group:
      chain.trust = CacheTrust::shared_with(root.status_info.st_gid);
      break;
    case CacheSharing::Kind::named_group: chain.trust = CacheTrust::shared_with(sharing_.gid); break;
  }
  if (chain.trust.shared() && !is_own_group(chain.trust.group()))
    return stop(root, root_,
                fmt::format("shared with group {}, which is not one of this process's groups",
                            chain.trust.group()));
  if (create) share_directory(&root, chain.trust);
  if (std::string why = chain.trust.check(root.status_info); !why.empty())
    return stop(root, root_, why);
  chain.root = std::move(root.fd);

  DirResult v1 = open_dir_at(chain.root.get(), "v1", create, chain.trust.directory_mode());
  if (v1.status == OpenStatus::ok && create) share_directory(&v1, chain.trust);
  if (v1.status != OpenStatus::ok) return stop(v1, entries_dir_, {});
  if (std::string why = chain.trust.check(v1.status_info); !why.empty())
    return stop(v1, entries_dir_, why);
  chain.v1 = std::move(v1.fd);
  chain.where = entries_dir_;
  if (sub == nullptr) {
    chain.status = OpenStatus::ok;
    return chain;
  }

  const fs::path sub_path = entries_dir_ / sub;
  DirResult dir = open_dir_at(chain.v1.get(), sub, create, chain.trust.directory_mode());
  if (dir.status == OpenStatus::ok && create) share_directory(&dir, chain.trust);
  if (dir.status != OpenStatus::ok) return stop(dir, sub_path, {});
  if (std::string why = chain.trust.check(dir.status_info); !why.empty())
    return stop(dir, sub_path, why);
  chain.sub = std::move(dir.fd);
  chain.where = sub_path;
  chain.status = OpenStatus::ok;
  return chain;
}

namespace {

// One warning per refused path, naming it and the reason.
void warn_refused(const fs::path& path, const std::string& why) {
  log_once(LogLevel::warn, "refused-cache-path:" + path.string(),
           "not using {}: {}; nothing there is loaded, written or removed", path.string(), why);
}

}  // namespace

namespace {

// "/a/cache/" would make open() follow a link at "cache" despite O_NOFOLLOW: drop the slash.
fs::path without_trailing_separator(fs::path path) {
  while (!path.empty() && !path.has_filename() && path != path.root_path())
    path = path.parent_path();
  return path;
}

}  // namespace

DiskCache::DiskCache(fs::path root, CacheMode mode, std::uint64_t max_bytes, CacheSharing sharing)
    : root_(without_trailing_separator(std::move(root))),
      entries_dir_(root_ / "v1"),
      mode_(mode),
      sharing_(std::move(sharing)),
      max_bytes_(max_bytes) {
  if (mode_ == CacheMode::off) return;
  if (root_.empty()) {
    degrade("no cache directory: set ASTRAI_JIT_CACHE_DIR, XDG_CACHE_HOME or HOME");
    return;
  }
  // read_only never creates anything: a missing directory is simply an empty cache.
  const Chain chain = open_chain(nullptr, mode_ == CacheMode::read_write);
  if (chain.status == OpenStatus::ok) return;
  if (chain.status == OpenStatus::missing && mode_ == CacheMode::read_only) return;
  degrade(fmt::format("{}: {}", chain.where.string(), chain.why));
}

bool DiskCache::usable_for_read() const {
  if (mode_ == CacheMode::off) return false;
  return open_chain(nullptr, false).status == OpenStatus::ok;
}

bool DiskCache::usable_for_write() const {
  if (mode_ != CacheMode::read_write) return false;
  std::lock_guard<std::mutex> lock(mutex_);
  return !degraded_;
}

bool DiskCache::check_usable(std::string* why, bool* missing) const {
  if (missing) *missing = false;
  const Chain chain = open_chain(nullptr, false);
  if (chain.status == OpenStatus::ok) return true;
  if (missing) *missing = chain.status == OpenStatus::missing;
  if (why) *why = fmt::format("{}: {}", chain.where.string(), chain.why);
  return chain.status == OpenStatus::missing;
}

void DiskCache::degrade(const std::string& why) const {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    degraded_ = true;
  }
  log_once(LogLevel::warn, "disk-cache-degraded:" + root_.string(),
           "kernel cache at {} is not usable ({}); {}", root_.string(), why,
           mode_ == CacheMode::read_write ? "compiled kernels are kept in memory only"
                                          : "nothing is loaded from it");
}

void DiskCache::report_refused(const Chain& chain) const {
  if (chain.where == root_ || chain.where == entries_dir_)
    degrade(fmt::format("{}: {}", chain.where.string(), chain.why));
  else
    warn_refused(chain.where, chain.why);
}

fs::path DiskCache::entry_path(const CacheKey& key, const std::string& variant_name) const {
  const std::string hex = key.hex();
  return entries_dir_ / hex.substr(0, 2) / (hex + "." + variant_name + std::string(kEntrySuffix));
}

bool DiskCache::contains(const CacheKey& key, const std::string& variant_name) const {
  if (mode_ == CacheMode::off || !is_valid_variant_for_path(variant_name)) return false;
  const std::string hex = key.hex();
  const Chain chain = open_chain(hex.substr(0, 2).c_str(), false);
  if (chain.status != OpenStatus::ok) return false;
  const std::string name = hex + "." + variant_name + std::string(kEntrySuffix);
  struct stat info {};
  return ::fstatat(chain.sub.get(), name.c_str(), &info, AT_SYMLINK_NOFOLLOW) == 0 &&
         S_ISREG(info.st_mode) && chain.trust.check(info).empty();
}

std::optional<CacheEntryData> DiskCache::load(const CacheKey& key,
                                              const std::string& variant_name) {
  if (mode_ == CacheMode::off || !is_valid_variant_for_path(variant_name)) return std::nullopt;
  const std::string hex = key.hex();
  const Chain chain = open_chain(hex.substr(0, 2).c_str(), false);
  if (chain.status != OpenStatus::ok) {
    if (chain.status == OpenStatus::refused) report_refused(chain);
    return std::nullopt;
  }
  const std::string name = hex + "." + variant_name + std::string(kEntrySuffix);
  const fs::path path = chain.where / name;
  // O_NONBLOCK only matters if something odd (a FIFO) sits where an entry should be.
  const int raw_fd = openat_retry(chain.sub.get(), name.c_str(),
                                  O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
  if (raw_fd < 0) {
    const int error = errno;
    if (error == ELOOP)
      warn_refused(path, "a symbolic link (never followed)");
    else if (error != ENOENT && error != ENOTDIR)
      log(LogLevel::debug, "cannot open cache entry {}: {}", path.string(), errno_text(error));
    return std::nullopt;
  }
  Fd fd(raw_fd);

  struct stat opened {};
  std::string why;
  std::optional<CacheEntryData> entry;
  if (::fstat(fd.get(), &opened) != 0) {
    why = "cannot stat: " + errno_text(errno);
  } else if (!S_ISREG(opened.st_mode)) {
    why = "not a regular file";
  } else if (std::string refused = chain.trust.check(opened); !refused.empty()) {
    warn_refused(path, refused);  // foreign: neither loaded nor removed
    return std::nullopt;
  } else {
    std::vector<char> bytes;
    if (read_entry_fd(fd.get(), opened, &bytes, &why)) {
      if (is_other_entry_format(bytes.data(), bytes.size())) {
        // Another build of the library shares this cache: its entry is not damaged.
        log(LogLevel::debug, "cache entry {} has another entry format; recompiling", path.string());
        return std::nullopt;
      }
      try {
        entry = decode_entry_taking(std::move(bytes), &why);
      } catch (const std::exception&) {
        why = "out of memory";
      }
      if (entry && entry->variant_name != variant_name) {
        why = "entry holds variant '" + entry->variant_name + "'";
        entry.reset();
      }
    }
  }

  if (entry) {
    // LRU bookkeeping: mtime is the "last used" time (atime is often disabled). Read-only
    // caches are never written, not even their timestamps.
    if (mode_ == CacheMode::read_write) touch_fd(fd.get());
    return entry;
  }
  fd.reset();

  // Damaged. Remove it only if the name still refers to the file we read: another process
  // may have just published a good entry under the same name.
  bool removed = false;
  if (mode_ == CacheMode::read_write && S_ISREG(opened.st_mode)) {
    struct stat current {};
    if (::fstatat(chain.sub.get(), name.c_str(), &current, AT_SYMLINK_NOFOLLOW) == 0 &&
        current.st_dev == opened.st_dev && current.st_ino == opened.st_ino)
      removed = ::unlinkat(chain.sub.get(), name.c_str(), 0) == 0;
  }
  if (removed) {
    log_once(LogLevel::warn, "damaged-cache-entry:" + path.string(),
             "removed damaged kernel cache entry {}: {}", path.string(), why);
  } else {
    log_once(LogLevel::warn, "damaged-cache-entry:" + path.string(),
             "ignoring damaged kernel cache entry {}: {}", path.string(), why);
  }
  return std::nullopt;
}

namespace {

// Writes `bytes` to a fresh temp file in `dir_fd` and renames it to `name`. Returns 0 or an
// errno value; `failure` receives a readable description.
int publish_file(int dir_fd, const fs::path& dir, const std::string& name,
                 const std::vector<char>& bytes, const CacheTrust& trust, std::string* failure) {
  std::string temp;
  int fd = -1;
  for (int attempt = 0; attempt < 16; ++attempt) {
    temp = fmt::format("{}{}-{:016x}", kTempPrefix, static_cast<long>(::getpid()), random_u64());
    fd = openat_retry(dir_fd, temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                      trust.file_mode());
    if (fd >= 0 || errno != EEXIST) break;
  }
  if (fd < 0) {
    const int error = errno;
    *failure = fmt::format("cannot create a file in {}: {}", dir.string(), errno_text(error));
    return error;
  }

  auto abandon = [&](int error, const char* what) {
    if (fd >= 0) ::close(fd);
    ::unlinkat(dir_fd, temp.c_str(), 0);
    *failure = fmt::format("{} {}: {}", what, (dir / temp).string(), errno_text(error));
    return error;
  };
  // The umask may have removed the group bits a shared cache needs.
  if (trust.shared()) ::fchmod(fd, trust.file_mode());
  if (int error = write_all(fd, bytes.data(), bytes.size()); error != 0)
    return abandon(error, "cannot write");
  // File systems that cannot sync at all (EINVAL and friends) still get the atomic rename.
  if (::fsync(fd) != 0 && errno != EINVAL && errno != ENOTSUP && errno != ENOSYS)
    return abandon(errno, "cannot fsync");
  const int close_result = ::close(fd);
  fd = -1;
  if (close_result != 0 && errno != EINTR) return abandon(errno, "cannot close");
  // renameat() replaces atomically: readers see the old entry or the new one, never a mix.
  // When two writers race, the last rename wins; both published the same key, so both
  // succeeded.
  if (::renameat(dir_fd, temp.c_str(), dir_fd, name.c_str()) != 0)
    return abandon(errno, "cannot rename");
  ::fsync(dir_fd);  // best effort: some file systems refuse to fsync directories
  return 0;
}

}  // namespace

bool DiskCache::store(const CacheKey& key, const CacheEntryData& entry) {
  if (!usable_for_write()) return false;
  if (!is_valid_variant_for_path(entry.variant_name)) {
    log_once(LogLevel::warn, "unstorable-variant:" + entry.variant_name,
             "not caching variant '{}': the name cannot be used as a file name",
             entry.variant_name);
    return false;
  }
  if (entry.nvrtc_version.size() > kMaxNameLength ||
      entry.payload.size() + kHeaderSize + entry.variant_name.size() +
              entry.nvrtc_version.size() >
          kMaxEntryFileBytes) {
    log_once(LogLevel::warn, "unstorable-entry:" + entry.variant_name,
             "not caching variant '{}': the entry is larger than {} MiB", entry.variant_name,
             kMaxEntryFileBytes >> 20);
    return false;
  }

  const std::vector<char> bytes = encode_entry(entry);
  const std::string hex = key.hex();
  const std::string name = hex + "." + entry.variant_name + std::string(kEntrySuffix);
  const fs::path path = entry_path(key, entry.variant_name);
  std::string failure;
  for (int attempt = 0;; ++attempt) {
    Chain chain = open_chain(hex.substr(0, 2).c_str(), true);
    int error = 0;
    if (chain.status == OpenStatus::refused) {
      report_refused(chain);
      return false;
    }
    if (chain.status != OpenStatus::ok) {
      error = chain.status == OpenStatus::missing ? ENOENT : EIO;
      failure = fmt::format("{}: {}", chain.where.string(), chain.why);
    } else {
      // Never replace what we would refuse to read: it is not ours.
      struct stat existing {};
      if (::fstatat(chain.sub.get(), name.c_str(), &existing, AT_SYMLINK_NOFOLLOW) == 0) {
        std::string refused = S_ISREG(existing.st_mode)   ? chain.trust.check(existing)
                              : S_ISLNK(existing.st_mode) ? std::string("a symbolic link")
                                                          : std::string("not a regular file");
        if (!refused.empty()) {
          warn_refused(path, refused);
          return false;
        }
      }
      error = publish_file(chain.sub.get(), chain.where, name, bytes, chain.trust, &failure);
    }
    if (error == 0) break;
    // ENOENT: the shard directory (or our temp file) was removed under us, typically by a
    // concurrent clear(). Recreate and retry a couple of times before giving up.
    if (error == ENOENT && attempt < 2) continue;
    degrade(failure);
    return false;
  }

  if (max_bytes_ > 0) prune_to(max_bytes_, &path);
  return true;
}

bool DiskCache::import_entry(const std::string& file_name, const std::vector<char>& bytes,
                             std::string* why) {
  std::string key_hex;
  std::string variant;
  if (!parse_entry_file_name(file_name, &key_hex, &variant) || !is_valid_variant_for_path(variant)) {
    *why = "not an entry file name";
    return false;
  }
  CacheKey key;
  for (std::size_t i = 0; i < 32; ++i) {
    const char c = key_hex[i];
    const std::uint64_t digit = static_cast<std::uint64_t>(c <= '9' ? c - '0' : c - 'a' + 10);
    std::uint64_t& half = i < 16 ? key.high : key.low;
    half = (half << 4) | digit;
  }
  auto decoded = decode_entry(bytes.data(), bytes.size(), why);
  if (!decoded) return false;
  if (decoded->variant_name != variant) {
    *why = "variant name does not match the file name";
    return false;
  }
  const std::size_t dot = variant.rfind('.');
  const std::string_view target =
      std::string_view(variant).substr(dot == std::string::npos ? 0 : dot + 1);
  const BinaryKind expected =
      target.rfind("compute_", 0) == 0 ? BinaryKind::ptx : BinaryKind::cubin;
  if (decoded->kind != expected) {
    *why = "binary kind does not match the variant's target";
    return false;
  }
  if (!store(key, *decoded)) {
    *why = fmt::format("cannot write the cache at {}", root_.string());
    return false;
  }
  return true;
}

std::unique_ptr<FileLock> DiskCache::lock_key(const CacheKey& key,
                                              std::chrono::milliseconds max_wait) {
  if (!usable_for_write()) return nullptr;
  const Chain chain = open_chain("locks", true);
  const std::string name = key.hex() + std::string(kLockSuffix);
  if (chain.status != OpenStatus::ok) {
    if (chain.status == OpenStatus::refused) report_refused(chain);
    log(LogLevel::debug, "cannot use compile lock {}: {}", (chain.where / name).string(), chain.why);
    return nullptr;
  }
  const fs::path path = chain.where / name;
  FileLock::Outcome outcome = FileLock::Outcome::unavailable;
  std::string why;
  std::unique_ptr<FileLock> lock =
      FileLock::acquire_at(chain.sub.get(), name, chain.trust, max_wait, &outcome, &why);
  if (outcome == FileLock::Outcome::timed_out) {
    log(max_wait >= std::chrono::seconds(5) ? LogLevel::warn : LogLevel::debug, "waited {} ms for compile lock {}; compiling without it",
        max_wait.count(), path.string());
  } else if (outcome == FileLock::Outcome::unavailable) {
    if (why == "a symbolic link" || why.rfind("owned by", 0) == 0 ||
        why.rfind("writable by", 0) == 0 || why == "not a regular file")
      warn_refused(path, why);
    else
      log(LogLevel::debug, "cannot use compile lock {}: {}; compiling without it", path.string(),
          why);
  }
  return lock;
}

// ---------------------------------------------------------------------------------------------
// Directory scan shared by list / stats / verify / prune / clear. Files that vanish while we
// look are skipped; nothing is followed through a symbolic link; no filesystem error escapes.

struct DiskCache::Scan {
  std::vector<CacheEntryInfo> entries;
  std::vector<CacheEntryInfo> temps;  // path, last_used, device, inode
};

namespace {

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

}  // namespace

DiskCache::Scan DiskCache::scan(bool with_foreign) const {
  Scan result;
  const Chain chain = open_chain(nullptr, false);
  if (chain.status != OpenStatus::ok) {
    if (chain.status == OpenStatus::refused) report_refused(chain);
    return result;
  }
  for_each_name(chain.v1.get(), [&](const std::string& shard_name) {
    if (!is_shard_dir_name(shard_name)) return;
    const fs::path shard_path = entries_dir_ / shard_name;
    DirResult shard = open_dir_at(chain.v1.get(), shard_name.c_str(), false, 0);
    if (shard.status != OpenStatus::ok) {
      if (shard.status == OpenStatus::refused) warn_refused(shard_path, shard.why);
      return;
    }
    if (std::string why = chain.trust.check(shard.status_info); !why.empty()) {
      warn_refused(shard_path, why);
      return;
    }
    for_each_name(shard.fd.get(), [&](const std::string& name) {
      struct stat info {};
      if (::fstatat(shard.fd.get(), name.c_str(), &info, AT_SYMLINK_NOFOLLOW) != 0 ||
          !S_ISREG(info.st_mode))
        return;
      CacheEntryInfo entry;
      entry.path = shard_path / name;
      entry.size_bytes = static_cast<std::uint64_t>(info.st_size);
      entry.last_used = file_time(info);
      entry.device = static_cast<std::uint64_t>(info.st_dev);
      entry.inode = static_cast<std::uint64_t>(info.st_ino);
      const std::string refused = chain.trust.check(info);
      if (starts_with(name, kTempPrefix)) {
        if (refused.empty()) result.temps.push_back(std::move(entry));
        return;
      }
      if (!parse_entry_file_name(name, &entry.key_hex, &entry.variant_name)) return;
      if (entry.key_hex.compare(0, 2, shard_name) != 0) return;
      if (!refused.empty()) {
        warn_refused(entry.path, refused);
        if (!with_foreign) return;
        entry.foreign = true;
        entry.problem = refused;
      }
      result.entries.push_back(std::move(entry));
    });
  });
  std::sort(result.entries.begin(), result.entries.end(),
            [](const CacheEntryInfo& a, const CacheEntryInfo& b) { return a.path < b.path; });
  return result;
}

// Removes the listed file if it is still the very file the scan saw, and still trusted.
bool DiskCache::remove_listed(const fs::path& path, std::uint64_t device,
                              std::uint64_t inode) const {
  const std::string shard = path.parent_path().filename().string();
  const std::string name = path.filename().string();
  const Chain chain = open_chain(shard.c_str(), false);
  if (chain.status != OpenStatus::ok) return false;
  struct stat info {};
  if (::fstatat(chain.sub.get(), name.c_str(), &info, AT_SYMLINK_NOFOLLOW) != 0 ||
      !S_ISREG(info.st_mode) || !same_file(info, device, inode) || !chain.trust.check(info).empty())
    return false;
  return ::unlinkat(chain.sub.get(), name.c_str(), 0) == 0;
}

bool DiskCache::read_entry_file(const CacheEntryInfo& info, std::vector<char>* bytes,
                                std::string* why) const {
  const std::string shard = info.path.parent_path().filename().string();
  const std::string name = info.path.filename().string();
  const Chain chain = open_chain(shard.c_str(), false);
  if (chain.status != OpenStatus::ok) {
    *why = chain.status == OpenStatus::missing ? "cannot open: " + errno_text(ENOENT) : chain.why;
    return false;
  }
  const int raw_fd =
      openat_retry(chain.sub.get(), name.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
  if (raw_fd < 0) {
    *why = errno == ELOOP ? std::string("a symbolic link") : "cannot open: " + errno_text(errno);
    return false;
  }
  Fd fd(raw_fd);
  struct stat opened {};
  if (::fstat(fd.get(), &opened) != 0) {
    *why = "cannot stat: " + errno_text(errno);
    return false;
  }
  if (!S_ISREG(opened.st_mode)) {
    *why = "not a regular file";
    return false;
  }
  if (std::string refused = chain.trust.check(opened); !refused.empty()) {
    *why = refused;
    return false;
  }
  if (!read_entry_fd(fd.get(), opened, bytes, why)) return false;
  if (is_other_entry_format(bytes->data(), bytes->size())) {
    *why = "another entry format";
    return false;
  }
  auto decoded = decode_entry(bytes->data(), bytes->size(), why);
  if (!decoded) return false;
  if (decoded->variant_name != info.variant_name) {
    *why = "variant name does not match the file name";
    return false;
  }
  // A variant's last name component is its target: PTX for a compute_ target, a cubin for
  // any other. An entry holding the other kind would be refused by the runtime anyway.
  const std::size_t dot = info.variant_name.rfind('.');
  const std::string_view target =
      std::string_view(info.variant_name).substr(dot == std::string::npos ? 0 : dot + 1);
  const BinaryKind expected =
      target.rfind("compute_", 0) == 0 ? BinaryKind::ptx : BinaryKind::cubin;
  if (decoded->kind != expected) {
    *why = "binary kind does not match the variant's target";
    return false;
  }
  return true;
}

std::vector<CacheEntryInfo> DiskCache::list() const {
  if (mode_ == CacheMode::off) return {};
  return scan(false).entries;
}

CacheStats DiskCache::stats() const {
  CacheStats stats;
  for (const auto& info : list()) {
    ++stats.entries;
    stats.total_bytes += info.size_bytes;
  }
  return stats;
}

std::vector<CacheEntryInfo> DiskCache::verify(bool repair) {
  if (mode_ == CacheMode::off) return {};
  std::vector<CacheEntryInfo> checked;
  for (auto& info : scan(true).entries) {
    if (info.foreign) {
      checked.push_back(std::move(info));
      continue;
    }
    std::vector<char> bytes;
    std::string why;
    info.valid = read_entry_file(info, &bytes, &why);
    if (!info.valid && why.rfind("cannot open: ", 0) == 0 &&
        why.find(errno_text(ENOENT)) != std::string::npos)
      continue;  // removed by someone else while we were looking
    if (!info.valid && why == "another entry format") {
      info.valid = true;
      info.other_format = true;
    } else if (!info.valid) {
      info.problem = why;
      if (repair && mode_ == CacheMode::read_write &&
          remove_listed(info.path, info.device, info.inode))
        log(LogLevel::info, "removed damaged kernel cache entry {}: {}", info.path.string(), why);
    }
    checked.push_back(std::move(info));
  }
  return checked;
}

std::uint64_t DiskCache::prune_to(std::uint64_t max_bytes, const fs::path* keep) {
  Scan found = scan(false);

  // Temp files this old belong to writers that were killed mid-store.
  const auto stale_before = fs::file_time_type::clock::now() - kStaleTempAge;
  for (const auto& temp : found.temps)
    if (temp.last_used < stale_before) remove_listed(temp.path, temp.device, temp.inode);

  std::sort(found.entries.begin(), found.entries.end(),
            [](const CacheEntryInfo& a, const CacheEntryInfo& b) {
              return a.last_used != b.last_used ? a.last_used < b.last_used : a.path < b.path;
            });
  std::uint64_t total = 0;
  for (const auto& info : found.entries) total += info.size_bytes;
  std::uint64_t freed = 0;
  for (const auto& info : found.entries) {
    if (total <= max_bytes) break;
    if (keep && info.path == *keep) continue;
    const bool removed = remove_listed(info.path, info.device, info.inode);
    if (removed) freed += info.size_bytes;
    // An entry that vanished (or was replaced) meanwhile no longer counts as this size.
    total -= info.size_bytes;
  }
  return freed;
}

std::uint64_t DiskCache::prune(std::uint64_t max_bytes) {
  if (mode_ != CacheMode::read_write) return 0;
  return prune_to(max_bytes, nullptr);
}

std::uint64_t DiskCache::clear() {
  if (mode_ != CacheMode::read_write) return 0;
  const Scan found = scan(false);
  std::uint64_t removed = 0;
  for (const auto& info : found.entries)
    if (remove_listed(info.path, info.device, info.inode)) ++removed;
  for (const auto& temp : found.temps) remove_listed(temp.path, temp.device, temp.inode);
  // Lock files: removing one while another process waits on it lets two processes compile
  // the same key at once. That is harmless (the atomic rename decides), and clear() is a
  // maintenance operation.
  const Chain locks = open_chain("locks", false);
  if (locks.status == OpenStatus::ok) {
    for_each_name(locks.sub.get(), [&](const std::string& name) {
      struct stat info {};
      if (!ends_with(name, kLockSuffix) ||
          ::fstatat(locks.sub.get(), name.c_str(), &info, AT_SYMLINK_NOFOLLOW) != 0 ||
          !S_ISREG(info.st_mode) || !locks.trust.check(info).empty())
        return;
      ::unlinkat(locks.sub.get(), name.c_str(), 0);
    });
  } else if (locks.status == OpenStatus::refused) {
    report_refused(locks);
  }
  return removed;
}

}  // namespace astrai::detail
