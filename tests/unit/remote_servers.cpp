#include "tests/unit/remote_servers.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include <fmt/format.h>

namespace astrai::testing {

namespace fs = std::filesystem;

namespace {

// The binary `name` on the PATH or in the sbin directories (nginx lives in /usr/sbin).
std::string find_binary(const std::string& name) {
  std::string path = std::getenv("PATH") ? std::getenv("PATH") : "";
  path += ":/usr/sbin:/usr/local/sbin:/sbin";
  std::size_t begin = 0;
  for (;;) {
    const std::size_t end = path.find(':', begin);
    const std::string dir = path.substr(begin, end == std::string::npos ? end : end - begin);
    if (!dir.empty() && ::access((fs::path(dir) / name).c_str(), X_OK) == 0)
      return (fs::path(dir) / name).string();
    if (end == std::string::npos) return {};
    begin = end + 1;
  }
}

sockaddr_in loopback(int port) {
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<std::uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return address;
}

bool accepts_connections(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  const sockaddr_in address = loopback(port);
  const bool ok = ::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address) == 0;
  ::close(fd);
  return ok;
}

}  // namespace

bool servers_required() {
  const char* value = std::getenv("ASTRAI_REQUIRE_SERVERS");
  return value != nullptr && std::string(value) == "1";
}

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address = loopback(0);
  socklen_t length = sizeof address;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    if (fd >= 0) ::close(fd);
    return 0;
  }
  ::close(fd);
  return ntohs(address.sin_port);
}

LocalServer::~LocalServer() {
  if (pid_ > 0) {
    ::kill(pid_, SIGTERM);
    // Both servers exit at once on SIGTERM; a hung one is killed after two seconds.
    for (int i = 0; i < 200; ++i) {
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    kill();
  }
}

void LocalServer::kill() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

bool LocalServer::launch(const std::vector<std::string>& argv, std::string* why) {
  const std::string log = (dir() / "server.log").string();
  pid_ = ::fork();
  if (pid_ < 0) {
    *why = "fork failed";
    return false;
  }
  if (pid_ == 0) {
    const int out = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (out >= 0) {
      ::dup2(out, 1);
      ::dup2(out, 2);
    }
    std::vector<std::string> storage = argv;
    std::vector<char*> args;
    for (auto& arg : storage) args.push_back(arg.data());
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  for (int i = 0; i < 500; ++i) {  // up to 5 s
    if (accepts_connections(port_)) return true;
    if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {
      pid_ = -1;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  *why = fmt::format("{} did not start on port {}: {}", argv[0], port_, read_file(log));
  kill();
  return false;
}

std::unique_ptr<LocalServer> LocalServer::redis(std::string* why) {
  const std::string binary = find_binary("redis-server");
  if (binary.empty()) {
    *why = "redis-server is not installed (Debian package redis-server)";
    return nullptr;
  }
  std::unique_ptr<LocalServer> server(new LocalServer());
  server->port_ = free_port();
  server->url_ = fmt::format("redis://127.0.0.1:{}/0", server->port_);
  if (!server->launch({binary, "--port", std::to_string(server->port_), "--bind", "127.0.0.1",
                       "--save", "", "--appendonly", "no", "--dir", server->dir().string(),
                       "--protected-mode", "yes"},
                      why))
    return nullptr;
  return server;
}

std::unique_ptr<LocalServer> LocalServer::nginx_dav(std::string* why) {
  const std::string binary = find_binary("nginx");
  if (binary.empty()) {
    *why = "nginx is not installed (Debian package nginx-light)";
    return nullptr;
  }
  std::string version;
  run_command(binary + " -V", &version);
  if (version.find("http_dav_module") == std::string::npos) {
    *why = "this nginx has no WebDAV module (nginx -V lists no http_dav_module)";
    return nullptr;
  }
  std::unique_ptr<LocalServer> server(new LocalServer());
  const fs::path root = server->dir();
  fs::create_directories(root / "data" / "cache");
  fs::create_directories(root / "logs");
  server->port_ = free_port();
  server->url_ = fmt::format("http://127.0.0.1:{}/cache", server->port_);
  // Every temp path the build has a module for points into the prefix: the compiled-in ones
  // (/var/lib/nginx) are not the current user's.
  std::string temps = fmt::format("client_body_temp_path {}/body;\n", root.string());
  for (const char* module : {"proxy", "fastcgi", "uwsgi", "scgi"})
    if (version.find(fmt::format("without-http_{}_module", module)) == std::string::npos)
      temps += fmt::format("{}_temp_path {}/{};\n", module, root.string(), module);
  write_file(root / "nginx.conf",
             fmt::format("daemon off;\nmaster_process off;\npid {0}/nginx.pid;\n"
                         "error_log {0}/logs/error.log;\nevents {{ worker_connections 64; }}\n"
                         "http {{\n access_log off;\n{1} client_max_body_size 128m;\n"
                         " server {{\n  listen 127.0.0.1:{2};\n  root {0}/data;\n"
                         "  location /cache/ {{\n   dav_methods PUT DELETE;\n"
                         "   create_full_put_path on;\n  }}\n }}\n}}\n",
                         root.string(), temps, server->port_));
  if (!server->launch({binary, "-p", root.string(), "-e", (root / "logs/startup.log").string(),
                       "-c", (root / "nginx.conf").string()},
                      why))
    return nullptr;
  return server;
}

SilentServer::SilentServer() {
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address = loopback(0);
  socklen_t length = sizeof address;
  if (fd_ >= 0 && ::bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 &&
      ::listen(fd_, 64) == 0 &&
      ::getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length) == 0)
    port_ = ntohs(address.sin_port);
}

SilentServer::~SilentServer() {
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace astrai::testing
