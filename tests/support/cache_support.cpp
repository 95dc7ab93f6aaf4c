#include "tests/support/cache_support.hpp"

#include <elf.h>

#include <algorithm>
#include <cstring>
#include <system_error>

#include "cache/variant_payload.hpp"

namespace astrai::testing {

namespace fs = std::filesystem;

detail::CacheKey make_key(std::uint64_t n) {
  detail::CacheKey key;
  key.high = 0x9e3779b97f4a7c15ULL * (n + 1);  // spreads keys over shard directories
  key.low = n;
  return key;
}

detail::CacheEntryData make_entry(const std::string& variant, std::size_t payload_size,
                                  unsigned seed) {
  detail::CacheEntryData entry;
  entry.kind = detail::BinaryKind::cubin;
  entry.variant_name = variant;
  entry.nvrtc_version = "12.8";
  entry.payload.resize(payload_size);
  for (std::size_t i = 0; i < payload_size; ++i)
    entry.payload[i] = static_cast<char>((i * 131 + seed * 17) & 0xff);
  return entry;
}

detail::CacheEntryData make_loadable_entry(const std::string& variant, unsigned seed) {
  Elf64_Ehdr header{};
  std::memcpy(header.e_ident, ELFMAG, SELFMAG);
  header.e_ident[EI_CLASS] = ELFCLASS64;
  header.e_ident[EI_DATA] = ELFDATA2LSB;
  header.e_ident[EI_VERSION] = EV_CURRENT;
  header.e_version = EV_CURRENT;
  header.e_flags = seed;  // entries of different seeds differ
  header.e_ehsize = sizeof header;
  std::vector<char> cubin(sizeof header);
  std::memcpy(cubin.data(), &header, sizeof header);
  detail::CacheEntryData entry;
  entry.kind = detail::BinaryKind::cubin;
  entry.variant_name = variant;
  entry.nvrtc_version = "13.0";
  entry.payload = detail::encode_variant_payload({"_Z6kernelv"}, cubin);
  return entry;
}

bool same_entry(const detail::CacheEntryData& a, const detail::CacheEntryData& b) {
  return a.kind == b.kind && a.variant_name == b.variant_name &&
         a.nvrtc_version == b.nvrtc_version && a.payload == b.payload;
}

detail::EnvConfig config_for(const fs::path& dir, detail::CacheMode mode) {
  detail::EnvConfig config;
  config.cache_dir = dir;
  config.cache_mode = mode;
  return config;
}

std::vector<fs::path> all_files(const fs::path& dir) {
  std::vector<fs::path> files;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->is_regular_file()) files.push_back(it->path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

std::map<std::string, std::string> snapshot(const fs::path& dir) {
  std::map<std::string, std::string> files;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::file_status status = it->symlink_status();
    if (fs::is_symlink(status))
      files[it->path().string()] = "-> " + fs::read_symlink(it->path()).string();
    else if (fs::is_regular_file(status))
      files[it->path().string()] = read_file(it->path());
    else
      files[it->path().string()] = "(dir)";
  }
  return files;
}

std::size_t count_temp_files(const fs::path& dir) {
  std::size_t count = 0;
  for (const auto& file : all_files(dir))
    if (file.filename().string().rfind(".tmp-", 0) == 0) ++count;
  return count;
}

std::size_t count_occurrences(const std::string& text, const std::string& needle) {
  std::size_t count = 0;
  for (auto pos = text.find(needle); pos != std::string::npos; pos = text.find(needle, pos + 1))
    ++count;
  return count;
}

void set_age(const fs::path& path, std::chrono::seconds age) {
  fs::last_write_time(path, fs::file_time_type::clock::now() - age);
}

QuietLog::QuietLog(detail::LogLevel level) : old_(detail::Logger::instance().level()) {
  detail::Logger::instance().set_level(level);
}

QuietLog::~QuietLog() { detail::Logger::instance().set_level(old_); }

LogCapture::LogCapture(const fs::path& file)
    : old_level_(detail::Logger::instance().level()), capture_(file) {
  detail::Logger::instance().set_level(detail::LogLevel::warn);
}

std::string LogCapture::finish() {
  std::string text = capture_.finish();
  detail::Logger::instance().set_level(old_level_);
  return text;
}

}  // namespace astrai::testing
