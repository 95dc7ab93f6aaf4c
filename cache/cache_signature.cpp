#include "cache/cache_signature.hpp"

#include <fcntl.h>
#include <sodium.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>

#include <fmt/format.h>

#include "astrai/error.hpp"
#include "cache/cache_fs.hpp"
#include "cache/cache_trust.hpp"

namespace astrai::detail {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kPublicPrefix = "ed25519:";
constexpr std::string_view kSecretPrefix = "ed25519-secret:";
// Separates this use of the keys from any other signature they might make.
constexpr std::string_view kDomain = "astrai-jit cache entry signature v1";
constexpr std::uint64_t kMaxTrustedKeysFile = 64 * 1024;
constexpr std::uint64_t kMaxSecretKeyFile = 4 * 1024;

void ensure_sodium() {
  // sodium_init is thread-safe and idempotent; it fails only without a randomness source.
  static const int status = sodium_init();
  if (status < 0) throw Error("libsodium could not be initialized (no randomness source?)");
}

SigningKeyId derive_key_id(const unsigned char* public_key) {
  ensure_sodium();
  unsigned char digest[crypto_generichash_BYTES_MIN];
  crypto_generichash(digest, sizeof digest, public_key, crypto_sign_PUBLICKEYBYTES, nullptr, 0);
  SigningKeyId id;
  std::memcpy(id.data(), digest, id.size());
  return id;
}

std::string to_base64(const unsigned char* data, std::size_t size) {
  const int variant = sodium_base64_VARIANT_ORIGINAL;
  std::string text(sodium_base64_ENCODED_LEN(size, variant), '\0');
  sodium_bin2base64(text.data(), text.size(), data, size, variant);
  text.resize(std::strlen(text.c_str()));
  return text;
}

// Decodes exactly `size` bytes of base64; false otherwise.
bool from_base64(std::string_view text, unsigned char* out, std::size_t size) {
  std::size_t decoded = 0;
  const char* end = nullptr;
  if (sodium_base642bin(out, size, text.data(), text.size(), nullptr, &decoded, &end,
                        sodium_base64_VARIANT_ORIGINAL) != 0)
    return false;
  return decoded == size && end == text.data() + text.size();
}

bool parse_hex_id(std::string_view text, SigningKeyId* id) {
  if (text.size() != 2 * id->size()) return false;
  std::size_t written = 0;
  return sodium_hex2bin(id->data(), id->size(), text.data(), text.size(), nullptr, &written,
                        nullptr) == 0 &&
         written == id->size() &&
         std::all_of(text.begin(), text.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

std::string_view trim_blanks(std::string_view text) {
  const auto blank = [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; };
  while (!text.empty() && blank(text.front())) text.remove_prefix(1);
  while (!text.empty() && blank(text.back())) text.remove_suffix(1);
  return text;
}

// Splits "<prefix><id>:<base64>" into id and base64; false with a reason.
bool split_token(std::string_view token, std::string_view prefix, SigningKeyId* id,
                 std::string_view* base64, std::string* why) {
  token = trim_blanks(token);
  if (token.substr(0, prefix.size()) != prefix) {
    *why = fmt::format("does not start with '{}'", prefix);
    return false;
  }
  token.remove_prefix(prefix.size());
  const std::size_t colon = token.find(':');
  if (colon == std::string_view::npos || !parse_hex_id(token.substr(0, colon), id)) {
    *why = "no key id (16 lowercase hex digits) after the prefix";
    return false;
  }
  *base64 = token.substr(colon + 1);
  return true;
}

// Reads a small file opened without following a link at its last component; checks it with
// `check` on the opened descriptor. False with a reason.
template <typename Check>
bool read_small_file(const fs::path& path, std::uint64_t max_bytes, Check&& check,
                     std::string* text, std::string* why) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
  if (!fd) {
    *why = errno == ELOOP ? "a symbolic link (never followed)" : errno_text(errno);
    return false;
  }
  struct stat info {};
  if (::fstat(fd.get(), &info) != 0) {
    *why = errno_text(errno);
    return false;
  }
  if (!S_ISREG(info.st_mode)) {
    *why = "not a regular file";
    return false;
  }
  if (std::string refused = check(info); !refused.empty()) {
    *why = refused;
    return false;
  }
  if (static_cast<std::uint64_t>(info.st_size) > max_bytes) {
    *why = fmt::format("larger than {} bytes", max_bytes);
    return false;
  }
  text->assign(static_cast<std::size_t>(info.st_size), '\0');
  std::size_t done = 0;
  while (done < text->size()) {
    const ssize_t n = ::read(fd.get(), text->data() + done, text->size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      *why = n < 0 ? errno_text(errno) : std::string("changed while read");
      return false;
    }
    done += static_cast<std::size_t>(n);
  }
  return true;
}

// The lines of a key file without comments and blanks.
std::vector<std::string_view> key_lines(std::string_view text) {
  std::vector<std::string_view> lines;
  while (!text.empty()) {
    const std::size_t end = text.find('\n');
    std::string_view line = text.substr(0, end);
    text = end == std::string_view::npos ? std::string_view() : text.substr(end + 1);
    line = trim_blanks(line.substr(0, line.find('#')));
    if (!line.empty()) lines.push_back(line);
  }
  return lines;
}

void hash_field(crypto_generichash_state* state, const void* data, std::uint64_t size) {
  unsigned char length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>((size >> (8 * i)) & 0xffu);
  crypto_generichash_update(state, length, sizeof length);
  crypto_generichash_update(state, static_cast<const unsigned char*>(data), size);
}

// What is signed: a digest of the domain, the key, the variant and the payload, each with its
// length, so that no two different inputs hash the same bytes.
std::array<unsigned char, crypto_generichash_BYTES_MAX> signed_digest(
    std::string_view key_hex, std::string_view variant, const char* payload, std::size_t size) {
  ensure_sodium();
  crypto_generichash_state state;
  crypto_generichash_init(&state, nullptr, 0, crypto_generichash_BYTES_MAX);
  hash_field(&state, kDomain.data(), kDomain.size());
  hash_field(&state, key_hex.data(), key_hex.size());
  hash_field(&state, variant.data(), variant.size());
  hash_field(&state, payload, size);
  std::array<unsigned char, crypto_generichash_BYTES_MAX> digest{};
  crypto_generichash_final(&state, digest.data(), digest.size());
  return digest;
}

}  // namespace

static_assert(crypto_sign_BYTES == kSignatureBytes);
static_assert(crypto_sign_SECRETKEYBYTES == 64 && crypto_sign_PUBLICKEYBYTES == 32);

const PublicKey* TrustedKeys::find(const SigningKeyId& id) const {
  for (const PublicKey& key : keys)
    if (key.id == id) return &key;
  return nullptr;
}

SigningKey::~SigningKey() { sodium_memzero(secret_.data(), secret_.size()); }

SigningKey SigningKey::generate() {
  ensure_sodium();
  SigningKey key;
  unsigned char public_key[crypto_sign_PUBLICKEYBYTES];
  crypto_sign_keypair(public_key, key.secret_.data());
  key.id_ = derive_key_id(public_key);
  return key;
}

PublicKey SigningKey::public_key() const {
  PublicKey key;
  // libsodium's secret key is the seed followed by the public key.
  std::memcpy(key.bytes.data(), secret_.data() + 32, key.bytes.size());
  key.id = id_;
  return key;
}

std::string key_id_hex(const SigningKeyId& id) {
  std::string text;
  for (unsigned char byte : id) text += fmt::format("{:02x}", byte);
  return text;
}

std::string format_public_key(const PublicKey& key) {
  return fmt::format("{}{}:{}", kPublicPrefix, key_id_hex(key.id),
                     to_base64(key.bytes.data(), key.bytes.size()));
}

std::string format_secret_key(const SigningKey& key) {
  return fmt::format("{}{}:{}", kSecretPrefix, key_id_hex(key.id()),
                     to_base64(key.secret().data(), key.secret().size()));
}

bool parse_public_key(std::string_view token, PublicKey* key, std::string* why) {
  ensure_sodium();
  std::string_view base64;
  PublicKey parsed;
  if (!split_token(token, kPublicPrefix, &parsed.id, &base64, why)) return false;
  if (!from_base64(base64, parsed.bytes.data(), parsed.bytes.size())) {
    *why = "the key is not 32 bytes of base64";
    return false;
  }
  if (derive_key_id(parsed.bytes.data()) != parsed.id) {
    *why = "the key id does not match the key";
    return false;
  }
  *key = parsed;
  return true;
}

bool parse_secret_key(std::string_view token, SigningKey* key, std::string* why) {
  ensure_sodium();
  std::string_view base64;
  SigningKey parsed;
  if (!split_token(token, kSecretPrefix, &parsed.id_, &base64, why)) return false;
  if (!from_base64(base64, parsed.secret_.data(), parsed.secret_.size())) {
    *why = "the key is not 64 bytes of base64";
    return false;
  }
  // The public half must be the one the seed yields, and have the id the token names.
  unsigned char public_key[crypto_sign_PUBLICKEYBYTES];
  crypto_sign_ed25519_sk_to_pk(public_key, parsed.secret_.data());
  unsigned char seed[crypto_sign_SEEDBYTES];
  unsigned char check_public[crypto_sign_PUBLICKEYBYTES];
  unsigned char check_secret[crypto_sign_SECRETKEYBYTES];
  crypto_sign_ed25519_sk_to_seed(seed, parsed.secret_.data());
  crypto_sign_seed_keypair(check_public, check_secret, seed);
  sodium_memzero(seed, sizeof seed);
  sodium_memzero(check_secret, sizeof check_secret);
  if (std::memcmp(check_public, public_key, sizeof public_key) != 0) {
    *why = "the key's public half does not belong to its seed";
    return false;
  }
  if (derive_key_id(public_key) != parsed.id_) {
    *why = "the key id does not match the key";
    return false;
  }
  *key = parsed;
  return true;
}

bool parse_trusted_keys(const std::string& value, TrustedKeys* keys, std::string* why) {
  TrustedKeys parsed;
  std::string_view rest = value;
  const auto separator = [](char c) { return c == ',' || c == ' ' || c == '\t' || c == '\n'; };
  while (!rest.empty()) {
    std::size_t end = 0;
    while (end < rest.size() && !separator(rest[end])) ++end;
    const std::string_view item = rest.substr(0, end);
    rest = end < rest.size() ? rest.substr(end + 1) : std::string_view();
    if (item.empty()) continue;
    std::string reason;
    if (item.front() == '/') {
      std::string text;
      if (!read_small_file(fs::path(std::string(item)), kMaxTrustedKeysFile,
                           [](const struct stat& info) { return CacheTrust::owner_only().check(info); },
                           &text, &reason)) {
        *why = fmt::format("key file {}: {}", item, reason);
        return false;
      }
      const auto lines = key_lines(text);
      if (lines.empty()) {
        *why = fmt::format("key file {}: holds no key", item);
        return false;
      }
      for (std::string_view line : lines) {
        PublicKey key;
        if (!parse_public_key(line, &key, &reason)) {
          *why = fmt::format("key file {}: '{}': {}", item, line.substr(0, 120), reason);
          return false;
        }
        if (!parsed.find(key.id)) parsed.keys.push_back(key);
      }
      continue;
    }
    PublicKey key;
    if (!parse_public_key(item, &key, &reason)) {
      *why = fmt::format("'{}': {}", item.substr(0, 120), reason);
      return false;
    }
    if (!parsed.find(key.id)) parsed.keys.push_back(key);
  }
  *keys = std::move(parsed);
  return true;
}

bool load_signing_key(const fs::path& path, SigningKey* key, std::string* why) {
  std::string text;
  const auto check = [](const struct stat& info) -> std::string {
    if (info.st_uid != ::geteuid())
      return fmt::format("owned by uid {}, not by this user", info.st_uid);
    if ((info.st_mode & 077) != 0)
      return fmt::format("mode {:04o} lets group or others in (chmod 600 it)",
                         info.st_mode & 07777);
    return {};
  };
  const bool read = read_small_file(path, kMaxSecretKeyFile, check, &text, why);
  if (!read) {
    sodium_memzero(text.data(), text.size());
    return false;
  }
  const auto lines = key_lines(text);
  bool ok = false;
  if (lines.size() != 1)
    *why = "holds no secret key, or more than one";
  else
    ok = parse_secret_key(lines.front(), key, why);
  sodium_memzero(text.data(), text.size());
  return ok;
}

bool write_key_pair(const fs::path& prefix, const SigningKey& key, std::string* why) {
  const fs::path secret_path = prefix.string() + ".secret";
  const fs::path public_path = prefix.string() + ".pub";
  const auto write_new = [why](const fs::path& path, const std::string& text, mode_t mode) {
    Fd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode));
    if (!fd) {
      *why = fmt::format("cannot create {}: {}", path.string(), errno_text(errno));
      return false;
    }
    // The umask may have taken bits away; the modes are what the files promise.
    if (::fchmod(fd.get(), mode) != 0 || write_all(fd.get(), text.data(), text.size()) != 0 ||
        ::fsync(fd.get()) != 0) {
      *why = fmt::format("cannot write {}: {}", path.string(), errno_text(errno));
      ::unlink(path.c_str());
      return false;
    }
    return true;
  };
  std::string secret = format_secret_key(key) + "\n";
  const bool wrote_secret = write_new(secret_path, secret, 0600);
  sodium_memzero(secret.data(), secret.size());
  if (!wrote_secret) return false;
  if (!write_new(public_path, format_public_key(key.public_key()) + "\n", 0644)) {
    ::unlink(secret_path.c_str());
    return false;
  }
  return true;
}

EntrySignature sign_entry(const SigningKey& key, std::string_view key_hex, std::string_view variant,
                          const char* payload, std::size_t payload_size) {
  const auto digest = signed_digest(key_hex, variant, payload, payload_size);
  EntrySignature signature;
  signature.key_id = key.id();
  crypto_sign_detached(signature.bytes.data(), nullptr, digest.data(), digest.size(),
                       key.secret().data());
  return signature;
}

void sign_entry_data(const SigningKey& key, std::string_view key_hex, CacheEntryData* entry) {
  entry->signature = sign_entry(key, key_hex, entry->variant_name, entry->payload.data(),
                                entry->payload.size());
}

std::string signature_state_text(SignatureState state, const std::optional<EntrySignature>& sig) {
  const std::string id = sig ? key_id_hex(sig->key_id) : std::string("?");
  switch (state) {
    case SignatureState::valid: return fmt::format("signed by {}", id);
    case SignatureState::unsigned_entry: return "unsigned";
    case SignatureState::unknown_key:
      return fmt::format("signed by {}, a key not in ASTRAI_JIT_TRUSTED_KEYS", id);
    case SignatureState::bad_signature:
      return fmt::format("the signature by {} does not match the entry", id);
  }
  return "unknown";
}

SignatureState verify_entry_signature(std::string_view key_hex, std::string_view variant,
                                      const char* payload, std::size_t payload_size,
                                      const std::optional<EntrySignature>& signature,
                                      const TrustedKeys& trusted) {
  if (!signature) return SignatureState::unsigned_entry;
  const PublicKey* key = trusted.find(signature->key_id);
  if (key == nullptr) return SignatureState::unknown_key;
  const auto digest = signed_digest(key_hex, variant, payload, payload_size);
  return crypto_sign_verify_detached(signature->bytes.data(), digest.data(), digest.size(),
                                     key->bytes.data()) == 0
             ? SignatureState::valid
             : SignatureState::bad_signature;
}

SignatureState verify_entry_signature(std::string_view key_hex, const CacheEntryData& entry,
                                      const TrustedKeys& trusted) {
  return verify_entry_signature(key_hex, entry.variant_name, entry.payload.data(),
                                entry.payload.size(), entry.signature, trusted);
}

}  // namespace astrai::detail
