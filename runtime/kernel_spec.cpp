#include "runtime/kernel_spec.hpp"

#include <cstdlib>
#include <sstream>

#include <fmt/format.h>

#include "runtime/env_config.hpp"

namespace astrai {

const char* dtype_name(DType dtype) { return dtype == DType::bf16 ? "bf16" : "fp16"; }

namespace detail {

namespace {

const char* device_type_name(DType dtype) {
  return dtype == DType::bf16 ? "astrai::bf16_t" : "astrai::fp16_t";
}

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

bool is_power_of_two(int value) { return value > 0 && (value & (value - 1)) == 0; }

bool is_paged(KernelKind kind) {
  return kind == KernelKind::paged_decode || kind == KernelKind::paged_prefill;
}

}  // namespace

const char* kernel_kind_name(KernelKind kind) {
  switch (kind) {
    case KernelKind::paged_decode: return "paged_decode";
    case KernelKind::rotary_emb: return "rotary_emb";
    case KernelKind::decode: return "decode";
    case KernelKind::prefill: return "prefill";
    case KernelKind::paged_prefill: return "paged_prefill";
  }
  return "?";
}

const std::vector<std::string>& kernel_kind_names() {
  static const std::vector<std::string> names = {"paged_decode", "rotary_emb", "decode", "prefill",
                                                 "paged_prefill"};
  return names;
}

bool parse_kernel_kind(const std::string& text, KernelKind* kind) {
  if (text == "paged_decode") *kind = KernelKind::paged_decode;
  else if (text == "rotary_emb") *kind = KernelKind::rotary_emb;
  else if (text == "decode") *kind = KernelKind::decode;
  else if (text == "prefill") *kind = KernelKind::prefill;
  else if (text == "paged_prefill") *kind = KernelKind::paged_prefill;
  else return false;
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
  std::string result = fmt::format("{}.{}.hd{}", kernel_kind_name(kind), dtype_name(dtype), head_dim);
  if (is_paged(kind)) result += fmt::format(".ps{}", page_size);
  if (kind != KernelKind::rotary_emb) result += fmt::format(".g{}", group_size);
  if (flags != 0) result += fmt::format(".f{:x}", flags);
  if (force_no_mma) result += ".nomma";
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
  if (is_paged(spec.kind)) {
    if (fields.size() < 6) throw fail("too few fields");
    if (!parse_prefixed_int(fields[next], "ps", &spec.page_size))
      throw fail("bad page size field '" + fields[next] + "'");
    ++next;
  }
  if (spec.kind != KernelKind::rotary_emb) {
    if (fields.size() < next + 2) throw fail("too few fields");
    if (!parse_prefixed_int(fields[next], "g", &spec.group_size))
      throw fail("bad group field '" + fields[next] + "'");
    ++next;
  }
  if (next < fields.size() - 1 && fields[next].size() > 1 && fields[next][0] == 'f') {
    char* end = nullptr;
    const unsigned long value = std::strtoul(fields[next].c_str() + 1, &end, 16);
    if (*end != '\0') throw fail("bad flags field '" + fields[next] + "'");
    spec.flags = static_cast<std::uint32_t>(value);
    ++next;
  }
  if (next < fields.size() - 1 && fields[next] == "nomma") {
    spec.force_no_mma = true;
    ++next;
  }
  if (next != fields.size() - 1) throw fail("unexpected field '" + fields[next] + "'");
  spec.arch = fields.back();
  // One spelling per variant: rejects a trailing '.', leading zeros and an "f0" flags field.
  if (spec.name() != name) throw fail("not the canonical spelling '" + spec.name() + "'");
  spec.validate();
  return spec;
}

std::string KernelSpec::main_file() const {
  switch (kind) {
    case KernelKind::paged_decode: return "paged_decode.cuh";
    case KernelKind::rotary_emb: return "rotary_emb.cuh";
    case KernelKind::decode: return "paged_decode.cuh";  // the same kernel, contiguous addressing
    case KernelKind::prefill:
    case KernelKind::paged_prefill: return "prefill.cuh";
  }
  return "";
}

std::vector<std::string> KernelSpec::instantiations() const {
  const char* type = device_type_name(dtype);
  switch (kind) {
    case KernelKind::paged_decode:
      return {fmt::format("astrai::paged_decode_kernel<{}, {}, {}, {}, {}>", type, head_dim,
                          page_size, group_size, flags),
              fmt::format("astrai::split_combine_kernel<{}, {}>", type, head_dim)};
    case KernelKind::rotary_emb:
      return {fmt::format("astrai::rotary_emb_kernel<{}, {}>", type, head_dim)};
    case KernelKind::decode:  // page size 0 selects contiguous KV addressing
      return {fmt::format("astrai::paged_decode_kernel<{}, {}, 0, {}, {}>", type, head_dim,
                          group_size, flags),
              fmt::format("astrai::split_combine_kernel<{}, {}>", type, head_dim)};
    case KernelKind::prefill:
    case KernelKind::paged_prefill:
      return {fmt::format("astrai::prefill_kernel<{}, {}, {}, {}, {}>", type, head_dim,
                          kind == KernelKind::prefill ? 0 : page_size, group_size, flags)};
  }
  return {};
}

bool KernelSpec::uses_mma() const { return !force_no_mma && arch_number(arch) >= 80; }

std::vector<std::string> KernelSpec::compile_options() const {
  std::vector<std::string> options = {"--std=c++17", "--gpu-architecture=" + arch,
                                      "--device-as-default-execution-space"};
  if (!uses_mma()) options.push_back("-DASTRAI_NO_MMA");
  return options;
}

void KernelSpec::validate() const {
  const std::string variant = name();
  const int number = arch_number(arch);
  if (number < 75)
    throw InvalidArgument(fmt::format("{}: arch '{}' is not supported (allowed: sm_75 or newer, "
                                      "e.g. sm_80, sm_89, sm_90a)", variant, arch));
  if (kind != KernelKind::rotary_emb) {
    if (head_dim % 16 != 0 || head_dim < 32 || head_dim > 256)
      throw InvalidArgument(fmt::format("{}: head_dim {} is not supported (allowed: 32..256, step 16)",
                                        variant, head_dim));
    if (!is_paged(kind) && page_size != 0)
      throw InvalidArgument(fmt::format("{}: {} takes no page size", variant, kernel_kind_name(kind)));
    if (is_paged(kind) && (!is_power_of_two(page_size) || page_size > 256))
      throw InvalidArgument(fmt::format("{}: page_size {} is not supported (allowed: a power of two "
                                        "in 1..256)", variant, page_size));
    if (group_size < 1 || group_size > 128)
      throw InvalidArgument(fmt::format("{}: group size {} is not supported (allowed: 1..128)",
                                        variant, group_size));
  } else {
    if (head_dim % 8 != 0 || head_dim < 8 || head_dim > 512)
      throw InvalidArgument(fmt::format("{}: head_dim {} is not supported (allowed: 8..512, step 8)",
                                        variant, head_dim));
    if (page_size != 0 || group_size != 0)
      throw InvalidArgument(fmt::format("{}: rotary_emb takes no page size or group", variant));
  }
  if (flags != 0)
    throw InvalidArgument(fmt::format("{}: flags {:#x} are not supported (allowed: 0)", variant, flags));
}

}  // namespace detail
}  // namespace astrai
