// The only place that talks to NVRTC.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "cache/disk_cache.hpp"
#include "runtime/kernel_sources.hpp"

namespace astrai::detail {

// Everything one NVRTC compile depends on (runtime/compile_plan.hpp builds it from a spec and
// hashes it into the cache key).
struct CompileRequest {
  std::string variant_name;
  std::string main_file;  // name of the header that holds the kernels
  // (file name, bytes) of every header the program can include; the bytes are viewed, not
  // owned (the embedded kernel sources, or a caller's static text).
  std::vector<SourceView> headers;
  std::vector<std::string> name_expressions;
  std::vector<std::string> options;  // normalized; order kept
  std::string arch;                  // target with suffix: "sm_90a", "compute_120"
  bool emit_ptx_only = false;  // target newer than NVRTC knows: PTX for the driver to finish
};

struct CompileResult {
  BinaryKind kind = BinaryKind::cubin;
  std::vector<char> binary;
  std::vector<std::string> lowered_names;  // same order as name_expressions
  std::string ptx;                         // filled when requested for dumps
  std::string log;
  std::string source;                      // the program text that was compiled
};

// Throws CompileError (carrying variant, options and log) when NVRTC rejects the program.
CompileResult nvrtc_compile(const CompileRequest& request, bool want_ptx_text);

struct NvrtcVersion {
  int major = 0;
  int minor = 0;
  std::string text() const { return std::to_string(major) + "." + std::to_string(minor); }
};
NvrtcVersion nvrtc_version();
// Real architectures NVRTC can emit cubins for (e.g. 75, 80, ..., 120), ascending.
std::vector<int> nvrtc_supported_archs();

}  // namespace astrai::detail
