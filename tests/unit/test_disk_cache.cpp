// DiskCache: atomic publish, the cache modes, degraded operation, damaged entries.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "cache/disk_cache.hpp"
#include "tests/support/cache_support.hpp"
#include "tests/support/support.hpp"

namespace fs = std::filesystem;
using astrai::detail::BinaryKind;
using astrai::detail::CacheEntryData;
using astrai::detail::CacheKey;
using astrai::detail::CacheMode;
using astrai::detail::DiskCache;
using astrai::detail::LogLevel;
using astrai::testing::read_file;
using astrai::testing::StderrCapture;
using astrai::testing::TempDir;
using astrai::testing::write_file;
using astrai::testing::all_files;
using astrai::testing::count_occurrences;
using astrai::testing::count_temp_files;
using astrai::testing::make_entry;
using astrai::testing::make_key;
using astrai::testing::QuietLog;
using astrai::testing::same_entry;
using astrai::testing::set_age;

namespace {

// True when chmod can really make `dir` unwritable (it cannot for root).
bool write_protection_works(const fs::path& dir) { return ::access(dir.c_str(), W_OK) != 0; }

constexpr uid_t kOtherUser = 65534;  // nobody

// Child: as another user when started as root (root ignores permission bits), a store into a
// cache whose directories are all 0555 fails, leaves no temporary file, and loads still work.
const bool kReadOnlyChildRegistered = astrai::testing::register_child_action(
    "cache-store-read-only", [](const std::vector<std::string>& args) -> int {
      if (args.size() != 2) return 10;
      if (::geteuid() == 0 && (::setgroups(0, nullptr) != 0 || ::setresgid(kOtherUser, kOtherUser, kOtherUser) != 0 ||
                               ::setresuid(kOtherUser, kOtherUser, kOtherUser) != 0))
        return 11;
      if (!write_protection_works(fs::path(args[0]) / "v1")) return 12;
      astrai::detail::Logger::instance().set_level(LogLevel::off);
      DiskCache cache(args[0], CacheMode::read_write, 0);
      if (cache.store(make_key(2), make_entry("other.sm_90", 10))) return 13;
      if (cache.usable_for_write()) return 14;
      if (count_temp_files(args[0]) != 0) return 15;
      const auto loaded = cache.load(make_key(1), args[1]);
      return loaded.has_value() ? 0 : 16;
    });

// Child: store with a tiny RLIMIT_FSIZE, which fails writes with EFBIG like a full disk does.
const bool kFsizeChildRegistered = astrai::testing::register_child_action(
    "cache-store-fsize-limit", [](const std::vector<std::string>& args) -> int {
      if (args.size() != 1) return 10;
      astrai::detail::Logger::instance().set_level(LogLevel::off);
      ::signal(SIGXFSZ, SIG_IGN);
      DiskCache cache(args[0], CacheMode::read_write, 0);
      if (!cache.usable_for_write()) return 11;
      struct rlimit limit = {64, 64};
      if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) return 12;
      if (cache.store(make_key(1), make_entry("big", 4096))) return 13;
      if (cache.usable_for_write()) return 14;
      if (count_temp_files(args[0]) != 0) return 15;
      if (cache.store(make_key(2), make_entry("small", 1))) return 16;  // degraded: no retry
      return 0;
    });

}  // namespace

TEST_SUITE("cache") {

TEST_CASE("a stored entry is published atomically at the documented path") {
  TempDir dir;
  DiskCache cache(dir.path(), CacheMode::read_write, 0);
  CHECK(cache.usable_for_read());
  CHECK(cache.usable_for_write());

  const CacheKey key = make_key(7);
  const CacheEntryData entry = make_entry("paged_decode.f16.hd64.ps16.g1.sm_90a", 3000);
  CHECK_FALSE(cache.contains(key, entry.variant_name));
  CHECK_FALSE(cache.load(key, entry.variant_name).has_value());
  REQUIRE(cache.store(key, entry));

  const std::string hex = key.hex();
  const fs::path expected =
      dir.path() / "v1" / hex.substr(0, 2) / (hex + "." + entry.variant_name + ".cubin");
  CHECK(cache.entry_path(key, entry.variant_name) == expected);
  CHECK(all_files(dir.path()) == std::vector<fs::path>{expected});
  CHECK(cache.contains(key, entry.variant_name));
  CHECK_FALSE(cache.contains(key, "other.variant"));

  const std::string on_disk = read_file(expected);
  const std::vector<char> encoded = encode_entry(entry);
  CHECK(on_disk == std::string(encoded.begin(), encoded.end()));

  auto loaded = cache.load(key, entry.variant_name);
  REQUIRE(loaded.has_value());
  CHECK(same_entry(*loaded, entry));

  // Storing again replaces the entry in place; still no stray files.
  const CacheEntryData second = make_entry(entry.variant_name, 100, 9);
  REQUIRE(cache.store(key, second));
  CHECK(all_files(dir.path()) == std::vector<fs::path>{expected});
  CHECK(same_entry(*cache.load(key, entry.variant_name), second));
}

TEST_CASE("off mode touches nothing") {
  TempDir dir;
  const fs::path root = dir.path() / "cache";
  DiskCache cache(root, CacheMode::off, 0);
  CHECK_FALSE(cache.usable_for_read());
  CHECK_FALSE(cache.usable_for_write());
  CHECK_FALSE(cache.store(make_key(1), make_entry("a", 10)));
  CHECK_FALSE(cache.load(make_key(1), "a").has_value());
  CHECK(cache.lock_key(make_key(1), std::chrono::milliseconds(10)) == nullptr);
  CHECK(cache.list().empty());
  CHECK(cache.prune(0) == 0);
  CHECK(cache.clear() == 0);
  CHECK_FALSE(fs::exists(root));
}

TEST_CASE("read-only mode never writes but serves existing entries") {
  TempDir dir;
  const fs::path missing_root = dir.path() / "missing";
  {
    DiskCache cache(missing_root, CacheMode::read_only, 0);
    CHECK_FALSE(cache.usable_for_write());
    CHECK_FALSE(cache.usable_for_read());
    CHECK_FALSE(cache.store(make_key(1), make_entry("a", 10)));
    CHECK_FALSE(cache.load(make_key(1), "a").has_value());
    CHECK(cache.lock_key(make_key(1), std::chrono::milliseconds(10)) == nullptr);
    CHECK_FALSE(fs::exists(missing_root));
  }

  const fs::path root = dir.path() / "shared";
  const CacheEntryData entry = make_entry("shared.sm_80", 500);
  {
    DiskCache writer(root, CacheMode::read_write, 0);
    REQUIRE(writer.store(make_key(3), entry));
    REQUIRE(writer.store(make_key(4), make_entry("doomed.sm_80", 50)));
  }
  const fs::path doomed =
      DiskCache(root, CacheMode::read_only, 0).entry_path(make_key(4), "doomed.sm_80");
  write_file(doomed, "garbage");
  set_age(doomed, std::chrono::seconds(3600 * 3));
  const auto doomed_time = fs::last_write_time(doomed);
  const auto before = all_files(root);

  QuietLog quiet;
  DiskCache cache(root, CacheMode::read_only, 0);
  CHECK(cache.usable_for_read());
  CHECK_FALSE(cache.usable_for_write());
  const fs::path path = cache.entry_path(make_key(3), entry.variant_name);
  set_age(path, std::chrono::seconds(3600));
  const auto old_time = fs::last_write_time(path);
  auto loaded = cache.load(make_key(3), entry.variant_name);
  REQUIRE(loaded.has_value());
  CHECK(same_entry(*loaded, entry));
  CHECK(fs::last_write_time(path) == old_time);  // not even the timestamp is written

  CHECK_FALSE(cache.load(make_key(4), "doomed.sm_80").has_value());  // damaged, but kept
  CHECK(fs::exists(doomed));
  CHECK(fs::last_write_time(doomed) == doomed_time);
  CHECK_FALSE(cache.store(make_key(5), entry));
  CHECK(cache.prune(0) == 0);
  CHECK(cache.clear() == 0);
  const auto checked = cache.verify(true);
  CHECK(checked.size() == 2);
  CHECK(all_files(root) == before);
}

TEST_CASE("verify flags an entry whose binary kind is not the one its target gets") {
  QuietLog quiet;
  TempDir dir;
  DiskCache cache(dir.path() / "cache", CacheMode::read_write, 0);
  CacheEntryData cubin_target = make_entry("x.bf16.sm_90a", 64);
  cubin_target.kind = BinaryKind::ptx;  // well formed, checksum and all, but the wrong kind
  CacheEntryData ptx_target = make_entry("x.bf16.compute_90", 64);
  ptx_target.kind = BinaryKind::cubin;
  CacheEntryData good_cubin = make_entry("y.bf16.sm_90a", 64);
  CacheEntryData good_ptx = make_entry("y.bf16.compute_90", 64);
  good_ptx.kind = BinaryKind::ptx;
  REQUIRE(cache.store(make_key(1), cubin_target));
  REQUIRE(cache.store(make_key(2), ptx_target));
  REQUIRE(cache.store(make_key(3), good_cubin));
  REQUIRE(cache.store(make_key(4), good_ptx));
  const auto checked = cache.verify(false);
  REQUIRE(checked.size() == 4);
  for (const auto& info : checked) {
    CAPTURE(info.variant_name);
    CHECK(info.valid == (info.variant_name.rfind("y.", 0) == 0));
  }
}

TEST_CASE("a write-protected directory makes store fail while loads keep working") {
  QuietLog quiet;
  TempDir dir;
  const fs::path root = dir.path() / "cache";
  const CacheEntryData entry = make_entry("ro.sm_90", 256);
  {
    DiskCache writer(root, CacheMode::read_write, 0);
    REQUIRE(writer.store(make_key(1), entry));
  }

  SUBCASE("chmod 0555 on every directory") {
    const std::vector<fs::path> dirs = {root, root / "v1",
                                        root / "v1" / make_key(1).hex().substr(0, 2),
                                        root / "v1" / make_key(2).hex().substr(0, 2)};
    for (const auto& sub : dirs) fs::create_directories(sub);
    // Root ignores permission bits: as root the cache is handed to another user, who then runs
    // the checks in a child, so they run (and can fail) whoever runs the suite.
    if (::geteuid() == 0) {
      fs::permissions(dir.path(), fs::perms(0755));
      for (const auto& path : fs::recursive_directory_iterator(root))
        REQUIRE(::lchown(path.path().c_str(), kOtherUser, kOtherUser) == 0);
      REQUIRE(::lchown(root.c_str(), kOtherUser, kOtherUser) == 0);
    }
    for (const auto& sub : dirs) fs::permissions(sub, fs::perms(0555));
    const int pid = astrai::testing::spawn_child("cache-store-read-only", {root.string(), entry.variant_name});
    CHECK(astrai::testing::wait_child(pid) == 0);
    CHECK(count_temp_files(root) == 0);
    for (const auto& sub : dirs) fs::permissions(sub, fs::perms(0755));
  }

  SUBCASE("a regular file where the shard directory should be (fails even for root)") {
    DiskCache cache(root, CacheMode::read_write, 0);
    REQUIRE(cache.usable_for_write());
    CacheKey blocked_key = make_key(2);
    const fs::path shard = root / "v1" / blocked_key.hex().substr(0, 2);
    REQUIRE_FALSE(fs::exists(shard));
    write_file(shard, "not a directory");
    CHECK_FALSE(cache.store(blocked_key, make_entry("other.sm_90", 10)));
    CHECK_FALSE(cache.usable_for_write());
    CHECK(cache.usable_for_read());
    // Degraded: even stores that would work are refused now.
    CHECK_FALSE(cache.store(make_key(3), make_entry("third.sm_90", 10)));
    CHECK(count_temp_files(root) == 0);
    auto loaded = cache.load(make_key(1), entry.variant_name);
    REQUIRE(loaded.has_value());
    CHECK(same_entry(*loaded, entry));
  }
}

TEST_CASE("an unusable cache root degrades to memory-only without throwing") {
  QuietLog quiet;
  TempDir dir;
  const fs::path file = dir.path() / "plain_file";
  write_file(file, "x");

  const std::vector<fs::path> roots = {file, file / "sub",
                                       fs::path("/proc/astrai-jit-no-such-dir/cache")};
  for (const auto& root : roots) {
    CAPTURE(root);
    std::unique_ptr<DiskCache> cache;
    REQUIRE_NOTHROW(cache = std::make_unique<DiskCache>(root, CacheMode::read_write, 1024));
    CHECK_FALSE(cache->usable_for_write());
    CHECK_FALSE(cache->usable_for_read());
    CHECK_NOTHROW(CHECK_FALSE(cache->store(make_key(1), make_entry("a", 10))));
    CHECK_NOTHROW(CHECK_FALSE(cache->load(make_key(1), "a").has_value()));
    CHECK_FALSE(cache->contains(make_key(1), "a"));
    CHECK(cache->lock_key(make_key(1), std::chrono::milliseconds(5)) == nullptr);
    CHECK_NOTHROW(CHECK(cache->list().empty()));
    CHECK_NOTHROW(CHECK(cache->stats().entries == 0));
    CHECK_NOTHROW(CHECK(cache->verify(true).empty()));
    CHECK_NOTHROW(CHECK(cache->prune(0) == 0));
    CHECK_NOTHROW(CHECK(cache->clear() == 0));
  }
  CHECK(read_file(file) == "x");

  DiskCache empty_root(fs::path(), CacheMode::read_write, 0);
  CHECK_FALSE(empty_root.usable_for_write());
  CHECK_FALSE(fs::exists("v1"));
}

TEST_CASE("a full disk during store removes the temp file and degrades") {
  TempDir dir;
  const int pid = astrai::testing::spawn_child("cache-store-fsize-limit",
                                               {(dir.path() / "cache").string()});
  CHECK(astrai::testing::wait_child(pid) == 0);
  CHECK(count_temp_files(dir.path()) == 0);
}

TEST_CASE("one warning names the path of a damaged entry, once") {
  TempDir dir;
  const fs::path root = dir.path() / "cache";
  {
    DiskCache writer(root, CacheMode::read_write, 0);
    REQUIRE(writer.store(make_key(1), make_entry("warned.sm_90", 40)));
  }
  DiskCache cache(root, CacheMode::read_only, 0);  // read-only: the damaged file stays
  const fs::path path = cache.entry_path(make_key(1), "warned.sm_90");
  std::string bytes = read_file(path);
  bytes[bytes.size() - 1] ^= 0x01;
  write_file(path, bytes);

  QuietLog level(LogLevel::warn);
  StderrCapture capture(dir.path() / "stderr.txt");
  CHECK_FALSE(cache.load(make_key(1), "warned.sm_90").has_value());
  CHECK_FALSE(cache.load(make_key(1), "warned.sm_90").has_value());
  CHECK_FALSE(cache.load(make_key(1), "warned.sm_90").has_value());
  const std::string output = capture.finish();
  CHECK(count_occurrences(output, path.string()) == 1);
  CHECK(count_occurrences(output, "checksum") == 1);
  CHECK(fs::exists(path));
}

TEST_CASE("a damaged entry is removed on load and treated as a miss") {
  QuietLog quiet;
  TempDir dir;
  DiskCache cache(dir.path(), CacheMode::read_write, 0);
  const CacheKey key = make_key(11);
  const std::string variant = "damaged.sm_90a";
  REQUIRE(cache.store(key, make_entry(variant, 200)));
  const fs::path path = cache.entry_path(key, variant);
  const std::string good = read_file(path);

  SUBCASE("truncated") { write_file(path, good.substr(0, good.size() - 1)); }
  SUBCASE("header only") { write_file(path, good.substr(0, 40)); }
  SUBCASE("zero length") { write_file(path, ""); }
  SUBCASE("bit flip in the payload") {
    std::string bytes = good;
    bytes[150] ^= 0x10;
    write_file(path, bytes);
  }
  SUBCASE("bit flip in the header") {
    std::string bytes = good;
    bytes[17] ^= 0x01;
    write_file(path, bytes);
  }
  SUBCASE("trailing garbage") { write_file(path, good + "junk"); }
  SUBCASE("an entry of another variant under this name") {
    const std::vector<char> other = encode_entry(make_entry("other.sm_90a", 200));
    write_file(path, std::string(other.begin(), other.end()));
  }
  SUBCASE("a flipped bit in the variant name") {
    std::string bytes = good;
    bytes[40] ^= 0x02;
    write_file(path, bytes);
  }

  CHECK_FALSE(cache.load(key, variant).has_value());
  CHECK_FALSE(fs::exists(path));
  CHECK(cache.usable_for_write());  // damage is not an I/O failure
  // The slot is usable again.
  REQUIRE(cache.store(key, make_entry(variant, 200)));
  CHECK(cache.load(key, variant).has_value());
}

TEST_CASE("invalid variant names are refused without degrading the cache") {
  QuietLog quiet;
  TempDir dir;
  DiskCache cache(dir.path(), CacheMode::read_write, 0);
  for (const std::string& bad : {std::string(), std::string("a/b"), std::string("../x"),
                                 std::string(300, 'v'), std::string("tab\tname")}) {
    CAPTURE(bad);
    CHECK_FALSE(cache.store(make_key(1), make_entry(bad, 10)));
    CHECK_FALSE(cache.load(make_key(1), bad).has_value());
    CHECK_FALSE(cache.contains(make_key(1), bad));
  }
  CHECK(cache.usable_for_write());
  CHECK(cache.store(make_key(1), make_entry("fine.sm_90", 10)));
  CHECK(all_files(dir.path()).size() == 1);
}

}  // TEST_SUITE
