// prefill (contiguous KV) and paged_prefill (ragged queries over a paged KV cache) against a
// float64 CPU reference on random data: causal offsets, masks, empty rows, layouts, LSE.
// Outputs and LSE are poisoned first; every element outside the written rows must keep the
// poison. Variants (dtype, head dim, page size, group) are drawn from a short list so the
// file compiles few kernels.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include <fmt/format.h>

#include "tests/gpu/gpu_support.hpp"

namespace astrai::gpu_test {
namespace {

constexpr double kTolerance = 1e-2;  // |err| <= 1e-2 + 1e-2 |ref|, and norm-rel <= 1e-2
constexpr std::uint16_t kPoison = 0xffff;

std::vector<float> to_floats(const std::vector<std::uint16_t>& bits, DType dtype) {
  std::vector<float> values(bits.size());
  for (std::size_t i = 0; i < bits.size(); ++i) values[i] = bits_to_float(bits[i], dtype);
  return values;
}

// Softmax attention of one query row over n KV rows (row-major [n][d] floats) in float64.
// Returns false, with zeros and LSE -inf, when keep selects nothing.
bool attend_row(const float* q, const float* k, const float* v, int n, const std::vector<char>& keep,
                int d, double scale, std::vector<double>* out, double* lse) {
  std::vector<double> scores(static_cast<std::size_t>(std::max(n, 1)));
  double max_score = -INFINITY;
  for (int j = 0; j < n; ++j) {
    if (!keep[j]) continue;
    double dot = 0;
    const float* k_row = k + static_cast<std::size_t>(j) * d;
    for (int c = 0; c < d; ++c) dot += static_cast<double>(q[c]) * k_row[c];
    scores[j] = dot * scale;
    max_score = std::max(max_score, scores[j]);
  }
  out->assign(d, 0.0);
  if (max_score == -INFINITY) {
    *lse = -INFINITY;
    return false;
  }
  double total = 0;
  for (int j = 0; j < n; ++j) {
    if (!keep[j]) continue;
    const double w = std::exp(scores[j] - max_score);
    total += w;
    const float* v_row = v + static_cast<std::size_t>(j) * d;
    for (int c = 0; c < d; ++c) (*out)[c] += w * v_row[c];
  }
  for (int c = 0; c < d; ++c) (*out)[c] /= total;
  *lse = max_score + std::log(total);
  return true;
}

// Everything one case checks: output elements, LSE values, and exact expectations (zeros and
// -inf for empty rows, poison left alone outside the rows).
struct Verdict {
  Comparison out;
  Comparison lse;
  std::size_t exact_failures = 0;
  std::string first_exact_failure;
  std::size_t empty_rows = 0;

  void exact_failure(const std::string& what) {
    if (exact_failures++ == 0) first_exact_failure = what;
  }
};

struct RowId {
  int b, i, h;
  std::string text() const { return fmt::format("b={} i={} h={}", b, i, h); }
};

// Compares one output row (and its LSE) with the reference. Locations are formatted only for
// failures (there are millions of elements).
void check_row(Verdict* verdict, DType dtype, const std::vector<std::uint16_t>& out,
               std::int64_t out_base, const std::vector<double>& want, bool non_empty,
               const float* lse_got, double lse_want, RowId id) {
  static const std::string kNowhere;
  const int d = static_cast<int>(want.size());
  for (int c = 0; c < d; ++c) {
    const double got = bits_to_float(out[out_base + c], dtype);
    if (non_empty) {
      const bool ok = std::isfinite(got) &&
                      std::fabs(got - want[c]) <= kTolerance + kTolerance * std::fabs(want[c]);
      accumulate(&verdict->out, got, want[c], kTolerance, kTolerance,
                 ok ? kNowhere : fmt::format("{} d={}", id.text(), c));
    } else if (got != 0.0) {
      verdict->exact_failure(
          fmt::format("{} d={}: a row with nothing to attend to gave {}", id.text(), c, got));
    }
  }
  if (!non_empty) ++verdict->empty_rows;
  if (lse_got == nullptr) return;
  if (non_empty) {
    const bool ok = std::isfinite(*lse_got) &&
                    std::fabs(*lse_got - lse_want) <= kTolerance + kTolerance * std::fabs(lse_want);
    accumulate(&verdict->lse, *lse_got, lse_want, kTolerance, kTolerance,
               ok ? kNowhere : id.text() + " lse");
  } else if (!(std::isinf(*lse_got) && *lse_got < 0)) {
    verdict->exact_failure(
        fmt::format("{}: LSE of an empty row is {} (want -inf)", id.text(), *lse_got));
  }
}

// Every element of `out` that no row owns must still hold the poison.
void check_poison(Verdict* verdict, const std::vector<std::uint16_t>& out,
                  const std::vector<char>& written) {
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (!written[i] && out[i] != kPoison) {
      verdict->exact_failure(fmt::format("element {} outside every output row was written", i));
      return;
    }
  }
}

void report(const std::string& kernel, DType dtype, const std::string& description, Verdict* v) {
  finish(&v->out);
  finish(&v->lse);
  note_worst(kernel, dtype, v->out);
  INFO(description);
  MESSAGE(fmt::format("{} -> max|err| {:.3g} norm-rel {:.3g} lse max|err| {:.3g} empty rows {}",
                      description, v->out.max_abs_error, v->out.norm_rel_error,
                      v->lse.max_abs_error, v->empty_rows));
  CHECK_MESSAGE(v->out.failures == 0, v->out.first_failure);
  CHECK_MESSAGE(v->lse.failures == 0, v->lse.first_failure);
  CHECK_MESSAGE(v->exact_failures == 0, v->first_exact_failure);
  CHECK(v->out.norm_rel_error <= kTolerance);
}

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
  unsigned seed = 1;

  std::string describe() const {
    return fmt::format("prefill dtype={} hd={} group={} kv_heads={} batch={} q_len={} kv_len={} "
                       "causal_offset={} mask={} empty_rows={} layout={} lse={} scale={} seed={}",
                       dtype_name(dtype), head_dim, group, n_kv_heads, batch, q_len, kv_len,
                       causal_offset, mask_name(mask), empty_rows, layout_name(layout), lse, scale,
                       seed);
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
  const std::vector<std::uint16_t> k = random_elements(kv_elems, c.dtype, rng);
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
  Verdict verdict;
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
                    (!has_mask || mask_row[j] != 0);
        for (int h = kvh * c.group; h < (kvh + 1) * c.group; ++h) {
          const std::int64_t base = b * q_batch + i * q_seq + h * q_head;
          for (int e = 0; e < d; ++e) q_row[e] = bits_to_float(q[base + e], c.dtype);
          double lse_want = 0;
          const bool non_empty = attend_row(q_row.data(), k_rows.data(), v_rows.data(), c.kv_len,
                                            keep, d, scale, &want, &lse_want);
          const std::size_t lse_index = (static_cast<std::size_t>(b) * c.q_len + i) * n_heads + h;
          check_row(&verdict, c.dtype, out, base, want, non_empty, c.lse ? &lse[lse_index] : nullptr,
                    lse_want, RowId{b, i, h});
          std::fill_n(written.begin() + base, d, 1);
        }
      }
    }
  }
  check_poison(&verdict, out, written);
  report("prefill", c.dtype, c.describe(), &verdict);
}

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
  unsigned seed = 1;

  int batch() const { return static_cast<int>(q_lens.size()); }
  std::string describe() const {
    return fmt::format("paged_prefill dtype={} hd={} ps={} group={} kv_heads={} causal={} mask={} "
                       "strided={} lse={} unmapped_page={} seed={} q_lens=[{}] seq_lens=[{}]{}",
                       dtype_name(dtype), head_dim, page_size, group, n_kv_heads, causal, mask,
                       strided, lse, unmapped_page, seed, fmt::join(q_lens, ","),
                       fmt::join(seq_lens, ","),
                       device_seq_lens.empty()
                           ? std::string()
                           : fmt::format(" device_seq_lens=[{}]", fmt::join(device_seq_lens, ",")));
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
  const std::vector<std::uint16_t> k_pool = random_elements(pool_elems, c.dtype, rng);
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
  Verdict verdict;
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
          keep[t] = (!c.causal || t <= position) && (!c.mask || mask[row * mask_stride_q + t] != 0);
        for (int h = kvh * c.group; h < (kvh + 1) * c.group; ++h) {
          const std::int64_t base = row * q_token + h * q_head;
          for (int e = 0; e < d; ++e) q_row[e] = bits_to_float(q[base + e], c.dtype);
          double lse_want = 0;
          const bool non_empty = attend_row(q_row.data(), k_rows.data(), v_rows.data(), seq_len,
                                            keep, d, scale, &want, &lse_want);
          const std::size_t lse_index = static_cast<std::size_t>(row) * n_heads + h;
          check_row(&verdict, c.dtype, out, base, want, non_empty, c.lse ? &lse[lse_index] : nullptr,
                    lse_want, RowId{b, i, h});
          std::fill_n(written.begin() + base, d, 1);
        }
      }
    }
  }
  check_poison(&verdict, out, written);
  report("paged_prefill", c.dtype, c.describe(), &verdict);
}

// The variants the random sweeps draw from; every one also appears in a targeted case, so the
// sweeps compile nothing new.
struct Variant {
  DType dtype;
  int head_dim;
  int group;
  int page_size;  // paged only
};

const Variant kPrefillVariants[] = {
    {DType::bf16, 128, 4, 0}, {DType::bf16, 64, 4, 0},  {DType::bf16, 80, 4, 0},
    {DType::bf16, 32, 4, 0},  {DType::bf16, 256, 4, 0}, {DType::bf16, 128, 1, 0},
    {DType::bf16, 128, 6, 0}, {DType::fp16, 128, 4, 0}, {DType::fp16, 64, 4, 0},
};

const Variant kPagedVariants[] = {
    {DType::bf16, 128, 4, 16}, {DType::bf16, 128, 4, 1},  {DType::bf16, 128, 4, 8},
    {DType::bf16, 128, 4, 64}, {DType::bf16, 64, 4, 16},  {DType::bf16, 256, 4, 16},
    {DType::fp16, 128, 6, 16}, {DType::bf16, 128, 1, 16}, {DType::bf16, 128, 8, 16},
};

}  // namespace

TEST_SUITE("prefill") {

TEST_CASE("prefill matches the reference across head dims, causal and not") {
  std::mt19937 rng(31);
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
  std::mt19937 rng(32);
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

TEST_CASE("prefill at the tile edges: q_len 1, 63..65, 127..129 and kv_len 0, 1, 33, 65, 2048") {
  // Query tiles are 64 rows (CUDA-core path, head dim > 128) or 128 rows (tensor cores up to
  // head dim 128, two 16-row MMA tiles per warp); KV stages 32 or 64 tokens.
  std::mt19937 rng(33);
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

TEST_CASE("prefill honours causal offsets other than the prompt tail") {
  std::mt19937 rng(34);
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
  std::mt19937 rng(35);
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
  early_rows.seed = 9;
  check_prefill(early_rows);
}

TEST_CASE("prefill with padded strides, interleaved K/V and a head-major layout") {
  std::mt19937 rng(36);
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
  std::mt19937 rng(37);
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
  const unsigned seed = 20261130;
  std::mt19937 rng(seed);
  MESSAGE(fmt::format("prefill random sweep seed {}", seed));
  for (int n = 0; n < 60; ++n) {
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
    c.seed = rng();
    check_prefill(c);
  }
}

}  // TEST_SUITE

TEST_SUITE("paged_prefill") {

TEST_CASE("paged_prefill matches the reference across page sizes with ragged requests") {
  std::mt19937 rng(41);
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
  std::mt19937 rng(42);
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
  std::mt19937 rng(43);
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

TEST_CASE("paged_prefill keeps device lengths in bounds") {
  // More query rows than KV positions: the early rows sit before position 0 and see nothing.
  PagedPrefillCase short_kv;
  short_kv.q_lens = {50, 10};
  short_kv.seq_lens = {20, 10};
  short_kv.seed = 5;
  check_paged_prefill(short_kv);
  // Negative and oversized device lengths are clamped to [0, table capacity].
  PagedPrefillCase clamped;
  clamped.q_lens = {8, 20, 12};
  clamped.seq_lens = {30, 40, 50};
  clamped.extra_pages = 0;
  clamped.device_seq_lens = {-5, 1 << 30, 50};
  clamped.causal = false;
  clamped.seed = 6;
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
  const unsigned seed = 20261201;
  std::mt19937 rng(seed);
  MESSAGE(fmt::format("paged_prefill random sweep seed {}", seed));
  for (int n = 0; n < 60; ++n) {
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
