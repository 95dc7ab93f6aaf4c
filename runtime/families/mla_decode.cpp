// mla_decode: MLA decode in the absorbed form (kernel_src/mla_decode.cuh). Descriptor, argument
// checks and launch; the plan is runtime/plan/mla_plan.cpp's.
#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "kernel_src/hopper_params.h"
#include "kernel_src/kernel_params.h"
#include "runtime/families/arg_checks.hpp"
#include "runtime/families/decode_launch.hpp"
#include "runtime/launch_heuristics.hpp"
#include "runtime/plan/mla_plan.hpp"
#include "runtime/plan/plan_memo.hpp"
#include "runtime/runtime_impl.hpp"
#include "runtime/tensor_map.hpp"
#include "runtime/validation.hpp"

namespace astrai {

namespace detail {

namespace {

// The split combine both implementations' split plans end with.
std::string mla_combine_instantiation(const KernelSpec& spec) {
  const char* type = device_type_name(spec.dtype);
  const int q_len = decode_q_len(spec.flags);
  return q_len == 1 ? fmt::format("astrai::split_combine_kernel<{}, {}>", type, int{kMlaVDim})
                    : fmt::format("astrai::split_combine_tokens_kernel<{}, {}, {}>", type, int{kMlaVDim}, q_len);
}

std::vector<std::string> mla_sm90_instantiations(const KernelSpec& spec) {
  return {fmt::format("astrai::mla_decode_sm90_kernel<{}, {}, {}>", device_type_name(spec.dtype), spec.page_size,
                      decode_q_len(spec.flags)),
          mla_combine_instantiation(spec)};
}

}  // namespace

const KernelFamily& mla_decode_family() {
  static const KernelFamily family{
      KernelKind::mla_decode,
      "mla_decode",
      /*paged=*/true,
      /*grouped=*/true,  // the group is the query heads sharing the one latent KV head
      /*warm_by_default=*/false,
      "mla_decode.cuh",
      [](const KernelSpec& spec) -> std::vector<std::string> {
        const char* type = device_type_name(spec.dtype);
        const int q_len = decode_q_len(spec.flags);
        const MlaTiling tiling = mla_tiling(spec.arch, spec.group_size, q_len);
        const unsigned kv_flags = spec.flags & kFeatureKvFp8;
        std::vector<std::string> names = {fmt::format("astrai::mla_decode_kernel<{}, {}, {}, {}, {}, {}u>", type,
                                                      spec.page_size, q_len, tiling.row_groups, tiling.block_n,
                                                      kv_flags)};
        names.push_back(mla_combine_instantiation(spec));
        return names;
      },
      /*limits=*/{{kMlaQkDim, kMlaQkDim, 16}, 64, 128},
      /*supported_flags=*/kFeatureQLenField | kFeatureKvFp8,
      // DeepSeek-V3/R1 on 8 GPUs (16 heads each) and on one (128), pages of 64 and 1.
      /*warm=*/{{{kMlaQkDim, 16}, {kMlaQkDim, 128}}, {kMlaQkDim}, {16, 128}, {1, 64}},
      /*hopper=*/{"mla_decode_sm90.cuh", mla_sm90_instantiations,
                  [](int head_dim, int page_size) { return head_dim == kMlaQkDim && mla_sm90_serves(page_size, 0u); },
                  "wgmma", kFeatureQLenField},
      /*needs_mma=*/true,
  };
  return family;
}

namespace {

constexpr const char* kCall = "mla_decode";

// As paged_decode's: the split plan's token arithmetic stays in int.
constexpr long long kMaxTableTokens =
    (std::numeric_limits<int>::max() / kDecodeBlockTokens - (kMaxSplits - 1)) * 1LL * kDecodeBlockTokens;

}  // namespace

MlaDecodeArgs resolve_mla_decode_args(const MlaDecodeArgs& input) {
  const KernelFamily& family = mla_decode_family();
  MlaDecodeArgs a = input;
  require_dtype(kCall, a.dtype);
  require_batch(kCall, a.batch);
  if (a.q_len < 1 || a.q_len > kMaxDecodeQLen)
    fail_argument(kCall, fmt::format("q_len {} is not valid (allowed: 1..{})", a.q_len, int{kMaxDecodeQLen}));
  if (!family.limits.group_ok(a.n_heads))
    fail_argument(kCall, fmt::format("n_heads {} is not supported (allowed: {})", a.n_heads,
                                     family.limits.group_allowed()));
  require_page_size(family, a.page_size);
  require_positive(kCall, "num_pages", a.num_pages);
  require_positive(kCall, "max_pages_per_seq", a.max_pages_per_seq);
  if (1LL * a.max_pages_per_seq * a.page_size > kMaxTableTokens)
    fail_argument(kCall, fmt::format("max_pages_per_seq {} x page_size {} = {} tokens exceeds the limit of {} tokens",
                                     a.max_pages_per_seq, a.page_size, 1LL * a.max_pages_per_seq * a.page_size,
                                     kMaxTableTokens));
  if (!(a.scale > 0.f) || a.scale == std::numeric_limits<float>::infinity())
    fail_argument(kCall, fmt::format("scale {} is not valid (allowed: the model's softmax scale, finite and > 0; "
                                     "the absorbed form's 576-wide rows do not imply it, e.g. DeepSeek-V3 uses "
                                     "1/sqrt(192) times its YaRN factor squared)",
                                     a.scale));
  if (a.page_table_stride == 0) a.page_table_stride = a.max_pages_per_seq;
  if (a.page_table_stride < a.max_pages_per_seq)
    fail_argument(kCall, fmt::format("page_table_stride {} is smaller than max_pages_per_seq {}", a.page_table_stride,
                                     a.max_pages_per_seq));
  resolve_query_strides(kCall, {"q_stride_batch", &a.q_stride_batch}, {"q_stride_seq", &a.q_stride_seq},
                        {"q_stride_head", &a.q_stride_head}, a.n_heads, kMlaQkDim, a.q_len, 0);
  std::int64_t unused_head_stride = 0;
  resolve_kv_strides(kCall, {"kv_stride_page", &a.kv_stride_page}, {"kv_stride_token", &a.kv_stride_token},
                     {"kv_stride_head", &unused_head_stride}, 1, kMlaQkDim, a.page_size);
  resolve_query_strides(kCall, {"out_stride_batch", &a.out_stride_batch}, {"out_stride_seq", &a.out_stride_seq},
                        {"out_stride_head", &a.out_stride_head}, a.n_heads, kMlaVDim, a.q_len, a.batch);
  if (a.batch > 0) {
    require_pointer(kCall, "q", a.q, 16);
    require_pointer(kCall, "kv_cache", a.kv_cache, 16);
    require_pointer(kCall, "out", a.out, 16);
    require_index_table(kCall, "page_table", a.page_table);
    require_index_table(kCall, "seq_lens", a.seq_lens);
  }
  require_optional_alignment(kCall, "lse", a.lse, 4);
  if (a.kv_dtype != KvDType::same && a.kv_dtype != KvDType::e4m3 && a.kv_dtype != KvDType::e5m2)
    fail_argument(kCall, fmt::format("kv_dtype {} is not valid (allowed: same, e4m3, e5m2)", static_cast<int>(a.kv_dtype)));
  if (a.kv_dtype == KvDType::same) {
    if (a.kv_scale != nullptr)
      fail_argument(kCall, fmt::format("kv_scale = {} is set but kv_dtype is same (a scale belongs to an FP8 cache: "
                                       "kv_dtype e4m3 or e5m2)", static_cast<const void*>(a.kv_scale)));
  } else {
    require_pointer(kCall, "kv_scale", a.kv_scale, 4);
    for (const auto& [name, stride] : {std::pair{"kv_stride_page", a.kv_stride_page}, {"kv_stride_token", a.kv_stride_token}})
      if (stride % 16 != 0)
        fail_argument(kCall, fmt::format("{} {} is not a multiple of 16 elements (an FP8 cache's rows must stay "
                                         "16-byte aligned)", name, stride));
  }
  require_optional_alignment(kCall, "workspace", a.workspace, 16);
  if (a.workspace == nullptr && a.workspace_bytes != 0)
    fail_argument(kCall, fmt::format("workspace_bytes {} with a null workspace (allowed: 0)", a.workspace_bytes));
  return a;
}

MlaProblem mla_problem(const MlaDecodeArgs& a) {
  MlaProblem problem;
  problem.dtype = a.dtype;
  problem.batch = a.batch;
  problem.q_len = a.q_len;
  problem.n_heads = a.n_heads;
  problem.page_size = a.page_size;
  problem.capacity = 1LL * a.max_pages_per_seq * a.page_size;
  problem.kv_flags = a.kv_dtype == KvDType::e4m3 ? kFeatureKvE4m3 : a.kv_dtype == KvDType::e5m2 ? kFeatureKvE5m2 : 0u;
  problem.caller_workspace = a.workspace != nullptr;
  problem.workspace_bytes = a.workspace != nullptr ? a.workspace_bytes : 0;
  return problem;
}

}  // namespace detail

std::size_t mla_decode_workspace_bytes(const MlaDecodeArgs& input, int num_sms) {
  const MlaDecodeArgs args = detail::resolve_mla_decode_args(input);
  detail::DeviceTraits device;
  device.arch = "sm_80";  // the larger tiling has fewer row tiles, so more splits: the bound
  device.num_sms = num_sms;
  detail::MlaProblem problem = detail::mla_problem(args);
  problem.caller_workspace = false;
  problem.workspace_bytes = 0;
  return detail::plan_mla_decode(problem, device).workspace_bytes;
}

namespace detail {
namespace {

// The sm_90a kernel's TMA view of the latent cache: the paged decode's layout with one KV head,
// {576, 1, page_size, num_pages}, boxes of a page's rows (at most a block's) of one 64-column
// chunk; false when the driver refuses it (the call is then planned again without it).
bool mla_sm90_map(const Device& device, const MlaDecodeArgs& a, CUtensorMap* map) {
  using U = std::uint64_t;
  const std::array<U, 5> words{U(a.page_size), U(a.num_pages), reinterpret_cast<std::uintptr_t>(a.kv_cache),
                               U(a.kv_stride_token), U(a.kv_stride_page)};
  thread_local TensorMapMemo<5> memo;
  const TensorMaps& maps = memo.find_or_encode(
      words, "mla_decode", a.dtype == DType::fp16, device.ordinal(), CU_TENSOR_MAP_L2_PROMOTION_NONE, [&] {
        const auto box = static_cast<std::uint32_t>(std::min(a.page_size, kMlaSm90BlockN));
        return std::vector<NamedTensorMapShape>{
            {"kv_cache",
             {a.kv_cache, {U(kMlaQkDim), 1, U(a.page_size), U(a.num_pages)},
              {a.kv_stride_token, a.kv_stride_token, a.kv_stride_page}, {64, 1, box, 1}}}};
      });
  if (!maps.usable) return false;
  *map = maps.maps[0];
  return true;
}

}  // namespace
}  // namespace detail

void Runtime::mla_decode(const MlaDecodeArgs& input) {
  const MlaDecodeArgs args = detail::resolve_mla_decode_args(input);
  if (args.batch == 0) return;
  detail::Device& device = impl_->current_device();
  thread_local detail::PlanMemo<detail::MlaProblem> memo;
  detail::MlaProblem problem = detail::mla_problem(args);
  auto make = [&] { return detail::plan_mla_decode(problem, device.traits()); };
  const detail::Plan* planned = &memo.get(&device, problem, make);
  CUtensorMap map{};
  if (planned->spec.hopper && !detail::mla_sm90_map(device, args, &map)) {
    problem.tma_refused = true;
    planned = &memo.get(&device, problem, make);
  }
  const detail::Plan& plan = *planned;
  const detail::LoadedVariant& launched = impl_->planned_variant(device, plan);
  const CUstream stream = static_cast<CUstream>(args.stream);
  MlaDecodeParams params{};
  params.q = args.q;
  params.q_stride_batch = args.q_stride_batch;
  params.q_stride_seq = args.q_stride_seq;
  params.q_stride_head = args.q_stride_head;
  params.kv_cache = args.kv_cache;
  params.kv_stride_page = args.kv_stride_page;
  params.kv_stride_token = args.kv_stride_token;
  params.page_table = detail::index_pointer(args.page_table);
  params.page_table_stride = args.page_table_stride;
  params.seq_lens = detail::index_pointer(args.seq_lens);
  params.layout_bits = detail::index_layout_bits(args.page_table, nullptr, args.seq_lens, args.seq_lens_are_offsets);
  params.kv_capacity = static_cast<int>(problem.capacity);
  params.num_pages = args.num_pages;
  params.lse = args.lse;
  params.out = args.out;
  params.out_stride_batch = args.out_stride_batch;
  params.out_stride_seq = args.out_stride_seq;
  params.out_stride_head = args.out_stride_head;
  params.batch = args.batch;
  params.n_heads = args.n_heads;
  params.tokens_per_split = plan.split.tokens_per_split;
  params.scale_log2 = args.scale * detail::kLog2e;
  params.workspace.num_splits = plan.split.num_splits;
  params.kv_scale = args.kv_scale;
  if (plan.split_kv()) {
    const CUdeviceptr base = args.workspace != nullptr ? reinterpret_cast<CUdeviceptr>(args.workspace)
                                                       : device.workspace(stream, plan.workspace_bytes, "mla_decode");
    params.workspace = detail::split_workspace_at(
        base, plan.split.num_splits, static_cast<std::size_t>(args.batch) * args.n_heads * args.q_len, kMlaVDim);
  }
  detail::LaunchConfig attention{};
  attention.name = "cuLaunchKernel(mla_decode)";
  attention.grid = plan.grid;
  attention.block = static_cast<unsigned>(plan.block);
  attention.smem = static_cast<unsigned>(plan.smem);
  attention.stream = stream;
  attention.programmatic_dependent = true;
  if (plan.spec.hopper) {
    void* arguments[] = {&params, &map};
    device.launch(launched.functions[0], attention, arguments);
  } else {
    device.launch(launched.functions[0], attention, &params);
  }
  if (plan.split_kv())
    detail::launch_split_combine(device, launched.functions[1], params.workspace,
                                 {params.lse, params.out, params.out_stride_batch, params.out_stride_seq,
                                  params.out_stride_head, params.batch, params.n_heads, args.q_len,
                                  int{kMlaVDim}},
                                 stream, "cuLaunchKernel(mla_decode split_combine)");
}

}  // namespace astrai
