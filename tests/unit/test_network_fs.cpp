// Cache directories on network file systems (ASTRAI_JIT_CACHE_NFS, cache/network_fs.hpp): no
// flock() there, publish by atomic rename, a bounded duplicate compile.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <thread>
#include <vector>

#include "astrai/error.hpp"
#include "cache/disk_cache.hpp"
#include "cache/network_fs.hpp"
#include "runtime/env_config.hpp"
#include "runtime/jit_engine.hpp"
#include "tests/support/cache_support.hpp"
#include "tests/support/specs.hpp"

namespace fs = std::filesystem;
using astrai::detail::CacheMode;
using astrai::detail::DiskCache;
using astrai::detail::JitEngine;
using astrai::detail::NetworkFsMode;
using astrai::testing::TempDir;

TEST_SUITE("network_fs") {

TEST_CASE("network and cluster file system types are told from local ones") {
  for (long type : {0x6969L, 0xff534d42L, 0xfe534d42L, 0x517bL, 0x0bd00bd0L, 0x47504653L,
                    0x00c36400L, 0x65735546L})
    CHECK(astrai::detail::is_network_fs_type(type));
  // ext4, tmpfs, xfs, btrfs, overlayfs
  for (long type : {0xef53L, 0x01021994L, 0x58465342L, 0x9123683eL, 0x794c7630L})
    CHECK_FALSE(astrai::detail::is_network_fs_type(type));
}

TEST_CASE("ASTRAI_JIT_CACHE_NFS takes auto, on and off") {
  CHECK(astrai::detail::parse_env_config({}).cache_nfs == NetworkFsMode::automatic);
  CHECK(astrai::detail::parse_env_config({"ASTRAI_JIT_CACHE_NFS=On"}).cache_nfs ==
        NetworkFsMode::on);
  CHECK(astrai::detail::parse_env_config({"ASTRAI_JIT_CACHE_NFS=off"}).cache_nfs ==
        NetworkFsMode::off);
  CHECK_THROWS_WITH_AS(astrai::detail::parse_env_config({"ASTRAI_JIT_CACHE_NFS=maybe"}),
                       "ASTRAI_JIT_CACHE_NFS=maybe is not valid (allowed: auto, on, off)",
                       astrai::ConfigError);
}

TEST_CASE("on a network file system the cache takes no compile lock; off, it does") {
  TempDir dir;
  DiskCache cache(dir.path(), CacheMode::read_write, 0);
  const auto key = astrai::testing::make_key(7);

  cache.set_network_mode(NetworkFsMode::on);
  CHECK(cache.on_network_fs());
  CHECK(cache.lock_key(key, std::chrono::milliseconds(100)) == nullptr);
  CHECK_FALSE(fs::exists(dir.path() / "v1" / "locks"));

  cache.set_network_mode(NetworkFsMode::off);
  CHECK_FALSE(cache.on_network_fs());
  CHECK(cache.lock_key(key, std::chrono::milliseconds(100)) != nullptr);

  // automatic follows the root's file system type.
  const int fd = ::open(dir.path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  const bool network = astrai::detail::on_network_fs(fd);
  ::close(fd);
  cache.set_network_mode(NetworkFsMode::automatic);
  CHECK(cache.on_network_fs() == network);
}

TEST_CASE("two engines racing on a lock-free cache each get a whole entry, compiling at most twice") {
  astrai::testing::QuietLog quiet;
  TempDir dir;
  auto config = astrai::testing::config_for(dir.path());
  config.cache_nfs = NetworkFsMode::on;
  const auto spec = astrai::testing::rotary_spec(astrai::DType::fp16, 208, "sm_80");
  std::vector<std::unique_ptr<JitEngine>> engines;
  for (int i = 0; i < 2; ++i) engines.push_back(std::make_unique<JitEngine>(config));
  std::vector<std::thread> threads;
  for (auto& engine : engines) threads.emplace_back([&engine, &spec] { engine->get(spec); });
  for (auto& thread : threads) thread.join();
  CHECK(engines[0]->counters().compiles + engines[1]->counters().compiles >= 1);
  CHECK(engines[0]->counters().compiles + engines[1]->counters().compiles <= 2);
  DiskCache check(dir.path(), CacheMode::read_only, 0);
  const auto entries = check.verify(false);
  REQUIRE(entries.size() == 1);
  CHECK(entries[0].valid);
  JitEngine later(config);
  later.get(spec);
  CHECK(later.counters().compiles == 0);
}

}  // TEST_SUITE
