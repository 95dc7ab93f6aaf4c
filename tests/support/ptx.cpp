#include "tests/support/ptx.hpp"

#include <algorithm>
#include <array>

namespace astrai::testing {

std::string global_access_before_grid_wait(const std::string& ptx) {
  // Instructions that read or write global memory (bulk tensor copies read it through a map).
  static constexpr std::array<const char*, 7> kAccesses = {"ld.global",    "st.global",         "atom.global",
                                                           "red.global",   "cp.async.ca.shared", "cp.async.cg.shared",
                                                           "cp.async.bulk"};
  std::size_t entry = ptx.find(".entry ");
  while (entry != std::string::npos) {
    const std::size_t next = ptx.find(".entry ", entry + 1);
    const std::size_t end = next == std::string::npos ? ptx.size() : next;
    const std::size_t wait = std::min(ptx.find("griddepcontrol.wait", entry), end);
    std::size_t first = end;
    std::string what;
    for (const char* access : kAccesses) {
      const std::size_t at = ptx.find(access, entry);
      if (at < first) {
        first = at;
        what = access;
      }
    }
    if (first < wait) {
      const std::size_t name_end = ptx.find_first_of("( \n", entry + 7);
      return ptx.substr(entry + 7, name_end - entry - 7) + ": " + what;
    }
    entry = next;
  }
  return "";
}

}  // namespace astrai::testing
