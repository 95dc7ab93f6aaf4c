#include "runtime/families/prefill_launch.hpp"

#include <algorithm>
#include <array>
#include <vector>

#include <fmt/format.h>

#include "kernel_src/hopper_params.h"
#include "runtime/launch_heuristics.hpp"
#include "runtime/tensor_map.hpp"

namespace astrai::detail {

std::vector<std::string> prefill_instantiations(const KernelSpec& spec, int page_size) {
  return {fmt::format("astrai::prefill_kernel<{}, {}, {}, {}, {}>", device_type_name(spec.dtype),
                      spec.head_dim, page_size, spec.group_size, spec.flags)};
}

std::vector<std::string> prefill_sm90_instantiations(const KernelSpec& spec, int page_size) {
  const int consumers = prefill_sm90_consumers(spec.head_dim, spec.wide);
  return {fmt::format("astrai::prefill_sm90_kernel<{}, {}, {}, {}, {}, {}, {}{}>", device_type_name(spec.dtype),
                      spec.head_dim, page_size, spec.group_size, consumers,
                      prefill_sm90_block_n(spec.head_dim, consumers), spec.flags,
                      prefill_sm90_persistent(page_size, consumers, spec.flags) ? ", true" : "")};
}

bool prefill_sm90_serves(int head_dim, int page_size) {
  return prefill_sm90_head_dim(head_dim) && (page_size == 0 || page_size >= 8);
}

bool prefill_sm90_has_wide(int head_dim) { return prefill_sm90_wide_consumers(head_dim) != 0; }

PrefillMaps prefill_map_shapes(const PrefillParams& p, int head_dim, int page_size, int consumers, int block_n) {
  using U = std::uint64_t;
  const U d = static_cast<U>(head_dim);
  PrefillMaps maps;
  const std::uint32_t pack = static_cast<std::uint32_t>(prefill_sm90_pack_heads(p.n_heads / p.n_kv_heads));
  const bool packed = pack > 1;
  const std::uint32_t block_m = static_cast<std::uint32_t>(prefill_sm90_block_m(consumers));
  const std::uint32_t kv_box = static_cast<std::uint32_t>(block_n);
  if (page_size == 0) {
    const U kv_rows = static_cast<U>(std::max(p.kv_len, 1));  // kv_len 0 loads nothing
    maps.q = packed ? TensorMapShape{p.q, {d, U(p.n_heads), U(p.q_len), U(p.batch)},
                                     {p.q_stride_head, p.q_stride_seq, p.q_stride_batch}, {}}
                    : TensorMapShape{p.q, {d, U(p.q_len), U(p.n_heads), U(p.batch)},
                                     {p.q_stride_seq, p.q_stride_head, p.q_stride_batch}, {}};
    maps.k = {p.k, {d, kv_rows, U(p.n_kv_heads), U(p.batch)}, {p.k_stride_seq, p.k_stride_head, p.k_stride_batch},
              {64, kv_box, 1, 1}};
    maps.v = {p.v, {d, kv_rows, U(p.n_kv_heads), U(p.batch)}, {p.v_stride_seq, p.v_stride_head, p.v_stride_batch},
              {64, kv_box, 1, 1}};
  } else {
    const std::uint32_t box = static_cast<std::uint32_t>(std::min(page_size, 16));
    const U pages = static_cast<U>(std::max(p.num_pages, 1));
    const U total_q = static_cast<U>(std::max(p.total_q, 1));
    const std::int64_t q_span = p.q_stride_seq * static_cast<std::int64_t>(total_q);  // the one "batch"
    maps.q = packed ? TensorMapShape{p.q, {d, U(p.n_heads), total_q, 1}, {p.q_stride_head, p.q_stride_seq, q_span}, {}}
                    : TensorMapShape{p.q, {d, total_q, U(p.n_heads), 1}, {p.q_stride_seq, p.q_stride_head, q_span}, {}};
    maps.k = {p.k, {d, U(p.n_kv_heads), U(page_size), pages}, {p.k_stride_head, p.k_stride_seq, p.k_stride_page},
              {64, 1, box, 1}};
    // V in boxes of whole rows: the third dim steps 64 columns.
    const std::uint32_t chunks = static_cast<std::uint32_t>(head_dim / 64);
    maps.v = {p.v,
              {64, U(page_size), chunks, U(p.n_kv_heads), pages},
              {p.v_stride_seq, 64, p.v_stride_head, p.v_stride_page},
              {64, box, chunks, 1, 1}};
  }
  // Packed: a pack's heads at block_m / pack positions; else block_m positions of one head.
  maps.q.box = packed ? std::vector<std::uint32_t>{64, pack, block_m / pack, 1}
                      : std::vector<std::uint32_t>{64, block_m, 1, 1};
  return maps;
}

GridSize prefill_sm90_grid(const PrefillParams& p, int max_q_len, int consumers) {
  const int pack = prefill_sm90_pack_heads(p.n_heads / p.n_kv_heads);
  const long long rows = static_cast<long long>(max_q_len) * pack;
  const int block_m = prefill_sm90_block_m(consumers);
  return {static_cast<unsigned>((rows + block_m - 1) / block_m), static_cast<unsigned>(p.n_heads / pack),
          static_cast<unsigned>(p.batch)};
}

namespace {

// Launches the Hopper kernel when it serves the call; false leaves it to the portable one.
bool launch_prefill_sm90(Runtime::Impl& impl, Device& device, KernelSpec spec, const char* launch_name,
                         int max_q_len, const PrefillParams& params, void* stream) {
  if (!device.uses_wgmma() || params.mask != nullptr || !hopper_serves(spec)) return false;
  // Packed GQA tiles hold a pack of heads: a tile row per head and position, whose count must
  // stay within the kernel's int, else the portable kernel takes the call.
  if (1LL * max_q_len * prefill_sm90_pack_heads(spec.group_size) > (1LL << 30)) return false;
  const long long total_q = spec.page_size == 0 ? 1LL * params.q_len * params.batch : params.total_q;
  spec.wide = prefill_sm90_takes_wide_tiles(impl.engine.config().prefill_tiles, spec.head_dim, max_q_len, total_q,
                                            params.n_heads, params.n_kv_heads, params.batch, device.num_sms());
  const int consumers = prefill_sm90_consumers(spec.head_dim, spec.wide);
  const int block_n = prefill_sm90_block_n(spec.head_dim, consumers);
  const PrefillMaps shapes = prefill_map_shapes(params, spec.head_dim, spec.page_size, consumers, block_n);
  if (!tma_can_read(launch_name, {{"q", shapes.q}})) return false;
  const bool fp16 = spec.dtype == DType::fp16;
  constexpr CUtensorMapL2promotion kPromotion = CU_TENSOR_MAP_L2_PROMOTION_L2_256B;
  // Only K and V are memoized: a paged call reads the same cache every step, while q's pointer
  // and row count change with every batch of prompts. Keyed on the shapes themselves, so every
  // value that goes into the maps is in the key.
  std::array<std::uint64_t, 2 * kTensorMapWords> words;
  const auto k_words = tensor_map_words(shapes.k);
  const auto v_words = tensor_map_words(shapes.v);
  std::copy(v_words.begin(), v_words.end(), std::copy(k_words.begin(), k_words.end(), words.begin()));
  thread_local TensorMapMemo<2 * kTensorMapWords> memo;
  const TensorMaps& kv = memo.find_or_encode(words, launch_name, fp16, device.ordinal(), kPromotion, [&] {
    return std::vector<NamedTensorMapShape>{{"k", shapes.k}, {"v", shapes.v}};
  });
  if (!kv.usable) return false;
  CUtensorMap map_q = encode_tensor_map(shapes.q, fp16, device.ordinal(), kPromotion);
  CUtensorMap map_k = kv.maps[0];
  CUtensorMap map_v = kv.maps[1];
  spec.hopper = true;
  const int threads = prefill_sm90_threads(consumers);
  const bool persistent = prefill_sm90_persistent(spec.page_size, consumers, spec.flags);
  const int smem = prefill_sm90_smem_bytes(spec.head_dim, consumers, block_n, persistent);
  const GridSize tiles = prefill_sm90_grid(params, max_q_len, consumers);
  // Persistent: a CTA an SM (or a tile), each walking tiles of that grid. Their tile ids are 31-bit
  // (fast_divide's range): a grid past that (a Q of terabytes) goes to the portable kernel.
  const long long tile_count = 1LL * tiles.x * tiles.y * tiles.z;
  if (persistent && tile_count >= (1LL << 31)) return false;
  const LoadedVariant& variant = impl.variant(device, spec, {threads, smem});
  PrefillParams launch_params = params;
  launch_params.tile_order = prefill_tile_order(tiles.x, tiles.y, tiles.z);
  void* arguments[] = {&launch_params, &map_q, &map_k, &map_v};
  LaunchConfig config{};
  config.name = launch_name;
  config.grid = persistent ? GridSize{static_cast<unsigned>(std::min<long long>(tile_count, device.num_sms())), 1, 1}
                           : tiles;
  config.block = static_cast<unsigned>(threads);
  config.smem = static_cast<unsigned>(smem);
  config.stream = static_cast<CUstream>(stream);
  device.launch(variant.functions[0], config, arguments);
  return true;
}

}  // namespace

void launch_prefill(Runtime::Impl& impl, const KernelFamily& family, const char* launch_name, DType dtype,
                    int head_dim, int page_size, std::uint32_t flags, int max_q_len, const PrefillParams& params,
                    void* stream) {
  Device& device = impl.current_device();
  KernelSpec spec;
  spec.kind = family.kind;
  spec.dtype = dtype;
  spec.head_dim = head_dim;
  spec.page_size = page_size;
  spec.group_size = params.n_heads / params.n_kv_heads;
  spec.flags = flags;
  spec.arch = device.arch();
  if (launch_prefill_sm90(impl, device, spec, launch_name, max_q_len, params, stream)) return;
  // The tensor-core and CUDA-core paths tile differently: which one runs on this device.
  const bool mma = device.uses_mma();
  const int smem = mma ? prefill_smem_bytes(head_dim, (flags & (kFeatureKvE4m3 | kFeatureKvE5m2)) != 0)
                       : prefill_core_smem_bytes(head_dim);
  const LoadedVariant& variant = impl.variant(device, spec, {kPrefillThreads, smem});
  const int block_q = mma ? prefill_block_q(head_dim) : kPrefillCoreBlockQ;
  const long long q_tiles = (static_cast<long long>(max_q_len) + block_q - 1) / block_q;
  PrefillParams launch_params = params;
  LaunchConfig config{};
  config.name = launch_name;
  config.grid = {static_cast<unsigned>(q_tiles), static_cast<unsigned>(params.n_heads),
                 static_cast<unsigned>(params.batch)};
  launch_params.tile_order = prefill_tile_order(config.grid.x, config.grid.y, config.grid.z);
  config.block = kPrefillThreads;
  config.smem = static_cast<unsigned>(smem);
  config.stream = static_cast<CUstream>(stream);
  device.launch(variant.functions[0], config, &launch_params);
}

}  // namespace astrai::detail
