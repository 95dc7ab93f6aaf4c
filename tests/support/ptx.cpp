#include "tests/support/ptx.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <iterator>
#include <regex>

namespace astrai::testing {

namespace {

// Where `access` first occurs in ptx from `from` on, skipping the forms allowed ahead of the
// wait: L2 prefetches (hints) and reads through L2 alone (ld.global.cg), which leave no L1 line
// that could outlive the wait.
std::size_t find_access(const std::string& ptx, const std::string& access, std::size_t from) {
  static constexpr std::array<const char*, 2> kAllowed = {"ld.global.cg", "cp.async.bulk.prefetch"};
  for (std::size_t at = ptx.find(access, from); at != std::string::npos; at = ptx.find(access, at + 1)) {
    const bool allowed = std::any_of(kAllowed.begin(), kAllowed.end(),
                                     [&](const char* form) { return ptx.compare(at, std::strlen(form), form) == 0; });
    if (!allowed) return at;
  }
  return std::string::npos;
}

// The part of each entry of `ptx` ahead of its griddepcontrol.wait (the whole entry when it never
// waits): calls visit(entry_start, wait) for each until one returns true.
template <typename Visit>
bool any_entry_head(const std::string& ptx, Visit visit) {
  for (std::size_t entry = ptx.find(".entry "); entry != std::string::npos;) {
    const std::size_t next = ptx.find(".entry ", entry + 1);
    const std::size_t end = next == std::string::npos ? ptx.size() : next;
    if (visit(entry, std::min(ptx.find("griddepcontrol.wait", entry), end))) return true;
    entry = next;
  }
  return false;
}

}  // namespace

std::string global_access_before_grid_wait(const std::string& ptx) {
  // Instructions that read or write global memory (bulk tensor copies read it through a map).
  static constexpr std::array<const char*, 7> kAccesses = {"ld.global",    "st.global",         "atom.global",
                                                           "red.global",   "cp.async.ca.shared", "cp.async.cg.shared",
                                                           "cp.async.bulk"};
  std::string found;
  any_entry_head(ptx, [&](std::size_t entry, std::size_t wait) {
    std::size_t first = wait;
    for (const char* access : kAccesses) {
      const std::size_t at = find_access(ptx, access, entry);
      if (at < first) {
        first = at;
        found = access;
      }
    }
    if (first == wait) return false;
    const std::size_t name_end = ptx.find_first_of("( \n", entry + 7);
    found = ptx.substr(entry + 7, name_end - entry - 7) + ": " + found;
    return true;
  });
  return found;
}

bool occurs_before_grid_wait(const std::string& ptx, const std::string& instruction) {
  return any_entry_head(ptx, [&](std::size_t entry, std::size_t wait) { return ptx.find(instruction, entry) < wait; });
}

std::string entry_text(const std::string& ptx, const std::string& name) {
  for (std::size_t entry = ptx.find(".entry "); entry != std::string::npos;) {
    const std::size_t next = ptx.find(".entry ", entry + 1);
    const std::size_t name_end = ptx.find_first_of("( \n", entry + 7);
    if (ptx.substr(entry + 7, name_end - entry - 7).find(name) != std::string::npos)
      return ptx.substr(entry, next == std::string::npos ? std::string::npos : next - entry);
    entry = next;
  }
  return "";
}

int cta_barriers(const std::string& text) {
  static const std::regex barrier(R"((^|[\s;])(bar|barrier)(\.cta)?\.sync(\.aligned)?\s+0\s*;)");
  const std::sregex_iterator first(text.begin(), text.end(), barrier);
  return static_cast<int>(std::distance(first, std::sregex_iterator()));
}

}  // namespace astrai::testing
