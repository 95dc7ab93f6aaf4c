// Who may have written the cache: the modes it creates its files with, and entries, shard
// directories and roots that another user owns or could write, which it neither trusts nor
// touches. CI runs as root, so files can be chowned to another uid; without root those cases skip.
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "cache/cache_entry.hpp"
#include "cache/disk_cache.hpp"
#include "runtime/jit_engine.hpp"
#include "runtime/kernel_spec.hpp"
#include "tests/support/cache_support.hpp"
#include "tests/support/support.hpp"
#include "tests/unit/cache_trust_support.hpp"

namespace fs = std::filesystem;
using astrai::detail::CacheEntryData;
using astrai::detail::CacheMode;
using astrai::detail::DiskCache;
using astrai::detail::encode_entry;
using astrai::detail::JitEngine;
using astrai::detail::KernelSpec;
using astrai::detail::VariantSource;
using astrai::testing::chown_to;
using astrai::testing::config_for;
using astrai::testing::count_occurrences;
using astrai::testing::is_root;
using astrai::testing::kStranger;
using astrai::testing::LogCapture;
using astrai::testing::make_entry;
using astrai::testing::make_key;
using astrai::testing::mode_of;
using astrai::testing::QuietLog;
using astrai::testing::read_file;
using astrai::testing::rotary_spec;
using astrai::testing::snapshot;
using astrai::testing::TempDir;
using astrai::testing::write_file;

TEST_SUITE("trust") {

TEST_CASE("cache directories are created 0700, entries and locks 0600, whatever the umask") {
  TempDir dir;
  const fs::path root = dir.path() / "home" / ".cache" / "astrai-jit";
  const mode_t old_umask = ::umask(0);
  DiskCache cache(root, CacheMode::read_write, 0);
  REQUIRE(cache.store(make_key(1), make_entry("modes.sm_80")));
  auto lock = cache.lock_key(make_key(1), std::chrono::milliseconds(100));
  ::umask(old_umask);
  REQUIRE(lock);
  CHECK(mode_of(dir.path() / "home" / ".cache") == 0700);
  CHECK(mode_of(root) == 0700);
  CHECK(mode_of(root / "v1") == 0700);
  const fs::path entry = cache.entry_path(make_key(1), "modes.sm_80");
  CHECK(mode_of(entry.parent_path()) == 0700);
  CHECK(mode_of(entry) == 0600);
  CHECK(mode_of(root / "v1" / "locks") == 0700);
  CHECK(mode_of(root / "v1" / "locks" / (make_key(1).hex() + ".lock")) == 0600);
}

TEST_CASE("an entry owned by another user is a miss with one warning and is never removed") {
  if (!is_root()) {
    MESSAGE("not root: cannot chown a file to another user, skipping");
    return;
  }
  TempDir dir;
  DiskCache cache(dir.path() / "cache", CacheMode::read_write, 0);
  REQUIRE(cache.store(make_key(1), make_entry("foreign.sm_80")));
  const fs::path path = cache.entry_path(make_key(1), "foreign.sm_80");
  chown_to(path, kStranger);
  const std::string before = read_file(path);

  LogCapture log(dir.path() / "log.txt");
  CHECK_FALSE(cache.load(make_key(1), "foreign.sm_80").has_value());
  CHECK_FALSE(cache.load(make_key(1), "foreign.sm_80").has_value());
  CHECK_FALSE(cache.contains(make_key(1), "foreign.sm_80"));
  // Not replaced by a store, not removed by maintenance; verify reports it.
  CHECK_FALSE(cache.store(make_key(1), make_entry("foreign.sm_80", 10)));
  const auto checked = cache.verify(true);
  REQUIRE(checked.size() == 1);
  CHECK(checked[0].foreign);
  CHECK_FALSE(checked[0].valid);
  CHECK(checked[0].problem.find("owned by uid 1234") != std::string::npos);
  CHECK(cache.list().empty());
  CHECK(cache.prune(0) == 0);
  CHECK(cache.clear() == 0);
  const std::string output = log.finish();
  CHECK(read_file(path) == before);
  CHECK(count_occurrences(output, path.string()) == 1);
  CHECK(output.find("owned by uid 1234") != std::string::npos);
}

TEST_CASE("a group- or other-writable entry is a miss and is kept") {
  QuietLog quiet;
  TempDir dir;
  DiskCache cache(dir.path() / "cache", CacheMode::read_write, 0);
  for (const mode_t mode : {mode_t{0620}, mode_t{0602}, mode_t{0666}}) {
    CAPTURE(mode);
    REQUIRE(cache.store(make_key(mode), make_entry("writable.sm_80")));
    const fs::path path = cache.entry_path(make_key(mode), "writable.sm_80");
    REQUIRE(::chmod(path.c_str(), mode) == 0);
    CHECK_FALSE(cache.load(make_key(mode), "writable.sm_80").has_value());
    CHECK(fs::exists(path));
    CHECK(cache.clear() == 0);
    CHECK(fs::exists(path));
  }
}

TEST_CASE("a shard directory that others could write is neither read nor written") {
  QuietLog quiet;
  TempDir dir;
  DiskCache cache(dir.path() / "cache", CacheMode::read_write, 0);
  REQUIRE(cache.store(make_key(7), make_entry("shard.sm_80")));
  const fs::path path = cache.entry_path(make_key(7), "shard.sm_80");
  const fs::path shard = path.parent_path();
  REQUIRE(::chmod(shard.c_str(), 0777) == 0);
  CHECK_FALSE(cache.load(make_key(7), "shard.sm_80").has_value());
  CHECK_FALSE(cache.store(make_key(7), make_entry("shard.sm_80", 3)));
  CHECK(cache.list().empty());
  CHECK(cache.clear() == 0);
  CHECK(fs::exists(path));
  CHECK(fs::file_size(path) > 40 + 64);  // the first entry, untouched
  // Another shard of the same cache still works.
  CHECK(cache.store(make_key(8), make_entry("other.sm_80")));
  CHECK(cache.load(make_key(8), "other.sm_80").has_value());
}

TEST_CASE("a cache root that others could write, or another user owns, is not used at all") {
  QuietLog quiet;
  TempDir dir;
  std::vector<std::pair<std::string, std::function<void(const fs::path&)>>> setups = {
      {"mode 0777", [](const fs::path& root) { REQUIRE(::chmod(root.c_str(), 0777) == 0); }},
      {"mode 0770", [](const fs::path& root) { REQUIRE(::chmod(root.c_str(), 0770) == 0); }},
      {"v1 mode 0775",
       [](const fs::path& root) { REQUIRE(::chmod((root / "v1").c_str(), 0775) == 0); }}};
  if (is_root())
    setups.push_back({"owned by another user", [](const fs::path& root) { chown_to(root, kStranger); }});
  int n = 0;
  for (const auto& [name, setup] : setups) {
    CAPTURE(name);
    const fs::path root = dir.path() / fmt::format("cache{}", n++);
    {
      DiskCache writer(root, CacheMode::read_write, 0);
      REQUIRE(writer.store(make_key(1), make_entry("poisoned.sm_80")));
    }
    setup(root);
    const auto before = snapshot(root);
    DiskCache cache(root, CacheMode::read_write, 0);
    CHECK_FALSE(cache.usable_for_write());
    CHECK_FALSE(cache.load(make_key(1), "poisoned.sm_80").has_value());
    CHECK_FALSE(cache.store(make_key(2), make_entry("new.sm_80")));
    CHECK_FALSE(cache.lock_key(make_key(2), std::chrono::milliseconds(10)));
    CHECK(cache.list().empty());
    CHECK(cache.clear() == 0);
    CHECK(cache.prune(0) == 0);
    std::string why;
    CHECK_FALSE(cache.check_usable(&why));
    CHECK_FALSE(why.empty());
    CHECK(snapshot(root) == before);
  }
}

TEST_CASE("the engine compiles instead of loading an entry rewritten in a world-writable cache") {
  // The attack of the issue: another user rewrote an entry and recomputed its checksum.
  QuietLog quiet;
  TempDir dir;
  const fs::path root = dir.path() / "cache";
  const KernelSpec spec = rotary_spec();
  {
    JitEngine warm(config_for(root));
    warm.get(spec);
  }
  for (fs::recursive_directory_iterator it(root), end; it != end; ++it)
    if (it->is_directory()) fs::permissions(it->path(), fs::perms::all);
  fs::permissions(root, fs::perms::all);
  JitEngine engine(config_for(root));
  const auto path = engine.cache().entry_path(engine.key_for(spec), spec.name());
  const auto entry = astrai::detail::decode_entry(read_file(path).data(), fs::file_size(path));
  REQUIRE(entry);
  CacheEntryData evil = *entry;
  evil.payload.back() ^= 0x5a;  // a different binary with a valid checksum
  const auto bytes = encode_entry(evil);
  write_file(path, std::string(bytes.begin(), bytes.end()));
  VariantSource source = VariantSource::memory;
  engine.get(spec, &source);
  CHECK(source == VariantSource::compiled);
  CHECK(engine.counters().disk_hits == 0);
}

}  // TEST_SUITE
