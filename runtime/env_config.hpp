// The ASTRAI_JIT_* environment, read once when the runtime starts.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/logging.hpp"
#include "cache/cache_signature.hpp"
#include "cache/disk_cache.hpp"
#include "cache/remote_store.hpp"

namespace astrai::detail {

// Which tiling a Hopper kernel takes where its head dim has two (kernel_src/hopper_params.h): the
// prefill's 128 or 192 query rows a CTA, the decode's one split a CTA or a request's splits side
// by side in one wide CTA. automatic: the runtime chooses by shape (launch_heuristics.hpp).
enum class TileChoice { automatic, narrow, wide };
// Its spelling in ASTRAI_JIT_PREFILL_TILES, ASTRAI_JIT_DECODE_TILES and warm --prefill-tiles:
// auto, narrow, wide.
const char* tile_choice_name(TileChoice tiles);
// The inverse (case and surrounding blanks ignored; empty is auto); throws InvalidArgument
// naming `name` (the variable or option) and the value.
TileChoice parse_tile_choice(const std::string& name, const std::string& value);

struct EnvConfig {
  std::filesystem::path cache_dir;     // ASTRAI_JIT_CACHE_DIR, else $XDG_CACHE_HOME/astrai-jit, else ~/.cache/astrai-jit
  CacheMode cache_mode = CacheMode::read_write;  // ASTRAI_JIT_CACHE = rw | ro | off
  // ASTRAI_JIT_CACHE_PATH: read-only cache layers searched, in order, before cache_dir
  // (colon-separated absolute paths; never written).
  std::vector<std::filesystem::path> cache_layers;
  CacheSharing cache_sharing;          // ASTRAI_JIT_CACHE_SHARED = group | <group name> | <gid>
                                       // its owners: ASTRAI_JIT_CACHE_OWNERS = <user|uid>[,...]
  bool force_compile = false;          // ASTRAI_JIT_FORCE_COMPILE = 0|1|true|false|yes|no|on|off
  bool strict = false;                 // ASTRAI_JIT_STRICT (bool)
  std::filesystem::path record_file;   // ASTRAI_JIT_RECORD=<file>; empty = off
  std::uint64_t max_cache_bytes = 0;   // ASTRAI_JIT_MAX_CACHE_SIZE: bytes with optional K/M/G/T (powers of 1024) suffix, "KiB"/"MiB"/"GiB"/"TiB" or "KB"/"MB"/"GB" accepted; 0 = unlimited
  LogLevel log_level = LogLevel::warn; // ASTRAI_JIT_LOG = off | error | warn | info | debug
  // ASTRAI_JIT_ARCH, normalized: "sm_89", "sm_90a", "sm_100a", "compute_80", "compute_90a"
  // (accepts "89", "8.9", "sm89", "sm_89", "90a", "compute_80"; a compute_ target compiles PTX
  // that the driver finishes for the device).
  std::string arch_override;
  bool no_mma = false;                 // ASTRAI_JIT_NO_MMA (bool)
  bool no_wgmma = false;               // ASTRAI_JIT_NO_WGMMA (bool): portable kernels on sm_90a
  // ASTRAI_JIT_PREFILL_TILES = auto | narrow | wide: the Hopper prefill's tiling where its head
  // dim has a wide one (auto: by grid size, launch_heuristics.hpp).
  TileChoice prefill_tiles = TileChoice::automatic;
  // ASTRAI_JIT_DECODE_TILES = auto | narrow | wide: the Hopper decode's wide CTAs (a request's
  // splits side by side in one CTA, merged there) where its head dim has them (auto: when the
  // grid's (request, KV head) pairs fit one wave and split 2 to 4 ways).
  TileChoice decode_tiles = TileChoice::automatic;
  std::filesystem::path dump_dir;      // ASTRAI_JIT_DUMP=<dir>; empty = off
  // ASTRAI_JIT_TRUSTED_KEYS: public keys (tokens, or absolute paths of files of them; see
  // cache/cache_signature.hpp). Set and not empty: only entries validly signed by one of them
  // load from any cache tier. Null: signatures are not required.
  std::shared_ptr<const TrustedKeys> trusted_keys;
  // ASTRAI_JIT_SIGNING_KEY: a secret key file (owner-only); entries this process compiles are
  // signed with it before they are stored. Null: stored unsigned.
  std::shared_ptr<const SigningKey> signing_key;
  // ASTRAI_JIT_CACHE_NFS = auto | on | off: compile locks on a network file system
  // (cache/network_fs.hpp); auto detects it from the cache root.
  NetworkFsMode cache_nfs = NetworkFsMode::automatic;
  // ASTRAI_JIT_REMOTE: remote cache stores shared by a cluster, searched in order after a local
  // miss (cache/remote_store.hpp has the forms); empty = none.
  std::vector<RemoteEndpoint> remotes;
  // ASTRAI_JIT_REMOTE_TIMEOUT_MS (1..60000): connect and request limit of a remote store.
  std::chrono::milliseconds remote_timeout{300};
  // ASTRAI_JIT_REMOTE_LEASE_MS (0..600000; 0 = off): how long another node's compile of a key
  // is awaited before compiling anyway.
  std::chrono::milliseconds remote_lease{10000};
  // Every ASTRAI_JIT_* variable that was set, as (name, value), sorted by name (for `info`).
  std::vector<std::pair<std::string, std::string>> variables_set;
  // ASTRAI_JIT_* names that are not known (typos); the runtime warns once about each.
  std::vector<std::string> unknown_variables;
};

// Names of all recognized variables, sorted.
const std::vector<std::string>& known_env_variables();

// Warns once about each of config.unknown_variables, listing the known names.
void warn_unknown_env_variables(const EnvConfig& config);

// Parses the given environment (entries "NAME=value", like `environ`). Throws
// astrai::ConfigError for a bad value; the message names the variable, its value and what is
// allowed, e.g. "ASTRAI_JIT_CACHE=rx is not valid (allowed: rw, ro, off)".
EnvConfig parse_env_config(const std::vector<std::string>& environment);
// Same, over the process environment.
EnvConfig load_env_config_from_process();

// The oldest target the kernels support (also the floor of `warm --arch`).
inline constexpr int kMinArchNumber = 75;

// What ASTRAI_JIT_ARCH and `warm --arch` accept, for messages: the notations normalize_arch
// takes, then the supported range.
inline constexpr const char* kArchForms =
    "sm_XY, XY or X.Y for a cubin of that arch, or compute_XY for PTX that the driver finishes "
    "for the device, each with an optional a or f suffix; e.g. sm_80, 8.9, sm_90a, compute_80";
inline constexpr const char* kArchSupported =
    "sm_75 or newer, or compute_75 or newer; e.g. sm_80, sm_89, sm_90a, compute_80";

// Normalizes an arch string ("89", "8.9", "sm89", "sm_89", "sm_90a", "90a") to "sm_89"/"sm_90a",
// and a virtual arch ("compute_80", "COMPUTE_90a"; packed digits only) to "compute_80"/"compute_90a".
// Returns nullopt when it is not an arch (letters, out-of-range numbers: major 3..15, minor 0..9).
std::optional<std::string> normalize_arch(const std::string& text);

// Parses a size like "10G", "512MiB", "1048576"; nullopt on error.
std::optional<std::uint64_t> parse_byte_size(const std::string& text);

}  // namespace astrai::detail
