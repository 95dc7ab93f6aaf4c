// trust: another local user's attacks on the cache (a rewritten entry in a world-writable
// cache, foreign and group-writable entries, symbolic links at every path, a held lock), plus a
// group-shared cache, read-only layers and export/import. Nothing foreign is loaded, nothing
// outside the cache changes, every binary is correct. The scenarios that need another uid run
// only as root.
#include <sys/file.h>

#include "cache/cache_archive.hpp"
#include "tests/torture/torture.hpp"

namespace astrai::torture {

// =============================================================================================
// trust

constexpr uid_t kAttacker = 1234;
constexpr gid_t kTeamGroup = 1500;

namespace {

bool become(long uid, long gid) {
  if (uid < 0) return true;
  const auto g = static_cast<gid_t>(gid);
  const auto u = static_cast<uid_t>(uid);
  return ::setgroups(0, nullptr) == 0 && ::setresgid(g, g, g) == 0 && ::setresuid(u, u, u) == 0;
}

}  // namespace

// Child: another local user. "rewrite" replaces the entry at --path with a different binary
// under a valid checksum; "hold-lock" holds the flock of --path until killed (opened as root,
// then becoming the attacker), "hold-lock-as" likewise but opened as the attacker; "shared-get"
// gets --variant from the group-shared cache at --path and prints "G <source> <normalized>
// <signature>".
int trust_attacker(const TrustAttackerOptions& options) {
  Logger::instance().set_level(LogLevel::off);
  if (options.action == "hold-lock") {
    // Opened before giving up root: the point is a lock held by someone else.
    const int fd = ::open(options.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0 || ::flock(fd, LOCK_EX) != 0) return 3;
    if (!become(options.uid, options.gid)) return 4;
    std::printf("L\n");
    std::fflush(stdout);
    for (;;) ::pause();
  }
  if (!become(options.uid, options.gid)) {
    std::printf("X cannot change uid: %s\n", std::strerror(errno));
    return 4;
  }
  if (options.action == "hold-lock-as") {
    // Opened as the attacker: only a lock file its mode lets others read can be held.
    const int fd = ::open(options.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0 || ::flock(fd, LOCK_EX) != 0) return 3;
    std::printf("L\n");
    std::fflush(stdout);
    for (;;) ::pause();
  }
  if (options.action == "rewrite") {
    auto bytes = read_bytes(options.path);
    auto entry = decode_entry(bytes.data(), bytes.size());
    if (!entry) return 5;
    entry->payload[entry->payload.size() / 2] ^= 0x5a;  // XXH3 has no key: re-checksum it
    return write_bytes(options.path, encode_entry(*entry)) ? 0 : 6;
  }
  if (options.action == "shared-get") {
    EnvConfig config = engine_config(options.path);
    config.cache_sharing.kind = astrai::detail::CacheSharing::Kind::directory_group;
    config.cache_sharing.name = "group";
    JitEngine engine(config);
    VariantSource source = VariantSource::memory;
    const Fingerprint print = fingerprint(*engine.get(KernelSpec::parse(options.variant), &source));
    std::printf("G %s %llu %d\n", source == VariantSource::disk ? "disk" : "compiled",
                static_cast<unsigned long long>(print.normalized), print.signature);
    return 0;
  }
  return 2;
}

int run_trust(TrustOptions options) {
  Verdict verdict("trust");
  Logger::instance().set_level(LogLevel::off);
  WorkDir work(options.dir, "trust", options.keep);
  fs::permissions(work.path(), fs::perms(0755));
  const bool as_root = ::geteuid() == 0;
  const auto specs = rotary_pool(4);
  ReferenceBook book(specs);
  fmt::print("trust: {} rounds per scenario{}\n", options.rounds,
             as_root ? "" : "; not root, so the scenarios that need another uid are skipped");
  fmt::print("  {:<16} {:<58} {:>5} {:>8}  {}\n", "scenario", "attack", "gets", "compiled",
             "verdict");

  struct Tally {
    std::uint64_t gets = 0, compiled = 0;
  };
  // A victim's get with a fresh engine: must succeed and return the correct binary.
  auto victim_get = [&](const std::string& scenario, const EnvConfig& config,
                        const KernelSpec& spec, Tally* tally) -> VariantSource {
    VariantSource source = VariantSource::memory;
    try {
      JitEngine engine(config);
      const auto variant = engine.get(spec, &source);
      ++tally->gets;
      tally->compiled += source == VariantSource::compiled;
      if (book.check(spec.name(), fingerprint(*variant)) == ReferenceBook::Match::different)
        verdict.fail("{}: {} returned a WRONG binary ({})", scenario, spec.name(),
                     source == VariantSource::disk ? "from disk" : "compiled");
    } catch (const std::exception& error) {
      verdict.fail("{}: get of {} threw: {}", scenario, spec.name(), error.what());
    }
    return source;
  };
  auto report = [&](const std::string& name, const std::string& attack, const Tally& tally,
                    std::uint64_t before) {
    fmt::print("  {:<16} {:<58} {:>5} {:>8}  {}\n", name, attack, tally.gets, tally.compiled,
               verdict.count() == before ? "ok" : "FAILED");
  };
  auto skip = [&](const std::string& name, const std::string& attack) {
    fmt::print("  {:<16} {:<58} {:>5} {:>8}  {}\n", name, attack, "-", "-", "skipped (not root)");
  };
  // Every maintenance operation on the cache at `root`.
  auto maintain = [](const fs::path& root) {
    DiskCache cache(root, CacheMode::read_write, 0);
    cache.verify(true);
    cache.prune(0);
    cache.clear();
  };

  // 1. Another user rewrites an entry of a world-writable cache with a valid checksum.
  if (as_root) {
    const std::uint64_t before = verdict.count();
    Tally tally;
    for (int round = 0; round < options.rounds; ++round) {
      const fs::path root = work.path() / fmt::format("open-{}", round);
      const KernelSpec& spec = specs[static_cast<std::size_t>(round) % specs.size()];
      fs::path entry;
      {
        JitEngine warm(engine_config(root));
        warm.get(spec);
        entry = warm.cache().entry_path(warm.key_for(spec), spec.name());
      }
      for (fs::recursive_directory_iterator it(root), end; it != end; ++it)
        fs::permissions(it->path(), it->is_directory() ? fs::perms::all : fs::perms(0666));
      fs::permissions(root, fs::perms::all);
      const Captured attacker = run_captured({"__trust-attacker", "--action", "rewrite", "--path",
                                              entry.string(), "--uid", std::to_string(kAttacker),
                                              "--gid", std::to_string(kAttacker)});
      if (!exited_ok(attacker.status))
        verdict.fail("rewritten-entry: the attacker failed ({})", describe_status(attacker.status));
      if (victim_get("rewritten-entry", engine_config(root), spec, &tally) != VariantSource::compiled)
        verdict.fail("rewritten-entry: the world-writable cache was used");
      const auto after = read_bytes(entry);
      if (after.empty()) verdict.fail("rewritten-entry: the attacker's file was removed");
    }
    report("rewritten-entry", "world-writable cache, entry rewritten by uid 1234", tally, before);
  } else {
    skip("rewritten-entry", "world-writable cache, entry rewritten by uid 1234");
  }

  // 2. Entries owned by another user or writable by the group sit in our own cache.
  {
    const std::uint64_t before = verdict.count();
    Tally tally;
    for (int round = 0; round < options.rounds; ++round) {
      const fs::path root = work.path() / fmt::format("foreign-{}", round);
      const KernelSpec& spec = specs[static_cast<std::size_t>(round) % specs.size()];
      fs::path entry;
      {
        JitEngine warm(engine_config(root));
        warm.get(spec);
        entry = warm.cache().entry_path(warm.key_for(spec), spec.name());
      }
      auto bytes = read_bytes(entry);
      auto decoded = decode_entry(bytes.data(), bytes.size());
      decoded->payload[decoded->payload.size() / 2] ^= 0x5a;
      write_bytes(entry, encode_entry(*decoded));
      const bool chown_it = as_root && round % 2 == 0;
      if (chown_it) {
        if (::chown(entry.c_str(), kAttacker, kAttacker) != 0)
          verdict.fail("foreign-entry: chown failed: {}", std::strerror(errno));
      } else {
        fs::permissions(entry, fs::perms(0660));
      }
      const auto planted = read_bytes(entry);
      if (victim_get("foreign-entry", engine_config(root), spec, &tally) != VariantSource::compiled)
        verdict.fail("foreign-entry: the planted entry was not refused");
      maintain(root);
      if (read_bytes(entry) != planted)
        verdict.fail("foreign-entry: the planted entry was changed or removed");
    }
    report("foreign-entry", "entry chowned to uid 1234 or made group-writable", tally, before);
  }

  // 3. Symbolic links planted at every path the runtime opens point at a decoy tree.
  {
    const std::uint64_t before = verdict.count();
    Tally tally;
    const fs::path decoy = work.path() / "decoy";
    {
      JitEngine decoy_engine(engine_config(decoy));
      for (const auto& spec : specs) decoy_engine.get(spec);
    }
    std::ofstream(decoy / "precious.txt") << "do not touch\n";
    const auto decoy_before = tree_snapshot(decoy);
    const std::vector<std::string> places = {"root", "v1", "shard", "entry", "locks", "lock",
                                             "dump", "record", "root/.", "record-dir"};
    for (int round = 0; round < options.rounds; ++round) {
      for (const auto& place : places) {
        const fs::path root = work.path() / fmt::format("links-{}-{}", place, round);
        const KernelSpec& spec = specs[static_cast<std::size_t>(round) % specs.size()];
        JitEngine probe(engine_config(root));
        const std::string hex = probe.key_for(spec).hex();
        const fs::path entry = probe.cache().entry_path(probe.key_for(spec), spec.name());
        const fs::path decoy_entry =
            DiskCache(decoy, CacheMode::read_only, 0).entry_path(probe.key_for(spec), spec.name());
        EnvConfig config = engine_config(root);
        fs::path maintained = root;
        std::error_code ec;
        if (place == "root/.") {  // a trailing /. must not get the root's link followed
          fs::remove_all(root, ec);
          fs::create_directory_symlink(decoy, root);
          config.cache_dir = root.string() + "/.";
          maintained = config.cache_dir;
        } else if (place == "record-dir") {  // a link to the record file's directory
          fs::create_directories(root);
          fs::create_directory_symlink(decoy, root / "records");
          config.record_file = root / "records" / "precious.txt";
        } else if (place == "root") {
          fs::remove_all(root, ec);
          fs::create_directory_symlink(decoy, root);
        } else if (place == "v1") {
          fs::remove_all(root / "v1", ec);
          fs::create_directory_symlink(decoy / "v1", root / "v1");
        } else if (place == "shard") {
          fs::create_directories(root / "v1");
          fs::create_directory_symlink(decoy_entry.parent_path(), entry.parent_path());
        } else if (place == "entry") {
          fs::create_directories(entry.parent_path());
          fs::create_symlink(decoy_entry, entry);
        } else if (place == "locks") {
          fs::create_directories(root / "v1");
          fs::create_directory_symlink(decoy / "v1", root / "v1" / "locks");
        } else if (place == "lock") {
          fs::create_directories(root / "v1" / "locks");
          fs::create_symlink(decoy / "lock-created", root / "v1" / "locks" / (hex + ".lock"));
        } else if (place == "dump") {
          fs::create_directories(root);
          fs::create_directory_symlink(decoy, root / "dump");
          config.dump_dir = root / "dump";
        } else if (place == "record") {
          fs::create_directories(root);
          fs::create_symlink(decoy / "precious.txt", root / "record.txt");
          config.record_file = root / "record.txt";
        }
        config.force_compile = place == "dump";  // the dump is written by a compile
        const VariantSource source = victim_get("planted-link", config, spec, &tally);
        if (source == VariantSource::disk && (place == "root" || place == "v1" ||
                                              place == "shard" || place == "entry" ||
                                              place == "root/."))
          verdict.fail("planted-link: the {} link was followed to a disk hit", place);
        maintain(maintained);
        if (tree_snapshot(decoy) != decoy_before)
          verdict.fail("planted-link: a link at the {} led to a change outside the cache", place);
      }
    }
    report("planted-link", "links at every path (10 places, root/. and record dir too)", tally,
           before);
  }

  // 4. Another user holds a compile lock: we must not wait for it.
  if (as_root) {
    const std::uint64_t before = verdict.count();
    Tally tally;
    const fs::path root = work.path() / "lock-stall";
    const KernelSpec& spec = specs[0];
    JitEngine probe(engine_config(root));
    const fs::path lock = root / "v1" / "locks" / (probe.key_for(spec).hex() + ".lock");
    { probe.cache().lock_key(probe.key_for(spec), std::chrono::milliseconds(10)); }
    if (::chown(lock.c_str(), kAttacker, kAttacker) != 0)
      verdict.fail("lock-stall: chown failed: {}", std::strerror(errno));
    int out_pipe[2];
    if (::pipe2(out_pipe, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
    ChildIo io;
    io.stdout_fd = out_pipe[1];
    const pid_t holder = spawn_self({"__trust-attacker", "--action", "hold-lock", "--path",
                                     lock.string(), "--uid", std::to_string(kAttacker), "--gid",
                                     std::to_string(kAttacker)},
                                    io);
    ::close(out_pipe[1]);
    char ready = 0;
    if (::read(out_pipe[0], &ready, 1) != 1 || ready != 'L')
      verdict.fail("lock-stall: the attacker did not take the lock");
    ::close(out_pipe[0]);
    for (int round = 0; round < options.rounds; ++round) {
      const auto start = std::chrono::steady_clock::now();
      EnvConfig config = engine_config(root);
      config.force_compile = true;  // every get goes through the lock
      victim_get("lock-stall", config, spec, &tally);
      if (std::chrono::steady_clock::now() - start > std::chrono::seconds(5))
        verdict.fail("lock-stall: a get waited for the foreign lock");
    }
    ::kill(holder, SIGKILL);
    wait_raw(holder);
    report("lock-stall", "uid 1234 holds a compile lock file it owns", tally, before);
  } else {
    skip("lock-stall", "uid 1234 holds a compile lock file it owns");
  }

  // 4b. A lock file of ours that others may read (an older cache, or one offered as a layer):
  // another user opens it and holds it. It must be replaced, never waited for.
  if (as_root) {
    const std::uint64_t before = verdict.count();
    Tally tally;
    const KernelSpec& spec = specs[0];
    for (int round = 0; round < options.rounds; ++round) {
      const fs::path root = work.path() / fmt::format("exposed-lock-{}", round);
      JitEngine probe(engine_config(root));
      const fs::path lock = root / "v1" / "locks" / (probe.key_for(spec).hex() + ".lock");
      { probe.cache().lock_key(probe.key_for(spec), std::chrono::milliseconds(10)); }
      for (const fs::path& dir : {root, root / "v1", root / "v1" / "locks"})
        fs::permissions(dir, fs::perms(0755));
      fs::permissions(lock, fs::perms(0644));
      int out_pipe[2];
      if (::pipe2(out_pipe, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
      ChildIo io;
      io.stdout_fd = out_pipe[1];
      const pid_t holder = spawn_self({"__trust-attacker", "--action", "hold-lock-as", "--path",
                                       lock.string(), "--uid", std::to_string(kAttacker), "--gid",
                                       std::to_string(kAttacker)},
                                      io);
      ::close(out_pipe[1]);
      char ready = 0;
      if (::read(out_pipe[0], &ready, 1) != 1 || ready != 'L')
        verdict.fail("exposed-lock: the attacker could not take the lock");
      ::close(out_pipe[0]);
      const auto start = std::chrono::steady_clock::now();
      EnvConfig config = engine_config(root);
      config.force_compile = true;
      victim_get("exposed-lock", config, spec, &tally);
      if (std::chrono::steady_clock::now() - start > std::chrono::seconds(5))
        verdict.fail("exposed-lock: a get waited for the lock another user holds");
      struct stat info {};
      if (::stat(lock.c_str(), &info) != 0 || (info.st_mode & 07777) != 0600)
        verdict.fail("exposed-lock: the lock file was not replaced by a private one");
      ::kill(holder, SIGKILL);
      wait_raw(holder);
    }
    report("exposed-lock", "uid 1234 holds our lock file, readable by others", tally, before);
  } else {
    skip("exposed-lock", "uid 1234 holds our lock file, readable by others");
  }

  // 5. A cache shared by a group: two members share entries, an outsider gets nothing.
  if (as_root) {
    const std::uint64_t before = verdict.count();
    Tally tally;
    for (int round = 0; round < options.rounds; ++round) {
      const fs::path root = work.path() / fmt::format("team-{}", round);
      fs::create_directories(root);
      if (::chown(root.c_str(), 0, kTeamGroup) != 0 || ::chmod(root.c_str(), 02770) != 0)
        verdict.fail("shared-group: cannot prepare {}", root.string());
      const std::string variant = specs[static_cast<std::size_t>(round) % specs.size()].name();
      const std::pair<uid_t, gid_t> users[] = {{1501, kTeamGroup}, {1502, kTeamGroup}, {1503, 1600}};
      const char* expected[] = {"compiled", "disk", "compiled"};
      for (int i = 0; i < 3; ++i) {
        const Captured child = run_captured(
            {"__trust-attacker", "--action", "shared-get", "--path", root.string(), "--variant",
             variant, "--uid", std::to_string(users[i].first), "--gid",
             std::to_string(users[i].second)});
        std::istringstream fields(child.out);
        std::string tag, source;
        Fingerprint print;
        fields >> tag >> source >> print.normalized >> print.signature;
        ++tally.gets;
        tally.compiled += source == "compiled";
        if (!exited_ok(child.status) || tag != "G")
          verdict.fail("shared-group: uid {} failed: {}{}", users[i].first, child.out, child.err);
        else if (source != expected[i])
          verdict.fail("shared-group: uid {} got {} from {}, expected {}", users[i].first,
                       variant, source, expected[i]);
        if (book.check(variant, print) == ReferenceBook::Match::different)
          verdict.fail("shared-group: uid {} got a wrong binary", users[i].first);
      }
    }
    report("shared-group", "uids 1501, 1502 share gid 1500; uid 1503 is outside", tally, before);
  } else {
    skip("shared-group", "uids 1501, 1502 share gid 1500; uid 1503 is outside");
  }

  // 6. A read-only layer serves hits, is never written; a damaged entry in it is skipped.
  {
    const std::uint64_t before = verdict.count();
    Tally tally;
    const fs::path layer = work.path() / "layer";
    fs::path damaged;
    {
      JitEngine warm(engine_config(layer));
      for (const auto& spec : specs) warm.get(spec);
      damaged = warm.cache().entry_path(warm.key_for(specs[1]), specs[1].name());
    }
    auto bytes = read_bytes(damaged);
    bytes[bytes.size() / 2] ^= 0x01;
    write_bytes(damaged, bytes);
    const auto layer_before = tree_snapshot(layer);
    for (int round = 0; round < options.rounds; ++round) {
      EnvConfig config = engine_config(work.path() / fmt::format("user-{}", round));
      config.cache_layers = {layer};
      for (std::size_t i = 0; i < specs.size(); ++i) {
        const VariantSource source = victim_get("read-only-layer", config, specs[i], &tally);
        const VariantSource expected = i == 1 ? VariantSource::compiled : VariantSource::disk;
        if (source != expected)
          verdict.fail("read-only-layer: {} came from the wrong place", specs[i].name());
      }
      if (victim_get("read-only-layer", config, specs[1], &tally) != VariantSource::disk)
        verdict.fail("read-only-layer: the recompiled entry did not land in the user cache");
    }
    if (tree_snapshot(layer) != layer_before) verdict.fail("read-only-layer: the layer changed");
    report("read-only-layer", "hits from a layer; one damaged entry there", tally, before);
  }

  // 6b. In shared mode, another user's layer given a group we are in: never trusted.
  if (as_root) {
    const std::uint64_t before = verdict.count();
    Tally tally;
    for (int round = 0; round < options.rounds; ++round) {
      const fs::path layer = work.path() / fmt::format("their-layer-{}", round);
      const KernelSpec& spec = specs[static_cast<std::size_t>(round) % specs.size()];
      {
        JitEngine warm(engine_config(layer));
        warm.get(spec);
      }
      if (::chown(layer.c_str(), kAttacker, ::getegid()) != 0)
        verdict.fail("foreign-layer: chown failed: {}", std::strerror(errno));
      for (fs::recursive_directory_iterator it(layer), end; it != end; ++it)
        if (::lchown(it->path().c_str(), kAttacker, ::getegid()) != 0)
          verdict.fail("foreign-layer: chown failed: {}", std::strerror(errno));
      const auto layer_before = tree_snapshot(layer);
      EnvConfig config = engine_config(work.path() / fmt::format("their-layer-user-{}", round));
      config.cache_sharing.kind = astrai::detail::CacheSharing::Kind::directory_group;
      config.cache_sharing.name = "group";
      config.cache_layers = {layer};
      if (victim_get("foreign-layer", config, spec, &tally) != VariantSource::compiled)
        verdict.fail("foreign-layer: an entry of uid {}'s layer was served", kAttacker);
      if (tree_snapshot(layer) != layer_before) verdict.fail("foreign-layer: the layer changed");
    }
    report("foreign-layer", "shared mode; layer of uid 1234 in a group of ours", tally, before);
  } else {
    skip("foreign-layer", "shared mode; layer of uid 1234 in a group of ours");
  }

  // 7. Export from one machine's cache, import on an empty one: hits, no compile.
  {
    const std::uint64_t before = verdict.count();
    Tally tally;
    const fs::path ci = work.path() / "ci";
    {
      JitEngine warm(engine_config(ci));
      for (const auto& spec : specs) warm.get(spec);
    }
    const fs::path archive = work.path() / "kernels.astrai";
    const auto exported =
        astrai::detail::export_cache(DiskCache(ci, CacheMode::read_only, 0), {}, archive);
    for (int round = 0; round < options.rounds; ++round) {
      const fs::path node = work.path() / fmt::format("node-{}", round);
      DiskCache target(node, CacheMode::read_write, 0);
      const auto imported = astrai::detail::import_archive(target, archive);
      if (imported.entries != specs.size() || exported.entries != specs.size())
        verdict.fail("export-import: {} exported, {} imported, expected {}", exported.entries,
                     imported.entries, specs.size());
      for (const auto& spec : specs)
        if (victim_get("export-import", engine_config(node), spec, &tally) != VariantSource::disk)
          verdict.fail("export-import: {} was not a hit after import", spec.name());
    }
    // An archive damaged after its sound entries imports nothing at all.
    auto damaged = read_bytes(archive);
    damaged.resize(damaged.size() - 16);
    for (char c : std::string("garbage, garbage")) damaged.push_back(c);
    write_bytes(work.path() / "damaged.astrai", damaged);
    DiskCache target(work.path() / "node-damaged", CacheMode::read_write, 0);
    try {
      astrai::detail::import_archive(target, work.path() / "damaged.astrai");
      verdict.fail("export-import: a damaged archive was imported");
    } catch (const astrai::Error&) {
    }
    for (fs::recursive_directory_iterator it(work.path() / "node-damaged"), end; it != end; ++it)
      if (it->is_regular_file())
        verdict.fail("export-import: a damaged archive left {} in the cache", it->path().string());
    report("export-import", "warm, export, import; a damaged archive imports nothing", tally,
           before);
  }

  // 8. No HOME: never a predictable directory under /tmp.
  {
    const std::uint64_t before = verdict.count();
    Tally tally;
    const EnvConfig config = astrai::detail::parse_env_config({});
    if (config.cache_dir.string().rfind("/tmp", 0) == 0)
      verdict.fail("no-home: the cache fell back to {}", config.cache_dir.string());
    report("no-home", "no HOME or XDG variables: no /tmp/astrai-jit-<uid>", tally, before);
  }

  fmt::print("  binaries: {}\n", book.summary());
  return verdict.finish();
}

}  // namespace astrai::torture
