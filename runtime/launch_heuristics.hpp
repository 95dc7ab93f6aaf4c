// Launch decisions as plain functions (testable on the CPU).
#pragma once

#include <cstddef>

namespace astrai::detail {

struct DecodeSplitPlan {
  int num_splits = 1;
  int tokens_per_split = 0;  // multiple of kDecodeBlockTokens
};

// Splits the KV range so that batch x kv_heads x head_tiles x splits CTAs fill the GPU about
// twice. Derived from the page table's capacity (max_pages_per_seq x page_size), not from the
// current lengths, so a CUDA graph captured at one length stays valid as sequences grow.
DecodeSplitPlan plan_decode_splits(int batch, int n_kv_heads, int head_tiles, long long capacity,
                                   int num_sms);

// Bytes of split workspace a plan needs (0 when unsplit): partial outputs and LSEs in fp32.
std::size_t decode_workspace_bytes(const DecodeSplitPlan& plan, int batch, int n_heads,
                                   int head_dim);

// Grid size for the rotary kernel: enough CTAs of 256 threads to cover `vectors` 16-byte
// vectors, capped at a few waves (the kernel strides over the rest).
int rotary_grid_size(long long vectors, int num_sms);

}  // namespace astrai::detail
