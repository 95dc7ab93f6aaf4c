// `astrai-jit cache list | stats | verify | prune | clear | export | import | push | pull`.
#include "tools/cli/cli.hpp"

#include "cache/remote_tier.hpp"
#include "runtime/compile_plan.hpp"

namespace astrai::cli {

// Cache verbs manage the directory whatever ASTRAI_JIT_CACHE says, except that a read-only
// configuration is never written to. `write` asks for a cache that may remove files.
DiskCache open_cache(const EnvConfig& config, bool write) {
  const CacheMode mode =
      write && config.cache_mode != CacheMode::read_only ? CacheMode::read_write : CacheMode::read_only;
  return DiskCache(config.cache_dir, mode, 0, config.cache_sharing);
}

// Checked before a writable DiskCache is opened (which would create a missing directory).
bool require_usable(const EnvConfig& config, const char* verb) {
  const DiskCache cache(config.cache_dir, CacheMode::read_only, 0, config.cache_sharing);
  std::string why;
  bool missing = false;
  if (!cache.check_usable(&why, &missing))
    throw astrai::ConfigError(fmt::format("cache {}: {} is not a usable cache ({})", verb,
                                          cache.root().string(), why));
  if (missing)
    print_note(fmt::format("cache {}: no cache at {} yet: an empty cache (nothing created there)",
                           verb, cache.root().string()));
  return !missing;
}

void require_writable(const EnvConfig& config, const char* verb) {
  if (config.cache_mode == CacheMode::read_only)
    throw astrai::ConfigError(fmt::format(
        "cache {}: the cache {} is read-only (ASTRAI_JIT_CACHE=ro); nothing changed", verb,
        config.cache_dir.string()));
}

int run_cache_list(const EnvConfig& config) {
  require_usable(config, "list");
  DiskCache cache = open_cache(config, false);
  std::uint64_t total = 0;
  const auto entries = cache.list();
  for (const auto& entry : entries) {
    total += entry.size_bytes;
    fmt::print("{:>10}  {}  {}  {}\n", format_bytes(entry.size_bytes), iso_time(entry.last_used),
               entry.key_hex, entry.variant_name);
  }
  fmt::print("total: {}, {} ({} bytes) in {}\n", counted(entries.size(), "entry", "entries"),
             format_bytes(total), total,
             config.cache_dir.string());
  return kExitOk;
}

std::string cap_text(std::uint64_t max_bytes) {
  if (max_bytes == 0) return "unlimited";
  return fmt::format("{} ({} bytes)", format_bytes(max_bytes), max_bytes);
}

int run_cache_stats(const EnvConfig& config, bool json) {
  require_usable(config, "stats");
  DiskCache cache = open_cache(config, false);
  const auto stats = cache.stats();
  if (json) {
    fmt::print("{}\n", cache_stats_json(config, stats.entries, stats.total_bytes));
    return kExitOk;
  }
  fmt::print("directory: {}\n", config.cache_dir.string());
  fmt::print("mode: {}\n", cache_mode_name(config.cache_mode));
  fmt::print("entries: {}\n", stats.entries);
  fmt::print("total bytes: {} ({})\n", stats.total_bytes, format_bytes(stats.total_bytes));
  fmt::print("cap: {}\n", cap_text(config.max_cache_bytes));
  return kExitOk;
}

int run_cache_verify(const EnvConfig& config, bool repair) {
  const bool can_repair = repair && config.cache_mode != CacheMode::read_only;
  if (repair && !can_repair)
    print_warning("ASTRAI_JIT_CACHE=ro: damaged entries are reported, not removed");
  const bool exists = require_usable(config, "verify");
  // A missing directory has nothing to check; a writable cache would create it.
  DiskCache cache = open_cache(config, can_repair && exists);
  // ASTRAI_JIT_TRUSTED_KEYS: verify reports what the runtime would refuse.
  cache.set_trusted_keys(config.trusted_keys);
  const auto entries = cache.verify(can_repair);
  std::size_t damaged = 0;
  std::size_t refused = 0;
  std::size_t other_format = 0;
  std::size_t signed_entries = 0;
  std::size_t unsigned_entries = 0;
  std::size_t signature_refused = 0;
  for (const auto& entry : entries) {
    if (entry.valid && !entry.other_format) {
      (entry.signature == "unsigned" ? unsigned_entries : signed_entries) += 1;
      if (entry.signature_refused) {
        ++signature_refused;
        fmt::print("signature refused: {} {} ({}): {} - kept, never loaded\n", entry.key_hex,
                   entry.variant_name, entry.path.string(), entry.signature);
      }
    }
    if (entry.other_format) {
      ++other_format;
      fmt::print("other format: {} {} ({}): written by another library version, kept\n",
                 entry.key_hex, entry.variant_name, entry.path.string());
      continue;
    }
    if (entry.valid) continue;
    if (entry.foreign) {
      ++refused;
      fmt::print("refused: {} {} ({}): {} - kept, never loaded\n", entry.key_hex,
                 entry.variant_name, entry.path.string(), entry.problem);
      continue;
    }
    ++damaged;
    std::error_code ec;
    const bool removed = can_repair && !fs::exists(fs::symlink_status(entry.path, ec));
    fmt::print("damaged: {} {} ({}): {}{}\n", entry.key_hex, entry.variant_name,
               entry.path.string(), entry.problem, removed ? " - removed" : "");
  }
  fmt::print("verify: {} checked, {} damaged{}{}{}\n", counted(entries.size(), "entry", "entries"), damaged,
             damaged > 0 ? (can_repair ? ", removed" : ", kept") : "",
             refused > 0 ? fmt::format(", {} refused (not trusted)", refused) : std::string(),
             other_format > 0 ? fmt::format(", {} of another format", other_format)
                              : std::string());
  // Signature state: with ASTRAI_JIT_TRUSTED_KEYS, an entry not validly signed by one of them is
  // refused by the runtime, so it fails the check too (it is kept: it is not damaged).
  fmt::print("signatures: {} signed, {} unsigned{}\n", signed_entries, unsigned_entries,
             config.trusted_keys
                 ? fmt::format(", {} refused by ASTRAI_JIT_TRUSTED_KEYS ({})", signature_refused,
                               counted(config.trusted_keys->keys.size(), "key"))
                 : std::string(" (ASTRAI_JIT_TRUSTED_KEYS not set: not checked)"));
  return damaged + refused + signature_refused > 0 ? kExitFailed : kExitOk;
}

int run_cache_prune(const EnvConfig& config, const std::string& max_size) {
  std::uint64_t limit = config.max_cache_bytes;
  if (!max_size.empty()) {
    const auto parsed = astrai::detail::parse_byte_size(trim(max_size));
    if (!parsed)
      throw astrai::InvalidArgument(fmt::format(
          "--max-size '{}' is not a size (allowed: bytes with an optional K, M, G, T, KiB, MiB, "
          "GiB or TiB suffix, e.g. 512M, 10GiB)", max_size));
    limit = *parsed;
  } else if (limit == 0) {
    throw astrai::InvalidArgument(
        "cache prune: no size limit: give --max-size SIZE or set ASTRAI_JIT_MAX_CACHE_SIZE");
  }
  require_writable(config, "prune");
  const bool exists = require_usable(config, "prune");
  DiskCache cache = open_cache(config, exists);
  const std::uint64_t freed = exists ? cache.prune(limit) : 0;
  const auto stats = cache.stats();
  fmt::print("prune: freed {} bytes ({}); {}, {} bytes remain (limit {} bytes)\n", freed,
             format_bytes(freed), counted(stats.entries, "entry", "entries"), stats.total_bytes, limit);
  return kExitOk;
}

int run_cache_clear(const EnvConfig& config) {
  require_writable(config, "clear");
  const bool exists = require_usable(config, "clear");
  DiskCache cache = open_cache(config, exists);
  const std::uint64_t removed = exists ? cache.clear() : 0;
  fmt::print("clear: removed {} from {}\n", counted(removed, "entry", "entries"), config.cache_dir.string());
  return kExitOk;
}

int run_cache_export(const EnvConfig& config, const CacheOptions& options) {
  std::vector<std::string> variants;
  if (!options.manifest.empty()) {
    for (const auto& spec : read_manifest(options.manifest)) variants.push_back(spec.name());
    if (variants.empty())
      throw astrai::InvalidArgument(fmt::format("--manifest: '{}' names no variant",
                                                astrai::detail::echo_text(options.manifest)));
  }
  std::optional<astrai::detail::SigningKey> sign;
  if (!options.export_sign_key.empty())
    sign = read_signing_key_option("--sign", options.export_sign_key);
  require_usable(config, "export");
  DiskCache cache = open_cache(config, false);
  const auto report = astrai::detail::export_cache(cache, variants, options.output,
                                                   sign ? &*sign : nullptr);
  for (const auto& problem : report.problems) print_error(problem);
  fmt::print("export: {}, {} ({} bytes) from {} to {}{}\n",
             counted(report.entries, "entry", "entries"), format_bytes(report.bytes), report.bytes,
             config.cache_dir.string(), options.output,
             sign ? fmt::format(", signed by {}", astrai::detail::key_id_hex(sign->id()))
                  : std::string());
  return report.problems.empty() ? kExitOk : kExitFailed;
}

int run_cache_import(const EnvConfig& config, const CacheOptions& options) {
  require_writable(config, "import");
  DiskCache cache = open_cache(config, true);
  // ASTRAI_JIT_TRUSTED_KEYS: import takes only entries signed by a trusted key.
  cache.set_trusted_keys(config.trusted_keys);
  if (!cache.usable_for_write())
    throw astrai::ConfigError(fmt::format("cache import: {} is not a usable cache",
                                          config.cache_dir.string()));
  const auto report = astrai::detail::import_archive(cache, options.archive);
  for (const auto& problem : report.problems) print_error(problem);
  fmt::print("import: {}, {} ({} bytes) into {}{}\n", counted(report.entries, "entry", "entries"),
             format_bytes(report.bytes), report.bytes, config.cache_dir.string(),
             report.problems.empty() ? std::string()
                                     : fmt::format(", {} rejected", report.problems.size()));
  return report.problems.empty() ? kExitOk : kExitFailed;
}

namespace {

// The stores of --remote, else of ASTRAI_JIT_REMOTE; no leases (nothing is compiled here).
std::unique_ptr<astrai::detail::RemoteTier> open_remote(const EnvConfig& config,
                                                        const CacheOptions& options,
                                                        const char* verb) {
  std::vector<astrai::detail::RemoteEndpoint> endpoints = config.remotes;
  if (!options.remote.empty()) {
    std::string why;
    if (!astrai::detail::parse_remote_endpoints(options.remote, &endpoints, &why))
      throw astrai::InvalidArgument(fmt::format("--remote is not valid: {} (allowed: {})", why,
                                                astrai::detail::kRemoteAllowed));
  }
  if (endpoints.empty())
    throw astrai::ConfigError(fmt::format(
        "cache {}: no remote cache: give --remote URLS or set ASTRAI_JIT_REMOTE", verb));
  astrai::detail::RemoteTierOptions tier_options;
  tier_options.store.timeout = config.remote_timeout;
  tier_options.store.max_entry_bytes = astrai::detail::kMaxEntryFileBytes;
  tier_options.lease = std::chrono::milliseconds(0);
  return std::make_unique<astrai::detail::RemoteTier>(endpoints, tier_options);
}

std::vector<KernelSpec> manifest_specs(const std::string& manifest) {
  std::vector<KernelSpec> specs = read_manifest(manifest);
  if (specs.empty())
    throw astrai::InvalidArgument(fmt::format("--manifest: '{}' names no variant",
                                              astrai::detail::echo_text(manifest)));
  return specs;
}

}  // namespace

int run_cache_push(const EnvConfig& config, const CacheOptions& options) {
  std::set<std::string> wanted;
  if (!options.manifest.empty())
    for (const auto& spec : manifest_specs(options.manifest)) wanted.insert(spec.name());
  auto remote = open_remote(config, options, "push");
  require_usable(config, "push");
  DiskCache cache = open_cache(config, false);
  std::vector<std::string> problems;
  std::set<std::string> found;
  std::uint64_t pushed = 0;
  std::uint64_t bytes_pushed = 0;
  for (const auto& entry : cache.list()) {
    if (!wanted.empty() && wanted.count(entry.variant_name) == 0) continue;
    found.insert(entry.variant_name);
    std::vector<char> bytes;
    std::string why;
    if (!cache.read_entry_file(entry, &bytes, &why)) {
      problems.push_back(fmt::format("{}: not pushed: {}", entry.path.string(), why));
      continue;
    }
    if (!remote->put_now(entry.path.filename().string(), bytes, &why)) {
      problems.push_back(fmt::format("not pushed: {}", why));
      if (!remote->any_available()) break;  // every store failed: the rest would too
      continue;
    }
    ++pushed;
    bytes_pushed += bytes.size();
  }
  for (const auto& name : wanted)
    if (found.count(name) == 0) problems.push_back(fmt::format("{} is not in the cache", name));
  for (const auto& problem : problems) print_error(problem);
  fmt::print("push: {}, {} ({} bytes) from {} to {}{}\n", counted(pushed, "entry", "entries"),
             format_bytes(bytes_pushed), bytes_pushed, config.cache_dir.string(),
             remote->describe(),
             problems.empty() ? std::string() : ", " + counted(problems.size(), "problem"));
  return problems.empty() ? kExitOk : kExitFailed;
}

int run_cache_pull(const EnvConfig& config, const CacheOptions& options) {
  const std::vector<KernelSpec> specs = manifest_specs(options.manifest);
  auto remote = open_remote(config, options, "pull");
  require_writable(config, "pull");
  DiskCache cache = open_cache(config, true);
  if (!cache.usable_for_write())
    throw astrai::ConfigError(fmt::format("cache pull: {} is not a usable cache",
                                          config.cache_dir.string()));
  std::vector<std::string> problems;
  std::uint64_t pulled = 0;
  std::uint64_t present = 0;
  std::uint64_t bytes_pulled = 0;
  for (const auto& spec : specs) {
    const std::string name = spec.name();
    const auto key = astrai::detail::compile_request_key(astrai::detail::compile_request(spec),
                                                         astrai::detail::nvrtc_version());
    if (cache.contains(key, name)) {
      ++present;
      continue;
    }
    const std::string file_name = key.hex() + "." + name + ".cubin";
    const auto bytes = remote->fetch(file_name);
    if (!bytes) {
      if (!remote->any_available()) {
        problems.push_back(fmt::format("{} is unavailable: nothing more pulled", remote->describe()));
        break;
      }
      problems.push_back(fmt::format("{} is not on the remote", name));
      continue;
    }
    // Checked exactly like an imported entry before it is stored.
    DiskCache::StagedEntry staged;
    std::string why;
    if (!cache.stage_import(file_name, *bytes, &staged, &why) || !cache.commit_import(staged, &why)) {
      problems.push_back(fmt::format("{}: refused: {}", name, why));
      continue;
    }
    ++pulled;
    bytes_pulled += bytes->size();
  }
  for (const auto& problem : problems) print_error(problem);
  fmt::print("pull: {}, {} ({} bytes) into {} from {}; {} already cached{}\n",
             counted(pulled, "entry", "entries"), format_bytes(bytes_pulled), bytes_pulled,
             config.cache_dir.string(), remote->describe(), present,
             problems.empty() ? std::string() : ", " + counted(problems.size(), "problem"));
  return problems.empty() ? kExitOk : kExitFailed;
}

}  // namespace astrai::cli
