// Turns a KernelSpec into a compiled binary: memory, then disk cache, then the remote tier
// (ASTRAI_JIT_REMOTE), then NVRTC. Needs no GPU (the CLI's `warm` uses it directly). One compile
// per key: threads share a compile through a per-key future, processes through the cache's
// per-key lock file, nodes of a cluster through a remote lease.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "cache/disk_cache.hpp"
#include "cache/remote_tier.hpp"
#include "cache/variant_payload.hpp"
#include "runtime/env_config.hpp"
#include "runtime/kernel_spec.hpp"
#include "runtime/nvrtc_compiler.hpp"

namespace astrai::detail {

struct CompiledVariant {
  KernelSpec spec;
  CacheKey key;
  BinaryKind kind = BinaryKind::cubin;
  std::vector<char> binary;
  std::vector<std::string> symbols;  // lowered kernel names, in KernelSpec::instantiations() order
};

enum class VariantSource { memory, disk, remote, compiled };

struct JitCounters {
  std::atomic<std::uint64_t> compiles{0};
  std::atomic<std::uint64_t> disk_hits{0};
  std::atomic<std::uint64_t> memory_hits{0};
  std::atomic<std::uint64_t> remote_hits{0};  // verified entries taken from the remote tier
};

class JitEngine {
 public:
  explicit JitEngine(EnvConfig config);

  // The compiled variant for `spec` (spec.arch must be set). Throws CompileError, or
  // CacheMissError under ASTRAI_JIT_STRICT.
  std::shared_ptr<const CompiledVariant> get(const KernelSpec& spec, VariantSource* source = nullptr);

  // The key of compile_request(spec) (runtime/compile_plan.hpp).
  CacheKey key_for(const KernelSpec& spec) const;
  // The compile target for a device of compute capability major.minor: "sm_90a" on Hopper and
  // other arch-specific targets, "sm_XY" elsewhere, "compute_XY" (PTX) for an arch newer than
  // NVRTC knows. ASTRAI_JIT_ARCH overrides.
  std::string target_for_device(int major, int minor) const;

  const EnvConfig& config() const { return config_; }
  DiskCache& cache() { return cache_; }
  // The read-only layers (ASTRAI_JIT_CACHE_PATH), searched in order before cache().
  const std::vector<std::unique_ptr<DiskCache>>& layers() const { return layers_; }
  // Whether a layer or the cache holds a trusted entry for the spec (no checksum check).
  bool cached(const KernelSpec& spec) const;
  const JitCounters& counters() const { return counters_; }
  // The remote tier (ASTRAI_JIT_REMOTE); nullptr when none is configured.
  RemoteTier* remote() { return remote_.get(); }

  // How long a process waits for another's compile of the same key before compiling itself.
  static constexpr std::chrono::milliseconds kLockWait{60000};

 private:
  std::shared_ptr<const CompiledVariant> produce(const KernelSpec& spec, VariantSource* source);
  std::shared_ptr<const CompiledVariant> from_entry(const KernelSpec& spec, const CacheKey& key,
                                                    CacheEntryData&& entry);
  // Verifies bytes fetched from the remote tier like an import, then backfills the cache.
  std::shared_ptr<const CompiledVariant> adopt_remote(const KernelSpec& spec, const CacheKey& key,
                                                      const std::string& file_name,
                                                      const std::vector<char>& bytes);
  // Another node holds the key's lease: polls the remote for its entry for up to the lease's
  // length, or until the lease is free (then `token` holds it when `acquired` is set).
  std::shared_ptr<const CompiledVariant> await_remote(const KernelSpec& spec, const CacheKey& key,
                                                      const std::string& file_name,
                                                      std::string* token, bool* acquired);
  void record(const KernelSpec& spec);
  // ASTRAI_JIT_DUMP: the compile's source, PTX, cubin (for cuobjdump -sass) and log.
  void dump(const CompileRequest& request, const std::string& source, const std::string& ptx,
            std::string_view cubin, const std::string& log);

  EnvConfig config_;
  DiskCache cache_;
  std::vector<std::unique_ptr<DiskCache>> layers_;
  std::unique_ptr<RemoteTier> remote_;
  JitCounters counters_;
  std::mutex mutex_;
  std::unordered_map<std::string, std::shared_future<std::shared_ptr<const CompiledVariant>>> variants_;
  std::mutex record_mutex_;
  std::unordered_set<std::string> recorded_;
};

}  // namespace astrai::detail
