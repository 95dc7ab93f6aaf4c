#include "runtime/families/decode_launch.hpp"

#include <algorithm>
#include <array>

#include <fmt/format.h>

#include "base/logging.hpp"
#include "kernel_src/hopper_params.h"
#include "runtime/launch_heuristics.hpp"
#include "runtime/plan/plan_memo.hpp"
#include "runtime/tensor_map.hpp"

namespace astrai::detail {

bool decode_sm90_has_wide_tiling(int head_dim, std::uint32_t /*flags*/) {
  // Every feature the TMA decode serves has the wide tiling: an FP8 ring is smaller than the
  // 16-bit one its region is sized for (the kernel asserts it).
  return decode_sm90_has_wide(head_dim);
}

namespace {

// The entry held to 4 CTAs an SM (kernel_src/paged_decode.cuh): the direct FP8 path with bf16 Q
// at head dim 128, on tensor cores.
bool decode_entry_holds_4_ctas(const KernelSpec& spec) {
  return spec.uses_mma() && spec.dtype == DType::bf16 && spec.head_dim == 128 &&
         (spec.flags & kFeatureKvFp8) != 0;
}

}  // namespace

std::vector<std::string> decode_instantiations(const KernelSpec& spec, int page_size) {
  const char* type = device_type_name(spec.dtype);
  const int q_len = decode_q_len(spec.flags);
  return {fmt::format("astrai::{}<{}, {}, {}, {}, {}>",
                      decode_entry_holds_4_ctas(spec) ? "paged_decode_kernel_4ctas" : "paged_decode_kernel", type,
                      spec.head_dim, page_size, spec.group_size, spec.flags),
          q_len == 1 ? fmt::format("astrai::split_combine_kernel<{}, {}>", type, spec.head_dim)
                     : fmt::format("astrai::split_combine_tokens_kernel<{}, {}, {}>", type, spec.head_dim, q_len)};
}

std::vector<std::string> decode_sm90_instantiations(const KernelSpec& spec, int page_size) {
  std::vector<std::string> names = decode_instantiations(spec, page_size);
  names[0] = fmt::format("astrai::paged_decode_sm90_kernel<{}, {}, {}, {}, {}, {}>", device_type_name(spec.dtype),
                         spec.head_dim, page_size, spec.group_size, spec.flags,
                         spec.wide ? kDecodeSm90WideSplits : 1);
  return names;
}

namespace {

// The TMA views of the K and V caches the Hopper decode reads (kernel_src/paged_decode_sm90.cuh):
// paged {d, n_kv_heads, page_size, num_pages}, contiguous {d, n_kv_heads, kv_capacity, batch};
// boxes of a 128-byte row piece (64 elements, an FP8 cache's 128; at hd64 an FP8 row's 64 bytes,
// which take the 64-byte swizzle) by min(page_size, 64) tokens.
// The maps are a function of these fields (the memo adds the device and dtype), so the key is
// built without the shapes' allocations.
struct DecodeMapKey {
  int head_dim, page_size, n_kv_heads, rows, outer, element_bytes;
  const void* k;
  const void* v;
  std::int64_t k_strides[3], v_strides[3];  // head, token, page (contiguous: batch)

  static constexpr std::size_t kWords = 14;
  std::array<std::uint64_t, kWords> words() const {
    using U = std::uint64_t;
    return {U(head_dim), U(page_size), U(n_kv_heads), U(rows), U(outer), U(element_bytes),
            reinterpret_cast<std::uintptr_t>(k), reinterpret_cast<std::uintptr_t>(v),
            U(k_strides[0]), U(k_strides[1]), U(k_strides[2]),
            U(v_strides[0]), U(v_strides[1]), U(v_strides[2])};
  }
};

TensorMapShape decode_map_shape(const DecodeMapKey& key, const void* base, const std::int64_t* strides) {
  using U = std::uint64_t;
  const std::uint32_t box =
      static_cast<std::uint32_t>(key.page_size > 0 ? std::min(key.page_size, kDecodeBlockTokens) : kDecodeBlockTokens);
  return {base,
          {U(key.head_dim), U(key.n_kv_heads), U(key.rows), U(key.outer)},
          {strides[0], strides[1], strides[2]},
          {static_cast<std::uint32_t>(std::min(128, key.head_dim * key.element_bytes) / key.element_bytes), 1, box, 1},
          key.element_bytes};
}

// The TMA views of K and V for a call the plan gave the Hopper decode; false when the driver
// refuses one (the call is then planned again without it).
bool decode_sm90_maps(const Device& device, const KernelSpec& spec, const PagedDecodeParams& p, CUtensorMap* map_k,
                      CUtensorMap* map_v) {
  const DecodeMapKey key{spec.head_dim,
                         spec.page_size,
                         p.n_kv_heads,
                         std::max(spec.page_size > 0 ? spec.page_size : p.kv_capacity, 1),
                         std::max(spec.page_size > 0 ? p.num_pages : p.batch, 1),
                         (spec.flags & kFeatureKvFp8) != 0 ? 1 : 2,
                         p.k_cache,
                         p.v_cache,
                         {p.k_stride_head, p.k_stride_token, p.k_stride_page},
                         {p.v_stride_head, p.v_stride_token, p.v_stride_page}};
  thread_local TensorMapMemo<DecodeMapKey::kWords> memo;
  const TensorMaps& maps =
      memo.find_or_encode(key.words(), spec.family().name, spec.dtype == DType::fp16, device.ordinal(),
                          CU_TENSOR_MAP_L2_PROMOTION_NONE, [&] {
                            return std::vector<NamedTensorMapShape>{
                                {"k", decode_map_shape(key, key.k, key.k_strides)},
                                {"v", decode_map_shape(key, key.v, key.v_strides)}};
                          });
  if (!maps.usable) return false;
  *map_k = maps.maps[0];
  *map_v = maps.maps[1];
  return true;
}

}  // namespace

namespace {
// A copy, not a pointer into the variant: a variant lives as long as its device's state.
thread_local std::string last_launched_name;
}  // namespace

const std::string& last_decode_variant() { return last_launched_name; }

SplitWorkspace split_workspace_at(CUdeviceptr base, int num_splits, std::size_t rows, int head_dim) {
  const std::size_t all_rows = static_cast<std::size_t>(num_splits) * rows;
  const std::size_t out_bytes = ((all_rows * head_dim * sizeof(float) + 255) / 256) * 256;
  SplitWorkspace workspace{};
  workspace.partial_out = reinterpret_cast<float*>(base);
  workspace.partial_lse = reinterpret_cast<float*>(base + out_bytes);
  workspace.num_splits = num_splits;
  return workspace;
}

void launch_split_combine(Device& device, CUfunction combine, const SplitWorkspace& workspace,
                          const CombineTarget& target, CUstream stream, const char* name) {
  CombineParams rows{};
  rows.workspace = workspace;
  rows.lse = target.lse;
  rows.out = target.out;
  rows.out_stride_batch = target.out_stride_batch;
  rows.out_stride_head = target.out_stride_head;
  rows.batch = target.batch;
  rows.n_heads = target.n_heads;
  TokenCombineParams tokens{rows, target.out_stride_seq};
  LaunchConfig config{};
  config.name = name;
  config.grid = {static_cast<unsigned>(target.batch * target.n_heads * target.q_len),
                 static_cast<unsigned>(combine_column_slices(target.head_dim)), 1};
  config.block = 128;
  config.smem = 0;
  config.stream = stream;
  config.programmatic_dependent = true;
  device.launch(combine, config, target.q_len > 1 ? static_cast<void*>(&tokens) : &rows);
}

AttentionProblem decode_problem(const DecodeLaunch& launch, const PagedDecodeParams& params) {
  AttentionProblem problem;
  problem.kind = launch.family.kind;
  problem.dtype = launch.dtype;
  problem.head_dim = launch.head_dim;
  problem.page_size = launch.page_size;
  problem.batch = params.batch;
  problem.n_heads = params.n_heads;
  problem.n_kv_heads = params.n_kv_heads;
  problem.flags = launch.flags;
  problem.masked = params.mask != nullptr;
  // A window's splits cover only the blocks it can touch (a function of the shape and the
  // window, so graphs stay valid as lengths grow). The flag says whether there is a window:
  // without one the value is unset (0), and contiguous decode folds a causal offset past kv_len
  // into it, down to -1 (nothing to attend to), which still plans one block.
  const int window_left = (launch.flags & kFeatureWindow) != 0 ? std::max(params.features.window_left, 0) : -1;
  problem.span = decode_span_tokens(params.kv_capacity, window_left, decode_q_len(launch.flags));
  problem.caller_workspace = launch.workspace != nullptr;
  problem.workspace_bytes = launch.workspace != nullptr ? launch.workspace_bytes : 0;
  return problem;
}

void launch_decode(Runtime::Impl& impl, const DecodeLaunch& launch, PagedDecodeParams params) {
  Device& device = impl.current_device();
  thread_local PlanMemo<AttentionProblem> memo;
  AttentionProblem problem = decode_problem(launch, params);
  CUtensorMap map_k;
  CUtensorMap map_v;
  const auto make = [&] {
    // The portable kernels' occupancy is read off the loaded variant.
    const OccupancyQuery occupancy = [&](const KernelSpec& spec, int block, int smem) {
      return impl.variant(device, spec, {block, smem}).resident_ctas;
    };
    return plan_decode(problem, device.traits(), occupancy);
  };
  const Plan* planned = nullptr;
  for (;;) {
    planned = &memo.get(&device, problem, make);
    if (!planned->spec.hopper || decode_sm90_maps(device, planned->spec, params, &map_k, &map_v)) break;
    problem.hopper_refused = true;
  }
  const Plan& plan = *planned;
  const LoadedVariant& launched = impl.planned_variant(device, plan);
  const int q_len = decode_q_len(launch.flags);
  params.tokens_per_split = plan.split.tokens_per_split;
  params.workspace.num_splits = plan.split.num_splits;
  if (plan.split_kv()) {
    // A caller's workspace is big enough: cap_decode_splits planned for it.
    const CUdeviceptr base = launch.workspace != nullptr ? reinterpret_cast<CUdeviceptr>(launch.workspace)
                                                         : device.workspace(launch.stream, plan.workspace_bytes,
                                                                            launch.family.name);
    params.workspace = split_workspace_at(base, plan.split.num_splits,
                                          static_cast<std::size_t>(params.batch) * params.n_heads * q_len,
                                          launch.head_dim);
  }
  LaunchConfig attention{};
  attention.name = launch.family.name;
  attention.grid = plan.grid;
  attention.block = static_cast<unsigned>(plan.block);
  attention.smem = static_cast<unsigned>(plan.smem);
  attention.stream = launch.stream;
  // Its CTAs may be placed while the kernel before it drains; they wait for it before any load.
  attention.programmatic_dependent = true;
  if (plan.spec.hopper) {
    void* arguments[] = {&params, &map_k, &map_v};
    device.launch(launched.functions[0], attention, arguments);
  } else {
    device.launch(launched.functions[0], attention, &params);
  }
  if (last_launched_name != launched.name) last_launched_name = launched.name;  // copies only on a change
  if (plan.split_kv())
    launch_split_combine(device, launched.functions[1], params.workspace,
                         {params.lse, params.out, params.out_stride_batch, params.out_stride_seq,
                          params.out_stride_head, params.batch, params.n_heads, q_len, launch.head_dim},
                         launch.stream, "cuLaunchKernel(split_combine)");
}

}  // namespace astrai::detail
