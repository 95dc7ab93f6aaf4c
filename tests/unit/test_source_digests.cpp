// The cache key holds each source's digest, and the library's own sources carry digests and
// include closures computed when it was built (tools/embed/embed_kernel_sources.cpp). These
// cases pin that the precomputed facts are exactly those of the embedded bytes, and that the
// key still follows every byte of every header a program includes.
#include <doctest/doctest.h>

#include <regex>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cache/cache_key.hpp"
#include "runtime/compile_plan.hpp"
#include "runtime/kernel_sources.hpp"
#include "tests/support/specs.hpp"

namespace source_digest_tests {

using astrai::detail::CacheKey;
using astrai::detail::CompileRequest;
using astrai::detail::embedded_kernel_sources;
using astrai::detail::kernel_source;

// The files `main_file` reaches through #include "..." lines, found with a regular expression:
// another reading than the generator's scanner, so that the two check each other.
std::set<std::string> reachable_files(const std::string& main_file) {
  static const std::regex include_line(R"re(^[ \t]*#[ \t]*include[ \t]*"([^"\n]+)")re",
                                       std::regex::multiline);
  std::set<std::string> seen;
  std::vector<std::string> pending = {main_file};
  while (!pending.empty()) {
    const std::string name = pending.back();
    pending.pop_back();
    if (!seen.insert(name).second) continue;
    const std::string text(kernel_source(name));
    for (std::sregex_iterator m(text.begin(), text.end(), include_line), end; m != end; ++m)
      pending.push_back((*m)[1].str());
  }
  return seen;
}

// Key of `request` with NVRTC 12.8, as the engine computes it.
CacheKey key_of(const CompileRequest& request) {
  return astrai::detail::compile_request_key(request, astrai::detail::NvrtcVersion{12, 8});
}

// The same key computed from owned copies of every header's bytes (CacheKeyInputs::sources,
// digested when the key is computed): what the key would be without build-time digests.
CacheKey key_from_bytes(const CompileRequest& request) {
  astrai::detail::CacheKeyInputs inputs;
  inputs.variant_name = request.variant_name;
  for (const auto& expression : request.name_expressions) inputs.instantiation += expression + ";";
  for (const auto& header : request.headers)
    inputs.sources.emplace_back(std::string(header.first), std::string(header.second));
  inputs.options = request.options;
  inputs.arch = request.arch;
  inputs.nvrtc_major = 12;
  inputs.nvrtc_minor = 8;
  return astrai::detail::compute_cache_key(inputs);
}

CompileRequest sm90_decode_request() {
  auto spec = astrai::testing::paged_decode_spec(astrai::DType::bf16, 128, 16, 4, "sm_90a");
  return astrai::detail::compile_request(spec);
}

}  // namespace source_digest_tests

TEST_SUITE("kernel_spec") {

TEST_CASE("every embedded source carries the digest of its exact bytes") {
  for (const auto& source : astrai::detail::embedded_kernel_sources()) {
    CAPTURE(source.name);
    CHECK(source.digest == astrai::detail::source_digest(source.text));
    CHECK(astrai::detail::kernel_source_digest(source.text) == source.digest);
    // Equal bytes elsewhere digest alike; a prefix of the embedded text is hashed as itself.
    const std::string copy(source.text);
    CHECK(astrai::detail::kernel_source_digest(copy) == source.digest);
    const std::string_view prefix = source.text.substr(0, source.text.size() - 1);
    CHECK(astrai::detail::kernel_source_digest(prefix) == astrai::detail::source_digest(prefix));
    CHECK(astrai::detail::kernel_source_digest(prefix) != source.digest);
  }
}

TEST_CASE("every embedded source's precomputed closure is what its include lines reach") {
  for (const auto& source : astrai::detail::embedded_kernel_sources()) {
    CAPTURE(source.name);
    const auto& closure = astrai::detail::kernel_source_closure(source.name);
    std::set<std::string> names;
    for (const auto& member : closure) {
      names.insert(std::string(member.first));
      CHECK(member.second.data() == astrai::detail::kernel_source(member.first).data());  // the embedded storage
    }
    CHECK(names.size() == closure.size());
    CHECK(names == source_digest_tests::reachable_files(source.name));
    for (std::size_t i = 1; i < closure.size(); ++i) CHECK(closure[i - 1].first < closure[i].first);
  }
}

TEST_CASE("the key of a request is the key of its headers' bytes") {
  const astrai::detail::CompileRequest request = source_digest_tests::sm90_decode_request();
  REQUIRE(request.headers.size() > 1);
  CHECK(source_digest_tests::key_of(request) == source_digest_tests::key_from_bytes(request));
}

TEST_CASE("editing an included header changes the key") {
  using source_digest_tests::key_of;
  const astrai::detail::CompileRequest request = source_digest_tests::sm90_decode_request();
  const astrai::detail::CacheKey base = key_of(request);
  std::set<std::string> keys = {base.hex()};
  bool saw_included_header = false;
  for (std::size_t i = 0; i < request.headers.size(); ++i) {
    const std::string name(request.headers[i].first);
    CAPTURE(name);
    saw_included_header |= name != request.main_file;
    // The same bytes held elsewhere (the runtime hashes them): the same key. The precomputed
    // digest stands for the bytes, nothing else.
    const std::string copy(request.headers[i].second);
    astrai::detail::CompileRequest moved = request;
    moved.headers[i].second = copy;
    CHECK(key_of(moved) == base);
    // An edit anywhere in the file: a byte changed in its middle, one appended.
    std::string middle = copy;
    middle[middle.size() / 2] = middle[middle.size() / 2] == ' ' ? '\t' : ' ';
    std::string appended = copy + "\n";
    for (const std::string* edited : {&middle, &appended}) {
      astrai::detail::CompileRequest changed = request;
      changed.headers[i].second = *edited;
      const astrai::detail::CacheKey key = key_of(changed);
      CHECK(key != base);
      CHECK(key == source_digest_tests::key_from_bytes(changed));
      CHECK(keys.insert(key.hex()).second);
    }
  }
  CHECK(saw_included_header);
  // A header dropped from the program, or renamed: another key.
  astrai::detail::CompileRequest dropped = request;
  dropped.headers.pop_back();
  CHECK(key_of(dropped) != base);
  astrai::detail::CompileRequest renamed = request;
  renamed.headers[0].first = "renamed.cuh";
  CHECK(key_of(renamed) != base);
}

}  // TEST_SUITE
