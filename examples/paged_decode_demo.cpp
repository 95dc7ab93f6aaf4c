// astrai-demo: one paged_decode call on random data (Llama-3-8B shape), checked against a
// float64 CPU reference. Exit 0: matches; 1: mismatch or error; 77: no GPU here.
#include <astrai/runtime.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "runtime/driver_api.hpp"

namespace {

using astrai::detail::check_cu;
using astrai::detail::driver;

std::uint16_t to_bf16(float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, 4);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>(bits >> 16);
}

float from_bf16(std::uint16_t bits) {
  const std::uint32_t wide = static_cast<std::uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, 4);
  return value;
}

template <typename T> CUdeviceptr upload(const std::vector<T>& host) {
  CUdeviceptr pointer = 0;
  check_cu(driver().cuMemAlloc(&pointer, host.size() * sizeof(T)), "cuMemAlloc", 0);
  check_cu(driver().cuMemcpyHtoD(pointer, host.data(), host.size() * sizeof(T)), "cuMemcpyHtoD", 0);
  return pointer;
}

int run() {
  const auto& api = driver();
  CUdevice device;
  CUcontext context;
  check_cu(api.cuDeviceGet(&device, 0), "cuDeviceGet", 0);
  check_cu(api.cuDevicePrimaryCtxRetain(&context, device), "cuDevicePrimaryCtxRetain", 0);
  check_cu(api.cuCtxSetCurrent(context), "cuCtxSetCurrent", 0);

  const int batch = 8, n_heads = 32, n_kv_heads = 8, head_dim = 128, page_size = 16;
  const int max_pages = 128;  // up to 2048 tokens per sequence
  std::mt19937 rng(2026);
  std::vector<std::int32_t> lens(batch);
  for (auto& len : lens) len = 1 + static_cast<int>(rng() % (max_pages * page_size));
  const int num_pages = batch * max_pages;
  std::vector<std::int32_t> pages(num_pages);
  std::iota(pages.begin(), pages.end(), 0);
  std::shuffle(pages.begin(), pages.end(), rng);
  std::vector<std::int32_t> table(pages.begin(), pages.end());  // row b: a shuffled set of pages
  const std::size_t token_elems = static_cast<std::size_t>(n_kv_heads) * head_dim;
  const std::size_t pool_elems = static_cast<std::size_t>(num_pages) * page_size * token_elems;
  std::uniform_real_distribution<float> uniform(-1.f, 1.f);
  auto random_bf16 = [&](std::size_t n) {
    std::vector<std::uint16_t> values(n);
    for (auto& value : values) value = to_bf16(uniform(rng));
    return values;
  };
  const auto k = random_bf16(pool_elems), v = random_bf16(pool_elems);
  const auto q = random_bf16(static_cast<std::size_t>(batch) * n_heads * head_dim);
  std::vector<std::uint16_t> out(q.size(), 0xffff);

  const CUdeviceptr d_k = upload(k), d_v = upload(v), d_q = upload(q), d_out = upload(out);
  const CUdeviceptr d_table = upload(table), d_lens = upload(lens);
  astrai::PagedDecodeArgs args;
  args.batch = batch;
  args.n_heads = n_heads;
  args.n_kv_heads = n_kv_heads;
  args.head_dim = head_dim;
  args.page_size = page_size;
  args.num_pages = num_pages;
  args.max_pages_per_seq = max_pages;
  args.q = reinterpret_cast<const void*>(d_q);
  args.k_cache = reinterpret_cast<const void*>(d_k);
  args.v_cache = reinterpret_cast<const void*>(d_v);
  args.page_table = reinterpret_cast<const std::int32_t*>(d_table);
  args.seq_lens = reinterpret_cast<const std::int32_t*>(d_lens);
  args.out = reinterpret_cast<void*>(d_out);

  const auto start = std::chrono::steady_clock::now();
  astrai::Runtime::get().paged_decode(args);
  check_cu(api.cuCtxSynchronize(), "cuCtxSynchronize", 0);
  const double first_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  check_cu(api.cuMemcpyDtoH(out.data(), d_out, out.size() * 2), "cuMemcpyDtoH", 0);

  double max_error = 0;
  bool ok = true;
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  const int group = n_heads / n_kv_heads;
  std::vector<double> w;
  for (int b = 0; b < batch; ++b)
    for (int h = 0; h < n_heads; ++h) {
      w.assign(lens[b], 0.0);
      double max_score = -INFINITY;
      auto row = [&](int t) {
        return (static_cast<std::size_t>(table[b * max_pages + t / page_size]) * page_size + t % page_size) *
                   token_elems + static_cast<std::size_t>(h / group) * head_dim;
      };
      for (int t = 0; t < lens[b]; ++t) {
        double dot = 0;
        for (int i = 0; i < head_dim; ++i)
          dot += static_cast<double>(from_bf16(q[(b * n_heads + h) * head_dim + i])) * from_bf16(k[row(t) + i]);
        w[t] = dot * scale;
        max_score = std::max(max_score, w[t]);
      }
      double total = 0;
      for (double& x : w) total += (x = std::exp(x - max_score));
      for (int i = 0; i < head_dim; ++i) {
        double want = 0;
        for (int t = 0; t < lens[b]; ++t) want += w[t] * from_bf16(v[row(t) + i]);
        want /= total;
        const double got = from_bf16(out[(b * n_heads + h) * head_dim + i]);
        const double error = std::fabs(got - want);
        max_error = std::max(max_error, error);
        if (!(error <= 1e-2 + 1e-2 * std::fabs(want))) ok = false;
      }
    }
  const auto names = astrai::Runtime::get().loaded_variants();
  std::printf("paged_decode demo: %s, batch %d, lengths up to %d, first call %.1f ms (JIT or cache "
              "load included), max |error| vs float64 reference %.2e: %s\n",
              names.empty() ? "?" : names.front().c_str(), batch, max_pages * page_size, first_ms,
              max_error, ok ? "OK" : "MISMATCH");
  for (CUdeviceptr pointer : {d_k, d_v, d_q, d_out, d_table, d_lens}) api.cuMemFree(pointer);
  return ok ? 0 : 1;
}

}  // namespace

int main() {
  std::string why;
  if (!astrai::detail::driver_available(&why)) {
    std::printf("astrai-demo: no GPU here (%s); skipped\n", why.c_str());
    return 77;
  }
  try {
    return run();
  } catch (const std::exception& error) {
    std::fprintf(stderr, "astrai-demo: %s\n", error.what());
    return 1;
  }
}
