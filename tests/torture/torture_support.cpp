// Helpers every verb shares: time, seeds, the verdict, binaries, child processes, files.
#include "tests/torture/torture.hpp"

#include "tests/support/specs.hpp"

namespace astrai::torture {

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double ms(std::int64_t nanoseconds) { return static_cast<double>(nanoseconds) / 1e6; }

void sleep_ms(double milliseconds) {
  std::this_thread::sleep_for(
      std::chrono::microseconds(static_cast<std::int64_t>(milliseconds * 1000)));
}

std::uint64_t fresh_seed() {
  std::random_device device;
  return (static_cast<std::uint64_t>(device()) << 32) ^ device() ^
         static_cast<std::uint64_t>(now_ns());
}

std::vector<KernelSpec> rotary_pool(std::size_t count) {
  static const char* const kArchs[] = {"sm_80", "sm_86", "sm_89", "sm_90a"};
  constexpr std::size_t kPerArch = 2 * 64;
  std::vector<KernelSpec> specs;
  for (std::size_t i = 0; i < std::min(count, kPoolLimit); ++i) {
    specs.push_back(astrai::testing::rotary_spec(i % 2 == 0 ? DType::bf16 : DType::fp16,
                                                 static_cast<int>(8 * (1 + (i / 2) % 64)),
                                                 kArchs[(i / kPerArch) % 4]));
  }
  return specs;
}

EnvConfig engine_config(const fs::path& dir, bool force, bool strict,
                        CacheMode mode) {
  EnvConfig config;
  config.cache_dir = dir;
  config.cache_mode = mode;
  config.force_compile = force;
  config.strict = strict;
  return config;
}

std::uint64_t digest(BinaryKind kind, const std::vector<std::string>& symbols,
                     const std::vector<char>& binary) {
  std::uint64_t hash = payload_checksum(binary.data(), binary.size());
  for (const auto& symbol : symbols)
    hash = (hash * 0x100000001b3ULL) ^ payload_checksum(symbol.data(), symbol.size());
  return hash ^ (static_cast<std::uint64_t>(kind) << 56);
}

Fingerprint fingerprint(BinaryKind kind, const std::vector<std::string>& symbols,
                        const std::vector<char>& binary) {
  Fingerprint result;
  result.raw = digest(kind, symbols, binary);
  std::vector<char> masked = binary;
  const std::string_view view(binary.data(), binary.size());
  constexpr std::string_view kMarker = "_INTERNAL_";
  auto is_digit = [](char c) { return c >= '0' && c <= '9'; };
  auto is_hex = [&](char c) { return is_digit(c) || (c >= 'a' && c <= 'f'); };
  auto mask_hex8 = [&](std::size_t at) {
    if (at + 8 > view.size()) return false;
    for (std::size_t i = at; i < at + 8; ++i)
      if (!is_hex(view[i])) return false;
    std::fill(masked.begin() + static_cast<std::ptrdiff_t>(at),
              masked.begin() + static_cast<std::ptrdiff_t>(at + 8), '#');
    return true;
  };
  for (std::size_t at = view.find(kMarker); at != std::string_view::npos;
       at = view.find(kMarker, at + 1)) {
    std::size_t p = at + kMarker.size();
    if (!mask_hex8(p)) continue;
    p += 8;
    if (p >= view.size() || view[p] != '_') continue;
    std::size_t q = ++p;
    while (q < view.size() && is_digit(view[q]) && q - p < 6) ++q;
    if (q == p || q >= view.size() || view[q] != '_') continue;
    p = q + 1 + std::stoul(std::string(view.substr(p, q - p)));
    if (p >= view.size() || view[p] != '_') continue;
    if (!mask_hex8(++p)) continue;
    p += 8;
    if (p >= view.size() || view[p] != '_') continue;
    for (q = ++p; q < view.size() && is_digit(view[q]); ++q) masked[q] = '#';
    result.signature += static_cast<int>(q - p);
  }
  result.normalized = digest(kind, symbols, masked);
  return result;
}

Fingerprint fingerprint(const CompiledVariant& variant) {
  return fingerprint(variant.kind, variant.symbols, variant.binary);
}

std::optional<Fingerprint> entry_file_fingerprint(const fs::path& path,
                                                  std::string* variant_name) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto entry = decode_entry(bytes.data(), bytes.size());
  if (!entry) return std::nullopt;
  std::vector<std::string> symbols;
  std::vector<char> binary;
  if (!decode_variant_payload(entry->payload, &symbols, &binary)) return std::nullopt;
  if (variant_name) *variant_name = entry->variant_name;
  return fingerprint(entry->kind, symbols, binary);
}

std::uint64_t entry_bytes_of(const KernelSpec& spec, const CompiledVariant& variant) {
  CacheEntryData entry;
  entry.kind = variant.kind;
  entry.variant_name = spec.name();
  entry.nvrtc_version = astrai::detail::nvrtc_version().text();
  entry.payload = encode_variant_payload(variant.symbols, variant.binary);
  return encode_entry(entry).size();
}

std::string self_exe() {
  std::error_code ec;
  const fs::path path = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("astrai-cache-torture") : path.string();
}

pid_t spawn_self(const std::vector<std::string>& args, const ChildIo& io) {
  std::vector<std::string> storage{self_exe()};
  storage.insert(storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& text : storage) argv.push_back(text.data());
  argv.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error(fmt::format("fork failed: {}", std::strerror(errno)));
  if (pid == 0) {
    // Only async-signal-safe calls between fork and exec.
    if (io.marker_fd >= 0) {
      if (io.marker_fd == 3) ::fcntl(3, F_SETFD, 0);
      else ::dup2(io.marker_fd, 3);
    }
    if (io.stdout_fd >= 0) ::dup2(io.stdout_fd, 1);
    if (io.stderr_fd >= 0) ::dup2(io.stderr_fd, 2);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  return pid;
}

int wait_raw(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return -1;
  }
  return status;
}

bool exited_ok(int status) { return status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0; }

std::string describe_status(int status) {
  if (status == -1) return "lost";
  if (WIFEXITED(status)) return fmt::format("exit {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return fmt::format("signal {}", WTERMSIG(status));
  return fmt::format("status {:#x}", status);
}

Captured run_captured(const std::vector<std::string>& args) {
  int out_pipe[2];
  int err_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
  ChildIo io;
  io.stdout_fd = out_pipe[1];
  io.stderr_fd = err_pipe[1];
  const pid_t pid = spawn_self(args, io);
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  Captured result;
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  std::string* sinks[2] = {&result.out, &result.err};
  int open_count = 2;
  while (open_count > 0) {
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      char buffer[4096];
      const ssize_t n = ::read(fds[i].fd, buffer, sizeof buffer);
      if (n > 0) {
        sinks[i]->append(buffer, static_cast<std::size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open_count;
      }
    }
  }
  for (auto& fd : fds)
    if (fd.fd >= 0) ::close(fd.fd);
  result.status = wait_raw(pid);
  return result;
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) lines.push_back(line);
  return lines;
}

int reference_child(const std::string& variant) {
  Logger::instance().set_level(LogLevel::off);
  JitEngine engine(engine_config({}, false, false, CacheMode::off));
  const Fingerprint print = fingerprint(*engine.get(KernelSpec::parse(variant)));
  std::printf("R %llu %d\n", static_cast<unsigned long long>(print.normalized), print.signature);
  return 0;
}

std::vector<char> read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

bool write_bytes(const fs::path& path, const std::vector<char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  return static_cast<bool>(out);
}

bool is_temp_name(const std::string& name) { return name.rfind(".tmp-", 0) == 0; }

std::string entry_key_of(const std::string& name) {
  if (name.size() < 40 || name[32] != '.' || name.compare(name.size() - 6, 6, ".cubin") != 0)
    return {};
  for (std::size_t i = 0; i < 32; ++i) {
    const char c = name[i];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return {};
  }
  return name.substr(0, 32);
}

std::set<fs::path> temp_files(const fs::path& root) {
  std::set<fs::path> temps;
  std::error_code ec;
  for (fs::directory_iterator shard(root / "v1", ec), end; !ec && shard != end;
       shard.increment(ec)) {
    std::error_code inner;
    for (fs::directory_iterator file(shard->path(), inner); !inner && file != end;
         file.increment(inner))
      if (is_temp_name(file->path().filename().string())) temps.insert(file->path());
  }
  return temps;
}

std::map<std::string, std::uintmax_t> tree_snapshot(const fs::path& dir) {
  std::map<std::string, std::uintmax_t> files;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code size_ec;
    const auto size = it->is_regular_file(size_ec) ? it->file_size(size_ec) : 0;
    files[fs::relative(it->path(), dir, size_ec).string()] = size;
  }
  return files;
}

void remove_tree(const fs::path& path) {
  std::error_code ec;
  fs::permissions(path, fs::perms::owner_all, fs::perm_options::add, ec);
  for (fs::recursive_directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code perm_ec;
    if (it->is_directory(perm_ec))
      fs::permissions(it->path(), fs::perms::owner_all, fs::perm_options::add, perm_ec);
  }
  fs::remove_all(path, ec);
}


}  // namespace astrai::torture
