// Clock stamps of the Hopper prefill's phases, for astrai-sm90-check --trace only: the check
// tool pre-includes this header (NVRTC --pre-include) with ASTRAI_PREFILL_TRACE defined to the
// number of CTAs traced, and the kernel's hooks (prefill_sm90_tile.cuh, empty otherwise) then
// store each CTA's SM clock at its phases and its SM id, so the tool can say where a tile's time
// goes.
#pragma once

#ifndef ASTRAI_PREFILL_TRACE
#error "prefill_sm90_trace.cuh: define ASTRAI_PREFILL_TRACE to the number of CTAs traced"
#endif

// C linkage: the check tool looks the array up by its plain name.
// Slots: 0 start, 1 Q and the first K block arrived, 2 first softmax done, 3 last P V done, 4-6 each
// consumer's stores issued, 7 the SM, 8 Q issued, 9 the first K block issued, 10 consumer 0 ready to
// wait for them, 11 Q arrived, 12 the tile placed (thread 0 about to set up the barriers), 13 the
// barriers set up.
extern "C" __device__ unsigned long long astrai_prefill_trace[ASTRAI_PREFILL_TRACE][14];

namespace astrai {

// Stamp `slot` of the CTA's tile with `value` (slot 0 also records the SM).
__device__ __forceinline__ void prefill_trace(int slot, unsigned long long value) {
  const unsigned index = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  if (index >= ASTRAI_PREFILL_TRACE) return;
  astrai_prefill_trace[index][slot] = value;
  if (slot == 0) {
    unsigned sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    astrai_prefill_trace[index][7] = sm;
  }
}

}  // namespace astrai

// A clock read kept in a register, for stamps whose stores would otherwise delay what they time.
#define ASTRAI_PREFILL_CLOCK(name) const unsigned long long name = clock64()
#define ASTRAI_PREFILL_STAMP_AT(condition, slot, value) \
  do {                                                  \
    if (condition) ::astrai::prefill_trace(slot, value); \
  } while (0)
