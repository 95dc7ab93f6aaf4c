// Launch decisions as plain functions (testable on the CPU).
#pragma once

#include <cstddef>

#include "runtime/env_config.hpp"

namespace astrai::detail {

struct DecodeSplitPlan {
  int num_splits = 1;
  int tokens_per_split = 0;  // multiple of kDecodeBlockTokens
};

// Splits the KV range across CTAs. `resident_ctas` is how many CTAs of the kernel the GPU runs
// at once (occupancy x SMs). The plan minimizes a simple model of the time: waves of CTAs times
// the token blocks each CTA streams (plus one block's worth of fixed cost per CTA, and one for
// the combine when split), so that the last wave is not left mostly empty.
// Derived from the page table's capacity (max_pages_per_seq x page_size), not from the current
// lengths, so a CUDA graph captured at one length stays valid as sequences grow.
// `partial_blocks`: what one split CTA's partials (written, then read by the combine) cost, in
// KV blocks streamed; 0 where they are small beside the KV (the decode: 16 rows of f32 against
// 64 tokens of K and V).
DecodeSplitPlan plan_decode_splits(int batch, int n_kv_heads, int head_tiles, long long capacity,
                                   int resident_ctas, double partial_blocks = 0);

// Whether a Hopper decode call takes wide CTAs (kernel_src/paged_decode_sm90.cuh: the splits of
// each of the `tiles` (request, KV head, head tile) columns side by side in one CTA of
// `wide_splits` groups, merged there, with no workspace and no split combine). auto: when the
// columns fit one wave on `num_sms` SMs (a wide CTA fills an SM) and the plan splits them 2 to
// `wide_splits` ways, the shape whose split combine and its wait cost about 2 us of a 36 us call
// (hd64 24/4 B32 x 4096, docs/performance.md).
bool decode_takes_wide_ctas(TileChoice tiles, const DecodeSplitPlan& plan, long long tiles_count, int num_sms,
                            int wide_splits);
// The split of a wide CTA: `capacity` tokens in `wide_splits` parts of whole 64-token blocks.
DecodeSplitPlan wide_cta_plan(long long capacity, int wide_splits);

// Bytes of split workspace a plan needs (0 when unsplit): partial outputs and LSEs in fp32.
// The plan with at most as many splits as a caller's workspace of `bytes` holds (each split
// covering more blocks); one split, which needs no workspace, when it holds fewer than two.
DecodeSplitPlan cap_decode_splits(const DecodeSplitPlan& plan, long long capacity, std::size_t bytes, int batch,
                                  int n_heads, int head_dim);
std::size_t decode_workspace_bytes(const DecodeSplitPlan& plan, int batch, int n_heads,
                                   int head_dim);

// Whether a Hopper prefill call takes its head dim's wide tiling (`wide_rows` query rows a CTA
// instead of `narrow_rows`; kernel_src/hopper_params.h). The wide tiles save L2 traffic but lose
// on small grids, where the last wave's idle SMs and the rows a short query leaves empty cost
// more (measured on the H200: -3% to -6% at 2.7 to 5.3 waves, -28% with 96 tiles on 132 SMs;
// tied or up to +3% from 10.4 waves on). So: at least 10 waves of wide tiles, no more than 4%
// more padded rows than the narrow tiling (q 4096: 4224 rows against 4096), and requests of
// nearly one length (`total_q`, their rows summed, at least 90% of max_q_len x batch; the padding
// is judged on max_q_len). The figures and why the bounds stand: docs/decisions/0011.
bool prefill_prefers_wide_tiles(int max_q_len, long long total_q, int n_heads, int batch, int num_sms,
                                int narrow_rows, int wide_rows);

// The tiling a Hopper prefill call of this head dim and grid takes: ASTRAI_JIT_PREFILL_TILES's
// choice where it names one, else prefill_prefers_wide_tiles's on the grid the kernel launches
// (packed GQA, kernel_src/hopper_params.h: a tile row per query head and position, a tile row of
// tiles per pack of heads); never wide where the head dim has no wide tiling. The one decision the
// runtime and the benchmark's variant names share.
bool prefill_sm90_takes_wide_tiles(TileChoice tiles, int head_dim, int max_q_len, long long total_q,
                                   int n_heads, int n_kv_heads, int batch, int num_sms);

// Grid size for the rotary kernel: enough CTAs of 256 threads to cover `vectors` 16-byte
// vectors, capped at a few waves (the kernel strides over the rest).
int rotary_grid_size(long long vectors, int num_sms);
// Grid size for merge_states: CTAs of kMergeStatesThreads threads, each taking
// kMergeStatesThreads / (head_dim / 8) (row, head) items a pass, up to kMergeStatesCtasPerSm
// CTAs an SM, as many as are resident at once (the kernel loops over the rest).
int merge_states_grid_size(long long items, int head_dim, int num_sms);

}  // namespace astrai::detail
