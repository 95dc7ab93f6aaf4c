// astrai-jit: command-line front end of the JIT runtime.
//
//   astrai-jit warm   compile kernel variants ahead of time into the disk cache
//   astrai-jit cache  list | stats | verify | prune | clear | export | import | sign | push | pull
//   astrai-jit keygen a key pair for signing cache entries
//   astrai-jit info   version, NVRTC, driver, devices, cache and ASTRAI_JIT_* settings
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
  CLI::App* cache_sign = nullptr;
  CLI::App* keygen = nullptr;
  CLI::App* cache_push = nullptr;
  CLI::App* cache_pull = nullptr;
  CLI::App* info = nullptr;
  CLI::App* plan = nullptr;
  InfoOptions info_options;
  PlanOptions plan_options;
  WarmOptions warm_options;
  CacheOptions cache_options;
};

int default_jobs() {
  const unsigned cpus = std::thread::hardware_concurrency();
  return static_cast<int>(std::clamp(cpus, 1u, 64u));
}

// A value's placeholder exactly as given (CLI11 otherwise appends " ..." to list options).
CLI::Option* placeholder(CLI::Option* option, const char* text) { return option->option_text(text); }

// The attention families' default shapes, as the help states them (kernel_family.cpp).
std::string default_shapes_text() {
  const auto& defaults = astrai::detail::kernel_family(KernelKind::paged_decode).warm;
  std::vector<std::string> pairs;
  for (const auto& [head_dim, group] : defaults.shapes) pairs.push_back(fmt::format("hd{} {}", head_dim, group));
  std::vector<std::string> groups;
  for (int group : defaults.groups) groups.push_back(std::to_string(group));
  return fmt::format("{}; {} with --head-dims", join(pairs, ", "), join(groups, ","));
}

std::string int_list(const std::vector<int>& values) {
  std::vector<std::string> items;
  for (int value : values) items.push_back(std::to_string(value));
  return join(items, ",");
}

void add_warm_command(CLI::App& app, Commands* commands) {
  WarmOptions& options = commands->warm_options;
  options.jobs = default_jobs();
  const auto& defaults = astrai::detail::kernel_family(KernelKind::paged_decode).warm;
  std::vector<std::string> other_kernels;
  const std::vector<std::string> default_kernels = default_kernel_names();
  for (const auto& name : astrai::detail::kernel_kind_names())
    if (std::find(default_kernels.begin(), default_kernels.end(), name) == default_kernels.end())
      other_kernels.push_back(name);

  CLI::App* warm = app.add_subcommand(
      "warm", "Compile kernel variants ahead of time into the disk cache (no GPU needed)");
  placeholder(warm->add_option("--arch", options.archs,
                               "Targets, e.g. sm_89,sm_90a,compute_80 [default: auto, each local GPU's]"),
              "LIST")->delimiter(',');
  placeholder(warm->add_option("--kernels", options.kernels,
                               fmt::format("[default: {}]; also the others below", join(default_kernels, ","))),
              "LIST")->delimiter(',');
  placeholder(warm->add_option("--dtypes", options.dtypes, "bf16, fp16 [default: bf16]"), "LIST")
      ->delimiter(',');
  placeholder(warm->add_option("--head-dims", options.head_dims,
                               fmt::format("Head dims [default: {}]", int_list(defaults.head_dims))),
              "LIST")->delimiter(',');
  placeholder(warm->add_option("--group-sizes", options.group_sizes,
                               fmt::format("Query heads per KV head [default: {}]", default_shapes_text())),
              "LIST")->delimiter(',');
  placeholder(warm->add_option("--page-sizes", options.page_sizes,
                               fmt::format("Tokens per page, paged kernels [default: {}]",
                                           int_list(defaults.page_sizes))),
              "LIST")->delimiter(',');
  placeholder(warm->add_option("--features", options.features,
                               "none, or features joined by '+', e.g. none,swa+sink [default: none]"),
              "LIST")->delimiter(',');
  placeholder(warm->add_option("--manifest", options.manifest,
                               "Variant names, one a line (as ASTRAI_JIT_RECORD writes them)"),
              "FILE");
  placeholder(warm->add_option("-j,--jobs", options.jobs,
                               fmt::format("Parallel compiles [default: {}, the CPUs]", options.jobs)),
              "N")->check(CLI::Range(1, 64));
  warm->add_flag("--no-mma", options.no_mma, "CUDA-core variants on sm_80+ (as ASTRAI_JIT_NO_MMA=1)");
  warm->add_flag("--hopper,--wgmma", options.hopper_only,
                 "sm_90a: only the Hopper variants (.wgmma, .tma) [default: both kinds]");
  warm->add_flag("--no-hopper,--no-wgmma", options.no_hopper,
                 "sm_90a: only the portable variants (as ASTRAI_JIT_NO_WGMMA=1)");
  placeholder(warm->add_option("--prefill-tiles", options.prefill_tiles,
                               "sm_90a hd128 prefill: auto (both), narrow, wide [default: auto]"),
              "TILES")->check(CLI::IsMember({"auto", "narrow", "wide"}));
  warm->add_flag("-n,--dry-run", options.dry_run,
                 "List the variants and which are cached; compile and write nothing");
  placeholder(warm->add_option("--cache-dir", options.cache_dir,
                               "[default: ASTRAI_JIT_CACHE_DIR, else ~/.cache/astrai-jit]"),
              "DIR");
  warm->footer(
      fmt::format("Other kernels: {}.\n", join(other_kernels, ", ")) +
      "With no selection flag: paged_decode (pages 1,16) and rotary_emb at hd64 and hd128, bf16,\n"
      "for each local GPU's target (sm_90a without a GPU, with its Hopper variants too). Lists are\n"
      "comma-separated; given lists cross (head dims x groups x pages). A manifest alone warms its\n"
      "own lines. Features, tilings and the output: the README's \"astrai-jit warm\".\n"
      "Exit codes: 0 success, 1 a compile failed, 2 usage or configuration error.");
  commands->warm = warm;
}

void add_cache_dir_option(CLI::App* command, CacheOptions* options) {
  placeholder(command->add_option("--cache-dir", options->cache_dir,
                                  "[default: ASTRAI_JIT_CACHE_DIR, else ~/.cache/astrai-jit]"),
              "DIR");
}

void add_cache_command(CLI::App& app, Commands* commands) {
  CacheOptions& options = commands->cache_options;
  CLI::App* cache = app.add_subcommand("cache", "Inspect and maintain the kernel disk cache");
  cache->require_subcommand(1);
  // Set before the verbs are added: they inherit it.
  cache->footer(
      "Every verb: a missing directory is an empty cache (nothing is created); a path that is not\n"
      "a usable cache (not a directory, a symbolic link, another user's, writable by others) exits\n"
      "2 untouched. With ASTRAI_JIT_CACHE=ro nothing is removed (verify only reports).\n"
      "Exit codes: 0 success, 1 damaged or rejected entries, 2 usage or configuration error.");
  commands->cache = cache;

  commands->cache_list = cache->add_subcommand(
      "list", "One line per entry: size, last used (UTC), key, variant; then a total");
  commands->cache_stats =
      cache->add_subcommand("stats", "Directory, mode, entry count, total bytes and size cap");
  commands->cache_stats->add_flag(
      "--json", options.json,
      "One JSON object: the directory's figures, and this command's own\n"
      "counters (zero in a fresh process; a server's live ones: cache_metrics())");
  commands->cache_verify = cache->add_subcommand(
      "verify", "Check every entry; remove damaged ones (exit 1 if any)");
  commands->cache_verify->add_flag("--no-repair", options.no_repair,
                                   "Report damaged entries without removing them");
  commands->cache_prune = cache->add_subcommand(
      "prune", "Remove least recently used entries until the cache fits the size cap");
  placeholder(commands->cache_prune->add_option(
                  "--max-size", options.max_size,
                  "Cap, e.g. 512M, 10GiB, 0 (empty it) [default: ASTRAI_JIT_MAX_CACHE_SIZE]"),
              "SIZE");
  commands->cache_clear = cache->add_subcommand("clear", "Remove every entry, lock and temp file");
  commands->cache_export = cache->add_subcommand(
      "export", "Write sound entries (or a manifest's variants) to an archive file");
  placeholder(commands->cache_export->add_option("--manifest", options.manifest,
                                                 "Only these variants (as ASTRAI_JIT_RECORD writes them)"),
              "FILE");
  placeholder(commands->cache_export->add_option("-o,--output", options.output, "Archive to write (required)"),
              "FILE")->required();
  placeholder(commands->cache_export->add_option(
                  "--sign", options.export_sign_key,
                  "Sign every entry in the archive with this secret key (from keygen)"),
              "KEY");
  commands->cache_import = cache->add_subcommand(
      "import", "Check every entry of an archive written by `cache export` and store it");
  placeholder(commands->cache_import->add_option("archive", options.archive, "Archive to read (required)"),
              "FILE")->required();
  commands->cache_sign = cache->add_subcommand(
      "sign", "Sign every sound entry with a secret key (replacing it atomically)");
  placeholder(commands->cache_sign->add_option("--key", options.sign_key,
                                               "Secret key file from keygen (mode 0600, required)"),
              "FILE")->required();
  commands->cache_push = cache->add_subcommand(
      "push", "Upload sound entries (or a manifest's variants) to the remote cache");
  placeholder(commands->cache_push->add_option("--manifest", options.manifest,
                                               "Only these variants (as ASTRAI_JIT_RECORD writes them)"),
              "FILE");
  commands->cache_pull = cache->add_subcommand(
      "pull", "Fetch a manifest's variants from the remote cache into this one, checked");
  placeholder(commands->cache_pull->add_option("--manifest", options.manifest,
                                               "The variants to fetch (required)"),
              "FILE")->required();
  for (CLI::App* verb : {commands->cache_push, commands->cache_pull})
    placeholder(verb->add_option("--remote", options.remote,
                                 "Remote stores, comma-separated [default: ASTRAI_JIT_REMOTE]"),
                "URLS");
  for (CLI::App* verb : {commands->cache_list, commands->cache_stats, commands->cache_verify,
                         commands->cache_prune, commands->cache_clear, commands->cache_export,
                         commands->cache_import, commands->cache_sign, commands->cache_push,
                         commands->cache_pull})
    add_cache_dir_option(verb, &options);
}

void add_keygen_command(CLI::App& app, Commands* commands) {
  commands->keygen = app.add_subcommand(
      "keygen", "Make an Ed25519 key pair for signing cache entries");
  placeholder(commands->keygen->add_option(
                  "--out", commands->cache_options.keygen_out,
                  "Writes PREFIX.secret (mode 0600) and PREFIX.pub (its public key, the form\n"
                  "ASTRAI_JIT_TRUSTED_KEYS takes); never overwrites (required)"),
              "PREFIX")->required();
  commands->keygen->footer("Exit codes: 0 success, 1 a file could not be written (or exists).");
}

void add_info_command(CLI::App& app, Commands* commands) {
  commands->info = app.add_subcommand(
      "info", "Version, NVRTC, driver, devices, cache and ASTRAI_JIT_* settings");
  add_cache_dir_option(commands->info, &commands->cache_options);
  commands->info->add_flag("--variables", commands->info_options.variables,
                           "Every ASTRAI_JIT_* variable: its values, its effect and its value here");
  commands->info->add_flag("--markdown", commands->info_options.markdown,
                           "With --variables: the README's table of them");
  commands->info->footer("Exit codes: 0 success (also without a driver or GPU), 2 a bad ASTRAI_JIT_* value.");
}

void add_plan_command(CLI::App& app, Commands* commands) {
  PlanOptions& o = commands->plan_options;
  CLI::App* plan = commands->plan = app.add_subcommand(
      "plan", "How the runtime runs an attention call, and why (no GPU needed)");
  placeholder(plan->add_option("kind", o.kind, "paged_decode, decode, prefill, paged_prefill or mla_decode"), "KIND")
      ->required();
  placeholder(plan->add_option("--arch", o.arch, "Target [default: auto, the local GPU's, else sm_90a]"), "TARGET");
  placeholder(plan->add_option("--sms", o.sms, "SM count [default: the local GPU's, else typical]"), "N");
  plan->add_option("--dtype", o.dtype, "bf16 or fp16 [default: bf16]")->check(CLI::IsMember({"bf16", "fp16"}));
  placeholder(plan->add_option("--head-dim", o.head_dim, "Head dim [default: 128]"), "D");
  placeholder(plan->add_option("--heads", o.heads, "Query heads (mla_decode: of the one latent head) [default: 32]"),
              "N");
  placeholder(plan->add_option("--kv-heads", o.kv_heads, "KV heads [default: --heads]"), "N");
  placeholder(plan->add_option("--batch", o.batch, "Requests [default: 1]"), "N");
  placeholder(plan->add_option("--kv-len", o.kv_len, "KV tokens a request (decode: the table's) [default: 4096]"),
              "N");
  placeholder(plan->add_option("--q-len", o.q_len, "Decode: new tokens 1..8; prefill: query rows [default: kv-len]"),
              "N");
  placeholder(plan->add_option("--page-size", o.page_size, "Paged calls' page size [default: 16]"), "N");
  placeholder(plan->add_option("--window", o.window, "Sliding window: keys before the query (swa)"), "N");
  placeholder(plan->add_option("--features", o.features, "Serving options: cap, sink, kv_e4m3, kv_e5m2")
                  ->delimiter(','),
              "LIST");
  plan->add_flag("--mask", o.mask, "The call passes a mask");
  placeholder(plan->add_option("--workspace", o.workspace, "Decode: a caller's workspace of N bytes"), "BYTES");
  plan->footer("No GPU needed. Exit codes: 0 success, 2 a bad flag or value.");
}

// The verbs named in argv, e.g. "astrai-jit cache verify", and in `unknown` a message when one
// of them is not a verb (CLI11 would report "a subcommand is required"). Only the top level and
// `cache` take verbs, and neither has options that take a value, so the first word that is not
// an option is the verb.
std::string verb_path(const CLI::App& app, int argc, char** argv, std::string* unknown) {
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
    if (next == nullptr) {
      if (unknown != nullptr)
        *unknown = fmt::format("unknown command '{} {}' (known: {}; run '{} --help')", path, word,
                               join(names, ", "), path);
      break;
    }
    path += " " + word;
    level = next;
  }
  return path;
}

int dispatch(const Commands& commands) {
  EnvConfig config = load_config();
  if (*commands.warm) return run_warm(commands.warm_options, std::move(config));
  if (*commands.keygen) return run_keygen(commands.cache_options);
  apply_cache_dir_override(commands.cache_options.cache_dir, &config);
  if (*commands.info) return run_info(config, commands.info_options);
  if (*commands.plan) return run_plan(config, commands.plan_options);
  if (*commands.cache_list) return run_cache_list(config);
  if (*commands.cache_stats) return run_cache_stats(config, commands.cache_options.json);
  if (*commands.cache_verify) return run_cache_verify(config, !commands.cache_options.no_repair);
  if (*commands.cache_prune) return run_cache_prune(config, commands.cache_options.max_size);
  if (*commands.cache_clear) return run_cache_clear(config);
  if (*commands.cache_export) return run_cache_export(config, commands.cache_options);
  if (*commands.cache_import) return run_cache_import(config, commands.cache_options);
  if (*commands.cache_sign) return run_cache_sign(config, commands.cache_options);
  if (*commands.cache_push) return run_cache_push(config, commands.cache_options);
  if (*commands.cache_pull) return run_cache_pull(config, commands.cache_options);
  print_error("no command given (run with --help)");
  return kExitUsage;
}


}  // namespace
}  // namespace astrai::cli

int main(int argc, char** argv) {
  using namespace astrai::cli;
  CLI::App app{"astrai-jit: compile the attention kernels ahead of time; inspect and maintain "
               "their disk cache"};
  app.name("astrai-jit");
  app.require_subcommand(1);
  app.footer(kExitCodesFooter);
  // Narrower than CLI11's 30 columns, so that every help line fits 100 columns.
  app.get_formatter()->column_width(26);
  app.set_version_flag("--version", [] {
    return fmt::format("astrai-jit {} (NVRTC {})", kVersion, astrai::detail::nvrtc_version().text());
  });
  Commands commands;
  add_warm_command(app, &commands);
  add_cache_command(app, &commands);
  add_keygen_command(app, &commands);
  add_info_command(app, &commands);
  add_plan_command(app, &commands);

  std::string unknown;
  const std::string path = verb_path(app, argc, argv, &unknown);
  if (!unknown.empty()) {
    print_error(unknown);
    return kExitUsage;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    // --help and --version print to stdout and succeed; every other parse error takes the
    // tool's one error prefix and points at the verb's help.
    if (error.get_exit_code() == 0) return app.exit(error);
    print_error(fmt::format("{} (run '{} --help')", error.what(), path));
    return kExitUsage;
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
