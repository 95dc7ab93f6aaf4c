#include "runtime/jit_engine.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string_view>
#include <thread>

#include <fmt/format.h>

#include "astrai/error.hpp"
#include "base/logging.hpp"
#include "cache/cache_entry.hpp"
#include "cache/cache_fs.hpp"
#include "cache/cache_metrics.hpp"
#include "runtime/compile_plan.hpp"
#include "runtime/nvrtc_compiler.hpp"

namespace astrai::detail {

namespace {

double milliseconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

std::unique_ptr<RemoteTier> make_remote_tier(const EnvConfig& config) {
  if (config.remotes.empty()) return nullptr;
  RemoteTierOptions options;
  options.store.timeout = config.remote_timeout;
  options.store.max_entry_bytes = kMaxEntryFileBytes;  // the local entry cap
  options.lease = config.remote_lease;
  return std::make_unique<RemoteTier>(config.remotes, options);
}

std::string entry_file_name(const CacheKey& key, const std::string& variant_name) {
  return key.hex() + "." + variant_name + ".cubin";
}

}  // namespace

JitEngine::JitEngine(EnvConfig config)
    : config_(std::move(config)),
      cache_(config_.cache_dir, config_.cache_mode, config_.max_cache_bytes,
             config_.cache_sharing),
      remote_(make_remote_tier(config_)) {
  if (config_.cache_mode == CacheMode::off) return;
  cache_.set_trusted_keys(config_.trusted_keys);
  cache_.set_network_mode(config_.cache_nfs);
  // A layer is someone's published cache (an image's, a colleague's): its files are trusted
  // only when owned by us or root and writable by nobody else. The sharing mode of our own cache
  // never extends to layers: a group shared with us says nothing about who wrote a layer.
  for (const auto& layer : config_.cache_layers)
    if (layer != config_.cache_dir)
      layers_.push_back(std::make_unique<DiskCache>(layer, CacheMode::read_only, 0, CacheSharing{}));
  for (auto& layer : layers_) layer->set_trusted_keys(config_.trusted_keys);
}

bool JitEngine::cached(const KernelSpec& spec) const {
  const CacheKey key = key_for(spec);
  const std::string name = spec.name();
  for (const auto& layer : layers_)
    if (layer->contains(key, name)) return true;
  return cache_.contains(key, name);
}

CacheKey JitEngine::key_for(const KernelSpec& spec) const {
  return compile_request_key(compile_request(spec), nvrtc_version());
}

std::string JitEngine::target_for_device(int major, int minor) const {
  if (!config_.arch_override.empty()) return config_.arch_override;
  const int number = major * 10 + minor;
  const std::vector<int> supported = nvrtc_supported_archs();
  const bool known = std::find(supported.begin(), supported.end(), number) != supported.end();
  if (!known && !supported.empty() && number > supported.back()) {
    const std::string target = fmt::format("compute_{}", supported.back());
    log_once(LogLevel::warn, "ptx-fallback-" + std::to_string(number),
             "NVRTC {} does not know sm_{}; compiling PTX for {} and letting the driver finish it",
             nvrtc_version().text(), number, target);
    return target;
  }
  // Arch-specific targets (wgmma, setmaxnreg, ...) exist from Hopper on.
  return number >= 90 ? fmt::format("sm_{}a", number) : fmt::format("sm_{}", number);
}

std::shared_ptr<const CompiledVariant> JitEngine::get(const KernelSpec& spec, VariantSource* source) {
  const std::string name = spec.name();
  std::promise<std::shared_ptr<const CompiledVariant>> promise;
  std::shared_future<std::shared_ptr<const CompiledVariant>> in_flight;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = variants_.find(name);
    if (it == variants_.end()) {
      variants_.emplace(name, promise.get_future().share());
    } else {
      in_flight = it->second;
    }
  }
  if (in_flight.valid()) {
    // Wait for an in-flight compile of the same variant without the engine's lock, so that
    // other variants' memory hits and compiles go on meanwhile.
    counters_.memory_hits.fetch_add(1, std::memory_order_relaxed);
    cache_metrics_registry().hit(CacheTier::memory);
    if (source) *source = VariantSource::memory;
    return in_flight.get();
  }
  cache_metrics_registry().miss(CacheTier::memory);
  record(spec);
  try {
    auto result = produce(spec, source);
    promise.set_value(result);
    return result;
  } catch (...) {
    promise.set_exception(std::current_exception());
    // Forget the failure so that a later call can try again.
    std::lock_guard<std::mutex> lock(mutex_);
    variants_.erase(name);
    throw;
  }
}

std::shared_ptr<const CompiledVariant> JitEngine::from_entry(const KernelSpec& spec,
                                                             const CacheKey& key,
                                                             CacheEntryData&& entry) {
  auto variant = std::make_shared<CompiledVariant>();
  variant->spec = spec;
  variant->key = key;
  variant->kind = entry.kind;
  // The kind byte lives in the entry header, outside the checksum: an entry whose kind is not
  // the one this spec compiles to (PTX for compute_ targets, a cubin otherwise) is damaged.
  if (entry.kind != binary_kind_for_target(spec.arch)) return nullptr;
  std::size_t offset = 0;
  if (!decode_variant_symbols(entry.payload, &variant->symbols, &offset) ||
      variant->symbols.size() != spec.instantiations().size())
    return nullptr;
  // Nothing malformed reaches the driver: PTX ends in NUL, a cubin's ELF tables lie inside it.
  std::string why;
  if (!check_kernel_binary(entry.kind, entry.payload.data() + offset,
                           entry.payload.size() - offset, &why))
    return nullptr;
  // The binary is the payload's tail: take the buffer over instead of copying it (a cached
  // load sits on the path of a server's first call).
  variant->binary = std::move(entry.payload);
  variant->binary.erase(variant->binary.begin(), variant->binary.begin() + static_cast<std::ptrdiff_t>(offset));
  return variant;
}

std::shared_ptr<const CompiledVariant> JitEngine::produce(const KernelSpec& spec,
                                                          VariantSource* source) {
  spec.validate();
  const std::string name = spec.name();
  const CompileRequest request = compile_request(spec);
  const CacheKey key = compile_request_key(request, nvrtc_version());

  // The read-only layers first, then the user cache. A bad entry in a layer is skipped with a
  // warning (never repaired there) and the variant comes from the next one or a compile.
  CacheMetricsRegistry& metrics = cache_metrics_registry();
  // A tier's miss is counted once the lookup has gone past it for good (a compile, or a hit
  // further down), so that the look again after the compile lock counts once.
  auto try_cache = [&](DiskCache& cache, CacheTier tier) -> std::shared_ptr<const CompiledVariant> {
    const auto load_start = std::chrono::steady_clock::now();
    auto entry = cache.load(key, name);
    if (!entry) return nullptr;
    auto variant = from_entry(spec, key, std::move(*entry));
    if (!variant) {
      log_once(LogLevel::warn, "bad-payload-" + cache.root().string() + key.hex(),
               "cache entry for {} in {} has a malformed payload, binary or binary kind; "
               "recompiling",
               name, cache.root().string());
      return nullptr;
    }
    counters_.disk_hits.fetch_add(1, std::memory_order_relaxed);
    metrics.hit(tier, std::chrono::steady_clock::now() - load_start);
    if (source) *source = VariantSource::disk;
    // The arguments are built only when the line is written: a hit needs neither string.
    if (Logger::instance().enabled(LogLevel::debug))
      log(LogLevel::debug, "loaded {} from the cache at {} ({})", name, cache.root().string(),
          key.hex());
    return variant;
  };
  auto try_disk = [&]() -> std::shared_ptr<const CompiledVariant> {
    if (config_.force_compile) return nullptr;
    for (const auto& layer : layers_)
      if (auto hit = try_cache(*layer, CacheTier::layer)) return hit;
    auto hit = try_cache(cache_, CacheTier::disk);
    if (hit && !layers_.empty()) metrics.miss(CacheTier::layer);
    return hit;
  };
  auto count_misses = [&] {
    if (config_.force_compile || config_.cache_mode == CacheMode::off) return;
    if (!layers_.empty()) metrics.miss(CacheTier::layer);
    metrics.miss(CacheTier::disk);
  };

  // The remote tier's name for the entry; only the remote paths below use it.
  const std::string file_name = remote_ ? entry_file_name(key, name) : std::string();
  bool remote_refused = false;  // the remote's entry failed verification: not fetched again
  auto try_remote = [&]() -> std::shared_ptr<const CompiledVariant> {
    if (!remote_ || config_.force_compile || remote_refused) return nullptr;
    const auto fetch_start = std::chrono::steady_clock::now();
    auto bytes = remote_->fetch(file_name);
    auto variant = bytes ? adopt_remote(spec, key, file_name, *bytes) : nullptr;
    remote_refused = bytes && !variant;
    if (variant) {
      metrics.hit(CacheTier::remote, std::chrono::steady_clock::now() - fetch_start);
      if (source) *source = VariantSource::remote;
    } else {
      metrics.miss(CacheTier::remote);
    }
    return variant;
  };

  if (auto hit = try_disk()) return hit;
  if (auto hit = try_remote()) return hit;
  if (config_.strict) {
    count_misses();
    throw CacheMissError(fmt::format(
        "{} is not in the cache at {} and ASTRAI_JIT_STRICT forbids compiling at run time; "
        "provide it with: {}",
        name, cache_.root().string(), spec.warm_command()));
  }

  // Another process may be compiling the same key: wait for it (bounded), then look again.
  std::unique_ptr<FileLock> lock;
  if (cache_.usable_for_write()) {
    lock = cache_.lock_key(key, kLockWait);
    if (lock) {
      if (auto hit = try_disk()) return hit;
    }
  }

  // Another node may be compiling the same key: wait for its publish (bounded), then compile.
  std::string lease_token;
  bool leased = false;
  if (remote_ && !config_.force_compile) {
    const LeaseOutcome outcome = remote_->try_lease(key.hex(), &lease_token);
    leased = outcome == LeaseOutcome::acquired;
    if (outcome == LeaseOutcome::held) {
      if (auto hit = await_remote(spec, key, file_name, &lease_token, &leased)) {
        if (source) *source = VariantSource::remote;
        return hit;
      }
    }
    // The last holder may have published between our fetch and our lease.
    if (leased) {
      if (auto hit = try_remote()) {
        remote_->release(key.hex(), lease_token);
        return hit;
      }
    }
  }
  // A compile that fails gives the lease back at once (other nodes then try themselves).
  struct LeaseGuard {
    RemoteTier* tier;
    const std::string& key_hex;
    const std::string& token;
    bool* held;
    ~LeaseGuard() {
      if (*held) tier->release(key_hex, token);
    }
  };
  const std::string key_hex = key.hex();
  LeaseGuard lease_guard{remote_.get(), key_hex, lease_token, &leased};

  count_misses();
  log(LogLevel::debug, "compiling {} ({})", name, key.hex());
  const auto start = std::chrono::steady_clock::now();
  CompileResult compiled;
  try {
    compiled = nvrtc_compile(request, !config_.dump_dir.empty());
  } catch (const CompileError& error) {
    metrics.count(metrics.compile_failures);
    if (!config_.dump_dir.empty()) dump(request, "", "", "", error.log());
    throw;
  } catch (...) {
    metrics.count(metrics.compile_failures);
    throw;
  }
  metrics.compile_time.observe(std::chrono::steady_clock::now() - start);
  metrics.count(metrics.compiles);
  const double elapsed = milliseconds_since(start);
  counters_.compiles.fetch_add(1, std::memory_order_relaxed);
  log(LogLevel::info, "compiled {} in {:.0f} ms", name, elapsed);
  if (!config_.dump_dir.empty())
    dump(request, compiled.source, compiled.ptx,
         compiled.kind == BinaryKind::cubin ? std::string_view(compiled.binary.data(), compiled.binary.size())
                                            : std::string_view(),
         compiled.log);

  auto variant = std::make_shared<CompiledVariant>();
  variant->spec = spec;
  variant->key = key;
  variant->kind = compiled.kind;
  variant->binary = std::move(compiled.binary);
  variant->symbols = std::move(compiled.lowered_names);

  if (cache_.usable_for_write() || remote_) {
    CacheEntryData entry;
    entry.kind = variant->kind;
    entry.variant_name = name;
    entry.nvrtc_version = nvrtc_version().text();
    entry.payload = encode_variant_payload(variant->symbols, variant->binary);
    // A publishing process (ASTRAI_JIT_SIGNING_KEY) signs what it compiles.
    if (config_.signing_key) sign_entry_data(*config_.signing_key, key.hex(), &entry);
    if (cache_.usable_for_write() && cache_.store(key, entry)) metrics.count(metrics.stores);
    if (remote_) {
      // In the background: the call never waits for the remote. The lease goes with the
      // publish and is released once the entry is there for the nodes waiting on it.
      remote_->publish(file_name, encode_entry(entry), leased ? key_hex : std::string(),
                       leased ? lease_token : std::string());
      leased = false;
    }
  }
  if (source) *source = VariantSource::compiled;
  return variant;
}

std::shared_ptr<const CompiledVariant> JitEngine::adopt_remote(const KernelSpec& spec,
                                                               const CacheKey& key,
                                                               const std::string& file_name,
                                                               const std::vector<char>& bytes) {
  // Verified exactly like an imported entry file before anything of it is used.
  CacheEntryData entry;
  std::string why;
  if (!cache_.verify_entry_file(file_name, bytes, &entry, &why)) {
    remote_->note_rejected(file_name, why);
    return nullptr;
  }
  auto variant = from_entry(spec, key, std::move(entry));
  if (!variant) {
    remote_->note_rejected(file_name, "its payload does not hold this variant's kernels");
    return nullptr;
  }
  if (cache_.usable_for_write()) {
    DiskCache::StagedEntry staged;
    if (!cache_.stage_import(file_name, bytes, &staged, &why) || !cache_.commit_import(staged, &why))
      log(LogLevel::debug, "not keeping remote entry {} in the cache: {}", file_name, why);
  }
  counters_.remote_hits.fetch_add(1, std::memory_order_relaxed);
  log(LogLevel::debug, "loaded {} from the remote cache", file_name);
  return variant;
}

std::shared_ptr<const CompiledVariant> JitEngine::await_remote(const KernelSpec& spec,
                                                               const CacheKey& key,
                                                               const std::string& file_name,
                                                               std::string* token, bool* acquired) {
  remote_->note_lease_wait();
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + remote_->lease_length();
  auto pause = std::chrono::milliseconds(20);
  while (std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(200));
    if (auto bytes = remote_->fetch(file_name)) {
      if (auto variant = adopt_remote(spec, key, file_name, *bytes)) return variant;
      return nullptr;  // refused: compile it here
    }
    // The holder gave up (its compile failed) or its lease expired: compile here.
    const LeaseOutcome outcome = remote_->try_lease(key.hex(), token);
    if (outcome == LeaseOutcome::acquired) {
      *acquired = true;
      return nullptr;
    }
    if (outcome == LeaseOutcome::unsupported) return nullptr;
  }
  log(LogLevel::info, "waited {:.0f} ms for another node's compile of {}; compiling here",
      milliseconds_since(start), spec.name());
  return nullptr;
}

void JitEngine::record(const KernelSpec& spec) {
  if (config_.record_file.empty()) return;
  const std::string name = spec.name();
  std::lock_guard<std::mutex> lock(record_mutex_);
  if (!recorded_.insert(name).second) return;
  // One O_APPEND write per line: lines from concurrent processes never interleave.
  std::string why;
  const int fd = open_private_append(config_.record_file, &why);
  if (fd < 0) {
    log_once(LogLevel::warn, "record-open", "ASTRAI_JIT_RECORD: not writing {}: {}",
             config_.record_file.string(), why);
    return;
  }
  const std::string line = name + "\n";
  if (::write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size()))
    log_once(LogLevel::warn, "record-write", "ASTRAI_JIT_RECORD: cannot write {}: {}",
             config_.record_file.string(), std::strerror(errno));
  ::close(fd);
}

void JitEngine::dump(const CompileRequest& request, const std::string& source, const std::string& ptx,
                     std::string_view cubin, const std::string& log_text) {
  // The dump directory is created private; an existing one must be ours and writable by
  // nobody else, and no file in it is written through a symbolic link or a second name.
  std::filesystem::path dir = config_.dump_dir;
  while (!dir.empty() && !dir.has_filename() && dir != dir.root_path()) dir = dir.parent_path();
  std::error_code ignored;  // the open below reports what matters
  if (dir.has_parent_path()) std::filesystem::create_directories(dir.parent_path(), ignored);
  ::mkdir(dir.c_str(), 0700);
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  struct stat dir_info {};
  std::string refused;
  if (dir_fd < 0)
    refused = errno == ELOOP ? "a symbolic link (never followed)" : std::strerror(errno);
  else if (::fstat(dir_fd, &dir_info) != 0)
    refused = std::strerror(errno);
  else
    refused = CacheTrust::owner_only().check(dir_info);
  if (!refused.empty()) {
    log_once(LogLevel::warn, "dump-dir", "ASTRAI_JIT_DUMP: not writing to {}: {}", dir.string(),
             refused);
    if (dir_fd >= 0) ::close(dir_fd);
    return;
  }
  auto write = [&](const std::string& suffix, std::string_view text) {
    const std::string name = request.variant_name + suffix;
    const int fd = ::openat(dir_fd, name.c_str(),
                            O_WRONLY | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);
    struct stat info {};
    bool ok = fd >= 0 && ::fstat(fd, &info) == 0 && S_ISREG(info.st_mode) &&
              info.st_nlink == 1 && info.st_uid == ::geteuid() && ::ftruncate(fd, 0) == 0;
    for (std::size_t done = 0; ok && done < text.size();) {
      const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      ok = n > 0;
      if (ok) done += static_cast<std::size_t>(n);
    }
    if (fd >= 0) ::close(fd);
    if (!ok)
      log_once(LogLevel::warn, "dump-" + name, "ASTRAI_JIT_DUMP: cannot write {}",
               (dir / name).string());
  };
  std::string full_source = source;
  for (const auto& [header_name, text] : request.headers)
    full_source += fmt::format("\n// ---- {} ----\n{}", header_name, text);
  write(".cu", full_source);
  if (!ptx.empty()) write(".ptx", ptx);
  if (!cubin.empty()) write(".cubin", cubin);
  write(".log", fmt::format("options:{}\n{}\n", [&] {
          std::string joined;
          for (const auto& option : request.options) joined += " " + option;
          return joined;
        }(), log_text));
  ::close(dir_fd);
}

}  // namespace astrai::detail
