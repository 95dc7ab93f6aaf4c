// astrai-jit: command-line front end of the JIT runtime.
//
//   astrai-jit warm   compile kernel variants ahead of time into the disk cache
//   astrai-jit cache  list | stats | verify | prune | clear | export | import
//   astrai-jit info   NVRTC, driver, devices, cache and ASTRAI_JIT_* settings
//
// Nothing here needs a GPU: `warm` compiles through JitEngine (NVRTC only) and `info` reports
// a missing driver instead of failing.
#include <CLI/CLI.hpp>

#include "tools/cli/cli.hpp"

namespace astrai::cli {
namespace {

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
                   "Targets, e.g. sm_75,sm_80,sm_89,sm_90a, compute_80 (PTX the driver finishes), "
                   "or auto (each local GPU's target; sm_90a without a GPU) [default: auto]")
      ->delimiter(',')->type_name("LIST");
  warm->add_option("--kernels", options.kernels,
                   fmt::format("Kernels: {} [default: {}]", join(astrai::detail::kernel_kind_names(), ", "),
                               join(default_kernel_names(), ",")))
      ->delimiter(',')->type_name("LIST");
  warm->add_option("--dtypes", options.dtypes, "Dtypes: bf16, fp16 [default: bf16]")
      ->delimiter(',')->type_name("LIST");
  warm->add_option("--head-dims", options.head_dims, "Head dims, e.g. 64,128")
      ->delimiter(',')->type_name("LIST");
  warm->add_option("--page-sizes", options.page_sizes,
                   "Page sizes of the paged kernels [default: 1,16]")
      ->delimiter(',')->type_name("LIST");
  warm->add_option("--group-sizes", options.group_sizes,
                   "Query heads per KV head of the attention kernels, e.g. 4,6")
      ->delimiter(',')->type_name("LIST");
  warm->add_option("--features", options.features,
                   "Feature sets of the attention kernels: none, or features joined by '+' "
                   "(kv_e4m3, kv_e5m2, swa, cap, sink, q2..q8), e.g. none,cap,swa+sink,kv_e4m3,q4 "
                   "[default: none]")
      ->delimiter(',')->type_name("LIST");
  warm->add_option("--manifest", options.manifest,
                   "File of variant names, one per line (as written by ASTRAI_JIT_RECORD); "
                   "'#' starts a comment")
      ->type_name("FILE");
  warm->add_option("--jobs,-j", options.jobs, "Parallel compiles [default: number of CPUs]")
      ->check(CLI::Range(1, 64))->type_name("N");
  warm->add_flag("--no-mma", options.no_mma,
                 "Compile the variants without tensor cores on sm_80+ (as ASTRAI_JIT_NO_MMA=1)");
  auto* no_hopper = warm->add_flag("--no-hopper,--no-wgmma", options.no_hopper,
                                   "On sm_90a, only the portable variants (as ASTRAI_JIT_NO_WGMMA=1)");
  warm->add_flag("--hopper,--wgmma", options.hopper_only,
                 "On sm_90a, only the Hopper variants (.wgmma prefill, .tma decode) of the kernels that have them")
      ->excludes(no_hopper);
  warm->add_option("--prefill-tiles", options.prefill_tiles,
                   "On sm_90a, the hd128 prefill tilings to warm: auto (both), narrow or wide "
                   "[default: ASTRAI_JIT_PREFILL_TILES, else auto]")
      ->check(CLI::IsMember({"auto", "narrow", "wide"}))->type_name("TILES");
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
}  // namespace astrai::cli

int main(int argc, char** argv) {
  using namespace astrai::cli;
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

