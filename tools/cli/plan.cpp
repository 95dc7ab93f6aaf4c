// `astrai-jit plan`: how the runtime would run a call on a target, from the same Plan the
// runtime executes (runtime/plan/): the implementation, the variant, grid, block, shared memory,
// split-KV plan, and why faster implementations were passed over. No GPU needed: the SM count
// and the portable decode's occupancy are modeled where no device answers.
#include "tools/cli/cli.hpp"

#include "kernel_src/hopper_params.h"
#include "runtime/families/attention_features.hpp"
#include "runtime/plan/attention_plan.hpp"
#include "runtime/plan/implementations.hpp"
#include "runtime/plan/mla_plan.hpp"

namespace astrai::cli {

namespace {

// The SMs of the first local GPU with this target, else a typical count for it.
int target_sms(const JitEngine& engine, const std::string& arch) {
  std::string why;
  if (astrai::detail::driver_available(&why)) {
    try {
      const auto& api = astrai::detail::driver();
      int count = 0;
      astrai::detail::check_cu(api.cuDeviceGetCount(&count), "cuDeviceGetCount", -1);
      for (int ordinal = 0; ordinal < count; ++ordinal) {
        CUdevice device = 0;
        astrai::detail::check_cu(api.cuDeviceGet(&device, ordinal), "cuDeviceGet", ordinal);
        const int major = device_attribute(device, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, ordinal);
        const int minor = device_attribute(device, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, ordinal);
        if (engine.target_for_device(major, minor) == arch)
          return device_attribute(device, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, ordinal);
      }
    } catch (const astrai::Error&) {
    }
  }
  return astrai::detail::arch_number(arch) >= 90 ? 132 : 108;  // H100/H200 SXM, A100
}

std::uint32_t feature_flags(const std::vector<std::string>& names, KernelKind kind) {
  std::uint32_t flags = 0;
  for (const std::string& raw : names) {
    const std::string name = trim(raw);
    const auto* feature = astrai::detail::find_kernel_feature(name);
    if (feature == nullptr || feature->field != 0)
      throw astrai::InvalidArgument(fmt::format(
          "--features '{}' is not a serving option (allowed: {})", raw,
          astrai::detail::supported_feature_names(astrai::detail::attention_option_flags(kind))));
    if ((astrai::detail::kernel_family(kind).supported_flags & feature->bit) == 0)
      throw astrai::InvalidArgument(fmt::format(
          "--features '{}' is not served by {} (its options: {})", raw, astrai::detail::kernel_kind_name(kind),
          astrai::detail::supported_feature_names(astrai::detail::attention_option_flags(kind))));
    flags |= feature->bit;
  }
  const std::string conflict = astrai::detail::feature_conflict(flags);
  if (!conflict.empty()) throw astrai::InvalidArgument("--features: " + conflict);
  return flags;
}

void print_plan(const astrai::detail::Plan& plan, const astrai::detail::DeviceTraits& device, bool modeled_sms) {
  fmt::print("target: {}, {} SMs{}\n", device.arch, device.num_sms, modeled_sms ? " (from the target)" : "");
  fmt::print("implementation: {}\n", plan.implementation->name);
  fmt::print("variant: {}\n", plan.spec.name());
  fmt::print("launch: grid {}x{}x{}, block {}, shared memory {} bytes{}\n", plan.grid.x, plan.grid.y, plan.grid.z,
             plan.block, plan.smem, plan.persistent ? ", persistent CTAs" : "");
}

// MLA decode's own plan: heads, q_len, page size, the table's tokens (--kv-len), the workspace.
int run_mla_plan(const PlanOptions& options, const astrai::detail::DeviceTraits& device) {
  if (!options.features.empty() || options.window >= 0 || options.mask)
    throw astrai::InvalidArgument("plan mla_decode: --features, --window and --mask are not MLA options");
  astrai::detail::MlaProblem problem;
  problem.dtype = options.dtype == "fp16" ? DType::fp16 : DType::bf16;
  problem.batch = options.batch;
  problem.q_len = std::max(options.q_len, 1);
  if (problem.q_len > astrai::kMaxDecodeQLen)
    throw astrai::InvalidArgument(fmt::format("--q-len {} is not valid (allowed: 1..{})", problem.q_len,
                                              int{astrai::kMaxDecodeQLen}));
  problem.n_heads = options.heads;
  problem.page_size = options.page_size;
  problem.capacity = options.kv_len;
  problem.caller_workspace = options.workspace >= 0;
  problem.workspace_bytes = options.workspace >= 0 ? static_cast<std::size_t>(options.workspace) : 0;
  const astrai::detail::Plan plan = astrai::detail::plan_mla_decode(problem, device);
  print_plan(plan, device, options.sms <= 0);
  const auto tiling = astrai::detail::mla_tiling(device.arch, problem.n_heads, problem.q_len);
  fmt::print("tiling: {} query rows a CTA, blocks of {} keys\n",
             plan.spec.hopper ? int{astrai::kMlaSm90Rows} : tiling.rows(), plan.block_n);
  fmt::print("split-KV: {} split{} of {} tokens, workspace {} bytes\n", plan.split.num_splits,
             plan.split.num_splits == 1 ? "" : "s", plan.split.tokens_per_split, plan.workspace_bytes);
  for (int i = 0; i < plan.passed_over_count; ++i)
    fmt::print("passed over: {}: {}\n", plan.passed_over[i].implementation->name, plan.passed_over[i].reason);
  fmt::print("warm it with: {}\n", plan.spec.warm_command());
  return kExitOk;
}

}  // namespace

int run_plan(const EnvConfig& config, const PlanOptions& options) {
  KernelKind kind;
  const bool known = astrai::detail::parse_kernel_kind(options.kind, &kind);
  if (!known || (!astrai::detail::is_attention_kind(kind) && kind != KernelKind::mla_decode))
    throw astrai::InvalidArgument(fmt::format(
        "plan: '{}' is not an attention call (allowed: paged_decode, decode, prefill, paged_prefill, mla_decode)",
        options.kind));
  EnvConfig engine_config = config;
  engine_config.cache_mode = CacheMode::off;
  const JitEngine engine(engine_config);
  astrai::detail::DeviceTraits device;
  device.arch = resolve_archs({options.arch}, engine, false).front();
  device.num_sms = options.sms > 0 ? options.sms : target_sms(engine, device.arch);
  device.force_no_mma = config.no_mma && astrai::detail::arch_number(device.arch) >= 80;
  device.no_hopper = config.no_wgmma;
  device.decode_tiles = config.decode_tiles;
  device.prefill_tiles = config.prefill_tiles;
  if (kind == KernelKind::mla_decode) return run_mla_plan(options, device);

  const bool paged = kind == KernelKind::paged_decode || kind == KernelKind::paged_prefill;
  astrai::detail::AttentionProblem problem;
  problem.kind = kind;
  problem.dtype = options.dtype == "fp16" ? DType::fp16 : DType::bf16;
  problem.head_dim = options.head_dim;
  problem.page_size = paged ? options.page_size : 0;
  problem.batch = options.batch;
  problem.n_heads = options.heads;
  problem.n_kv_heads = options.kv_heads > 0 ? options.kv_heads : options.heads;
  if (problem.n_heads % problem.n_kv_heads != 0)
    throw astrai::InvalidArgument(fmt::format("--heads {} is not a multiple of --kv-heads {}", problem.n_heads,
                                              problem.n_kv_heads));
  problem.flags = feature_flags(options.features, kind);
  if (options.window >= 0) problem.flags |= astrai::kFeatureWindow;
  problem.masked = options.mask;
  if (astrai::detail::is_decode_kind(kind)) {
    const int q_len = std::max(options.q_len, 1);
    if (q_len > 1 && kind != KernelKind::paged_decode)
      throw astrai::InvalidArgument("--q-len above 1 needs paged_decode (multi-token decode)");
    if (q_len > astrai::kMaxDecodeQLen)
      throw astrai::InvalidArgument(fmt::format("--q-len {} is not valid (allowed: 1..{})", q_len,
                                                int{astrai::kMaxDecodeQLen}));
    problem.flags |= astrai::decode_q_len_flags(q_len);
    problem.span = astrai::detail::decode_span_tokens(options.kv_len, options.window, q_len);
    problem.caller_workspace = options.workspace >= 0;
    problem.workspace_bytes = options.workspace >= 0 ? static_cast<std::size_t>(options.workspace) : 0;
  } else {
    problem.max_q_len = options.q_len > 0 ? options.q_len : options.kv_len;
    problem.total_q = 1LL * problem.max_q_len * problem.batch;
  }
  const astrai::detail::Plan plan = astrai::detail::plan_attention(problem, device, nullptr);
  print_plan(plan, device, options.sms <= 0);
  if (plan.spec.wide && astrai::detail::is_decode_kind(kind))
    fmt::print("split-KV: {} splits of {} tokens side by side in each wide CTA, merged there (no workspace)\n",
               astrai::kDecodeSm90WideSplits, plan.split.tokens_per_split);
  else if (astrai::detail::is_decode_kind(kind))
    fmt::print("split-KV: {} split{} of {} tokens, workspace {} bytes{}\n", plan.split.num_splits,
               plan.split.num_splits == 1 ? "" : "s", plan.split.tokens_per_split, plan.workspace_bytes,
               plan.implementation->hopper ? "" : " (occupancy modeled from shared memory; the runtime asks the driver)");
  for (int i = 0; i < plan.passed_over_count; ++i)
    fmt::print("passed over: {}: {}\n", plan.passed_over[i].implementation->name, plan.passed_over[i].reason);
  fmt::print("warm it with: {}\n", plan.spec.warm_command());
  return kExitOk;
}

}  // namespace astrai::cli
