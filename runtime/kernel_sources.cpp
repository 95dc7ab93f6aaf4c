#include "runtime/kernel_sources.hpp"

#include <map>
#include <mutex>

#include <fmt/format.h>

#include "astrai/error.hpp"

namespace astrai::detail {

namespace {

const EmbeddedSource* find_source(std::string_view name) {
  for (const auto& source : embedded_kernel_sources())
    if (name == source.name) return &source;
  throw Error(fmt::format("astrai-jit: no embedded kernel source named '{}'", name));
}

}  // namespace

std::string_view kernel_source(std::string_view name) { return find_source(name)->text; }

namespace {

// The file names of the `#include "..."` lines of one source (a plain scan: this runs on the
// path of a cached load, where a regex engine costs milliseconds).
std::vector<std::string> quoted_includes(std::string_view text) {
  std::vector<std::string> names;
  std::size_t begin = 0;
  while (begin < text.size()) {
    std::size_t end = text.find('\n', begin);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(begin, end - begin);
    begin = end + 1;
    std::size_t i = line.find_first_not_of(" \t");
    if (i == std::string_view::npos || line[i] != '#') continue;
    i = line.find_first_not_of(" \t", i + 1);
    if (i == std::string_view::npos || line.compare(i, 7, "include") != 0) continue;
    i = line.find_first_not_of(" \t", i + 7);
    if (i == std::string_view::npos || line[i] != '"') continue;
    const std::size_t close = line.find('"', i + 1);
    if (close == std::string_view::npos || close == i + 1) continue;
    names.emplace_back(line.substr(i + 1, close - i - 1));
  }
  return names;
}

std::vector<SourceView> compute_closure(std::string_view main_file) {
  std::map<std::string_view, std::string_view> seen;
  std::vector<std::string> pending = {std::string(main_file)};
  while (!pending.empty()) {
    const std::string name = pending.back();
    pending.pop_back();
    if (seen.count(name)) continue;
    const EmbeddedSource* source = find_source(name);
    for (auto& included : quoted_includes(source->text)) pending.push_back(std::move(included));
    seen.emplace(source->name, source->text);
  }
  return {seen.begin(), seen.end()};
}

}  // namespace

const std::vector<SourceView>& kernel_source_closure(std::string_view main_file) {
  // The embedded sources never change in a process: compute each closure once (map nodes are
  // stable, so the reference stays valid).
  static std::mutex mutex;
  static std::map<std::string, std::vector<SourceView>, std::less<>> memo;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = memo.find(main_file);
  if (it == memo.end()) it = memo.emplace(std::string(main_file), compute_closure(main_file)).first;
  return it->second;
}

}  // namespace astrai::detail
