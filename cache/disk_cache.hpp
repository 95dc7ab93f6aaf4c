// On-disk cache of compiled kernels. Usable without a driver or GPU. The entry format is in
// cache/cache_entry.hpp.
//
// Layout under the cache root:
//   v1/<first two hex digits>/<32-hex key>.<variant name>.cubin   entry (header + payload)
//   v1/locks/<32-hex key>.lock                                   per-key compile lock
//   v1/size                                                      running size (cache_size.hpp)
// An entry is published atomically: written to a temp file in the same directory, fsynced,
// then renamed into place. Readers verify the header and the payload checksum; a damaged entry
// is removed (one warning) and treated as a miss.
//
// Trust (cache/cache_trust.hpp): every directory and file is opened relative to its parent's
// descriptor with O_NOFOLLOW and checked with fstat before use. A symbolic link anywhere below
// the root, or at the root itself, is never followed; a directory or entry that another user
// could have written is a miss with one warning, and is never loaded, written through or
// removed. Directories are created 0700 and files 0600 (shared caches: 02770 and 0660).
#pragma once

#include <sys/stat.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "cache/cache_entry.hpp"
#include "cache/cache_key.hpp"
#include "cache/cache_signature.hpp"
#include "cache/cache_trust.hpp"
#include "cache/file_lock.hpp"
#include "cache/network_fs.hpp"

namespace astrai::detail {

enum class CacheMode { read_write, read_only, off };

struct CacheEntryInfo {
  std::filesystem::path path;
  std::string key_hex;
  std::string variant_name;
  std::uint64_t size_bytes = 0;
  std::filesystem::file_time_type last_used;
  bool valid = false;  // header and checksum verified (only filled by verify())
  std::string problem;        // why it is not valid (verify)
  bool other_format = false;  // written with another entry format: not ours to judge (verify)
  bool foreign = false;       // refused by the trust rule (verify): never read or removed
  std::uint64_t device = 0;   // identity of the file seen by the scan: only that file is removed
  std::uint64_t inode = 0;
  std::string signature;           // verify, sound entries: "unsigned", "signed by <key id>", ...
  bool signature_refused = false;  // verify: trusted keys are set and the entry fails them
};

struct CacheStats {
  std::uint64_t entries = 0;
  std::uint64_t total_bytes = 0;
};

class DiskCache {
 public:
  // `max_bytes` 0 = unlimited. An unusable directory (cannot create, read-only, a file)
  // degrades to memory-only: every operation becomes a miss / no-op, with one warning.
  // `sharing` opts into a cache shared by a group (ASTRAI_JIT_CACHE_SHARED).
  DiskCache(std::filesystem::path root, CacheMode mode, std::uint64_t max_bytes,
            CacheSharing sharing = {});

  const std::filesystem::path& root() const { return root_; }
  CacheMode mode() const { return mode_; }
  bool usable_for_read() const;
  bool usable_for_write() const;
  // For maintenance commands: false, with the reason, when the root or v1 exists but cannot be
  // used (not a directory, a symbolic link, refused by the trust rule). `missing` is set when
  // the root or v1 does not exist.
  bool check_usable(std::string* why, bool* missing = nullptr) const;

  // Signatures (cache/cache_signature.hpp). With trusted keys set (ASTRAI_JIT_TRUSTED_KEYS),
  // load() and stage_import() take only entries validly signed by one of them: anything else is
  // a miss with one warning (counted as a signature refusal), neither loaded nor removed, and
  // verify() reports it. Without, entries load whether signed or not. Code: cache_signing.cpp.
  void set_trusted_keys(std::shared_ptr<const TrustedKeys> keys) { trusted_keys_ = std::move(keys); }
  bool requires_signatures() const { return trusted_keys_ && !trusted_keys_->empty(); }
  // Re-signs every sound entry with `key` (an atomic replace, as import does). Returns how many
  // were signed; entries that fail their checks are left as they are and named in `problems`.
  std::uint64_t sign_entries(const SigningKey& key, std::vector<std::string>* problems);

  // Hit: entry verified, access time refreshed (for LRU). Damaged entry: removed, warning,
  // nullopt. Entry whose variant name differs from `variant_name`: treated as damaged.
  std::optional<CacheEntryData> load(const CacheKey& key, const std::string& variant_name);

  // Atomic publish (temp + fsync + rename). Never throws for I/O problems: returns false and
  // degrades to memory-only with one warning (read-only dir, disk full, vanished dir).
  // With a cap set, the store is added to the running size (cache/cache_size.hpp); when that
  // goes over the cap, least-recently-used entries are removed until the cache is at most 90%
  // of it (so that a full cache is not scanned again on the next store).
  bool store(const CacheKey& key, const CacheEntryData& entry);

  // Import in two steps, so that an archive goes in whole or not at all (cache_archive.hpp).
  // stage_import checks an entry file taken from elsewhere, named "<32 hex>.<variant>.cubin",
  // like a load does (header, checksum, the variant against the name, the binary kind against
  // the target, the payload's symbol table and binary) and writes it to a temp file beside its
  // place; commit_import renames it into place (never over a file the trust rule refuses);
  // discard_import removes it. False with a reason.
  struct StagedEntry {
    std::string shard;  // "ab": the shard directory below v1
    std::string temp;   // the temp file's name there
    std::string name;   // the entry's file name
  };
  bool stage_import(const std::string& file_name, const std::vector<char>& bytes,
                    StagedEntry* staged, std::string* why);
  // The check of an entry file taken from elsewhere (an archive, a remote store), named
  // "<32 hex>.<variant>.cubin": what a load checks (header, checksum, the variant against the
  // name, the binary kind against the target) and the payload's symbol table and binary, under
  // this cache's rules. `entry` (optional) receives the decoded entry. False with a reason.
  // stage_import and the remote tier (runtime/jit_engine.cpp) both go through it: every entry
  // that did not come from this process's own compile is checked here before it is loaded or
  // stored. Needs no usable directory.
  bool verify_entry_file(const std::string& file_name, const std::vector<char>& bytes,
                         CacheEntryData* entry, std::string* why) const;
  bool commit_import(const StagedEntry& staged, std::string* why);
  void discard_import(const StagedEntry& staged) const;

  // Per-key cross-process lock; nullptr when locking is impossible or timed out (the caller
  // compiles anyway). Stale locks of dead processes never block (flock is released on exit).
  // On a network file system (set_network_mode) it takes no lock and returns nullptr.
  std::unique_ptr<FileLock> lock_key(const CacheKey& key, std::chrono::milliseconds max_wait);
  // ASTRAI_JIT_CACHE_NFS (cache/network_fs.hpp): `automatic` looks at the root's file system,
  // on the first on_network_fs(): only a miss (its compile lock) needs to know, so a cached load
  // never opens the root for it.
  void set_network_mode(NetworkFsMode mode);
  bool on_network_fs() const;

  // With trusted keys set, only an entry that is sound and validly signed counts (the file is
  // read and checked, with no side effect: nothing touched, removed, counted or logged).
  bool contains(const CacheKey& key, const std::string& variant_name) const;
  std::filesystem::path entry_path(const CacheKey& key, const std::string& variant_name) const;

  // Reads one listed entry's file and checks it fully (header, checksum, names, kind); the
  // file's bytes go to `bytes`. Used by verify and export.
  bool read_entry_file(const CacheEntryInfo& info, std::vector<char>* bytes,
                       std::string* why) const;

  std::vector<CacheEntryInfo> list() const;
  CacheStats stats() const;
  // Checks every entry; removes damaged ones when `repair`. Returns all entries with `valid`
  // and `problem`, including entries refused by the trust rule (`foreign`, never removed)
  // and entries of another format (`other_format`, valid, never removed).
  std::vector<CacheEntryInfo> verify(bool repair);
  // Removes least-recently-used entries until the total is <= max_bytes. Returns bytes freed.
  std::uint64_t prune(std::uint64_t max_bytes);
  // For tests: how many directory scans (list, verify, prune, clear, capped stores that had to
  // count) this process has started.
  static std::uint64_t scans_started();
  // Removes every entry, lock and temp file under the versioned root. Returns entries removed.
  std::uint64_t clear();

 private:
  struct Chain;
  // Opens root, v1 and (when `sub` is not null) v1/<sub>, creating them when `create`.
  Chain open_chain(const char* sub, bool create) const;
  // The path of the directory a chain stopped at (or of the deepest one it opened).
  std::filesystem::path where(const Chain& chain) const;
  bool remove_listed(const std::filesystem::path& path, std::uint64_t device,
                     std::uint64_t inode) const;
  // Scans; when the entries' total is over `evict_above`, removes least-recently-used ones
  // (never `keep`) until it is at most `down_to`. `remaining`: the total left. Returns bytes freed.
  std::uint64_t prune_to(std::uint64_t evict_above, std::uint64_t down_to,
                         const std::filesystem::path* keep, std::uint64_t* remaining = nullptr);
  // Adds a published entry (`added` bytes, replacing `replaced` bytes) to the running size, and
  // evicts when that goes over the cap (see store).
  void count_store(std::uint64_t added, std::uint64_t replaced, const std::filesystem::path& keep);
  struct Scan;
  Scan scan(bool with_foreign) const;
  // Marks the cache unusable for writes, with one warning (const: a scan may find out).
  void degrade(const std::string& why) const;
  // One warning for a path refused by the trust rule; a refused root or v1 degrades.
  void report_refused(const Chain& chain) const;
  // With trusted keys set: empty when `entry` (key `key_hex`) is validly signed by one of them,
  // else why not. The refusal is counted (cache metrics) unless `file` (device, inode) is the
  // file refused last: the engine looks twice (before and after the compile lock) in one lookup.
  std::string signature_refusal(const std::string& key_hex, const CacheEntryData& entry,
                                const struct stat* file = nullptr) const;
  // verify(): fills info->signature and info->signature_refused from the entry file's bytes.
  void assess_signature(CacheEntryInfo* info, const std::vector<char>& bytes) const;
  // contains() with trusted keys set.
  bool contains_signed(const CacheKey& key, const std::string& variant_name) const;
  std::filesystem::path root_;
  std::filesystem::path entries_dir_;  // root_/v1
  CacheMode mode_;
  CacheSharing sharing_;
  std::uint64_t max_bytes_;
  mutable std::mutex mutex_;
  mutable bool degraded_ = false;
  std::shared_ptr<const TrustedKeys> trusted_keys_;
  mutable std::uint64_t last_refused_device_ = 0;  // guarded by mutex_
  mutable std::uint64_t last_refused_inode_ = 0;
  // No compile locks (set_network_mode); with `automatic`, unknown until on_network_fs() looks.
  // Guarded by mutex_.
  NetworkFsMode network_mode_ = NetworkFsMode::off;
  mutable std::optional<bool> network_fs_ = false;
};

}  // namespace astrai::detail
