#include "cache/cache_trust.hpp"

#include <grp.h>
#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <limits>
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

CacheTrust CacheTrust::shared_with(gid_t group, const std::vector<uid_t>& owners) {
  CacheTrust trust = shared_with(group);
  trust.owners_listed_ = true;
  trust.owners_ = owners;
  return trust;
}

bool CacheTrust::trusted_owner(uid_t owner) const {
  return owner == uid_ || owner == 0 ||
         (owners_listed_ && std::find(owners_.begin(), owners_.end(), owner) != owners_.end());
}

std::string CacheTrust::trusted_text() const {
  std::string text = fmt::format("uid {}, root", uid_);
  for (uid_t owner : owners_) text += fmt::format(", uid {}", owner);
  return text;
}

std::string CacheTrust::check(const struct stat& status) const {
  const mode_t mode = status.st_mode;
  if (mode & S_IWOTH) return fmt::format("writable by others (mode {:04o})", mode & 07777);
  const bool owner_ok = trusted_owner(status.st_uid);
  if (owners_listed_ && !owner_ok)
    return fmt::format("owned by uid {}, who is not in ASTRAI_JIT_CACHE_OWNERS (trusted: {})",
                       status.st_uid, trusted_text());
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

namespace {

// One item of ASTRAI_JIT_CACHE_OWNERS: a numeric uid or a user name from the user database.
bool parse_owner(const std::string& item, uid_t* uid, std::string* why) {
  if (std::all_of(item.begin(), item.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    // (uid_t)-1 means "no change" to chown and is nobody's uid.
    constexpr unsigned long long kLimit = std::numeric_limits<uid_t>::max();
    if (item.size() > 10 || std::stoull(item) >= kLimit) {
      *why = fmt::format("uid {} is out of range (at most {})", item, kLimit - 1);
      return false;
    }
    *uid = static_cast<uid_t>(std::stoull(item));
    return true;
  }
  std::vector<char> buffer(16384);
  for (int attempt = 0; attempt < 4; ++attempt) {
    struct passwd entry {};
    struct passwd* found = nullptr;
    const int rc = ::getpwnam_r(item.c_str(), &entry, buffer.data(), buffer.size(), &found);
    if (rc == ERANGE) {
      buffer.resize(buffer.size() * 4);
      continue;
    }
    if (rc == 0 && found != nullptr) {
      *uid = found->pw_uid;
      return true;
    }
    break;
  }
  *why = fmt::format("no user named '{}'", item);
  return false;
}

bool is_blank(char c) { return c == ' ' || c == '\t'; }

}  // namespace

bool parse_cache_owners(const std::string& text, std::vector<uid_t>* owners, std::string* why) {
  owners->clear();
  if (std::all_of(text.begin(), text.end(), is_blank)) return true;
  std::size_t begin = 0;
  for (;;) {
    const std::size_t end = std::min(text.find(',', begin), text.size());
    std::size_t first = begin;
    std::size_t last = end;
    while (first < last && is_blank(text[first])) ++first;
    while (last > first && is_blank(text[last - 1])) --last;
    if (first == last) {
      *why = "an empty name";
      return false;
    }
    uid_t uid = 0;
    if (!parse_owner(text.substr(first, last - first), &uid, why)) return false;
    if (std::find(owners->begin(), owners->end(), uid) == owners->end()) owners->push_back(uid);
    if (end == text.size()) return true;
    begin = end + 1;
  }
}

}  // namespace astrai::detail
