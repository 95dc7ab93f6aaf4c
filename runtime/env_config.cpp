#include "runtime/env_config.hpp"
#include "runtime/env_variables.hpp"

#include <pwd.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <initializer_list>
#include <limits>
#include <stdexcept>
#include <map>
#include <string_view>
#include <system_error>
#include <utility>

#include <fmt/format.h>

#include "astrai/error.hpp"
#include "cache/cache_archive.hpp"
#include "cache/cache_fs.hpp"

extern char** environ;

namespace astrai::detail {

namespace {

constexpr std::string_view kPrefix = "ASTRAI_JIT_";

constexpr const char* kCacheDirVar = "ASTRAI_JIT_CACHE_DIR";
constexpr const char* kCacheVar = "ASTRAI_JIT_CACHE";
constexpr const char* kForceCompileVar = "ASTRAI_JIT_FORCE_COMPILE";
constexpr const char* kStrictVar = "ASTRAI_JIT_STRICT";
constexpr const char* kRecordVar = "ASTRAI_JIT_RECORD";
constexpr const char* kMaxCacheSizeVar = "ASTRAI_JIT_MAX_CACHE_SIZE";
constexpr const char* kLogVar = "ASTRAI_JIT_LOG";
constexpr const char* kArchVar = "ASTRAI_JIT_ARCH";
constexpr const char* kNoMmaVar = "ASTRAI_JIT_NO_MMA";
constexpr const char* kNoWgmmaVar = "ASTRAI_JIT_NO_WGMMA";
constexpr const char* kPrefillTilesVar = "ASTRAI_JIT_PREFILL_TILES";
constexpr const char* kDecodeTilesVar = "ASTRAI_JIT_DECODE_TILES";
constexpr const char* kDumpVar = "ASTRAI_JIT_DUMP";
constexpr const char* kCachePathVar = "ASTRAI_JIT_CACHE_PATH";
constexpr const char* kCacheSharedVar = "ASTRAI_JIT_CACHE_SHARED";
constexpr const char* kCacheOwnersVar = "ASTRAI_JIT_CACHE_OWNERS";
constexpr const char* kTrustedKeysVar = "ASTRAI_JIT_TRUSTED_KEYS";
constexpr const char* kSigningKeyVar = "ASTRAI_JIT_SIGNING_KEY";
constexpr const char* kCacheNfsVar = "ASTRAI_JIT_CACHE_NFS";
constexpr const char* kRemoteVar = "ASTRAI_JIT_REMOTE";
constexpr const char* kRemoteTimeoutVar = "ASTRAI_JIT_REMOTE_TIMEOUT_MS";
constexpr const char* kRemoteLeaseVar = "ASTRAI_JIT_REMOTE_LEASE_MS";

constexpr const char* kTrustedKeysAllowed =
    "public keys as `astrai-jit keygen` writes them (ed25519:<key id>:<base64>) or absolute "
    "paths of files of them, separated by commas or blanks";
constexpr const char* kSigningKeyAllowed =
    "the path of a secret key file from `astrai-jit keygen`, owned by you with mode 0600 or 0400";
constexpr const char* kBoolAllowed = "1, 0, true, false, yes, no, on, off";
constexpr const char* kCacheAllowed = "rw, ro, off";
constexpr const char* kLogAllowed = "off, error, warn, info, debug";
constexpr const char* kTileChoicesAllowed = "auto, narrow, wide";
constexpr const char* kCachePathAllowed =
    "a colon-separated list of absolute directories, e.g. /opt/astrai-jit/cache:/mnt/kernels";
constexpr const char* kCacheSharedAllowed =
    "off, group (the cache directory's group), a group name or a numeric gid";
constexpr const char* kCacheOwnersAllowed =
    "comma-separated user names or numeric uids, e.g. alice,bob,1500";
constexpr const char* kCacheNfsAllowed = "auto, on, off";
constexpr const char* kRemoteTimeoutAllowed = "a whole number of milliseconds in 1..60000";
constexpr const char* kRemoteLeaseAllowed =
    "a whole number of milliseconds in 0..600000; 0 = no leases";
constexpr const char* kSizeAllowed =
    "a whole number of bytes, optionally followed by B, K, M, G, T, KiB, MiB, GiB, TiB, KB, "
    "MB, GB or TB (all powers of 1024), e.g. 1048576, 512M, 10GiB; 0 = unlimited";

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }

char to_lower(char c) { return static_cast<char>(std::tolower(static_cast<unsigned char>(c))); }

std::string lowercase(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = to_lower(c);
  return out;
}

// Strips surrounding whitespace (a value like "1 " from a shell script still counts).
std::string_view trim(std::string_view text) {
  while (!text.empty() && is_space(text.front())) text.remove_prefix(1);
  while (!text.empty() && is_space(text.back())) text.remove_suffix(1);
  return text;
}

[[noreturn]] void throw_invalid(const std::string& name, const std::string& value,
                                const char* allowed) {
  // Escaped: a value with control bytes must not rewrite the terminal that shows the message.
  throw ConfigError(
      fmt::format("{}={} is not valid (allowed: {})", name, echo_text(value), allowed));
}

bool parse_bool(const std::string& name, const std::string& value) {
  const std::string text = lowercase(trim(value));
  if (text.empty() || text == "0" || text == "false" || text == "no" || text == "off") return false;
  if (text == "1" || text == "true" || text == "yes" || text == "on") return true;
  throw_invalid(name, value, kBoolAllowed);
}

// One of a variable's words (any case, spaces trimmed); empty means the first choice.
template <typename Enum>
Enum parse_choice(const std::string& name, const std::string& value,
                  std::initializer_list<std::pair<std::string_view, Enum>> choices, const char* allowed) {
  const std::string text = lowercase(trim(value));
  if (text.empty()) return choices.begin()->second;
  for (const auto& [word, choice] : choices)
    if (text == word) return choice;
  throw_invalid(name, value, allowed);
}

CacheMode parse_cache_mode(const std::string& name, const std::string& value) {
  return parse_choice<CacheMode>(
      name, value, {{"rw", CacheMode::read_write}, {"ro", CacheMode::read_only}, {"off", CacheMode::off}},
      kCacheAllowed);
}

LogLevel parse_log(const std::string& name, const std::string& value) {
  const std::string text = lowercase(trim(value));
  if (text.empty()) return LogLevel::warn;
  LogLevel level = LogLevel::warn;
  if (!parse_log_level(text, &level)) throw_invalid(name, value, kLogAllowed);
  return level;
}

// Value of a (non-ASTRAI) variable from the parsed environment, or nullptr when absent.
const std::string* lookup(const std::map<std::string, std::string>& variables,
                          const std::string& name) {
  auto it = variables.find(name);
  return it == variables.end() ? nullptr : &it->second;
}

std::filesystem::path make_absolute(const std::filesystem::path& path) {
  std::error_code ec;
  std::filesystem::path result = std::filesystem::absolute(path, ec);
  return ec ? path : result;
}

// Home directory from the user database, for processes started without HOME.
std::filesystem::path password_home() {
  long suggested = ::sysconf(_SC_GETPW_R_SIZE_MAX);
  std::size_t size = suggested > 0 ? static_cast<std::size_t>(suggested) : 16384;
  for (int attempt = 0; attempt < 4; ++attempt, size *= 4) {
    std::vector<char> buffer(size);
    struct passwd entry {};
    struct passwd* found = nullptr;
    int rc = ::getpwuid_r(::getuid(), &entry, buffer.data(), buffer.size(), &found);
    if (rc == ERANGE) continue;
    if (rc != 0 || found == nullptr || found->pw_dir == nullptr) return {};
    std::filesystem::path home(found->pw_dir);
    if (home.empty() || !home.is_absolute()) return {};
    return home;
  }
  return {};
}

std::filesystem::path default_cache_dir(const std::map<std::string, std::string>& others) {
  if (const std::string* xdg = lookup(others, "XDG_CACHE_HOME")) {
    std::filesystem::path base(*xdg);
    // The XDG spec says relative values are to be ignored.
    if (!xdg->empty() && base.is_absolute()) return base / "astrai-jit";
  }
  if (const std::string* home = lookup(others, "HOME")) {
    std::filesystem::path base(*home);
    if (!home->empty() && base.is_absolute()) return base / ".cache" / "astrai-jit";
  }
  std::filesystem::path home = password_home();
  if (!home.empty()) return home / ".cache" / "astrai-jit";
  // Never a predictable name in a world-writable directory (another user could create it
  // first): the per-user runtime directory, else no disk cache at all (memory only).
  if (const std::string* runtime = lookup(others, "XDG_RUNTIME_DIR")) {
    std::filesystem::path base(*runtime);
    if (!runtime->empty() && base.is_absolute()) return base / "astrai-jit";
  }
  return {};
}

std::vector<std::filesystem::path> parse_cache_layers(const std::string& value) {
  std::vector<std::filesystem::path> layers;
  std::size_t begin = 0;
  for (;;) {
    const std::size_t end = value.find(':', begin);
    const std::string part(trim(std::string_view(value).substr(
        begin, end == std::string::npos ? std::string::npos : end - begin)));
    if (!part.empty()) {
      std::filesystem::path path(part);
      if (!path.is_absolute()) throw_invalid(kCachePathVar, value, kCachePathAllowed);
      path = normalize_for_open(path);
      if (std::find(layers.begin(), layers.end(), path) == layers.end()) layers.push_back(path);
    }
    if (end == std::string::npos) break;
    begin = end + 1;
  }
  return layers;
}

// A whole number in [low, high] (blanks around it ignored).
long long parse_bounded(const char* name, const std::string& value, long long low, long long high,
                        const char* allowed) {
  const std::string_view text = trim(value);
  if (text.empty() || text.size() > 12) throw_invalid(name, value, allowed);
  long long number = 0;
  for (char c : text) {
    if (!is_digit(c)) throw_invalid(name, value, allowed);
    number = number * 10 + (c - '0');
  }
  if (number < low || number > high) throw_invalid(name, value, allowed);
  return number;
}

}  // namespace

const std::vector<std::string>& known_env_variables() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> list;
    for (const EnvVariable& variable : env_variables()) list.emplace_back(variable.name);
    std::sort(list.begin(), list.end());
    return list;
  }();
  return names;
}

void warn_unknown_env_variables(const EnvConfig& config) {
  std::string known;
  for (const auto& name : known_env_variables()) known += (known.empty() ? "" : ", ") + name;
  for (const auto& name : config.unknown_variables)
    log_once(LogLevel::warn, "unknown-env-" + name,
             "unknown environment variable {} ignored (known: {})", echo_text(name), known);
}

std::optional<std::uint64_t> parse_byte_size(const std::string& text) {
  constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();
  std::size_t pos = 0;
  std::uint64_t value = 0;
  while (pos < text.size() && is_digit(text[pos])) {
    const std::uint64_t digit = static_cast<std::uint64_t>(text[pos] - '0');
    if (value > (kMax - digit) / 10) return std::nullopt;  // overflow
    value = value * 10 + digit;
    ++pos;
  }
  if (pos == 0) return std::nullopt;  // empty, sign, or no leading digits

  std::string_view rest(text);
  rest.remove_prefix(pos);
  if (rest.empty()) return value;
  if (rest.front() == ' ') rest.remove_prefix(1);  // "10 G" (one space only)

  // Every unit is a power of 1024, including the decimal-looking KB/MB/GB/TB spellings.
  const std::string unit = lowercase(rest);
  unsigned shift = 0;
  if (unit == "b") {
    shift = 0;
  } else if (unit.size() >= 1 && unit.size() <= 3) {
    switch (unit[0]) {
      case 'k': shift = 10; break;
      case 'm': shift = 20; break;
      case 'g': shift = 30; break;
      case 't': shift = 40; break;
      default: return std::nullopt;
    }
    const std::string tail = unit.substr(1);
    if (!(tail.empty() || tail == "b" || tail == "ib")) return std::nullopt;
  } else {
    return std::nullopt;
  }
  if (shift > 0 && value > (kMax >> shift)) return std::nullopt;  // overflow
  return value << shift;
}

std::optional<std::string> normalize_arch(const std::string& text) {
  std::string_view rest(text);
  bool prefixed = false;
  // "compute_XY" names a virtual arch: PTX that the driver finishes for the device it loads on.
  constexpr std::string_view kCompute = "compute_";
  bool virtual_arch = rest.size() >= kCompute.size();
  for (std::size_t i = 0; virtual_arch && i < kCompute.size(); ++i)
    virtual_arch = to_lower(rest[i]) == kCompute[i];
  if (virtual_arch) {
    rest.remove_prefix(kCompute.size());
    prefixed = true;
  } else if (rest.size() >= 2 && to_lower(rest[0]) == 's' && to_lower(rest[1]) == 'm') {
    rest.remove_prefix(2);
    if (!rest.empty() && rest.front() == '_') rest.remove_prefix(1);
    prefixed = true;
  }

  // Optional trailing "a" (arch-specific) or "f" (family-specific) suffix.
  std::string suffix;
  if (!rest.empty()) {
    const char last = to_lower(rest.back());
    if (last == 'a' || last == 'f') {
      suffix.assign(1, last);
      rest.remove_suffix(1);
    }
  }
  if (rest.empty()) return std::nullopt;

  int major = 0;
  int minor = 0;
  const std::size_t dot = rest.find('.');
  if (dot != std::string_view::npos) {
    // Compute-capability notation "8.9", "10.0", "9.0a"; not combined with an "sm" prefix.
    if (prefixed) return std::nullopt;
    const std::string_view major_text = rest.substr(0, dot);
    const std::string_view minor_text = rest.substr(dot + 1);
    if (major_text.empty() || major_text.size() > 2 || minor_text.size() != 1) return std::nullopt;
    if (major_text.size() == 2 && major_text[0] == '0') return std::nullopt;
    for (char c : major_text)
      if (!is_digit(c)) return std::nullopt;
    if (!is_digit(minor_text[0])) return std::nullopt;
    for (char c : major_text) major = major * 10 + (c - '0');
    minor = minor_text[0] - '0';
  } else {
    // Packed notation "89", "90", "100", "120": the last digit is the minor version.
    if (rest.size() < 2 || rest.size() > 3 || rest[0] == '0') return std::nullopt;
    int number = 0;
    for (char c : rest) {
      if (!is_digit(c)) return std::nullopt;
      number = number * 10 + (c - '0');
    }
    major = number / 10;
    minor = number % 10;
  }
  if (major < 3 || major > 15 || minor < 0 || minor > 9) return std::nullopt;
  return fmt::format("{}{}{}{}", virtual_arch ? "compute_" : "sm_", major, minor, suffix);
}

TileChoice parse_tile_choice(const std::string& name, const std::string& value) {
  return parse_choice<TileChoice>(
      name, value,
      {{"auto", TileChoice::automatic}, {"narrow", TileChoice::narrow}, {"wide", TileChoice::wide}},
      kTileChoicesAllowed);
}

const char* tile_choice_name(TileChoice tiles) {
  switch (tiles) {
    case TileChoice::narrow: return "narrow";
    case TileChoice::wide: return "wide";
    case TileChoice::automatic: break;
  }
  return "auto";
}

EnvConfig parse_env_config(const std::vector<std::string>& environment) {
  // First occurrence of a name wins, as with getenv().
  std::map<std::string, std::string> ours;
  std::map<std::string, std::string> others;
  for (const std::string& entry : environment) {
    const std::size_t eq = entry.find('=');
    if (eq == std::string::npos || eq == 0) continue;
    std::string name = entry.substr(0, eq);
    std::string value = entry.substr(eq + 1);
    auto& target = name.compare(0, kPrefix.size(), kPrefix) == 0 ? ours : others;
    target.emplace(std::move(name), std::move(value));
  }

  EnvConfig config;
  const std::vector<std::string>& known = known_env_variables();
  for (const auto& [name, value] : ours) {
    config.variables_set.emplace_back(name, value);
    if (!std::binary_search(known.begin(), known.end(), name))
      config.unknown_variables.push_back(name);
  }

  auto get = [&ours, &known](const char* name) -> const std::string* {
    // Every variable read here is listed in runtime/env_variables.cpp, which the warning, the CLI
    // and the README take their list from: reading an unlisted one is a bug of ours.
    if (!std::binary_search(known.begin(), known.end(), std::string(name)))
      throw std::logic_error(fmt::format("{} is read but not listed in env_variables()", name));
    return lookup(ours, name);
  };

  if (const std::string* value = get(kCacheDirVar); value && !value->empty())
    config.cache_dir = make_absolute(*value);
  else
    config.cache_dir = default_cache_dir(others);
  // "LINK/." or "LINK/.." would let open() follow a symbolic link at the root: see
  // normalize_for_open. Normalized here too, so that `info` shows the directory actually used.
  if (!config.cache_dir.empty()) config.cache_dir = normalize_for_open(config.cache_dir);

  if (const std::string* value = get(kCacheVar))
    config.cache_mode = parse_cache_mode(kCacheVar, *value);
  if (const std::string* value = get(kCachePathVar)) config.cache_layers = parse_cache_layers(*value);
  if (const std::string* value = get(kCacheSharedVar)) {
    std::string why;
    if (!parse_cache_sharing(lowercase(trim(*value)) == "group" ? std::string("group")
                                                                 : std::string(trim(*value)),
                             &config.cache_sharing, &why))
      throw ConfigError(fmt::format("{}={} is not valid: {} (allowed: {})", kCacheSharedVar,
                                    echo_text(*value), echo_text(why), kCacheSharedAllowed));
  }
  // Read after the sharing mode, which resets it; it only narrows whom a shared cache trusts.
  if (const std::string* value = get(kCacheOwnersVar)) {
    std::string why;
    if (!parse_cache_owners(*value, &config.cache_sharing.owners, &why))
      throw ConfigError(fmt::format("{}={} is not valid: {} (allowed: {})", kCacheOwnersVar,
                                    echo_text(*value), echo_text(why), kCacheOwnersAllowed));
    config.cache_sharing.owners_listed = true;
  }
  if (const std::string* value = get(kForceCompileVar))
    config.force_compile = parse_bool(kForceCompileVar, *value);
  if (const std::string* value = get(kStrictVar)) config.strict = parse_bool(kStrictVar, *value);
  if (const std::string* value = get(kRecordVar)) config.record_file = *value;

  if (const std::string* value = get(kMaxCacheSizeVar)) {
    const std::string_view text = trim(*value);
    if (!text.empty()) {
      std::optional<std::uint64_t> bytes = parse_byte_size(std::string(text));
      if (!bytes) throw_invalid(kMaxCacheSizeVar, *value, kSizeAllowed);
      config.max_cache_bytes = *bytes;
    }
  }

  if (const std::string* value = get(kLogVar)) config.log_level = parse_log(kLogVar, *value);

  if (const std::string* value = get(kArchVar)) {
    const std::string_view text = trim(*value);
    if (!text.empty()) {
      std::optional<std::string> arch = normalize_arch(std::string(text));
      if (!arch) throw_invalid(kArchVar, *value, kArchForms);
      // Validated like `warm --arch`: 75 is the oldest arch the kernels support.
      int number = 0;
      for (char c : *arch)
        if (is_digit(c)) number = number * 10 + (c - '0');
      if (number < kMinArchNumber)
        throw ConfigError(fmt::format("{}={} is not supported (allowed: {})", kArchVar,
                                      echo_text(*value),
                                      kArchSupported));
      config.arch_override = *arch;
    }
  }

  if (const std::string* value = get(kNoMmaVar)) config.no_mma = parse_bool(kNoMmaVar, *value);
  if (const std::string* value = get(kNoWgmmaVar)) config.no_wgmma = parse_bool(kNoWgmmaVar, *value);
  if (const std::string* value = get(kPrefillTilesVar))
    config.prefill_tiles = parse_tile_choice(kPrefillTilesVar, *value);
  if (const std::string* value = get(kDecodeTilesVar))
    config.decode_tiles = parse_tile_choice(kDecodeTilesVar, *value);
  if (const std::string* value = get(kDumpVar)) config.dump_dir = *value;
  if (const std::string* value = get(kTrustedKeysVar)) {
    auto keys = std::make_shared<TrustedKeys>();
    std::string why;
    if (!parse_trusted_keys(*value, keys.get(), &why))
      throw ConfigError(fmt::format("{}={} is not valid: {} (allowed: {})", kTrustedKeysVar,
                                    echo_text(*value), echo_text(why), kTrustedKeysAllowed));
    if (!keys->empty()) config.trusted_keys = std::move(keys);
  }
  if (const std::string* value = get(kSigningKeyVar); value && !trim(*value).empty()) {
    auto key = std::make_shared<SigningKey>();
    std::string why;
    if (!load_signing_key(std::string(trim(*value)), key.get(), &why))
      throw ConfigError(fmt::format("{}={} is not usable: {} (allowed: {})", kSigningKeyVar,
                                    echo_text(*value), echo_text(why), kSigningKeyAllowed));
    config.signing_key = std::move(key);
  }
  if (const std::string* value = get(kCacheNfsVar))
    config.cache_nfs = parse_choice<NetworkFsMode>(kCacheNfsVar, *value,
                                                   {{"auto", NetworkFsMode::automatic},
                                                    {"on", NetworkFsMode::on},
                                                    {"off", NetworkFsMode::off}},
                                                   kCacheNfsAllowed);
  if (const std::string* value = get(kRemoteVar)) {
    std::string why;
    // The value may carry a password: the message names the item, not its text.
    if (!parse_remote_endpoints(*value, &config.remotes, &why))
      throw ConfigError(fmt::format("{} is not valid: {} (allowed: {})", kRemoteVar, why,
                                    kRemoteAllowed));
    // `info` lists the variables set: it shows the URLs without their passwords.
    std::string shown;
    for (const auto& remote : config.remotes) shown += (shown.empty() ? "" : ",") + remote.shown;
    for (auto& [name, text] : config.variables_set)
      if (name == kRemoteVar) text = shown;
  }
  if (const std::string* value = get(kRemoteTimeoutVar))
    config.remote_timeout = std::chrono::milliseconds(
        parse_bounded(kRemoteTimeoutVar, *value, 1, 60000, kRemoteTimeoutAllowed));
  if (const std::string* value = get(kRemoteLeaseVar))
    config.remote_lease = std::chrono::milliseconds(
        parse_bounded(kRemoteLeaseVar, *value, 0, 600000, kRemoteLeaseAllowed));
  return config;
}

EnvConfig load_env_config_from_process() {
  // Only the entries the parser looks at are copied.
  std::vector<std::string> environment;
  if (environ != nullptr) {
    for (char** entry = environ; *entry != nullptr; ++entry) {
      std::string_view text(*entry);
      if (text.compare(0, kPrefix.size(), kPrefix) == 0 ||
          text.compare(0, 15, "XDG_CACHE_HOME=") == 0 || text.compare(0, 5, "HOME=") == 0 ||
          text.compare(0, 16, "XDG_RUNTIME_DIR=") == 0)
        environment.emplace_back(text);
    }
  }
  return parse_env_config(environment);
}

}  // namespace astrai::detail
