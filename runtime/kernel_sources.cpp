#include "runtime/kernel_sources.hpp"

#include <algorithm>
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

// The file names of the `#include "..."` lines of one source. This runs on the path of a cached
// load in a fresh process, so it jumps from one '#' to the next (memchr) rather than walking
// every line: a line-by-line scan of a family's 18 headers cost more than the rest of the load's
// host work together.
std::vector<std::string_view> quoted_includes(std::string_view text) {
  std::vector<std::string_view> names;
  constexpr std::string_view kInclude = "include";
  for (std::size_t hash = text.find('#'); hash != std::string_view::npos; hash = text.find('#', hash + 1)) {
    // A directive: only blanks between the line's start and the '#'.
    std::size_t before = hash;
    while (before > 0 && (text[before - 1] == ' ' || text[before - 1] == '\t')) --before;
    if (before > 0 && text[before - 1] != '\n') continue;
    std::size_t i = text.find_first_not_of(" \t", hash + 1);
    if (i == std::string_view::npos || text.compare(i, kInclude.size(), kInclude) != 0) continue;
    i = text.find_first_not_of(" \t", i + kInclude.size());
    if (i == std::string_view::npos || text[i] != '"') continue;
    const std::size_t close = text.find_first_of("\"\n", i + 1);
    if (close == std::string_view::npos || text[close] != '"' || close == i + 1) continue;
    names.push_back(text.substr(i + 1, close - i - 1));
  }
  return names;
}

// Visited files are marked by their place in the embedded table (a flag a file, no tree of
// names), then sorted by name once at the end.
std::vector<SourceView> compute_closure(std::string_view main_file) {
  const auto& sources = embedded_kernel_sources();
  std::vector<bool> seen(sources.size(), false);
  std::vector<SourceView> closure;
  std::vector<std::string_view> pending = {main_file};
  while (!pending.empty()) {
    const std::string_view name = pending.back();
    pending.pop_back();
    const EmbeddedSource* source = find_source(name);
    const std::size_t index = static_cast<std::size_t>(source - sources.data());
    if (seen[index]) continue;
    seen[index] = true;
    closure.emplace_back(source->name, source->text);
    for (std::string_view included : quoted_includes(source->text)) pending.push_back(included);
  }
  std::sort(closure.begin(), closure.end(),
            [](const SourceView& a, const SourceView& b) { return a.first < b.first; });
  return closure;
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
