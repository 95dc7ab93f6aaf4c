// The kernel templates embedded in the library (generated from kernel_src/ at build time by
// tools/embed/embed_kernel_sources.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cache/cache_key.hpp"

namespace astrai::detail {

struct EmbeddedSource {
  const char* name;       // file name, e.g. "paged_decode.cuh"
  std::string_view text;  // exact bytes
  // Computed at build time from the same bytes: source_digest(text), and the table indices of
  // this file and every file it includes (recursively, through #include "..."), in name order.
  SourceDigest digest;
  const std::uint32_t* closure;
  std::size_t closure_size;
};

const std::vector<EmbeddedSource>& embedded_kernel_sources();

// The text of one embedded file; throws astrai::Error if there is none by that name.
std::string_view kernel_source(std::string_view name);

// `main_file` and every file it includes (recursively, through #include "..."), sorted by
// name, with their bytes: exactly what a program compiled from `main_file` can see.
// The views point into the embedded sources (static storage).
using SourceView = std::pair<std::string_view, std::string_view>;  // (file name, bytes)
const std::vector<SourceView>& kernel_source_closure(std::string_view main_file);

// source_digest(bytes): the digest computed at build time when `bytes` is exactly an embedded
// source's text (the same storage, the same length), computed here for any other bytes (a
// bench-side header, a test's edited copy).
SourceDigest kernel_source_digest(std::string_view bytes);

}  // namespace astrai::detail
