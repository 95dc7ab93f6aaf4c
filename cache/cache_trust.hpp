// Who may have written what the cache reads.
//
// A cubin loaded from the cache runs inside the caller's CUDA context and can read and write
// all of that process's GPU memory, so whoever can write a cache directory can run code in
// every process that uses it. The rule below is checked on opened file descriptors (fstat of a
// descriptor opened with O_NOFOLLOW), never on path names, so a file swapped or symlinked in
// between a check and its use is never trusted by mistake.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <string>
#include <vector>

namespace astrai::detail {

// ASTRAI_JIT_CACHE_SHARED: off (default, owner only), the cache root's own group ("group"), or
// a group named by the user (resolved to its gid when the environment is read).
struct CacheSharing {
  enum class Kind { off, directory_group, named_group };
  Kind kind = Kind::off;
  gid_t gid = 0;          // named_group only
  std::string name;       // as given, for messages
  // ASTRAI_JIT_CACHE_OWNERS: when listed, group membership alone no longer makes a file
  // trusted (a former member keeps files in the group): only the user, root and these uids.
  bool owners_listed = false;
  std::vector<uid_t> owners;
  bool enabled() const { return kind != Kind::off; }
};

// The rule for one cache tree, with the shared group resolved (a directory_group cache takes
// the group of its root directory).
//   owner only: owned by the effective uid or root, not writable by group or others.
//   shared:     as above, or belonging to the shared group; never writable by others.
//   shared, with an owner list: owned by the effective uid, root or a listed uid, and either
//               in the shared group or not writable by group; never writable by others.
class CacheTrust {
 public:
  CacheTrust() = default;
  static CacheTrust owner_only();
  static CacheTrust shared_with(gid_t group);
  static CacheTrust shared_with(gid_t group, const std::vector<uid_t>& owners);

  // Empty when a file or directory with this status may be used; otherwise the reason, e.g.
  // "owned by uid 1234 (trusted: uid 0 and root)".
  std::string check(const struct stat& status) const;

  // Whether someone this rule does not trust may open a file with this status for reading or
  // writing: the others' bits, and the group's unless it is the shared group. Such a user can
  // hold an flock on it (a read descriptor is enough), which matters for lock files.
  bool openable_by_others(const struct stat& status) const;

  bool shared() const { return shared_; }
  gid_t group() const { return group_; }
  // Modes for what the cache creates: private 0700/0600, shared 02770/0660 (setgid so that
  // new files and directories take the shared group).
  mode_t directory_mode() const { return shared_ ? 02770 : 0700; }
  mode_t file_mode() const { return shared_ ? 0660 : 0600; }

 private:
  bool trusted_owner(uid_t owner) const;
  std::string trusted_text() const;
  bool shared_ = false;
  bool owners_listed_ = false;
  gid_t group_ = 0;
  uid_t uid_ = 0;
  std::vector<uid_t> owners_;
};

// Whether the process is a member of `group` (effective or supplementary). A shared cache's
// group must be one of ours: a directory of a group we are not in is someone else's.
bool is_own_group(gid_t group);

// Parses ASTRAI_JIT_CACHE_SHARED: "" or "0"/"off"/"no"/"false" = off, "group" (the cache
// root's group), a group name or a numeric gid. nullopt-like failure: returns false and sets
// `why` (an unknown group name).
bool parse_cache_sharing(const std::string& text, CacheSharing* sharing, std::string* why);

// Parses ASTRAI_JIT_CACHE_OWNERS: comma-separated user names or numeric uids, blanks around each
// ignored; an empty text is an empty list (only the user and root). False with `why` set for an
// empty item, an unknown user or a uid out of range.
bool parse_cache_owners(const std::string& text, std::vector<uid_t>* owners, std::string* why);

}  // namespace astrai::detail
