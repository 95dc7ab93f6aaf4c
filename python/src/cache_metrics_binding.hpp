// astrai_jit._C.cache_metrics() and cache_metrics_prometheus(): the process's cache counters
// (include/astrai/cache_metrics.hpp) as a dict and as Prometheus text.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <astrai/cache_metrics.hpp>

namespace astrai_jit_binding {

namespace nb = nanobind;

inline nb::dict latency_dict(const astrai::CacheLatency& latency) {
  nb::dict out;
  out["count"] = latency.count;
  out["sum_seconds"] = latency.sum_seconds;
  out["min_seconds"] = latency.min_seconds;
  out["max_seconds"] = latency.max_seconds;
  nb::list buckets;  // (upper bound in seconds, cumulative count)
  for (std::size_t i = 0; i < latency.bucket_bounds.size(); ++i)
    buckets.append(nb::make_tuple(latency.bucket_bounds[i], latency.bucket_counts[i]));
  out["buckets"] = buckets;
  return out;
}

inline nb::dict cache_metrics_dict() {
  const astrai::CacheMetrics metrics = astrai::cache_metrics();
  nb::dict tiers;
  const std::pair<const char*, const astrai::CacheTierMetrics*> named[] = {
      {"memory", &metrics.memory}, {"layer", &metrics.layer},
      {"disk", &metrics.disk},     {"remote", &metrics.remote}};
  for (const auto& [name, tier] : named) {
    nb::dict entry;
    entry["hits"] = tier->hits;
    entry["misses"] = tier->misses;
    entry["load_time"] = latency_dict(tier->load_time);
    tiers[name] = entry;
  }
  nb::dict out;
  out["tiers"] = tiers;
  out["compiles"] = metrics.compiles;
  out["compile_failures"] = metrics.compile_failures;
  out["stores"] = metrics.stores;
  out["signature_refusals"] = metrics.signature_refusals;
  out["remote_errors"] = metrics.remote_errors;
  out["compile_time"] = latency_dict(metrics.compile_time);
  return out;
}

inline void bind_cache_metrics(nb::module_& m) {
  m.def("cache_metrics", &cache_metrics_dict,
        "This process's kernel cache counters: hits and misses per tier, compiles, compile and "
        "load times, signature refusals, remote errors.");
  m.def("cache_metrics_prometheus", [] { return astrai::cache_metrics_prometheus(); },
        "The same counters in the Prometheus text exposition format.");
}

}  // namespace astrai_jit_binding
