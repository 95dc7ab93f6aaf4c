// astrai::Runtime: the process-wide runtime. The calls themselves (argument checks and
// launches) live with their families in runtime/families/.
#include "astrai/runtime.hpp"

#include "base/logging.hpp"
#include "runtime/validation.hpp"
#include "runtime/runtime_impl.hpp"

namespace astrai {

void validate_args(const PagedDecodeArgs& args) { detail::resolve_paged_decode_args(args); }
void validate_args(const DecodeArgs& args) { detail::resolve_decode_args(args); }
void validate_args(const PrefillArgs& args) { detail::resolve_prefill_args(args); }
void validate_args(const PagedPrefillArgs& args) { detail::resolve_paged_prefill_args(args); }
void validate_args(const RotaryArgs& args) { detail::resolve_rotary_args(args); }
void validate_args(const MergeStatesArgs& args) { detail::resolve_merge_states_args(args); }
void validate_args(const MlaDecodeArgs& args) { detail::resolve_mla_decode_args(args); }
void validate_args(const CascadeArgs& args) { detail::resolve_cascade_args(args); }

Runtime& Runtime::get() {
  static Runtime runtime;
  return runtime;
}

Runtime::Runtime() {
  detail::EnvConfig config = detail::load_env_config_from_process();
  detail::Logger::instance().set_level(config.log_level);
  detail::warn_unknown_env_variables(config);
  impl_ = std::make_unique<Impl>(std::move(config));
}

Runtime::~Runtime() = default;

std::vector<std::string> Runtime::loaded_variants() const { return impl_->devices.loaded_variant_names(); }

}  // namespace astrai
