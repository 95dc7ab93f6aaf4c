// `cache import` stores a whole archive or nothing: the archive's structure (end marker and
// count included) and every entry, payload included, are checked before anything is stored.
// And `cache export` writes archives only their owner can read.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "astrai/error.hpp"
#include "cache/cache_archive.hpp"
#include "cache/disk_cache.hpp"
#include "cache/variant_payload.hpp"
#include "tests/support/cache_support.hpp"
#include "tests/support/support.hpp"
#include "tests/unit/cache_trust_support.hpp"

namespace fs = std::filesystem;
using astrai::detail::CacheEntryData;
using astrai::detail::CacheMode;
using astrai::detail::DiskCache;
using astrai::testing::all_files;
using astrai::testing::make_key;
using astrai::testing::make_loadable_entry;
using astrai::testing::mode_of;
using astrai::testing::QuietLog;
using astrai::testing::read_file;
using astrai::testing::TempDir;
using astrai::testing::write_file;

namespace {

// The bytes of an archive exported from a cache holding `entries` (keys 1, 2, ...).
std::string archive_of(const fs::path& dir, const std::vector<CacheEntryData>& entries) {
  {
    DiskCache source(dir / "source", CacheMode::read_write, 0);
    for (std::size_t i = 0; i < entries.size(); ++i)
      REQUIRE(source.store(make_key(i + 1), entries[i]));
  }
  const fs::path archive = dir / "export.astrai";
  const auto report =
      astrai::detail::export_cache(DiskCache(dir / "source", CacheMode::read_only, 0), {}, archive);
  REQUIRE(report.entries == entries.size());
  std::string bytes = read_file(archive);
  fs::remove_all(dir / "source");
  fs::remove(archive);
  return bytes;
}

// Imports `bytes` into a fresh cache below `dir`; returns the error's message, or "" when the
// import succeeded. Either way the files the import left are in `files`.
std::string import_bytes(const fs::path& dir, const std::string& bytes,
                         std::vector<fs::path>* files) {
  const fs::path archive = dir / "import.astrai";
  write_file(archive, bytes);
  const fs::path target = dir / "target";
  fs::remove_all(target);
  std::string message;
  {
    DiskCache cache(target, CacheMode::read_write, 0);
    try {
      astrai::detail::import_archive(cache, archive);
    } catch (const astrai::Error& error) {
      message = error.what();
    }
  }
  *files = all_files(target);
  return message;
}

}  // namespace

TEST_SUITE("trust") {

TEST_CASE("an archive whose sound entries are followed by damage imports nothing") {
  QuietLog quiet;
  TempDir dir;
  const std::string good =
      archive_of(dir.path(), {make_loadable_entry("a.sm_80", 1), make_loadable_entry("b.sm_80", 2)});
  std::vector<fs::path> files;
  REQUIRE(import_bytes(dir.path(), good, &files).empty());
  REQUIRE(files.size() == 2);

  const std::string trailer = good.substr(good.size() - 16);
  struct Damage {
    const char* what;
    std::string bytes;
    const char* reason;
  };
  std::string wrong_count = good;
  wrong_count[wrong_count.size() - 8] = 3;
  const std::vector<Damage> damages = {
      {"garbage instead of the end marker", good.substr(0, good.size() - 16) + "garbage, garbage",
       "missing or wrong end marker"},
      {"no end marker", good.substr(0, good.size() - 16), "missing or wrong end marker"},
      {"a wrong count in the end marker", wrong_count, "missing or wrong end marker"},
      {"bytes after the end marker", good + "x", "trailing bytes"},
      {"the second entry cut short", good.substr(0, good.size() - 16 - 10), "truncated"},
  };
  for (const auto& damage : damages) {
    CAPTURE(damage.what);
    const std::string message = import_bytes(dir.path(), damage.bytes, &files);
    CHECK(message.find(damage.reason) != std::string::npos);
    CHECK(message.find("; nothing imported") != std::string::npos);
    CHECK(files.empty());  // no entry, and no temp file left behind
  }
}

TEST_CASE("an entry whose payload a load would refuse makes import refuse the whole archive") {
  QuietLog quiet;
  TempDir dir;
  CacheEntryData not_elf = make_loadable_entry("b.sm_80");
  not_elf.payload = astrai::detail::encode_variant_payload({"_Z6kernelv"}, {'n', 'o', 't'});
  CacheEntryData no_symbols = make_loadable_entry("c.sm_80");
  no_symbols.payload = {'\xff', '\xff', '\xff', '\xff', 'x'};
  CacheEntryData truncated_elf = make_loadable_entry("d.sm_80");
  truncated_elf.payload.resize(truncated_elf.payload.size() - 1);
  struct Case {
    CacheEntryData entry;
    const char* reason;
  };
  for (const auto& bad : {Case{not_elf, "cubin shorter than an ELF header"},
                          Case{no_symbols, "malformed symbol table in the payload"},
                          Case{truncated_elf, "cubin shorter than an ELF header"}}) {
    CAPTURE(bad.reason);
    // Its checksum is valid: only the payload check can tell.
    const std::string bytes = archive_of(dir.path(), {make_loadable_entry("a.sm_80"), bad.entry});
    std::vector<fs::path> files;
    const std::string message = import_bytes(dir.path(), bytes, &files);
    CHECK(message.find(std::string("entry 2 of 2 (") + make_key(2).hex() + "." +
                       bad.entry.variant_name + ".cubin): " + bad.reason) != std::string::npos);
    CHECK(files.empty());
  }
}

TEST_CASE("an exported archive is readable by its owner only") {
  QuietLog quiet;
  TempDir dir;
  {
    DiskCache source(dir.path() / "source", CacheMode::read_write, 0);
    REQUIRE(source.store(make_key(1), make_loadable_entry("a.sm_80")));
  }
  const fs::path archive = dir.path() / "kernels.astrai";
  astrai::detail::export_cache(DiskCache(dir.path() / "source", CacheMode::read_only, 0), {},
                               archive);
  CHECK(mode_of(archive) == 0600);
}

}  // TEST_SUITE
