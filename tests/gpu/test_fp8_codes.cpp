// Every FP8 code through the paged prefill's widening, exactly. A request with one key attends
// to it with weight 1, so its output row is that key's V row widened to the output type (scales
// of 1: no rounding anywhere), which must match the host codec bit for bit, NaN and infinities
// included. On sm_90a the call takes the wgmma kernel, which widens in shared memory by bit
// placement; under ASTRAI_JIT_NO_WGMMA=1 (or below sm_90a) the portable kernel's conversion.
#include <doctest/doctest.h>

#include <cmath>
#include <random>

#include <fmt/format.h>

#include "tests/gpu/gpu_support.hpp"
#include "tests/support/fp8.hpp"

namespace astrai::gpu_test {
namespace {

TEST_SUITE("kv_fp8") {
  TEST_CASE("every FP8 code leaves the paged prefill exactly as the host widens it (e4m3, e5m2; bf16, fp16)") {
    constexpr int kBatch = 2, kKvHeads = 2, kGroup = 4, kHeadDim = 128, kPageSize = 16;
    constexpr int kHeads = kKvHeads * kGroup;
    constexpr std::int64_t kTokenStride = kKvHeads * kHeadDim;
    constexpr std::int64_t kPageStride = kPageSize * kTokenStride;
    std::mt19937 rng(test_seed(8010));
    std::uniform_real_distribution<float> uniform(-1.f, 1.f);
    for (KvDType format : {KvDType::e4m3, KvDType::e5m2}) {
      for (DType dtype : {DType::bf16, DType::fp16}) {
        CAPTURE(kv_dtype_name(format));
        CAPTURE(dtype_name(dtype));
        // Request b's one key is token 0 of page b; its V row of KV head h holds the codes
        // (2b + h) x 128 .. + 127 (mod 256): every code twice. The page's other tokens hold NaN
        // codes in K and V: a kernel that read them (past the KV's end) would turn rows to NaN.
        const std::uint8_t nan_code = format == KvDType::e4m3 ? 0x7f : 0x7e;
        std::vector<std::uint8_t> k_pool(kBatch * kPageStride, nan_code), v_pool(kBatch * kPageStride, nan_code);
        for (int b = 0; b < kBatch; ++b)
          for (int h = 0; h < kKvHeads; ++h)
            for (int i = 0; i < kHeadDim; ++i) {
              const std::int64_t at = b * kPageStride + h * kHeadDim + i;
              v_pool[at] = static_cast<std::uint8_t>(((2 * b + h) * kHeadDim + i) % 256);
              k_pool[at] = testing::float_to_fp8(uniform(rng), format);
            }
        const std::vector<std::int32_t> table = {0, 1}, lens = {1, 1}, indptr = {0, 1, 2};
        const std::vector<float> ones = {1.f};
        const std::vector<std::uint16_t> q = random_elements(kBatch * kHeads * kHeadDim, dtype, rng);
        DeviceBuffer d_q = DeviceBuffer::from(q), d_k = DeviceBuffer::from(k_pool), d_v = DeviceBuffer::from(v_pool);
        DeviceBuffer d_table = DeviceBuffer::from(table), d_lens = DeviceBuffer::from(lens);
        DeviceBuffer d_indptr = DeviceBuffer::from(indptr), d_scale = DeviceBuffer::from(ones);
        DeviceBuffer d_out(q.size() * 2);
        d_out.fill_byte(0xff);

        PagedPrefillArgs args;
        args.dtype = dtype;
        args.batch = kBatch;
        args.total_q = kBatch;
        args.max_q_len = 1;
        args.n_heads = kHeads;
        args.n_kv_heads = kKvHeads;
        args.head_dim = kHeadDim;
        args.page_size = kPageSize;
        args.num_pages = kBatch;
        args.max_pages_per_seq = 1;
        args.causal = true;
        args.kv_dtype = format;
        args.k_scale = args.v_scale = static_cast<const float*>(d_scale.get());
        args.q = d_q.get();
        args.qo_indptr = static_cast<const std::int32_t*>(d_indptr.get());
        args.k_cache = d_k.get();
        args.v_cache = d_v.get();
        args.k_stride_page = args.v_stride_page = kPageStride;
        args.k_stride_token = args.v_stride_token = kTokenStride;
        args.k_stride_head = args.v_stride_head = kHeadDim;
        args.page_table = static_cast<const std::int32_t*>(d_table.get());
        args.seq_lens = static_cast<const std::int32_t*>(d_lens.get());
        args.out = d_out.get();
        Runtime::get().paged_prefill(args);
        synchronize();
        const auto out = d_out.to_host<std::uint16_t>(q.size());

        // Exact: the same value (a -0 code leaves as +0: the weighted sum starts from +0), NaN as
        // NaN, infinities with their sign.
        int wrong = 0;
        std::string listed;
        for (int b = 0; b < kBatch; ++b)
          for (int head = 0; head < kHeads; ++head)
            for (int i = 0; i < kHeadDim; ++i) {
              const std::uint8_t code = v_pool[b * kPageStride + (head / kGroup) * kHeadDim + i];
              const float want = testing::fp8_to_float(code, format);
              const std::uint16_t got_bits = out[(b * kHeads + head) * kHeadDim + i];
              const float got = bits_to_float(got_bits, dtype);
              const bool right = std::isnan(want) ? std::isnan(got) : got == want;
              if (!right && wrong++ < 6)
                listed += fmt::format(" code {:#04x}: got {:#06x} ({}), want {} (b={} head={} col={});", code, got_bits,
                                      got, want, b, head, i);
            }
        INFO(fmt::format("{} of {} values wrong:{}", wrong, kBatch * kHeads * kHeadDim, listed));
        CHECK(wrong == 0);
      }
    }
  }
}

}  // namespace
}  // namespace astrai::gpu_test
