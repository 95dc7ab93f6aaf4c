#include "runtime/families/prefill_launch.hpp"

#include <algorithm>
#include <array>
#include <vector>

#include <fmt/format.h>

#include "kernel_src/hopper_params.h"
#include "runtime/families/arg_checks.hpp"
#include "runtime/families/attention_features.hpp"
#include "runtime/launch_heuristics.hpp"
#include "runtime/plan/implementations.hpp"
#include "runtime/plan/plan_memo.hpp"
#include "runtime/tensor_map.hpp"

namespace astrai::detail {

std::vector<std::string> prefill_instantiations(const KernelSpec& spec, int page_size) {
  return {fmt::format("astrai::prefill_kernel<{}, {}, {}, {}, {}>", device_type_name(spec.dtype),
                      spec.head_dim, page_size, spec.group_size, spec.flags)};
}

std::vector<std::string> prefill_sm90_instantiations(const KernelSpec& spec, int page_size) {
  const int consumers = prefill_sm90_consumers(spec.head_dim, spec.wide, spec.flags);
  // An FP8 cache and FP8 attention take the byte rings' 128-token blocks.
  const bool kv8 = (spec.flags & (kFeatureKvFp8 | kFeatureQkvE4m3)) != 0;
  return {fmt::format("astrai::prefill_sm90_kernel<{}, {}, {}, {}, {}, {}, {}{}>", device_type_name(spec.dtype),
                      spec.head_dim, page_size, spec.group_size, consumers,
                      prefill_sm90_block_n(spec.head_dim, consumers, kv8), spec.flags,
                      prefill_sm90_persistent(page_size, consumers, spec.flags) ? ", true" : "")};
}

bool prefill_sm90_serves(int head_dim, int page_size) {
  return prefill_sm90_head_dim(head_dim) && (page_size == 0 || page_size >= 8);
}

bool prefill_sm90_has_wide(int head_dim, std::uint32_t flags) {
  return prefill_sm90_wide_consumers(head_dim) != 0 && (flags & (kFeatureKvFp8 | kFeatureQkvE4m3)) == 0;
}

void check_fp8_attention(const char* call, const AttentionOptions& options, float scale, int head_dim,
                         int page_size, const void* mask, const char* causal_name,
                         std::initializer_list<std::pair<const char*, std::int64_t>> strides) {
  if (options.qkv_dtype != KvDType::e4m3) return;
  constexpr const char* kFp8 = "with qkv_dtype e4m3 (FP8 attention: float8_e4m3fn q, k and v)";
  if (!prefill_sm90_serves_qkv8(head_dim, 0, kFeatureQkvE4m3))
    fail_argument(call, fmt::format("head_dim {} is not served {} (allowed: 64, 128 or 256)", head_dim, kFp8));
  if (!prefill_sm90_serves_qkv8(head_dim, page_size, kFeatureQkvE4m3))
    fail_argument(call, fmt::format("page_size {} is not served {} (allowed: 8 or more)", page_size, kFp8));
  if (options.p_fp16 && !prefill_sm90_serves_qkv8(head_dim, page_size, kFeatureQkvE4m3 | kFeatureQkvP16))
    fail_argument(call, fmt::format("P in f16 (p_fp16; p_dtype torch.float16 in Python) is not served at head_dim "
                                    "{} {} (allowed: P in e4m3 at head_dims 64 and 256, either at 128)",
                                    head_dim, kFp8));
  const std::uint32_t others = attention_features(options, scale).flags & ~(kFeatureQkvE4m3 | kFeatureQkvP16);
  if (!prefill_sm90_serves_qkv8(head_dim, page_size, others | kFeatureQkvE4m3))
    fail_argument(call, fmt::format("{} is not served {} (allowed: none of logit_cap, sinks, window_left, "
                                    "alibi_slopes)", requested_option_values(options, others), kFp8));
  if (mask != nullptr)
    fail_argument(call, fmt::format("mask = {} is not served {} (allowed: none; {} for a causal prefill)", mask,
                                    kFp8, causal_name));
  // The kernel reads q, K and V only through TMA; with one-byte elements a view can break that,
  // and no other kernel could take the call.
  for (const auto& [name, stride] : strides)
    if (stride % 16 != 0)
      fail_argument(call, fmt::format("{} {} is not served with qkv_dtype e4m3 (allowed: a multiple of 16 "
                                      "elements, as FP8 attention reads q, k and v through TMA)",
                                      name, stride));
}

PrefillMaps prefill_map_shapes(const PrefillParams& p, int head_dim, int page_size, int consumers, int block_n,
                               bool kv8, bool qkv8) {
  using U = std::uint64_t;
  const U d = static_cast<U>(head_dim);
  PrefillMaps maps;
  const std::uint32_t pack = static_cast<std::uint32_t>(prefill_sm90_pack_heads(p.n_heads / p.n_kv_heads));
  const bool packed = pack > 1;
  const std::uint32_t block_m = static_cast<std::uint32_t>(prefill_sm90_block_m(consumers));
  const std::uint32_t kv_box = static_cast<std::uint32_t>(block_n);
  // Rows of bytes go in boxes of 128 bytes at most (the swizzle's row), a chunk each; hd64's of
  // 64 (64-byte swizzled).
  const std::uint32_t byte_box = static_cast<std::uint32_t>(std::min(head_dim, 128));
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
    if (kv8 || qkv8) {
      // An FP8 cache: K and V alike in boxes of rows of bytes, a 128-byte swizzle row each (the
      // kernel issues a box a chunk at hd256).
      maps.k = {p.k, {d, U(p.n_kv_heads), U(page_size), pages}, {p.k_stride_head, p.k_stride_seq, p.k_stride_page},
                {byte_box, 1, box, 1}, 1};
      maps.v = {p.v, {d, U(p.n_kv_heads), U(page_size), pages}, {p.v_stride_head, p.v_stride_seq, p.v_stride_page},
                {byte_box, 1, box, 1}, 1};
    }
  }
  // Packed: a pack's heads at block_m / pack positions; else block_m positions of one head.
  maps.q.box = packed ? std::vector<std::uint32_t>{64, pack, block_m / pack, 1}
                      : std::vector<std::uint32_t>{64, block_m, 1, 1};
  if (qkv8) {
    // FP8 attention: q, K and V in boxes of rows of bytes (a 128-byte swizzle row, one chunk of
    // hd256's two), the strides counting bytes.
    for (TensorMapShape* shape : {&maps.q, &maps.k, &maps.v}) {
      shape->box[0] = byte_box;
      shape->element_bytes = 1;
    }
  }
  return maps;
}

GridSize prefill_sm90_grid(const PrefillParams& p, int max_q_len, int consumers) {
  return prefill_sm90_tile_grid(max_q_len, p.n_heads, p.n_heads / p.n_kv_heads, p.batch, consumers);
}

namespace {

// The Hopper kernel's TMA views of q, K and V for a call its plan gave it; false when the driver
// refuses one (the call is then planned again without it).
bool prefill_sm90_maps(const Device& device, const Plan& plan, const char* launch_name, const PrefillParams& params,
                       CUtensorMap* map_q, CUtensorMap* map_k, CUtensorMap* map_v) {
  const KernelSpec& spec = plan.spec;
  const PrefillMaps shapes = prefill_map_shapes(params, spec.head_dim, spec.page_size, plan.consumers, plan.block_n,
                                                (spec.flags & kFeatureKvFp8) != 0,
                                                (spec.flags & kFeatureQkvE4m3) != 0);
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
  *map_q = encode_tensor_map(shapes.q, fp16, device.ordinal(), kPromotion);
  *map_k = kv.maps[0];
  *map_v = kv.maps[1];
  return true;
}

}  // namespace

void launch_prefill(Runtime::Impl& impl, const KernelFamily& family, const char* launch_name, DType dtype,
                    int head_dim, int page_size, std::uint32_t flags, int max_q_len, const PrefillParams& params,
                    void* stream) {
  Device& device = impl.current_device();
  AttentionProblem problem;
  problem.kind = family.kind;
  problem.dtype = dtype;
  problem.head_dim = head_dim;
  problem.page_size = page_size;
  problem.batch = params.batch;
  problem.n_heads = params.n_heads;
  problem.n_kv_heads = params.n_kv_heads;
  problem.flags = flags;
  problem.masked = params.mask != nullptr;
  problem.max_q_len = max_q_len;
  problem.total_q = page_size == 0 ? 1LL * params.q_len * params.batch : params.total_q;
  CUtensorMap maps[3];
  thread_local PlanMemo<AttentionProblem> memo;
  const auto make = [&] { return plan_prefill(problem, device.traits()); };
  const Plan* planned = &memo.get(&device, problem, make);
  if (planned->spec.hopper &&
      !prefill_sm90_maps(device, *planned, launch_name, params, &maps[0], &maps[1], &maps[2])) {
    problem.hopper_refused = true;
    planned = &memo.get(&device, problem, make);
  }
  const Plan& plan = *planned;
  const LoadedVariant& variant = impl.planned_variant(device, plan);
  PrefillParams launch_params = params;
  launch_params.tile_order = prefill_tile_order(plan.tiles.x, plan.tiles.y, plan.tiles.z);
  LaunchConfig config{};
  config.name = launch_name;
  config.grid = plan.grid;
  config.block = static_cast<unsigned>(plan.block);
  config.smem = static_cast<unsigned>(plan.smem);
  config.stream = static_cast<CUstream>(stream);
  if (plan.spec.hopper) {
    void* arguments[] = {&launch_params, &maps[0], &maps[1], &maps[2]};
    device.launch(variant.functions[0], config, arguments);
  } else {
    device.launch(variant.functions[0], config, &launch_params);
  }
}

}  // namespace astrai::detail
