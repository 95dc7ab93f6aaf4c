#include <doctest/doctest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "base/logging.hpp"
#include "cache/disk_cache.hpp"
#include "tests/support/support.hpp"

namespace fs = std::filesystem;
using astrai::detail::BinaryKind;
using astrai::detail::CacheEntryData;
using astrai::detail::CacheEntryInfo;
using astrai::detail::CacheKey;
using astrai::detail::CacheMode;
using astrai::detail::decode_entry;
using astrai::detail::DiskCache;
using astrai::detail::encode_entry;
using astrai::detail::LogLevel;
using astrai::detail::payload_checksum;
using astrai::testing::read_file;
using astrai::testing::StderrCapture;
using astrai::testing::TempDir;
using astrai::testing::write_file;

namespace {

CacheKey make_key(std::uint64_t n) {
  CacheKey key;
  key.high = 0x9e3779b97f4a7c15ULL * (n + 1);  // spreads keys over shard directories
  key.low = n;
  return key;
}

CacheEntryData make_entry(const std::string& variant, std::size_t payload_size,
                          unsigned seed = 1) {
  CacheEntryData entry;
  entry.kind = BinaryKind::cubin;
  entry.variant_name = variant;
  entry.nvrtc_version = "12.8";
  entry.payload.resize(payload_size);
  for (std::size_t i = 0; i < payload_size; ++i)
    entry.payload[i] = static_cast<char>((i * 131 + seed * 17) & 0xff);
  return entry;
}

bool same_entry(const CacheEntryData& a, const CacheEntryData& b) {
  return a.kind == b.kind && a.variant_name == b.variant_name &&
         a.nvrtc_version == b.nvrtc_version && a.payload == b.payload;
}

// Every regular file below `dir` (directories are not listed).
std::vector<fs::path> all_files(const fs::path& dir) {
  std::vector<fs::path> files;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->is_regular_file()) files.push_back(it->path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

std::size_t count_temp_files(const fs::path& dir) {
  std::size_t count = 0;
  for (const auto& file : all_files(dir))
    if (file.filename().string().rfind(".tmp-", 0) == 0) ++count;
  return count;
}

void set_age(const fs::path& path, std::chrono::seconds age) {
  fs::last_write_time(path, fs::file_time_type::clock::now() - age);
}

// Tests that expect warnings keep them out of the test output.
class QuietLog {
 public:
  explicit QuietLog(LogLevel level = LogLevel::off)
      : old_(astrai::detail::Logger::instance().level()) {
    astrai::detail::Logger::instance().set_level(level);
  }
  ~QuietLog() { astrai::detail::Logger::instance().set_level(old_); }

 private:
  LogLevel old_;
};

std::size_t count_occurrences(const std::string& text, const std::string& needle) {
  std::size_t count = 0;
  for (auto pos = text.find(needle); pos != std::string::npos; pos = text.find(needle, pos + 1))
    ++count;
  return count;
}

// True when chmod can really make `dir` unwritable (it cannot for root).
bool write_protection_works(const fs::path& dir) { return ::access(dir.c_str(), W_OK) != 0; }

// Child: store with a tiny RLIMIT_FSIZE, which fails writes with EFBIG like a full disk does.
const bool kFsizeChildRegistered = astrai::testing::register_child_action(
    "cache-store-fsize-limit", [](const std::vector<std::string>& args) -> int {
      if (args.size() != 1) return 10;
      astrai::detail::Logger::instance().set_level(LogLevel::off);
      ::signal(SIGXFSZ, SIG_IGN);
      DiskCache cache(args[0], CacheMode::read_write, 0);
      if (!cache.usable_for_write()) return 11;
      struct rlimit limit = {64, 64};
      if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) return 12;
      if (cache.store(make_key(1), make_entry("big", 4096))) return 13;
      if (cache.usable_for_write()) return 14;
      if (count_temp_files(args[0]) != 0) return 15;
      if (cache.store(make_key(2), make_entry("small", 1))) return 16;  // degraded: no retry
      return 0;
    });

}  // namespace

TEST_SUITE("cache") {

// ---------------------------------------------------------------------------------------------
// Entry format

TEST_CASE("a small entry encodes to the documented, pinned bytes") {
  CacheEntryData entry;
  entry.kind = BinaryKind::cubin;
  entry.variant_name = "v";
  entry.nvrtc_version = "12.8";
  entry.payload = {'\x01', '\x02', '\x03'};
  const std::vector<char> bytes = encode_entry(entry);
  REQUIRE(bytes.size() == 48);

  const std::string covered = std::string("v12.8") + std::string("\x01\x02\x03", 3);
  // Seeded with header bytes 8..15: version 2, kind 1 (cubin), reserved zeros.
  const std::uint64_t checksum = payload_checksum(covered.data(), covered.size(), 0x0000000100000002ULL);
  std::string expected("ASTRAIJC", 8);
  expected += std::string("\x02\x00\x00\x00", 4);          // format version
  expected += std::string("\x01\x00\x00\x00", 4);          // kind + 3 zero bytes
  expected += std::string("\x03\x00\x00\x00\x00\x00\x00\x00", 8);  // payload size
  for (int i = 0; i < 8; ++i) expected.push_back(static_cast<char>((checksum >> (8 * i)) & 0xff));
  expected += std::string("\x01\x00\x00\x00", 4);          // name length
  expected += std::string("\x04\x00\x00\x00", 4);          // version length
  expected += "v12.8";
  expected += std::string("\x01\x02\x03", 3);
  CHECK(std::string(bytes.begin(), bytes.end()) == expected);

  CHECK(checksum == 0x94d34ee885ef51bcULL);  // XXH3-64 of "v12.8" {1, 2, 3}, seeded
  CHECK(payload_checksum(bytes.data(), bytes.size()) == 0x891787ce92fd87c3ULL);
}

TEST_CASE("entries round-trip through encode and decode") {
  std::vector<CacheEntryData> entries;
  entries.push_back(make_entry("paged_decode.bf16.hd128.ps16.g4.sm_90a", 1000));
  CacheEntryData ptx = make_entry("rotary.f16.sm_120", 64);
  ptx.kind = BinaryKind::ptx;
  ptx.nvrtc_version = "13.0";
  entries.push_back(ptx);
  entries.push_back(make_entry("empty_payload", 0));
  CacheEntryData unnamed = make_entry("", 5);
  unnamed.nvrtc_version.clear();
  entries.push_back(unnamed);
  entries.push_back(make_entry(std::string(4096, 'n'), 7));

  for (const auto& entry : entries) {
    const std::vector<char> bytes = encode_entry(entry);
    std::string error = "untouched";
    auto decoded = decode_entry(bytes.data(), bytes.size(), &error);
    REQUIRE(decoded.has_value());
    CHECK(same_entry(*decoded, entry));
    CHECK(decode_entry(bytes.data(), bytes.size()).has_value());  // error pointer is optional
  }
}

TEST_CASE("decode rejects an entry truncated at every length") {
  const std::vector<char> bytes = encode_entry(make_entry("trunc.sm_90", 37));
  for (std::size_t size = 0; size < bytes.size(); ++size) {
    CAPTURE(size);
    // A fresh copy of exactly `size` bytes, so the sanitizer catches any read past the end.
    std::vector<char> prefix(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(size));
    std::string error;
    CHECK_FALSE(decode_entry(size ? prefix.data() : nullptr, size, &error).has_value());
    CHECK_FALSE(error.empty());
    CHECK_FALSE(decode_entry(prefix.data(), size).has_value());
  }
}

TEST_CASE("decode rejects every single-bit flip") {
  // Entry without names: every byte is covered by the header checks or the payload checksum.
  CacheEntryData bare = make_entry("", 24);
  bare.nvrtc_version.clear();
  const std::vector<char> bare_bytes = encode_entry(bare);
  for (std::size_t bit = 0; bit < bare_bytes.size() * 8; ++bit) {
    CAPTURE(bit);
    std::vector<char> flipped = bare_bytes;
    flipped[bit / 8] = static_cast<char>(flipped[bit / 8] ^ (1 << (bit % 8)));
    CHECK_FALSE(decode_entry(flipped.data(), flipped.size()).has_value());
  }

  // With names: the checksum covers the names too, so every flip is rejected as well.
  const CacheEntryData named = make_entry("v.sm_90a", 24);
  const std::vector<char> bytes = encode_entry(named);
  for (std::size_t bit = 0; bit < bytes.size() * 8; ++bit) {
    CAPTURE(bit);
    std::vector<char> flipped = bytes;
    flipped[bit / 8] = static_cast<char>(flipped[bit / 8] ^ (1 << (bit % 8)));
    CHECK_FALSE(decode_entry(flipped.data(), flipped.size()).has_value());
  }
}

TEST_CASE("decode rejects bad magic, version, kind, reserved bytes, trailing data, long names") {
  const std::vector<char> good = encode_entry(make_entry("x.sm_89", 16));
  REQUIRE(decode_entry(good.data(), good.size()).has_value());

  auto rejected = [](std::vector<char> bytes, const std::string& reason) {
    std::string error;
    const bool ok = decode_entry(bytes.data(), bytes.size(), &error).has_value();
    CAPTURE(error);
    CHECK(error.find(reason) != std::string::npos);
    return !ok;
  };

  std::vector<char> magic = good;
  magic[0] = 'B';
  CHECK(rejected(magic, "magic"));

  std::vector<char> version = good;
  version[8] = 1;  // the previous format
  CHECK(rejected(version, "version"));
  version[8] = 2;
  version[11] = 1;
  CHECK(rejected(version, "version"));

  for (int kind : {0, 3, 255}) {
    std::vector<char> bad_kind = good;
    bad_kind[12] = static_cast<char>(kind);
    CHECK(rejected(bad_kind, "kind"));
  }
  std::vector<char> ptx_kind = good;  // 2 is a valid kind, but the checksum is seeded with it
  ptx_kind[12] = 2;
  CHECK(rejected(ptx_kind, "checksum"));

  for (int index : {13, 14, 15}) {
    std::vector<char> reserved = good;
    reserved[static_cast<std::size_t>(index)] = 1;
    CHECK(rejected(reserved, "reserved"));
  }

  std::vector<char> trailing = good;
  trailing.push_back('\0');
  CHECK(rejected(trailing, "trailing"));

  std::vector<char> checksum = good;
  checksum.back() = static_cast<char>(checksum.back() ^ 0x40);
  CHECK(rejected(checksum, "checksum"));

  CacheEntryData long_name = make_entry(std::string(4097, 'n'), 3);
  CHECK(rejected(encode_entry(long_name), "too long"));
  CacheEntryData long_version = make_entry("v", 3);
  long_version.nvrtc_version = std::string(4097, '1');
  CHECK(rejected(encode_entry(long_version), "too long"));

  // Huge length fields must not be trusted (no allocation, no overflow).
  std::vector<char> huge = good;
  std::memset(huge.data() + 16, 0xff, 8);
  CHECK(rejected(huge, "truncated"));
  std::vector<char> huge_names = good;
  std::memset(huge_names.data() + 32, 0xff, 8);
  CHECK(rejected(huge_names, "too long"));
}

TEST_CASE("decode never crashes on arbitrary bytes") {
  std::mt19937 rng(12345);
  const std::vector<char> good = encode_entry(make_entry("fuzz.sm_90", 40));
  int accepted = 0;
  for (int round = 0; round < 20000; ++round) {
    std::vector<char> bytes;
    if (round % 2 == 0) {
      bytes.resize(rng() % 128);
      for (auto& b : bytes) b = static_cast<char>(rng());
    } else {
      // Start from a valid entry, scribble over a few bytes and cut or extend it.
      bytes = good;
      const int edits = 1 + static_cast<int>(rng() % 4);
      for (int e = 0; e < edits; ++e) bytes[rng() % bytes.size()] = static_cast<char>(rng());
      if (rng() % 2) bytes.resize(rng() % (bytes.size() + 16));
    }
    auto decoded = decode_entry(bytes.data(), bytes.size());
    if (decoded) ++accepted;
  }
  CHECK(accepted < 20000);
}

// ---------------------------------------------------------------------------------------------
// DiskCache: publish, modes, degraded operation

TEST_CASE("a stored entry is published atomically at the documented path") {
  TempDir dir;
  DiskCache cache(dir.path(), CacheMode::read_write, 0);
  CHECK(cache.usable_for_read());
  CHECK(cache.usable_for_write());

  const CacheKey key = make_key(7);
  const CacheEntryData entry = make_entry("paged_decode.f16.hd64.ps16.g1.sm_90a", 3000);
  CHECK_FALSE(cache.contains(key, entry.variant_name));
  CHECK_FALSE(cache.load(key, entry.variant_name).has_value());
  REQUIRE(cache.store(key, entry));

  const std::string hex = key.hex();
  const fs::path expected =
      dir.path() / "v1" / hex.substr(0, 2) / (hex + "." + entry.variant_name + ".cubin");
  CHECK(cache.entry_path(key, entry.variant_name) == expected);
  CHECK(all_files(dir.path()) == std::vector<fs::path>{expected});
  CHECK(cache.contains(key, entry.variant_name));
  CHECK_FALSE(cache.contains(key, "other.variant"));

  const std::string on_disk = read_file(expected);
  const std::vector<char> encoded = encode_entry(entry);
  CHECK(on_disk == std::string(encoded.begin(), encoded.end()));

  auto loaded = cache.load(key, entry.variant_name);
  REQUIRE(loaded.has_value());
  CHECK(same_entry(*loaded, entry));

  // Storing again replaces the entry in place; still no stray files.
  const CacheEntryData second = make_entry(entry.variant_name, 100, 9);
  REQUIRE(cache.store(key, second));
  CHECK(all_files(dir.path()) == std::vector<fs::path>{expected});
  CHECK(same_entry(*cache.load(key, entry.variant_name), second));
}

TEST_CASE("off mode touches nothing") {
  TempDir dir;
  const fs::path root = dir.path() / "cache";
  DiskCache cache(root, CacheMode::off, 0);
  CHECK_FALSE(cache.usable_for_read());
  CHECK_FALSE(cache.usable_for_write());
  CHECK_FALSE(cache.store(make_key(1), make_entry("a", 10)));
  CHECK_FALSE(cache.load(make_key(1), "a").has_value());
  CHECK(cache.lock_key(make_key(1), std::chrono::milliseconds(10)) == nullptr);
  CHECK(cache.list().empty());
  CHECK(cache.prune(0) == 0);
  CHECK(cache.clear() == 0);
  CHECK_FALSE(fs::exists(root));
}

TEST_CASE("read-only mode never writes but serves existing entries") {
  TempDir dir;
  const fs::path missing_root = dir.path() / "missing";
  {
    DiskCache cache(missing_root, CacheMode::read_only, 0);
    CHECK_FALSE(cache.usable_for_write());
    CHECK_FALSE(cache.usable_for_read());
    CHECK_FALSE(cache.store(make_key(1), make_entry("a", 10)));
    CHECK_FALSE(cache.load(make_key(1), "a").has_value());
    CHECK(cache.lock_key(make_key(1), std::chrono::milliseconds(10)) == nullptr);
    CHECK_FALSE(fs::exists(missing_root));
  }

  const fs::path root = dir.path() / "shared";
  const CacheEntryData entry = make_entry("shared.sm_80", 500);
  {
    DiskCache writer(root, CacheMode::read_write, 0);
    REQUIRE(writer.store(make_key(3), entry));
    REQUIRE(writer.store(make_key(4), make_entry("doomed.sm_80", 50)));
  }
  const fs::path doomed =
      DiskCache(root, CacheMode::read_only, 0).entry_path(make_key(4), "doomed.sm_80");
  write_file(doomed, "garbage");
  set_age(doomed, std::chrono::seconds(3600 * 3));
  const auto doomed_time = fs::last_write_time(doomed);
  const auto before = all_files(root);

  QuietLog quiet;
  DiskCache cache(root, CacheMode::read_only, 0);
  CHECK(cache.usable_for_read());
  CHECK_FALSE(cache.usable_for_write());
  const fs::path path = cache.entry_path(make_key(3), entry.variant_name);
  set_age(path, std::chrono::seconds(3600));
  const auto old_time = fs::last_write_time(path);
  auto loaded = cache.load(make_key(3), entry.variant_name);
  REQUIRE(loaded.has_value());
  CHECK(same_entry(*loaded, entry));
  CHECK(fs::last_write_time(path) == old_time);  // not even the timestamp is written

  CHECK_FALSE(cache.load(make_key(4), "doomed.sm_80").has_value());  // damaged, but kept
  CHECK(fs::exists(doomed));
  CHECK(fs::last_write_time(doomed) == doomed_time);
  CHECK_FALSE(cache.store(make_key(5), entry));
  CHECK(cache.prune(0) == 0);
  CHECK(cache.clear() == 0);
  const auto checked = cache.verify(true);
  CHECK(checked.size() == 2);
  CHECK(all_files(root) == before);
}

TEST_CASE("verify flags an entry whose binary kind is not the one its target gets") {
  QuietLog quiet;
  TempDir dir;
  DiskCache cache(dir.path() / "cache", CacheMode::read_write, 0);
  CacheEntryData cubin_target = make_entry("x.bf16.sm_90a", 64);
  cubin_target.kind = BinaryKind::ptx;  // well formed, checksum and all, but the wrong kind
  CacheEntryData ptx_target = make_entry("x.bf16.compute_90", 64);
  ptx_target.kind = BinaryKind::cubin;
  CacheEntryData good_cubin = make_entry("y.bf16.sm_90a", 64);
  CacheEntryData good_ptx = make_entry("y.bf16.compute_90", 64);
  good_ptx.kind = BinaryKind::ptx;
  REQUIRE(cache.store(make_key(1), cubin_target));
  REQUIRE(cache.store(make_key(2), ptx_target));
  REQUIRE(cache.store(make_key(3), good_cubin));
  REQUIRE(cache.store(make_key(4), good_ptx));
  const auto checked = cache.verify(false);
  REQUIRE(checked.size() == 4);
  for (const auto& info : checked) {
    CAPTURE(info.variant_name);
    CHECK(info.valid == (info.variant_name.rfind("y.", 0) == 0));
  }
}

TEST_CASE("a write-protected directory makes store fail while loads keep working") {
  QuietLog quiet;
  TempDir dir;
  const fs::path root = dir.path() / "cache";
  const CacheEntryData entry = make_entry("ro.sm_90", 256);
  {
    DiskCache writer(root, CacheMode::read_write, 0);
    REQUIRE(writer.store(make_key(1), entry));
  }

  SUBCASE("chmod 0555 on every directory") {
    const std::vector<fs::path> dirs = {root, root / "v1",
                                        root / "v1" / make_key(1).hex().substr(0, 2),
                                        root / "v1" / make_key(2).hex().substr(0, 2)};
    for (const auto& sub : dirs) fs::create_directories(sub);
    for (const auto& sub : dirs) fs::permissions(sub, fs::perms(0555));
    DiskCache cache(root, CacheMode::read_write, 0);
    if (!write_protection_works(root / "v1")) {
      MESSAGE("running as root: chmod 0555 does not stop writes, skipping the assertions");
      return;
    }
    CHECK_FALSE(cache.store(make_key(2), make_entry("other.sm_90", 10)));
    CHECK_FALSE(cache.usable_for_write());
    CHECK(count_temp_files(root) == 0);
    auto loaded = cache.load(make_key(1), entry.variant_name);
    REQUIRE(loaded.has_value());
    CHECK(same_entry(*loaded, entry));
  }

  SUBCASE("a regular file where the shard directory should be (fails even for root)") {
    DiskCache cache(root, CacheMode::read_write, 0);
    REQUIRE(cache.usable_for_write());
    CacheKey blocked_key = make_key(2);
    const fs::path shard = root / "v1" / blocked_key.hex().substr(0, 2);
    REQUIRE_FALSE(fs::exists(shard));
    write_file(shard, "not a directory");
    CHECK_FALSE(cache.store(blocked_key, make_entry("other.sm_90", 10)));
    CHECK_FALSE(cache.usable_for_write());
    CHECK(cache.usable_for_read());
    // Degraded: even stores that would work are refused now.
    CHECK_FALSE(cache.store(make_key(3), make_entry("third.sm_90", 10)));
    CHECK(count_temp_files(root) == 0);
    auto loaded = cache.load(make_key(1), entry.variant_name);
    REQUIRE(loaded.has_value());
    CHECK(same_entry(*loaded, entry));
  }
}

TEST_CASE("an unusable cache root degrades to memory-only without throwing") {
  QuietLog quiet;
  TempDir dir;
  const fs::path file = dir.path() / "plain_file";
  write_file(file, "x");

  const std::vector<fs::path> roots = {file, file / "sub",
                                       fs::path("/proc/astrai-jit-no-such-dir/cache")};
  for (const auto& root : roots) {
    CAPTURE(root);
    std::unique_ptr<DiskCache> cache;
    REQUIRE_NOTHROW(cache = std::make_unique<DiskCache>(root, CacheMode::read_write, 1024));
    CHECK_FALSE(cache->usable_for_write());
    CHECK_FALSE(cache->usable_for_read());
    CHECK_NOTHROW(CHECK_FALSE(cache->store(make_key(1), make_entry("a", 10))));
    CHECK_NOTHROW(CHECK_FALSE(cache->load(make_key(1), "a").has_value()));
    CHECK_FALSE(cache->contains(make_key(1), "a"));
    CHECK(cache->lock_key(make_key(1), std::chrono::milliseconds(5)) == nullptr);
    CHECK_NOTHROW(CHECK(cache->list().empty()));
    CHECK_NOTHROW(CHECK(cache->stats().entries == 0));
    CHECK_NOTHROW(CHECK(cache->verify(true).empty()));
    CHECK_NOTHROW(CHECK(cache->prune(0) == 0));
    CHECK_NOTHROW(CHECK(cache->clear() == 0));
  }
  CHECK(read_file(file) == "x");

  DiskCache empty_root(fs::path(), CacheMode::read_write, 0);
  CHECK_FALSE(empty_root.usable_for_write());
  CHECK_FALSE(fs::exists("v1"));
}

TEST_CASE("a full disk during store removes the temp file and degrades") {
  TempDir dir;
  const int pid = astrai::testing::spawn_child("cache-store-fsize-limit",
                                               {(dir.path() / "cache").string()});
  CHECK(astrai::testing::wait_child(pid) == 0);
  CHECK(count_temp_files(dir.path()) == 0);
}

TEST_CASE("one warning names the path of a damaged entry, once") {
  TempDir dir;
  const fs::path root = dir.path() / "cache";
  {
    DiskCache writer(root, CacheMode::read_write, 0);
    REQUIRE(writer.store(make_key(1), make_entry("warned.sm_90", 40)));
  }
  DiskCache cache(root, CacheMode::read_only, 0);  // read-only: the damaged file stays
  const fs::path path = cache.entry_path(make_key(1), "warned.sm_90");
  std::string bytes = read_file(path);
  bytes[bytes.size() - 1] ^= 0x01;
  write_file(path, bytes);

  QuietLog level(LogLevel::warn);
  StderrCapture capture(dir.path() / "stderr.txt");
  CHECK_FALSE(cache.load(make_key(1), "warned.sm_90").has_value());
  CHECK_FALSE(cache.load(make_key(1), "warned.sm_90").has_value());
  CHECK_FALSE(cache.load(make_key(1), "warned.sm_90").has_value());
  const std::string output = capture.finish();
  CHECK(count_occurrences(output, path.string()) == 1);
  CHECK(count_occurrences(output, "checksum") == 1);
  CHECK(fs::exists(path));
}

TEST_CASE("a damaged entry is removed on load and treated as a miss") {
  QuietLog quiet;
  TempDir dir;
  DiskCache cache(dir.path(), CacheMode::read_write, 0);
  const CacheKey key = make_key(11);
  const std::string variant = "damaged.sm_90a";
  REQUIRE(cache.store(key, make_entry(variant, 200)));
  const fs::path path = cache.entry_path(key, variant);
  const std::string good = read_file(path);

  SUBCASE("truncated") { write_file(path, good.substr(0, good.size() - 1)); }
  SUBCASE("header only") { write_file(path, good.substr(0, 40)); }
  SUBCASE("zero length") { write_file(path, ""); }
  SUBCASE("bit flip in the payload") {
    std::string bytes = good;
    bytes[150] ^= 0x10;
    write_file(path, bytes);
  }
  SUBCASE("bit flip in the header") {
    std::string bytes = good;
    bytes[17] ^= 0x01;
    write_file(path, bytes);
  }
  SUBCASE("trailing garbage") { write_file(path, good + "junk"); }
  SUBCASE("an entry of another variant under this name") {
    const std::vector<char> other = encode_entry(make_entry("other.sm_90a", 200));
    write_file(path, std::string(other.begin(), other.end()));
  }
  SUBCASE("a flipped bit in the variant name") {
    std::string bytes = good;
    bytes[40] ^= 0x02;
    write_file(path, bytes);
  }

  CHECK_FALSE(cache.load(key, variant).has_value());
  CHECK_FALSE(fs::exists(path));
  CHECK(cache.usable_for_write());  // damage is not an I/O failure
  // The slot is usable again.
  REQUIRE(cache.store(key, make_entry(variant, 200)));
  CHECK(cache.load(key, variant).has_value());
}

TEST_CASE("invalid variant names are refused without degrading the cache") {
  QuietLog quiet;
  TempDir dir;
  DiskCache cache(dir.path(), CacheMode::read_write, 0);
  for (const std::string& bad : {std::string(), std::string("a/b"), std::string("../x"),
                                 std::string(300, 'v'), std::string("tab\tname")}) {
    CAPTURE(bad);
    CHECK_FALSE(cache.store(make_key(1), make_entry(bad, 10)));
    CHECK_FALSE(cache.load(make_key(1), bad).has_value());
    CHECK_FALSE(cache.contains(make_key(1), bad));
  }
  CHECK(cache.usable_for_write());
  CHECK(cache.store(make_key(1), make_entry("fine.sm_90", 10)));
  CHECK(all_files(dir.path()).size() == 1);
}

// ---------------------------------------------------------------------------------------------
// Maintenance: list, stats, verify, prune, clear

TEST_CASE("list and stats report entries only, ignoring temp files and locks") {
  TempDir dir;
  DiskCache cache(dir.path(), CacheMode::read_write, 0);
  REQUIRE(cache.store(make_key(1), make_entry("one.sm_90", 100)));
  REQUIRE(cache.store(make_key(2), make_entry("two.with.dots.sm_90", 200)));
  auto lock = cache.lock_key(make_key(1), std::chrono::milliseconds(100));
  REQUIRE(lock != nullptr);
  const fs::path shard = cache.entry_path(make_key(1), "one.sm_90").parent_path();
  write_file(shard / ".tmp-123-abcdef", "partial");
  write_file(shard / "README", "unrelated");
  write_file(dir.path() / "v1" / "zz", "unrelated");

  auto entries = cache.list();
  REQUIRE(entries.size() == 2);
  std::sort(entries.begin(), entries.end(),
            [](const CacheEntryInfo& a, const CacheEntryInfo& b) {
              return a.size_bytes < b.size_bytes;
            });
  CHECK(entries[0].key_hex == make_key(1).hex());
  CHECK(entries[0].variant_name == "one.sm_90");
  CHECK(entries[0].path == cache.entry_path(make_key(1), "one.sm_90"));
  CHECK(entries[0].size_bytes == encode_entry(make_entry("one.sm_90", 100)).size());
  CHECK(entries[1].variant_name == "two.with.dots.sm_90");
  CHECK_FALSE(entries[0].valid);  // only verify() fills it

  const auto stats = cache.stats();
  CHECK(stats.entries == 2);
  CHECK(stats.total_bytes == entries[0].size_bytes + entries[1].size_bytes);
}

TEST_CASE("verify finds damaged entries and removes them only when repairing") {
  QuietLog quiet;
  TempDir dir;
  DiskCache cache(dir.path(), CacheMode::read_write, 0);
  for (int i = 0; i < 3; ++i) REQUIRE(cache.store(make_key(i), make_entry("ok.sm_90", 64, i)));
  const fs::path bad = cache.entry_path(make_key(1), "ok.sm_90");
  std::string bytes = read_file(bad);
  bytes[60] ^= 0x04;
  write_file(bad, bytes);
  // A valid entry renamed to the wrong variant is damaged too.
  const fs::path misnamed = cache.entry_path(make_key(2), "renamed.sm_90");
  fs::rename(cache.entry_path(make_key(2), "ok.sm_90"), misnamed);

  auto count_invalid = [](const std::vector<CacheEntryInfo>& entries) {
    return std::count_if(entries.begin(), entries.end(), [](const auto& e) { return !e.valid; });
  };
  auto checked = cache.verify(false);
  CHECK(checked.size() == 3);
  CHECK(count_invalid(checked) == 2);
  CHECK(fs::exists(bad));
  CHECK(fs::exists(misnamed));

  checked = cache.verify(true);
  CHECK(checked.size() == 3);
  CHECK(count_invalid(checked) == 2);
  CHECK_FALSE(fs::exists(bad));
  CHECK_FALSE(fs::exists(misnamed));

  checked = cache.verify(true);
  REQUIRE(checked.size() == 1);
  CHECK(checked[0].valid);
  CHECK(checked[0].key_hex == make_key(0).hex());
}

TEST_CASE("prune removes the least recently used entries first") {
  TempDir dir;
  DiskCache cache(dir.path(), CacheMode::read_write, 0);
  std::vector<std::uint64_t> sizes;
  for (int i = 0; i < 4; ++i) {
    REQUIRE(cache.store(make_key(i), make_entry("lru.sm_90", 1000)));
    // Stored long ago, oldest first: 0 is the least recently stored.
    set_age(cache.entry_path(make_key(i), "lru.sm_90"), std::chrono::seconds(3600 * (10 - i)));
  }
  const std::uint64_t entry_size = cache.list().at(0).size_bytes;
  // Using entries 0 and 2 makes them the most recently used.
  REQUIRE(cache.load(make_key(0), "lru.sm_90").has_value());
  REQUIRE(cache.load(make_key(2), "lru.sm_90").has_value());

  CHECK(cache.prune(4 * entry_size) == 0);
  CHECK(cache.stats().entries == 4);
  CHECK(cache.prune(2 * entry_size + 10) == 2 * entry_size);
  CHECK(cache.contains(make_key(0), "lru.sm_90"));
  CHECK_FALSE(cache.contains(make_key(1), "lru.sm_90"));
  CHECK(cache.contains(make_key(2), "lru.sm_90"));
  CHECK_FALSE(cache.contains(make_key(3), "lru.sm_90"));

  REQUIRE(cache.load(make_key(0), "lru.sm_90").has_value());  // now 2 is the older one
  CHECK(cache.prune(entry_size) == entry_size);
  CHECK(cache.contains(make_key(0), "lru.sm_90"));
  CHECK_FALSE(cache.contains(make_key(2), "lru.sm_90"));
  CHECK(cache.prune(0) == entry_size);
  CHECK(cache.list().empty());
}

TEST_CASE("prune removes temp files left behind for over an hour") {
  TempDir dir;
  DiskCache cache(dir.path(), CacheMode::read_write, 0);
  REQUIRE(cache.store(make_key(1), make_entry("keep.sm_90", 10)));
  const fs::path shard = cache.entry_path(make_key(1), "keep.sm_90").parent_path();
  const fs::path stale = shard / ".tmp-4242-0123456789abcdef";
  const fs::path fresh = shard / ".tmp-4243-fedcba9876543210";
  write_file(stale, "left by a killed process");
  write_file(fresh, "being written right now");
  set_age(stale, std::chrono::seconds(2 * 3600));

  CHECK(cache.prune(1 << 20) == 0);
  CHECK_FALSE(fs::exists(stale));
  CHECK(fs::exists(fresh));
  CHECK(cache.contains(make_key(1), "keep.sm_90"));
}

TEST_CASE("a size cap is enforced after every store and keeps the entry just written") {
  TempDir dir;
  const std::uint64_t entry_size = encode_entry(make_entry("cap.sm_90", 1000)).size();
  DiskCache cache(dir.path(), CacheMode::read_write, 3 * entry_size);
  for (int i = 0; i < 8; ++i) {
    CAPTURE(i);
    REQUIRE(cache.store(make_key(i), make_entry("cap.sm_90", 1000, i)));
    // Make the order unambiguous even with a coarse file system clock.
    set_age(cache.entry_path(make_key(i), "cap.sm_90"), std::chrono::seconds(1000 - i));
    CHECK(cache.stats().total_bytes <= 3 * entry_size);
    CHECK(cache.contains(make_key(i), "cap.sm_90"));
  }
  CHECK(cache.stats().entries == 3);
  for (int i = 5; i < 8; ++i) CHECK(cache.contains(make_key(i), "cap.sm_90"));

  // An entry bigger than the whole cap still stays (everything older goes).
  REQUIRE(cache.store(make_key(100), make_entry("cap.sm_90", 10 * 1000)));
  CHECK(cache.stats().entries == 1);
  CHECK(cache.contains(make_key(100), "cap.sm_90"));
}

TEST_CASE("clear removes entries, locks and temp files") {
  TempDir dir;
  DiskCache cache(dir.path(), CacheMode::read_write, 0);
  for (int i = 0; i < 5; ++i) REQUIRE(cache.store(make_key(i), make_entry("c.sm_90", 10)));
  { auto lock = cache.lock_key(make_key(1), std::chrono::milliseconds(100)); }
  const fs::path shard = cache.entry_path(make_key(1), "c.sm_90").parent_path();
  write_file(shard / ".tmp-1-2", "partial");
  const fs::path unrelated = dir.path() / "keep-me.txt";
  write_file(unrelated, "user data beside the cache");

  CHECK(all_files(dir.path() / "v1" / "locks").size() == 1);
  CHECK(cache.clear() == 5);
  CHECK(all_files(dir.path()) == std::vector<fs::path>{unrelated});
  CHECK(cache.clear() == 0);
  CHECK(cache.usable_for_write());
  REQUIRE(cache.store(make_key(1), make_entry("c.sm_90", 10)));
  CHECK(cache.load(make_key(1), "c.sm_90").has_value());
}

// ---------------------------------------------------------------------------------------------
// Concurrency

TEST_CASE("eight threads storing and loading shared and private keys stay consistent") {
  TempDir dir;
  DiskCache cache(dir.path(), CacheMode::read_write, 0);
  const CacheEntryData shared = make_entry("shared.sm_90a", 20000, 77);
  constexpr int kThreads = 8;
  constexpr int kRounds = 25;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < kRounds; ++round) {
        const CacheKey own_key = make_key(1000 + t * kRounds + round);
        const CacheEntryData own = make_entry("own.sm_90a", 1000 + t * 10, t * 1000 + round);
        if (!cache.store(make_key(0), shared)) ++failures;
        if (!cache.store(own_key, own)) ++failures;
        auto loaded_shared = cache.load(make_key(0), shared.variant_name);
        if (!loaded_shared || !same_entry(*loaded_shared, shared)) ++failures;
        auto loaded_own = cache.load(own_key, own.variant_name);
        if (!loaded_own || !same_entry(*loaded_own, own)) ++failures;
        if (round % 8 == 0) (void)cache.stats();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  CHECK(failures.load() == 0);
  CHECK(cache.usable_for_write());
  CHECK(count_temp_files(dir.path()) == 0);

  const auto checked = cache.verify(false);
  CHECK(checked.size() == 1 + kThreads * kRounds);
  CHECK(std::all_of(checked.begin(), checked.end(), [](const auto& e) { return e.valid; }));
  for (int t = 0; t < kThreads; ++t) {
    for (int round = 0; round < kRounds; ++round) {
      auto loaded = cache.load(make_key(1000 + t * kRounds + round), "own.sm_90a");
      REQUIRE(loaded.has_value());
      CHECK(same_entry(*loaded, make_entry("own.sm_90a", 1000 + t * 10, t * 1000 + round)));
    }
  }
}

TEST_CASE("maintenance tolerates entries vanishing while other threads store and clear") {
  QuietLog quiet;
  TempDir dir;
  DiskCache cache(dir.path(), CacheMode::read_write, 8000);
  std::atomic<bool> stop{false};
  std::atomic<int> exceptions{0};
  std::atomic<int> bad_loads{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; !stop.load(); ++i) {
        try {
          const CacheEntryData entry = make_entry("race.sm_90", 500, t);
          cache.store(make_key(t * 100000 + i % 50), entry);
          auto loaded = cache.load(make_key(t * 100000 + (i + 25) % 50), entry.variant_name);
          if (loaded && !same_entry(*loaded, entry)) ++bad_loads;
        } catch (...) {
          ++exceptions;
        }
      }
    });
  }
  threads.emplace_back([&] {
    for (int i = 0; !stop.load(); ++i) {
      try {
        (void)cache.list();
        (void)cache.stats();
        (void)cache.verify(i % 2 == 0);
        (void)cache.prune(4000);
        if (i % 5 == 0) (void)cache.clear();
      } catch (...) {
        ++exceptions;
      }
      // clear() also deletes in-flight temp files; store() retries that a few times, so keep
      // the clearing rate merely aggressive rather than continuous.
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  stop = true;
  for (auto& thread : threads) thread.join();
  CHECK(exceptions.load() == 0);
  CHECK(bad_loads.load() == 0);
  CHECK(cache.usable_for_write());  // concurrent clear() must not degrade writers
  const auto checked = cache.verify(false);
  CHECK(std::all_of(checked.begin(), checked.end(), [](const auto& e) { return e.valid; }));
}

}  // TEST_SUITE
