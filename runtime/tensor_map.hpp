// TMA tensor maps for the Hopper kernels: the driver's rules checked as a plain function (the
// launchers route anything that breaks them to the portable kernels), the encoding, and the
// per-thread memo of encoded maps the launchers share.
#pragma once

#include <cuda.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace astrai::detail {

// A tensor of 2..5 dims, innermost first, of 16-bit elements (bf16 or fp16, as the encoder is
// told) or bytes (an FP8 cache, FP8 attention: element_bytes 1), read in boxes of one swizzle row
// (128 bytes: 64 or 128 elements; or 64 bytes of bytes, FP8 attention's rows at hd64, 64-byte
// swizzled) by box[1] x box[2] ... elements. strides[i] is the element stride of dim i + 1.
struct TensorMapShape {
  const void* base = nullptr;
  std::vector<std::uint64_t> dims;
  std::vector<std::int64_t> strides;  // dims.size() - 1 entries
  std::vector<std::uint32_t> box;     // dims.size() entries, box[0] * element_bytes == 128 (or 64 bytes)
  int element_bytes = 2;
};

// Empty when the driver accepts `shape` with the swizzle its inner box sets (128 bytes, or 64);
// else the first rule it breaks ("q: stride 72 bytes is not a multiple of 16"). Checked without
// a driver.
std::string tensor_map_problem(const TensorMapShape& shape);

// The encoded map (cuTensorMapEncodeTiled; zeros outside the tensor; bytes as UINT8: the kernel
// widens them). `promotion`: how much a
// box row's L2 miss fetches. A box row is half of a 256-byte K/V row at head dim 128: promoting
// it to 256 B cost the decode 6% of its bandwidth on the H200 (docs/performance.md), so the
// decode maps take none. Throws CudaError when the driver refuses the map.
CUtensorMap encode_tensor_map(const TensorMapShape& shape, bool fp16, int device,
                              CUtensorMapL2promotion promotion);

// A tensor a launcher reads through TMA, named for the log ("k").
struct NamedTensorMapShape {
  const char* name;
  TensorMapShape shape;
};

// Whether TMA can read every one of `shapes`. Else logs the first it cannot ("prefill: portable
// kernel, k cannot be read through TMA: ...") and the caller takes the portable kernel.
bool tma_can_read(const char* launch_name, const std::vector<NamedTensorMapShape>& shapes);

// Every value of `shape` that encode_tensor_map reads, as memo key words: the base, the three
// sizes, then dims, strides and box padded with zeros to rank 5 (a larger rank, which TMA
// refuses anyway, is cut there), then the element size.
inline constexpr std::size_t kTensorMapWords = 19;
std::array<std::uint64_t, kTensorMapWords> tensor_map_words(const TensorMapShape& shape);

// The memo's hash (XXH3, as the cache key uses).
std::size_t hash_words(const std::uint64_t* words, std::size_t count);

// Maps a launch reads, or that TMA cannot read one of its tensors.
struct TensorMaps {
  bool usable = false;
  std::vector<CUtensorMap> maps;  // in the order of the shapes, when usable
};

// Encoded maps by key words that stand for every value going into them (the launcher's words,
// plus the device, dtype and promotion added here): a hit never hands out a map of other memory.
// A serving loop launches over the same caches (one pair per layer) every step, and encoding
// costs more than the rest of a call's host work. Each launcher keeps one per thread
// (thread_local), so no locks. Bounded: past kMaxEntries it starts over.
template <std::size_t kWords>
class TensorMapMemo {
 public:
  // The maps for `words`; on a miss `shapes()` gives the std::vector<NamedTensorMapShape> they
  // stand for, checked with tma_can_read, then encoded. A throw leaves nothing cached.
  template <typename Shapes>
  const TensorMaps& find_or_encode(const std::array<std::uint64_t, kWords>& words, const char* launch_name,
                                   bool fp16, int device, CUtensorMapL2promotion promotion, Shapes&& shapes) {
    Key key{static_cast<std::uint64_t>(device), fp16 ? 1u : 0u, static_cast<std::uint64_t>(promotion)};
    std::copy(words.begin(), words.end(), key.begin() + 3);
    if (auto it = entries_.find(key); it != entries_.end()) return it->second;
    if (entries_.size() >= kMaxEntries) entries_.clear();
    const std::vector<NamedTensorMapShape> named = shapes();
    TensorMaps maps;
    maps.usable = tma_can_read(launch_name, named);
    if (maps.usable)
      for (const NamedTensorMapShape& tensor : named)
        maps.maps.push_back(encode_tensor_map(tensor.shape, fp16, device, promotion));
    return entries_.emplace(key, std::move(maps)).first->second;
  }

 private:
  static constexpr std::size_t kMaxEntries = 1024;
  using Key = std::array<std::uint64_t, kWords + 3>;
  struct KeyHash {
    std::size_t operator()(const Key& key) const { return hash_words(key.data(), key.size()); }
  };
  std::unordered_map<Key, TensorMaps, KeyHash> entries_;
};

}  // namespace astrai::detail
