// `astrai-jit keygen`, `astrai-jit cache sign` and the JSON of `cache stats --json`.
#include "cache/cache_metrics.hpp"
#include "cache/cache_signature.hpp"
#include "tools/cli/cli.hpp"

namespace astrai::cli {

namespace {

// A JSON string literal: quotes, backslashes and control characters escaped.
std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\')
      out += std::string("\\") + c;
    else if (u < 0x20)
      out += fmt::format("\\u{:04x}", u);
    else
      out += c;
  }
  return out + "\"";
}

}  // namespace

astrai::detail::SigningKey read_signing_key_option(const char* flag, const std::string& path) {
  astrai::detail::SigningKey key;
  std::string why;
  if (!astrai::detail::load_signing_key(path, &key, &why))
    throw astrai::ConfigError(fmt::format("{} {}: not a usable secret key: {}", flag,
                                          astrai::detail::echo_text(path), why));
  return key;
}

int run_keygen(const CacheOptions& options) {
  const auto key = astrai::detail::SigningKey::generate();
  std::string why;
  if (!astrai::detail::write_key_pair(options.keygen_out, key, &why))
    throw astrai::Error(fmt::format("keygen: {}", why));
  fmt::print("keygen: key {} written: {}.secret (secret, mode 0600) and {}.pub (public)\n",
             astrai::detail::key_id_hex(key.id()), options.keygen_out, options.keygen_out);
  fmt::print("public key: {}\n", astrai::detail::format_public_key(key.public_key()));
  return kExitOk;
}

int run_cache_sign(const EnvConfig& config, const CacheOptions& options) {
  const auto key = read_signing_key_option("--key", options.sign_key);
  require_writable(config, "sign");
  if (!require_usable(config, "sign")) {
    fmt::print("sign: 0 entries signed in {}\n", config.cache_dir.string());
    return kExitOk;
  }
  DiskCache cache = open_cache(config, true);
  std::vector<std::string> problems;
  const std::uint64_t signed_count = cache.sign_entries(key, &problems);
  for (const auto& problem : problems) print_error(problem);
  fmt::print("sign: {} signed by {} in {}{}\n", counted(signed_count, "entry", "entries"),
             astrai::detail::key_id_hex(key.id()), config.cache_dir.string(),
             problems.empty() ? std::string() : fmt::format(", {} not signed", problems.size()));
  return problems.empty() ? kExitOk : kExitFailed;
}

std::string cache_stats_json(const EnvConfig& config, std::uint64_t entries, std::uint64_t bytes) {
  return fmt::format(
      "{{\"directory\": {}, \"mode\": {}, \"entries\": {}, \"total_bytes\": {}, "
      "\"cap_bytes\": {}, \"trusted_keys\": {}, \"process\": {}}}",
      json_string(config.cache_dir.string()), json_string(cache_mode_name(config.cache_mode)),
      entries, bytes, config.max_cache_bytes,
      config.trusted_keys ? config.trusted_keys->keys.size() : 0,
      astrai::detail::format_metrics_json(astrai::cache_metrics()));
}

}  // namespace astrai::cli
