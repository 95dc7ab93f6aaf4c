// decode (contiguous KV) against a float64 CPU reference: causal offsets, masks, LSE, layouts.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "tests/gpu/gpu_support.hpp"

namespace astrai::gpu_test {
namespace {

struct DecodeCase {
  DType dtype = DType::bf16;
  int batch = 3;
  int kv_len = 100;
  int n_kv_heads = 2;
  int group = 4;
  int head_dim = 128;
  int causal_offset = -1;
  bool mask = false;
  bool bhld = false;  // K/V stored [batch, heads, kv_len, D], passed through strides
  float scale = 0.f;
  float key_ramp = 0.f;  // > 0: key t scaled by key_gain (peaked rows whose maximum rises)
  CaseFeatures features;
  unsigned seed = test_seed(1);
  std::string describe() const {
    return fmt::format("decode dtype={} batch={} kv_len={} kv_heads={} group={} hd={} causal_offset={} "
                       "mask={} bhld={} seed={}{}", dtype_name(dtype), batch, kv_len, n_kv_heads, group,
                       head_dim, causal_offset, mask, bhld, seed,
                       (scale > 0 ? fmt::format(" scale={}", scale) : "") +
                           (key_ramp > 0 ? fmt::format(" key_ramp={}", key_ramp) : "") + features.text());
  }

};

void check_decode(const DecodeCase& c, bool graph = false) {
  std::mt19937 rng(c.seed);
  const int n_heads = c.n_kv_heads * c.group;
  const int d = c.head_dim;
  const std::int64_t s_head = c.bhld ? static_cast<std::int64_t>(c.kv_len) * d : d;
  const std::int64_t s_seq = c.bhld ? d : static_cast<std::int64_t>(c.n_kv_heads) * d;
  const std::int64_t s_batch = static_cast<std::int64_t>(c.kv_len) * c.n_kv_heads * d;
  const std::size_t kv_elems = std::max<std::size_t>(8, c.batch * s_batch);
  auto k = random_elements(kv_elems, c.dtype, rng);
  auto v = random_elements(kv_elems, c.dtype, rng);
  auto q = random_elements(std::max(8, c.batch * n_heads * d), c.dtype, rng);
  if (c.key_ramp > 0)
    for (int b = 0; b < c.batch; ++b)
      for (int t = 0; t < c.kv_len; ++t)
        for (int kvh = 0; kvh < c.n_kv_heads; ++kvh)
          scale_elements(&k[b * s_batch + t * s_seq + kvh * s_head], d, key_gain(t, c.kv_len, c.key_ramp), c.dtype);
  std::vector<std::uint8_t> mask(std::max(1, c.batch * c.kv_len), 1);
  if (c.mask) {
    std::bernoulli_distribution keep(0.6);
    for (auto& m : mask) m = keep(rng);
    for (int t = 0; t < c.kv_len && c.batch > 1; ++t) mask[static_cast<std::size_t>(c.kv_len) + t] = 0;
  }
  DeviceBuffer d_k = DeviceBuffer::from(k), d_v = DeviceBuffer::from(v), d_q = DeviceBuffer::from(q);
  DeviceBuffer d_mask = DeviceBuffer::from(mask);
  const std::size_t out_elems = std::max(8, c.batch * n_heads * d);
  DeviceBuffer d_out(out_elems * 2), d_lse(std::max(1, c.batch * n_heads) * 4);
  d_out.fill_byte(0xff);
  d_lse.fill_byte(0xff);

  DecodeArgs args;
  args.dtype = c.dtype;
  args.batch = c.batch;
  args.kv_len = c.kv_len;
  args.n_heads = n_heads;
  args.n_kv_heads = c.n_kv_heads;
  args.head_dim = d;
  args.causal_offset = c.causal_offset;
  args.scale = c.scale;
  args.logit_cap = c.features.logit_cap;
  const std::vector<float> sinks = sink_values(n_heads, c.seed);
  DeviceBuffer d_sinks = DeviceBuffer::from(sinks);
  if (c.features.sinks) args.sinks = static_cast<const float*>(d_sinks.get());
  const std::vector<float> slopes = alibi_values(n_heads);
  DeviceBuffer d_slopes = DeviceBuffer::from(slopes);
  if (c.features.alibi) args.alibi_slopes = static_cast<const float*>(d_slopes.get());
  args.window_left = c.features.window_left;
  args.q = d_q.get();
  args.k = d_k.get();
  args.v = d_v.get();
  args.k_stride_batch = args.v_stride_batch = s_batch;
  args.k_stride_seq = args.v_stride_seq = s_seq;
  args.k_stride_head = args.v_stride_head = s_head;
  args.out = d_out.get();
  args.lse = static_cast<float*>(d_lse.get());
  if (c.mask) args.mask = static_cast<const bool*>(d_mask.get());
  Runtime::get().decode(args);
  synchronize();
  const auto out = d_out.to_host<std::uint16_t>(out_elems);
  const auto lse = d_lse.to_host<float>(std::max(1, c.batch * n_heads));

  if (graph) {
    auto decode_on = [args](CUstream stream) mutable {
      args.stream = stream;
      Runtime::get().decode(args);
    };
    check_graph_replay(decode_on, &d_out, out, /*replays=*/1, c.describe());
  }

  RowCheck check(testing::attention_tolerance(c.dtype));
  const double scale = c.scale > 0 ? c.scale : 1.0 / std::sqrt(static_cast<double>(d));
  const int len = c.causal_offset < 0 ? c.kv_len : std::min(c.kv_len, c.causal_offset + 1);
  // The window counts back from the query's position (causal_offset, or kv_len - 1).
  const long long position = c.causal_offset < 0 ? c.kv_len - 1LL : c.causal_offset;
  const long long window_first = c.features.window_left < 0 ? 0 : position - c.features.window_left;
  std::vector<float> k_rows(static_cast<std::size_t>(std::max(len, 1)) * d), v_rows(k_rows.size()), q_row(d);
  std::vector<char> keep(static_cast<std::size_t>(std::max(len, 1)));
  std::vector<double> want;
  for (int b = 0; b < c.batch; ++b)
    for (int kvh = 0; kvh < c.n_kv_heads; ++kvh) {
      for (int t = 0; t < len; ++t) {
        keep[t] = mask[b * c.kv_len + t] && t >= window_first;
        for (int i = 0; i < d; ++i) {
          k_rows[static_cast<std::size_t>(t) * d + i] = bits_to_float(k[b * s_batch + t * s_seq + kvh * s_head + i], c.dtype);
          v_rows[static_cast<std::size_t>(t) * d + i] = bits_to_float(v[b * s_batch + t * s_seq + kvh * s_head + i], c.dtype);
        }
      }
      for (int h = kvh * c.group; h < (kvh + 1) * c.group; ++h) {
        for (int i = 0; i < d; ++i) q_row[i] = bits_to_float(q[(b * n_heads + h) * d + i], c.dtype);
        RowFeatures features;
        features.logit_cap = c.features.logit_cap;
        if (c.features.sinks) features.sink = sinks[h];
        if (c.features.alibi) {
          features.alibi_slope = slopes[h];
          features.query_position = position;
        }
        double want_lse = 0, lse_slack = 0;
        const bool non_empty = attend_row(q_row.data(), k_rows.data(), v_rows.data(), len, keep, d, scale, &want,
                                          &want_lse, features, &lse_slack);
        const auto where = [&] { return fmt::format("b={} h={}", b, h); };
        check.row_bits(&out[static_cast<std::size_t>(b * n_heads + h) * d], c.dtype, want.data(), d, non_empty, where);
        check.lse(lse[b * n_heads + h], want_lse, where, lse_slack);
      }
    }
  // The tail of a buffer padded to 8 elements holds the poison.
  for (std::size_t i = static_cast<std::size_t>(c.batch) * n_heads * d; i < out_elems; ++i)
    check.expect(out[i] == 0xffff, [&] { return fmt::format("element {} past the rows was written", i); });
  report_case("decode", c.dtype, c.describe(), check);
}

}  // namespace

TEST_SUITE("decode") {

TEST_CASE("decode matches the reference across head dims, groups and causal offsets") {
  std::mt19937 rng(test_seed(17));
  for (int head_dim : {32, 64, 80, 96, 128, 256}) {
    for (int group : {1, 4, 6, 8, 16}) {
      DecodeCase c;
      c.head_dim = head_dim;
      c.group = group;
      c.kv_len = 1 + rng() % 900;
      c.causal_offset = (rng() % 2) ? -1 : static_cast<int>(rng() % (c.kv_len + 5));
      c.dtype = rng() % 3 == 0 ? DType::fp16 : DType::bf16;
      c.seed = rng();
      check_decode(c);
    }
  }
}

TEST_CASE("decode with masks, a fully masked row, bhld strides, and edge lengths") {
  std::mt19937 rng(test_seed(18));
  for (int kv_len : {0, 1, 63, 64, 65, 32768}) {
    DecodeCase c;
    c.kv_len = kv_len;
    c.mask = kv_len > 0;
    c.bhld = kv_len % 2 == 1;
    c.batch = kv_len > 10000 ? 2 : 3;
    c.seed = rng();
    check_decode(c);
  }
}

TEST_CASE("decode captured in a CUDA graph replays bit for bit") {
  DecodeCase c;
  c.kv_len = 5000;
  c.mask = true;
  check_decode(c, /*graph=*/true);
}

TEST_CASE("decode with a logit soft-cap: caps below, near and above the score range") {
  std::mt19937 rng(test_seed(19));
  // With scale 1 the scores of random rows spread over about +-10 (head dim 128).
  for (float cap : {0.5f, 4.f, 30.f}) {
    for (int head_dim : {64, 128}) {
      DecodeCase c;
      c.head_dim = head_dim;
      c.group = head_dim == 64 ? 6 : 4;
      c.kv_len = 1 + rng() % 3000;
      c.scale = 1.f;
      c.features.logit_cap = cap;
      c.mask = rng() % 2 == 0;
      c.causal_offset = rng() % 2 ? -1 : static_cast<int>(rng() % (c.kv_len + 3));
      c.dtype = head_dim == 64 ? DType::fp16 : DType::bf16;
      c.seed = rng();
      check_decode(c);
    }
  }
  DecodeCase split;  // split across CTAs: the combine merges capped partial results
  split.kv_len = 20000;
  split.batch = 2;
  split.features.logit_cap = 0.2f;
  split.seed = test_seed(5);
  check_decode(split);
}

TEST_CASE("decode with ALiBi: short and split rows, causal offsets, with the soft-cap, sinks and a window") {
  std::mt19937 rng(test_seed(21));
  for (int kv_len : {1, 65, 900, 30000}) {
    DecodeCase c;
    c.kv_len = kv_len;
    c.batch = kv_len > 10000 ? 2 : 3;
    c.features.alibi = true;
    c.features.logit_cap = kv_len == 900 ? 3.f : 0.f;
    c.features.sinks = kv_len == 65;
    c.features.window_left = kv_len == 30000 ? 4000 : -1;
    c.mask = kv_len == 900;
    c.causal_offset = kv_len == 65 ? 20 : -1;
    c.group = kv_len == 1 ? 6 : 4;
    c.head_dim = kv_len == 1 ? 64 : 128;
    c.dtype = kv_len == 900 ? DType::fp16 : DType::bf16;
    c.seed = rng();
    check_decode(c);
  }
}

TEST_CASE("decode with attention sinks: empty, masked, causal and split rows, with the soft-cap") {
  std::mt19937 rng(test_seed(20));
  for (int kv_len : {0, 1, 65, 900, 30000}) {
    DecodeCase c;
    c.kv_len = kv_len;
    c.batch = kv_len > 10000 ? 2 : 3;
    c.features.sinks = true;
    c.features.logit_cap = kv_len == 900 ? 3.f : 0.f;
    c.mask = kv_len > 0 && kv_len < 10000;  // batch row 1 fully masked
    c.causal_offset = kv_len == 65 ? 20 : -1;
    c.group = kv_len == 1 ? 6 : 4;
    c.head_dim = kv_len == 1 ? 64 : 128;
    c.seed = rng();
    check_decode(c);
  }
}

TEST_CASE("decode with a sliding window: causal offsets inside and past kv_len, long windows, sinks") {
  std::mt19937 rng(test_seed(21));
  const int cases[][3] = {  // kv_len, causal_offset, window_left
      {1000, -1, 0}, {1000, -1, 63}, {1000, -1, 64}, {1000, -1, 5000}, {1000, 500, 100},
      {1000, 1100, 150},  // the query sits past kv_len: the window keeps kv 950..999
      {1000, 1100, 50},   // ... and here it ends before the keys: nothing kept
      {0, -1, 10},        {30000, -1, 4095}, {30000, 20000, 20000}};
  for (const auto& entry : cases) {
    DecodeCase c;
    c.kv_len = entry[0];
    c.causal_offset = entry[1];
    c.features.window_left = entry[2];
    c.features.sinks = entry[2] % 2 == 1;
    c.mask = entry[2] == 100;
    c.batch = c.kv_len > 10000 ? 2 : 3;
    c.seed = rng();
    check_decode(c);
  }
}

TEST_CASE("decode with peaked rows whose maximum rises along the keys, through the split merge") {
  // Scale 1 and keys growing along the sequence: each row's maximum rises block after block,
  // and on long rows split after split, so the merge must rescale the earlier splits.
  std::mt19937 rng(test_seed(22));
  for (int kv_len : {70, 900, 5000, 30000}) {
    for (float ramp : {2.f, 6.f}) {
      DecodeCase c;
      c.kv_len = kv_len;
      c.batch = kv_len > 10000 ? 2 : 3;
      c.scale = 1.f;
      c.key_ramp = ramp;
      c.dtype = ramp > 3.f ? DType::fp16 : DType::bf16;
      c.features.sinks = kv_len == 5000;
      c.features.logit_cap = kv_len == 900 && ramp > 3.f ? 30.f : 0.f;
      c.seed = rng();
      check_decode(c);
    }
  }
}

TEST_CASE("decode random sweep") {
  // 30 cases with fully random variants, then ASTRAI_TEST_SWEEP more (default 60) drawn from
  // variants the targeted cases already compiled.
  const unsigned seed = test_seed(4242);
  std::mt19937 rng(seed);
  MESSAGE(fmt::format("decode random sweep seed {}", seed));
  const int total = 30 + sweep_count(60);
  for (int i = 0; i < total; ++i) {
    DecodeCase c;
    const bool pooled = i >= 30;
    const int pooled_head_dims[] = {32, 64, 80, 96, 128, 256};
    const int pooled_groups[] = {1, 4, 6, 8, 16};
    c.dtype = !pooled && rng() % 3 == 0 ? DType::fp16 : DType::bf16;
    c.head_dim = pooled ? pooled_head_dims[rng() % 6] : 16 * static_cast<int>(2 + rng() % 15);
    c.group = pooled ? pooled_groups[rng() % 5] : 1 + static_cast<int>(rng() % 16);
    c.n_kv_heads = 1 + rng() % 3;
    c.batch = 1 + rng() % 4;
    c.kv_len = rng() % 3000;
    c.causal_offset = rng() % 3 == 0 ? static_cast<int>(rng() % (c.kv_len + 2)) : -1;
    c.mask = rng() % 3 == 0;
    c.bhld = rng() % 2 == 0;
    if (rng() % 4 == 0) {  // a peaked row now and then
      c.scale = 1.f;
      c.key_ramp = 4.f;
    }
    c.seed = rng();
    check_decode(c);
  }
}

}  // TEST_SUITE
}  // namespace astrai::gpu_test
