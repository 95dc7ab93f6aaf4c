// The benchmarks' own kernels as {file name, exact bytes}, generated into the build tree from
// this directory's .cuh files (astrai_embed_files, cmake/EmbedKernelSources.cmake).
#pragma once

#include <string_view>
#include <utility>
#include <vector>

namespace astrai::bench {

const std::vector<std::pair<std::string_view, std::string_view>>& bench_kernel_files();

}  // namespace astrai::bench
