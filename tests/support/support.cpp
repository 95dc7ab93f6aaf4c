#include "tests/support/support.hpp"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <stdexcept>
#include <utility>

namespace astrai::testing {

TempDir::TempDir() {
  std::random_device device;
  std::mt19937_64 rng(device());
  auto base = std::filesystem::temp_directory_path();
  for (int attempt = 0; attempt < 100; ++attempt) {
    auto candidate = base / ("astrai-test-" + std::to_string(::getpid()) + "-" +
                             std::to_string(rng() % 1000000000ULL));
    if (std::filesystem::create_directory(candidate)) {
      // Explicit: a cache root here must not turn group-writable under a umask like 002.
      std::filesystem::permissions(candidate, std::filesystem::perms(0755));
      path_ = candidate;
      return;
    }
  }
  throw std::runtime_error("cannot create a temp directory");
}

TempDir::~TempDir() {
  std::error_code ignored;
  // Restore write permission first so read-only test directories can be removed.
  for (auto it = std::filesystem::recursive_directory_iterator(path_, ignored);
       it != std::filesystem::recursive_directory_iterator(); it.increment(ignored)) {
    std::filesystem::permissions(it->path(), std::filesystem::perms::owner_all,
                                 std::filesystem::perm_options::add, ignored);
  }
  std::filesystem::permissions(path_, std::filesystem::perms::owner_all,
                               std::filesystem::perm_options::add, ignored);
  std::filesystem::remove_all(path_, ignored);
}

ScopedEnv::ScopedEnv(std::string name, const char* value) : name_(std::move(name)) {
  if (const char* old = std::getenv(name_.c_str())) {
    had_old_ = true;
    old_ = old;
  }
  if (value) ::setenv(name_.c_str(), value, 1);
  else ::unsetenv(name_.c_str());
}

ScopedEnv::~ScopedEnv() {
  if (had_old_) ::setenv(name_.c_str(), old_.c_str(), 1);
  else ::unsetenv(name_.c_str());
}

namespace {
std::map<std::string, ChildAction>& child_actions() {
  static std::map<std::string, ChildAction> actions;
  return actions;
}
std::string& self_path_storage() {
  static std::string path;
  return path;
}
}  // namespace

bool register_child_action(const std::string& verb, ChildAction action) {
  child_actions()[verb] = std::move(action);
  return true;
}

int run_child(int argc, char** argv) {
  set_self_path(argv[0]);
  auto it = child_actions().find(argv[2]);
  if (it == child_actions().end()) {
    std::fprintf(stderr, "unknown child action %s\n", argv[2]);
    return 2;
  }
  std::vector<std::string> args(argv + 3, argv + argc);
  try {
    return it->second(args);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "child action %s failed: %s\n", argv[2], error.what());
    return 3;
  }
}

void set_self_path(const char* argv0) {
  std::error_code ec;
  auto resolved = std::filesystem::canonical("/proc/self/exe", ec);
  self_path_storage() = ec ? std::string(argv0) : resolved.string();
}

const std::string& self_path() { return self_path_storage(); }

int run_command(const std::string& command, std::string* output) {
  std::string full = command + " 2>&1";
  FILE* pipe = ::popen(full.c_str(), "r");
  if (!pipe) return -1;
  std::array<char, 4096> buffer;
  std::string collected;
  std::size_t n;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0) collected.append(buffer.data(), n);
  int status = ::pclose(pipe);
  if (output) *output = collected;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

int spawn_child(const std::string& verb, const std::vector<std::string>& args,
                const std::vector<std::pair<std::string, std::string>>& env) {
  pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    for (const auto& [name, value] : env) ::setenv(name.c_str(), value.c_str(), 1);
    std::vector<std::string> storage = {self_path(), "--child", verb};
    storage.insert(storage.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& s : storage) argv.push_back(s.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  return pid;
}

int wait_child(int pid) {
  int status = 0;
  if (::waitpid(pid, &status, 0) < 0) return -1;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

void write_file(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

StderrCapture::StderrCapture(std::filesystem::path file) : file_(std::move(file)) {
  std::fflush(stderr);
  saved_ = ::dup(2);
  const int fd = ::open(file_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  ::dup2(fd, 2);
  ::close(fd);
}

StderrCapture::~StderrCapture() { restore(); }

std::string StderrCapture::finish() {
  restore();
  return read_file(file_);
}

void StderrCapture::restore() {
  if (saved_ < 0) return;
  std::fflush(stderr);
  ::dup2(saved_, 2);
  ::close(saved_);
  saved_ = -1;
}

}  // namespace astrai::testing
