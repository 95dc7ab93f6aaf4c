// Helpers for the GPU suite: host bf16/fp16 conversion, random data, checks (device buffers
// come from tests/support).
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "astrai/runtime.hpp"
#include "runtime/driver_api.hpp"
#include "tests/support/device_buffer.hpp"
#include "tests/support/numerics.hpp"

namespace astrai::gpu_test {

using testing::attend_row;
using testing::DeviceBuffer;
using testing::RowCheck;
using testing::RowFeatures;
using testing::soft_capped;
using testing::test_seed;

void synchronize();

// Host-side element conversions (round to nearest even), matching the device's.
inline std::uint16_t float_to_bits(float value, DType dtype) { return testing::float_to_element(value, dtype); }
inline float bits_to_float(std::uint16_t bits, DType dtype) { return testing::element_to_float(bits, dtype); }

// Random values in [-1, 1) rounded to the dtype, as raw bits.
std::vector<std::uint16_t> random_elements(std::size_t count, DType dtype, std::mt19937& rng);

// A rotary table of `pairs` random rotations: cos and sin of angles in [-100, 100) radians.
std::vector<float> random_rotations(std::size_t pairs, std::mt19937& rng);

// Peaked softmax rows: the gain of key t of `len` under a ramp, 1 + ramp * t / len. Keys that
// grow along the sequence give rows whose maximum keeps rising block after block and split
// after split (later splits outweigh earlier ones, which the merge must rescale); with scale 1
// the scores spread over tens of units.
inline float key_gain(int t, int len, float ramp) {
  return ramp > 0 && len > 0 ? 1.f + ramp * static_cast<float>(t) / static_cast<float>(len) : 1.f;
}
// Multiplies the `count` elements at `at` by `gain` (rounded back to the dtype).
void scale_elements(std::uint16_t* at, std::int64_t count, float gain, DType dtype);

// Runs `call` (a launch on the stream it is given) eagerly on a fresh stream, which sizes its
// workspace there, captures it in a CUDA graph and replays the graph `replays` times over a
// re-poisoned `out`: each replay must give `eager_out` bit for bit.
void check_graph_replay(const std::function<void(CUstream)>& call, DeviceBuffer* out,
                        const std::vector<std::uint16_t>& eager_out, int replays, const std::string& description);

// Records a case's verdict: the worst errors per kernel and dtype and the number of cases
// (printed at the end of the suite), then checks it, printing its parameter string and errors.
void report_case(const std::string& kernel, DType dtype, const std::string& description, const RowCheck& check);
void print_worst();
// A case that could not run here (an sm_90a-only case on another GPU, a multi-GPU case on one
// GPU): listed as NOT RUN at the end of the suite, never counted as passed.
void not_run(const std::string& what);

bool mma_forced_off();
bool wgmma_forced_off();  // ASTRAI_JIT_NO_WGMMA
bool wide_tiles_forced();  // ASTRAI_JIT_PREFILL_TILES=wide
// Compute capability of device 0 as major * 10 + minor (90 on an H100/H200).
int device_compute_capability();
// Whether the runtime compiles for sm_90a on device 0: an sm_90 GPU and no ASTRAI_JIT_ARCH
// naming another target (ASTRAI_JIT_ARCH=compute_80 runs the sm_80 code path there).
bool sm90a_target();
// How many variants loaded so far have `part` in their name: which path a call took.
int loaded_variants_named(const std::string& part);

// The serving features of an attention case. text() is its part of the parameter string,
// " cap=4" for those set, "" for none.
struct CaseFeatures {
  float logit_cap = 0.f;  // > 0: soft-cap
  bool sinks = false;     // one sink logit per query head (sink_values)
  int window_left = -1;   // >= 0: sliding window
  bool alibi = false;     // ALiBi slopes (alibi_values)
  std::string text() const;
};

// ALiBi slopes of n_heads heads: the geometric series 2^(-8 (h + 1) / n_heads) of the models
// that use it.
std::vector<float> alibi_values(int n_heads);

// Sink logits of a case with n_heads query heads: spread over [-2, 7] (below, within and above
// the LSE of the rows), and -inf for head 0 (a sink that weighs nothing).
std::vector<float> sink_values(int n_heads, unsigned seed);

// Extra cases for the random sweeps: ASTRAI_TEST_SWEEP, else `fallback`.
int sweep_count(int fallback);

}  // namespace astrai::gpu_test
