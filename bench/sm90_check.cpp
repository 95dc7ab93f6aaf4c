// astrai-sm90-check: brings up the Hopper (sm_90a) kernels on an H100/H200 ahead of their
// integration into the runtime. Compiles them with NVRTC (compile time and any C75xx
// serialization warning reported), checks them against float64 references on random data with
// poisoned outputs, and times them beside the portable prefill measured in the same run.
//   astrai-sm90-check [--check-only] [--small] [--timings-only] [--trace] [--reps N] [--sustained S]
//                     [--filter REGEX]
// --check-only skips the timings; --small also skips the 8192^3 GEMM check (sanitizer runs);
// --timings-only skips the prefill checks (and compiles only the timed variants); --trace also
// runs each timed shape through a build whose CTAs stamp their phases (bench/kernels/
// prefill_sm90_trace.cuh, pre-included into prefill_sm90.cuh) and says where the SMs' cycles go; --sustained S also times each shape's
// Hopper kernel over S seconds of back-to-back launches, where the GPU settles at its power cap
// (a timed call after an idle gap starts at a higher clock). --filter REGEX keeps the prefill
// checks and timings whose label matches (compiling only their variants) and skips the large GEMM.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <memory>
#include <random>
#include <regex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "astrai/runtime.hpp"
#include "bench_kernels.hpp"
#include "kernel_src/hopper_params.h"
#include "kernel_src/kernel_params.h"
#include "runtime/driver_api.hpp"
#include "runtime/families/prefill_launch.hpp"
#include "runtime/kernel_sources.hpp"
#include "runtime/nvrtc_compiler.hpp"
#include "runtime/tensor_map.hpp"
#include "sm90_check_support.hpp"
#include "tests/support/numerics.hpp"

namespace {

using namespace astrai::sm90_check;

// ---------------------------------------------------------------------------------------------
// GEMM

void gemm_case(CUfunction kernel, int m, int n, int k, CUstream stream, int reps, bool time_it,
               std::mt19937& rng) {
  const auto a_host = random_bits(static_cast<std::size_t>(m) * k, false, rng);
  const auto b_host = random_bits(static_cast<std::size_t>(n) * k, false, rng);
  Buffer a(a_host.size() * 2), b(b_host.size() * 2), c(static_cast<std::size_t>(m) * n * 2);
  a.upload(a_host);
  b.upload(b_host);
  c.poison();
  const CUtensorMap map_a = tensor_map(a.ptr(), false, {std::uint64_t(k), std::uint64_t(m)}, {std::uint64_t(k)}, 128);
  const CUtensorMap map_b = tensor_map(b.ptr(), false, {std::uint64_t(k), std::uint64_t(n)}, {std::uint64_t(k)}, 256);
  CUdeviceptr c_ptr = c.get();
  int mm = m, nn = n, kk = k;
  const Grid grid{static_cast<unsigned>((m / astrai::kGemmBlockM) * (n / astrai::kGemmBlockN))};
  const unsigned smem = astrai::kGemmSmemBytes;
  auto run = [&] {
    launch(kernel, grid, astrai::kGemmThreads, smem, stream,
           {const_cast<CUtensorMap*>(&map_a), const_cast<CUtensorMap*>(&map_b), &c_ptr, &mm, &nn, &kk});
  };
  run();
  check_cu(driver().cuStreamSynchronize(stream), "cuStreamSynchronize(gemm)", 0);
  const auto c_host = c.download<std::uint16_t>(static_cast<std::size_t>(m) * n);
  // Every element when small, else 4096 random ones plus the tile corners.
  const bool full = static_cast<long long>(m) * n <= (1 << 20);
  double worst = 0;
  bool finite = true;
  std::uniform_int_distribution<int> pick_m(0, m - 1), pick_n(0, n - 1);
  const long long samples = full ? static_cast<long long>(m) * n : 4096;
  for (long long i = 0; i < samples; ++i) {
    const int row = full ? static_cast<int>(i / n) : pick_m(rng);
    const int col = full ? static_cast<int>(i % n) : pick_n(rng);
    double want = 0;
    for (int x = 0; x < k; ++x)
      want += static_cast<double>(from_bits(a_host[static_cast<std::size_t>(row) * k + x], false)) *
              from_bits(b_host[static_cast<std::size_t>(col) * k + x], false);
    const float got = from_bits(c_host[static_cast<std::size_t>(row) * n + col], false);
    if (!std::isfinite(got)) finite = false;
    // bf16 output: relative rounding 2^-8 of the value, plus f32 accumulation error.
    worst = std::max(worst, std::fabs(got - want) / (std::fabs(want) * 0.0079 + 1e-3 * std::sqrt(k)));
  }
  expect(finite && worst <= 1.0, fmt::format("gemm {}x{}x{}: {} checked elements within bf16 rounding "
                                             "(worst {:.2f} of the bound)", m, n, k, samples, worst));
  if (!time_it) return;
  const double ms = time_ms(stream, reps, run);
  const double tflops = 2.0 * m * n * k / (ms * 1e-3) / 1e12;
  fmt::print("TIME gemm_bf16 {}x{}x{}: {:.3f} ms, {:.1f} TFLOP/s\n", m, n, k, ms, tflops);
}

// ---------------------------------------------------------------------------------------------
// Prefill

struct PrefillCase {
  int head_dim = 128;
  bool fp16 = false;
  int batch = 1;
  int q_len = 1;
  int kv_len = 1;
  int n_heads = 4;
  int n_kv_heads = 1;
  int causal_offset = -1;
  bool lse = true;
  int consumers = 0;  // consumer warpgroups; 0: the default of hopper_params.h
  int block_n = 0;    // 0: the default of hopper_params.h
  int page_size = 0;  // 0: contiguous KV
  bool shuffle_pages = true;  // paged: pages in random pool order (false: in order)
  bool persistent = false;    // a CTA an SM walking tiles (hopper_params.h: prefill_sm90_persistent)
  int warpgroups() const { return consumers ? consumers : astrai::prefill_sm90_consumers(head_dim); }
  int block_m() const { return astrai::prefill_sm90_block_m(warpgroups()); }
  int kv_block() const { return block_n ? block_n : astrai::prefill_sm90_block_n(head_dim, warpgroups()); }
  std::string kernel_name() const {
    return fmt::format("astrai::prefill_sm90_kernel<astrai::{}, {}, {}, {}, {}, {}{}>", fp16 ? "fp16_t" : "bf16_t",
                       head_dim, page_size, n_heads / n_kv_heads, warpgroups(), kv_block(),
                       persistent ? ", 0, true" : "");
  }
  std::string label() const {
    return fmt::format("hd{} {} B{} q{} kv{} h{}/{} causal{} wg{} bn{} ps{}{}{}", head_dim, fp16 ? "fp16" : "bf16",
                       batch, q_len, kv_len, n_heads, n_kv_heads, causal_offset, warpgroups(), kv_block(), page_size,
                       page_size > 0 && !shuffle_pages ? " in order" : "", persistent ? " persistent" : "");
  }
};

struct PrefillKernels {
  Module module;  // functions: one per entry of `names`, in its order
  std::vector<std::string> names;
  // Adds the kernel each case needs, once.
  void add(const std::vector<PrefillCase>& cases) {
    for (const auto& c : cases)
      if (std::find(names.begin(), names.end(), c.kernel_name()) == names.end()) names.push_back(c.kernel_name());
  }
  CUfunction find(const PrefillCase& c) const {
    const std::string want = c.kernel_name();
    for (std::size_t i = 0; i < names.size(); ++i)
      if (names[i] == want) return module.functions[i];
    throw std::runtime_error("no kernel " + want);
  }
};

// One request as the reference sees it: its query rows in q/out/lse, its KV gathered.
struct RequestRef {
  int q_start = 0;
  int q_len = 0;
  int kv_len = 0;
  bool causal = false;
  long long causal_base = 0;  // row i sits at KV position causal_base + i (may be negative)
  std::vector<std::uint16_t> k, v;  // [kv_len, n_kv_heads, head_dim]
};

struct PrefillData {
  int total_q = 0;
  int max_q_len = 0;
  int num_pages = 0;
  int max_pages = 0;
  std::vector<std::uint16_t> q;  // [total_q, n_heads, head_dim]
  std::vector<RequestRef> requests;
  std::unique_ptr<Buffer> dq, dk, dv, dout, dlse, dindptr, dseq_lens, dtable;
};

// Contiguous: q [batch, q_len, H, D], K/V [batch, kv_len, Hkv, D]. Paged: requests of ragged
// lengths (request b has q_len - 7b rows and kv_len - 5b tokens, at least 1 and 0), pages
// shuffled through the pool, the unused tail of each last page filled with NaN, and page-table
// entries past each request pointing outside the pool.
PrefillData make_prefill_data(const PrefillCase& c, std::mt19937& rng) {
  PrefillData d;
  const std::size_t row = static_cast<std::size_t>(c.n_kv_heads) * c.head_dim;  // one KV token
  for (int b = 0; b < c.batch; ++b) {
    RequestRef r;
    const bool paged = c.page_size > 0;
    r.q_len = paged ? std::max(1, c.q_len - 7 * b) : c.q_len;
    r.kv_len = paged ? std::max(0, c.kv_len - 5 * b) : c.kv_len;
    r.q_start = d.total_q;
    r.causal = c.causal_offset >= 0;
    r.causal_base = paged ? static_cast<long long>(r.kv_len) - r.q_len : c.causal_offset;
    r.k = random_bits(r.kv_len * row, c.fp16, rng);
    r.v = random_bits(r.kv_len * row, c.fp16, rng);
    d.total_q += r.q_len;
    d.max_q_len = std::max(d.max_q_len, r.q_len);
    d.requests.push_back(std::move(r));
  }
  d.q = random_bits(static_cast<std::size_t>(d.total_q) * c.n_heads * c.head_dim, c.fp16, rng);
  d.dq = std::make_unique<Buffer>(d.q.size() * 2);
  d.dq->upload(d.q);
  d.dout = std::make_unique<Buffer>(d.q.size() * 2);
  d.dlse = std::make_unique<Buffer>(static_cast<std::size_t>(d.total_q) * c.n_heads * 4);
  if (c.page_size == 0) {
    std::vector<std::uint16_t> k, v;
    for (const auto& r : d.requests) {
      k.insert(k.end(), r.k.begin(), r.k.end());
      v.insert(v.end(), r.v.begin(), r.v.end());
    }
    d.dk = std::make_unique<Buffer>(std::max<std::size_t>(k.size(), 1) * 2);
    d.dv = std::make_unique<Buffer>(std::max<std::size_t>(v.size(), 1) * 2);
    d.dk->upload(k);
    d.dv->upload(v);
    return d;
  }
  const int ps = c.page_size;
  for (const auto& r : d.requests) {
    d.num_pages += (r.kv_len + ps - 1) / ps;
    d.max_pages = std::max(d.max_pages, (r.kv_len + ps - 1) / ps);
  }
  d.num_pages = std::max(d.num_pages, 1);
  d.max_pages += 2;  // table entries past the end of every request
  std::vector<int> order(d.num_pages);
  for (int i = 0; i < d.num_pages; ++i) order[i] = i;
  if (c.shuffle_pages) std::shuffle(order.begin(), order.end(), rng);
  const std::size_t page_elems = static_cast<std::size_t>(ps) * row;
  std::vector<std::uint16_t> k_cache(d.num_pages * page_elems, 0xffff), v_cache(d.num_pages * page_elems, 0xffff);
  std::vector<int> table(static_cast<std::size_t>(c.batch) * d.max_pages, d.num_pages + 1000);
  std::vector<int> indptr(1, 0), seq_lens;
  int next = 0;
  for (int b = 0; b < c.batch; ++b) {
    const auto& r = d.requests[b];
    for (int t = 0; t < r.kv_len; ++t) {
      if (t % ps == 0) table[static_cast<std::size_t>(b) * d.max_pages + t / ps] = order[next++];
      const std::size_t at = table[static_cast<std::size_t>(b) * d.max_pages + t / ps] * page_elems + (t % ps) * row;
      std::copy(r.k.begin() + t * row, r.k.begin() + (t + 1) * row, k_cache.begin() + at);
      std::copy(r.v.begin() + t * row, r.v.begin() + (t + 1) * row, v_cache.begin() + at);
    }
    indptr.push_back(r.q_start + r.q_len);
    seq_lens.push_back(r.kv_len);
  }
  d.dk = std::make_unique<Buffer>(k_cache.size() * 2);
  d.dv = std::make_unique<Buffer>(v_cache.size() * 2);
  d.dk->upload(k_cache);
  d.dv->upload(v_cache);
  d.dindptr = std::make_unique<Buffer>(indptr.size() * 4);
  d.dseq_lens = std::make_unique<Buffer>(seq_lens.size() * 4);
  d.dtable = std::make_unique<Buffer>(table.size() * 4);
  d.dindptr->upload(indptr);
  d.dseq_lens->upload(seq_lens);
  d.dtable->upload(table);
  return d;
}

// The current device's SMs (persistent launches hold a CTA each).
int sm_count() {
  static const int count = [] {
    CUdevice device = 0;
    int sms = 0;
    check_cu(driver().cuCtxGetDevice(&device), "cuCtxGetDevice", 0);
    check_cu(driver().cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device),
             "cuDeviceGetAttribute(MULTIPROCESSOR_COUNT)", 0);
    return sms;
  }();
  return count;
}

void run_sm90_prefill(const PrefillKernels& kernels, const PrefillCase& c, PrefillData& d, CUstream stream) {
  astrai::PrefillParams p{};
  const long long q_row = static_cast<long long>(c.n_heads) * c.head_dim;
  const long long kv_row = static_cast<long long>(c.n_kv_heads) * c.head_dim;
  p.q = d.dq->ptr();
  p.q_stride_seq = p.out_stride_seq = q_row;
  p.q_stride_head = p.out_stride_head = c.head_dim;
  p.k = d.dk->ptr();
  p.v = d.dv->ptr();
  p.k_stride_seq = p.v_stride_seq = kv_row;
  p.k_stride_head = p.v_stride_head = c.head_dim;
  p.out = d.dout->ptr();
  p.lse = c.lse ? static_cast<float*>(d.dlse->ptr()) : nullptr;
  p.batch = c.batch;
  p.n_heads = c.n_heads;
  p.n_kv_heads = c.n_kv_heads;
  p.causal_offset = c.causal_offset;
  p.scale_log2 = static_cast<float>(1.0 / std::sqrt(c.head_dim) * 1.4426950408889634);
  const int block_n = c.kv_block();
  if (c.page_size == 0) {
    p.q_stride_batch = p.out_stride_batch = q_row * c.q_len;
    // A zero-length KV still gets a positive batch stride (TMA needs one; nothing is loaded).
    p.k_stride_batch = p.v_stride_batch = kv_row * std::max(c.kv_len, 1);
    p.q_len = c.q_len;
    p.kv_len = c.kv_len;
  } else {
    p.k_stride_page = p.v_stride_page = kv_row * c.page_size;
    p.qo_indptr = static_cast<const int*>(d.dindptr->ptr());
    p.seq_lens = static_cast<const int*>(d.dseq_lens->ptr());
    p.page_table = static_cast<const int*>(d.dtable->ptr());
    p.page_table_stride = d.max_pages;
    p.page_table_rows = c.batch;  // request b reads row b (no req_indices)
    p.total_q = d.total_q;
    p.num_pages = d.num_pages;
    p.max_pages_per_seq = d.max_pages;
    p.causal_offset = c.causal_offset < 0 ? -1 : 0;
  }
  // The runtime's own views and grid (packed GQA among them), for this case's tiling.
  const astrai::detail::PrefillMaps shapes =
      astrai::detail::prefill_map_shapes(p, c.head_dim, c.page_size, c.warpgroups(), block_n);
  CUtensorMap map_q = encode(shapes.q, c.fp16);
  CUtensorMap map_k = encode(shapes.k, c.fp16);
  CUtensorMap map_v = encode(shapes.v, c.fp16);
  const astrai::detail::GridSize size = astrai::detail::prefill_sm90_grid(p, d.max_q_len, c.warpgroups());
  Grid grid{size.x, size.y, size.z};
  p.tile_order = astrai::prefill_tile_order(size.x, size.y, size.z);
  if (c.persistent) {  // a CTA an SM, each walking tiles of the grid above
    const long long tiles = static_cast<long long>(size.x) * size.y * size.z;
    grid = {static_cast<unsigned>(std::min<long long>(tiles, sm_count())), 1, 1};
  }
  const int wg = c.warpgroups();
  launch(kernels.find(c), grid, astrai::prefill_sm90_threads(wg),
         static_cast<unsigned>(astrai::prefill_sm90_smem_bytes(c.head_dim, wg, block_n, c.persistent)), stream,
         {&p, &map_q, &map_k, &map_v});
}

void run_portable_prefill(const PrefillCase& c, PrefillData& d, CUstream stream) {
  const auto dtype = c.fp16 ? astrai::DType::fp16 : astrai::DType::bf16;
  if (c.page_size == 0) {
    astrai::PrefillArgs args;
    args.dtype = dtype;
    args.batch = c.batch;
    args.q_len = c.q_len;
    args.kv_len = c.kv_len;
    args.n_heads = c.n_heads;
    args.n_kv_heads = c.n_kv_heads;
    args.head_dim = c.head_dim;
    args.causal_offset = c.causal_offset;
    args.q = d.dq->ptr();
    args.k = d.dk->ptr();
    args.v = d.dv->ptr();
    args.out = d.dout->ptr();
    args.stream = stream;
    astrai::Runtime::get().prefill(args);
    return;
  }
  astrai::PagedPrefillArgs args;
  args.dtype = dtype;
  args.batch = c.batch;
  args.total_q = d.total_q;
  args.max_q_len = d.max_q_len;
  args.n_heads = c.n_heads;
  args.n_kv_heads = c.n_kv_heads;
  args.head_dim = c.head_dim;
  args.page_size = c.page_size;
  args.num_pages = d.num_pages;
  args.max_pages_per_seq = d.max_pages;
  args.causal = c.causal_offset >= 0;
  args.q = d.dq->ptr();
  args.qo_indptr = static_cast<const std::int32_t*>(d.dindptr->ptr());
  args.k_cache = d.dk->ptr();
  args.v_cache = d.dv->ptr();
  args.page_table = static_cast<const std::int32_t*>(d.dtable->ptr());
  args.seq_lens = static_cast<const std::int32_t*>(d.dseq_lens->ptr());
  args.out = d.dout->ptr();
  args.stream = stream;
  astrai::Runtime::get().paged_prefill(args);
}

void check_prefill(const PrefillKernels& kernels, const PrefillCase& c, CUstream stream, std::mt19937& rng) {
  PrefillData d = make_prefill_data(c, rng);
  d.dout->poison();
  d.dlse->poison();
  run_sm90_prefill(kernels, c, d, stream);
  check_cu(driver().cuStreamSynchronize(stream), "cuStreamSynchronize(prefill_sm90)", 0);
  const auto out = d.dout->download<std::uint16_t>(d.q.size());
  const auto lse = d.dlse->download<float>(static_cast<std::size_t>(d.total_q) * c.n_heads);
  const int group = c.n_heads / c.n_kv_heads;
  const double scale = 1.0 / std::sqrt(c.head_dim);
  // Every row and LSE apart, bounds by dtype (tests/support/numerics: relative norm a row).
  const astrai::DType dtype = c.fp16 ? astrai::DType::fp16 : astrai::DType::bf16;
  astrai::testing::RowCheck check(astrai::testing::attention_tolerance(dtype));
  std::vector<double> acc(c.head_dim);
  std::vector<float> got(c.head_dim);
  for (const auto& r : d.requests) {
    std::vector<double> scores(r.kv_len);
    for (int i = 0; i < r.q_len; ++i)
      for (int h = 0; h < c.n_heads; ++h) {
        const int kvh = h / group;
        const long long stop = !r.causal ? r.kv_len : std::clamp<long long>(r.causal_base + i + 1, 0, r.kv_len);
        const std::size_t q_at = ((static_cast<std::size_t>(r.q_start) + i) * c.n_heads + h) * c.head_dim;
        double max_score = -INFINITY;
        for (long long j = 0; j < stop; ++j) {
          const std::size_t k_at = (static_cast<std::size_t>(j) * c.n_kv_heads + kvh) * c.head_dim;
          double dot = 0;
          for (int x = 0; x < c.head_dim; ++x)
            dot += static_cast<double>(from_bits(d.q[q_at + x], c.fp16)) * from_bits(r.k[k_at + x], c.fp16);
          scores[j] = dot * scale;
          max_score = std::max(max_score, scores[j]);
        }
        std::fill(acc.begin(), acc.end(), 0.0);
        double sum = 0;
        for (long long j = 0; j < stop; ++j) {
          const double w = std::exp(scores[j] - max_score);
          sum += w;
          const std::size_t v_at = (static_cast<std::size_t>(j) * c.n_kv_heads + kvh) * c.head_dim;
          for (int x = 0; x < c.head_dim; ++x) acc[x] += w * from_bits(r.v[v_at + x], c.fp16);
        }
        for (int x = 0; x < c.head_dim; ++x) {
          acc[x] = stop > 0 ? acc[x] / sum : 0.0;
          got[x] = from_bits(out[q_at + x], c.fp16);
        }
        const auto where = [&] { return fmt::format("row {} head {}", r.q_start + i, h); };
        check.row(got.data(), acc.data(), c.head_dim, stop > 0, where);
        check.lse(lse[(static_cast<std::size_t>(r.q_start) + i) * c.n_heads + h],
                  stop > 0 ? max_score + std::log(sum) : -INFINITY, where);
      }
  }
  expect(check.passed(), fmt::format("prefill_sm90 {}: {}{}", c.label(), check.summary(),
                                     check.passed() ? "" : "; " + check.first_failure()));
}

// Mean time a call over `seconds` of back-to-back calls (batches of 20, synchronized between).
template <typename Body> double sustained_ms(CUstream stream, double seconds, Body&& body) {
  body();
  check_cu(driver().cuStreamSynchronize(stream), "cuStreamSynchronize", 0);
  const auto start = std::chrono::steady_clock::now();
  long calls = 0;
  double elapsed = 0;
  do {
    for (int i = 0; i < 20; ++i) body();
    check_cu(driver().cuStreamSynchronize(stream), "cuStreamSynchronize", 0);
    calls += 20;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  } while (elapsed < seconds);
  return elapsed * 1e3 / static_cast<double>(calls);
}

void time_prefill(const PrefillKernels& kernels, const PrefillCase& c, CUstream stream, int reps,
                  double sustained_seconds, std::mt19937& rng) {
  PrefillData d = make_prefill_data(c, rng);
  double flops = 0;
  for (const auto& r : d.requests)
    flops += 4.0 * c.n_heads * static_cast<double>(r.q_len) * r.kv_len * c.head_dim *
             (c.causal_offset >= 0 ? 0.5 : 1.0);
  const double sm90_ms = time_ms(stream, reps, [&] { run_sm90_prefill(kernels, c, d, stream); });
  const double portable_ms = time_ms(stream, reps, [&] { run_portable_prefill(c, d, stream); });
  fmt::print("TIME prefill {}: sm90 {:.3f} ms {:.1f} TFLOP/s | portable {:.3f} ms {:.1f} TFLOP/s | {:.2f}x\n",
             c.label(), sm90_ms, flops / (sm90_ms * 1e-3) / 1e12, portable_ms,
             flops / (portable_ms * 1e-3) / 1e12, portable_ms / sm90_ms);
  if (sustained_seconds <= 0) return;
  const double ms = sustained_ms(stream, sustained_seconds, [&] { run_sm90_prefill(kernels, c, d, stream); });
  fmt::print("SUSTAINED prefill {}: sm90 {:.3f} ms {:.1f} TFLOP/s over {:g} s\n", c.label(), ms,
             flops / (ms * 1e-3) / 1e12, sustained_seconds);
}

// CTAs the traced build stamps (grid order; the timed shapes launch at most 4096).
constexpr int kTracedCtas = 8192;

// One run of `c` through the traced build: per SM, its CTAs in start order, the cycles between
// one's last store and the next one's start (gap), from the start to Q and the first K block
// arriving (load), the first block's S and softmax (first), the walk (loop) and from the last
// P V to the last consumer's stores (tail), as shares of the SMs' busy spans and as per-CTA means.
void trace_prefill(const PrefillKernels& traced, const PrefillCase& c, CUstream stream, int clock_khz,
                   std::mt19937& rng) {
  PrefillData d = make_prefill_data(c, rng);
  CUdeviceptr stamps = 0;
  std::size_t bytes = 0;
  check_cu(driver().cuModuleGetGlobal(&stamps, &bytes, traced.module.module, "astrai_prefill_trace"),
           "cuModuleGetGlobal(astrai_prefill_trace)", 0);
  run_sm90_prefill(traced, c, d, stream);  // warm-up
  const double kernel_ms = time_ms(stream, 5, [&] { run_sm90_prefill(traced, c, d, stream); });
  check_cu(driver().cuMemsetD8(stamps, 0, bytes), "cuMemsetD8", 0);
  run_sm90_prefill(traced, c, d, stream);
  check_cu(driver().cuStreamSynchronize(stream), "cuStreamSynchronize(trace)", 0);
  std::vector<std::uint64_t> raw(bytes / 8);
  check_cu(driver().cuMemcpyDtoH(raw.data(), stamps, bytes), "cuMemcpyDtoH", 0);
  struct Cta {
    std::uint64_t start, arrived, first, last_pv, end;
  };
  std::vector<std::vector<Cta>> by_sm;
  long long ctas = 0;
  // The load phase's steps (slots 8-13 of bench/kernels/prefill_sm90_trace.cuh), cycles after the CTA's start.
  double placed = 0, barriers = 0, q_issued = 0, k_issued = 0, ready = 0, q_arrived = 0;
  constexpr std::size_t kSlots = 14;
  for (std::size_t i = 0; i + kSlots <= raw.size(); i += kSlots) {
    const std::uint64_t* s = &raw[i];
    const std::uint64_t end = std::max({s[4], s[5], s[6]});
    if (s[0] == 0 || s[1] == 0 || end == 0) continue;  // not launched, or a tile with no rows
    const std::size_t sm = s[7];
    if (by_sm.size() <= sm) by_sm.resize(sm + 1);
    by_sm[sm].push_back({s[0], s[1], s[2], s[3], end});
    auto after_start = [&](int slot) { return static_cast<double>(s[slot]) - static_cast<double>(s[0]); };
    placed += after_start(12);
    barriers += after_start(13);
    q_issued += after_start(8);
    k_issued += after_start(9);
    ready += after_start(10);
    q_arrived += after_start(11);
    ++ctas;
  }
  double span = 0, gap = 0, load = 0, first = 0, loop = 0, tail = 0, longest = 0;
  int sms = 0, most = 0, fewest = 1 << 30;
  for (auto& list : by_sm) {
    if (list.empty()) continue;
    std::sort(list.begin(), list.end(), [](const Cta& a, const Cta& b) { return a.start < b.start; });
    ++sms;
    most = std::max<int>(most, list.size());
    fewest = std::min<int>(fewest, list.size());
    const double sm_span = static_cast<double>(list.back().end - list.front().start);
    span += sm_span;
    longest = std::max(longest, sm_span);
    for (std::size_t i = 0; i < list.size(); ++i) {
      const Cta& x = list[i];
      if (i > 0 && x.start > list[i - 1].end) gap += static_cast<double>(x.start - list[i - 1].end);
      load += static_cast<double>(x.arrived - x.start);
      first += static_cast<double>(x.first - x.arrived);
      loop += static_cast<double>(x.last_pv - x.first);
      tail += static_cast<double>(x.end - x.last_pv);
    }
  }
  if (ctas == 0) {
    expect(false, "trace " + c.label() + ": no CTA stamped");
    return;
  }
  auto share = [&](double part) { return 100.0 * part / span; };
  auto per_cta = [&](double part) { return part / static_cast<double>(ctas); };
  // The SMs' spans in their own cycles over the kernel's time: about the clock they ran at (under
  // a power cap, below the rated one).
  fmt::print("TRACE prefill {}: {} CTAs on {} SMs ({}..{} each); kernel {:.3f} ms; SM span mean {:.0f} "
             "cycles (longest {:.0f}): about {:.0f} MHz against the rated {} MHz\n",
             c.label(), ctas, sms, fewest, most, kernel_ms, span / sms, longest, span / sms / (kernel_ms * 1e3),
             clock_khz / 1000);
  fmt::print("TRACE   share of SM spans: gap {:.1f}%, load {:.1f}%, first {:.1f}%, loop {:.1f}%, tail {:.1f}%\n",
             share(gap), share(load), share(first), share(loop), share(tail));
  fmt::print("TRACE   per CTA (cycles): gap {:.0f}, load {:.0f}, first {:.0f}, loop {:.0f}, tail {:.0f}\n",
             gap / std::max<double>(1, ctas - sms), per_cta(load), per_cta(first), per_cta(loop), per_cta(tail));
  fmt::print("TRACE   load steps (cycles after the start): tile placed {:.0f}, barriers set up {:.0f}, Q issued "
             "{:.0f}, first K issued {:.0f}, consumer 0 ready {:.0f}, Q arrived {:.0f}, first K arrived {:.0f}\n",
             per_cta(placed), per_cta(barriers), per_cta(q_issued), per_cta(k_issued), per_cta(ready),
             per_cta(q_arrived), per_cta(load));
}

}  // namespace

int main(int argc, char** argv) {
  bool check_only = false;
  bool small = false;
  bool timings_only = false;
  bool trace = false;
  int reps = 20;
  double sustained_seconds = 0;
  std::string filter;  // keeps the prefill cases whose label matches (and skips the large GEMM)
  std::regex keep;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--check-only") check_only = true;
    else if (arg == "--small") check_only = small = true;
    else if (arg == "--timings-only") timings_only = true;
    else if (arg == "--trace") trace = true;
    else if (arg == "--reps" && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
    else if (arg == "--sustained" && i + 1 < argc) sustained_seconds = std::max(0.0, std::atof(argv[++i]));
    else if (arg == "--filter" && i + 1 < argc) {
      filter = argv[++i];
      try {
        keep = std::regex(filter);
      } catch (const std::regex_error& e) {
        fmt::print(stderr, "astrai-sm90-check: --filter '{}' is not a regular expression: {}\n", filter, e.what());
        return 2;
      }
    } else {
      fmt::print(stderr, "astrai-sm90-check: unknown argument '{}' (allowed: --check-only, --small, --timings-only, "
                 "--trace, --reps N, --sustained SECONDS, --filter REGEX)\n", arg);
      return 2;
    }
  }
  try {
    const auto& api = driver();
    CUdevice device;
    check_cu(api.cuDeviceGet(&device, 0), "cuDeviceGet", 0);
    int major = 0, minor = 0;
    api.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device);
    api.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device);
    if (major != 9 || minor != 0) {
      fmt::print("astrai-sm90-check: needs a compute capability 9.0 GPU (found {}.{})\n", major, minor);
      return 0;
    }
    CUcontext context;
    check_cu(api.cuDevicePrimaryCtxRetain(&context, device), "cuDevicePrimaryCtxRetain", 0);
    check_cu(api.cuCtxSetCurrent(context), "cuCtxSetCurrent", 0);
    CUstream stream;
    check_cu(api.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate", 0);
    // The data's seed: ASTRAI_TEST_SEED mixed in when set (printed, so that a run repeats).
    const unsigned seed = astrai::testing::test_seed(20261130);
    fmt::print("seed {} (ASTRAI_TEST_SEED={})\n", seed, astrai::testing::base_seed());
    std::mt19937 rng(seed);

    Module gemm;
    compile(&gemm, astrai::bench::bench_compile_request("hopper_gemm.cuh", "sm_90a", {"astrai_gemm_bf16_sm90"}),
            "gemm_bf16_sm90");
    gemm_case(gemm.functions[0], 256, 512, 192, stream, reps, false, rng);
    if (!small && filter.empty()) gemm_case(gemm.functions[0], 8192, 8192, 8192, stream, reps, !check_only, rng);

    // Every check and timing case, then one program holding every kernel they need.
    std::vector<PrefillCase> checks, timings;
    // Other tilings (head dim, consumer warpgroups, KV block), checked and timed beside the defaults.
    const std::vector<std::tuple<int, int, int>> alternatives = {
        {64, 2, 192}, {128, 3, 80}, {256, 2, 64}};
    const int lens[][3] = {{1, 1, -1}, {63, 65, -1}, {128, 128, 0}, {129, 300, 171}, {200, 257, -1},
                           {64, 0, -1}, {300, 129, 0}};
    for (bool fp16 : {false, true})
      for (int head_dim : {64, 128, 256})
        for (const auto& len : lens) {
          PrefillCase c;
          c.head_dim = head_dim;
          c.fp16 = fp16;
          c.batch = 2;
          c.q_len = len[0];
          c.kv_len = len[1];
          c.causal_offset = len[2];
          c.n_kv_heads = (len[0] % 2) ? 4 : 1;
          checks.push_back(c);
          for (const auto& [alt_head_dim, consumers, block_n] : alternatives)
            if (alt_head_dim == head_dim && !fp16 && c.n_kv_heads == 1) {
              c.consumers = consumers;
              c.block_n = block_n;
              checks.push_back(c);
            }
          c.consumers = c.block_n = 0;
        }
    // Paged: ragged requests, pages of 8 to 256 tokens, NaN past each request's last token.
    const int paged_lens[][3] = {{1, 1, 0}, {63, 65, -1}, {129, 300, 0}, {200, 257, -1}, {64, 3, 0}, {17, 700, 0}};
    for (const auto& [head_dim, fp16, page_size] :
         std::vector<std::tuple<int, bool, int>>{{128, false, 16}, {128, false, 8}, {128, false, 32}, {128, true, 256},
                                                 {64, false, 16}, {64, true, 64}, {256, false, 16}, {256, true, 128}})
      for (const auto& len : paged_lens) {
        PrefillCase c;
        c.head_dim = head_dim;
        c.fp16 = fp16;
        c.page_size = page_size;
        c.batch = 3;
        c.q_len = len[0];
        c.kv_len = len[1];
        c.causal_offset = len[2];
        c.n_kv_heads = (len[0] % 2) ? 4 : 1;
        checks.push_back(c);
      }
    // The headline shapes, then two that isolate costs of hd128 non-causal's: 128 tiles of 171
    // blocks (one wave, each tile's prologue and epilogue spread thin) and 1056 tiles (8 waves
    // exactly, where B4 x 4096 fills 31.03). Each also with its head dim's other tiling: a
    // 192-row tiling leaves small grids emptier (96 tiles instead of 128 in the first).
    for (const auto& [head_dim, batch, q_len, kv_len, causal, page_size] :
         std::vector<std::tuple<int, int, int, int, bool, int>>{{128, 4, 4096, 4096, false, 0},
                                                                {128, 2, 8192, 8192, true, 0},
                                                                {64, 2, 8192, 8192, true, 0},
                                                                {256, 2, 8192, 8192, true, 0},
                                                                {128, 2, 8192, 8192, true, 16},
                                                                {128, 1, 512, 32768, false, 0},
                                                                {128, 1, 4224, 4096, false, 0},
                                                                // Where the wide hd128 tiles start to win:
                                                                // 2.7, 5.3, 10.4 and 15.5 waves of them.
                                                                {128, 1, 2048, 2048, false, 0},
                                                                {128, 1, 4096, 4096, false, 0},
                                                                {128, 1, 8192, 8192, false, 0},
                                                                {128, 1, 12288, 12288, true, 0},
                                                                // Short causal prompts: a tile's
                                                                // diagonal block is much of its walk.
                                                                {128, 16, 1024, 1024, true, 0}}) {
      PrefillCase c;
      c.head_dim = head_dim;
      c.batch = batch;
      c.q_len = q_len;
      c.kv_len = kv_len;
      c.n_heads = 32;
      c.n_kv_heads = 8;
      c.causal_offset = causal ? 0 : -1;
      c.page_size = page_size;
      c.lse = false;
      timings.push_back(c);
      for (const auto& [alt_head_dim, consumers, block_n] : alternatives)
        if (alt_head_dim == head_dim) {
          c.consumers = consumers;
          c.block_n = block_n;
          timings.push_back(c);
        }
      c.consumers = c.block_n = 0;
      if (page_size > 0) {  // what page order costs: the same pool, pages in order
        c.shuffle_pages = false;
        timings.push_back(c);
      }
    }
    // AstrAI's own heads (hd64, 24/4: a group of 6) on short causal prompts, where a tile walks few
    // blocks: the default tiling, then smaller KV blocks and two consumers (consumers, KV block).
    {
      PrefillCase c;
      c.head_dim = 64;
      c.batch = 16;
      c.q_len = c.kv_len = 1024;
      c.n_heads = 24;
      c.n_kv_heads = 4;
      c.causal_offset = 0;
      c.lse = false;
      timings.push_back(c);
      for (const auto& [consumers, block_n] : std::vector<std::pair<int, int>>{{3, 64}, {2, 192}, {2, 128}, {2, 64}}) {
        c.consumers = consumers;
        c.block_n = block_n;
        timings.push_back(c);
      }
    }
    // Persistent CTAs (three consumers, a CTA an SM walking tiles): grids of more tiles than SMs,
    // so that CTAs walk several (both ends of the rows of tiles), ragged lengths, a group of 1, an
    // empty KV; then the timed rows where tiles walk few blocks, and three long ones.
    for (const auto& [head_dim, batch, q_len, kv_len, causal_offset, heads, kv_heads] :
         std::vector<std::tuple<int, int, int, int, int, int, int>>{{64, 40, 200, 200, 0, 8, 2},
                                                                    {64, 8, 300, 300, 0, 24, 4},
                                                                    {128, 40, 200, 260, 60, 8, 2},
                                                                    {128, 60, 130, 300, -1, 4, 1},
                                                                    {128, 50, 129, 129, 0, 8, 8},
                                                                    {64, 200, 64, 0, -1, 4, 1}}) {
      PrefillCase c;
      c.head_dim = head_dim;
      c.consumers = 3;
      c.persistent = true;
      c.batch = batch;
      c.q_len = q_len;
      c.kv_len = kv_len;
      c.causal_offset = causal_offset;
      c.n_heads = heads;
      c.n_kv_heads = kv_heads;
      checks.push_back(c);
    }
    for (const auto& [head_dim, batch, length, causal, heads, kv_heads] :
         std::vector<std::tuple<int, int, int, bool, int, int>>{{64, 16, 1024, true, 24, 4},
                                                                {128, 16, 1024, true, 32, 8},
                                                                {128, 2, 8192, true, 32, 8},
                                                                {64, 2, 8192, true, 32, 8},
                                                                {128, 4, 4096, false, 32, 8}}) {
      PrefillCase c;
      c.head_dim = head_dim;
      c.consumers = 3;
      c.persistent = true;
      c.batch = batch;
      c.q_len = c.kv_len = length;
      c.causal_offset = causal ? 0 : -1;
      c.n_heads = heads;
      c.n_kv_heads = kv_heads;
      c.lse = false;
      timings.push_back(c);
    }
    // --filter: only the cases whose label matches, compiled alone (a device call spends its time
    // on one experiment, not on every variant's NVRTC compile).
    if (!filter.empty()) {
      auto unmatched = [&](const PrefillCase& c) { return !std::regex_search(c.label(), keep); };
      checks.erase(std::remove_if(checks.begin(), checks.end(), unmatched), checks.end());
      timings.erase(std::remove_if(timings.begin(), timings.end(), unmatched), timings.end());
    }
    PrefillKernels prefill;
    if (timings_only) checks.clear();
    if (!filter.empty() && checks.empty() && (check_only || timings.empty())) {
      fmt::print(stderr, "astrai-sm90-check: --filter '{}' leaves no prefill case to run\n", filter);
      return 2;
    }
    prefill.add(checks);
    prefill.add(timings);
    // One program per variant, as the runtime compiles them: the per-variant compile time.
    if (timings.size() > 1) {
      Module probe;
      compile(&probe, library_request("prefill_sm90.cuh", {timings[1].kernel_name()}),
              timings[1].kernel_name() + " (alone)");
    }
    compile(&prefill.module, library_request("prefill_sm90.cuh", prefill.names),
            fmt::format("prefill_sm90 ({} variants)", prefill.names.size()));
    for (const auto& c : checks) check_prefill(prefill, c, stream, rng);
    if (!check_only)
      for (const auto& c : timings) time_prefill(prefill, c, stream, reps, sustained_seconds, rng);
    // Persistent CTAs are not traced: the stamps are a CTA's, and theirs walk many tiles.
    std::vector<PrefillCase> traceable;
    std::copy_if(timings.begin(), timings.end(), std::back_inserter(traceable),
                 [](const PrefillCase& c) { return !c.persistent; });
    if (trace && !check_only && !traceable.empty()) {
      PrefillKernels traced;
      traced.add(traceable);
      astrai::detail::CompileRequest request = library_request("prefill_sm90.cuh", traced.names);
      astrai::bench::add_prefill_trace(&request, kTracedCtas);
      compile(&traced.module, request, "prefill_sm90 traced");
      int clock_khz = 0;
      check_cu(api.cuDeviceGetAttribute(&clock_khz, CU_DEVICE_ATTRIBUTE_CLOCK_RATE, device), "cuDeviceGetAttribute", 0);
      for (const auto& c : traceable) trace_prefill(traced, c, stream, clock_khz, rng);
    }
    api.cuStreamDestroy(stream);
  } catch (const std::exception& error) {
    fmt::print("astrai-sm90-check: {}\n", error.what());
    return 1;
  }
  fmt::print("{} failure(s)\n", g_failures);
  return g_failures == 0 ? 0 : 1;
}
