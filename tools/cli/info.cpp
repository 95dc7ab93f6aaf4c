// `astrai-jit info`: version, NVRTC, driver, devices, cache and the ASTRAI_JIT_* settings in effect.
#include "tools/cli/cli.hpp"

#include "runtime/env_variables.hpp"

namespace astrai::cli {

void print_devices(const EnvConfig& config) {
  std::string why;
  if (!astrai::detail::driver_available(&why)) {
    fmt::print("driver: not available ({})\n", why);
    fmt::print("devices: none (no CUDA driver or GPU available; `warm --arch auto` uses {})\n",
               kFallbackArch);
    return;
  }
  try {
    const auto& api = astrai::detail::driver();
    fmt::print("driver: CUDA {}.{} ({})\n", api.driver_version / 1000,
               (api.driver_version % 1000) / 10, api.driver_version);
    // An engine without a disk cache gives the target mapping the runtime uses (with
    // ASTRAI_JIT_ARCH applied).
    EnvConfig engine_config = config;
    engine_config.cache_mode = CacheMode::off;
    const JitEngine engine(engine_config);
    int count = 0;
    astrai::detail::check_cu(api.cuDeviceGetCount(&count), "cuDeviceGetCount", -1);
    fmt::print("devices: {}\n", count);
    for (int ordinal = 0; ordinal < count; ++ordinal) {
      try {
        CUdevice device = 0;
        astrai::detail::check_cu(api.cuDeviceGet(&device, ordinal), "cuDeviceGet", ordinal);
        char name[256] = {};
        astrai::detail::check_cu(api.cuDeviceGetName(name, sizeof name - 1, device),
                                 "cuDeviceGetName", ordinal);
        const int major = device_attribute(device, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, ordinal);
        const int minor = device_attribute(device, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, ordinal);
        const int sms = device_attribute(device, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, ordinal);
        std::size_t memory = 0;
        astrai::detail::check_cu(api.cuDeviceTotalMem(&memory, device), "cuDeviceTotalMem", ordinal);
        fmt::print("  device {}: {}, compute capability {}.{}, {} SMs, {} memory\n", ordinal, name,
                   major, minor, sms, format_bytes(memory));
        fmt::print("    target: {}\n", engine.target_for_device(major, minor));
      } catch (const astrai::Error& error) {
        fmt::print("  device {}: query failed: {}\n", ordinal, error.what());
      }
    }
  } catch (const astrai::Error& error) {
    fmt::print("driver: query failed: {}\n", error.what());
  }
}

namespace {

// The variables from the one list (runtime/env_variables.hpp), with the value each has here.
int print_variables(const EnvConfig& config, bool markdown) {
  if (markdown) {
    fmt::print("{}", astrai::detail::env_variables_markdown());
    return kExitOk;
  }
  for (const auto& variable : astrai::detail::env_variables()) {
    const auto set = std::find_if(config.variables_set.begin(), config.variables_set.end(),
                                  [&](const auto& entry) { return entry.first == variable.name; });
    fmt::print("{}{}\n  values: {}\n  effect: {}\n", variable.name,
               set != config.variables_set.end() ? "=" + set->second : std::string(" (not set)"), variable.values,
               variable.effect);
  }
  return kExitOk;
}

}  // namespace

int run_info(const EnvConfig& config, const InfoOptions& options) {
  if (options.markdown && !options.variables)
    throw astrai::InvalidArgument("--markdown: goes with --variables (the table of ASTRAI_JIT_* variables)");
  if (options.variables) return print_variables(config, options.markdown);
  const auto version = astrai::detail::nvrtc_version();
  std::vector<std::string> archs;
  for (int arch : astrai::detail::nvrtc_supported_archs()) archs.push_back(fmt::format("sm_{}", arch));
  fmt::print("astrai-jit: {}\n", kVersion);
  fmt::print("NVRTC: {}\n", version.text());
  fmt::print("  supported archs: {}\n", archs.empty() ? std::string("(unknown)") : join(archs, " "));
  if (!config.arch_override.empty()) fmt::print("  ASTRAI_JIT_ARCH: {}\n", config.arch_override);
  std::fflush(stdout);

  print_devices(config);

  DiskCache cache = open_cache(config, false);
  const auto stats = cache.stats();
  fmt::print("cache:\n");
  fmt::print("  directory: {}\n", config.cache_dir.string());
  // What the cache verbs would make of the directory (cache.cpp, require_usable).
  std::string why;
  bool missing = false;
  if (!cache.check_usable(&why, &missing))
    fmt::print("  state: not usable ({}); the cache verbs exit 2\n", why);
  else if (missing)
    fmt::print("  state: not created yet (the first compile or warm creates it)\n");
  fmt::print("  mode: {}\n", cache_mode_name(config.cache_mode));
  fmt::print("  trust: {}\n",
             config.cache_sharing.enabled()
                 ? fmt::format("shared with group {}", config.cache_sharing.name)
                 : std::string("owner only"));
  for (const auto& layer : config.cache_layers)
    fmt::print("  read-only layer: {}\n", layer.string());
  fmt::print("  entries: {}\n", stats.entries);
  fmt::print("  total size: {} ({} bytes)\n", format_bytes(stats.total_bytes), stats.total_bytes);
  fmt::print("  cap: {}\n", cap_text(config.max_cache_bytes));
  std::vector<std::string> key_ids;
  if (config.trusted_keys)
    for (const auto& key : config.trusted_keys->keys)
      key_ids.push_back(astrai::detail::key_id_hex(key.id));
  fmt::print("  signatures: {}\n",
             key_ids.empty() ? std::string("not required (ASTRAI_JIT_TRUSTED_KEYS not set)")
                             : fmt::format("required, trusted keys {}", join(key_ids, ", ")));
  if (config.signing_key)
    fmt::print("  signing key: {} (what this process compiles is signed)\n",
               astrai::detail::key_id_hex(config.signing_key->id()));

  fmt::print("environment:\n");
  if (config.variables_set.empty()) fmt::print("  (no ASTRAI_JIT_* variables set)\n");
  for (const auto& [name, value] : config.variables_set) {
    const bool unknown = std::find(config.unknown_variables.begin(), config.unknown_variables.end(),
                                   name) != config.unknown_variables.end();
    fmt::print("  {}={}{}\n", name, value, unknown ? "   (unknown, ignored)" : "");
  }
  return kExitOk;
}


}  // namespace astrai::cli
