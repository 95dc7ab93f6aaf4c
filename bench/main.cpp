// astrai-bench entry point: options, case selection and the run.
#include <CLI/CLI.hpp>

#include "bench/bench.hpp"

namespace astrai::bench {

int run(const Options& options, const std::vector<CaseDef>& selected) {
  std::string why;
  if (!astrai::detail::driver_available(&why)) {
    print_error("timing needs a CUDA GPU, but " + why + " (--list and --help work without one)");
    return kExitFailed;
  }
  Bench bench(options);
  try {
    bench.open_device();
    bench.compile_kernels();
  } catch (const astrai::ConfigError& error) {
    print_error(error.what());
    return kExitUsage;
  } catch (const std::exception& error) {
    print_error(error.what());
    return kExitFailed;
  }
  fmt::print(stderr, "measuring ceilings\n");
  bench.measure_ceilings();
  print_header(bench, options);
  std::fflush(stdout);

  std::vector<CaseResult> results;
  std::map<std::string, CaseResult> by_name;
  int index = 0;
  for (const auto& def : selected) {
    ++index;
    fmt::print(stderr, "[{}/{}] {}\n", index, selected.size(), def.name());
    if (def.is_jit()) {
      bench.run_jit(def);
      continue;
    }
    CaseResult result = bench.run_case(def, by_name);
    if (result.status == "ok")
      fmt::print(stderr, "        {:.2f} us/call, {} {}\n", result.us.median, format_rate(result.rate), result.metric);
    else
      fmt::print(stderr, "        {}\n", first_line(result.error));
    by_name[def.name()] = result;
    results.push_back(std::move(result));
  }
  print_table(results);
  print_jit(bench.jit(), options.compile_reps, options.load_runs);
  if (bench.context_broken())
    fmt::print("\nnote: the CUDA context became unusable ({}); later cases were skipped\n", bench.broken_reason());

  if (!options.json_path.empty()) {
    const std::string text = report_json(bench, options, results).dump();
    std::ofstream out(options.json_path, std::ios::binary | std::ios::trunc);
    out << text;
    out.close();
    if (!out) {
      print_error("cannot write " + options.json_path);
      return kExitFailed;
    }
    fmt::print(stderr, "wrote {}\n", options.json_path);
  }
  return kExitOk;
}


}  // namespace astrai::bench

int main(int argc, char** argv) {
  using namespace astrai::bench;
  Options options;
  CLI::App app{"astrai-bench: times the astrai-jit kernels on GPU 0 against bandwidth ceilings "
               "measured in the same run"};
  app.name("astrai-bench");
  app.footer(kFooter);
  app.add_option("--filter", options.filter, "Run only the cases whose name matches this regex "
                                              "(ECMAScript, searched anywhere in the name)");
  app.add_option("--reps", options.reps, "Timed graph replays per case (ceilings use at least 10)")
      ->check(CLI::Range(1, 100000));
  app.add_option("--calls", options.calls, "Back-to-back calls captured in one graph (at least one per input set)")
      ->check(CLI::Range(1, kMaxCallsPerReplay));
  app.add_option("--compile-reps", options.compile_reps, "Cold compiles per variant for jit/compile")
      ->check(CLI::Range(1, 100));
  app.add_option("--load-runs", options.load_runs, "Fresh processes for jit/load")->check(CLI::Range(1, 100));
  app.add_option("--json", options.json_path, "Also write the results as JSON to this file");
  app.add_flag("--list", options.list, "List the cases (after --filter) and exit; needs no GPU");
  app.add_option("--child-load", options.child_load,
                 "Time one cached load (JitEngine::get + cuModuleLoadData) of VARIANT from cache DIR "
                 "in this fresh process and print it; without a GPU, JitEngine::get alone")
      ->expected(2)
      ->type_name("DIR VARIANT")
      ->group("Internal");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error) == 0 ? kExitOk : kExitUsage;
  }

  if (!options.child_load.empty()) return child_load(options.child_load[0], options.child_load[1]);

  {
    const EnvConfig config = [] {
      try {
        return astrai::detail::load_env_config_from_process();
      } catch (const astrai::ConfigError&) {
        return EnvConfig{};  // reported again, as an error, when the runtime starts
      }
    }();
    astrai::detail::Logger::instance().set_level(config.log_level);
  }

  std::vector<CaseDef> selected;
  try {
    const std::regex pattern(options.filter, std::regex::ECMAScript);
    for (const auto& def : all_cases())
      if (options.filter.empty() || std::regex_search(def.name(), pattern)) selected.push_back(def);
  } catch (const std::regex_error& error) {
    print_error(fmt::format("--filter '{}' is not a valid regular expression: {}", options.filter, error.what()));
    return kExitUsage;
  }
  if (selected.empty()) {
    print_error(fmt::format("no case matches --filter '{}' (see --list)", options.filter));
    return kExitUsage;
  }

  if (options.list) {
    for (const auto& def : selected) {
      std::string line = def.basis().empty() ? fmt::format("{:<42} {}", def.name(), def.shape())
                                             : fmt::format("{:<42} {:<34} {:<30}", def.name(), def.shape(), def.basis());
      if (!def.features().empty()) line += " " + def.features();
      while (!line.empty() && line.back() == ' ') line.pop_back();
      fmt::print("{}\n", line);
    }
    return kExitOk;
  }
  try {
    return run(options, selected);
  } catch (const std::exception& error) {
    print_error(error.what());
    return kExitFailed;
  }
}

