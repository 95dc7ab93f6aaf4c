// astrai_jit._C: the runtime's calls over DLPack tensors (torch, CuPy, JAX...). Shapes and
// strides come from the tensors; every argument is checked here (dtypes, ranks, shapes, then
// the runtime's own limits, then devices) before anything touches a GPU, and a bad one raises
// TypeError (a dtype) or astrai_jit.InvalidArgument, a ValueError (anything else), naming the
// argument, its value and what is allowed. The stream is a CUstream handle, or None for the
// current stream of the tensors' framework (one that publishes DLPack's C exchange API). The
// attention calls take their options (scale, soft-cap, sinks, window, FP8 scales, ALiBi...) as one
// tuple, `options`, read by the table of attention_options.hpp, so a new option changes no
// signature here.
#include "tensor_args.hpp"
#include "attention_options.hpp"
#include "cache_metrics_binding.hpp"

#include <chrono>

namespace {


// The page-table row of each request: req_indices ([batch], int32 or int64) when given, else
// row b, which needs a table of at least batch rows. `batch_what` says where batch came from.
template <typename Args>
void set_request_rows(Checker& c, const char* call, Args& a, const Input& page_table, const Opt<Input>& req_indices,
                      const char* batch_what) {
  a.page_table_rows = as_int(call, "page_table rows", page_table.shape(0));
  if (req_indices) {
    c.rank("req_indices", *req_indices, 1, "[batch]");
    c.dtype("req_indices", *req_indices, Kind::index);
    c.dim("req_indices", *req_indices, 0, a.batch, batch_what);
    c.contiguous("req_indices", *req_indices);
    a.req_indices = index_table(*req_indices);
  } else if (a.page_table_rows < a.batch) {
    invalid(call, "page_table has shape " + shape_string(page_table) + ": " + std::to_string(a.page_table_rows) +
                      " rows for batch " + std::to_string(a.batch) +
                      " (allowed: at least batch rows, or req_indices naming the row of each request)");
  }
}

astrai::PagedDecodeArgs paged_decode_args(const Input& q, const Input& k_cache, const Input& v_cache,
                                          const Input& page_table, const Opt<Input>& seq_lens, const Output& out,
                                          const Opt<Output>& lse, const Opt<Input>& mask,
                                          const Opt<Input>& req_indices, const Opt<Input>& new_k,
                                          const Opt<Input>& new_v, const AttentionOptionArgs& options,
                                          Opt<std::uintptr_t> stream, bool seq_lens_are_offsets,
                                          const Opt<Output>& workspace) {
  constexpr const char* kCall = "paged_decode";
  constexpr const char* kQueryLayout = "[batch, n_heads, head_dim] or [batch, q_len, n_heads, head_dim]";
  Checker c(kCall);
  astrai::PagedDecodeArgs a;
  // A 4-D q carries q_len new tokens per request (multi-token decode); the runtime checks 1..8.
  const bool tokens = q.ndim() == 4;
  const std::size_t h = tokens ? 2 : 1;  // the n_heads dim of q, out and lse; head_dim follows
  c.rank("q", q, tokens ? 4 : 3, kQueryLayout);
  c.rank("page_table", page_table, 2, "[batch, max_pages_per_seq]");
  // Offsets come as the functional API's kv_indptr: messages name that.
  const char* lens_name = seq_lens_are_offsets ? "kv_indptr" : "seq_lens";
  if (seq_lens) c.rank(lens_name, *seq_lens, 1, seq_lens_are_offsets ? "[batch + 1]" : "[batch]");
  c.rank("out", out, tokens ? 4 : 3, kQueryLayout);
  a.dtype = c.attention_dtype("q", q);
  c.dtype("page_table", page_table, Kind::index);
  if (seq_lens) c.dtype(lens_name, *seq_lens, Kind::index);
  c.same_dtype("out", out, a.dtype);
  a.batch = as_int(kCall, "batch", q.shape(0));
  a.q_len = tokens ? as_int(kCall, "q_len", q.shape(1)) : 1;
  a.n_heads = as_int(kCall, "n_heads", q.shape(h));
  a.head_dim = as_int(kCall, "head_dim", q.shape(h + 1));
  set_paged_cache(c, a, k_cache, v_cache, options.k_scale(), options.v_scale());
  a.max_pages_per_seq = as_int(kCall, "max_pages_per_seq", page_table.shape(1));
  if (seq_lens)
    c.dim(lens_name, *seq_lens, 0, a.batch + (seq_lens_are_offsets ? 1 : 0),
          seq_lens_are_offsets ? "batch of q + 1" : "batch of q");
  else if (seq_lens_are_offsets)
    invalid(kCall, "kv_indptr is None with offsets requested (allowed: [batch + 1] offsets)");
  c.same_shape("out", out, "q", q);
  for (auto [name, t] : {std::pair{"q", &q}, {"page_table", &page_table}}) c.unit_last(name, *t);
  c.unit_last("out", out);
  if (seq_lens) c.contiguous(lens_name, *seq_lens);
  a.q = q.data();
  a.q_stride_batch = c.stride("q", q, 0);
  if (tokens) a.q_stride_seq = c.stride("q", q, 1);
  a.q_stride_head = c.stride("q", q, h);
  a.page_table = index_table(page_table);
  a.page_table_stride = c.stride("page_table", page_table, 0);
  if (seq_lens) a.seq_lens = index_table(*seq_lens);
  a.seq_lens_are_offsets = seq_lens_are_offsets;
  a.out = out.data();
  a.out_stride_batch = c.stride("out", out, 0);
  if (tokens) a.out_stride_seq = c.stride("out", out, 1);
  a.out_stride_head = c.stride("out", out, h);
  set_request_rows(c, kCall, a, page_table, req_indices, "batch of q");
  if (mask) {
    c.rank("mask", *mask, 2, "[batch, max_pages_per_seq * page_size]");
    c.dtype("mask", *mask, Kind::boolean);
    c.dim("mask", *mask, 0, a.batch, "batch of q");
    c.dim("mask", *mask, 1, static_cast<std::int64_t>(a.max_pages_per_seq) * a.page_size,
          "max_pages_per_seq * page_size");
    c.unit_last("mask", *mask);
    a.mask = static_cast<const bool*>(mask->data());
    a.mask_stride_batch = c.stride("mask", *mask, 0);
  }
  if (new_k.has_value() != new_v.has_value())
    invalid(kCall, std::string(new_k ? "new_k is given but new_v is not" : "new_v is given but new_k is not") +
                       " (allowed: both or neither)");
  if (new_k) {
    const Input* kv[2] = {&*new_k, &*new_v};
    const char* names[2] = {"new_k", "new_v"};
    for (int i = 0; i < 2; ++i) {
      c.rank(names[i], *kv[i], 3, "[batch, n_kv_heads, head_dim]");
      c.same_dtype(names[i], *kv[i], a.dtype);
      c.dim(names[i], *kv[i], 0, a.batch, "batch of q");
      c.dim(names[i], *kv[i], 1, a.n_kv_heads, "n_kv_heads of k_cache");
      c.dim(names[i], *kv[i], 2, a.head_dim, "head_dim of q");
      c.unit_last(names[i], *kv[i]);
    }
    a.new_k = new_k->data();
    a.new_k_stride_batch = c.stride("new_k", *new_k, 0);
    a.new_k_stride_head = c.stride("new_k", *new_k, 1);
    a.new_v = new_v->data();
    a.new_v_stride_batch = c.stride("new_v", *new_v, 0);
    a.new_v_stride_head = c.stride("new_v", *new_v, 1);
  }
  a.lse = tokens ? lse_pointer(c, lse, "[batch, q_len, n_heads]",
                               {{a.batch, "batch of q"}, {a.q_len, "q_len of q"}, {a.n_heads, "n_heads of q"}})
                 : lse_pointer(c, lse, "[batch, n_heads]", {{a.batch, "batch of q"}, {a.n_heads, "n_heads of q"}});
  if (workspace) {
    a.workspace_bytes = c.scratch("workspace", *workspace);
    a.workspace = workspace->data();
  }
  finish_attention_args(c, a, q, options, stream);
  return a;
}

void paged_decode(const Input& q, const Input& k_cache, const Input& v_cache, const Input& page_table,
                  const Opt<Input>& seq_lens, const Output& out, const Opt<Output>& lse, const Opt<Input>& mask,
                  const Opt<Input>& req_indices, const Opt<Input>& new_k, const Opt<Input>& new_v,
                  const nb::tuple& pack, Opt<std::uintptr_t> stream, bool seq_lens_are_offsets,
                  const Opt<Output>& workspace) {
  const astrai::PagedDecodeArgs a =
      paged_decode_args(q, k_cache, v_cache, page_table, seq_lens, out, lse, mask, req_indices, new_k, new_v,
                        read_options("paged_decode", pack), stream, seq_lens_are_offsets, workspace);
  launch(&astrai::Runtime::paged_decode, a);
}

// For the host-overhead benchmark: mean host microseconds of `calls` back-to-back C++
// paged_decode calls with these arguments (checked and converted once, as a C++ caller would).
double time_paged_decode_calls(const Input& q, const Input& k_cache, const Input& v_cache,
                               const Input& page_table, const Input& seq_lens, const Output& out, double scale,
                               Opt<std::uintptr_t> stream, int calls) {
  Opt<Output> lse;
  AttentionOptionArgs options;
  options.scale = static_cast<float>(scale);
  const astrai::PagedDecodeArgs a = paged_decode_args(q, k_cache, v_cache, page_table, seq_lens, out, lse, {},
                                                      {}, {}, {}, options, stream, false, {});
  nb::gil_scoped_release release;
  astrai::Runtime& runtime = astrai::Runtime::get();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < calls; ++i) runtime.paged_decode(a);
  const std::chrono::duration<double, std::micro> elapsed = std::chrono::steady_clock::now() - start;
  return calls > 0 ? elapsed.count() / calls : 0.0;
}

// q and out as [batch, n_heads, head_dim] or [batch, 1, n_heads, head_dim]: returns the index
// of the heads dim.
std::size_t decode_heads_dim(Checker& c, const char* name, const Input& t) {
  if (t.ndim() == 4) {
    c.rank(name, t, 4, "[batch, 1, n_heads, head_dim] or [batch, n_heads, head_dim]");
    c.dim(name, t, 1, 1, "one query token per sequence");
    return 2;
  }
  c.rank(name, t, 3, "[batch, 1, n_heads, head_dim] or [batch, n_heads, head_dim]");
  return 1;
}

void decode(const Input& q, const Input& k, const Input& v, const Output& out, const Opt<Output>& lse,
            const Opt<Input>& mask, int causal_offset, const nb::tuple& pack, Opt<std::uintptr_t> stream) {
  constexpr const char* kCall = "decode";
  const AttentionOptionArgs options = read_options(kCall, pack);
  Checker c(kCall);
  astrai::DecodeArgs a;
  const std::size_t h = decode_heads_dim(c, "q", q);
  c.rank("out", out, q.ndim(), "the shape of q");
  a.dtype = c.attention_dtype("q", q);
  c.same_dtype("out", out, a.dtype);
  a.batch = as_int(kCall, "batch", q.shape(0));
  a.n_heads = as_int(kCall, "n_heads", q.shape(h));
  a.head_dim = as_int(kCall, "head_dim", q.shape(h + 1));
  set_contiguous_kv(c, a, k, v, ContiguousKv::fp8_cache, options.k_scale(), options.v_scale());
  c.same_shape("out", out, "q", q);
  c.unit_last("q", q);
  c.unit_last("out", out);
  a.q = q.data();
  a.q_stride_batch = c.stride("q", q, 0);
  a.q_stride_head = c.stride("q", q, h);
  a.out = out.data();
  a.out_stride_batch = c.stride("out", out, 0);
  a.out_stride_head = c.stride("out", out, h);
  if (mask) {
    if (mask->ndim() == 3) {
      c.rank("mask", *mask, 3, "[batch, kv_len] or [batch, 1, kv_len]");
      c.dim("mask", *mask, 1, 1, "one query token per sequence");
    } else {
      c.rank("mask", *mask, 2, "[batch, kv_len] or [batch, 1, kv_len]");
    }
    c.dtype("mask", *mask, Kind::boolean);
    c.dim("mask", *mask, 0, a.batch, "batch of q");
    c.dim("mask", *mask, mask->ndim() - 1, a.kv_len, "kv_len of k");
    c.unit_last("mask", *mask);
    a.mask = static_cast<const bool*>(mask->data());
    a.mask_stride_batch = c.stride("mask", *mask, 0);
  }
  a.lse = lse_pointer(c, lse, "[batch, n_heads]", {{a.batch, "batch of q"}, {a.n_heads, "n_heads of q"}});
  a.causal_offset = causal_offset;
  finish_attention_args(c, a, q, options, stream);
  launch(&astrai::Runtime::decode, a);
}

// A prefill's dtypes from q and out. FP8 attention: q of dtype float8_e4m3fn makes the call
// qkv_dtype e4m3 (k and v must be e4m3 too), out keeps a 16-bit dtype of its own (the call's
// dtype), and q_scale, k_scale and v_scale are required: f32, one each or one per query head (q)
// and per KV head (k and v).
template <typename Args>
void set_prefill_dtypes(Checker& c, Args& a, const Input& q, const Output& out, const AttentionOptionArgs& options) {
  if (Checker::is_e4m3(q.dtype())) {
    a.qkv_dtype = astrai::KvDType::e4m3;
    a.dtype = c.attention_dtype("out", out);  // FP8 attention writes bf16 or fp16
    return;
  }
  if (q.dtype().bits == 8)  // another FP8 format: FP8 attention is e4m3 only
    throw nb::type_error((std::string(c.call()) + ": q has dtype " + dtype_string(q.dtype()) +
                          " (allowed: bfloat16, float16, or float8_e4m3fn with k and v float8_e4m3fn too)").c_str());
  a.dtype = c.attention_dtype("q", q);
  c.same_dtype("out", out, a.dtype);
  if (options.q_scale())
    c.fail(std::string("q_scale is given but q has dtype ") + torch_dtype_name(a.dtype) +
           " (allowed: None; scales come with float8_e4m3fn q, k and v, FP8 attention)");
}

astrai::PrefillArgs prefill_args(const Input& q, const Input& k, const Input& v, const Output& out,
                                 const Opt<Output>& lse, const Opt<Input>& mask, int causal_offset,
                                 const AttentionOptionArgs& options, Opt<std::uintptr_t> stream) {
  constexpr const char* kCall = "prefill";
  Checker c(kCall);
  astrai::PrefillArgs a;
  c.rank("q", q, 4, "[batch, q_len, n_heads, head_dim]");
  c.rank("out", out, 4, "[batch, q_len, n_heads, head_dim]");
  set_prefill_dtypes(c, a, q, out, options);
  a.batch = as_int(kCall, "batch", q.shape(0));
  a.q_len = as_int(kCall, "q_len", q.shape(1));
  a.n_heads = as_int(kCall, "n_heads", q.shape(2));
  a.head_dim = as_int(kCall, "head_dim", q.shape(3));
  set_contiguous_kv(c, a, k, v, ContiguousKv::q_dtype, options.k_scale(), options.v_scale(),
                    options.q_scale().has_value());
  c.same_shape("out", out, "q", q);
  c.unit_last("q", q);
  c.unit_last("out", out);
  a.q = q.data();
  a.q_stride_batch = c.stride("q", q, 0);
  a.q_stride_seq = c.stride("q", q, 1);
  a.q_stride_head = c.stride("q", q, 2);
  a.out = out.data();
  a.out_stride_batch = c.stride("out", out, 0);
  a.out_stride_seq = c.stride("out", out, 1);
  a.out_stride_head = c.stride("out", out, 2);
  if (mask) {
    const bool per_query = mask->ndim() == 3;
    c.rank("mask", *mask, per_query ? 3 : 2, "[batch, kv_len] or [batch, q_len, kv_len]");
    c.dtype("mask", *mask, Kind::boolean);
    if (mask->shape(0) != 1) c.dim("mask", *mask, 0, a.batch, "batch of q, or 1");
    if (per_query && mask->shape(1) != 1) c.dim("mask", *mask, 1, a.q_len, "q_len of q, or 1");
    c.dim("mask", *mask, mask->ndim() - 1, a.kv_len, "kv_len of k");
    c.unit_last("mask", *mask);
    a.mask = static_cast<const bool*>(mask->data());
    a.mask_batch = as_int(kCall, "mask batch", mask->shape(0));
    a.mask_q_len = per_query ? as_int(kCall, "mask q_len", mask->shape(1)) : 1;
    a.mask_stride_batch = c.stride("mask", *mask, 0);
    a.mask_stride_q = per_query ? c.stride("mask", *mask, 1) : a.kv_len;
  }
  a.lse = lse_pointer(c, lse, "[batch, q_len, n_heads]",
                      {{a.batch, "batch of q"}, {a.q_len, "q_len of q"}, {a.n_heads, "n_heads of q"}});
  a.causal_offset = causal_offset;
  finish_attention_args(c, a, q, options, stream);
  return a;
}

void prefill(const Input& q, const Input& k, const Input& v, const Output& out, const Opt<Output>& lse,
             const Opt<Input>& mask, int causal_offset, const nb::tuple& pack, Opt<std::uintptr_t> stream) {
  const astrai::PrefillArgs a =
      prefill_args(q, k, v, out, lse, mask, causal_offset, read_options("prefill", pack), stream);
  launch(&astrai::Runtime::prefill, a);
}

// For the marshalling tests: what a prefill call with these arguments hands the runtime (after
// every check; nothing launched), as a dict of astrai::PrefillArgs fields, pointers as ints.
nb::dict prefill_args_dict(const Input& q, const Input& k, const Input& v, const Output& out,
                           const Opt<Output>& lse, const Opt<Input>& mask, int causal_offset, const nb::tuple& pack,
                           Opt<std::uintptr_t> stream) {
  const astrai::PrefillArgs a =
      prefill_args(q, k, v, out, lse, mask, causal_offset, read_options("prefill", pack), stream);
  auto address = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p); };
  nb::dict d;
  d["dtype"] = astrai::dtype_name(a.dtype);
  d["qkv_dtype"] = astrai::kv_dtype_name(a.qkv_dtype);
  d["kv_dtype"] = astrai::kv_dtype_name(a.kv_dtype);
  d["batch"] = a.batch;
  d["q_len"] = a.q_len;
  d["kv_len"] = a.kv_len;
  d["n_heads"] = a.n_heads;
  d["n_kv_heads"] = a.n_kv_heads;
  d["head_dim"] = a.head_dim;
  d["scale"] = a.scale;
  d["causal_offset"] = a.causal_offset;
  d["logit_cap"] = a.logit_cap;
  d["window_left"] = a.window_left;
  d["q"] = address(a.q);
  d["k"] = address(a.k);
  d["v"] = address(a.v);
  d["out"] = address(a.out);
  d["lse"] = address(a.lse);
  d["mask"] = address(a.mask);
  d["sinks"] = address(a.sinks);
  d["alibi_slopes"] = address(a.alibi_slopes);
  d["q_scale"] = address(a.q_scale);
  d["k_scale"] = address(a.k_scale);
  d["v_scale"] = address(a.v_scale);
  d["q_scale_per_head"] = a.q_scale_per_head;
  d["p_fp16"] = a.p_fp16;
  d["kv_scale_per_head"] = a.kv_scale_per_head;
  d["q_strides"] = nb::make_tuple(a.q_stride_batch, a.q_stride_seq, a.q_stride_head);
  d["k_strides"] = nb::make_tuple(a.k_stride_batch, a.k_stride_seq, a.k_stride_head);
  d["v_strides"] = nb::make_tuple(a.v_stride_batch, a.v_stride_seq, a.v_stride_head);
  d["out_strides"] = nb::make_tuple(a.out_stride_batch, a.out_stride_seq, a.out_stride_head);
  d["stream"] = address(a.stream);
  return d;
}

void paged_prefill(const Input& q, const Input& k_cache, const Input& v_cache, const Input& page_table,
                   const Input& seq_lens, const Input& qo_indptr, const Output& out, const Opt<Output>& lse,
                   const Opt<Input>& mask, int max_q_len, bool causal, const nb::tuple& pack,
                   Opt<std::uintptr_t> stream, const Opt<Input>& req_indices, bool seq_lens_are_offsets) {
  constexpr const char* kCall = "paged_prefill";
  const AttentionOptionArgs options = read_options(kCall, pack);
  Checker c(kCall);
  astrai::PagedPrefillArgs a;
  c.rank("q", q, 3, "[total_q, n_heads, head_dim]");
  c.rank("page_table", page_table, 2, "[batch, max_pages_per_seq]");
  const char* lens_name = seq_lens_are_offsets ? "kv_indptr" : "seq_lens";  // as the functional API names it
  c.rank(lens_name, seq_lens, 1, seq_lens_are_offsets ? "[batch + 1]" : "[batch]");
  c.rank("qo_indptr", qo_indptr, 1, "[batch + 1]");
  c.rank("out", out, 3, "[total_q, n_heads, head_dim]");
  set_prefill_dtypes(c, a, q, out, options);
  c.dtype("page_table", page_table, Kind::index);
  c.dtype(lens_name, seq_lens, Kind::index);
  c.dtype("qo_indptr", qo_indptr, Kind::index);
  a.batch = as_int(kCall, "batch", qo_indptr.shape(0)) - 1;
  if (a.batch < 0) invalid(kCall, "qo_indptr has shape [0] (allowed: [batch + 1])");
  c.dim(lens_name, seq_lens, 0, a.batch + (seq_lens_are_offsets ? 1 : 0),
        seq_lens_are_offsets ? "batch + 1, batch from qo_indptr" : "batch, from qo_indptr");
  a.seq_lens_are_offsets = seq_lens_are_offsets;
  a.total_q = as_int(kCall, "total_q", q.shape(0));
  a.max_q_len = max_q_len < 0 ? a.total_q : max_q_len;
  a.n_heads = as_int(kCall, "n_heads", q.shape(1));
  a.head_dim = as_int(kCall, "head_dim", q.shape(2));
  set_paged_cache(c, a, k_cache, v_cache, options.k_scale(), options.v_scale(), options.q_scale().has_value());
  a.max_pages_per_seq = as_int(kCall, "max_pages_per_seq", page_table.shape(1));
  set_request_rows(c, kCall, a, page_table, req_indices, "batch, from qo_indptr");
  c.same_shape("out", out, "q", q);
  for (auto [name, t] : {std::pair{"q", &q}, {"page_table", &page_table}}) c.unit_last(name, *t);
  c.unit_last("out", out);
  c.contiguous(lens_name, seq_lens);
  c.contiguous("qo_indptr", qo_indptr);
  a.q = q.data();
  a.q_stride_token = c.stride("q", q, 0);
  a.q_stride_head = c.stride("q", q, 1);
  a.page_table = index_table(page_table);
  a.page_table_stride = c.stride("page_table", page_table, 0);
  a.seq_lens = index_table(seq_lens);
  a.qo_indptr = index_table(qo_indptr);
  a.out = out.data();
  a.out_stride_token = c.stride("out", out, 0);
  a.out_stride_head = c.stride("out", out, 1);
  if (mask) {
    // 2-D: a row per query row of q; 3-D: rows numbered within each request, [batch, rows, kv],
    // where rows is at least the longest request's query count (the kernel reads row i < q_len_b).
    const bool per_request = mask->ndim() == 3;
    const std::int64_t capacity = static_cast<std::int64_t>(a.max_pages_per_seq) * a.page_size;
    c.rank("mask", *mask, per_request ? 3 : 2,
           "[total_q, max_pages_per_seq * page_size] or [batch, max_q_len, max_pages_per_seq * page_size]");
    c.dtype("mask", *mask, Kind::boolean);
    const bool shared_row = per_request && mask->shape(1) == 1;  // one row for all of a request's queries
    if (per_request) {
      c.dim("mask", *mask, 0, a.batch, "batch, from qo_indptr");
      if (!shared_row && mask->shape(1) < static_cast<std::size_t>(a.max_q_len))
        invalid(kCall, "mask has shape " + shape_string(*mask) + ": " + std::to_string(mask->shape(1)) +
                           " rows a request for max_q_len " + std::to_string(a.max_q_len) +
                           " (allowed: at least max_q_len rows; pass max_q_len)");
    } else {
      c.dim("mask", *mask, 0, a.total_q, "total_q of q");
    }
    c.dim("mask", *mask, mask->ndim() - 1, capacity, "max_pages_per_seq * page_size");
    c.unit_last("mask", *mask);
    a.mask = static_cast<const bool*>(mask->data());
    a.mask_rows_per_request = per_request;
    if (per_request) a.mask_stride_batch = c.stride("mask", *mask, 0);
    a.mask_stride_q = shared_row ? 0 : c.stride("mask", *mask, per_request ? 1 : 0);
  }
  a.lse = lse_pointer(c, lse, "[total_q, n_heads]", {{a.total_q, "total_q of q"}, {a.n_heads, "n_heads of q"}});
  a.causal = causal;
  finish_attention_args(c, a, q, options, stream);
  launch(&astrai::Runtime::paged_prefill, a);
}

void rotary_emb(const Input& x, const Input& freqs, const Output& out, Opt<std::uintptr_t> stream) {
  constexpr const char* kCall = "rotary_emb";
  Checker c(kCall);
  astrai::RotaryArgs a;
  const bool tokens = x.ndim() == 3;
  c.rank("x", x, tokens ? 3 : 4, "[tokens, n_heads, head_dim] or [batch, seq, n_heads, head_dim]");
  c.rank("out", out, x.ndim(), "the shape of x");
  a.dtype = c.attention_dtype("x", x);
  c.same_dtype("out", out, a.dtype);
  c.same_shape("out", out, "x", x);
  const std::size_t s = tokens ? 0 : 1;
  a.batch = tokens ? 1 : as_int(kCall, "batch", x.shape(0));
  a.seq_len = as_int(kCall, "seq", x.shape(s));
  a.n_heads = as_int(kCall, "n_heads", x.shape(s + 1));
  a.head_dim = as_int(kCall, "head_dim", x.shape(s + 2));
  const bool freqs_batched = freqs.ndim() == 4;
  if (tokens) {
    c.rank("freqs_cis", freqs, 3, "[tokens, head_dim / 2, 2]");
  } else if (freqs_batched) {
    c.rank("freqs_cis", freqs, 4, "[batch, seq, head_dim / 2, 2] or [seq, head_dim / 2, 2]");
    if (freqs.shape(0) != 1) c.dim("freqs_cis", freqs, 0, a.batch, "batch of x, or 1");
  } else {
    c.rank("freqs_cis", freqs, 3, "[batch, seq, head_dim / 2, 2] or [seq, head_dim / 2, 2]");
  }
  c.dtype("freqs_cis", freqs, Kind::float32);
  const std::size_t fs = freqs_batched ? 1 : 0;
  c.dim("freqs_cis", freqs, fs, a.seq_len, tokens ? "tokens of x" : "seq of x");
  c.dim("freqs_cis", freqs, fs + 1, a.head_dim / 2, "head_dim / 2 of x");
  c.dim("freqs_cis", freqs, fs + 2, 2, "(cos, sin) pairs");
  c.unit_last("x", x);
  c.unit_last("out", out);
  if ((freqs.shape(fs + 1) > 1 && freqs.stride(fs + 1) != 2) || freqs.stride(fs + 2) != 1)
    invalid(kCall, "freqs_cis is not contiguous in its last two dims (allowed: [..., head_dim / 2, 2] contiguous)");
  a.x = x.data();
  a.x_stride_batch = tokens ? 0 : c.stride("x", x, 0);
  a.x_stride_seq = c.stride("x", x, s);
  a.x_stride_head = c.stride("x", x, s + 1);
  a.out = out.data();
  a.out_stride_batch = tokens ? 0 : c.stride("out", out, 0);
  a.out_stride_seq = c.stride("out", out, s);
  a.out_stride_head = c.stride("out", out, s + 1);
  a.freqs = static_cast<const float*>(freqs.data());
  a.freqs_stride_batch = freqs_batched && freqs.shape(0) > 1 ? c.stride("freqs_cis", freqs, 0) : 0;
  a.freqs_stride_seq = c.stride("freqs_cis", freqs, fs);
  astrai::validate_args(a);
  c.devices();
  a.stream = launch_stream(kCall, stream, x);
  launch(&astrai::Runtime::rotary_emb, a);
}

// One source of merge_states: values [rows, n_heads, head_dim] and LSEs [rows, n_heads] (one
// state), or [rows, states, n_heads, head_dim] and [rows, states, n_heads] (stacked states); the
// rows, heads and head dim are out's.
void set_merge_source(Checker& c, const astrai::MergeStatesArgs& a, astrai::MergeStatesSource& source,
                      const char* v_name, const Input& v, const char* lse_name, const Input& lse) {
  const bool stacked = v.ndim() == 4;
  c.rank(v_name, v, stacked ? 4 : 3, "[rows, n_heads, head_dim] or [rows, states, n_heads, head_dim]");
  c.rank(lse_name, lse, v.ndim() - 1,
         stacked ? "[rows, states, n_heads], as its values" : "[rows, n_heads], as its values");
  c.same_dtype(v_name, v, a.dtype, "out");
  c.dtype(lse_name, lse, Kind::float32);
  const std::size_t h = stacked ? 2 : 1;
  c.dim(v_name, v, 0, a.rows, "rows of out");
  c.dim(v_name, v, h, a.n_heads, "n_heads of out");
  c.dim(v_name, v, h + 1, a.head_dim, "head_dim of out");
  source.states = stacked ? as_int(c.call(), "states", v.shape(1)) : 1;
  c.dim(lse_name, lse, 0, a.rows, "rows of out");
  if (stacked) c.dim(lse_name, lse, 1, source.states, "states of its values");
  c.dim(lse_name, lse, h, a.n_heads, "n_heads of out");
  c.unit_last(v_name, v);
  source.v = v.data();
  source.v_stride_row = c.stride(v_name, v, 0);
  source.v_stride_state = stacked ? c.stride(v_name, v, 1) : 0;
  source.v_stride_head = c.stride(v_name, v, h);
  source.lse = static_cast<const float*>(lse.data());
  source.lse_stride_row = c.stride(lse_name, lse, 0);
  source.lse_stride_state = stacked ? c.stride(lse_name, lse, 1) : 0;
  source.lse_stride_head = c.stride(lse_name, lse, h);
}

void merge_states(const Input& v_a, const Input& s_a, const Opt<Input>& v_b, const Opt<Input>& s_b,
                  const Output& out, const Opt<Output>& lse, Opt<std::uintptr_t> stream) {
  constexpr const char* kCall = "merge_states";
  Checker c(kCall);
  astrai::MergeStatesArgs a;
  c.rank("out", out, 3, "[rows, n_heads, head_dim]");
  a.dtype = c.attention_dtype("out", out);
  a.rows = as_int(kCall, "rows", out.shape(0));
  a.n_heads = as_int(kCall, "n_heads", out.shape(1));
  a.head_dim = as_int(kCall, "head_dim", out.shape(2));
  set_merge_source(c, a, a.a, "v_a", v_a, "s_a", s_a);
  if (v_b.has_value() != s_b.has_value())
    invalid(kCall, "v_b and s_b come together (allowed: both, or neither for a's states alone)");
  if (v_b) {
    set_merge_source(c, a, a.b, "v_b", *v_b, "s_b", *s_b);
  } else {
    a.b.states = 0;
  }
  c.unit_last("out", out);
  a.out = out.data();
  a.out_stride_row = c.stride("out", out, 0);
  a.out_stride_head = c.stride("out", out, 1);
  if (lse) {
    c.rank("lse", *lse, 2, "[rows, n_heads]");
    c.dtype("lse", *lse, Kind::float32);
    c.dim("lse", *lse, 0, a.rows, "rows of out");
    c.dim("lse", *lse, 1, a.n_heads, "n_heads of out");
    a.lse = static_cast<float*>(lse->data());
    a.lse_stride_row = c.stride("lse", *lse, 0);
    a.lse_stride_head = c.stride("lse", *lse, 1);
  }
  astrai::validate_args(a);
  c.devices();
  a.stream = launch_stream(kCall, stream, out);
  launch(&astrai::Runtime::merge_states, a);
}

// MLA decode: q [batch, n_heads, 576] or [batch, q_len, n_heads, 576], one latent cache
// [pages, page_size, 576] (or [pages, page_size, 1, 576]), out like q with 512-wide rows.
void mla_decode(const Input& q, const Input& kv_cache, const Input& page_table, const Input& seq_lens,
                const Output& out, const Opt<Output>& lse, double scale, Opt<std::uintptr_t> stream,
                bool seq_lens_are_offsets, const Opt<Output>& workspace, const Opt<Input>& kv_scale) {
  constexpr const char* kCall = "mla_decode";
  constexpr const char* kLayout = "[batch, n_heads, 576] or [batch, q_len, n_heads, 576]";
  Checker c(kCall);
  astrai::MlaDecodeArgs a;
  const bool tokens = q.ndim() == 4;
  const std::size_t h = tokens ? 2 : 1;
  c.rank("q", q, tokens ? 4 : 3, kLayout);
  c.rank("out", out, q.ndim(), tokens ? "[batch, q_len, n_heads, 512]" : "[batch, n_heads, 512]");
  const bool headed = kv_cache.ndim() == 4;
  c.rank("kv_cache", kv_cache, headed ? 4 : 3, "[num_pages, page_size, 576] or [num_pages, page_size, 1, 576]");
  c.rank("page_table", page_table, 2, "[batch, max_pages_per_seq]");
  const char* lens_name = seq_lens_are_offsets ? "kv_indptr" : "seq_lens";
  c.rank(lens_name, seq_lens, 1, seq_lens_are_offsets ? "[batch + 1]" : "[batch]");
  a.dtype = c.attention_dtype("q", q);
  a.kv_dtype = c.kv_dtype("kv_cache", kv_cache, a.dtype);
  c.same_dtype("out", out, a.dtype);
  if (a.kv_dtype == astrai::KvDType::same && kv_scale)
    c.fail("kv_scale is given but kv_cache has dtype " + dtype_string(kv_cache.dtype()) +
           " (allowed: a scale with a float8_e4m3fn or float8_e5m2 cache only)");
  if (a.kv_dtype != astrai::KvDType::same && !kv_scale)
    c.fail("kv_cache has dtype " + dtype_string(kv_cache.dtype()) + " but kv_scale is missing (allowed: an f32 "
           "scale, [] or [1])");
  if (kv_scale) {
    c.rank("kv_scale", *kv_scale, kv_scale->ndim() == 0 ? 0 : 1, "[] or [1]");
    c.dtype("kv_scale", *kv_scale, Kind::float32);
    if (kv_scale->ndim() == 1) c.dim("kv_scale", *kv_scale, 0, 1, "1 (one scale for the latent head)");
    a.kv_scale = static_cast<const float*>(kv_scale->data());
  }
  c.dtype("page_table", page_table, Kind::index);
  c.dtype(lens_name, seq_lens, Kind::index);
  a.batch = as_int(kCall, "batch", q.shape(0));
  a.q_len = tokens ? as_int(kCall, "q_len", q.shape(1)) : 1;
  a.n_heads = as_int(kCall, "n_heads", q.shape(h));
  c.dim("q", q, h + 1, 576, "576 (512 latent + 64 rotary dims)");
  c.dim("out", out, 0, a.batch, "batch of q");
  if (tokens) c.dim("out", out, 1, a.q_len, "q_len of q");
  c.dim("out", out, h, a.n_heads, "n_heads of q");
  c.dim("out", out, h + 1, 512, "512 (V's latent dims)");
  if (headed) c.dim("kv_cache", kv_cache, 2, 1, "1 (one latent head)");
  c.dim("kv_cache", kv_cache, kv_cache.ndim() - 1, 576, "576 (512 latent + 64 rotary dims)");
  a.num_pages = as_int(kCall, "num_pages", kv_cache.shape(0));
  a.page_size = as_int(kCall, "page_size", kv_cache.shape(1));
  a.max_pages_per_seq = as_int(kCall, "max_pages_per_seq", page_table.shape(1));
  c.dim("page_table", page_table, 0, a.batch, "batch of q");
  c.dim(lens_name, seq_lens, 0, a.batch + (seq_lens_are_offsets ? 1 : 0),
        seq_lens_are_offsets ? "batch of q + 1" : "batch of q");
  c.contiguous(lens_name, seq_lens);
  for (auto [name, t] : {std::pair{"q", &q}, {"kv_cache", &kv_cache}, {"page_table", &page_table}}) c.unit_last(name, *t);
  c.unit_last("out", out);
  a.q = q.data();
  a.q_stride_batch = c.stride("q", q, 0);
  if (tokens) a.q_stride_seq = c.stride("q", q, 1);
  a.q_stride_head = c.stride("q", q, h);
  a.kv_cache = kv_cache.data();
  a.kv_stride_page = c.stride("kv_cache", kv_cache, 0);
  a.kv_stride_token = c.stride("kv_cache", kv_cache, 1);
  a.page_table = index_table(page_table);
  a.page_table_stride = c.stride("page_table", page_table, 0);
  a.seq_lens = index_table(seq_lens);
  a.seq_lens_are_offsets = seq_lens_are_offsets;
  a.out = out.data();
  a.out_stride_batch = c.stride("out", out, 0);
  if (tokens) a.out_stride_seq = c.stride("out", out, 1);
  a.out_stride_head = c.stride("out", out, h);
  a.lse = tokens ? lse_pointer(c, lse, "[batch, q_len, n_heads]",
                               {{a.batch, "batch of q"}, {a.q_len, "q_len of q"}, {a.n_heads, "n_heads of q"}})
                 : lse_pointer(c, lse, "[batch, n_heads]", {{a.batch, "batch of q"}, {a.n_heads, "n_heads of q"}});
  if (workspace) {
    a.workspace_bytes = c.scratch("workspace", *workspace);
    a.workspace = workspace->data();
  }
  a.scale = static_cast<float>(scale);
  astrai::validate_args(a);
  c.devices();
  a.stream = launch_stream(kCall, stream, q);
  launch(&astrai::Runtime::mla_decode, a);
}

// Cascade levels come as parallel lists (one entry a level): qo_indptr [groups + 1], page
// table [groups, max_pages], seq_lens [groups], causal, max_q_len (-1: total_q).
void cascade(const Input& q, const Input& k_cache, const Input& v_cache, const std::vector<Input>& qo_indptrs,
             const std::vector<Input>& page_tables, const std::vector<Input>& seq_lens,
             const std::vector<bool>& causal, const std::vector<int>& max_q_lens, const Output& out,
             const Opt<Output>& lse, const nb::tuple& pack, const Opt<Output>& workspace,
             Opt<std::uintptr_t> stream) {
  constexpr const char* kCall = "cascade";
  // A window and ALiBi travel in the pack too; the runtime refuses them for cascade by name.
  const AttentionOptionArgs options = read_options(kCall, pack);
  Checker c(kCall);
  astrai::CascadeArgs a;
  const std::size_t levels = qo_indptrs.size();
  if (levels < 1 || levels > static_cast<std::size_t>(astrai::kMaxCascadeLevels))
    invalid(kCall, "levels has " + std::to_string(levels) + " entries (allowed: 1.." +
                       std::to_string(astrai::kMaxCascadeLevels) + ")");
  if (page_tables.size() != levels || seq_lens.size() != levels || causal.size() != levels ||
      max_q_lens.size() != levels)
    invalid(kCall, "the level lists differ in length (allowed: one qo_indptr, page_table, seq_lens, causal and "
                   "max_q_len a level)");
  c.rank("q", q, 3, "[total_q, n_heads, head_dim]");
  c.rank("out", out, 3, "[total_q, n_heads, head_dim]");
  a.dtype = c.attention_dtype("q", q);
  c.same_dtype("out", out, a.dtype);
  c.same_shape("out", out, "q", q);
  a.total_q = as_int(kCall, "total_q", q.shape(0));
  a.n_heads = as_int(kCall, "n_heads", q.shape(1));
  a.head_dim = as_int(kCall, "head_dim", q.shape(2));
  set_paged_cache(c, a, k_cache, v_cache, options.k_scale(), options.v_scale());
  a.num_levels = static_cast<int>(levels);
  static_assert(astrai::kMaxCascadeLevels == 4, "one row of argument names a level");
  static const char* const kNames[][3] = {{"levels[0].qo_indptr", "levels[0].page_table", "levels[0].seq_lens"},
                                          {"levels[1].qo_indptr", "levels[1].page_table", "levels[1].seq_lens"},
                                          {"levels[2].qo_indptr", "levels[2].page_table", "levels[2].seq_lens"},
                                          {"levels[3].qo_indptr", "levels[3].page_table", "levels[3].seq_lens"}};
  for (std::size_t l = 0; l < levels; ++l) {
    const char* const* names = kNames[l];
    astrai::CascadeLevel& level = a.levels[l];
    c.rank(names[0], qo_indptrs[l], 1, "[groups + 1]");
    c.rank(names[1], page_tables[l], 2, "[groups, max_pages_per_seq]");
    c.rank(names[2], seq_lens[l], 1, "[groups]");
    for (std::size_t i = 0; i < 3; ++i)
      c.dtype(names[i], i == 0 ? qo_indptrs[l] : i == 1 ? page_tables[l] : seq_lens[l], Kind::index);
    level.groups = as_int(kCall, "groups", qo_indptrs[l].shape(0)) - 1;
    if (level.groups < 0) invalid(kCall, std::string(names[0]) + " has shape [0] (allowed: [groups + 1])");
    c.dim(names[1], page_tables[l], 0, level.groups, "groups, from qo_indptr");
    c.dim(names[2], seq_lens[l], 0, level.groups, "groups, from qo_indptr");
    c.contiguous(names[0], qo_indptrs[l]);
    c.contiguous(names[2], seq_lens[l]);
    c.unit_last(names[1], page_tables[l]);
    level.qo_indptr = index_table(qo_indptrs[l]);
    level.page_table = index_table(page_tables[l]);
    level.max_pages_per_seq = as_int(kCall, "max_pages_per_seq", page_tables[l].shape(1));
    level.page_table_stride = c.stride(names[1], page_tables[l], 0);
    level.seq_lens = index_table(seq_lens[l]);
    level.causal = causal[l];
    level.max_q_len = max_q_lens[l] < 0 ? a.total_q : max_q_lens[l];
  }
  c.unit_last("q", q);
  c.unit_last("out", out);
  a.q = q.data();
  a.q_stride_token = c.stride("q", q, 0);
  a.q_stride_head = c.stride("q", q, 1);
  a.out = out.data();
  a.out_stride_token = c.stride("out", out, 0);
  a.out_stride_head = c.stride("out", out, 1);
  a.lse = lse_pointer(c, lse, "[total_q, n_heads]", {{a.total_q, "total_q of q"}, {a.n_heads, "n_heads of q"}});
  if (workspace) {
    a.workspace_bytes = c.scratch("workspace", *workspace);
    a.workspace = workspace->data();
  }
  finish_attention_args(c, a, q, options, stream);
  launch(&astrai::Runtime::cascade, a);
}

std::vector<std::string> loaded_variants() { return astrai::Runtime::get().loaded_variants(); }

}  // namespace

NB_MODULE(_C, m) {
  m.doc() = "astrai-jit runtime calls over DLPack tensors (use the astrai_jit package)";

  // The Python exception types. InvalidArgument is also a ValueError, so callers catching the
  // standard type see it.
  static PyObject* error = PyErr_NewException("astrai_jit.Error", PyExc_RuntimeError, nullptr);
  nb::object invalid_bases = nb::make_tuple(nb::handle(error), nb::handle(PyExc_ValueError));
  static PyObject* invalid_argument =
      PyErr_NewException("astrai_jit.InvalidArgument", invalid_bases.ptr(), nullptr);
  static PyObject* compile_error = PyErr_NewException("astrai_jit.CompileError", error, nullptr);
  static PyObject* cuda_error = PyErr_NewException("astrai_jit.CudaError", error, nullptr);
  static PyObject* config_error = PyErr_NewException("astrai_jit.ConfigError", error, nullptr);
  static PyObject* cache_miss_error = PyErr_NewException("astrai_jit.CacheMissError", error, nullptr);
  m.attr("Error") = nb::handle(error);
  m.attr("InvalidArgument") = nb::handle(invalid_argument);
  m.attr("CompileError") = nb::handle(compile_error);
  m.attr("CudaError") = nb::handle(cuda_error);
  m.attr("ConfigError") = nb::handle(config_error);
  m.attr("CacheMissError") = nb::handle(cache_miss_error);

  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const astrai::InvalidArgument& e) {
      PyErr_SetString(invalid_argument, e.what());
    } catch (const astrai::CompileError& e) {
      std::string message = e.what();
      if (!e.log().empty() && message.find(e.log()) == std::string::npos) message += "\n" + e.log();
      PyErr_SetString(compile_error, message.c_str());
    } catch (const astrai::CudaError& e) {
      PyErr_SetString(cuda_error, e.what());
    } catch (const astrai::ConfigError& e) {
      PyErr_SetString(config_error, e.what());
    } catch (const astrai::CacheMissError& e) {
      PyErr_SetString(cache_miss_error, e.what());
    } catch (const astrai::Error& e) {
      PyErr_SetString(error, e.what());
    }
  });

  m.def("paged_decode", &paged_decode, nb::arg("q"), nb::arg("k_cache"), nb::arg("v_cache"),
        nb::arg("page_table"), nb::arg("seq_lens").none(), nb::arg("out"), nb::arg("lse").none(),
        nb::arg("mask").none(), nb::arg("req_indices").none(), nb::arg("new_k").none(),
        nb::arg("new_v").none(), nb::arg("options"), nb::arg("stream").none(),
        nb::arg("seq_lens_are_offsets") = false, nb::arg("workspace").none() = nb::none(),
        "Paged decode attention over DLPack tensors; out (and lse) written in place.");
  m.def("decode", &decode, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("lse").none(),
        nb::arg("mask").none(), nb::arg("causal_offset"), nb::arg("options"), nb::arg("stream").none(),
        "Decode attention over a contiguous KV cache.");
  m.def("prefill", &prefill, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("lse").none(),
        nb::arg("mask").none(), nb::arg("causal_offset"), nb::arg("options"), nb::arg("stream").none(),
        "Prefill attention over a contiguous KV cache.");
  m.def("paged_prefill", &paged_prefill, nb::arg("q"), nb::arg("k_cache"), nb::arg("v_cache"),
        nb::arg("page_table"), nb::arg("seq_lens"), nb::arg("qo_indptr"), nb::arg("out"),
        nb::arg("lse").none(), nb::arg("mask").none(), nb::arg("max_q_len"), nb::arg("causal"),
        nb::arg("options"), nb::arg("stream").none(), nb::arg("req_indices").none() = nb::none(),
        nb::arg("seq_lens_are_offsets") = false,
        "Prefill over a paged KV cache, ragged batch.");
  m.def("rotary_emb", &rotary_emb, nb::arg("x"), nb::arg("freqs_cis"), nb::arg("out"), nb::arg("stream").none(),
        "Rotary embedding over interleaved pairs (out may be x).");
  m.def("merge_states", &merge_states, nb::arg("v_a"), nb::arg("s_a"), nb::arg("v_b").none(), nb::arg("s_b").none(),
        nb::arg("out"), nb::arg("lse").none(), nb::arg("stream").none(),
        "Attention states merged by their LSEs (out and lse may be a's or b's single state).");
  m.def("mla_decode", &mla_decode, nb::arg("q"), nb::arg("kv_cache"), nb::arg("page_table"), nb::arg("seq_lens"),
        nb::arg("out"), nb::arg("lse").none(), nb::arg("scale"), nb::arg("stream").none(),
        nb::arg("seq_lens_are_offsets") = false, nb::arg("workspace").none() = nb::none(),
        nb::arg("kv_scale").none() = nb::none(), "MLA decode (absorbed form) over one paged latent cache.");
  m.def("cascade", &cascade, nb::arg("q"), nb::arg("k_cache"), nb::arg("v_cache"), nb::arg("qo_indptrs"),
        nb::arg("page_tables"), nb::arg("seq_lens"), nb::arg("causal"), nb::arg("max_q_lens"), nb::arg("out"),
        nb::arg("lse").none(), nb::arg("options"), nb::arg("workspace").none(), nb::arg("stream").none(),
        "Cascade attention over KV levels shared by groups of query rows.");
  m.def("_time_paged_decode_calls", &time_paged_decode_calls, nb::arg("q"), nb::arg("k_cache"),
        nb::arg("v_cache"), nb::arg("page_table"), nb::arg("seq_lens"), nb::arg("out"), nb::arg("scale"),
        nb::arg("stream").none(), nb::arg("calls"), "Benchmark helper: mean host us per C++ paged_decode call.");
  m.def("_reads_type_directly",
        [](nb::handle type) {
          return PyType_Check(type.ptr()) && exchange_api(reinterpret_cast<PyTypeObject*>(type.ptr())) != nullptr;
        },
        nb::arg("type"),
        "Whether tensors of this type are read through DLPack's C exchange API, which also gives the "
        "current stream (stream=None), rather than through __dlpack__.");
  m.def("_set_host_only", [](bool on) { host_only = on; }, nb::arg("on"),
        "Benchmark mode: calls accept CPU tensors and launch nothing.");
  m.def("_prefill_args", &prefill_args_dict, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"),
        nb::arg("lse").none(), nb::arg("mask").none(), nb::arg("causal_offset"), nb::arg("options"),
        nb::arg("stream").none(),
        "For tests: the astrai::PrefillArgs (a dict) a prefill call with these arguments launches; checks "
        "everything, launches nothing.");
  m.def("_attention_option_fields", &option_fields,
        "The attention options' pack as the extension reads it: (name, schema kind, default) a field, in order.");
  m.def("loaded_variants", &loaded_variants, "Variant names this process has loaded.");
  astrai_jit_binding::bind_cache_metrics(m);
}
