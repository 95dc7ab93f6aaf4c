// A cache used together with others: compile locks that other processes or users hold, read-only
// layers, export and import of archives, a cache shared by a group (steps run under other uids
// with setpriv, which needs root; without it that case skips), and threads of one engine.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "astrai/error.hpp"
#include "base/logging.hpp"
#include "cache/cache_archive.hpp"
#include "cache/disk_cache.hpp"
#include "runtime/env_config.hpp"
#include "runtime/jit_engine.hpp"
#include "runtime/kernel_spec.hpp"
#include "tests/support/cache_support.hpp"
#include "tests/support/support.hpp"
#include "tests/unit/cache_trust_support.hpp"

namespace fs = std::filesystem;
using astrai::DType;
using astrai::detail::CacheMode;
using astrai::detail::CacheSharing;
using astrai::detail::DiskCache;
using astrai::detail::EnvConfig;
using astrai::detail::JitEngine;
using astrai::detail::KernelKind;
using astrai::detail::KernelSpec;
using astrai::detail::LogLevel;
using astrai::detail::VariantSource;
using astrai::testing::chown_to;
using astrai::testing::config_for;
using astrai::testing::count_occurrences;
using astrai::testing::is_root;
using astrai::testing::kStranger;
using astrai::testing::LogCapture;
using astrai::testing::make_entry;
using astrai::testing::make_key;
using astrai::testing::make_loadable_entry;
using astrai::testing::mode_of;
using astrai::testing::QuietLog;
using astrai::testing::read_file;
using astrai::testing::rotary_spec;
using astrai::testing::snapshot;
using astrai::testing::TempDir;
using astrai::testing::write_file;

namespace {

// Child: an engine sharing the cache at args[0] with the group of the directory gets the
// variant args[1]. Exit 10: compiled; 11: loaded from disk; anything else: a failure.
const bool kSharedGetRegistered = astrai::testing::register_child_action(
    "trust-shared-get", [](const std::vector<std::string>& args) -> int {
      if (args.size() != 2) return 2;
      astrai::detail::Logger::instance().set_level(LogLevel::off);
      EnvConfig config = config_for(args[0]);
      config.cache_sharing.kind = CacheSharing::Kind::directory_group;
      config.cache_sharing.name = "group";
      JitEngine engine(config);
      VariantSource source = VariantSource::memory;
      const auto variant = engine.get(KernelSpec::parse(args[1]), &source);
      if (!variant) return 4;
      if (source == VariantSource::compiled) return 10;
      if (source == VariantSource::disk) return 11;
      return 5;
    });

// Child: holds the flock of the file args[0] until killed.
const bool kHoldLockRegistered = astrai::testing::register_child_action(
    "trust-hold-lock", [](const std::vector<std::string>& args) -> int {
      if (args.size() != 1) return 2;
      const int fd = ::open(args[0].c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0 || ::flock(fd, LOCK_EX) != 0) return 3;
      for (;;) ::pause();
    });

// Child: as the user args[0] (group too, no supplementary groups), holds the flock of the file
// args[1] until killed. Exit 3: it could not open or lock the file.
const bool kHoldLockAsRegistered = astrai::testing::register_child_action(
    "trust-hold-lock-as", [](const std::vector<std::string>& args) -> int {
      if (args.size() != 2) return 2;
      const auto uid = static_cast<uid_t>(std::stoul(args[0]));
      if (::setgroups(0, nullptr) != 0 || ::setresgid(uid, uid, uid) != 0 ||
          ::setresuid(uid, uid, uid) != 0)
        return 4;
      const int fd = ::open(args[1].c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0 || ::flock(fd, LOCK_EX) != 0) return 3;
      for (;;) ::pause();
    });

// Whether someone holds the flock of `path` (probed from a descriptor of our own).
bool lock_is_held(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool held = ::flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
  if (!held) ::flock(fd, LOCK_UN);
  ::close(fd);
  return held;
}

std::string setpriv(uid_t uid, gid_t gid) {
  return fmt::format("setpriv --reuid={} --regid={} --clear-groups ", uid, gid);
}

}  // namespace

TEST_SUITE("trust") {

TEST_CASE("a lock file owned by another user is refused at once instead of stalling us") {
  if (!is_root()) {
    MESSAGE("not root: cannot chown a file to another user, skipping");
    return;
  }
  QuietLog quiet;
  TempDir dir;
  DiskCache cache(dir.path() / "cache", CacheMode::read_write, 0);
  { REQUIRE(cache.lock_key(make_key(1), std::chrono::milliseconds(10))); }
  const fs::path lock = dir.path() / "cache" / "v1" / "locks" / (make_key(1).hex() + ".lock");
  chown_to(lock, kStranger);
  const int holder = astrai::testing::spawn_child("trust-hold-lock", {lock.string()});
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const auto start = std::chrono::steady_clock::now();
  CHECK_FALSE(cache.lock_key(make_key(1), std::chrono::seconds(30)));
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
  ::kill(holder, SIGKILL);
  astrai::testing::wait_child(holder);
}

TEST_CASE("a lock file other users could open is replaced, so that nobody else can hold our locks") {
  if (!is_root()) {
    MESSAGE("not root: cannot run a step as another user, skipping");
    return;
  }
  TempDir dir;
  // An older cache, or one offered to colleagues as a layer: directories others may enter and a
  // lock file others may read, which is all flock needs.
  const fs::path root = dir.path() / "cache";
  const fs::path lock = root / "v1" / "locks" / (make_key(1).hex() + ".lock");
  {
    DiskCache cache(root, CacheMode::read_write, 0);
    REQUIRE(cache.lock_key(make_key(1), std::chrono::milliseconds(10)));
  }
  for (const fs::path& path : {dir.path(), root, root / "v1", root / "v1" / "locks"})
    fs::permissions(path, fs::perms(0755));
  fs::permissions(lock, fs::perms(0644));
  const int holder =
      astrai::testing::spawn_child("trust-hold-lock-as", {std::to_string(kStranger), lock.string()});
  for (int i = 0; i < 200 && !lock_is_held(lock); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  REQUIRE(lock_is_held(lock));  // the other user holds it

  LogCapture log(dir.path() / "log.txt");
  DiskCache cache(root, CacheMode::read_write, 0);
  const auto start = std::chrono::steady_clock::now();
  const auto ours = cache.lock_key(make_key(1), std::chrono::seconds(3));
  const auto waited = std::chrono::steady_clock::now() - start;
  const std::string output = log.finish();
  ::kill(holder, SIGKILL);
  astrai::testing::wait_child(holder);
  CHECK(ours);
  CHECK(waited < std::chrono::seconds(1));
  CHECK(mode_of(lock) == 0600);
  CHECK(count_occurrences(output, "could be opened by other users (mode 0644)") == 1);
}

TEST_CASE("a wait of more than a few seconds for a compile lock is logged at warn") {
  TempDir dir;
  DiskCache cache(dir.path() / "cache", CacheMode::read_write, 0);
  { REQUIRE(cache.lock_key(make_key(1), std::chrono::milliseconds(10))); }
  const fs::path lock = dir.path() / "cache" / "v1" / "locks" / (make_key(1).hex() + ".lock");
  const int holder = astrai::testing::spawn_child("trust-hold-lock", {lock.string()});
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  LogCapture log(dir.path() / "log.txt");
  CHECK_FALSE(cache.lock_key(make_key(1), std::chrono::milliseconds(5500)));
  const std::string output = log.finish();
  ::kill(holder, SIGKILL);
  astrai::testing::wait_child(holder);
  CHECK(count_occurrences(output, "warning: waiting for compile lock " + make_key(1).hex() + ".lock held by "
                         "another process") == 1);
  CHECK(count_occurrences(output, "warning: waited 5500 ms for compile lock") == 1);
}

TEST_CASE("a read-only layer serves hits and is never written") {
  QuietLog quiet;
  TempDir dir;
  const fs::path layer = dir.path() / "image-cache";
  const KernelSpec in_layer = rotary_spec(64);
  const KernelSpec not_in_layer = rotary_spec(128);
  { JitEngine(config_for(layer)).get(in_layer); }
  const auto before = snapshot(layer);

  EnvConfig config = config_for(dir.path() / "user");
  config.cache_layers = {dir.path() / "missing-layer", layer};
  JitEngine engine(config);
  VariantSource source = VariantSource::memory;
  engine.get(in_layer, &source);
  CHECK(source == VariantSource::disk);
  engine.get(not_in_layer, &source);
  CHECK(source == VariantSource::compiled);
  CHECK(engine.cached(in_layer));
  CHECK(engine.cached(not_in_layer));
  CHECK(snapshot(layer) == before);
  CHECK(engine.cache().list().size() == 1);  // the compile went to the user cache
  CHECK_FALSE(fs::exists(dir.path() / "missing-layer"));
}

TEST_CASE("a layer owned by another user is refused in shared mode too, whatever its group") {
  if (!is_root()) {
    MESSAGE("not root: cannot chown a file to another user, skipping");
    return;
  }
  TempDir dir;
  const KernelSpec spec = rotary_spec();
  int round = 0;
  for (const auto kind : {CacheSharing::Kind::directory_group, CacheSharing::Kind::named_group}) {
    CAPTURE(static_cast<int>(kind));
    const fs::path layer = dir.path() / fmt::format("their-cache-{}", ++round);
    {
      QuietLog quiet;
      JitEngine(config_for(layer)).get(spec);
    }
    // Another user's cache, given a group we are in: under the group rule of our own shared
    // cache its entries (sound, checksums valid) would be served.
    chown_to(layer, kStranger, ::getegid());
    for (fs::recursive_directory_iterator it(layer), end; it != end; ++it)
      chown_to(it->path(), kStranger, ::getegid());
    const auto before = snapshot(layer);
    EnvConfig config = config_for(dir.path() / fmt::format("mine-{}", round));
    config.cache_sharing.kind = kind;
    config.cache_sharing.gid = ::getegid();
    config.cache_sharing.name = "team";
    config.cache_layers = {layer};
    LogCapture log(dir.path() / "log.txt");
    VariantSource source = VariantSource::memory;
    {
      JitEngine engine(config);
      engine.get(spec, &source);
    }
    const std::string output = log.finish();
    CHECK(source == VariantSource::compiled);
    CHECK(count_occurrences(output, fmt::format("owned by uid {}", kStranger)) == 1);
    CHECK(snapshot(layer) == before);
  }
}

TEST_CASE("a damaged entry in a read-only layer is skipped, kept and compiled into the user cache") {
  QuietLog quiet;
  TempDir dir;
  const fs::path layer = dir.path() / "image-cache";
  const KernelSpec spec = rotary_spec();
  fs::path path;
  {
    JitEngine warm(config_for(layer));
    warm.get(spec);
    path = warm.cache().entry_path(warm.key_for(spec), spec.name());
  }
  std::string bytes = read_file(path);
  bytes[bytes.size() / 2] ^= 0x40;
  write_file(path, bytes);
  const auto before = snapshot(layer);
  EnvConfig config = config_for(dir.path() / "user");
  config.cache_layers = {layer};
  {
    JitEngine engine(config);
    VariantSource source = VariantSource::memory;
    engine.get(spec, &source);
    CHECK(source == VariantSource::compiled);
  }
  CHECK(snapshot(layer) == before);
  JitEngine again(config);
  VariantSource source = VariantSource::memory;
  again.get(spec, &source);
  CHECK(source == VariantSource::disk);
  CHECK(again.counters().compiles == 0);
}

TEST_CASE("export then import into an empty cache gives hits with no compile") {
  QuietLog quiet;
  TempDir dir;
  const std::vector<KernelSpec> specs = {rotary_spec(64), rotary_spec(128)};
  {
    JitEngine warm(config_for(dir.path() / "ci"));
    for (const auto& spec : specs) warm.get(spec);
  }
  const fs::path archive = dir.path() / "kernels.astrai";
  {
    DiskCache ci(dir.path() / "ci", CacheMode::read_only, 0);
    const auto report = astrai::detail::export_cache(ci, {}, archive);
    CHECK(report.entries == 2);
    CHECK(report.problems.empty());
    const auto partial = astrai::detail::export_cache(ci, {specs[1].name(), "rotary_emb.bf16.hd96.sm_80"},
                                                      dir.path() / "partial.astrai");
    CHECK(partial.entries == 1);
    REQUIRE(partial.problems.size() == 1);
    CHECK(partial.problems[0] == "not in the cache: rotary_emb.bf16.hd96.sm_80");
  }
  {
    JitEngine node(config_for(dir.path() / "node"));
    const auto report = astrai::detail::import_archive(node.cache(), archive);
    CHECK(report.entries == 2);
    CHECK(report.problems.empty());
  }
  JitEngine node(config_for(dir.path() / "node"));
  for (const auto& spec : specs) {
    VariantSource source = VariantSource::memory;
    node.get(spec, &source);
    CHECK(source == VariantSource::disk);
  }
  CHECK(node.counters().compiles == 0);
}

TEST_CASE("import checks every entry and refuses archives that are not sound") {
  QuietLog quiet;
  TempDir dir;
  {
    DiskCache source(dir.path() / "src", CacheMode::read_write, 0);
    REQUIRE(source.store(make_key(1), make_loadable_entry("a.sm_80", 1)));
    REQUIRE(source.store(make_key(2), make_loadable_entry("b.sm_80", 2)));
    astrai::detail::export_cache(source, {}, dir.path() / "good.astrai");
  }
  const std::string good = read_file(dir.path() / "good.astrai");
  // A flipped payload byte: the archive is damaged, and nothing of it is imported.
  std::string tampered = good;
  tampered[tampered.size() - 16 - 10] ^= 0x01;
  write_file(dir.path() / "tampered.astrai", tampered);
  DiskCache target(dir.path() / "dst", CacheMode::read_write, 0);
  try {
    astrai::detail::import_archive(target, dir.path() / "tampered.astrai");
    FAIL("a tampered archive was imported");
  } catch (const astrai::Error& error) {
    CHECK(std::string(error.what()).find("checksum mismatch; nothing imported") !=
          std::string::npos);
  }
  CHECK(target.list().empty());
  CHECK(astrai::detail::import_archive(target, dir.path() / "good.astrai").entries == 2);

  write_file(dir.path() / "truncated.astrai", good.substr(0, good.size() - 3));
  CHECK_THROWS_AS(astrai::detail::import_archive(target, dir.path() / "truncated.astrai"),
                  astrai::Error);
  write_file(dir.path() / "garbage.astrai", "not an archive at all, no");
  CHECK_THROWS_WITH_AS(
      astrai::detail::import_archive(target, dir.path() / "garbage.astrai"),
      ("cache import: " + (dir.path() / "garbage.astrai").string() +
       " is not a sound archive: bad magic; nothing imported").c_str(),
      astrai::Error);
  std::string huge = good.substr(0, 24);
  huge += std::string("\x28\0\0\0", 4) + make_key(1).hex() + ".a.sm_80.cubin";
  huge += std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8);
  write_file(dir.path() / "huge.astrai", huge);
  CHECK_THROWS_AS(astrai::detail::import_archive(target, dir.path() / "huge.astrai"),
                  astrai::Error);
  CHECK_THROWS_AS(astrai::detail::import_archive(target, dir.path()), astrai::InvalidArgument);
}

TEST_CASE("two users in one group share a cache; a user outside the group cannot use it") {
  if (!is_root() || astrai::testing::run_command("setpriv --version") != 0) {
    MESSAGE("needs root and setpriv to run steps as other users, skipping");
    return;
  }
  TempDir dir;
  const fs::path root = dir.path() / "team-cache";
  fs::permissions(dir.path(), fs::perms(0755));
  fs::create_directory(root);
  chown_to(root, 0, 1500);
  fs::permissions(root, fs::perms(02770));
  const std::string variant = rotary_spec().name();
  auto get_as = [&](uid_t uid, gid_t gid) {
    std::string output;
    const int rc = astrai::testing::run_command(
        setpriv(uid, gid) + astrai::testing::self_path() + " --child trust-shared-get " +
            root.string() + " " + variant,
        &output);
    CAPTURE(output);
    return rc;
  };
  CHECK(get_as(1501, 1500) == 10);  // compiles and publishes
  CHECK(get_as(1502, 1500) == 11);  // another member of the group loads it
  CHECK(get_as(1503, 1600) == 10);  // outside the group: no access, compiles in memory
  std::vector<fs::path> entries;
  for (fs::recursive_directory_iterator it(root), end; it != end; ++it)
    if (it->path().extension() == ".cubin") entries.push_back(it->path());
  REQUIRE(entries.size() == 1);
  struct stat info {};
  REQUIRE(::stat(entries[0].c_str(), &info) == 0);
  CHECK(info.st_uid == 1501);
  CHECK(info.st_gid == 1500);
  CHECK((info.st_mode & 07777) == 0660);
  REQUIRE(::stat(entries[0].parent_path().c_str(), &info) == 0);
  CHECK((info.st_mode & 07777) == 02770);
  CHECK(info.st_gid == 1500);
  // A process outside the group may not trust it even in shared mode (root can open it).
  {
    QuietLog quiet;
    CacheSharing sharing;
    sharing.kind = CacheSharing::Kind::directory_group;
    DiskCache outsider(root, CacheMode::read_only, 0, sharing);
    std::string why;
    CHECK_FALSE(outsider.check_usable(&why));
    CHECK(why.find("not one of this process's groups") != std::string::npos);
  }
  // Without the shared mode the owner-only rule refuses the group-writable tree.
  QuietLog quiet;
  DiskCache private_view(root, CacheMode::read_only, 0);
  CHECK(private_view.list().empty());
}

TEST_CASE("shared mode leaves an existing private cache private, with one warning") {
  TempDir dir;
  const fs::path root = dir.path() / "cache";
  {
    QuietLog quiet;
    DiskCache mine(root, CacheMode::read_write, 0);
    REQUIRE(mine.store(make_key(1), make_loadable_entry("a.sm_80")));
  }
  const mode_t root_mode = astrai::testing::mode_of(root);
  REQUIRE(root_mode == 0700);
  CacheSharing sharing;
  sharing.kind = CacheSharing::Kind::directory_group;
  sharing.name = "group";
  LogCapture log(dir.path() / "log.txt");
  {
    DiskCache shared(root, CacheMode::read_write, 0, sharing);
    CHECK(shared.load(make_key(1), "a.sm_80").has_value());  // still ours to use
    CHECK(shared.store(make_key(2), make_loadable_entry("b.sm_80", 2)));
  }
  const std::string output = log.finish();
  CHECK(astrai::testing::mode_of(root) == 0700);
  CHECK(astrai::testing::mode_of(root / "v1") == 0700);
  CHECK(count_occurrences(output, "the existing cache directory " + root.string() +
                                      " is not shared (mode 0700") == 1);
  // A directory it creates itself is shared.
  DiskCache fresh(dir.path() / "fresh", CacheMode::read_write, 0, sharing);
  CHECK(astrai::testing::mode_of(dir.path() / "fresh") == 02770);
}

TEST_CASE("with an owner list, a shared cache refuses a group member's files unless listed") {
  if (!is_root()) {
    MESSAGE("skipped: files of another uid need root");
    return;
  }
  TempDir dir;
  const fs::path root = dir.path() / "cache";
  CacheSharing sharing;
  sharing.kind = CacheSharing::Kind::directory_group;
  sharing.name = "group";
  fs::path entry;
  {
    QuietLog quiet;
    DiskCache writer(root, CacheMode::read_write, 0, sharing);
    REQUIRE(writer.store(make_key(1), make_loadable_entry("a.sm_80")));
    entry = writer.entry_path(make_key(1), "a.sm_80");
  }
  // Another user of the cache's group (or a former member: the file keeps the group).
  chown_to(entry, kStranger, ::getegid());
  REQUIRE(mode_of(entry) == 0660);
  {
    QuietLog quiet;
    DiskCache group_only(root, CacheMode::read_only, 0, sharing);
    CHECK(group_only.load(make_key(1), "a.sm_80").has_value());
  }
  sharing.owners_listed = true;
  sharing.owners = {1500};
  {
    LogCapture log(dir.path() / "refused.txt");
    DiskCache listed(root, CacheMode::read_write, 0, sharing);
    CHECK_FALSE(listed.load(make_key(1), "a.sm_80").has_value());
    CHECK_FALSE(listed.load(make_key(1), "a.sm_80").has_value());
    CHECK_FALSE(listed.store(make_key(1), make_loadable_entry("a.sm_80")));  // not replaced
    CHECK(listed.list().empty());
    const std::string output = log.finish();
    CHECK(count_occurrences(output, "not using " + entry.string() +
                                        ": owned by uid 1234, who is not in "
                                        "ASTRAI_JIT_CACHE_OWNERS (trusted: uid 0, root, uid "
                                        "1500)") == 1);
  }
  struct stat info {};
  REQUIRE(::stat(entry.c_str(), &info) == 0);
  CHECK(info.st_uid == kStranger);  // neither removed nor replaced
  sharing.owners = {1500, kStranger};
  {
    QuietLog quiet;
    DiskCache listed(root, CacheMode::read_only, 0, sharing);
    CHECK(listed.load(make_key(1), "a.sm_80").has_value());
  }
  // A directory of an unlisted member is refused too, with what is below it.
  chown_to(entry, 0, ::getegid());
  chown_to(entry.parent_path(), kStranger, ::getegid());
  sharing.owners = {1500};
  LogCapture log(dir.path() / "directory.txt");
  DiskCache listed(root, CacheMode::read_only, 0, sharing);
  CHECK_FALSE(listed.load(make_key(1), "a.sm_80").has_value());
  CHECK(count_occurrences(log.finish(), "not using " + entry.parent_path().string() +
                                            ": owned by uid 1234, who is not in") == 1);
}

TEST_CASE("threads waiting for another thread's compile do not block other memory hits") {
  QuietLog quiet;
  TempDir dir;
  JitEngine engine(config_for(dir.path() / "cache", CacheMode::off));
  const KernelSpec ready = rotary_spec(64);
  KernelSpec slow;  // an attention kernel: its compile takes far longer than a memory hit
  slow.kind = KernelKind::paged_decode;
  slow.dtype = DType::bf16;
  slow.head_dim = 128;
  slow.page_size = 16;
  slow.group_size = 4;
  slow.arch = "sm_80";
  engine.get(ready);
  using Clock = std::chrono::steady_clock;
  Clock::time_point compiled_at, waiter_done, hit_done;
  std::thread compiler([&] {
    engine.get(slow);
    compiled_at = Clock::now();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::thread waiter([&] {
    engine.get(slow);  // waits for the compile in flight
    waiter_done = Clock::now();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::thread hitter([&] {
    engine.get(ready);
    hit_done = Clock::now();
  });
  compiler.join();
  waiter.join();
  hitter.join();
  CHECK(engine.counters().compiles == 2);
  CHECK(hit_done < compiled_at);
}

}  // TEST_SUITE
