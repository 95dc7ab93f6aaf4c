# xxHash is used header-only (XXH_INLINE_ALL), so nothing needs linking at run time.
# ASTRAI_XXHASH_INCLUDE_DIR may point at a directory holding xxhash.h (e.g. a carried copy).
find_path(ASTRAI_XXHASH_INCLUDE_DIR xxhash.h
  HINTS ${ASTRAI_XXHASH_INCLUDE_DIR} ${CMAKE_CURRENT_SOURCE_DIR}/.deps/include)
if(NOT ASTRAI_XXHASH_INCLUDE_DIR)
  message(FATAL_ERROR "xxhash.h not found: install libxxhash-dev or set ASTRAI_XXHASH_INCLUDE_DIR")
endif()
