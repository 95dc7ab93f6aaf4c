#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "astrai/error.hpp"
#include "base/logging.hpp"
#include "cache/disk_cache.hpp"
#include "runtime/env_config.hpp"
#include "runtime/jit_engine.hpp"
#include "runtime/kernel_spec.hpp"
#include "runtime/nvrtc_compiler.hpp"
#include "tests/support/cache_support.hpp"
#include "tests/support/ptx.hpp"
#include "tests/support/specs.hpp"
#include "tests/support/support.hpp"

namespace fs = std::filesystem;
using astrai::DType;
using astrai::testing::contains;
using astrai::testing::is_elf;
using astrai::detail::CacheMode;
using astrai::detail::CompiledVariant;
using astrai::detail::decode_variant_payload;
using astrai::detail::DiskCache;
using astrai::detail::encode_variant_payload;
using astrai::detail::EnvConfig;
using astrai::detail::JitEngine;
using astrai::detail::KernelKind;
using astrai::detail::KernelSpec;
using astrai::detail::LogLevel;
using astrai::detail::VariantSource;
using astrai::testing::all_files;
using astrai::testing::config_for;
using astrai::testing::QuietLog;
using astrai::testing::read_file;
using astrai::testing::TempDir;
using astrai::testing::write_file;

namespace {

// The cheapest variant to compile, and one attention variant.
KernelSpec rotary_hd64_spec(DType dtype = DType::bf16, const std::string& arch = "sm_80") {
  return astrai::testing::rotary_spec(dtype, 64, arch);
}

KernelSpec paged_hd64_spec(const std::string& arch = "sm_80") {
  return astrai::testing::paged_decode_spec(DType::bf16, 64, 16, 4, arch);
}

// Cache entry files below `dir`/v1 (lock files and temp files excluded).
std::vector<fs::path> entry_files(const fs::path& dir) {
  std::vector<fs::path> entries;
  for (const auto& file : all_files(dir / "v1")) {
    const std::string name = file.filename().string();
    if (file.parent_path().filename() == "locks" || name.rfind(".tmp-", 0) == 0) continue;
    entries.push_back(file);
  }
  return entries;
}

std::size_t line_count(const std::string& text) {
  return static_cast<std::size_t>(std::count(text.begin(), text.end(), '\n'));
}

// Child: one engine on the directory args[0] gets the variant named args[1].
// Exit 10: it compiled; 11: it loaded the cache entry; anything else: a failure.
const bool kGetChildRegistered = astrai::testing::register_child_action(
    "jit-engine-get", [](const std::vector<std::string>& args) -> int {
      if (args.size() != 2) return 2;
      astrai::detail::Logger::instance().set_level(LogLevel::off);
      JitEngine engine(config_for(args[0]));
      VariantSource source = VariantSource::memory;
      const auto variant = engine.get(KernelSpec::parse(args[1]), &source);
      if (!variant || !is_elf(variant->binary)) return 4;
      if (source == VariantSource::compiled && engine.counters().compiles == 1) return 10;
      if (source == VariantSource::disk && engine.counters().compiles == 0) return 11;
      return 5;
    });

}  // namespace

TEST_SUITE("jit_engine") {

TEST_CASE("the first get compiles, the second is a memory hit, a new engine loads from disk") {
  TempDir dir;
  const KernelSpec spec = rotary_hd64_spec();

  JitEngine first(config_for(dir.path()));
  VariantSource source = VariantSource::memory;
  const auto compiled = first.get(spec, &source);
  REQUIRE(compiled);
  CHECK(source == VariantSource::compiled);
  CHECK(first.counters().compiles == 1);
  CHECK(first.counters().disk_hits == 0);
  CHECK(first.counters().memory_hits == 0);
  CHECK(compiled->spec == spec);
  CHECK(compiled->key == first.key_for(spec));
  CHECK(is_elf(compiled->binary));
  REQUIRE(compiled->symbols.size() == spec.instantiations().size());
  CHECK(compiled->symbols[0].rfind("_Z", 0) == 0);
  CHECK(entry_files(dir.path()).size() == 1);
  CHECK(fs::exists(first.cache().entry_path(compiled->key, spec.name())));

  source = VariantSource::compiled;
  const auto again = first.get(spec, &source);
  CHECK(source == VariantSource::memory);
  CHECK(again == compiled);  // the same object
  CHECK(first.counters().compiles == 1);
  CHECK(first.counters().memory_hits == 1);

  JitEngine second(config_for(dir.path()));
  source = VariantSource::memory;
  const auto loaded = second.get(spec, &source);
  REQUIRE(loaded);
  CHECK(source == VariantSource::disk);
  CHECK(second.counters().compiles == 0);
  CHECK(second.counters().disk_hits == 1);
  CHECK(loaded->binary == compiled->binary);
  CHECK(loaded->symbols == compiled->symbols);
  CHECK(loaded->kind == compiled->kind);
  CHECK(loaded->key == compiled->key);
}

TEST_CASE("a paged decode variant carries both kernel symbols through the cache") {
  TempDir dir;
  const KernelSpec spec = paged_hd64_spec();
  JitEngine first(config_for(dir.path()));
  const auto compiled = first.get(spec);
  REQUIRE(compiled->symbols.size() == 2);
  CHECK(contains(compiled->symbols[0], "paged_decode_kernel"));
  CHECK(contains(compiled->symbols[1], "split_combine_kernel"));

  JitEngine second(config_for(dir.path()));
  VariantSource source = VariantSource::compiled;
  const auto loaded = second.get(spec, &source);
  CHECK(source == VariantSource::disk);
  CHECK(loaded->symbols == compiled->symbols);
  CHECK(loaded->binary == compiled->binary);
}

TEST_CASE("the cache key changes with every field that changes the binary") {
  TempDir dir_a;
  TempDir dir_b;
  JitEngine engine(config_for(dir_a.path()));
  JitEngine other(config_for(dir_b.path(), CacheMode::off));
  const KernelSpec base = paged_hd64_spec("sm_89");
  const auto key = engine.key_for(base);
  CHECK(key.hex().size() == 32);
  CHECK(engine.key_for(base) == key);
  CHECK(other.key_for(base) == key);  // nothing machine- or directory-specific

  std::vector<KernelSpec> variants;
  KernelSpec changed = base;
  changed.arch = "sm_86";
  variants.push_back(changed);
  changed = base;
  changed.arch = "sm_90a";
  variants.push_back(changed);
  changed = base;
  changed.dtype = DType::fp16;
  variants.push_back(changed);
  changed = base;
  changed.head_dim = 128;
  variants.push_back(changed);
  changed = base;
  changed.page_size = 1;
  variants.push_back(changed);
  changed = base;
  changed.group_size = 8;
  variants.push_back(changed);
  changed = base;
  changed.force_no_mma = true;
  variants.push_back(changed);
  variants.push_back(rotary_hd64_spec(DType::bf16, "sm_89"));
  variants.push_back(rotary_hd64_spec(DType::fp16, "sm_89"));

  std::vector<std::string> hexes = {key.hex()};
  for (const auto& spec : variants) {
    CAPTURE(spec.name());
    CHECK(engine.key_for(spec) != key);
    hexes.push_back(engine.key_for(spec).hex());
  }
  std::sort(hexes.begin(), hexes.end());
  CHECK(std::unique(hexes.begin(), hexes.end()) == hexes.end());
  CHECK(engine.counters().compiles == 0);
}

TEST_CASE("force_compile recompiles a variant that is already on disk") {
  TempDir dir;
  const KernelSpec spec = rotary_hd64_spec();
  {
    JitEngine warm(config_for(dir.path()));
    warm.get(spec);
    REQUIRE(warm.counters().compiles == 1);
  }
  EnvConfig config = config_for(dir.path());
  config.force_compile = true;
  JitEngine forced(config);
  VariantSource source = VariantSource::memory;
  const auto variant = forced.get(spec, &source);
  CHECK(source == VariantSource::compiled);
  CHECK(forced.counters().compiles == 1);
  CHECK(forced.counters().disk_hits == 0);
  CHECK(is_elf(variant->binary));
  CHECK(entry_files(dir.path()).size() == 1);  // the entry is replaced, not duplicated

  // Within one engine the compiled variant is still reused.
  forced.get(spec, &source);
  CHECK(source == VariantSource::memory);
  CHECK(forced.counters().compiles == 1);
}

TEST_CASE("strict mode on an empty cache throws a CacheMissError with the warm command") {
  TempDir dir;
  EnvConfig config = config_for(dir.path());
  config.strict = true;
  JitEngine strict(config);

  const KernelSpec rotary = rotary_hd64_spec();
  std::string message;
  try {
    strict.get(rotary);
  } catch (const astrai::CacheMissError& error) {
    message = error.what();
  }
  CAPTURE(message);
  CHECK(contains(message, rotary.name()));
  CHECK(contains(message, dir.path().string()));
  CHECK(contains(message, "astrai-jit warm --arch sm_80 --kernels rotary_emb --dtypes bf16 --head-dims 64"));
  CHECK_FALSE(contains(message, "--page-sizes"));
  CHECK_FALSE(contains(message, "--no-mma"));

  const KernelSpec paged = paged_hd64_spec("sm_90a");
  CHECK_THROWS_WITH_AS(strict.get(paged),
                       doctest::Contains("astrai-jit warm --arch sm_90a --kernels paged_decode "
                                         "--dtypes bf16 --head-dims 64 --page-sizes 16 --group-sizes 4"),
                       astrai::CacheMissError);
  CHECK_THROWS_WITH_AS(strict.get(paged), doctest::Contains(paged.name().c_str()),
                       astrai::CacheMissError);

  // The miss is not remembered as a result: every call asks again, and nothing was compiled.
  CHECK_THROWS_AS(strict.get(rotary), astrai::CacheMissError);
  CHECK(strict.counters().compiles == 0);
  CHECK(entry_files(dir.path()).empty());
}

TEST_CASE("the strict-mode hint for a no-MMA variant warms that same variant") {
  TempDir dir;
  EnvConfig config = config_for(dir.path());
  config.strict = true;
  JitEngine strict(config);
  KernelSpec spec = paged_hd64_spec("sm_90a");
  spec.force_no_mma = true;
  CHECK_THROWS_WITH_AS(strict.get(spec),
                       doctest::Contains("astrai-jit warm --arch sm_90a --kernels paged_decode "
                                         "--dtypes bf16 --head-dims 64 --page-sizes 16 "
                                         "--group-sizes 4 --no-mma"),
                       astrai::CacheMissError);
}

TEST_CASE("strict mode loads a warmed variant from disk without compiling") {
  TempDir dir;
  const KernelSpec spec = rotary_hd64_spec(DType::fp16);
  {
    JitEngine warm(config_for(dir.path()));
    warm.get(spec);
    REQUIRE(warm.counters().compiles == 1);
  }
  EnvConfig config = config_for(dir.path());
  config.strict = true;
  JitEngine strict(config);
  VariantSource source = VariantSource::memory;
  const auto variant = strict.get(spec, &source);
  CHECK(source == VariantSource::disk);
  CHECK(strict.counters().compiles == 0);
  CHECK(is_elf(variant->binary));
  // Another variant is still a miss.
  CHECK_THROWS_AS(strict.get(rotary_hd64_spec(DType::bf16)), astrai::CacheMissError);
}

TEST_CASE("record mode appends each requested variant once") {
  TempDir dir;
  const fs::path record = dir.path() / "manifest.txt";
  EnvConfig config = config_for(dir.path() / "cache");
  config.record_file = record;
  JitEngine engine(config);
  const KernelSpec spec = rotary_hd64_spec();
  engine.get(spec);
  engine.get(spec);
  CHECK(read_file(record) == spec.name() + "\n");

  // Variants that are requested but cannot be produced are recorded too (strict mode misses
  // are exactly what a manifest is for); each still only once.
  EnvConfig strict_config = config_for(dir.path() / "empty");
  strict_config.record_file = record;
  strict_config.strict = true;
  JitEngine strict(strict_config);
  const KernelSpec paged = paged_hd64_spec();
  CHECK_THROWS_AS(strict.get(paged), astrai::CacheMissError);
  CHECK_THROWS_AS(strict.get(paged), astrai::CacheMissError);
  const std::string text = read_file(record);
  CHECK(text == spec.name() + "\n" + paged.name() + "\n");
  CHECK(line_count(text) == 2);
  // Each recorded line parses back to the spec (the file is a warm manifest).
  CHECK(KernelSpec::parse(paged.name()) == paged);
}

TEST_CASE("cache mode off neither reads nor writes the cache directory") {
  QuietLog quiet;
  TempDir dir;
  const KernelSpec spec = rotary_hd64_spec();
  JitEngine off(config_for(dir.path(), CacheMode::off));
  VariantSource source = VariantSource::memory;
  const auto variant = off.get(spec, &source);
  CHECK(source == VariantSource::compiled);
  CHECK(is_elf(variant->binary));
  CHECK(fs::is_empty(dir.path()));

  // A warmed cache is ignored as well.
  JitEngine warm(config_for(dir.path()));
  warm.get(spec);
  const auto files_before = all_files(dir.path());
  REQUIRE(files_before.size() >= 1);
  JitEngine off_again(config_for(dir.path(), CacheMode::off));
  off_again.get(spec, &source);
  CHECK(source == VariantSource::compiled);
  CHECK(off_again.counters().disk_hits == 0);
  CHECK(all_files(dir.path()) == files_before);
}

TEST_CASE("read-only mode loads from the cache and never writes to it") {
  QuietLog quiet;
  TempDir dir;
  const KernelSpec spec = rotary_hd64_spec();
  JitEngine empty_ro(config_for(dir.path(), CacheMode::read_only));
  VariantSource source = VariantSource::memory;
  CHECK(is_elf(empty_ro.get(spec, &source)->binary));
  CHECK(source == VariantSource::compiled);
  CHECK(fs::is_empty(dir.path()));

  JitEngine warm(config_for(dir.path()));
  warm.get(spec);
  const auto files_before = all_files(dir.path());
  JitEngine ro(config_for(dir.path(), CacheMode::read_only));
  ro.get(spec, &source);
  CHECK(source == VariantSource::disk);
  CHECK(ro.counters().compiles == 0);
  // A miss compiles in memory only.
  ro.get(rotary_hd64_spec(DType::fp16), &source);
  CHECK(source == VariantSource::compiled);
  CHECK(all_files(dir.path()) == files_before);
}

TEST_CASE("an unusable cache directory degrades to memory-only and get still succeeds") {
  QuietLog quiet;
  TempDir dir;
  const fs::path blocker = dir.path() / "not-a-dir";
  write_file(blocker, "a regular file");
  const fs::path cache_dir = blocker / "cache";
  const KernelSpec spec = rotary_hd64_spec();

  JitEngine engine(config_for(cache_dir));
  CHECK_FALSE(engine.cache().usable_for_write());
  VariantSource source = VariantSource::memory;
  const auto variant = engine.get(spec, &source);
  CHECK(source == VariantSource::compiled);
  CHECK(is_elf(variant->binary));
  engine.get(spec, &source);
  CHECK(source == VariantSource::memory);

  // Nothing persisted: the next engine compiles again.
  JitEngine next(config_for(cache_dir));
  next.get(spec, &source);
  CHECK(source == VariantSource::compiled);
  CHECK(next.counters().compiles == 1);
  CHECK(read_file(blocker) == "a regular file");
  CHECK(all_files(dir.path()) == std::vector<fs::path>{blocker});

  JitEngine read_only(config_for(cache_dir, CacheMode::read_only));
  read_only.get(spec, &source);
  CHECK(source == VariantSource::compiled);
}

TEST_CASE("a damaged cache entry is replaced by a fresh compile") {
  QuietLog quiet;
  TempDir dir;
  const KernelSpec spec = rotary_hd64_spec();
  std::vector<char> original;
  {
    JitEngine warm(config_for(dir.path()));
    original = warm.get(spec)->binary;
  }
  const auto entries = entry_files(dir.path());
  REQUIRE(entries.size() == 1);
  std::string bytes = read_file(entries[0]);
  REQUIRE(bytes.size() > 100);
  bytes[bytes.size() - 7] = static_cast<char>(bytes[bytes.size() - 7] ^ 0x20);  // inside the payload
  write_file(entries[0], bytes);
  {
    DiskCache check(dir.path(), CacheMode::read_only, 0);
    const auto report = check.verify(false);
    REQUIRE(report.size() == 1);
    REQUIRE_FALSE(report[0].valid);
  }

  JitEngine repaired(config_for(dir.path()));
  VariantSource source = VariantSource::memory;
  const auto variant = repaired.get(spec, &source);
  CHECK(source == VariantSource::compiled);
  CHECK(repaired.counters().compiles == 1);
  CHECK(repaired.counters().disk_hits == 0);
  CHECK(variant->binary.size() == original.size());

  DiskCache cache(dir.path(), CacheMode::read_write, 0);
  const auto report = cache.verify(false);
  REQUIRE(report.size() == 1);
  CHECK(report[0].valid);
  CHECK(report[0].variant_name == spec.name());

  JitEngine after(config_for(dir.path()));
  after.get(spec, &source);
  CHECK(source == VariantSource::disk);
}

TEST_CASE("a sound cache entry whose payload is not a variant is recompiled and overwritten") {
  QuietLog quiet;
  const KernelSpec spec = rotary_hd64_spec();
  const std::vector<std::vector<char>> bad_payloads = {
      {'x', 'y', 'z'},                                                  // no symbol table
      encode_variant_payload({"_Z1av", "_Z1bv"}, {'\x7f', 'E', 'L', 'F'}),  // 2 symbols, 1 wanted
  };
  for (const auto& payload : bad_payloads) {
    TempDir dir;
    {
      DiskCache cache(dir.path(), CacheMode::read_write, 0);
      JitEngine keys(config_for(dir.path(), CacheMode::off));
      astrai::detail::CacheEntryData entry;
      entry.variant_name = spec.name();
      entry.nvrtc_version = astrai::detail::nvrtc_version().text();
      entry.payload = payload;
      REQUIRE(cache.store(keys.key_for(spec), entry));
    }
    JitEngine engine(config_for(dir.path()));
    VariantSource source = VariantSource::memory;
    const auto variant = engine.get(spec, &source);
    CHECK(source == VariantSource::compiled);
    CHECK(variant->symbols.size() == 1);
    CHECK(is_elf(variant->binary));

    JitEngine after(config_for(dir.path()));
    const auto loaded = after.get(spec, &source);
    CHECK(source == VariantSource::disk);
    CHECK(loaded->binary == variant->binary);
  }
}

TEST_CASE("dump mode writes the program, its PTX, its cubin and the compile log") {
  TempDir dir;
  EnvConfig config = config_for(dir.path() / "cache");
  config.dump_dir = dir.path() / "dump";
  JitEngine engine(config);
  const KernelSpec spec = rotary_hd64_spec();
  engine.get(spec);
  const fs::path base = dir.path() / "dump" / spec.name();
  const std::string source = read_file(base.string() + ".cu");
  const std::string ptx = read_file(base.string() + ".ptx");
  const std::string log = read_file(base.string() + ".log");
  const std::string cubin = read_file(base.string() + ".cubin");
  CHECK(contains(source, "#include \"rotary_emb.cuh\""));
  CHECK(contains(source, "// ---- astrai_common.cuh ----"));
  CHECK(contains(source, "// ---- kernel_params.h ----"));
  CHECK(contains(ptx, ".target sm_80"));
  CHECK(contains(ptx, ".entry"));
  CHECK(contains(log, "options:"));
  CHECK(contains(log, "--gpu-architecture=sm_80"));
  CHECK(cubin.rfind("\x7f" "ELF", 0) == 0);  // the image as compiled, for cuobjdump -sass
  CHECK(all_files(dir.path() / "dump").size() == 4);
}

TEST_CASE("eight threads asking for one variant share a single compile") {
  TempDir dir;
  JitEngine engine(config_for(dir.path()));
  const KernelSpec spec = rotary_hd64_spec();
  constexpr int kThreads = 8;
  std::vector<std::shared_ptr<const CompiledVariant>> results(kThreads);
  std::vector<VariantSource> sources(kThreads, VariantSource::disk);
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      ready.fetch_add(1);
      while (!go.load()) std::this_thread::yield();
      results[i] = engine.get(spec, &sources[i]);
    });
  }
  while (ready.load() < kThreads) std::this_thread::yield();
  go.store(true);
  for (auto& thread : threads) thread.join();

  CHECK(engine.counters().compiles == 1);
  CHECK(engine.counters().disk_hits == 0);
  CHECK(engine.counters().memory_hits == kThreads - 1);
  CHECK(std::count(sources.begin(), sources.end(), VariantSource::compiled) == 1);
  CHECK(std::count(sources.begin(), sources.end(), VariantSource::memory) == kThreads - 1);
  for (const auto& result : results) {
    REQUIRE(result);
    CHECK(result == results[0]);
  }
  CHECK(entry_files(dir.path()).size() == 1);
}

TEST_CASE("processes racing for one variant compile it once") {
  TempDir dir;
  const std::string name = paged_hd64_spec().name();
  constexpr int kChildren = 4;
  std::vector<int> pids;
  for (int i = 0; i < kChildren; ++i)
    pids.push_back(astrai::testing::spawn_child("jit-engine-get", {dir.path().string(), name}));
  std::vector<int> codes;
  for (int pid : pids) codes.push_back(astrai::testing::wait_child(pid));
  CAPTURE(codes);
  CHECK(std::count(codes.begin(), codes.end(), 10) == 1);
  CHECK(std::count(codes.begin(), codes.end(), 11) == kChildren - 1);
  CHECK(entry_files(dir.path()).size() == 1);
}

TEST_CASE("an invalid spec is rejected before any compile, every time") {
  TempDir dir;
  JitEngine engine(config_for(dir.path()));
  KernelSpec spec = paged_hd64_spec();
  spec.head_dim = 72;
  CHECK_THROWS_WITH_AS(engine.get(spec), doctest::Contains("head_dim 72"), astrai::InvalidArgument);
  CHECK_THROWS_AS(engine.get(spec), astrai::InvalidArgument);
  CHECK(engine.counters().compiles == 0);
  CHECK(entry_files(dir.path()).empty());
}

TEST_CASE("the device target is arch-specific from Hopper on and follows the override") {
  QuietLog quiet;
  TempDir dir;
  JitEngine engine(config_for(dir.path()));
  CHECK(engine.target_for_device(7, 5) == "sm_75");
  CHECK(engine.target_for_device(8, 0) == "sm_80");
  CHECK(engine.target_for_device(8, 6) == "sm_86");
  CHECK(engine.target_for_device(8, 9) == "sm_89");
  CHECK(engine.target_for_device(9, 0) == "sm_90a");
  const auto supported = astrai::detail::nvrtc_supported_archs();
  REQUIRE_FALSE(supported.empty());
  // A GPU newer than NVRTC knows gets PTX for the newest arch it does know.
  CHECK(engine.target_for_device(99, 0) == "compute_" + std::to_string(supported.back()));

  EnvConfig config = config_for(dir.path());
  config.arch_override = "sm_86";
  JitEngine overridden(config);
  CHECK(overridden.target_for_device(9, 0) == "sm_86");

  // A virtual arch override compiles PTX the driver finishes for any newer device.
  config.arch_override = "compute_80";
  JitEngine virtual_target(config);
  CHECK(virtual_target.target_for_device(9, 0) == "compute_80");
}

TEST_CASE("variant payloads round-trip through encode and decode") {
  const std::vector<std::pair<std::vector<std::string>, std::vector<char>>> cases = {
      {{}, {'\x01'}},
      {{"_Z3foov"}, {'\x7f', 'E', 'L', 'F', '\0', '\x02'}},
      {{"_Z1av", "", std::string(4096, 's')}, std::vector<char>(1000, '\x55')},
      {std::vector<std::string>(64, "x"), {'\0'}},
  };
  for (const auto& [symbols, binary] : cases) {
    const std::vector<char> payload = encode_variant_payload(symbols, binary);
    std::vector<std::string> decoded_symbols = {"stale"};
    std::vector<char> decoded_binary = {'s'};
    REQUIRE(decode_variant_payload(payload, &decoded_symbols, &decoded_binary));
    CHECK(decoded_symbols == symbols);
    CHECK(decoded_binary == binary);
  }
  // The layout: u32 count, then u32 length + bytes per symbol, then the binary.
  const std::vector<char> small = encode_variant_payload({"ab"}, {'z'});
  CHECK(std::string(small.begin(), small.end()) == std::string("\x01\x00\x00\x00\x02\x00\x00\x00" "abz", 11));
}

TEST_CASE("decode rejects a payload truncated anywhere before the binary") {
  const std::vector<std::string> symbols = {"_Z14paged_decodev", "_Z7combinev"};
  const std::vector<char> binary = {'\x7f', 'E', 'L', 'F', '1', '2', '3'};
  const std::vector<char> payload = encode_variant_payload(symbols, binary);
  const std::size_t table_end = payload.size() - binary.size();
  REQUIRE(table_end == 4 + 4 + symbols[0].size() + 4 + symbols[1].size());
  for (std::size_t size = 0; size < payload.size(); ++size) {
    CAPTURE(size);
    const std::vector<char> prefix(payload.begin(), payload.begin() + static_cast<std::ptrdiff_t>(size));
    std::vector<std::string> out_symbols;
    std::vector<char> out_binary;
    const bool ok = decode_variant_payload(prefix, &out_symbols, &out_binary);
    if (size <= table_end) {
      // Inside the symbol table, or no binary left: always rejected.
      CHECK_FALSE(ok);
    } else {
      // The binary has no length field of its own (the cache entry's checksum guards it), so
      // a cut inside it still yields the intact symbols and a shorter binary.
      REQUIRE(ok);
      CHECK(out_symbols == symbols);
      const auto kept = static_cast<std::ptrdiff_t>(size - table_end);
      CHECK(out_binary == std::vector<char>(binary.begin(), binary.begin() + kept));
    }
  }
}

TEST_CASE("decode rejects payloads with impossible counts and lengths") {
  std::vector<std::string> symbols;
  std::vector<char> binary;
  // No binary at all.
  CHECK_FALSE(decode_variant_payload(encode_variant_payload({"_Z1av"}, {}), &symbols, &binary));
  // More than 64 symbols.
  CHECK_FALSE(decode_variant_payload(encode_variant_payload(std::vector<std::string>(65, "s"), {'b'}),
                                     &symbols, &binary));
  // A symbol longer than 4096 bytes.
  CHECK_FALSE(decode_variant_payload(encode_variant_payload({std::string(4097, 's')}, {'b'}),
                                     &symbols, &binary));
  // A count of 3 with only one symbol present.
  std::vector<char> short_table = encode_variant_payload({"_Z1av"}, {'b'});
  short_table[0] = 3;
  CHECK_FALSE(decode_variant_payload(short_table, &symbols, &binary));
  // A length running past the end.
  std::vector<char> long_length = encode_variant_payload({"_Z1av"}, {'b', 'c'});
  long_length[4] = 100;
  CHECK_FALSE(decode_variant_payload(long_length, &symbols, &binary));
  // Huge fields must not be trusted.
  std::vector<char> huge(16, '\xff');
  CHECK_FALSE(decode_variant_payload(huge, &symbols, &binary));
}

TEST_CASE("decode survives arbitrary bytes") {
  std::mt19937 rng(2024);
  const std::vector<char> good = encode_variant_payload({"_Z1av", "_Z1bv"}, std::vector<char>(32, 'b'));
  int accepted = 0;
  for (int round = 0; round < 5000; ++round) {
    std::vector<char> bytes;
    if (round % 2 == 0) {
      bytes.resize(rng() % 64);
      for (auto& b : bytes) b = static_cast<char>(rng() % 4 == 0 ? rng() : rng() % 8);
    } else {
      bytes = good;
      bytes[rng() % bytes.size()] = static_cast<char>(rng());
      bytes.resize(rng() % (bytes.size() + 1));
    }
    std::vector<std::string> symbols;
    std::vector<char> binary;
    if (decode_variant_payload(bytes, &symbols, &binary)) {
      ++accepted;
      CHECK_FALSE(binary.empty());
      CHECK(symbols.size() <= 64);
    }
  }
  CHECK(accepted > 0);
}

}  // TEST_SUITE
