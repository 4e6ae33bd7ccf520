// Internal glue between the public API (include/scalesweep/cuda/quantize.h), the kernels
// (quantize.cu) and the CPU emulation (host_api.cc). Host code only.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/cuda/block_quant.h"
#include "scalesweep/cuda/quantize.h"

namespace scalesweep::cuda::detail {

// m when the kernels implement it; throws std::invalid_argument for an unsupported method.
Method kmethod(Method m);
kern::Params make_params(const QuantizeArgs& a);

// Runs a launch on the CPU with HOST pointers in `a`: the same per-block code as the GPU's
// generic path (block_quant.h, process_block), block by block. Validates first. Used by the
// CPU tests to check the kernels' selection, packing and layout code without a GPU.
void emulate(const QuantizeArgs& a);

// GPU self-check of the native conversions against the shared format code (quantize.cu):
// e4m3 RNE of n floats and E2M1 RNE of n quotients. Returns the number of mismatches;
// native_e4m3 / native_e2m1 tell whether the device code used the native instructions.
struct ConversionCheck {
  int64_t checked = 0, mismatches = 0;
  bool native_e4m3 = false, native_e2m1 = false;
};
ConversionCheck check_native_conversions(int64_t n);

// GPU check of the fast sweeps (fast_check.cu, for gpu_test.cc): generates a [rows, cols]
// tensor of test kind `kind` (0 normal, 1 Laplace, 2 Student-t-like, 3 uniform, 4 bench-like
// bf16 activations, 5 exact FP4 ties, 6 FP8-valued, 7 outlier, 8 integer-valued, 9 one-hot;
// magnitudes over every FP8 binade) on the device, runs `method` (sweep-mse or sweep-wmse)
// exact and fast and the exhaustive method of the same loss, and compares per block the
// contract loss of the fast choice with the reference: the exhaustive optimum for sweep-mse
// (whose proven windows contain it), the window optimum (the exact kernel) for sweep-wmse.
// weighted: random importance for sweep-wmse. numerics: kFast or kHalf2; a violation is a block
// whose loss exceeds (1 + tol) times the reference (kFast) or the reference plus
// kern::half2_excess_bound (kHalf2; the excess statistics then relative to ref + 2^-16 a^2 w_a).
inline constexpr int kFastCheckKinds = 10;
struct FastCheck {
  int64_t blocks = 0;
  int64_t differs = 0;                    // fast pattern != exact pattern
  int64_t worse = 0;                      // fast contract loss > exact contract loss
  int64_t violations = 0;                 // fast loss > (1 + tol) * reference loss
  int64_t exact_not_optimal = 0;          // sweep-mse: exact loss != exhaustive loss (must be 0)
  double max_excess = 0, sum_excess = 0;  // relative excess over the reference, where worse
  int64_t first_violation = -1;
  std::string violation;  // the first violation's patterns and losses
};
FastCheck check_fast_numerics(Method method, int kind, int64_t rows, int64_t cols, uint64_t seed,
                              bool weighted, Numerics numerics = Numerics::kFast,
                              double tol = 1e-6);

// Tests only: caps the grid of the quantize kernels at `ctas` thread blocks (0 restores the
// default, SMs x 64), so that the grid-stride loops run many iterations on small tensors.
void set_grid_cap_for_testing(int64_t ctas);

}  // namespace scalesweep::cuda::detail
