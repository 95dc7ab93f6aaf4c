#include "cache/remote_tier.hpp"

#include <unistd.h>

#include <utility>

#include <fmt/format.h>

#include "base/logging.hpp"
#include "cache/cache_fs.hpp"
#include "cache/cache_metrics.hpp"

namespace astrai::detail {

namespace {

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void raise_to(std::atomic<std::uint64_t>* value, std::uint64_t candidate) {
  std::uint64_t current = value->load(std::memory_order_relaxed);
  while (candidate > current &&
         !value->compare_exchange_weak(current, candidate, std::memory_order_relaxed)) {
  }
}

}  // namespace

RemoteTier::RemoteTier(const std::vector<RemoteEndpoint>& endpoints,
                       const RemoteTierOptions& options)
    : options_(options) {
  for (const auto& endpoint : endpoints) {
    auto slot = std::make_unique<Slot>();
    slot->store = make_remote_store(endpoint, options_.store);
    slots_.push_back(std::move(slot));
  }
}

RemoteTier::RemoteTier(std::vector<std::unique_ptr<RemoteStore>> stores,
                       const RemoteTierOptions& options)
    : options_(options) {
  for (auto& store : stores) {
    auto slot = std::make_unique<Slot>();
    slot->store = std::move(store);
    slots_.push_back(std::move(slot));
  }
}

RemoteTier::~RemoteTier() {
  if (!queue_) return;
  if (queue_pid_ != static_cast<long>(::getpid())) {
    (void)queue_.release();  // the parent's queue and thread: not ours to stop
    return;
  }
  {
    std::lock_guard<std::mutex> lock(queue_->mutex);
    queue_->stopping = true;
    queue_->deadline = std::chrono::steady_clock::now() + options_.exit_flush;
  }
  queue_->changed.notify_all();
  if (queue_->thread) queue_->thread->join();
}

RemoteTier::PublishQueue& RemoteTier::own_queue() {
  const long pid = static_cast<long>(::getpid());
  if (queue_ && queue_pid_ != pid) (void)queue_.release();  // inherited through fork: leave it
  if (!queue_) {
    queue_ = std::make_unique<PublishQueue>();
    queue_pid_ = pid;
  }
  return *queue_;
}

bool RemoteTier::available(const Slot& slot) const {
  const std::int64_t until = slot.down_until.load(std::memory_order_relaxed);
  return until == 0 || now_ns() >= until;
}

bool RemoteTier::any_available() const {
  for (const auto& slot : slots_)
    if (available(*slot)) return true;
  return false;
}

void RemoteTier::mark_down(Slot& slot, const std::string& why) {
  errors_.fetch_add(1, std::memory_order_relaxed);
  // The process-wide metrics (cache_metrics(), Prometheus) count it too.
  CacheMetricsRegistry& metrics = cache_metrics_registry();
  metrics.count(metrics.remote_errors);
  const auto retry = std::chrono::duration_cast<std::chrono::nanoseconds>(options_.retry_after);
  slot.down_until.store(now_ns() + retry.count(), std::memory_order_relaxed);
  const std::string& shown = slot.store->endpoint().shown;
  log_once(LogLevel::warn, "remote-down:" + shown,
           "remote kernel cache {} is unavailable ({}); working from the local cache without "
           "it, trying it again every {} s",
           shown, why, options_.retry_after.count() / 1000);
  log(LogLevel::debug, "remote kernel cache {} failed: {}", shown, why);
}

void RemoteTier::mark_up(Slot& slot) {
  if (slot.down_until.load(std::memory_order_relaxed) != 0) {
    slot.down_until.store(0, std::memory_order_relaxed);
    log(LogLevel::info, "remote kernel cache {} answers again", slot.store->endpoint().shown);
  }
}

std::optional<std::vector<char>> RemoteTier::fetch(const std::string& file_name) {
  for (auto& slot : slots_) {
    std::lock_guard<std::mutex> busy(slot->busy);
    if (!available(*slot)) continue;
    const auto start = std::chrono::steady_clock::now();
    RemoteReply reply = slot->store->get(file_name);
    const auto micros = static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() -
                                                              start)
            .count());
    fetch_count_.fetch_add(1, std::memory_order_relaxed);
    fetch_micros_total_.fetch_add(micros, std::memory_order_relaxed);
    raise_to(&fetch_micros_max_, micros);
    if (reply.status == RemoteStatus::error) {
      mark_down(*slot, reply.why);
      continue;
    }
    mark_up(*slot);
    if (reply.status == RemoteStatus::hit) {
      hits_.fetch_add(1, std::memory_order_relaxed);
      return std::move(reply.bytes);
    }
    if (!reply.why.empty()) note_rejected(file_name, reply.why);  // e.g. over the size cap
  }
  misses_.fetch_add(1, std::memory_order_relaxed);
  return std::nullopt;
}

void RemoteTier::note_rejected(const std::string& file_name, const std::string& why) {
  rejected_.fetch_add(1, std::memory_order_relaxed);
  log_once(LogLevel::warn, "remote-rejected:" + file_name,
           "refused remote kernel cache entry {}: {}; nothing of it is loaded, compiling instead",
           file_name, why);
}

void RemoteTier::publish(std::string file_name, std::vector<char> bytes, std::string key_hex,
                         std::string token) {
  Job job{std::move(file_name), std::move(bytes), std::move(key_hex), std::move(token)};
  PublishQueue& queue = own_queue();
  {
    std::lock_guard<std::mutex> lock(queue.mutex);
    if (queue.stopping || queue.jobs.size() >= options_.max_queued) {
      dropped_.fetch_add(1, std::memory_order_relaxed);
      log(LogLevel::debug, "remote publish queue full: not publishing {}", job.file_name);
      return;  // a lease that came with it expires by itself
    }
    queue.jobs.push_back(std::move(job));
    // Started by the first publish: a process that only loads never runs the thread.
    if (!queue.thread)
      queue.thread = std::make_unique<std::thread>([this, &queue] { run_publisher(&queue); });
  }
  queue.changed.notify_all();
}

void RemoteTier::run_publisher(PublishQueue* queue) {
  std::unique_lock<std::mutex> lock(queue->mutex);
  for (;;) {
    queue->changed.wait(lock, [queue] { return queue->stopping || !queue->jobs.empty(); });
    if (queue->jobs.empty()) break;  // stopping, nothing left
    if (queue->stopping && std::chrono::steady_clock::now() >= queue->deadline) {
      dropped_.fetch_add(queue->jobs.size(), std::memory_order_relaxed);
      log(LogLevel::debug, "exiting: {} remote publishes dropped", queue->jobs.size());
      queue->jobs.clear();
      break;
    }
    Job job = std::move(queue->jobs.front());
    queue->jobs.pop_front();
    queue->busy = true;
    lock.unlock();
    publish_job(job);
    lock.lock();
    queue->busy = false;
    queue->changed.notify_all();
  }
  queue->busy = false;
  queue->changed.notify_all();
}

void RemoteTier::publish_job(const Job& job) {
  for (auto& slot : slots_) {
    std::lock_guard<std::mutex> busy(slot->busy);
    if (!available(*slot)) {
      dropped_.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    RemoteReply reply = slot->store->put(job.file_name, job.bytes);
    if (reply.status == RemoteStatus::error) {
      mark_down(*slot, reply.why);
      continue;
    }
    published_.fetch_add(1, std::memory_order_relaxed);
    log(LogLevel::debug, "published {} to {}", job.file_name, slot->store->endpoint().shown);
  }
  if (!job.token.empty()) release(job.key_hex, job.token);
}

bool RemoteTier::flush(std::chrono::milliseconds max_wait) {
  PublishQueue& queue = own_queue();
  std::unique_lock<std::mutex> lock(queue.mutex);
  return queue.changed.wait_for(lock, max_wait,
                                [&queue] { return queue.jobs.empty() && !queue.busy; });
}

bool RemoteTier::put_now(const std::string& file_name, const std::vector<char>& bytes,
                         std::string* why) {
  bool stored = false;
  for (auto& slot : slots_) {
    std::lock_guard<std::mutex> busy(slot->busy);
    if (!available(*slot)) continue;
    RemoteReply reply = slot->store->put(file_name, bytes);
    if (reply.status == RemoteStatus::error) {
      *why = fmt::format("{}: {}", slot->store->endpoint().shown, reply.why);
      mark_down(*slot, reply.why);
      continue;
    }
    published_.fetch_add(1, std::memory_order_relaxed);
    stored = true;
  }
  if (!stored && why->empty()) *why = "no remote store is answering";
  return stored;
}

LeaseOutcome RemoteTier::try_lease(const std::string& key_hex, std::string* token) {
  if (options_.lease.count() <= 0) return LeaseOutcome::unsupported;
  if (token->empty())
    *token = fmt::format("{}-{:016x}", static_cast<long>(::getpid()), random_u64());
  for (auto& slot : slots_) {
    std::lock_guard<std::mutex> busy(slot->busy);
    if (!available(*slot)) continue;
    std::string why;
    const LeaseOutcome outcome = slot->store->try_lease(key_hex, options_.lease, *token, &why);
    if (outcome != LeaseOutcome::unsupported) return outcome;
    if (!why.empty()) mark_down(*slot, why);
  }
  return LeaseOutcome::unsupported;
}

void RemoteTier::release(const std::string& key_hex, const std::string& token) {
  for (auto& slot : slots_) {
    std::lock_guard<std::mutex> busy(slot->busy);
    if (available(*slot)) slot->store->release(key_hex, token);
  }
}

RemoteCounters RemoteTier::counters() const {
  RemoteCounters c;
  c.hits = hits_.load(std::memory_order_relaxed);
  c.misses = misses_.load(std::memory_order_relaxed);
  c.errors = errors_.load(std::memory_order_relaxed);
  c.rejected = rejected_.load(std::memory_order_relaxed);
  c.published = published_.load(std::memory_order_relaxed);
  c.publish_dropped = dropped_.load(std::memory_order_relaxed);
  c.lease_waits = lease_waits_.load(std::memory_order_relaxed);
  c.fetch_count = fetch_count_.load(std::memory_order_relaxed);
  c.fetch_micros_total = fetch_micros_total_.load(std::memory_order_relaxed);
  c.fetch_micros_max = fetch_micros_max_.load(std::memory_order_relaxed);
  return c;
}

std::string RemoteTier::describe() const {
  std::string text;
  for (const auto& slot : slots_)
    text += (text.empty() ? "" : ", ") + slot->store->endpoint().shown;
  return text;
}

}  // namespace astrai::detail
