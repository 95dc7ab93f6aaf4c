// The running size of a cache's entries, kept in v1/size, so that a store with a size cap
// (ASTRAI_JIT_MAX_CACHE_SIZE) does not scan the whole cache: at 200k files a scan takes about a
// second.
//
// Every store adds its entry's bytes to the count while holding the file's flock, after the
// entry is renamed into place; an eviction scan writes the total it found while holding it too.
// So a count can only be too high (an entry removed by clear, verify or a damaged-entry load,
// an entry counted by a scan and by its own store): that costs an early scan, never data.
// A count that is too low would let the cache grow past its cap, so everything that could lose
// an addition drops the file instead (next capped store scans), and a capped store recounts
// with a scan every kRecountEvery updates in case writers that do not keep the count (older
// versions, files copied in by hand) added entries.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "cache/cache_trust.hpp"

namespace astrai::detail {

inline constexpr const char* kSizeFileName = "size";  // in v1/, beside the shard directories
inline constexpr std::uint64_t kRecountEvery = 1024;

class SizeLedger {
 public:
  struct Count {
    std::uint64_t total_bytes = 0;
    std::uint64_t updates = 0;  // stores counted since the last scan
  };
  enum class Opened { ok, missing, refused, busy, failed };

  // Opens v1/size in `v1_fd` (created with `create`, mode from `trust`), checks it with `trust`
  // and takes its flock, waiting at most `max_wait`. nullptr with `opened` (and for refused,
  // `why`) otherwise; a file that others could open (and so hold) is refused, not waited on.
  static std::unique_ptr<SizeLedger> open(int v1_fd, const CacheTrust& trust, bool create,
                                          std::chrono::milliseconds max_wait, Opened* opened,
                                          std::string* why);
  // False when the file holds no count (new, or damaged): the caller counts by scanning.
  bool read(Count* count) const;
  void write(const Count& count);
  ~SizeLedger();
  SizeLedger(const SizeLedger&) = delete;
  SizeLedger& operator=(const SizeLedger&) = delete;

 private:
  explicit SizeLedger(int fd) : fd_(fd) {}
  int fd_;
};

// Removes v1/size (when it is trusted), so that the next capped store counts by scanning. Used
// when an addition could not be counted. A process that holds the removed file's lock finds it
// gone once it has the lock (open() checks the name still leads to the file it locked).
void drop_size_ledger(int v1_fd, const CacheTrust& trust);

}  // namespace astrai::detail
