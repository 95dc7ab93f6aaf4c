// paged_prefill (ragged queries over a paged KV cache) against a float64 CPU reference on
// random data: page sizes, masks, strided pools, unmapped pages, device lengths clamped.
// Outputs and LSE are poisoned first. Variants are drawn from a short list.
#include "tests/gpu/prefill_support.hpp"

namespace astrai::gpu_test {
namespace {

// ---------------------------------------------------------------------------------------------
// paged_prefill

struct PagedPrefillCase {
  DType dtype = DType::bf16;
  int n_kv_heads = 2;
  int group = 4;
  int head_dim = 128;
  int page_size = 16;
  std::vector<int> q_lens;     // query rows per request (qo_indptr is their prefix sum)
  std::vector<int> seq_lens;   // KV length per request, the new rows included
  bool causal = true;
  bool mask = false;           // [total_q, mask_stride_q] random keep-mask, one row empty
  bool strided = false;        // padded q/out rows, K and V interleaved in one page pool
  bool lse = true;
  bool unmapped_page = false;  // one page of request 0 points outside the pool (reads zeros)
  std::vector<int> device_seq_lens;  // when set: what the device sees (clamping is tested)
  int extra_pages = 1;
  float scale = 0.f;
  float key_ramp = 0.f;  // > 0: key t scaled by key_gain (peaked rows whose maximum rises)
  CaseFeatures features;
  unsigned seed = test_seed(1);

  int batch() const { return static_cast<int>(q_lens.size()); }
  std::string describe() const {
    return fmt::format("paged_prefill dtype={} hd={} ps={} group={} kv_heads={} causal={} mask={} "
                       "strided={} lse={} unmapped_page={} seed={} q_lens=[{}] seq_lens=[{}]{}{}",
                       dtype_name(dtype), head_dim, page_size, group, n_kv_heads, causal, mask,
                       strided, lse, unmapped_page, seed, fmt::join(q_lens, ","),
                       fmt::join(seq_lens, ","),
                       device_seq_lens.empty()
                           ? std::string()
                           : fmt::format(" device_seq_lens=[{}]", fmt::join(device_seq_lens, ",")),
                       (scale > 0 ? fmt::format(" scale={}", scale) : "") +
                           (key_ramp > 0 ? fmt::format(" key_ramp={}", key_ramp) : "") + features.text());
  }
};

void check_paged_prefill(const PagedPrefillCase& c) {
  std::mt19937 rng(c.seed);
  const int batch = c.batch();
  const int n_heads = c.n_kv_heads * c.group;
  const int d = c.head_dim;
  const int ps = c.page_size;
  const int pad = c.strided ? 8 : 0;
  std::vector<std::int32_t> indptr(batch + 1, 0);
  for (int b = 0; b < batch; ++b) indptr[b + 1] = indptr[b] + c.q_lens[b];
  const int total_q = indptr[batch];
  const int max_q_len = batch ? *std::max_element(c.q_lens.begin(), c.q_lens.end()) : 0;
  const int max_len = batch ? *std::max_element(c.seq_lens.begin(), c.seq_lens.end()) : 0;
  const int max_pages = std::max(1, (max_len + ps - 1) / ps + c.extra_pages);
  const int capacity = max_pages * ps;
  int used_pages = 0;
  for (int len : c.seq_lens) used_pages += (len + ps - 1) / ps;
  const int num_pages = used_pages + 3;

  // Pages handed out in a shuffled order so logical and physical order differ.
  std::vector<int> physical(num_pages);
  std::iota(physical.begin(), physical.end(), 0);
  std::shuffle(physical.begin(), physical.end(), rng);
  const int table_stride = max_pages + (c.strided ? 3 : 0);
  std::vector<std::int32_t> table(static_cast<std::size_t>(std::max(1, batch)) * table_stride, -1);
  int next = 0;
  for (int b = 0; b < batch; ++b)
    for (int p = 0; p < (c.seq_lens[b] + ps - 1) / ps; ++p)
      table[b * table_stride + p] = physical[next++];
  if (c.unmapped_page && batch > 0 && c.seq_lens[0] > 0) table[(c.seq_lens[0] - 1) / ps] = num_pages + 7;

  const std::int64_t kv_head = d + pad;
  const std::int64_t kv_token = c.n_kv_heads * kv_head;
  const std::int64_t kv_page = ps * kv_token * (c.strided ? 2 : 1);
  const std::int64_t v_offset = c.strided ? ps * kv_token : 0;  // V follows K inside a page
  const std::size_t pool_elems = static_cast<std::size_t>(num_pages) * kv_page;
  std::vector<std::uint16_t> k_pool = random_elements(pool_elems, c.dtype, rng);
  if (c.key_ramp > 0)
    for (int b = 0; b < batch; ++b)
      for (int t = 0; t < c.seq_lens[b]; ++t) {
        const std::int32_t page = table[b * table_stride + t / ps];
        if (page < 0 || page >= num_pages) continue;
        for (int kvh = 0; kvh < c.n_kv_heads; ++kvh)
          scale_elements(&k_pool[page * kv_page + (t % ps) * kv_token + kvh * kv_head], d,
                         key_gain(t, c.seq_lens[b], c.key_ramp), c.dtype);
      }
  const std::vector<std::uint16_t> v_separate =
      c.strided ? std::vector<std::uint16_t>() : random_elements(pool_elems, c.dtype, rng);
  const std::vector<std::uint16_t>& v_pool = c.strided ? k_pool : v_separate;

  const std::int64_t q_head = d + pad;
  const std::int64_t q_token = n_heads * q_head + pad;
  const std::size_t q_elems = static_cast<std::size_t>(std::max(1, total_q)) * q_token;
  const std::vector<std::uint16_t> q = random_elements(q_elems, c.dtype, rng);

  const std::int64_t mask_stride_q = capacity + (c.strided ? 3 : 0);
  std::vector<std::uint8_t> mask(static_cast<std::size_t>(std::max(1, total_q)) * mask_stride_q, 1);
  if (c.mask) {
    std::bernoulli_distribution keep(0.75);
    for (auto& m : mask) m = keep(rng) ? 1 : 0;
    if (total_q > 0) std::fill_n(mask.begin() + (total_q / 2) * mask_stride_q, capacity, 0);
  }

  const std::vector<int>& device_lens = c.device_seq_lens.empty() ? c.seq_lens : c.device_seq_lens;
  DeviceBuffer d_q = DeviceBuffer::from(q);
  DeviceBuffer d_indptr = DeviceBuffer::from(indptr);
  DeviceBuffer d_k = DeviceBuffer::from(k_pool);
  DeviceBuffer d_v = c.strided ? DeviceBuffer(16) : DeviceBuffer::from(v_separate);
  DeviceBuffer d_table = DeviceBuffer::from(table);
  DeviceBuffer d_lens = DeviceBuffer::from(device_lens);
  DeviceBuffer d_mask = DeviceBuffer::from(mask);
  DeviceBuffer d_out(q_elems * 2);
  const std::size_t lse_count = static_cast<std::size_t>(std::max(1, total_q * n_heads));
  DeviceBuffer d_lse(lse_count * sizeof(float));
  d_out.fill_byte(0xff);
  d_lse.fill_byte(0xff);

  PagedPrefillArgs args;
  args.dtype = c.dtype;
  args.batch = batch;
  args.total_q = total_q;
  args.max_q_len = max_q_len;
  args.n_heads = n_heads;
  args.n_kv_heads = c.n_kv_heads;
  args.head_dim = d;
  args.page_size = ps;
  args.num_pages = num_pages;
  args.max_pages_per_seq = max_pages;
  args.scale = c.scale;
  args.logit_cap = c.features.logit_cap;
  const std::vector<float> sinks = sink_values(n_heads, c.seed);
  DeviceBuffer d_sinks = DeviceBuffer::from(sinks);
  if (c.features.sinks) args.sinks = static_cast<const float*>(d_sinks.get());
  args.window_left = c.features.window_left;
  args.causal = c.causal;
  args.q = d_q.get();
  args.qo_indptr = static_cast<const std::int32_t*>(d_indptr.get());
  args.k_cache = d_k.get();
  args.v_cache = c.strided ? static_cast<const void*>(
                                 static_cast<const std::uint16_t*>(d_k.get()) + v_offset)
                           : d_v.get();
  args.page_table = static_cast<const std::int32_t*>(d_table.get());
  args.seq_lens = static_cast<const std::int32_t*>(d_lens.get());
  args.out = d_out.get();
  if (c.strided) {
    args.q_stride_token = args.out_stride_token = q_token;
    args.q_stride_head = args.out_stride_head = q_head;
    args.k_stride_page = args.v_stride_page = kv_page;
    args.k_stride_token = args.v_stride_token = kv_token;
    args.k_stride_head = args.v_stride_head = kv_head;
    args.page_table_stride = table_stride;
    args.mask_stride_q = mask_stride_q;
  }
  if (c.mask) args.mask = reinterpret_cast<const bool*>(d_mask.get());
  if (c.lse) args.lse = static_cast<float*>(d_lse.get());
  Runtime::get().paged_prefill(args);
  synchronize();
  const std::vector<std::uint16_t> out = d_out.to_host<std::uint16_t>(q_elems);
  const std::vector<float> lse = d_lse.to_host<float>(lse_count);

  const double scale = c.scale > 0 ? c.scale : 1.0 / std::sqrt(static_cast<double>(d));
  RowFeatures row_features;
  row_features.logit_cap = c.features.logit_cap;
  Verdict verdict(c.dtype);
  std::vector<char> written(q_elems, 0);
  std::vector<float> q_row(d);
  std::vector<double> want;
  for (int b = 0; b < batch; ++b) {
    // What the kernel must use: the device length clamped to the table capacity.
    const int seq_len = std::clamp(device_lens[b], 0, capacity);
    const int q_len = c.q_lens[b];
    std::vector<float> k_rows(static_cast<std::size_t>(std::max(1, seq_len)) * d);
    std::vector<float> v_rows(k_rows.size());
    std::vector<char> keep(static_cast<std::size_t>(std::max(1, seq_len)));
    for (int kvh = 0; kvh < c.n_kv_heads; ++kvh) {
      for (int t = 0; t < seq_len; ++t) {
        const std::int32_t page = table[b * table_stride + t / ps];
        const bool mapped = page >= 0 && page < num_pages;
        const std::int64_t at = page * kv_page + (t % ps) * kv_token + kvh * kv_head;
        for (int e = 0; e < d; ++e) {
          k_rows[static_cast<std::size_t>(t) * d + e] =
              mapped ? bits_to_float(k_pool[at + e], c.dtype) : 0.f;
          v_rows[static_cast<std::size_t>(t) * d + e] =
              mapped ? bits_to_float(v_pool[v_offset + at + e], c.dtype) : 0.f;
        }
      }
      for (int i = 0; i < q_len; ++i) {
        const int row = indptr[b] + i;
        const std::int64_t position = static_cast<std::int64_t>(seq_len) - q_len + i;
        for (int t = 0; t < seq_len; ++t)
          keep[t] = (!c.causal || t <= position) &&
                    (c.features.window_left < 0 || t >= position - c.features.window_left) &&
                    (!c.mask || mask[row * mask_stride_q + t] != 0);
        for (int h = kvh * c.group; h < (kvh + 1) * c.group; ++h) {
          const std::int64_t base = row * q_token + h * q_head;
          for (int e = 0; e < d; ++e) q_row[e] = bits_to_float(q[base + e], c.dtype);
          double lse_want = 0;
          row_features.sink = c.features.sinks ? sinks[h] : -INFINITY;
          const bool non_empty = attend_row(q_row.data(), k_rows.data(), v_rows.data(), seq_len,
                                            keep, d, scale, &want, &lse_want, row_features);
          const std::size_t lse_index = static_cast<std::size_t>(row) * n_heads + h;
          check_row(&verdict, c.dtype, out, base, want, non_empty, c.lse ? &lse[lse_index] : nullptr,
                    lse_want, RowId{b, i, h});
          std::fill_n(written.begin() + base, d, 1);
        }
      }
    }
  }
  check_poison(&verdict, out, written);
  if (!c.lse) check_lse_untouched(&verdict.check, lse);
  report("paged_prefill", c.dtype, c.describe(), &verdict);
}

// The variants the random sweep draws from; each also appears in a targeted case, so the
// sweep compiles nothing new.
const Variant kPagedVariants[] = {
    {DType::bf16, 128, 4, 16}, {DType::bf16, 128, 4, 1},  {DType::bf16, 128, 4, 8},
    {DType::bf16, 128, 4, 64}, {DType::bf16, 64, 4, 16},  {DType::bf16, 256, 4, 16},
    {DType::fp16, 128, 6, 16}, {DType::bf16, 128, 1, 16}, {DType::bf16, 128, 8, 16},
};

}  // namespace

TEST_SUITE("paged_prefill") {

TEST_CASE("paged_prefill matches the reference across page sizes with ragged requests") {
  std::mt19937 rng(test_seed(41));
  for (int page_size : {1, 8, 16, 64}) {
    for (bool causal : {true, false}) {
      PagedPrefillCase c;
      c.page_size = page_size;
      c.causal = causal;
      // A fresh prompt, an empty request, chunked prefill (q_len < seq_len), one row, and a
      // chunk that crosses a tile boundary.
      c.q_lens = {70, 0, 33, 1, 65};
      c.seq_lens = {70, 40, 300, 129, 200};
      c.seed = rng();
      check_paged_prefill(c);
    }
  }
}

TEST_CASE("paged_prefill across head dims, groups and fp16") {
  std::mt19937 rng(test_seed(42));
  const Variant variants[] = {{DType::bf16, 64, 4, 16}, {DType::bf16, 256, 4, 16},
                              {DType::fp16, 128, 6, 16}, {DType::bf16, 128, 1, 16},
                              {DType::bf16, 128, 8, 16}};
  for (const Variant& variant : variants) {
    PagedPrefillCase c;
    c.dtype = variant.dtype;
    c.head_dim = variant.head_dim;
    c.group = variant.group;
    c.page_size = variant.page_size;
    c.n_kv_heads = variant.group >= 8 ? 1 : 2;
    c.q_lens = {64, 17, 130};
    c.seq_lens = {64, 500, 190};
    c.seed = rng();
    check_paged_prefill(c);
  }
}

TEST_CASE("paged_prefill with masks, strided pools, unmapped pages and a long cache") {
  std::mt19937 rng(test_seed(43));
  for (bool strided : {false, true}) {
    PagedPrefillCase c;
    c.mask = true;
    c.strided = strided;
    c.unmapped_page = true;
    c.q_lens = {40, 80, 0, 3};
    c.seq_lens = {100, 80, 7, 64};
    c.seed = rng();
    check_paged_prefill(c);
  }
  PagedPrefillCase long_cache;
  long_cache.n_kv_heads = 1;
  long_cache.q_lens = {64, 129};
  long_cache.seq_lens = {2048, 1500};
  long_cache.seed = rng();
  check_paged_prefill(long_cache);
}

TEST_CASE("paged_prefill with a logit soft-cap: caps below, near and above the score range") {
  std::mt19937 rng(test_seed(44));
  for (float cap : {0.5f, 4.f, 30.f}) {
    for (int page_size : {1, 16}) {
      PagedPrefillCase c;
      c.page_size = page_size;
      c.scale = 1.f;  // scores of random rows spread over about +-10 (head dim 128)
      c.features.logit_cap = cap;
      c.causal = cap != 30.f;
      c.mask = cap == 4.f;
      c.q_lens = {70, 0, 33, 1, 65};
      c.seq_lens = {70, 40, 300, 129, 200};
      c.seed = rng();
      check_paged_prefill(c);
    }
  }
  PagedPrefillCase fp16;
  fp16.dtype = DType::fp16;
  fp16.head_dim = 64;
  fp16.group = 6;
  fp16.features.logit_cap = 0.3f;  // the default scale, a cap near the small scores it gives
  fp16.q_lens = {64, 129};
  fp16.seq_lens = {1000, 1500};
  fp16.seed = rng();
  check_paged_prefill(fp16);
}

TEST_CASE("paged_prefill with attention sinks: empty requests, rows before position 0, the soft-cap") {
  std::mt19937 rng(test_seed(45));
  for (int page_size : {1, 16}) {
    for (bool cap : {false, true}) {
      PagedPrefillCase c;
      c.page_size = page_size;
      c.features.sinks = true;
      c.features.logit_cap = cap ? 4.f : 0.f;
      c.mask = !cap;
      c.unmapped_page = cap;
      c.q_lens = {70, 0, 33, 1, 65};
      c.seq_lens = {70, 40, 300, 129, 200};
      c.seed = rng();
      check_paged_prefill(c);
    }
  }
  PagedPrefillCase short_kv;  // early rows sit before position 0: zeros, LSE = the sink
  short_kv.features.sinks = true;
  short_kv.q_lens = {50, 10};
  short_kv.seq_lens = {20, 10};
  short_kv.seed = rng();
  check_paged_prefill(short_kv);
}

TEST_CASE("paged_prefill with a sliding window: windows crossing page edges, longer than the request, with sinks") {
  std::mt19937 rng(test_seed(46));
  for (int page_size : {1, 8, 16, 64}) {
    for (int window : {0, 15, 16, 17, 100, 5000}) {
      PagedPrefillCase c;
      c.page_size = page_size;
      c.features.window_left = window;
      c.features.sinks = window % 2 == 0;  // sinks + window, as gpt-oss
      c.mask = window == 17;
      c.unmapped_page = window == 100;
      c.q_lens = {70, 0, 33, 1, 65};
      c.seq_lens = {70, 40, 300, 129, 900};
      c.seed = rng();
      check_paged_prefill(c);
    }
  }
  PagedPrefillCase everything;
  everything.features.window_left = 256;
  everything.features.sinks = true;
  everything.features.logit_cap = 5.f;
  everything.scale = 1.f;
  everything.q_lens = {200, 129};
  everything.seq_lens = {3000, 1500};
  everything.seed = rng();
  check_paged_prefill(everything);
}

TEST_CASE("paged_prefill with peaked rows whose maximum rises along the keys") {
  // Scale 1 and keys growing along each request: row maxima rise block after block.
  std::mt19937 rng(test_seed(47));
  for (int page_size : {1, 16}) {
    for (float ramp : {2.f, 6.f}) {
      PagedPrefillCase c;
      c.page_size = page_size;
      c.dtype = ramp > 3.f ? DType::fp16 : DType::bf16;
      c.group = ramp > 3.f ? 6 : 4;
      c.scale = 1.f;
      c.key_ramp = ramp;
      c.features.sinks = page_size == 16;
      c.q_lens = {70, 1, 129, 33};
      c.seq_lens = {70, 1500, 2000, 300};
      c.seed = rng();
      check_paged_prefill(c);
    }
  }
}

TEST_CASE("paged_prefill keeps device lengths in bounds") {
  // More query rows than KV positions: the early rows sit before position 0 and see nothing.
  PagedPrefillCase short_kv;
  short_kv.q_lens = {50, 10};
  short_kv.seq_lens = {20, 10};
  short_kv.seed = test_seed(5);
  check_paged_prefill(short_kv);
  // Negative and oversized device lengths are clamped to [0, table capacity].
  PagedPrefillCase clamped;
  clamped.q_lens = {8, 20, 12};
  clamped.seq_lens = {30, 40, 50};
  clamped.extra_pages = 0;
  clamped.device_seq_lens = {-5, 1 << 30, 50};
  clamped.causal = false;
  clamped.seed = test_seed(6);
  check_paged_prefill(clamped);
}

TEST_CASE("paged_prefill with nothing to do launches nothing") {
  PagedPrefillArgs args;
  args.batch = 3;
  args.total_q = 0;
  args.max_q_len = 0;
  args.n_heads = 4;
  args.n_kv_heads = 1;
  args.head_dim = 128;
  args.page_size = 16;
  args.num_pages = 1;
  args.max_pages_per_seq = 1;
  CHECK_NOTHROW(Runtime::get().paged_prefill(args));
  // Every request empty: all rows zero-length, nothing written.
  PagedPrefillCase empty;
  empty.q_lens = {0, 0};
  empty.seq_lens = {10, 0};
  check_paged_prefill(empty);
}

TEST_CASE("paged_prefill random sweep") {
  const unsigned seed = test_seed(20261201);
  std::mt19937 rng(seed);
  MESSAGE(fmt::format("paged_prefill random sweep seed {}", seed));
  // 40 cases, then ASTRAI_TEST_SWEEP more (default 20).
  const int total = 40 + sweep_count(20);
  for (int n = 0; n < total; ++n) {
    const Variant& variant = kPagedVariants[rng() % std::size(kPagedVariants)];
    PagedPrefillCase c;
    c.dtype = variant.dtype;
    c.head_dim = variant.head_dim;
    c.group = variant.group;
    c.page_size = variant.page_size;
    c.n_kv_heads = 1 + rng() % 2;
    const int batch = 1 + rng() % 4;
    for (int b = 0; b < batch; ++b) {
      const int q_len = rng() % 5 == 0 ? 0 : (rng() % 3 == 0 ? 1 + rng() % 4 : 1 + rng() % 150);
      const int prefix = rng() % 2 == 0 ? 0 : static_cast<int>(rng() % 400);
      c.q_lens.push_back(q_len);
      c.seq_lens.push_back(q_len + prefix);
    }
    c.causal = rng() % 4 != 0;
    c.mask = rng() % 3 == 0;
    c.strided = rng() % 3 == 0;
    c.lse = rng() % 4 != 0;
    c.unmapped_page = rng() % 8 == 0;
    c.extra_pages = rng() % 3;
    c.seed = rng();
    check_paged_prefill(c);
  }
}

}  // TEST_SUITE
}  // namespace astrai::gpu_test
