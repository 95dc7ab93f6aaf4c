// A remote store of cache entry files shared by the nodes of a cluster (ASTRAI_JIT_REMOTE):
// Redis (cache/remote_redis.cpp) or an HTTP server that takes GET and PUT, such as an nginx
// WebDAV location or a Bazel/sccache-style HTTP cache (cache/remote_http.cpp).
//
// A store moves bytes only. What it returns is never trusted: its users (the engine, `cache
// pull`) hand fetched bytes to DiskCache::verify_entry_file (cache/disk_cache.hpp), the check
// every entry file from elsewhere goes through, before anything is loaded or stored.
//
// Names on the remote: the entry's local file name "<32 hex key>.<variant>.cubin"; in Redis
// under the prefix "astrai-jit:v<entry format>:", over HTTP as "<base URL>/<file name>".
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace astrai::detail {

struct RemoteEndpoint {
  enum class Kind { redis, http };
  Kind kind = Kind::redis;
  std::string url;       // as configured (may carry a password: never printed)
  std::string shown;     // the URL without user or password, for messages
  // redis: host, port, database, password (empty: no AUTH)
  std::string host;
  int port = 6379;
  int database = 0;
  std::string password;
  // http(s): the base URL without a trailing slash (user and password kept for libcurl)
  std::string base_url;
};

// What ASTRAI_JIT_REMOTE accepts, for messages.
inline constexpr const char* kRemoteAllowed =
    "a comma-separated list of redis://[:password@]host[:port][/db] and "
    "http[s]://[user:password@]host[:port][/prefix], e.g. redis://10.0.0.5:6379/0,"
    "http://cache.internal/astrai";

// Parses ASTRAI_JIT_REMOTE. False with a reason naming the offending item; empty text is an
// empty list. Duplicates are dropped.
bool parse_remote_endpoints(const std::string& text, std::vector<RemoteEndpoint>* endpoints,
                            std::string* why);

struct RemoteOptions {
  // Connect and per-request I/O limit (ASTRAI_JIT_REMOTE_TIMEOUT_MS).
  std::chrono::milliseconds timeout{300};
  // Entries larger than this are refused before they are read whole.
  std::uint64_t max_entry_bytes = 0;
};

// The outcome of one request. `error` means the store did not answer properly (down, slow,
// refused, a protocol error): the tier stops asking it for a while.
enum class RemoteStatus { hit, miss, error };

struct RemoteReply {
  RemoteStatus status = RemoteStatus::miss;
  std::vector<char> bytes;  // get: the entry file's bytes, unverified
  std::string why;          // error (or an oversized entry on a miss): what happened
};

enum class LeaseOutcome {
  acquired,     // ours until released or expired
  held,         // another node holds it: it is compiling this key
  unsupported,  // the store has no leases (HTTP), or failed to answer
};

class RemoteStore {
 public:
  virtual ~RemoteStore() = default;
  const RemoteEndpoint& endpoint() const { return endpoint_; }

  // The entry file "<key_hex>.<variant>.cubin". A value over the size cap is a miss whose
  // `why` says so (never read whole).
  virtual RemoteReply get(const std::string& file_name) = 0;
  virtual RemoteReply put(const std::string& file_name, const std::vector<char>& bytes) = 0;
  // A short exclusive claim on `key_hex` (one compile per key across the cluster), expiring
  // after `length`; `token` identifies the holder for release.
  virtual LeaseOutcome try_lease(const std::string& key_hex, std::chrono::milliseconds length,
                                 const std::string& token, std::string* why);
  // Releases a lease only while `token` still holds it (an expired one may be another's now).
  virtual void release(const std::string& key_hex, const std::string& token);

 protected:
  RemoteStore(RemoteEndpoint endpoint, RemoteOptions options)
      : endpoint_(std::move(endpoint)), options_(options) {}
  RemoteEndpoint endpoint_;
  RemoteOptions options_;
};

// A store for `endpoint`. Throws astrai::ConfigError when this build has no support for its
// kind (built without hiredis or libcurl). Connects lazily: never fails for a remote that is down.
std::unique_ptr<RemoteStore> make_remote_store(const RemoteEndpoint& endpoint,
                                               const RemoteOptions& options);

// Backends (defined only when built with their library).
std::unique_ptr<RemoteStore> make_redis_store(const RemoteEndpoint& endpoint,
                                              const RemoteOptions& options);
std::unique_ptr<RemoteStore> make_http_store(const RemoteEndpoint& endpoint,
                                             const RemoteOptions& options);

// The Redis key of an entry file and of a key's lease.
std::string redis_entry_key(const std::string& file_name);
std::string redis_lease_key(const std::string& key_hex);

}  // namespace astrai::detail
