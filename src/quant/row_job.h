// Internal: one quantization job over a range of rows, shared by the scalar reference
// (src/quant/quantize.cc) and the fast kernels (src/quant/simd/kernels.h).
// Inputs are validated before a job is built (finite values, importance >= 0, options), so
// kernels never throw. Every kernel must write exactly the bytes of quantize_rows_reference
// (docs/NUMERICS.md).
#pragma once

#include <cstdint>
#include <string>

#include "scalesweep/quant/quantize.h"
#include "scalesweep/scale/selector.h"

namespace scalesweep::detail {

struct RowJob {
  // Input X[rows, cols], row-major, element type `dtype` (bf16/f16 widened exactly).
  const void* x = nullptr;
  DType dtype = DType::kF32;
  int64_t rows = 0, cols = 0;
  int block = 16;  // 8, 16, 32, 64 (MXFP4: 32); the last block of a row may be partial
  TensorFormat format = TensorFormat::kNvfp4;
  float gs = 1.0f;  // encode-direction global scale: y = fl(x * gs) (1 for MXFP4)
  // Importance, only set when the selector uses weights (method_uses_weights()):
  // kPerColumn: imp[c] for every row; kPerElement: imp[r * cols + c]. nullptr = unweighted.
  ImportanceKind imp_kind = ImportanceKind::kNone;
  const float* imp = nullptr;
  // kBlockHessian (the *-hessian methods): [blocks_per_row, block, block] (Importance).
  const double* hessian = nullptr;
  // Method (never kOptFp32), scale format (E4M3 for NVFP4, UE8M0 for MXFP4), window.
  SelectorConfig selector;
  // Outputs, whole tensor buffers; a job writes rows [r0, r1) completely:
  // codes [rows, (cols + 1) / 2] (element 2i low nibble, 2i+1 high, odd tail padded with 0),
  // scales [rows, ceil(cols / block)] bit patterns.
  uint8_t* codes = nullptr;
  uint8_t* scales = nullptr;

  int64_t blocks_per_row() const { return (cols + block - 1) / block; }
  int64_t packed_cols() const { return scalesweep::packed_cols(cols); }
};

// Loads y = fl(x * gs) of row r, columns [c0, c0 + n) into y, and the weights into w (returns
// the pointer to use: nullptr when unweighted, else w or a pointer into job.imp).
void load_block(const RowJob& job, int64_t r, int64_t c0, int n, float* y);
const float* block_weights(const RowJob& job, int64_t r, int64_t c0);

// Throws std::invalid_argument naming `name` and the first bad index when an importance
// element is negative or not finite (quantize()'s check and message).
void check_importance(const Importance& imp, int64_t rows, int64_t cols, const std::string& name);

// The scalar reference for rows [r0, r1): per block select_block_scale on y (the *-hessian
// methods: select_block_scale_hessian with the block's Hessian), then fp4_code of every
// element with the chosen scale, packed.
void quantize_rows_reference(const RowJob& job, int64_t r0, int64_t r1);

}  // namespace scalesweep::detail
