// The device layer: per-device state, handles that release what they own, the split-KV
// workspace pool and one launch entry point. Everything a family's launch needs from a GPU.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/driver_api.hpp"
#include "runtime/kernel_spec.hpp"
#include "runtime/plan/attention_plan.hpp"

namespace astrai::detail {

class JitEngine;

// Makes `context` current on this thread for the guard's lifetime.
class ScopedContext {
 public:
  ScopedContext(CUcontext context, int ordinal);
  ~ScopedContext();
  ScopedContext(const ScopedContext&) = delete;
  ScopedContext& operator=(const ScopedContext&) = delete;
};

// A device's primary context, retained for the handle's lifetime.
class PrimaryContext {
 public:
  PrimaryContext(CUdevice device, int ordinal);
  ~PrimaryContext();
  PrimaryContext(const PrimaryContext&) = delete;
  PrimaryContext& operator=(const PrimaryContext&) = delete;
  CUcontext get() const { return context_; }

 private:
  CUdevice device_;
  CUcontext context_ = nullptr;
};

// A loaded module, unloaded in its context when the handle goes away.
class ModuleHandle {
 public:
  ModuleHandle(CUcontext context, const void* image, const std::string& variant, int ordinal);
  ~ModuleHandle();
  ModuleHandle(const ModuleHandle&) = delete;
  ModuleHandle& operator=(const ModuleHandle&) = delete;
  CUmodule get() const { return module_; }

 private:
  CUcontext context_;
  CUmodule module_ = nullptr;
};

// Device memory, freed in its context when the handle goes away.
class DeviceAllocation {
 public:
  DeviceAllocation(CUcontext context, std::size_t bytes, int ordinal);
  ~DeviceAllocation();
  DeviceAllocation(const DeviceAllocation&) = delete;
  DeviceAllocation& operator=(const DeviceAllocation&) = delete;
  CUdeviceptr get() const { return pointer_; }
  std::size_t bytes() const { return bytes_; }

 private:
  CUcontext context_;
  CUdeviceptr pointer_ = 0;
  std::size_t bytes_;
};

struct LaunchConfig {
  const char* name;  // what a failed launch is reported as
  GridSize grid;
  unsigned block;    // threads per CTA (x only)
  unsigned smem;     // dynamic shared memory bytes
  CUstream stream;
  // May start before the previous kernel on the stream finishes, where the device supports
  // programmatic dependent launch; the kernel must wait for it (griddepcontrol.wait).
  bool programmatic_dependent = false;
};

// Launches `function` with its argument array, as a programmatic dependent launch where
// config.programmatic_dependent says so (the caller has checked that the device and driver
// support one). Device::launch and the bench's launch floor both go through here, so the floor
// times the runtime's own launch.
void launch_kernel(CUfunction function, const LaunchConfig& config, void** arguments, int ordinal);

// How the first kernel of a variant is launched, for its attributes and the occupancy query.
struct KernelShape {
  int threads = 128;
  int dynamic_smem = 0;
};

struct LoadedVariant {
  LoadedVariant(CUcontext context, const void* image, std::string variant_name, int ordinal)
      : name(std::move(variant_name)), module(context, image, name, ordinal) {}
  std::string name;
  int resident_ctas = 0;  // CTAs of the first kernel the device runs at once
  ModuleHandle module;
  std::array<CUfunction, 2> functions{};  // main kernel, then helpers (the split combine)
};

// One workspace per stream, grown geometrically and never during graph capture. Outgrown
// buffers stay allocated: a graph captured earlier may still point at them.
class WorkspacePool {
 public:
  WorkspacePool(CUcontext context, int ordinal) : context_(context), ordinal_(ordinal) {}
  CUdeviceptr acquire(CUstream stream, std::size_t bytes, const char* call);

 private:
  CUcontext context_;
  int ordinal_;
  std::shared_mutex mutex_;
  std::unordered_map<CUstream, std::unique_ptr<DeviceAllocation>> current_;
  std::vector<std::unique_ptr<DeviceAllocation>> retired_;
};

class Device {
 public:
  Device(int ordinal, const JitEngine& engine);
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  int ordinal() const { return ordinal_; }
  // What a plan needs of this device (runtime/plan/attention_plan.hpp), and the accessors to it.
  const DeviceTraits& traits() const { return traits_; }
  int num_sms() const { return traits_.num_sms; }
  const std::string& arch() const { return traits_.arch; }
  bool force_no_mma() const { return traits_.force_no_mma; }
  bool uses_mma() const { return traits_.uses_mma(); }
  // Hopper implementations allowed: an sm_90a target, tensor cores on, no ASTRAI_JIT_NO_WGMMA.
  bool uses_wgmma() const { return traits_.uses_hopper(); }
  CUcontext context() const { return primary_.get(); }

  // The variant `spec` names on this device (its arch and no-MMA fields are filled from the
  // device). Hot path: a shared lock and a hash lookup; cold path: JIT and module load.
  const LoadedVariant& variant(JitEngine& engine, const KernelSpec& spec, KernelShape shape);
  CUdeviceptr workspace(CUstream stream, std::size_t bytes, const char* call) {
    return workspaces_.acquire(stream, bytes, call);
  }
  void launch(CUfunction function, const LaunchConfig& config, void* params) const;  // one parameter
  void launch(CUfunction function, const LaunchConfig& config, void** arguments) const;  // several
  void append_variant_names(std::vector<std::string>* names) const;

 private:
  // Declaration order is release order reversed: variants and workspaces go before the
  // primary context they live in.
  int ordinal_;
  CUdevice device_ = 0;
  DeviceTraits traits_;  // the target, SM count and the switches that steer the plans
  // Hopper and newer with a driver that captures it in graphs (12.3+).
  bool programmatic_launch_ = false;
  PrimaryContext primary_;
  WorkspacePool workspaces_;
  mutable std::shared_mutex variants_mutex_;
  std::unordered_map<std::uint64_t, std::unique_ptr<LoadedVariant>> variants_;
};

// Devices as they are first used.
class DeviceRegistry {
 public:
  // The device of the calling thread's current context (device 0's primary context if none).
  Device& current(const JitEngine& engine);
  Device& at(int ordinal, const JitEngine& engine);
  std::vector<std::string> loaded_variant_names() const;

 private:
  static constexpr int kMaxDevices = 64;
  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<Device>> devices_;  // guarded by mutex_
  // Lock-free view of the devices already set up, for the hot path.
  std::array<std::atomic<Device*>, kMaxDevices> ready_{};
};

}  // namespace astrai::detail
