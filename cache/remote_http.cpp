// The HTTP backend of the remote tier (libcurl): GET and PUT of "<base URL>/<entry file name>",
// the protocol of Bazel/sccache-style HTTP caches and of an nginx WebDAV location. 404 is a
// miss; other failures (refused, timed out, 5xx, 401/403) are errors.
#include <curl/curl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <mutex>

#include <fmt/format.h>

#include "cache/remote_store.hpp"

namespace astrai::detail {

namespace {

void global_init() {
  // Once per process and never cleaned up: other libraries in the process may use libcurl too.
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

struct Download {
  std::vector<char>* bytes = nullptr;
  std::uint64_t cap = 0;
  bool oversized = false;
};

std::size_t on_data(char* data, std::size_t size, std::size_t count, void* user) {
  auto* download = static_cast<Download*>(user);
  const std::size_t n = size * count;
  if (download->bytes->size() + n > download->cap) {
    download->oversized = true;
    return 0;  // aborts the transfer: an oversized entry is never read whole
  }
  download->bytes->insert(download->bytes->end(), data, data + n);
  return n;
}

struct Upload {
  const std::vector<char>* bytes = nullptr;
  std::size_t offset = 0;
};

std::size_t on_read(char* buffer, std::size_t size, std::size_t count, void* user) {
  auto* upload = static_cast<Upload*>(user);
  const std::size_t n = std::min(size * count, upload->bytes->size() - upload->offset);
  std::memcpy(buffer, upload->bytes->data() + upload->offset, n);
  upload->offset += n;
  return n;
}

std::size_t discard(char*, std::size_t size, std::size_t count, void*) { return size * count; }

struct SlistFree {
  void operator()(curl_slist* list) const { curl_slist_free_all(list); }
};

class HttpStore final : public RemoteStore {
 public:
  HttpStore(const RemoteEndpoint& endpoint, const RemoteOptions& options)
      : RemoteStore(endpoint, options) {
    global_init();
    handle_ = curl_easy_init();
    pid_ = ::getpid();
    // Without it, libcurl waits up to a second for "100 Continue" before a large upload's body.
    headers_.reset(curl_slist_append(nullptr, "Expect:"));
  }
  ~HttpStore() override {
    if (handle_) curl_easy_cleanup(handle_);
  }

  RemoteReply get(const std::string& file_name) override {
    std::lock_guard<std::mutex> lock(mutex_);
    RemoteReply result;
    if (!prepare(file_name, &result)) return result;
    Download download{&result.bytes, options_.max_entry_bytes};
    curl_easy_setopt(handle_, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(handle_, CURLOPT_WRITEDATA, &download);
    curl_easy_setopt(handle_, CURLOPT_MAXFILESIZE_LARGE,
                     static_cast<curl_off_t>(options_.max_entry_bytes));
    const CURLcode code = curl_easy_perform(handle_);
    long status = 0;
    curl_easy_getinfo(handle_, CURLINFO_RESPONSE_CODE, &status);
    if (download.oversized || code == CURLE_FILESIZE_EXCEEDED) {
      result.bytes.clear();
      result.status = RemoteStatus::miss;
      result.why = fmt::format("larger than the {} byte cap", options_.max_entry_bytes);
      return result;
    }
    if (code != CURLE_OK) return failed(&result, curl_easy_strerror(code));
    if (status == 404 || status == 410) {
      result.bytes.clear();
      result.status = RemoteStatus::miss;
      return result;
    }
    if (status != 200) return failed(&result, fmt::format("HTTP status {}", status));
    result.status = result.bytes.empty() ? RemoteStatus::miss : RemoteStatus::hit;
    return result;
  }

  RemoteReply put(const std::string& file_name, const std::vector<char>& bytes) override {
    std::lock_guard<std::mutex> lock(mutex_);
    RemoteReply result;
    if (!prepare(file_name, &result)) return result;
    Upload upload{&bytes, 0};
    curl_easy_setopt(handle_, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(handle_, CURLOPT_READFUNCTION, on_read);
    curl_easy_setopt(handle_, CURLOPT_READDATA, &upload);
    curl_easy_setopt(handle_, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(bytes.size()));
    curl_easy_setopt(handle_, CURLOPT_WRITEFUNCTION, discard);
    const CURLcode code = curl_easy_perform(handle_);
    long status = 0;
    curl_easy_getinfo(handle_, CURLINFO_RESPONSE_CODE, &status);
    if (code != CURLE_OK) return failed(&result, curl_easy_strerror(code));
    if (status < 200 || status > 299) return failed(&result, fmt::format("HTTP status {}", status));
    result.status = RemoteStatus::hit;
    return result;
  }

 private:
  // Resets the handle (keeping its connections) and sets what every request shares.
  bool prepare(const std::string& file_name, RemoteReply* result) {
    // A forked child must not reuse its parent's connections: the replies would interleave.
    if (handle_ && pid_ != ::getpid()) {
      curl_easy_cleanup(handle_);
      handle_ = curl_easy_init();
      pid_ = ::getpid();
    }
    if (!handle_) {
      failed(result, "cannot create a libcurl handle");
      return false;
    }
    curl_easy_reset(handle_);
    char* escaped = curl_easy_escape(handle_, file_name.c_str(), static_cast<int>(file_name.size()));
    if (!escaped) {
      failed(result, "cannot escape the entry name");
      return false;
    }
    const std::string url = endpoint_.base_url + "/" + escaped;
    curl_free(escaped);
    curl_easy_setopt(handle_, CURLOPT_URL, url.c_str());
    curl_easy_setopt(handle_, CURLOPT_NOSIGNAL, 1L);  // timeouts without SIGALRM (threads)
    curl_easy_setopt(handle_, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(options_.timeout.count()));
    curl_easy_setopt(handle_, CURLOPT_TIMEOUT_MS, static_cast<long>(options_.timeout.count()));
    curl_easy_setopt(handle_, CURLOPT_HTTPHEADER, headers_.get());
#if LIBCURL_VERSION_NUM >= 0x075500
    curl_easy_setopt(handle_, CURLOPT_PROTOCOLS_STR, "http,https");
#else
    curl_easy_setopt(handle_, CURLOPT_PROTOCOLS, static_cast<long>(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
    return true;
  }

  static const RemoteReply& failed(RemoteReply* result, const std::string& why) {
    result->status = RemoteStatus::error;
    result->bytes.clear();
    result->why = why;
    return *result;
  }

  std::mutex mutex_;
  CURL* handle_ = nullptr;
  pid_t pid_ = 0;  // the process that created handle_ (and its connections)
  std::unique_ptr<curl_slist, SlistFree> headers_;
};

}  // namespace

std::unique_ptr<RemoteStore> make_http_store(const RemoteEndpoint& endpoint,
                                             const RemoteOptions& options) {
  return std::make_unique<HttpStore>(endpoint, options);
}

}  // namespace astrai::detail
