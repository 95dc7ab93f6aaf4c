// libFuzzer target: cache entry files (decode_entry), the variant payload inside them
// (decode_variant_payload) and the binary check before the driver (check_kernel_binary). None
// may crash, leak or misbehave on any bytes; whatever decodes re-encodes to exactly the same
// bytes (one encoding per entry), and a rejection names a reason.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "cache/disk_cache.hpp"
#include "runtime/jit_engine.hpp"
#include "tests/support/fuzz.hpp"

using astrai::detail::BinaryKind;
using astrai::detail::CacheEntryData;
using astrai::fuzz::require;

namespace {

std::string as_string(const std::vector<char>& bytes) {
  return std::string(bytes.begin(), bytes.end());
}

void check_payload(const std::vector<char>& payload) {
  std::vector<std::string> symbols;
  std::vector<char> binary;
  if (!astrai::detail::decode_variant_payload(payload, &symbols, &binary)) return;
  require(!binary.empty(), "a decoded payload has an empty binary");
  require(astrai::detail::encode_variant_payload(symbols, binary) == payload,
          "a decoded payload does not re-encode to the same bytes");
  for (const BinaryKind kind : {BinaryKind::cubin, BinaryKind::ptx}) {
    std::string why;
    if (!astrai::detail::check_kernel_binary(kind, binary.data(), binary.size(), &why))
      require(!why.empty(), "a refused binary gives no reason");
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  CacheEntryData entry;
  entry.variant_name = "rotary_emb.bf16.hd64.sm_80";
  entry.nvrtc_version = "13.0";
  entry.payload = astrai::detail::encode_variant_payload(
      {"_ZN6astrai15rotary_emb_kernelINS_6bf16_tELi64EEEvNS_10RotaryArgsE"},
      {'\x7f', 'E', 'L', 'F', 2, 1, 1, 0x33, 0, 0, 0, 0});
  std::vector<std::string> seeds = {as_string(astrai::detail::encode_entry(entry))};
  entry.kind = BinaryKind::ptx;
  entry.variant_name = "paged_decode.fp16.hd128.ps16.g4.compute_120";
  const std::string ptx = "//\n.version 9.0\n.target sm_120\n";
  entry.payload = astrai::detail::encode_variant_payload(
      {"_Z19paged_decode_kernelv", "_Z20split_combine_kernelv"},
      std::vector<char>(ptx.begin(), ptx.end() + 1));
  seeds.push_back(as_string(astrai::detail::encode_entry(entry)));
  entry.variant_name.clear();
  entry.nvrtc_version.clear();
  entry.payload = {'x'};
  seeds.push_back(as_string(astrai::detail::encode_entry(entry)));
  seeds.push_back(as_string(entry.payload));
  seeds.push_back(std::string("ASTRAIJC", 8));
  astrai::fuzz::write_seeds(seeds);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const char* bytes = reinterpret_cast<const char*>(data);
  std::string error;
  const auto entry = astrai::detail::decode_entry(bytes, size, &error);
  if (entry) {
    require(entry->kind == BinaryKind::cubin || entry->kind == BinaryKind::ptx,
            "a decoded entry has an unknown binary kind");
    const std::vector<char> again = astrai::detail::encode_entry(*entry);
    require(again.size() == size && (size == 0 || std::memcmp(again.data(), data, size) == 0),
            "a decoded entry does not re-encode to the same bytes");
    check_payload(entry->payload);
  } else {
    require(!error.empty(), "a rejected entry gives no reason");
  }
  // The raw bytes as a payload, too.
  check_payload(std::vector<char>(bytes, bytes + size));
  return 0;
}
