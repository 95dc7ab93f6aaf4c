// paged_decode against a float64 CPU reference on random data, output poisoned first.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <thread>

#include <fmt/format.h>

#include "tests/gpu/gpu_support.hpp"
#include "tests/gpu/paged_decode_support.hpp"
#include "tests/gpu/prefill_support.hpp"

namespace astrai::gpu_test {
namespace {

struct PagedCase {
  DType dtype = DType::bf16;
  int n_kv_heads = 2;
  int group = 4;
  int head_dim = 128;
  int page_size = 16;
  std::vector<int> seq_lens;
  int extra_pages = 1;     // table columns beyond the longest sequence (never read)
  bool strided = false;    // padded head strides, K and V interleaved in one pool, padded out
  bool mask = false;       // random keep-mask; sequence 0 fully masked when it is non-empty
  bool append = false;     // fused append of new_k / new_v at seq_len - 1
  bool req_rows = false;   // requests index a larger page table through req_indices
  bool lse = false;        // also check the log-sum-exp output
  float scale = 0.f;       // 0: 1/sqrt(head_dim)
  float key_ramp = 0.f;    // > 0: key t scaled by key_gain (peaked rows whose maximum rises)
  CaseFeatures features;
  unsigned seed = test_seed(1);

  int batch() const { return static_cast<int>(seq_lens.size()); }
  std::string describe() const {
    return fmt::format("paged_decode dtype={} hd={} ps={} kv_heads={} group={} strided={} mask={} "
                       "append={} req_rows={} lse={} seed={} lens=[{}]{}", dtype_name(dtype), head_dim,
                       page_size, n_kv_heads, group, strided, mask, append, req_rows, lse, seed,
                       fmt::join(seq_lens, ","),
                       (scale > 0 ? fmt::format(" scale={}", scale) : "") +
                           (key_ramp > 0 ? fmt::format(" key_ramp={}", key_ramp) : "") + features.text());
  }

};

struct PagedRun {
  explicit PagedRun(DType dtype) : check(testing::attention_tolerance(dtype)) {}
  RowCheck check;
  std::vector<std::uint16_t> out;  // raw output, for bit-exact comparisons
};

PagedRun run_paged_case(const PagedCase& c, bool capture_graph = false) {
  std::mt19937 rng(c.seed);
  const int batch = c.batch();
  const int n_heads = c.n_kv_heads * c.group;
  const int d = c.head_dim;
  const int ps = c.page_size;
  const int pad = c.strided ? 8 : 0;
  PageTableShape shape;
  shape.extra_pages = c.extra_pages;
  shape.spare_pages = 3;
  shape.stride_padding = c.strided ? 5 : 0;
  shape.request_rows = c.req_rows;
  const PageTable pages = make_page_table(c.seq_lens, ps, shape, rng);
  const int max_pages = pages.max_pages;
  const int num_pages = pages.num_pages;
  const int table_stride = pages.stride;
  const std::vector<std::int32_t>& req = pages.request_row;
  const std::vector<std::int32_t>& table = pages.table;

  const std::int64_t kv_head_stride = d + pad;
  const std::int64_t kv_token_stride = c.n_kv_heads * kv_head_stride;
  const std::int64_t kv_page_stride = ps * kv_token_stride * (c.strided ? 2 : 1);
  const std::size_t pool_elems = static_cast<std::size_t>(num_pages) * kv_page_stride;
  std::vector<std::uint16_t> k_pool = random_elements(pool_elems, c.dtype, rng);
  std::vector<std::uint16_t> v_pool =
      c.strided ? std::vector<std::uint16_t>() : random_elements(pool_elems, c.dtype, rng);
  const std::int64_t v_offset = c.strided ? ps * kv_token_stride : 0;  // V follows K in a page
  if (c.key_ramp > 0)
    for (int b = 0; b < batch; ++b)
      for (int t = 0; t < c.seq_lens[b]; ++t)
        for (int kvh = 0; kvh < c.n_kv_heads; ++kvh)
          scale_elements(&k_pool[pages.table[pages.request_row[b] * pages.stride + t / ps] * kv_page_stride +
                                 (t % ps) * kv_token_stride + kvh * kv_head_stride],
                         d, key_gain(t, c.seq_lens[b], c.key_ramp), c.dtype);
  const std::vector<std::uint16_t>& v_source = c.strided ? k_pool : v_pool;  // read after append

  const std::int64_t q_head_stride = d + pad;
  const std::int64_t q_batch_stride = n_heads * q_head_stride;
  std::vector<std::uint16_t> q = random_elements(std::max(1, batch) * q_batch_stride, c.dtype, rng);
  const std::int64_t out_head_stride = d + pad;
  const std::int64_t out_batch_stride = n_heads * out_head_stride + pad;
  const std::size_t out_elems = std::max<std::size_t>(1, batch * out_batch_stride);

  const std::int64_t capacity = static_cast<std::int64_t>(max_pages) * ps;
  const std::int64_t mask_stride = capacity + (c.strided ? 3 : 0);
  const std::vector<std::uint8_t> mask =
      c.mask ? random_keep_mask(batch, mask_stride, rng) : std::vector<std::uint8_t>();
  const std::int64_t new_stride_batch = c.n_kv_heads * kv_head_stride;
  std::vector<std::uint16_t> new_k, new_v;
  if (c.append) {
    new_k = random_elements(std::max(1, batch) * new_stride_batch, c.dtype, rng);
    new_v = random_elements(std::max(1, batch) * new_stride_batch, c.dtype, rng);
  }
  DeviceBuffer d_mask = DeviceBuffer::from(mask);
  DeviceBuffer d_new_k = DeviceBuffer::from(new_k);
  DeviceBuffer d_new_v = DeviceBuffer::from(new_v);
  DeviceBuffer d_req = DeviceBuffer::from(req);
  DeviceBuffer d_lse(std::max(1, batch * n_heads) * sizeof(float));
  d_lse.fill_byte(0xff);
  DeviceBuffer d_k = DeviceBuffer::from(k_pool);
  DeviceBuffer d_v = c.strided ? DeviceBuffer(16) : DeviceBuffer::from(v_pool);
  DeviceBuffer d_q = DeviceBuffer::from(q);
  DeviceBuffer d_table = DeviceBuffer::from(table);
  DeviceBuffer d_lens = DeviceBuffer::from(c.seq_lens);
  DeviceBuffer d_out(out_elems * 2);
  d_out.fill_byte(0xff);  // poison: every element must be written

  const std::vector<float> sinks = sink_values(n_heads, c.seed);
  DeviceBuffer d_sinks = DeviceBuffer::from(sinks);
  const void* v_cache =
      c.strided ? static_cast<void*>(static_cast<std::uint16_t*>(d_k.get()) + v_offset) : d_v.get();
  const KvPool pool{d_k.get(), v_cache, kv_page_stride, kv_token_stride, kv_head_stride};
  PagedDecodeArgs args = paged_decode_args(c, pages, d_table, d_lens, d_sinks, pool);
  args.scale = c.scale;
  args.q = d_q.get();
  args.q_stride_batch = q_batch_stride;
  args.q_stride_head = q_head_stride;
  args.page_table_stride = table_stride;
  args.out = d_out.get();
  args.out_stride_batch = out_batch_stride;
  args.out_stride_head = out_head_stride;
  if (c.mask) {
    args.mask = static_cast<const bool*>(d_mask.get());
    args.mask_stride_batch = mask_stride;
  }
  if (c.append) {
    args.new_k = d_new_k.get();
    args.new_v = d_new_v.get();
    args.new_k_stride_batch = args.new_v_stride_batch = new_stride_batch;
    args.new_k_stride_head = args.new_v_stride_head = kv_head_stride;
  }
  if (c.req_rows) {
    args.req_indices = static_cast<const std::int32_t*>(d_req.get());
    args.page_table_rows = pages.rows;
  }
  if (c.lse) args.lse = static_cast<float*>(d_lse.get());
  Runtime::get().paged_decode(args);
  synchronize();
  PagedRun run(c.dtype);
  run.out = d_out.to_host<std::uint16_t>(out_elems);
  const auto lse = d_lse.to_host<float>(std::max(1, batch * n_heads));
  if (c.append) {
    // The new token must be in the cache, bit for bit, at slot seq_len - 1.
    const auto k_after = d_k.to_host<std::uint16_t>(pool_elems);
    const auto v_after = c.strided ? k_after : d_v.to_host<std::uint16_t>(pool_elems);
    for (int b = 0; b < batch; ++b) {
      const int t = c.seq_lens[b] - 1;
      if (t < 0) continue;
      const std::int64_t page = table[req[b] * table_stride + t / ps];
      for (int kvh = 0; kvh < c.n_kv_heads; ++kvh)
        for (int i = 0; i < d; ++i) {
          const std::int64_t at = page * kv_page_stride + (t % ps) * kv_token_stride + kvh * kv_head_stride + i;
          const std::int64_t from = b * new_stride_batch + kvh * kv_head_stride + i;
          run.check.expect(k_after[at] == new_k[from] && v_after[v_offset + at] == new_v[from],
                           [&] { return fmt::format("append not written at b={} kvh={} i={}", b, kvh, i); });
          // The reference below reads the appended token from the pools.
          k_pool[at] = new_k[from];
          (c.strided ? k_pool : v_pool)[v_offset + at] = new_v[from];
        }
    }
  }

  if (capture_graph) check_graph_replay(paged_decode_call(args), &d_out, run.out, /*replays=*/2, c.describe());

  const double scale = c.scale > 0 ? c.scale : 1.0 / std::sqrt(static_cast<double>(d));
  std::vector<char> written(run.out.size(), 0);
  std::vector<float> k_rows, v_rows, q_row(d);
  std::vector<double> want;
  for (int b = 0; b < batch; ++b) {
    const int len = c.seq_lens[b];
    std::vector<char> keep(static_cast<std::size_t>(std::max(len, 1)), 0);
    for (int t = 0; t < len; ++t)
      keep[t] = (c.features.window_left < 0 || t >= len - 1 - c.features.window_left) &&
                (!c.mask || mask[b * mask_stride + t] != 0);
    for (int kvh = 0; kvh < c.n_kv_heads; ++kvh) {
      k_rows.assign(static_cast<std::size_t>(std::max(len, 1)) * d, 0.f);
      v_rows.assign(k_rows.size(), 0.f);
      for (int t = 0; t < len; ++t) {
        const std::int64_t page = table[req[b] * table_stride + t / ps];
        const std::int64_t base = page * kv_page_stride + (t % ps) * kv_token_stride + kvh * kv_head_stride;
        for (int i = 0; i < d; ++i) {
          k_rows[static_cast<std::size_t>(t) * d + i] = bits_to_float(k_pool[base + i], c.dtype);
          v_rows[static_cast<std::size_t>(t) * d + i] = bits_to_float(v_source[v_offset + base + i], c.dtype);
        }
      }
      for (int h = kvh * c.group; h < (kvh + 1) * c.group; ++h) {
        for (int i = 0; i < d; ++i) q_row[i] = bits_to_float(q[b * q_batch_stride + h * q_head_stride + i], c.dtype);
        RowFeatures features;
        features.logit_cap = c.features.logit_cap;
        if (c.features.sinks) features.sink = sinks[h];
        double want_lse = 0, lse_slack = 0;
        const bool non_empty = attend_row(q_row.data(), k_rows.data(), v_rows.data(), len, keep, d, scale, &want,
                                          &want_lse, features, &lse_slack);
        const auto where = [&] { return fmt::format("b={} h={}", b, h); };
        const std::int64_t row = b * out_batch_stride + h * out_head_stride;
        run.check.row_bits(&run.out[row], c.dtype, want.data(), d, non_empty, where);
        std::fill_n(written.begin() + row, d, 1);
        if (c.lse) run.check.lse(lse[b * n_heads + h], want_lse, where, lse_slack);
      }
    }
  }
  // Padding after every head, after every request's heads and at the buffer's end keeps the
  // poison; so does the LSE when the call had none.
  check_poison(&run.check, run.out, written);
  if (!c.lse) check_lse_untouched(&run.check, lse);
  return run;
}

void check_case(const PagedCase& c, bool graph = false) {
  report_case("paged_decode", c.dtype, c.describe(), run_paged_case(c, graph).check);
}

std::vector<int> ragged_lengths(int page_size, std::mt19937& rng) {
  std::uniform_int_distribution<int> length(2, 700);
  return {0, 1, page_size - 1 > 1 ? page_size - 1 : 2, page_size, page_size + 1, length(rng), length(rng)};
}

}  // namespace

TEST_SUITE("paged_decode") {

TEST_CASE("paged_decode matches the reference across head dims, page sizes and GQA groups") {
  std::mt19937 rng(test_seed(2024));
  for (int head_dim : {64, 128, 256, 80, 96}) {
    for (int page_size : {1, 16}) {
      for (int group : {1, 4, 6, 8}) {
        PagedCase c;
        c.head_dim = head_dim;
        c.page_size = page_size;
        c.group = group;
        c.n_kv_heads = group == 1 ? 3 : 2;
        c.seq_lens = ragged_lengths(page_size, rng);
        c.seed = rng();
        check_case(c);
      }
    }
  }
}

TEST_CASE("paged_decode handles strided Q, output and an interleaved K/V pool") {
  std::mt19937 rng(test_seed(7));
  for (int page_size : {1, 8, 16, 64}) {
    PagedCase c;
    c.page_size = page_size;
    c.strided = true;
    c.seq_lens = ragged_lengths(page_size, rng);
    c.seed = rng();
    check_case(c);
  }
}

TEST_CASE("paged_decode splits long sequences and merges the splits exactly") {
  PagedCase c;
  c.group = 4;
  c.n_kv_heads = 8;
  c.seq_lens = {32768, 1, 0, 5000};
  check_case(c);
  PagedCase one;
  one.group = 6;
  one.n_kv_heads = 4;
  one.head_dim = 64;
  one.seq_lens = {9000};
  check_case(one);
}

TEST_CASE("paged_decode of short tables splits a block a split: empty splits, sinks, LSE") {
  // Capacities of 3 and 16 blocks split into a block a split (small batches fill the GPU that
  // way); sequences of 0 and 1 tokens leave every split but one empty for the combine to merge.
  std::mt19937 rng(test_seed(61));
  for (int longest : {130, 1000}) {
    for (bool sinks : {false, true}) {
      PagedCase c;
      c.head_dim = sinks ? 64 : 128;
      c.group = sinks ? 20 : 6;  // 20: two head tiles
      c.features.sinks = sinks;
      c.features.logit_cap = sinks ? 5.f : 0.f;
      c.lse = true;
      c.append = true;
      c.seq_lens = {longest, 0, 1, 65};
      c.seed = rng();
      check_case(c);
    }
  }
}

TEST_CASE("paged_decode with fp16 and large groups") {
  std::mt19937 rng(test_seed(99));
  for (int group : {1, 6, 16, 20}) {
    PagedCase c;
    c.dtype = DType::fp16;
    c.group = group;
    c.n_kv_heads = 2;
    c.seq_lens = ragged_lengths(16, rng);
    c.seed = rng();
    check_case(c);
  }
}

TEST_CASE("paged_decode of an all-empty batch outputs zeros") {
  PagedCase c;
  c.seq_lens = {0, 0, 0};
  check_case(c);
}

TEST_CASE("paged_decode with masks (including a fully masked row), LSE and request rows") {
  std::mt19937 rng(test_seed(31));
  for (int page_size : {1, 16}) {
    for (int group : {1, 6, 8}) {
      PagedCase c;
      c.page_size = page_size;
      c.group = group;
      c.mask = true;
      c.lse = true;
      c.req_rows = true;
      c.seq_lens = ragged_lengths(page_size, rng);
      c.seq_lens.push_back(20000);  // split, so the combine kernel merges masked splits
      c.seed = rng();
      check_case(c);
    }
  }
}

TEST_CASE("paged_decode fused append writes the cache bit for bit and attends to the new token") {
  std::mt19937 rng(test_seed(41));
  for (int page_size : {1, 8, 16, 64}) {
    for (bool strided : {false, true}) {
      PagedCase c;
      c.page_size = page_size;
      c.append = true;
      c.strided = strided;
      c.lse = true;
      c.req_rows = page_size == 16;
      c.seq_lens = ragged_lengths(page_size, rng);
      c.seq_lens.push_back(9000);
      c.seed = rng();
      check_case(c);
    }
  }
}

TEST_CASE("paged_decode captured in a CUDA graph replays bit for bit") {
  PagedCase c;
  c.seq_lens = {3000, 17, 1, 0};
  c.seed = test_seed(5);
  check_case(c, /*graph=*/true);
  PagedCase everything;
  everything.seq_lens = {40000, 64, 2};
  everything.mask = everything.append = everything.lse = everything.req_rows = true;
  everything.page_size = 1;
  everything.seed = test_seed(6);
  check_case(everything, /*graph=*/true);
}

// Behind a kernel that lets it start early (rotary_emb does, from sm_90 on), the decode
// prefetches its Q rows, lengths and first pages before waiting for that kernel: it must still
// attend with the Q the kernel wrote. Each round poisons Q, rotates Q0 into it and decodes, all
// queued on one stream; every output must equal, bit for bit, the decode of the rotated Q run
// alone, which differs from the decode of the unrotated Q0 (so a stale read would show). Pages
// of 16 take the Hopper kernel on sm_90a, pages of 1 the portable one.
TEST_CASE("paged_decode right behind rotary_emb on one stream attends with the rotated Q") {
  const auto& api = detail::driver();
  for (const int page_size : {16, 1}) {
    for (const std::vector<int>& lens : {std::vector<int>{1024}, std::vector<int>{700, 1, 64, 3000}}) {
      PagedCase c;
      c.page_size = page_size;
      c.n_kv_heads = 8;
      c.seq_lens = lens;
      c.seed = test_seed(31);
      CAPTURE(c.describe());
      std::mt19937 rng(c.seed);
      const int n_heads = c.n_kv_heads * c.group;
      const int d = c.head_dim;
      const PageTable pages = make_page_table(c.seq_lens, c.page_size, PageTableShape{}, rng);
      const std::int64_t token_stride = static_cast<std::int64_t>(c.n_kv_heads) * d;
      const std::size_t pool_elems = static_cast<std::size_t>(pages.num_pages) * c.page_size * token_stride;
      DeviceBuffer d_k = DeviceBuffer::from(random_elements(pool_elems, c.dtype, rng));
      DeviceBuffer d_v = DeviceBuffer::from(random_elements(pool_elems, c.dtype, rng));
      const std::size_t q_elems = static_cast<std::size_t>(c.batch()) * n_heads * d;
      DeviceBuffer d_q0 = DeviceBuffer::from(random_elements(q_elems, c.dtype, rng));
      DeviceBuffer d_q(q_elems * 2);
      const std::vector<float> freqs = random_rotations(static_cast<std::size_t>(c.batch()) * d / 2, rng);
      DeviceBuffer d_freqs = DeviceBuffer::from(freqs);
      DeviceBuffer d_table = DeviceBuffer::from(pages.table);
      DeviceBuffer d_lens = DeviceBuffer::from(c.seq_lens);
      DeviceBuffer no_sinks(16);
      const KvPool pool{d_k.get(), d_v.get(), c.page_size * token_stride, token_stride, d};
      PagedDecodeArgs decode = paged_decode_args(c, pages, d_table, d_lens, no_sinks, pool);
      decode.page_table_stride = pages.stride;
      RotaryArgs rotary;
      rotary.dtype = c.dtype;
      rotary.batch = c.batch();
      rotary.seq_len = 1;
      rotary.n_heads = n_heads;
      rotary.head_dim = d;
      rotary.x = d_q0.get();
      rotary.out = d_q.get();
      rotary.freqs = static_cast<const float*>(d_freqs.get());

      // The references, each call finished before the next starts.
      DeviceBuffer d_out(q_elems * 2);
      auto decode_alone = [&](const void* q) {
        d_out.fill_byte(0xff);
        decode.q = q;
        decode.out = d_out.get();
        decode.stream = nullptr;
        Runtime::get().paged_decode(decode);
        synchronize();
        return d_out.to_host<std::uint16_t>(q_elems);
      };
      const auto unrotated = decode_alone(d_q0.get());
      rotary.stream = nullptr;
      Runtime::get().rotary_emb(rotary);
      synchronize();
      const auto want = decode_alone(d_q.get());
      REQUIRE(want != unrotated);

      CUstream stream;
      detail::check_cu(api.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate", -1);
      constexpr int kRounds = 8;
      std::vector<DeviceBuffer> outs;
      for (int round = 0; round < kRounds; ++round) outs.emplace_back(q_elems * 2);
      for (int round = 0; round < kRounds; ++round) {
        const auto q_bytes = q_elems * 2;
        detail::check_cu(api.cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(d_q.get()), 0xff, q_bytes, stream),
                 "cuMemsetD8Async", -1);
        detail::check_cu(api.cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(outs[round].get()), 0xff, q_bytes, stream),
                 "cuMemsetD8Async", -1);
        rotary.stream = stream;
        Runtime::get().rotary_emb(rotary);
        decode.q = d_q.get();
        decode.out = outs[round].get();
        decode.stream = stream;
        Runtime::get().paged_decode(decode);
      }
      detail::check_cu(api.cuStreamSynchronize(stream), "cuStreamSynchronize", -1);
      detail::check_cu(api.cuStreamDestroy(stream), "cuStreamDestroy", -1);
      for (int round = 0; round < kRounds; ++round)
        CHECK_MESSAGE(outs[round].to_host<std::uint16_t>(q_elems) == want, "round " << round);
    }
  }
}

TEST_CASE("paged_decode with a logit soft-cap: caps below, near and above the score range") {
  std::mt19937 rng(test_seed(51));
  // With scale 1 the scores of random rows spread over about +-10 (head dim 128).
  for (float cap : {0.5f, 4.f, 30.f}) {
    for (int page_size : {1, 16}) {
      PagedCase c;
      c.page_size = page_size;
      c.group = page_size == 1 ? 6 : 4;
      c.head_dim = page_size == 1 ? 64 : 128;
      c.scale = 1.f;
      c.features.logit_cap = cap;
      c.lse = true;
      c.mask = cap > 1.f;
      c.append = page_size == 16;
      c.seq_lens = ragged_lengths(page_size, rng);
      c.seq_lens.push_back(12000);  // split: the combine merges capped partial results
      c.seed = rng();
      check_case(c);
    }
  }
  PagedCase small;  // the default scale, a cap near the small scores it gives
  small.dtype = DType::fp16;
  small.features.logit_cap = 0.3f;
  small.lse = true;
  small.seq_lens = {700, 1, 0, 33};
  check_case(small);
  PagedCase graph;  // a captured soft-cap call replays bit for bit
  graph.features.logit_cap = 2.f;
  graph.scale = 1.f;
  graph.seq_lens = {3000, 17};
  check_case(graph, /*graph=*/true);
}

TEST_CASE("paged_decode with attention sinks: empty, masked and split rows, with the soft-cap") {
  std::mt19937 rng(test_seed(52));
  for (int page_size : {1, 16}) {
    for (bool cap : {false, true}) {
      PagedCase c;
      c.page_size = page_size;
      c.group = page_size == 1 ? 6 : 8;
      c.head_dim = page_size == 1 ? 64 : 128;
      c.features.sinks = true;
      c.features.logit_cap = cap ? 5.f : 0.f;
      c.lse = true;
      c.mask = cap;        // row 0 fully masked: zeros, LSE = its sink
      c.append = !cap;
      c.req_rows = page_size == 16;
      c.seq_lens = ragged_lengths(page_size, rng);  // starts with an empty sequence
      c.seq_lens.push_back(20000);  // split: only split 0 adds the sink, the combine merges it
      c.seed = rng();
      check_case(c);
    }
  }
  PagedCase fp16;
  fp16.dtype = DType::fp16;
  fp16.features.sinks = true;
  fp16.lse = true;
  fp16.seq_lens = {0, 0, 3, 40000};
  fp16.seed = test_seed(9);
  check_case(fp16);
  PagedCase graph;  // a captured call with sinks replays bit for bit
  graph.features.sinks = true;
  graph.seq_lens = {9000, 2, 0};
  graph.seed = test_seed(10);
  check_case(graph, /*graph=*/true);
}

TEST_CASE("paged_decode with a sliding window: windows crossing page edges, longer than the sequence, with sinks") {
  std::mt19937 rng(test_seed(53));
  for (int page_size : {1, 16, 64}) {
    for (int window : {0, 1, 15, 16, 17, 100, 1000, 5000}) {
      PagedCase c;
      c.page_size = page_size;
      c.group = page_size == 1 ? 6 : 4;
      c.head_dim = page_size == 1 ? 64 : 128;
      c.features.window_left = window;
      c.features.sinks = window % 2 == 0;  // sinks + window, as gpt-oss
      c.lse = true;
      c.mask = window == 17;
      c.append = window == 100;
      c.req_rows = window == 1000;
      c.seq_lens = ragged_lengths(page_size, rng);  // 0, 1, page edges, random lengths
      c.seq_lens.push_back(3000 + static_cast<int>(rng() % 200));
      c.seed = rng();
      check_case(c);
    }
  }
  PagedCase split;  // a window over a long table: several splits, all inside the window
  split.n_kv_heads = 1;
  split.group = 8;
  split.features.window_left = 8191;
  split.features.sinks = true;
  split.features.logit_cap = 5.f;
  split.lse = true;
  split.seq_lens = {60000, 8192, 8193, 100};
  split.seed = test_seed(11);
  check_case(split);
  PagedCase graph;  // a captured windowed call replays bit for bit
  graph.features.window_left = 500;
  graph.seq_lens = {20000, 300, 0};
  graph.seed = test_seed(12);
  check_case(graph, /*graph=*/true);
}

TEST_CASE("paged_decode with peaked rows whose maximum rises along the keys, through the split merge") {
  // Scale 1 and keys growing along each sequence: row maxima rise block after block and split
  // after split (the long rows split), so the merge must rescale the earlier splits.
  std::mt19937 rng(test_seed(54));
  for (int page_size : {1, 16}) {
    for (float ramp : {2.f, 6.f}) {
      PagedCase c;
      c.page_size = page_size;
      c.dtype = ramp > 3.f ? DType::fp16 : DType::bf16;
      c.group = page_size == 1 ? 6 : 4;
      c.head_dim = page_size == 1 ? 64 : 128;
      c.scale = 1.f;
      c.key_ramp = ramp;
      c.lse = true;
      c.features.sinks = ramp > 3.f;
      c.append = page_size == 16;
      c.seq_lens = ragged_lengths(page_size, rng);
      c.seq_lens.push_back(30000);
      c.seq_lens.push_back(9000);
      c.seed = rng();
      check_case(c);
    }
  }
}

TEST_CASE("paged_decode random sweep") {
  // 40 cases with fully random variants (each a new compile), then ASTRAI_TEST_SWEEP more
  // (default 60) drawn from variants the targeted cases already compiled.
  const unsigned seed = test_seed(12345);
  std::mt19937 rng(seed);
  MESSAGE(fmt::format("paged_decode random sweep seed {}", seed));
  std::uniform_int_distribution<int> head_dim_step(2, 16);
  const int page_sizes[] = {1, 2, 4, 8, 16, 32, 64, 128, 256};
  const int pooled_head_dims[] = {64, 128, 256, 80, 96};
  const int pooled_groups[] = {1, 4, 6, 8};
  const int total = 40 + sweep_count(60);
  for (int i = 0; i < total; ++i) {
    PagedCase c;
    const bool pooled = i >= 40;
    c.dtype = (!pooled && rng() % 4 == 0) ? DType::fp16 : DType::bf16;
    c.head_dim = pooled ? pooled_head_dims[rng() % 5] : 16 * head_dim_step(rng);
    c.page_size = pooled ? (rng() % 2 ? 16 : 1) : page_sizes[rng() % 9];
    c.group = pooled ? pooled_groups[rng() % 4] : 1 + static_cast<int>(rng() % 12);
    c.n_kv_heads = 1 + rng() % 3;
    c.strided = rng() % 3 == 0;
    c.mask = rng() % 4 == 0;
    c.append = rng() % 4 == 0;
    c.req_rows = rng() % 3 == 0;
    c.lse = rng() % 5 != 0;
    if (rng() % 4 == 0) {  // a peaked row now and then
      c.scale = 1.f;
      c.key_ramp = 4.f;
    }
    const int batch = 1 + rng() % 5;
    for (int b = 0; b < batch; ++b) c.seq_lens.push_back(rng() % 3 == 0 ? rng() % 3 : rng() % 1500);
    c.seed = rng();
    check_case(c);
  }
}

TEST_CASE("on sm_90a paged_decode streams K and V through TMA (unless switched off), a masked call takes the "
          "portable kernel") {
  if (!sm90a_target()) return not_run("paged_decode TMA case: needs an sm_90a target");
  // Lengths around the 32-token pages and 64-token blocks, an empty one; the fused append.
  PagedCase c;
  c.page_size = 32;
  c.group = 3;
  c.seq_lens = {1, 31, 32, 33, 63, 64, 65, 200, 0};
  c.append = true;
  c.lse = true;
  c.seed = test_seed(5);
  check_case(c);
  const bool hopper = !mma_forced_off() && !wgmma_forced_off();
  CHECK(loaded_variants_named("paged_decode.bf16.hd128.ps32.g3.tma.sm_90a") == (hopper ? 1 : 0));
  c.mask = true;
  c.seed = test_seed(6);
  check_case(c);
  const char* portable =
      mma_forced_off() ? "paged_decode.bf16.hd128.ps32.g3.nomma.sm_90a" : "paged_decode.bf16.hd128.ps32.g3.sm_90a";
  CHECK(loaded_variants_named(portable) == 1);
}

TEST_CASE("on sm_90a a paged_decode call compiles only the variant it launches, narrow or wide CTAs") {
  if (!sm90a_target()) return not_run("paged_decode wide-CTA case: needs an sm_90a target");
  if (mma_forced_off() || wgmma_forced_off()) return;  // the Hopper kernel is switched off on purpose
  // hd64 (the head dim with wide CTAs), a group no other case uses, so that neither variant is
  // loaded yet: 16 requests x 8 KV heads (128 columns, one wave on 132 SMs) of 2048 tokens split
  // 4 ways, where the automatic choice takes wide CTAs. The split plan comes before either
  // variant is compiled, so the call loads one of them, never both.
  PagedCase c;
  c.head_dim = 64;
  c.group = 7;
  c.n_kv_heads = 8;
  c.seq_lens.assign(16, 2048);
  c.seed = test_seed(8);
  check_case(c);
  const int narrow = loaded_variants_named("paged_decode.bf16.hd64.ps16.g7.tma.sm_90a");
  const int wide = loaded_variants_named("paged_decode.bf16.hd64.ps16.g7.tma.wide.sm_90a");
  CHECK(narrow + wide == 1);
}

}  // TEST_SUITE
}  // namespace astrai::gpu_test

namespace astrai::gpu_test {
namespace {

// Runs `cases` on device `ordinal` from its own thread (in that device's primary context) and
// returns one line per failed check; an exception becomes a line too. `*checked` counts the
// output elements compared against the reference.
std::vector<std::string> run_cases_on_device(int ordinal, const std::vector<PagedCase>& cases,
                                             std::size_t* checked) {
  std::vector<std::string> problems;
  const auto& api = detail::driver();
  CUdevice device = 0;
  CUcontext primary = nullptr;
  try {
    detail::check_cu(api.cuDeviceGet(&device, ordinal), "cuDeviceGet", ordinal);
    detail::check_cu(api.cuDevicePrimaryCtxRetain(&primary, device), "cuDevicePrimaryCtxRetain", ordinal);
    detail::check_cu(api.cuCtxSetCurrent(primary), "cuCtxSetCurrent", ordinal);
    for (const PagedCase& c : cases) {
      const PagedRun run = run_paged_case(c);
      *checked += run.check.elements();
      if (!run.check.passed())
        problems.push_back(fmt::format("device {}: {}: {}", ordinal, c.describe(), run.check.first_failure()));
    }
  } catch (const std::exception& error) {
    problems.push_back(fmt::format("device {}: {}", ordinal, error.what()));
  }
  if (primary) api.cuDevicePrimaryCtxRelease(device);
  return problems;
}

}  // namespace

TEST_SUITE("multi_gpu") {

TEST_CASE("paged_decode on every GPU at once, each device with its own variants, then a shared one") {
  int count = 0;
  detail::check_cu(detail::driver().cuDeviceGetCount(&count), "cuDeviceGetCount", -1);
  if (count < 2) {
    not_run(fmt::format("multi-GPU case: {} GPU visible (needs 2 or more)", count));
    return;
  }
  MESSAGE(fmt::format("multi-GPU case on {} GPUs", count));
  const int head_dims[] = {128, 64, 256, 96};
  for (int phase = 0; phase < 2; ++phase) {
    // Phase 0: a different head dim and page size per device (its own variants).
    // Phase 1: every device runs the same variant (compiled once, loaded per device).
    std::vector<std::vector<PagedCase>> per_device(count);
    for (int d = 0; d < count; ++d)
      for (int round = 0; round < 3; ++round) {
        PagedCase c;
        c.head_dim = phase == 0 ? head_dims[d % 4] : 128;
        c.page_size = phase == 0 ? (d % 2 ? 1 : 16) : 16;
        c.seq_lens = {1 + 977 * round, 4100, 0, 33};
        c.lse = round == 2;
        c.seed = test_seed(static_cast<unsigned>(1000 * phase + 10 * d + round));
        per_device[d].push_back(c);
      }
    std::vector<std::vector<std::string>> problems(count);
    std::vector<std::size_t> checked(count, 0);
    std::vector<std::thread> threads;
    for (int d = 0; d < count; ++d)
      threads.emplace_back([&, d] { problems[d] = run_cases_on_device(d, per_device[d], &checked[d]); });
    for (auto& thread : threads) thread.join();
    for (int d = 0; d < count; ++d) {
      INFO("phase " << phase << ", device " << d);
      CHECK_MESSAGE(problems[d].empty(), fmt::format("{}", fmt::join(problems[d], "\n")));
      CHECK(checked[d] > 0);  // every device really compared output against the reference
    }
  }
  // Each device loaded the variants its threads used (names repeat once per device).
  const auto names = Runtime::get().loaded_variants();
  const auto shared = std::count_if(names.begin(), names.end(), [](const std::string& name) {
    return name.rfind("paged_decode.bf16.hd128.ps16.g4.", 0) == 0;
  });
  CHECK(shared >= count);
}

}  // TEST_SUITE
}  // namespace astrai::gpu_test
