// The remote cache tier (ASTRAI_JIT_REMOTE) against real servers on 127.0.0.1: redis-server and
// nginx with a WebDAV location (tests/unit/remote_servers.hpp). Compiles are real NVRTC compiles
// of rotary variants, the cheapest there are.
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "astrai/cache_metrics.hpp"
#include "astrai/error.hpp"
#include "cache/cache_entry.hpp"
#include "cache/remote_store.hpp"
#include "cache/remote_tier.hpp"
#include "runtime/env_config.hpp"
#include "runtime/jit_engine.hpp"
#include "tests/support/cache_support.hpp"
#include "tests/support/specs.hpp"
#include "tests/unit/remote_servers.hpp"

namespace fs = std::filesystem;
using astrai::DType;
using astrai::detail::EnvConfig;
using astrai::detail::JitEngine;
using astrai::detail::KernelSpec;
using astrai::detail::LeaseOutcome;
using astrai::detail::RemoteEndpoint;
using astrai::detail::RemoteOptions;
using astrai::detail::RemoteStatus;
using astrai::detail::RemoteTier;
using astrai::detail::RemoteTierOptions;
using astrai::detail::VariantSource;
using astrai::testing::LocalServer;
using astrai::testing::LogCapture;
using astrai::testing::QuietLog;
using astrai::testing::TempDir;

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

EnvConfig remote_config(const fs::path& cache_dir, const std::string& remote,
                        int timeout_ms = 300) {
  EnvConfig config = astrai::detail::parse_env_config(
      {"ASTRAI_JIT_CACHE_DIR=" + cache_dir.string(), "ASTRAI_JIT_REMOTE=" + remote,
       "ASTRAI_JIT_REMOTE_TIMEOUT_MS=" + std::to_string(timeout_ms)});
  return config;
}

KernelSpec rotary(int head_dim, DType dtype = DType::bf16) {
  return astrai::testing::rotary_spec(dtype, head_dim, "sm_80");
}

RemoteEndpoint endpoint_of(const std::string& url) {
  std::vector<RemoteEndpoint> endpoints;
  std::string why;
  REQUIRE(astrai::detail::parse_remote_endpoints(url, &endpoints, &why));
  REQUIRE(endpoints.size() == 1);
  return endpoints[0];
}

std::string file_name_of(JitEngine& engine, const KernelSpec& spec) {
  return engine.key_for(spec).hex() + "." + spec.name() + ".cubin";
}

// Node A compiles and publishes; node B, on a fresh cache, gets the variant without compiling,
// keeps it in its cache, and a third engine on B's cache finds it there.
void check_second_node_compiles_nothing(const std::string& url) {
  TempDir a;
  TempDir b;
  const KernelSpec spec = rotary(64);
  {
    JitEngine node_a(remote_config(a.path(), url));
    VariantSource source = VariantSource::memory;
    node_a.get(spec, &source);
    CHECK(source == VariantSource::compiled);
    CHECK(node_a.counters().compiles == 1);
    REQUIRE(node_a.remote()->flush(std::chrono::seconds(5)));
    CHECK(node_a.remote()->counters().published == 1);
  }
  JitEngine node_b(remote_config(b.path(), url));
  VariantSource source = VariantSource::memory;
  const auto variant = node_b.get(spec, &source);
  REQUIRE(variant);
  CHECK(source == VariantSource::remote);
  CHECK(node_b.counters().compiles == 0);
  CHECK(node_b.counters().remote_hits == 1);
  CHECK(node_b.remote()->counters().hits == 1);
  CHECK(node_b.cache().contains(variant->key, spec.name()));

  JitEngine again(astrai::testing::config_for(b.path()));
  again.get(spec, &source);
  CHECK(source == VariantSource::disk);
  CHECK(again.counters().compiles == 0);
}

// p50/p99 of `count` fetches of one entry through the tier, printed with the store's kind.
void report_fetch_times(const std::string& url, const std::string& file_name) {
  RemoteTierOptions options;
  options.store.max_entry_bytes = astrai::detail::kMaxEntryFileBytes;
  RemoteTier tier({endpoint_of(url)}, options);
  std::vector<double> times;
  for (int i = 0; i < 200; ++i) {
    const auto start = Clock::now();
    REQUIRE(tier.fetch(file_name));
    times.push_back(ms_since(start));
  }
  std::sort(times.begin(), times.end());
  MESSAGE(url.substr(0, url.find(':')) << " fetch of a rotary entry on localhost, 200 fetches: p50 "
                                       << times[100] << " ms, p99 " << times[198] << " ms");
  CHECK(times[100] < 50.0);
}

// Child: an engine on the cache args[0] with the remote args[1] gets the variant args[2], then
// exits (its queued publish goes out as the engine is destroyed). Exit 10: it compiled; 11: it
// came from the remote; anything else: a failure.
const bool kRemoteGetChild = astrai::testing::register_child_action(
    "remote-get", [](const std::vector<std::string>& args) -> int {
      if (args.size() != 3) return 2;
      astrai::detail::Logger::instance().set_level(astrai::detail::LogLevel::off);
      JitEngine engine(remote_config(args[0], args[1]));
      VariantSource source = VariantSource::memory;
      engine.get(KernelSpec::parse(args[2]), &source);
      if (source == VariantSource::compiled && engine.counters().compiles == 1) return 10;
      if (source == VariantSource::remote && engine.counters().compiles == 0) return 11;
      return 3;
    });

}  // namespace

TEST_SUITE("remote") {

TEST_CASE("two processes on fresh caches sharing one Redis: the second compiles nothing") {
  ASTRAI_START_SERVER(redis, redis);
  TempDir a;
  TempDir b;
  const std::string spec = rotary(176).name();
  // The first process exits right after its compile: its publish goes out at exit.
  CHECK(astrai::testing::wait_child(astrai::testing::spawn_child(
            "remote-get", {a.path().string(), redis->url(), spec})) == 10);
  CHECK(astrai::testing::wait_child(astrai::testing::spawn_child(
            "remote-get", {b.path().string(), redis->url(), spec})) == 11);
}


TEST_CASE("ASTRAI_JIT_REMOTE takes Redis and HTTP URLs and names what it refuses") {
  std::vector<RemoteEndpoint> list;
  std::string why;
  REQUIRE(astrai::detail::parse_remote_endpoints(
      " redis://:s3cret@10.0.0.5:6380/2 , http://cache.internal/astrai/ ,https://u:p@h:8443", &list,
      &why));
  REQUIRE(list.size() == 3);
  CHECK(list[0].kind == RemoteEndpoint::Kind::redis);
  CHECK(list[0].host == "10.0.0.5");
  CHECK(list[0].port == 6380);
  CHECK(list[0].database == 2);
  CHECK(list[0].password == "s3cret");
  CHECK(list[0].shown == "redis://10.0.0.5:6380/2");
  CHECK(list[1].kind == RemoteEndpoint::Kind::http);
  CHECK(list[1].base_url == "http://cache.internal/astrai");
  CHECK(list[2].base_url == "https://u:p@h:8443");
  CHECK(list[2].shown == "https://h:8443");

  for (const char* bad : {"ftp://host/x", "redis://host:99999", "redis://host/abc", "host:6379",
                          "http://", "http://h/x?y=1"})
    CHECK_FALSE(astrai::detail::parse_remote_endpoints(bad, &list, &why));

  CHECK_THROWS_WITH_AS(astrai::detail::parse_env_config({"ASTRAI_JIT_REMOTE=redis://:pw@h:0"}),
                       doctest::Contains("ASTRAI_JIT_REMOTE is not valid: item 1: the port is "
                                         "not a number in 1..65535 (allowed: a comma-separated "
                                         "list of redis://"),
                       astrai::ConfigError);
  CHECK_THROWS_WITH_AS(
      astrai::detail::parse_env_config({"ASTRAI_JIT_REMOTE_TIMEOUT_MS=0"}),
      "ASTRAI_JIT_REMOTE_TIMEOUT_MS=0 is not valid (allowed: a whole number of milliseconds in "
      "1..60000)",
      astrai::ConfigError);
  CHECK_THROWS_AS(astrai::detail::parse_env_config({"ASTRAI_JIT_REMOTE_LEASE_MS=-5"}),
                  astrai::ConfigError);
  const EnvConfig config = astrai::detail::parse_env_config(
      {"ASTRAI_JIT_REMOTE=redis://:pw@h:7000", "ASTRAI_JIT_REMOTE_LEASE_MS=0"});
  CHECK(config.remote_lease.count() == 0);
  CHECK(config.unknown_variables.empty());
  // `info` shows the variables set: never the password.
  for (const auto& [name, value] : config.variables_set)
    if (name == "ASTRAI_JIT_REMOTE") CHECK(value == "redis://h:7000/0");
}

TEST_CASE("two nodes on fresh caches sharing one Redis: the second compiles nothing") {
  ASTRAI_START_SERVER(redis, redis);
  check_second_node_compiles_nothing(redis->url());
  TempDir dir;
  JitEngine engine(remote_config(dir.path(), redis->url()));
  report_fetch_times(redis->url(), file_name_of(engine, rotary(64)));
}

TEST_CASE("two nodes on fresh caches sharing an nginx WebDAV location: the second compiles nothing") {
  ASTRAI_START_SERVER(nginx, nginx_dav);
  check_second_node_compiles_nothing(nginx->url());
  TempDir dir;
  JitEngine engine(remote_config(dir.path(), nginx->url()));
  report_fetch_times(nginx->url(), file_name_of(engine, rotary(64)));
}

TEST_CASE("a remote killed mid-run costs one warning and no failed call") {
  ASTRAI_START_SERVER(redis, redis);
  TempDir dir;
  TempDir log_dir;
  LogCapture capture(log_dir.path() / "log");
  JitEngine engine(remote_config(dir.path(), redis->url(), 200));
  engine.get(rotary(32));
  REQUIRE(engine.remote()->flush(std::chrono::seconds(5)));
  const std::uint64_t errors_before = astrai::cache_metrics().remote_errors;
  redis->kill();
  const auto start = Clock::now();
  VariantSource source = VariantSource::memory;
  CHECK_NOTHROW(engine.get(rotary(48), &source));
  CHECK(source == VariantSource::compiled);
  CHECK_NOTHROW(engine.get(rotary(80), &source));
  CHECK(source == VariantSource::compiled);
  const double elapsed = ms_since(start);
  engine.remote()->flush(std::chrono::seconds(5));
  const std::string log = capture.finish();
  CHECK(astrai::testing::count_occurrences(log, "is unavailable") == 1);
  CHECK(engine.remote()->counters().errors >= 1);
  // The process-wide metrics see the remote's failure too.
  CHECK(astrai::cache_metrics().remote_errors > errors_before);
  CHECK(engine.counters().compiles == 3);
  MESSAGE("two compiles with the remote down took " << elapsed << " ms");
}

TEST_CASE("a remote that never answers costs one timeout, then is left alone") {
  astrai::testing::SilentServer silent;
  REQUIRE(silent.port() > 0);
  QuietLog quiet;
  RemoteTierOptions options;
  options.store.timeout = std::chrono::milliseconds(150);
  options.store.max_entry_bytes = 1 << 20;
  options.exit_flush = std::chrono::milliseconds(300);
  for (const std::string scheme : {"redis", "http"}) {
    CAPTURE(scheme);
    const auto built = Clock::now();
    {
      RemoteTier tier({endpoint_of(scheme + "://127.0.0.1:" + std::to_string(silent.port()))},
                      options);
      auto start = Clock::now();
      CHECK_FALSE(tier.fetch("00000000000000000000000000000000.x.cubin"));
      const double first = ms_since(start);
      CHECK(first >= 100);
      CHECK(first < 1000);
      start = Clock::now();
      CHECK_FALSE(tier.fetch("00000000000000000000000000000000.x.cubin"));
      CHECK(ms_since(start) < 5);  // left alone: no second timeout
      CHECK(tier.counters().errors == 1);
      CHECK_FALSE(tier.any_available());
      for (int i = 0; i < 10; ++i) tier.publish("x" + std::to_string(i), std::vector<char>(64, 'x'));
    }
    // The queued publishes are dropped at exit without waiting on the store.
    CHECK(ms_since(built) < 2000);
  }
}

TEST_CASE("eight threads asking a remote that never answers wait for one timeout, not eight") {
  astrai::testing::SilentServer silent;
  REQUIRE(silent.port() > 0);
  QuietLog quiet;
  RemoteTierOptions options;
  options.store.timeout = std::chrono::milliseconds(200);
  options.store.max_entry_bytes = 1 << 20;
  RemoteTier tier({endpoint_of("redis://127.0.0.1:" + std::to_string(silent.port()))}, options);
  const auto start = Clock::now();
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i)
    threads.emplace_back([&tier, i] { tier.fetch(std::to_string(i) + ".cubin"); });
  for (auto& thread : threads) thread.join();
  const double elapsed = ms_since(start);
  CHECK(elapsed < 600);
  CHECK(tier.counters().errors == 1);
  CHECK(tier.counters().misses == 8);
}

TEST_CASE("poisoned, truncated, wrong-variant and oversized remote entries are refused") {
  ASTRAI_START_SERVER(redis, redis);
  QuietLog quiet;
  RemoteOptions store_options;
  store_options.max_entry_bytes = astrai::detail::kMaxEntryFileBytes;
  auto store = astrai::detail::make_remote_store(endpoint_of(redis->url()), store_options);

  // A sound entry of one variant, published by a node.
  TempDir source_dir;
  JitEngine publisher(remote_config(source_dir.path(), redis->url()));
  const KernelSpec good = rotary(96);
  publisher.get(good);
  REQUIRE(publisher.remote()->flush(std::chrono::seconds(5)));
  const auto sound = store->get(file_name_of(publisher, good));
  REQUIRE(sound.status == RemoteStatus::hit);

  struct Poison {
    std::string what;
    KernelSpec spec;
    std::vector<char> bytes;
  };
  REQUIRE(sound.bytes.size() > 256);
  std::vector<char> flipped = sound.bytes;
  flipped.at(flipped.size() - 20) ^= 0x5a;
  std::vector<char> truncated(sound.bytes.begin(), sound.bytes.begin() + sound.bytes.size() / 2);
  const std::vector<Poison> cases = {
      {"a flipped payload byte", rotary(112), flipped},
      {"a truncated entry", rotary(128), truncated},
      {"another variant's entry", rotary(144), sound.bytes},
  };
  for (const auto& poison : cases) {
    CAPTURE(poison.what);
    TempDir dir;
    JitEngine victim(remote_config(dir.path(), redis->url()));
    REQUIRE(store->put(file_name_of(victim, poison.spec), poison.bytes).status ==
            RemoteStatus::hit);
    VariantSource source = VariantSource::memory;
    const auto variant = victim.get(poison.spec, &source);
    CHECK(source == VariantSource::compiled);
    CHECK(victim.counters().compiles == 1);
    CHECK(victim.counters().remote_hits == 0);
    CHECK(victim.remote()->counters().rejected == 1);
    // What the cache holds is the local compile, not the remote's bytes.
    const auto loaded = astrai::testing::read_file(victim.cache().entry_path(variant->key, poison.spec.name()));
    CHECK(std::vector<char>(loaded.begin(), loaded.end()) != poison.bytes);
  }

  // Over the cap: refused before it is read whole (GETRANGE stops one byte past the cap).
  RemoteOptions small = store_options;
  small.max_entry_bytes = 1000;
  auto capped = astrai::detail::make_remote_store(endpoint_of(redis->url()), small);
  const auto oversized = capped->get(file_name_of(publisher, good));
  CHECK(oversized.status == RemoteStatus::miss);
  CHECK(oversized.bytes.empty());
  CHECK(oversized.why.find("larger than the 1000 byte cap") != std::string::npos);
}

TEST_CASE("an oversized HTTP entry is refused without being read whole") {
  ASTRAI_START_SERVER(nginx, nginx_dav);
  RemoteOptions options;
  options.max_entry_bytes = 1 << 20;
  auto store = astrai::detail::make_remote_store(endpoint_of(nginx->url()), options);
  CHECK(store->get("00000000000000000000000000000000.none.cubin").status == RemoteStatus::miss);
  REQUIRE(store->put("big.cubin", std::vector<char>(3 << 20, 'z')).status == RemoteStatus::hit);
  const auto reply = store->get("big.cubin");
  CHECK(reply.status == RemoteStatus::miss);
  CHECK(reply.bytes.empty());
  CHECK(reply.why.find("cap") != std::string::npos);
  REQUIRE(store->put("small.cubin", std::vector<char>(1000, 'y')).status == RemoteStatus::hit);
  CHECK(store->get("small.cubin").bytes == std::vector<char>(1000, 'y'));
}

TEST_CASE("four nodes compiling one key at once against one Redis compile it once") {
  ASTRAI_START_SERVER(redis, redis);
  QuietLog quiet;
  const KernelSpec spec = rotary(160);
  std::vector<std::unique_ptr<TempDir>> dirs;
  std::vector<std::unique_ptr<JitEngine>> nodes;
  for (int i = 0; i < 4; ++i) {
    dirs.push_back(std::make_unique<TempDir>());
    nodes.push_back(std::make_unique<JitEngine>(remote_config(dirs.back()->path(), redis->url())));
  }
  std::vector<std::thread> threads;
  std::vector<VariantSource> sources(4, VariantSource::memory);
  for (int i = 0; i < 4; ++i)
    threads.emplace_back([&, i] { nodes[i]->get(spec, &sources[i]); });
  for (auto& thread : threads) thread.join();
  std::uint64_t compiles = 0;
  std::uint64_t waits = 0;
  for (const auto& node : nodes) {
    compiles += node->counters().compiles;
    waits += node->remote()->counters().lease_waits;
  }
  CHECK(compiles == 1);
  CHECK(waits == 3);
  CHECK(std::count(sources.begin(), sources.end(), VariantSource::remote) == 3);
}

TEST_CASE("a forked child publishes through its own connection and thread") {
  for (const std::string kind : {"redis", "http"}) {
    CAPTURE(kind);
    std::string why;
    auto server = kind == "redis" ? LocalServer::redis(&why) : LocalServer::nginx_dav(&why);
    if (!server) {
      if (astrai::testing::servers_required()) FAIL("ASTRAI_REQUIRE_SERVERS=1: " << why);
      MESSAGE("skipped: " << why);
      continue;
    }
    RemoteTierOptions options;
    options.store.max_entry_bytes = 1 << 20;
    RemoteTier tier({endpoint_of(server->url())}, options);
    tier.publish("parent.cubin", std::vector<char>(100, 'p'));
    REQUIRE(tier.flush(std::chrono::seconds(5)));
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      tier.publish("child.cubin", std::vector<char>(100, 'c'));
      const bool flushed = tier.flush(std::chrono::seconds(5));
      const auto fetched = tier.fetch("parent.cubin");
      ::_exit(flushed && fetched && *fetched == std::vector<char>(100, 'p') ? 0 : 1);
    }
    int status = 0;
    ::waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    // The parent's connection still works after the child used the store.
    const auto child_entry = tier.fetch("child.cubin");
    REQUIRE(child_entry);
    CHECK(*child_entry == std::vector<char>(100, 'c'));
  }
}

TEST_CASE("a lease is released only by its holder and expires by itself") {
  ASTRAI_START_SERVER(redis, redis);
  RemoteOptions options;
  options.max_entry_bytes = 1 << 20;
  auto store = astrai::detail::make_remote_store(endpoint_of(redis->url()), options);
  const std::string key(32, 'a');
  std::string why;
  const auto length = std::chrono::milliseconds(300);
  CHECK(store->try_lease(key, length, "one", &why) == LeaseOutcome::acquired);
  CHECK(store->try_lease(key, length, "two", &why) == LeaseOutcome::held);
  store->release(key, "two");  // not the holder: nothing happens
  CHECK(store->try_lease(key, length, "two", &why) == LeaseOutcome::held);
  store->release(key, "one");
  CHECK(store->try_lease(key, length, "two", &why) == LeaseOutcome::acquired);
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  CHECK(store->try_lease(key, length, "three", &why) == LeaseOutcome::acquired);
}

}  // TEST_SUITE
