#include "cache/disk_cache.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <exception>
#include <string_view>
#include <utility>

#include "base/logging.hpp"
#include "cache/disk_cache_internal.hpp"
#include "cache/variant_payload.hpp"

namespace astrai::detail {

namespace fs = std::filesystem;

DiskCache::Chain DiskCache::open_chain(const char* sub, bool create) const {
  Chain chain;
  if (root_.empty()) {
    chain.why = "no cache directory";
    return chain;
  }
  using Level = Chain::Level;
  if (sub != nullptr) chain.sub_name = sub;
  auto stop = [&chain](DirResult& dir, Level level, const std::string& reason) {
    chain.status = dir.status == OpenStatus::ok ? OpenStatus::refused : dir.status;
    chain.why = reason.empty() ? dir.why : reason;
    chain.level = level;
    return std::move(chain);
  };

  // The root: its own last component is never followed (directories above it may be links,
  // e.g. a home directory on another volume).
  const CacheTrust private_trust = CacheTrust::owner_only();
  mode_t root_mode = sharing_.enabled() ? 02770 : 0700;
  if (create) make_parents(root_);
  DirResult root = open_dir_at(AT_FDCWD, root_.c_str(), create, root_mode);
  if (root.status != OpenStatus::ok) return stop(root, Level::root, {});
  switch (sharing_.kind) {
    case CacheSharing::Kind::off: chain.trust = private_trust; break;
    case CacheSharing::Kind::directory_group:
      chain.trust = CacheTrust::shared_with(root.status_info.st_gid);
      break;
    case CacheSharing::Kind::named_group: chain.trust = CacheTrust::shared_with(sharing_.gid); break;
  }
  if (chain.trust.shared() && sharing_.owners_listed)
    chain.trust = CacheTrust::shared_with(chain.trust.group(), sharing_.owners);
  if (chain.trust.shared() && !is_own_group(chain.trust.group()))
    return stop(root, Level::root,
                fmt::format("shared with group {}, which is not one of this process's groups",
                            chain.trust.group()));
  if (create) share_directory(&root, chain.trust);
  const mode_t shared_bits = S_ISGID | S_IRWXG;
  if (create && chain.trust.shared() && !root.created &&
      ((root.status_info.st_mode & shared_bits) != shared_bits ||
       root.status_info.st_gid != chain.trust.group()))
    log_once(LogLevel::warn, "unshared-cache-root:" + root_.string(),
             "ASTRAI_JIT_CACHE_SHARED is set but the existing cache directory {} is not shared "
             "(mode {:04o}, group {}); it is left as it is. To share it with group {}, run: chgrp "
             "-R {} {} && chmod -R g+rwX {} && find {} -type d -exec chmod g+s {{}} +",
             root_.string(), root.status_info.st_mode & 07777, root.status_info.st_gid,
             chain.trust.group(), chain.trust.group(), root_.string(), root_.string(),
             root_.string());
  if (std::string why = chain.trust.check(root.status_info); !why.empty())
    return stop(root, Level::root, why);
  chain.root = std::move(root.fd);

  DirResult v1 = open_dir_at(chain.root.get(), "v1", create, chain.trust.directory_mode());
  if (v1.status == OpenStatus::ok && create) share_directory(&v1, chain.trust);
  if (v1.status != OpenStatus::ok) return stop(v1, Level::v1, {});
  if (std::string why = chain.trust.check(v1.status_info); !why.empty())
    return stop(v1, Level::v1, why);
  chain.v1 = std::move(v1.fd);
  chain.level = Level::v1;
  if (sub == nullptr) {
    chain.status = OpenStatus::ok;
    return chain;
  }

  DirResult dir = open_dir_at(chain.v1.get(), sub, create, chain.trust.directory_mode());
  if (dir.status == OpenStatus::ok && create) share_directory(&dir, chain.trust);
  if (dir.status != OpenStatus::ok) return stop(dir, Level::sub, {});
  if (std::string why = chain.trust.check(dir.status_info); !why.empty())
    return stop(dir, Level::sub, why);
  chain.sub = std::move(dir.fd);
  chain.level = Level::sub;
  chain.status = OpenStatus::ok;
  return chain;
}

fs::path DiskCache::where(const Chain& chain) const {
  switch (chain.level) {
    case Chain::Level::root: return root_;
    case Chain::Level::v1: return entries_dir_;
    case Chain::Level::sub: break;
  }
  return entries_dir_ / chain.sub_name;
}

void warn_refused(const fs::path& path, const std::string& why) {
  log_once(LogLevel::warn, "refused-cache-path:" + path.string(),
           "not using {}: {}; nothing there is loaded, written or removed", path.string(), why);
}

DiskCache::DiskCache(fs::path root, CacheMode mode, std::uint64_t max_bytes, CacheSharing sharing)
    : root_(normalize_for_open(root)),
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
  degrade(fmt::format("{}: {}", where(chain).string(), chain.why));
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
  if (why) *why = fmt::format("{}: {}", where(chain).string(), chain.why);
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
  if (chain.level != Chain::Level::sub)
    degrade(fmt::format("{}: {}", where(chain).string(), chain.why));
  else
    warn_refused(where(chain), chain.why);
}

fs::path DiskCache::entry_path(const CacheKey& key, const std::string& variant_name) const {
  const std::string hex = key.hex();
  return entries_dir_ / hex.substr(0, 2) / (hex + "." + variant_name + std::string(kEntrySuffix));
}

bool DiskCache::contains(const CacheKey& key, const std::string& variant_name) const {
  if (mode_ == CacheMode::off || !is_valid_variant_for_path(variant_name)) return false;
  if (requires_signatures()) return contains_signed(key, variant_name);
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
  // The entry's path names it in warnings only: built when one is written.
  const auto path = [&] { return where(chain) / name; };
  // O_NONBLOCK only matters if something odd (a FIFO) sits where an entry should be.
  const int raw_fd = openat_retry(chain.sub.get(), name.c_str(),
                                  O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
  if (raw_fd < 0) {
    const int error = errno;
    if (error == ELOOP)
      warn_refused(path(), "a symbolic link (never followed)");
    else if (error != ENOENT && error != ENOTDIR)
      log(LogLevel::debug, "cannot open cache entry {}: {}", path().string(), errno_text(error));
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
    warn_refused(path(), refused);  // foreign: neither loaded nor removed
    return std::nullopt;
  } else {
    std::vector<char> bytes;
    if (read_entry_fd(fd.get(), opened, &bytes, &why)) {
      if (is_other_entry_format(bytes.data(), bytes.size())) {
        // Another build of the library shares this cache: its entry is not damaged.
        log(LogLevel::debug, "cache entry {} has another entry format; recompiling", path().string());
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
      if (entry && requires_signatures()) {
        // Sound but not signed by a trusted key: not ours to load, nor damage to remove.
        if (std::string refused = signature_refusal(hex, *entry, &opened); !refused.empty()) {
          log_once(LogLevel::warn, "unsigned-cache-entry:" + path().string(),
                   "not using kernel cache entry {}: {}; recompiling", path().string(), refused);
          return std::nullopt;
        }
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
    log_once(LogLevel::warn, "damaged-cache-entry:" + path().string(),
             "removed damaged kernel cache entry {}: {}", path().string(), why);
  } else {
    log_once(LogLevel::warn, "damaged-cache-entry:" + path().string(),
             "ignoring damaged kernel cache entry {}: {}", path().string(), why);
  }
  return std::nullopt;
}

namespace {

// Writes `bytes` to a fresh temp file in `dir_fd` (fsynced, closed) and sets `temp` to its name.
// Returns 0 or an errno value; `failure` receives a readable description.
int write_temp_file(int dir_fd, const fs::path& dir, const std::vector<char>& bytes,
                    const CacheTrust& trust, std::string* temp, std::string* failure) {
  int fd = -1;
  for (int attempt = 0; attempt < 16; ++attempt) {
    *temp = fmt::format("{}{}-{:016x}", kTempPrefix, static_cast<long>(::getpid()), random_u64());
    fd = openat_retry(dir_fd, temp->c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
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
    ::unlinkat(dir_fd, temp->c_str(), 0);
    *failure = fmt::format("{} {}: {}", what, (dir / *temp).string(), errno_text(error));
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
  return 0;
}

// Renames the temp file `temp` to `name` in `dir_fd`; the temp file is removed on failure.
int rename_into_place(int dir_fd, const fs::path& dir, const std::string& temp,
                      const std::string& name, std::string* failure) {
  // renameat() replaces atomically: readers see the old entry or the new one, never a mix.
  // When two writers race, the last rename wins; both published the same key, so both
  // succeeded.
  if (::renameat(dir_fd, temp.c_str(), dir_fd, name.c_str()) != 0) {
    const int error = errno;
    ::unlinkat(dir_fd, temp.c_str(), 0);
    *failure = fmt::format("cannot rename {}: {}", (dir / temp).string(), errno_text(error));
    return error;
  }
  ::fsync(dir_fd);  // best effort: some file systems refuse to fsync directories
  return 0;
}

// Writes `bytes` to a fresh temp file in `dir_fd` and renames it to `name`.
int publish_file(int dir_fd, const fs::path& dir, const std::string& name,
                 const std::vector<char>& bytes, const CacheTrust& trust, std::string* failure) {
  std::string temp;
  if (int error = write_temp_file(dir_fd, dir, bytes, trust, &temp, failure); error != 0)
    return error;
  return rename_into_place(dir_fd, dir, temp, name, failure);
}

// Empty when the name `name` in `dir_fd` is free or holds a file we may replace; otherwise why
// not (never replace what we would refuse to read: it is not ours).
std::string replace_refused(int dir_fd, const std::string& name, const CacheTrust& trust) {
  struct stat existing {};
  if (::fstatat(dir_fd, name.c_str(), &existing, AT_SYMLINK_NOFOLLOW) != 0) return {};
  return S_ISREG(existing.st_mode)   ? trust.check(existing)
         : S_ISLNK(existing.st_mode) ? std::string("a symbolic link")
                                     : std::string("not a regular file");
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
  if (entry.nvrtc_version.size() > kMaxEntryNameLength ||
      entry.payload.size() + kEntryHeaderSize + entry.variant_name.size() +
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
  std::uint64_t replaced = 0;  // the bytes of an entry of the same name that this one replaces
  for (int attempt = 0;; ++attempt) {
    Chain chain = open_chain(hex.substr(0, 2).c_str(), true);
    int error = 0;
    if (chain.status == OpenStatus::refused) {
      report_refused(chain);
      return false;
    }
    if (chain.status != OpenStatus::ok) {
      error = chain.status == OpenStatus::missing ? ENOENT : EIO;
      failure = fmt::format("{}: {}", where(chain).string(), chain.why);
    } else {
      if (std::string refused = replace_refused(chain.sub.get(), name, chain.trust);
          !refused.empty()) {
        warn_refused(path, refused);
        return false;
      }
      struct stat existing {};
      replaced = ::fstatat(chain.sub.get(), name.c_str(), &existing, AT_SYMLINK_NOFOLLOW) == 0
                     ? static_cast<std::uint64_t>(existing.st_size)
                     : 0;
      error = publish_file(chain.sub.get(), where(chain), name, bytes, chain.trust, &failure);
    }
    if (error == 0) break;
    // ENOENT: the shard directory (or our temp file) was removed under us, typically by a
    // concurrent clear(). Recreate and retry a couple of times before giving up.
    if (error == ENOENT && attempt < 2) continue;
    degrade(failure);
    return false;
  }

  count_store(bytes.size(), replaced, path);
  return true;
}

bool DiskCache::verify_entry_file(const std::string& file_name, const std::vector<char>& bytes,
                                  CacheEntryData* entry, std::string* why) const {
  std::string key_hex;
  std::string variant;
  if (!parse_entry_file_name(file_name, &key_hex, &variant) || !is_valid_variant_for_path(variant)) {
    *why = "not an entry file name";
    return false;
  }
  auto decoded = decode_entry_of_variant(variant, bytes.data(), bytes.size(), why);
  if (!decoded || !check_variant_payload(decoded->kind, decoded->payload, why)) return false;
  if (requires_signatures()) {
    if (std::string refused = signature_refusal(key_hex, *decoded); !refused.empty()) {
      *why = refused;
      return false;
    }
  }
  if (entry) *entry = std::move(*decoded);
  return true;
}

bool DiskCache::stage_import(const std::string& file_name, const std::vector<char>& bytes,
                             StagedEntry* staged, std::string* why) {
  if (!verify_entry_file(file_name, bytes, nullptr, why)) return false;
  const std::string key_hex = file_name.substr(0, 32);
  if (!usable_for_write()) {
    *why = fmt::format("cannot write the cache at {}", root_.string());
    return false;
  }
  const std::string shard = key_hex.substr(0, 2);
  const Chain chain = open_chain(shard.c_str(), true);
  if (chain.status != OpenStatus::ok) {
    if (chain.status == OpenStatus::refused) report_refused(chain);
    *why = fmt::format("{}: {}", where(chain).string(), chain.why);
    return false;
  }
  std::string temp;
  if (write_temp_file(chain.sub.get(), where(chain), bytes, chain.trust, &temp, why) != 0)
    return false;
  *staged = StagedEntry{shard, std::move(temp), file_name};
  return true;
}

bool DiskCache::commit_import(const StagedEntry& staged, std::string* why) {
  const Chain chain = open_chain(staged.shard.c_str(), false);
  if (chain.status != OpenStatus::ok) {
    *why = fmt::format("{}: {}", where(chain).string(), chain.why);
    return false;
  }
  if (std::string refused = replace_refused(chain.sub.get(), staged.name, chain.trust);
      !refused.empty()) {
    ::unlinkat(chain.sub.get(), staged.temp.c_str(), 0);
    *why = fmt::format("{}: {}", (where(chain) / staged.name).string(), refused);
    return false;
  }
  struct stat temp {};
  struct stat existing {};
  const std::uint64_t added =
      ::fstatat(chain.sub.get(), staged.temp.c_str(), &temp, AT_SYMLINK_NOFOLLOW) == 0
          ? static_cast<std::uint64_t>(temp.st_size)
          : 0;
  const std::uint64_t replaced =
      ::fstatat(chain.sub.get(), staged.name.c_str(), &existing, AT_SYMLINK_NOFOLLOW) == 0
          ? static_cast<std::uint64_t>(existing.st_size)
          : 0;
  if (rename_into_place(chain.sub.get(), where(chain), staged.temp, staged.name, why) != 0)
    return false;
  count_store(added, replaced, where(chain) / staged.name);  // imports count like stores
  return true;
}

void DiskCache::discard_import(const StagedEntry& staged) const {
  const Chain chain = open_chain(staged.shard.c_str(), false);
  if (chain.status == OpenStatus::ok) ::unlinkat(chain.sub.get(), staged.temp.c_str(), 0);
}

void DiskCache::set_network_mode(NetworkFsMode mode) {
  std::lock_guard<std::mutex> lock(mutex_);
  network_mode_ = mode;
  network_fs_.reset();
  if (mode != NetworkFsMode::automatic || mode_ == CacheMode::off)
    network_fs_ = mode == NetworkFsMode::on;
}

bool DiskCache::on_network_fs() const {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (network_fs_) return *network_fs_;
  }
  // `automatic`, first asked: the root's file system (outside the lock: it is I/O). Two threads
  // asking at once both look and find the same.
  const Chain chain = open_chain(nullptr, false);
  const bool network =
      chain.status == OpenStatus::ok && ::astrai::detail::on_network_fs(chain.root.get());
  std::lock_guard<std::mutex> lock(mutex_);
  if (!network_fs_) network_fs_ = network;
  return *network_fs_;
}

std::unique_ptr<FileLock> DiskCache::lock_key(const CacheKey& key,
                                              std::chrono::milliseconds max_wait) {
  if (!usable_for_write()) return nullptr;
  if (on_network_fs()) {
    log_once(LogLevel::info, "network-fs-cache:" + root_.string(),
             "kernel cache {} is on a network file system: no compile locks (ASTRAI_JIT_CACHE_NFS); "
             "processes that miss one variant at the same moment each compile it",
             root_.string());
    return nullptr;
  }
  const Chain chain = open_chain("locks", true);
  const std::string name = key.hex() + std::string(kLockSuffix);
  if (chain.status != OpenStatus::ok) {
    if (chain.status == OpenStatus::refused) report_refused(chain);
    log(LogLevel::debug, "cannot use compile lock {}: {}", (where(chain) / name).string(), chain.why);
    return nullptr;
  }
  const fs::path path = where(chain) / name;
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
    else if (why.rfind("openable by", 0) == 0)
      log_once(LogLevel::warn, "exposed-lock:" + path.string(),
               "not waiting on compile lock {}: {}; compiling without it", path.string(), why);
    else
      log(LogLevel::debug, "cannot use compile lock {}: {}; compiling without it", path.string(),
          why);
  }
  return lock;
}


}  // namespace astrai::detail
