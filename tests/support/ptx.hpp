// Checks on NVRTC's output (PTX text, binaries) shared by the compile tests.
#pragma once

#include <string>
#include <vector>

namespace astrai::testing {

inline bool contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

// An ELF image (a cubin): more than the 64-byte ELF64 header, and its magic number.
inline bool is_elf(const std::vector<char>& binary) {
  return binary.size() > 64 && binary[0] == '\x7f' && binary[1] == 'E' && binary[2] == 'L' && binary[3] == 'F';
}

// A kernel launched as a programmatic dependent may start while the kernel before it still
// writes, so before griddepcontrol.wait it may only prefetch into L2 and read through L2 alone
// (ld.global.cg: no L1 line outlives the wait), values that may be stale and so may only steer
// prefetches. Returns "" when every entry of `ptx` waits before its first other global access
// (load, store, atomic, cp.async or bulk copy), else "<entry>: <first access>" for the first
// entry that does not (or never waits).
std::string global_access_before_grid_wait(const std::string& ptx);

// Whether `instruction` occurs ahead of griddepcontrol.wait (or in an entry that never waits) in
// some entry of `ptx`: for the prefetches a dependent issues while the kernel ahead finishes.
bool occurs_before_grid_wait(const std::string& ptx, const std::string& instruction);

// The text of the first entry of `ptx` whose name contains `name`, up to the next entry ("" when
// there is none).
std::string entry_text(const std::string& ptx, const std::string& name);

// How many CTA-wide barriers (bar.sync or barrier.sync on barrier 0 with no thread count, i.e.
// __syncthreads) `text` holds.
int cta_barriers(const std::string& text);

}  // namespace astrai::testing
