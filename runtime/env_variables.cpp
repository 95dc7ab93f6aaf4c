#include "runtime/env_variables.hpp"

#include <fmt/format.h>

namespace astrai::detail {

const std::vector<EnvVariable>& env_variables() {
  static const std::vector<EnvVariable> variables = {
      {"ASTRAI_JIT_CACHE_DIR", "path",
       "cache root; default `$XDG_CACHE_HOME/astrai-jit`, else `~/.cache/astrai-jit` (home from `HOME` "
       "or the user database), else `$XDG_RUNTIME_DIR/astrai-jit`, else memory only (never a fixed name"
       " under `/tmp`)"},
      {"ASTRAI_JIT_CACHE", "`rw` (default), `ro`, `off`",
       "read and write; read only (never writes); memory only (layers off too)"},
      {"ASTRAI_JIT_CACHE_PATH", "`DIR:DIR:...` (absolute)",
       "read-only cache layers searched in order before the cache; never written"},
      {"ASTRAI_JIT_CACHE_SHARED", "`group`, a group name or gid; default off",
       "share the cache with a group (see \"Trust and sharing\")"},
      {"ASTRAI_JIT_CACHE_OWNERS", "`NAME,UID,...` (user names or uids)",
       "in shared mode, trust only files and directories owned by you, root or a listed user, whatever "
       "their group; empty: you and root only (see \"Trust and sharing\")"},
      {"ASTRAI_JIT_CACHE_NFS", "`auto` (default), `on`, `off`",
       "compile locks on a network file system: `auto` takes none when the cache root is on NFS, "
       "SMB/CIFS, Lustre, GPFS, Ceph, BeeGFS, 9P, AFS or FUSE; `on` never locks, `off` always does (see"
       " \"Network file systems\")"},
      {"ASTRAI_JIT_FORCE_COMPILE", "bool",
       "ignore cached entries, compile and republish"},
      {"ASTRAI_JIT_STRICT", "bool",
       "never compile at run time: a miss throws `CacheMissError` naming the variant and the "
       "`astrai-jit warm` command that provides it"},
      {"ASTRAI_JIT_RECORD", "file",
       "append each variant the process asks for (input for `warm --manifest`)"},
      {"ASTRAI_JIT_MAX_CACHE_SIZE", "bytes, `K`/`M`/`G`/`T` suffixes (1024-based)",
       "cap; a store that takes the cache over it prunes least-recently-used entries down to 90% of it;"
       " `0` unlimited"},
      {"ASTRAI_JIT_LOG", "`off`, `error`, `warn` (default), `info`, `debug`",
       "stderr log; `info` logs every compile with its variant and milliseconds"},
      {"ASTRAI_JIT_ARCH", "`sm_89`, `sm_90a`, `8.9`, ...; `compute_80`, `compute_90a`, ... (75 or newer)",
       "compile for this target instead of the device's: `sm_XY` a cubin (loads only on that arch), "
       "`compute_XY` PTX of that virtual arch that the driver finishes for the device (runs an older "
       "arch's code path on a newer GPU, e.g. `compute_80` on an H200); the variant names end in the "
       "target"},
      {"ASTRAI_JIT_NO_MMA", "bool",
       "force the CUDA-core path (`ASTRAI_NO_MMA`) on any GPU"},
      {"ASTRAI_JIT_NO_WGMMA", "bool",
       "on sm_90a, use the portable mma.sync kernels instead of the Hopper ones (wgmma prefill, TMA "
       "decode)"},
      {"ASTRAI_JIT_PREFILL_TILES", "`auto`, `narrow`, `wide`",
       "the Hopper prefill's tiling where the head dim has two (hd128: 128 or 192 query rows a CTA); "
       "`auto` (default) takes the wide one on grids of at least 10 waves of it"},
      {"ASTRAI_JIT_DECODE_TILES", "`auto`, `narrow`, `wide`",
       "the Hopper decode's wide CTAs where the head dim has them (hd64, a 16-bit or an FP8 cache: a "
       "request's splits side by side in one CTA of 512 threads, merged there, with no split combine); "
       "`auto` (default) takes "
       "them when the grid's (request, KV head) columns fit one wave and split 2 to 4 ways"},
      {"ASTRAI_JIT_TRUSTED_KEYS",
       "public keys `ed25519:<key id>:<base64>` or absolute paths of files of them, separated by commas"
       " or blanks",
       "load (from the cache, a layer or an import) only entries validly signed by one of these keys; "
       "anything else is a miss with one warning (see \"Signed kernels and metrics\")"},
      {"ASTRAI_JIT_SIGNING_KEY", "path of a secret key file (yours, mode 0600 or 0400)",
       "sign every entry this process compiles before it is stored"},
      {"ASTRAI_JIT_DUMP", "directory",
       "write the source, PTX, cubin (`cuobjdump -sass` reads it) and log of each compile (created "
       "0700; an existing one must be yours and writable by nobody else)"},
      {"ASTRAI_JIT_REMOTE",
       "`redis://[:PASSWORD@]HOST[:PORT][/DB]`, `http[s]://[USER:PASSWORD@]HOST[:PORT][/PREFIX]`, "
       "comma-separated",
       "remote caches shared by a cluster, read after a local miss and published to after a compile "
       "(see \"Cluster\")"},
      {"ASTRAI_JIT_REMOTE_TIMEOUT_MS", "1..60000 (default 300)",
       "connect and request limit of a remote; one that errs or times out is left alone for 30 s, with "
       "one warning"},
      {"ASTRAI_JIT_REMOTE_LEASE_MS", "0..600000 (default 10000)",
       "how long a node waits for another node's compile of the same key (Redis lease) before compiling"
       " itself; `0` no leases"},
      {"ASTRAI_JIT_NVRTC_DIR", "directory",
       "the Python package loads NVRTC from this directory instead of the `nvidia-cuda-nvrtc` wheel or "
       "the toolkit (the library itself ignores it)"},
  };
  return variables;
}

std::string env_variables_markdown() {
  std::string table = "| variable | values | effect |\n|---|---|---|\n";
  for (const EnvVariable& variable : env_variables())
    table += fmt::format("| `{}` | {} | {} |\n", variable.name, variable.values, variable.effect);
  return table;
}

}  // namespace astrai::detail
