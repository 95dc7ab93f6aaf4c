// ASTRAI_JIT_* environment parsing: values, defaults, error messages, cache-dir precedence.
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "astrai/error.hpp"
#include "runtime/env_config.hpp"
#include "tests/support/cache_support.hpp"
#include "tests/support/support.hpp"

namespace {

using astrai::ConfigError;
using astrai::detail::CacheMode;
using astrai::detail::EnvConfig;
using astrai::detail::LogLevel;
using astrai::detail::normalize_arch;
using astrai::detail::parse_byte_size;
using astrai::detail::parse_env_config;

constexpr const char* kTestHome = "/home/tester";

// Parses exactly the given entries.
EnvConfig parse_exact(std::vector<std::string> entries) { return parse_env_config(entries); }

// Parses the entries plus a fixed HOME (appended, so an entry of the test's own wins).
EnvConfig parse(std::vector<std::string> entries) {
  entries.push_back(std::string("HOME=") + kTestHome);
  return parse_env_config(entries);
}

// Parses an environment holding one variable.
EnvConfig parse_one(const std::string& name, const std::string& value) {
  return parse({name + "=" + value});
}

std::string bool_error(const std::string& name, const std::string& value) {
  return name + "=" + value + " is not valid (allowed: 1, 0, true, false, yes, no, on, off)";
}

std::string size_error(const std::string& value) {
  return "ASTRAI_JIT_MAX_CACHE_SIZE=" + value +
         " is not valid (allowed: a whole number of bytes, optionally followed by B, K, M, G, T, "
         "KiB, MiB, GiB, TiB, KB, MB, GB or TB (all powers of 1024), e.g. 1048576, 512M, 10GiB; "
         "0 = unlimited)";
}

std::string arch_error(const std::string& value) {
  return "ASTRAI_JIT_ARCH=" + value +
         " is not valid (allowed: sm_XY, XY or X.Y for a cubin of that arch, or compute_XY for PTX "
         "that the driver finishes for the device, each with an optional a or f suffix; e.g. sm_80, "
         "8.9, sm_90a, compute_80)";
}

bool get_flag(const EnvConfig& config, const std::string& name) {
  if (name == "ASTRAI_JIT_FORCE_COMPILE") return config.force_compile;
  if (name == "ASTRAI_JIT_STRICT") return config.strict;
  if (name == "ASTRAI_JIT_NO_MMA") return config.no_mma;
  if (name == "ASTRAI_JIT_NO_WGMMA") return config.no_wgmma;
  FAIL("not a boolean variable: " << name);
  return false;
}

const std::vector<std::string> kBoolVariables = {"ASTRAI_JIT_FORCE_COMPILE", "ASTRAI_JIT_STRICT",
                                                 "ASTRAI_JIT_NO_MMA", "ASTRAI_JIT_NO_WGMMA"};

constexpr std::uint64_t KiB = 1024ULL;
constexpr std::uint64_t MiB = 1024ULL * KiB;
constexpr std::uint64_t GiB = 1024ULL * MiB;
constexpr std::uint64_t TiB = 1024ULL * GiB;

}  // namespace

TEST_SUITE("env") {

TEST_CASE("the known variables are listed once each, sorted") {
  const auto& known = astrai::detail::known_env_variables();
  const std::vector<std::string> expected = {
      "ASTRAI_JIT_ARCH",          "ASTRAI_JIT_CACHE",        "ASTRAI_JIT_CACHE_DIR",
      "ASTRAI_JIT_CACHE_NFS",     "ASTRAI_JIT_CACHE_OWNERS",  "ASTRAI_JIT_CACHE_PATH",    "ASTRAI_JIT_CACHE_SHARED", "ASTRAI_JIT_DECODE_TILES", "ASTRAI_JIT_DUMP",
      "ASTRAI_JIT_FORCE_COMPILE", "ASTRAI_JIT_LOG",          "ASTRAI_JIT_MAX_CACHE_SIZE",
      "ASTRAI_JIT_NO_MMA",        "ASTRAI_JIT_NO_WGMMA",     "ASTRAI_JIT_PREFILL_TILES",
      "ASTRAI_JIT_RECORD",        "ASTRAI_JIT_REMOTE",       "ASTRAI_JIT_REMOTE_LEASE_MS",
      "ASTRAI_JIT_REMOTE_TIMEOUT_MS", "ASTRAI_JIT_STRICT"};
  CHECK(known == expected);
  CHECK(std::is_sorted(known.begin(), known.end()));
  CHECK(std::adjacent_find(known.begin(), known.end()) == known.end());
}

TEST_CASE("an environment without ASTRAI_JIT variables gives the defaults") {
  EnvConfig config = parse({"PATH=/usr/bin", "LANG=C.UTF-8"});
  CHECK(config.cache_dir == std::filesystem::path(kTestHome) / ".cache" / "astrai-jit");
  CHECK(config.cache_mode == CacheMode::read_write);
  CHECK_FALSE(config.force_compile);
  CHECK_FALSE(config.strict);
  CHECK(config.record_file.empty());
  CHECK(config.max_cache_bytes == 0);
  CHECK(config.log_level == LogLevel::warn);
  CHECK(config.arch_override.empty());
  CHECK_FALSE(config.no_mma);
  CHECK(config.dump_dir.empty());
  CHECK(config.variables_set.empty());
  CHECK(config.unknown_variables.empty());
}

TEST_CASE("boolean variables accept every documented spelling in any case") {
  const std::vector<std::string> truthy = {"1", "true", "TRUE", "True", "yes", "YES", "on", "On"};
  const std::vector<std::string> falsy = {"0", "false", "FALSE", "no", "No", "off", "OFF", ""};
  for (const auto& name : kBoolVariables) {
    for (const auto& value : truthy) {
      CAPTURE(name);
      CAPTURE(value);
      CHECK(get_flag(parse_one(name, value), name));
    }
    for (const auto& value : falsy) {
      CAPTURE(name);
      CAPTURE(value);
      CHECK_FALSE(get_flag(parse_one(name, value), name));
    }
  }
}

TEST_CASE("a boolean variable only affects its own field") {
  EnvConfig strict = parse_one("ASTRAI_JIT_STRICT", "1");
  CHECK(strict.strict);
  CHECK_FALSE(strict.force_compile);
  CHECK_FALSE(strict.no_mma);
  EnvConfig force = parse_one("ASTRAI_JIT_FORCE_COMPILE", "yes");
  CHECK(force.force_compile);
  CHECK_FALSE(force.strict);
  EnvConfig no_mma = parse_one("ASTRAI_JIT_NO_MMA", "on");
  CHECK(no_mma.no_mma);
  CHECK_FALSE(no_mma.strict);
  CHECK_FALSE(no_mma.no_wgmma);
  EnvConfig no_wgmma = parse_one("ASTRAI_JIT_NO_WGMMA", "1");
  CHECK(no_wgmma.no_wgmma);
  CHECK_FALSE(no_wgmma.no_mma);
}

TEST_CASE("ASTRAI_JIT_DECODE_TILES picks the Hopper decode's wide CTAs, auto by default") {
  using astrai::detail::TileChoice;
  CHECK(parse_one("ASTRAI_JIT_ARCH", "sm_90a").decode_tiles == TileChoice::automatic);
  CHECK(parse_one("ASTRAI_JIT_DECODE_TILES", "narrow").decode_tiles == TileChoice::narrow);
  CHECK(parse_one("ASTRAI_JIT_DECODE_TILES", "wide").decode_tiles == TileChoice::wide);
  CHECK(parse_one("ASTRAI_JIT_DECODE_TILES", "wide").prefill_tiles == TileChoice::automatic);
  CHECK_THROWS_WITH_AS(parse_one("ASTRAI_JIT_DECODE_TILES", "4"),
                       "ASTRAI_JIT_DECODE_TILES=4 is not valid (allowed: auto, narrow, wide)", ConfigError);
}

TEST_CASE("ASTRAI_JIT_PREFILL_TILES picks the Hopper prefill's tiling, auto by default") {
  using astrai::detail::TileChoice;
  CHECK(parse({"PATH=/usr/bin"}).prefill_tiles == TileChoice::automatic);
  CHECK(parse_one("ASTRAI_JIT_PREFILL_TILES", "auto").prefill_tiles == TileChoice::automatic);
  CHECK(parse_one("ASTRAI_JIT_PREFILL_TILES", "").prefill_tiles == TileChoice::automatic);
  CHECK(parse_one("ASTRAI_JIT_PREFILL_TILES", "narrow").prefill_tiles == TileChoice::narrow);
  CHECK(parse_one("ASTRAI_JIT_PREFILL_TILES", " Wide ").prefill_tiles == TileChoice::wide);
  CHECK_THROWS_WITH_AS(parse_one("ASTRAI_JIT_PREFILL_TILES", "192"),
                       "ASTRAI_JIT_PREFILL_TILES=192 is not valid (allowed: auto, narrow, wide)", ConfigError);
}

TEST_CASE("a bad boolean value is rejected with the variable, the value and the spellings") {
  CHECK_THROWS_WITH_AS(parse_one("ASTRAI_JIT_STRICT", "maybe"),
                       "ASTRAI_JIT_STRICT=maybe is not valid (allowed: 1, 0, true, false, yes, "
                       "no, on, off)",
                       ConfigError);
  for (const auto& name : kBoolVariables) {
    for (const std::string value : {"maybe", "2", "-1", "enable", "y", "n", "tru", "1 1"}) {
      CAPTURE(name);
      CAPTURE(value);
      CHECK_THROWS_WITH_AS(parse_one(name, value), bool_error(name, value).c_str(), ConfigError);
    }
  }
}

TEST_CASE("surrounding whitespace in a value is ignored but kept in error messages") {
  CHECK(parse_one("ASTRAI_JIT_STRICT", " 1 ").strict);
  CHECK(parse_one("ASTRAI_JIT_CACHE", "ro\n").cache_mode == CacheMode::read_only);
  CHECK(parse_one("ASTRAI_JIT_MAX_CACHE_SIZE", " 10G ").max_cache_bytes == 10 * GiB);
  CHECK(parse_one("ASTRAI_JIT_ARCH", "\tsm_89 ").arch_override == "sm_89");
  CHECK(parse_one("ASTRAI_JIT_LOG", " debug").log_level == LogLevel::debug);
  CHECK_THROWS_WITH_AS(parse_one("ASTRAI_JIT_STRICT", " maybe "),
                       bool_error("ASTRAI_JIT_STRICT", " maybe ").c_str(), ConfigError);
}

TEST_CASE("the cache mode accepts rw, ro and off") {
  CHECK(parse_one("ASTRAI_JIT_CACHE", "rw").cache_mode == CacheMode::read_write);
  CHECK(parse_one("ASTRAI_JIT_CACHE", "ro").cache_mode == CacheMode::read_only);
  CHECK(parse_one("ASTRAI_JIT_CACHE", "off").cache_mode == CacheMode::off);
  CHECK(parse_one("ASTRAI_JIT_CACHE", "RO").cache_mode == CacheMode::read_only);
  CHECK(parse_one("ASTRAI_JIT_CACHE", "Off").cache_mode == CacheMode::off);
  CHECK(parse_one("ASTRAI_JIT_CACHE", "").cache_mode == CacheMode::read_write);
}

TEST_CASE("a bad cache mode is rejected with the allowed modes") {
  CHECK_THROWS_WITH_AS(parse_one("ASTRAI_JIT_CACHE", "rx"),
                       "ASTRAI_JIT_CACHE=rx is not valid (allowed: rw, ro, off)", ConfigError);
  CHECK_THROWS_WITH_AS(parse_one("ASTRAI_JIT_CACHE", "readonly"),
                       "ASTRAI_JIT_CACHE=readonly is not valid (allowed: rw, ro, off)",
                       ConfigError);
  CHECK_THROWS_WITH_AS(parse_one("ASTRAI_JIT_CACHE", "1"),
                       "ASTRAI_JIT_CACHE=1 is not valid (allowed: rw, ro, off)", ConfigError);
}

TEST_CASE("the log level accepts every level name in any case") {
  CHECK(parse_one("ASTRAI_JIT_LOG", "off").log_level == LogLevel::off);
  CHECK(parse_one("ASTRAI_JIT_LOG", "error").log_level == LogLevel::error);
  CHECK(parse_one("ASTRAI_JIT_LOG", "warn").log_level == LogLevel::warn);
  CHECK(parse_one("ASTRAI_JIT_LOG", "info").log_level == LogLevel::info);
  CHECK(parse_one("ASTRAI_JIT_LOG", "debug").log_level == LogLevel::debug);
  CHECK(parse_one("ASTRAI_JIT_LOG", "DEBUG").log_level == LogLevel::debug);
  CHECK(parse_one("ASTRAI_JIT_LOG", "Info").log_level == LogLevel::info);
  CHECK(parse_one("ASTRAI_JIT_LOG", "").log_level == LogLevel::warn);
}

TEST_CASE("a bad log level is rejected with the allowed levels") {
  CHECK_THROWS_WITH_AS(parse_one("ASTRAI_JIT_LOG", "verbose"),
                       "ASTRAI_JIT_LOG=verbose is not valid (allowed: off, error, warn, info, "
                       "debug)",
                       ConfigError);
  CHECK_THROWS_WITH_AS(parse_one("ASTRAI_JIT_LOG", "warning"),
                       "ASTRAI_JIT_LOG=warning is not valid (allowed: off, error, warn, info, "
                       "debug)",
                       ConfigError);
  CHECK_THROWS_WITH_AS(parse_one("ASTRAI_JIT_LOG", "3"),
                       "ASTRAI_JIT_LOG=3 is not valid (allowed: off, error, warn, info, debug)",
                       ConfigError);
}

TEST_CASE("the record file and the dump directory are taken as given and empty means off") {
  EnvConfig config = parse({"ASTRAI_JIT_RECORD=/tmp/rec/variants.txt", "ASTRAI_JIT_DUMP=dumps"});
  CHECK(config.record_file == std::filesystem::path("/tmp/rec/variants.txt"));
  CHECK(config.dump_dir == std::filesystem::path("dumps"));

  EnvConfig off = parse({"ASTRAI_JIT_RECORD=", "ASTRAI_JIT_DUMP="});
  CHECK(off.record_file.empty());
  CHECK(off.dump_dir.empty());
  // Set but empty still counts as set for `info`.
  CHECK(off.variables_set.size() == 2);
}

TEST_CASE("the maximum cache size accepts bytes and 1024-based suffixes") {
  CHECK(parse_one("ASTRAI_JIT_MAX_CACHE_SIZE", "0").max_cache_bytes == 0);
  CHECK(parse_one("ASTRAI_JIT_MAX_CACHE_SIZE", "").max_cache_bytes == 0);
  CHECK(parse_one("ASTRAI_JIT_MAX_CACHE_SIZE", "1048576").max_cache_bytes == MiB);
  CHECK(parse_one("ASTRAI_JIT_MAX_CACHE_SIZE", "10G").max_cache_bytes == 10 * GiB);
  CHECK(parse_one("ASTRAI_JIT_MAX_CACHE_SIZE", "512MiB").max_cache_bytes == 512 * MiB);
  CHECK(parse_one("ASTRAI_JIT_MAX_CACHE_SIZE", "2 TB").max_cache_bytes == 2 * TiB);
}

TEST_CASE("a bad maximum cache size is rejected with the value and the allowed forms") {
  for (const std::string value :
       {"10X", "-1", "1.5G", "abc", "10 G B", "99999999999999999999", "17179869184G"}) {
    CAPTURE(value);
    CHECK_THROWS_WITH_AS(parse_one("ASTRAI_JIT_MAX_CACHE_SIZE", value), size_error(value).c_str(),
                         ConfigError);
  }
}

TEST_CASE("byte sizes parse digits and every suffix spelling") {
  struct Row {
    const char* text;
    std::uint64_t bytes;
  };
  const Row rows[] = {
      {"0", 0},
      {"1", 1},
      {"007", 7},
      {"1048576", MiB},
      {"18446744073709551615", UINT64_MAX},
      {"100B", 100},
      {"100 b", 100},
      {"1K", KiB},
      {"1k", KiB},
      {"1KiB", KiB},
      {"1kib", KiB},
      {"1KB", KiB},
      {"1kb", KiB},
      {"4 K", 4 * KiB},
      {"3M", 3 * MiB},
      {"3MiB", 3 * MiB},
      {"3MB", 3 * MiB},
      {"3 mib", 3 * MiB},
      {"10G", 10 * GiB},
      {"10GiB", 10 * GiB},
      {"10GB", 10 * GiB},
      {"10 gB", 10 * GiB},
      {"2T", 2 * TiB},
      {"2TiB", 2 * TiB},
      {"2TB", 2 * TiB},
      {"0G", 0},
      {"16777215T", 16777215ULL * TiB},
      {"17179869183G", 17179869183ULL * GiB},
  };
  for (const Row& row : rows) {
    CAPTURE(row.text);
    std::optional<std::uint64_t> parsed = parse_byte_size(row.text);
    REQUIRE(parsed.has_value());
    CHECK(*parsed == row.bytes);
  }
}

TEST_CASE("byte sizes reject empty, signed, fractional, malformed and overflowing text") {
  const char* rows[] = {
      "",
      " ",
      "K",
      "G10",
      "-1",
      "+1",
      "-0",
      "1.5",
      "1.5G",
      "1,000",
      "1e6",
      "0x10",
      " 10",
      "10 ",
      "10  G",
      "10\tG",
      "10 G ",
      "10GG",
      "10Gi",
      "10iB",
      "10GIBS",
      "10bytes",
      "10P",
      "10PiB",
      "10X",
      "99999999999999999999",
      "18446744073709551616",
      "16777216T",
      "17179869184G",
      "18446744073709551615K",
  };
  for (const char* text : rows) {
    CAPTURE(text);
    CHECK_FALSE(parse_byte_size(text).has_value());
  }
}

TEST_CASE("the arch override is normalized") {
  CHECK(parse_one("ASTRAI_JIT_ARCH", "8.9").arch_override == "sm_89");
  CHECK(parse_one("ASTRAI_JIT_ARCH", "sm_90a").arch_override == "sm_90a");
  CHECK(parse_one("ASTRAI_JIT_ARCH", "100a").arch_override == "sm_100a");
  CHECK(parse_one("ASTRAI_JIT_ARCH", "").arch_override.empty());
}

TEST_CASE("an arch override may name a virtual arch, compiled to PTX that the driver finishes") {
  CHECK(parse_one("ASTRAI_JIT_ARCH", "compute_80").arch_override == "compute_80");
  CHECK(parse_one("ASTRAI_JIT_ARCH", "compute_89").arch_override == "compute_89");
  CHECK(parse_one("ASTRAI_JIT_ARCH", "compute_90a").arch_override == "compute_90a");
  CHECK(parse_one("ASTRAI_JIT_ARCH", "COMPUTE_90").arch_override == "compute_90");
  CHECK(parse_one("ASTRAI_JIT_ARCH", " compute_75 ").arch_override == "compute_75");
}

TEST_CASE("a bad arch override is rejected naming every accepted form") {
  CHECK_THROWS_WITH_AS(parse_one("ASTRAI_JIT_ARCH", "sm_xx"),
                       "ASTRAI_JIT_ARCH=sm_xx is not valid (allowed: sm_XY, XY or X.Y for a cubin of "
                       "that arch, or compute_XY for PTX that the driver finishes for the device, each "
                       "with an optional a or f suffix; e.g. sm_80, 8.9, sm_90a, compute_80)",
                       ConfigError);
  for (const std::string value : {"compute_8.9", "compute_", "compute80", "compute_sm_80", "sm_20", "sm_160",
                                  "ampere", "8.10"}) {
    CAPTURE(value);
    CHECK_THROWS_WITH_AS(parse_one("ASTRAI_JIT_ARCH", value), arch_error(value).c_str(),
                         ConfigError);
  }
}

TEST_CASE("arch strings in every accepted notation normalize to sm_<major><minor> or compute_<major><minor>") {
  struct Row {
    const char* text;
    const char* arch;
  };
  const Row rows[] = {
      {"89", "sm_89"},       {"8.9", "sm_89"},        {"sm89", "sm_89"},
      {"sm_89", "sm_89"},    {"SM_89", "sm_89"},      {"Sm89", "sm_89"},
      {"80", "sm_80"},       {"sm_80", "sm_80"},      {"8.0", "sm_80"},
      {"90a", "sm_90a"},     {"sm_90a", "sm_90a"},    {"sm90a", "sm_90a"},
      {"9.0a", "sm_90a"},    {"SM_90A", "sm_90a"},    {"90", "sm_90"},
      {"100a", "sm_100a"},   {"sm_100a", "sm_100a"},  {"10.0a", "sm_100a"},
      {"sm_100f", "sm_100f"}, {"100f", "sm_100f"},    {"10.0f", "sm_100f"},
      {"sm_120", "sm_120"},  {"12.0", "sm_120"},      {"sm_121a", "sm_121a"},
      {"30", "sm_30"},       {"3.0", "sm_30"},        {"sm_35", "sm_35"},
      {"159", "sm_159"},     {"15.9", "sm_159"},      {"7.5", "sm_75"},
      {"compute_80", "compute_80"},   {"compute_89", "compute_89"},   {"compute_90a", "compute_90a"},
      {"COMPUTE_90A", "compute_90a"}, {"Compute_100f", "compute_100f"}, {"compute_120", "compute_120"},
      {"compute_75", "compute_75"},   {"compute_30", "compute_30"},
  };
  for (const Row& row : rows) {
    CAPTURE(row.text);
    std::optional<std::string> arch = normalize_arch(row.text);
    REQUIRE(arch.has_value());
    CHECK(*arch == row.arch);
  }
}

TEST_CASE("strings that are not an arch do not normalize") {
  const char* rows[] = {
      "",        "sm",       "sm_",        "sm__89",    "a",         "sm_a",
      "9",       "sm_9",     "20",         "2.0",       "sm_20",     "160",
      "16.0",    "sm_160",   "1000",       "sm_1000",   "089",       "sm_089",
      "08.9",    "8.10",     "8.",         ".9",        "8..9",      "sm_8.9",
      "sm8.9",   "sm_90b",   "sm_90aa",    "sm_90af",   "a90",       "sm_a90",
      "ampere",  "sm_89 ",   " sm_89",     "sm-89",     "+89",       "-89",
      "8.9.0",   "sm_9x",    "sm_100fa",   "lto_90",    "compute",   "compute_",
      "compute_8.9", "compute80", "compute-80", "compute_9", "compute_20", "compute_160",
      "compute_089", "compute_90b", "compute_90aa", "compute_sm_80", "sm_compute_80", "compute_80 ",
      "computer_80", "compute_a",
  };
  for (const char* text : rows) {
    CAPTURE(text);
    CHECK_FALSE(normalize_arch(text).has_value());
  }
}

TEST_CASE("misspelled ASTRAI_JIT names are reported as unknown") {
  EnvConfig config = parse({"ASTRAI_JIT_CACHEDIR=/x", "ASTRAI_JIT_LOG=info", "ASTRAI_JIT_STRIC=1",
                            "ASTRAI_JIT_=", "astrai_jit_log=debug", "ASTRAI_JITLOG=debug"});
  const std::vector<std::string> unknown = {"ASTRAI_JIT_", "ASTRAI_JIT_CACHEDIR",
                                            "ASTRAI_JIT_STRIC"};
  CHECK(config.unknown_variables == unknown);
  // The typo does not set the cache directory, and unknown names never raise an error.
  CHECK(config.cache_dir == std::filesystem::path(kTestHome) / ".cache" / "astrai-jit");
  CHECK(config.log_level == LogLevel::info);
  CHECK_FALSE(config.strict);
}

TEST_CASE("every ASTRAI_JIT variable that is set is listed, sorted by name") {
  EnvConfig config = parse({"ASTRAI_JIT_STRICT=1", "PATH=/bin", "ASTRAI_JIT_CACHEDIR=/x",
                            "ASTRAI_JIT_ARCH=8.9", "ASTRAI_JIT_DUMP=", "XDG_CACHE_HOME=/xdg"});
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"ASTRAI_JIT_ARCH", "8.9"},
      {"ASTRAI_JIT_CACHEDIR", "/x"},
      {"ASTRAI_JIT_DUMP", ""},
      {"ASTRAI_JIT_STRICT", "1"},
  };
  CHECK(config.variables_set == expected);
  CHECK(config.unknown_variables == std::vector<std::string>{"ASTRAI_JIT_CACHEDIR"});
}

TEST_CASE("the first of repeated entries wins and entries without a name are skipped") {
  EnvConfig config = parse({"ASTRAI_JIT_LOG=debug", "ASTRAI_JIT_LOG=bogus", "ASTRAI_JIT_STRICT",
                            "=ASTRAI_JIT_NO_MMA=1"});
  CHECK(config.log_level == LogLevel::debug);
  CHECK_FALSE(config.strict);
  CHECK_FALSE(config.no_mma);
  CHECK(config.variables_set ==
        std::vector<std::pair<std::string, std::string>>{{"ASTRAI_JIT_LOG", "debug"}});
}

TEST_CASE("a value keeps everything after the first equals sign") {
  EnvConfig config = parse({"ASTRAI_JIT_RECORD=/tmp/a=b.txt"});
  CHECK(config.record_file == std::filesystem::path("/tmp/a=b.txt"));
  CHECK_THROWS_WITH_AS(parse({"ASTRAI_JIT_ARCH=sm_90a=x"}), arch_error("sm_90a=x").c_str(),
                       ConfigError);
}

TEST_CASE("ASTRAI_JIT_CACHE_DIR takes precedence over XDG_CACHE_HOME and HOME") {
  EnvConfig config = parse_exact({"ASTRAI_JIT_CACHE_DIR=/srv/jit-cache", "XDG_CACHE_HOME=/xdg",
                                  "HOME=/home/someone"});
  CHECK(config.cache_dir == std::filesystem::path("/srv/jit-cache"));
}

TEST_CASE("XDG_CACHE_HOME takes precedence over HOME") {
  EnvConfig config = parse_exact({"XDG_CACHE_HOME=/xdg", "HOME=/home/someone"});
  CHECK(config.cache_dir == std::filesystem::path("/xdg/astrai-jit"));
}

TEST_CASE("HOME is used when neither the cache dir nor XDG_CACHE_HOME is set") {
  EnvConfig config = parse_exact({"HOME=/home/someone"});
  CHECK(config.cache_dir == std::filesystem::path("/home/someone/.cache/astrai-jit"));
}

TEST_CASE("an empty cache dir or an empty or relative XDG_CACHE_HOME falls through") {
  CHECK(parse_exact({"ASTRAI_JIT_CACHE_DIR=", "XDG_CACHE_HOME=/xdg", "HOME=/h"}).cache_dir ==
        std::filesystem::path("/xdg/astrai-jit"));
  CHECK(parse_exact({"XDG_CACHE_HOME=", "HOME=/h"}).cache_dir ==
        std::filesystem::path("/h/.cache/astrai-jit"));
  CHECK(parse_exact({"XDG_CACHE_HOME=relative/cache", "HOME=/h"}).cache_dir ==
        std::filesystem::path("/h/.cache/astrai-jit"));
}

TEST_CASE("a relative cache dir is made absolute against the working directory") {
  EnvConfig config = parse_exact({"ASTRAI_JIT_CACHE_DIR=rel/cache", "HOME=/h"});
  CHECK(config.cache_dir.is_absolute());
  CHECK(config.cache_dir == std::filesystem::current_path() / "rel" / "cache");
}

TEST_CASE("without HOME the cache dir comes from the user database, never a predictable /tmp name") {
  for (const std::vector<std::string>& environment :
       {std::vector<std::string>{}, std::vector<std::string>{"HOME="},
        std::vector<std::string>{"HOME=relative"},
        std::vector<std::string>{"XDG_RUNTIME_DIR=/run/user/7"}}) {
    EnvConfig config = parse_exact(environment);
    CAPTURE(config.cache_dir);
    const bool from_home = config.cache_dir.is_absolute() &&
                           config.cache_dir.filename() == "astrai-jit" &&
                           config.cache_dir.parent_path().filename() == ".cache";
    const bool from_runtime_dir = config.cache_dir == "/run/user/7/astrai-jit";
    // Memory only (empty) is the last resort; a name under /tmp never is.
    CHECK((from_home || from_runtime_dir || config.cache_dir.empty()));
    CHECK(config.cache_dir.string().rfind("/tmp", 0) != 0);
  }
}

TEST_CASE("read-only cache layers are a list of absolute directories, empty parts skipped") {
  EnvConfig config = parse_one("ASTRAI_JIT_CACHE_PATH", "/opt/astrai-jit/cache::/mnt/k/ :/opt/astrai-jit/cache");
  REQUIRE(config.cache_layers.size() == 2);
  CHECK(config.cache_layers[0] == "/opt/astrai-jit/cache");
  CHECK(config.cache_layers[1] == "/mnt/k");  // normalized: no trailing separator
  CHECK(parse_one("ASTRAI_JIT_CACHE_PATH", "").cache_layers.empty());
  CHECK_THROWS_WITH_AS(parse_one("ASTRAI_JIT_CACHE_PATH", "/opt/c:relative"),
                       "ASTRAI_JIT_CACHE_PATH=/opt/c:relative is not valid (allowed: a "
                       "colon-separated list of absolute directories, e.g. "
                       "/opt/astrai-jit/cache:/mnt/kernels)",
                       ConfigError);
}

TEST_CASE("the shared cache takes off, group, a group name or a gid") {
  using Kind = astrai::detail::CacheSharing::Kind;
  CHECK(parse({}).cache_sharing.kind == Kind::off);
  CHECK(parse_one("ASTRAI_JIT_CACHE_SHARED", "off").cache_sharing.kind == Kind::off);
  CHECK(parse_one("ASTRAI_JIT_CACHE_SHARED", "group").cache_sharing.kind == Kind::directory_group);
  CHECK(parse_one("ASTRAI_JIT_CACHE_SHARED", " GROUP ").cache_sharing.kind == Kind::directory_group);
  const auto root_group = parse_one("ASTRAI_JIT_CACHE_SHARED", "root").cache_sharing;
  CHECK(root_group.kind == Kind::named_group);
  CHECK(root_group.gid == 0);
  const auto numeric = parse_one("ASTRAI_JIT_CACHE_SHARED", "1500").cache_sharing;
  CHECK(numeric.kind == Kind::named_group);
  CHECK(numeric.gid == 1500);
  CHECK_THROWS_WITH_AS(parse_one("ASTRAI_JIT_CACHE_SHARED", "no-such-group-x"),
                       "ASTRAI_JIT_CACHE_SHARED=no-such-group-x is not valid: no group named "
                       "'no-such-group-x' (allowed: off, group (the cache directory's group), a "
                       "group name or a numeric gid)",
                       ConfigError);
}

TEST_CASE("the shared cache's owners are user names or uids, and a bad one names the value") {
  CHECK_FALSE(parse({}).cache_sharing.owners_listed);
  const auto listed = parse_exact({"ASTRAI_JIT_CACHE_SHARED=group",
                                   "ASTRAI_JIT_CACHE_OWNERS= root , 1500,1501,1500"})
                          .cache_sharing;
  CHECK(listed.kind == astrai::detail::CacheSharing::Kind::directory_group);
  CHECK(listed.owners_listed);
  CHECK(listed.owners == std::vector<uid_t>{0, 1500, 1501});
  // Empty: a list of nobody, so only the user and root are trusted (never the whole group).
  const auto empty = parse_one("ASTRAI_JIT_CACHE_OWNERS", " ").cache_sharing;
  CHECK(empty.owners_listed);
  CHECK(empty.owners.empty());
  const std::string allowed =
      " (allowed: comma-separated user names or numeric uids, e.g. alice,bob,1500)";
  CHECK_THROWS_WITH_AS(parse_one("ASTRAI_JIT_CACHE_OWNERS", "root,no-such-user-x"),
                       ("ASTRAI_JIT_CACHE_OWNERS=root,no-such-user-x is not valid: no user named "
                        "'no-such-user-x'" + allowed).c_str(),
                       ConfigError);
  CHECK_THROWS_WITH_AS(parse_one("ASTRAI_JIT_CACHE_OWNERS", "1500,,1501"),
                       ("ASTRAI_JIT_CACHE_OWNERS=1500,,1501 is not valid: an empty name" + allowed)
                           .c_str(),
                       ConfigError);
  CHECK_THROWS_WITH_AS(parse_one("ASTRAI_JIT_CACHE_OWNERS", "4294967295"),
                       ("ASTRAI_JIT_CACHE_OWNERS=4294967295 is not valid: uid 4294967295 is out "
                        "of range (at most 4294967294)" + allowed).c_str(),
                       ConfigError);
  CHECK_THROWS_WITH_AS(parse_one("ASTRAI_JIT_CACHE_OWNERS", "-1"),
                       ("ASTRAI_JIT_CACHE_OWNERS=-1 is not valid: no user named '-1'" + allowed)
                           .c_str(),
                       ConfigError);
  CHECK_THROWS_WITH_AS(parse_one("ASTRAI_JIT_CACHE_OWNERS", "bob\x1b[2J"),
                       ("ASTRAI_JIT_CACHE_OWNERS=bob\\x1b[2J is not valid: no user named "
                        "'bob\\x1b[2J'" + allowed).c_str(),
                       ConfigError);
}

TEST_CASE("an arch override older than sm_75 is refused like warm --arch") {
  CHECK_THROWS_WITH_AS(parse_one("ASTRAI_JIT_ARCH", "sm_70"),
                       "ASTRAI_JIT_ARCH=sm_70 is not supported (allowed: sm_75 or newer, or "
                       "compute_75 or newer; e.g. sm_80, sm_89, sm_90a, compute_80)",
                       ConfigError);
  CHECK_THROWS_WITH_AS(parse_one("ASTRAI_JIT_ARCH", "compute_70"),
                       "ASTRAI_JIT_ARCH=compute_70 is not supported (allowed: sm_75 or newer, or "
                       "compute_75 or newer; e.g. sm_80, sm_89, sm_90a, compute_80)",
                       ConfigError);
  CHECK_THROWS_AS(parse_one("ASTRAI_JIT_ARCH", "6.1"), ConfigError);
  CHECK(parse_one("ASTRAI_JIT_ARCH", "7.5").arch_override == "sm_75");
}

TEST_CASE("every variable can be set at once") {
  EnvConfig config = parse_exact({
      "ASTRAI_JIT_CACHE_DIR=/c",
      "ASTRAI_JIT_CACHE=ro",
      "ASTRAI_JIT_FORCE_COMPILE=true",
      "ASTRAI_JIT_STRICT=on",
      "ASTRAI_JIT_RECORD=/r.txt",
      "ASTRAI_JIT_MAX_CACHE_SIZE=256M",
      "ASTRAI_JIT_LOG=error",
      "ASTRAI_JIT_ARCH=sm_90a",
      "ASTRAI_JIT_NO_MMA=1",
      "ASTRAI_JIT_DUMP=/d",
  });
  CHECK(config.cache_dir == std::filesystem::path("/c"));
  CHECK(config.cache_mode == CacheMode::read_only);
  CHECK(config.force_compile);
  CHECK(config.strict);
  CHECK(config.record_file == std::filesystem::path("/r.txt"));
  CHECK(config.max_cache_bytes == 256 * MiB);
  CHECK(config.log_level == LogLevel::error);
  CHECK(config.arch_override == "sm_90a");
  CHECK(config.no_mma);
  CHECK(config.dump_dir == std::filesystem::path("/d"));
  CHECK(config.variables_set.size() == 10);
  CHECK(config.unknown_variables.empty());
}

TEST_CASE("the process environment is read") {
  astrai::testing::TempDir dir;
  const std::string cache = (dir.path() / "cache").string();
  astrai::testing::ScopedEnv cache_dir("ASTRAI_JIT_CACHE_DIR", cache.c_str());
  astrai::testing::ScopedEnv mode("ASTRAI_JIT_CACHE", "off");
  astrai::testing::ScopedEnv arch("ASTRAI_JIT_ARCH", "8.6");
  astrai::testing::ScopedEnv typo("ASTRAI_JIT_FORCECOMPILE", "1");
  astrai::testing::ScopedEnv strict("ASTRAI_JIT_STRICT", nullptr);

  EnvConfig config = astrai::detail::load_env_config_from_process();
  CHECK(config.cache_dir == std::filesystem::path(cache));
  CHECK(config.cache_mode == CacheMode::off);
  CHECK(config.arch_override == "sm_86");
  CHECK_FALSE(config.strict);
  CHECK(std::find(config.unknown_variables.begin(), config.unknown_variables.end(),
                  "ASTRAI_JIT_FORCECOMPILE") != config.unknown_variables.end());
  CHECK(std::is_sorted(config.variables_set.begin(), config.variables_set.end()));

  astrai::testing::ScopedEnv bad("ASTRAI_JIT_STRICT", "maybe");
  CHECK_THROWS_WITH_AS(astrai::detail::load_env_config_from_process(),
                       "ASTRAI_JIT_STRICT=maybe is not valid (allowed: 1, 0, true, false, yes, "
                       "no, on, off)",
                       ConfigError);
}

TEST_CASE("the process cache dir follows XDG_CACHE_HOME when no override is set") {
  astrai::testing::ScopedEnv cache_dir("ASTRAI_JIT_CACHE_DIR", nullptr);
  astrai::testing::ScopedEnv xdg("XDG_CACHE_HOME", "/xdg-from-process");
  CHECK(astrai::detail::load_env_config_from_process().cache_dir ==
        std::filesystem::path("/xdg-from-process/astrai-jit"));
}

TEST_CASE("control bytes of a bad value are escaped in the error message") {
  CHECK_THROWS_WITH_AS(parse_one("ASTRAI_JIT_CACHE", "r\x1b[2Jw"),
                       "ASTRAI_JIT_CACHE=r\\x1b[2Jw is not valid (allowed: rw, ro, off)",
                       ConfigError);
  CHECK_THROWS_WITH_AS(parse_one("ASTRAI_JIT_ARCH", "sm_70\r\x07"),
                       "ASTRAI_JIT_ARCH=sm_70\\x0d\\x07 is not valid (allowed: sm_XY, XY or X.Y for "
                       "a cubin of that arch, or compute_XY for PTX that the driver finishes for "
                       "the device, each with an optional a or f suffix; e.g. sm_80, 8.9, sm_90a, "
                       "compute_80)",
                       ConfigError);
}

TEST_CASE("the unknown-variable warning lists every known variable") {
  const EnvConfig config = parse_one("ASTRAI_JIT_CACHE_SHARD", "group");
  REQUIRE(config.unknown_variables.size() == 1);
  astrai::testing::TempDir dir;
  astrai::testing::LogCapture log(dir.path() / "log.txt");
  astrai::detail::warn_unknown_env_variables(config);
  const std::string output = log.finish();
  CHECK(output.find("unknown environment variable ASTRAI_JIT_CACHE_SHARD ignored") !=
        std::string::npos);
  for (const auto& name : astrai::detail::known_env_variables()) {
    CAPTURE(name);
    CHECK(output.find(name) != std::string::npos);
  }
}

}  // TEST_SUITE("env")
