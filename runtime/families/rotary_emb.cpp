// rotary_emb: rotary embedding over interleaved pairs (kernel_src/rotary_emb.cuh).
// Descriptor, argument checks and launch.
#include <fmt/format.h>

#include "kernel_src/kernel_params.h"
#include "runtime/families/arg_checks.hpp"
#include "runtime/launch_heuristics.hpp"
#include "runtime/runtime_impl.hpp"
#include "runtime/validation.hpp"

namespace astrai {

namespace detail {

const KernelFamily& rotary_emb_family() {
  static const KernelFamily family{
      KernelKind::rotary_emb,
      "rotary_emb",
      /*paged=*/false,
      /*grouped=*/false,
      /*warm_by_default=*/true,
      "rotary_emb.cuh",
      [](const KernelSpec& spec) -> std::vector<std::string> {
        return {fmt::format("astrai::rotary_emb_kernel<{}, {}>", device_type_name(spec.dtype), spec.head_dim)};
      },
      /*limits=*/{{8, 512, 8}, 0, 0},
      /*supported_flags=*/0,
      /*warm=*/{{{64, 0}, {128, 0}}, {64, 128}, {}, {}},
  };
  return family;
}

RotaryArgs resolve_rotary_args(const RotaryArgs& input) {
  const KernelFamily& family = rotary_emb_family();
  const char* kCall = family.name;
  RotaryArgs a = input;
  require_dtype(kCall, a.dtype);
  if (a.batch < 0) fail_argument(kCall, fmt::format("batch {} is not valid (allowed: >= 0)", a.batch));
  if (a.seq_len < 0) fail_argument(kCall, fmt::format("seq_len {} is not valid (allowed: >= 0)", a.seq_len));
  require_positive(kCall, "n_heads", a.n_heads);
  if (!family.limits.head_dim.contains(a.head_dim))
    fail_argument(kCall, fmt::format("head_dim {} is not supported (allowed: {})", a.head_dim,
                                     family.limits.head_dim.allowed()));
  const std::int64_t d = a.head_dim;
  if (a.x_stride_head == 0) a.x_stride_head = d;
  if (a.x_stride_seq == 0) a.x_stride_seq = a.n_heads * a.x_stride_head;
  if (a.x_stride_batch == 0) a.x_stride_batch = static_cast<std::int64_t>(a.seq_len) * a.x_stride_seq;
  if (a.out_stride_head == 0) a.out_stride_head = d;
  if (a.out_stride_seq == 0) a.out_stride_seq = a.n_heads * a.out_stride_head;
  if (a.out_stride_batch == 0) a.out_stride_batch = static_cast<std::int64_t>(a.seq_len) * a.out_stride_seq;
  if (a.freqs_stride_seq == 0) a.freqs_stride_seq = d;
  if (a.freqs_stride_batch == -1) a.freqs_stride_batch = static_cast<std::int64_t>(a.seq_len) * a.freqs_stride_seq;
  if (a.x_stride_batch == 0) a.x_stride_batch = 8;  // seq_len 0: nothing is read
  if (a.out_stride_batch == 0) a.out_stride_batch = 8;

  require_stride(kCall, "x_stride_head", a.x_stride_head, d, a.n_heads > 1);
  require_stride(kCall, "x_stride_seq", a.x_stride_seq, 1, false);
  require_stride(kCall, "x_stride_batch", a.x_stride_batch, 1, false);
  require_stride(kCall, "out_stride_head", a.out_stride_head, d, a.n_heads > 1);
  require_stride(kCall, "out_stride_seq", a.out_stride_seq, (a.n_heads - 1) * a.out_stride_head + d,
                 a.seq_len > 1);
  require_stride(kCall, "out_stride_batch", a.out_stride_batch, 1, false);
  if (a.freqs_stride_seq < d || a.freqs_stride_seq % 4 != 0)
    fail_argument(kCall, fmt::format("freqs_stride_seq {} is not valid (allowed: a multiple of 4 floats, "
                                     ">= head_dim {})", a.freqs_stride_seq, d));
  if (a.freqs_stride_batch < 0 || a.freqs_stride_batch % 4 != 0)
    fail_argument(kCall, fmt::format("freqs_stride_batch {} is not valid (allowed: 0 to share, -1 for "
                                     "contiguous, or a non-negative multiple of 4 floats)",
                                     a.freqs_stride_batch));
  if (1LL * a.batch * a.seq_len > 0) {
    require_pointer(kCall, "x", a.x, 16);
    require_pointer(kCall, "out", a.out, 16);
    require_pointer(kCall, "freqs", a.freqs, 16);
  }
  return a;
}

}  // namespace detail

void Runtime::rotary_emb(const RotaryArgs& input) {
  const RotaryArgs args = detail::resolve_rotary_args(input);
  const long long vectors = 1LL * args.batch * args.seq_len * args.n_heads * (args.head_dim / 8);
  if (vectors == 0) return;
  detail::Device& device = impl_->current_device();
  detail::KernelSpec spec;
  spec.kind = detail::KernelKind::rotary_emb;
  spec.dtype = args.dtype;
  spec.head_dim = args.head_dim;
  const auto& variant = impl_->variant(device, spec, {256, 0});
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
  detail::LaunchConfig config{};
  config.name = "cuLaunchKernel(rotary_emb)";
  config.grid = {static_cast<unsigned>(detail::rotary_grid_size(vectors, device.num_sms())), 1, 1};
  config.block = 256;
  config.smem = 0;
  config.stream = static_cast<CUstream>(args.stream);
  device.launch(variant.functions[0], config, &params);
}

}  // namespace astrai
