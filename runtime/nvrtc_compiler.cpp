#include "runtime/nvrtc_compiler.hpp"

#include <nvrtc.h>

#include <memory>

#include <fmt/format.h>

#include "astrai/error.hpp"

namespace astrai::detail {

namespace {

// Owns one nvrtcProgram.
class Program {
 public:
  explicit Program(nvrtcProgram program) : program_(program) {}
  ~Program() { nvrtcDestroyProgram(&program_); }
  Program(const Program&) = delete;
  Program& operator=(const Program&) = delete;
  nvrtcProgram get() const { return program_; }

 private:
  nvrtcProgram program_;
};

std::string join_options(const std::vector<std::string>& options) {
  std::string joined;
  for (const auto& option : options) {
    if (!joined.empty()) joined += ' ';
    joined += option;
  }
  return joined;
}

void check(nvrtcResult result, const char* call, const CompileRequest& request) {
  if (result != NVRTC_SUCCESS)
    throw CompileError(fmt::format("{}: {} failed: {}", request.variant_name, call,
                                   nvrtcGetErrorString(result)),
                       request.variant_name, join_options(request.options), "");
}

}  // namespace

CompileResult nvrtc_compile(const CompileRequest& request, bool want_ptx_text) {
  CompileResult result;
  result.source = fmt::format("// {}\n#include \"{}\"\n", request.variant_name, request.main_file);

  // NVRTC takes C strings: copy the viewed headers once (a compile costs far more).
  std::vector<std::string> names(request.headers.size());
  std::vector<std::string> texts(request.headers.size());
  std::vector<const char*> header_texts;
  std::vector<const char*> header_names;
  for (std::size_t i = 0; i < request.headers.size(); ++i) {
    names[i] = std::string(request.headers[i].first);
    texts[i] = std::string(request.headers[i].second);
    header_names.push_back(names[i].c_str());
    header_texts.push_back(texts[i].c_str());
  }
  nvrtcProgram raw = nullptr;
  check(nvrtcCreateProgram(&raw, result.source.c_str(), (request.variant_name + ".cu").c_str(),
                           static_cast<int>(header_texts.size()), header_texts.data(),
                           header_names.data()),
        "nvrtcCreateProgram", request);
  Program program(raw);
  for (const auto& expression : request.name_expressions)
    check(nvrtcAddNameExpression(program.get(), expression.c_str()), "nvrtcAddNameExpression", request);

  std::vector<const char*> option_pointers;
  for (const auto& option : request.options) option_pointers.push_back(option.c_str());
  const nvrtcResult compiled = nvrtcCompileProgram(
      program.get(), static_cast<int>(option_pointers.size()), option_pointers.data());

  std::size_t log_size = 0;
  if (nvrtcGetProgramLogSize(program.get(), &log_size) == NVRTC_SUCCESS && log_size > 1) {
    result.log.resize(log_size);
    nvrtcGetProgramLog(program.get(), result.log.data());
    result.log.resize(log_size - 1);
  }
  if (compiled != NVRTC_SUCCESS) {
    throw CompileError(fmt::format("{}: NVRTC compile failed ({})\noptions: {}\n{}",
                                   request.variant_name, nvrtcGetErrorString(compiled),
                                   join_options(request.options), result.log),
                       request.variant_name, join_options(request.options), result.log);
  }

  for (const auto& expression : request.name_expressions) {
    const char* lowered = nullptr;
    check(nvrtcGetLoweredName(program.get(), expression.c_str(), &lowered), "nvrtcGetLoweredName",
          request);
    result.lowered_names.emplace_back(lowered);
  }

  if (request.emit_ptx_only || want_ptx_text) {
    std::size_t ptx_size = 0;
    check(nvrtcGetPTXSize(program.get(), &ptx_size), "nvrtcGetPTXSize", request);
    result.ptx.resize(ptx_size);
    check(nvrtcGetPTX(program.get(), result.ptx.data()), "nvrtcGetPTX", request);
  }
  if (request.emit_ptx_only) {
    result.kind = BinaryKind::ptx;
    result.binary.assign(result.ptx.begin(), result.ptx.end());  // keeps the trailing NUL
  } else {
    std::size_t cubin_size = 0;
    check(nvrtcGetCUBINSize(program.get(), &cubin_size), "nvrtcGetCUBINSize", request);
    result.binary.resize(cubin_size);
    check(nvrtcGetCUBIN(program.get(), result.binary.data()), "nvrtcGetCUBIN", request);
    result.kind = BinaryKind::cubin;
  }
  return result;
}

NvrtcVersion nvrtc_version() {
  NvrtcVersion version;
  nvrtcVersion(&version.major, &version.minor);
  return version;
}

std::vector<int> nvrtc_supported_archs() {
  int count = 0;
  if (nvrtcGetNumSupportedArchs(&count) != NVRTC_SUCCESS || count <= 0) return {};
  std::vector<int> archs(static_cast<std::size_t>(count));
  if (nvrtcGetSupportedArchs(archs.data()) != NVRTC_SUCCESS) return {};
  return archs;
}

}  // namespace astrai::detail
