#include "cache/cache_trust.hpp"

#include <grp.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

#include <fmt/format.h>

namespace astrai::detail {

CacheTrust CacheTrust::owner_only() {
  CacheTrust trust;
  trust.uid_ = ::geteuid();
  return trust;
}

CacheTrust CacheTrust::shared_with(gid_t group) {
  CacheTrust trust = owner_only();
  trust.shared_ = true;
  trust.group_ = group;
  return trust;
}

std::string CacheTrust::check(const struct stat& status) const {
  const mode_t mode = status.st_mode;
  if (mode & S_IWOTH) return fmt::format("writable by others (mode {:04o})", mode & 07777);
  const bool owner_ok = status.st_uid == uid_ || status.st_uid == 0;
  if (shared_ && status.st_gid == group_) return {};
  if (!owner_ok) {
    if (shared_)
      return fmt::format("owned by uid {} and group {} (trusted: uid {}, root, group {})",
                         status.st_uid, status.st_gid, uid_, group_);
    return fmt::format("owned by uid {} (trusted: uid {} and root)", status.st_uid, uid_);
  }
  if (mode & S_IWGRP)
    return fmt::format("writable by group {} (mode {:04o})", status.st_gid, mode & 07777);
  return {};
}

bool CacheTrust::openable_by_others(const struct stat& status) const {
  const mode_t mode = status.st_mode;
  if (mode & (S_IROTH | S_IWOTH)) return true;
  const bool trusted_group = shared_ && status.st_gid == group_;
  return !trusted_group && (mode & (S_IRGRP | S_IWGRP)) != 0;
}

bool is_own_group(gid_t group) {
  if (::getegid() == group) return true;
  const int count = ::getgroups(0, nullptr);
  if (count <= 0) return false;
  std::vector<gid_t> groups(static_cast<std::size_t>(count));
  const int got = ::getgroups(count, groups.data());
  for (int i = 0; i < got; ++i)
    if (groups[static_cast<std::size_t>(i)] == group) return true;
  return false;
}

bool parse_cache_sharing(const std::string& text, CacheSharing* sharing, std::string* why) {
  *sharing = CacheSharing{};
  if (text.empty() || text == "0" || text == "off" || text == "no" || text == "false") return true;
  sharing->name = text;
  if (text == "group" || text == "1" || text == "on" || text == "yes" || text == "true") {
    sharing->kind = CacheSharing::Kind::directory_group;
    return true;
  }
  sharing->kind = CacheSharing::Kind::named_group;
  bool numeric = text.size() <= 9;
  for (char c : text) numeric = numeric && c >= '0' && c <= '9';
  if (numeric) {
    sharing->gid = static_cast<gid_t>(std::stoul(text));
    return true;
  }
  std::vector<char> buffer(16384);
  for (int attempt = 0; attempt < 4; ++attempt) {
    struct group entry {};
    struct group* found = nullptr;
    const int rc = ::getgrnam_r(text.c_str(), &entry, buffer.data(), buffer.size(), &found);
    if (rc == ERANGE) {
      buffer.resize(buffer.size() * 4);
      continue;
    }
    if (rc == 0 && found != nullptr) {
      sharing->gid = found->gr_gid;
      return true;
    }
    break;
  }
  *why = fmt::format("no group named '{}'", text);
  return false;
}

}  // namespace astrai::detail
