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
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/file.h>
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

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "astrai/error.hpp"
#include "cache/cache_archive.hpp"
#include "cache/cache_key.hpp"
#include "cache/disk_cache.hpp"
#include "runtime/env_config.hpp"
#include "runtime/jit_engine.hpp"
#include "runtime/kernel_spec.hpp"
#include "runtime/logging.hpp"
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

namespace {

constexpr int kExitViolation = 1;
constexpr int kExitUsage = 2;

// The next process to lock a key whose holder was SIGKILLed must get it within this bound.
// flock is released by the kernel when the holder dies, so the first non-blocking attempt
// succeeds; the bound only allows for one 5 ms poll and a loaded scheduler.
constexpr double kLockWaitBoundMs = 250.0;

// ---------------------------------------------------------------------------------------------
// Small utilities

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double ms(std::int64_t nanoseconds) { return static_cast<double>(nanoseconds) / 1e6; }

void sleep_ms(double milliseconds) {
  std::this_thread::sleep_for(
      std::chrono::microseconds(static_cast<std::int64_t>(milliseconds * 1000)));
}

std::uint64_t fresh_seed() {
  std::random_device device;
  return (static_cast<std::uint64_t>(device()) << 32) ^ device() ^
         static_cast<std::uint64_t>(now_ns());
}

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

std::vector<KernelSpec> rotary_pool(std::size_t count) {
  static const char* const kArchs[] = {"sm_80", "sm_86", "sm_89", "sm_90a"};
  constexpr std::size_t kPerArch = 2 * 64;
  std::vector<KernelSpec> specs;
  for (std::size_t i = 0; i < std::min(count, kPoolLimit); ++i) {
    KernelSpec spec;
    spec.kind = KernelKind::rotary_emb;
    spec.dtype = i % 2 == 0 ? DType::bf16 : DType::fp16;
    spec.head_dim = static_cast<int>(8 * (1 + (i / 2) % 64));
    spec.arch = kArchs[(i / kPerArch) % 4];
    specs.push_back(spec);
  }
  return specs;
}

EnvConfig engine_config(const fs::path& dir, bool force = false, bool strict = false,
                        CacheMode mode = CacheMode::read_write) {
  EnvConfig config;
  config.cache_dir = dir;
  config.cache_mode = mode;
  config.force_compile = force;
  config.strict = strict;
  return config;
}

// ---------------------------------------------------------------------------------------------
// Comparing binaries

// Identity of what a get() returned: the binary, its kind and its kernel symbols.
std::uint64_t digest(BinaryKind kind, const std::vector<std::string>& symbols,
                     const std::vector<char>& binary) {
  std::uint64_t hash = payload_checksum(binary.data(), binary.size());
  for (const auto& symbol : symbols)
    hash = (hash * 0x100000001b3ULL) ^ payload_checksum(symbol.data(), symbol.size());
  return hash ^ (static_cast<std::uint64_t>(kind) << 56);
}

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
                        const std::vector<char>& binary) {
  Fingerprint result;
  result.raw = digest(kind, symbols, binary);
  std::vector<char> masked = binary;
  const std::string_view view(binary.data(), binary.size());
  constexpr std::string_view kMarker = "_INTERNAL_";
  auto is_digit = [](char c) { return c >= '0' && c <= '9'; };
  auto is_hex = [&](char c) { return is_digit(c) || (c >= 'a' && c <= 'f'); };
  auto mask_hex8 = [&](std::size_t at) {
    if (at + 8 > view.size()) return false;
    for (std::size_t i = at; i < at + 8; ++i)
      if (!is_hex(view[i])) return false;
    std::fill(masked.begin() + static_cast<std::ptrdiff_t>(at),
              masked.begin() + static_cast<std::ptrdiff_t>(at + 8), '#');
    return true;
  };
  for (std::size_t at = view.find(kMarker); at != std::string_view::npos;
       at = view.find(kMarker, at + 1)) {
    std::size_t p = at + kMarker.size();
    if (!mask_hex8(p)) continue;
    p += 8;
    if (p >= view.size() || view[p] != '_') continue;
    std::size_t q = ++p;
    while (q < view.size() && is_digit(view[q]) && q - p < 6) ++q;
    if (q == p || q >= view.size() || view[q] != '_') continue;
    p = q + 1 + std::stoul(std::string(view.substr(p, q - p)));
    if (p >= view.size() || view[p] != '_') continue;
    if (!mask_hex8(++p)) continue;
    p += 8;
    if (p >= view.size() || view[p] != '_') continue;
    for (q = ++p; q < view.size() && is_digit(view[q]); ++q) masked[q] = '#';
    result.signature += static_cast<int>(q - p);
  }
  result.normalized = digest(kind, symbols, masked);
  return result;
}

Fingerprint fingerprint(const CompiledVariant& variant) {
  return fingerprint(variant.kind, variant.symbols, variant.binary);
}

// Fingerprint of the variant an entry file holds; nullopt when the file does not decode.
std::optional<Fingerprint> entry_file_fingerprint(const fs::path& path,
                                                  std::string* variant_name = nullptr) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto entry = decode_entry(bytes.data(), bytes.size());
  if (!entry) return std::nullopt;
  std::vector<std::string> symbols;
  std::vector<char> binary;
  if (!decode_variant_payload(entry->payload, &symbols, &binary)) return std::nullopt;
  if (variant_name) *variant_name = entry->variant_name;
  return fingerprint(entry->kind, symbols, binary);
}

std::uint64_t entry_bytes_of(const KernelSpec& spec, const CompiledVariant& variant) {
  CacheEntryData entry;
  entry.kind = variant.kind;
  entry.variant_name = spec.name();
  entry.nvrtc_version = astrai::detail::nvrtc_version().text();
  entry.payload = encode_variant_payload(variant.symbols, variant.binary);
  return encode_entry(entry).size();
}

// ---------------------------------------------------------------------------------------------
// Child processes: this same binary, started with fork + exec.

std::string self_exe() {
  std::error_code ec;
  const fs::path path = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("astrai-cache-torture") : path.string();
}

struct ChildIo {
  int stdout_fd = -1;
  int stderr_fd = -1;
  int marker_fd = -1;  // becomes descriptor 3 in the child
};

pid_t spawn_self(const std::vector<std::string>& args, const ChildIo& io = {}) {
  std::vector<std::string> storage{self_exe()};
  storage.insert(storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& text : storage) argv.push_back(text.data());
  argv.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error(fmt::format("fork failed: {}", std::strerror(errno)));
  if (pid == 0) {
    // Only async-signal-safe calls between fork and exec.
    if (io.marker_fd >= 0) {
      if (io.marker_fd == 3) ::fcntl(3, F_SETFD, 0);
      else ::dup2(io.marker_fd, 3);
    }
    if (io.stdout_fd >= 0) ::dup2(io.stdout_fd, 1);
    if (io.stderr_fd >= 0) ::dup2(io.stderr_fd, 2);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  return pid;
}

int wait_raw(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return -1;
  }
  return status;
}

bool exited_ok(int status) { return status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0; }

std::string describe_status(int status) {
  if (status == -1) return "lost";
  if (WIFEXITED(status)) return fmt::format("exit {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return fmt::format("signal {}", WTERMSIG(status));
  return fmt::format("status {:#x}", status);
}

struct Captured {
  int status = -1;
  std::string out;
  std::string err;
};

// Runs a child with stdout and stderr captured through pipes, read with poll so that neither
// can fill up and block the child.
Captured run_captured(const std::vector<std::string>& args) {
  int out_pipe[2];
  int err_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
  ChildIo io;
  io.stdout_fd = out_pipe[1];
  io.stderr_fd = err_pipe[1];
  const pid_t pid = spawn_self(args, io);
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  Captured result;
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  std::string* sinks[2] = {&result.out, &result.err};
  int open_count = 2;
  while (open_count > 0) {
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      char buffer[4096];
      const ssize_t n = ::read(fds[i].fd, buffer, sizeof buffer);
      if (n > 0) {
        sinks[i]->append(buffer, static_cast<std::size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open_count;
      }
    }
  }
  for (auto& fd : fds)
    if (fd.fd >= 0) ::close(fd.fd);
  result.status = wait_raw(pid);
  return result;
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) lines.push_back(line);
  return lines;
}

// Child: one fresh compile of a variant with the cache off; prints "R <normalized> <signature>".
int reference_child(const std::string& variant) {
  Logger::instance().set_level(LogLevel::off);
  JitEngine engine(engine_config({}, false, false, CacheMode::off));
  const Fingerprint print = fingerprint(*engine.get(KernelSpec::parse(variant)));
  std::printf("R %llu %d\n", static_cast<unsigned long long>(print.normalized), print.signature);
  return 0;
}

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

std::vector<char> read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

bool write_bytes(const fs::path& path, const std::vector<char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  return static_cast<bool>(out);
}

bool is_temp_name(const std::string& name) { return name.rfind(".tmp-", 0) == 0; }

// Key hex of an entry file name "<32 hex>.<variant>.cubin"; empty for anything else.
std::string entry_key_of(const std::string& name) {
  if (name.size() < 40 || name[32] != '.' || name.compare(name.size() - 6, 6, ".cubin") != 0)
    return {};
  for (std::size_t i = 0; i < 32; ++i) {
    const char c = name[i];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return {};
  }
  return name.substr(0, 32);
}

// Temp files (".tmp-*") in the shard directories of the cache at `root`.
std::set<fs::path> temp_files(const fs::path& root) {
  std::set<fs::path> temps;
  std::error_code ec;
  for (fs::directory_iterator shard(root / "v1", ec), end; !ec && shard != end;
       shard.increment(ec)) {
    std::error_code inner;
    for (fs::directory_iterator file(shard->path(), inner); !inner && file != end;
         file.increment(inner))
      if (is_temp_name(file->path().filename().string())) temps.insert(file->path());
  }
  return temps;
}

// Every path below `dir` with its size, for "nothing was written" checks.
std::map<std::string, std::uintmax_t> tree_snapshot(const fs::path& dir) {
  std::map<std::string, std::uintmax_t> files;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code size_ec;
    const auto size = it->is_regular_file(size_ec) ? it->file_size(size_ec) : 0;
    files[fs::relative(it->path(), dir, size_ec).string()] = size;
  }
  return files;
}

// Removal that also works after chmod 0555 (write permission is restored first).
void remove_tree(const fs::path& path) {
  std::error_code ec;
  fs::permissions(path, fs::perms::owner_all, fs::perm_options::add, ec);
  for (fs::recursive_directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code perm_ec;
    if (it->is_directory(perm_ec))
      fs::permissions(it->path(), fs::perms::owner_all, fs::perm_options::add, perm_ec);
  }
  fs::remove_all(path, ec);
}

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

// =============================================================================================
// stress

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

// =============================================================================================
// crash

struct CrashOptions {
  int trials = 100;
  std::string dir;
  std::size_t keys = 8;
  double max_delay_ms = 300;
  double aimed = 0.5;  // share of trials aimed at the end of the first get (the publish)
  bool keep = false;
  std::uint64_t seed = 0;
};

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

// =============================================================================================
// corrupt

struct CorruptOptions {
  int trials = 1000;
  std::string dir;
  std::size_t variants = 4;
  int compile_every = 10;
  bool keep = false;
  std::uint64_t seed = 0;
};

enum class Damage {
  truncate,
  zero_length,
  bit_flip,
  byte_overwrite,
  bad_magic,
  bad_version,
  kind_swap,
  header_field,
  other_variant,
  append_garbage,
  count
};
constexpr int kDamageKinds = static_cast<int>(Damage::count);

const char* damage_name(Damage damage) {
  switch (damage) {
    case Damage::truncate: return "truncated";
    case Damage::zero_length: return "zero length";
    case Damage::bit_flip: return "bit flip";
    case Damage::byte_overwrite: return "byte overwritten";
    case Damage::bad_magic: return "wrong magic";
    case Damage::bad_version: return "wrong format version";
    case Damage::kind_swap: return "binary kind swapped";
    case Damage::header_field: return "other header byte";
    case Damage::other_variant: return "another variant's entry";
    case Damage::append_garbage: return "garbage appended";
    case Damage::count: break;
  }
  return "?";
}

// Header layout (cache/disk_cache.hpp): magic 0..7, version 8..11, kind 12, reserved 13..15,
// payload size 16..23, checksum 24..31, name length 32..35, nvrtc version length 36..39.
std::vector<char> damaged_copy(Damage damage, const std::vector<char>& good,
                               const std::vector<char>& other, std::mt19937_64& rng) {
  std::vector<char> bytes = good;
  auto pick = [&](std::size_t lo, std::size_t hi) {  // in [lo, hi)
    return lo + static_cast<std::size_t>(rng() % (hi - lo));
  };
  auto overwrite = [&](std::size_t at) {
    bytes[at] = static_cast<char>(static_cast<unsigned char>(bytes[at]) ^
                                  static_cast<unsigned char>(1 + rng() % 255));
  };
  switch (damage) {
    case Damage::truncate: bytes.resize(pick(1, good.size())); break;
    case Damage::zero_length: bytes.clear(); break;
    case Damage::bit_flip: {
      const std::size_t at = pick(0, bytes.size());
      bytes[at] = static_cast<char>(bytes[at] ^ (1 << (rng() % 8)));
      break;
    }
    case Damage::byte_overwrite: overwrite(pick(0, bytes.size())); break;
    case Damage::bad_magic: overwrite(pick(0, 8)); break;
    case Damage::bad_version: {
      const std::uint32_t current = astrai::detail::kEntryFormatVersion;
      const std::uint32_t choices[] = {0, current - 1, current + 1, 0xffffffffu,
                                       static_cast<std::uint32_t>(rng())};
      std::uint32_t version = choices[rng() % 5];
      if (version == current) version ^= 0x100;
      for (int i = 0; i < 4; ++i) bytes[8 + i] = static_cast<char>((version >> (8 * i)) & 0xff);
      break;
    }
    case Damage::kind_swap:
      bytes[12] = static_cast<char>(static_cast<std::uint8_t>(bytes[12]) ==
                                            static_cast<std::uint8_t>(BinaryKind::cubin)
                                        ? BinaryKind::ptx
                                        : BinaryKind::cubin);
      break;
    case Damage::header_field: overwrite(pick(13, 40)); break;
    case Damage::other_variant: bytes = other; break;
    case Damage::append_garbage: {
      const std::size_t extra = pick(1, 65);
      for (std::size_t i = 0; i < extra; ++i) bytes.push_back(static_cast<char>(rng()));
      break;
    }
    case Damage::count: break;
  }
  return bytes;
}

int run_corrupt(CorruptOptions options) {
  Verdict verdict("corrupt");
  Logger::instance().set_level(LogLevel::off);
  if (options.seed == 0) options.seed = fresh_seed();
  WorkDir work(options.dir, "corrupt", options.keep);
  const fs::path root = work.path() / "cache";
  std::mt19937_64 rng(options.seed);
  const auto start = now_ns();

  // bf16 head dims 8, 16, 24, ...: the even indices of the pool, all equally cheap.
  std::vector<KernelSpec> specs;
  for (const auto& spec : rotary_pool(2 * options.variants))
    if (spec.dtype == DType::bf16) specs.push_back(spec);
  ReferenceBook book(specs);

  std::vector<fs::path> paths;
  std::vector<std::vector<char>> pristine;
  std::vector<Fingerprint> pristine_print;
  {
    JitEngine warm(engine_config(root));
    for (const auto& spec : specs) {
      warm.get(spec);
      paths.push_back(warm.cache().entry_path(warm.key_for(spec), spec.name()));
      pristine.push_back(read_bytes(paths.back()));
      const auto print = entry_file_fingerprint(paths.back());
      if (!print) throw std::runtime_error("warming did not publish " + spec.name());
      pristine_print.push_back(*print);
    }
  }
  fmt::print("corrupt: {} damaged entries over {} variants; 1 round in {} of the {} damage kinds "
             "recompiles, the other trials run strict (the damage must become a cache miss); "
             "seed {}\n",
             options.trials, specs.size(), options.compile_every, kDamageKinds, options.seed);

  struct Tally {
    std::uint64_t trials = 0, detected = 0, removed_on_load = 0, recompiled = 0;
  };
  Tally tally[kDamageKinds];
  std::uint64_t strict_trials = 0, compile_trials = 0;

  for (int trial = 0; trial < options.trials; ++trial) {
    const auto damage = static_cast<Damage>(trial % kDamageKinds);
    Tally& counts = tally[static_cast<int>(damage)];
    ++counts.trials;
    const std::size_t victim = static_cast<std::size_t>(rng() % specs.size());
    const std::size_t other =
        (victim + 1 + static_cast<std::size_t>(rng() % (specs.size() - 1))) % specs.size();
    const auto bytes = damaged_copy(damage, pristine[victim], pristine[other], rng);
    if (bytes == pristine[victim]) {
      verdict.fail("trial {}: {} left the entry unchanged (harness bug)", trial,
                   damage_name(damage));
      continue;
    }
    if (!write_bytes(paths[victim], bytes))
      throw std::runtime_error("cannot write " + paths[victim].string());
    const KernelSpec& spec = specs[victim];
    const bool compile = (trial / kDamageKinds) % options.compile_every == 0;

    if (!compile) {
      // Strict: the damaged entry must turn into a miss (CacheMissError), never a hit.
      ++strict_trials;
      JitEngine engine(engine_config(root, false, true));
      try {
        const auto variant = engine.get(spec);
        verdict.fail("trial {}: the {} entry of {} was served from disk ({})", trial,
                     damage_name(damage), spec.name(),
                     book.check(spec.name(), fingerprint(*variant)) == ReferenceBook::Match::equal
                         ? "a correct binary"
                         : "a WRONG binary");
      } catch (const astrai::CacheMissError&) {
        ++counts.detected;
      } catch (const std::exception& error) {
        verdict.fail("trial {}: the {} entry made get() throw: {}", trial, damage_name(damage),
                     error.what());
      }
      if (engine.counters().disk_hits != 0 || engine.counters().compiles != 0)
        verdict.fail("trial {}: a strict get counted {} disk hits and {} compiles", trial,
                     engine.counters().disk_hits.load(), engine.counters().compiles.load());
      std::error_code ec;
      if (!fs::exists(paths[victim], ec)) ++counts.removed_on_load;
    } else {
      // The whole path: the damage is detected, the variant recompiled and republished.
      ++compile_trials;
      try {
        JitEngine engine(engine_config(root));
        VariantSource source = VariantSource::memory;
        const auto variant = engine.get(spec, &source);
        if (source != VariantSource::compiled || engine.counters().compiles != 1 ||
            engine.counters().disk_hits != 0)
          verdict.fail("trial {}: the {} entry of {}: expected one compile and no disk hit, got "
                       "{} compiles and {} disk hits",
                       trial, damage_name(damage), spec.name(), engine.counters().compiles.load(),
                       engine.counters().disk_hits.load());
        else
          ++counts.detected;
        if (book.check(spec.name(), fingerprint(*variant)) == ReferenceBook::Match::different)
          verdict.fail("trial {}: the {} entry of {} led to a wrong binary", trial,
                       damage_name(damage), spec.name());
        const auto republished = entry_file_fingerprint(paths[victim]);
        if (!republished || republished->normalized != pristine_print[victim].normalized ||
            republished->signature != pristine_print[victim].signature)
          verdict.fail("trial {}: after the {} entry, {} was not republished correctly", trial,
                       damage_name(damage), spec.name());
        else
          ++counts.recompiled;
        JitEngine again(engine_config(root));
        VariantSource again_source = VariantSource::memory;
        const auto reloaded = again.get(spec, &again_source);
        if (again_source != VariantSource::disk ||
            book.check(spec.name(), fingerprint(*reloaded)) != ReferenceBook::Match::equal)
          verdict.fail("trial {}: the republished entry of {} is not served from disk", trial,
                       spec.name());
      } catch (const std::exception& error) {
        verdict.fail("trial {}: the {} entry made get() throw: {}", trial, damage_name(damage),
                     error.what());
      }
    }
    // Put the original back, so every trial damages a sound entry.
    if (!write_bytes(paths[victim], pristine[victim]))
      throw std::runtime_error("cannot restore " + paths[victim].string());
  }

  DiskCache cache(root, CacheMode::read_write, 0);
  for (const auto& info : cache.verify(false))
    if (!info.valid) verdict.fail("entry {} does not verify at the end", info.path.string());

  fmt::print("  trials: {} ({} strict, {} recompiling) in {:.1f} s\n", options.trials,
             strict_trials, compile_trials, ms(now_ns() - start) / 1000);
  fmt::print("  {:<24} {:>7} {:>9} {:>16} {:>11}\n", "damage", "trials", "detected",
             "removed on load", "recompiled");
  for (int d = 0; d < kDamageKinds; ++d) {
    const Tally& counts = tally[d];
    fmt::print("  {:<24} {:>7} {:>9} {:>16} {:>11}\n", damage_name(static_cast<Damage>(d)),
               counts.trials, counts.detected, counts.removed_on_load, counts.recompiled);
  }
  fmt::print("  (detected: a strict get missed, or a full get compiled once with no disk hit; "
             "removed on load: strict trials whose entry the load deleted; recompiled: the "
             "entry was republished)\n");
  return verdict.finish();
}

// =============================================================================================
// hostile

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
      if (line.rfind("[astrai-jit] warn: kernel cache at ", 0) == 0 &&
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

// =============================================================================================
// trust

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

constexpr uid_t kAttacker = 1234;
constexpr gid_t kTeamGroup = 1500;

bool become(long uid, long gid) {
  if (uid < 0) return true;
  return ::setgroups(0, nullptr) == 0 && ::setresgid(static_cast<gid_t>(gid), static_cast<gid_t>(gid), static_cast<gid_t>(gid)) == 0 &&
         ::setresuid(static_cast<uid_t>(uid), static_cast<uid_t>(uid), static_cast<uid_t>(uid)) == 0;
}

// Child: another local user. "rewrite" replaces the entry at --path with a different binary
// under a valid checksum; "hold-lock" holds the flock of --path until killed; "shared-get"
// gets --variant from the group-shared cache at --path and prints "G <source> <normalized>
// <signature>".
int trust_attacker(const TrustAttackerOptions& options) {
  Logger::instance().set_level(LogLevel::off);
  if (options.action == "hold-lock") {
    // Opened before giving up root: the point is a lock held by someone else.
    const int fd = ::open(options.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0 || ::flock(fd, LOCK_EX) != 0) return 3;
    if (!become(options.uid, options.gid)) return 4;
    std::printf("L\n");
    std::fflush(stdout);
    for (;;) ::pause();
  }
  if (!become(options.uid, options.gid)) {
    std::printf("X cannot change uid: %s\n", std::strerror(errno));
    return 4;
  }
  if (options.action == "rewrite") {
    auto bytes = read_bytes(options.path);
    auto entry = decode_entry(bytes.data(), bytes.size());
    if (!entry) return 5;
    entry->payload[entry->payload.size() / 2] ^= 0x5a;  // XXH3 has no key: re-checksum it
    return write_bytes(options.path, encode_entry(*entry)) ? 0 : 6;
  }
  if (options.action == "shared-get") {
    EnvConfig config = engine_config(options.path);
    config.cache_sharing.kind = astrai::detail::CacheSharing::Kind::directory_group;
    config.cache_sharing.name = "group";
    JitEngine engine(config);
    VariantSource source = VariantSource::memory;
    const Fingerprint print = fingerprint(*engine.get(KernelSpec::parse(options.variant), &source));
    std::printf("G %s %llu %d\n", source == VariantSource::disk ? "disk" : "compiled",
                static_cast<unsigned long long>(print.normalized), print.signature);
    return 0;
  }
  return 2;
}

int run_trust(TrustOptions options) {
  Verdict verdict("trust");
  Logger::instance().set_level(LogLevel::off);
  WorkDir work(options.dir, "trust", options.keep);
  fs::permissions(work.path(), fs::perms(0755));
  const bool as_root = ::geteuid() == 0;
  const auto specs = rotary_pool(4);
  ReferenceBook book(specs);
  fmt::print("trust: {} rounds per scenario{}\n", options.rounds,
             as_root ? "" : "; not root, so the scenarios that need another uid are skipped");
  fmt::print("  {:<16} {:<58} {:>5} {:>8}  {}\n", "scenario", "attack", "gets", "compiled",
             "verdict");

  struct Tally {
    std::uint64_t gets = 0, compiled = 0;
  };
  // A victim's get with a fresh engine: must succeed and return the correct binary.
  auto victim_get = [&](const std::string& scenario, const EnvConfig& config,
                        const KernelSpec& spec, Tally* tally) -> VariantSource {
    VariantSource source = VariantSource::memory;
    try {
      JitEngine engine(config);
      const auto variant = engine.get(spec, &source);
      ++tally->gets;
      tally->compiled += source == VariantSource::compiled;
      if (book.check(spec.name(), fingerprint(*variant)) == ReferenceBook::Match::different)
        verdict.fail("{}: {} returned a WRONG binary ({})", scenario, spec.name(),
                     source == VariantSource::disk ? "from disk" : "compiled");
    } catch (const std::exception& error) {
      verdict.fail("{}: get of {} threw: {}", scenario, spec.name(), error.what());
    }
    return source;
  };
  auto report = [&](const std::string& name, const std::string& attack, const Tally& tally,
                    std::uint64_t before) {
    fmt::print("  {:<16} {:<58} {:>5} {:>8}  {}\n", name, attack, tally.gets, tally.compiled,
               verdict.count() == before ? "ok" : "FAILED");
  };
  auto skip = [&](const std::string& name, const std::string& attack) {
    fmt::print("  {:<16} {:<58} {:>5} {:>8}  {}\n", name, attack, "-", "-", "skipped (not root)");
  };
  // Every maintenance operation on the cache at `root`.
  auto maintain = [](const fs::path& root) {
    DiskCache cache(root, CacheMode::read_write, 0);
    cache.verify(true);
    cache.prune(0);
    cache.clear();
  };

  // 1. Another user rewrites an entry of a world-writable cache with a valid checksum.
  if (as_root) {
    const std::uint64_t before = verdict.count();
    Tally tally;
    for (int round = 0; round < options.rounds; ++round) {
      const fs::path root = work.path() / fmt::format("open-{}", round);
      const KernelSpec& spec = specs[static_cast<std::size_t>(round) % specs.size()];
      fs::path entry;
      {
        JitEngine warm(engine_config(root));
        warm.get(spec);
        entry = warm.cache().entry_path(warm.key_for(spec), spec.name());
      }
      for (fs::recursive_directory_iterator it(root), end; it != end; ++it)
        fs::permissions(it->path(), it->is_directory() ? fs::perms::all : fs::perms(0666));
      fs::permissions(root, fs::perms::all);
      const Captured attacker = run_captured({"__trust-attacker", "--action", "rewrite", "--path",
                                              entry.string(), "--uid", std::to_string(kAttacker),
                                              "--gid", std::to_string(kAttacker)});
      if (!exited_ok(attacker.status))
        verdict.fail("rewritten-entry: the attacker failed ({})", describe_status(attacker.status));
      if (victim_get("rewritten-entry", engine_config(root), spec, &tally) != VariantSource::compiled)
        verdict.fail("rewritten-entry: the world-writable cache was used");
      const auto after = read_bytes(entry);
      if (after.empty()) verdict.fail("rewritten-entry: the attacker's file was removed");
    }
    report("rewritten-entry", "world-writable cache, entry rewritten by uid 1234", tally, before);
  } else {
    skip("rewritten-entry", "world-writable cache, entry rewritten by uid 1234");
  }

  // 2. Entries owned by another user or writable by the group sit in our own cache.
  {
    const std::uint64_t before = verdict.count();
    Tally tally;
    for (int round = 0; round < options.rounds; ++round) {
      const fs::path root = work.path() / fmt::format("foreign-{}", round);
      const KernelSpec& spec = specs[static_cast<std::size_t>(round) % specs.size()];
      fs::path entry;
      {
        JitEngine warm(engine_config(root));
        warm.get(spec);
        entry = warm.cache().entry_path(warm.key_for(spec), spec.name());
      }
      auto bytes = read_bytes(entry);
      auto decoded = decode_entry(bytes.data(), bytes.size());
      decoded->payload[decoded->payload.size() / 2] ^= 0x5a;
      write_bytes(entry, encode_entry(*decoded));
      const bool chown_it = as_root && round % 2 == 0;
      if (chown_it) {
        if (::chown(entry.c_str(), kAttacker, kAttacker) != 0)
          verdict.fail("foreign-entry: chown failed: {}", std::strerror(errno));
      } else {
        fs::permissions(entry, fs::perms(0660));
      }
      const auto planted = read_bytes(entry);
      if (victim_get("foreign-entry", engine_config(root), spec, &tally) != VariantSource::compiled)
        verdict.fail("foreign-entry: the planted entry was not refused");
      maintain(root);
      if (read_bytes(entry) != planted)
        verdict.fail("foreign-entry: the planted entry was changed or removed");
    }
    report("foreign-entry", "entry chowned to uid 1234 or made group-writable", tally, before);
  }

  // 3. Symbolic links planted at every path the runtime opens point at a decoy tree.
  {
    const std::uint64_t before = verdict.count();
    Tally tally;
    const fs::path decoy = work.path() / "decoy";
    {
      JitEngine decoy_engine(engine_config(decoy));
      for (const auto& spec : specs) decoy_engine.get(spec);
    }
    std::ofstream(decoy / "precious.txt") << "do not touch\n";
    const auto decoy_before = tree_snapshot(decoy);
    const std::vector<std::string> places = {"root", "v1", "shard", "entry", "locks", "lock",
                                             "dump", "record"};
    for (int round = 0; round < options.rounds; ++round) {
      for (const auto& place : places) {
        const fs::path root = work.path() / fmt::format("links-{}-{}", place, round);
        const KernelSpec& spec = specs[static_cast<std::size_t>(round) % specs.size()];
        JitEngine probe(engine_config(root));
        const std::string hex = probe.key_for(spec).hex();
        const fs::path entry = probe.cache().entry_path(probe.key_for(spec), spec.name());
        const fs::path decoy_entry = DiskCache(decoy, CacheMode::read_only, 0).entry_path(probe.key_for(spec), spec.name());
        EnvConfig config = engine_config(root);
        std::error_code ec;
        if (place == "root") {
          fs::remove_all(root, ec);
          fs::create_directory_symlink(decoy, root);
        } else if (place == "v1") {
          fs::remove_all(root / "v1", ec);
          fs::create_directory_symlink(decoy / "v1", root / "v1");
        } else if (place == "shard") {
          fs::create_directories(root / "v1");
          fs::create_directory_symlink(decoy_entry.parent_path(), entry.parent_path());
        } else if (place == "entry") {
          fs::create_directories(entry.parent_path());
          fs::create_symlink(decoy_entry, entry);
        } else if (place == "locks") {
          fs::create_directories(root / "v1");
          fs::create_directory_symlink(decoy / "v1", root / "v1" / "locks");
        } else if (place == "lock") {
          fs::create_directories(root / "v1" / "locks");
          fs::create_symlink(decoy / "lock-created", root / "v1" / "locks" / (hex + ".lock"));
        } else if (place == "dump") {
          fs::create_directories(root);
          fs::create_directory_symlink(decoy, root / "dump");
          config.dump_dir = root / "dump";
        } else if (place == "record") {
          fs::create_directories(root);
          fs::create_symlink(decoy / "precious.txt", root / "record.txt");
          config.record_file = root / "record.txt";
        }
        config.force_compile = place == "dump";  // the dump is written by a compile
        const VariantSource source = victim_get("planted-link", config, spec, &tally);
        if (source == VariantSource::disk && (place == "root" || place == "v1" || place == "shard" || place == "entry"))
          verdict.fail("planted-link: the {} link was followed to a disk hit", place);
        maintain(root);
        if (tree_snapshot(decoy) != decoy_before)
          verdict.fail("planted-link: a link at the {} led to a change outside the cache", place);
      }
    }
    report("planted-link", "links at root, v1, shard, entry, locks, lock, dump, record", tally,
           before);
  }

  // 4. Another user holds a compile lock: we must not wait for it.
  if (as_root) {
    const std::uint64_t before = verdict.count();
    Tally tally;
    const fs::path root = work.path() / "lock-stall";
    const KernelSpec& spec = specs[0];
    JitEngine probe(engine_config(root));
    const fs::path lock = root / "v1" / "locks" / (probe.key_for(spec).hex() + ".lock");
    { probe.cache().lock_key(probe.key_for(spec), std::chrono::milliseconds(10)); }
    if (::chown(lock.c_str(), kAttacker, kAttacker) != 0)
      verdict.fail("lock-stall: chown failed: {}", std::strerror(errno));
    int out_pipe[2];
    if (::pipe2(out_pipe, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
    ChildIo io;
    io.stdout_fd = out_pipe[1];
    const pid_t holder = spawn_self({"__trust-attacker", "--action", "hold-lock", "--path",
                                     lock.string(), "--uid", std::to_string(kAttacker), "--gid",
                                     std::to_string(kAttacker)},
                                    io);
    ::close(out_pipe[1]);
    char ready = 0;
    if (::read(out_pipe[0], &ready, 1) != 1 || ready != 'L')
      verdict.fail("lock-stall: the attacker did not take the lock");
    ::close(out_pipe[0]);
    for (int round = 0; round < options.rounds; ++round) {
      const auto start = std::chrono::steady_clock::now();
      EnvConfig config = engine_config(root);
      config.force_compile = true;  // every get goes through the lock
      victim_get("lock-stall", config, spec, &tally);
      if (std::chrono::steady_clock::now() - start > std::chrono::seconds(5))
        verdict.fail("lock-stall: a get waited for the foreign lock");
    }
    ::kill(holder, SIGKILL);
    wait_raw(holder);
    report("lock-stall", "uid 1234 holds a compile lock file it owns", tally, before);
  } else {
    skip("lock-stall", "uid 1234 holds a compile lock file it owns");
  }

  // 5. A cache shared by a group: two members share entries, an outsider gets nothing.
  if (as_root) {
    const std::uint64_t before = verdict.count();
    Tally tally;
    for (int round = 0; round < options.rounds; ++round) {
      const fs::path root = work.path() / fmt::format("team-{}", round);
      fs::create_directories(root);
      if (::chown(root.c_str(), 0, kTeamGroup) != 0 || ::chmod(root.c_str(), 02770) != 0)
        verdict.fail("shared-group: cannot prepare {}", root.string());
      const std::string variant = specs[static_cast<std::size_t>(round) % specs.size()].name();
      const std::pair<uid_t, gid_t> users[] = {{1501, kTeamGroup}, {1502, kTeamGroup}, {1503, 1600}};
      const char* expected[] = {"compiled", "disk", "compiled"};
      for (int i = 0; i < 3; ++i) {
        const Captured child = run_captured(
            {"__trust-attacker", "--action", "shared-get", "--path", root.string(), "--variant",
             variant, "--uid", std::to_string(users[i].first), "--gid",
             std::to_string(users[i].second)});
        std::istringstream fields(child.out);
        std::string tag, source;
        Fingerprint print;
        fields >> tag >> source >> print.normalized >> print.signature;
        ++tally.gets;
        tally.compiled += source == "compiled";
        if (!exited_ok(child.status) || tag != "G")
          verdict.fail("shared-group: uid {} failed: {}{}", users[i].first, child.out, child.err);
        else if (source != expected[i])
          verdict.fail("shared-group: uid {} got {} from {}, expected {}", users[i].first,
                       variant, source, expected[i]);
        if (book.check(variant, print) == ReferenceBook::Match::different)
          verdict.fail("shared-group: uid {} got a wrong binary", users[i].first);
      }
    }
    report("shared-group", "uids 1501, 1502 share gid 1500; uid 1503 is outside", tally, before);
  } else {
    skip("shared-group", "uids 1501, 1502 share gid 1500; uid 1503 is outside");
  }

  // 6. A read-only layer serves hits, is never written; a damaged entry in it is skipped.
  {
    const std::uint64_t before = verdict.count();
    Tally tally;
    const fs::path layer = work.path() / "layer";
    fs::path damaged;
    {
      JitEngine warm(engine_config(layer));
      for (const auto& spec : specs) warm.get(spec);
      damaged = warm.cache().entry_path(warm.key_for(specs[1]), specs[1].name());
    }
    auto bytes = read_bytes(damaged);
    bytes[bytes.size() / 2] ^= 0x01;
    write_bytes(damaged, bytes);
    const auto layer_before = tree_snapshot(layer);
    for (int round = 0; round < options.rounds; ++round) {
      EnvConfig config = engine_config(work.path() / fmt::format("user-{}", round));
      config.cache_layers = {layer};
      for (std::size_t i = 0; i < specs.size(); ++i) {
        const VariantSource source = victim_get("read-only-layer", config, specs[i], &tally);
        const VariantSource expected = i == 1 ? VariantSource::compiled : VariantSource::disk;
        if (source != expected)
          verdict.fail("read-only-layer: {} came from the wrong place", specs[i].name());
      }
      if (victim_get("read-only-layer", config, specs[1], &tally) != VariantSource::disk)
        verdict.fail("read-only-layer: the recompiled entry did not land in the user cache");
    }
    if (tree_snapshot(layer) != layer_before) verdict.fail("read-only-layer: the layer changed");
    report("read-only-layer", "hits from a layer; one damaged entry there", tally, before);
  }

  // 7. Export from one machine's cache, import on an empty one: hits, no compile.
  {
    const std::uint64_t before = verdict.count();
    Tally tally;
    const fs::path ci = work.path() / "ci";
    {
      JitEngine warm(engine_config(ci));
      for (const auto& spec : specs) warm.get(spec);
    }
    const fs::path archive = work.path() / "kernels.astrai";
    const auto exported =
        astrai::detail::export_cache(DiskCache(ci, CacheMode::read_only, 0), {}, archive);
    for (int round = 0; round < options.rounds; ++round) {
      const fs::path node = work.path() / fmt::format("node-{}", round);
      DiskCache target(node, CacheMode::read_write, 0);
      const auto imported = astrai::detail::import_archive(target, archive);
      if (imported.entries != specs.size() || exported.entries != specs.size())
        verdict.fail("export-import: {} exported, {} imported, expected {}", exported.entries,
                     imported.entries, specs.size());
      for (const auto& spec : specs)
        if (victim_get("export-import", engine_config(node), spec, &tally) != VariantSource::disk)
          verdict.fail("export-import: {} was not a hit after import", spec.name());
    }
    report("export-import", "warm, export, import into empty caches", tally, before);
  }

  // 8. No HOME: never a predictable directory under /tmp.
  {
    const std::uint64_t before = verdict.count();
    Tally tally;
    const EnvConfig config = astrai::detail::parse_env_config({});
    if (config.cache_dir.string().rfind("/tmp", 0) == 0)
      verdict.fail("no-home: the cache fell back to {}", config.cache_dir.string());
    report("no-home", "no HOME or XDG variables: no /tmp/astrai-jit-<uid>", tally, before);
  }

  fmt::print("  binaries: {}\n", book.summary());
  return verdict.finish();
}

}  // namespace

int main(int argc, char** argv) {
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
