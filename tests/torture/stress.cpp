// stress: processes x threads calling JitEngine::get() on overlapping variants, a pruner, force
// compiles; afterwards every entry verifies and every repeated compile is explained.
#include "tests/torture/torture.hpp"

namespace astrai::torture {

// =============================================================================================
// stress

// One worker process: M threads get() random variants, mostly through a process-wide engine
// that is replaced every 250 ms, sometimes through a private engine made for that one call
// (so both the in-process single flight and the cross-engine file lock are exercised).
// Log lines: "S" totals, "C variant t0 t1 raw" per compile, "H variant source raw normalized
// signature" per distinct result, "E text" per failure.
int stress_worker(const WorkerOptions& options) {
  Logger::instance().set_level(LogLevel::off);
  const auto specs = rotary_pool(options.variants);
  const EnvConfig config = engine_config(options.dir, options.force);

  std::atomic<std::uint64_t> counted_compiles{0}, counted_disk{0}, counted_memory{0};
  std::atomic<std::uint64_t> degraded_engines{0};
  auto make_engine = [&] {
    return std::shared_ptr<JitEngine>(new JitEngine(config), [&](JitEngine* engine) {
      counted_compiles += engine->counters().compiles.load();
      counted_disk += engine->counters().disk_hits.load();
      counted_memory += engine->counters().memory_hits.load();
      if (!engine->cache().usable_for_write()) ++degraded_engines;
      delete engine;
    });
  };

  struct CompileEvent {
    std::size_t variant;
    std::int64_t t0, t1;
    std::uint64_t raw;
  };
  struct Result {
    std::size_t variant;
    char source;
    std::uint64_t raw, normalized;
    int signature;
    bool operator<(const Result& o) const {
      return std::tie(variant, source, raw) < std::tie(o.variant, o.source, o.raw);
    }
  };
  struct ThreadLog {
    std::uint64_t gets = 0, memory = 0, disk = 0, compiled = 0, errors = 0;
    std::vector<CompileEvent> compiles;
    std::set<Result> results;
    std::vector<std::string> error_texts;
  };
  std::vector<ThreadLog> logs(static_cast<std::size_t>(options.threads));

  std::mutex shared_mutex;
  std::shared_ptr<JitEngine> shared = make_engine();
  std::vector<std::thread> threads;
  for (int t = 0; t < options.threads; ++t) {
    threads.emplace_back([&, t] {
      ThreadLog& log = logs[static_cast<std::size_t>(t)];
      std::mt19937_64 rng(options.seed ^ (static_cast<std::uint64_t>(options.id) << 20) ^
                          static_cast<std::uint64_t>(t));
      std::int64_t next_swap = now_ns() + 250'000'000;
      while (now_ns() < options.until) {
        if (t == 0 && now_ns() >= next_swap) {
          auto fresh = make_engine();
          std::lock_guard<std::mutex> lock(shared_mutex);
          shared.swap(fresh);
          next_swap = now_ns() + 250'000'000;
        }
        std::shared_ptr<JitEngine> engine;
        if (rng() % 3 == 0) {
          engine = make_engine();
        } else {
          std::lock_guard<std::mutex> lock(shared_mutex);
          engine = shared;
        }
        const std::size_t v = static_cast<std::size_t>(rng() % specs.size());
        VariantSource source = VariantSource::memory;
        const std::int64_t t0 = now_ns();
        try {
          const auto variant = engine->get(specs[v], &source);
          const std::int64_t t1 = now_ns();
          const Fingerprint print = fingerprint(*variant);
          ++log.gets;
          char tag = 'm';
          switch (source) {
            case VariantSource::memory: ++log.memory; break;
            case VariantSource::remote:  // never: the harness configures no remote tier
            case VariantSource::disk:
              ++log.disk;
              tag = 'd';
              break;
            case VariantSource::compiled:
              ++log.compiled;
              tag = 'c';
              log.compiles.push_back({v, t0, t1, print.raw});
              break;
          }
          log.results.insert({v, tag, print.raw, print.normalized, print.signature});
        } catch (const std::exception& error) {
          ++log.errors;
          if (log.error_texts.size() < 5) log.error_texts.push_back(error.what());
        }
        engine.reset();
        if (options.pause_us > 0) sleep_ms(options.pause_us / 1000.0);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  shared.reset();

  ThreadLog total;
  for (const auto& log : logs) {
    total.gets += log.gets;
    total.memory += log.memory;
    total.disk += log.disk;
    total.compiled += log.compiled;
    total.errors += log.errors;
  }
  std::ofstream out(options.log, std::ios::trunc);
  out << fmt::format("S {} {} {} {} {} {} {} {} {} {} {}\n", options.id, options.force ? 1 : 0,
                     total.gets, total.memory, total.disk, total.compiled, total.errors,
                     counted_compiles.load(), counted_disk.load(), counted_memory.load(),
                     degraded_engines.load());
  for (const auto& log : logs) {
    for (const auto& event : log.compiles)
      out << fmt::format("C {} {} {} {}\n", event.variant, event.t0, event.t1, event.raw);
    for (const auto& result : log.results)
      out << fmt::format("H {} {} {} {} {}\n", result.variant, result.source, result.raw,
                         result.normalized, result.signature);
    for (const auto& text : log.error_texts) {
      std::string line = text;
      std::replace(line.begin(), line.end(), '\n', ' ');
      out << "E " << line << "\n";
    }
  }
  out.close();
  return out ? 0 : 3;
}

// The pruner: DiskCache::prune to a small cap in a loop. An inotify watch on every shard
// directory records exactly which entries were removed in each time window; a window runs
// from the previous read of the events to this one, so the windows cover the whole run.
int stress_pruner(const PrunerOptions& options) {
  Logger::instance().set_level(LogLevel::off);
  DiskCache cache(options.dir, CacheMode::read_write, 0);
  const fs::path entries = fs::path(options.dir) / "v1";
  const int inotify = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  bool watching = inotify >= 0;
  for (int shard = 0; shard < 256; ++shard) {
    const fs::path dir = entries / fmt::format("{:02x}", shard);
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (watching && ::inotify_add_watch(inotify, dir.c_str(), IN_DELETE) < 0) watching = false;
  }
  std::ofstream out(options.log, std::ios::trunc);
  if (!watching) out << "N inotify unavailable\n";

  auto drain = [&](std::set<std::string>* keys, bool* overflow) {
    if (!watching) return;
    alignas(inotify_event) char buffer[16384];
    for (;;) {
      const ssize_t n = ::read(inotify, buffer, sizeof buffer);
      if (n <= 0) return;
      for (ssize_t at = 0; at < n;) {
        const auto* event = reinterpret_cast<const inotify_event*>(buffer + at);
        if (event->mask & IN_Q_OVERFLOW) *overflow = true;
        if (event->len > 0) {
          const std::string key = entry_key_of(event->name);
          if (!key.empty()) keys->insert(key);
        }
        at += static_cast<ssize_t>(sizeof(inotify_event) + event->len);
      }
    }
  };
  auto write_window = [&](std::int64_t from, std::int64_t to, std::uint64_t freed) {
    std::set<std::string> keys;
    bool overflow = !watching;
    drain(&keys, &overflow);
    out << fmt::format("P {} {} {} {} {}", from, to, freed, overflow ? 1 : 0, keys.size());
    for (const auto& key : keys) out << ' ' << key;
    out << '\n';
  };

  std::int64_t window_start = now_ns();
  while (now_ns() < options.until) {
    const std::uint64_t freed = cache.prune(options.cap);
    const std::int64_t window_end = now_ns();
    write_window(window_start, window_end, freed);
    window_start = window_end;
    sleep_ms(options.interval_ms);
  }
  // Whatever was removed after the last pass (nothing should be) still lands in a window.
  write_window(window_start, std::numeric_limits<std::int64_t>::max(), 0);
  out.close();
  if (inotify >= 0) ::close(inotify);
  return out ? 0 : 3;
}

int run_stress(StressOptions options) {
  Verdict verdict("stress");
  Logger::instance().set_level(LogLevel::off);
  if (options.seed == 0) options.seed = fresh_seed();
  if (options.force_procs < 0) options.force_procs = options.procs >= 2 ? 1 : 0;
  options.force_procs = std::min(options.force_procs, options.procs);
  WorkDir work(options.dir, "stress", options.keep);
  const fs::path root = work.path() / "cache";
  const fs::path logs = work.path() / "logs";
  fs::create_directories(logs);

  const auto specs = rotary_pool(options.variants);
  const auto reference_start = now_ns();
  ReferenceBook book(specs);
  std::map<std::string, std::size_t> index_of_key;
  std::vector<std::string> key_of(specs.size());
  std::uint64_t entry_bytes = 0;
  {
    JitEngine probe(engine_config({}, false, false, CacheMode::off));
    for (std::size_t i = 0; i < specs.size(); ++i) {
      key_of[i] = probe.key_for(specs[i]).hex();
      index_of_key[key_of[i]] = i;
      entry_bytes += book.entry_bytes(specs[i].name());
    }
  }
  if (options.prune_cap == 0) options.prune_cap = std::max<std::uint64_t>(1, entry_bytes / 4);
  fmt::print("stress: {} worker processes ({} with force_compile) x {} threads + 1 pruner, {} "
             "variants ({} KiB of entries), prune to {} KiB every {} ms, {} s, seed {}\n",
             options.procs, options.force_procs, options.threads, specs.size(), entry_bytes / 1024,
             options.prune_cap / 1024, options.prune_interval_ms, options.seconds, options.seed);
  fmt::print("  reference compiles: {} variants in {:.1f} s\n", specs.size(),
             ms(now_ns() - reference_start) / 1000);

  const std::int64_t run_start = now_ns();
  const std::int64_t until = run_start + static_cast<std::int64_t>(options.seconds * 1e9);
  const fs::path pruner_log = logs / "pruner.log";
  const pid_t pruner = spawn_self({"__stress-pruner", "--dir", root.string(), "--cap",
                                   std::to_string(options.prune_cap), "--interval",
                                   std::to_string(options.prune_interval_ms), "--until",
                                   std::to_string(until), "--log", pruner_log.string()});
  std::vector<pid_t> workers;
  std::vector<fs::path> worker_logs;
  for (int id = 0; id < options.procs; ++id) {
    const bool force = id < options.force_procs;
    worker_logs.push_back(logs / fmt::format("worker-{}.log", id));
    workers.push_back(spawn_self(
        {"__stress-worker", "--dir", root.string(), "--id", std::to_string(id), "--threads",
         std::to_string(options.threads), "--variants", std::to_string(options.variants),
         "--until", std::to_string(until), "--force", force ? "1" : "0", "--pause-us",
         std::to_string(options.pause_us), "--seed", std::to_string(options.seed), "--log",
         worker_logs.back().string()}));
  }
  for (std::size_t i = 0; i < workers.size(); ++i) {
    const int status = wait_raw(workers[i]);
    if (!exited_ok(status)) verdict.fail("worker {} ended with {}", i, describe_status(status));
  }
  if (const int status = wait_raw(pruner); !exited_ok(status))
    verdict.fail("the pruner ended with {}", describe_status(status));
  const double wall = ms(now_ns() - run_start) / 1000;

  // --- Collect the worker logs.
  struct Compile {
    std::int64_t t0, t1;
    bool force;
    int worker;
  };
  struct Got {
    std::size_t variant;
    char source;
    Fingerprint print;
    int worker;
  };
  std::map<std::size_t, std::vector<Compile>> compiles;  // by variant
  std::map<std::size_t, std::set<std::uint64_t>> compiled_raw;
  std::vector<Got> results;
  std::uint64_t gets = 0, memory = 0, disk = 0, compiled = 0, errors = 0;
  for (std::size_t w = 0; w < worker_logs.size(); ++w) {
    std::ifstream in(worker_logs[w]);
    if (!in) {
      verdict.fail("worker {} wrote no log", w);
      continue;
    }
    bool force = false;
    for (std::string line; std::getline(in, line);) {
      std::istringstream fields(line);
      char tag = 0;
      fields >> tag;
      if (tag == 'S') {
        int id = 0, force_flag = 0;
        std::uint64_t g = 0, m = 0, d = 0, c = 0, e = 0, cc = 0, cd = 0, cm = 0, degraded = 0;
        fields >> id >> force_flag >> g >> m >> d >> c >> e >> cc >> cd >> cm >> degraded;
        force = force_flag != 0;
        gets += g;
        memory += m;
        disk += d;
        compiled += c;
        errors += e;
        if (cc != c || cd != d || cm != m)
          verdict.fail("worker {}: JitCounters (compiles {}, disk hits {}, memory hits {}) "
                       "disagree with what get() reported (compiled {}, disk {}, memory {})",
                       w, cc, cd, cm, c, d, m);
        if (e != 0) verdict.fail("worker {}: {} get() calls threw", w, e);
        if (degraded != 0)
          verdict.fail("worker {}: {} engines degraded to memory-only on a healthy directory", w,
                       degraded);
      } else if (tag == 'C') {
        std::size_t variant = 0;
        Compile event{};
        std::uint64_t raw = 0;
        fields >> variant >> event.t0 >> event.t1 >> raw;
        event.force = force;
        event.worker = static_cast<int>(w);
        compiles[variant].push_back(event);
        compiled_raw[variant].insert(raw);
      } else if (tag == 'H') {
        Got got{};
        fields >> got.variant >> got.source >> got.print.raw >> got.print.normalized >>
            got.print.signature;
        got.worker = static_cast<int>(w);
        results.push_back(got);
      } else if (tag == 'E') {
        verdict.fail("worker {}: {}", w, line.substr(2));
      }
    }
  }

  // --- Every binary any process got: equal to a fresh compile (up to the module id), and a
  // disk hit byte-equal to what some process of this run compiled.
  std::uint64_t results_checked = 0;
  for (const auto& got : results) {
    if (got.variant >= specs.size()) {
      verdict.fail("worker {} logged an unknown variant {}", got.worker, got.variant);
      continue;
    }
    ++results_checked;
    const std::string& name = specs[got.variant].name();
    if (book.check(name, got.print) == ReferenceBook::Match::different)
      verdict.fail("worker {} got a binary for {} ({}) that differs from a fresh compile",
                   got.worker, name, got.source == 'd' ? "disk hit" : "compiled or memory");
    if (got.source == 'd' && compiled_raw[got.variant].count(got.print.raw) == 0)
      verdict.fail("worker {} loaded bytes for {} from disk that no process compiled", got.worker,
                   name);
  }

  // --- The pruner's removal windows.
  struct Window {
    std::int64_t lo, hi;
    bool all;
    std::set<std::string> keys;
  };
  std::vector<Window> windows;
  std::uint64_t passes = 0, pruned_entries = 0, freed_bytes = 0;
  bool watched = true;
  {
    std::ifstream in(pruner_log);
    if (!in) verdict.fail("the pruner wrote no log");
    for (std::string line; std::getline(in, line);) {
      std::istringstream fields(line);
      char tag = 0;
      fields >> tag;
      if (tag == 'N') watched = false;
      if (tag != 'P') continue;
      Window window{};
      std::uint64_t freed = 0;
      std::size_t count = 0;
      int overflow = 0;
      fields >> window.lo >> window.hi >> freed >> overflow >> count;
      window.all = overflow != 0;
      for (std::size_t i = 0; i < count; ++i) {
        std::string key;
        fields >> key;
        window.keys.insert(key);
      }
      ++passes;
      freed_bytes += freed;
      pruned_entries += window.keys.size();
      windows.push_back(std::move(window));
    }
    if (passes > 0) --passes;  // the last window is the after-run check, not a prune
  }

  // --- Every compile after a key's first must be explained. The file lock serializes the
  // compiles of one key, so between two consecutive ones the entry existed (published by the
  // earlier) unless something removed it, and the only remover here is the pruner. A removal
  // explains a repeat when it happened within the union of both get() intervals (so the
  // order in which the two processes read the clock does not matter).
  std::uint64_t first = 0, force_repeats = 0, pruned_repeats = 0, unexplained = 0;
  std::size_t max_per_key = 0;
  for (auto& [variant, events] : compiles) {
    std::sort(events.begin(), events.end(),
              [](const Compile& a, const Compile& b) { return a.t1 < b.t1; });
    max_per_key = std::max(max_per_key, events.size());
    const std::string& key = key_of[variant];
    for (std::size_t j = 0; j < events.size(); ++j) {
      if (j == 0) {
        ++first;
        continue;
      }
      const Compile& previous = events[j - 1];
      const Compile& event = events[j];
      if (event.force) {
        ++force_repeats;
        continue;
      }
      const std::int64_t lo = std::min(previous.t0, event.t0);
      const std::int64_t hi = std::max(previous.t1, event.t1);
      const bool explained = std::any_of(windows.begin(), windows.end(), [&](const Window& w) {
        return (w.all || w.keys.count(key) != 0) && w.hi >= lo && w.lo <= hi;
      });
      if (explained) {
        ++pruned_repeats;
        continue;
      }
      ++unexplained;
      verdict.fail("{} compiled again by worker {} ({:.0f}..{:.0f} ms) after worker {} "
                   "({:.0f}..{:.0f} ms) with no removal of its entry in between",
                   specs[variant].name(), event.worker, ms(event.t0 - run_start),
                   ms(event.t1 - run_start), previous.worker, ms(previous.t0 - run_start),
                   ms(previous.t1 - run_start));
    }
  }

  // --- The directory: every entry verifies and holds bytes some process compiled.
  DiskCache cache(root, CacheMode::read_write, 0);
  const auto checked = cache.verify(false);
  std::uint64_t valid = 0;
  for (const auto& info : checked) {
    if (!info.valid) {
      verdict.fail("entry {} does not verify", info.path.string());
      continue;
    }
    ++valid;
    std::string name;
    const auto print = entry_file_fingerprint(info.path, &name);
    const auto it = index_of_key.find(info.key_hex);
    if (!print || it == index_of_key.end() || name != specs[it->second].name() ||
        book.check(name, *print) == ReferenceBook::Match::different ||
        compiled_raw[it->second].count(print->raw) == 0)
      verdict.fail("entry {} does not hold a binary compiled for its key in this run",
                   info.path.string());
  }
  const std::size_t temps = temp_files(root).size();
  if (temps != 0) verdict.fail("{} temp files were left behind although nothing was killed", temps);

  fmt::print("  processes: {} workers x {} threads + 1 pruner, {:.1f} s\n", options.procs,
             options.threads, wall);
  fmt::print("  gets: {} (memory {}, disk hits {}, compiled {}), errors {}\n", gets, memory, disk,
             compiled, errors);
  fmt::print("  compiles: {} = {} first per key + {} by force_compile + {} after the pruner "
             "removed the entry + {} unexplained (most of one key: {})\n",
             first + force_repeats + pruned_repeats + unexplained, first, force_repeats,
             pruned_repeats, unexplained, max_per_key);
  fmt::print("  pruner: {} passes, {} entries removed ({} KiB){}\n", passes, pruned_entries,
             freed_bytes / 1024,
             watched ? "" : " [no inotify: every pass counts as removing every key]");
  fmt::print("  binaries: {} distinct results {}\n", results_checked, book.summary());
  fmt::print("  directory: {} entries, {} verify, {} temp files\n", checked.size(), valid, temps);
  return verdict.finish();
}


}  // namespace astrai::torture
