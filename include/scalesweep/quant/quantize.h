// NVFP4 / MXFP4 quantization of a 2-D tensor X[N, K] (rows = output channels for weights,
// tokens for activations), blocks of `block` consecutive elements along K, partial last
// block when K % block != 0. Layer `quant`: depends on `scale` and `format`.
// This is the scalar reference path; fast paths (SIMD, threads, CUDA) must produce the
// same bytes (docs/NUMERICS.md).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "scalesweep/base/names.h"
#include "scalesweep/format/dtype.h"
#include "scalesweep/quant/layout_index.h"
#include "scalesweep/scale/selector.h"

namespace scalesweep {

enum class TensorFormat { kNvfp4, kMxfp4 };

// "nvfp4", "mxfp4"; parsing ignores case (NVFP4 is accepted).
inline constexpr auto kTensorFormatNames = make_names<TensorFormat>(
    "format", {{TensorFormat::kNvfp4, "nvfp4"}, {TensorFormat::kMxfp4, "mxfp4"}}, true);

// The block-scale format of a tensor format: E4M3 for NVFP4, UE8M0 for MXFP4.
constexpr ScaleFormat scale_format_of(TensorFormat f) {
  return f == TensorFormat::kMxfp4 ? ScaleFormat::kUE8M0 : ScaleFormat::kE4M3;
}

// The one block-size check: NVFP4 takes blocks of 8, 16, 32 or 64 elements, MXFP4 of 32 (OCP
// MX). Throws std::invalid_argument "block size 12 is not supported (accepted: 8, 16, 32, 64)"
// or "MXFP4 requires block 32 (got 16)".
void check_block(TensorFormat f, int block);

// The one check of C in S = amax / (6 C) (QuantConfig::max_block_scale): throws OptionError
// (base/option_error.h) for field "max_block_scale" with the message "C must satisfy 0 < C <= 448
// (the largest FP8 E4M3 value)".
void check_max_block_scale(float c);
// The one check of an explicit encode-direction global scale: OptionError for "global_scale"
// ("must be a finite value > 0").
void check_global_scale(float gs);

// Element type of the input tensor: DType (format/dtype.h, names in kDTypeNames). bf16/f16
// are widened exactly to float first, so a bf16 tensor gives the same bytes as the float
// tensor of the same values.

// kBlockHessian: for each column block b of the row (every row alike), the block's
// [block, block] diagonal block of the input Hessian (sum x x^T of the columns b*block ..),
// row-major, one after another: [ceil(K / block), block, block] doubles in `hessian` (a partial
// last block uses the top-left n x n of its slot). Read by the *-hessian methods only, which
// require it (block_hessians() extracts it from a full [K, K] matrix).
enum class ImportanceKind {
  kNone,
  kPerColumn /* [K] */,
  kPerElement /* [N, K] */,
  kBlockHessian /* [ceil(K/block), block, block] */
};

struct Importance {
  ImportanceKind kind = ImportanceKind::kNone;
  const float* data = nullptr;      // kPerColumn, kPerElement: non-negative, finite
  const double* hessian = nullptr;  // kBlockHessian: finite, non-negative diagonal
  int block = 0;                    // kBlockHessian: the block size it was built for
};

// The diagonal blocks of a symmetric [k, k] matrix given by its upper triangle (j >= i read;
// row-major), scaled by `scale`, in kBlockHessian's layout for blocks of `block` columns.
std::vector<double> block_hessians(const double* h, int64_t k, int block, double scale = 1.0);
// The block Hessians of a diagonal matrix diag(w[0..k)) in the same layout: where only a
// per-column importance is known (attention states; the per-layer error report).
std::vector<double> diagonal_block_hessians(const float* w, int64_t k, int block);

struct QuantConfig {
  TensorFormat format = TensorFormat::kNvfp4;
  int block = 16;           // 8, 16, 32, 64 (MXFP4: 32)
  SelectorConfig selector;  // selector.scale_format is set from `format` by quantize()
  // C in S = amax / (6 C); default 448 for absmax, 256 for every other method.
  std::optional<float> max_block_scale;
  // Explicit encode-direction global scale gs = 1/S (overrides max_block_scale).
  std::optional<float> global_scale;
  int threads = 0;  // 0 = all cores; output is identical for every thread count
  // Skip the fast kernels (src/quant/simd) and run the scalar reference only (tests, benches).
  bool reference_only = false;
};

// The one validation of a QuantConfig, as quantize() runs it: check_block, the global scale
// (check_max_block_scale, check_global_scale, not both, neither for MXFP4), the window (only
// for the sweep methods, required by kSweep, check_window for the format) and threads >= 0.
// Throws OptionError naming the field ("block", "window", ...).
void validate(const QuantConfig& cfg);

// Packed result. codes: [rows, ceil(cols/2)] bytes, element 2i in the low nibble, 2i+1 in
// the high nibble, an odd last column padded with code 0. scales: [rows, ceil(cols/block)]
// bit patterns (E4M3 for NVFP4, UE8M0 for MXFP4), row-major.
struct QuantizedTensor {
  TensorFormat format = TensorFormat::kNvfp4;
  int64_t rows = 0, cols = 0;
  int block = 16;
  float global_scale = 1.0f;  // encode direction gs (1 for MXFP4)
  std::vector<uint8_t> codes;
  std::vector<uint8_t> scales;
  int64_t blocks_per_row() const { return (cols + block - 1) / block; }
  int64_t packed_cols() const { return scalesweep::packed_cols(cols); }
};

// Default C for a method (448 for absmax, 256 otherwise).
float default_max_block_scale(Method m);
// gs = fl(fl(6 C) / amax) as float, clamped to [the smallest gs with fl(6 * 448 / gs) finite,
// FLT_MAX] (a huge or a tiny amax); 1 for an all-zero tensor. Throws std::invalid_argument for a
// NaN, infinite or negative amax.
float global_scale_for_amax(float amax, float max_block_scale);
// The encode-direction global scale quantize() uses for this input and config (1 for MXFP4).
// Validates like quantize().
float resolve_global_scale(const void* x, DType dtype, int64_t rows, int64_t cols,
                           const QuantConfig& cfg, const std::string& name = "tensor");

// Validates input (non-empty, finite, importance finite and >= 0, options): throws
// std::invalid_argument naming `name` and the first bad index ("tensor 'w': element [3, 17] is
// NaN"). Methods that use weights (the *-wmse ones, sweep with importance, opt-fp32) read
// `imp`; the others ignore it. kOptFp32 has no packed form: use fake_quantize.
QuantizedTensor quantize(const float* x, int64_t rows, int64_t cols, const Importance& imp,
                         const QuantConfig& cfg, const std::string& name = "tensor");
QuantizedTensor quantize(const void* x, DType dtype, int64_t rows, int64_t cols,
                         const Importance& imp, const QuantConfig& cfg,
                         const std::string& name = "tensor");
// Same result as quantize(), written into `out`: its codes/scales vectors are resized (their
// capacity is reused, so repeated calls on same-shaped tensors allocate nothing; every byte
// is overwritten). With an explicit cfg.global_scale on the fast NVFP4 path, the separate
// input scan is skipped: the row kernels check finiteness and amax * gs <= 2^48 on the fly,
// and on a violation the scan runs and throws the same error as quantize() (then `out` holds
// unspecified bytes).
void quantize_into(const void* x, DType dtype, int64_t rows, int64_t cols, const Importance& imp,
                   const QuantConfig& cfg, QuantizedTensor& out,
                   const std::string& name = "tensor");

// x_hat = fl(q * s / gs) per element (q * s is exact, one rounding), as float: [rows, cols];
// saturated to +-FLT_MAX (an MXFP4 scale up to 2^127 can exceed the float range).
std::vector<float> dequantize(const QuantizedTensor& q);

// Quantize-dequantize in one step (simulation). For Method::kOptFp32 this is the only path:
// every block uses its exact continuous optimum scale s* (no FP8 rounding), weighted when
// `imp` is given, and x_hat = fl(q * s* / gs) computed in double (saturated to +-FLT_MAX).
std::vector<float> fake_quantize(const float* x, int64_t rows, int64_t cols, const Importance& imp,
                                 const QuantConfig& cfg, const std::string& name = "tensor");
std::vector<float> fake_quantize(const void* x, DType dtype, int64_t rows, int64_t cols,
                                 const Importance& imp, const QuantConfig& cfg,
                                 const std::string& name = "tensor");

struct ErrorMetrics {
  double nmse = 0;   // sum (x - xh)^2 / sum x^2
  double nwmse = 0;  // sum w (x - xh)^2 / sum w x^2 (equals nmse without importance); block
                     // Hessians: sum over blocks of d^T H_b d / sum of x^T H_b x, d = x - xh
};
// Sums in double. A zero denominator gives 0 (the numerator is then 0 too).
ErrorMetrics error_metrics(const float* x, const float* xhat, int64_t rows, int64_t cols,
                           const Importance& imp);
ErrorMetrics error_metrics(const void* x, DType dtype, const float* xhat, int64_t rows,
                           int64_t cols, const Importance& imp);
// 100 * (err - err_opt) / err_opt (0 when both are 0, +inf when only err_opt is 0).
double gap_percent(double err, double err_opt);

// Widens element i of a tensor of the given dtype to float (exact).
float load_element(const void* x, DType dtype, int64_t i);

}  // namespace scalesweep
