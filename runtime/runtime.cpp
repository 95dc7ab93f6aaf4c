// astrai::Runtime: argument checks, per-device module loading, workspace, and launches.
#include "astrai/runtime.hpp"

#include <algorithm>
#include <cstdint>

#include <fmt/format.h>

#include "kernel_src/kernel_params.h"
#include "runtime/launch_heuristics.hpp"
#include "runtime/runtime_impl.hpp"
#include "runtime/validation.hpp"

namespace astrai {

using detail::kLog2e;

std::size_t paged_decode_workspace_bytes(const PagedDecodeArgs& input, int num_sms) {
  const PagedDecodeArgs args = detail::resolve_paged_decode_args(input);
  const int group = args.n_heads / args.n_kv_heads;
  const int head_tiles = (group + kDecodeHeadsPerTile - 1) / kDecodeHeadsPerTile;
  // The plan depends on the kernel's occupancy, known once it is loaded: take the largest
  // workspace over every occupancy a 128-thread CTA can have.
  std::size_t bytes = 0;
  for (int per_sm = 1; per_sm <= 16; ++per_sm) {
    const auto plan = detail::plan_decode_splits(args.batch, args.n_kv_heads, head_tiles,
                                                 1LL * args.max_pages_per_seq * args.page_size,
                                                 per_sm * num_sms);
    bytes = std::max(bytes, detail::decode_workspace_bytes(plan, args.batch, args.n_heads, args.head_dim));
  }
  return bytes;
}

void validate_args(const PagedDecodeArgs& args) { detail::resolve_paged_decode_args(args); }
void validate_args(const DecodeArgs& args) { detail::resolve_decode_args(args); }
void validate_args(const PrefillArgs& args) { detail::resolve_prefill_args(args); }
void validate_args(const PagedPrefillArgs& args) { detail::resolve_paged_prefill_args(args); }
void validate_args(const RotaryArgs& args) { detail::resolve_rotary_args(args); }

Runtime& Runtime::get() {
  static Runtime runtime;
  return runtime;
}

Runtime::Runtime() {
  detail::EnvConfig config = detail::load_env_config_from_process();
  detail::Logger::instance().set_level(config.log_level);
  for (const auto& name : config.unknown_variables)
    detail::log_once(detail::LogLevel::warn, "unknown-env-" + name,
                     "unknown environment variable {} ignored (known: ASTRAI_JIT_CACHE_DIR, "
                     "ASTRAI_JIT_CACHE, ASTRAI_JIT_FORCE_COMPILE, ASTRAI_JIT_STRICT, "
                     "ASTRAI_JIT_RECORD, ASTRAI_JIT_MAX_CACHE_SIZE, ASTRAI_JIT_LOG, ASTRAI_JIT_ARCH, "
                     "ASTRAI_JIT_NO_MMA, ASTRAI_JIT_DUMP)", name);
  impl_ = std::make_unique<Impl>(std::move(config));
}

Runtime::~Runtime() = default;

std::vector<std::string> Runtime::loaded_variants() const {
  std::vector<std::string> names;
  std::lock_guard<std::mutex> lock(impl_->devices_mutex);
  for (const auto& device : impl_->devices) {
    if (!device) continue;
    std::shared_lock<std::shared_mutex> variants_lock(device->variants_mutex);
    for (const auto& [id, variant] : device->variants) names.push_back(variant->name);
  }
  return names;
}

namespace {

// What differs between paged and contiguous decode at launch time.
struct DecodeLaunch {
  const char* call;
  KernelKind kind;
  DType dtype;
  int head_dim;
  int page_size;  // 0 for contiguous decode
  CUstream stream;
  void* workspace;  // caller-provided, or null for the runtime's own
  std::size_t workspace_bytes;
};

// Picks the split plan from the capacity, places the workspace, launches the attention kernel
// and, when split, the combine kernel.
void launch_decode(Runtime::Impl& impl, const DecodeLaunch& launch, PagedDecodeParams params) {
  detail::DeviceState& device = impl.current_device();
  const int group = params.n_heads / params.n_kv_heads;
  detail::VariantRequest request;
  request.kind = launch.kind;
  request.dtype = launch.dtype;
  request.head_dim = launch.head_dim;
  request.page_size = launch.page_size;
  request.group = group;
  request.dynamic_smem = paged_decode_smem_bytes(launch.head_dim);
  const auto& variant = impl.variant(device, request);
  const int head_tiles = (group + kDecodeHeadsPerTile - 1) / kDecodeHeadsPerTile;
  // The plan is a pure function of the shape; remember the last one per thread (hot path).
  struct PlanMemo {
    const detail::LoadedVariant* variant = nullptr;
    int batch = -1, n_kv_heads = -1, capacity = -1;
    detail::DecodeSplitPlan plan;
  };
  thread_local PlanMemo memo;
  if (memo.variant != &variant || memo.batch != params.batch || memo.n_kv_heads != params.n_kv_heads ||
      memo.capacity != params.kv_capacity) {
    memo.plan = detail::plan_decode_splits(params.batch, params.n_kv_heads, head_tiles,
                                           params.kv_capacity, variant.resident_ctas);
    memo.variant = &variant;
    memo.batch = params.batch;
    memo.n_kv_heads = params.n_kv_heads;
    memo.capacity = params.kv_capacity;
  }
  const detail::DecodeSplitPlan plan = memo.plan;
  params.tokens_per_split = plan.tokens_per_split;
  params.workspace.num_splits = plan.num_splits;
  if (plan.num_splits > 1) {
    const std::size_t bytes =
        detail::decode_workspace_bytes(plan, params.batch, params.n_heads, launch.head_dim);
    CUdeviceptr base = 0;
    if (launch.workspace) {
      if (launch.workspace_bytes < bytes)
        throw InvalidArgument(fmt::format("{}: workspace_bytes {} is too small (this shape needs >= "
                                          "{}; see paged_decode_workspace_bytes)",
                                          launch.call, launch.workspace_bytes, bytes));
      base = reinterpret_cast<CUdeviceptr>(launch.workspace);
    } else {
      base = impl.workspace(device, launch.stream, bytes, launch.call);
    }
    const std::size_t rows = static_cast<std::size_t>(plan.num_splits) * params.batch * params.n_heads;
    const std::size_t out_bytes = ((rows * launch.head_dim * sizeof(float) + 255) / 256) * 256;
    params.workspace.partial_out = reinterpret_cast<float*>(base);
    params.workspace.partial_lse = reinterpret_cast<float*>(base + out_bytes);
  }
  impl.launch(device, variant.functions[0], launch.call,
              {static_cast<unsigned>(plan.num_splits),
               static_cast<unsigned>(params.n_kv_heads * head_tiles), static_cast<unsigned>(params.batch)},
              kDecodeThreads, static_cast<unsigned>(paged_decode_smem_bytes(launch.head_dim)),
              launch.stream, &params);
  if (plan.num_splits > 1) {
    CombineParams combine{};
    combine.workspace = params.workspace;
    combine.lse = params.lse;
    combine.out = params.out;
    combine.out_stride_batch = params.out_stride_batch;
    combine.out_stride_head = params.out_stride_head;
    combine.batch = params.batch;
    combine.n_heads = params.n_heads;
    impl.launch_dependent(device, variant.functions[1], "cuLaunchKernel(split_combine)",
                {static_cast<unsigned>(params.batch * params.n_heads), 1, 1}, 128, 0, launch.stream,
                &combine);
  }
}

}  // namespace

namespace {

// The fields paged and contiguous decode fill alike: query, output, LSE, mask, shape, scale.
template <typename Args>
PagedDecodeParams common_decode_params(const Args& args) {
  PagedDecodeParams params{};
  params.q = args.q;
  params.q_stride_batch = args.q_stride_batch;
  params.q_stride_head = args.q_stride_head;
  params.mask = args.mask;
  params.mask_stride_batch = args.mask_stride_batch;
  params.lse = args.lse;
  params.out = args.out;
  params.out_stride_batch = args.out_stride_batch;
  params.out_stride_head = args.out_stride_head;
  params.batch = args.batch;
  params.n_heads = args.n_heads;
  params.n_kv_heads = args.n_kv_heads;
  params.scale_log2 = args.scale * kLog2e;
  return params;
}

}  // namespace

void Runtime::paged_decode(const PagedDecodeArgs& input) {
  const PagedDecodeArgs args = detail::resolve_paged_decode_args(input);
  if (args.batch == 0) return;
  PagedDecodeParams params = common_decode_params(args);
  params.k_cache = args.k_cache;
  params.v_cache = args.v_cache;
  params.k_stride_page = args.k_stride_page;
  params.k_stride_token = args.k_stride_token;
  params.k_stride_head = args.k_stride_head;
  params.v_stride_page = args.v_stride_page;
  params.v_stride_token = args.v_stride_token;
  params.v_stride_head = args.v_stride_head;
  params.page_table = args.page_table;
  params.page_table_stride = args.page_table_stride;
  params.req_indices = args.req_indices;
  params.page_table_rows = args.page_table_rows;
  params.seq_lens = args.seq_lens;
  params.kv_capacity = args.max_pages_per_seq * args.page_size;
  params.new_k = args.new_k;
  params.new_v = args.new_v;
  params.new_k_stride_batch = args.new_k_stride_batch;
  params.new_k_stride_head = args.new_k_stride_head;
  params.new_v_stride_batch = args.new_v_stride_batch;
  params.new_v_stride_head = args.new_v_stride_head;
  params.num_pages = args.num_pages;
  params.max_pages_per_seq = args.max_pages_per_seq;
  launch_decode(*impl_,
                {"paged_decode", KernelKind::paged_decode, args.dtype, args.head_dim, args.page_size,
                 static_cast<CUstream>(args.stream), args.workspace, args.workspace_bytes},
                params);
}

void Runtime::decode(const DecodeArgs& input) {
  const DecodeArgs args = detail::resolve_decode_args(input);
  if (args.batch == 0) return;
  PagedDecodeParams params = common_decode_params(args);
  params.k_cache = args.k;
  params.v_cache = args.v;
  params.k_stride_page = args.k_stride_batch;
  params.k_stride_token = args.k_stride_seq;
  params.k_stride_head = args.k_stride_head;
  params.v_stride_page = args.v_stride_batch;
  params.v_stride_token = args.v_stride_seq;
  params.v_stride_head = args.v_stride_head;
  // The causal offset only shortens the range: the query at position c sees [0, c].
  params.kv_capacity = args.causal_offset < 0 ? args.kv_len : std::min(args.kv_len, args.causal_offset + 1);
  params.num_pages = 0;
  launch_decode(*impl_,
                {"decode", KernelKind::decode, args.dtype, args.head_dim, 0,
                 static_cast<CUstream>(args.stream), args.workspace, args.workspace_bytes},
                params);
}

void Runtime::rotary_emb(const RotaryArgs& input) {
  const RotaryArgs args = detail::resolve_rotary_args(input);
  const long long vectors = 1LL * args.batch * args.seq_len * args.n_heads * (args.head_dim / 8);
  if (vectors == 0) return;
  detail::DeviceState& device = impl_->current_device();
  detail::VariantRequest request;
  request.kind = KernelKind::rotary_emb;
  request.dtype = args.dtype;
  request.head_dim = args.head_dim;
  const auto& variant = impl_->variant(device, request);
  RotaryParams params{};
  params.x = args.x;
  params.x_stride_batch = args.x_stride_batch;
  params.x_stride_seq = args.x_stride_seq;
  params.x_stride_head = args.x_stride_head;
  params.out = args.out;
  params.out_stride_batch = args.out_stride_batch;
  params.out_stride_seq = args.out_stride_seq;
  params.out_stride_head = args.out_stride_head;
  params.freqs = args.freqs;
  params.freqs_stride_batch = args.freqs_stride_batch;
  params.freqs_stride_seq = args.freqs_stride_seq;
  params.batch = args.batch;
  params.seq_len = args.seq_len;
  params.n_heads = args.n_heads;
  impl_->launch(device, variant.functions[0], "cuLaunchKernel(rotary_emb)",
                {static_cast<unsigned>(detail::rotary_grid_size(vectors, device.num_sms)), 1, 1}, 256, 0,
                static_cast<CUstream>(args.stream), &params);
}

}  // namespace astrai
