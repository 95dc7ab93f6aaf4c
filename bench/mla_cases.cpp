// The bench cases of MLA decode: B requests of `len` keys each in a shuffled pool of pages, every
// query head against the one latent head. Bytes: each request's latent rows once (576 x 2 bytes
// a key), Q and O; the note gives the tensor-core rate the same call reaches, since with 128
// heads the scores and P V (2 x 1088 flops a key and query row) can outweigh the reads.
#include "bench/bench.hpp"

namespace astrai::bench {

void Bench::case_mla_decode(const CaseDef& def, CaseResult* result) {
  std::mt19937 rng(static_cast<std::uint32_t>(seed_of(def.name())));
  constexpr int kQk = 576, kV = 512;
  const PagedLayout layout = make_paged_layout(std::vector<std::int32_t>(def.batch, def.len), def.page_size, rng);
  result->variant = variant_name(KernelKind::mla_decode, kQk, def.page_size, def.n_heads, decode_q_len_flags(def.q_len));
  const std::size_t pool_elems = static_cast<std::size_t>(layout.num_pages) * def.page_size * kQk;
  const std::size_t rows = static_cast<std::size_t>(def.batch) * def.q_len * def.n_heads;
  const std::size_t set_bytes = pool_elems * 2 + rows * (kQk + kV) * 2;
  const int sets = choose_sets(set_bytes, 0, &result->notes);
  result->sets = sets;
  struct Set {
    DeviceBuffer kv, q, out;
  };
  std::vector<Set> buffers;
  for (int s = 0; s < sets; ++s) {
    Set set{DeviceBuffer(pool_elems * 2), DeviceBuffer(rows * kQk * 2), DeviceBuffer(rows * kV * 2)};
    const std::uint64_t seed = seed_of(def.name()) + 3u * static_cast<std::uint64_t>(s);
    fill_bf16(set.kv, pool_elems, seed);
    fill_bf16(set.q, rows * kQk, seed + 1);
    buffers.push_back(std::move(set));
  }
  const DeviceBuffer d_table = DeviceBuffer::from(layout.table), d_lens = DeviceBuffer::from(layout.lens);
  sync_all();
  astrai::MlaDecodeArgs base;
  base.batch = def.batch;
  base.q_len = def.q_len;
  base.n_heads = def.n_heads;
  base.page_size = def.page_size;
  base.num_pages = layout.num_pages;
  base.max_pages_per_seq = layout.width;
  base.scale = 0.0721f;
  base.page_table = d_table.as<const std::int32_t>();
  base.seq_lens = d_lens.as<const std::int32_t>();
  const Call call = [&](int s, CUstream stream) {
    astrai::MlaDecodeArgs args = base;
    const Set& set = buffers[static_cast<std::size_t>(s)];
    args.q = set.q.ptr();
    args.kv_cache = set.kv.ptr();
    args.out = set.out.ptr();
    args.stream = stream;
    Runtime::get().mla_decode(args);
  };
  const Timing timing = time_calls(sets, call);
  const double keys = static_cast<double>(layout.total_tokens);
  const double bytes = keys * kQk * 2 + static_cast<double>(rows) * (kQk + kV) * 2;
  const double flops = keys * def.q_len * def.n_heads * 2.0 * (kQk + kV);
  if (timing.us_per_call.median > 0)
    result->notes.push_back(fmt::format("{:.0f} TFLOP/s on the scores and P V", flops / (timing.us_per_call.median * 1e-6) / 1e12));
  finish(result, timing, bytes, false);
}

}  // namespace astrai::bench
