#include "runtime/tensor_map.hpp"

#define XXH_INLINE_ALL  // header-only, as cache/cache_key.cpp uses it
#include <xxhash.h>

#include <fmt/format.h>

#include "base/logging.hpp"
#include "runtime/driver_api.hpp"

namespace astrai::detail {

std::string tensor_map_problem(const TensorMapShape& shape) {
  const std::size_t rank = shape.dims.size();
  if (rank < 2 || rank > 5 || shape.strides.size() != rank - 1 || shape.box.size() != rank)
    return fmt::format("rank {} with {} strides and {} box sizes", rank, shape.strides.size(), shape.box.size());
  const auto base = reinterpret_cast<std::uintptr_t>(shape.base);
  if (base % 16 != 0) return fmt::format("base address {:#x} is not 16-byte aligned", base);
  if (shape.element_bytes != 1 && shape.element_bytes != 2)
    return fmt::format("elements of {} bytes (allowed: 1 or 2)", shape.element_bytes);
  // The inner box is the swizzle's row: 128 bytes, or 64 (rows of one-byte elements at hd64).
  const std::uint32_t row_bytes = shape.box[0] * static_cast<std::uint32_t>(shape.element_bytes);
  if (row_bytes != 128 && !(row_bytes == 64 && shape.element_bytes == 1))
    return fmt::format("inner box of {} elements ({} bytes) is not a 128-byte row{}", shape.box[0], row_bytes,
                       shape.element_bytes == 1 ? " or a 64-byte one" : "");
  for (std::size_t i = 0; i < rank; ++i) {
    if (shape.dims[i] == 0 || shape.dims[i] > (std::uint64_t{1} << 32))
      return fmt::format("dim {} has size {} (allowed: 1..2^32)", i, shape.dims[i]);
    if (shape.box[i] == 0 || shape.box[i] > 256)
      return fmt::format("box {} has size {} (allowed: 1..256)", i, shape.box[i]);
  }
  for (std::size_t i = 0; i + 1 < rank; ++i) {
    const std::int64_t bytes = shape.strides[i] * shape.element_bytes;
    if (bytes <= 0 || bytes % 16 != 0 || bytes >= (std::int64_t{1} << 40))
      return fmt::format("stride of dim {} is {} bytes (allowed: a positive multiple of 16 below 2^40)",
                         i + 1, bytes);
  }
  return {};
}

CUtensorMap encode_tensor_map(const TensorMapShape& shape, bool fp16, int device,
                              CUtensorMapL2promotion promotion) {
  const std::size_t rank = shape.dims.size();
  cuuint64_t dims[5];
  cuuint64_t strides[4];
  cuuint32_t box[5];
  cuuint32_t element_strides[5];
  for (std::size_t i = 0; i < rank; ++i) {
    dims[i] = shape.dims[i];
    box[i] = shape.box[i];
    element_strides[i] = 1;
    if (i + 1 < rank) strides[i] = static_cast<cuuint64_t>(shape.strides[i]) * shape.element_bytes;
  }
  const CUtensorMapDataType type = shape.element_bytes == 1 ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                                   : fp16                   ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                            : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  CUtensorMap map;
  check_cu(driver().cuTensorMapEncodeTiled(&map, type,
                                           static_cast<cuuint32_t>(rank), const_cast<void*>(shape.base), dims,
                                           strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                           box[0] * shape.element_bytes == 64 ? CU_TENSOR_MAP_SWIZZLE_64B
                                                                              : CU_TENSOR_MAP_SWIZZLE_128B,
                                           promotion,
                                           CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
           "cuTensorMapEncodeTiled", device);
  return map;
}

bool tma_can_read(const char* launch_name, const std::vector<NamedTensorMapShape>& shapes) {
  for (const NamedTensorMapShape& tensor : shapes) {
    const std::string problem = tensor_map_problem(tensor.shape);
    if (!problem.empty()) {
      log(LogLevel::debug, "{}: portable kernel, {} cannot be read through TMA: {}", launch_name, tensor.name,
          problem);
      return false;
    }
  }
  return true;
}

std::array<std::uint64_t, kTensorMapWords> tensor_map_words(const TensorMapShape& shape) {
  std::array<std::uint64_t, kTensorMapWords> words{};
  words[0] = reinterpret_cast<std::uintptr_t>(shape.base);
  words[1] = shape.dims.size();
  words[2] = shape.strides.size();
  words[3] = shape.box.size();
  for (std::size_t i = 0; i < std::min<std::size_t>(shape.dims.size(), 5); ++i) words[4 + i] = shape.dims[i];
  for (std::size_t i = 0; i < std::min<std::size_t>(shape.strides.size(), 4); ++i)
    words[9 + i] = static_cast<std::uint64_t>(shape.strides[i]);
  for (std::size_t i = 0; i < std::min<std::size_t>(shape.box.size(), 5); ++i) words[13 + i] = shape.box[i];
  words[18] = static_cast<std::uint64_t>(shape.element_bytes);
  return words;
}

std::size_t hash_words(const std::uint64_t* words, std::size_t count) {
  return static_cast<std::size_t>(XXH3_64bits(words, count * sizeof(std::uint64_t)));
}

}  // namespace astrai::detail
