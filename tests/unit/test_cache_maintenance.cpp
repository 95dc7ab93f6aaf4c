// DiskCache maintenance: list, stats, verify, prune, clear.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cache/disk_cache.hpp"
#include "tests/support/cache_support.hpp"
#include "tests/support/support.hpp"

namespace fs = std::filesystem;

namespace {

// Child: stores args[2] entries of 1000 payload bytes (keys from args[1]) into the cache at
// args[0] with a cap of args[3] bytes. Exits with the number of directory scans it took (at
// most 200), or 250 when a store failed.
const bool kCappedStoresRegistered = astrai::testing::register_child_action(
    "cache-capped-stores", [](const std::vector<std::string>& args) -> int {
      if (args.size() != 4) return 251;
      astrai::detail::DiskCache cache(args[0], astrai::detail::CacheMode::read_write,
                                      std::stoull(args[3]));
      const int first = std::stoi(args[1]);
      const int count = std::stoi(args[2]);
      const std::uint64_t scans = astrai::detail::DiskCache::scans_started();
      for (int i = 0; i < count; ++i)
        if (!cache.store(astrai::testing::make_key(first + i),
                         astrai::testing::make_entry("capped.sm_90", 1000, first + i)))
          return 250;
      return static_cast<int>(
          std::min<std::uint64_t>(astrai::detail::DiskCache::scans_started() - scans, 200));
    });

}  // namespace
using astrai::detail::CacheEntryInfo;
using astrai::detail::CacheMode;
using astrai::detail::DiskCache;
using astrai::testing::read_file;
using astrai::testing::TempDir;
using astrai::testing::write_file;
using astrai::testing::all_files;
using astrai::testing::make_entry;
using astrai::testing::make_key;
using astrai::testing::QuietLog;
using astrai::testing::set_age;

TEST_SUITE("cache") {

TEST_CASE("list and stats report entries only, ignoring temp files and locks") {
  TempDir dir;
  DiskCache cache(dir.path(), CacheMode::read_write, 0);
  REQUIRE(cache.store(make_key(1), make_entry("one.sm_90", 100)));
  REQUIRE(cache.store(make_key(2), make_entry("two.with.dots.sm_90", 200)));
  auto lock = cache.lock_key(make_key(1), std::chrono::milliseconds(100));
  REQUIRE(lock != nullptr);
  const fs::path shard = cache.entry_path(make_key(1), "one.sm_90").parent_path();
  write_file(shard / ".tmp-123-abcdef", "partial");
  write_file(shard / "README", "unrelated");
  write_file(dir.path() / "v1" / "zz", "unrelated");

  auto entries = cache.list();
  REQUIRE(entries.size() == 2);
  std::sort(entries.begin(), entries.end(),
            [](const CacheEntryInfo& a, const CacheEntryInfo& b) {
              return a.size_bytes < b.size_bytes;
            });
  CHECK(entries[0].key_hex == make_key(1).hex());
  CHECK(entries[0].variant_name == "one.sm_90");
  CHECK(entries[0].path == cache.entry_path(make_key(1), "one.sm_90"));
  CHECK(entries[0].size_bytes == encode_entry(make_entry("one.sm_90", 100)).size());
  CHECK(entries[1].variant_name == "two.with.dots.sm_90");
  CHECK_FALSE(entries[0].valid);  // only verify() fills it

  const auto stats = cache.stats();
  CHECK(stats.entries == 2);
  CHECK(stats.total_bytes == entries[0].size_bytes + entries[1].size_bytes);
}

TEST_CASE("verify finds damaged entries and removes them only when repairing") {
  QuietLog quiet;
  TempDir dir;
  DiskCache cache(dir.path(), CacheMode::read_write, 0);
  for (int i = 0; i < 3; ++i) REQUIRE(cache.store(make_key(i), make_entry("ok.sm_90", 64, i)));
  const fs::path bad = cache.entry_path(make_key(1), "ok.sm_90");
  std::string bytes = read_file(bad);
  bytes[60] ^= 0x04;
  write_file(bad, bytes);
  // A valid entry renamed to the wrong variant is damaged too.
  const fs::path misnamed = cache.entry_path(make_key(2), "renamed.sm_90");
  fs::rename(cache.entry_path(make_key(2), "ok.sm_90"), misnamed);

  auto count_invalid = [](const std::vector<CacheEntryInfo>& entries) {
    return std::count_if(entries.begin(), entries.end(), [](const auto& e) { return !e.valid; });
  };
  auto checked = cache.verify(false);
  CHECK(checked.size() == 3);
  CHECK(count_invalid(checked) == 2);
  CHECK(fs::exists(bad));
  CHECK(fs::exists(misnamed));

  checked = cache.verify(true);
  CHECK(checked.size() == 3);
  CHECK(count_invalid(checked) == 2);
  CHECK_FALSE(fs::exists(bad));
  CHECK_FALSE(fs::exists(misnamed));

  checked = cache.verify(true);
  REQUIRE(checked.size() == 1);
  CHECK(checked[0].valid);
  CHECK(checked[0].key_hex == make_key(0).hex());
}

TEST_CASE("prune removes the least recently used entries first") {
  TempDir dir;
  DiskCache cache(dir.path(), CacheMode::read_write, 0);
  std::vector<std::uint64_t> sizes;
  for (int i = 0; i < 4; ++i) {
    REQUIRE(cache.store(make_key(i), make_entry("lru.sm_90", 1000)));
    // Stored long ago, oldest first: 0 is the least recently stored.
    set_age(cache.entry_path(make_key(i), "lru.sm_90"), std::chrono::seconds(3600 * (10 - i)));
  }
  const std::uint64_t entry_size = cache.list().at(0).size_bytes;
  // Using entries 0 and 2 makes them the most recently used.
  REQUIRE(cache.load(make_key(0), "lru.sm_90").has_value());
  REQUIRE(cache.load(make_key(2), "lru.sm_90").has_value());

  CHECK(cache.prune(4 * entry_size) == 0);
  CHECK(cache.stats().entries == 4);
  CHECK(cache.prune(2 * entry_size + 10) == 2 * entry_size);
  CHECK(cache.contains(make_key(0), "lru.sm_90"));
  CHECK_FALSE(cache.contains(make_key(1), "lru.sm_90"));
  CHECK(cache.contains(make_key(2), "lru.sm_90"));
  CHECK_FALSE(cache.contains(make_key(3), "lru.sm_90"));

  REQUIRE(cache.load(make_key(0), "lru.sm_90").has_value());  // now 2 is the older one
  CHECK(cache.prune(entry_size) == entry_size);
  CHECK(cache.contains(make_key(0), "lru.sm_90"));
  CHECK_FALSE(cache.contains(make_key(2), "lru.sm_90"));
  CHECK(cache.prune(0) == entry_size);
  CHECK(cache.list().empty());
}

TEST_CASE("prune removes temp files left behind for over an hour") {
  TempDir dir;
  DiskCache cache(dir.path(), CacheMode::read_write, 0);
  REQUIRE(cache.store(make_key(1), make_entry("keep.sm_90", 10)));
  const fs::path shard = cache.entry_path(make_key(1), "keep.sm_90").parent_path();
  const fs::path stale = shard / ".tmp-4242-0123456789abcdef";
  const fs::path fresh = shard / ".tmp-4243-fedcba9876543210";
  write_file(stale, "left by a killed process");
  write_file(fresh, "being written right now");
  set_age(stale, std::chrono::seconds(2 * 3600));

  CHECK(cache.prune(1 << 20) == 0);
  CHECK_FALSE(fs::exists(stale));
  CHECK(fs::exists(fresh));
  CHECK(cache.contains(make_key(1), "keep.sm_90"));
}

TEST_CASE("a size cap is enforced after every store and keeps the entry just written") {
  TempDir dir;
  const std::uint64_t entry_size = encode_entry(make_entry("cap.sm_90", 1000)).size();
  DiskCache cache(dir.path(), CacheMode::read_write, 3 * entry_size);
  for (int i = 0; i < 8; ++i) {
    CAPTURE(i);
    REQUIRE(cache.store(make_key(i), make_entry("cap.sm_90", 1000, i)));
    // Make the order unambiguous even with a coarse file system clock.
    set_age(cache.entry_path(make_key(i), "cap.sm_90"), std::chrono::seconds(1000 - i));
    CHECK(cache.stats().total_bytes <= 3 * entry_size);
    CHECK(cache.contains(make_key(i), "cap.sm_90"));
  }
  // Eviction goes down to 90% of the cap: the last store left the two newest entries.
  CHECK(cache.stats().entries == 2);
  for (int i = 6; i < 8; ++i) CHECK(cache.contains(make_key(i), "cap.sm_90"));

  // An entry bigger than the whole cap still stays (everything older goes).
  REQUIRE(cache.store(make_key(100), make_entry("cap.sm_90", 10 * 1000)));
  CHECK(cache.stats().entries == 1);
  CHECK(cache.contains(make_key(100), "cap.sm_90"));
}

TEST_CASE("a store with a cap set keeps a running size instead of scanning the cache each time") {
  TempDir dir;
  const std::uint64_t entry_size = encode_entry(make_entry("run.sm_90", 1000)).size();
  DiskCache cache(dir.path(), CacheMode::read_write, 1000 * entry_size);
  const std::uint64_t before = DiskCache::scans_started();
  for (int i = 0; i < 300; ++i) REQUIRE(cache.store(make_key(i), make_entry("run.sm_90", 1000, i)));
  CHECK(DiskCache::scans_started() - before == 1);  // the first store counts the cache once
  // Replacing an entry counts only the difference; the count matches a scan.
  REQUIRE(cache.store(make_key(0), make_entry("run.sm_90", 1000, 0)));
  CHECK(read_file(dir.path() / "v1" / "size") ==
        fmt::format("astrai-jit size v1 {:020} {:020}\n", 300 * entry_size, 300));
  CHECK(cache.stats().total_bytes == 300 * entry_size);

  // A full cache is scanned about once a tenth of its cap written, and stays under the cap.
  DiskCache small(dir.path() / "small", CacheMode::read_write, 100 * entry_size);
  const std::uint64_t full = DiskCache::scans_started();
  for (int i = 1000; i < 1200; ++i) {
    REQUIRE(small.store(make_key(i), make_entry("run.sm_90", 1000, i)));
    set_age(small.entry_path(make_key(i), "run.sm_90"), std::chrono::seconds(2000 - i + 1000));
  }
  CHECK(DiskCache::scans_started() - full <= 22);
  CHECK(small.stats().total_bytes <= 100 * entry_size);
  CHECK(small.contains(make_key(1199), "run.sm_90"));
  CHECK_FALSE(small.contains(make_key(1000), "run.sm_90"));
}

TEST_CASE("entries removed or added behind the running size's back cost a scan, never the cap") {
  QuietLog quiet;
  TempDir dir;
  const std::uint64_t entry_size = encode_entry(make_entry("run.sm_90", 1000)).size();
  {
    DiskCache cache(dir.path(), CacheMode::read_write, 10 * entry_size);
    for (int i = 0; i < 8; ++i) REQUIRE(cache.store(make_key(i), make_entry("run.sm_90", 1000, i)));
    CHECK(cache.clear() == 8);  // the count stays at 8 entries: too high is safe
    for (int i = 0; i < 4; ++i) REQUIRE(cache.store(make_key(i), make_entry("run.sm_90", 1000, i)));
    CHECK(cache.stats().entries == 4);  // the early scan found the real total and evicted nothing
  }
  // A store without a cap (another process, the CLI) still adds to the count.
  DiskCache uncapped(dir.path(), CacheMode::read_write, 0);
  for (int i = 100; i < 110; ++i)
    REQUIRE(uncapped.store(make_key(i), make_entry("run.sm_90", 1000, i)));
  DiskCache cache(dir.path(), CacheMode::read_write, 10 * entry_size);
  REQUIRE(cache.store(make_key(200), make_entry("run.sm_90", 1000, 200)));
  CHECK(cache.stats().total_bytes <= 10 * entry_size);
  // A count that cannot be read is recounted by the next capped store.
  const auto private_file = [](const fs::path& path, const std::string& bytes) {
    fs::create_directories(path.parent_path());
    write_file(path, bytes);
    fs::permissions(path, fs::perms::owner_read | fs::perms::owner_write);
  };
  private_file(dir.path() / "v1" / "size", "astrai-jit size v1 0");
  const std::string copy = read_file(cache.entry_path(make_key(200), "run.sm_90"));
  for (int i = 300; i < 310; ++i) private_file(cache.entry_path(make_key(i), "run.sm_90"), copy);
  REQUIRE(cache.store(make_key(201), make_entry("run.sm_90", 1000, 201)));
  CHECK(cache.stats().total_bytes <= 10 * entry_size);
}

TEST_CASE("a running size file that the trust rule refuses is left alone and the cap still holds") {
  TempDir dir;
  const std::uint64_t entry_size = encode_entry(make_entry("run.sm_90", 1000)).size();
  const fs::path size_file = dir.path() / "v1" / "size";
  DiskCache cache(dir.path(), CacheMode::read_write, 5 * entry_size);
  REQUIRE(cache.store(make_key(0), make_entry("run.sm_90", 1000, 0)));
  // Readable by others: they could hold its lock and stall every store.
  fs::permissions(size_file, fs::perms::others_read, fs::perm_options::add);
  const std::string before = read_file(size_file);
  astrai::testing::LogCapture log(dir.path() / "log.txt");
  for (int i = 1; i < 12; ++i) REQUIRE(cache.store(make_key(i), make_entry("run.sm_90", 1000, i)));
  const std::string output = log.finish();
  CHECK(astrai::testing::count_occurrences(
            output, "not using " + size_file.string() + ": openable by other users (mode 0604)") ==
        1);
  CHECK(read_file(size_file) == before);
  CHECK(cache.stats().total_bytes <= 5 * entry_size);
}

TEST_CASE("two processes storing with a cap keep the cache under it without scanning each store") {
  TempDir dir;
  const std::uint64_t entry_size = encode_entry(make_entry("capped.sm_90", 1000)).size();
  const std::string cap = std::to_string(100 * entry_size);
  const int a = astrai::testing::spawn_child("cache-capped-stores",
                                             {dir.path().string(), "0", "150", cap});
  const int b = astrai::testing::spawn_child("cache-capped-stores",
                                             {dir.path().string(), "100000", "150", cap});
  const int scans_a = astrai::testing::wait_child(a);
  const int scans_b = astrai::testing::wait_child(b);
  CHECK(scans_a < 40);  // one scan a store would be 150
  CHECK(scans_b < 40);
  DiskCache cache(dir.path(), CacheMode::read_only, 0);
  const auto stats = cache.stats();
  CHECK(stats.total_bytes <= 100 * entry_size + entry_size);
  CHECK(stats.entries >= 80);
}

TEST_CASE("clear removes entries, locks and temp files") {
  TempDir dir;
  DiskCache cache(dir.path(), CacheMode::read_write, 0);
  for (int i = 0; i < 5; ++i) REQUIRE(cache.store(make_key(i), make_entry("c.sm_90", 10)));
  { auto lock = cache.lock_key(make_key(1), std::chrono::milliseconds(100)); }
  const fs::path shard = cache.entry_path(make_key(1), "c.sm_90").parent_path();
  write_file(shard / ".tmp-1-2", "partial");
  const fs::path unrelated = dir.path() / "keep-me.txt";
  write_file(unrelated, "user data beside the cache");

  CHECK(all_files(dir.path() / "v1" / "locks").size() == 1);
  CHECK(cache.clear() == 5);
  CHECK(all_files(dir.path()) == std::vector<fs::path>{unrelated});
  CHECK(cache.clear() == 0);
  CHECK(cache.usable_for_write());
  REQUIRE(cache.store(make_key(1), make_entry("c.sm_90", 10)));
  CHECK(cache.load(make_key(1), "c.sm_90").has_value());
}

}  // TEST_SUITE
