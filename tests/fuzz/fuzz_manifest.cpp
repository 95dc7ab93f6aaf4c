// libFuzzer target: manifest lines (KernelSpec::parse), read the way `astrai-jit warm
// --manifest` reads them (a '#' starts a comment, surrounding whitespace is ignored). A line
// either parses or throws astrai::InvalidArgument; any other exception escapes and is a bug.
// What parses is canonical (name() gives the line back), valid, and parses again to itself.
#include <cstddef>
#include <cstdint>
#include <string>

#include "astrai/error.hpp"
#include "runtime/kernel_spec.hpp"
#include "tests/support/fuzz.hpp"

using astrai::detail::KernelSpec;
using astrai::fuzz::require;

namespace {

std::string trim(const std::string& text) {
  const char* space = " \t\r\n\f\v";
  const std::size_t first = text.find_first_not_of(space);
  if (first == std::string::npos) return {};
  return text.substr(first, text.find_last_not_of(space) - first + 1);
}

void check_line(const std::string& text) {
  KernelSpec spec;
  try {
    spec = KernelSpec::parse(text);
  } catch (const astrai::InvalidArgument& error) {
    // The message quotes the text first, so a NUL in the text cuts what() short there; only
    // require that there is a message.
    require(error.what()[0] != '\0', "a parse error has an empty message");
    return;
  }
  require(spec.name() == text, "a parsed name is not canonical");
  spec.validate();  // parse validated already: must not throw
  require(KernelSpec::parse(spec.name()) == spec, "a parsed name does not parse to itself");
  require(!spec.main_file().empty(), "a parsed spec has no main file");
  require(!spec.instantiations().empty(), "a parsed spec has no instantiation");
  require(!spec.compile_options().empty(), "a parsed spec has no compile options");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  astrai::fuzz::write_seeds({
      "paged_decode.bf16.hd128.ps16.g4.sm_90a\n",
      "rotary_emb.fp16.hd64.sm_89  # comment\n\n  decode.bf16.hd64.g6.nomma.sm_80\n",
      "prefill.bf16.hd128.g4.sm_90a\npaged_prefill.fp16.hd64.ps1.g8.compute_120\n",
      "paged_decode.bf16.hd128.ps16.g4.f1.sm_90a\nrotary_emb.bf16.hd0128.sm_89\n",
      "paged_decode.bf16.hd72.ps3.g0.sm_70.\n",
  });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  for (std::string line : astrai::fuzz::split_any(input, "\n")) {
    check_line(line);  // the raw line, as a program might pass it
    const std::size_t hash = line.find('#');
    if (hash != std::string::npos) line.erase(hash);
    const std::string text = trim(line);
    if (!text.empty()) check_line(text);
  }
  return 0;
}
