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

#include "scalesweep/scale/selector.h"

namespace scalesweep {

enum class TensorFormat { kNvfp4, kMxfp4 };

enum class ImportanceKind { kNone, kPerColumn /* [K] */, kPerElement /* [N, K] */ };

struct Importance {
  ImportanceKind kind = ImportanceKind::kNone;
  const float* data = nullptr;  // non-negative, finite
};

struct QuantConfig {
  TensorFormat format = TensorFormat::kNvfp4;
  int block = 16;  // 8, 16, 32, 64 (MXFP4: 32)
  SelectorConfig selector;
  // C in S = amax / (6 C); default 448 for absmax, 256 for every other method.
  std::optional<float> max_block_scale;
  // Explicit encode-direction global scale gs = 1/S (overrides max_block_scale).
  std::optional<float> global_scale;
  int threads = 0;  // 0 = all cores; output is identical for every thread count
};

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
  int64_t packed_cols() const { return (cols + 1) / 2; }
};

// Default C for a method (448 for absmax, 256 otherwise).
float default_max_block_scale(Method m);
// gs = 6 C / amax as float; 1 for an all-zero tensor.
float global_scale_for_amax(float amax, float max_block_scale);

// Validates input (finite, shapes, options): throws std::invalid_argument with the first bad
// index ("element [r, c] is NaN"). `name` is used in messages.
QuantizedTensor quantize(const float* x, int64_t rows, int64_t cols, const Importance& imp,
                         const QuantConfig& cfg, const std::string& name = "tensor");

// x_hat = q * s / gs per element, as float: [rows, cols].
std::vector<float> dequantize(const QuantizedTensor& q);

// Quantize-dequantize in one step (simulation). For Method::kOptFp32 this is the only path:
// every block uses its exact continuous optimum scale (no FP8 rounding).
std::vector<float> fake_quantize(const float* x, int64_t rows, int64_t cols,
                                 const Importance& imp, const QuantConfig& cfg,
                                 const std::string& name = "tensor");

struct ErrorMetrics {
  double nmse = 0;    // sum (x - xh)^2 / sum x^2
  double nwmse = 0;   // sum w (x - xh)^2 / sum w x^2 (equals nmse without importance)
};
ErrorMetrics error_metrics(const float* x, const float* xhat, int64_t rows, int64_t cols,
                           const Importance& imp);
// 100 * (err - err_opt) / err_opt
double gap_percent(double err, double err_opt);

}  // namespace scalesweep
