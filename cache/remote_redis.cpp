// The Redis backend of the remote tier (hiredis, synchronous): GET/SET of entry files under a
// prefix that carries the entry format version, and leases by SET NX PX.
#include <sys/time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include <mutex>
#include <utility>

#include <fmt/format.h>

#include "cache/remote_store.hpp"

namespace astrai::detail {

namespace {

struct ReplyFree {
  void operator()(redisReply* reply) const {
    if (reply) freeReplyObject(reply);
  }
};
using Reply = std::unique_ptr<redisReply, ReplyFree>;

struct ContextFree {
  void operator()(redisContext* context) const {
    if (context) redisFree(context);
  }
};
using Context = std::unique_ptr<redisContext, ContextFree>;

timeval to_timeval(std::chrono::milliseconds ms) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(ms.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((ms.count() % 1000) * 1000);
  return tv;
}

// Deletes the lease only while it still holds our token (an expired lease may be another's).
constexpr const char* kReleaseScript =
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end "
    "return 0";

class RedisStore final : public RemoteStore {
 public:
  RedisStore(const RemoteEndpoint& endpoint, const RemoteOptions& options)
      : RemoteStore(endpoint, options) {}

  RemoteReply get(const std::string& file_name) override {
    const std::string key = redis_entry_key(file_name);
    // GETRANGE reads at most one byte past the cap, so an oversized value is never read whole.
    const long long last = static_cast<long long>(options_.max_entry_bytes);
    std::lock_guard<std::mutex> lock(mutex_);
    RemoteReply result;
    Reply reply = command(&result.why, "GETRANGE %b 0 %lld", key.data(), key.size(), last);
    if (!reply) {
      result.status = RemoteStatus::error;
      return result;
    }
    if (reply->type == REDIS_REPLY_ERROR) {  // e.g. the key holds another type: not ours
      result.why = fmt::format("Redis refused GETRANGE: {}", std::string(reply->str, reply->len));
      return result;
    }
    if (reply->type != REDIS_REPLY_STRING || reply->len == 0) return result;  // miss
    if (static_cast<std::uint64_t>(reply->len) > options_.max_entry_bytes) {
      result.why = fmt::format("larger than the {} byte cap", options_.max_entry_bytes);
      return result;
    }
    result.status = RemoteStatus::hit;
    result.bytes.assign(reply->str, reply->str + reply->len);
    return result;
  }

  RemoteReply put(const std::string& file_name, const std::vector<char>& bytes) override {
    const std::string key = redis_entry_key(file_name);
    std::lock_guard<std::mutex> lock(mutex_);
    RemoteReply result;
    Reply reply = command(&result.why, "SET %b %b", key.data(), key.size(), bytes.data(),
                          bytes.size());
    if (!reply || reply->type == REDIS_REPLY_ERROR) {
      // A full Redis (maxmemory without eviction) answers with an error: stop publishing.
      if (reply) result.why = std::string(reply->str, reply->len);
      result.status = RemoteStatus::error;
      return result;
    }
    result.status = RemoteStatus::hit;
    return result;
  }

  LeaseOutcome try_lease(const std::string& key_hex, std::chrono::milliseconds length,
                         const std::string& token, std::string* why) override {
    const std::string key = redis_lease_key(key_hex);
    std::lock_guard<std::mutex> lock(mutex_);
    Reply reply = command(why, "SET %b %b NX PX %lld", key.data(), key.size(), token.data(),
                          token.size(), static_cast<long long>(length.count()));
    if (!reply) return LeaseOutcome::unsupported;
    if (reply->type == REDIS_REPLY_STATUS) return LeaseOutcome::acquired;
    if (reply->type == REDIS_REPLY_NIL) return LeaseOutcome::held;
    if (reply->type == REDIS_REPLY_ERROR) *why = std::string(reply->str, reply->len);
    return LeaseOutcome::unsupported;
  }

  void release(const std::string& key_hex, const std::string& token) override {
    const std::string key = redis_lease_key(key_hex);
    std::lock_guard<std::mutex> lock(mutex_);
    std::string ignored;
    command(&ignored, "EVAL %s 1 %b %b", kReleaseScript, key.data(), key.size(), token.data(),
            token.size());
  }

 private:
  // Connects when there is no live connection; false with a reason.
  bool connect(std::string* why) {
    // A forked child must not talk over its parent's connection: the replies would interleave.
    if (context_ && pid_ != ::getpid()) context_.reset();
    if (context_) return true;
    std::string host = endpoint_.host;
    if (host.size() > 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
    Context context(redisConnectWithTimeout(host.c_str(), endpoint_.port,
                                            to_timeval(options_.timeout)));
    if (!context || context->err) {
      *why = context ? context->errstr : "cannot allocate a Redis context";
      return false;
    }
    if (redisSetTimeout(context.get(), to_timeval(options_.timeout)) != REDIS_OK) {
      *why = context->errstr;
      return false;
    }
    context_ = std::move(context);
    pid_ = ::getpid();
    if (!endpoint_.password.empty() && !simple_command(why, "AUTH %b", endpoint_.password.data(),
                                                       endpoint_.password.size()))
      return false;
    if (endpoint_.database != 0 && !simple_command(why, "SELECT %d", endpoint_.database))
      return false;
    return true;
  }

  // A command whose reply must not be an error; the connection is dropped when it is.
  template <typename... Args>
  bool simple_command(std::string* why, const char* format, Args... args) {
    Reply reply(static_cast<redisReply*>(redisCommand(context_.get(), format, args...)));
    if (reply && reply->type != REDIS_REPLY_ERROR) return true;
    *why = reply ? std::string(reply->str, reply->len) : std::string(context_->errstr);
    context_.reset();
    return false;
  }

  // Runs a command; nullptr (with `why`) when the connection failed, which is then dropped so
  // that the next request reconnects.
  template <typename... Args>
  Reply command(std::string* why, const char* format, Args... args) {
    if (!connect(why)) return nullptr;
    Reply reply(static_cast<redisReply*>(redisCommand(context_.get(), format, args...)));
    if (!reply) {
      *why = context_->errstr[0] != '\0' ? context_->errstr : "no reply";
      context_.reset();
    }
    return reply;
  }

  std::mutex mutex_;
  Context context_;
  pid_t pid_ = 0;  // the process that opened context_
};

}  // namespace

std::unique_ptr<RemoteStore> make_redis_store(const RemoteEndpoint& endpoint,
                                              const RemoteOptions& options) {
  return std::make_unique<RedisStore>(endpoint, options);
}

}  // namespace astrai::detail
