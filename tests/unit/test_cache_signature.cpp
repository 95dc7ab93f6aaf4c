// Signed cache entries: keys and their text forms, the entry format's signature trailer, the
// check every tier applies, and what the disk cache, layers, import and the engine do with
// ASTRAI_JIT_TRUSTED_KEYS and ASTRAI_JIT_SIGNING_KEY.
#include <doctest/doctest.h>
#include <sys/stat.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "astrai/error.hpp"
#include "cache/cache_archive.hpp"
#include "cache/cache_entry.hpp"
#include "cache/cache_metrics.hpp"
#include "cache/cache_signature.hpp"
#include "cache/disk_cache.hpp"
#include "runtime/env_config.hpp"
#include "runtime/jit_engine.hpp"
#include "tests/support/cache_support.hpp"
#include "tests/support/specs.hpp"
#include "tests/support/support.hpp"

namespace fs = std::filesystem;
using astrai::detail::CacheEntryData;
using astrai::detail::CacheMode;
using astrai::detail::decode_entry;
using astrai::detail::DiskCache;
using astrai::detail::encode_entry;
using astrai::detail::EnvConfig;
using astrai::detail::JitEngine;
using astrai::detail::KernelSpec;
using astrai::detail::SignatureState;
using astrai::detail::SigningKey;
using astrai::detail::TrustedKeys;
using astrai::detail::VariantSource;
using astrai::testing::config_for;
using astrai::testing::count_occurrences;
using astrai::testing::LogCapture;
using astrai::testing::make_key;
using astrai::testing::make_loadable_entry;
using astrai::testing::QuietLog;
using astrai::testing::read_file;
using astrai::testing::TempDir;
using astrai::testing::write_file;

namespace {

std::shared_ptr<const TrustedKeys> trusting(const SigningKey& key) {
  auto keys = std::make_shared<TrustedKeys>();
  keys->keys.push_back(key.public_key());
  return keys;
}

KernelSpec cheap_spec() { return astrai::testing::rotary_spec(astrai::DType::bf16, 64, "sm_80"); }

EnvConfig engine_config(const fs::path& dir, const SigningKey* trusted, const SigningKey* signer) {
  EnvConfig config = config_for(dir);
  if (trusted) config.trusted_keys = trusting(*trusted);
  if (signer) config.signing_key = std::make_shared<SigningKey>(*signer);
  return config;
}

VariantSource get_source(const EnvConfig& config, const KernelSpec& spec) {
  JitEngine engine(config);
  VariantSource source = VariantSource::memory;
  engine.get(spec, &source);
  return source;
}

// The single entry file of the cache at `dir`.
fs::path only_entry(const fs::path& dir) {
  DiskCache cache(dir, CacheMode::read_only, 0);
  const auto entries = cache.list();
  REQUIRE(entries.size() == 1);
  return entries[0].path;
}

std::uint64_t refusals() {
  return astrai::detail::cache_metrics_registry().signature_refusals.load();
}

}  // namespace

TEST_SUITE("signed cache entries") {

TEST_CASE("a generated key round-trips through its text forms and its signature verifies") {
  const SigningKey key = SigningKey::generate();
  astrai::detail::PublicKey parsed;
  std::string why;
  REQUIRE(astrai::detail::parse_public_key(
      astrai::detail::format_public_key(key.public_key()), &parsed, &why));
  CHECK(parsed.id == key.id());
  CHECK(parsed.bytes == key.public_key().bytes);
  SigningKey secret;
  REQUIRE(astrai::detail::parse_secret_key(astrai::detail::format_secret_key(key), &secret, &why));
  CHECK(secret.id() == key.id());

  CacheEntryData entry = make_loadable_entry("signed.sm_80");
  const std::string hex = make_key(1).hex();
  astrai::detail::sign_entry_data(secret, hex, &entry);
  const std::vector<char> bytes = encode_entry(entry);
  CHECK(bytes[8] == static_cast<char>(astrai::detail::kSignedEntryFormatVersion));
  const auto decoded = decode_entry(bytes.data(), bytes.size());
  REQUIRE(decoded);
  REQUIRE(decoded->signature);
  CHECK(decoded->payload == entry.payload);
  CHECK(decoded->signature->key_id == key.id());
  CHECK(astrai::detail::verify_entry_signature(hex, *decoded, *trusting(key)) ==
        SignatureState::valid);
  // The trailer sits after the payload: the last 72 bytes are the key id and the signature.
  CHECK(std::equal(key.id().begin(), key.id().end(),
                   reinterpret_cast<const unsigned char*>(bytes.data()) + bytes.size() - 72));
}

TEST_CASE("an unsigned entry keeps format 2 and loads when no keys are configured") {
  TempDir dir;
  CacheEntryData entry = make_loadable_entry("plain.sm_80");
  CHECK(encode_entry(entry)[8] == static_cast<char>(astrai::detail::kEntryFormatVersion));
  DiskCache cache(dir.path(), CacheMode::read_write, 0);
  REQUIRE(cache.store(make_key(1), entry));
  const auto loaded = cache.load(make_key(1), "plain.sm_80");
  REQUIRE(loaded);
  CHECK_FALSE(loaded->signature);

  // A signed entry loads too, its signature unchecked.
  astrai::detail::sign_entry_data(SigningKey::generate(), make_key(2).hex(), &entry);
  entry.variant_name = "plain2.sm_80";
  REQUIRE(cache.store(make_key(2), entry));
  CHECK(cache.load(make_key(2), "plain2.sm_80"));
}

TEST_CASE("a tampered payload, key or variant, a wrong key or a truncated signature fails") {
  const SigningKey key = SigningKey::generate();
  const SigningKey other = SigningKey::generate();
  CacheEntryData entry = make_loadable_entry("tamper.sm_80");
  const std::string hex = make_key(3).hex();
  astrai::detail::sign_entry_data(key, hex, &entry);
  const auto trusted = trusting(key);
  REQUIRE(astrai::detail::verify_entry_signature(hex, entry, *trusted) == SignatureState::valid);

  CacheEntryData payload = entry;
  payload.payload.back() = static_cast<char>(payload.payload.back() ^ 1);
  CHECK(astrai::detail::verify_entry_signature(hex, payload, *trusted) ==
        SignatureState::bad_signature);
  CHECK(astrai::detail::verify_entry_signature(make_key(4).hex(), entry, *trusted) ==
        SignatureState::bad_signature);
  CacheEntryData renamed = entry;
  renamed.variant_name = "tamper.sm_86";
  CHECK(astrai::detail::verify_entry_signature(hex, renamed, *trusted) ==
        SignatureState::bad_signature);
  CacheEntryData forged = entry;
  forged.signature->bytes[10] ^= 0x40;
  CHECK(astrai::detail::verify_entry_signature(hex, forged, *trusted) ==
        SignatureState::bad_signature);
  CHECK(astrai::detail::verify_entry_signature(hex, entry, *trusting(other)) ==
        SignatureState::unknown_key);
  CacheEntryData bare = entry;
  bare.signature.reset();
  CHECK(astrai::detail::verify_entry_signature(hex, bare, *trusted) ==
        SignatureState::unsigned_entry);

  // A signed file cut inside its trailer, or with a byte after it, is not an entry.
  std::vector<char> bytes = encode_entry(entry);
  std::string why;
  std::vector<char> cut(bytes.begin(), bytes.end() - 1);
  CHECK_FALSE(decode_entry(cut.data(), cut.size(), &why));
  CHECK((why == "checksum mismatch" || why == "truncated signature"));
  bytes.push_back(0);
  CHECK_FALSE(decode_entry(bytes.data(), bytes.size(), &why));
  CHECK(why == "trailing bytes after payload");
}

TEST_CASE("malformed ASTRAI_JIT_TRUSTED_KEYS values are refused naming the variable") {
  const std::string good = astrai::detail::format_public_key(SigningKey::generate().public_key());
  const std::string other = astrai::detail::format_public_key(SigningKey::generate().public_key());
  const EnvConfig config = astrai::detail::parse_env_config(
      {"ASTRAI_JIT_CACHE_DIR=/tmp/x", "ASTRAI_JIT_TRUSTED_KEYS=" + good + ", " + other});
  REQUIRE(config.trusted_keys);
  CHECK(config.trusted_keys->keys.size() == 2);

  std::string wrong_id = good;
  wrong_id[8] = wrong_id[8] == '0' ? '1' : '0';  // the first hex digit of the key id
  for (const std::string& bad :
       {std::string("rsa:0011223344556677:AAAA"), good.substr(0, good.size() - 4), wrong_id,
        std::string("ed25519:xyz:") + good.substr(25), good + ",relative/path.pub"}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH_AS(
        astrai::detail::parse_env_config({"ASTRAI_JIT_TRUSTED_KEYS=" + bad}),
        doctest::Contains("ASTRAI_JIT_TRUSTED_KEYS="), astrai::ConfigError);
  }
}

TEST_CASE("a trusted keys file is read, and refused when others may write it") {
  TempDir dir;
  const SigningKey key = SigningKey::generate();
  const fs::path file = dir.path() / "trusted.pub";
  write_file(file, "# the release key\n" + astrai::detail::format_public_key(key.public_key()) +
                       "  # comment\n\n");
  ::chmod(file.c_str(), 0644);
  TrustedKeys keys;
  std::string why;
  REQUIRE(astrai::detail::parse_trusted_keys(file.string(), &keys, &why));
  REQUIRE(keys.keys.size() == 1);
  CHECK(keys.keys[0].id == key.id());

  ::chmod(file.c_str(), 0666);
  CHECK_FALSE(astrai::detail::parse_trusted_keys(file.string(), &keys, &why));
  CHECK(why.find("writable by") != std::string::npos);
  CHECK_THROWS_WITH_AS(
      astrai::detail::parse_env_config({"ASTRAI_JIT_TRUSTED_KEYS=" + file.string()}),
      doctest::Contains("ASTRAI_JIT_TRUSTED_KEYS="), astrai::ConfigError);

  const fs::path link = dir.path() / "link.pub";
  ::chmod(file.c_str(), 0644);
  fs::create_symlink(file, link);
  CHECK_FALSE(astrai::detail::parse_trusted_keys(link.string(), &keys, &why));
  CHECK(why.find("symbolic link") != std::string::npos);
}

TEST_CASE("keygen writes an owner-only secret; a secret key others can read is refused") {
  TempDir dir;
  const SigningKey key = SigningKey::generate();
  const fs::path prefix = dir.path() / "release";
  std::string why;
  REQUIRE(astrai::detail::write_key_pair(prefix, key, &why));
  struct stat info {};
  REQUIRE(::stat((prefix.string() + ".secret").c_str(), &info) == 0);
  CHECK((info.st_mode & 0777) == 0600);
  CHECK_FALSE(astrai::detail::write_key_pair(prefix, key, &why));  // never overwrites

  SigningKey loaded;
  REQUIRE(astrai::detail::load_signing_key(prefix.string() + ".secret", &loaded, &why));
  CHECK(loaded.id() == key.id());
  TrustedKeys keys;
  REQUIRE(astrai::detail::parse_trusted_keys(prefix.string() + ".pub", &keys, &why));
  CHECK(keys.keys[0].id == key.id());

  ::chmod((prefix.string() + ".secret").c_str(), 0640);
  CHECK_FALSE(astrai::detail::load_signing_key(prefix.string() + ".secret", &loaded, &why));
  CHECK(why.find("mode 0640") != std::string::npos);
  CHECK_THROWS_WITH_AS(astrai::detail::parse_env_config(
                           {"ASTRAI_JIT_SIGNING_KEY=" + prefix.string() + ".secret"}),
                       doctest::Contains("ASTRAI_JIT_SIGNING_KEY="), astrai::ConfigError);
  // A public key file is not a secret key.
  ::chmod((prefix.string() + ".pub").c_str(), 0600);
  CHECK_FALSE(astrai::detail::load_signing_key(prefix.string() + ".pub", &loaded, &why));
}

TEST_CASE("with trusted keys an unsigned entry is a miss with one warning, then recompiled") {
  TempDir dir;
  const SigningKey publisher = SigningKey::generate();
  const KernelSpec spec = cheap_spec();
  REQUIRE(get_source(config_for(dir.path()), spec) == VariantSource::compiled);  // unsigned

  // warm --dry-run's question: an unsigned entry does not count as cached.
  CHECK(JitEngine(config_for(dir.path())).cached(spec));
  CHECK_FALSE(JitEngine(engine_config(dir.path(), &publisher, nullptr)).cached(spec));
  const std::uint64_t before = refusals();
  {
    LogCapture log(dir.path() / "log.txt");
    CHECK(get_source(engine_config(dir.path(), &publisher, nullptr), spec) ==
          VariantSource::compiled);
    const std::string text = log.finish();
    CHECK(count_occurrences(text, "not using kernel cache entry") == 1);
    CHECK(text.find("unsigned") != std::string::npos);
  }
  CHECK(refusals() >= before + 1);

  // A publisher signs what it compiles; then a process trusting it loads from disk.
  {
    QuietLog quiet;
    CHECK(get_source(engine_config(dir.path(), &publisher, &publisher), spec) ==
          VariantSource::compiled);
  }
  const auto signed_entry = decode_entry(read_file(only_entry(dir.path())).data(),
                                         read_file(only_entry(dir.path())).size());
  REQUIRE(signed_entry);
  REQUIRE(signed_entry->signature);
  CHECK(get_source(engine_config(dir.path(), &publisher, nullptr), spec) == VariantSource::disk);
  CHECK(JitEngine(engine_config(dir.path(), &publisher, nullptr)).cached(spec));
  const SigningKey other = SigningKey::generate();
  CHECK_FALSE(JitEngine(engine_config(dir.path(), &other, nullptr)).cached(spec));
  // Without keys it loads too.
  CHECK(get_source(config_for(dir.path()), spec) == VariantSource::disk);
}

TEST_CASE("an entry signed by another key, or tampered after signing, is never loaded") {
  QuietLog quiet;
  TempDir dir;
  const SigningKey trusted = SigningKey::generate();
  const SigningKey stranger = SigningKey::generate();
  const KernelSpec spec = cheap_spec();
  REQUIRE(get_source(engine_config(dir.path(), nullptr, &stranger), spec) ==
          VariantSource::compiled);
  CHECK(get_source(engine_config(dir.path(), &trusted, nullptr), spec) == VariantSource::compiled);

  // Signed by the trusted key, then the payload changed and the checksum made right again:
  // only the signature can tell.
  REQUIRE(get_source(engine_config(dir.path(), &trusted, &trusted), spec) ==
          VariantSource::compiled);
  const fs::path path = only_entry(dir.path());
  const std::string bytes = read_file(path);
  auto entry = decode_entry(bytes.data(), bytes.size());
  REQUIRE(entry);
  REQUIRE(entry->signature);
  entry->payload[entry->payload.size() / 2] ^= 0x01;
  const std::vector<char> forged = encode_entry(*entry);
  write_file(path, std::string(forged.begin(), forged.end()));
  const std::uint64_t before = refusals();
  CHECK(get_source(engine_config(dir.path(), &trusted, nullptr), spec) == VariantSource::compiled);
  CHECK(refusals() == before + 1);
}

TEST_CASE("read-only layers and imports take only signed entries when keys are set") {
  QuietLog quiet;
  TempDir dir;
  const SigningKey key = SigningKey::generate();
  const KernelSpec spec = cheap_spec();
  const fs::path layer = dir.path() / "layer";
  REQUIRE(get_source(config_for(layer), spec) == VariantSource::compiled);  // unsigned

  EnvConfig config = engine_config(dir.path() / "own", &key, nullptr);
  config.cache_layers = {layer};
  CHECK(get_source(config, spec) == VariantSource::compiled);

  // Export unsigned: an import that requires signatures takes nothing.
  const fs::path plain = dir.path() / "plain.astrai";
  const fs::path signed_archive = dir.path() / "signed.astrai";
  DiskCache source(layer, CacheMode::read_only, 0);
  astrai::detail::export_cache(source, {}, plain);
  const auto report = astrai::detail::export_cache(source, {}, signed_archive, &key);
  CHECK(report.entries == 1);
  DiskCache target(dir.path() / "imported", CacheMode::read_write, 0);
  target.set_trusted_keys(trusting(key));
  CHECK_THROWS_WITH_AS(astrai::detail::import_archive(target, plain),
                       doctest::Contains("unsigned"), astrai::Error);
  CHECK(target.list().empty());
  CHECK(astrai::detail::import_archive(target, signed_archive).entries == 1);
  // The import kept the signature: a process trusting the key loads it.
  CHECK(get_source(engine_config(dir.path() / "imported", &key, nullptr), spec) ==
        VariantSource::disk);
}

TEST_CASE("cache sign signs every sound entry and verify reports each entry's state") {
  QuietLog quiet;
  TempDir dir;
  const SigningKey key = SigningKey::generate();
  DiskCache cache(dir.path(), CacheMode::read_write, 0);
  REQUIRE(cache.store(make_key(1), make_loadable_entry("one.sm_80", 1)));
  REQUIRE(cache.store(make_key(2), make_loadable_entry("two.sm_80", 2)));
  cache.set_trusted_keys(trusting(key));
  for (const auto& info : cache.verify(false)) {
    CHECK(info.valid);
    CHECK(info.signature == "unsigned");
    CHECK(info.signature_refused);
  }
  std::vector<std::string> problems;
  CHECK(cache.sign_entries(key, &problems) == 2);
  CHECK(problems.empty());
  for (const auto& info : cache.verify(false)) {
    CHECK(info.signature == "signed by " + astrai::detail::key_id_hex(key.id()));
    CHECK_FALSE(info.signature_refused);
  }
  CHECK(cache.load(make_key(1), "one.sm_80"));
}

}  // TEST_SUITE

TEST_SUITE("cache metrics") {

TEST_CASE("the counters move with a compile, a memory hit and a disk hit") {
  TempDir dir;
  const KernelSpec spec = cheap_spec();
  const astrai::CacheMetrics start = astrai::cache_metrics();
  {
    JitEngine engine(config_for(dir.path()));
    engine.get(spec);
    engine.get(spec);
  }
  const astrai::CacheMetrics compiled = astrai::cache_metrics();
  CHECK(compiled.compiles == start.compiles + 1);
  CHECK(compiled.compile_time.count == start.compile_time.count + 1);
  CHECK(compiled.compile_time.max_seconds > 0);
  CHECK(compiled.stores == start.stores + 1);
  CHECK(compiled.memory.misses == start.memory.misses + 1);
  CHECK(compiled.memory.hits == start.memory.hits + 1);
  CHECK(compiled.disk.misses == start.disk.misses + 1);
  CHECK(compiled.disk.hits == start.disk.hits);

  {
    JitEngine engine(config_for(dir.path()));
    engine.get(spec);
  }
  const astrai::CacheMetrics loaded = astrai::cache_metrics();
  CHECK(loaded.compiles == compiled.compiles);
  CHECK(loaded.disk.hits == compiled.disk.hits + 1);
  CHECK(loaded.disk.misses == compiled.disk.misses);
  CHECK(loaded.disk.load_time.count == compiled.disk.load_time.count + 1);
  CHECK(loaded.disk.load_time.bucket_counts.back() <= loaded.disk.load_time.count);
  CHECK(loaded.memory.misses == compiled.memory.misses + 1);
}

TEST_CASE("the Prometheus text follows the exposition format") {
  astrai::detail::cache_metrics_registry().compile_time.observe(std::chrono::milliseconds(120));
  const std::string text = astrai::cache_metrics_prometheus();
  REQUIRE_FALSE(text.empty());
  CHECK(text.back() == '\n');
  std::string family;
  std::string type;
  std::size_t samples = 0;
  std::size_t line_start = 0;
  while (line_start < text.size()) {
    const std::size_t end = text.find('\n', line_start);
    const std::string line = text.substr(line_start, end - line_start);
    line_start = end + 1;
    CAPTURE(line);
    if (line.rfind("# HELP ", 0) == 0) {
      family = line.substr(7, line.find(' ', 7) - 7);
      continue;
    }
    if (line.rfind("# TYPE ", 0) == 0) {
      CHECK(line.substr(7, family.size()) == family);
      type = line.substr(8 + family.size());
      CHECK((type == "counter" || type == "histogram"));
      if (type == "counter") CHECK(family.size() > 6);
      if (type == "counter") CHECK(family.substr(family.size() - 6) == "_total");
      continue;
    }
    // A sample: the family's name (histograms add a suffix), optional labels, a value.
    REQUIRE(line.rfind(family, 0) == 0);
    const std::size_t space = line.rfind(' ');
    REQUIRE(space != std::string::npos);
    const std::string name_part = line.substr(0, space);
    const std::string value = line.substr(space + 1);
    std::size_t parsed = 0;
    CHECK_NOTHROW((void)std::stod(value, &parsed));
    CHECK(parsed == value.size());
    const std::string suffix = name_part.substr(family.size());
    if (type == "histogram")
      CHECK((suffix.rfind("_bucket{", 0) == 0 || suffix.rfind("_sum", 0) == 0 ||
             suffix.rfind("_count", 0) == 0));
    else
      CHECK((suffix.empty() || suffix.front() == '{'));
    if (suffix.find('{') != std::string::npos) CHECK(suffix.back() == '}');
    ++samples;
  }
  CHECK(samples > 20);
  CHECK(text.find("astrai_jit_compile_seconds_bucket{le=\"+Inf\"}") != std::string::npos);
  CHECK(text.find("astrai_jit_cache_load_seconds_bucket{tier=\"disk\",le=\"0.001\"}") !=
        std::string::npos);
  CHECK(text.find("astrai_jit_cache_hits_total{tier=\"remote\"} ") != std::string::npos);
}

}  // TEST_SUITE
