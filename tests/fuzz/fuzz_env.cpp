// libFuzzer target: parse_env_config over entries separated by NUL or newline ("NAME=value",
// like environ). A bad value throws astrai::ConfigError; any other exception escapes and is a
// bug. A parsed configuration is consistent: an absolute cache directory, a normalized arch,
// the variables listed sorted and once each.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "astrai/error.hpp"
#include "runtime/env_config.hpp"
#include "tests/support/fuzz.hpp"

using astrai::fuzz::require;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  using namespace std::string_literals;
  astrai::fuzz::write_seeds({
      "ASTRAI_JIT_CACHE_DIR=/var/cache/astrai\nASTRAI_JIT_CACHE=ro\nASTRAI_JIT_LOG=debug\n",
      "ASTRAI_JIT_MAX_CACHE_SIZE=10GiB\0ASTRAI_JIT_ARCH=8.9\0ASTRAI_JIT_NO_MMA=yes\0"s,
      "ASTRAI_JIT_FORCE_COMPILE=on\nASTRAI_JIT_STRICT=0\nASTRAI_JIT_RECORD=/tmp/m\n"
      "ASTRAI_JIT_DUMP=d\nASTRAI_JIT_CACHE_DIR=relative/dir\n",
      "HOME=/home/u\nXDG_CACHE_HOME=rel\nASTRAI_JIT_ARCH=sm_90a\nASTRAI_JIT_CAHCE=rw\n",
      "ASTRAI_JIT_MAX_CACHE_SIZE=18446744073709551615\nASTRAI_JIT_ARCH=sm_100f\n=x\nnoequals\n",
      "ASTRAI_JIT_CACHE_PATH=/opt/a:/mnt/b::/c/\nASTRAI_JIT_CACHE_SHARED=group\n",
      "ASTRAI_JIT_CACHE_SHARED=1500\nASTRAI_JIT_CACHE_PATH=rel\nXDG_RUNTIME_DIR=/run/user/1\n",
  });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const std::vector<std::string> entries = astrai::fuzz::split_any(input, std::string("\0\n", 2));

  for (const auto& entry : entries) {
    // The helpers return nullopt for anything they do not accept; they never throw.
    const std::string value = entry.substr(std::min(entry.size(), entry.find('=') + 1));
    if (const auto bytes = astrai::detail::parse_byte_size(value))
      require(astrai::detail::parse_byte_size(std::to_string(*bytes)) == bytes,
              "a byte size does not survive printing and parsing");
    if (const auto arch = astrai::detail::normalize_arch(value))
      require(astrai::detail::normalize_arch(*arch) == arch, "a normalized arch is not stable");
  }

  astrai::detail::EnvConfig config;
  try {
    config = astrai::detail::parse_env_config(entries);
  } catch (const astrai::ConfigError& error) {
    require(std::string(error.what()).find("ASTRAI_JIT_") != std::string::npos,
            "a configuration error does not name the variable");
    return 0;
  }
  // Empty means memory only (no HOME, no user database entry, no XDG_RUNTIME_DIR).
  require(config.cache_dir.empty() || config.cache_dir.is_absolute(),
          "the cache directory is not absolute");
  for (const auto& layer : config.cache_layers)
    require(layer.is_absolute(), "a read-only cache layer is not absolute");
  require(config.arch_override.empty() ||
              astrai::detail::normalize_arch(config.arch_override) == config.arch_override,
          "the arch override is not normalized");
  require(std::is_sorted(config.variables_set.begin(), config.variables_set.end()),
          "the variables set are not sorted");
  require(std::adjacent_find(config.variables_set.begin(), config.variables_set.end(),
                             [](const auto& a, const auto& b) { return a.first == b.first; }) ==
              config.variables_set.end(),
          "a variable is listed twice");
  for (const auto& name : config.unknown_variables)
    require(std::any_of(config.variables_set.begin(), config.variables_set.end(),
                        [&](const auto& set) { return set.first == name; }),
            "an unknown variable is not among the variables set");
  return 0;
}
