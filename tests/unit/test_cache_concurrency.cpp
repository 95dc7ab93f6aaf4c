// DiskCache under concurrent use: threads storing, loading and clearing one cache.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "cache/disk_cache.hpp"
#include "tests/support/cache_support.hpp"
#include "tests/support/support.hpp"

using astrai::detail::CacheEntryData;
using astrai::detail::CacheKey;
using astrai::detail::CacheMode;
using astrai::detail::DiskCache;
using astrai::testing::TempDir;
using astrai::testing::count_temp_files;
using astrai::testing::make_entry;
using astrai::testing::make_key;
using astrai::testing::QuietLog;
using astrai::testing::same_entry;

TEST_SUITE("cache") {

TEST_CASE("eight threads storing and loading shared and private keys stay consistent") {
  TempDir dir;
  DiskCache cache(dir.path(), CacheMode::read_write, 0);
  const CacheEntryData shared = make_entry("shared.sm_90a", 20000, 77);
  constexpr int kThreads = 8;
  constexpr int kRounds = 25;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < kRounds; ++round) {
        const CacheKey own_key = make_key(1000 + t * kRounds + round);
        const CacheEntryData own = make_entry("own.sm_90a", 1000 + t * 10, t * 1000 + round);
        if (!cache.store(make_key(0), shared)) ++failures;
        if (!cache.store(own_key, own)) ++failures;
        auto loaded_shared = cache.load(make_key(0), shared.variant_name);
        if (!loaded_shared || !same_entry(*loaded_shared, shared)) ++failures;
        auto loaded_own = cache.load(own_key, own.variant_name);
        if (!loaded_own || !same_entry(*loaded_own, own)) ++failures;
        if (round % 8 == 0) (void)cache.stats();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  CHECK(failures.load() == 0);
  CHECK(cache.usable_for_write());
  CHECK(count_temp_files(dir.path()) == 0);

  const auto checked = cache.verify(false);
  CHECK(checked.size() == 1 + kThreads * kRounds);
  CHECK(std::all_of(checked.begin(), checked.end(), [](const auto& e) { return e.valid; }));
  for (int t = 0; t < kThreads; ++t) {
    for (int round = 0; round < kRounds; ++round) {
      auto loaded = cache.load(make_key(1000 + t * kRounds + round), "own.sm_90a");
      REQUIRE(loaded.has_value());
      CHECK(same_entry(*loaded, make_entry("own.sm_90a", 1000 + t * 10, t * 1000 + round)));
    }
  }
}

TEST_CASE("maintenance tolerates entries vanishing while other threads store and clear") {
  QuietLog quiet;
  TempDir dir;
  DiskCache cache(dir.path(), CacheMode::read_write, 8000);
  std::atomic<bool> stop{false};
  std::atomic<int> exceptions{0};
  std::atomic<int> bad_loads{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; !stop.load(); ++i) {
        try {
          const CacheEntryData entry = make_entry("race.sm_90", 500, t);
          cache.store(make_key(t * 100000 + i % 50), entry);
          auto loaded = cache.load(make_key(t * 100000 + (i + 25) % 50), entry.variant_name);
          if (loaded && !same_entry(*loaded, entry)) ++bad_loads;
        } catch (...) {
          ++exceptions;
        }
      }
    });
  }
  threads.emplace_back([&] {
    for (int i = 0; !stop.load(); ++i) {
      try {
        (void)cache.list();
        (void)cache.stats();
        (void)cache.verify(i % 2 == 0);
        (void)cache.prune(4000);
        if (i % 5 == 0) (void)cache.clear();
      } catch (...) {
        ++exceptions;
      }
      // clear() also deletes in-flight temp files; store() retries that a few times, so keep
      // the clearing rate merely aggressive rather than continuous.
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  stop = true;
  for (auto& thread : threads) thread.join();
  CHECK(exceptions.load() == 0);
  CHECK(bad_loads.load() == 0);
  CHECK(cache.usable_for_write());  // concurrent clear() must not degrade writers
  const auto checked = cache.verify(false);
  CHECK(std::all_of(checked.begin(), checked.end(), [](const auto& e) { return e.valid; }));
}

}  // TEST_SUITE
