// merge_states: attention states merged by their LSEs (kernel_src/merge_states.cuh).
// Descriptor, argument checks and launch.
#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include <fmt/format.h>

#include "kernel_src/kernel_params.h"
#include "runtime/families/arg_checks.hpp"
#include "runtime/launch_heuristics.hpp"
#include "runtime/runtime_impl.hpp"
#include "runtime/validation.hpp"

namespace astrai {

namespace detail {

const KernelFamily& merge_states_family() {
  static const KernelFamily family{
      KernelKind::merge_states,
      "merge_states",
      /*paged=*/false,
      /*grouped=*/false,
      /*warm_by_default=*/false,
      "merge_states.cuh",
      [](const KernelSpec& spec) -> std::vector<std::string> {
        const char* type = device_type_name(spec.dtype);
        return {fmt::format("astrai::merge_states_kernel<{}, {}>", type, spec.head_dim),
                fmt::format("astrai::cascade_chunks_kernel<{}, {}>", type, spec.head_dim)};
      },
      /*limits=*/{{8, 1024, 8}, 0, 0},
      /*supported_flags=*/0,
      // The attention head dims of the warm defaults and MLA's 512-wide latent rows.
      /*warm=*/{{{64, 0}, {128, 0}, {512, 0}}, {64, 128, 512}, {}, {}},
  };
  return family;
}

namespace {

constexpr const char* kMergeCall = "merge_states";

// A dimension of extent 1 is never stepped over: its stride takes the contiguous value, so a
// caller's arbitrary stride there (PyTorch keeps one) is not checked.
void resolve_stride(std::int64_t* stride, std::int64_t extent, std::int64_t contiguous) {
  if (*stride == 0 || extent <= 1) *stride = contiguous;
}

void resolve_source(const char* name, MergeStatesSource& s, const MergeStatesArgs& a, bool optional) {
  const std::string prefix(name);
  if (optional ? s.states < 0 : s.states < 1)
    fail_argument(kMergeCall, fmt::format("{}.states {} is not valid (allowed: {})", name, s.states,
                                          optional ? ">= 0, 0 for no second source" : ">= 1"));
  if (s.states == 0) {
    s = MergeStatesSource{};
    s.states = 0;
    return;
  }
  const std::int64_t d = a.head_dim;
  resolve_stride(&s.v_stride_head, a.n_heads, d);
  resolve_stride(&s.v_stride_state, s.states, a.n_heads * s.v_stride_head);
  resolve_stride(&s.v_stride_row, a.rows, s.states * s.v_stride_state);
  resolve_stride(&s.lse_stride_head, a.n_heads, 1);
  resolve_stride(&s.lse_stride_state, s.states, a.n_heads * s.lse_stride_head);
  resolve_stride(&s.lse_stride_row, a.rows, s.states * s.lse_stride_state);
  require_stride(kMergeCall, (prefix + ".v_stride_head").c_str(), s.v_stride_head, d, false);
  require_stride(kMergeCall, (prefix + ".v_stride_state").c_str(), s.v_stride_state, d, false);
  require_stride(kMergeCall, (prefix + ".v_stride_row").c_str(), s.v_stride_row, d, false);
  require_positive(kMergeCall, (prefix + ".lse_stride_head").c_str(), s.lse_stride_head);
  require_positive(kMergeCall, (prefix + ".lse_stride_state").c_str(), s.lse_stride_state);
  require_positive(kMergeCall, (prefix + ".lse_stride_row").c_str(), s.lse_stride_row);
  if (1LL * a.rows * a.n_heads > 0) {
    require_pointer(kMergeCall, (prefix + ".v").c_str(), s.v, 16);
    require_pointer(kMergeCall, (prefix + ".lse").c_str(), s.lse, 4);
  }
}

ByteSpan values_span(const MergeStatesSource& s, const MergeStatesArgs& a) {
  return byte_span(s.v, 2, a.head_dim,
                 {{a.rows, s.v_stride_row}, {s.states, s.v_stride_state}, {a.n_heads, s.v_stride_head}});
}

ByteSpan lse_span(const MergeStatesSource& s, const MergeStatesArgs& a) {
  return byte_span(s.lse, 4, 1,
                 {{a.rows, s.lse_stride_row}, {s.states, s.lse_stride_state}, {a.n_heads, s.lse_stride_head}});
}

// An output may be the very tensor of a source's single state (in place); otherwise it must not
// overlap any input, or a CTA could read what another has written.
void require_apart(const char* output, const ByteSpan& out, const void* out_data, std::int64_t out_row,
                   std::int64_t out_head, const char* input, const MergeStatesSource& s, const ByteSpan& in,
                   const void* in_data, std::int64_t in_row, std::int64_t in_head) {
  if (s.states == 0 || !out.overlaps(in)) return;
  if (s.states == 1 && out_data == in_data && out_row == in_row && out_head == in_head) return;
  fail_argument(kMergeCall, fmt::format("{} overlaps {} (allowed: {} is {} itself when that source has one "
                                        "state and the same strides, in place, or apart from it)",
                                        output, input, output, input));
}

}  // namespace

MergeStatesArgs resolve_merge_states_args(const MergeStatesArgs& input) {
  const KernelFamily& family = merge_states_family();
  MergeStatesArgs a = input;
  require_dtype(kMergeCall, a.dtype);
  require_non_negative(kMergeCall, "rows", a.rows);
  require_positive(kMergeCall, "n_heads", a.n_heads);
  if (!family.limits.head_dim.contains(a.head_dim))
    fail_argument(kMergeCall, fmt::format("head_dim {} is not supported (allowed: {})", a.head_dim,
                                          family.limits.head_dim.allowed()));
  resolve_source("a", a.a, a, false);
  resolve_source("b", a.b, a, true);
  const std::int64_t d = a.head_dim;
  resolve_stride(&a.out_stride_head, a.n_heads, d);
  resolve_stride(&a.out_stride_row, a.rows, a.n_heads * a.out_stride_head);
  require_stride(kMergeCall, "out_stride_head", a.out_stride_head, d, false);
  require_stride(kMergeCall, "out_stride_row", a.out_stride_row, d, false);
  require_disjoint_rows(kMergeCall, d, {{"out_stride_row", a.out_stride_row, a.rows},
                                        {"out_stride_head", a.out_stride_head, a.n_heads}});
  resolve_stride(&a.lse_stride_head, a.n_heads, 1);
  resolve_stride(&a.lse_stride_row, a.rows, a.n_heads * a.lse_stride_head);
  if (a.lse != nullptr) {
    require_positive(kMergeCall, "lse_stride_head", a.lse_stride_head);
    require_positive(kMergeCall, "lse_stride_row", a.lse_stride_row);
    require_disjoint_rows(kMergeCall, 1, {{"lse_stride_row", a.lse_stride_row, a.rows},
                                          {"lse_stride_head", a.lse_stride_head, a.n_heads}});
  }
  if (1LL * a.rows * a.n_heads == 0) return a;
  require_pointer(kMergeCall, "out", a.out, 16);
  require_optional_alignment(kMergeCall, "lse", a.lse, 4);

  const ByteSpan out = byte_span(a.out, 2, d, {{a.rows, a.out_stride_row}, {a.n_heads, a.out_stride_head}});
  const ByteSpan lse =
      a.lse == nullptr ? ByteSpan{} : byte_span(a.lse, 4, 1, {{a.rows, a.lse_stride_row}, {a.n_heads, a.lse_stride_head}});
  const MergeStatesSource* sources[] = {&a.a, &a.b};
  const char* values_names[] = {"a.v", "b.v"};
  const char* lse_names[] = {"a.lse", "b.lse"};
  for (int i = 0; i < 2; ++i) {
    const MergeStatesSource& s = *sources[i];
    if (s.states == 0) continue;
    const ByteSpan v = values_span(s, a);
    const ByteSpan s_lse = lse_span(s, a);
    require_apart("out", out, a.out, a.out_stride_row, a.out_stride_head, values_names[i], s, v, s.v, s.v_stride_row,
                  s.v_stride_head);
    // Apart from the other kind's tensors: no state is both.
    if (out.overlaps(s_lse))
      fail_argument(kMergeCall, fmt::format("out overlaps {} (allowed: apart from it)", lse_names[i]));
    if (a.lse == nullptr) continue;
    require_apart("lse", lse, a.lse, a.lse_stride_row, a.lse_stride_head, lse_names[i], s, s_lse, s.lse,
                  s.lse_stride_row, s.lse_stride_head);
    if (lse.overlaps(v))
      fail_argument(kMergeCall, fmt::format("lse overlaps {} (allowed: apart from it)", values_names[i]));
  }
  if (a.lse != nullptr && out.overlaps(lse)) fail_argument(kMergeCall, "out overlaps lse (allowed: apart from it)");
  return a;
}

}  // namespace detail

void Runtime::merge_states(const MergeStatesArgs& input) {
  const MergeStatesArgs args = detail::resolve_merge_states_args(input);
  const long long items = 1LL * args.rows * args.n_heads;
  if (items == 0) return;
  detail::Device& device = impl_->current_device();
  detail::KernelSpec spec;
  spec.kind = detail::KernelKind::merge_states;
  spec.dtype = args.dtype;
  spec.head_dim = args.head_dim;
  const auto& variant = impl_->variant(device, spec, {kMergeStatesThreads, 0});
  MergeStatesParams params{};
  const MergeStatesSource* sources[] = {&args.a, &args.b};
  MergeSourceParams* targets[] = {&params.a, &params.b};
  for (int i = 0; i < 2; ++i) {
    const MergeStatesSource& s = *sources[i];
    MergeSourceParams& t = *targets[i];
    t.v = s.v;
    t.lse = s.lse;
    t.v_stride_row = s.v_stride_row;
    t.v_stride_state = s.v_stride_state;
    t.v_stride_head = s.v_stride_head;
    t.lse_stride_row = s.lse_stride_row;
    t.lse_stride_state = s.lse_stride_state;
    t.lse_stride_head = s.lse_stride_head;
    t.states = s.states;
  }
  params.out = args.out;
  params.out_stride_row = args.out_stride_row;
  params.out_stride_head = args.out_stride_head;
  params.lse = args.lse;
  params.lse_stride_row = args.lse_stride_row;
  params.lse_stride_head = args.lse_stride_head;
  params.rows = args.rows;
  params.n_heads = args.n_heads;
  detail::LaunchConfig config{};
  config.name = "cuLaunchKernel(merge_states)";
  config.grid = {static_cast<unsigned>(detail::merge_states_grid_size(items, args.head_dim, device.num_sms())), 1, 1};
  config.block = kMergeStatesThreads;
  config.smem = 0;
  config.stream = static_cast<CUstream>(args.stream);
  device.launch(variant.functions[0], config, &params);
}

}  // namespace astrai
