// `astrai-jit warm`: the variant selection (from the kernel family descriptors, or a manifest)
// and the parallel compile.
#include "tools/cli/cli.hpp"

namespace astrai::cli {

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
        astrai::detail::check_cu(api.cuDeviceGet(&device, ordinal), "cuDeviceGet", ordinal);
        const int major = device_attribute(device, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, ordinal);
        const int minor = device_attribute(device, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, ordinal);
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
  print_note(fmt::format("no GPU found ({}); --arch auto uses {}", why, kFallbackArch));
  return {kFallbackArch};
}

std::vector<std::string> resolve_archs(const std::vector<std::string>& requested,
                                       const JitEngine& engine, bool hopper_only) {
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
      throw astrai::InvalidArgument(fmt::format("--arch '{}' is not a valid target (allowed: auto, or {})",
                                                raw, astrai::detail::kArchForms));
    const int number = astrai::detail::arch_number(*arch);
    if (number < astrai::detail::kMinArchNumber)
      throw astrai::InvalidArgument(fmt::format("--arch '{}' is not supported (allowed: {})", raw,
                                                astrai::detail::kArchSupported));
    if (!supported.empty() &&
        std::find(supported.begin(), supported.end(), number) == supported.end()) {
      std::vector<std::string> names;
      for (int value : supported) names.push_back(fmt::format("sm_{}", value));
      throw astrai::InvalidArgument(fmt::format(
          "--arch '{}': NVRTC {} cannot compile for it (supported: {})", raw,
          astrai::detail::nvrtc_version().text(), join(names, ", ")));
    }
    // A Hopper GPU runs sm_90a code (JitEngine::target_for_device): plain sm_90 variants are
    // loaded only under ASTRAI_JIT_ARCH=sm_90, so warming them is almost always a mistake.
    if (*arch == "sm_90") {
      if (hopper_only) {
        print_note(fmt::format("--arch {} with --hopper: warming sm_90a, the target of the Hopper variants", raw));
        add("sm_90a");
        continue;
      }
      print_warning(fmt::format(
          "--arch {}: a Hopper GPU loads sm_90a variants, not these (sm_90 is used only under "
          "ASTRAI_JIT_ARCH=sm_90); use --arch sm_90a", raw));
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

// Feature sets (KernelSpec::flags) from `--features` items: "none", or names joined by '+'.
std::vector<std::uint32_t> resolve_feature_sets(const std::vector<std::string>& requested) {
  std::vector<std::uint32_t> sets;
  for (const auto& raw : requested) {
    const std::string text = trim(raw);
    std::uint32_t flags = 0;
    if (text != "none") {
      std::stringstream stream(text);
      std::string name;
      bool bad = text.empty();
      while (!bad && std::getline(stream, name, '+')) {
        // A field's values (q2 .. q8) exclude each other like a repeated feature.
        const astrai::detail::KernelFeature* feature = astrai::detail::find_kernel_feature(trim(name));
        bad = feature == nullptr || (flags & feature->mask()) != 0;
        if (!bad) flags |= feature->bit;
      }
      if (bad || text.back() == '+') {
        std::uint32_t every = 0;
        for (const auto& feature : astrai::detail::kernel_features()) every |= feature.mask();
        throw astrai::InvalidArgument(fmt::format(
            "--features '{}' is not a feature set (allowed: none, or distinct features joined by "
            "'+': {}; at most one of q2..q8)", raw, astrai::detail::supported_feature_names(every)));
      }
      const std::string conflict = astrai::detail::feature_conflict(flags);
      if (!conflict.empty())
        throw astrai::InvalidArgument(fmt::format("--features '{}': {}", raw, conflict));
    }
    if (std::find(sets.begin(), sets.end(), flags) == sets.end()) sets.push_back(flags);
  }
  return sets;
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

// The families `warm` compiles without --kernels.
std::vector<std::string> default_kernel_names() {
  std::vector<std::string> names;
  for (const auto* family : astrai::detail::kernel_families())
    if (family->warm_by_default) names.emplace_back(family->name);
  return names;
}

bool has_flag_selection(const WarmOptions& options) {
  return !options.archs.empty() || !options.kernels.empty() || !options.dtypes.empty() ||
         !options.head_dims.empty() || !options.page_sizes.empty() || !options.group_sizes.empty() ||
         !options.features.empty();
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

  if (options.hopper_only && options.no_hopper)
    throw astrai::InvalidArgument("--hopper and --no-hopper exclude each other (give at most one)");
  if (options.hopper_only && engine.config().no_wgmma)
    throw astrai::InvalidArgument("--hopper: ASTRAI_JIT_NO_WGMMA is set, so the runtime never loads "
                                  "the Hopper variants (unset it, or drop --hopper)");
  // These choose among the flag selection's variants; a manifest alone names each variant.
  if (!options.manifest.empty() && !has_flag_selection(options) &&
      (options.hopper_only || options.no_hopper || options.no_mma || !options.prefill_tiles.empty()))
    throw astrai::InvalidArgument(fmt::format(
        "{} would not change what --manifest warms (it names each variant); add a selection (--kernels, "
        "--arch, ...) for it to apply to, or drop it",
        options.hopper_only ? "--hopper" : options.no_hopper ? "--no-hopper" : options.no_mma ? "--no-mma"
                                                                                                : "--prefill-tiles"));
  if (options.manifest.empty() || has_flag_selection(options)) {
    const std::vector<std::string> archs = resolve_archs(
        options.archs.empty() ? std::vector<std::string>{"auto"} : options.archs, engine, options.hopper_only);
    // --hopper on a target without Hopper variants would silently warm portable ones.
    if (options.hopper_only) {
      std::vector<std::string> other;
      for (const auto& arch : archs)
        if (arch != "sm_90a") other.push_back(arch);
      if (!other.empty())
        throw astrai::InvalidArgument(fmt::format(
            "--hopper: {} {} no Hopper variants (they exist for sm_90a only); drop --hopper or the target",
            join(other, ", "), other.size() == 1 ? "has" : "have"));
    }
    const std::vector<KernelKind> kinds = resolve_kernels(
        options.kernels.empty() ? default_kernel_names() : options.kernels);
    const std::vector<DType> dtypes =
        resolve_dtypes(options.dtypes.empty() ? std::vector<std::string>{"bf16"} : options.dtypes);
    const bool no_mma = options.no_mma || engine.config().no_mma;
    const bool no_hopper = options.no_hopper || engine.config().no_wgmma;
    // Which of two Hopper prefill tilings to warm: the option, else what the runtime will take.
    using astrai::detail::TileChoice;
    const TileChoice tiles = options.prefill_tiles.empty()
                                 ? engine.config().prefill_tiles
                                 : astrai::detail::parse_tile_choice("--prefill-tiles", options.prefill_tiles);
    // The Hopper decode's wide CTAs (hd64): what ASTRAI_JIT_DECODE_TILES lets the runtime take.
    const TileChoice decode_tiles = engine.config().decode_tiles;
    const bool shape_flags = !options.head_dims.empty() || !options.group_sizes.empty();
    const std::vector<std::uint32_t> feature_sets =
        resolve_feature_sets(options.features.empty() ? std::vector<std::string>{"none"} : options.features);

    for (const auto& arch : archs) {
      for (KernelKind kind : kinds) {
        const astrai::detail::KernelFamily& family = astrai::detail::kernel_family(kind);
        const astrai::detail::WarmDefaults& defaults = family.warm;
        // A family without features takes only its plain variants; the others must support
        // every requested set.
        std::vector<std::uint32_t> family_sets;
        for (std::uint32_t flags : feature_sets) {
          if (family.supported_flags == 0) flags = 0;
          const std::uint32_t refused = flags & ~family.supported_flags;
          if (refused != 0)
            throw astrai::InvalidArgument(fmt::format(
                "--features {}: {} does not support {} (supported: {})",
                astrai::detail::feature_names(flags, "+"), family.name,
                astrai::detail::feature_names(refused),
                family.supported_flags == 0 ? std::string("none")
                                            : astrai::detail::supported_feature_names(family.supported_flags)));
          if (std::find(family_sets.begin(), family_sets.end(), flags) == family_sets.end())
            family_sets.push_back(flags);
        }
        // (head_dim, group) pairs: the family's default set, or the cross product of the flags
        // (each falling back to the family's default list); group 0 for ungrouped families.
        std::vector<std::pair<int, int>> shapes;
        if (!shape_flags) {
          shapes = defaults.shapes;
        } else {
          const std::vector<int> head_dims =
              options.head_dims.empty() ? defaults.head_dims : unique_values(options.head_dims);
          std::vector<int> groups = {0};
          if (family.grouped)
            groups = options.group_sizes.empty() ? defaults.groups : unique_values(options.group_sizes);
          for (int head_dim : head_dims)
            for (int group : groups) shapes.emplace_back(head_dim, group);
        }
        std::vector<int> page_sizes = {0};
        if (family.paged)
          page_sizes = options.page_sizes.empty() ? defaults.page_sizes : unique_values(options.page_sizes);
        for (DType dtype : dtypes) {
          KernelSpec spec;
          spec.kind = kind;
          spec.dtype = dtype;
          spec.arch = arch;
          spec.force_no_mma = no_mma && astrai::detail::arch_number(arch) >= 80;
          for (std::uint32_t flags : family_sets) {
            spec.flags = flags;
            for (const auto& [head_dim, group] : shapes) {
              for (int page_size : page_sizes) {
                spec.head_dim = head_dim;
                spec.group_size = group;
                spec.page_size = page_size;
                // On sm_90a the runtime takes the Hopper kernel where it serves a call and the
                // portable one otherwise (masks, features, other head dims): warm both unless told.
                const bool hopper = astrai::detail::hopper_serves(spec) && !no_hopper;
                if (!hopper || !options.hopper_only) add(spec);
                if (hopper) {
                  KernelSpec hopper_spec = spec;
                  hopper_spec.hopper = true;
                  // A head dim with two tilings: both (the runtime picks by grid), or the one named.
                  const auto has_wide = spec.family().hopper.has_wide;
                  const bool two_tilings = has_wide != nullptr && has_wide(head_dim, flags);
                  const TileChoice family_tiles = is_decode_kind(kind) ? decode_tiles : tiles;
                  if (!two_tilings || family_tiles != TileChoice::wide) add(hopper_spec);
                  if (two_tilings && family_tiles != TileChoice::narrow) {
                    hopper_spec.wide = true;
                    add(hopper_spec);
                  }
                }
              }
            }
          }
        }
      }
    }
  }
  for (const auto& spec : manifest) add(spec);
  return specs;
}

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
        print_error(fmt::format("{} failed:\n{}", name, error));
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
  if (options.dry_run) {
    // A dry run only looks: a read-only cache never creates its directory, and nothing is
    // compiled, so ASTRAI_JIT_RECORD is not written either.
    if (config.cache_mode == CacheMode::read_write) config.cache_mode = CacheMode::read_only;
  } else if (config.cache_mode == CacheMode::off) {
    print_warning("ASTRAI_JIT_CACHE=off: compiled kernels are not stored, warm only checks that "
                  "they compile");
  } else if (config.cache_mode == CacheMode::read_only) {
    print_warning(fmt::format("ASTRAI_JIT_CACHE=ro: compiled kernels are not stored in {}",
                              config.cache_dir.string()));
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
    fmt::print("warm: {}, {} already cached (dry run, nothing compiled)\n",
               counted(specs.size(), "variant"), cached);
    return failed > 0 ? kExitFailed : kExitOk;
  }

  if (specs.empty()) print_warning("nothing selected to warm");
  // The first line otherwise comes only when the first compile ends (about a second each).
  const int jobs = static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(options.jobs),
                                                          std::max<std::size_t>(specs.size(), 1)));
  if (!specs.empty())
    fmt::print("warm: {} into {}, {}\n", counted(specs.size(), "variant"),
               config.cache_mode == CacheMode::off ? std::string("memory only") : config.cache_dir.string(),
               counted(static_cast<std::size_t>(jobs), "job"));
  std::fflush(stdout);
  const auto start = std::chrono::steady_clock::now();
  const WarmTotals totals = compile_all(engine, specs, options.jobs);
  // The size is that of what this run compiled: a warm that found everything cached says none.
  fmt::print("warm: {}, {} compiled{}, {} already cached, {} failed, {:.2f} s wall\n",
             counted(specs.size(), "variant"), totals.compiled,
             totals.compiled > 0 ? fmt::format(" ({} bytes)", totals.bytes) : std::string(),
             totals.cached, totals.failed, seconds_since(start));
  // A cache that could not be written (read-only or full disk) leaves the work undone.
  if (config.cache_mode == CacheMode::read_write && totals.compiled > 0 &&
      !engine.cache().usable_for_write()) {
    print_error(fmt::format("the compiled kernels could not be stored in {}",
                            config.cache_dir.string()));
    return kExitFailed;
  }
  return totals.failed > 0 ? kExitFailed : kExitOk;
}


}  // namespace astrai::cli
