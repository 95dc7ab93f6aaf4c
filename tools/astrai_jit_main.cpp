// astrai-jit: command-line front end of the JIT runtime.
//
//   astrai-jit warm   compile kernel variants ahead of time into the disk cache
//   astrai-jit cache  list | stats | verify | prune | clear | export | import
//   astrai-jit info   NVRTC, driver, devices, cache and ASTRAI_JIT_* settings
//
// Nothing here needs a GPU: `warm` compiles through JitEngine (NVRTC only) and `info` reports
// a missing driver instead of failing.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <exception>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "astrai/error.hpp"
#include "cache/cache_archive.hpp"
#include "cache/disk_cache.hpp"
#include "runtime/driver_api.hpp"
#include "runtime/env_config.hpp"
#include "runtime/jit_engine.hpp"
#include "runtime/kernel_spec.hpp"
#include "runtime/logging.hpp"
#include "runtime/nvrtc_compiler.hpp"

namespace {

namespace fs = std::filesystem;
using astrai::DType;
using astrai::detail::CacheMode;
using astrai::detail::DiskCache;
using astrai::detail::EnvConfig;
using astrai::detail::JitEngine;
using astrai::detail::KernelKind;
using astrai::detail::KernelSpec;
using astrai::detail::VariantSource;

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;

// Used by `warm --arch auto` when no GPU is visible.
constexpr const char* kFallbackArch = "sm_90a";

constexpr const char* kExitCodesFooter =
    "Exit codes:\n"
    "  0  success\n"
    "  1  work failed: a kernel did not compile, `cache verify` found damaged or refused\n"
    "     entries, `cache export` missed a manifest variant, `cache import` rejected an entry,\n"
    "     or an internal error (a missing GPU is not a failure for `info`)\n"
    "  2  usage or configuration error: bad flag or value, bad manifest line, bad ASTRAI_JIT_*\n"
    "     environment value";

constexpr const char* kWarmFooter =
    "Selection:\n"
    "  Lists are comma-separated; a flag may also be repeated.\n"
    "  With no --head-dims/--group-sizes, the default set is compiled: AstrAI 1B (head_dim 64,\n"
    "  24 query / 4 KV heads = group 6) and Llama-3-8B (head_dim 128, 32/8 = group 4):\n"
    "    paged_decode {hd64 g6, hd128 g4} x page sizes {1, 16}; rotary_emb {hd64, hd128}\n"
    "  (6 variants per dtype and arch).\n"
    "  When --head-dims or --group-sizes is given, paged_decode takes the cross product\n"
    "  head dims x group sizes x page sizes, each list falling back to its default when not\n"
    "  given: head dims {64,128}, group sizes {4,6}, page sizes {1,16}. rotary_emb uses only\n"
    "  the head dims and dtypes; the attention kernels without paging (decode, prefill) skip\n"
    "  the page sizes. Duplicates are compiled once.\n"
    "  --manifest alone warms exactly the manifest's variants (they carry their own arch);\n"
    "  together with any other selection flag (--arch included) both sets are warmed.\n"
    "  --no-mma (or ASTRAI_JIT_NO_MMA=1) selects the no-tensor-core variants on sm_80 and newer\n"
    "  for the flag selection; manifest lines are taken as written.\n"
    "  --arch auto: the target of each local GPU (ASTRAI_JIT_ARCH overrides); sm_90a when no GPU\n"
    "  is found.\n"
    "\n"
    "Output: one line per variant as it finishes, `[k/n] <variant> 0.42 s` (compiled),\n"
    "`[k/n] <variant> cached` (already on disk) or `[k/n] <variant> FAILED: <reason>`, then\n"
    "`warm: N variants, C compiled, H already cached, F failed, B bytes, W s wall`.";

// Shown under the help of every verb.
std::string with_exit_codes(const char* text) { return std::string(text) + "\n\n" + kExitCodesFooter; }

// ---------------------------------------------------------------------------------------------
// Small helpers

std::string format_bytes(std::uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024) return fmt::format("{} B", bytes);
  double value = static_cast<double>(bytes);
  std::size_t unit = 0;
  while (value >= 1024.0 && unit + 1 < std::size(kUnits)) {
    value /= 1024.0;
    ++unit;
  }
  return fmt::format("{:.1f} {}", value, kUnits[unit]);
}

const char* cache_mode_name(CacheMode mode) {
  switch (mode) {
    case CacheMode::read_write: return "rw";
    case CacheMode::read_only: return "ro";
    case CacheMode::off: return "off";
  }
  return "?";
}

std::string iso_time(fs::file_time_type time) {
  // C++17 has no clock_cast: map through the distance from "now" on both clocks.
  const auto system = std::chrono::system_clock::now() +
                      std::chrono::duration_cast<std::chrono::system_clock::duration>(
                          time - fs::file_time_type::clock::now());
  const std::time_t seconds = std::chrono::system_clock::to_time_t(system);
  std::tm utc{};
  if (::gmtime_r(&seconds, &utc) == nullptr) return "?";
  char text[32];
  if (std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &utc) == 0) return "?";
  return text;
}

std::string first_line(const std::string& text) {
  const std::size_t end = text.find('\n');
  return end == std::string::npos ? text : text.substr(0, end);
}

std::string trim(const std::string& text) {
  const char* space = " \t\r\n\f\v";
  const std::size_t begin = text.find_first_not_of(space);
  if (begin == std::string::npos) return "";
  return text.substr(begin, text.find_last_not_of(space) - begin + 1);
}

std::string join(const std::vector<std::string>& items, const char* separator) {
  std::string out;
  for (const auto& item : items) {
    if (!out.empty()) out += separator;
    out += item;
  }
  return out;
}

void print_error(std::string message) {
  // Some library messages already carry the program name.
  const std::string prefix = "astrai-jit: ";
  if (message.compare(0, prefix.size(), prefix) == 0) message.erase(0, prefix.size());
  fmt::print(stderr, "astrai-jit: error: {}\n", message);
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Reads the ASTRAI_JIT_* environment once, configures logging and warns about unknown names.
EnvConfig load_config() {
  EnvConfig config = astrai::detail::load_env_config_from_process();
  astrai::detail::Logger::instance().set_level(config.log_level);
  // ASTRAI_JIT_ARCH is checked like `warm --arch`: NVRTC must be able to compile for it.
  if (!config.arch_override.empty()) {
    const std::vector<int> supported = astrai::detail::nvrtc_supported_archs();
    const int number = astrai::detail::arch_number(config.arch_override);
    if (!supported.empty() &&
        std::find(supported.begin(), supported.end(), number) == supported.end()) {
      std::vector<std::string> names;
      for (int arch : supported) names.push_back(fmt::format("sm_{}", arch));
      throw astrai::ConfigError(fmt::format(
          "ASTRAI_JIT_ARCH={}: NVRTC {} cannot compile for it (supported: {})",
          config.arch_override, astrai::detail::nvrtc_version().text(), join(names, ", ")));
    }
  }
  for (const auto& name : config.unknown_variables)
    astrai::detail::log_once(astrai::detail::LogLevel::warn, "unknown-env-" + name,
                             "unknown environment variable {} ignored (known: {})", name,
                             join(astrai::detail::known_env_variables(), ", "));
  return config;
}

void apply_cache_dir_override(const std::string& cache_dir, EnvConfig* config) {
  if (cache_dir.empty()) return;
  std::error_code ec;
  fs::path path = fs::absolute(cache_dir, ec);
  config->cache_dir = ec ? fs::path(cache_dir) : path;
}

// ---------------------------------------------------------------------------------------------
// warm

struct WarmOptions {
  std::vector<std::string> archs;
  std::vector<std::string> kernels;
  std::vector<std::string> dtypes;
  std::vector<int> head_dims;
  std::vector<int> page_sizes;
  std::vector<int> group_sizes;
  std::string manifest;
  std::string cache_dir;
  int jobs = 0;
  bool no_mma = false;
  bool dry_run = false;
};

// The targets behind `--arch auto`: one per distinct local GPU.
std::vector<std::string> auto_archs(const JitEngine& engine) {
  if (!engine.config().arch_override.empty()) return {engine.config().arch_override};
  std::string why;
  if (astrai::detail::driver_available(&why)) {
    try {
      const auto& api = astrai::detail::driver();
      int count = 0;
      astrai::detail::check_cu(api.cuDeviceGetCount(&count), "cuDeviceGetCount", -1);
      std::vector<std::string> targets;
      for (int ordinal = 0; ordinal < count; ++ordinal) {
        CUdevice device = 0;
        int major = 0;
        int minor = 0;
        astrai::detail::check_cu(api.cuDeviceGet(&device, ordinal), "cuDeviceGet", ordinal);
        astrai::detail::check_cu(
            api.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device),
            "cuDeviceGetAttribute", ordinal);
        astrai::detail::check_cu(
            api.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device),
            "cuDeviceGetAttribute", ordinal);
        const std::string target = engine.target_for_device(major, minor);
        if (std::find(targets.begin(), targets.end(), target) == targets.end())
          targets.push_back(target);
      }
      if (!targets.empty()) return targets;
      why = "the driver reports no devices";
    } catch (const astrai::Error& error) {
      why = error.what();
    }
  }
  fmt::print(stderr, "astrai-jit: no GPU found ({}); --arch auto uses {}\n", why, kFallbackArch);
  return {kFallbackArch};
}

std::vector<std::string> resolve_archs(const std::vector<std::string>& requested,
                                       const JitEngine& engine) {
  const std::vector<int> supported = astrai::detail::nvrtc_supported_archs();
  std::vector<std::string> archs;
  auto add = [&archs](const std::string& arch) {
    if (std::find(archs.begin(), archs.end(), arch) == archs.end()) archs.push_back(arch);
  };
  for (const auto& raw : requested) {
    const std::string text = trim(raw);
    if (text == "auto") {
      for (const auto& arch : auto_archs(engine)) add(arch);
      continue;
    }
    const std::optional<std::string> arch = astrai::detail::normalize_arch(text);
    if (!arch)
      throw astrai::InvalidArgument(fmt::format(
          "--arch '{}' is not a valid target (allowed: auto, or an arch like sm_75, sm_80, "
          "sm_89, sm_90a, 8.9)", raw));
    const int number = astrai::detail::arch_number(*arch);
    if (number < 75)
      throw astrai::InvalidArgument(fmt::format(
          "--arch '{}' is not supported (allowed: sm_75 or newer, e.g. sm_80, sm_89, sm_90a)", raw));
    if (!supported.empty() &&
        std::find(supported.begin(), supported.end(), number) == supported.end()) {
      std::vector<std::string> names;
      for (int value : supported) names.push_back(fmt::format("sm_{}", value));
      throw astrai::InvalidArgument(fmt::format(
          "--arch '{}': NVRTC {} cannot compile for it (supported: {})", raw,
          astrai::detail::nvrtc_version().text(), join(names, ", ")));
    }
    add(*arch);
  }
  return archs;
}

std::vector<KernelKind> resolve_kernels(const std::vector<std::string>& requested) {
  std::vector<KernelKind> kinds;
  for (const auto& raw : requested) {
    KernelKind kind{};
    if (!astrai::detail::parse_kernel_kind(trim(raw), &kind))
      throw astrai::InvalidArgument(fmt::format("--kernels '{}' is not a kernel (allowed: {})", raw,
                                                join(astrai::detail::kernel_kind_names(), ", ")));
    if (std::find(kinds.begin(), kinds.end(), kind) == kinds.end()) kinds.push_back(kind);
  }
  std::sort(kinds.begin(), kinds.end());
  return kinds;
}

std::vector<DType> resolve_dtypes(const std::vector<std::string>& requested) {
  std::vector<DType> dtypes;
  for (const auto& raw : requested) {
    const std::string text = trim(raw);
    DType dtype{};
    if (text == "bf16") dtype = DType::bf16;
    else if (text == "fp16") dtype = DType::fp16;
    else throw astrai::InvalidArgument(fmt::format("--dtypes '{}' is not a dtype (allowed: bf16, fp16)", raw));
    if (std::find(dtypes.begin(), dtypes.end(), dtype) == dtypes.end()) dtypes.push_back(dtype);
  }
  return dtypes;
}

// Which shape parameters a kernel's variants take.
enum class KernelShape {
  head_dim,             // head dim only (rotary_emb)
  head_dim_group,       // head dim and group (contiguous attention)
  head_dim_group_page,  // head dim, group and page size (paged attention)
};

KernelShape kernel_shape(KernelKind kind) {
  switch (kind) {
    case KernelKind::rotary_emb: return KernelShape::head_dim;
    case KernelKind::decode:
    case KernelKind::prefill: return KernelShape::head_dim_group;
    case KernelKind::paged_decode:
    case KernelKind::paged_prefill: return KernelShape::head_dim_group_page;
  }
  return KernelShape::head_dim_group_page;
}

template <typename T>
std::vector<T> unique_values(const std::vector<T>& values) {
  std::vector<T> out;
  for (const T& value : values)
    if (std::find(out.begin(), out.end(), value) == out.end()) out.push_back(value);
  return out;
}

// Variants of a manifest file (as written by ASTRAI_JIT_RECORD). Throws InvalidArgument naming
// file:line for a bad line.
std::vector<KernelSpec> read_manifest(const std::string& path) {
  std::vector<KernelSpec> specs;
  for (const auto& line : astrai::detail::read_manifest_lines(path)) {
    try {
      specs.push_back(KernelSpec::parse(line.text));
    } catch (const astrai::Error& error) {
      // The message echoes the line: cut it short and make it printable.
      throw astrai::InvalidArgument(fmt::format("{}:{}: {}", astrai::detail::echo_text(path),
                                                line.number,
                                                astrai::detail::echo_text(error.what())));
    }
  }
  return specs;
}

bool has_flag_selection(const WarmOptions& options) {
  return !options.archs.empty() || !options.kernels.empty() || !options.dtypes.empty() ||
         !options.head_dims.empty() || !options.page_sizes.empty() || !options.group_sizes.empty();
}

// Builds the deduplicated, validated list of variants `warm` compiles.
std::vector<KernelSpec> build_selection(const WarmOptions& options, const JitEngine& engine) {
  std::vector<KernelSpec> specs;
  std::set<std::string> seen;
  auto add = [&](const KernelSpec& spec) {
    spec.validate();
    if (seen.insert(spec.name()).second) specs.push_back(spec);
  };

  std::vector<KernelSpec> manifest;
  if (!options.manifest.empty()) manifest = read_manifest(options.manifest);

  if (options.manifest.empty() || has_flag_selection(options)) {
    const std::vector<std::string> archs =
        resolve_archs(options.archs.empty() ? std::vector<std::string>{"auto"} : options.archs, engine);
    const std::vector<KernelKind> kinds = resolve_kernels(
        options.kernels.empty() ? std::vector<std::string>{"paged_decode", "rotary_emb"}
                                : options.kernels);
    const std::vector<DType> dtypes =
        resolve_dtypes(options.dtypes.empty() ? std::vector<std::string>{"bf16"} : options.dtypes);
    const bool no_mma = options.no_mma || engine.config().no_mma;
    const std::vector<int> page_sizes =
        options.page_sizes.empty() ? std::vector<int>{1, 16} : unique_values(options.page_sizes);

    // (head_dim, group) pairs for the attention kernels; head dims alone for rotary_emb.
    std::vector<std::pair<int, int>> attention_shapes;
    std::vector<int> head_dims;
    if (options.head_dims.empty() && options.group_sizes.empty()) {
      attention_shapes = {{64, 6}, {128, 4}};  // AstrAI 1B, Llama-3-8B
      head_dims = {64, 128};
    } else {
      head_dims =
          options.head_dims.empty() ? std::vector<int>{64, 128} : unique_values(options.head_dims);
      const std::vector<int> groups =
          options.group_sizes.empty() ? std::vector<int>{4, 6} : unique_values(options.group_sizes);
      for (int head_dim : head_dims)
        for (int group : groups) attention_shapes.emplace_back(head_dim, group);
    }

    for (const auto& arch : archs) {
      for (KernelKind kind : kinds) {
        for (DType dtype : dtypes) {
          KernelSpec spec;
          spec.kind = kind;
          spec.dtype = dtype;
          spec.arch = arch;
          spec.force_no_mma = no_mma && astrai::detail::arch_number(arch) >= 80;
          switch (kernel_shape(kind)) {
            case KernelShape::head_dim:
              for (int head_dim : head_dims) {
                spec.head_dim = head_dim;
                add(spec);
              }
              break;
            case KernelShape::head_dim_group:
              for (const auto& [head_dim, group] : attention_shapes) {
                spec.head_dim = head_dim;
                spec.group_size = group;
                add(spec);
              }
              break;
            case KernelShape::head_dim_group_page:
              for (const auto& [head_dim, group] : attention_shapes) {
                for (int page_size : page_sizes) {
                  spec.head_dim = head_dim;
                  spec.group_size = group;
                  spec.page_size = page_size;
                  add(spec);
                }
              }
              break;
          }
        }
      }
    }
  }
  for (const auto& spec : manifest) add(spec);
  return specs;
}

struct WarmTotals {
  std::size_t compiled = 0;
  std::size_t cached = 0;
  std::size_t failed = 0;
  std::uint64_t bytes = 0;
};

// Compiles (or finds on disk) every spec with `jobs` threads, printing a line as each finishes.
WarmTotals compile_all(JitEngine& engine, const std::vector<KernelSpec>& specs, int jobs) {
  WarmTotals totals;
  std::mutex output_mutex;
  std::atomic<std::size_t> next{0};
  std::size_t done = 0;
  const std::size_t total = specs.size();

  auto work = [&]() {
    for (std::size_t index = next++; index < total; index = next++) {
      const KernelSpec& spec = specs[index];
      const std::string name = spec.name();
      const auto start = std::chrono::steady_clock::now();
      VariantSource source = VariantSource::compiled;
      std::string error;
      std::size_t binary_bytes = 0;
      try {
        auto variant = engine.get(spec, &source);
        binary_bytes = variant->binary.size();
      } catch (const std::exception& caught) {
        error = caught.what();
        if (error.empty()) error = "unknown error";
      }
      const double elapsed = seconds_since(start);

      std::lock_guard<std::mutex> lock(output_mutex);
      ++done;
      if (!error.empty()) {
        ++totals.failed;
        fmt::print(stderr, "astrai-jit: {} failed:\n{}\n", name, error);
        std::fflush(stderr);
        fmt::print("[{}/{}] {} FAILED: {}\n", done, total, name, first_line(error));
      } else if (source == VariantSource::compiled) {
        ++totals.compiled;
        totals.bytes += binary_bytes;
        fmt::print("[{}/{}] {} {:.2f} s\n", done, total, name, elapsed);
      } else {
        ++totals.cached;
        fmt::print("[{}/{}] {} cached\n", done, total, name);
      }
      std::fflush(stdout);
    }
  };

  const int threads = static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(jobs), total));
  std::vector<std::thread> workers;
  for (int i = 1; i < threads; ++i) workers.emplace_back(work);
  work();
  for (auto& worker : workers) worker.join();
  return totals;
}

int run_warm(const WarmOptions& options, EnvConfig config) {
  apply_cache_dir_override(options.cache_dir, &config);
  if (config.strict) {
    astrai::detail::log(astrai::detail::LogLevel::info,
                        "ASTRAI_JIT_STRICT ignored by warm (it exists to fill the cache)");
    config.strict = false;
  }
  if (!options.dry_run) {
    if (config.cache_mode == CacheMode::off)
      fmt::print(stderr, "astrai-jit: warning: ASTRAI_JIT_CACHE=off: compiled kernels are not "
                         "stored, warm only checks that they compile\n");
    else if (config.cache_mode == CacheMode::read_only)
      fmt::print(stderr, "astrai-jit: warning: ASTRAI_JIT_CACHE=ro: compiled kernels are not "
                         "stored in {}\n", config.cache_dir.string());
  }
  JitEngine engine(config);
  const std::vector<KernelSpec> specs = build_selection(options, engine);

  if (options.dry_run) {
    std::size_t cached = 0;
    std::size_t failed = 0;
    for (const auto& spec : specs) {
      bool present = false;
      try {
        present = !config.force_compile && engine.cached(spec);
      } catch (const astrai::Error& error) {
        ++failed;
        print_error(fmt::format("{}: {}", spec.name(), error.what()));
      }
      cached += present ? 1 : 0;
      fmt::print("{}{}\n", spec.name(), present ? " cached" : "");
    }
    fmt::print("warm: {} variants, {} already cached (dry run, nothing compiled)\n", specs.size(),
               cached);
    return failed > 0 ? kExitFailed : kExitOk;
  }

  if (specs.empty()) fmt::print(stderr, "astrai-jit: warning: nothing selected to warm\n");
  const auto start = std::chrono::steady_clock::now();
  const WarmTotals totals = compile_all(engine, specs, options.jobs);
  fmt::print("warm: {} variants, {} compiled, {} already cached, {} failed, {} bytes, {:.2f} s wall\n",
             specs.size(), totals.compiled, totals.cached, totals.failed, totals.bytes,
             seconds_since(start));
  // A cache that could not be written (read-only or full disk) leaves the work undone.
  if (config.cache_mode == CacheMode::read_write && totals.compiled > 0 &&
      !engine.cache().usable_for_write()) {
    print_error(fmt::format("the compiled kernels could not be stored in {}",
                            config.cache_dir.string()));
    return kExitFailed;
  }
  return totals.failed > 0 ? kExitFailed : kExitOk;
}

// ---------------------------------------------------------------------------------------------
// cache

struct CacheOptions {
  std::string cache_dir;
  bool no_repair = false;
  std::string max_size;
  std::string manifest;
  std::string output;
  std::string archive;
};

// Cache verbs manage the directory whatever ASTRAI_JIT_CACHE says, except that a read-only
// configuration is never written to. `write` asks for a cache that may remove files.
DiskCache open_cache(const EnvConfig& config, bool write) {
  const CacheMode mode =
      write && config.cache_mode != CacheMode::read_only ? CacheMode::read_write : CacheMode::read_only;
  return DiskCache(config.cache_dir, mode, 0, config.cache_sharing);
}

// Maintenance of a path that is not a usable cache (missing, not a directory, a symbolic
// link, refused by the trust rule) is a usage error: nothing there is touched.
// Checked before a writable DiskCache is opened (which would create a missing directory).
void require_usable(const EnvConfig& config, const char* verb) {
  const DiskCache cache(config.cache_dir, CacheMode::read_only, 0, config.cache_sharing);
  std::string why;
  bool missing = false;
  if (!cache.check_usable(&why, &missing) || missing)
    throw astrai::ConfigError(fmt::format("cache {}: {} is not a usable cache ({})", verb,
                                          cache.root().string(),
                                          missing ? why + " (nothing to do)" : why));
}

void require_writable(const EnvConfig& config, const char* verb) {
  if (config.cache_mode == CacheMode::read_only)
    throw astrai::ConfigError(fmt::format(
        "cache {}: the cache {} is read-only (ASTRAI_JIT_CACHE=ro); nothing changed", verb,
        config.cache_dir.string()));
}

int run_cache_list(const EnvConfig& config) {
  DiskCache cache = open_cache(config, false);
  std::uint64_t total = 0;
  const auto entries = cache.list();
  for (const auto& entry : entries) {
    total += entry.size_bytes;
    fmt::print("{:>10}  {}  {}  {}\n", format_bytes(entry.size_bytes), iso_time(entry.last_used),
               entry.key_hex, entry.variant_name);
  }
  fmt::print("total: {} entries, {} ({} bytes) in {}\n", entries.size(), format_bytes(total), total,
             config.cache_dir.string());
  return kExitOk;
}

std::string cap_text(std::uint64_t max_bytes) {
  if (max_bytes == 0) return "unlimited";
  return fmt::format("{} ({} bytes)", format_bytes(max_bytes), max_bytes);
}

int run_cache_stats(const EnvConfig& config) {
  DiskCache cache = open_cache(config, false);
  const auto stats = cache.stats();
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
    fmt::print(stderr, "astrai-jit: warning: ASTRAI_JIT_CACHE=ro: damaged entries are reported, "
                       "not removed\n");
  require_usable(config, "verify");
  DiskCache cache = open_cache(config, can_repair);
  const auto entries = cache.verify(can_repair);
  std::size_t damaged = 0;
  std::size_t refused = 0;
  std::size_t other_format = 0;
  for (const auto& entry : entries) {
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
  fmt::print("verify: {} entries checked, {} damaged{}{}{}\n", entries.size(), damaged,
             damaged > 0 ? (can_repair ? ", removed" : ", kept") : "",
             refused > 0 ? fmt::format(", {} refused (not trusted)", refused) : std::string(),
             other_format > 0 ? fmt::format(", {} of another format", other_format)
                              : std::string());
  return damaged + refused > 0 ? kExitFailed : kExitOk;
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
  require_usable(config, "prune");
  DiskCache cache = open_cache(config, true);
  const std::uint64_t freed = cache.prune(limit);
  const auto stats = cache.stats();
  fmt::print("prune: freed {} bytes ({}); {} entries, {} bytes remain (limit {} bytes)\n", freed,
             format_bytes(freed), stats.entries, stats.total_bytes, limit);
  return kExitOk;
}

int run_cache_clear(const EnvConfig& config) {
  require_writable(config, "clear");
  require_usable(config, "clear");
  DiskCache cache = open_cache(config, true);
  const std::uint64_t removed = cache.clear();
  fmt::print("clear: removed {} entries from {}\n", removed, config.cache_dir.string());
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
  require_usable(config, "export");
  DiskCache cache = open_cache(config, false);
  const auto report = astrai::detail::export_cache(cache, variants, options.output);
  for (const auto& problem : report.problems) fmt::print(stderr, "astrai-jit: {}\n", problem);
  fmt::print("export: {} entries, {} ({} bytes) from {} to {}\n", report.entries,
             format_bytes(report.bytes), report.bytes, config.cache_dir.string(), options.output);
  return report.problems.empty() ? kExitOk : kExitFailed;
}

int run_cache_import(const EnvConfig& config, const CacheOptions& options) {
  require_writable(config, "import");
  DiskCache cache = open_cache(config, true);
  if (!cache.usable_for_write())
    throw astrai::ConfigError(fmt::format("cache import: {} is not a usable cache",
                                          config.cache_dir.string()));
  const auto report = astrai::detail::import_archive(cache, options.archive);
  for (const auto& problem : report.problems) fmt::print(stderr, "astrai-jit: {}\n", problem);
  fmt::print("import: {} entries, {} ({} bytes) into {}{}\n", report.entries,
             format_bytes(report.bytes), report.bytes, config.cache_dir.string(),
             report.problems.empty() ? std::string()
                                     : fmt::format(", {} rejected", report.problems.size()));
  return report.problems.empty() ? kExitOk : kExitFailed;
}

// ---------------------------------------------------------------------------------------------
// info

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
        int major = 0, minor = 0, sms = 0;
        astrai::detail::check_cu(
            api.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device),
            "cuDeviceGetAttribute", ordinal);
        astrai::detail::check_cu(
            api.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device),
            "cuDeviceGetAttribute", ordinal);
        astrai::detail::check_cu(
            api.cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device),
            "cuDeviceGetAttribute", ordinal);
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

int run_info(const EnvConfig& config) {
  const auto version = astrai::detail::nvrtc_version();
  std::vector<std::string> archs;
  for (int arch : astrai::detail::nvrtc_supported_archs()) archs.push_back(fmt::format("sm_{}", arch));
  fmt::print("NVRTC: {}\n", version.text());
  fmt::print("  supported archs: {}\n", archs.empty() ? std::string("(unknown)") : join(archs, " "));
  if (!config.arch_override.empty()) fmt::print("  ASTRAI_JIT_ARCH: {}\n", config.arch_override);
  std::fflush(stdout);

  print_devices(config);

  DiskCache cache = open_cache(config, false);
  const auto stats = cache.stats();
  fmt::print("cache:\n");
  fmt::print("  directory: {}\n", config.cache_dir.string());
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

  fmt::print("environment:\n");
  if (config.variables_set.empty()) fmt::print("  (no ASTRAI_JIT_* variables set)\n");
  for (const auto& [name, value] : config.variables_set) {
    const bool unknown = std::find(config.unknown_variables.begin(), config.unknown_variables.end(),
                                   name) != config.unknown_variables.end();
    fmt::print("  {}={}{}\n", name, value, unknown ? "   (unknown, ignored)" : "");
  }
  return kExitOk;
}

// ---------------------------------------------------------------------------------------------
// Command line

struct Commands {
  CLI::App* warm = nullptr;
  CLI::App* cache = nullptr;
  CLI::App* cache_list = nullptr;
  CLI::App* cache_stats = nullptr;
  CLI::App* cache_verify = nullptr;
  CLI::App* cache_prune = nullptr;
  CLI::App* cache_clear = nullptr;
  CLI::App* cache_export = nullptr;
  CLI::App* cache_import = nullptr;
  CLI::App* info = nullptr;
  WarmOptions warm_options;
  CacheOptions cache_options;
};

int default_jobs() {
  const unsigned cpus = std::thread::hardware_concurrency();
  return static_cast<int>(std::clamp(cpus, 1u, 64u));
}

void add_warm_command(CLI::App& app, Commands* commands) {
  WarmOptions& options = commands->warm_options;
  options.jobs = default_jobs();
  CLI::App* warm = app.add_subcommand(
      "warm", "Compile kernel variants ahead of time into the disk cache (no GPU needed)");
  warm->add_option("--arch", options.archs,
                   "Targets, e.g. sm_75,sm_80,sm_89,sm_90a, or auto (each local GPU's target; "
                   "sm_90a without a GPU) [default: auto]")
      ->delimiter(',')->type_name("LIST");
  warm->add_option("--kernels", options.kernels,
                   fmt::format("Kernels: {} [default: paged_decode,rotary_emb]",
                               join(astrai::detail::kernel_kind_names(), ", ")))
      ->delimiter(',')->type_name("LIST");
  warm->add_option("--dtypes", options.dtypes, "Dtypes: bf16, fp16 [default: bf16]")
      ->delimiter(',')->type_name("LIST");
  warm->add_option("--head-dims", options.head_dims, "Head dims, e.g. 64,128")
      ->delimiter(',')->type_name("LIST");
  warm->add_option("--page-sizes", options.page_sizes,
                   "paged_decode page sizes [default: 1,16]")
      ->delimiter(',')->type_name("LIST");
  warm->add_option("--group-sizes", options.group_sizes,
                   "paged_decode query heads per KV head, e.g. 4,6")
      ->delimiter(',')->type_name("LIST");
  warm->add_option("--manifest", options.manifest,
                   "File of variant names, one per line (as written by ASTRAI_JIT_RECORD); "
                   "'#' starts a comment")
      ->type_name("FILE");
  warm->add_option("--jobs,-j", options.jobs, "Parallel compiles [default: number of CPUs]")
      ->check(CLI::Range(1, 64))->type_name("N");
  warm->add_flag("--no-mma", options.no_mma,
                 "Compile the variants without tensor cores on sm_80+ (as ASTRAI_JIT_NO_MMA=1)");
  warm->add_flag("--dry-run,-n", options.dry_run,
                 "List the selected variants (and which are cached) without compiling");
  warm->add_option("--cache-dir", options.cache_dir,
                   "Cache directory [default: ASTRAI_JIT_CACHE_DIR, $XDG_CACHE_HOME/astrai-jit, "
                   "~/.cache/astrai-jit]")
      ->type_name("DIR");
  warm->footer(with_exit_codes(kWarmFooter));
  commands->warm = warm;
}

void add_cache_dir_option(CLI::App* command, CacheOptions* options) {
  command->add_option("--cache-dir", options->cache_dir,
                      "Cache directory [default: ASTRAI_JIT_CACHE_DIR, $XDG_CACHE_HOME/astrai-jit, "
                      "~/.cache/astrai-jit]")
      ->type_name("DIR");
}

void add_cache_command(CLI::App& app, Commands* commands) {
  CacheOptions& options = commands->cache_options;
  CLI::App* cache = app.add_subcommand("cache", "Inspect and maintain the kernel disk cache");
  cache->require_subcommand(1);
  // Set before the verbs are added: they inherit it.
  cache->footer(with_exit_codes(
      "The cache verbs act on the configured directory (ASTRAI_JIT_CACHE_DIR, or --cache-dir)\n"
      "even when ASTRAI_JIT_CACHE=off; with ASTRAI_JIT_CACHE=ro nothing is removed (verify only\n"
      "reports, prune, clear and import fail with exit code 2). verify, prune, clear and export\n"
      "of a path that is not a usable cache (missing, not a directory, a symbolic link, owned by\n"
      "another user or writable by others) exit 2 and touch nothing."));
  commands->cache = cache;

  commands->cache_list = cache->add_subcommand(
      "list", "One line per entry: size, last used (UTC), key, variant; then a total");
  commands->cache_stats =
      cache->add_subcommand("stats", "Directory, mode, entry count, total bytes and size cap");
  commands->cache_verify = cache->add_subcommand(
      "verify", "Check every entry's header and checksum; remove damaged ones (exit 1 if any)");
  commands->cache_verify->add_flag("--no-repair", options.no_repair,
                                   "Report damaged entries without removing them");
  commands->cache_prune = cache->add_subcommand(
      "prune", "Remove least recently used entries until the cache fits the size cap");
  commands->cache_prune
      ->add_option("--max-size", options.max_size,
                   "Size cap, e.g. 512M, 10GiB, 0 (empty the cache) [default: "
                   "ASTRAI_JIT_MAX_CACHE_SIZE; one of them is required]")
      ->type_name("SIZE");
  commands->cache_clear = cache->add_subcommand("clear", "Remove every entry, lock and temp file");
  commands->cache_export = cache->add_subcommand(
      "export", "Write the cache's sound entries (or a manifest's variants) to an archive file");
  commands->cache_export
      ->add_option("--manifest", options.manifest,
                   "Export only these variants (a file as written by ASTRAI_JIT_RECORD)")
      ->type_name("FILE");
  commands->cache_export->add_option("-o,--output", options.output, "Archive to write")
      ->type_name("FILE")
      ->required();
  commands->cache_import = cache->add_subcommand(
      "import", "Check every entry of an archive written by `cache export` and store it");
  commands->cache_import->add_option("archive", options.archive, "Archive to read")
      ->type_name("FILE")
      ->required();
  for (CLI::App* verb : {commands->cache_list, commands->cache_stats, commands->cache_verify,
                         commands->cache_prune, commands->cache_clear, commands->cache_export,
                         commands->cache_import})
    add_cache_dir_option(verb, &options);
}

void add_info_command(CLI::App& app, Commands* commands) {
  commands->info = app.add_subcommand(
      "info", "Show NVRTC, driver and devices, cache and the ASTRAI_JIT_* settings");
  add_cache_dir_option(commands->info, &commands->cache_options);
}

// CLI11 reports an unknown verb as "a subcommand is required"; name it instead. Returns an
// error message, or an empty string when the verbs in argv are known. Only the top level and
// `cache` take verbs, and neither has options that take a value, so the first word that is
// not an option is the verb.
std::string unknown_verb(const CLI::App& app, int argc, char** argv) {
  const CLI::App* level = &app;
  std::string path = "astrai-jit";
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    if (word.empty() || word[0] == '-') {
      if (word == "--") break;
      continue;
    }
    const auto known = level->get_subcommands([](const CLI::App*) { return true; });
    if (known.empty()) break;
    const CLI::App* next = nullptr;
    std::vector<std::string> names;
    for (const CLI::App* command : known) {
      names.push_back(command->get_name());
      if (command->get_name() == word) next = command;
    }
    if (next == nullptr)
      return fmt::format("unknown command '{} {}' (known: {}; run '{} --help')", path, word,
                         join(names, ", "), path);
    path += " " + word;
    level = next;
  }
  return "";
}

int dispatch(const Commands& commands) {
  EnvConfig config = load_config();
  if (*commands.warm) return run_warm(commands.warm_options, std::move(config));
  apply_cache_dir_override(commands.cache_options.cache_dir, &config);
  if (*commands.info) return run_info(config);
  if (*commands.cache_list) return run_cache_list(config);
  if (*commands.cache_stats) return run_cache_stats(config);
  if (*commands.cache_verify) return run_cache_verify(config, !commands.cache_options.no_repair);
  if (*commands.cache_prune) return run_cache_prune(config, commands.cache_options.max_size);
  if (*commands.cache_clear) return run_cache_clear(config);
  if (*commands.cache_export) return run_cache_export(config, commands.cache_options);
  if (*commands.cache_import) return run_cache_import(config, commands.cache_options);
  print_error("no command given (run with --help)");
  return kExitUsage;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"astrai-jit: ahead-of-time compilation and cache maintenance for the AstrAI "
               "attention kernels"};
  app.name("astrai-jit");
  app.require_subcommand(1);
  app.footer(kExitCodesFooter);
  Commands commands;
  add_warm_command(app, &commands);
  add_cache_command(app, &commands);
  add_info_command(app, &commands);

  if (const std::string message = unknown_verb(app, argc, argv); !message.empty()) {
    print_error(message);
    return kExitUsage;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error) == 0 ? kExitOk : kExitUsage;
  }

  try {
    return dispatch(commands);
  } catch (const astrai::ConfigError& error) {
    print_error(error.what());
    return kExitUsage;
  } catch (const astrai::InvalidArgument& error) {
    print_error(error.what());
    return kExitUsage;
  } catch (const std::exception& error) {
    print_error(error.what());
    return kExitFailed;
  }
}
