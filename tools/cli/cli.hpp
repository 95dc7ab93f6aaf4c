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

constexpr const char* kExitCodesFooter =
    "Exit codes:\n"
    "  0  success\n"
    "  1  work failed: a kernel did not compile, `cache verify` found damaged or refused\n"
    "     entries, `cache export` missed a manifest variant, `cache import` rejected an entry,\n"
    "     or an internal error (a missing GPU is not a failure for `info`)\n"
    "  2  usage or configuration error: bad flag or value, bad manifest line, bad ASTRAI_JIT_*\n"
    "     environment value";

constexpr const char* kWarmFooter =
    "Selection:\n"
    "  Lists are comma-separated; a flag may also be repeated.\n"
    "  With no --head-dims/--group-sizes, the default set is compiled: AstrAI 1B (head_dim 64,\n"
    "  24 query / 4 KV heads = group 6) and Llama-3-8B (head_dim 128, 32/8 = group 4):\n"
    "    paged_decode {hd64 g6, hd128 g4} x page sizes {1, 16}; rotary_emb {hd64, hd128}\n"
    "  (6 variants per dtype and arch).\n"
    "  When --head-dims or --group-sizes is given, each attention kernel takes the cross product\n"
    "  head dims x group sizes (x page sizes when paged), each list falling back to its default\n"
    "  when not given: head dims {64,128}, group sizes {4,6}, page sizes {1,16}. rotary_emb uses\n"
    "  only the head dims and dtypes. Duplicates are compiled once.\n"
    "  --manifest alone warms exactly the manifest's variants (they carry their own arch);\n"
    "  together with any other selection flag (--arch included) both sets are warmed.\n"
    "  --no-mma (or ASTRAI_JIT_NO_MMA=1) selects the no-tensor-core variants on sm_80 and newer\n"
    "  for the flag selection; manifest lines are taken as written.\n"
    "  On sm_90a, variants that the Hopper kernels serve are warmed twice: the portable variant\n"
    "  (masked calls) and the Hopper one: .wgmma for prefill and paged_prefill (head dims 64,\n"
    "  128, 192, 256; pages of 8 tokens or more), .tma for paged_decode and decode (head dims\n"
    "  64, 128, 192, 256; pages of 16 tokens or more). --no-hopper (or ASTRAI_JIT_NO_WGMMA=1)\n"
    "  keeps only the portable ones, --hopper only the Hopper ones (--no-wgmma and --wgmma are\n"
    "  the same flags). The hd128 prefill has two Hopper tilings (128 and 192 query rows a CTA,\n"
    "  .wgmma and .wgmma.wide; the runtime picks by grid size): both are warmed, or the one\n"
    "  --prefill-tiles (or ASTRAI_JIT_PREFILL_TILES) names. The hd64 decode has wide CTAs too\n"
    "  (.tma.wide: a request's splits side by side in one CTA; the runtime takes them when the\n"
    "  grid's columns fit one wave): both are warmed, or the one ASTRAI_JIT_DECODE_TILES names.\n"
    "  --features lists feature sets, each `none` (the plain variants, the default) or feature\n"
    "  names joined by '+', e.g. `--features none,swa+sink`; every attention kernel selected\n"
    "  must support each set (rotary_emb takes only its plain variant). Features: kv_e4m3 and\n"
    "  kv_e5m2 (FP8 KV cache; paged_decode, decode and paged_prefill; one of the two), swa\n"
    "  (sliding window), cap (logit soft-cap), sink (attention sinks), q2..q8 (multi-token\n"
    "  paged_decode: 2..8 query tokens per request; at most one). The Hopper variants take swa,\n"
    "  cap, sink and (decode) q2..q8; FP8 variants stay portable.\n"
    "  --arch auto: the target of each local GPU (ASTRAI_JIT_ARCH overrides); sm_90a when no GPU\n"
    "  is found. --arch compute_XY (e.g. compute_80) compiles PTX for that virtual arch, which the\n"
    "  driver finishes for the GPU that loads it: the sm_80 code path on an sm_90 GPU.\n"
    "\n"
    "Output: one line per variant as it finishes, `[k/n] <variant> 0.42 s` (compiled),\n"
    "`[k/n] <variant> cached` (already on disk) or `[k/n] <variant> FAILED: <reason>`, then\n"
    "`warm: N variants, C compiled, H already cached, F failed, B bytes, W s wall`.";

// Shown under the help of every verb.
inline std::string with_exit_codes(const char* text) { return std::string(text) + "\n\n" + kExitCodesFooter; }

// ---------------------------------------------------------------------------------------------
// Small helpers

std::string format_bytes(std::uint64_t bytes);

const char* cache_mode_name(CacheMode mode);

std::string iso_time(fs::file_time_type time);

std::string first_line(const std::string& text);

std::string trim(const std::string& text);

std::string join(const std::vector<std::string>& items, const char* separator);

void print_error(std::string message);

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

std::vector<std::string> resolve_archs(const std::vector<std::string>& requested,
                                       const JitEngine& engine);

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
};

// Cache verbs manage the directory whatever ASTRAI_JIT_CACHE says, except that a read-only
// configuration is never written to. `write` asks for a cache that may remove files.
DiskCache open_cache(const EnvConfig& config, bool write);

// Maintenance of a path that is not a usable cache (missing, not a directory, a symbolic
// link, refused by the trust rule) is a usage error: nothing there is touched.
void require_usable(const EnvConfig& config, const char* verb);

void require_writable(const EnvConfig& config, const char* verb);

int run_cache_list(const EnvConfig& config);

std::string cap_text(std::uint64_t max_bytes);

int run_cache_stats(const EnvConfig& config);

int run_cache_verify(const EnvConfig& config, bool repair);

int run_cache_prune(const EnvConfig& config, const std::string& max_size);

int run_cache_clear(const EnvConfig& config);

int run_cache_export(const EnvConfig& config, const CacheOptions& options);

int run_cache_import(const EnvConfig& config, const CacheOptions& options);

// ---------------------------------------------------------------------------------------------
// info

void print_devices(const EnvConfig& config);

int run_info(const EnvConfig& config);

}  // namespace astrai::cli
