// Minimal leveled logging to stderr, configured once from ASTRAI_JIT_LOG. The base layer: the
// cache and everything above it log through this; it depends on nothing of the project.
#pragma once

#include <atomic>
#include <string>
#include <string_view>

#include <fmt/format.h>

namespace astrai::detail {

enum class LogLevel { off = 0, error = 1, warn = 2, info = 3, debug = 4 };

// Parses "off|error|warn|info|debug"; returns false for anything else.
bool parse_log_level(std::string_view text, LogLevel* level);
const char* log_level_name(LogLevel level);

class Logger {
 public:
  static Logger& instance();
  void set_level(LogLevel level) { level_.store(level, std::memory_order_relaxed); }
  LogLevel level() const { return level_.load(std::memory_order_relaxed); }
  bool enabled(LogLevel level) const { return level != LogLevel::off && level <= this->level(); }
  void write(LogLevel level, std::string_view message);
  // Logs only the first time `once_key` is seen in this process (repeated warnings stay quiet).
  void write_once(LogLevel level, const std::string& once_key, std::string_view message);

 private:
  std::atomic<LogLevel> level_{LogLevel::warn};
};

template <typename... Args>
void log(LogLevel level, fmt::format_string<Args...> format, Args&&... args) {
  Logger& logger = Logger::instance();
  if (logger.enabled(level)) logger.write(level, fmt::format(format, std::forward<Args>(args)...));
}

template <typename... Args>
void log_once(LogLevel level, const std::string& once_key, fmt::format_string<Args...> format,
              Args&&... args) {
  Logger& logger = Logger::instance();
  if (logger.enabled(level))
    logger.write_once(level, once_key, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace astrai::detail
