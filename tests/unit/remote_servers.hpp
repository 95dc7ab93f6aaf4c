// Real servers for the remote tier's tests, listening on 127.0.0.1 only: redis-server (no
// persistence) and nginx with a WebDAV location, each in its own temp directory, run as the
// current user. A test whose server binary is absent is skipped with the reason, except under
// ASTRAI_REQUIRE_SERVERS=1 (CI), where that fails.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>

#include "tests/support/support.hpp"

namespace astrai::testing {

class LocalServer {
 public:
  ~LocalServer();
  LocalServer(const LocalServer&) = delete;
  LocalServer& operator=(const LocalServer&) = delete;

  int port() const { return port_; }
  // The ASTRAI_JIT_REMOTE value for it: redis://127.0.0.1:PORT/0 or http://127.0.0.1:PORT/cache
  const std::string& url() const { return url_; }
  const std::filesystem::path& dir() const { return dir_.path(); }
  // Kills the server (SIGKILL: as a crash would) and waits for it.
  void kill();
  bool running() const { return pid_ > 0; }

  // Started server, or nullptr with `why` (binary absent, or it did not come up).
  static std::unique_ptr<LocalServer> redis(std::string* why);
  static std::unique_ptr<LocalServer> nginx_dav(std::string* why);

 private:
  LocalServer() = default;
  bool launch(const std::vector<std::string>& argv, std::string* why);
  TempDir dir_;
  pid_t pid_ = -1;
  int port_ = 0;
  std::string url_;
};

// ASTRAI_REQUIRE_SERVERS=1: a missing server binary fails the test instead of skipping it.
bool servers_required();

// A TCP port on 127.0.0.1 that nothing listens on right now.
int free_port();

// A socket on 127.0.0.1 that accepts connections into its backlog and never answers: a remote
// that hangs. Closed on destruction.
class SilentServer {
 public:
  SilentServer();
  ~SilentServer();
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

}  // namespace astrai::testing

// Starts a server into `var`, or skips the test case (fails under ASTRAI_REQUIRE_SERVERS=1).
#define ASTRAI_START_SERVER(var, kind)                                                   \
  std::string var##_why;                                                                 \
  auto var = astrai::testing::LocalServer::kind(&var##_why);                             \
  if (!var) {                                                                            \
    if (astrai::testing::servers_required()) FAIL("ASTRAI_REQUIRE_SERVERS=1: " << var##_why); \
    MESSAGE("skipped: " << var##_why);                                                   \
    return;                                                                              \
  }
