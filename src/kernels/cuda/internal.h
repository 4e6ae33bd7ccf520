// Internal glue between the public API (include/scalesweep/cuda/quantize.h), the kernels
// (quantize.cu) and the CPU emulation (host_api.cc). Host code only.
#pragma once

#include <cstdint>

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

// Tests only: caps the grid of the quantize kernels at `ctas` thread blocks (0 restores the
// default, SMs x 64), so that the grid-stride loops run many iterations on small tensors.
void set_grid_cap_for_testing(int64_t ctas);

}  // namespace scalesweep::cuda::detail
