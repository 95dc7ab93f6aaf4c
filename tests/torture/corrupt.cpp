// corrupt: entries damaged in many ways are never served; they are removed or replaced and
// recompiled exactly once.
#include "tests/torture/torture.hpp"

namespace astrai::torture {

// =============================================================================================
// corrupt

enum class Damage {
  truncate,
  zero_length,
  bit_flip,
  byte_overwrite,
  bad_magic,
  bad_version,
  kind_swap,
  header_field,
  other_variant,
  append_garbage,
  count
};
constexpr int kDamageKinds = static_cast<int>(Damage::count);

const char* damage_name(Damage damage) {
  switch (damage) {
    case Damage::truncate: return "truncated";
    case Damage::zero_length: return "zero length";
    case Damage::bit_flip: return "bit flip";
    case Damage::byte_overwrite: return "byte overwritten";
    case Damage::bad_magic: return "wrong magic";
    case Damage::bad_version: return "wrong format version";
    case Damage::kind_swap: return "binary kind swapped";
    case Damage::header_field: return "other header byte";
    case Damage::other_variant: return "another variant's entry";
    case Damage::append_garbage: return "garbage appended";
    case Damage::count: break;
  }
  return "?";
}

// Header layout (cache/cache_entry.hpp): magic 0..7, version 8..11, kind 12, reserved 13..15,
// payload size 16..23, checksum 24..31, name length 32..35, nvrtc version length 36..39.
std::vector<char> damaged_copy(Damage damage, const std::vector<char>& good,
                               const std::vector<char>& other, std::mt19937_64& rng) {
  std::vector<char> bytes = good;
  auto pick = [&](std::size_t lo, std::size_t hi) {  // in [lo, hi)
    return lo + static_cast<std::size_t>(rng() % (hi - lo));
  };
  auto overwrite = [&](std::size_t at) {
    bytes[at] = static_cast<char>(static_cast<unsigned char>(bytes[at]) ^
                                  static_cast<unsigned char>(1 + rng() % 255));
  };
  switch (damage) {
    case Damage::truncate: bytes.resize(pick(1, good.size())); break;
    case Damage::zero_length: bytes.clear(); break;
    case Damage::bit_flip: {
      const std::size_t at = pick(0, bytes.size());
      bytes[at] = static_cast<char>(bytes[at] ^ (1 << (rng() % 8)));
      break;
    }
    case Damage::byte_overwrite: overwrite(pick(0, bytes.size())); break;
    case Damage::bad_magic: overwrite(pick(0, 8)); break;
    case Damage::bad_version: {
      const std::uint32_t current = astrai::detail::kEntryFormatVersion;
      const std::uint32_t choices[] = {0, current - 1, current + 1, 0xffffffffu,
                                       static_cast<std::uint32_t>(rng())};
      std::uint32_t version = choices[rng() % 5];
      if (version == current) version ^= 0x100;
      for (int i = 0; i < 4; ++i) bytes[8 + i] = static_cast<char>((version >> (8 * i)) & 0xff);
      break;
    }
    case Damage::kind_swap:
      bytes[12] = static_cast<char>(static_cast<std::uint8_t>(bytes[12]) ==
                                            static_cast<std::uint8_t>(BinaryKind::cubin)
                                        ? BinaryKind::ptx
                                        : BinaryKind::cubin);
      break;
    case Damage::header_field: overwrite(pick(13, 40)); break;
    case Damage::other_variant: bytes = other; break;
    case Damage::append_garbage: {
      const std::size_t extra = pick(1, 65);
      for (std::size_t i = 0; i < extra; ++i) bytes.push_back(static_cast<char>(rng()));
      break;
    }
    case Damage::count: break;
  }
  return bytes;
}

int run_corrupt(CorruptOptions options) {
  Verdict verdict("corrupt");
  Logger::instance().set_level(LogLevel::off);
  if (options.seed == 0) options.seed = fresh_seed();
  WorkDir work(options.dir, "corrupt", options.keep);
  const fs::path root = work.path() / "cache";
  std::mt19937_64 rng(options.seed);
  const auto start = now_ns();

  // bf16 head dims 8, 16, 24, ...: the even indices of the pool, all equally cheap.
  std::vector<KernelSpec> specs;
  for (const auto& spec : rotary_pool(2 * options.variants))
    if (spec.dtype == DType::bf16) specs.push_back(spec);
  ReferenceBook book(specs);

  std::vector<fs::path> paths;
  std::vector<std::vector<char>> pristine;
  std::vector<Fingerprint> pristine_print;
  {
    JitEngine warm(engine_config(root));
    for (const auto& spec : specs) {
      warm.get(spec);
      paths.push_back(warm.cache().entry_path(warm.key_for(spec), spec.name()));
      pristine.push_back(read_bytes(paths.back()));
      const auto print = entry_file_fingerprint(paths.back());
      if (!print) throw std::runtime_error("warming did not publish " + spec.name());
      pristine_print.push_back(*print);
    }
  }
  fmt::print("corrupt: {} damaged entries over {} variants; 1 round in {} of the {} damage kinds "
             "recompiles, the other trials run strict (the damage must become a cache miss); "
             "seed {}\n",
             options.trials, specs.size(), options.compile_every, kDamageKinds, options.seed);

  struct Tally {
    std::uint64_t trials = 0, detected = 0, removed_on_load = 0, recompiled = 0;
  };
  Tally tally[kDamageKinds];
  std::uint64_t strict_trials = 0, compile_trials = 0;

  for (int trial = 0; trial < options.trials; ++trial) {
    const auto damage = static_cast<Damage>(trial % kDamageKinds);
    Tally& counts = tally[static_cast<int>(damage)];
    ++counts.trials;
    const std::size_t victim = static_cast<std::size_t>(rng() % specs.size());
    const std::size_t other =
        (victim + 1 + static_cast<std::size_t>(rng() % (specs.size() - 1))) % specs.size();
    const auto bytes = damaged_copy(damage, pristine[victim], pristine[other], rng);
    if (bytes == pristine[victim]) {
      verdict.fail("trial {}: {} left the entry unchanged (harness bug)", trial,
                   damage_name(damage));
      continue;
    }
    if (!write_bytes(paths[victim], bytes))
      throw std::runtime_error("cannot write " + paths[victim].string());
    const KernelSpec& spec = specs[victim];
    const bool compile = (trial / kDamageKinds) % options.compile_every == 0;

    if (!compile) {
      // Strict: the damaged entry must turn into a miss (CacheMissError), never a hit.
      ++strict_trials;
      JitEngine engine(engine_config(root, false, true));
      try {
        const auto variant = engine.get(spec);
        verdict.fail("trial {}: the {} entry of {} was served from disk ({})", trial,
                     damage_name(damage), spec.name(),
                     book.check(spec.name(), fingerprint(*variant)) == ReferenceBook::Match::equal
                         ? "a correct binary"
                         : "a WRONG binary");
      } catch (const astrai::CacheMissError&) {
        ++counts.detected;
      } catch (const std::exception& error) {
        verdict.fail("trial {}: the {} entry made get() throw: {}", trial, damage_name(damage),
                     error.what());
      }
      if (engine.counters().disk_hits != 0 || engine.counters().compiles != 0)
        verdict.fail("trial {}: a strict get counted {} disk hits and {} compiles", trial,
                     engine.counters().disk_hits.load(), engine.counters().compiles.load());
      std::error_code ec;
      if (!fs::exists(paths[victim], ec)) ++counts.removed_on_load;
    } else {
      // The whole path: the damage is detected, the variant recompiled and republished.
      ++compile_trials;
      try {
        JitEngine engine(engine_config(root));
        VariantSource source = VariantSource::memory;
        const auto variant = engine.get(spec, &source);
        if (source != VariantSource::compiled || engine.counters().compiles != 1 ||
            engine.counters().disk_hits != 0)
          verdict.fail("trial {}: the {} entry of {}: expected one compile and no disk hit, got "
                       "{} compiles and {} disk hits",
                       trial, damage_name(damage), spec.name(), engine.counters().compiles.load(),
                       engine.counters().disk_hits.load());
        else
          ++counts.detected;
        if (book.check(spec.name(), fingerprint(*variant)) == ReferenceBook::Match::different)
          verdict.fail("trial {}: the {} entry of {} led to a wrong binary", trial,
                       damage_name(damage), spec.name());
        const auto republished = entry_file_fingerprint(paths[victim]);
        if (!republished || republished->normalized != pristine_print[victim].normalized ||
            republished->signature != pristine_print[victim].signature)
          verdict.fail("trial {}: after the {} entry, {} was not republished correctly", trial,
                       damage_name(damage), spec.name());
        else
          ++counts.recompiled;
        JitEngine again(engine_config(root));
        VariantSource again_source = VariantSource::memory;
        const auto reloaded = again.get(spec, &again_source);
        if (again_source != VariantSource::disk ||
            book.check(spec.name(), fingerprint(*reloaded)) != ReferenceBook::Match::equal)
          verdict.fail("trial {}: the republished entry of {} is not served from disk", trial,
                       spec.name());
      } catch (const std::exception& error) {
        verdict.fail("trial {}: the {} entry made get() throw: {}", trial, damage_name(damage),
                     error.what());
      }
    }
    // Put the original back, so every trial damages a sound entry.
    if (!write_bytes(paths[victim], pristine[victim]))
      throw std::runtime_error("cannot restore " + paths[victim].string());
  }

  DiskCache cache(root, CacheMode::read_write, 0);
  for (const auto& info : cache.verify(false))
    if (!info.valid) verdict.fail("entry {} does not verify at the end", info.path.string());

  fmt::print("  trials: {} ({} strict, {} recompiling) in {:.1f} s\n", options.trials,
             strict_trials, compile_trials, ms(now_ns() - start) / 1000);
  fmt::print("  {:<24} {:>7} {:>9} {:>16} {:>11}\n", "damage", "trials", "detected",
             "removed on load", "recompiled");
  for (int d = 0; d < kDamageKinds; ++d) {
    const Tally& counts = tally[d];
    fmt::print("  {:<24} {:>7} {:>9} {:>16} {:>11}\n", damage_name(static_cast<Damage>(d)),
               counts.trials, counts.detected, counts.removed_on_load, counts.recompiled);
  }
  fmt::print("  (detected: a strict get missed, or a full get compiled once with no disk hit; "
             "removed on load: strict trials whose entry the load deleted; recompiled: the "
             "entry was republished)\n");
  return verdict.finish();
}


}  // namespace astrai::torture
