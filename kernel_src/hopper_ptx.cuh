// Hopper (sm_90a) building blocks as inline PTX: tensor-map (TMA) loads into shared memory,
// mbarriers, warpgroup MMA (wgmma) over 128-byte-swizzled shared-memory tiles, register
// reallocation between warpgroups. Included only by sm_90a kernels: sm_90 and older targets
// reject wgmma and setmaxnreg.
//
// Shared-memory operand layout used throughout: a tile of `rows` x D elements (16-bit) is stored
// as D/64 column chunks, each `rows` x 128 bytes, with the 128-byte swizzle (16-byte piece c of
// row r lives at c ^ (r & 7)); every chunk starts on a 1024-byte boundary. TMA writes this
// layout with CU_TENSOR_MAP_SWIZZLE_128B and a box of 64 elements by `rows`.
#pragma once

#include "astrai_common.cuh"

namespace astrai {

// Whether a 16-bit element type is fp16 (the wgmma instructions' type field).
template <typename T>
struct IsFp16 {
  static constexpr bool value = false;
};
template <>
struct IsFp16<fp16_t> {
  static constexpr bool value = true;
};

namespace sm90 {

typedef unsigned long long u64;

// The driver's CUtensorMap, opaque here (kernels see no CUDA header). Passed by value as a
// `const __grid_constant__` kernel parameter so that its address is a valid TMA operand.
struct __align__(64) TmaMap {
  u64 opaque[16];
};

// --- mbarriers --------------------------------------------------------------------------------

__device__ __forceinline__ void mbar_init(u64* bar, unsigned arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(shared_address(bar)), "r"(arrivals));
}

// Makes barrier initialization visible to the async proxy (TMA) before first use.
__device__ __forceinline__ void fence_mbar_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

__device__ __forceinline__ void mbar_arrive(u64* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(shared_address(bar)) : "memory");
}

// One arrival that also announces `bytes` of TMA traffic completing on this barrier.
__device__ __forceinline__ void mbar_arrive_expect_tx(u64* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(shared_address(bar)),
               "r"(bytes)
               : "memory");
}

// Waits until the phase of parity `parity` has completed. A fresh barrier counts its
// (non-existent) previous phase, of parity 1, as complete: producers start waiting on 1.
__device__ __forceinline__ void mbar_wait(u64* bar, unsigned parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "LAB_WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra LAB_WAIT;\n"
      "}\n" ::"r"(shared_address(bar)),
      "r"(parity)
      : "memory");
}

// Orders this thread's generic-proxy shared-memory writes before later async-proxy accesses
// (wgmma operand reads, TMA stores).
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// --- TMA ----------------------------------------------------------------------------------------

__device__ __forceinline__ void tma_prefetch_map(const TmaMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<u64>(map)) : "memory");
}

// An L2 prefetch of one box of a 4-D map: a hint that writes nothing; a box outside the tensor
// fetches nothing.
__device__ __forceinline__ void tma_prefetch_l2_4d(const TmaMap* map, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.prefetch.tensor.4d.L2.global.tile [%0, {%1, %2, %3, %4}];\n" ::"l"(
                   reinterpret_cast<u64>(map)),
               "r"(c0), "r"(c1), "r"(c2), "r"(c3)
               : "memory");
}

// One box of a 4-D map into shared memory; completion is counted on `bar` (expect-tx bytes).
// Elements outside the tensor are written as zeros.
__device__ __forceinline__ void tma_load_4d(void* dst, const TmaMap* map, u64* bar, int c0, int c1,
                                            int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(shared_address(dst)),
      "l"(reinterpret_cast<u64>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(shared_address(bar))
      : "memory");
}

// The same with an L2 cache policy for the lines it brings (l2_evict_first_policy).
__device__ __forceinline__ void tma_load_4d(void* dst, const TmaMap* map, u64* bar, int c0, int c1,
                                            int c2, int c3, u64 l2_policy) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%2, %3, %4, %5}], [%6], %7;\n" ::"r"(shared_address(dst)),
      "l"(reinterpret_cast<u64>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(shared_address(bar)), "l"(l2_policy)
      : "memory");
}

__device__ __forceinline__ void tma_load_5d(void* dst, const TmaMap* map, u64* bar, int c0, int c1,
                                            int c2, int c3, int c4) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4, %5, %6}], [%7];\n" ::"r"(shared_address(dst)),
      "l"(reinterpret_cast<u64>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4), "r"(shared_address(bar))
      : "memory");
}

__device__ __forceinline__ void tma_load_2d(void* dst, const TmaMap* map, u64* bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(shared_address(dst)),
      "l"(reinterpret_cast<u64>(map)), "r"(c0), "r"(c1), "r"(shared_address(bar))
      : "memory");
}

// --- registers and warpgroups --------------------------------------------------------------------

// Hands registers back (producer) or takes them (consumers). Needs a register cap at kernel
// entry (__launch_bounds__(threads, 1)) or ptxas ignores it (C7508).
template <int kRegs> __device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs> __device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// Named barrier over `threads` threads (ids 1..15; 0 is __syncthreads).
__device__ __forceinline__ void named_bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// --- wgmma -------------------------------------------------------------------------------------

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int kPending> __device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// Keeps a later wgmma.wait_group below the code that computed `value`: ptxas otherwise moves the
// wait up as far as it can (it took the prefill's P V wait above the softmax's exp2s). A shared
// store of the value, from one lane into the warp's own `word`, is an instruction ptxas does not
// move the wait across.
__device__ __forceinline__ void pin_wait_after(unsigned word, float value, bool lane0) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %2, 0;\n@p st.shared.f32 [%0], %1;\n}\n" ::"r"(word), "f"(value),
               "r"(static_cast<unsigned>(lane0))
               : "memory");
}

// Four 8x8 tiles of 16-bit values, one register each in the accumulator's layout (lane l holds
// row l / 4, columns 2 (l % 4) and + 1), to shared memory: lane l gives the address of row l % 8
// of tile l / 8 (16 bytes each).
__device__ __forceinline__ void stmatrix_x4(unsigned address, unsigned r0, unsigned r1, unsigned r2, unsigned r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(address), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
}
// A 16-byte load from a shared-window address (through a generic pointer it compiles to LD.E).
__device__ __forceinline__ uint4 ld_shared_v4(unsigned address) {
  uint4 v;
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(address)
               : "memory");
  return v;
}
__device__ __forceinline__ unsigned ld_shared_u32(unsigned address) {
  unsigned v;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(address) : "memory");
  return v;
}
__device__ __forceinline__ uint2 ld_shared_v2(unsigned address) {
  uint2 v;
  asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "r"(address) : "memory");
  return v;
}
__device__ __forceinline__ void st_shared_v2(unsigned address, uint2 v) {
  asm volatile("st.shared.v2.b32 [%0], {%1, %2};\n" ::"r"(address), "r"(v.x), "r"(v.y) : "memory");
}
__device__ __forceinline__ void st_shared_v4(unsigned address, uint4 v) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(address), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

// Pins accumulator registers at a point of the program, so that the compiler moves no access to
// them into a window where a wgmma owns them (which would serialize every wgmma: C7515).
template <int kCount> __device__ __forceinline__ void reg_fence(float (&d)[kCount]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int kRows> __device__ __forceinline__ void reg_fence(unsigned (&d)[kRows][4]) {
#pragma unroll
  for (int i = 0; i < kRows; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(d[i][j])::"memory");
}

// Shared-memory matrix descriptor for a 128-byte-swizzled tile: start address, leading and
// stride byte offsets (LBO, SBO), swizzle mode 1 (128 B), or 2 for a 64-byte-swizzled one (rows
// of 64 bytes: FP8 attention's at hd64). Operands start on their swizzle's atoms (1024 or 512
// bytes), so the base-offset field stays 0.
__device__ __forceinline__ u64 smem_desc(unsigned address, unsigned lbo, unsigned sbo, unsigned mode = 1) {
  return static_cast<u64>((address & 0x3ffffu) >> 4) |
         (static_cast<u64>((lbo & 0x3ffffu) >> 4) << 16) |
         (static_cast<u64>((sbo & 0x3ffffu) >> 4) << 32) | (static_cast<u64>(mode) << 62);
}
// A K-major tile of rows of kRowBytes (128 or 64), swizzled across them: 8-row groups 8 rows on.
template <int kRowBytes>
__device__ __forceinline__ u64 smem_desc_rows(unsigned address) {
  static_assert(kRowBytes == 128 || kRowBytes == 64, "128- or 64-byte swizzled rows");
  return smem_desc(address, 16, 8 * kRowBytes, kRowBytes == 128 ? 1 : 2);
}
// The descriptor of the tile `bytes` (a multiple of 16) further on: its start address is the low
// word's first field (address / 16, 14 bits), which a shared-memory address (under 228 KB) never
// carries out of, so the step is a 32-bit add where smem_desc's masks and shifts cost five
// operations a descriptor.
// (Written on the words in PTX: in C++ the compiler made it a 64-bit add with its carry.)
__device__ __forceinline__ u64 smem_desc_plus(u64 desc, unsigned bytes) {
  unsigned lo, hi;
  asm("mov.b64 {%0, %1}, %2;" : "=r"(lo), "=r"(hi) : "l"(desc));
  u64 out;
  asm("mov.b64 %0, {%1, %2};" : "=l"(out) : "r"(lo + (bytes >> 4)), "r"(hi));
  return out;
}

// Accumulator fragment of a 64 x N wgmma, thread t of the warpgroup (w = t / 32, l = t % 32):
// d[4j + {0,1}] is row 16w + l/4, columns 8j + 2(l%4) + {0,1}; d[4j + {2,3}] is the row 8 below.
// SS: A and B from shared memory, both K-major. RS: A from registers (the m16k16 fragment of
// mma.sync: a0 rows 0-7 cols 0-7, a1 rows 8-15, a2 cols 8-15, a3 both), B from shared memory,
// N-major (transposed). `accumulate` 0 overwrites D.
#define ASTRAI_F8(i)                                                                              \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]),     \
      "+f"(d[i + 6]), "+f"(d[i + 7])

// The operand list of an N = 256 accumulator's 128 registers.
#define ASTRAI_D128_LIST                                                                          \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"                        \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"               \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"               \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63,"               \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79,"               \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95,"               \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111,"  \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "

#define ASTRAI_WGMMA_SS_N32(TYPES)  \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"  \
      "wgmma.mma_async.sync.aligned.m64n32k16.f32." TYPES " "  \
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "  \
      "%16, %17, p, 1, 1, 0, 0;\n}\n"  \
      : ASTRAI_F8(0), ASTRAI_F8(8)  \
      : "l"(desc_a), "l"(desc_b), "r"(accumulate))

#define ASTRAI_WGMMA_SS_N64(TYPES)  \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"  \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPES " "  \
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"  \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "  \
      "%32, %33, p, 1, 1, 0, 0;\n}\n"  \
      : ASTRAI_F8(0), ASTRAI_F8(8), ASTRAI_F8(16), ASTRAI_F8(24)  \
      : "l"(desc_a), "l"(desc_b), "r"(accumulate))

#define ASTRAI_WGMMA_SS_N80(TYPES)  \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %42, 0;\n"  \
      "wgmma.mma_async.sync.aligned.m64n80k16.f32." TYPES " "  \
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"  \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"  \
      "%32, %33, %34, %35, %36, %37, %38, %39}, "  \
      "%40, %41, p, 1, 1, 0, 0;\n}\n"  \
      : ASTRAI_F8(0), ASTRAI_F8(8), ASTRAI_F8(16), ASTRAI_F8(24),  \
        ASTRAI_F8(32)  \
      : "l"(desc_a), "l"(desc_b), "r"(accumulate))

#define ASTRAI_WGMMA_SS_N128(TYPES)  \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"  \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPES " "  \
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"  \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"  \
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"  \
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "  \
      "%64, %65, p, 1, 1, 0, 0;\n}\n"  \
      : ASTRAI_F8(0), ASTRAI_F8(8), ASTRAI_F8(16), ASTRAI_F8(24),  \
        ASTRAI_F8(32), ASTRAI_F8(40), ASTRAI_F8(48), ASTRAI_F8(56)  \
      : "l"(desc_a), "l"(desc_b), "r"(accumulate))

#define ASTRAI_WGMMA_SS_N176(TYPES)  \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %90, 0;\n"  \
      "wgmma.mma_async.sync.aligned.m64n176k16.f32." TYPES " "  \
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"  \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"  \
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"  \
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63,"  \
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79,"  \
      "%80, %81, %82, %83, %84, %85, %86, %87}, "  \
      "%88, %89, p, 1, 1, 0, 0;\n}\n"  \
      : ASTRAI_F8(0), ASTRAI_F8(8), ASTRAI_F8(16), ASTRAI_F8(24),  \
        ASTRAI_F8(32), ASTRAI_F8(40), ASTRAI_F8(48), ASTRAI_F8(56),  \
        ASTRAI_F8(64), ASTRAI_F8(72), ASTRAI_F8(80)  \
      : "l"(desc_a), "l"(desc_b), "r"(accumulate))

#define ASTRAI_WGMMA_SS_N192(TYPES)  \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %98, 0;\n"  \
      "wgmma.mma_async.sync.aligned.m64n192k16.f32." TYPES " "  \
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"  \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"  \
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"  \
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63,"  \
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79,"  \
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95}, "  \
      "%96, %97, p, 1, 1, 0, 0;\n}\n"  \
      : ASTRAI_F8(0), ASTRAI_F8(8), ASTRAI_F8(16), ASTRAI_F8(24),  \
        ASTRAI_F8(32), ASTRAI_F8(40), ASTRAI_F8(48), ASTRAI_F8(56),  \
        ASTRAI_F8(64), ASTRAI_F8(72), ASTRAI_F8(80), ASTRAI_F8(88)  \
      : "l"(desc_a), "l"(desc_b), "r"(accumulate))

// TRANS_B "1": B N-major (transposed), as RS takes it (MLA's P V: V rows of keys).
#define ASTRAI_WGMMA_SS_N256_B(TYPES, TRANS_B)  \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"  \
      "wgmma.mma_async.sync.aligned.m64n256k16.f32." TYPES " "  \
      ASTRAI_D128_LIST  \
      "%128, %129, p, 1, 1, 0, " TRANS_B ";\n}\n"  \
      : ASTRAI_F8(0), ASTRAI_F8(8), ASTRAI_F8(16), ASTRAI_F8(24),  \
        ASTRAI_F8(32), ASTRAI_F8(40), ASTRAI_F8(48), ASTRAI_F8(56),  \
        ASTRAI_F8(64), ASTRAI_F8(72), ASTRAI_F8(80), ASTRAI_F8(88),  \
        ASTRAI_F8(96), ASTRAI_F8(104), ASTRAI_F8(112), ASTRAI_F8(120)  \
      : "l"(desc_a), "l"(desc_b), "r"(accumulate))
#define ASTRAI_WGMMA_SS_N256(TYPES) ASTRAI_WGMMA_SS_N256_B(TYPES, "0")
#define ASTRAI_WGMMA_SS_TB_N256(TYPES) ASTRAI_WGMMA_SS_N256_B(TYPES, "1")

#define ASTRAI_WGMMA_RS_N64(TYPES)  \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"  \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPES " "  \
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"  \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "  \
      "{%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"  \
      : ASTRAI_F8(0), ASTRAI_F8(8), ASTRAI_F8(16), ASTRAI_F8(24)  \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate))

#define ASTRAI_WGMMA_RS_N128(TYPES)  \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"  \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPES " "  \
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"  \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"  \
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"  \
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "  \
      "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"  \
      : ASTRAI_F8(0), ASTRAI_F8(8), ASTRAI_F8(16), ASTRAI_F8(24),  \
        ASTRAI_F8(32), ASTRAI_F8(40), ASTRAI_F8(48), ASTRAI_F8(56)  \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate))

#define ASTRAI_WGMMA_RS_N192(TYPES)  \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %101, 0;\n"  \
      "wgmma.mma_async.sync.aligned.m64n192k16.f32." TYPES " "  \
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"  \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"  \
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"  \
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63,"  \
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79,"  \
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95}, "  \
      "{%96, %97, %98, %99}, %100, p, 1, 1, 1;\n}\n"  \
      : ASTRAI_F8(0), ASTRAI_F8(8), ASTRAI_F8(16), ASTRAI_F8(24),  \
        ASTRAI_F8(32), ASTRAI_F8(40), ASTRAI_F8(48), ASTRAI_F8(56),  \
        ASTRAI_F8(64), ASTRAI_F8(72), ASTRAI_F8(80), ASTRAI_F8(88)  \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate))

#define ASTRAI_WGMMA_RS_N256(TYPES)  \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"  \
      "wgmma.mma_async.sync.aligned.m64n256k16.f32." TYPES " "  \
      ASTRAI_D128_LIST  \
      "{%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"  \
      : ASTRAI_F8(0), ASTRAI_F8(8), ASTRAI_F8(16), ASTRAI_F8(24),  \
        ASTRAI_F8(32), ASTRAI_F8(40), ASTRAI_F8(48), ASTRAI_F8(56),  \
        ASTRAI_F8(64), ASTRAI_F8(72), ASTRAI_F8(80), ASTRAI_F8(88),  \
        ASTRAI_F8(96), ASTRAI_F8(104), ASTRAI_F8(112), ASTRAI_F8(120)  \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate))

// FP8 (e4m3) operands, k32 a step: both from shared memory K-major (FP8 wgmma has no transposed
// form), or A from registers (the m16k32 fragment: a0 rows 0-7 bytes 4(l%4)..+3 of cols 0-15,
// a1 rows 8-15, a2 and a3 the same of cols 16-31). N = 128, and 64 or 256 for P V.
#define ASTRAI_F8_D128                                                                            \
  ASTRAI_F8(0), ASTRAI_F8(8), ASTRAI_F8(16), ASTRAI_F8(24), ASTRAI_F8(32), ASTRAI_F8(40), ASTRAI_F8(48), \
      ASTRAI_F8(56)
#define ASTRAI_D64_LIST                                                                           \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"                        \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"               \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"               \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "

__device__ __forceinline__ void wgmma_ss_e4m3_n128(float (&d)[64], u64 desc_a, u64 desc_b, int accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 " ASTRAI_D64_LIST "%64, %65, p, 1, 1;\n}\n"
               : ASTRAI_F8_D128
               : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}
__device__ __forceinline__ void wgmma_rs_e4m3_n128(float (&d)[64], const unsigned (&a)[4], u64 desc_b,
                                                   int accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 " ASTRAI_D64_LIST
               "{%64, %65, %66, %67}, %68, p, 1, 1;\n}\n"
               : ASTRAI_F8_D128
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
}
// N = 256 (FP8 attention's P V at head_dim 256): D's 128 registers (ASTRAI_D128_LIST), then A's 4
// and B.
__device__ __forceinline__ void wgmma_rs_e4m3_n256(float (&d)[128], const unsigned (&a)[4], u64 desc_b,
                                                   int accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3 " ASTRAI_D128_LIST
               "{%128, %129, %130, %131}, %132, p, 1, 1;\n}\n"
               : ASTRAI_F8_D128, ASTRAI_F8(64), ASTRAI_F8(72), ASTRAI_F8(80), ASTRAI_F8(88), ASTRAI_F8(96),
                 ASTRAI_F8(104), ASTRAI_F8(112), ASTRAI_F8(120)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
}
// N = 64 (hd64).
__device__ __forceinline__ void wgmma_rs_e4m3_n64(float (&d)[32], const unsigned (&a)[4], u64 desc_b,
                                                  int accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
               "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
               "{%32, %33, %34, %35}, %36, p, 1, 1;\n}\n"
               : ASTRAI_F8(0), ASTRAI_F8(8), ASTRAI_F8(16), ASTRAI_F8(24)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
}
// P V over the head dim's columns: one wgmma of N = kHeadDim.
template <int kHeadDim>
__device__ __forceinline__ void wgmma_rs_e4m3(float (&d)[kHeadDim / 2], const unsigned (&a)[4], u64 desc_b,
                                              int accumulate) {
  static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256, "FP8 attention's head dims");
  if constexpr (kHeadDim == 64)
    wgmma_rs_e4m3_n64(d, a, desc_b, accumulate);
  else if constexpr (kHeadDim == 128)
    wgmma_rs_e4m3_n128(d, a, desc_b, accumulate);
  else
    wgmma_rs_e4m3_n256(d, a, desc_b, accumulate);
}
#undef ASTRAI_D64_LIST
#undef ASTRAI_F8_D128

// kFirst > 0: D is registers kFirst .. kFirst + kN / 2 of `tile`, columns 2 kFirst .. of a wider
// accumulator (the fragment's registers run column block by column block).
template <int kN, bool kFp16, int kFirst = 0, int kRegs>
__device__ __forceinline__ void wgmma_ss(float (&tile)[kRegs], u64 desc_a, u64 desc_b, int accumulate) {
  static_assert(kFirst % 4 == 0 && kFirst + kN / 2 <= kRegs, "wgmma_ss: D lies inside the tile");
  float(&d)[kN / 2] = *reinterpret_cast<float(*)[kN / 2]>(&tile[kFirst]);
#define ASTRAI_WGMMA_SS_CASE(N)                                                                    \
  if constexpr (kN == N) {                                                                        \
    if constexpr (kFp16) ASTRAI_WGMMA_SS_N##N("f16.f16"); else ASTRAI_WGMMA_SS_N##N("bf16.bf16"); \
  }
  ASTRAI_WGMMA_SS_CASE(32) ASTRAI_WGMMA_SS_CASE(64) ASTRAI_WGMMA_SS_CASE(80) ASTRAI_WGMMA_SS_CASE(128)
  ASTRAI_WGMMA_SS_CASE(176) ASTRAI_WGMMA_SS_CASE(192) ASTRAI_WGMMA_SS_CASE(256)
#undef ASTRAI_WGMMA_SS_CASE
  static_assert(kN == 32 || kN == 64 || kN == 80 || kN == 128 || kN == 176 || kN == 192 || kN == 256,
                "wgmma_ss: no wrapper for this N");
}

// A and B from shared memory, B N-major (the RS form's B): O += P V with P written to shared
// memory by more than one warpgroup.
template <int kN, bool kFp16>
__device__ __forceinline__ void wgmma_ss_tb(float (&d)[kN / 2], u64 desc_a, u64 desc_b, int accumulate) {
  static_assert(kN == 256, "wgmma_ss_tb: no wrapper for this N");
  if constexpr (kFp16) ASTRAI_WGMMA_SS_TB_N256("f16.f16"); else ASTRAI_WGMMA_SS_TB_N256("bf16.bf16");
}

template <int kN, bool kFp16>
__device__ __forceinline__ void wgmma_rs(float (&d)[kN / 2], const unsigned (&a)[4], u64 desc_b,
                                         int accumulate) {
#define ASTRAI_WGMMA_RS_CASE(N)                                                                    \
  if constexpr (kN == N) {                                                                        \
    if constexpr (kFp16) ASTRAI_WGMMA_RS_N##N("f16.f16"); else ASTRAI_WGMMA_RS_N##N("bf16.bf16"); \
  }
  ASTRAI_WGMMA_RS_CASE(64) ASTRAI_WGMMA_RS_CASE(128) ASTRAI_WGMMA_RS_CASE(192)
  ASTRAI_WGMMA_RS_CASE(256)
#undef ASTRAI_WGMMA_RS_CASE
  static_assert(kN == 64 || kN == 128 || kN == 192 || kN == 256, "wgmma_rs: no wrapper for this N");
}

}  // namespace sm90
}  // namespace astrai
