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

// The closure was found when the library was built (tools/embed/embed_kernel_sources.cpp): a
// cached load in a fresh process reads none of the sources' text.
std::vector<SourceView> compute_closure(std::string_view main_file) {
  const auto& sources = embedded_kernel_sources();
  const EmbeddedSource* source = find_source(main_file);
  std::vector<SourceView> closure;
  closure.reserve(source->closure_size);
  for (std::size_t i = 0; i < source->closure_size; ++i) {
    const EmbeddedSource& member = sources.at(source->closure[i]);
    closure.emplace_back(member.name, member.text);
  }
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

SourceDigest kernel_source_digest(std::string_view bytes) {
  // Only the very storage of an embedded source has its digest precomputed: equal bytes held
  // elsewhere (or a prefix of an embedded text) are hashed, never matched by name.
  for (const auto& source : embedded_kernel_sources())
    if (bytes.data() == source.text.data() && bytes.size() == source.text.size()) return source.digest;
  return source_digest(bytes);
}

}  // namespace astrai::detail
