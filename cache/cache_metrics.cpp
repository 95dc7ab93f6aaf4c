#include "cache/cache_metrics.hpp"

#include <algorithm>
#include <limits>

#include <fmt/format.h>

namespace astrai::detail {

namespace {

// A compile takes 0.3 s to a few seconds; a cached load a fraction of a millisecond to a few
// milliseconds (a cold page cache, a network file system).
std::vector<double> compile_bounds() { return {0.05, 0.1, 0.2, 0.3, 0.5, 1, 2, 5, 10, 30, 60}; }
std::vector<double> load_bounds() {
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 0.5, 2};
}

void update_min(std::atomic<std::uint64_t>& target, std::uint64_t value) {
  std::uint64_t seen = target.load(std::memory_order_relaxed);
  while (value < seen && !target.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}

void update_max(std::atomic<std::uint64_t>& target, std::uint64_t value) {
  std::uint64_t seen = target.load(std::memory_order_relaxed);
  while (value > seen && !target.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}

// Prometheus sample values: integers as they are, other numbers with enough digits to round-trip.
std::string number(double value) { return fmt::format("{}", value); }

void counter_family(std::string& out, const char* name, const char* help) {
  out += fmt::format("# HELP {} {}\n# TYPE {} counter\n", name, help, name);
}

void histogram_samples(std::string& out, const char* name, const std::string& labels,
                       const CacheLatency& latency) {
  const std::string sep = labels.empty() ? "" : ",";
  for (std::size_t i = 0; i < latency.bucket_bounds.size(); ++i)
    out += fmt::format("{}_bucket{{{}{}le=\"{}\"}} {}\n", name, labels, sep,
                       number(latency.bucket_bounds[i]), latency.bucket_counts[i]);
  out += fmt::format("{}_bucket{{{}{}le=\"+Inf\"}} {}\n", name, labels, sep, latency.count);
  const std::string braces = labels.empty() ? "" : "{" + labels + "}";
  out += fmt::format("{}_sum{} {}\n", name, braces, number(latency.sum_seconds));
  out += fmt::format("{}_count{} {}\n", name, braces, latency.count);
}

std::string latency_json(const CacheLatency& latency) {
  std::string buckets;
  for (std::size_t i = 0; i < latency.bucket_bounds.size(); ++i)
    buckets += fmt::format("{}[{}, {}]", i == 0 ? "" : ", ", number(latency.bucket_bounds[i]),
                           latency.bucket_counts[i]);
  return fmt::format(
      "{{\"count\": {}, \"sum_seconds\": {}, \"min_seconds\": {}, \"max_seconds\": {}, "
      "\"buckets\": [{}]}}",
      latency.count, number(latency.sum_seconds), number(latency.min_seconds),
      number(latency.max_seconds), buckets);
}

const CacheTierMetrics& tier_of(const CacheMetrics& metrics, CacheTier tier) {
  switch (tier) {
    case CacheTier::memory: return metrics.memory;
    case CacheTier::layer: return metrics.layer;
    case CacheTier::disk: return metrics.disk;
    case CacheTier::remote: return metrics.remote;
  }
  return metrics.memory;
}

constexpr CacheTier kTiers[] = {CacheTier::memory, CacheTier::layer, CacheTier::disk,
                                CacheTier::remote};

}  // namespace

const char* cache_tier_name(CacheTier tier) {
  switch (tier) {
    case CacheTier::memory: return "memory";
    case CacheTier::layer: return "layer";
    case CacheTier::disk: return "disk";
    case CacheTier::remote: return "remote";
  }
  return "unknown";
}

LatencyHistogram::LatencyHistogram(std::vector<double> bounds_seconds)
    : bounds_(std::move(bounds_seconds)),
      buckets_(new std::atomic<std::uint64_t>[bounds_.size() + 1]) {
  for (double bound : bounds_) bounds_ns_.push_back(static_cast<std::uint64_t>(bound * 1e9 + 0.5));
  for (std::size_t i = 0; i <= bounds_.size(); ++i) buckets_[i].store(0);
}

void LatencyHistogram::observe(std::chrono::nanoseconds elapsed) {
  const auto ns = static_cast<std::uint64_t>(std::max<std::int64_t>(0, elapsed.count()));
  const std::size_t bucket = static_cast<std::size_t>(
      std::lower_bound(bounds_ns_.begin(), bounds_ns_.end(), ns) - bounds_ns_.begin());
  buckets_[bucket].fetch_add(1, std::memory_order_relaxed);
  sum_ns_.fetch_add(ns, std::memory_order_relaxed);
  update_min(min_ns_, ns);
  update_max(max_ns_, ns);
  count_.fetch_add(1, std::memory_order_relaxed);
}

CacheLatency LatencyHistogram::snapshot() const {
  CacheLatency out;
  out.bucket_bounds = bounds_;
  std::uint64_t running = 0;
  for (std::size_t i = 0; i < bounds_.size(); ++i) {
    running += buckets_[i].load(std::memory_order_relaxed);
    out.bucket_counts.push_back(running);
  }
  running += buckets_[bounds_.size()].load(std::memory_order_relaxed);
  // The count is the buckets' total, so that `+Inf` always equals `_count`.
  out.count = running;
  out.sum_seconds = static_cast<double>(sum_ns_.load(std::memory_order_relaxed)) * 1e-9;
  if (out.count > 0) {
    out.min_seconds = static_cast<double>(min_ns_.load(std::memory_order_relaxed)) * 1e-9;
    out.max_seconds = static_cast<double>(max_ns_.load(std::memory_order_relaxed)) * 1e-9;
  }
  return out;
}

CacheMetricsRegistry::CacheMetricsRegistry()
    : compile_time(compile_bounds()),
      load_time{LatencyHistogram(load_bounds()), LatencyHistogram(load_bounds()),
                LatencyHistogram(load_bounds()), LatencyHistogram(load_bounds())} {}

void CacheMetricsRegistry::hit(CacheTier tier, std::chrono::nanoseconds load) {
  const auto index = static_cast<std::size_t>(tier);
  hits[index].fetch_add(1, std::memory_order_relaxed);
  if (tier != CacheTier::memory) load_time[index].observe(load);
}

CacheMetrics CacheMetricsRegistry::snapshot() const {
  CacheMetrics out;
  CacheTierMetrics* tiers[] = {&out.memory, &out.layer, &out.disk, &out.remote};
  for (std::size_t i = 0; i < kCacheTierCount; ++i) {
    tiers[i]->hits = hits[i].load(std::memory_order_relaxed);
    tiers[i]->misses = misses[i].load(std::memory_order_relaxed);
    tiers[i]->load_time = load_time[i].snapshot();
  }
  out.compiles = compiles.load(std::memory_order_relaxed);
  out.compile_failures = compile_failures.load(std::memory_order_relaxed);
  out.stores = stores.load(std::memory_order_relaxed);
  out.signature_refusals = signature_refusals.load(std::memory_order_relaxed);
  out.remote_errors = remote_errors.load(std::memory_order_relaxed);
  out.compile_time = compile_time.snapshot();
  return out;
}

CacheMetricsRegistry& cache_metrics_registry() {
  static auto* registry = new CacheMetricsRegistry();
  return *registry;
}

std::string format_prometheus(const CacheMetrics& metrics) {
  std::string out;
  counter_family(out, "astrai_jit_cache_hits_total", "Kernel lookups served by a cache tier.");
  for (CacheTier tier : kTiers)
    out += fmt::format("astrai_jit_cache_hits_total{{tier=\"{}\"}} {}\n", cache_tier_name(tier),
                       tier_of(metrics, tier).hits);
  counter_family(out, "astrai_jit_cache_misses_total",
                 "Kernel lookups that a cache tier could not serve.");
  for (CacheTier tier : kTiers)
    out += fmt::format("astrai_jit_cache_misses_total{{tier=\"{}\"}} {}\n", cache_tier_name(tier),
                       tier_of(metrics, tier).misses);
  const struct {
    const char* name;
    const char* help;
    std::uint64_t value;
  } counters[] = {
      {"astrai_jit_compiles_total", "Kernel variants compiled by NVRTC.", metrics.compiles},
      {"astrai_jit_compile_failures_total", "NVRTC compiles that failed.", metrics.compile_failures},
      {"astrai_jit_cache_stores_total", "Entries written to the disk cache.", metrics.stores},
      {"astrai_jit_signature_refusals_total",
       "Cache entries refused because they were unsigned or wrongly signed.",
       metrics.signature_refusals},
      {"astrai_jit_remote_errors_total", "Failed operations on a remote cache tier.",
       metrics.remote_errors},
  };
  for (const auto& counter : counters) {
    counter_family(out, counter.name, counter.help);
    out += fmt::format("{} {}\n", counter.name, counter.value);
  }
  out += "# HELP astrai_jit_compile_seconds Time of each NVRTC compile.\n"
         "# TYPE astrai_jit_compile_seconds histogram\n";
  histogram_samples(out, "astrai_jit_compile_seconds", "", metrics.compile_time);
  out += "# HELP astrai_jit_cache_load_seconds Time to read, check and decode a cache hit.\n"
         "# TYPE astrai_jit_cache_load_seconds histogram\n";
  for (CacheTier tier : kTiers) {
    if (tier == CacheTier::memory) continue;
    histogram_samples(out, "astrai_jit_cache_load_seconds",
                      fmt::format("tier=\"{}\"", cache_tier_name(tier)),
                      tier_of(metrics, tier).load_time);
  }
  return out;
}

std::string format_metrics_json(const CacheMetrics& metrics) {
  std::string tiers;
  for (CacheTier tier : kTiers) {
    const CacheTierMetrics& t = tier_of(metrics, tier);
    tiers += fmt::format("{}\"{}\": {{\"hits\": {}, \"misses\": {}, \"load_time\": {}}}",
                         tiers.empty() ? "" : ", ", cache_tier_name(tier), t.hits, t.misses,
                         latency_json(t.load_time));
  }
  return fmt::format(
      "{{\"tiers\": {{{}}}, \"compiles\": {}, \"compile_failures\": {}, \"stores\": {}, "
      "\"signature_refusals\": {}, \"remote_errors\": {}, \"compile_time\": {}}}",
      tiers, metrics.compiles, metrics.compile_failures, metrics.stores,
      metrics.signature_refusals, metrics.remote_errors, latency_json(metrics.compile_time));
}

}  // namespace astrai::detail

namespace astrai {

CacheMetrics cache_metrics() { return detail::cache_metrics_registry().snapshot(); }

std::string cache_metrics_prometheus() { return detail::format_prometheus(cache_metrics()); }

}  // namespace astrai
