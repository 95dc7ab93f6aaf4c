// The only place that talks to NVRTC.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "cache/disk_cache.hpp"

namespace astrai::detail {

struct CompileRequest {
  std::string variant_name;
  std::string main_file;  // name of the embedded header that holds the kernels
  std::vector<std::pair<std::string, std::string>> headers;  // (file name, bytes)
  std::vector<std::string> name_expressions;
  std::vector<std::string> options;
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
