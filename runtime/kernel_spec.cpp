#include "runtime/kernel_spec.hpp"

#include <cstdlib>
#include <sstream>

#include <fmt/format.h>

#include "kernel_src/kernel_params.h"
#include "runtime/env_config.hpp"
#include "runtime/plan/implementations.hpp"

namespace astrai {

const char* dtype_name(DType dtype) { return dtype == DType::bf16 ? "bf16" : "fp16"; }

const char* kv_dtype_name(KvDType kv_dtype) {
  switch (kv_dtype) {
    case KvDType::same: return "same";
    case KvDType::e4m3: return "e4m3";
    case KvDType::e5m2: return "e5m2";
  }
  return "unknown";
}

namespace detail {

namespace {

bool parse_prefixed_int(const std::string& field, const char* prefix, int* value) {
  const std::size_t length = std::char_traits<char>::length(prefix);
  if (field.compare(0, length, prefix) != 0 || field.size() == length || field.size() > length + 6)
    return false;
  int result = 0;
  for (std::size_t i = length; i < field.size(); ++i) {
    if (field[i] < '0' || field[i] > '9') return false;
    result = result * 10 + (field[i] - '0');
  }
  *value = result;
  return true;
}

}  // namespace

const char* kernel_kind_name(KernelKind kind) { return kernel_family(kind).name; }

const std::vector<std::string>& kernel_kind_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> list;
    for (const KernelFamily* family : kernel_families()) list.emplace_back(family->name);
    return list;
  }();
  return names;
}

bool parse_kernel_kind(const std::string& text, KernelKind* kind) {
  const KernelFamily* family = find_kernel_family(text);
  if (!family) return false;
  *kind = family->kind;
  return true;
}

int arch_number(const std::string& arch) {
  std::string digits;
  if (arch.rfind("sm_", 0) == 0) digits = arch.substr(3);
  else if (arch.rfind("compute_", 0) == 0) digits = arch.substr(8);
  else return 0;
  if (!digits.empty() && (digits.back() == 'a' || digits.back() == 'f')) digits.pop_back();
  if (digits.size() < 2 || digits.size() > 3) return 0;
  int value = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return 0;
    value = value * 10 + (c - '0');
  }
  return value;
}

std::string KernelSpec::name() const {
  const KernelFamily& info = family();
  std::string result = fmt::format("{}.{}.hd{}", info.name, dtype_name(dtype), head_dim);
  if (info.paged) result += fmt::format(".ps{}", page_size);
  if (info.grouped) result += fmt::format(".g{}", group_size);
  std::uint32_t unnamed = flags;
  for (const KernelFeature& feature : kernel_features()) {
    if (!feature.in(flags)) continue;
    result += fmt::format(".{}", feature.name);
    unnamed &= ~feature.mask();
  }
  // Bits no feature names (never valid) still make a distinct, parseable name.
  if (unnamed != 0) result += fmt::format(".f{:x}", unnamed);
  if (force_no_mma) result += ".nomma";
  if (hopper) result += fmt::format(".{}", info.hopper.name_field);
  if (wide) result += ".wide";
  result += "." + arch;
  return result;
}

KernelSpec KernelSpec::parse(const std::string& name) {
  // Shown in messages with control bytes escaped, so a NUL cannot cut the message short.
  std::string shown;
  for (unsigned char c : name) shown += (c >= 0x20 && c < 0x7f) ? std::string(1, static_cast<char>(c))
                                                                  : fmt::format("\\x{:02x}", c);
  auto fail = [&](const std::string& why) -> InvalidArgument {
    return InvalidArgument(fmt::format(
        "variant name '{}' is malformed: {} (expected like paged_decode.bf16.hd128.ps16.g4.sm_90a "
        "or rotary_emb.bf16.hd128.sm_89)",
        shown, why));
  };
  std::vector<std::string> fields;
  std::stringstream stream(name);
  std::string field;
  while (std::getline(stream, field, '.')) fields.push_back(field);
  if (fields.size() < 4) throw fail("too few fields");
  KernelSpec spec;
  if (!parse_kernel_kind(fields[0], &spec.kind)) throw fail("unknown kernel '" + fields[0] + "'");
  if (fields[1] == "bf16") spec.dtype = DType::bf16;
  else if (fields[1] == "fp16") spec.dtype = DType::fp16;
  else throw fail("unknown dtype '" + fields[1] + "'");
  if (!parse_prefixed_int(fields[2], "hd", &spec.head_dim)) throw fail("bad head dim field '" + fields[2] + "'");
  std::size_t next = 3;
  const KernelFamily& info = spec.family();
  if (info.paged) {
    if (fields.size() < 6) throw fail("too few fields");
    if (!parse_prefixed_int(fields[next], "ps", &spec.page_size))
      throw fail("bad page size field '" + fields[next] + "'");
    ++next;
  }
  if (info.grouped) {
    if (fields.size() < next + 2) throw fail("too few fields");
    if (!parse_prefixed_int(fields[next], "g", &spec.group_size))
      throw fail("bad group field '" + fields[next] + "'");
    ++next;
  }
  // Feature fields; their order is checked by the canonical spelling below.
  while (next < fields.size() - 1) {
    const KernelFeature* feature = find_kernel_feature(fields[next]);
    if (feature == nullptr) break;
    if (spec.flags & feature->mask()) {
      if (feature->field == 0) throw fail("feature '" + fields[next] + "' given twice");
      throw fail(fmt::format("'{}' is a second {} field", fields[next], feature->field_name));
    }
    spec.flags |= feature->bit;
    ++next;
  }
  if (next < fields.size() - 1 && fields[next].size() > 1 && fields[next][0] == 'f') {
    char* end = nullptr;
    const unsigned long value = std::strtoul(fields[next].c_str() + 1, &end, 16);
    if (*end != '\0') throw fail("bad flags field '" + fields[next] + "'");
    spec.flags |= static_cast<std::uint32_t>(value);
    ++next;
  }
  if (next < fields.size() - 1 && fields[next] == "nomma") {
    spec.force_no_mma = true;
    ++next;
  }
  if (next < fields.size() - 1 && info.hopper.main_file != nullptr && fields[next] == info.hopper.name_field) {
    spec.hopper = true;
    ++next;
  }
  if (next < fields.size() - 1 && fields[next] == "wide") {
    spec.wide = true;
    ++next;
  }
  if (next != fields.size() - 1) throw fail("unexpected field '" + fields[next] + "'");
  spec.arch = fields.back();
  // One spelling per variant: rejects a trailing '.', leading zeros and an "f0" flags field.
  if (spec.name() != name) throw fail("not the canonical spelling '" + spec.name() + "'");
  spec.validate();
  return spec;
}

std::string KernelSpec::main_file() const { return hopper ? family().hopper.main_file : family().main_file; }

std::vector<std::string> KernelSpec::instantiations() const {
  return hopper ? family().hopper.instantiations(*this) : family().instantiations(*this);
}

bool target_uses_mma(const std::string& arch, bool force_no_mma) {
  return !force_no_mma && arch_number(arch) >= 80;
}

bool KernelSpec::uses_mma() const { return target_uses_mma(arch, force_no_mma); }

std::vector<std::string> KernelSpec::compile_options() const {
  std::vector<std::string> options = {"--std=c++17", "--gpu-architecture=" + arch,
                                      "--device-as-default-execution-space"};
  if (!uses_mma()) options.push_back("-DASTRAI_NO_MMA");
  return options;
}

void KernelSpec::validate() const {
  const std::string variant = name();
  const KernelFamily& info = family();
  const FamilyLimits& limits = info.limits;
  if (arch_number(arch) < 75)
    throw InvalidArgument(fmt::format("{}: arch '{}' is not supported (allowed: {})", variant, arch,
                                      kArchSupported));
  if (!limits.head_dim.contains(head_dim))
    throw InvalidArgument(fmt::format("{}: head_dim {} is not supported (allowed: {})", variant,
                                      head_dim, limits.head_dim.allowed()));
  if (!info.paged && !info.grouped && (page_size != 0 || group_size != 0))
    throw InvalidArgument(fmt::format("{}: {} takes no page size or group", variant, info.name));
  if (!info.paged && page_size != 0)
    throw InvalidArgument(fmt::format("{}: {} takes no page size", variant, info.name));
  if (info.paged && !limits.page_size_ok(page_size))
    throw InvalidArgument(fmt::format("{}: page_size {} is not supported (allowed: {})", variant,
                                      page_size, limits.page_size_allowed()));
  if (info.grouped && !limits.group_ok(group_size))
    throw InvalidArgument(fmt::format("{}: group size {} is not supported (allowed: {})", variant,
                                      group_size, limits.group_allowed()));
  if (info.needs_mma && !uses_mma())
    throw InvalidArgument(fmt::format("{}: {} needs tensor cores (allowed: sm_80 or newer, without .nomma)", variant,
                                      info.name));
  const std::uint32_t refused = flags & ~info.supported_flags;
  if (refused != 0) {
    const std::string allowed =
        info.supported_flags == 0 ? std::string("none") : supported_feature_names(info.supported_flags);
    const std::string named = feature_names(refused);
    if (!named.empty())
      throw InvalidArgument(fmt::format("{}: {} does not support the feature{} {} (allowed: {})", variant,
                                        info.name, named.find(',') != std::string::npos ? "s" : "", named,
                                        allowed));
    throw InvalidArgument(fmt::format("{}: flags {:#x} name no feature (allowed: {})", variant, refused,
                                      allowed));
  }
  const std::string conflict = feature_conflict(flags);
  if (!conflict.empty()) throw InvalidArgument(fmt::format("{}: {}", variant, conflict));
  if (hopper && info.hopper.main_file == nullptr)
    throw InvalidArgument(fmt::format("{}: {} has no sm_90a implementation", variant, info.name));
  const char* path = hopper ? info.hopper.name_field : "";
  if (hopper && arch != "sm_90a")
    throw InvalidArgument(fmt::format("{}: {} variants exist only for sm_90a, not '{}'", variant, path, arch));
  if (hopper && (flags & ~info.hopper.supported_flags) != 0)
    throw InvalidArgument(fmt::format("{}: the sm_90a ({}) implementation has no {} (the portable variant has)",
                                      variant, path, feature_names(flags & ~info.hopper.supported_flags)));
  if (hopper && force_no_mma)
    throw InvalidArgument(fmt::format("{}: {} variants take no .nomma", variant, path));
  if (hopper && !info.hopper.serves(head_dim, page_size))
    throw InvalidArgument(fmt::format("{}: the sm_90a implementation does not serve head_dim {}{} (the "
                                      "portable variant does)",
                                      variant, head_dim,
                                      info.paged ? fmt::format(" with page_size {}", page_size) : ""));
  if (hopper)  // the rules the Plan follows (an FP8 cache's head dims)
    if (const char* why = hopper_variant_refusal(*this))
      throw InvalidArgument(fmt::format("{}: the sm_90a implementation does not serve it: {}", variant, why));
  if (wide && !hopper)
    throw InvalidArgument(fmt::format("{}: .wide names a tiling of the sm_90a implementation only", variant));
  if ((flags & kFeatureQkvP16) != 0 && (flags & kFeatureQkvE4m3) == 0)
    throw InvalidArgument(fmt::format("{}: p_fp16 keeps FP8 attention's P in f16 and needs qkv_e4m3 beside it", variant));
  if (!hopper && (flags & kFeatureQkvE4m3) != 0)
    throw InvalidArgument(fmt::format("{}: qkv_e4m3 (FP8 attention) is a variant of the sm_90a wgmma prefill only",
                                      variant));
  if (wide && (info.hopper.has_wide == nullptr || !info.hopper.has_wide(head_dim, flags)))
    throw InvalidArgument(fmt::format("{}: {} has no wide tiling at head_dim {}{}", variant, info.name, head_dim,
                                      (flags & kFeatureKvFp8) != 0 ? " with an FP8 cache" : ""));
}

std::string KernelSpec::warm_command() const {
  const KernelFamily& info = family();
  std::string command = fmt::format("astrai-jit warm --arch {} --kernels {} --dtypes {} --head-dims {}",
                                    arch, info.name, dtype_name(dtype), head_dim);
  if (info.paged) command += fmt::format(" --page-sizes {}", page_size);
  if (info.grouped) command += fmt::format(" --group-sizes {}", group_size);
  if (flags != 0) command += " --features " + feature_names(flags, "+");
  if (force_no_mma) command += " --no-mma";
  if (hopper) command += " --hopper";
  else if (hopper_serves(*this)) command += " --no-hopper";
  if (hopper && info.hopper.has_wide != nullptr && info.hopper.has_wide(head_dim, flags)) {
    // Decode's wide CTAs follow ASTRAI_JIT_DECODE_TILES (warm has no flag for them).
    if (is_decode_kind(kind)) command = fmt::format("ASTRAI_JIT_DECODE_TILES={} {}", wide ? "wide" : "narrow", command);
    else command += wide ? " --prefill-tiles wide" : " --prefill-tiles narrow";
  }
  return command;
}

}  // namespace detail
}  // namespace astrai
