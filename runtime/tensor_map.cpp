#include "runtime/tensor_map.hpp"

#include <fmt/format.h>

#include "runtime/driver_api.hpp"

namespace astrai::detail {

std::string tensor_map_problem(const TensorMapShape& shape) {
  const std::size_t rank = shape.dims.size();
  if (rank < 2 || rank > 5 || shape.strides.size() != rank - 1 || shape.box.size() != rank)
    return fmt::format("rank {} with {} strides and {} box sizes", rank, shape.strides.size(), shape.box.size());
  const auto base = reinterpret_cast<std::uintptr_t>(shape.base);
  if (base % 16 != 0) return fmt::format("base address {:#x} is not 16-byte aligned", base);
  if (shape.box[0] != 64) return fmt::format("inner box {} is not 64 elements", shape.box[0]);
  for (std::size_t i = 0; i < rank; ++i) {
    if (shape.dims[i] == 0 || shape.dims[i] > (std::uint64_t{1} << 32))
      return fmt::format("dim {} has size {} (allowed: 1..2^32)", i, shape.dims[i]);
    if (shape.box[i] == 0 || shape.box[i] > 256)
      return fmt::format("box {} has size {} (allowed: 1..256)", i, shape.box[i]);
  }
  for (std::size_t i = 0; i + 1 < rank; ++i) {
    const std::int64_t bytes = shape.strides[i] * 2;
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
    if (i + 1 < rank) strides[i] = static_cast<cuuint64_t>(shape.strides[i]) * 2;
  }
  CUtensorMap map;
  check_cu(driver().cuTensorMapEncodeTiled(&map, fp16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                                           static_cast<cuuint32_t>(rank), const_cast<void*>(shape.base), dims,
                                           strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                           CU_TENSOR_MAP_SWIZZLE_128B, promotion,
                                           CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
           "cuTensorMapEncodeTiled", device);
  return map;
}

}  // namespace astrai::detail
