// DiskCache maintenance: the directory scan and what is built on it (list, stats, verify,
// prune, clear), and the full check of one listed entry (verify, export).
#include "cache/disk_cache.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <string_view>
#include <utility>

#include "base/logging.hpp"
#include "cache/cache_size.hpp"
#include "cache/disk_cache_internal.hpp"

namespace astrai::detail {

namespace fs = std::filesystem;

namespace {
std::atomic<std::uint64_t> scan_count{0};
}  // namespace

std::uint64_t DiskCache::scans_started() { return scan_count.load(); }

DiskCache::Scan DiskCache::scan(bool with_foreign) const {
  ++scan_count;
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
  return decode_entry_of_variant(info.variant_name, bytes->data(), bytes->size(), why)
      .has_value();
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
    } else if (info.valid) {
      assess_signature(&info, bytes);
    } else {
      info.problem = why;
      if (repair && mode_ == CacheMode::read_write &&
          remove_listed(info.path, info.device, info.inode))
        log(LogLevel::info, "removed damaged kernel cache entry {}: {}", info.path.string(), why);
    }
    checked.push_back(std::move(info));
  }
  return checked;
}

std::uint64_t DiskCache::prune_to(std::uint64_t evict_above, std::uint64_t down_to,
                                  const fs::path* keep, std::uint64_t* remaining) {
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
  const std::uint64_t goal = total > evict_above ? std::min(down_to, evict_above) : total;
  for (const auto& info : found.entries) {
    if (total <= goal) break;
    if (keep && info.path == *keep) continue;
    const bool removed = remove_listed(info.path, info.device, info.inode);
    if (removed) freed += info.size_bytes;
    // An entry that vanished (or was replaced) meanwhile no longer counts as this size.
    total -= info.size_bytes;
  }
  if (remaining) *remaining = total;
  return freed;
}

std::uint64_t DiskCache::prune(std::uint64_t max_bytes) {
  if (mode_ != CacheMode::read_write) return 0;
  // Holding the running size while scanning: the total found replaces it (a count that was too
  // high, after entries were removed, is corrected here).
  const Chain chain = open_chain(nullptr, false);
  std::unique_ptr<SizeLedger> ledger;
  if (chain.status == OpenStatus::ok) {
    SizeLedger::Opened opened = SizeLedger::Opened::failed;
    std::string why;
    ledger = SizeLedger::open(chain.v1.get(), chain.trust, false, kSizeLedgerWait, &opened, &why);
  }
  std::uint64_t remaining = 0;
  const std::uint64_t freed = prune_to(max_bytes, max_bytes, nullptr, &remaining);
  if (ledger) ledger->write({remaining, 0});
  return freed;
}

void DiskCache::count_store(std::uint64_t added, std::uint64_t replaced, const fs::path& keep) {
  const bool capped = max_bytes_ > 0;
  // Eviction goes down to 90% of the cap: a full cache then takes a scan every tenth of its cap
  // written, not one a store.
  const std::uint64_t low_water = max_bytes_ - max_bytes_ / 10;
  const Chain chain = open_chain(nullptr, false);
  if (chain.status != OpenStatus::ok) {
    if (capped) prune_to(max_bytes_, low_water, &keep);
    return;
  }
  SizeLedger::Opened opened = SizeLedger::Opened::failed;
  std::string why;
  std::unique_ptr<SizeLedger> ledger =
      SizeLedger::open(chain.v1.get(), chain.trust, capped, kSizeLedgerWait, &opened, &why);
  if (!ledger) {
    if (opened == SizeLedger::Opened::refused)
      warn_refused(entries_dir_ / kSizeFileName, why);
    else if (opened != SizeLedger::Opened::missing)
      drop_size_ledger(chain.v1.get(), chain.trust);  // it lacks our bytes: never too low
    if (capped) prune_to(max_bytes_, low_water, &keep);  // the scan every capped store used to take
    return;
  }
  SizeLedger::Count count;
  const bool counted = ledger->read(&count);
  if (counted) {
    count.total_bytes =
        count.total_bytes + added > replaced ? count.total_bytes + added - replaced : 0;
    ++count.updates;
  }
  // Without a cap the count is only kept up to date; one missing waits for a capped store.
  if (!capped || (counted && count.updates <= kRecountEvery && count.total_bytes <= max_bytes_)) {
    if (counted) ledger->write(count);
    return;
  }
  // Over the cap, not counted yet, or a recount is due: scan while holding the ledger, so that
  // no other store's addition falls between the scan and the write.
  std::uint64_t remaining = 0;
  prune_to(max_bytes_, low_water, &keep, &remaining);
  ledger->write({remaining, 0});
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
      // Lock files, and the replacements of exposed ones left by a process killed in between.
      if (!(ends_with(name, kLockSuffix) || starts_with(name, ".tmp-lock-")) ||
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
