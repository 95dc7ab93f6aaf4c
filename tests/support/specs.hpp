// Spec builders for tests and harnesses: one place that spells out a variant's fields.
#pragma once

#include <string>

#include "runtime/kernel_spec.hpp"

namespace astrai::testing {

// A spec of any family; pass 0 for the fields its family does not take.
detail::KernelSpec make_spec(detail::KernelKind kind, DType dtype, int head_dim, int page_size, int group,
                             const std::string& arch, bool no_mma = false);

inline detail::KernelSpec paged_decode_spec(DType dtype, int head_dim, int page_size, int group,
                                            const std::string& arch, bool no_mma = false) {
  return make_spec(detail::KernelKind::paged_decode, dtype, head_dim, page_size, group, arch, no_mma);
}

inline detail::KernelSpec rotary_spec(DType dtype, int head_dim, const std::string& arch, bool no_mma = false) {
  return make_spec(detail::KernelKind::rotary_emb, dtype, head_dim, 0, 0, arch, no_mma);
}

// The message of the InvalidArgument that spec.validate() throws, or "" when it accepts the spec.
std::string rejection(const detail::KernelSpec& spec);

}  // namespace astrai::testing
