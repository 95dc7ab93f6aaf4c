// Cache directories on network file systems (NFS, SMB, Lustre, ...), where flock() may fail,
// hang on a lock daemon, or lock only within one client (ASTRAI_JIT_CACHE_NFS). There the cache
// takes no compile locks: entries are still published by atomic rename (a reader sees a whole
// entry or none), and processes that miss the same variant at the same moment each compile it,
// a duplicate bounded by the number of processes racing.
#pragma once

namespace astrai::detail {

enum class NetworkFsMode {
  automatic,  // detect from the cache root's file system type
  on,         // treat the cache as on a network file system
  off,        // always lock with flock()
};

// True for a statfs() f_type of a network or cluster file system.
bool is_network_fs_type(long f_type);

// Whether the directory open as `fd` is on a network file system (false when unknown).
bool on_network_fs(int fd);

}  // namespace astrai::detail
