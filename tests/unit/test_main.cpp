// Unit-test entry point. The binary doubles as a child process for the cross-process tests:
// `astrai_unit_tests --child <verb> ...` runs one helper action instead of the suite.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstring>

#include "tests/support/support.hpp"

int main(int argc, char** argv) {
  if (argc >= 3 && std::strcmp(argv[1], "--child") == 0) return astrai::testing::run_child(argc, argv);
  astrai::testing::set_self_path(argv[0]);
  doctest::Context context(argc, argv);
  return context.run();
}
