#include "cache/cache_archive.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>
#include <set>
#include <string_view>

#include <fmt/format.h>

#include "astrai/error.hpp"
#include "cache/cache_fs.hpp"

namespace astrai::detail {

namespace fs = std::filesystem;

namespace {

constexpr char kArchiveMagic[8] = {'A', 'S', 'T', 'R', 'A', 'I', 'J', 'A'};
constexpr char kArchiveEndMagic[8] = {'A', 'S', 'T', 'R', 'A', 'I', 'J', 'Z'};
constexpr std::uint32_t kMaxEntryFileName = 255;

// Opens `path` for reading and checks that it is a regular file; throws InvalidArgument
// naming `what` otherwise.
int open_regular_file(const fs::path& path, const char* what, struct stat* info) {
  int fd = -1;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0)
    throw InvalidArgument(fmt::format("{}: cannot read '{}': {}", what, echo_text(path.string()),
                                      errno_text(errno)));
  if (::fstat(fd, info) != 0 || !S_ISREG(info->st_mode)) {
    ::close(fd);
    throw InvalidArgument(
        fmt::format("{}: '{}' is not a regular file", what, echo_text(path.string())));
  }
  return fd;
}

// Reads exactly `size` bytes; false at end of file or on an error.
bool read_exact(int fd, char* out, std::size_t size) {
  while (size > 0) {
    const ssize_t n = ::read(fd, out, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    out += n;
    size -= static_cast<std::size_t>(n);
  }
  return true;
}

void put_u32(std::string& out, std::uint32_t value) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xffu));
}

void put_u64(std::string& out, std::uint64_t value) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xffu));
}

std::uint64_t get_le(const char* p, int bytes) {
  std::uint64_t value = 0;
  for (int i = bytes - 1; i >= 0; --i) value = (value << 8) | static_cast<unsigned char>(p[i]);
  return value;
}

}  // namespace

std::string echo_text(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (out.size() >= kMaxEchoedText) {
      out += "...";
      break;
    }
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f)
      out += fmt::format("\\x{:02x}", u);
    else
      out.push_back(c);
  }
  return out;
}

std::vector<ManifestLine> read_manifest_lines(const fs::path& path) {
  struct stat info {};
  const int fd = open_regular_file(path, "--manifest", &info);
  const std::string shown = echo_text(path.string());
  if (static_cast<std::uint64_t>(info.st_size) > kMaxManifestBytes) {
    ::close(fd);
    throw InvalidArgument(fmt::format("--manifest: '{}' is larger than {} MiB", shown,
                                      kMaxManifestBytes >> 20));
  }
  std::string text(static_cast<std::size_t>(info.st_size), '\0');
  std::size_t used = 0;
  for (;;) {
    if (used == text.size()) {
      // Grew after fstat: allow up to the limit.
      if (text.size() >= kMaxManifestBytes) {
        char probe = 0;
        const ssize_t n = ::read(fd, &probe, 1);
        ::close(fd);
        if (n > 0)
          throw InvalidArgument(fmt::format("--manifest: '{}' is larger than {} MiB", shown,
                                            kMaxManifestBytes >> 20));
        break;
      }
      text.resize(std::min<std::size_t>(std::max<std::size_t>(text.size() * 2, 4096),
                                        kMaxManifestBytes));
    }
    const ssize_t n = ::read(fd, text.data() + used, text.size() - used);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error = errno;
      ::close(fd);
      throw InvalidArgument(fmt::format("--manifest: error reading '{}': {}", shown,
                                        errno_text(error)));
    }
    if (n == 0) {
      ::close(fd);
      break;
    }
    used += static_cast<std::size_t>(n);
  }
  text.resize(used);

  std::vector<ManifestLine> lines;
  std::size_t begin = 0;
  for (int number = 1; begin < text.size(); ++number) {
    std::size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + begin, end - begin);
    begin = end + 1;
    if (line.size() > kMaxManifestLine)
      throw InvalidArgument(fmt::format("{}:{}: line longer than {} characters: '{}'", shown,
                                        number, kMaxManifestLine,
                                        echo_text(std::string(line))));
    const std::size_t hash = line.find('#');
    if (hash != std::string_view::npos) line = line.substr(0, hash);
    const char* space = " \t\r\n\f\v";
    const std::size_t first = line.find_first_not_of(space);
    if (first == std::string_view::npos) continue;
    const std::size_t last = line.find_last_not_of(space);
    lines.push_back({number, std::string(line.substr(first, last - first + 1))});
  }
  return lines;
}

ArchiveReport export_cache(const DiskCache& cache, const std::vector<std::string>& variants,
                           const fs::path& output, const SigningKey* sign) {
  ArchiveReport report;
  const std::set<std::string> wanted(variants.begin(), variants.end());
  std::set<std::string> found;

  const fs::path dir = output.has_parent_path() ? output.parent_path() : fs::path(".");
  std::mt19937_64 random(std::random_device{}());
  fs::path temp;
  int fd = -1;
  for (int attempt = 0; attempt < 16 && fd < 0; ++attempt) {
    temp = dir / fmt::format(".{}.tmp-{:016x}", output.filename().string(), random());
    // 0600: an archive holds code that others would run; who else may read it is the user's call.
    fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0)
    throw Error(fmt::format("cache export: cannot create a file in {}: {}", dir.string(),
                            errno_text(errno)));
  auto fail = [&](const std::string& what) {
    ::close(fd);
    ::unlink(temp.c_str());
    throw Error(fmt::format("cache export: {} {}: {}", what, temp.string(), errno_text(errno)));
  };

  std::string header(kArchiveMagic, sizeof kArchiveMagic);
  put_u32(header, kArchiveVersion);
  put_u32(header, 0);
  put_u64(header, 0);  // entry count, filled in at the end
  if (write_all(fd, header.data(), header.size()) != 0) fail("cannot write");

  for (const auto& info : cache.list()) {
    if (!wanted.empty() && wanted.count(info.variant_name) == 0) continue;
    std::vector<char> bytes;
    std::string why;
    if (!cache.read_entry_file(info, &bytes, &why)) {
      report.problems.push_back(
          fmt::format("skipped {} ({}): {}", info.variant_name, info.path.string(), why));
      continue;
    }
    if (sign != nullptr) {
      auto entry = decode_entry(bytes.data(), bytes.size(), &why);
      if (!entry) {  // read_entry_file decoded it just before: not reached
        report.problems.push_back(fmt::format("skipped {}: {}", info.variant_name, why));
        continue;
      }
      sign_entry_data(*sign, info.key_hex, &*entry);
      bytes = encode_entry(*entry);
    }
    const std::string name = info.path.filename().string();
    std::string record;
    put_u32(record, static_cast<std::uint32_t>(name.size()));
    record += name;
    put_u64(record, bytes.size());
    if (write_all(fd, record.data(), record.size()) != 0 ||
        write_all(fd, bytes.data(), bytes.size()) != 0)
      fail("cannot write");
    found.insert(info.variant_name);
    ++report.entries;
    report.bytes += bytes.size();
  }
  for (const auto& variant : wanted)
    if (found.count(variant) == 0)
      report.problems.push_back(fmt::format("not in the cache: {}", echo_text(variant)));

  std::string trailer(kArchiveEndMagic, sizeof kArchiveEndMagic);
  put_u64(trailer, report.entries);
  std::string count;
  put_u64(count, report.entries);
  if (write_all(fd, trailer.data(), trailer.size()) != 0 ||
      ::pwrite(fd, count.data(), count.size(), 16) != static_cast<ssize_t>(count.size()))
    fail("cannot write");
  if (::fsync(fd) != 0 && errno != EINVAL && errno != ENOTSUP) fail("cannot fsync");
  if (::close(fd) != 0) {
    ::unlink(temp.c_str());
    throw Error(fmt::format("cache export: cannot close {}", temp.string()));
  }
  if (::rename(temp.c_str(), output.c_str()) != 0) {
    const int error = errno;
    ::unlink(temp.c_str());
    throw Error(fmt::format("cache export: cannot rename {} to {}: {}", temp.string(),
                            output.string(), errno_text(error)));
  }
  return report;
}

ArchiveReport import_archive(DiskCache& cache, const fs::path& input) {
  struct stat info {};
  const int fd = open_regular_file(input, "cache import", &info);
  const std::string shown = echo_text(input.string());
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  // Entries are staged (checked, written to temp files) while the archive is read; only a
  // whole, sound archive is committed. Anything else leaves the cache as it was.
  std::vector<DiskCache::StagedEntry> staged;
  struct Discard {
    DiskCache& cache;
    std::vector<DiskCache::StagedEntry>& staged;
    ~Discard() {
      for (const auto& entry : staged) cache.discard_import(entry);
    }
  } discard{cache, staged};
  auto bad = [&shown](const std::string& why) {
    return Error(fmt::format("cache import: {} is not a sound archive: {}; nothing imported",
                             shown, why));
  };

  char header[24];
  if (!read_exact(fd, header, sizeof header)) throw bad("truncated header");
  if (std::memcmp(header, kArchiveMagic, sizeof kArchiveMagic) != 0) throw bad("bad magic");
  if (get_le(header + 8, 4) != kArchiveVersion)
    throw bad(fmt::format("archive version {} (this build reads {})", get_le(header + 8, 4),
                          kArchiveVersion));
  const std::uint64_t count = get_le(header + 16, 8);
  if (count > kMaxArchiveEntries) throw bad(fmt::format("{} entries", count));

  ArchiveReport report;
  std::vector<std::uint64_t> sizes;  // of each staged entry
  std::vector<char> bytes;
  for (std::uint64_t i = 0; i < count; ++i) {
    const std::string which = fmt::format("entry {} of {}", i + 1, count);
    char length[4];
    if (!read_exact(fd, length, sizeof length)) throw bad(which + ": truncated");
    const std::uint64_t name_length = get_le(length, 4);
    if (name_length == 0 || name_length > kMaxEntryFileName)
      throw bad(which + ": bad entry name length");
    std::string name(static_cast<std::size_t>(name_length), '\0');
    char size_field[8];
    if (!read_exact(fd, name.data(), name.size()) || !read_exact(fd, size_field, sizeof size_field))
      throw bad(which + ": truncated");
    const std::uint64_t size = get_le(size_field, 8);
    // Refused before any allocation: no entry is larger than the cache accepts.
    if (size > kMaxEntryFileBytes)
      throw bad(fmt::format("{} ({}): {} bytes", which, echo_text(name), size));
    bytes.resize(static_cast<std::size_t>(size));
    if (!read_exact(fd, bytes.data(), bytes.size())) throw bad(which + ": truncated");
    std::string why;
    DiskCache::StagedEntry entry;
    if (!cache.stage_import(name, bytes, &entry, &why))
      throw bad(fmt::format("{} ({}): {}", which, echo_text(name), why));
    staged.push_back(std::move(entry));
    sizes.push_back(size);
  }
  char trailer[16];
  if (!read_exact(fd, trailer, sizeof trailer) ||
      std::memcmp(trailer, kArchiveEndMagic, sizeof kArchiveEndMagic) != 0 ||
      get_le(trailer + 8, 8) != count)
    throw bad("missing or wrong end marker");
  char extra = 0;
  if (::read(fd, &extra, 1) > 0) throw bad("trailing bytes");

  // Every entry is sound: now they go in. One refused here (a foreign file in its place) is
  // reported; the others stay imported.
  for (std::size_t i = 0; i < staged.size(); ++i) {
    std::string why;
    if (cache.commit_import(staged[i], &why)) {
      ++report.entries;
      report.bytes += sizes[i];
    } else {
      report.problems.push_back(fmt::format("rejected {}: {}", echo_text(staged[i].name), why));
    }
  }
  staged.clear();
  return report;
}

}  // namespace astrai::detail
