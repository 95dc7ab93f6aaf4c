// Logging moved to the base layer (base/logging.hpp), below the cache. This header keeps the
// old include working for the sources that still use it (runtime/families/prefill_launch.cpp).
#pragma once

#include "base/logging.hpp"
