// Helpers every verb shares: formatting, configuration, errors.
#include "tools/cli/cli.hpp"

#include "cache/cache_fs.hpp"

namespace astrai::cli {

std::string format_bytes(std::uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024) return fmt::format("{} B", bytes);
  double value = static_cast<double>(bytes);
  std::size_t unit = 0;
  while (value >= 1024.0 && unit + 1 < std::size(kUnits)) {
    value /= 1024.0;
    ++unit;
  }
  return fmt::format("{:.1f} {}", value, kUnits[unit]);
}

const char* cache_mode_name(CacheMode mode) {
  switch (mode) {
    case CacheMode::read_write: return "rw";
    case CacheMode::read_only: return "ro";
    case CacheMode::off: return "off";
  }
  return "?";
}

std::string iso_time(fs::file_time_type time) {
  // C++17 has no clock_cast: map through the distance from "now" on both clocks.
  const auto system = std::chrono::system_clock::now() +
                      std::chrono::duration_cast<std::chrono::system_clock::duration>(
                          time - fs::file_time_type::clock::now());
  const std::time_t seconds = std::chrono::system_clock::to_time_t(system);
  std::tm utc{};
  if (::gmtime_r(&seconds, &utc) == nullptr) return "?";
  char text[32];
  if (std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &utc) == 0) return "?";
  return text;
}

std::string first_line(const std::string& text) {
  const std::size_t end = text.find('\n');
  return end == std::string::npos ? text : text.substr(0, end);
}

std::string trim(const std::string& text) {
  const char* space = " \t\r\n\f\v";
  const std::size_t begin = text.find_first_not_of(space);
  if (begin == std::string::npos) return "";
  return text.substr(begin, text.find_last_not_of(space) - begin + 1);
}

std::string join(const std::vector<std::string>& items, const char* separator) {
  std::string out;
  for (const auto& item : items) {
    if (!out.empty()) out += separator;
    out += item;
  }
  return out;
}

std::string counted(std::size_t count, const char* singular, const char* plural) {
  if (count == 1) return fmt::format("1 {}", singular);
  return plural != nullptr ? fmt::format("{} {}", count, plural) : fmt::format("{} {}s", count, singular);
}

void print_error(std::string message) {
  // Some library messages already carry the program name.
  const std::string prefix = "astrai-jit: ";
  if (message.compare(0, prefix.size(), prefix) == 0) message.erase(0, prefix.size());
  fmt::print(stderr, "astrai-jit: error: {}\n", message);
}

void print_warning(const std::string& message) { fmt::print(stderr, "astrai-jit: warning: {}\n", message); }

void print_note(const std::string& message) { fmt::print(stderr, "astrai-jit: note: {}\n", message); }

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

int device_attribute(CUdevice device, CUdevice_attribute attribute, int ordinal) {
  int value = 0;
  astrai::detail::check_cu(astrai::detail::driver().cuDeviceGetAttribute(&value, attribute, device),
                           "cuDeviceGetAttribute", ordinal);
  return value;
}

// Reads the ASTRAI_JIT_* environment once, configures logging and warns about unknown names.
EnvConfig load_config() {
  EnvConfig config = astrai::detail::load_env_config_from_process();
  astrai::detail::Logger::instance().set_level(config.log_level);
  // ASTRAI_JIT_ARCH is checked like `warm --arch`: NVRTC must be able to compile for it.
  if (!config.arch_override.empty()) {
    const std::vector<int> supported = astrai::detail::nvrtc_supported_archs();
    const int number = astrai::detail::arch_number(config.arch_override);
    if (!supported.empty() &&
        std::find(supported.begin(), supported.end(), number) == supported.end()) {
      std::vector<std::string> names;
      for (int arch : supported) names.push_back(fmt::format("sm_{}", arch));
      throw astrai::ConfigError(fmt::format(
          "ASTRAI_JIT_ARCH={}: NVRTC {} cannot compile for it (supported: {})",
          config.arch_override, astrai::detail::nvrtc_version().text(), join(names, ", ")));
    }
  }
  astrai::detail::warn_unknown_env_variables(config);
  return config;
}

void apply_cache_dir_override(const std::string& cache_dir, EnvConfig* config) {
  if (cache_dir.empty()) return;
  std::error_code ec;
  fs::path path = fs::absolute(cache_dir, ec);
  // Normalized like ASTRAI_JIT_CACHE_DIR: a trailing "/." must not get a linked root followed.
  config->cache_dir = astrai::detail::normalize_for_open(ec ? fs::path(cache_dir) : path);
}


}  // namespace astrai::cli
