// Shared helpers for the libFuzzer targets: invariant checks and seed corpora.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace astrai::fuzz {

// A violated invariant: print it and abort, so libFuzzer saves the input as a crash.
[[noreturn]] inline void fail(const char* what) {
  std::fprintf(stderr, "fuzz invariant violated: %s\n", what);
  std::abort();
}

inline void require(bool condition, const char* what) {
  if (!condition) fail(what);
}

// Writes the seeds into $ASTRAI_FUZZ_SEED_DIR (if set) as seed-<n>, so a corpus directory can
// be primed by the target itself: `ASTRAI_FUZZ_SEED_DIR=corpus ./fuzz_x -runs=0 corpus`.
inline void write_seeds(const std::vector<std::string>& seeds) {
  const char* dir = std::getenv("ASTRAI_FUZZ_SEED_DIR");
  if (dir == nullptr || *dir == '\0') return;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  for (std::size_t i = 0; i < seeds.size(); ++i) {
    std::ofstream out(std::filesystem::path(dir) / ("seed-" + std::to_string(i)),
                      std::ios::binary | std::ios::trunc);
    out.write(seeds[i].data(), static_cast<std::streamsize>(seeds[i].size()));
  }
}

// Splits at any of `separators`, keeping empty pieces.
inline std::vector<std::string> split_any(const std::string& text, const std::string& separators) {
  std::vector<std::string> pieces(1);
  for (char c : text) {
    if (separators.find(c) != std::string::npos) pieces.emplace_back();
    else pieces.back().push_back(c);
  }
  return pieces;
}

}  // namespace astrai::fuzz
