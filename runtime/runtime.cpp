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

std::vector<std::string> Runtime::loaded_variants() const { return impl_->devices.loaded_variant_names(); }

}  // namespace astrai
