// A kernel source that includes a file the generator is not given (tests/CMakeLists.txt).
#pragma once
#include "absent.cuh"
