// The process-wide counters behind astrai::cache_metrics() (include/astrai/cache_metrics.hpp):
// lock-free atomics that the engine and the cache bump as they go. Relaxed order: each counter
// is exact, a snapshot taken while others count may mix moments.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "astrai/cache_metrics.hpp"

namespace astrai::detail {

enum class CacheTier { memory = 0, layer = 1, disk = 2, remote = 3 };
inline constexpr std::size_t kCacheTierCount = 4;
const char* cache_tier_name(CacheTier tier);  // "memory", "layer", "disk", "remote"

class LatencyHistogram {
 public:
  explicit LatencyHistogram(std::vector<double> bounds_seconds);
  void observe(std::chrono::nanoseconds elapsed);
  CacheLatency snapshot() const;

 private:
  std::vector<double> bounds_;
  std::vector<std::uint64_t> bounds_ns_;
  std::unique_ptr<std::atomic<std::uint64_t>[]> buckets_;  // not cumulative; last is +Inf
  std::atomic<std::uint64_t> count_{0};
  std::atomic<std::uint64_t> sum_ns_{0};
  std::atomic<std::uint64_t> min_ns_{UINT64_MAX};
  std::atomic<std::uint64_t> max_ns_{0};
};

struct CacheMetricsRegistry {
  CacheMetricsRegistry();
  std::atomic<std::uint64_t> hits[kCacheTierCount] = {};
  std::atomic<std::uint64_t> misses[kCacheTierCount] = {};
  std::atomic<std::uint64_t> compiles{0};
  std::atomic<std::uint64_t> compile_failures{0};
  std::atomic<std::uint64_t> stores{0};
  std::atomic<std::uint64_t> signature_refusals{0};
  std::atomic<std::uint64_t> remote_errors{0};
  LatencyHistogram compile_time;
  LatencyHistogram load_time[kCacheTierCount];

  void hit(CacheTier tier, std::chrono::nanoseconds load = std::chrono::nanoseconds::zero());
  void miss(CacheTier tier) { misses[static_cast<std::size_t>(tier)].fetch_add(1, std::memory_order_relaxed); }
  void count(std::atomic<std::uint64_t>& counter) { counter.fetch_add(1, std::memory_order_relaxed); }
  CacheMetrics snapshot() const;
};

// The process's registry (never destroyed, so that late threads may still count).
CacheMetricsRegistry& cache_metrics_registry();

// Prometheus text exposition of a snapshot.
std::string format_prometheus(const CacheMetrics& metrics);
// JSON object of a snapshot (the CLI's `cache stats --json` "process" member).
std::string format_metrics_json(const CacheMetrics& metrics);

}  // namespace astrai::detail
