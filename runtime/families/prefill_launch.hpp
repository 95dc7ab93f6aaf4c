// The launch prefill and paged_prefill share: one portable template (kernel_src/prefill.cuh)
// for contiguous and paged KV, tiled differently on the tensor-core and CUDA-core paths, and
// the Hopper template (kernel_src/prefill_sm90.cuh: TMA and wgmma) on sm_90a where it serves
// the call.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <utility>

#include "kernel_src/kernel_params.h"
#include "runtime/runtime_impl.hpp"
#include "runtime/tensor_map.hpp"

namespace astrai::detail {

// Instantiation of kernel_src/prefill.cuh; page size 0 selects contiguous KV.
std::vector<std::string> prefill_instantiations(const KernelSpec& spec, int page_size);
// Instantiation of kernel_src/prefill_sm90.cuh (its wide tiling when spec.wide), and the shapes
// it compiles for: head dims 64, 128, 192, 256; contiguous KV or pages of at least 8 tokens.
std::vector<std::string> prefill_sm90_instantiations(const KernelSpec& spec, int page_size);
bool prefill_sm90_serves(int head_dim, int page_size);
// Head dims whose Hopper prefill has a wide tiling too (HopperImplementation::has_wide); an FP8
// cache's byte rings leave no room for its Q tile.
bool prefill_sm90_has_wide(int head_dim, std::uint32_t flags);

// FP8 attention (qkv_dtype e4m3) has one kernel, the sm_90a wgmma prefill's, and takes only its
// shape (prefill_sm90_serves_qkv8, which the planner asks too): what it does not serve is refused
// here by argument, before any device is asked. `page_size` 0: contiguous KV; `causal_name`: the
// call's causal argument, which a refused mask's message points to; `strides`: q's, k's and v's,
// resolved (elements, one byte each), which TMA needs in whole 16-byte units.
void check_fp8_attention(const char* call, const AttentionOptions& options, float scale, int head_dim,
                         int page_size, const void* mask, const char* causal_name,
                         std::initializer_list<std::pair<const char*, std::int64_t>> strides);

// The TMA views of q, K and V the Hopper kernel reads (kernel_src/prefill_sm90.cuh): contiguous
// q {d, q_len, heads, batch}, K/V {d, kv_len, kv_heads, batch}; paged q {d, total_q, heads, 1},
// K {d, kv_heads, page_size, num_pages} in boxes of up to 16 tokens, V {64, page_size, d / 64,
// kv_heads, num_pages} in boxes of up to 16 whole rows. With packed GQA (prefill_sm90_pack_heads)
// q is {d, heads, q_len or total_q, batch or 1} in boxes of a pack's heads at block_m / pack
// positions. Each barrier of the kernel expects the bytes of its boxes: the unit tests hold the
// two to each other. `consumers` and `block_n` give the tiling (prefill_sm90_consumers and
// prefill_sm90_block_n; the check tool times others).
struct PrefillMaps {
  TensorMapShape q, k, v;
};
PrefillMaps prefill_map_shapes(const PrefillParams& p, int head_dim, int page_size, int consumers, int block_n,
                               bool kv8 = false, bool qkv8 = false);
// The Hopper kernel's grid: (tiles of the longest request, heads, requests); with packed GQA the
// tiles hold a pack's heads and the second dimension counts packs.
GridSize prefill_sm90_grid(const PrefillParams& p, int max_q_len, int consumers);

// `flags`: the features the call asks for. The Hopper kernel computes the soft-cap, sinks and the
// sliding window (prefill_sm90_features); any other feature, or a mask, selects the portable one.
void launch_prefill(Runtime::Impl& impl, const KernelFamily& family, const char* launch_name, DType dtype,
                    int head_dim, int page_size, std::uint32_t flags, int max_q_len, const PrefillParams& params,
                    void* stream);

}  // namespace astrai::detail
