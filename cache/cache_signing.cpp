// The disk cache's side of signed entries: the check load() and stage_import() apply with
// trusted keys set, verify()'s report, and `cache sign`.
#include <sys/stat.h>

#include <fmt/format.h>

#include "cache/cache_metrics.hpp"
#include "cache/disk_cache.hpp"
#include "cache/disk_cache_internal.hpp"
#include "cache/variant_payload.hpp"

namespace astrai::detail {

std::string DiskCache::signature_refusal(const std::string& key_hex, const CacheEntryData& entry,
                                         const struct stat* file) const {
  const SignatureState state = verify_entry_signature(key_hex, entry, *trusted_keys_);
  if (state == SignatureState::valid) return {};
  bool again = false;
  if (file != nullptr) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto device = static_cast<std::uint64_t>(file->st_dev);
    const auto inode = static_cast<std::uint64_t>(file->st_ino);
    again = device == last_refused_device_ && inode == last_refused_inode_;
    last_refused_device_ = device;
    last_refused_inode_ = inode;
  }
  if (!again) cache_metrics_registry().count(cache_metrics_registry().signature_refusals);
  return signature_state_text(state, entry.signature) +
         " (ASTRAI_JIT_TRUSTED_KEYS asks for a valid signature by a trusted key)";
}

void DiskCache::assess_signature(CacheEntryInfo* info, const std::vector<char>& bytes) const {
  const auto entry = decode_entry(bytes.data(), bytes.size());
  if (!entry) return;  // read_entry_file decoded it just before: not reached
  if (!requires_signatures()) {
    info->signature = entry->signature
                          ? fmt::format("signed by {} (not checked: no ASTRAI_JIT_TRUSTED_KEYS)",
                                        key_id_hex(entry->signature->key_id))
                          : std::string("unsigned");
    return;
  }
  const SignatureState state = verify_entry_signature(info->key_hex, *entry, *trusted_keys_);
  info->signature = signature_state_text(state, entry->signature);
  info->signature_refused = state != SignatureState::valid;
}

bool DiskCache::contains_signed(const CacheKey& key, const std::string& variant_name) const {
  CacheEntryInfo info;
  info.path = entry_path(key, variant_name);
  info.key_hex = key.hex();
  info.variant_name = variant_name;
  std::vector<char> bytes;
  std::string why;
  if (!read_entry_file(info, &bytes, &why)) return false;
  const auto entry = decode_entry(bytes.data(), bytes.size());
  return entry && verify_entry_signature(info.key_hex, *entry, *trusted_keys_) ==
                      SignatureState::valid;
}

std::uint64_t DiskCache::sign_entries(const SigningKey& key, std::vector<std::string>* problems) {
  std::uint64_t signed_count = 0;
  if (!usable_for_write()) {
    problems->push_back(fmt::format("cannot write the cache at {}", root_.string()));
    return 0;
  }
  for (const auto& info : list()) {
    std::vector<char> bytes;
    std::string why;
    auto fail = [&](const std::string& reason) {
      problems->push_back(fmt::format("not signed: {} ({}): {}", info.variant_name,
                                      info.path.string(), reason));
    };
    if (!read_entry_file(info, &bytes, &why)) {
      fail(why);
      continue;
    }
    auto entry = decode_entry(bytes.data(), bytes.size(), &why);
    if (!entry || !check_variant_payload(entry->kind, entry->payload, &why)) {
      fail(why);
      continue;
    }
    sign_entry_data(key, info.key_hex, &*entry);
    // The replace goes through the import path: a temp file beside the entry, checked like a
    // load, renamed over it only if the file there is still one the trust rule accepts.
    StagedEntry staged;
    if (!stage_import(info.path.filename().string(), encode_entry(*entry), &staged, &why)) {
      fail(why);
      continue;
    }
    if (!commit_import(staged, &why)) {
      fail(why);
      continue;
    }
    ++signed_count;
  }
  return signed_count;
}

}  // namespace astrai::detail
