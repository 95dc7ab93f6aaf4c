// Counters of the kernel cache in this process: hits and misses per tier, compiles, compile and
// load times, signature refusals, remote errors. Process-wide, thread-safe, never reset.
//
//   #include <astrai/cache_metrics.hpp>
//   astrai::CacheMetrics m = astrai::cache_metrics();
//   std::string text = astrai::cache_metrics_prometheus();   // for a server's /metrics
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "astrai/export.hpp"

namespace astrai {

// A latency distribution: a histogram with fixed bucket bounds, plus its extremes.
struct CacheLatency {
  std::uint64_t count = 0;
  double sum_seconds = 0;
  double min_seconds = 0;  // 0 while count is 0
  double max_seconds = 0;
  std::vector<double> bucket_bounds;         // upper bounds in seconds, increasing
  std::vector<std::uint64_t> bucket_counts;  // cumulative: observations <= bound (Prometheus `le`)
};

struct CacheTierMetrics {
  std::uint64_t hits = 0;
  std::uint64_t misses = 0;
  CacheLatency load_time;  // each hit's read, checks and decode (empty for the memory tier)
};

struct CacheMetrics {
  // A lookup goes memory -> read-only layers (ASTRAI_JIT_CACHE_PATH) -> the disk cache -> a
  // remote tier (when one is configured) -> NVRTC; each tier it reaches counts one hit or miss.
  CacheTierMetrics memory, layer, disk, remote;
  std::uint64_t compiles = 0;          // NVRTC compiles that succeeded
  std::uint64_t compile_failures = 0;  // compiles that threw
  std::uint64_t stores = 0;            // entries written to the disk cache
  std::uint64_t signature_refusals = 0;  // entries refused for their signature (any tier)
  std::uint64_t remote_errors = 0;     // failed remote operations (when a remote is configured)
  CacheLatency compile_time;
};

// A snapshot of this process's counters.
ASTRAI_API CacheMetrics cache_metrics();
// The same in the Prometheus text exposition format (version 0.0.4): counters named
// astrai_jit_*_total, histograms astrai_jit_compile_seconds and astrai_jit_cache_load_seconds.
ASTRAI_API std::string cache_metrics_prometheus();

}  // namespace astrai
