#include <doctest/doctest.h>

#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "cache/disk_cache.hpp"
#include "cache/file_lock.hpp"
#include "tests/support/support.hpp"

namespace fs = std::filesystem;
using astrai::detail::CacheKey;
using astrai::detail::CacheMode;
using astrai::detail::DiskCache;
using astrai::detail::FileLock;
using astrai::testing::read_file;
using astrai::testing::TempDir;
using astrai::testing::write_file;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

namespace {

void append_marker(const std::string& path, char c) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return;
  (void)!::write(fd, &c, 1);
  ::close(fd);
}

// Child: take the lock, append 'B', hold it for <hold ms>, append 'E', release.
const bool kHoldChildRegistered = astrai::testing::register_child_action(
    "lock-hold-with-marker", [](const std::vector<std::string>& args) -> int {
      if (args.size() != 3) return 10;
      FileLock::Outcome outcome = FileLock::Outcome::unavailable;
      auto lock = FileLock::acquire(args[0], milliseconds(10000), &outcome);
      if (!lock || outcome != FileLock::Outcome::acquired) return 20;
      append_marker(args[1], 'B');
      std::this_thread::sleep_for(milliseconds(std::stoi(args[2])));
      append_marker(args[1], 'E');
      return 0;
    });

// Child: take the lock, announce it through a file, then hold it until killed.
const bool kForeverChildRegistered = astrai::testing::register_child_action(
    "lock-hold-until-killed", [](const std::vector<std::string>& args) -> int {
      if (args.size() != 2) return 10;
      auto lock = FileLock::acquire(args[0], milliseconds(10000), nullptr);
      if (!lock) return 20;
      append_marker(args[1], 'R');
      std::this_thread::sleep_for(std::chrono::seconds(60));
      return 0;
    });

// Polls until `path` has at least `size` bytes; false after 10 s.
bool wait_for_file_size(const fs::path& path, std::uintmax_t size) {
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (Clock::now() < deadline) {
    std::error_code ec;
    if (fs::file_size(path, ec) >= size && !ec) return true;
    std::this_thread::sleep_for(milliseconds(2));
  }
  return false;
}

long elapsed_ms(Clock::time_point start) {
  return static_cast<long>(
      std::chrono::duration_cast<milliseconds>(Clock::now() - start).count());
}

}  // namespace

TEST_SUITE("cache") {

TEST_CASE("a file lock is exclusive, times out for a second holder and is reusable after release") {
  TempDir dir;
  const fs::path path = dir.path() / "locks" / "key.lock";  // parent is created on demand
  FileLock::Outcome outcome = FileLock::Outcome::unavailable;
  auto first = FileLock::acquire(path, milliseconds(100), &outcome);
  REQUIRE(first != nullptr);
  CHECK(outcome == FileLock::Outcome::acquired);
  CHECK(fs::exists(path));

  // flock belongs to the open file description, so a second acquire in this process conflicts.
  outcome = FileLock::Outcome::acquired;
  CHECK(FileLock::acquire(path, milliseconds(0), &outcome) == nullptr);
  CHECK(outcome == FileLock::Outcome::timed_out);
  const auto start = Clock::now();
  CHECK(FileLock::acquire(path, milliseconds(40), &outcome) == nullptr);
  CHECK(outcome == FileLock::Outcome::timed_out);
  CHECK(elapsed_ms(start) >= 40);
  CHECK(elapsed_ms(start) < 1000);

  first.reset();
  CHECK(fs::exists(path));  // never unlinked: waiters must keep locking the same inode
  auto again = FileLock::acquire(path, milliseconds(0), nullptr);  // outcome is optional
  CHECK(again != nullptr);
}

TEST_CASE("processes holding the same lock never overlap") {
  TempDir dir;
  const fs::path lock = dir.path() / "shared.lock";
  const fs::path marker = dir.path() / "marker";
  std::vector<int> pids;
  for (int i = 0; i < 4; ++i)
    pids.push_back(astrai::testing::spawn_child("lock-hold-with-marker",
                                                {lock.string(), marker.string(), "50"}));
  for (int pid : pids) CHECK(astrai::testing::wait_child(pid) == 0);
  // Each holder writes B ... E; any overlap would show up as "BB".
  CHECK(read_file(marker) == "BEBEBEBE");
}

TEST_CASE("a waiting process gets the lock right after the holder releases it") {
  TempDir dir;
  const fs::path lock = dir.path() / "handoff.lock";
  const fs::path marker = dir.path() / "marker";
  const int pid = astrai::testing::spawn_child("lock-hold-with-marker",
                                               {lock.string(), marker.string(), "150"});
  REQUIRE(wait_for_file_size(marker, 1));

  FileLock::Outcome outcome = FileLock::Outcome::acquired;
  CHECK(FileLock::acquire(lock, milliseconds(0), &outcome) == nullptr);
  CHECK(outcome == FileLock::Outcome::timed_out);  // held by another process

  const auto start = Clock::now();
  auto held = FileLock::acquire(lock, milliseconds(5000), &outcome);
  REQUIRE(held != nullptr);
  CHECK(outcome == FileLock::Outcome::acquired);
  CHECK(read_file(marker) == "BE");  // the child finished its critical section first
  CHECK(elapsed_ms(start) < 4000);
  CHECK(astrai::testing::wait_child(pid) == 0);
}

TEST_CASE("a holder killed with SIGKILL does not block the next acquire") {
  TempDir dir;
  const fs::path lock = dir.path() / "killed.lock";
  const fs::path ready = dir.path() / "ready";
  const int pid = astrai::testing::spawn_child("lock-hold-until-killed",
                                               {lock.string(), ready.string()});
  REQUIRE(wait_for_file_size(ready, 1));

  FileLock::Outcome outcome = FileLock::Outcome::acquired;
  CHECK(FileLock::acquire(lock, milliseconds(20), &outcome) == nullptr);
  CHECK(outcome == FileLock::Outcome::timed_out);

  REQUIRE(::kill(pid, SIGKILL) == 0);
  CHECK(astrai::testing::wait_child(pid) == 128 + SIGKILL);
  CHECK(fs::exists(lock));  // the stale file is still there, but nobody holds it

  // The kernel released the dead holder's lock: the very first attempt succeeds, no waiting.
  auto held = FileLock::acquire(lock, milliseconds(0), &outcome);
  CHECK(held != nullptr);
  CHECK(outcome == FileLock::Outcome::acquired);
}

TEST_CASE("a lock in a directory that cannot be written is unavailable") {
  TempDir dir;
  const fs::path file = dir.path() / "plain_file";
  write_file(file, "x");
  for (const fs::path& path : {file / "key.lock", file / "sub" / "key.lock",
                               fs::path("/proc/astrai-jit-no-such-dir/key.lock")}) {
    CAPTURE(path);
    FileLock::Outcome outcome = FileLock::Outcome::acquired;
    const auto start = Clock::now();
    CHECK(FileLock::acquire(path, milliseconds(1000), &outcome) == nullptr);
    CHECK(outcome == FileLock::Outcome::unavailable);
    CHECK(elapsed_ms(start) < 500);  // no polling when the file cannot even be opened
  }

  // A directory the caller cannot write: checked in a child, which gives up root first (root
  // ignores permission bits), so the check runs whoever runs the suite.
  const fs::path protected_dir = dir.path() / "readonly";
  fs::create_directories(protected_dir);
  fs::permissions(protected_dir, fs::perms(0555));
  fs::permissions(dir.path(), fs::perms(0755));
  const int pid = astrai::testing::spawn_child("lock-in-read-only-dir", {(protected_dir / "key.lock").string()});
  CHECK(astrai::testing::wait_child(pid) == 0);
}

constexpr uid_t kOtherUser = 65534;  // nobody

const bool kReadOnlyLockChildRegistered = astrai::testing::register_child_action(
    "lock-in-read-only-dir", [](const std::vector<std::string>& args) -> int {
      if (args.size() != 1) return 10;
      if (::geteuid() == 0 && (::setgroups(0, nullptr) != 0 || ::setresgid(kOtherUser, kOtherUser, kOtherUser) != 0 ||
                               ::setresuid(kOtherUser, kOtherUser, kOtherUser) != 0))
        return 11;
      if (::access(fs::path(args[0]).parent_path().c_str(), W_OK) == 0) return 12;  // still writable
      FileLock::Outcome outcome = FileLock::Outcome::acquired;
      if (FileLock::acquire(args[0], milliseconds(100), &outcome) != nullptr) return 13;
      return outcome == FileLock::Outcome::unavailable ? 0 : 14;
    });

TEST_CASE("the disk cache hands out one compile lock per key at a time") {
  TempDir dir;
  DiskCache cache(dir.path(), CacheMode::read_write, 0);
  CacheKey key;
  key.high = 0xabcdef;
  key.low = 42;
  CacheKey other = key;
  other.low = 43;

  auto first = cache.lock_key(key, milliseconds(100));
  REQUIRE(first != nullptr);
  CHECK(fs::exists(dir.path() / "v1" / "locks" / (key.hex() + ".lock")));
  const auto start = Clock::now();
  CHECK(cache.lock_key(key, milliseconds(30)) == nullptr);  // timed out: caller compiles anyway
  CHECK(elapsed_ms(start) >= 30);
  auto unrelated = cache.lock_key(other, milliseconds(0));
  CHECK(unrelated != nullptr);
  first.reset();
  CHECK(cache.lock_key(key, milliseconds(0)) != nullptr);
  // Locks are not entries.
  CHECK(cache.list().empty());
}

}  // TEST_SUITE
