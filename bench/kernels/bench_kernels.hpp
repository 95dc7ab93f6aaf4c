// Kernels only the benchmarks compile (kernels/*.cuh here: the wgmma GEMM ceiling, the prefill's
// trace stamps), embedded as text in the tools that use them: the library does not carry them.
// They include the library's kernel headers, which come from the library's own embedding.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "runtime/kernel_sources.hpp"
#include "runtime/nvrtc_compiler.hpp"

namespace astrai::bench {

// The text of a bench-side kernel file; throws std::runtime_error naming the file otherwise.
std::string_view bench_kernel_source(std::string_view name);

// A request compiling bench-side `main_file` for `arch`: every header it can see (its bench-side
// includes and, for each library header it includes, that header's closure), the runtime's
// language options, and the kernels to instantiate.
astrai::detail::CompileRequest bench_compile_request(const std::string& main_file, const std::string& arch,
                                                     const std::vector<std::string>& names);

// Adds the prefill trace hooks to a request for prefill_sm90.cuh: the bench's header, pre-included,
// and the number of CTAs it stamps.
void add_prefill_trace(astrai::detail::CompileRequest* request, int traced_ctas);

}  // namespace astrai::bench
