// One compile plan: a spec becomes a compile request once (sources, instantiations, options,
// target), and the cache key is the hash of that request plus the NVRTC version. The JIT
// engine, the CLI, the tests and the torture harness all go through these two functions.
#pragma once

#include "cache/cache_key.hpp"
#include "runtime/kernel_spec.hpp"
#include "runtime/nvrtc_compiler.hpp"

namespace astrai::detail {

// The request that compiles `spec` (spec.arch must be set): its family's main file and the
// closure of headers it includes, the instantiations, the options and the target.
CompileRequest compile_request(const KernelSpec& spec);

// The cache key of a request: XXH3-128 over the canonical serialization of the request's
// fields and the NVRTC version (cache/cache_key.hpp pins the format).
CacheKey compile_request_key(const CompileRequest& request, const NvrtcVersion& version);

}  // namespace astrai::detail
