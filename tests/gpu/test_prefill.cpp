// prefill (contiguous KV) against a float64 CPU reference on random data: causal offsets,
// masks, empty rows, layouts, LSE. Outputs and LSE are poisoned first; every element outside
// the written rows must keep the poison. Variants (dtype, head dim, group) are drawn from a
// short list so the file compiles few kernels.
#include "tests/gpu/prefill_support.hpp"

namespace astrai::gpu_test {
namespace {

// ---------------------------------------------------------------------------------------------
// prefill (contiguous KV)

enum class MaskShape { none, per_batch, broadcast, per_query, per_query_broadcast };
enum class Layout { dense, padded, bhld };

const char* mask_name(MaskShape shape) {
  switch (shape) {
    case MaskShape::none: return "none";
    case MaskShape::per_batch: return "[batch,kv]";
    case MaskShape::broadcast: return "[1,kv]";
    case MaskShape::per_query: return "[batch,q,kv]";
    case MaskShape::per_query_broadcast: return "[1,q,kv]";
  }
  return "?";
}

const char* layout_name(Layout layout) {
  switch (layout) {
    case Layout::dense: return "dense";
    case Layout::padded: return "padded";
    case Layout::bhld: return "bhld";
  }
  return "?";
}

struct PrefillCase {
  DType dtype = DType::bf16;
  int batch = 2;
  int q_len = 64;
  int kv_len = 64;
  int n_kv_heads = 2;
  int group = 4;
  int head_dim = 128;
  int causal_offset = -1;
  MaskShape mask = MaskShape::none;
  // 3D masks: this many rows of mask batch 0 keep nothing; 2D masks: any value > 0 empties the
  // last mask row (a whole request, or every request when broadcast).
  int empty_rows = 0;
  Layout layout = Layout::dense;  // dense passes 0 strides (the defaults); padded interleaves
                                  // K and V in one buffer and pads every row; bhld is head-major
  bool lse = true;
  float scale = 0.f;
  // > 0: key j is scaled by 1 + key_ramp * (kv_len - 1 - j) / kv_len, so scores grow towards the
  // KV's start, where the kernels' walks (from the KV's end) arrive last: row maxima keep rising.
  float key_ramp = 0.f;
  CaseFeatures features;
  unsigned seed = test_seed(1);

  std::string describe() const {
    return fmt::format("prefill dtype={} hd={} group={} kv_heads={} batch={} q_len={} kv_len={} "
                       "causal_offset={} mask={} empty_rows={} layout={} lse={} scale={} key_ramp={} "
                       "seed={}{}",
                       dtype_name(dtype), head_dim, group, n_kv_heads, batch, q_len, kv_len,
                       causal_offset, mask_name(mask), empty_rows, layout_name(layout), lse, scale,
                       key_ramp, seed, features.text());
  }
};

void check_prefill(const PrefillCase& c) {
  std::mt19937 rng(c.seed);
  const int n_heads = c.n_kv_heads * c.group;
  const int d = c.head_dim;
  const int pad = c.layout == Layout::padded ? 8 : 0;
  const std::int64_t q_rows = std::max(1, c.q_len);
  const std::int64_t kv_rows = std::max(1, c.kv_len);

  // Strides of q and out (same layout), and of K and V.
  std::int64_t q_head, q_seq, q_batch, kv_head, kv_seq, kv_batch, v_offset = 0;
  if (c.layout == Layout::bhld) {
    q_head = q_rows * d;
    q_seq = d;
    q_batch = n_heads * q_head;
    kv_head = kv_rows * d;
    kv_seq = d;
    kv_batch = c.n_kv_heads * kv_head;
  } else {
    q_head = d + pad;
    q_seq = n_heads * q_head + pad;
    q_batch = q_rows * q_seq + 2 * pad;
    kv_head = d + pad;
    // Padded: each position holds the K heads, then the V heads, in one buffer.
    kv_seq = c.n_kv_heads * kv_head * (c.layout == Layout::padded ? 2 : 1);
    kv_batch = kv_rows * kv_seq + pad;
    if (c.layout == Layout::padded) v_offset = c.n_kv_heads * kv_head;
  }
  const std::size_t q_elems = static_cast<std::size_t>(std::max(1, c.batch) * q_batch);
  const std::size_t kv_elems = static_cast<std::size_t>(std::max(1, c.batch) * kv_batch);
  const std::vector<std::uint16_t> q = random_elements(q_elems, c.dtype, rng);
  std::vector<std::uint16_t> k = random_elements(kv_elems, c.dtype, rng);
  if (c.key_ramp > 0)
    for (int b = 0; b < c.batch; ++b)
      for (int j = 0; j < c.kv_len; ++j) {
        const float gain =
            1.f + c.key_ramp * static_cast<float>(c.kv_len - 1 - j) / static_cast<float>(c.kv_len);
        for (std::int64_t e = 0; e < kv_seq; ++e) {
          std::uint16_t& x = k[static_cast<std::size_t>(b * kv_batch + j * kv_seq + e)];
          x = float_to_bits(bits_to_float(x, c.dtype) * gain, c.dtype);
        }
      }
  const std::vector<std::uint16_t> v_separate = c.layout == Layout::padded
                                                    ? std::vector<std::uint16_t>()
                                                    : random_elements(kv_elems, c.dtype, rng);
  const std::vector<std::uint16_t>& v = c.layout == Layout::padded ? k : v_separate;

  // Mask [mask_batch, mask_q_len, mask_stride_q].
  const bool has_mask = c.mask != MaskShape::none;
  const int mask_batch =
      (c.mask == MaskShape::broadcast || c.mask == MaskShape::per_query_broadcast) ? 1 : c.batch;
  const int mask_q_len =
      (c.mask == MaskShape::per_query || c.mask == MaskShape::per_query_broadcast) ? c.q_len : 1;
  const std::int64_t mask_stride_q = kv_rows + (c.layout == Layout::padded ? 3 : 0);
  const std::int64_t mask_stride_batch =
      mask_q_len * mask_stride_q + (c.layout == Layout::padded ? 5 : 0);
  std::vector<std::uint8_t> mask(
      static_cast<std::size_t>(std::max<std::int64_t>(1, mask_batch * mask_stride_batch)), 0);
  if (has_mask) {
    std::bernoulli_distribution keep(0.75);
    for (auto& m : mask) m = keep(rng) ? 1 : 0;
    if (c.empty_rows > 0) {
      if (mask_q_len > 1) {
        const int rows[] = {0, c.q_len / 2, c.q_len - 1, 1, 2, 3};
        for (int r = 0; r < std::min(c.empty_rows, 6); ++r)
          if (rows[r] < c.q_len) std::fill_n(mask.begin() + rows[r] * mask_stride_q, c.kv_len, 0);
      } else {
        std::fill_n(mask.begin() + (mask_batch - 1) * mask_stride_batch, c.kv_len, 0);
      }
    }
  }

  DeviceBuffer d_q = DeviceBuffer::from(q);
  DeviceBuffer d_k = DeviceBuffer::from(k);
  DeviceBuffer d_v = c.layout == Layout::padded ? DeviceBuffer(16) : DeviceBuffer::from(v_separate);
  DeviceBuffer d_mask = DeviceBuffer::from(mask);
  DeviceBuffer d_out(q_elems * 2);
  const std::size_t lse_count = static_cast<std::size_t>(std::max(1, c.batch * c.q_len * n_heads));
  DeviceBuffer d_lse(lse_count * sizeof(float));
  d_out.fill_byte(0xff);
  d_lse.fill_byte(0xff);

  PrefillArgs args;
  args.dtype = c.dtype;
  args.batch = c.batch;
  args.q_len = c.q_len;
  args.kv_len = c.kv_len;
  args.n_heads = n_heads;
  args.n_kv_heads = c.n_kv_heads;
  args.head_dim = d;
  args.scale = c.scale;
  args.logit_cap = c.features.logit_cap;
  const std::vector<float> sinks = sink_values(n_heads, c.seed);
  DeviceBuffer d_sinks = DeviceBuffer::from(sinks);
  if (c.features.sinks) args.sinks = static_cast<const float*>(d_sinks.get());
  const std::vector<float> slopes = alibi_values(n_heads);
  DeviceBuffer d_slopes = DeviceBuffer::from(slopes);
  if (c.features.alibi) args.alibi_slopes = static_cast<const float*>(d_slopes.get());
  args.window_left = c.features.window_left;
  args.causal_offset = c.causal_offset;
  args.q = d_q.get();
  args.out = d_out.get();
  if (c.kv_len > 0) {  // with no KV positions nothing may be read: pass no pointers at all
    args.k = d_k.get();
    args.v = c.layout == Layout::padded
                 ? static_cast<const void*>(static_cast<const std::uint16_t*>(d_k.get()) + v_offset)
                 : d_v.get();
  }
  if (c.layout != Layout::dense) {
    args.q_stride_batch = q_batch;
    args.q_stride_seq = q_seq;
    args.q_stride_head = q_head;
    args.out_stride_batch = q_batch;
    args.out_stride_seq = q_seq;
    args.out_stride_head = q_head;
    args.k_stride_batch = args.v_stride_batch = kv_batch;
    args.k_stride_seq = args.v_stride_seq = kv_seq;
    args.k_stride_head = args.v_stride_head = kv_head;
  }
  if (has_mask) {
    args.mask = reinterpret_cast<const bool*>(d_mask.get());
    args.mask_batch = mask_batch;
    args.mask_q_len = mask_q_len;
    if (c.layout == Layout::padded) {
      args.mask_stride_q = mask_stride_q;
      args.mask_stride_batch = mask_stride_batch;
    }
  }
  if (c.lse) args.lse = static_cast<float*>(d_lse.get());
  Runtime::get().prefill(args);
  synchronize();
  const std::vector<std::uint16_t> out = d_out.to_host<std::uint16_t>(q_elems);
  const std::vector<float> lse = d_lse.to_host<float>(lse_count);

  // Reference, with K and V of one (request, KV head) gathered into dense float rows.
  const double scale = c.scale > 0 ? c.scale : 1.0 / std::sqrt(static_cast<double>(d));
  RowFeatures row_features;
  row_features.logit_cap = c.features.logit_cap;
  Verdict verdict(c.dtype);
  std::vector<char> written(q_elems, 0);
  std::vector<float> k_rows(static_cast<std::size_t>(kv_rows) * d), v_rows(k_rows.size()), q_row(d);
  std::vector<char> keep(static_cast<std::size_t>(kv_rows));
  std::vector<double> want;
  for (int b = 0; b < c.batch; ++b) {
    for (int kvh = 0; kvh < c.n_kv_heads; ++kvh) {
      for (int j = 0; j < c.kv_len; ++j)
        for (int e = 0; e < d; ++e) {
          const std::int64_t at = b * kv_batch + j * kv_seq + kvh * kv_head + e;
          k_rows[static_cast<std::size_t>(j) * d + e] = bits_to_float(k[at], c.dtype);
          v_rows[static_cast<std::size_t>(j) * d + e] = bits_to_float(v[v_offset + at], c.dtype);
        }
      for (int i = 0; i < c.q_len; ++i) {
        const std::uint8_t* mask_row =
            mask.data() + (mask_batch == 1 ? 0 : b) * mask_stride_batch +
            (mask_q_len == 1 ? 0 : i) * mask_stride_q;
        for (int j = 0; j < c.kv_len; ++j)
          keep[j] = (c.causal_offset < 0 || j <= static_cast<std::int64_t>(c.causal_offset) + i) &&
                    (c.features.window_left < 0 ||
                     j >= static_cast<std::int64_t>(c.causal_offset) + i - c.features.window_left) &&
                    (!has_mask || mask_row[j] != 0);
        for (int h = kvh * c.group; h < (kvh + 1) * c.group; ++h) {
          const std::int64_t base = b * q_batch + i * q_seq + h * q_head;
          for (int e = 0; e < d; ++e) q_row[e] = bits_to_float(q[base + e], c.dtype);
          double lse_want = 0;
          row_features.sink = c.features.sinks ? sinks[h] : -INFINITY;
          row_features.alibi_slope = c.features.alibi ? slopes[h] : 0.0;
          row_features.query_position = static_cast<long long>(c.causal_offset) + i;
          const bool non_empty = attend_row(q_row.data(), k_rows.data(), v_rows.data(), c.kv_len,
                                            keep, d, scale, &want, &lse_want, row_features);
          const std::size_t lse_index = (static_cast<std::size_t>(b) * c.q_len + i) * n_heads + h;
          check_row(&verdict, c.dtype, out, base, want, non_empty, c.lse ? &lse[lse_index] : nullptr,
                    lse_want, RowId{b, i, h});
          std::fill_n(written.begin() + base, d, 1);
        }
      }
    }
  }
  check_poison(&verdict, out, written);
  if (!c.lse) check_lse_untouched(&verdict.check, lse);
  report("prefill", c.dtype, c.describe(), &verdict);
}

// The variants the random sweep draws from; each also appears in a targeted case, so the
// sweep compiles nothing new.
const Variant kPrefillVariants[] = {
    {DType::bf16, 128, 4, 0}, {DType::bf16, 64, 4, 0},  {DType::bf16, 80, 4, 0},
    {DType::bf16, 32, 4, 0},  {DType::bf16, 256, 4, 0}, {DType::bf16, 128, 1, 0},
    {DType::bf16, 128, 6, 0}, {DType::fp16, 128, 4, 0}, {DType::fp16, 64, 4, 0},
};

}  // namespace

TEST_SUITE("prefill") {

TEST_CASE("prefill matches the reference across head dims, causal and not") {
  std::mt19937 rng(test_seed(31));
  for (int head_dim : {32, 64, 80, 96, 128, 256}) {
    for (bool causal : {true, false}) {
      PrefillCase c;
      c.head_dim = head_dim;
      c.q_len = 100;
      c.kv_len = 230;
      c.causal_offset = causal ? c.kv_len - c.q_len : -1;
      c.seed = rng();
      check_prefill(c);
    }
  }
}

TEST_CASE("prefill matches the reference across GQA groups") {
  std::mt19937 rng(test_seed(32));
  for (int group : {1, 4, 6, 8, 16}) {
    PrefillCase c;
    c.group = group;
    c.n_kv_heads = group >= 8 ? 1 : 2;
    c.q_len = 77;
    c.kv_len = 150;
    c.causal_offset = c.kv_len - c.q_len;
    c.seed = rng();
    check_prefill(c);
  }
}

TEST_CASE("prefill with a GQA group's heads packed in one tile: lengths at the packed tiles' edges") {
  // On sm_90a, a group's query heads go into the tile in packs (a row per head and position):
  // the whole group where it divides 64, else the largest power of two dividing it (2 of 6, 4
  // of 12, 8 of 24, 64 of 128; odd groups unpacked). 128 rows hold 128 / pack positions, the
  // wide tiling's 192 rows 192 / pack. Lengths around those counts, every head and position
  // checked (LSE too), causal and not.
  std::mt19937 rng(test_seed(37));
  for (int group : {2, 4, 8, 16, 64, 3, 6, 12, 24, 128}) {
    for (int q_len : {1, 15, 16, 17, 31, 32, 33, 47, 48, 49, 97}) {
      PrefillCase c;
      c.group = group;
      c.n_kv_heads = group >= 16 ? 1 : 2;
      c.batch = group >= 16 ? 1 : 2;
      c.q_len = q_len;
      c.kv_len = 200;
      c.causal_offset = c.kv_len - c.q_len;
      c.seed = rng();
      check_prefill(c);
      c.causal_offset = -1;
      c.seed = rng();
      check_prefill(c);
    }
  }
}

TEST_CASE("prefill at the tile edges: q_len 1, 63..65, 127..129 and kv_len 0, 1, 33, 65, 2048") {
  // Query tiles are 64 rows (CUDA-core path, head dim > 128) or 128 rows (tensor cores up to
  // head dim 128, two 16-row MMA tiles per warp); KV stages 32 or 64 tokens.
  std::mt19937 rng(test_seed(33));
  for (int q_len : {1, 63, 64, 65, 127, 128, 129}) {
    for (int kv_len : {0, 1, 33, 65, 2048}) {
      if (kv_len == 2048 && q_len != 65) continue;  // one long case is enough
      PrefillCase c;
      c.batch = kv_len == 2048 ? 1 : 2;
      c.n_kv_heads = kv_len == 2048 ? 1 : 2;
      c.q_len = q_len;
      c.kv_len = kv_len;
      c.causal_offset = std::max(0, kv_len - q_len);
      c.seed = rng();
      check_prefill(c);
      c.causal_offset = -1;
      c.seed = rng();
      check_prefill(c);
    }
  }
  // A long prompt with several query tiles per head.
  PrefillCase prompt;
  prompt.batch = 1;
  prompt.n_kv_heads = 1;
  prompt.q_len = 300;
  prompt.kv_len = 2048;
  prompt.causal_offset = prompt.kv_len - prompt.q_len;
  prompt.seed = rng();
  check_prefill(prompt);
}

TEST_CASE("prefill grids of more tiles than the GPU has SMs: ragged tiles, causal and not, an empty KV") {
  // On sm_90a, contiguous prefill on three consumers (hd64; hd128 where the wide tiling is
  // taken or forced) launches a CTA an SM, each walking tiles from both ends of every row of
  // tiles: these grids hold 180-432 tiles of three consumers, so CTAs walk two or more. An empty
  // KV gives CTAs runs of tiles with nothing to walk, whose Q-slot barriers must keep step with
  // the producer's (else a hang).
  std::mt19937 rng(test_seed(39));
  for (int head_dim : {64, 128}) {
    for (const auto& [group, batch, q_len, kv_len, causal_offset] :
         std::vector<std::tuple<int, int, int, int, int>>{
             {6, 24, 200, 260, 60}, {4, 30, 130, 77, -1}, {1, 100, 97, 97, 0}, {4, 60, 64, 0, -1},
             {1, 600, 64, 0, -1}}) {
      PrefillCase c;
      c.head_dim = head_dim;
      c.group = group;
      c.n_kv_heads = 2;
      c.batch = batch;
      c.q_len = q_len;
      c.kv_len = kv_len;
      c.causal_offset = causal_offset;
      c.seed = rng();
      check_prefill(c);
    }
  }
}

TEST_CASE("prefill honours causal offsets other than the prompt tail") {
  std::mt19937 rng(test_seed(34));
  // 0: a fresh prompt against a longer cache; small: the first rows see few tokens; past the
  // end: every row sees everything; q_len > kv_len with offset 0: late rows are capped by kv_len.
  const std::pair<int, int> shapes[] = {{100, 300}, {100, 300}, {100, 300}, {150, 90}, {64, 64}};
  const int offsets[] = {0, 5, 1000, 0, 63};
  for (int i = 0; i < 5; ++i) {
    PrefillCase c;
    c.q_len = shapes[i].first;
    c.kv_len = shapes[i].second;
    c.causal_offset = offsets[i];
    c.seed = rng();
    check_prefill(c);
  }
}

TEST_CASE("prefill with 2D and 3D masks, broadcasting, and fully masked rows") {
  std::mt19937 rng(test_seed(35));
  for (MaskShape shape : {MaskShape::per_batch, MaskShape::broadcast, MaskShape::per_query,
                          MaskShape::per_query_broadcast}) {
    for (bool causal : {false, true}) {
      PrefillCase c;
      c.batch = 3;
      c.q_len = 70;
      c.kv_len = 140;
      c.mask = shape;
      c.causal_offset = causal ? c.kv_len - c.q_len : -1;
      c.empty_rows = causal ? 3 : 0;
      c.seed = rng();
      check_prefill(c);
    }
  }
  // Every row of every request masked out: zeros and LSE -inf everywhere.
  PrefillCase all_masked;
  all_masked.mask = MaskShape::broadcast;
  all_masked.empty_rows = 1;
  all_masked.q_len = 65;
  all_masked.kv_len = 100;
  check_prefill(all_masked);
  // Rows whose causal window holds only masked positions.
  PrefillCase early_rows;
  early_rows.mask = MaskShape::per_query;
  early_rows.empty_rows = 6;
  early_rows.causal_offset = 0;
  early_rows.q_len = 64;
  early_rows.kv_len = 64;
  early_rows.seed = test_seed(9);
  check_prefill(early_rows);
}

TEST_CASE("prefill with padded strides, interleaved K/V and a head-major layout") {
  std::mt19937 rng(test_seed(36));
  for (Layout layout : {Layout::padded, Layout::bhld}) {
    for (int head_dim : {64, 128}) {
      PrefillCase c;
      c.layout = layout;
      c.head_dim = head_dim;
      c.q_len = 90;
      c.kv_len = 200;
      c.causal_offset = 110;
      c.mask = layout == Layout::padded ? MaskShape::per_query : MaskShape::per_batch;
      c.seed = rng();
      check_prefill(c);
    }
  }
}

TEST_CASE("prefill in fp16, with an explicit scale, and without LSE") {
  std::mt19937 rng(test_seed(37));
  for (int head_dim : {64, 128}) {
    PrefillCase c;
    c.dtype = DType::fp16;
    c.head_dim = head_dim;
    c.q_len = 129;
    c.kv_len = 257;
    c.causal_offset = c.kv_len - c.q_len;
    c.seed = rng();
    check_prefill(c);
  }
  PrefillCase scaled;
  scaled.scale = 0.3f;
  scaled.lse = false;
  scaled.q_len = 50;
  scaled.kv_len = 120;
  scaled.seed = rng();
  check_prefill(scaled);
}

TEST_CASE("prefill keeps its accuracy while row maxima climb along the walk") {
  // Keys grow towards the KV's start and the scale is 1: each row's maximum rises block after
  // block, by more and by less than the slack the Hopper kernel lets its softmax reference lag
  // (8 in log2 units), so both its rescaling and its skipped rescales are exercised.
  std::mt19937 rng(test_seed(41));
  for (int head_dim : {64, 128, 256})
    for (bool causal : {false, true}) {
      PrefillCase c;
      c.head_dim = head_dim;
      c.q_len = causal ? 300 : 129;
      c.kv_len = 1500;
      c.causal_offset = causal ? c.kv_len - c.q_len : -1;
      c.scale = 1.f;
      c.key_ramp = 5.f;
      c.dtype = head_dim == 64 ? DType::fp16 : DType::bf16;
      c.seed = rng();
      check_prefill(c);
    }
}

TEST_CASE("prefill with a logit soft-cap: caps below, near and above the score range") {
  std::mt19937 rng(test_seed(38));
  // With scale 1 the scores of random rows spread over about +-10 (head dim 128).
  for (float cap : {0.5f, 4.f, 30.f}) {
    for (bool causal : {true, false}) {
      PrefillCase c;
      c.q_len = 1 + rng() % 200;
      c.kv_len = c.q_len + rng() % 300;
      c.causal_offset = causal ? c.kv_len - c.q_len : -1;
      c.scale = 1.f;
      c.features.logit_cap = cap;
      c.mask = cap == 4.f ? MaskShape::per_query : MaskShape::none;
      c.head_dim = causal ? 128 : 64;
      c.group = causal ? 4 : 6;
      c.dtype = causal ? DType::bf16 : DType::fp16;
      c.seed = rng();
      check_prefill(c);
    }
  }
  PrefillCase small;  // the default scale, a cap near the small scores it gives
  small.features.logit_cap = 0.3f;
  small.q_len = 130;
  small.kv_len = 260;
  small.causal_offset = 130;
  small.seed = rng();
  check_prefill(small);
}

TEST_CASE("prefill with ALiBi: causal prompts and chunks, with the soft-cap, sinks, a window and masks") {
  std::mt19937 rng(test_seed(41));
  for (int variant = 0; variant < 4; ++variant) {
    PrefillCase c;
    c.q_len = 1 + rng() % 300;
    c.kv_len = c.q_len + (variant % 2 == 0 ? 0 : rng() % 400);
    c.causal_offset = c.kv_len - c.q_len;
    c.features.alibi = true;
    c.features.logit_cap = variant == 1 ? 4.f : 0.f;
    c.features.sinks = variant == 2;
    c.features.window_left = variant == 3 ? 50 : -1;
    c.mask = variant == 2 ? MaskShape::per_query : c.mask;
    c.head_dim = variant == 1 ? 64 : 128;
    c.dtype = variant == 1 ? DType::fp16 : DType::bf16;
    c.seed = rng();
    check_prefill(c);
  }
}

TEST_CASE("prefill with attention sinks: causal and not, rows with nothing kept, with the soft-cap") {
  std::mt19937 rng(test_seed(39));
  for (bool causal : {true, false}) {
    for (bool cap : {false, true}) {
      PrefillCase c;
      c.q_len = 1 + rng() % 200;
      c.kv_len = c.q_len + rng() % 300;
      c.causal_offset = causal ? c.kv_len - c.q_len : -1;
      c.mask = MaskShape::per_query;
      c.empty_rows = 3;  // rows with nothing kept: zeros, LSE = the sink
      c.features.sinks = true;
      c.features.logit_cap = cap ? 4.f : 0.f;
      c.head_dim = cap ? 64 : 128;
      c.group = cap ? 6 : 4;
      c.dtype = cap ? DType::fp16 : DType::bf16;
      c.seed = rng();
      check_prefill(c);
    }
  }
  PrefillCase early;  // a causal offset of 0 over a longer prompt
  early.q_len = 130;
  early.kv_len = 140;
  early.causal_offset = 0;
  early.features.sinks = true;
  early.seed = rng();
  check_prefill(early);
}

TEST_CASE("prefill with a sliding window: short, tile-sized and longer-than-prompt windows, with sinks and masks") {
  std::mt19937 rng(test_seed(40));
  for (int window : {0, 1, 31, 32, 63, 64, 100, 257, 10000}) {
    for (int head_dim : {64, 128}) {
      PrefillCase c;
      c.head_dim = head_dim;
      c.group = head_dim == 64 ? 6 : 4;
      c.q_len = 1 + rng() % 300;
      c.kv_len = c.q_len + rng() % 400;
      c.causal_offset = rng() % 4 == 0 ? static_cast<int>(rng() % (c.kv_len + 1)) : c.kv_len - c.q_len;
      c.features.window_left = window;
      c.features.sinks = window % 2 == 1;  // sinks + window, as gpt-oss
      c.mask = window == 100 ? MaskShape::per_query : MaskShape::none;
      c.dtype = head_dim == 64 ? DType::fp16 : DType::bf16;
      c.seed = rng();
      check_prefill(c);
    }
  }
  PrefillCase everything;
  everything.q_len = 333;
  everything.kv_len = 1500;
  everything.causal_offset = 1167;
  everything.features.window_left = 128;
  everything.features.sinks = true;
  everything.features.logit_cap = 5.f;
  everything.scale = 1.f;
  everything.seed = rng();
  check_prefill(everything);
}

TEST_CASE("on sm_90a an unmasked prefill with the soft-cap, sinks and a window runs the Hopper kernel, named by them") {
  if (!sm90a_target()) return not_run("prefill Hopper features case: needs an sm_90a target");
  PrefillCase c;
  c.head_dim = 128;
  c.q_len = 300;
  c.kv_len = 900;
  c.causal_offset = 600;
  c.features.logit_cap = 5.f;
  c.features.sinks = true;
  c.features.window_left = 200;
  c.seed = test_seed(78);
  check_prefill(c);
  int portable = 0;
  int hopper = 0;
  for (const auto& name : Runtime::get().loaded_variants()) {
    const bool features =
        name.find(".swa.cap.sink.") != std::string::npos && name.rfind("prefill.bf16.hd128.g4.", 0) == 0;
    portable += features && name.find("wgmma") == std::string::npos;
    hopper += features && name.find(".wgmma.") != std::string::npos;
  }
  const bool on_hopper = !mma_forced_off() && !wgmma_forced_off();
  CHECK(hopper == (on_hopper ? 1 : 0));
  CHECK(portable == (on_hopper ? 0 : 1));
}

TEST_CASE("on sm_90a an unmasked prefill runs the Hopper kernel (unless switched off), a masked one the portable "
          "kernel") {
  if (!sm90a_target()) return not_run("prefill Hopper/portable case: needs an sm_90a target");
  PrefillCase plain;
  plain.head_dim = 128;
  plain.q_len = 70;
  plain.kv_len = 90;
  plain.causal_offset = 20;
  plain.seed = test_seed(77);
  check_prefill(plain);
  const bool hopper = !mma_forced_off() && !wgmma_forced_off();
  // One CTA of query rows: the default tiling, unless ASTRAI_JIT_PREFILL_TILES=wide forces the other.
  const char* tiled =
      wide_tiles_forced() ? "prefill.bf16.hd128.g4.wgmma.wide.sm_90a" : "prefill.bf16.hd128.g4.wgmma.sm_90a";
  CHECK(loaded_variants_named(tiled) == (hopper ? 1 : 0));
  PrefillCase masked = plain;
  masked.mask = MaskShape::per_query;
  masked.seed = test_seed(78);
  check_prefill(masked);
  const char* portable = mma_forced_off() ? "prefill.bf16.hd128.g4.nomma.sm_90a" : "prefill.bf16.hd128.g4.sm_90a";
  CHECK(loaded_variants_named(portable) == 1);
}

TEST_CASE("prefill with nothing to do launches nothing") {
  PrefillArgs args;
  args.batch = 0;
  args.q_len = 16;
  args.kv_len = 16;
  args.n_heads = 4;
  args.n_kv_heads = 1;
  args.head_dim = 128;
  CHECK_NOTHROW(Runtime::get().prefill(args));
  args.batch = 2;
  args.q_len = 0;
  CHECK_NOTHROW(Runtime::get().prefill(args));
}

TEST_CASE("prefill random sweep") {
  const unsigned seed = test_seed(20261130);
  std::mt19937 rng(seed);
  MESSAGE(fmt::format("prefill random sweep seed {}", seed));
  // 40 cases, then ASTRAI_TEST_SWEEP more (default 20).
  const int total = 40 + sweep_count(20);
  for (int n = 0; n < total; ++n) {
    const Variant& variant = kPrefillVariants[rng() % std::size(kPrefillVariants)];
    PrefillCase c;
    c.dtype = variant.dtype;
    c.head_dim = variant.head_dim;
    c.group = variant.group;
    c.n_kv_heads = 1 + rng() % 2;
    c.batch = 1 + rng() % 3;
    c.q_len = rng() % 4 == 0 ? 1 + rng() % 8 : 1 + rng() % 200;
    c.kv_len = rng() % 8 == 0 ? rng() % 4 : rng() % 400;
    switch (rng() % 3) {
      case 0: c.causal_offset = -1; break;
      case 1: c.causal_offset = std::max(0, c.kv_len - c.q_len); break;
      default: c.causal_offset = static_cast<int>(rng() % (c.kv_len + 8)); break;
    }
    c.mask = static_cast<MaskShape>(rng() % 5);
    c.empty_rows = rng() % 3 == 0 ? 1 + rng() % 3 : 0;
    c.layout = static_cast<Layout>(rng() % 3);
    c.lse = rng() % 4 != 0;
    if (rng() % 4 == 0) {  // a peaked row now and then
      c.scale = 1.f;
      c.key_ramp = 4.f;
    }
    c.seed = rng();
    check_prefill(c);
  }
}

}  // TEST_SUITE
}  // namespace astrai::gpu_test
