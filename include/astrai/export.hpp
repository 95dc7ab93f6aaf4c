// The library is built with hidden symbols; ASTRAI_API marks what the public API exports
// (functions, classes, and so the exceptions' type info, which must match across a shared
// library boundary for `catch` to work).
#pragma once

#if defined(__GNUC__) || defined(__clang__)
#define ASTRAI_API __attribute__((visibility("default")))
#else
#define ASTRAI_API
#endif
