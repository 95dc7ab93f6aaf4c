// The remote tier: the stores of ASTRAI_JIT_REMOTE in order, their health, the background
// publisher and the counters. The engine (runtime/jit_engine.cpp) reads through it after a
// local miss and publishes to it after a compile; `astrai-jit cache push/pull` use it directly.
//
// Failure never reaches a caller: a store that errs or times out (RemoteOptions::timeout) is
// left alone for `retry_after`, with one warning per store and process, and the process works
// from its local cache meanwhile. Fetched bytes are unverified: callers pass them to
// DiskCache::verify_entry_file (cache/disk_cache.hpp) and report a refusal with note_rejected.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cache/remote_store.hpp"

namespace astrai::detail {

// What the tier did, for metrics (a plain copy: RemoteTier::counters()).
struct RemoteCounters {
  std::uint64_t hits = 0;             // entries fetched (before verification)
  std::uint64_t misses = 0;           // fetches no store could answer with an entry
  std::uint64_t errors = 0;           // requests that failed (down, timed out, refused)
  std::uint64_t rejected = 0;         // fetched entries refused by verification
  std::uint64_t published = 0;        // entries stored on a remote (one per store)
  std::uint64_t publish_dropped = 0;  // publishes dropped: queue full, store down, or at exit
  std::uint64_t lease_waits = 0;      // compiles that waited for another node's lease
  std::uint64_t fetch_count = 0;      // fetch requests timed (hits and misses)
  std::uint64_t fetch_micros_total = 0;
  std::uint64_t fetch_micros_max = 0;
};

struct RemoteTierOptions {
  RemoteOptions store;
  // How long another node's compile of a key is awaited (0: no leases).
  std::chrono::milliseconds lease{10000};
  // How long a store that failed is left alone before it is tried again.
  std::chrono::milliseconds retry_after{30000};
  // At exit, how long queued publishes may still take; the rest is dropped.
  std::chrono::milliseconds exit_flush{1000};
  std::size_t max_queued = 64;
};

class RemoteTier {
 public:
  // Throws astrai::ConfigError for a kind this build does not support.
  RemoteTier(const std::vector<RemoteEndpoint>& endpoints, const RemoteTierOptions& options);
  // For tests: stores made elsewhere.
  RemoteTier(std::vector<std::unique_ptr<RemoteStore>> stores, const RemoteTierOptions& options);
  // Publishes what is queued for at most options.exit_flush, drops the rest, never hangs
  // longer than that plus one request's timeout.
  ~RemoteTier();
  RemoteTier(const RemoteTier&) = delete;
  RemoteTier& operator=(const RemoteTier&) = delete;

  // The unverified bytes of the entry file `file_name` from the first store that has it.
  std::optional<std::vector<char>> fetch(const std::string& file_name);
  // A fetched entry that failed verification: counted, one warning per entry name.
  void note_rejected(const std::string& file_name, const std::string& why);

  // Queues the entry for every store; returns at once. A lease (try_lease) on `key_hex` held
  // with `token` is released once the entry is stored.
  void publish(std::string file_name, std::vector<char> bytes, std::string key_hex = {},
               std::string token = {});
  // Waits until the queue is empty and nothing is in flight; false on timeout.
  bool flush(std::chrono::milliseconds max_wait);
  // Stores now in every available store; false with a reason when none took it.
  bool put_now(const std::string& file_name, const std::vector<char>& bytes, std::string* why);

  // One compile per key across the cluster: `acquired` means compile and publish (the lease
  // goes with the publish, or release it); `held` means another node is compiling: poll fetch
  // for up to lease_length(); `unsupported`: no store has leases, or leases are off.
  LeaseOutcome try_lease(const std::string& key_hex, std::string* token);
  void release(const std::string& key_hex, const std::string& token);
  std::chrono::milliseconds lease_length() const { return options_.lease; }
  // A compile that waited for another node's lease (counted by the engine).
  void note_lease_wait() { lease_waits_.fetch_add(1, std::memory_order_relaxed); }

  RemoteCounters counters() const;
  // The stores' URLs (without passwords), comma-separated.
  std::string describe() const;
  // Whether any store is currently answering (not within a retry_after window).
  bool any_available() const;

 private:
  struct Slot {
    std::unique_ptr<RemoteStore> store;
    std::atomic<std::int64_t> down_until{0};  // steady_clock nanoseconds; 0: up
    // Held across the health check and the request: callers queued behind a request that
    // timed out see the store marked down instead of each waiting for a timeout of their own.
    std::mutex busy;
  };
  struct Job {
    std::string file_name;
    std::vector<char> bytes;
    std::string key_hex;
    std::string token;
  };
  bool available(const Slot& slot) const;
  void mark_down(Slot& slot, const std::string& why);
  void mark_up(Slot& slot);
  void publish_job(const Job& job);

  RemoteTierOptions options_;
  std::vector<std::unique_ptr<Slot>> slots_;

  std::atomic<std::uint64_t> hits_{0}, misses_{0}, errors_{0}, rejected_{0}, published_{0},
      dropped_{0}, lease_waits_{0}, fetch_count_{0}, fetch_micros_total_{0},
      fetch_micros_max_{0};
  // The publish queue and its thread. A forked child inherits them in whatever state the
  // parent's thread left them (a condition variable with a waiter that does not exist in the
  // child never wakes a broadcaster): the child leaves them alone and makes its own.
  struct PublishQueue {
    std::mutex mutex;
    std::condition_variable changed;
    std::deque<Job> jobs;
    bool busy = false;
    bool stopping = false;
    std::chrono::steady_clock::time_point deadline;
    std::unique_ptr<std::thread> thread;
  };
  PublishQueue& own_queue();
  void run_publisher(PublishQueue* queue);
  std::unique_ptr<PublishQueue> queue_;
  long queue_pid_ = 0;  // the process that made queue_
};

}  // namespace astrai::detail
