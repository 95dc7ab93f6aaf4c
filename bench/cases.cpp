// The case table and each kernel's case: inputs, the timed call, the amount of work.
#include "bench/bench.hpp"
#include "runtime/families/decode_launch.hpp"

namespace astrai::bench {

std::string launched_decode_variant(const std::string& expected) {
  const std::string& launched = astrai::detail::last_decode_variant();
  return launched.empty() ? expected : launched;
}

std::vector<CaseDef> all_cases() {
  std::vector<CaseDef> cases;
  // A feature row's label ends in its variant's feature fields (".kv_e4m3", ".swa.sink").
  auto feature_suffix = [](const CaseDef& c) {
    return c.flags() == 0 ? std::string() : "." + astrai::detail::feature_names(c.flags(), ".");
  };
  // Head dim, and the head counts where they are not Llama-3-8B's 32/8 ("hd64.h24kv4").
  auto shape_label = [](int head_dim, int heads, int kv_heads) {
    return fmt::format("hd{}{}", head_dim,
                       heads == 32 && kv_heads == 8 ? std::string() : fmt::format(".h{}kv{}", heads, kv_heads));
  };
  // An FP8 row (kv) compares its calls per second, i.e. tokens per second, with the bf16 row of
  // the same shape; a row with other features (`with`) compares its time with the plain row's.
  auto paged_decode = [&](int head_dim, int heads, int kv_heads, int page, int batch, int len,
                          bool ragged, std::string ratio_to, std::string ratio_label, KvDType kv = KvDType::same,
                          const std::function<void(CaseDef&)>& with = nullptr) {
    CaseDef c;
    c.kind = CaseKind::paged_decode;
    c.kernel = "paged_decode";
    c.kv_dtype = kv;
    if (with) with(c);
    c.label = fmt::format("{}.ps{}.B{}xL{}{}{}{}{}{}", shape_label(head_dim, heads, kv_heads), page, batch, len,
                          ragged ? ".ragged" : "", feature_suffix(c), c.head_major ? ".hnd" : "",
                          c.pages_in_order ? ".inorder" : "", c.rope ? ".rope" : "");
    if (kv != KvDType::same) c.ratio_of = RatioOf::calls;
    else if (!c.features().empty()) c.ratio_of = RatioOf::time;
    else if (c.head_major || c.pages_in_order) c.ratio_of = RatioOf::calls;
    else if (c.rope) c.ratio_of = RatioOf::time;
    c.batch = batch;
    c.len = len;
    c.n_heads = heads;
    c.n_kv_heads = kv_heads;
    c.head_dim = head_dim;
    c.page_size = page;
    c.ragged = ragged;
    c.ratio_to = std::move(ratio_to);
    c.ratio_label = std::move(ratio_label);
    cases.push_back(c);
  };
  const std::string uniform = "paged_decode/hd128.ps16.B32xL4096";
  const std::string astrai16 = "paged_decode/hd64.h24kv4.ps16.B32xL4096";
  paged_decode(128, 32, 8, 16, 64, 8192, false, "", "");
  paged_decode(128, 32, 8, 16, 16, 32768, false, "", "");
  paged_decode(128, 32, 8, 16, 32, 4096, false, "", "");
  paged_decode(128, 32, 8, 16, 1, 1024, false, "", "");
  paged_decode(128, 32, 8, 16, 1, 32768, false, "", "");
  // Head dim 256 at batch 1: a long split list of wide rows for the combine.
  paged_decode(256, 32, 8, 16, 1, 32768, false, "", "");
  // Batch 1 on pages of one token (the portable kernel on sm_90a as well).
  paged_decode(128, 32, 8, 1, 1, 1024, false, "paged_decode/hd128.ps16.B1xL1024", "time vs ps16");
  paged_decode(128, 32, 8, 1, 32, 4096, false, uniform, "TB/s vs ps16");
  paged_decode(128, 32, 8, 16, 32, 4096, true, uniform, "TB/s vs uniform");
  paged_decode(64, 24, 4, 16, 32, 4096, false, "", "");
  paged_decode(64, 24, 4, 1, 32, 4096, false, astrai16, "TB/s vs ps16");
  // FP8 KV cache beside the bf16 rows (target: >= 1.95x the bf16 tokens/s at hd128, >= 1.7x on
  // AstrAI's hd64 heads); on sm_90a hd128 runs the TMA decode, hd64 the direct path.
  const std::string b64 = "paged_decode/hd128.ps16.B64xL8192";
  paged_decode(128, 32, 8, 16, 64, 8192, false, b64, "tokens/s vs bf16", KvDType::e4m3);
  paged_decode(128, 32, 8, 16, 64, 8192, false, b64, "tokens/s vs bf16", KvDType::e5m2);
  paged_decode(128, 32, 8, 16, 16, 32768, false, "paged_decode/hd128.ps16.B16xL32768", "tokens/s vs bf16",
               KvDType::e4m3);
  paged_decode(128, 32, 8, 16, 32, 4096, false, uniform, "tokens/s vs bf16", KvDType::e4m3);
  paged_decode(64, 24, 4, 16, 32, 4096, false, astrai16, "tokens/s vs bf16", KvDType::e4m3);
  paged_decode(64, 24, 4, 1, 32, 4096, false, "paged_decode/hd64.h24kv4.ps1.B32xL4096", "tokens/s vs bf16",
               KvDType::e4m3);
  // Serving features next to the plain row. A window's decode reads only the window's pages,
  // so its time should follow the tokens read (noted with each .swa row).
  const auto window = [](CaseDef& c) { c.window_left = 1024; };
  const auto cap = [](CaseDef& c) { c.logit_cap = 30.f; };
  const auto sink = [](CaseDef& c) { c.sinks = true; };
  const auto window_sink = [](CaseDef& c) {
    c.window_left = 1024;
    c.sinks = true;
  };
  paged_decode(128, 32, 8, 16, 32, 4096, false, uniform, "time vs plain", KvDType::same, window);
  paged_decode(128, 32, 8, 16, 64, 8192, false, b64, "time vs plain", KvDType::same, window);
  paged_decode(128, 32, 8, 16, 32, 4096, false, uniform, "time vs plain", KvDType::same, cap);
  paged_decode(128, 32, 8, 16, 32, 4096, false, uniform, "time vs plain", KvDType::same, sink);
  paged_decode(128, 32, 8, 16, 32, 4096, false, uniform, "time vs plain", KvDType::same, window_sink);
  // The same shapes over a head-major pool, each head's page one contiguous run of rows: the
  // rows a CTA reads no longer interleave with the other heads' (time ratio to the plain row).
  const auto head_major = [](CaseDef& c) { c.head_major = true; };
  paged_decode(128, 32, 8, 16, 64, 8192, false, b64, "speed vs token-major", KvDType::same, head_major);
  paged_decode(128, 32, 8, 16, 16, 32768, false, "paged_decode/hd128.ps16.B16xL32768", "speed vs token-major",
               KvDType::same, head_major);
  paged_decode(128, 32, 8, 16, 32, 4096, false, uniform, "speed vs token-major", KvDType::same, head_major);
  paged_decode(64, 24, 4, 16, 32, 4096, false, astrai16, "speed vs token-major", KvDType::same, head_major);
  // The same shapes with each request's pages in order through the pool: what the shuffled
  // pool's DRAM locality costs (a page of 16 tokens is 8 KB at hd64 with 4 KV heads, 32 KB at hd128 with 8).
  const auto in_order = [](CaseDef& c) { c.pages_in_order = true; };
  paged_decode(128, 32, 8, 16, 32, 4096, false, uniform, "speed vs shuffled", KvDType::same, in_order);
  paged_decode(64, 24, 4, 16, 32, 4096, false, astrai16, "speed vs shuffled", KvDType::same, in_order);
  // A decode step: rotary_emb on Q, then the decode (time ratio to the decode alone; the
  // difference against rotary_emb's own time says how much of the two calls overlaps).
  const auto rope = [](CaseDef& c) { c.rope = true; };
  paged_decode(128, 32, 8, 16, 1, 1024, false, "paged_decode/hd128.ps16.B1xL1024", "time vs decode alone",
               KvDType::same, rope);
  paged_decode(128, 32, 8, 16, 32, 4096, false, uniform, "time vs decode alone", KvDType::same, rope);
  // Multi-token decode (issue 13: at q_len 4, >= 0.9x the bandwidth of q_len 1 at B32 x 4096;
  // group 4 x 4 tokens = one 16-row tile, K and V read once).
  paged_decode(128, 32, 8, 16, 32, 4096, false, uniform, "TB/s vs q1", KvDType::same,
               [](CaseDef& c) { c.q_len = 4; });

  auto decode = [&](int head_dim, int heads, int kv_heads, int batch, int len, KvDType kv = KvDType::same,
                    bool bhld = false) {
    CaseDef c;
    c.kind = CaseKind::decode;
    c.kernel = "decode";
    c.kv_dtype = kv;
    c.head_major = bhld;
    const std::string shape = shape_label(head_dim, heads, kv_heads);
    c.label = fmt::format("{}.B{}xL{}{}{}", shape, batch, len, feature_suffix(c), bhld ? ".bhld" : "");
    if (kv != KvDType::same || bhld) {
      c.ratio_to = fmt::format("decode/{}.B{}xL{}", shape, batch, len);
      c.ratio_label = bhld ? "speed vs token-major" : "tokens/s vs bf16";
      c.ratio_of = RatioOf::calls;
    }
    c.batch = batch;
    c.len = len;
    c.n_heads = heads;
    c.n_kv_heads = kv_heads;
    c.head_dim = head_dim;
    cases.push_back(c);
  };
  decode(128, 32, 8, 64, 8192);
  decode(128, 32, 8, 32, 4096);
  decode(128, 32, 8, 1, 1024);
  decode(128, 32, 8, 64, 8192, KvDType::e4m3);
  decode(128, 32, 8, 64, 8192, KvDType::same, true);
  decode(128, 32, 8, 32, 4096, KvDType::same, true);
  // AstrAI's hd64 24/4 shape over a contiguous cache, against its paged row: what the page
  // lookups (and the paged kernel's registers) cost at the head dim furthest from the ceiling.
  decode(64, 24, 4, 32, 4096);
  cases.back().ratio_to = astrai16;
  cases.back().ratio_label = "speed vs ps16";
  cases.back().ratio_of = RatioOf::calls;

  const std::string causal_prefill = "prefill/hd128.causal.B2x8192";
  auto prefill = [&](CaseKind kind, int head_dim, bool causal, int batch, int len, int page,
                     const std::function<void(CaseDef&)>& with = nullptr) {
    CaseDef c;
    c.kind = kind;
    c.kernel = kind == CaseKind::prefill ? "prefill" : "paged_prefill";
    c.n_heads = 32;
    c.n_kv_heads = 8;
    if (with) with(c);
    c.label = fmt::format("{}{}.{}.B{}x{}{}{}", shape_label(head_dim, c.n_heads, c.n_kv_heads),
                          page ? fmt::format(".ps{}", page) : std::string(), causal ? "causal" : "full", batch, len,
                          c.prefix ? fmt::format(".kv{}", c.prefix + len) : "", feature_suffix(c));
    c.batch = batch;
    c.len = len;
    c.head_dim = head_dim;
    c.page_size = page;
    c.causal = causal;
    if (kind == CaseKind::paged_prefill) {
      c.ratio_to = causal_prefill;
      c.ratio_label = "TFLOP/s vs prefill";
    } else if (c.flags() != 0) {
      c.ratio_to = causal_prefill;
      c.ratio_label = "time vs plain";
      c.ratio_of = RatioOf::time;
    }
    cases.push_back(c);
  };
  prefill(CaseKind::prefill, 128, true, 2, 8192, 0);
  prefill(CaseKind::prefill, 128, false, 4, 4096, 0);
  prefill(CaseKind::prefill, 64, true, 2, 8192, 0);
  prefill(CaseKind::prefill, 256, true, 2, 8192, 0);
  prefill(CaseKind::paged_prefill, 128, true, 2, 8192, 16);
  // An FP8 cache (sm_90a: widened in shared memory for the wgmma kernel), against the bf16 row:
  // a long prompt, and a chunk of 512 against 8192 cached tokens, the chunked-prefill shape.
  const std::string paged_prefill_bf16 = "paged_prefill/hd128.ps16.causal.B2x8192";
  prefill(CaseKind::paged_prefill, 128, true, 2, 8192, 16, [&](CaseDef& c) { c.kv_dtype = KvDType::e4m3; });
  cases.back().ratio_to = paged_prefill_bf16;
  cases.back().ratio_label = "TFLOP/s vs bf16";
  prefill(CaseKind::paged_prefill, 128, true, 8, 512, 16, [&](CaseDef& c) { c.prefix = 7680; });
  prefill(CaseKind::paged_prefill, 128, true, 8, 512, 16, [&](CaseDef& c) {
    c.prefix = 7680;
    c.kv_dtype = KvDType::e4m3;
  });
  cases.back().ratio_to = "paged_prefill/hd128.ps16.causal.B8x512.kv8192";
  cases.back().ratio_label = "TFLOP/s vs bf16";
  // FP8 attention (sm_90a): e4m3 q, k and v (and once P kept in f16), each row against its bf16
  // twin (its label less ".qkv_e4m3...").
  struct Fp8Row {
    CaseKind kind;
    bool causal;
    int batch, len, page, prefix;
    bool p16;
    int head_dim = 128;
  };
  for (const Fp8Row& r :
       {Fp8Row{CaseKind::prefill, true, 2, 8192, 0, 0, false}, Fp8Row{CaseKind::prefill, true, 2, 8192, 0, 0, true},
        Fp8Row{CaseKind::prefill, false, 4, 4096, 0, 0, false}, Fp8Row{CaseKind::paged_prefill, true, 2, 8192, 16, 0, false},
        Fp8Row{CaseKind::paged_prefill, true, 8, 512, 16, 7680, false},
        Fp8Row{CaseKind::prefill, true, 2, 8192, 0, 0, false, 64}, Fp8Row{CaseKind::prefill, true, 2, 8192, 0, 0, false, 256}}) {
    prefill(r.kind, r.head_dim, r.causal, r.batch, r.len, r.page, [&](CaseDef& c) {
      c.prefix = r.prefix;
      c.qkv_e4m3 = true;
      c.p_fp16 = r.p16;
    });
    CaseDef& row = cases.back();
    row.ratio_to = row.name().substr(0, row.name().rfind(".qkv_e4m3"));
    row.ratio_label = "TFLOP/s vs bf16";
    row.ratio_of = RatioOf::rate;
  }
  // On sm_90a these run the Hopper kernel like the plain row; the window cuts the score work
  // (noted with the row).
  prefill(CaseKind::prefill, 128, true, 2, 8192, 0, window);
  prefill(CaseKind::prefill, 128, true, 2, 8192, 0, cap);
  // AstrAI's own heads on short prompts: a group of 6, which the Hopper kernel packs two heads to
  // a row position.
  prefill(CaseKind::prefill, 64, true, 16, 1024, 0, [](CaseDef& c) {
    c.n_heads = 24;
    c.n_kv_heads = 4;
  });

  auto rotary = [&](int tokens) {
    CaseDef c;
    c.kind = CaseKind::rotary;
    c.kernel = "rotary_emb";
    c.label = fmt::format("hd128.T{}", tokens);
    c.len = tokens;
    c.batch = 1;
    c.n_heads = 32;
    c.head_dim = 128;
    cases.push_back(c);
  };
  rotary(16384);
  rotary(64);

  // Cascade attention's merge: a shared prefix's pass and each request's own (2 states), and a
  // caller's split passes (8), over a decode batch's rows and a prefill's.
  auto merge = [&](int tokens, int states, int head_dim) {
    CaseDef c;
    c.kind = CaseKind::merge_states;
    c.kernel = "merge_states";
    c.label = fmt::format("hd{}.T{}.s{}", head_dim, tokens, states);
    c.len = tokens;
    c.states = states;
    c.batch = 1;
    c.n_heads = 32;
    c.head_dim = head_dim;
    cases.push_back(c);
  };
  merge(16384, 2, 128);
  merge(16384, 8, 128);
  merge(64, 2, 128);
  merge(4096, 2, 512);

  // Shared prefixes: 64 requests over one 8192-token prefix and 512 tokens each of their own,
  // as cascade levels, and as a plain paged_decode of the same requests over the same pages
  // (whose tables repeat the prefix's pages): the cascade row's ratio is its speedup.
  auto shared_prefix = [&](bool decode) {
    CaseDef c;
    c.kind = CaseKind::cascade;
    c.kernel = "cascade";
    c.label = std::string("hd128.B64.P8192.U512") + (decode ? ".decode" : "");
    c.batch = 64;
    c.prefix = 8192;
    c.len = 512;
    c.n_heads = 32;
    c.n_kv_heads = 8;
    c.head_dim = 128;
    c.page_size = 16;
    c.cascade_as_decode = decode;
    if (!decode) {
      c.ratio_to = "cascade/hd128.B64.P8192.U512.decode";
      c.ratio_label = "x paged_decode";
      c.ratio_of = RatioOf::calls;
    }
    cases.push_back(c);
  };
  shared_prefix(true);
  shared_prefix(false);

  // MLA decode (DeepSeek-V3 shapes): 128 heads on one GPU and 16 (8-way tensor parallel), a
  // batch of one for latency, and two new tokens (MTP) a request.
  auto mla = [&](int batch, int len, int heads, int q_len) {
    CaseDef c;
    c.kind = CaseKind::mla_decode;
    c.kernel = "mla_decode";
    c.label = fmt::format("B{}.L{}.H{}{}", batch, len, heads, q_len > 1 ? fmt::format(".q{}", q_len) : "");
    c.batch = batch;
    c.len = len;
    c.n_heads = heads;
    c.q_len = q_len;
    c.head_dim = 576;
    c.page_size = 64;
    cases.push_back(c);
  };
  mla(64, 8192, 128, 1);
  mla(64, 8192, 16, 1);
  mla(1, 8192, 128, 1);
  mla(32, 4096, 128, 2);

  auto jit = [&](CaseKind kind, const char* label) {
    CaseDef c;
    c.kind = kind;
    c.kernel = "jit";
    c.label = label;
    cases.push_back(c);
  };
  jit(CaseKind::jit_compile, "compile");
  jit(CaseKind::jit_load, "load");
  jit(CaseKind::jit_host, "host_overhead");
  return cases;
}


PagedLayout make_paged_layout(std::vector<std::int32_t> lens, int page_size, std::mt19937& rng, bool shuffle) {
  PagedLayout layout;
  layout.lens = std::move(lens);
  int max_len = 1;
  for (int len : layout.lens) {
    max_len = std::max(max_len, len);
    layout.total_tokens += len;
    layout.pages_read += (len + page_size - 1) / page_size;
  }
  layout.width = (max_len + page_size - 1) / page_size;
  layout.num_pages = static_cast<int>(std::max<std::int64_t>(1, layout.pages_read));
  std::vector<std::int32_t> physical(static_cast<std::size_t>(layout.num_pages));
  std::iota(physical.begin(), physical.end(), 0);
  if (shuffle) std::shuffle(physical.begin(), physical.end(), rng);
  const std::size_t batch = layout.lens.size();
  layout.table.assign(batch * static_cast<std::size_t>(layout.width), 0);
  std::size_t next = 0;
  for (std::size_t b = 0; b < batch; ++b) {
    const int pages = (layout.lens[b] + page_size - 1) / page_size;
    for (int p = 0; p < pages; ++p) layout.table[b * layout.width + static_cast<std::size_t>(p)] = physical[next++];
  }
  return layout;
}

std::uint64_t seed_of(const std::string& name) { return std::hash<std::string>{}(name) | 1u; }

// Sink logits for a case with sinks, one per query head, in the range the GPU tests use.
std::vector<float> sink_logits(const CaseDef& def) {
  std::mt19937 rng(static_cast<std::uint32_t>(seed_of(def.name()) ^ 0x5eedu));
  std::uniform_real_distribution<float> logit(-2.f, 7.f);
  std::vector<float> values(static_cast<std::size_t>(def.n_heads));
  for (auto& value : values) value = logit(rng);
  return values;
}

// What a decode call reads of its sequences: all of them, or with a window only the last
// window_left + 1 tokens and the pages that hold them.
struct DecodeReads {
  std::int64_t tokens = 0;
  std::int64_t pages = 0;
};

DecodeReads decode_reads(const CaseDef& def, const PagedLayout& layout) {
  if (def.window_left < 0) return {layout.total_tokens, layout.pages_read};
  DecodeReads reads;
  for (const int len : layout.lens) {
    if (len <= 0) continue;
    const int first = std::max(0, len - 1 - def.window_left);
    reads.tokens += len - first;
    reads.pages += (len - 1) / def.page_size - first / def.page_size + 1;
  }
  return reads;
}

void Bench::case_paged_decode(const CaseDef& def, CaseResult* result) {
  std::mt19937 rng(static_cast<std::uint32_t>(seed_of(def.name())));
  std::vector<std::int32_t> lens(static_cast<std::size_t>(def.batch), def.len);
  if (def.ragged) {
    std::uniform_int_distribution<int> length(1, 2 * def.len);
    for (auto& len : lens) len = length(rng);
  }
  const PagedLayout layout = make_paged_layout(lens, def.page_size, rng, !def.pages_in_order);
  if (def.ragged)
    result->notes.push_back(fmt::format("mean length {:.0f}",
                                        static_cast<double>(layout.total_tokens) / def.batch));
  const int group = def.n_heads / def.n_kv_heads;
  const bool fp8 = def.kv_dtype != KvDType::same;
  result->variant = variant_name(KernelKind::paged_decode, def.head_dim, def.page_size, group, def.flags());
  const DecodeReads reads = decode_reads(def, layout);
  if (!def.features().empty()) result->notes.push_back(def.features());
  if (def.window_left >= 0)
    result->notes.push_back(fmt::format("reads {:.2f}x the tokens ({} of {})",
                                        static_cast<double>(reads.tokens) / static_cast<double>(layout.total_tokens),
                                        reads.tokens, layout.total_tokens));

  const std::size_t pool_elems =
      static_cast<std::size_t>(layout.num_pages) * def.page_size * def.n_kv_heads * def.head_dim;
  const std::size_t kv_element_bytes = fp8 ? 1 : 2;
  const std::size_t q_elems = static_cast<std::size_t>(def.batch) * def.q_len * def.n_heads * def.head_dim;
  const std::size_t set_bytes = 2 * pool_elems * kv_element_bytes + 2 * q_elems * 2;
  const std::size_t shared_bytes = (layout.table.size() + layout.lens.size()) * 4;
  const int sets = choose_sets(set_bytes, shared_bytes, &result->notes);
  result->sets = sets;

  struct Set {
    DeviceBuffer k, v, q, out;
  };
  std::vector<Set> buffers;
  for (int s = 0; s < sets; ++s) {
    Set set{DeviceBuffer(pool_elems * kv_element_bytes), DeviceBuffer(pool_elems * kv_element_bytes),
            DeviceBuffer(q_elems * 2), DeviceBuffer(q_elems * 2)};
    const std::uint64_t seed = seed_of(def.name()) + 4u * static_cast<std::uint64_t>(s);
    fill_kv(set.k, pool_elems, seed, def.kv_dtype);
    fill_kv(set.v, pool_elems, seed + 1, def.kv_dtype);
    fill_bf16(set.q, q_elems, seed + 2);
    fill_bf16(set.out, q_elems, seed + 3);
    buffers.push_back(std::move(set));
  }
  const DeviceBuffer table = DeviceBuffer::from(layout.table);
  const DeviceBuffer seq_lens = DeviceBuffer::from(layout.lens);
  const std::vector<float> unit_scales(static_cast<std::size_t>(def.n_kv_heads), 1.f);
  const DeviceBuffer scales = DeviceBuffer::from(unit_scales);
  DeviceBuffer sinks;
  if (def.sinks) sinks = DeviceBuffer::from(sink_logits(def));
  // .rope: one rotation per (request, query token, pair), shared by the sets.
  const std::size_t rope_pairs = static_cast<std::size_t>(def.batch) * def.q_len * (def.head_dim / 2);
  DeviceBuffer freqs;
  if (def.rope) {
    freqs = DeviceBuffer(rope_pairs * 8);
    fill_rotation(freqs, rope_pairs, seed_of(def.name()) + 1000);
    result->notes.push_back("rotary_emb on Q first");
  }
  sync_all();

  astrai::PagedDecodeArgs base;
  base.dtype = DType::bf16;
  base.batch = def.batch;
  base.n_heads = def.n_heads;
  base.n_kv_heads = def.n_kv_heads;
  base.head_dim = def.head_dim;
  base.page_size = def.page_size;
  base.num_pages = layout.num_pages;
  base.max_pages_per_seq = layout.width;
  base.page_table = table.as<const std::int32_t>();
  base.seq_lens = seq_lens.as<const std::int32_t>();
  base.q_len = def.q_len;
  if (def.head_major) {  // [pages, kv_heads, page_size, D]
    base.k_stride_page = base.v_stride_page = 1LL * def.n_kv_heads * def.page_size * def.head_dim;
    base.k_stride_head = base.v_stride_head = 1LL * def.page_size * def.head_dim;
    base.k_stride_token = base.v_stride_token = def.head_dim;
  }
  if (fp8) {
    base.kv_dtype = def.kv_dtype;
    base.k_scale = base.v_scale = scales.as<const float>();
    base.kv_scale_per_head = true;
  }
  base.logit_cap = def.logit_cap;
  if (def.sinks) base.sinks = sinks.as<const float>();
  base.window_left = def.window_left;
  astrai::RotaryArgs rope;  // .rope: Q rotated in place, [batch, q_len, heads, D]
  rope.dtype = DType::bf16;
  rope.batch = def.batch;
  rope.seq_len = def.q_len;
  rope.n_heads = def.n_heads;
  rope.head_dim = def.head_dim;
  rope.freqs = freqs.as<const float>();
  const Call call = [&](int s, CUstream stream) {
    astrai::PagedDecodeArgs args = base;
    const Set& set = buffers[static_cast<std::size_t>(s)];
    args.q = set.q.ptr();
    args.k_cache = set.k.ptr();
    args.v_cache = set.v.ptr();
    args.out = set.out.ptr();
    args.stream = stream;
    if (def.rope) {
      astrai::RotaryArgs rotary = rope;
      rotary.x = rotary.out = set.q.ptr();
      rotary.stream = stream;
      Runtime::get().rotary_emb(rotary);
    }
    Runtime::get().paged_decode(args);
  };
  const Timing timing = time_calls(sets, call);
  // Bytes moved: the K and V of the tokens read (a window's only), Q, O, the page table entries
  // read and the lengths.
  const double kv_bytes = static_cast<double>(reads.tokens) * def.n_kv_heads * def.head_dim * 2 *
                          static_cast<double>(kv_element_bytes);
  // .rope: rotary_emb's read and write of Q and its rotations too.
  const double rope_bytes =
      def.rope ? 2.0 * static_cast<double>(q_elems) * 2 + static_cast<double>(rope_pairs) * 8 : 0.0;
  const double bytes = kv_bytes + 2.0 * static_cast<double>(q_elems) * 2 + static_cast<double>(reads.pages) * 4 +
                       static_cast<double>(def.batch) * 4 + rope_bytes;
  result->variant = launched_decode_variant(result->variant);
  finish(result, timing, bytes, false);
}

void Bench::case_decode(const CaseDef& def, CaseResult* result) {
  const int group = def.n_heads / def.n_kv_heads;
  const bool fp8 = def.kv_dtype != KvDType::same;
  const std::uint32_t flags = !fp8 ? 0u : def.kv_dtype == KvDType::e4m3 ? kFeatureKvE4m3 : kFeatureKvE5m2;
  result->variant = variant_name(KernelKind::decode, def.head_dim, 0, group, flags);
  const std::size_t kv_elems = static_cast<std::size_t>(def.batch) * def.len * def.n_kv_heads * def.head_dim;
  const std::size_t kv_element_bytes = fp8 ? 1 : 2;
  const std::size_t q_elems = static_cast<std::size_t>(def.batch) * def.n_heads * def.head_dim;
  const std::size_t set_bytes = 2 * kv_elems * kv_element_bytes + 2 * q_elems * 2;
  const int sets = choose_sets(set_bytes, 0, &result->notes);
  result->sets = sets;
  struct Set {
    DeviceBuffer k, v, q, out;
  };
  std::vector<Set> buffers;
  for (int s = 0; s < sets; ++s) {
    Set set{DeviceBuffer(kv_elems * kv_element_bytes), DeviceBuffer(kv_elems * kv_element_bytes),
            DeviceBuffer(q_elems * 2), DeviceBuffer(q_elems * 2)};
    const std::uint64_t seed = seed_of(def.name()) + 4u * static_cast<std::uint64_t>(s);
    fill_kv(set.k, kv_elems, seed, def.kv_dtype);
    fill_kv(set.v, kv_elems, seed + 1, def.kv_dtype);
    fill_bf16(set.q, q_elems, seed + 2);
    fill_bf16(set.out, q_elems, seed + 3);
    buffers.push_back(std::move(set));
  }
  const std::vector<float> unit_scale = {1.f};
  const DeviceBuffer scale = DeviceBuffer::from(unit_scale);
  sync_all();
  astrai::DecodeArgs base;
  base.dtype = DType::bf16;
  base.batch = def.batch;
  base.kv_len = def.len;
  base.n_heads = def.n_heads;
  base.n_kv_heads = def.n_kv_heads;
  base.head_dim = def.head_dim;
  if (fp8) {
    base.kv_dtype = def.kv_dtype;
    base.k_scale = base.v_scale = scale.as<const float>();
  }
  if (def.head_major) {  // [batch, kv_heads, len, D]
    base.k_stride_batch = base.v_stride_batch = 1LL * def.n_kv_heads * def.len * def.head_dim;
    base.k_stride_head = base.v_stride_head = 1LL * def.len * def.head_dim;
    base.k_stride_seq = base.v_stride_seq = def.head_dim;
  }
  const Call call = [&](int s, CUstream stream) {
    astrai::DecodeArgs args = base;
    const Set& set = buffers[static_cast<std::size_t>(s)];
    args.q = set.q.ptr();
    args.k = set.k.ptr();
    args.v = set.v.ptr();
    args.out = set.out.ptr();
    args.stream = stream;
    Runtime::get().decode(args);
  };
  const Timing timing = time_calls(sets, call);
  const double bytes = 2.0 * static_cast<double>(kv_elems) * static_cast<double>(kv_element_bytes) +
                       2.0 * static_cast<double>(q_elems) * 2;
  result->variant = launched_decode_variant(result->variant);
  finish(result, timing, bytes, false);
}

void Bench::case_rotary(const CaseDef& def, CaseResult* result) {
  result->variant = variant_name(KernelKind::rotary_emb, def.head_dim, 0, 0);
  const std::size_t x_elems = static_cast<std::size_t>(def.len) * def.n_heads * def.head_dim;
  const std::size_t pairs = static_cast<std::size_t>(def.len) * (def.head_dim / 2);
  const std::size_t set_bytes = x_elems * 2 + pairs * 8;
  const int sets = choose_sets(set_bytes, 0, &result->notes);
  result->sets = sets;
  struct Set {
    DeviceBuffer x, freqs;
  };
  std::vector<Set> buffers;
  for (int s = 0; s < sets; ++s) {
    Set set{DeviceBuffer(x_elems * 2), DeviceBuffer(pairs * 8)};
    const std::uint64_t seed = seed_of(def.name()) + 2u * static_cast<std::uint64_t>(s);
    fill_bf16(set.x, x_elems, seed);
    fill_rotation(set.freqs, pairs, seed + 1);
    buffers.push_back(std::move(set));
  }
  sync_all();
  astrai::RotaryArgs base;
  base.dtype = DType::bf16;
  base.batch = 1;
  base.seq_len = def.len;
  base.n_heads = def.n_heads;
  base.head_dim = def.head_dim;
  const Call call = [&](int s, CUstream stream) {
    astrai::RotaryArgs args = base;
    const Set& set = buffers[static_cast<std::size_t>(s)];
    args.x = set.x.ptr();
    args.out = set.x.ptr();  // in place
    args.freqs = set.freqs.as<const float>();
    args.stream = stream;
    Runtime::get().rotary_emb(args);
  };
  const Timing timing = time_calls(sets, call);
  const double bytes = 2.0 * static_cast<double>(x_elems) * 2 + static_cast<double>(pairs) * 8;
  finish(result, timing, bytes, false);
}

CaseResult Bench::run_case(const CaseDef& def, const std::map<std::string, CaseResult>& earlier) {
  CaseResult result;
  result.def = def;
  if (context_broken_) {
    result.status = "skipped";
    result.error = "skipped: the CUDA context is unusable after an earlier error (" + broken_reason_ + ")";
    return result;
  }
  try {
    loaded_before_ = Runtime::get().loaded_variants();
    switch (def.kind) {
      case CaseKind::paged_decode: case_paged_decode(def, &result); break;
      case CaseKind::decode: case_decode(def, &result); break;
      case CaseKind::prefill: case_prefill(def, &result); break;
      case CaseKind::paged_prefill: case_paged_prefill(def, &result); break;
      case CaseKind::rotary: case_rotary(def, &result); break;
      case CaseKind::merge_states: case_merge_states(def, &result); break;
      case CaseKind::cascade: case_cascade(def, &result); break;
      case CaseKind::mla_decode: case_mla_decode(def, &result); break;
      default: break;
    }
  } catch (const std::exception& error) {
    result.status = "error";
    result.error = "error: " + strip_prefix(error.what());
    // A fault in a kernel leaves the context unusable for every later case: say so once.
    const CUresult state = driver().cuCtxSynchronize();
    if (state != CUDA_SUCCESS) {
      context_broken_ = true;
      broken_reason_ = astrai::detail::cu_result_name(state);
    }
  }
  if (result.status == "ok" && !def.ratio_to.empty()) {
    auto it = earlier.find(def.ratio_to);
    if (it != earlier.end() && it->second.status == "ok" && it->second.rate > 0) {
      const CaseResult& other = it->second;
      switch (def.ratio_of) {
        case RatioOf::rate: result.ratio = result.rate / other.rate; break;
        case RatioOf::calls: result.ratio = other.us.median / result.us.median; break;
        case RatioOf::time: result.ratio = result.us.median / other.us.median; break;
      }
      // Rows on different paths (an FP8 row beside a Hopper bf16 row, ASTRAI_JIT_NO_WGMMA=1 on one
      // of them) say so.
      auto hopper = [](const std::string& variant) {
        return variant.find(".wgmma.") != std::string::npos || variant.find(".tma.") != std::string::npos;
      };
      if (hopper(other.variant) && !hopper(result.variant))
        result.notes.push_back("the compared row runs the Hopper kernel");
    } else if (it == earlier.end())
      result.notes.push_back("select " + def.ratio_to + " too for the ratio");
  }
  return result;
}


}  // namespace astrai::bench
