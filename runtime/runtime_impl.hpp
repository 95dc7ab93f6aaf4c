// What every family's launch reaches through Runtime: the JIT engine and the devices.
#pragma once

#include "astrai/runtime.hpp"
#include "runtime/device.hpp"
#include "runtime/jit_engine.hpp"

namespace astrai {

struct Runtime::Impl {
  // Declared first, released last: the devices' variants were compiled by it.
  detail::JitEngine engine;
  detail::DeviceRegistry devices;

  explicit Impl(detail::EnvConfig config) : engine(std::move(config)) {}

  detail::Device& current_device() { return devices.current(engine); }
  const detail::LoadedVariant& variant(detail::Device& device, const detail::KernelSpec& spec,
                                       detail::KernelShape shape) {
    return device.variant(engine, spec, shape);
  }
  // The variant a plan runs. Under ASTRAI_JIT_STRICT a miss names the plan too (the
  // implementation and why the ones before it were passed over).
  const detail::LoadedVariant& planned_variant(detail::Device& device, const detail::Plan& plan) {
    try {
      return device.variant(engine, plan.spec, {plan.block, plan.smem});
    } catch (const CacheMissError& miss) {
      throw CacheMissError(std::string(miss.what()) + " (plan: " + plan.describe() + ")");
    }
  }
};

namespace detail {
constexpr float kLog2e = 1.4426950408889634f;
}  // namespace detail

}  // namespace astrai
