#include "runtime/launch_heuristics.hpp"

#include <algorithm>

#include "kernel_src/hopper_params.h"
#include "kernel_src/kernel_params.h"

namespace astrai::detail {

DecodeSplitPlan plan_decode_splits(int batch, int n_kv_heads, int head_tiles, long long capacity,
                                   int resident_ctas, double partial_blocks) {
  const long long blocks = std::max<long long>(1, (capacity + kDecodeBlockTokens - 1) / kDecodeBlockTokens);
  const long long base_ctas = std::max<long long>(1, 1LL * batch * n_kv_heads * head_tiles);
  const long long resident = std::max(resident_ctas, 1);
  // Beyond a few waves more splits only add combine work; the cost model below weighs the
  // fixed cost per CTA against filling the GPU (tiny batches get one block per split).
  const long long useful_splits = (4 * resident + base_ctas - 1) / base_ctas;
  const long long max_splits =
      std::max<long long>(1, std::min<long long>({kMaxSplits, blocks, useful_splits}));
  long long best_splits = 1;
  double best_cost = -1;
  for (long long splits = 1; splits <= max_splits; ++splits) {
    const long long blocks_per_split = (blocks + splits - 1) / splits;
    const long long used_splits = (blocks + blocks_per_split - 1) / blocks_per_split;
    if (used_splits != splits) continue;  // the same plan as a smaller split count
    const long long waves = (base_ctas * splits + resident - 1) / resident;
    // The partials of a split plan are written and read back by every CTA through the GPU's
    // bandwidth, so they cost in proportion to all of them, not to one wave's.
    const double partials =
        splits > 1 ? partial_blocks * static_cast<double>(base_ctas * splits) / static_cast<double>(resident) : 0.0;
    const double cost = static_cast<double>(waves * (blocks_per_split + 1) + (splits > 1 ? 1 : 0)) + partials;
    if (best_cost < 0 || cost < best_cost) {
      best_cost = cost;
      best_splits = splits;
    }
  }
  DecodeSplitPlan plan;
  const long long blocks_per_split = (blocks + best_splits - 1) / best_splits;
  plan.tokens_per_split = static_cast<int>(blocks_per_split * kDecodeBlockTokens);
  plan.num_splits = static_cast<int>((blocks + blocks_per_split - 1) / blocks_per_split);
  return plan;
}

bool decode_takes_wide_ctas(TileChoice tiles, const DecodeSplitPlan& plan, long long tiles_count, int num_sms,
                            int wide_splits) {
  if (tiles == TileChoice::narrow) return false;
  if (tiles == TileChoice::wide) return true;
  return tiles_count <= num_sms && plan.num_splits >= 2 && plan.num_splits <= wide_splits;
}

DecodeSplitPlan wide_cta_plan(long long capacity, int wide_splits) {
  const long long blocks = std::max<long long>(1, (capacity + kDecodeBlockTokens - 1) / kDecodeBlockTokens);
  const long long splits = std::max(wide_splits, 1);
  DecodeSplitPlan plan;
  plan.tokens_per_split = static_cast<int>((blocks + splits - 1) / splits * kDecodeBlockTokens);
  plan.num_splits = static_cast<int>(splits);
  return plan;
}

std::size_t decode_workspace_bytes(const DecodeSplitPlan& plan, int batch, int n_heads,
                                   int head_dim) {
  if (plan.num_splits <= 1) return 0;
  const std::size_t rows = static_cast<std::size_t>(plan.num_splits) * batch * n_heads;
  const std::size_t out_bytes = rows * head_dim * sizeof(float);
  const std::size_t lse_bytes = rows * sizeof(float);
  return ((out_bytes + 255) / 256) * 256 + lse_bytes;
}

DecodeSplitPlan cap_decode_splits(const DecodeSplitPlan& plan, long long capacity, std::size_t bytes, int batch,
                                  int n_heads, int head_dim) {
  if (decode_workspace_bytes(plan, batch, n_heads, head_dim) <= bytes) return plan;
  int fit = plan.num_splits - 1;
  DecodeSplitPlan capped;
  const long long blocks = std::max<long long>(1, (capacity + kDecodeBlockTokens - 1) / kDecodeBlockTokens);
  for (; fit >= 1; --fit) {
    const long long blocks_per_split = (blocks + fit - 1) / fit;
    capped.tokens_per_split = static_cast<int>(blocks_per_split * kDecodeBlockTokens);
    capped.num_splits = static_cast<int>((blocks + blocks_per_split - 1) / blocks_per_split);
    if (capped.num_splits <= 1 || decode_workspace_bytes(capped, batch, n_heads, head_dim) <= bytes) break;
  }
  return capped;
}

bool prefill_prefers_wide_tiles(int max_q_len, long long total_q, int n_heads, int batch, int num_sms,
                                int narrow_rows, int wide_rows) {
  if (max_q_len <= 0 || n_heads <= 0 || batch <= 0 || num_sms <= 0 || narrow_rows <= 0 || wide_rows <= 0)
    return false;
  // Ragged requests: each short one would pad a whole tile of the longer kind.
  if (total_q * 10 < 9LL * max_q_len * batch) return false;
  const long long narrow_tiles = (max_q_len + narrow_rows - 1LL) / narrow_rows;
  const long long wide_tiles = (max_q_len + wide_rows - 1LL) / wide_rows;
  const long long ctas = wide_tiles * n_heads * batch;
  const bool many_waves = ctas >= 10LL * num_sms;
  const bool little_padding = wide_tiles * wide_rows * 100 <= narrow_tiles * narrow_rows * 104;
  return many_waves && little_padding;
}

bool prefill_sm90_takes_wide_tiles(TileChoice tiles, int head_dim, int max_q_len, long long total_q,
                                   int n_heads, int n_kv_heads, int batch, int num_sms) {
  if (prefill_sm90_wide_consumers(head_dim) == 0 || tiles == TileChoice::narrow) return false;
  if (tiles == TileChoice::wide) return true;
  const int group = n_kv_heads > 0 ? n_heads / n_kv_heads : 1;
  const int rows_per_position = prefill_sm90_pack_heads(group);
  const long long rows = 1LL * max_q_len * rows_per_position;
  if (rows > (1LL << 30)) return false;  // such calls take the portable kernel
  return prefill_prefers_wide_tiles(static_cast<int>(rows), total_q * rows_per_position,
                                    n_heads / rows_per_position, batch, num_sms,
                                    prefill_sm90_block_m(prefill_sm90_consumers(head_dim, false)),
                                    prefill_sm90_block_m(prefill_sm90_consumers(head_dim, true)));
}

int rotary_grid_size(long long vectors, int num_sms) {
  const long long needed = (vectors + 255) / 256;
  const long long cap = 8LL * std::max(num_sms, 1);
  return static_cast<int>(std::max<long long>(1, std::min(needed, cap)));
}

int merge_states_grid_size(long long items, int head_dim, int num_sms) {
  const long long per_cta = std::max(1, kMergeStatesThreads / std::max(head_dim / 8, 1));
  const long long needed = (items + per_cta - 1) / per_cta;
  const long long cap = static_cast<long long>(kMergeStatesCtasPerSm) * std::max(num_sms, 1);
  return static_cast<int>(std::max<long long>(1, std::min(needed, cap)));
}

}  // namespace astrai::detail
