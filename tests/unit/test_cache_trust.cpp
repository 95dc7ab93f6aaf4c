// The cache as a hostile local user would attack it: foreign and writable files and
// directories, planted symbolic links, oversized entries, malformed binaries, read-only layers,
// export and import, a cache shared by a group. CI runs as root, so files can be chowned to
// another uid and steps run under another uid with setpriv; without root those cases skip.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
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

namespace fs = std::filesystem;
using astrai::DType;
using astrai::detail::BinaryKind;
using astrai::detail::CacheEntryData;
using astrai::detail::CacheMode;
using astrai::detail::CacheSharing;
using astrai::detail::check_kernel_binary;
using astrai::detail::DiskCache;
using astrai::detail::encode_entry;
using astrai::detail::EnvConfig;
using astrai::detail::JitEngine;
using astrai::detail::KernelKind;
using astrai::detail::KernelSpec;
using astrai::detail::LogLevel;
using astrai::detail::VariantSource;
using astrai::testing::config_for;
using astrai::testing::count_occurrences;
using astrai::testing::make_entry;
using astrai::testing::make_key;
using astrai::testing::QuietLog;
using astrai::testing::read_file;
using astrai::testing::TempDir;
using astrai::testing::write_file;

namespace {

constexpr uid_t kStranger = 1234;  // a uid that is not ours (nor root)

bool is_root() { return ::geteuid() == 0; }

KernelSpec rotary_spec(int head_dim = 64) {
  KernelSpec spec;
  spec.kind = KernelKind::rotary_emb;
  spec.dtype = DType::bf16;
  spec.head_dim = head_dim;
  spec.arch = "sm_80";
  return spec;
}

mode_t mode_of(const fs::path& path) {
  struct stat info {};
  REQUIRE(::lstat(path.c_str(), &info) == 0);
  return info.st_mode & 07777;
}

// Everything below `dir` (links not followed) with file contents and link targets: a file
// created, written or removed anywhere below it changes the snapshot.
std::map<std::string, std::string> snapshot(const fs::path& dir) {
  std::map<std::string, std::string> files;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::file_status status = it->symlink_status();
    if (fs::is_symlink(status))
      files[it->path().string()] = "-> " + fs::read_symlink(it->path()).string();
    else if (fs::is_regular_file(status))
      files[it->path().string()] = read_file(it->path());
    else
      files[it->path().string()] = "(dir)";
  }
  return files;
}

void chown_to(const fs::path& path, uid_t uid, gid_t gid = static_cast<gid_t>(-1)) {
  REQUIRE(::lchown(path.c_str(), uid, gid) == 0);
}

// Collects the log for the scope (warnings and above).
class LogCapture {
 public:
  explicit LogCapture(const fs::path& file)
      : old_level_(astrai::detail::Logger::instance().level()), capture_(file) {
    astrai::detail::Logger::instance().set_level(LogLevel::warn);
  }
  ~LogCapture() { finish(); }
  std::string finish() {
    std::string text = capture_.finish();
    astrai::detail::Logger::instance().set_level(old_level_);
    return text;
  }

 private:
  LogLevel old_level_;
  astrai::testing::StderrCapture capture_;
};

// A minimal 64-bit little-endian ELF: header, then `sections` section headers right after it.
std::vector<char> tiny_elf(std::uint16_t sections = 1) {
  std::vector<char> elf(64 + 64 * std::size_t{sections}, 0);
  elf[0] = 0x7f;
  elf[1] = 'E';
  elf[2] = 'L';
  elf[3] = 'F';
  elf[4] = 2;  // 64-bit
  elf[5] = 1;  // little endian
  auto put = [&elf](std::size_t at, std::uint64_t value, int bytes) {
    for (int i = 0; i < bytes; ++i) elf[at + i] = static_cast<char>((value >> (8 * i)) & 0xff);
  };
  put(40, 64, 8);        // e_shoff
  put(52, 64, 2);        // e_ehsize
  put(58, 64, 2);        // e_shentsize
  put(60, sections, 2);  // e_shnum
  return elf;
}

void put_le(std::vector<char>& bytes, std::size_t at, std::uint64_t value, int width) {
  for (int i = 0; i < width; ++i) bytes[at + i] = static_cast<char>((value >> (8 * i)) & 0xff);
}

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

std::string setpriv(uid_t uid, gid_t gid) {
  return fmt::format("setpriv --reuid={} --regid={} --clear-groups ", uid, gid);
}

}  // namespace

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
  CHECK(count_occurrences(output, "warn: waiting for compile lock " + make_key(1).hex() + ".lock held by "
                         "another process") == 1);
  CHECK(count_occurrences(output, "warn: waited 5500 ms for compile lock") == 1);
}

TEST_CASE("an entry file over 64 MiB is refused before it is read") {
  TempDir dir;
  DiskCache cache(dir.path() / "cache", CacheMode::read_write, 0);
  REQUIRE(cache.store(make_key(1), make_entry("huge.sm_80")));
  const fs::path path = cache.entry_path(make_key(1), "huge.sm_80");
  REQUIRE(::truncate(path.c_str(), static_cast<off_t>(astrai::detail::kMaxEntryFileBytes + 1)) == 0);
  LogCapture log(dir.path() / "log.txt");
  CHECK_FALSE(cache.load(make_key(1), "huge.sm_80").has_value());
  const std::string output = log.finish();
  CHECK(output.find("larger than the 64 MiB limit") != std::string::npos);
  // Storing one is refused too.
  QuietLog quiet;
  CHECK_FALSE(cache.store(make_key(2), make_entry("huge2.sm_80", astrai::detail::kMaxEntryFileBytes)));
}

TEST_CASE("an entry of another format version is a miss, never removed or called damaged") {
  QuietLog quiet;
  TempDir dir;
  DiskCache cache(dir.path() / "cache", CacheMode::read_write, 0);
  REQUIRE(cache.store(make_key(1), make_entry("future.sm_80")));
  const fs::path path = cache.entry_path(make_key(1), "future.sm_80");
  std::string bytes = read_file(path);
  bytes[8] = static_cast<char>(astrai::detail::kEntryFormatVersion + 1);
  write_file(path, bytes);
  CHECK(astrai::detail::is_other_entry_format(bytes.data(), bytes.size()));
  CHECK_FALSE(cache.load(make_key(1), "future.sm_80").has_value());
  CHECK(fs::exists(path));
  const auto checked = cache.verify(true);
  REQUIRE(checked.size() == 1);
  CHECK(checked[0].other_format);
  CHECK(checked[0].valid);
  CHECK(fs::exists(path));
}

TEST_CASE("kernel binaries are checked before they reach the driver") {
  std::string why;
  const char ptx[] = ".version 8.0\n.target sm_80\n";
  CHECK(check_kernel_binary(BinaryKind::ptx, ptx, sizeof ptx, &why));  // NUL included
  CHECK_FALSE(check_kernel_binary(BinaryKind::ptx, ptx, sizeof ptx - 1, &why));
  CHECK(why == "PTX text does not end in NUL");
  CHECK_FALSE(check_kernel_binary(BinaryKind::ptx, ptx, 0, &why));

  std::vector<char> elf = tiny_elf(2);
  CHECK(check_kernel_binary(BinaryKind::cubin, elf.data(), elf.size(), &why));
  CHECK_FALSE(check_kernel_binary(BinaryKind::cubin, elf.data(), 63, &why));
  CHECK(why == "cubin shorter than an ELF header");
  CHECK_FALSE(check_kernel_binary(BinaryKind::cubin, elf.data(), elf.size() - 1, &why));
  CHECK(why == "ELF section table lies outside the cubin");
  {
    auto bad = elf;
    put_le(bad, 40, ~std::uint64_t{0} - 10, 8);  // e_shoff near 2^64: no overflow
    CHECK_FALSE(check_kernel_binary(BinaryKind::cubin, bad.data(), bad.size(), &why));
    put_le(bad, 40, 64, 8);
    put_le(bad, 60, 0xffff, 2);
    CHECK_FALSE(check_kernel_binary(BinaryKind::cubin, bad.data(), bad.size(), &why));
  }
  {
    auto bad = elf;
    put_le(bad, 64 + 4, 1, 4);                 // section 0: SHT_PROGBITS
    put_le(bad, 64 + 24, 100, 8);              // offset
    put_le(bad, 64 + 32, ~std::uint64_t{0}, 8);  // size
    CHECK_FALSE(check_kernel_binary(BinaryKind::cubin, bad.data(), bad.size(), &why));
    CHECK(why == "an ELF section lies outside the cubin");
    put_le(bad, 64 + 4, 8, 4);  // SHT_NOBITS takes no file space
    CHECK(check_kernel_binary(BinaryKind::cubin, bad.data(), bad.size(), &why));
  }
  {
    auto bad = elf;
    bad[4] = 1;  // 32-bit
    CHECK_FALSE(check_kernel_binary(BinaryKind::cubin, bad.data(), bad.size(), &why));
    bad = elf;
    bad[1] = 'X';
    CHECK_FALSE(check_kernel_binary(BinaryKind::cubin, bad.data(), bad.size(), &why));
  }
}

TEST_CASE("a sound entry holding a malformed cubin is recompiled, never loaded") {
  QuietLog quiet;
  TempDir dir;
  const KernelSpec spec = rotary_spec();
  JitEngine engine(config_for(dir.path() / "cache"));
  CacheEntryData entry;
  entry.kind = BinaryKind::cubin;
  entry.variant_name = spec.name();
  entry.nvrtc_version = "x";
  std::vector<char> not_elf = tiny_elf(3);
  not_elf.resize(100);  // the section table no longer fits
  entry.payload = astrai::detail::encode_variant_payload({"kernel_symbol"}, not_elf);
  REQUIRE(engine.cache().store(engine.key_for(spec), entry));
  VariantSource source = VariantSource::memory;
  const auto variant = engine.get(spec, &source);
  CHECK(source == VariantSource::compiled);
  std::string why;
  CHECK(check_kernel_binary(variant->kind, variant->binary.data(), variant->binary.size(), &why));
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
    REQUIRE(source.store(make_key(1), make_entry("a.sm_80")));
    REQUIRE(source.store(make_key(2), make_entry("b.sm_80")));
    astrai::detail::export_cache(source, {}, dir.path() / "good.astrai");
  }
  const std::string good = read_file(dir.path() / "good.astrai");
  // A flipped payload byte: that entry is rejected, the other imported.
  std::string tampered = good;
  tampered[tampered.size() - 16 - 10] ^= 0x01;
  write_file(dir.path() / "tampered.astrai", tampered);
  DiskCache target(dir.path() / "dst", CacheMode::read_write, 0);
  const auto report = astrai::detail::import_archive(target, dir.path() / "tampered.astrai");
  CHECK(report.entries == 1);
  REQUIRE(report.problems.size() == 1);
  CHECK(report.problems[0].find("checksum mismatch") != std::string::npos);
  CHECK(target.list().size() == 1);

  write_file(dir.path() / "truncated.astrai", good.substr(0, good.size() - 3));
  CHECK_THROWS_AS(astrai::detail::import_archive(target, dir.path() / "truncated.astrai"),
                  astrai::Error);
  write_file(dir.path() / "garbage.astrai", "not an archive at all, no");
  CHECK_THROWS_WITH_AS(
      astrai::detail::import_archive(target, dir.path() / "garbage.astrai"),
      ("cache import: " + (dir.path() / "garbage.astrai").string() +
       " is not a sound archive: bad magic").c_str(),
      astrai::Error);
  std::string huge = good.substr(0, 24);
  huge += std::string("\x28\0\0\0", 4) + make_key(1).hex() + ".a.sm_80.cubin";
  huge += std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8);
  write_file(dir.path() / "huge.astrai", huge);
  CHECK_THROWS_AS(astrai::detail::import_archive(target, dir.path() / "huge.astrai"),
                  astrai::Error);
  CHECK_THROWS_AS(astrai::detail::import_archive(target, dir.path()), astrai::InvalidArgument);
}

TEST_CASE("a manifest must be a regular file of bounded size with bounded lines") {
  TempDir dir;
  const fs::path manifest = dir.path() / "manifest.txt";
  write_file(manifest, "# recorded\n  rotary_emb.bf16.hd64.sm_80  # one\n\nx\n");
  const auto lines = astrai::detail::read_manifest_lines(manifest);
  REQUIRE(lines.size() == 2);
  CHECK(lines[0].number == 2);
  CHECK(lines[0].text == "rotary_emb.bf16.hd64.sm_80");
  CHECK(lines[1].number == 4);

  REQUIRE(::mkfifo((dir.path() / "fifo").c_str(), 0600) == 0);
  CHECK_THROWS_WITH_AS(astrai::detail::read_manifest_lines(dir.path() / "fifo"),
                       ("--manifest: '" + (dir.path() / "fifo").string() +
                        "' is not a regular file").c_str(),
                       astrai::InvalidArgument);
  CHECK_THROWS_AS(astrai::detail::read_manifest_lines(dir.path()), astrai::InvalidArgument);
  write_file(manifest, "ok\n" + std::string(5000, 'A') + "\n");
  try {
    astrai::detail::read_manifest_lines(manifest);
    FAIL("a 5000-character line was accepted");
  } catch (const astrai::InvalidArgument& error) {
    const std::string message = error.what();
    CHECK(message.find(":2: line longer than 1024 characters") != std::string::npos);
    CHECK(message.size() < 400);  // the line is echoed cut short
  }
  CHECK(astrai::detail::echo_text(std::string("a\x1b[2Jb", 6)) == "a\\x1b[2Jb");
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
