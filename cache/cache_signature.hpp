// Signed cache entries: Ed25519 keys (libsodium), their text forms, and the one check every
// tier applies to an entry before it is used (the disk cache and its layers, import, and a
// remote tier on the bytes it fetched). Pure functions over bytes, plus the reading of key files.
//
// What a signature covers: the entry's cache key (its 32 hex digits), its variant name and its
// payload (kernel symbols and binary), hashed with BLAKE2b-512 under a domain string; the
// digest is signed with crypto_sign_detached. The NVRTC version and the target are in the key.
//
// Text forms (one token, no blanks):
//   public key   ed25519:<key id, 16 hex>:<32-byte key, base64>
//   secret key   ed25519-secret:<key id, 16 hex>:<64-byte libsodium secret key, base64>
// The key id is the first 8 bytes of BLAKE2b of the public key; a token whose id does not match
// its key is refused (a truncated or mixed-up key is noticed).
#pragma once

#include <array>
#include <cstddef>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cache/cache_entry.hpp"

namespace astrai::detail {

using SigningKeyId = std::array<unsigned char, kSignatureKeyIdBytes>;

struct PublicKey {
  SigningKeyId id{};
  std::array<unsigned char, 32> bytes{};
};

// The keys ASTRAI_JIT_TRUSTED_KEYS names. Empty: signatures are not required (unsigned entries
// load as they always did; signed ones load too, their signature unchecked).
struct TrustedKeys {
  std::vector<PublicKey> keys;
  bool empty() const { return keys.empty(); }
  const PublicKey* find(const SigningKeyId& id) const;
};

// A secret key (ASTRAI_JIT_SIGNING_KEY, `astrai-jit keygen`). The bytes are wiped on destruction.
class SigningKey {
 public:
  SigningKey() = default;
  SigningKey(const SigningKey& other) = default;
  SigningKey& operator=(const SigningKey& other) = default;
  ~SigningKey();
  // A fresh random key pair.
  static SigningKey generate();
  const SigningKeyId& id() const { return id_; }
  PublicKey public_key() const;
  const std::array<unsigned char, 64>& secret() const { return secret_; }

 private:
  friend bool parse_secret_key(std::string_view, SigningKey*, std::string*);
  SigningKeyId id_{};
  std::array<unsigned char, 64> secret_{};
};

std::string key_id_hex(const SigningKeyId& id);
std::string format_public_key(const PublicKey& key);
std::string format_secret_key(const SigningKey& key);
// Parse one token (surrounding blanks ignored); false with a short reason.
bool parse_public_key(std::string_view token, PublicKey* key, std::string* why);
bool parse_secret_key(std::string_view token, SigningKey* key, std::string* why);

// ASTRAI_JIT_TRUSTED_KEYS: items separated by commas or blanks, each a public key token or the
// absolute path of a file of them (one a line; `#` starts a comment; at most 64 KiB; a regular
// file owned by the user or root and writable by nobody else, never through a symbolic link).
// False with a reason naming the bad item. An empty value is an empty list.
bool parse_trusted_keys(const std::string& value, TrustedKeys* keys, std::string* why);

// Reads a secret key file (ASTRAI_JIT_SIGNING_KEY, `--key`, `--sign`): a regular file of the
// user's, not a symbolic link, with no permission for group or others (0600 or 0400), at most
// 4 KiB, holding one secret key token (`#` comment lines allowed). False with a reason.
bool load_signing_key(const std::filesystem::path& path, SigningKey* key, std::string* why);

// Writes a new key pair as PREFIX.secret (0600, created exclusively) and PREFIX.pub (0644).
// False with a reason (an existing file is never overwritten).
bool write_key_pair(const std::filesystem::path& prefix, const SigningKey& key, std::string* why);

// The signature of an entry's key, variant and payload.
EntrySignature sign_entry(const SigningKey& key, std::string_view key_hex, std::string_view variant,
                          const char* payload, std::size_t payload_size);
// Signs `entry` in place (it becomes a format 3 entry when encoded).
void sign_entry_data(const SigningKey& key, std::string_view key_hex, CacheEntryData* entry);

enum class SignatureState { valid, unsigned_entry, unknown_key, bad_signature };
// "signed by <id>", "unsigned", "signed by <id>, a key not in ASTRAI_JIT_TRUSTED_KEYS",
// "signature by <id> does not match".
std::string signature_state_text(SignatureState state, const std::optional<EntrySignature>& sig);

// The check of every tier: whether `signature` is a valid signature, by one of `trusted`, of
// this key, variant and payload. With an empty `trusted`, a present signature is checked against
// nothing and reported as unknown_key; callers decide what an empty list means (see TrustedKeys).
SignatureState verify_entry_signature(std::string_view key_hex, std::string_view variant,
                                      const char* payload, std::size_t payload_size,
                                      const std::optional<EntrySignature>& signature,
                                      const TrustedKeys& trusted);
// The same for a decoded entry.
SignatureState verify_entry_signature(std::string_view key_hex, const CacheEntryData& entry,
                                      const TrustedKeys& trusted);

}  // namespace astrai::detail
