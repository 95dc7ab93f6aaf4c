// Every ASTRAI_JIT_* variable, once: its name, the values it takes and what it does. The
// unknown-variable warning, `astrai-jit info --variables` and the README's table (checked
// against `astrai-jit info --variables --markdown` by the CLI test) all come from this list.
#pragma once

#include <string>
#include <vector>

namespace astrai::detail {

struct EnvVariable {
  const char* name;    // "ASTRAI_JIT_CACHE_DIR"
  const char* values;  // what it accepts, in Markdown ("`rw` (default), `ro`, `off`")
  const char* effect;  // what it does, in Markdown
};

// In the order the README lists them.
const std::vector<EnvVariable>& env_variables();

// The README's table: a header and one row a variable.
std::string env_variables_markdown();

}  // namespace astrai::detail
