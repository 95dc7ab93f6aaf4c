// Shared declarations of the astrai-jit command-line tool: helpers (common.cpp) and one file
// per verb (warm.cpp, cache.cpp, info.cpp); main.cpp builds the command line and dispatches.
#pragma once
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <exception>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "astrai/error.hpp"
#include "base/logging.hpp"
#include "cache/cache_archive.hpp"
#include "cache/disk_cache.hpp"
#include "runtime/driver_api.hpp"
#include "runtime/env_config.hpp"
#include "runtime/jit_engine.hpp"
#include "runtime/kernel_spec.hpp"
#include "runtime/nvrtc_compiler.hpp"


namespace astrai::cli {

namespace fs = std::filesystem;
using astrai::DType;
using astrai::detail::CacheMode;
using astrai::detail::DiskCache;
using astrai::detail::EnvConfig;
using astrai::detail::JitEngine;
using astrai::detail::KernelKind;
using astrai::detail::KernelSpec;
using astrai::detail::VariantSource;

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;

// Used by `warm --arch auto` when no GPU is visible.
constexpr const char* kFallbackArch = "sm_90a";

// The version of the project (CMakeLists.txt, pyproject.toml), set by tools/CMakeLists.txt.
#ifndef ASTRAI_JIT_VERSION
#error "ASTRAI_JIT_VERSION must be defined by the build"
#endif
constexpr const char* kVersion = ASTRAI_JIT_VERSION;

// The top-level help carries the exit codes; a verb's help stays within a screen, so the rules
// that do not fit live in the README (section "The command-line tool").
constexpr const char* kExitCodesFooter =
    "Exit codes: 0 success; 1 work failed (a compile failed, `cache verify` found damaged or\n"
    "refused entries, `cache export` missed a manifest variant, `cache import` rejected an entry);\n"
    "2 usage or configuration error (bad flag or value, bad manifest line, bad ASTRAI_JIT_* value,\n"
    "a cache path that is not a usable cache). `astrai-jit VERB --help` shows a verb's flags;\n"
    "the README's \"The command-line tool\" has the selection rules.";

// ---------------------------------------------------------------------------------------------
// Small helpers

std::string format_bytes(std::uint64_t bytes);

const char* cache_mode_name(CacheMode mode);

std::string iso_time(fs::file_time_type time);

std::string first_line(const std::string& text);

std::string trim(const std::string& text);

std::string join(const std::vector<std::string>& items, const char* separator);

// "1 variant", "2 variants"; `plural` defaults to the singular with an "s".
std::string counted(std::size_t count, const char* singular, const char* plural = nullptr);

// One prefix per kind of message on stderr: "astrai-jit: error: ", "astrai-jit: warning: ",
// "astrai-jit: note: ".
void print_error(std::string message);
void print_warning(const std::string& message);
void print_note(const std::string& message);

double seconds_since(std::chrono::steady_clock::time_point start);

// One attribute of the device `ordinal` (throws astrai::CudaError naming the call).
int device_attribute(CUdevice device, CUdevice_attribute attribute, int ordinal);

// Reads the ASTRAI_JIT_* environment once, configures logging and warns about unknown names.
EnvConfig load_config();

void apply_cache_dir_override(const std::string& cache_dir, EnvConfig* config);

// ---------------------------------------------------------------------------------------------
// warm

struct WarmOptions {
  std::vector<std::string> archs;
  std::vector<std::string> kernels;
  std::vector<std::string> dtypes;
  std::vector<int> head_dims;
  std::vector<int> page_sizes;
  std::vector<int> group_sizes;
  std::vector<std::string> features;  // feature sets: "none", or names joined by '+'
  std::string manifest;
  std::string cache_dir;
  int jobs = 0;
  bool no_mma = false;
  bool no_hopper = false;    // portable variants only on sm_90a
  bool hopper_only = false;  // Hopper variants only on sm_90a
  std::string prefill_tiles;  // auto | narrow | wide; empty: ASTRAI_JIT_PREFILL_TILES
  bool dry_run = false;
};

// The targets behind `--arch auto`: one per distinct local GPU.
std::vector<std::string> auto_archs(const JitEngine& engine);

// `hopper_only` (--hopper) maps sm_90 to sm_90a, the target that has the Hopper variants;
// without it, sm_90 is kept with a warning (a Hopper GPU loads sm_90a variants).
std::vector<std::string> resolve_archs(const std::vector<std::string>& requested,
                                       const JitEngine& engine, bool hopper_only = false);

std::vector<KernelKind> resolve_kernels(const std::vector<std::string>& requested);

std::vector<DType> resolve_dtypes(const std::vector<std::string>& requested);

template <typename T>
std::vector<T> unique_values(const std::vector<T>& values) {
  std::vector<T> out;
  for (const T& value : values)
    if (std::find(out.begin(), out.end(), value) == out.end()) out.push_back(value);
  return out;
}

// Variants of a manifest file (as written by ASTRAI_JIT_RECORD). Throws InvalidArgument naming
// file:line for a bad line.
std::vector<KernelSpec> read_manifest(const std::string& path);

// The families `warm` compiles without --kernels.
std::vector<std::string> default_kernel_names();

bool has_flag_selection(const WarmOptions& options);

// Builds the deduplicated, validated list of variants `warm` compiles.
std::vector<KernelSpec> build_selection(const WarmOptions& options, const JitEngine& engine);

struct WarmTotals {
  std::size_t compiled = 0;
  std::size_t cached = 0;
  std::size_t failed = 0;
  std::uint64_t bytes = 0;
};

// Compiles (or finds on disk) every spec with `jobs` threads, printing a line as each finishes.
WarmTotals compile_all(JitEngine& engine, const std::vector<KernelSpec>& specs, int jobs);

int run_warm(const WarmOptions& options, EnvConfig config);

// ---------------------------------------------------------------------------------------------
// cache

struct CacheOptions {
  std::string cache_dir;
  bool no_repair = false;
  std::string max_size;
  std::string manifest;  // export: only these variants
  std::string output;    // export: the archive written
  std::string archive;   // import: the archive read
  std::string export_sign_key;  // export --sign: a secret key file; entries are signed in the archive
  std::string sign_key;         // cache sign --key
  bool json = false;            // stats --json
  std::string keygen_out;       // keygen --out PREFIX
  std::string remote;    // push, pull: the remote stores (else ASTRAI_JIT_REMOTE)
};

// Cache verbs manage the directory whatever ASTRAI_JIT_CACHE says, except that a read-only
// configuration is never written to. `write` asks for a cache that may remove files.
DiskCache open_cache(const EnvConfig& config, bool write);

// Every cache verb treats a path the same way: a missing directory is an empty cache (a note
// says so, nothing is created; returns false), and a path that is not a usable cache (not a
// directory, a symbolic link, refused by the trust rule) is a usage error: nothing there is
// touched.
bool require_usable(const EnvConfig& config, const char* verb);

void require_writable(const EnvConfig& config, const char* verb);

int run_cache_list(const EnvConfig& config);

std::string cap_text(std::uint64_t max_bytes);

int run_cache_stats(const EnvConfig& config, bool json = false);

int run_cache_verify(const EnvConfig& config, bool repair);

int run_cache_prune(const EnvConfig& config, const std::string& max_size);

int run_cache_clear(const EnvConfig& config);

int run_cache_export(const EnvConfig& config, const CacheOptions& options);

int run_cache_import(const EnvConfig& config, const CacheOptions& options);

// Upload the cache's sound entries (those of --manifest's variants when given) to the remote
// stores; fetch --manifest's variants from them into the cache, each checked like an import.
int run_cache_push(const EnvConfig& config, const CacheOptions& options);
int run_cache_pull(const EnvConfig& config, const CacheOptions& options);

// ---------------------------------------------------------------------------------------------
// plan

struct PlanOptions {
  std::string kind;           // paged_decode | decode | prefill | paged_prefill | mla_decode
  std::string arch = "auto";
  int sms = 0;                // 0: the local GPU's, else a typical count for the target
  std::string dtype = "bf16";
  int head_dim = 128;
  int heads = 32;
  int kv_heads = 0;           // 0: heads
  int batch = 1;
  long long kv_len = 4096;    // decode: the table's tokens; prefill: the KV (and by default query) length
  int q_len = 0;              // decode: new tokens a request (1..8); prefill: query rows a request
  int page_size = 16;
  int window = -1;            // >= 0: a sliding window of that many keys before the query
  std::vector<std::string> features;
  bool mask = false;
  long long workspace = -1;   // decode: a caller's workspace of that many bytes
};

int run_plan(const EnvConfig& config, const PlanOptions& options);

// ---------------------------------------------------------------------------------------------
// signatures and metrics (keys.cpp)

// Reads a secret key file named by a flag; throws ConfigError naming the flag.
astrai::detail::SigningKey read_signing_key_option(const char* flag, const std::string& path);

int run_keygen(const CacheOptions& options);

int run_cache_sign(const EnvConfig& config, const CacheOptions& options);

// `cache stats --json`: the directory's figures and this process's own counters.
std::string cache_stats_json(const EnvConfig& config, std::uint64_t entries, std::uint64_t bytes);

// ---------------------------------------------------------------------------------------------
// info

struct InfoOptions {
  bool variables = false;  // list every ASTRAI_JIT_* variable instead
  bool markdown = false;   // ... as the README's table
};

void print_devices(const EnvConfig& config);

int run_info(const EnvConfig& config, const InfoOptions& options);

}  // namespace astrai::cli
