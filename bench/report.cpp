// The report: the table on stdout and the JSON file.
#include "bench/bench.hpp"

namespace astrai::bench {

// ---------------------------------------------------------------------------------------------
// Report

std::string format_rate(double value) { return value > 0 ? fmt::format("{:.2f}", value) : "-"; }

void print_header(const Bench& bench, const Options& options) {
  const DeviceInfo& info = bench.info();
  fmt::print("astrai-bench  {}\n", utc_now());
  // The runtime switches that change which kernels the cases time.
  std::string runtime = info.runtime_no_mma ? " no-mma" : "";
  if (info.runtime_no_wgmma) runtime += " no-wgmma";
  if (info.runtime_prefill_tiles != astrai::detail::TileChoice::automatic)
    runtime += fmt::format(" prefill-tiles {}", astrai::detail::tile_choice_name(info.runtime_prefill_tiles));
  if (info.runtime_decode_tiles != astrai::detail::TileChoice::automatic)
    runtime += fmt::format(" decode-tiles {}", astrai::detail::tile_choice_name(info.runtime_decode_tiles));
  fmt::print("device   {}, {} SMs, sm_{}{} (runtime target {}{}, bench kernels {}), {}, L2 {:.0f} MiB\n",
             info.name, info.sms, info.cc_major, info.cc_minor, info.runtime_target, runtime, info.bench_target,
             format_gib(static_cast<double>(info.total_mem)), static_cast<double>(info.l2_bytes) / (1 << 20));
  std::string clocks;
  if (info.sm_clock_khz > 0) clocks += fmt::format(", SM clock {} MHz", info.sm_clock_khz / 1000);
  if (info.mem_clock_khz > 0 && info.bus_width_bits > 0)
    clocks += fmt::format(", memory {} MHz x {} bit (nominal {:.2f} TB/s)", info.mem_clock_khz / 1000,
                          info.bus_width_bits, 2.0 * info.mem_clock_khz * 1e3 * info.bus_width_bits / 8 / 1e12);
  fmt::print("driver   CUDA {}.{}, NVRTC {}{}\n", info.driver_version / 1000, (info.driver_version % 1000) / 10,
             astrai::detail::nvrtc_version().text(), clocks);
  fmt::print("method   median of {} graph replays of >= {} back-to-back calls (CUDA events), spread = min..max;\n"
             "         inputs random, rotated to >= 3x L2 when smaller than 2x L2; first call (JIT) excluded\n",
             options.reps, options.calls);
  fmt::print("ceilings\n");
  auto ceiling_line = [](const char* name, const Ceiling& ceiling) {
    if (!ceiling.ok) {
      fmt::print("  {:<16} {}\n", name, ceiling.error);
      return;
    }
    fmt::print("  {:<16} {:>6.2f} TB/s  ({:.2f}..{:.2f}, {:.3f} ms median of {})  {}\n", name, ceiling.tbps(),
               ceiling.tbps_min(), ceiling.tbps_max(), ceiling.ms.median, ceiling.ms.count, ceiling.note);
  };
  ceiling_line("streaming read", bench.read_ceiling());
  ceiling_line("device copy", bench.copy_ceiling());
  const LaunchFloor& floor = bench.launch_floor();
  if (floor.ok)
    fmt::print("  {:<16} {:>6.2f} us a call with one kernel, {:.2f} us with two  (medians of {})  {}\n",
               "launch floor", floor.one_us.median, floor.two_us.median, floor.two_us.count, floor.note);
  else
    fmt::print("  {:<16} {}\n", "launch floor", floor.error);
  const Ceiling& gemm = bench.gemm_ceiling();
  if (gemm.ok)
    fmt::print("  {:<16} {:>6.0f} TFLOP/s  ({:.3f} ms median of {})  {}\n", "bf16 GEMM", gemm.tflops(), gemm.ms.median,
               gemm.ms.count, gemm.note);
  else
    fmt::print("  {:<16} {:>6.0f} TFLOP/s  documented (performance.md, bf16 GEMM 8192^3); {}\n", "bf16 GEMM",
               kDocumentedGemmTflops, gemm.error);
}

void print_table(const std::vector<CaseResult>& results) {
  if (results.empty()) return;
  const char* format = "{:<13} {:<30} {:<40} {:<28} {:>10} {:>15} {:>7}  {:<19} {}\n";
  fmt::print("\n");
  fmt::print(format, "kernel", "case", "variant", "shape", "us/call", "rate", "% ceil", "spread us", "notes");
  for (const auto& r : results) {
    if (r.status != "ok") {
      fmt::print("{:<13} {:<30} {:<40} {:<28} {}\n", r.def.kernel, r.def.label, r.variant, r.def.shape(),
                 clip(first_line(r.error), 120));
      continue;
    }
    std::vector<std::string> notes;
    if (r.ratio) notes.push_back(fmt::format("{:.2f}x {}", *r.ratio, r.def.ratio_label));
    for (const auto& note : r.notes) notes.push_back(note);
    if (r.method != "graph") notes.push_back("method: " + r.method);
    std::string joined;
    for (const auto& note : notes) joined += (joined.empty() ? "" : "; ") + note;
    fmt::print(format, r.def.kernel, r.def.label, r.variant, r.def.shape(), fmt::format("{:.2f}", r.us.median),
               fmt::format("{} {}", format_rate(r.rate), r.metric),
               r.percent > 0 ? fmt::format("{:.1f}%", r.percent) : "-",
               fmt::format("{:.2f}..{:.2f}", r.us.min, r.us.max), joined);
  }
}

void print_jit(const JitResults& jit, int compile_reps, int load_runs) {
  if (!jit.compile_run && !jit.load_run && !jit.host_run) return;
  fmt::print("\nJIT\n");
  for (const auto& figure : jit.compiles) {
    if (!figure.error.empty()) {
      fmt::print("  cold compile    {:<40} {}\n", figure.variant, clip(figure.error, 120));
      continue;
    }
    fmt::print("  cold compile    {:<40} {:>9.1f} ms  median of {} ({:.1f}..{:.1f})\n", figure.variant,
               figure.ms.median, compile_reps, figure.ms.min, figure.ms.max);
  }
  if (jit.load_run) {
    if (!jit.load_error.empty())
      fmt::print("  cached load     {:<40} {}\n", jit.load_variant, clip(jit.load_error, 120));
    else
      fmt::print("  cached load     {:<40} {:>9.2f} ms  median of {} fresh processes ({:.2f}..{:.2f}): "
                 "JitEngine::get {:.2f} + module load {:.2f}\n",
                 jit.load_variant, jit.load_ms.median, load_runs, jit.load_ms.min, jit.load_ms.max,
                 jit.load_get_ms.median, jit.load_module_ms.median);
  }
  if (jit.host_run) {
    if (!jit.host_error.empty()) {
      fmt::print("  host overhead   {:<40} {}\n", jit.host_variant, clip(jit.host_error, 120));
    } else {
      fmt::print("  host overhead   {:<40} {:>9.2f} us  per hot paged_decode call ({} launch{}), B1 L1024\n",
                 jit.host_variant, jit.runtime_us.median, jit.launches_per_call,
                 jit.launches_per_call > 1 ? "es" : "");
      fmt::print("  host overhead   {:<40} {:>9.2f} us  per raw cuLaunchKernel (trivial kernel)\n", "bench_noop",
                 jit.raw_us.median);
      fmt::print("  host overhead   {:<40} {:>9.2f} us  runtime - launches x raw (median of {} batches of 200 "
                 "calls, no sync inside)\n",
                 "difference", jit.runtime_us.median - jit.launches_per_call * jit.raw_us.median,
                 jit.runtime_us.count);
    }
  }
}

Json launch_floor_json(const LaunchFloor& floor) {
  Json json = Json::object();
  json.set("what", "graph-replayed calls of one and of two no-op kernels, decode-shaped");
  if (!floor.ok) return json.set("status", "error").set("error", floor.error);
  return json.set("status", "ok")
      .set("one_kernel_us", stats_json(floor.one_us))
      .set("two_kernels_us", stats_json(floor.two_us))
      .set("note", floor.note);
}

Json ceiling_json(const Ceiling& ceiling, const char* what) {
  Json json = Json::object();
  json.set("what", what);
  if (!ceiling.ok) return json.set("status", "error").set("error", ceiling.error);
  return json.set("status", "ok")
      .set("tbps", ceiling.tbps())
      .set("tbps_min", ceiling.tbps_min())
      .set("tbps_max", ceiling.tbps_max())
      .set("bytes", ceiling.bytes)
      .set("ms", stats_json(ceiling.ms))
      .set("note", ceiling.note);
}

Json report_json(const Bench& bench, const Options& options, const std::vector<CaseResult>& results) {
  const DeviceInfo& info = bench.info();
  Json json = Json::object();
  json.set("tool", "astrai-bench").set("timestamp", utc_now());
  json.set("device", Json::object()
                         .set("name", info.name)
                         .set("sms", info.sms)
                         .set("compute_capability", fmt::format("{}.{}", info.cc_major, info.cc_minor))
                         .set("runtime_target", info.runtime_target)
                         .set("runtime_no_mma", info.runtime_no_mma)
                         .set("runtime_no_wgmma", info.runtime_no_wgmma)
                         .set("runtime_prefill_tiles", astrai::detail::tile_choice_name(info.runtime_prefill_tiles))
                         .set("runtime_decode_tiles", astrai::detail::tile_choice_name(info.runtime_decode_tiles))
                         .set("bench_target", info.bench_target)
                         .set("total_memory_bytes", static_cast<std::uint64_t>(info.total_mem))
                         .set("l2_bytes", static_cast<std::uint64_t>(info.l2_bytes))
                         .set("sm_clock_mhz", info.sm_clock_khz / 1000)
                         .set("memory_clock_mhz", info.mem_clock_khz / 1000)
                         .set("memory_bus_bits", info.bus_width_bits)
                         .set("driver_cuda_version", fmt::format("{}.{}", info.driver_version / 1000,
                                                                 (info.driver_version % 1000) / 10))
                         .set("nvrtc_version", astrai::detail::nvrtc_version().text()));
  json.set("settings", Json::object()
                           .set("filter", options.filter)
                           .set("reps", options.reps)
                           .set("calls_per_replay_min", options.calls)
                           .set("warmup_replays", kWarmupReplays)
                           .set("warmup_seconds_min", kWarmupSeconds)
                           .set("compile_reps", options.compile_reps)
                           .set("load_runs", options.load_runs));
  json.set("ceilings", Json::object()
                           .set("read", ceiling_json(bench.read_ceiling(), "streaming read, 16-byte loads"))
                           .set("copy", ceiling_json(bench.copy_ceiling(), "cuMemcpyDtoD, read + write"))
                           .set("gemm", Json::object()
                                            .set("what", bench.gemm_ceiling().ok
                                                             ? bench.gemm_ceiling().note
                                                             : "bf16 GEMM 8192^3, documented in performance.md")
                                            .set("status", bench.gemm_ceiling().ok ? "measured" : "documented")
                                            .set("tflops", bench.gemm_tflops()))
                           .set("launch_floor", launch_floor_json(bench.launch_floor())));
  Json cases = Json::array();
  for (const auto& r : results) {
    Json item = Json::object();
    item.set("name", r.def.name()).set("kernel", r.def.kernel).set("case", r.def.label)
        .set("variant", r.variant).set("shape", r.def.shape()).set("status", r.status);
    if (r.status != "ok") {
      item.set("error", r.error);
      cases.push(std::move(item));
      continue;
    }
    item.set("us_per_call", stats_json(r.us))
        .set("metric", r.metric)
        .set("rate", r.rate)
        .set("rate_min", r.rate_min)
        .set("rate_max", r.rate_max)
        .set("ceiling", r.ceiling)
        .set("ceiling_value", r.ceiling_value)
        .set("percent_of_ceiling", r.percent > 0 ? Json(r.percent) : Json())
        .set("floor_us", r.floor_us > 0 ? Json(r.floor_us) : Json());
    if (r.metric == "TB/s") item.set("bytes_per_call", r.bytes);
    else item.set("flops_per_call", r.flops);
    item.set("input_sets", r.sets)
        .set("calls_per_replay", r.calls_per_replay)
        .set("method", r.method)
        .set("first_call_ms", r.first_call_ms);
    if (r.ratio)
      item.set("ratio", Json::object().set("to", r.def.ratio_to).set("what", r.def.ratio_label).set("value", *r.ratio));
    Json notes = Json::array();
    for (const auto& note : r.notes) notes.push(note);
    item.set("notes", std::move(notes));
    cases.push(std::move(item));
  }
  json.set("cases", std::move(cases));

  const JitResults& jit = bench.jit();
  Json jit_json = Json::object();
  if (jit.compile_run) {
    Json compiles = Json::array();
    for (const auto& figure : jit.compiles) {
      Json item = Json::object().set("variant", figure.variant);
      if (figure.error.empty()) item.set("status", "ok").set("ms", stats_json(figure.ms));
      else item.set("status", "error").set("error", figure.error);
      compiles.push(std::move(item));
    }
    jit_json.set("cold_compile", std::move(compiles));
  }
  if (jit.load_run) {
    Json load = Json::object().set("variant", jit.load_variant);
    if (jit.load_error.empty())
      load.set("status", "ok").set("ms", stats_json(jit.load_ms)).set("get_ms", stats_json(jit.load_get_ms))
          .set("module_load_ms", stats_json(jit.load_module_ms));
    else load.set("status", "error").set("error", jit.load_error);
    jit_json.set("cached_load_fresh_process", std::move(load));
  }
  if (jit.host_run) {
    Json host = Json::object().set("variant", jit.host_variant);
    if (jit.host_error.empty())
      host.set("status", "ok")
          .set("runtime_call_us", stats_json(jit.runtime_us))
          .set("raw_launch_us", stats_json(jit.raw_us))
          .set("launches_per_call", jit.launches_per_call)
          .set("overhead_us", jit.runtime_us.median - jit.launches_per_call * jit.raw_us.median)
          .set("calls", jit.host_calls);
    else host.set("status", "error").set("error", jit.host_error);
    jit_json.set("host_overhead", std::move(host));
  }
  json.set("jit", std::move(jit_json));
  return json;
}

void print_error(const std::string& message) {
  fmt::print(stderr, "astrai-bench: error: {}\n", strip_prefix(message));
}


}  // namespace astrai::bench
