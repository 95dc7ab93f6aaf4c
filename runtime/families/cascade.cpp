// cascade: attention over KV levels shared by groups of requests, as one paged_prefill pass a
// level and an in-place merge of each further level into the first (merge_states). It has no
// kernel of its own: its checks, its workspace and the order of the calls.
#include <algorithm>
#include <cstdint>
#include <string>

#include <fmt/format.h>

#include "kernel_src/kernel_params.h"
#include "runtime/families/arg_checks.hpp"
#include "runtime/launch_heuristics.hpp"
#include "runtime/runtime_impl.hpp"
#include "runtime/validation.hpp"

namespace astrai {

namespace detail {

namespace {

constexpr const char* kCascadeCall = "cascade";
constexpr std::size_t kCascadeAlign = 256;

std::size_t aligned(std::size_t bytes) { return (bytes + kCascadeAlign - 1) / kCascadeAlign * kCascadeAlign; }

// The scratch of a call with more than one level: a level's output (q's dtype, contiguous) and
// LSE, level 0's LSE when the caller asks for none (the merges need it), and with a split shared
// level its q copies, its chunks' states, their query offsets and lengths.
struct CascadeScratch {
  std::size_t out = 0, lse = 0, first_lse = 0, decode = 0, q_copies = 0, chunk_out = 0, chunk_lse = 0, indptr = 0,
              lens = 0;
  std::size_t bytes = 0;
};

// `decode_bytes`: the split-KV workspace of the levels paged_decode serves (they run one after
// another and share it).
CascadeScratch cascade_scratch(const CascadeArgs& a, const CascadeSplit& split, std::size_t decode_bytes) {
  CascadeScratch s;
  if (a.num_levels <= 1) return s;
  const std::size_t rows = static_cast<std::size_t>(a.total_q) * static_cast<std::size_t>(a.n_heads);
  const std::size_t row_bytes = static_cast<std::size_t>(a.head_dim) * 2;
  const std::size_t chunks = static_cast<std::size_t>(split.chunks);
  s.out = 0;
  s.lse = aligned(rows * row_bytes);
  s.first_lse = s.lse + aligned(rows * 4);
  s.decode = s.first_lse + (a.lse == nullptr ? aligned(rows * 4) : 0);
  s.q_copies = s.decode + aligned(decode_bytes);
  if (chunks <= 1) {
    s.bytes = s.q_copies;
    return s;
  }
  s.chunk_out = s.q_copies + aligned(chunks * rows * row_bytes);
  s.chunk_lse = s.chunk_out + aligned(chunks * rows * row_bytes);
  s.indptr = s.chunk_lse + aligned(chunks * rows * 4);
  s.lens = s.indptr + aligned((chunks + 1) * 4);
  s.bytes = s.lens + aligned(chunks * 4);
  return s;
}

// What every level's call shares with the cascade: the options, the shape, the KV pool.
template <typename Args>
void copy_cascade_fields(const CascadeArgs& a, int l, Args* call) {
  Args& p = *call;
  static_cast<AttentionOptions&>(p) = a;
  if (l > 0) p.sinks = nullptr;  // a sink joins the softmax once: level 0's pass carries it
  p.dtype = a.dtype;
  p.n_heads = a.n_heads;
  p.n_kv_heads = a.n_kv_heads;
  p.head_dim = a.head_dim;
  p.page_size = a.page_size;
  p.num_pages = a.num_pages;
  p.max_pages_per_seq = a.levels[l].max_pages_per_seq;
  p.scale = a.scale;
  p.k_cache = a.k_cache;
  p.k_stride_page = a.k_stride_page;
  p.k_stride_token = a.k_stride_token;
  p.k_stride_head = a.k_stride_head;
  p.v_cache = a.v_cache;
  p.v_stride_page = a.v_stride_page;
  p.v_stride_token = a.v_stride_token;
  p.v_stride_head = a.v_stride_head;
  p.page_table = a.levels[l].page_table;
  p.page_table_stride = a.levels[l].page_table_stride;
  p.seq_lens = a.levels[l].seq_lens;
  p.lse = a.lse;
  p.stream = a.stream;
}

// Level `l` as the paged_prefill call that computes it (outputs set by the caller).
PagedPrefillArgs level_call(const CascadeArgs& a, int l) {
  const CascadeLevel& level = a.levels[l];
  PagedPrefillArgs p;
  copy_cascade_fields(a, l, &p);
  p.batch = level.groups;
  p.total_q = a.total_q;
  p.max_q_len = level.max_q_len;
  p.causal = level.causal;
  p.q = a.q;
  p.q_stride_token = a.q_stride_token;
  p.q_stride_head = a.q_stride_head;
  p.qo_indptr = level.qo_indptr;
  p.out = a.out;
  p.out_stride_token = a.out_stride_token;
  p.out_stride_head = a.out_stride_head;
  return p;
}

// A causal level of q_len rows a group (groups x q_len = total_q, q_len <= 8) holds each
// request's new tokens: paged_decode serves it (the multi-token decode, which splits long keys
// over the SMs), where a paged_prefill tile would hold only group x q_len live rows.
bool level_as_decode(const CascadeArgs& a, int l) {
  const CascadeLevel& level = a.levels[l];
  return l > 0 && level.causal && level.max_q_len >= 1 && level.max_q_len <= kMaxDecodeQLen &&
         1LL * level.groups * level.max_q_len == a.total_q;
}

// Level `l` as the paged_decode call that computes it (outputs set by the caller). Group b's
// rows are q's rows b * q_len .. b * q_len + q_len - 1.
PagedDecodeArgs decode_call(const CascadeArgs& a, int l) {
  const CascadeLevel& level = a.levels[l];
  PagedDecodeArgs d;
  copy_cascade_fields(a, l, &d);
  d.batch = level.groups;
  d.q_len = level.max_q_len;
  d.q = a.q;
  d.q_stride_batch = level.max_q_len * a.q_stride_token;
  d.q_stride_seq = a.q_stride_token;
  d.q_stride_head = a.q_stride_head;
  d.out = a.out;
  d.out_stride_batch = level.max_q_len * a.out_stride_token;
  d.out_stride_seq = a.out_stride_token;
  d.out_stride_head = a.out_stride_head;
  return d;
}

// The merge of a level's result (level_out, level_lse) into the result so far (out, first_lse),
// in place.
MergeStatesArgs level_merge(const CascadeArgs& a, void* level_out, float* level_lse, float* first_lse) {
  MergeStatesArgs merge;
  merge.dtype = a.dtype;
  merge.rows = a.total_q;
  merge.n_heads = a.n_heads;
  merge.head_dim = a.head_dim;
  merge.a.v = a.out;
  merge.a.lse = first_lse;
  merge.a.v_stride_row = a.out_stride_token;
  merge.a.v_stride_head = a.out_stride_head;
  merge.b.v = level_out;
  merge.b.lse = level_lse;
  merge.out = a.out;
  merge.out_stride_row = a.out_stride_token;
  merge.out_stride_head = a.out_stride_head;
  merge.lse = first_lse;
  merge.stream = a.stream;
  return merge;
}

// Where the scratch lies: the caller's workspace, or (null) the device's.
struct ScratchPointers {
  void* level_out;
  float* level_lse;
  float* first_lse;
  void* decode_workspace;
};

ScratchPointers scratch_pointers(const CascadeArgs& a, const CascadeSplit& split, std::size_t decode_bytes,
                                 std::uintptr_t base) {
  const CascadeScratch s = cascade_scratch(a, split, decode_bytes);
  return {reinterpret_cast<void*>(base + s.out), reinterpret_cast<float*>(base + s.lse),
          a.lse != nullptr ? a.lse : reinterpret_cast<float*>(base + s.first_lse),
          reinterpret_cast<void*>(base + s.decode)};
}

// A level's checks are paged_prefill's, reported as this call's: "cascade: levels[1]: ...".
PagedPrefillArgs resolve_level(const PagedPrefillArgs& call, int l) {
  try {
    return resolve_paged_prefill_args(call);
  } catch (const InvalidArgument& error) {
    std::string message = error.what();
    const std::string prefix = std::string(paged_prefill_family().name) + ": ";
    if (message.rfind(prefix, 0) == 0) message.erase(0, prefix.size());
    fail_argument(kCascadeCall, fmt::format("levels[{}]: {}", l, message));
  }
}

// Level 0 split into chunks: one group a chunk over copies of q (contiguous), each group's
// table row `chunk_pages` further into the level's one row, its outputs the chunks' states.
PagedPrefillArgs chunked_level(const PagedPrefillArgs& level, const CascadeSplit& split, const CascadeArgs& a,
                               std::uintptr_t base, const CascadeScratch& s) {
  PagedPrefillArgs p = level;
  p.batch = split.chunks;
  p.page_table_rows = split.chunks;  // rows chunk_pages apart within the level's one row
  p.total_q = split.chunks * a.total_q;
  p.max_q_len = a.total_q;
  p.q = reinterpret_cast<const void*>(base + s.q_copies);
  p.q_stride_token = 1LL * a.n_heads * a.head_dim;
  p.q_stride_head = a.head_dim;
  p.qo_indptr = reinterpret_cast<const std::int32_t*>(base + s.indptr);
  p.max_pages_per_seq = split.chunk_pages;
  p.page_table_stride = split.chunk_pages;
  p.seq_lens = reinterpret_cast<const std::int32_t*>(base + s.lens);
  p.out = reinterpret_cast<void*>(base + s.chunk_out);
  p.out_stride_token = 1LL * a.n_heads * a.head_dim;
  p.out_stride_head = a.head_dim;
  p.lse = reinterpret_cast<float*>(base + s.chunk_lse);
  return p;
}

// The merge of the chunks' states ([chunk, row, head] in the scratch), and of level 1's state
// (level_out, level_lse: one read of every state and one write of out where a merge of the chunks
// and then one of level 1 would write out twice), into out and level 0's LSE.
MergeStatesArgs chunk_merge(const CascadeArgs& a, const CascadeSplit& split, std::uintptr_t base,
                            const CascadeScratch& s, const ScratchPointers& scratch) {
  MergeStatesArgs merge;
  merge.dtype = a.dtype;
  merge.rows = a.total_q;
  merge.n_heads = a.n_heads;
  merge.head_dim = a.head_dim;
  merge.a.v = reinterpret_cast<const void*>(base + s.chunk_out);
  merge.a.lse = reinterpret_cast<const float*>(base + s.chunk_lse);
  merge.a.states = split.chunks;
  merge.a.v_stride_row = 1LL * a.n_heads * a.head_dim;
  merge.a.v_stride_state = 1LL * a.total_q * a.n_heads * a.head_dim;
  merge.a.v_stride_head = a.head_dim;
  merge.a.lse_stride_row = a.n_heads;
  merge.a.lse_stride_state = 1LL * a.total_q * a.n_heads;
  merge.a.lse_stride_head = 1;
  merge.b.v = scratch.level_out;
  merge.b.lse = scratch.level_lse;
  merge.out = a.out;
  merge.out_stride_row = a.out_stride_token;
  merge.out_stride_head = a.out_stride_head;
  merge.lse = scratch.first_lse;
  merge.stream = a.stream;
  return merge;
}

}  // namespace

CascadeSplit cascade_split(const CascadeArgs& a, int num_sms) {
  CascadeSplit none;
  const CascadeLevel& shared = a.levels[0];
  if (num_sms <= 0 || a.num_levels < 2 || a.sinks != nullptr || shared.groups != 1 || shared.causal ||
      a.total_q <= 0 || a.n_kv_heads <= 0 || a.page_size <= 0)
    return none;
  // The single group's pass: its rows (each query head of a KV head) in tiles of up to 128.
  const long long rows = 1LL * a.total_q * (a.n_heads / a.n_kv_heads);
  const long long ctas = (rows + 127) / 128 * a.n_kv_heads;
  const int min_chunk_pages = (256 + a.page_size - 1) / a.page_size;
  long long chunks = std::min<long long>({num_sms / ctas, 16, shared.max_pages_per_seq / min_chunk_pages});
  if (chunks < 2) return none;
  CascadeSplit split;
  split.chunk_pages = static_cast<int>((shared.max_pages_per_seq + chunks - 1) / chunks);
  split.chunks = (shared.max_pages_per_seq + split.chunk_pages - 1) / split.chunk_pages;
  return split.chunks >= 2 ? split : none;
}

CascadePlan resolve_cascade_args(const CascadeArgs& input, int num_sms) {
  CascadePlan plan;
  CascadeArgs& a = plan.args;
  a = input;
  if (a.num_levels < 1 || a.num_levels > kMaxCascadeLevels)
    fail_argument(kCascadeCall,
                  fmt::format("num_levels {} is not valid (allowed: 1..{})", a.num_levels, kMaxCascadeLevels));
  if (a.window_left != -1)
    fail_argument(kCascadeCall, fmt::format("window_left {} is not served (allowed: -1; a window needs each "
                                            "key's distance to its query across levels)", a.window_left));
  if (a.alibi_slopes != nullptr)
    fail_argument(kCascadeCall, "alibi_slopes is not served (allowed: null; ALiBi needs each key's distance to "
                                "its query across levels)");
  require_non_negative(kCascadeCall, "total_q", a.total_q);
  for (int l = 0; l < a.num_levels; ++l) {
    plan.levels.push_back(resolve_level(level_call(a, l), l));
    // A level the decode does not serve (a feature it lacks with several tokens) stays a prefill.
    bool decode = level_as_decode(a, l);
    PagedDecodeArgs call;
    if (decode) {
      try {
        call = resolve_paged_decode_args(decode_call(a, l));
      } catch (const InvalidArgument&) {
        decode = false;
      }
    }
    plan.as_decode.push_back(decode);
    plan.decodes.push_back(call);
  }
  // The levels' resolved strides are the call's (each level resolved the same q, caches and out).
  const PagedPrefillArgs& first = plan.levels.front();
  a.scale = first.scale;
  a.q_stride_token = first.q_stride_token;
  a.q_stride_head = first.q_stride_head;
  a.out_stride_token = first.out_stride_token;
  a.out_stride_head = first.out_stride_head;
  size_cascade_plan(&plan, num_sms);
  return plan;
}

void size_cascade_plan(CascadePlan* plan_ptr, int num_sms) {
  CascadePlan& plan = *plan_ptr;
  const CascadeArgs& a = plan.args;
  plan.decode_workspace = 0;
  plan.split = cascade_split(a, num_sms);
  for (int l = 0; l < a.num_levels; ++l)
    if (plan.as_decode[l]) {
      PagedDecodeArgs scratch_call = plan.decodes[l];  // as it runs: out contiguous in the scratch
      scratch_call.out_stride_head = a.head_dim;
      scratch_call.out_stride_seq = 1LL * a.n_heads * a.head_dim;
      scratch_call.out_stride_batch = scratch_call.q_len * scratch_call.out_stride_seq;
      plan.decode_workspace =
          std::max(plan.decode_workspace, paged_decode_workspace_bytes(scratch_call, std::max(num_sms, 1)));
    }
  const CascadeScratch scratch = cascade_scratch(a, plan.split, plan.decode_workspace);
  plan.workspace_bytes = scratch.bytes;
  if (a.workspace != nullptr && a.num_levels > 1 && 1LL * a.total_q * a.n_heads > 0) {
    require_pointer(kCascadeCall, "workspace", a.workspace, kCascadeAlign);
    if (a.workspace_bytes < scratch.bytes)
      fail_argument(kCascadeCall, fmt::format("workspace_bytes {} is too small (allowed: >= {}, "
                                              "cascade_workspace_bytes)", a.workspace_bytes, scratch.bytes));
    // The levels' passes write the scratch while out holds the result so far: apart, or the
    // merge would read what a pass overwrote.
    const ByteSpan workspace = byte_span(a.workspace, 1, static_cast<std::int64_t>(scratch.bytes), {});
    const ByteSpan out =
        byte_span(a.out, 2, a.head_dim, {{a.total_q, a.out_stride_token}, {a.n_heads, a.out_stride_head}});
    const ByteSpan lse = a.lse == nullptr ? ByteSpan{} : byte_span(a.lse, 4, 1LL * a.total_q * a.n_heads, {});
    if (workspace.overlaps(out) || workspace.overlaps(lse))
      fail_argument(kCascadeCall, fmt::format("workspace [{:#x}, {:#x}) overlaps out or lse (allowed: apart from "
                                              "both)", workspace.begin, workspace.end));
  }
}

// Level 0 over `chunks` CTAs as many: the chunks' offsets, lengths and q copies (the
// merge_states module's second kernel) and one paged_prefill over the chunks into their states,
// which level 1's merge takes in (chunk_merge).
void run_split_level(Runtime& runtime, Runtime::Impl& impl, const CascadePlan& plan, std::uintptr_t base) {
  const CascadeArgs& a = plan.args;
  const CascadeScratch s = cascade_scratch(a, plan.split, plan.decode_workspace);
  Device& device = impl.current_device();
  KernelSpec spec;
  spec.kind = KernelKind::merge_states;
  spec.dtype = a.dtype;
  spec.head_dim = a.head_dim;
  const auto& variant = impl.variant(device, spec, {kMergeStatesThreads, 0});
  CascadeChunkParams chunks{};
  chunks.seq_lens = static_cast<const int*>(a.levels[0].seq_lens.data);
  chunks.wide = a.levels[0].seq_lens.wide ? 1 : 0;
  chunks.indptr = reinterpret_cast<int*>(base + s.indptr);
  chunks.lens = reinterpret_cast<int*>(base + s.lens);
  chunks.q = a.q;
  chunks.q_copies = reinterpret_cast<void*>(base + s.q_copies);
  chunks.q_stride_token = a.q_stride_token;
  chunks.q_stride_head = a.q_stride_head;
  chunks.rows = a.total_q;
  chunks.n_heads = a.n_heads;
  chunks.chunks = plan.split.chunks;
  chunks.chunk_tokens = plan.split.chunk_pages * a.page_size;
  chunks.capacity = a.levels[0].max_pages_per_seq * a.page_size;
  const long long vectors = 1LL * plan.split.chunks * a.total_q * a.n_heads * (a.head_dim / 8);
  LaunchConfig config{};
  config.name = "cuLaunchKernel(cascade_chunks)";
  config.grid = {static_cast<unsigned>(merge_states_grid_size(vectors, 8, device.num_sms())), 1, 1};
  config.block = kMergeStatesThreads;
  config.stream = static_cast<CUstream>(a.stream);
  device.launch(variant.functions[1], config, &chunks);
  runtime.paged_prefill(chunked_level(plan.levels[0], plan.split, a, base, s));
}

}  // namespace detail

std::size_t cascade_workspace_bytes(const CascadeArgs& args, int num_sms) {
  return detail::resolve_cascade_args(args, num_sms).workspace_bytes;
}

void Runtime::cascade(const CascadeArgs& input) {
  detail::CascadePlan plan = detail::resolve_cascade_args(input);  // every check before the device
  detail::Device& device = impl_->current_device();
  detail::size_cascade_plan(&plan, device.num_sms());
  const CascadeArgs& a = plan.args;
  if (a.num_levels == 1) {
    paged_prefill(plan.levels[0]);
    return;
  }
  if (1LL * a.total_q * a.n_heads == 0) return;
  auto base = reinterpret_cast<std::uintptr_t>(a.workspace);
  if (base == 0) base = device.workspace(static_cast<CUstream>(a.stream), plan.workspace_bytes, "cascade");
  const detail::ScratchPointers scratch = detail::scratch_pointers(a, plan.split, plan.decode_workspace, base);
  const bool split = plan.split.chunks > 1;
  const detail::CascadeScratch layout = detail::cascade_scratch(a, plan.split, plan.decode_workspace);
  if (split) {
    detail::run_split_level(*this, *impl_, plan, base);
  } else {
    PagedPrefillArgs first = plan.levels[0];
    first.lse = scratch.first_lse;
    paged_prefill(first);
  }
  const MergeStatesArgs merge = detail::level_merge(a, scratch.level_out, scratch.level_lse, scratch.first_lse);
  const std::int64_t row = 1LL * a.n_heads * a.head_dim;  // the scratch output's rows
  for (int l = 1; l < a.num_levels; ++l) {
    const auto at = static_cast<std::size_t>(l);
    if (plan.as_decode[at]) {
      PagedDecodeArgs level = plan.decodes[at];
      level.out = scratch.level_out;
      level.out_stride_batch = level.q_len * row;
      level.out_stride_seq = row;
      level.out_stride_head = a.head_dim;
      level.lse = scratch.level_lse;
      level.workspace = scratch.decode_workspace;
      level.workspace_bytes = plan.decode_workspace;
      paged_decode(level);
    } else {
      PagedPrefillArgs level = plan.levels[at];
      level.out = scratch.level_out;
      level.out_stride_token = row;
      level.out_stride_head = a.head_dim;
      level.lse = scratch.level_lse;
      paged_prefill(level);
    }
    if (split && l == 1)
      merge_states(detail::chunk_merge(a, plan.split, base, layout, scratch));
    else
      merge_states(merge);
  }
}

}  // namespace astrai
