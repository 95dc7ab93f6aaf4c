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

namespace astrai::gpu_test {

using testing::DeviceBuffer;

void synchronize();

// Host-side element conversions (round to nearest even), matching the device's.
std::uint16_t float_to_bits(float value, DType dtype);
float bits_to_float(std::uint16_t bits, DType dtype);

// Random values in [-1, 1) rounded to the dtype, as raw bits.
std::vector<std::uint16_t> random_elements(std::size_t count, DType dtype, std::mt19937& rng);

// A rotary table of `pairs` random rotations: cos and sin of angles in [-100, 100) radians.
std::vector<float> random_rotations(std::size_t pairs, std::mt19937& rng);

// Elementwise |got - want| <= atol + rtol * |want| over every element, NaN never passes.
struct Comparison {
  std::size_t checked = 0;
  std::size_t failures = 0;
  double max_abs_error = 0;
  double max_rel_error = 0;   // max |err| / max(|want|, 1e-3) over elements
  double norm_rel_error = 0;  // ||got - want|| / ||want||
  std::string first_failure;
  double sum_sq_error = 0;
  double sum_sq_reference = 0;
};
void accumulate(Comparison* comparison, double got, double want, double atol, double rtol,
                const std::string& where);
void finish(Comparison* comparison);

// Runs `call` (a launch on the stream it is given) eagerly on a fresh stream, which sizes its
// workspace there, captures it in a CUDA graph and replays the graph `replays` times over a
// re-poisoned `out`: each replay must give `eager_out` bit for bit.
void check_graph_replay(const std::function<void(CUstream)>& call, DeviceBuffer* out,
                        const std::vector<std::uint16_t>& eager_out, int replays, const std::string& description);

// Records the worst errors of the run (printed at the end of the suite).
void note_worst(const std::string& kernel, DType dtype, const Comparison& comparison);
void print_worst();

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
  std::string text() const;
};

// Sink logits of a case with n_heads query heads: spread over [-2, 7] (below, within and above
// the LSE of the rows), and -inf for head 0 (a sink that weighs nothing).
std::vector<float> sink_values(int n_heads, unsigned seed);

// A scaled score as the soft-cap leaves it, in float64 (cap 0: unchanged).
double soft_capped(double score, double logit_cap);

// Extra cases for the random sweeps: ASTRAI_TEST_SWEEP, else `fallback`.
int sweep_count(int fallback);

}  // namespace astrai::gpu_test
