// Helpers shared by the test suites and harnesses: temp directories, environment overrides,
// child processes, files.
#pragma once

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace astrai::testing {

// A fresh directory under the system temp dir, removed (recursively) on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// Sets (or unsets, when value is null) an environment variable for the scope.
class ScopedEnv {
 public:
  ScopedEnv(std::string name, const char* value);
  ~ScopedEnv();

 private:
  std::string name_;
  bool had_old_ = false;
  std::string old_;
};

// Child-process actions: a test runs `self_path() --child <verb> args...`.
using ChildAction = std::function<int(const std::vector<std::string>& args)>;
bool register_child_action(const std::string& verb, ChildAction action);
int run_child(int argc, char** argv);
void set_self_path(const char* argv0);
const std::string& self_path();

// Runs a command line through /bin/sh; returns the exit status, stdout+stderr in `output`.
int run_command(const std::string& command, std::string* output = nullptr);
// Starts `self_path() --child verb args` and returns its pid (no wait).
int spawn_child(const std::string& verb, const std::vector<std::string>& args,
                const std::vector<std::pair<std::string, std::string>>& env = {});
// Waits for a pid; returns its exit status (or 128 + signal).
int wait_child(int pid);

// Redirects stderr (descriptor 2) into `file` for the scope; finish() restores it and returns
// what was written.
class StderrCapture {
 public:
  explicit StderrCapture(std::filesystem::path file);
  ~StderrCapture();
  StderrCapture(const StderrCapture&) = delete;
  StderrCapture& operator=(const StderrCapture&) = delete;
  std::string finish();

 private:
  void restore();
  std::filesystem::path file_;
  int saved_ = -1;
};

std::string read_file(const std::filesystem::path& path);
void write_file(const std::filesystem::path& path, const std::string& bytes);

}  // namespace astrai::testing
