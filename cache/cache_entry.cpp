#include "cache/cache_entry.hpp"

#include <cstring>
#include <exception>
#include <utility>

#include "cache/cache_key.hpp"

namespace astrai::detail {

namespace {

constexpr char kMagic[8] = {'A', 'S', 'T', 'R', 'A', 'I', 'J', 'C'};
// magic(8) version(4) kind(1) reserved(3) payload size(8) checksum(8) name len(4) version len(4)
constexpr std::size_t kHeaderSize = kEntryHeaderSize;
static_assert(kHeaderSize == 8 + 4 + 1 + 3 + 8 + 8 + 4 + 4);
constexpr std::uint32_t kMaxNameLength = kMaxEntryNameLength;

void put_u32(std::vector<char>& out, std::uint32_t value) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xffu));
}

void put_u64(std::vector<char>& out, std::uint64_t value) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xffu));
}

// Grows `out` and copies into the new tail. GCC 12 misreads vector::insert of a range after
// reserve() as a write past a zero-sized region (-Wstringop-overflow); this says the same
// thing without the false alarm.
void put_bytes(std::vector<char>& out, const char* data, std::size_t size) {
  if (size == 0) return;
  const std::size_t at = out.size();
  out.resize(at + size);
  std::memcpy(out.data() + at, data, size);
}

std::uint32_t get_u32(const unsigned char* p) {
  std::uint32_t value = 0;
  for (int i = 3; i >= 0; --i) value = (value << 8) | p[i];
  return value;
}

std::uint64_t get_u64(const unsigned char* p) {
  std::uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | p[i];
  return value;
}

}  // namespace

std::vector<char> encode_entry(const CacheEntryData& entry) {
  std::vector<char> out;
  const bool signed_entry = entry.signature.has_value();
  out.reserve(kHeaderSize + entry.variant_name.size() + entry.nvrtc_version.size() +
              entry.payload.size() + (signed_entry ? kEntrySignatureTrailerSize : 0));
  put_bytes(out, kMagic, sizeof kMagic);
  put_u32(out, signed_entry ? kSignedEntryFormatVersion : kEntryFormatVersion);
  out.push_back(static_cast<char>(entry.kind));
  out.push_back(0);
  out.push_back(0);
  out.push_back(0);
  put_u64(out, static_cast<std::uint64_t>(entry.payload.size()));
  const std::size_t checksum_at = out.size();
  put_u64(out, 0);
  put_u32(out, static_cast<std::uint32_t>(entry.variant_name.size()));
  put_u32(out, static_cast<std::uint32_t>(entry.nvrtc_version.size()));
  put_bytes(out, entry.variant_name.data(), entry.variant_name.size());
  put_bytes(out, entry.nvrtc_version.data(), entry.nvrtc_version.size());
  put_bytes(out, entry.payload.data(), entry.payload.size());
  if (signed_entry) {
    const EntrySignature& signature = *entry.signature;
    put_bytes(out, reinterpret_cast<const char*>(signature.key_id.data()), signature.key_id.size());
    put_bytes(out, reinterpret_cast<const char*>(signature.bytes.data()), signature.bytes.size());
  }
  // The checksum covers the names and the payload, seeded with the version and kind bytes, so
  // no flipped bit outside the checksum field itself goes unnoticed.
  const std::uint64_t checksum =
      payload_checksum(out.data() + kHeaderSize, out.size() - kHeaderSize,
                       get_u64(reinterpret_cast<const unsigned char*>(out.data()) + 8));
  for (int i = 0; i < 8; ++i) out[checksum_at + i] = static_cast<char>((checksum >> (8 * i)) & 0xffu);
  return out;
}

namespace {

// Where the parts of a valid entry file lie.
struct EntryLayout {
  BinaryKind kind = BinaryKind::cubin;
  std::size_t name_offset = 0;
  std::size_t name_length = 0;
  std::size_t version_length = 0;
  std::size_t payload_offset = 0;
  std::size_t payload_size = 0;
  bool signed_entry = false;  // a signature trailer follows the payload
};

// Checks an entry file (header, sizes, checksum); the reason goes to *error on failure.
bool parse_entry(const char* data, std::size_t size, EntryLayout* layout, std::string* error) {
  auto fail = [error](const char* why) {
    if (error) {
      try {
        *error = why;
      } catch (const std::exception&) {
      }
    }
    return false;
  };
  if (data == nullptr) return fail("no data");
  if (size < kHeaderSize) return fail("truncated header");
  const auto* bytes = reinterpret_cast<const unsigned char*>(data);
  if (std::memcmp(bytes, kMagic, sizeof kMagic) != 0) return fail("bad magic");
  const std::uint32_t version = get_u32(bytes + 8);
  if (version != kEntryFormatVersion && version != kSignedEntryFormatVersion)
    return fail("unsupported format version");
  const std::uint64_t trailer = version == kSignedEntryFormatVersion ? kEntrySignatureTrailerSize : 0;
  const unsigned kind = bytes[12];
  if (kind != static_cast<unsigned>(BinaryKind::cubin) &&
      kind != static_cast<unsigned>(BinaryKind::ptx))
    return fail("unknown binary kind");
  if (bytes[13] != 0 || bytes[14] != 0 || bytes[15] != 0) return fail("nonzero reserved bytes");
  const std::uint64_t payload_size = get_u64(bytes + 16);
  const std::uint64_t checksum = get_u64(bytes + 24);
  const std::uint32_t name_length = get_u32(bytes + 32);
  const std::uint32_t version_length = get_u32(bytes + 36);
  if (name_length > kMaxNameLength) return fail("variant name too long");
  if (version_length > kMaxNameLength) return fail("nvrtc version too long");

  // All comparisons below are against sizes already known to fit: no overflow possible.
  const std::uint64_t body = size - kHeaderSize;
  const std::uint64_t strings = std::uint64_t{name_length} + version_length;
  if (strings > body) return fail("truncated names");
  const std::uint64_t available = body - strings;
  if (payload_size > available) return fail("truncated payload");
  if (available - payload_size < trailer) return fail("truncated signature");
  if (available - payload_size > trailer) return fail("trailing bytes after payload");

  const char* name = data + kHeaderSize;
  if (payload_checksum(name, static_cast<std::size_t>(body), get_u64(bytes + 8)) != checksum)
    return fail("checksum mismatch");
  layout->kind = static_cast<BinaryKind>(kind);
  layout->name_offset = kHeaderSize;
  layout->name_length = name_length;
  layout->version_length = version_length;
  layout->payload_offset = kHeaderSize + static_cast<std::size_t>(strings);
  layout->payload_size = static_cast<std::size_t>(payload_size);
  layout->signed_entry = trailer != 0;
  return true;
}

std::optional<EntrySignature> read_signature(const char* data, const EntryLayout& layout) {
  if (!layout.signed_entry) return std::nullopt;
  const char* at = data + layout.payload_offset + layout.payload_size;
  EntrySignature signature;
  std::memcpy(signature.key_id.data(), at, signature.key_id.size());
  std::memcpy(signature.bytes.data(), at + signature.key_id.size(), signature.bytes.size());
  return signature;
}

}  // namespace

std::optional<CacheEntryData> decode_entry_taking(std::vector<char>&& bytes, std::string* error) {
  EntryLayout layout;
  if (!parse_entry(bytes.data(), bytes.size(), &layout, error)) return std::nullopt;
  CacheEntryData entry;
  entry.kind = layout.kind;
  const char* name = bytes.data() + layout.name_offset;
  entry.variant_name.assign(name, layout.name_length);
  entry.nvrtc_version.assign(name + layout.name_length, layout.version_length);
  entry.signature = read_signature(bytes.data(), layout);
  entry.payload = std::move(bytes);
  entry.payload.resize(layout.payload_offset + layout.payload_size);  // drops the trailer
  entry.payload.erase(entry.payload.begin(),
                      entry.payload.begin() + static_cast<std::ptrdiff_t>(layout.payload_offset));
  return entry;
}

std::optional<CacheEntryData> decode_entry(const char* data, std::size_t size,
                                           std::string* error) {
  EntryLayout layout;
  if (!parse_entry(data, size, &layout, error)) return std::nullopt;
  try {
    CacheEntryData entry;
    entry.kind = layout.kind;
    const char* name = data + layout.name_offset;
    entry.variant_name.assign(name, layout.name_length);
    entry.nvrtc_version.assign(name + layout.name_length, layout.version_length);
    const char* payload = data + layout.payload_offset;
    entry.payload.assign(payload, payload + layout.payload_size);
    entry.signature = read_signature(data, layout);
    return entry;
  } catch (const std::exception&) {
    if (error) *error = "out of memory";
    return std::nullopt;
  }
}

std::optional<CacheEntryData> decode_entry_of_variant(std::string_view variant_name,
                                                      const char* data, std::size_t size,
                                                      std::string* why) {
  auto decoded = decode_entry(data, size, why);
  if (!decoded) return std::nullopt;
  if (decoded->variant_name != variant_name) {
    if (why) *why = "variant name does not match the file name";
    return std::nullopt;
  }
  // An entry holding the other kind would be refused by the runtime anyway.
  const std::size_t dot = variant_name.rfind('.');
  const std::string_view target = variant_name.substr(dot == std::string_view::npos ? 0 : dot + 1);
  if (decoded->kind != binary_kind_for_target(target)) {
    if (why) *why = "binary kind does not match the variant's target";
    return std::nullopt;
  }
  return decoded;
}

bool is_other_entry_format(const char* data, std::size_t size) {
  if (data == nullptr || size < 12 || std::memcmp(data, kMagic, sizeof kMagic) != 0) return false;
  const std::uint32_t version = get_u32(reinterpret_cast<const unsigned char*>(data) + 8);
  return version != kEntryFormatVersion && version != kSignedEntryFormatVersion;
}

}  // namespace astrai::detail
