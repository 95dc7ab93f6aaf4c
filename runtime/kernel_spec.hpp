// A compiled variant: which kernel family, with which compile-time constants, for which target.
// What each family accepts lives in its descriptor (runtime/kernel_family.hpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "astrai/runtime.hpp"
#include "runtime/kernel_family.hpp"

namespace astrai::detail {

const char* kernel_kind_name(KernelKind kind);
// Names accepted by `warm --kernels` and manifests, in KernelKind order.
const std::vector<std::string>& kernel_kind_names();
bool parse_kernel_kind(const std::string& text, KernelKind* kind);

struct KernelSpec {
  KernelKind kind = KernelKind::paged_decode;
  DType dtype = DType::bf16;
  int head_dim = 0;
  int page_size = 0;        // paged families only
  int group_size = 0;       // grouped (attention) families: query heads per KV head
  std::uint32_t flags = 0;  // family feature bits (KernelFamily::supported_flags)
  bool force_no_mma = false;  // ASTRAI_JIT_NO_MMA on an arch that has tensor cores
  bool hopper = false;        // the family's Hopper implementation (sm_90a only)
  bool wide = false;          // its wider tiling (HopperImplementation::has_wide)
  std::string arch;         // compile target with suffix: "sm_90a", "sm_89", "compute_120"

  const KernelFamily& family() const { return kernel_family(kind); }

  // Readable, unique, stable: "paged_decode.bf16.hd128.ps16.g4.sm_90a" (a field per feature,
  // ".cap", in kernel_features() order; ".nomma" when forced; the family's Hopper field for its
  // Hopper implementation: "prefill.bf16.hd128.g4.wgmma.sm_90a",
  // "paged_decode.bf16.hd128.ps16.g4.tma.sm_90a"; ".wide" after it for its wider tiling).
  std::string name() const;
  // Inverse of name(); throws astrai::InvalidArgument naming the text when it is malformed.
  static KernelSpec parse(const std::string& name);

  std::string main_file() const;                     // the kernel_src header holding the kernel
  std::vector<std::string> instantiations() const;   // name expressions NVRTC instantiates
  std::vector<std::string> compile_options() const;  // normalized NVRTC options
  bool uses_mma() const;                             // tensor-core path compiled in
  // Throws InvalidArgument when a field is outside what the family supports.
  void validate() const;
  // The `astrai-jit warm` command that compiles exactly this variant (the strict-mode hint).
  std::string warm_command() const;

  bool operator==(const KernelSpec& other) const { return name() == other.name(); }
};

// Arch number of a target string: "sm_90a" -> 90, "compute_89" -> 89; 0 if malformed.
int arch_number(const std::string& arch);

// True when `arch` with the no-MMA switch compiles the tensor-core path (sm_80 and newer).
bool target_uses_mma(const std::string& arch, bool force_no_mma);

// The Hopper counterpart of a portable spec, when its family has one that serves its shape,
// target (sm_90a, tensor cores on) and features.
bool hopper_serves(const KernelSpec& spec);

}  // namespace astrai::detail
