// Launch decisions as plain functions (testable on the CPU).
#pragma once

#include <cstddef>

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
DecodeSplitPlan plan_decode_splits(int batch, int n_kv_heads, int head_tiles, long long capacity,
                                   int resident_ctas);

// Bytes of split workspace a plan needs (0 when unsplit): partial outputs and LSEs in fp32.
std::size_t decode_workspace_bytes(const DecodeSplitPlan& plan, int batch, int n_heads,
                                   int head_dim);

// Grid size for the rotary kernel: enough CTAs of 256 threads to cover `vectors` 16-byte
// vectors, capped at a few waves (the kernel strides over the rest).
int rotary_grid_size(long long vectors, int num_sms);

}  // namespace astrai::detail
