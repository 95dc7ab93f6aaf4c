#include "cache/remote_store.hpp"

#include <algorithm>
#include <cctype>
#include <string_view>

#include <fmt/format.h>

#include "astrai/error.hpp"
#include "cache/cache_entry.hpp"

namespace astrai::detail {

namespace {

std::string_view trim_url_blanks(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front())))
    text.remove_prefix(1);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back())))
    text.remove_suffix(1);
  return text;
}

bool all_digits(std::string_view text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
    return c >= '0' && c <= '9';
  });
}

// A host: a name or IPv4 address, or an IPv6 address in brackets; no blanks or controls.
bool valid_host(std::string_view host) {
  if (host.empty()) return false;
  for (char c : host) {
    const auto u = static_cast<unsigned char>(c);
    if (u <= 0x20 || u == 0x7f || c == '/' || c == '@' || c == '?' || c == '#') return false;
  }
  if (host.front() == '[') return host.back() == ']' && host.size() > 2;
  return host.find(':') == std::string_view::npos;
}

// Splits "[user[:password]@]host[:port]" into its parts.
bool split_authority(std::string_view authority, std::string* user, std::string* password,
                     std::string* host, std::string* port, std::string* why) {
  const std::size_t at = authority.rfind('@');
  if (at != std::string_view::npos) {
    const std::string_view userinfo = authority.substr(0, at);
    const std::size_t colon = userinfo.find(':');
    *user = std::string(userinfo.substr(0, colon));
    if (colon != std::string_view::npos) *password = std::string(userinfo.substr(colon + 1));
    authority.remove_prefix(at + 1);
  }
  std::string_view host_part = authority;
  std::string_view port_part;
  const std::size_t bracket = authority.rfind(']');
  const std::size_t colon = authority.rfind(':');
  if (colon != std::string_view::npos && (bracket == std::string_view::npos || colon > bracket)) {
    host_part = authority.substr(0, colon);
    port_part = authority.substr(colon + 1);
    if (!all_digits(port_part) || port_part.size() > 5 || std::stoi(std::string(port_part)) < 1 ||
        std::stoi(std::string(port_part)) > 65535) {
      *why = "the port is not a number in 1..65535";
      return false;
    }
  }
  if (!valid_host(host_part)) {
    *why = "no valid host";
    return false;
  }
  *host = std::string(host_part);
  *port = std::string(port_part);
  return true;
}

bool parse_one(std::string_view item, RemoteEndpoint* endpoint, std::string* why) {
  const std::size_t scheme_end = item.find("://");
  if (scheme_end == std::string_view::npos) {
    *why = "no scheme (redis://, http:// or https://)";
    return false;
  }
  std::string scheme(item.substr(0, scheme_end));
  for (char& c : scheme) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const std::string_view rest = item.substr(scheme_end + 3);
  if (rest.find_first_of("?#") != std::string_view::npos) {
    *why = "a query or fragment is not allowed";
    return false;
  }
  const std::size_t slash = rest.find('/');
  const std::string_view authority = rest.substr(0, slash);
  const std::string_view path =
      slash == std::string_view::npos ? std::string_view() : rest.substr(slash);
  std::string user;
  std::string password;
  std::string port;
  endpoint->url = std::string(item);
  if (!split_authority(authority, &user, &password, &endpoint->host, &port, why)) return false;
  const std::string host_port = port.empty() ? endpoint->host : endpoint->host + ":" + port;

  if (scheme == "redis") {
    endpoint->kind = RemoteEndpoint::Kind::redis;
    endpoint->port = port.empty() ? 6379 : std::stoi(port);
    endpoint->password = password;
    if (!user.empty() && password.empty()) endpoint->password = user;  // redis://secret@host
    std::string_view db = path;
    while (!db.empty() && db.front() == '/') db.remove_prefix(1);
    if (!db.empty()) {
      if (!all_digits(db) || db.size() > 5) {
        *why = fmt::format("the database '{}' is not a number", std::string(db));
        return false;
      }
      endpoint->database = std::stoi(std::string(db));
    }
    endpoint->shown = fmt::format("redis://{}/{}", host_port, endpoint->database);
    return true;
  }
  if (scheme == "http" || scheme == "https") {
    endpoint->kind = RemoteEndpoint::Kind::http;
    std::string_view prefix = path;
    while (!prefix.empty() && prefix.back() == '/') prefix.remove_suffix(1);
    for (char c : prefix) {
      const auto u = static_cast<unsigned char>(c);
      if (u <= 0x20 || u == 0x7f) {
        *why = "the path has a blank or control character";
        return false;
      }
    }
    endpoint->base_url = std::string(item.substr(0, scheme_end + 3)) + std::string(authority) +
                         std::string(prefix);
    endpoint->shown = scheme + "://" + host_port + std::string(prefix);
    return true;
  }
  *why = fmt::format("unknown scheme '{}'", scheme);
  return false;
}

}  // namespace

bool parse_remote_endpoints(const std::string& text, std::vector<RemoteEndpoint>* endpoints,
                            std::string* why) {
  endpoints->clear();
  std::size_t begin = 0;
  for (;;) {
    const std::size_t end = text.find(',', begin);
    const std::string_view item = trim_url_blanks(std::string_view(text).substr(
        begin, end == std::string::npos ? std::string::npos : end - begin));
    if (!item.empty()) {
      RemoteEndpoint endpoint;
      std::string reason;
      if (!parse_one(item, &endpoint, &reason)) {
        // The item may hold a password: name it by position, not by its text.
        *why = fmt::format("item {}: {}", endpoints->size() + 1, reason);
        return false;
      }
      const bool seen = std::any_of(endpoints->begin(), endpoints->end(),
                                    [&](const RemoteEndpoint& e) { return e.url == endpoint.url; });
      if (!seen) endpoints->push_back(std::move(endpoint));
    }
    if (end == std::string::npos) break;
    begin = end + 1;
  }
  return true;
}

LeaseOutcome RemoteStore::try_lease(const std::string&, std::chrono::milliseconds,
                                    const std::string&, std::string*) {
  return LeaseOutcome::unsupported;
}

void RemoteStore::release(const std::string&, const std::string&) {}

std::string redis_entry_key(const std::string& file_name) {
  return fmt::format("astrai-jit:v{}:{}", kEntryFormatVersion, file_name);
}

std::string redis_lease_key(const std::string& key_hex) {
  return fmt::format("astrai-jit:v{}:lease:{}", kEntryFormatVersion, key_hex);
}

std::unique_ptr<RemoteStore> make_remote_store(const RemoteEndpoint& endpoint,
                                               const RemoteOptions& options) {
  if (endpoint.kind == RemoteEndpoint::Kind::redis) {
#ifdef ASTRAI_JIT_HAVE_HIREDIS
    return make_redis_store(endpoint, options);
#else
    throw ConfigError(fmt::format("ASTRAI_JIT_REMOTE: {} needs Redis support, and this build has "
                                  "none (built without hiredis)", endpoint.shown));
#endif
  }
#ifdef ASTRAI_JIT_HAVE_CURL
  return make_http_store(endpoint, options);
#else
  throw ConfigError(fmt::format("ASTRAI_JIT_REMOTE: {} needs HTTP support, and this build has "
                                "none (built without libcurl)", endpoint.shown));
#endif
}

}  // namespace astrai::detail
