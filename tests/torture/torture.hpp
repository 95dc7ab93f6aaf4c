// Shared declarations of astrai-cache-torture (tests/torture/): the child-process, file and
// binary-comparison helpers (torture_support.cpp) and the verbs, one file each: stress.cpp,
// crash.cpp, corrupt.cpp, hostile.cpp, trust.cpp; main.cpp parses the command line.
#pragma once
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "astrai/error.hpp"
#include "base/logging.hpp"
#include "cache/cache_key.hpp"
#include "cache/disk_cache.hpp"
#include "runtime/env_config.hpp"
#include "runtime/jit_engine.hpp"
#include "runtime/kernel_spec.hpp"
#include "runtime/nvrtc_compiler.hpp"

namespace fs = std::filesystem;
using astrai::DType;
using astrai::detail::BinaryKind;
using astrai::detail::CacheEntryData;
using astrai::detail::CacheKey;
using astrai::detail::CacheMode;
using astrai::detail::CompiledVariant;
using astrai::detail::decode_entry;
using astrai::detail::decode_variant_payload;
using astrai::detail::DiskCache;
using astrai::detail::encode_entry;
using astrai::detail::encode_variant_payload;
using astrai::detail::EnvConfig;
using astrai::detail::JitEngine;
using astrai::detail::KernelKind;
using astrai::detail::KernelSpec;
using astrai::detail::Logger;
using astrai::detail::LogLevel;
using astrai::detail::payload_checksum;
using astrai::detail::VariantSource;


namespace astrai::torture {

constexpr int kExitViolation = 1;
constexpr int kExitUsage = 2;

// The next process to lock a key whose holder was SIGKILLed must get it within this bound.
// flock is released by the kernel when the holder dies, so the first non-blocking attempt
// succeeds; the bound only allows for one 5 ms poll and a loaded scheduler.
constexpr double kLockWaitBoundMs = 250.0;

// ---------------------------------------------------------------------------------------------
// Small utilities

std::int64_t now_ns();

double ms(std::int64_t nanoseconds);

void sleep_ms(double milliseconds);

std::uint64_t fresh_seed();

// Counts the violated guarantees of one verb; prints each (up to a limit) as it is found.
class Verdict {
 public:
  explicit Verdict(std::string verb) : verb_(std::move(verb)) {}

  template <typename... Args>
  void fail(fmt::format_string<Args...> format, Args&&... args) {
    std::lock_guard<std::mutex> lock(mutex_);
    ++count_;
    if (count_ <= kMaxPrinted)
      fmt::print(stderr, "{}: VIOLATION: {}\n", verb_,
                 fmt::format(format, std::forward<Args>(args)...));
    else if (count_ == kMaxPrinted + 1)
      fmt::print(stderr, "{}: (further violations are counted, not printed)\n", verb_);
  }

  std::uint64_t count() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return count_;
  }

  int finish() const {
    const std::uint64_t violations = count();
    if (violations == 0) {
      fmt::print("{}: OK\n", verb_);
      return 0;
    }
    fmt::print("{}: FAILED ({} violation{})\n", verb_, violations, violations == 1 ? "" : "s");
    return kExitViolation;
  }

 private:
  static constexpr std::uint64_t kMaxPrinted = 40;
  std::string verb_;
  mutable std::mutex mutex_;
  std::uint64_t count_ = 0;
};

// The variants the torture uses: rotary embeddings, the cheapest kernels to compile.
// Index i: the dtype alternates, head_dim runs 8..512 in steps of 8, then the arch changes.
constexpr std::size_t kPoolLimit = 512;

std::vector<KernelSpec> rotary_pool(std::size_t count);

EnvConfig engine_config(const fs::path& dir, bool force = false, bool strict = false,
                        CacheMode mode = CacheMode::read_write);

// ---------------------------------------------------------------------------------------------
// Comparing binaries

// Identity of what a get() returned: the binary, its kind and its kernel symbols.
std::uint64_t digest(BinaryKind kind, const std::vector<std::string>& symbols,
                     const std::vector<char>& binary);

// NVRTC names internal-linkage entities "_INTERNAL_<8 hex>_<n>_<file>_<8 hex>_<pid>": the hex
// fields change with the time of the compile and the last one is the compiling process's id,
// so two compiles of one program are byte-equal only within one process (and second). A
// fingerprint masks those characters in place (length preserving). `signature` is the total
// width of the masked digit runs: binaries with equal signatures have the same layout, and
// equal normalized digests then mean "the same compile up to the module id".
struct Fingerprint {
  std::uint64_t raw = 0;
  std::uint64_t normalized = 0;
  int signature = 0;
};

Fingerprint fingerprint(BinaryKind kind, const std::vector<std::string>& symbols,
                        const std::vector<char>& binary);

Fingerprint fingerprint(const CompiledVariant& variant);

// Fingerprint of the variant an entry file holds; nullopt when the file does not decode.
std::optional<Fingerprint> entry_file_fingerprint(const fs::path& path,
                                                  std::string* variant_name = nullptr);

std::uint64_t entry_bytes_of(const KernelSpec& spec, const CompiledVariant& variant);

// ---------------------------------------------------------------------------------------------
// Child processes: this same binary, started with fork + exec.

std::string self_exe();

struct ChildIo {
  int stdout_fd = -1;
  int stderr_fd = -1;
  int marker_fd = -1;  // becomes descriptor 3 in the child
};

pid_t spawn_self(const std::vector<std::string>& args, const ChildIo& io = {});

int wait_raw(pid_t pid);

bool exited_ok(int status);

std::string describe_status(int status);

struct Captured {
  int status = -1;
  std::string out;
  std::string err;
};

// Runs a child with stdout and stderr captured through pipes, read with poll so that neither
// can fill up and block the child.
Captured run_captured(const std::vector<std::string>& args);

std::vector<std::string> split_lines(const std::string& text);

// Child: one fresh compile of a variant with the cache off; prints "R <normalized> <signature>".
int reference_child(const std::string& variant);

// Fresh single-process compiles with the disk cache off: the ground truth every binary is
// compared with. A binary whose module id has another width (its compiler's pid had another
// number of digits) is compared with a reference compiled by a helper process of that width.
class ReferenceBook {
 public:
  enum class Match { equal, different, unverifiable };

  explicit ReferenceBook(const std::vector<KernelSpec>& specs) {
    JitEngine engine(engine_config({}, false, false, CacheMode::off));
    for (const auto& spec : specs) {
      const auto variant = engine.get(spec);
      const Fingerprint print = fingerprint(*variant);
      normalized_[{spec.name(), print.signature}] = print.normalized;
      entry_bytes_[spec.name()] = entry_bytes_of(spec, *variant);
    }
  }

  std::uint64_t entry_bytes(const std::string& name) const { return entry_bytes_.at(name); }
  bool knows(const std::string& name) const { return entry_bytes_.count(name) != 0; }

  Match check(const std::string& name, const Fingerprint& got) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!knows(name)) return Match::different;
    const std::pair<std::string, int> key{name, got.signature};
    auto it = normalized_.find(key);
    if (it == normalized_.end() && failed_.count(key) == 0) {
      // Helper processes get consecutive pids, so the first one almost always has the width
      // of the process that compiled `got`.
      for (int attempt = 0; attempt < 8 && normalized_.count(key) == 0; ++attempt) {
        const Captured child = run_captured({"__reference", "--variant", name});
        ++helpers_;
        std::istringstream fields(child.out);
        std::string tag;
        unsigned long long normalized = 0;
        int signature = -1;
        fields >> tag >> normalized >> signature;
        if (!exited_ok(child.status) || tag != "R") break;
        normalized_[{name, signature}] = normalized;
      }
      it = normalized_.find(key);
      if (it == normalized_.end()) failed_.insert(key);
    }
    if (it == normalized_.end()) {
      ++unverifiable_;
      return Match::unverifiable;
    }
    return it->second == got.normalized ? Match::equal : Match::different;
  }

  std::string summary() const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::string text = fmt::format("compared with fresh compiles up to NVRTC's per-process "
                                   "module id");
    if (helpers_ > 0) text += fmt::format(" ({} helper compiles for other pid widths)", helpers_);
    if (unverifiable_ > 0) text += fmt::format(", {} not comparable", unverifiable_);
    return text;
  }

 private:
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, int>, std::uint64_t> normalized_;
  std::map<std::string, std::uint64_t> entry_bytes_;
  std::set<std::pair<std::string, int>> failed_;
  std::uint64_t helpers_ = 0;
  std::uint64_t unverifiable_ = 0;
};

// ---------------------------------------------------------------------------------------------
// Files

std::vector<char> read_bytes(const fs::path& path);

bool write_bytes(const fs::path& path, const std::vector<char>& bytes);

bool is_temp_name(const std::string& name);

// Key hex of an entry file name "<32 hex>.<variant>.cubin"; empty for anything else.
std::string entry_key_of(const std::string& name);

// Temp files (".tmp-*") in the shard directories of the cache at `root`.
std::set<fs::path> temp_files(const fs::path& root);

// Every path below `dir` with its size, for "nothing was written" checks.
std::map<std::string, std::uintmax_t> tree_snapshot(const fs::path& dir);

// Removal that also works after chmod 0555 (write permission is restored first).
void remove_tree(const fs::path& path);

// A fresh working directory below the user's --dir, removed on destruction unless kept.
class WorkDir {
 public:
  WorkDir(const fs::path& parent, const std::string& verb, bool keep) : keep_(keep) {
    fs::create_directories(parent);
    path_ = fs::absolute(parent) /
            fmt::format("{}-{}-{:06x}", verb, ::getpid(), fresh_seed() & 0xffffff);
    fs::create_directories(path_);
    // Explicit: a cache root here must not turn group-writable under a umask like 002.
    fs::permissions(path_, fs::perms(0755));
  }
  ~WorkDir() {
    if (keep_) fmt::print("kept {}\n", path_.string());
    else remove_tree(path_);
  }
  WorkDir(const WorkDir&) = delete;
  WorkDir& operator=(const WorkDir&) = delete;
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
  bool keep_;
};


// Options of the verbs and their children.

struct StressOptions {
  int procs = 4;
  int threads = 2;
  std::size_t variants = 16;
  double seconds = 10;
  std::string dir;
  int force_procs = -1;         // -1: one when there are at least two processes
  std::uint64_t prune_cap = 0;  // 0: a quarter of all entries
  double prune_interval_ms = 100;
  double pause_us = 200;
  bool keep = false;
  std::uint64_t seed = 0;
};

struct WorkerOptions {
  std::string dir;
  int id = 0;
  int threads = 1;
  std::size_t variants = 1;
  std::int64_t until = 0;
  bool force = false;
  double pause_us = 0;
  std::uint64_t seed = 0;
  std::string log;
};

struct PrunerOptions {
  std::string dir;
  std::uint64_t cap = 0;
  double interval_ms = 50;
  std::int64_t until = 0;
  std::string log;
};

struct CrashOptions {
  int trials = 100;
  std::string dir;
  std::size_t keys = 8;
  double max_delay_ms = 300;
  double aimed = 0.5;  // share of trials aimed at the end of the first get (the publish)
  bool keep = false;
  std::uint64_t seed = 0;
};

struct CorruptOptions {
  int trials = 1000;
  std::string dir;
  std::size_t variants = 4;
  int compile_every = 10;
  bool keep = false;
  std::uint64_t seed = 0;
};

struct HostileOptions {
  std::string dir;
  int threads = 3;
  int rounds = 2;
  bool keep = false;
};

struct HostileChildOptions {
  std::string scenario;
  std::string dir;
  int threads = 3;
  int rounds = 2;
  bool drop_root = false;
  bool expect_disk_hit = false;
};

struct TrustOptions {
  std::string dir;
  int rounds = 3;
  bool keep = false;
};

struct TrustAttackerOptions {
  std::string action;
  std::string path;
  std::string variant;
  long uid = -1;
  long gid = -1;
};

// The verbs and the child processes they start (main.cpp dispatches on the command line).
int run_stress(StressOptions options);
int stress_worker(const WorkerOptions& options);
int stress_pruner(const PrunerOptions& options);
int run_crash(CrashOptions options);
int crash_child(const std::string& dir, std::size_t start, std::size_t keys);
int run_corrupt(CorruptOptions options);
int run_hostile(HostileOptions options);
int hostile_child(const HostileChildOptions& options);
int run_trust(TrustOptions options);
int trust_attacker(const TrustAttackerOptions& options);

}  // namespace astrai::torture
