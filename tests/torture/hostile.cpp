// hostile: read-only, full, vanishing and file-shaped cache paths; every get() succeeds with
// exactly one warning per process.
#include "tests/torture/torture.hpp"

namespace astrai::torture {

// =============================================================================================
// hostile

constexpr std::size_t kHostileVariants = 3;
constexpr uid_t kNobody = 65534;

// Child: fresh engines get() variants in several threads while the scenario's trouble happens.
// Prints "G <variant> <source> <normalized> <signature>" per get and "X <error>" per failure.
int hostile_child(const HostileChildOptions& options) {
  Logger::instance().set_level(LogLevel::warn);
  if (options.drop_root && ::geteuid() == 0) {
    // Root ignores permission bits: a read-only directory only binds other users.
    if (::setgroups(0, nullptr) != 0 || ::setresgid(kNobody, kNobody, kNobody) != 0 ||
        ::setresuid(kNobody, kNobody, kNobody) != 0) {
      std::printf("X cannot give up root: %s\n", std::strerror(errno));
      return 3;
    }
  }
  if (options.scenario == "full-disk") {
    // A full disk: writes past 1 KiB fail with EFBIG (SIGXFSZ ignored) instead of killing us.
    ::signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{1024, 1024};
    if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) {
      std::printf("X setrlimit failed: %s\n", std::strerror(errno));
      return 3;
    }
  }
  const auto specs = rotary_pool(kHostileVariants);
  const EnvConfig config = engine_config(options.dir);
  std::mutex print_mutex;
  auto get_once = [&](const KernelSpec& spec) {
    try {
      JitEngine engine(config);
      VariantSource source = VariantSource::memory;
      const Fingerprint print = fingerprint(*engine.get(spec, &source));
      const char* name = source == VariantSource::disk       ? "disk"
                         : source == VariantSource::compiled ? "compiled"
                                                             : "memory";
      std::lock_guard<std::mutex> lock(print_mutex);
      std::printf("G %s %s %llu %d\n", spec.name().c_str(), name,
                  static_cast<unsigned long long>(print.normalized), print.signature);
    } catch (const std::exception& error) {
      std::lock_guard<std::mutex> lock(print_mutex);
      std::printf("X %s: %s\n", spec.name().c_str(), error.what());
    }
  };

  if (options.expect_disk_hit) get_once(specs[0]);  // must come from the read-only cache

  std::atomic<bool> done{false};
  std::thread disruptor;
  const fs::path dir = options.dir;
  if (options.scenario == "vanish") {
    disruptor = std::thread([&] {
      while (!done.load()) {
        std::error_code ec;
        fs::remove_all(dir, ec);
        sleep_ms(2);
      }
    });
  } else if (options.scenario == "swap-for-file") {
    disruptor = std::thread([&] {
      sleep_ms(20);
      // Until a regular file holds the path (a concurrent store may recreate the directory
      // between the removal and the file's creation).
      for (std::error_code ec; !fs::is_regular_file(dir, ec); sleep_ms(1)) {
        fs::remove_all(dir, ec);
        std::ofstream(dir) << "not a directory\n";
      }
    });
  }
  std::vector<std::thread> threads;
  for (int t = 0; t < options.threads; ++t) {
    threads.emplace_back([&, t] {
      for (int r = 0; r < options.rounds; ++r)
        get_once(specs[static_cast<std::size_t>(t + r) % specs.size()]);
    });
  }
  for (auto& thread : threads) thread.join();
  done = true;
  if (disruptor.joinable()) disruptor.join();
  // One more get once the trouble is over (after swap-for-file, the path is surely a file).
  get_once(specs[1]);
  std::fflush(stdout);
  return 0;
}

// Every directory from `path` up to / can be searched by other users (so a child that gave up
// root can reach `path`).
bool searchable_by_others(const fs::path& path) {
  for (fs::path p = fs::absolute(path);; p = p.parent_path()) {
    struct stat st {};
    if (::stat(p.c_str(), &st) != 0 || !(st.st_mode & S_IXOTH)) return false;
    if (p == p.root_path() || p.parent_path() == p) return true;
  }
}

int run_hostile(HostileOptions options) {
  Verdict verdict("hostile");
  Logger::instance().set_level(LogLevel::off);
  WorkDir work(options.dir, "hostile", options.keep);
  const bool as_root = ::geteuid() == 0;
  // As root, the read-only scenarios run in a child that becomes `nobody`; it must be able to
  // reach their directories.
  std::unique_ptr<WorkDir> public_work;
  fs::path ro_base = work.path();
  if (as_root) {
    fs::permissions(ro_base, fs::perms(0755));
    if (!searchable_by_others(ro_base)) {
      public_work =
          std::make_unique<WorkDir>(fs::temp_directory_path(), "astrai-hostile", options.keep);
      ro_base = public_work->path();
      fs::permissions(ro_base, fs::perms(0755));
    }
  }

  const auto specs = rotary_pool(kHostileVariants);
  ReferenceBook book(specs);
  fmt::print("hostile: each scenario is a child process: {} threads x {} gets with fresh engines, "
             "plus one after{}\n",
             options.threads, options.rounds,
             as_root ? "; running as root, so read-only scenarios give up root (uid 65534)" : "");

  struct Scenario {
    std::string name;
    std::string setup;
    fs::path cache_dir;
    bool drop_root = false;
    bool expect_disk_hit = false;
    bool disk_allowed = false;  // may the child see disk hits (beyond the warm variant)?
    int min_warnings = 1, max_warnings = 1;
    std::function<void(Verdict&)> after;
  };
  std::vector<Scenario> scenarios;

  {
    const fs::path dir = ro_base / "ro-empty";
    fs::create_directories(dir);
    fs::permissions(dir, fs::perms(0555));
    scenarios.push_back({"read-only", "chmod 0555, empty", dir, true, false, false, 1, 1,
                         [dir](Verdict& v) {
                           if (!tree_snapshot(dir).empty())
                             v.fail("read-only: files appeared in {}", dir.string());
                         }});
  }
  {
    const fs::path dir = ro_base / "ro-warm";
    {
      JitEngine warm(engine_config(dir));
      warm.get(specs[0]);
    }
    for (fs::recursive_directory_iterator it(dir), end; it != end; ++it)
      fs::permissions(it->path(), it->is_directory() ? fs::perms(0555) : fs::perms(0444));
    fs::permissions(dir, fs::perms(0555));
    auto before = std::make_shared<std::map<std::string, std::uintmax_t>>(tree_snapshot(dir));
    scenarios.push_back({"read-only-warm", "chmod 0555, holding one entry", dir, true, true, false,
                         1, 1, [dir, before](Verdict& v) {
                           if (tree_snapshot(dir) != *before)
                             v.fail("read-only-warm: the directory changed");
                         }});
  }
  {
    const fs::path file = work.path() / "a-file";
    std::ofstream(file) << "x";
    scenarios.push_back({"below-a-file", "cache dir below a regular file", file / "cache", false,
                         false, false, 1, 1, nullptr});
  }
  {
    const fs::path file = work.path() / "plain-file";
    std::ofstream(file) << "x";
    scenarios.push_back({"is-a-file", "cache dir is a regular file", file, false, false, false, 1,
                         1, [file](Verdict& v) {
                           std::error_code ec;
                           if (!fs::is_regular_file(file, ec) || fs::file_size(file, ec) != 1)
                             v.fail("is-a-file: the file was changed");
                         }});
  }
  {
    const fs::path dir = work.path() / "full";
    scenarios.push_back({"full-disk", "RLIMIT_FSIZE 1 KiB (stores get EFBIG)", dir, false, false,
                         false, 1, 1, [dir](Verdict& v) {
                           if (!temp_files(dir).empty()) v.fail("full-disk: temp files were left");
                           DiskCache cache(dir, CacheMode::read_only, 0);
                           if (!cache.list().empty()) v.fail("full-disk: entries were published");
                         }});
  }
  {
    const fs::path dir = work.path() / "vanish";
    // The cache works between removals (so disk hits are fine); at most one warning.
    scenarios.push_back({"vanish", "rm -rf every 2 ms during the gets", dir, false, false, true, 0,
                         1, [dir](Verdict& v) {
                           DiskCache cache(dir, CacheMode::read_only, 0);
                           for (const auto& info : cache.verify(false))
                             if (!info.valid)
                               v.fail("vanish: entry {} does not verify", info.path.string());
                         }});
  }
  {
    const fs::path dir = work.path() / "swap";
    scenarios.push_back({"swap-for-file", "rm -rf, then a file at the path, mid-run", dir, false,
                         false, true, 1, 1, [dir](Verdict& v) {
                           std::error_code ec;
                           if (!fs::is_regular_file(dir, ec))
                             v.fail("swap-for-file: the path is no longer a file");
                         }});
  }

  fmt::print("  {:<15} {:<40} {:>5} {:>5} {:>8} {:>8}  {}\n", "scenario", "setup", "gets",
             "disk", "compiled", "warnings", "verdict");
  for (auto& scenario : scenarios) {
    const std::uint64_t before = verdict.count();
    std::vector<std::string> args = {"__hostile-child", "--scenario", scenario.name, "--dir",
                                     scenario.cache_dir.string(), "--threads",
                                     std::to_string(options.threads), "--rounds",
                                     std::to_string(options.rounds)};
    if (scenario.drop_root) args.push_back("--drop-root");
    if (scenario.expect_disk_hit) args.push_back("--expect-disk-hit");
    const Captured child = run_captured(args);
    if (!exited_ok(child.status))
      verdict.fail("{}: the child ended with {}", scenario.name, describe_status(child.status));

    std::uint64_t gets = 0, disk = 0, compiled = 0;
    const auto out_lines = split_lines(child.out);
    for (std::size_t i = 0; i < out_lines.size(); ++i) {
      std::istringstream fields(out_lines[i]);
      std::string tag, name, source;
      Fingerprint print;
      fields >> tag;
      if (tag != "G") {
        verdict.fail("{}: {}", scenario.name, out_lines[i]);
        continue;
      }
      fields >> name >> source >> print.normalized >> print.signature;
      ++gets;
      compiled += source == "compiled";
      if (source == "disk") {
        ++disk;
        // A read-only cache serves what it holds (the warm variant), and only that.
        const bool expected = scenario.expect_disk_hit && name == specs[0].name();
        if (!expected && !scenario.disk_allowed)
          verdict.fail("{}: {} came from disk although the cache is unusable", scenario.name, name);
      } else if (scenario.expect_disk_hit && i == 0) {
        verdict.fail("{}: the warm entry was not served from the read-only cache ({})",
                     scenario.name, source);
      }
      if (book.check(name, print) == ReferenceBook::Match::different)
        verdict.fail("{}: {} returned a wrong binary", scenario.name, name);
    }
    const std::uint64_t expected_gets =
        static_cast<std::uint64_t>(options.threads) * static_cast<std::uint64_t>(options.rounds) +
        1 + (scenario.expect_disk_hit ? 1 : 0);
    if (gets != expected_gets)
      verdict.fail("{}: {} gets succeeded, expected {}", scenario.name, gets, expected_gets);

    int warnings = 0;
    for (const auto& line : split_lines(child.err)) {
      if (line.rfind("astrai-jit: warning: kernel cache at ", 0) == 0 &&
          line.find("is not usable") != std::string::npos)
        ++warnings;
      else
        verdict.fail("{}: unexpected stderr line: {}", scenario.name, line);
    }
    if (warnings < scenario.min_warnings || warnings > scenario.max_warnings)
      verdict.fail("{}: {} warnings, expected {}", scenario.name, warnings,
                   scenario.min_warnings == scenario.max_warnings
                       ? std::to_string(scenario.min_warnings)
                       : fmt::format("{} to {}", scenario.min_warnings, scenario.max_warnings));
    if (scenario.after) scenario.after(verdict);
    fmt::print("  {:<15} {:<40} {:>5} {:>5} {:>8} {:>8}  {}\n", scenario.name, scenario.setup,
               gets, disk, compiled, warnings, verdict.count() == before ? "ok" : "FAILED");
  }
  fmt::print("  binaries: {}\n", book.summary());
  return verdict.finish();
}


}  // namespace astrai::torture
