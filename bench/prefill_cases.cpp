// The bench cases of prefill and paged_prefill: a fresh prompt over a contiguous cache, or a
// ragged batch over a shuffled pool of pages (a long prompt, or a chunk after cached tokens), in
// bf16, with an FP8 cache, or as FP8 attention (e4m3 q, k and v); FLOPs as the scores and P V
// of the keys each query sees.
#include "bench/bench.hpp"

namespace astrai::bench {

namespace {

// FP8 attention's options: e4m3 q, k and v, one scale of 1 each (the bench's e4m3 values are
// already in range).
template <typename Args>
void set_fp8_attention(Args* args, const DeviceBuffer& one, bool p_fp16, CaseResult* result) {
  args->qkv_dtype = KvDType::e4m3;
  args->p_fp16 = p_fp16;
  args->q_scale = args->k_scale = args->v_scale = one.as<const float>();
  result->notes.push_back("% of the bf16 GEMM ceiling: e4m3 wgmma's peak is twice it");
}

// The scores' and P V's FLOPs: 4 x head_dim a query row and key it sees.
double attention_flops(const CaseDef& def) {
  if (def.kind == CaseKind::paged_prefill && def.prefix > 0) {
    // A causal chunk after `prefix` cached tokens: query i sees prefix + i + 1 keys.
    const double keys = static_cast<double>(def.len) * def.prefix + def.len * (def.len + 1.0) / 2;
    return 4.0 * def.batch * def.n_heads * keys * def.head_dim;
  }
  const double flops = 4.0 * def.batch * def.n_heads * static_cast<double>(def.len) * def.len * def.head_dim;
  if (def.window_left < 0) return def.causal ? flops / 2 : flops;
  // A causal window: query i attends to min(i + 1, window_left + 1) keys.
  const double window = std::min<double>(def.window_left + 1.0, def.len);
  const double keys = window * (window + 1) / 2 + (def.len - window) * window;
  return 4.0 * def.batch * def.n_heads * keys * def.head_dim;
}

}  // namespace

void Bench::case_prefill(const CaseDef& def, CaseResult* result) {
  result->variant = planned_prefill_variant(KernelKind::prefill, def, def.flags());
  if (!def.features().empty()) result->notes.push_back(def.features());
  if (def.window_left >= 0) {
    CaseDef causal = def;
    causal.window_left = -1;
    result->notes.push_back(
        fmt::format("{:.2f}x the causal score work", attention_flops(def) / attention_flops(causal)));
  }
  const std::size_t q_elems = static_cast<std::size_t>(def.batch) * def.len * def.n_heads * def.head_dim;
  const std::size_t kv_elems = static_cast<std::size_t>(def.batch) * def.len * def.n_kv_heads * def.head_dim;
  const std::size_t bytes = def.qkv_e4m3 ? 1 : 2;  // of a q, k or v element
  const KvDType qkv = def.qkv_e4m3 ? KvDType::e4m3 : KvDType::same;
  const std::size_t set_bytes = q_elems * (bytes + 2) + 2 * kv_elems * bytes;
  const int sets = choose_sets(set_bytes, 0, &result->notes);
  result->sets = sets;
  struct Set {
    DeviceBuffer q, k, v, out;
  };
  std::vector<Set> buffers;
  for (int s = 0; s < sets; ++s) {
    Set set{DeviceBuffer(q_elems * bytes), DeviceBuffer(kv_elems * bytes), DeviceBuffer(kv_elems * bytes),
            DeviceBuffer(q_elems * 2)};
    const std::uint64_t seed = seed_of(def.name()) + 4u * static_cast<std::uint64_t>(s);
    fill_kv(set.q, q_elems, seed, qkv);
    fill_kv(set.k, kv_elems, seed + 1, qkv);
    fill_kv(set.v, kv_elems, seed + 2, qkv);
    fill_bf16(set.out, q_elems, seed + 3);
    buffers.push_back(std::move(set));
  }
  DeviceBuffer sinks;
  if (def.sinks) sinks = DeviceBuffer::from(sink_logits(def));
  const DeviceBuffer scales = DeviceBuffer::from(std::vector<float>{1.f});
  sync_all();
  astrai::PrefillArgs base;
  if (def.qkv_e4m3) set_fp8_attention(&base, scales, def.p_fp16, result);
  base.dtype = DType::bf16;
  base.batch = def.batch;
  base.q_len = def.len;
  base.kv_len = def.len;
  base.n_heads = def.n_heads;
  base.n_kv_heads = def.n_kv_heads;
  base.head_dim = def.head_dim;
  base.causal_offset = def.causal ? 0 : -1;  // a fresh prompt: kv_len - q_len
  base.logit_cap = def.logit_cap;
  if (def.sinks) base.sinks = sinks.as<const float>();
  base.window_left = def.window_left;
  const Call call = [&](int s, CUstream stream) {
    astrai::PrefillArgs args = base;
    const Set& set = buffers[static_cast<std::size_t>(s)];
    args.q = set.q.ptr();
    args.k = set.k.ptr();
    args.v = set.v.ptr();
    args.out = set.out.ptr();
    args.stream = stream;
    Runtime::get().prefill(args);
  };
  const Timing timing = time_calls(sets, call);
  finish(result, timing, attention_flops(def), true);
}

void Bench::case_paged_prefill(const CaseDef& def, CaseResult* result) {
  std::mt19937 rng(static_cast<std::uint32_t>(seed_of(def.name())));
  const PagedLayout layout = make_paged_layout(
      std::vector<std::int32_t>(static_cast<std::size_t>(def.batch), def.prefix + def.len), def.page_size, rng);
  const bool fp8 = def.kv_dtype != KvDType::same || def.qkv_e4m3;  // an e4m3 cache
  const KvDType cache = def.qkv_e4m3 ? KvDType::e4m3 : def.kv_dtype;
  const std::size_t q_bytes = def.qkv_e4m3 ? 1 : 2;  // of an element
  result->variant = planned_prefill_variant(KernelKind::paged_prefill, def, def.flags());
  const int total_q = def.batch * def.len;
  std::vector<std::int32_t> qo_indptr(static_cast<std::size_t>(def.batch) + 1);
  for (int b = 0; b <= def.batch; ++b) qo_indptr[static_cast<std::size_t>(b)] = b * def.len;
  const std::size_t pool_elems =
      static_cast<std::size_t>(layout.num_pages) * def.page_size * def.n_kv_heads * def.head_dim;
  const std::size_t q_elems = static_cast<std::size_t>(total_q) * def.n_heads * def.head_dim;
  const std::size_t kv_element_bytes = fp8 ? 1 : 2;
  const std::size_t set_bytes = 2 * pool_elems * kv_element_bytes + q_elems * (q_bytes + 2);
  const std::size_t shared_bytes = (layout.table.size() + layout.lens.size() + qo_indptr.size()) * 4;
  const int sets = choose_sets(set_bytes, shared_bytes, &result->notes);
  result->sets = sets;
  struct Set {
    DeviceBuffer q, k, v, out;
  };
  std::vector<Set> buffers;
  for (int s = 0; s < sets; ++s) {
    Set set{DeviceBuffer(q_elems * q_bytes), DeviceBuffer(pool_elems * kv_element_bytes),
            DeviceBuffer(pool_elems * kv_element_bytes), DeviceBuffer(q_elems * 2)};
    const std::uint64_t seed = seed_of(def.name()) + 4u * static_cast<std::uint64_t>(s);
    fill_kv(set.q, q_elems, seed, def.qkv_e4m3 ? KvDType::e4m3 : KvDType::same);
    fill_kv(set.k, pool_elems, seed + 1, cache);
    fill_kv(set.v, pool_elems, seed + 2, cache);
    fill_bf16(set.out, q_elems, seed + 3);
    buffers.push_back(std::move(set));
  }
  const DeviceBuffer table = DeviceBuffer::from(layout.table);
  const DeviceBuffer seq_lens = DeviceBuffer::from(layout.lens);
  const DeviceBuffer indptr = DeviceBuffer::from(qo_indptr);
  const DeviceBuffer scales = DeviceBuffer::from(std::vector<float>(static_cast<std::size_t>(def.n_kv_heads), 1.f));
  sync_all();
  astrai::PagedPrefillArgs base;
  base.dtype = DType::bf16;
  base.batch = def.batch;
  base.total_q = total_q;
  base.max_q_len = def.len;
  base.n_heads = def.n_heads;
  base.n_kv_heads = def.n_kv_heads;
  base.head_dim = def.head_dim;
  base.page_size = def.page_size;
  base.num_pages = layout.num_pages;
  base.max_pages_per_seq = layout.width;
  base.causal = def.causal;
  base.qo_indptr = indptr.as<const std::int32_t>();
  base.page_table = table.as<const std::int32_t>();
  base.seq_lens = seq_lens.as<const std::int32_t>();
  if (def.qkv_e4m3) {
    set_fp8_attention(&base, scales, def.p_fp16, result);
  } else if (fp8) {
    base.kv_dtype = def.kv_dtype;
    base.k_scale = base.v_scale = scales.as<const float>();
    base.kv_scale_per_head = true;
  }
  const Call call = [&](int s, CUstream stream) {
    astrai::PagedPrefillArgs args = base;
    const Set& set = buffers[static_cast<std::size_t>(s)];
    args.q = set.q.ptr();
    args.k_cache = set.k.ptr();
    args.v_cache = set.v.ptr();
    args.out = set.out.ptr();
    args.stream = stream;
    Runtime::get().paged_prefill(args);
  };
  const Timing timing = time_calls(sets, call);
  finish(result, timing, attention_flops(def), true);
}

}  // namespace astrai::bench
