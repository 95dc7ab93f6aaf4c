#include "bench_kernels.hpp"
#include "bench_kernel_files.hpp"

#include <map>
#include <mutex>
#include <regex>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>

namespace astrai::bench {

namespace {

const std::pair<std::string_view, std::string_view>* find_file(std::string_view name) {
  for (const auto& file : bench_kernel_files())
    if (file.first == name) return &file;
  return nullptr;
}

// Every file `main_file` can include: bench-side ones by name, library ones with their closure.
// Computed once a file (the views point into static storage, as NVRTC requests expect).
const std::vector<astrai::detail::SourceView>& bench_closure(const std::string& main_file) {
  static std::mutex mutex;
  static std::map<std::string, std::vector<astrai::detail::SourceView>> memo;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = memo.find(main_file);
  if (it != memo.end()) return it->second;
  std::map<std::string_view, std::string_view> seen;
  std::vector<std::string> pending = {main_file};
  const std::regex include_line(R"re(^\s*#\s*include\s*"([^"]+)")re", std::regex::multiline);
  while (!pending.empty()) {
    const std::string name = pending.back();
    pending.pop_back();
    if (seen.count(name)) continue;
    if (const auto* file = find_file(name)) {
      seen.emplace(file->first, file->second);
      const std::string text(file->second);
      for (std::sregex_iterator m(text.begin(), text.end(), include_line), end; m != end; ++m)
        pending.push_back((*m)[1].str());
    } else {
      for (const auto& view : astrai::detail::kernel_source_closure(name)) seen.emplace(view.first, view.second);
    }
  }
  return memo.emplace(main_file, std::vector<astrai::detail::SourceView>(seen.begin(), seen.end())).first->second;
}

}  // namespace

std::string_view bench_kernel_source(std::string_view name) {
  if (const auto* file = find_file(name)) return file->second;
  throw std::runtime_error(fmt::format("astrai bench: no bench kernel source named '{}'", name));
}

astrai::detail::CompileRequest bench_compile_request(const std::string& main_file, const std::string& arch,
                                                     const std::vector<std::string>& names) {
  bench_kernel_source(main_file);  // a bench-side file, or an error naming it
  astrai::detail::CompileRequest request;
  request.variant_name = main_file;
  request.main_file = main_file;
  const auto& closure = bench_closure(main_file);
  request.headers.assign(closure.begin(), closure.end());
  request.name_expressions = names;
  request.options = {"--std=c++17", "--gpu-architecture=" + arch, "--device-as-default-execution-space"};
  request.arch = arch;
  return request;
}

void add_prefill_trace(astrai::detail::CompileRequest* request, int traced_ctas) {
  constexpr std::string_view kHeader = "prefill_sm90_trace.cuh";
  request->headers.emplace_back(kHeader, bench_kernel_source(kHeader));
  request->options.push_back(fmt::format("-DASTRAI_PREFILL_TRACE={}", traced_ctas));
  request->options.push_back(fmt::format("--pre-include={}", kHeader));
}

}  // namespace astrai::bench
