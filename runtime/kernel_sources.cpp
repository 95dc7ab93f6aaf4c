#include "runtime/kernel_sources.hpp"

#include <map>
#include <regex>

#include <fmt/format.h>

#include "astrai/error.hpp"

namespace astrai::detail {

std::string_view kernel_source(std::string_view name) {
  for (const auto& source : embedded_kernel_sources())
    if (name == source.name) return source.text;
  throw Error(fmt::format("astrai-jit: no embedded kernel source named '{}'", name));
}

std::vector<std::pair<std::string, std::string>> kernel_source_closure(std::string_view main_file) {
  static const std::regex include_line(R"re(^\s*#\s*include\s*"([^"]+)")re");
  std::map<std::string, std::string> seen;
  std::vector<std::string> pending = {std::string(main_file)};
  while (!pending.empty()) {
    std::string name = pending.back();
    pending.pop_back();
    if (seen.count(name)) continue;
    std::string text(kernel_source(name));
    std::size_t begin = 0;
    while (begin < text.size()) {
      std::size_t end = text.find('\n', begin);
      if (end == std::string::npos) end = text.size();
      std::smatch match;
      const std::string line = text.substr(begin, end - begin);
      if (std::regex_search(line, match, include_line)) pending.push_back(match[1]);
      begin = end + 1;
    }
    seen.emplace(std::move(name), std::move(text));
  }
  return {seen.begin(), seen.end()};
}

}  // namespace astrai::detail
