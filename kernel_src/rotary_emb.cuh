// Rotary position embedding over interleaved pairs:
//   (x[2i], x[2i+1]) -> (x0 * cos - x1 * sin, x0 * sin + x1 * cos), math in fp32.
// Each thread rotates 8 elements (one 16-byte vector, four pairs) of one (batch, seq, head) row.
#pragma once

#include "astrai_common.cuh"

namespace astrai {

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(256) rotary_emb_kernel(const RotaryParams p) {
  static_assert(kHeadDim % 8 == 0, "head_dim must be a multiple of 8");
  // A programmatic dependent launched after this kernel (the decode that reads the rotated Q)
  // may be placed at once: it waits for this kernel's end before it reads, and meanwhile
  // prefetches its first reads into L2. Kernels launched the ordinary way are not affected.
  allow_dependent_grid();
  constexpr int kVectorsPerRow = kHeadDim / 8;
  const long long total = static_cast<long long>(p.batch) * p.seq_len * p.n_heads * kVectorsPerRow;
  for (long long index = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
       index < total; index += static_cast<long long>(gridDim.x) * blockDim.x) {
    const int vector = static_cast<int>(index % kVectorsPerRow);
    long long rest = index / kVectorsPerRow;
    const int head = static_cast<int>(rest % p.n_heads);
    rest /= p.n_heads;
    const int position = static_cast<int>(rest % p.seq_len);
    const int batch_index = static_cast<int>(rest / p.seq_len);

    const T* src = static_cast<const T*>(p.x) + batch_index * p.x_stride_batch +
                   position * p.x_stride_seq + head * p.x_stride_head + vector * 8;
    T* dst = static_cast<T*>(p.out) + batch_index * p.out_stride_batch +
             position * p.out_stride_seq + head * p.out_stride_head + vector * 8;
    const float* freqs = p.freqs + batch_index * p.freqs_stride_batch +
                         position * p.freqs_stride_seq + vector * 8;  // 4 pairs x (cos, sin)
    const uint4 packed = *reinterpret_cast<const uint4*>(src);
    const float4 f0 = *reinterpret_cast<const float4*>(freqs);
    const float4 f1 = *reinterpret_cast<const float4*>(freqs + 4);
    const unsigned in[4] = {packed.x, packed.y, packed.z, packed.w};
    const float cos_sin[8] = {f0.x, f0.y, f0.z, f0.w, f1.x, f1.y, f1.z, f1.w};
    unsigned result[4];
#pragma unroll
    for (int pair = 0; pair < 4; ++pair) {
      const float x0 = low_half<T>(in[pair]);
      const float x1 = high_half<T>(in[pair]);
      const float c = cos_sin[2 * pair];
      const float s = cos_sin[2 * pair + 1];
      result[pair] = pack2<T>(x0 * c - x1 * s, x0 * s + x1 * c);
    }
    *reinterpret_cast<uint4*>(dst) = make_uint4(result[0], result[1], result[2], result[3]);
  }
}

}  // namespace astrai
