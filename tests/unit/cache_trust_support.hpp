// Helpers shared by the cache trust tests (test_cache_trust_*.cpp): another user's uid, file
// modes and owners, and the small variant they compile. CI runs as root, so files can be chowned
// to another uid; without root the cases that need it skip.
#pragma once

#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include "astrai/runtime.hpp"
#include "runtime/kernel_spec.hpp"

namespace astrai::testing {

constexpr uid_t kStranger = 1234;  // a uid that is not ours (nor root)

inline bool is_root() { return ::geteuid() == 0; }

// A bf16 rotary_emb variant for sm_80: quick to compile, so the trust tests compile for real.
inline detail::KernelSpec rotary_spec(int head_dim = 64) {
  detail::KernelSpec spec;
  spec.kind = detail::KernelKind::rotary_emb;
  spec.dtype = DType::bf16;
  spec.head_dim = head_dim;
  spec.arch = "sm_80";
  return spec;
}

inline mode_t mode_of(const std::filesystem::path& path) {
  struct stat info {};
  REQUIRE(::lstat(path.c_str(), &info) == 0);
  return info.st_mode & 07777;
}

inline void chown_to(const std::filesystem::path& path, uid_t uid,
                     gid_t gid = static_cast<gid_t>(-1)) {
  REQUIRE(::lchown(path.c_str(), uid, gid) == 0);
}

}  // namespace astrai::testing
