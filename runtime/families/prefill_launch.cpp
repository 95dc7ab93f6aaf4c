#include "runtime/families/prefill_launch.hpp"

#include <fmt/format.h>

namespace astrai::detail {

std::vector<std::string> prefill_instantiations(const KernelSpec& spec, int page_size) {
  return {fmt::format("astrai::prefill_kernel<{}, {}, {}, {}, {}>", device_type_name(spec.dtype),
                      spec.head_dim, page_size, spec.group_size, spec.flags)};
}

void launch_prefill(Runtime::Impl& impl, const KernelFamily& family, const char* launch_name, DType dtype,
                    int head_dim, int page_size, int max_q_len, const PrefillParams& params, void* stream) {
  Device& device = impl.current_device();
  KernelSpec spec;
  spec.kind = family.kind;
  spec.dtype = dtype;
  spec.head_dim = head_dim;
  spec.page_size = page_size;
  spec.group_size = params.n_heads / params.n_kv_heads;
  // The tensor-core and CUDA-core paths tile differently: which one runs on this device.
  const bool mma = device.uses_mma();
  const int smem = mma ? prefill_smem_bytes(head_dim) : prefill_core_smem_bytes(head_dim);
  const LoadedVariant& variant = impl.variant(device, spec, {kPrefillThreads, smem});
  const int block_q = mma ? prefill_block_q(head_dim) : kPrefillCoreBlockQ;
  const long long q_tiles = (static_cast<long long>(max_q_len) + block_q - 1) / block_q;
  PrefillParams launch_params = params;
  LaunchConfig config{};
  config.name = launch_name;
  config.grid = {static_cast<unsigned>(q_tiles), static_cast<unsigned>(params.n_heads),
                 static_cast<unsigned>(params.batch)};
  config.block = kPrefillThreads;
  config.smem = static_cast<unsigned>(smem);
  config.stream = static_cast<CUstream>(stream);
  device.launch(variant.functions[0], config, &launch_params);
}

}  // namespace astrai::detail
