// crash: a child compiling and publishing is SIGKILLed at a random moment; only complete
// entries remain and the dead holder's lock is free at once.
#include "tests/torture/torture.hpp"

namespace astrai::torture {

// =============================================================================================
// crash

// Child: force-compiles and publishes the rotating set forever, one fresh engine per variant,
// writing "B i t" before and "E i t" after each get() to descriptor 3 (t: steady clock ns).
// The parent kills it.
int crash_child(const std::string& dir, std::size_t start, std::size_t keys) {
  Logger::instance().set_level(LogLevel::off);
  const auto specs = rotary_pool(keys);
  const EnvConfig config = engine_config(dir, true);
  auto marker = [](char tag, std::size_t i) {
    char line[64];
    const int n = std::snprintf(line, sizeof line, "%c %zu %lld\n", tag, i,
                                static_cast<long long>(now_ns()));
    if (::write(3, line, static_cast<std::size_t>(n)) != n) ::_exit(5);
  };
  for (std::size_t i = start % specs.size();; i = (i + 1) % specs.size()) {
    marker('B', i);
    JitEngine engine(config);
    engine.get(specs[i]);
    marker('E', i);
    sleep_ms(5);  // an idle moment after a publish, for kills to land in
  }
}

int run_crash(CrashOptions options) {
  Verdict verdict("crash");
  Logger::instance().set_level(LogLevel::off);
  if (options.seed == 0) options.seed = fresh_seed();
  WorkDir work(options.dir, "crash", options.keep);
  const fs::path root = work.path() / "cache";
  std::mt19937_64 rng(options.seed);

  const auto specs = rotary_pool(options.keys);
  ReferenceBook book(specs);
  DiskCache cache(root, CacheMode::read_write, 0);
  std::vector<CacheKey> keys;
  std::vector<fs::path> paths;
  {
    JitEngine probe(engine_config({}, false, false, CacheMode::off));
    for (const auto& spec : specs) {
      keys.push_back(probe.key_for(spec));
      paths.push_back(cache.entry_path(keys.back(), spec.name()));
    }
  }
  fmt::print("crash: {} trials, {} rotating variants force-compiled and published by a child "
             "killed with SIGKILL after 0..{} ms, seed {}\n",
             options.trials, specs.size(), options.max_delay_ms, options.seed);

  enum Phase { startup, compiling, publishing, renamed, after_publish, phase_count };
  const char* const kPhaseNames[] = {
      "before its first get() (process start)",
      "in get(), before publishing (lock or compile)",
      "in get(), publishing (temp file written, not renamed)",
      "in get(), after the rename (entry complete)",
      "after get() returned (entry published)"};
  std::uint64_t phase_counts[phase_count] = {};
  double max_lock_wait = 0, total_lock_wait = 0;
  std::uint64_t temps_seen = 0, next_disk = 0, next_compiled = 0, entries_checked = 0;
  std::uint64_t aimed_trials = 0;
  // When the first get() of a child returns, relative to its spawn (learned from the markers):
  // aimed trials kill in the last milliseconds before that, where the entry is written.
  std::vector<double> first_publish_ms;
  const auto start = now_ns();

  for (int trial = 0; trial < options.trials; ++trial) {
    std::vector<ino_t> inode_before(keys.size(), 0);
    for (std::size_t i = 0; i < keys.size(); ++i) {
      struct stat st {};
      if (::stat(paths[i].c_str(), &st) == 0) inode_before[i] = st.st_ino;
    }
    const auto temps_before = temp_files(root);

    int markers[2];
    if (::pipe2(markers, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
    ChildIo io;
    io.marker_fd = markers[1];
    const std::size_t first_key = static_cast<std::size_t>(trial) % keys.size();
    const auto spawned = now_ns();
    const pid_t pid = spawn_self({"__crash-child", "--dir", root.string(), "--start",
                                  std::to_string(first_key), "--keys", std::to_string(keys.size())},
                                 io);
    ::close(markers[1]);
    double delay = std::uniform_real_distribution<double>(0, options.max_delay_ms)(rng);
    if (!first_publish_ms.empty() &&
        std::uniform_real_distribution<double>(0, 1)(rng) < options.aimed) {
      std::vector<double> sorted = first_publish_ms;
      const auto middle = sorted.begin() + static_cast<std::ptrdiff_t>(sorted.size() / 2);
      std::nth_element(sorted.begin(), middle, sorted.end());
      const double median = sorted[sorted.size() / 2];
      delay = std::clamp(median + std::uniform_real_distribution<double>(-12, 2)(rng), 0.0,
                         options.max_delay_ms);
      ++aimed_trials;
    }
    const double elapsed = ms(now_ns() - spawned);
    if (delay > elapsed) sleep_ms(delay - elapsed);
    ::kill(pid, SIGKILL);
    const int status = wait_raw(pid);
    if (status == -1 || !WIFSIGNALED(status) || WTERMSIG(status) != SIGKILL)
      verdict.fail("trial {}: the child ended with {} before the kill", trial,
                   describe_status(status));

    std::string text;
    char buffer[4096];
    for (;;) {
      const ssize_t n = ::read(markers[0], buffer, sizeof buffer);
      if (n > 0) text.append(buffer, static_cast<std::size_t>(n));
      else if (n == 0 || errno != EINTR) break;
    }
    ::close(markers[0]);
    const auto lines = split_lines(text);
    for (const auto& line : lines) {
      char tag = 0;
      std::size_t index = 0;
      long long at = 0;
      if ((std::istringstream(line) >> tag >> index >> at) && tag == 'E') {
        first_publish_ms.push_back(ms(at - spawned));
        if (first_publish_ms.size() > 64) first_publish_ms.erase(first_publish_ms.begin());
        break;
      }
    }

    // Where did the kill land?
    std::size_t in_flight = first_key;
    Phase phase = startup;
    if (!lines.empty()) {
      char tag = 0;
      std::istringstream(lines.back()) >> tag >> in_flight;
      in_flight %= keys.size();
      if (tag == 'E') {
        phase = after_publish;
      } else {
        struct stat st {};
        const bool replaced = ::stat(paths[in_flight].c_str(), &st) == 0 &&
                              st.st_ino != inode_before[in_flight];
        const auto temps_now = temp_files(root);
        const bool new_temp =
            std::any_of(temps_now.begin(), temps_now.end(), [&](const fs::path& p) {
              return temps_before.count(p) == 0 &&
                     p.parent_path() == paths[in_flight].parent_path();
            });
        phase = replaced ? renamed : new_temp ? publishing : compiling;
      }
    }
    ++phase_counts[phase];

    // The next process to want that key gets its lock at once: the kernel released it.
    const auto lock_start = now_ns();
    auto lock = cache.lock_key(keys[in_flight], JitEngine::kLockWait);
    const double lock_wait = ms(now_ns() - lock_start);
    if (!lock)
      verdict.fail("trial {}: the lock of {} could not be taken", trial, specs[in_flight].name());
    lock.reset();
    max_lock_wait = std::max(max_lock_wait, lock_wait);
    total_lock_wait += lock_wait;
    if (lock_wait > kLockWaitBoundMs)
      verdict.fail("trial {}: waited {:.1f} ms for the lock of a killed holder (bound {} ms)",
                   trial, lock_wait, kLockWaitBoundMs);

    // Only complete, valid entries, each holding a correct binary.
    for (const auto& info : cache.verify(false)) {
      ++entries_checked;
      std::string name;
      const auto print = info.valid ? entry_file_fingerprint(info.path, &name) : std::nullopt;
      if (!info.valid || !print || name != info.variant_name ||
          book.check(name, *print) == ReferenceBook::Match::different)
        verdict.fail("trial {}: {} is not a complete, valid entry", trial, info.path.string());
    }

    // The next process's get() of the in-flight variant succeeds with a correct binary.
    try {
      JitEngine next(engine_config(root));
      VariantSource source = VariantSource::memory;
      const auto variant = next.get(specs[in_flight], &source);
      if (book.check(specs[in_flight].name(), fingerprint(*variant)) ==
          ReferenceBook::Match::different)
        verdict.fail("trial {}: the next get of {} returned a wrong binary", trial,
                     specs[in_flight].name());
      if (source == VariantSource::disk) ++next_disk;
      else ++next_compiled;
    } catch (const std::exception& error) {
      verdict.fail("trial {}: the next get of {} threw: {}", trial, specs[in_flight].name(),
                   error.what());
    }
    for (const auto& temp : temp_files(root)) temps_seen += temps_before.count(temp) == 0 ? 1 : 0;
  }
  const double wall = ms(now_ns() - start) / 1000;

  // Temp files of killed writers are never listed as entries and go once they are stale.
  const auto leftover = temp_files(root);
  for (const auto& info : cache.list())
    if (is_temp_name(info.path.filename().string()))
      verdict.fail("a temp file is listed as an entry: {}", info.path.string());
  for (const auto& temp : leftover) {
    std::error_code ec;
    fs::last_write_time(temp, fs::file_time_type::clock::now() - std::chrono::hours(2), ec);
  }
  const std::size_t entries_before_prune = cache.list().size();
  cache.prune(std::numeric_limits<std::uint64_t>::max());
  const std::size_t temps_after_prune = temp_files(root).size();
  if (temps_after_prune != 0)
    verdict.fail("{} stale temp files survived a prune", temps_after_prune);
  if (cache.list().size() != entries_before_prune)
    verdict.fail("pruning stale temp files removed entries");

  fmt::print("  trials: {} kills in {:.1f} s ({} aimed at the first publish, the rest at a "
             "uniform 0..{} ms)\n",
             options.trials, wall, aimed_trials, options.max_delay_ms);
  fmt::print("  kills landed:\n");
  for (int p = 0; p < phase_count; ++p)
    fmt::print("    {:6}  {}\n", phase_counts[p], kPhaseNames[p]);
  fmt::print("  lock of the killed holder's key: max wait {:.3f} ms, mean {:.3f} ms "
             "(bound {} ms)\n",
             max_lock_wait, options.trials > 0 ? total_lock_wait / options.trials : 0.0,
             kLockWaitBoundMs);
  fmt::print("  entries checked after kills: {}, all complete and valid; next get: {} disk hits, "
             "{} compiles\n",
             entries_checked, next_disk, next_compiled);
  fmt::print("  binaries: {}\n", book.summary());
  fmt::print("  temp files left by kills: {} ({} at the end, {} after a prune once stale)\n",
             temps_seen, leftover.size(), temps_after_prune);
  return verdict.finish();
}


}  // namespace astrai::torture
