#include "runtime/kernel_family.hpp"

#include <stdexcept>

#include <fmt/format.h>

#include "kernel_src/kernel_params.h"
#include "runtime/families/attention_features.hpp"

namespace astrai::detail {

std::string SteppedRange::allowed() const { return fmt::format("{}..{}, step {}", min, max, step); }

bool FamilyLimits::page_size_ok(long long page_size) const {
  return page_size > 0 && (page_size & (page_size - 1)) == 0 && page_size <= max_page_size;
}

std::string FamilyLimits::page_size_allowed() const {
  return fmt::format("a power of two in 1..{}", max_page_size);
}

std::string FamilyLimits::group_allowed() const { return fmt::format("1..{}", max_group); }

FamilyLimits attention_limits(bool paged) { return {{32, 256, 16}, paged ? 256 : 0, 128}; }

WarmDefaults attention_warm_defaults(bool paged) {
  return {{{64, 6}, {128, 4}}, {64, 128}, {4, 6}, paged ? std::vector<int>{1, 16} : std::vector<int>{}};
}

const std::vector<KernelFeature>& kernel_features() {
  static const std::vector<KernelFeature> features = [] {
    std::vector<KernelFeature> list;
    for (const AttentionOption& option : attention_options()) list.push_back({option.bit, option.name});
    // Multi-token decode: ".q2" .. ".q8" (q_len 1 is the plain variant and has no field).
    static const char* const kQLenNames[] = {"q2", "q3", "q4", "q5", "q6", "q7", "q8"};
    for (int q_len = 2; q_len <= kMaxDecodeQLen; ++q_len)
      list.push_back({decode_q_len_flags(q_len), kQLenNames[q_len - 2], kFeatureQLenField, "q_len"});
    return list;
  }();
  return features;
}

std::string feature_names(std::uint32_t flags, const char* separator) {
  std::string names;
  for (const KernelFeature& feature : kernel_features()) {
    if (!feature.in(flags)) continue;
    if (!names.empty()) names += separator;
    names += feature.name;
  }
  return names;
}

std::string supported_feature_names(std::uint32_t supported) {
  const std::vector<KernelFeature>& features = kernel_features();
  std::string names;
  for (std::size_t i = 0; i < features.size(); ++i) {
    const KernelFeature& feature = features[i];
    if ((supported & feature.mask()) != feature.mask()) continue;
    std::string name = feature.name;
    if (feature.field != 0) {  // the values of one field are listed together
      std::size_t last = i;
      while (last + 1 < features.size() && features[last + 1].field == feature.field) ++last;
      if (last > i) name += std::string("..") + features[last].name;
      i = last;
    }
    if (!names.empty()) names += ", ";
    names += name;
  }
  return names;
}

std::string feature_conflict(std::uint32_t flags) {
  if ((flags & kFeatureKvE4m3) != 0 && (flags & kFeatureKvE5m2) != 0)
    return "the features kv_e4m3 and kv_e5m2 exclude each other (a KV cache has one element type)";
  return "";
}

const KernelFeature* find_kernel_feature(std::string_view name) {
  for (const KernelFeature& feature : kernel_features())
    if (name == feature.name) return &feature;
  return nullptr;
}

const std::vector<const KernelFamily*>& kernel_families() {
  static const std::vector<const KernelFamily*> families = [] {
    std::vector<const KernelFamily*> list = {&paged_decode_family(), &rotary_emb_family(),
                                             &decode_family(), &prefill_family(),
                                             &paged_prefill_family(), &merge_states_family(),
                                             &mla_decode_family()};
    // Indexed by KernelKind: each descriptor sits at its own kind's position.
    for (std::size_t i = 0; i < list.size(); ++i)
      if (static_cast<std::size_t>(list[i]->kind) != i) throw std::logic_error("kernel family table order");
    return list;
  }();
  return families;
}

const KernelFamily& kernel_family(KernelKind kind) {
  return *kernel_families().at(static_cast<std::size_t>(kind));
}

const KernelFamily* find_kernel_family(std::string_view name) {
  for (const KernelFamily* family : kernel_families())
    if (name == family->name) return family;
  return nullptr;
}

const char* device_type_name(DType dtype) {
  return dtype == DType::bf16 ? "astrai::bf16_t" : "astrai::fp16_t";
}

}  // namespace astrai::detail
