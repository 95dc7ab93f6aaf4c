// JIT figures: cold compile, cached load in a fresh process, host overhead of a hot call.
#include "bench/bench.hpp"

namespace astrai::bench {

// ---------------------------------------------------------------------------------------------
// JIT figures

const fs::path& Bench::jit_dir() {
  if (!jit_dir_) jit_dir_ = std::make_unique<TempDir>();
  return jit_dir_->path();
}

EnvConfig Bench::jit_config(bool force_compile) {
  EnvConfig config;
  config.cache_dir = jit_dir();
  config.cache_mode = astrai::detail::CacheMode::read_write;
  config.force_compile = force_compile;
  config.log_level = astrai::detail::Logger::instance().level();
  return config;
}

KernelSpec Bench::jit_spec(KernelKind kind, int head_dim, int page_size, int group) const {
  return KernelSpec::parse(variant_name(kind, head_dim, page_size, group));
}

void Bench::run_jit(const CaseDef& def) {
  if (context_broken_) {
    const std::string skipped = "skipped: the CUDA context is unusable after an earlier error (" + broken_reason_ + ")";
    if (def.kind == CaseKind::jit_compile) {
      jit_.compile_run = true;
      jit_.compiles.push_back({"-", skipped, {}});
    } else if (def.kind == CaseKind::jit_load) {
      jit_.load_run = true;
      jit_.load_error = skipped;
    } else if (def.kind == CaseKind::jit_host) {
      jit_.host_run = true;
      jit_.host_error = skipped;
    }
    return;
  }
  switch (def.kind) {
    case CaseKind::jit_compile: jit_compile(); break;
    case CaseKind::jit_load: jit_load(); break;
    case CaseKind::jit_host: jit_host(); break;
    default: break;
  }
}

void Bench::jit_compile() {
  jit_.compile_run = true;
  const std::vector<std::tuple<KernelKind, int, int, int>> variants = {
      {KernelKind::paged_decode, 128, 16, 4}, {KernelKind::paged_decode, 64, 1, 6},
      {KernelKind::decode, 128, 0, 4},        {KernelKind::prefill, 128, 0, 4},
      {KernelKind::rotary_emb, 128, 0, 0}};
  for (const auto& [kind, head_dim, page_size, group] : variants) {
    CompileFigure figure;
    figure.variant = variant_name(kind, head_dim, page_size, group);
    fmt::print(stderr, "  compiling {} x{}\n", figure.variant, options_.compile_reps);
    try {
      const KernelSpec spec = KernelSpec::parse(figure.variant);
      std::vector<double> ms;
      for (int rep = 0; rep < options_.compile_reps; ++rep) {
        // A fresh engine each time: nothing in memory, and the disk cache is bypassed.
        JitEngine engine(jit_config(true));
        astrai::detail::VariantSource source = astrai::detail::VariantSource::memory;
        const auto start = Clock::now();
        engine.get(spec, &source);
        ms.push_back(ms_since(start));
        if (source != astrai::detail::VariantSource::compiled)
          throw astrai::Error("the engine did not compile (served from a cache)");
      }
      figure.ms = stats_of(ms);
    } catch (const std::exception& error) {
      figure.error = "error: " + first_line(strip_prefix(error.what()));
    }
    jit_.compiles.push_back(figure);
  }
}

struct ChildOutput {
  int status = -1;
  std::string text;
};

ChildOutput run_self(const std::vector<std::string>& arguments) {
  ChildOutput output;
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw astrai::Error("pipe2 failed");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  std::vector<std::string> storage = arguments;
  std::vector<char*> argv;
  for (auto& argument : storage) argv.push_back(argument.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int spawned = ::posix_spawn(&pid, "/proc/self/exe", &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  if (spawned != 0) {
    ::close(fds[0]);
    throw astrai::Error(fmt::format("posix_spawn(/proc/self/exe) failed: {}", std::strerror(spawned)));
  }
  char buffer[4096];
  for (;;) {
    const ssize_t got = ::read(fds[0], buffer, sizeof buffer);
    if (got > 0) output.text.append(buffer, static_cast<std::size_t>(got));
    else if (got == 0 || errno != EINTR) break;
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  output.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  return output;
}

std::optional<double> field_value(const std::string& text, const std::string& key) {
  const std::size_t at = text.find(key + "=");
  if (at == std::string::npos) return std::nullopt;
  char* end = nullptr;
  const char* begin = text.c_str() + at + key.size() + 1;
  const double value = std::strtod(begin, &end);
  if (end == begin) return std::nullopt;
  return value;
}

void Bench::jit_load() {
  jit_.load_run = true;
  try {
    // The variant must be in the temporary cache: compiled by jit/compile, else here (untimed).
    const KernelSpec spec = jit_spec(KernelKind::paged_decode, 128, 16, 4);
    jit_.load_variant = spec.name();
    {
      JitEngine engine(jit_config(false));
      engine.get(spec);
    }
    std::vector<double> total, get, module;
    for (int run = 0; run < options_.load_runs; ++run) {
      const ChildOutput child = run_self({"astrai-bench", "--child-load", jit_dir().string(), spec.name()});
      const auto load_ms = field_value(child.text, "load_ms");
      const auto get_ms = field_value(child.text, "get_ms");
      const auto module_ms = field_value(child.text, "module_ms");
      if (child.status != 0 || !load_ms || !get_ms || !module_ms)
        throw astrai::Error(fmt::format("child process exited with {}: {}", child.status,
                                        child.text.empty() ? "no output" : first_line(child.text)));
      total.push_back(*load_ms);
      get.push_back(*get_ms);
      module.push_back(*module_ms);
    }
    jit_.load_ms = stats_of(total);
    jit_.load_get_ms = stats_of(get);
    jit_.load_module_ms = stats_of(module);
  } catch (const std::exception& error) {
    jit_.load_error = "error: " + first_line(strip_prefix(error.what()));
  }
}

void Bench::jit_host() {
  jit_.host_run = true;
  try {
    const auto& api = driver();
    CaseDef def;
    def.batch = 1;
    def.len = 1024;
    def.n_heads = 32;
    def.n_kv_heads = 8;
    def.head_dim = 128;
    def.page_size = 16;
    std::mt19937 rng(7);
    const PagedLayout layout = make_paged_layout({def.len}, def.page_size, rng);
    jit_.host_variant = variant_name(KernelKind::paged_decode, def.head_dim, def.page_size, 4);
    const std::size_t pool_elems = static_cast<std::size_t>(layout.num_pages) * def.page_size * def.n_kv_heads * def.head_dim;
    const std::size_t q_elems = static_cast<std::size_t>(def.n_heads) * def.head_dim;
    DeviceBuffer k(pool_elems * 2), v(pool_elems * 2), q(q_elems * 2), out(q_elems * 2);
    fill_bf16(k, pool_elems, 11);
    fill_bf16(v, pool_elems, 12);
    fill_bf16(q, q_elems, 13);
    const DeviceBuffer table = DeviceBuffer::from(layout.table);
    const DeviceBuffer seq_lens = DeviceBuffer::from(layout.lens);
    DeviceBuffer noop_out(1024);
    sync_all();
    astrai::PagedDecodeArgs args;
    args.batch = 1;
    args.n_heads = def.n_heads;
    args.n_kv_heads = def.n_kv_heads;
    args.head_dim = def.head_dim;
    args.page_size = def.page_size;
    args.num_pages = layout.num_pages;
    args.max_pages_per_seq = layout.width;
    args.q = q.ptr();
    args.k_cache = k.ptr();
    args.v_cache = v.ptr();
    args.page_table = table.as<const std::int32_t>();
    args.seq_lens = seq_lens.as<const std::int32_t>();
    args.out = out.ptr();
    args.stream = stream_;
    jit_.launches_per_call = astrai::paged_decode_workspace_bytes(args, info_.sms) > 0 ? 2 : 1;

    CUdeviceptr noop_pointer = noop_out.get();
    int flag = 0;
    void* noop_params[] = {&noop_pointer, &flag};
    auto raw_launch = [&] {
      check_cu(api.cuLaunchKernel(kernels_.noop, 1, 1, 1, 32, 1, 1, 0, stream_, noop_params, nullptr),
               "cuLaunchKernel(bench_noop)", 0);
    };
    auto runtime_call = [&] { Runtime::get().paged_decode(args); };
    for (int i = 0; i < 100; ++i) {
      runtime_call();
      raw_launch();
    }
    sync_stream(stream_);

    // Batches short enough that the launch queue never fills (the host would then wait for the
    // GPU); the stream is drained between batches, outside the timed loops.
    constexpr int kBatches = 25;
    constexpr int kCallsPerBatch = 200;
    std::vector<double> runtime_us, raw_us;
    for (int batch = 0; batch < kBatches; ++batch) {
      auto start = Clock::now();
      for (int i = 0; i < kCallsPerBatch; ++i) runtime_call();
      runtime_us.push_back(ms_since(start) * 1e3 / kCallsPerBatch);
      sync_stream(stream_);
      start = Clock::now();
      for (int i = 0; i < kCallsPerBatch; ++i) raw_launch();
      raw_us.push_back(ms_since(start) * 1e3 / kCallsPerBatch);
      sync_stream(stream_);
    }
    jit_.runtime_us = stats_of(runtime_us);
    jit_.raw_us = stats_of(raw_us);
    jit_.host_calls = kBatches * kCallsPerBatch;
  } catch (const std::exception& error) {
    jit_.host_error = "error: " + first_line(strip_prefix(error.what()));
  }
}

// JitEngine::get of a cached variant from cache DIR in this fresh process, engine construction
// included: the host part of a cached load. Null (after saying why) when the variant did not
// come from the disk cache.
std::shared_ptr<const astrai::detail::CompiledVariant> timed_get(const std::string& dir, const KernelSpec& spec,
                                                                 double* get_ms) {
  const auto start = Clock::now();
  EnvConfig config;
  config.cache_dir = dir;
  config.cache_mode = astrai::detail::CacheMode::read_only;
  JitEngine engine(config);
  astrai::detail::VariantSource source = astrai::detail::VariantSource::memory;
  auto compiled = engine.get(spec, &source);
  *get_ms = ms_since(start);
  if (source == astrai::detail::VariantSource::disk) return compiled;
  fmt::print("error: {} was not served from the cache in {}\n", spec.name(), dir);
  return nullptr;
}

// `astrai-bench --child-load DIR VARIANT`: one cached load in a fresh process. Prints
// "load_ms=... get_ms=... module_ms=... source=disk" on stdout; without a GPU, the host part
// alone ("get_ms=... source=disk (no module load: ...)").
int child_load(const std::string& dir, const std::string& variant) {
  try {
    const KernelSpec spec = KernelSpec::parse(variant);
    double get_ms = 0;
    std::string why;
    if (!astrai::detail::driver_available(&why)) {
      if (!timed_get(dir, spec, &get_ms)) return kExitFailed;
      fmt::print("get_ms={:.3f} source=disk (no module load: {})\n", get_ms, why);
      return kExitOk;
    }
    const auto& api = driver();
    CUdevice device = 0;
    CUcontext context = nullptr;
    check_cu(api.cuDeviceGet(&device, 0), "cuDeviceGet", 0);
    check_cu(api.cuDevicePrimaryCtxRetain(&context, device), "cuDevicePrimaryCtxRetain", 0);
    check_cu(api.cuCtxSetCurrent(context), "cuCtxSetCurrent", 0);

    const auto start = Clock::now();
    const auto compiled = timed_get(dir, spec, &get_ms);
    if (!compiled) return kExitFailed;
    const auto module_start = Clock::now();
    CUmodule module = nullptr;
    check_cu(api.cuModuleLoadData(&module, compiled->binary.data()), "cuModuleLoadData", 0);
    for (const auto& symbol : compiled->symbols) {
      CUfunction function = nullptr;
      check_cu(api.cuModuleGetFunction(&function, module, symbol.c_str()), "cuModuleGetFunction", 0);
    }
    const double module_ms = ms_since(module_start);
    const double load_ms = ms_since(start);
    api.cuModuleUnload(module);
    api.cuDevicePrimaryCtxRelease(device);
    fmt::print("load_ms={:.3f} get_ms={:.3f} module_ms={:.3f} source=disk\n", load_ms, get_ms, module_ms);
    return kExitOk;
  } catch (const std::exception& error) {
    fmt::print("error: {}\n", first_line(strip_prefix(error.what())));
    return kExitFailed;
  }
}


}  // namespace astrai::bench
