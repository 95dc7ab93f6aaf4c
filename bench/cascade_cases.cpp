// The bench cases of the merge and of cascade attention.
#include "bench/bench.hpp"

namespace astrai::bench {

void Bench::case_merge_states(const CaseDef& def, CaseResult* result) {
  result->variant = variant_name(KernelKind::merge_states, def.head_dim, 0, 0);
  const std::size_t rows = static_cast<std::size_t>(def.len) * def.n_heads;  // (token, head) rows
  const std::size_t v_elems = rows * def.states * def.head_dim;
  const std::size_t lse_elems = rows * def.states;
  const std::size_t set_bytes = v_elems * 2 + lse_elems * 4 + rows * (def.head_dim * 2 + 4);
  const int sets = choose_sets(set_bytes, 0, &result->notes);
  result->sets = sets;
  struct Set {
    DeviceBuffer v, lse, out, out_lse;
  };
  std::vector<Set> buffers;
  for (int s = 0; s < sets; ++s) {
    Set set{DeviceBuffer(v_elems * 2), DeviceBuffer(lse_elems * 4), DeviceBuffer(rows * def.head_dim * 2),
            DeviceBuffer(rows * 4)};
    const std::uint64_t seed = seed_of(def.name()) + 2u * static_cast<std::uint64_t>(s);
    fill_bf16(set.v, v_elems, seed);
    fill_lse(set.lse, lse_elems, seed + 1);
    buffers.push_back(std::move(set));
  }
  sync_all();
  // a: the states stacked [tokens, states, heads, D]; no second source.
  astrai::MergeStatesArgs base;
  base.dtype = DType::bf16;
  base.rows = def.len;
  base.n_heads = def.n_heads;
  base.head_dim = def.head_dim;
  base.a.states = def.states;
  base.b.states = 0;
  const Call call = [&](int s, CUstream stream) {
    astrai::MergeStatesArgs args = base;
    const Set& set = buffers[static_cast<std::size_t>(s)];
    args.a.v = set.v.ptr();
    args.a.lse = set.lse.as<const float>();
    args.out = set.out.ptr();
    args.lse = set.out_lse.as<float>();
    args.stream = stream;
    Runtime::get().merge_states(args);
  };
  const Timing timing = time_calls(sets, call);
  finish(result, timing, static_cast<double>(set_bytes), false);
}

// B requests sharing a prefix of def.prefix tokens, each with def.len of its own. The cascade
// reads the prefix through one paged_prefill of every request's query (level 0) and each
// request's own pages through a causal one (level 1); the decode row reads each request's whole
// sequence, its table listing the prefix's pages and then its own. Both count the bytes the
// cascade must read (the prefix once, each request's own tokens, Q, O), so that the ratio of
// their calls per second is the cascade's speedup.
void Bench::case_cascade(const CaseDef& def, CaseResult* result) {
  std::mt19937 rng(static_cast<std::uint32_t>(seed_of(def.name())));
  const int ps = def.page_size;
  const int prefix_pages = (def.prefix + ps - 1) / ps;
  const int own_pages = (def.len + ps - 1) / ps;
  const int num_pages = prefix_pages + def.batch * own_pages;
  std::vector<std::int32_t> physical(static_cast<std::size_t>(num_pages));
  std::iota(physical.begin(), physical.end(), 0);
  std::shuffle(physical.begin(), physical.end(), rng);
  const std::vector<std::int32_t> prefix(physical.begin(), physical.begin() + prefix_pages);
  std::vector<std::int32_t> own_table, whole_table;
  const std::vector<std::int32_t> own_lens(def.batch, def.len), whole_lens(def.batch, def.prefix + def.len);
  std::vector<std::int32_t> request_indptr(def.batch + 1);
  for (int b = 0; b < def.batch; ++b) {
    const auto first = physical.begin() + prefix_pages + b * own_pages;
    own_table.insert(own_table.end(), first, first + own_pages);
    whole_table.insert(whole_table.end(), prefix.begin(), prefix.end());
    whole_table.insert(whole_table.end(), first, first + own_pages);
    request_indptr[b + 1] = b + 1;
  }
  const std::vector<std::int32_t> prefix_indptr = {0, def.batch}, prefix_lens = {def.prefix};
  const int group = def.n_heads / def.n_kv_heads;
  result->variant = def.cascade_as_decode
                        ? variant_name(KernelKind::paged_decode, def.head_dim, ps, group)
                        : planned_prefill_variant(KernelKind::paged_prefill, def, 0);
  const std::size_t pool_elems = static_cast<std::size_t>(num_pages) * ps * def.n_kv_heads * def.head_dim;
  const std::size_t q_elems = static_cast<std::size_t>(def.batch) * def.n_heads * def.head_dim;
  const int sets = choose_sets(2 * pool_elems * 2 + 2 * q_elems * 2, 0, &result->notes);
  result->sets = sets;
  struct Set {
    DeviceBuffer k, v, q, out;
  };
  std::vector<Set> buffers;
  for (int s = 0; s < sets; ++s) {
    Set set{DeviceBuffer(pool_elems * 2), DeviceBuffer(pool_elems * 2), DeviceBuffer(q_elems * 2),
            DeviceBuffer(q_elems * 2)};
    const std::uint64_t seed = seed_of(def.name()) + 4u * static_cast<std::uint64_t>(s);
    fill_bf16(set.k, pool_elems, seed);
    fill_bf16(set.v, pool_elems, seed + 1);
    fill_bf16(set.q, q_elems, seed + 2);
    buffers.push_back(std::move(set));
  }
  const DeviceBuffer d_prefix = DeviceBuffer::from(prefix), d_prefix_lens = DeviceBuffer::from(prefix_lens);
  const DeviceBuffer d_prefix_indptr = DeviceBuffer::from(prefix_indptr);
  const DeviceBuffer d_own = DeviceBuffer::from(own_table), d_own_lens = DeviceBuffer::from(own_lens);
  const DeviceBuffer d_request_indptr = DeviceBuffer::from(request_indptr);
  const DeviceBuffer d_whole = DeviceBuffer::from(whole_table), d_whole_lens = DeviceBuffer::from(whole_lens);
  sync_all();
  astrai::CascadeArgs levels;
  levels.total_q = def.batch;
  levels.n_heads = def.n_heads;
  levels.n_kv_heads = def.n_kv_heads;
  levels.head_dim = def.head_dim;
  levels.page_size = ps;
  levels.num_pages = num_pages;
  levels.num_levels = 2;
  levels.levels[0] = {1, def.batch, d_prefix_indptr.as<const std::int32_t>(), d_prefix.as<const std::int32_t>(),
                      prefix_pages, 0, d_prefix_lens.as<const std::int32_t>(), false};
  levels.levels[1] = {def.batch, 1, d_request_indptr.as<const std::int32_t>(), d_own.as<const std::int32_t>(),
                      own_pages, 0, d_own_lens.as<const std::int32_t>(), true};
  astrai::PagedDecodeArgs whole;
  whole.batch = def.batch;
  whole.n_heads = def.n_heads;
  whole.n_kv_heads = def.n_kv_heads;
  whole.head_dim = def.head_dim;
  whole.page_size = ps;
  whole.num_pages = num_pages;
  whole.max_pages_per_seq = prefix_pages + own_pages;
  whole.page_table = d_whole.as<const std::int32_t>();
  whole.seq_lens = d_whole_lens.as<const std::int32_t>();
  const Call call = [&](int s, CUstream stream) {
    const Set& set = buffers[static_cast<std::size_t>(s)];
    if (def.cascade_as_decode) {
      astrai::PagedDecodeArgs args = whole;
      args.q = set.q.ptr();
      args.k_cache = set.k.ptr();
      args.v_cache = set.v.ptr();
      args.out = set.out.ptr();
      args.stream = stream;
      Runtime::get().paged_decode(args);
    } else {
      astrai::CascadeArgs args = levels;
      args.q = set.q.ptr();
      args.k_cache = set.k.ptr();
      args.v_cache = set.v.ptr();
      args.out = set.out.ptr();
      args.stream = stream;
      Runtime::get().cascade(args);
    }
  };
  const Timing timing = time_calls(sets, call);
  const double kv_tokens = static_cast<double>(def.prefix) + static_cast<double>(def.batch) * def.len;
  const double bytes = kv_tokens * def.n_kv_heads * def.head_dim * 2 * 2 + 2.0 * static_cast<double>(q_elems) * 2;
  if (def.cascade_as_decode) result->variant = launched_decode_variant(result->variant);
  finish(result, timing, bytes, false);
}

}  // namespace astrai::bench
