// The kernel templates embedded in the library (generated from kernel_src/ at build time).
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace astrai::detail {

struct EmbeddedSource {
  const char* name;       // file name, e.g. "paged_decode.cuh"
  std::string_view text;  // exact bytes
};

const std::vector<EmbeddedSource>& embedded_kernel_sources();

// The text of one embedded file; throws astrai::Error if there is none by that name.
std::string_view kernel_source(std::string_view name);

// `main_file` and every file it includes (recursively, through #include "..."), sorted by
// name, with their bytes: exactly what a program compiled from `main_file` can see.
// The views point into the embedded sources (static storage).
using SourceView = std::pair<std::string_view, std::string_view>;  // (file name, bytes)
const std::vector<SourceView>& kernel_source_closure(std::string_view main_file);

}  // namespace astrai::detail
