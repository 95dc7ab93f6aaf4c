#include "tests/support/specs.hpp"

#include "astrai/error.hpp"

namespace astrai::testing {

detail::KernelSpec make_spec(detail::KernelKind kind, DType dtype, int head_dim, int page_size, int group,
                             const std::string& arch, bool no_mma) {
  detail::KernelSpec spec;
  spec.kind = kind;
  spec.dtype = dtype;
  spec.head_dim = head_dim;
  spec.page_size = page_size;
  spec.group_size = group;
  spec.arch = arch;
  spec.force_no_mma = no_mma;
  return spec;
}

std::string rejection(const detail::KernelSpec& spec) {
  try {
    spec.validate();
  } catch (const InvalidArgument& error) {
    return error.what();
  }
  return "";
}

}  // namespace astrai::testing
