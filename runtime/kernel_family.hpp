// What one kernel family is, in one place: the fields of its variant names, its template and
// instantiation, its limits and the shapes `astrai-jit warm` compiles by default. The spec
// parser and printer, the CLI, the strict-mode hint and the argument checks all read these
// descriptors; each family defines its own in runtime/families/<family>.cpp, beside its
// argument checks and its launch.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "astrai/runtime.hpp"

namespace astrai::detail {

// The order is the one `warm` compiles and lists families in.
enum class KernelKind { paged_decode, rotary_emb, decode, prefill, paged_prefill, merge_states, mla_decode };
// The decode kinds: one query row per head (or a few), their own tilings (ASTRAI_JIT_DECODE_TILES).
constexpr bool is_decode_kind(KernelKind kind) {
  return kind == KernelKind::paged_decode || kind == KernelKind::decode;
}

// The attention kinds: the ones plan_attention decides (runtime/plan/); the others have one
// kernel, or a plan of their own (mla_decode: runtime/plan/mla_plan.hpp).
constexpr bool is_attention_kind(KernelKind kind) {
  return kind != KernelKind::rotary_emb && kind != KernelKind::merge_states && kind != KernelKind::mla_decode;
}

struct KernelSpec;

// Values min..max in steps of `step` (min itself a multiple of step).
struct SteppedRange {
  int min = 0;
  int max = 0;
  int step = 1;
  bool contains(int value) const { return value >= min && value <= max && value % step == 0; }
  std::string allowed() const;  // "32..256, step 16"
};

struct FamilyLimits {
  SteppedRange head_dim;
  int max_page_size = 0;  // paged families: a power of two in 1..max_page_size
  int max_group = 0;      // grouped families: query heads per KV head in 1..max_group

  bool page_size_ok(long long page_size) const;
  std::string page_size_allowed() const;  // "a power of two in 1..256"
  bool group_ok(long long group) const { return group >= 1 && group <= max_group; }
  std::string group_allowed() const;      // "1..128"
};

// What `astrai-jit warm` compiles for a family when no shape flag says otherwise.
struct WarmDefaults {
  std::vector<std::pair<int, int>> shapes;  // (head_dim, group) with no --head-dims/--group-sizes
  std::vector<int> head_dims;               // with --group-sizes only
  std::vector<int> groups;                  // with --head-dims only
  std::vector<int> page_sizes;              // paged families, without --page-sizes
};

// A family's Hopper (sm_90a) implementation: TMA (and wgmma) kernels in their own header,
// compiled as "<...>.<name_field>.sm_90a" variants ("prefill....wgmma.sm_90a",
// "paged_decode....tma.sm_90a") for the shapes and features it serves; the portable kernels
// handle the rest.
struct HopperImplementation {
  const char* main_file = nullptr;  // null: the family has none
  std::vector<std::string> (*instantiations)(const KernelSpec& spec) = nullptr;
  bool (*serves)(int head_dim, int page_size) = nullptr;
  const char* name_field = nullptr;  // the variant name's field: what the path is built on
  std::uint32_t supported_flags = 0;  // feature bits it computes
  // Head dims (and features) with a second, wider tiling (KernelSpec::wide; ".wide" in the
  // name); null: none.
  bool (*has_wide)(int head_dim, std::uint32_t flags) = nullptr;
};

struct KernelFamily {
  KernelKind kind;
  const char* name;          // first field of a variant name, `--kernels` value
  bool paged;                // the name carries ".ps<page size>"; warm takes --page-sizes
  bool grouped;              // the name carries ".g<group>"; warm takes --group-sizes
  bool warm_by_default;      // compiled by `warm` without --kernels
  const char* main_file;     // the kernel_src header holding the kernels
  // Name expressions NVRTC instantiates: the main kernel first, then helpers (split combine).
  std::vector<std::string> (*instantiations)(const KernelSpec& spec);
  FamilyLimits limits;
  // Feature bits a variant may set (KernelSpec::flags, the ".f<hex>" name field); each bit is
  // a compile-time switch of the template.
  std::uint32_t supported_flags = 0;
  WarmDefaults warm;
  HopperImplementation hopper = {};
  // The kernels are written for tensor cores only (no CUDA-core path): variants need sm_80+
  // without .nomma.
  bool needs_mma = false;
};

// A compile-time feature of the attention templates (a bit of KernelSpec::flags, defined in
// kernel_src/kernel_params.h), spelled as its own field of a variant name. A few features are
// values of a multi-bit field instead (the multi-token decode's q_len: q2 .. q8); a variant
// has at most one value of a field.
struct KernelFeature {
  std::uint32_t bit;      // the feature's bit, or its value of `field`
  const char* name;       // the name field and the `warm --features` spelling
  std::uint32_t field = 0;           // the field's bits; 0: a one-bit feature
  const char* field_name = nullptr;  // "q_len", for messages

  std::uint32_t mask() const { return field != 0 ? field : bit; }
  bool in(std::uint32_t flags) const { return (flags & mask()) == bit; }
};
// Every feature, in the order their fields appear in a variant name.
const std::vector<KernelFeature>& kernel_features();
// "swa, cap" for the named features of `flags` (", " or another separator between them).
std::string feature_names(std::uint32_t flags, const char* separator = ", ");
// The features a family's supported_flags allow: "swa, cap, sink, q2..q8" (a field's values as
// a range).
std::string supported_feature_names(std::uint32_t supported);
// Why a set of feature bits cannot be one variant ("" when it can): kv_e4m3 with kv_e5m2.
std::string feature_conflict(std::uint32_t flags);
// The feature of a name; null when unknown.
const KernelFeature* find_kernel_feature(std::string_view name);

// What the attention families share: head dims 32..256 in steps of 16, GQA groups up to 128,
// page sizes up to 256 (paged), and the default warm set: AstrAI 1B (head_dim 64, group 6) and
// Llama-3-8B (head_dim 128, group 4), page sizes 1 and 16 (paged).
FamilyLimits attention_limits(bool paged);
WarmDefaults attention_warm_defaults(bool paged);

// Every family, in KernelKind order.
const std::vector<const KernelFamily*>& kernel_families();
const KernelFamily& kernel_family(KernelKind kind);
const KernelFamily* find_kernel_family(std::string_view name);  // null when unknown

// One accessor per family, defined in runtime/families/<family>.cpp.
const KernelFamily& paged_decode_family();
const KernelFamily& rotary_emb_family();
const KernelFamily& decode_family();
const KernelFamily& prefill_family();
const KernelFamily& paged_prefill_family();
const KernelFamily& merge_states_family();
const KernelFamily& mla_decode_family();

// The NVRTC spelling of a dtype in instantiations: "astrai::bf16_t".
const char* device_type_name(DType dtype);

}  // namespace astrai::detail
