#include "cache/variant_payload.hpp"

#include <cstdint>

namespace astrai::detail {

namespace {

void append_u32(std::vector<char>* out, std::uint32_t value) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((value >> (8 * i)) & 0xffu));
}

bool read_u32(const std::vector<char>& in, std::size_t* offset, std::uint32_t* value) {
  if (in.size() - *offset < 4 || *offset > in.size()) return false;
  std::uint32_t result = 0;
  for (int i = 0; i < 4; ++i)
    result |= static_cast<std::uint32_t>(static_cast<unsigned char>(in[*offset + i])) << (8 * i);
  *offset += 4;
  *value = result;
  return true;
}

}  // namespace

std::vector<char> encode_variant_payload(const std::vector<std::string>& symbols,
                                         const std::vector<char>& binary) {
  std::vector<char> out;
  append_u32(&out, static_cast<std::uint32_t>(symbols.size()));
  for (const auto& symbol : symbols) {
    append_u32(&out, static_cast<std::uint32_t>(symbol.size()));
    out.insert(out.end(), symbol.begin(), symbol.end());
  }
  out.insert(out.end(), binary.begin(), binary.end());
  return out;
}

bool decode_variant_symbols(const std::vector<char>& payload, std::vector<std::string>* symbols,
                            std::size_t* binary_offset) {
  std::size_t offset = 0;
  std::uint32_t count = 0;
  if (!read_u32(payload, &offset, &count) || count > 64) return false;
  symbols->clear();
  for (std::uint32_t i = 0; i < count; ++i) {
    std::uint32_t length = 0;
    if (!read_u32(payload, &offset, &length) || length > 4096 || payload.size() - offset < length)
      return false;
    symbols->emplace_back(payload.data() + offset, length);
    offset += length;
  }
  if (offset >= payload.size()) return false;  // a variant always has a binary
  *binary_offset = offset;
  return true;
}

bool decode_variant_payload(const std::vector<char>& payload, std::vector<std::string>* symbols,
                            std::vector<char>* binary) {
  std::size_t offset = 0;
  if (!decode_variant_symbols(payload, symbols, &offset)) return false;
  binary->assign(payload.begin() + static_cast<std::ptrdiff_t>(offset), payload.end());
  return true;
}

bool check_variant_payload(BinaryKind kind, const std::vector<char>& payload, std::string* why) {
  std::vector<std::string> symbols;
  std::size_t offset = 0;
  if (!decode_variant_symbols(payload, &symbols, &offset)) {
    if (why) *why = "malformed symbol table in the payload";
    return false;
  }
  return check_kernel_binary(kind, payload.data() + offset, payload.size() - offset, why);
}

}  // namespace astrai::detail
