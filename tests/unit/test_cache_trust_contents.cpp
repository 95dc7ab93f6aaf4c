// What the cache reads from files it cannot vouch for: oversized entries, entries of another
// format version, malformed kernel binaries (checked before they reach the driver) and manifests.
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "astrai/error.hpp"
#include "cache/cache_archive.hpp"
#include "cache/cache_entry.hpp"
#include "cache/disk_cache.hpp"
#include "runtime/jit_engine.hpp"
#include "runtime/kernel_spec.hpp"
#include "tests/support/cache_support.hpp"
#include "tests/support/support.hpp"
#include "tests/unit/cache_trust_support.hpp"

namespace fs = std::filesystem;
using astrai::detail::BinaryKind;
using astrai::detail::CacheEntryData;
using astrai::detail::CacheMode;
using astrai::detail::check_kernel_binary;
using astrai::detail::DiskCache;
using astrai::detail::JitEngine;
using astrai::detail::KernelSpec;
using astrai::detail::VariantSource;
using astrai::testing::config_for;
using astrai::testing::LogCapture;
using astrai::testing::make_entry;
using astrai::testing::make_key;
using astrai::testing::QuietLog;
using astrai::testing::read_file;
using astrai::testing::rotary_spec;
using astrai::testing::TempDir;
using astrai::testing::write_file;

namespace {

void put_le(std::vector<char>& bytes, std::size_t at, std::uint64_t value, int width) {
  for (int i = 0; i < width; ++i) bytes[at + i] = static_cast<char>((value >> (8 * i)) & 0xff);
}

// A minimal 64-bit little-endian ELF: header, then `sections` section headers right after it.
std::vector<char> tiny_elf(std::uint16_t sections = 1) {
  std::vector<char> elf(64 + 64 * std::size_t{sections}, 0);
  elf[0] = 0x7f;
  elf[1] = 'E';
  elf[2] = 'L';
  elf[3] = 'F';
  elf[4] = 2;  // 64-bit
  elf[5] = 1;  // little endian
  put_le(elf, 40, 64, 8);        // e_shoff
  put_le(elf, 52, 64, 2);        // e_ehsize
  put_le(elf, 58, 64, 2);        // e_shentsize
  put_le(elf, 60, sections, 2);  // e_shnum
  return elf;
}

}  // namespace

TEST_SUITE("trust") {

TEST_CASE("an entry file over 64 MiB is refused before it is read") {
  TempDir dir;
  DiskCache cache(dir.path() / "cache", CacheMode::read_write, 0);
  REQUIRE(cache.store(make_key(1), make_entry("huge.sm_80")));
  const fs::path path = cache.entry_path(make_key(1), "huge.sm_80");
  REQUIRE(::truncate(path.c_str(), static_cast<off_t>(astrai::detail::kMaxEntryFileBytes + 1)) == 0);
  LogCapture log(dir.path() / "log.txt");
  CHECK_FALSE(cache.load(make_key(1), "huge.sm_80").has_value());
  const std::string output = log.finish();
  CHECK(output.find("larger than the 64 MiB limit") != std::string::npos);
  // Storing one is refused too.
  QuietLog quiet;
  CHECK_FALSE(cache.store(make_key(2), make_entry("huge2.sm_80", astrai::detail::kMaxEntryFileBytes)));
}

TEST_CASE("an entry of another format version is a miss, never removed or called damaged") {
  QuietLog quiet;
  TempDir dir;
  DiskCache cache(dir.path() / "cache", CacheMode::read_write, 0);
  REQUIRE(cache.store(make_key(1), make_entry("future.sm_80")));
  const fs::path path = cache.entry_path(make_key(1), "future.sm_80");
  std::string bytes = read_file(path);
  bytes[8] = static_cast<char>(astrai::detail::kSignedEntryFormatVersion + 1);
  write_file(path, bytes);
  CHECK(astrai::detail::is_other_entry_format(bytes.data(), bytes.size()));
  CHECK_FALSE(cache.load(make_key(1), "future.sm_80").has_value());
  CHECK(fs::exists(path));
  const auto checked = cache.verify(true);
  REQUIRE(checked.size() == 1);
  CHECK(checked[0].other_format);
  CHECK(checked[0].valid);
  CHECK(fs::exists(path));
}

TEST_CASE("kernel binaries are checked before they reach the driver") {
  std::string why;
  const char ptx[] = ".version 8.0\n.target sm_80\n";
  CHECK(check_kernel_binary(BinaryKind::ptx, ptx, sizeof ptx, &why));  // NUL included
  CHECK_FALSE(check_kernel_binary(BinaryKind::ptx, ptx, sizeof ptx - 1, &why));
  CHECK(why == "PTX text does not end in NUL");
  CHECK_FALSE(check_kernel_binary(BinaryKind::ptx, ptx, 0, &why));

  std::vector<char> elf = tiny_elf(2);
  CHECK(check_kernel_binary(BinaryKind::cubin, elf.data(), elf.size(), &why));
  CHECK_FALSE(check_kernel_binary(BinaryKind::cubin, elf.data(), 63, &why));
  CHECK(why == "cubin shorter than an ELF header");
  CHECK_FALSE(check_kernel_binary(BinaryKind::cubin, elf.data(), elf.size() - 1, &why));
  CHECK(why == "ELF section table lies outside the cubin");
  {
    auto bad = elf;
    put_le(bad, 40, ~std::uint64_t{0} - 10, 8);  // e_shoff near 2^64: no overflow
    CHECK_FALSE(check_kernel_binary(BinaryKind::cubin, bad.data(), bad.size(), &why));
    put_le(bad, 40, 64, 8);
    put_le(bad, 60, 0xffff, 2);
    CHECK_FALSE(check_kernel_binary(BinaryKind::cubin, bad.data(), bad.size(), &why));
  }
  {
    auto bad = elf;
    put_le(bad, 64 + 4, 1, 4);                 // section 0: SHT_PROGBITS
    put_le(bad, 64 + 24, 100, 8);              // offset
    put_le(bad, 64 + 32, ~std::uint64_t{0}, 8);  // size
    CHECK_FALSE(check_kernel_binary(BinaryKind::cubin, bad.data(), bad.size(), &why));
    CHECK(why == "an ELF section lies outside the cubin");
    put_le(bad, 64 + 4, 8, 4);  // SHT_NOBITS takes no file space
    CHECK(check_kernel_binary(BinaryKind::cubin, bad.data(), bad.size(), &why));
  }
  {
    auto bad = elf;
    bad[4] = 1;  // 32-bit
    CHECK_FALSE(check_kernel_binary(BinaryKind::cubin, bad.data(), bad.size(), &why));
    bad = elf;
    bad[1] = 'X';
    CHECK_FALSE(check_kernel_binary(BinaryKind::cubin, bad.data(), bad.size(), &why));
  }
}

TEST_CASE("a sound entry holding a malformed cubin is recompiled, never loaded") {
  QuietLog quiet;
  TempDir dir;
  const KernelSpec spec = rotary_spec();
  JitEngine engine(config_for(dir.path() / "cache"));
  CacheEntryData entry;
  entry.kind = BinaryKind::cubin;
  entry.variant_name = spec.name();
  entry.nvrtc_version = "x";
  std::vector<char> not_elf = tiny_elf(3);
  not_elf.resize(100);  // the section table no longer fits
  entry.payload = astrai::detail::encode_variant_payload({"kernel_symbol"}, not_elf);
  REQUIRE(engine.cache().store(engine.key_for(spec), entry));
  VariantSource source = VariantSource::memory;
  const auto variant = engine.get(spec, &source);
  CHECK(source == VariantSource::compiled);
  std::string why;
  CHECK(check_kernel_binary(variant->kind, variant->binary.data(), variant->binary.size(), &why));
}

TEST_CASE("a manifest must be a regular file of bounded size with bounded lines") {
  TempDir dir;
  const fs::path manifest = dir.path() / "manifest.txt";
  write_file(manifest, "# recorded\n  rotary_emb.bf16.hd64.sm_80  # one\n\nx\n");
  const auto lines = astrai::detail::read_manifest_lines(manifest);
  REQUIRE(lines.size() == 2);
  CHECK(lines[0].number == 2);
  CHECK(lines[0].text == "rotary_emb.bf16.hd64.sm_80");
  CHECK(lines[1].number == 4);

  REQUIRE(::mkfifo((dir.path() / "fifo").c_str(), 0600) == 0);
  CHECK_THROWS_WITH_AS(astrai::detail::read_manifest_lines(dir.path() / "fifo"),
                       ("--manifest: '" + (dir.path() / "fifo").string() +
                        "' is not a regular file").c_str(),
                       astrai::InvalidArgument);
  CHECK_THROWS_AS(astrai::detail::read_manifest_lines(dir.path()), astrai::InvalidArgument);
  write_file(manifest, "ok\n" + std::string(5000, 'A') + "\n");
  try {
    astrai::detail::read_manifest_lines(manifest);
    FAIL("a 5000-character line was accepted");
  } catch (const astrai::InvalidArgument& error) {
    const std::string message = error.what();
    CHECK(message.find(":2: line longer than 1024 characters") != std::string::npos);
    CHECK(message.size() < 400);  // the line is echoed cut short
  }
  CHECK(astrai::detail::echo_text(std::string("a\x1b[2Jb", 6)) == "a\\x1b[2Jb");
}

}  // TEST_SUITE
