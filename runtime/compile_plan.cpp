#include "runtime/compile_plan.hpp"

#include "cache/cache_entry.hpp"

namespace astrai::detail {

CompileRequest compile_request(const KernelSpec& spec) {
  CompileRequest request;
  request.variant_name = spec.name();
  request.main_file = spec.main_file();
  const auto& closure = kernel_source_closure(request.main_file);
  request.headers.assign(closure.begin(), closure.end());
  request.name_expressions = spec.instantiations();
  request.options = spec.compile_options();
  request.arch = spec.arch;
  request.emit_ptx_only = binary_kind_for_target(spec.arch) == BinaryKind::ptx;
  return request;
}

CacheKey compile_request_key(const CompileRequest& request, const NvrtcVersion& version) {
  CacheKeyInputs inputs;
  inputs.variant_name = request.variant_name;
  for (const auto& expression : request.name_expressions) inputs.instantiation += expression + ";";
  // The key holds each header's digest: the library's own headers carry theirs (computed when
  // it was built), any other header (a bench's, a test's) is hashed here.
  std::vector<std::pair<std::string_view, SourceDigest>> digested;
  digested.reserve(request.headers.size());
  for (const SourceView& header : request.headers)
    digested.emplace_back(header.first, kernel_source_digest(header.second));
  inputs.digested_sources = &digested;
  inputs.options = request.options;
  inputs.arch = request.arch;
  inputs.nvrtc_major = version.major;
  inputs.nvrtc_minor = version.minor;
  return compute_cache_key(inputs);
}

}  // namespace astrai::detail
