// libFuzzer target: `cache import` (import_archive) on any bytes. An archive is imported whole
// or not at all: either it succeeds and every entry it stored passes the checks a load makes,
// or it throws astrai::Error (any other exception escapes and is a bug) and the cache holds no
// file at all, not even a temp file.
#include <signal.h>
#include <unistd.h>

#include <cerrno>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "astrai/error.hpp"
#include "base/logging.hpp"
#include "cache/cache_archive.hpp"
#include "cache/disk_cache.hpp"
#include "cache/variant_payload.hpp"
#include "tests/support/elf_image.hpp"
#include "tests/support/fuzz.hpp"

namespace fs = std::filesystem;
using astrai::detail::CacheMode;
using astrai::detail::DiskCache;
using astrai::fuzz::require;

namespace {

const std::string kPrefix = "astrai-fuzz-archive-";

// This process's scratch directory (one per process: libFuzzer may run several jobs).
const fs::path& work_dir() {
  static const fs::path dir = [] {
    fs::path path =
        fs::temp_directory_path() / (kPrefix + std::to_string(::getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
    fs::permissions(path, fs::perms::owner_all);
    // libFuzzer ends with _Exit (no atexit handlers): remove what finished runs left instead.
    std::error_code ec;
    for (const auto& item : fs::directory_iterator(fs::temp_directory_path(), ec)) {
      const std::string name = item.path().filename().string();
      if (name.rfind(kPrefix, 0) != 0) continue;
      const long pid = std::strtol(name.c_str() + kPrefix.size(), nullptr, 10);
      if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH)
        fs::remove_all(item.path(), ec);
    }
    return path;
  }();
  return dir;
}

void write(const fs::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

std::size_t files_below(const fs::path& dir) {
  std::size_t count = 0;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (it->is_regular_file()) ++count;
  return count;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  astrai::detail::Logger::instance().set_level(astrai::detail::LogLevel::off);
  // A sound archive of two entries, each a variant payload holding a small complete ELF.
  const fs::path source = work_dir() / "seed-cache";
  {
    DiskCache cache(source, CacheMode::read_write, 0);
    const astrai::testing::ElfImage elf;
    for (std::uint64_t i = 1; i <= 2; ++i) {
      astrai::detail::CacheEntryData entry;
      entry.variant_name =
          i == 1 ? "rotary_emb.bf16.hd64.sm_80" : "rotary_emb.bf16.hd128.sm_90a";
      entry.nvrtc_version = "13.0";
      entry.payload = astrai::detail::encode_variant_payload({"_Z6kernelv"}, elf.bytes());
      astrai::detail::CacheKey key;
      key.high = 0x9e3779b97f4a7c15ULL * i;
      key.low = i;
      cache.store(key, entry);
    }
  }
  const fs::path archive = work_dir() / "seed.astrai";
  astrai::detail::export_cache(DiskCache(source, CacheMode::read_only, 0), {}, archive);
  std::ifstream in(archive, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  astrai::fuzz::write_seeds({bytes, bytes.substr(0, 24), bytes.substr(0, bytes.size() - 16)});
  fs::remove_all(source);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const fs::path input = work_dir() / "input.astrai";
  const fs::path root = work_dir() / "cache";
  write(input, std::string(reinterpret_cast<const char*>(data), size));
  fs::remove_all(root);
  DiskCache cache(root, CacheMode::read_write, 0);
  try {
    const auto report = astrai::detail::import_archive(cache, input);
    require(report.problems.empty(), "an import into an empty cache reported a problem");
    const auto entries = cache.list();
    require(entries.size() <= report.entries, "more entries stored than imported");
    for (const auto& entry : entries) {
      std::vector<char> bytes;
      std::string why;
      require(cache.read_entry_file(entry, &bytes, &why), "an imported entry does not verify");
      const auto decoded = astrai::detail::decode_entry(bytes.data(), bytes.size());
      require(decoded &&
                  astrai::detail::check_variant_payload(decoded->kind, decoded->payload, &why),
              "an imported entry's payload would be refused by a load");
    }
  } catch (const astrai::Error& error) {
    require(error.what()[0] != '\0', "an import error has an empty message");
    require(files_below(root) == 0, "a refused archive left files in the cache");
  }
  return 0;
}
