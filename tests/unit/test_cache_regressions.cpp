// Regression tests for cache defects found by the torture harness (tests/torture/).
#include <doctest/doctest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "astrai/error.hpp"
#include "base/logging.hpp"
#include "cache/disk_cache.hpp"
#include "runtime/env_config.hpp"
#include "runtime/jit_engine.hpp"
#include "runtime/kernel_spec.hpp"
#include "tests/support/cache_support.hpp"
#include "tests/support/support.hpp"

namespace fs = std::filesystem;
using astrai::detail::BinaryKind;
using astrai::detail::decode_entry;
using astrai::detail::EnvConfig;
using astrai::detail::JitEngine;
using astrai::detail::KernelSpec;
using astrai::detail::VariantSource;
using astrai::testing::config_for;
using astrai::testing::QuietLog;
using astrai::testing::read_file;
using astrai::testing::TempDir;
using astrai::testing::write_file;

namespace {

constexpr std::size_t kKindOffset = 12;  // header: magic(8), version(4), kind(1)

// Warms `spec` into `dir`, then re-encodes its entry with the binary kind `kind` (a well-formed
// entry with a valid checksum but the wrong kind: the engine must still refuse it).
fs::path warm_and_set_kind(const fs::path& dir, const KernelSpec& spec, BinaryKind kind) {
  JitEngine warm(config_for(dir));
  warm.get(spec);
  const fs::path path = warm.cache().entry_path(warm.key_for(spec), spec.name());
  std::string bytes = read_file(path);
  REQUIRE(bytes.size() > kKindOffset);
  REQUIRE(static_cast<std::uint8_t>(bytes[kKindOffset]) != static_cast<std::uint8_t>(kind));
  // Flipping the byte alone breaks the checksum (it is seeded with the header's kind byte).
  std::string flipped = bytes;
  flipped[kKindOffset] = static_cast<char>(kind);
  REQUIRE_FALSE(decode_entry(flipped.data(), flipped.size()).has_value());
  auto entry = decode_entry(bytes.data(), bytes.size());
  REQUIRE(entry.has_value());
  entry->kind = kind;
  const std::vector<char> forged = encode_entry(*entry);
  write_file(path, std::string(forged.begin(), forged.end()));
  REQUIRE(decode_entry(forged.data(), forged.size()).has_value());
  return path;
}

}  // namespace

TEST_CASE("an entry whose binary kind byte was changed is never served from disk") {
  QuietLog quiet;
  struct Case {
    const char* variant;
    BinaryKind forged;
    BinaryKind real;
  };
  const Case cases[] = {
      {"rotary_emb.bf16.hd8.sm_80", BinaryKind::ptx, BinaryKind::cubin},
      {"rotary_emb.bf16.hd8.compute_80", BinaryKind::cubin, BinaryKind::ptx},
  };
  for (const Case& c : cases) {
    CAPTURE(c.variant);
    const KernelSpec spec = KernelSpec::parse(c.variant);

    SUBCASE("a normal get recompiles once and republishes the right kind") {
      TempDir dir;
      const fs::path path = warm_and_set_kind(dir.path(), spec, c.forged);
      JitEngine engine(config_for(dir.path()));
      VariantSource source = VariantSource::memory;
      const auto variant = engine.get(spec, &source);
      CHECK(source == VariantSource::compiled);
      CHECK(engine.counters().compiles == 1);
      CHECK(engine.counters().disk_hits == 0);
      CHECK(variant->kind == c.real);
      const std::string republished = read_file(path);
      const auto entry = decode_entry(republished.data(), republished.size());
      REQUIRE(entry.has_value());
      CHECK(entry->kind == c.real);

      JitEngine again(config_for(dir.path()));
      again.get(spec, &source);
      CHECK(source == VariantSource::disk);
    }

    SUBCASE("a strict get treats it as a miss") {
      TempDir dir;
      warm_and_set_kind(dir.path(), spec, c.forged);
      EnvConfig strict = config_for(dir.path());
      strict.strict = true;
      JitEngine engine(strict);
      CHECK_THROWS_AS(engine.get(spec), astrai::CacheMissError);
      CHECK(engine.counters().disk_hits == 0);
      CHECK(engine.counters().compiles == 0);
    }
  }
}
