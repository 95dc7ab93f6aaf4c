#include "cache/disk_cache.hpp"

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

#include "runtime/logging.hpp"

namespace astrai::detail {

namespace fs = std::filesystem;

namespace {

// ---------------------------------------------------------------------------------------------
// Entry encoding

constexpr char kMagic[8] = {'A', 'S', 'T', 'R', 'A', 'I', 'J', 'C'};
// magic(8) version(4) kind(1) reserved(3) payload size(8) checksum(8) name len(4) version len(4)
constexpr std::size_t kHeaderSize = 40;
constexpr std::uint32_t kMaxNameLength = 4096;

// Entries larger than this are refused when storing and treated as damaged when loading; a
// cubin is a few megabytes at most, so this only guards against reading absurd files.
constexpr std::uint64_t kMaxEntryFileBytes = std::uint64_t{1} << 30;

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

int open_retry(const char* path, int flags, mode_t mode = 0) {
  for (;;) {
    const int fd = ::open(path, flags, mode);
    if (fd >= 0 || errno != EINTR) return fd;
  }
}

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

void fsync_directory(const fs::path& dir) {
  const int fd = open_retry(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);  // best effort: some file systems refuse to fsync directories
  ::close(fd);
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
// Directory scan shared by list / stats / verify / prune / clear. Files that vanish while we
// look are skipped; no filesystem error escapes.

struct TempFile {
  fs::path path;
  fs::file_time_type modified;
};

struct ScanResult {
  std::vector<CacheEntryInfo> entries;
  std::vector<TempFile> temps;
};

bool is_regular_no_follow(const fs::directory_entry& entry) {
  std::error_code ec;
  const fs::file_status status = entry.symlink_status(ec);
  return !ec && fs::is_regular_file(status);
}

ScanResult scan_cache(const fs::path& entries_dir) {
  ScanResult result;
  std::error_code ec;
  for (fs::directory_iterator shard(entries_dir, ec), end; !ec && shard != end;
       shard.increment(ec)) {
    const std::string shard_name = shard->path().filename().string();
    if (!is_shard_dir_name(shard_name)) continue;
    std::error_code type_ec;
    if (!fs::is_directory(shard->symlink_status(type_ec)) || type_ec) continue;

    std::error_code file_ec;
    for (fs::directory_iterator file(shard->path(), file_ec); !file_ec && file != end;
         file.increment(file_ec)) {
      if (!is_regular_no_follow(*file)) continue;
      const fs::path& path = file->path();
      const std::string name = path.filename().string();
      std::error_code stat_ec;
      if (starts_with(name, kTempPrefix)) {
        const auto modified = fs::last_write_time(path, stat_ec);
        if (!stat_ec) result.temps.push_back({path, modified});
        continue;
      }
      CacheEntryInfo info;
      if (!parse_entry_file_name(name, &info.key_hex, &info.variant_name)) continue;
      if (info.key_hex.compare(0, 2, shard_name) != 0) continue;
      info.size_bytes = fs::file_size(path, stat_ec);
      if (stat_ec) continue;
      info.last_used = fs::last_write_time(path, stat_ec);
      if (stat_ec) continue;
      info.path = path;
      result.entries.push_back(std::move(info));
    }
  }
  std::sort(result.entries.begin(), result.entries.end(),
            [](const CacheEntryInfo& a, const CacheEntryInfo& b) { return a.path < b.path; });
  return result;
}

// Reads and fully checks one entry file. `missing` is set when the file is gone.
bool check_entry_file(const CacheEntryInfo& info, bool* missing, std::string* why) {
  *missing = false;
  const int fd = open_retry(info.path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int error = errno;
    *missing = error == ENOENT;
    *why = "cannot open: " + errno_text(error);
    return false;
  }
  std::vector<char> bytes;
  const bool read_ok = read_all(fd, info.size_bytes, &bytes, why);
  ::close(fd);
  if (!read_ok) return false;
  auto decoded = decode_entry(bytes.data(), bytes.size(), why);
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
  const BinaryKind expected = target.rfind("compute_", 0) == 0 ? BinaryKind::ptx : BinaryKind::cubin;
  if (decoded->kind != expected) {
    *why = "binary kind does not match the variant's target";
    return false;
  }
  return true;
}

// Removes stale temp files, then least-recently-used entries until the total is <= max_bytes,
// never touching `keep`. Returns bytes freed.
std::uint64_t prune_to(const fs::path& entries_dir, std::uint64_t max_bytes,
                       const fs::path* keep) {
  ScanResult scan = scan_cache(entries_dir);

  // Temp files this old belong to writers that were killed mid-store.
  const auto stale_before = fs::file_time_type::clock::now() - kStaleTempAge;
  for (const auto& temp : scan.temps) {
    if (temp.modified < stale_before) {
      std::error_code ec;
      fs::remove(temp.path, ec);
    }
  }

  std::sort(scan.entries.begin(), scan.entries.end(),
            [](const CacheEntryInfo& a, const CacheEntryInfo& b) {
              return a.last_used != b.last_used ? a.last_used < b.last_used : a.path < b.path;
            });
  std::uint64_t total = 0;
  for (const auto& info : scan.entries) total += info.size_bytes;
  std::uint64_t freed = 0;
  for (const auto& info : scan.entries) {
    if (total <= max_bytes) break;
    if (keep && info.path == *keep) continue;
    std::error_code ec;
    const bool removed = fs::remove(info.path, ec);
    if (removed) freed += info.size_bytes;
    // An entry that vanished meanwhile no longer counts; one we cannot remove still does.
    if (removed || !ec) total -= info.size_bytes;
  }
  return freed;
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

// =============================================================================================
// DiskCache

DiskCache::DiskCache(fs::path root, CacheMode mode, std::uint64_t max_bytes)
    : root_(std::move(root)), entries_dir_(root_ / "v1"), mode_(mode), max_bytes_(max_bytes) {
  if (mode_ == CacheMode::off) return;
  if (root_.empty()) {
    degrade("no cache directory given");
    return;
  }
  std::error_code ec;
  if (mode_ == CacheMode::read_write) {
    fs::create_directories(entries_dir_, ec);
    std::error_code dir_ec;
    if (ec || !fs::is_directory(entries_dir_, dir_ec)) {
      degrade(fmt::format("cannot create {}: {}", entries_dir_.string(),
                          ec ? ec.message() : std::string("not a directory")));
    }
    return;
  }
  // read_only: never create anything. A missing directory is simply an empty cache.
  const fs::file_status status = fs::status(entries_dir_, ec);
  if (!ec && fs::exists(status) && !fs::is_directory(status))
    degrade(fmt::format("{} is not a directory", entries_dir_.string()));
}

bool DiskCache::usable_for_read() const {
  if (mode_ == CacheMode::off) return false;
  std::error_code ec;
  return fs::is_directory(entries_dir_, ec);
}

bool DiskCache::usable_for_write() const {
  if (mode_ != CacheMode::read_write) return false;
  std::lock_guard<std::mutex> lock(mutex_);
  return !degraded_;
}

void DiskCache::degrade(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    degraded_ = true;
  }
  log_once(LogLevel::warn, "disk-cache-degraded:" + root_.string(),
           "kernel cache at {} is not usable ({}); compiled kernels are kept in memory only",
           root_.string(), why);
}

fs::path DiskCache::entry_path(const CacheKey& key, const std::string& variant_name) const {
  const std::string hex = key.hex();
  return entries_dir_ / hex.substr(0, 2) / (hex + "." + variant_name + std::string(kEntrySuffix));
}

bool DiskCache::contains(const CacheKey& key, const std::string& variant_name) const {
  if (mode_ == CacheMode::off || !is_valid_variant_for_path(variant_name)) return false;
  std::error_code ec;
  return fs::is_regular_file(entry_path(key, variant_name), ec);
}

std::optional<CacheEntryData> DiskCache::load(const CacheKey& key,
                                              const std::string& variant_name) {
  if (mode_ == CacheMode::off || !is_valid_variant_for_path(variant_name)) return std::nullopt;
  const fs::path path = entry_path(key, variant_name);
  // O_NONBLOCK only matters if something odd (a FIFO) sits where an entry should be.
  const int fd = open_retry(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int error = errno;
    if (error != ENOENT && error != ENOTDIR)
      log(LogLevel::debug, "cannot open cache entry {}: {}", path.string(), errno_text(error));
    return std::nullopt;
  }

  struct stat opened {};
  std::string why;
  std::optional<CacheEntryData> entry;
  if (::fstat(fd, &opened) != 0) {
    why = "cannot stat: " + errno_text(errno);
  } else if (!S_ISREG(opened.st_mode)) {
    why = "not a regular file";
  } else {
    std::vector<char> bytes;
    if (read_all(fd, static_cast<std::uint64_t>(opened.st_size), &bytes, &why)) {
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
    if (mode_ == CacheMode::read_write) touch_fd(fd);
    ::close(fd);
    return entry;
  }
  ::close(fd);

  // Damaged. Remove it only if the name still refers to the file we read: another process
  // may have just published a good entry under the same name.
  bool removed = false;
  if (mode_ == CacheMode::read_write && S_ISREG(opened.st_mode)) {
    struct stat current {};
    if (::lstat(path.c_str(), &current) == 0 && current.st_dev == opened.st_dev &&
        current.st_ino == opened.st_ino)
      removed = ::unlink(path.c_str()) == 0;
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

// Writes `bytes` to a fresh temp file beside `path` and renames it into place.
// Returns 0 or an errno value; `failure` receives a readable description.
int publish_file(const fs::path& path, const std::vector<char>& bytes, std::string* failure) {
  const fs::path dir = path.parent_path();
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    *failure = fmt::format("cannot create {}: {}", dir.string(), ec.message());
    return ec.value() != 0 ? ec.value() : EIO;
  }

  fs::path temp;
  int fd = -1;
  for (int attempt = 0; attempt < 16; ++attempt) {
    temp = dir / fmt::format("{}{}-{:016x}", kTempPrefix, static_cast<long>(::getpid()),
                             random_u64());
    fd = open_retry(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0 || errno != EEXIST) break;
  }
  if (fd < 0) {
    const int error = errno;
    *failure = fmt::format("cannot create a file in {}: {}", dir.string(), errno_text(error));
    return error;
  }

  auto abandon = [&](int error, const char* what) {
    if (fd >= 0) ::close(fd);
    ::unlink(temp.c_str());
    *failure = fmt::format("{} {}: {}", what, temp.string(), errno_text(error));
    return error;
  };
  if (int error = write_all(fd, bytes.data(), bytes.size()); error != 0)
    return abandon(error, "cannot write");
  // File systems that cannot sync at all (EINVAL and friends) still get the atomic rename.
  if (::fsync(fd) != 0 && errno != EINVAL && errno != ENOTSUP && errno != ENOSYS)
    return abandon(errno, "cannot fsync");
  const int close_result = ::close(fd);
  fd = -1;
  if (close_result != 0 && errno != EINTR) return abandon(errno, "cannot close");
  // rename() replaces atomically: readers see the old entry or the new one, never a mix.
  // When two writers race, the last rename wins; both published the same key, so both
  // succeeded.
  if (::rename(temp.c_str(), path.c_str()) != 0) return abandon(errno, "cannot rename");
  fsync_directory(dir);
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
             "not caching variant '{}': the entry is too large", entry.variant_name);
    return false;
  }

  const std::vector<char> bytes = encode_entry(entry);
  const fs::path path = entry_path(key, entry.variant_name);
  std::string failure;
  for (int attempt = 0;; ++attempt) {
    const int error = publish_file(path, bytes, &failure);
    if (error == 0) break;
    // ENOENT: the shard directory (or our temp file) was removed under us, typically by a
    // concurrent clear(). Recreate and retry a couple of times before giving up.
    if (error == ENOENT && attempt < 2) continue;
    degrade(failure);
    return false;
  }

  if (max_bytes_ > 0) prune_to(entries_dir_, max_bytes_, &path);
  return true;
}

std::unique_ptr<FileLock> DiskCache::lock_key(const CacheKey& key,
                                              std::chrono::milliseconds max_wait) {
  if (!usable_for_write()) return nullptr;
  const fs::path path = entries_dir_ / "locks" / (key.hex() + std::string(kLockSuffix));
  FileLock::Outcome outcome = FileLock::Outcome::unavailable;
  std::unique_ptr<FileLock> lock = FileLock::acquire(path, max_wait, &outcome);
  if (outcome == FileLock::Outcome::timed_out) {
    log(LogLevel::debug, "waited {} ms for compile lock {}; compiling without it",
        max_wait.count(), path.string());
  } else if (outcome == FileLock::Outcome::unavailable) {
    log(LogLevel::debug, "cannot use compile lock {}; compiling without it", path.string());
  }
  return lock;
}

std::vector<CacheEntryInfo> DiskCache::list() const {
  if (mode_ == CacheMode::off) return {};
  return scan_cache(entries_dir_).entries;
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
  for (auto& info : scan_cache(entries_dir_).entries) {
    bool missing = false;
    std::string why;
    info.valid = check_entry_file(info, &missing, &why);
    if (missing) continue;  // removed by someone else while we were looking
    if (!info.valid && repair && mode_ == CacheMode::read_write) {
      std::error_code ec;
      if (fs::remove(info.path, ec))
        log(LogLevel::info, "removed damaged kernel cache entry {}: {}", info.path.string(), why);
    }
    checked.push_back(std::move(info));
  }
  return checked;
}

std::uint64_t DiskCache::prune(std::uint64_t max_bytes) {
  if (mode_ != CacheMode::read_write) return 0;
  return prune_to(entries_dir_, max_bytes, nullptr);
}

std::uint64_t DiskCache::clear() {
  if (mode_ != CacheMode::read_write) return 0;
  ScanResult scan = scan_cache(entries_dir_);
  std::uint64_t removed = 0;
  for (const auto& info : scan.entries) {
    std::error_code ec;
    if (fs::remove(info.path, ec)) ++removed;
  }
  for (const auto& temp : scan.temps) {
    std::error_code ec;
    fs::remove(temp.path, ec);
  }
  // Lock files: removing one while another process waits on it lets two processes compile
  // the same key at once. That is harmless (the atomic rename decides), and clear() is a
  // maintenance operation.
  std::error_code ec;
  for (fs::directory_iterator lock(entries_dir_ / "locks", ec), end; !ec && lock != end;
       lock.increment(ec)) {
    const std::string name = lock->path().filename().string();
    if (is_regular_no_follow(*lock) && ends_with(name, kLockSuffix)) {
      std::error_code remove_ec;
      fs::remove(lock->path(), remove_ec);
    }
  }
  return removed;
}

}  // namespace astrai::detail
