// TMA tensor maps for the Hopper kernels: the driver's rules checked as a plain function (the
// launchers route anything that breaks them to the portable kernels), and the encoding.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <string>
#include <vector>

namespace astrai::detail {

// A 16-bit tensor of 2..5 dims, innermost first, read in boxes of 64 elements (one 128-byte
// swizzle row) by box[1] x box[2] ... elements. strides[i] is the element stride of dim i + 1.
struct TensorMapShape {
  const void* base = nullptr;
  std::vector<std::uint64_t> dims;
  std::vector<std::int64_t> strides;  // dims.size() - 1 entries
  std::vector<std::uint32_t> box;     // dims.size() entries, box[0] == 64
};

// Empty when the driver accepts `shape` with the 128-byte swizzle; else the first rule it
// breaks ("q: stride 72 bytes is not a multiple of 16"). Checked without a driver.
std::string tensor_map_problem(const TensorMapShape& shape);

// The encoded map (cuTensorMapEncodeTiled; zeros outside the tensor). `promotion`: how much a
// box row's L2 miss fetches. A box row is half of a 256-byte K/V row at head dim 128: promoting
// it to 256 B cost the decode 6% of its bandwidth on the H200 (docs/performance.md), so the
// decode maps take none. Throws CudaError when the driver refuses the map.
CUtensorMap encode_tensor_map(const TensorMapShape& shape, bool fp16, int device,
                              CUtensorMapL2promotion promotion);

}  // namespace astrai::detail
