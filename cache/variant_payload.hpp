// The payload of a cache entry: a variant's kernel symbols followed by its binary, so that a
// cached cubin loads without asking NVRTC for the lowered names again. Pure functions over bytes,
// used by the runtime (store, load) and by the cache's own checks of entries from elsewhere
// (import), which must refuse exactly what a load would refuse.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "cache/cache_entry.hpp"

namespace astrai::detail {

// Format (little endian): u32 symbol count (at most 64), per symbol u32 length (at most 4096)
// and its bytes, then the binary (never empty).
std::vector<char> encode_variant_payload(const std::vector<std::string>& symbols,
                                         const std::vector<char>& binary);
bool decode_variant_payload(const std::vector<char>& payload, std::vector<std::string>* symbols,
                            std::vector<char>* binary);
// The symbols of a payload and where its binary starts; false when malformed.
bool decode_variant_symbols(const std::vector<char>& payload, std::vector<std::string>* symbols,
                            std::size_t* binary_offset);
// The payload's symbol table decodes and its binary passes check_kernel_binary for `kind`.
// False with a short reason.
bool check_variant_payload(BinaryKind kind, const std::vector<char>& payload, std::string* why);

}  // namespace astrai::detail
