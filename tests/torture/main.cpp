// astrai-cache-torture: attacks the kernel cache and checks the guarantees the README gives.
//
//   stress   many processes x threads calling JitEngine::get() on overlapping variants while
//            some force compiles and one process prunes to a small cap; afterwards every entry
//            verifies, every binary equals a fresh compile, and every repeated compile of a key
//            is explained by a prune or by force_compile.
//   crash    a child compiling and publishing is SIGKILLed at a random moment; the directory
//            holds only complete entries and the dead holder's lock is free at once.
//   corrupt  entries are damaged in many ways; a fresh engine never serves damaged bytes, it
//            removes or replaces the entry and returns the correct binary.
//   hostile  read-only, full, vanishing and file-shaped cache paths: every get() succeeds and
//            each process prints exactly one warning.
//   trust    another local user's attacks: a rewritten entry in a world-writable cache,
//            foreign and group-writable entries, symbolic links at every path, a held lock;
//            plus a group-shared cache, read-only layers and export/import. Nothing foreign is
//            loaded, nothing outside the cache changes, every binary is correct.
//
// Each verb prints its figures and exits 1 when a guarantee was violated (2: usage error).
// Every run works in a fresh subdirectory of --dir and removes it afterwards (--keep keeps it).
// Verbs whose name starts with "__" are the child processes the others start.
#include <CLI/CLI.hpp>

#include "tests/torture/torture.hpp"

int main(int argc, char** argv) {
  using namespace astrai::torture;
  CLI::App app{"astrai-cache-torture: attacks the kernel cache and checks its guarantees.\n"
               "Each verb prints its figures and exits 1 if a guarantee was violated."};
  app.require_subcommand(1);

  StressOptions stress;
  auto* stress_cmd = app.add_subcommand(
      "stress", "processes x threads get() overlapping variants while one process prunes");
  stress_cmd->add_option("--procs", stress.procs, "worker processes")->check(CLI::Range(1, 256));
  stress_cmd->add_option("--threads", stress.threads, "threads per worker")
      ->check(CLI::Range(1, 256));
  stress_cmd->add_option("--variants", stress.variants, "distinct variants")
      ->check(CLI::Range(std::size_t{1}, kPoolLimit));
  stress_cmd->add_option("--seconds", stress.seconds, "duration")->check(CLI::Range(0.1, 86400.0));
  stress_cmd->add_option("--dir", stress.dir, "work directory (a fresh subdirectory is used)")
      ->required();
  stress_cmd->add_option("--force-procs", stress.force_procs,
                         "workers with force_compile (default: 1 if --procs >= 2)");
  stress_cmd->add_option("--prune-cap", stress.prune_cap,
                         "the pruner's cap in bytes (default: a quarter of all entries)");
  stress_cmd->add_option("--prune-interval-ms", stress.prune_interval_ms, "pause between prunes");
  stress_cmd->add_option("--pause-us", stress.pause_us, "pause between gets in each thread");
  stress_cmd->add_option("--seed", stress.seed, "random seed (0: random)");
  stress_cmd->add_flag("--keep", stress.keep, "keep the work directory");

  CrashOptions crash;
  auto* crash_cmd = app.add_subcommand("crash", "SIGKILL a compiling child at random moments");
  crash_cmd->add_option("--trials", crash.trials, "kills")->check(CLI::Range(1, 10000000));
  crash_cmd->add_option("--dir", crash.dir, "work directory (a fresh subdirectory is used)")
      ->required();
  crash_cmd->add_option("--keys", crash.keys, "size of the rotating variant set")
      ->check(CLI::Range(std::size_t{1}, kPoolLimit));
  crash_cmd->add_option("--max-delay-ms", crash.max_delay_ms, "kill after 0..this many ms")
      ->check(CLI::Range(0.0, 60000.0));
  crash_cmd->add_option("--aimed", crash.aimed,
                        "share of kills aimed at the first publish instead of uniform")
      ->check(CLI::Range(0.0, 1.0));
  crash_cmd->add_option("--seed", crash.seed, "random seed (0: random)");
  crash_cmd->add_flag("--keep", crash.keep, "keep the work directory");

  CorruptOptions corrupt;
  auto* corrupt_cmd = app.add_subcommand(
      "corrupt", "damage entries in many ways and check that none is ever served");
  corrupt_cmd->add_option("--trials", corrupt.trials, "damaged entries")
      ->check(CLI::Range(1, 100000000));
  corrupt_cmd->add_option("--dir", corrupt.dir, "work directory (a fresh subdirectory is used)")
      ->required();
  corrupt_cmd->add_option("--variants", corrupt.variants, "warm variants to damage")
      ->check(CLI::Range(std::size_t{2}, std::size_t{256}));
  corrupt_cmd->add_option("--compile-every", corrupt.compile_every,
                          "every Nth round of damage kinds recompiles (1: all); the others run "
                          "strict")
      ->check(CLI::Range(1, 1000000));
  corrupt_cmd->add_option("--seed", corrupt.seed, "random seed (0: random)");
  corrupt_cmd->add_flag("--keep", corrupt.keep, "keep the work directory");

  HostileOptions hostile;
  auto* hostile_cmd = app.add_subcommand(
      "hostile", "read-only, full, vanishing and file-shaped cache directories");
  hostile_cmd->add_option("--dir", hostile.dir, "work directory (a fresh subdirectory is used)")
      ->required();
  hostile_cmd->add_option("--threads", hostile.threads, "threads per child")
      ->check(CLI::Range(1, 64));
  hostile_cmd->add_option("--rounds", hostile.rounds, "gets per thread")
      ->check(CLI::Range(1, 1000));
  hostile_cmd->add_flag("--keep", hostile.keep, "keep the work directory");

  TrustOptions trust;
  auto* trust_cmd = app.add_subcommand(
      "trust", "another user's attacks, planted links, shared group, layers, export/import");
  trust_cmd->add_option("--dir", trust.dir, "work directory (a fresh subdirectory is used)")
      ->required();
  trust_cmd->add_option("--rounds", trust.rounds, "rounds per scenario")
      ->check(CLI::Range(1, 100000));
  trust_cmd->add_flag("--keep", trust.keep, "keep the work directory");

  // Child processes (not listed in --help).
  WorkerOptions worker;
  int worker_force = 0;
  auto* worker_cmd = app.add_subcommand("__stress-worker")->group("");
  worker_cmd->add_option("--dir", worker.dir)->required();
  worker_cmd->add_option("--id", worker.id);
  worker_cmd->add_option("--threads", worker.threads)->check(CLI::Range(1, 256));
  worker_cmd->add_option("--variants", worker.variants)
      ->check(CLI::Range(std::size_t{1}, kPoolLimit));
  worker_cmd->add_option("--until", worker.until);
  worker_cmd->add_option("--force", worker_force);
  worker_cmd->add_option("--pause-us", worker.pause_us);
  worker_cmd->add_option("--seed", worker.seed);
  worker_cmd->add_option("--log", worker.log)->required();

  PrunerOptions pruner;
  auto* pruner_cmd = app.add_subcommand("__stress-pruner")->group("");
  pruner_cmd->add_option("--dir", pruner.dir)->required();
  pruner_cmd->add_option("--cap", pruner.cap);
  pruner_cmd->add_option("--interval", pruner.interval_ms);
  pruner_cmd->add_option("--until", pruner.until);
  pruner_cmd->add_option("--log", pruner.log)->required();

  std::string crash_dir;
  std::size_t crash_start = 0, crash_keys = 1;
  auto* crash_child_cmd = app.add_subcommand("__crash-child")->group("");
  crash_child_cmd->add_option("--dir", crash_dir)->required();
  crash_child_cmd->add_option("--start", crash_start);
  crash_child_cmd->add_option("--keys", crash_keys)->check(CLI::Range(std::size_t{1}, kPoolLimit));

  TrustAttackerOptions trust_attacker_options;
  auto* trust_attacker_cmd = app.add_subcommand("__trust-attacker")->group("");
  trust_attacker_cmd->add_option("--action", trust_attacker_options.action)->required();
  trust_attacker_cmd->add_option("--path", trust_attacker_options.path)->required();
  trust_attacker_cmd->add_option("--variant", trust_attacker_options.variant);
  trust_attacker_cmd->add_option("--uid", trust_attacker_options.uid);
  trust_attacker_cmd->add_option("--gid", trust_attacker_options.gid);

  HostileChildOptions hostile_child_options;
  auto* hostile_child_cmd = app.add_subcommand("__hostile-child")->group("");
  hostile_child_cmd->add_option("--scenario", hostile_child_options.scenario)->required();
  hostile_child_cmd->add_option("--dir", hostile_child_options.dir)->required();
  hostile_child_cmd->add_option("--threads", hostile_child_options.threads)
      ->check(CLI::Range(1, 64));
  hostile_child_cmd->add_option("--rounds", hostile_child_options.rounds);
  hostile_child_cmd->add_flag("--drop-root", hostile_child_options.drop_root);
  hostile_child_cmd->add_flag("--expect-disk-hit", hostile_child_options.expect_disk_hit);

  std::string reference_variant;
  auto* reference_cmd = app.add_subcommand("__reference")->group("");
  reference_cmd->add_option("--variant", reference_variant)->required();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error) == 0 ? 0 : kExitUsage;
  }

  try {
    if (*stress_cmd) return run_stress(stress);
    if (*crash_cmd) return run_crash(crash);
    if (*corrupt_cmd) return run_corrupt(corrupt);
    if (*hostile_cmd) return run_hostile(hostile);
    if (*worker_cmd) {
      worker.force = worker_force != 0;
      return stress_worker(worker);
    }
    if (*pruner_cmd) return stress_pruner(pruner);
    if (*crash_child_cmd) return crash_child(crash_dir, crash_start, crash_keys);
    if (*hostile_child_cmd) return hostile_child(hostile_child_options);
    if (*trust_cmd) return run_trust(trust);
    if (*trust_attacker_cmd) return trust_attacker(trust_attacker_options);
    if (*reference_cmd) return reference_child(reference_variant);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "astrai-cache-torture: %s\n", error.what());
    return kExitViolation;
  }
  return kExitUsage;
}

