#include "base/logging.hpp"

#include <cstdio>
#include <mutex>
#include <unordered_set>

namespace astrai::detail {

bool parse_log_level(std::string_view text, LogLevel* level) {
  static constexpr std::pair<std::string_view, LogLevel> kLevels[] = {
      {"off", LogLevel::off},   {"error", LogLevel::error}, {"warn", LogLevel::warn},
      {"info", LogLevel::info}, {"debug", LogLevel::debug}};
  for (const auto& [name, value] : kLevels) {
    if (text == name) {
      *level = value;
      return true;
    }
  }
  return false;
}

const char* log_level_name(LogLevel level) {
  switch (level) {
    case LogLevel::off: return "off";
    case LogLevel::error: return "error";
    case LogLevel::warn: return "warn";
    case LogLevel::info: return "info";
    case LogLevel::debug: return "debug";
  }
  return "?";
}

Logger& Logger::instance() {
  static Logger logger;
  return logger;
}

namespace {
std::mutex& write_mutex() {
  static std::mutex mutex;
  return mutex;
}
}  // namespace

void Logger::write(LogLevel level, std::string_view message) {
  // One fwrite per line under a lock so lines from several threads never interleave.
  // The CLI's own messages' form ("astrai-jit: warning: ..."), so a user sees one style.
  std::string line = fmt::format("astrai-jit: {}: {}\n", level == LogLevel::warn ? "warning" : log_level_name(level),
                                 message);
  std::lock_guard<std::mutex> lock(write_mutex());
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

void Logger::write_once(LogLevel level, const std::string& once_key, std::string_view message) {
  static std::mutex seen_mutex;
  static std::unordered_set<std::string> seen;
  {
    std::lock_guard<std::mutex> lock(seen_mutex);
    if (!seen.insert(once_key).second) return;
  }
  write(level, message);
}

}  // namespace astrai::detail
