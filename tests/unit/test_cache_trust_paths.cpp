// Paths the cache did not create: symbolic links planted at the root, v1, a shard, an entry, the
// locks directory, a lock or a temp name, or behind a trailing slash, and the record file and
// dump directory of ASTRAI_JIT_RECORD / ASTRAI_JIT_DUMP. None is ever followed or written through.
#include <doctest/doctest.h>

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <string>

#include "cache/cache_fs.hpp"
#include "cache/disk_cache.hpp"
#include "runtime/env_config.hpp"
#include "runtime/jit_engine.hpp"
#include "tests/support/cache_support.hpp"
#include "tests/support/support.hpp"
#include "tests/unit/cache_trust_support.hpp"

namespace fs = std::filesystem;
using astrai::detail::CacheMode;
using astrai::detail::DiskCache;
using astrai::detail::EnvConfig;
using astrai::detail::JitEngine;
using astrai::testing::config_for;
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

TEST_CASE("a symbolic link at the root, v1, a shard or an entry is never followed") {
  QuietLog quiet;
  TempDir dir;
  const fs::path outside = dir.path() / "outside";
  // The target of every link: a cache tree of its own, and a plain file.
  {
    DiskCache victim(outside, CacheMode::read_write, 0);
    REQUIRE(victim.store(make_key(1), make_entry("victim.sm_80")));
    REQUIRE(victim.store(make_key(2), make_entry("victim2.sm_80")));
  }
  const fs::path victim_entry = DiskCache(outside, CacheMode::read_only, 0).entry_path(make_key(1), "victim.sm_80");
  const auto before = snapshot(outside);

  auto attack = [&](const std::string& name, const std::function<void(const fs::path&)>& plant) {
    CAPTURE(name);
    const fs::path root = dir.path() / name;
    {
      DiskCache setup(root, CacheMode::read_write, 0);
      REQUIRE(setup.store(make_key(3), make_entry("mine.sm_80")));
    }
    plant(root);
    DiskCache cache(root, CacheMode::read_write, 0);
    CHECK_FALSE(cache.load(make_key(1), "victim.sm_80").has_value());
    cache.store(make_key(1), make_entry("victim.sm_80", 5));
    cache.store(make_key(2), make_entry("victim2.sm_80", 5));
    cache.store(make_key(9), make_entry("new.sm_80", 5));
    cache.lock_key(make_key(1), std::chrono::milliseconds(10));
    cache.verify(true);
    cache.prune(0);
    cache.clear();
    CHECK(snapshot(outside) == before);
  };
  attack("root-link", [&](const fs::path& root) {
    fs::remove_all(root);
    fs::create_directory_symlink(outside, root);
  });
  attack("v1-link", [&](const fs::path& root) {
    fs::remove_all(root / "v1");
    fs::create_directory_symlink(outside / "v1", root / "v1");
  });
  attack("shard-link", [&](const fs::path& root) {
    const fs::path shard = root / "v1" / make_key(1).hex().substr(0, 2);
    fs::remove_all(shard);
    fs::create_directory_symlink(victim_entry.parent_path(), shard);
  });
  attack("entry-link", [&](const fs::path& root) {
    const fs::path entry = DiskCache(root, CacheMode::read_only, 0).entry_path(make_key(1), "victim.sm_80");
    fs::create_directories(entry.parent_path());
    fs::create_symlink(victim_entry, entry);
  });
  attack("locks-link", [&](const fs::path& root) {
    fs::remove_all(root / "v1" / "locks");
    fs::create_directory_symlink(outside / "v1", root / "v1" / "locks");
  });
}

TEST_CASE("a dangling symbolic link at a lock path or a temp name creates nothing") {
  QuietLog quiet;
  TempDir dir;
  const fs::path root = dir.path() / "cache";
  DiskCache cache(root, CacheMode::read_write, 0);
  REQUIRE(cache.usable_for_write());
  fs::create_directories(root / "v1" / "locks");
  const fs::path target = dir.path() / "created-through-link";
  fs::create_symlink(target, root / "v1" / "locks" / (make_key(1).hex() + ".lock"));
  CHECK_FALSE(cache.lock_key(make_key(1), std::chrono::milliseconds(10)));
  CHECK_FALSE(fs::exists(fs::symlink_status(target)));
  // The store of that key still works (the lock is only advisory).
  CHECK(cache.store(make_key(1), make_entry("locked.sm_80")));
  CHECK_FALSE(fs::exists(fs::symlink_status(target)));
}

TEST_CASE("ASTRAI_JIT_RECORD and ASTRAI_JIT_DUMP never write through a symbolic link") {
  QuietLog quiet;
  TempDir dir;
  const fs::path target = dir.path() / "target.txt";
  write_file(target, "precious\n");
  const fs::path dangling_target = dir.path() / "never-created";
  fs::create_symlink(target, dir.path() / "record-link");
  fs::create_symlink(dangling_target, dir.path() / "record-dangling");
  fs::create_directories(dir.path() / "dump-target");
  fs::create_directory_symlink(dir.path() / "dump-target", dir.path() / "dump-link");
  for (const char* record : {"record-link", "record-dangling"}) {
    CAPTURE(record);
    EnvConfig config = config_for(dir.path() / "cache", CacheMode::off);
    config.record_file = dir.path() / record;
    config.dump_dir = dir.path() / "dump-link";
    JitEngine engine(config);
    engine.get(rotary_spec());
  }
  CHECK(read_file(target) == "precious\n");
  CHECK_FALSE(fs::exists(fs::symlink_status(dangling_target)));
  CHECK(fs::is_empty(dir.path() / "dump-target"));

  // A dump directory writable by others is refused; a private one of ours is used.
  fs::create_directories(dir.path() / "dump-open");
  fs::permissions(dir.path() / "dump-open", fs::perms::all);
  {
    EnvConfig config = config_for(dir.path() / "cache", CacheMode::off);
    config.dump_dir = dir.path() / "dump-open";
    JitEngine(config).get(rotary_spec());
  }
  CHECK(fs::is_empty(dir.path() / "dump-open"));
  {
    EnvConfig config = config_for(dir.path() / "cache", CacheMode::off);
    config.dump_dir = dir.path() / "dump-new";
    config.record_file = dir.path() / "record.txt";
    JitEngine(config).get(rotary_spec());
  }
  CHECK(mode_of(dir.path() / "dump-new") == 0700);
  CHECK(fs::exists(dir.path() / "dump-new" / (rotary_spec().name() + ".cu")));
  CHECK(mode_of(dir.path() / "record.txt") == 0600);
  CHECK(read_file(dir.path() / "record.txt") == rotary_spec().name() + "\n");
}

TEST_CASE("a trailing slash does not make the root's symbolic link followed") {
  QuietLog quiet;
  TempDir dir;
  {
    DiskCache victim(dir.path() / "victim", CacheMode::read_write, 0);
    REQUIRE(victim.store(make_key(1), make_entry("v.sm_80")));
  }
  fs::create_directory_symlink(dir.path() / "victim", dir.path() / "link");
  const auto before = snapshot(dir.path() / "victim");
  DiskCache cache(dir.path().string() + "/link/", CacheMode::read_write, 0);
  CHECK_FALSE(cache.load(make_key(1), "v.sm_80").has_value());
  CHECK_FALSE(cache.store(make_key(2), make_entry("w.sm_80")));
  CHECK(cache.clear() == 0);
  CHECK(snapshot(dir.path() / "victim") == before);
}

TEST_CASE("a trailing /. or /.. does not make the root's symbolic link followed") {
  QuietLog quiet;
  TempDir dir;
  {
    DiskCache victim(dir.path() / "victim", CacheMode::read_write, 0);
    REQUIRE(victim.store(make_key(1), make_entry("v.sm_80")));
  }
  fs::create_directories(dir.path() / "victim" / "sub");
  fs::create_directory_symlink(dir.path() / "victim", dir.path() / "link");
  const auto before = snapshot(dir.path() / "victim");
  for (const std::string tail : {"/link/.", "/link/./", "/link/sub/..", "/link/sub/../.", "/./link"}) {
    CAPTURE(tail);
    DiskCache cache(dir.path().string() + tail, CacheMode::read_write, 0);
    CHECK(cache.root() == dir.path() / "link");
    CHECK_FALSE(cache.load(make_key(1), "v.sm_80").has_value());
    CHECK_FALSE(cache.store(make_key(2), make_entry("w.sm_80")));
    CHECK(cache.list().empty());
    CHECK(cache.clear() == 0);
    std::string why;
    CHECK_FALSE(DiskCache(dir.path().string() + tail, CacheMode::read_only, 0).check_usable(&why));
    CHECK(why.find("a symbolic link (never followed)") != std::string::npos);
  }
  CHECK(snapshot(dir.path() / "victim") == before);

  // ASTRAI_JIT_CACHE_DIR is normalized the same way, so `info` names the directory in use.
  const EnvConfig config =
      astrai::detail::parse_env_config({"ASTRAI_JIT_CACHE_DIR=" + dir.path().string() + "/link/."});
  CHECK(config.cache_dir == dir.path() / "link");
}

TEST_CASE("normalize_for_open returns lexically normal paths without a trailing separator") {
  // The reference: lexically_normal, then the trailing empty filename dropped.
  auto reference = [](const fs::path& path) {
    fs::path normal = path.lexically_normal();
    while (!normal.empty() && !normal.has_filename() && normal != normal.root_path())
      normal = normal.parent_path();
    return normal;
  };
  for (const std::string text :
       {"/a/b/c", "a/b", "a", "/", "", ".", "..", "/a/b/", "//a/b", "/a//b", "a/./b", "./a",
        "a/..", "a/b/../c", "/..", "/a/.", "a/...", "...", ".a/b.", "/a/b/.hidden", "a//"}) {
    CAPTURE(text);
    CHECK(astrai::detail::normalize_for_open(text).native() == reference(text).native());
  }
}

TEST_CASE("ASTRAI_JIT_RECORD never appends through a symbolic link to its directory") {
  QuietLog quiet;
  TempDir dir;
  // Someone plants a link to a directory of ours where the victim records: the file it leads
  // to is ours, single-linked and regular, so only the directory's check can refuse it.
  fs::create_directories(dir.path() / "private");
  const fs::path precious = dir.path() / "private" / "notes.txt";
  write_file(precious, "precious\n");
  fs::permissions(precious, fs::perms(0600));
  fs::create_directory_symlink(dir.path() / "private", dir.path() / "planted");
  for (const std::string record : {"planted/notes.txt", "planted/./notes.txt", "private/../planted/notes.txt"}) {
    CAPTURE(record);
    EnvConfig config = config_for(dir.path() / "cache", CacheMode::off);
    config.record_file = dir.path() / record;
    JitEngine(config).get(rotary_spec());
  }
  CHECK(read_file(precious) == "precious\n");

  // Writable by others: refused unless sticky (like /tmp), where the file is still ours alone.
  fs::create_directories(dir.path() / "open");
  fs::permissions(dir.path() / "open", fs::perms(0777));
  fs::create_directories(dir.path() / "sticky");
  fs::permissions(dir.path() / "sticky", fs::perms(01777));
  std::string why;
  CHECK(astrai::detail::open_private_append(dir.path() / "open" / "r.txt", &why) < 0);
  CHECK(why.find("writable by others") != std::string::npos);
  CHECK_FALSE(fs::exists(dir.path() / "open" / "r.txt"));
  const int fd = astrai::detail::open_private_append(dir.path() / "sticky" / "r.txt", &why);
  CHECK(fd >= 0);
  if (fd >= 0) ::close(fd);
  CHECK(mode_of(dir.path() / "sticky" / "r.txt") == 0600);
  CHECK(astrai::detail::open_private_append(dir.path() / "planted" / "notes.txt", &why) < 0);
  CHECK(why == "directory " + (dir.path() / "planted").string() +
                   ": a symbolic link (never followed)");
}

TEST_CASE("ASTRAI_JIT_RECORD never appends in a directory of another user") {
  if (!astrai::testing::is_root()) {
    MESSAGE("not root: cannot chown a directory to another user, skipping");
    return;
  }
  QuietLog quiet;
  TempDir dir;
  fs::create_directories(dir.path() / "theirs");
  astrai::testing::chown_to(dir.path() / "theirs", astrai::testing::kStranger);
  std::string why;
  CHECK(astrai::detail::open_private_append(dir.path() / "theirs" / "r.txt", &why) < 0);
  CHECK(why.find("owned by uid 1234") != std::string::npos);
  CHECK_FALSE(fs::exists(dir.path() / "theirs" / "r.txt"));
}

}  // TEST_SUITE
