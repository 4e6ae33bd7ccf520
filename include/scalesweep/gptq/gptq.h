// GPTQ / LDLQ with block scales fixed beforehand by a ScaleSweep selector (SPEC "GPTQ (LDLQ)
// as the paper uses it"; paper App. "GPTQ", static reordering as in MR-GPTQ).
// Layer `gptq`: depends on `quant` (selectors, tensor quantization) and LAPACKE/BLAS.
//
// Algorithm, for a weight W[N, K] (rows = output channels) and the calibration statistic
// XtX = sum_t x_t x_t^T [K, K] over n tokens (float64):
//   1. H = 2/n * XtX. Dead columns (H_jj == 0): H_jj = 1 and W[:, j] = 0.
//   2. Block scales and the global scale are chosen ONCE from this W by the selector
//      (scalesweep::quantize), with importance Imp_j = H_jj for the weighted methods.
//   3. Damping: H += damp * mean(diag H) * I.
//   4. Columns are processed in descending H_jj order (stable sort; ties keep index order),
//      with U = chol(H_p^-1)^T upper triangular (H_p the permuted H): for each column i,
//      q = quantize(w_i) with the FIXED scales of its original block, e = (w_i - q) / U_ii,
//      W[:, j] -= e * U_ij for j > i. Updates inside a block of `block_size` columns are
//      applied column by column; the rest of the matrix gets one BLAS GEMM per block
//      (lazy batch updates). block_size = 0 selects the unblocked reference path (a rank-1
//      BLAS update of all remaining columns per column), used to measure the speed-up.
//   The weight is held in float64 throughout; quantizing one element follows
//   docs/NUMERICS.md exactly: x = (float)w, y = fl(x * gs), code = RNE_fp4(y / s).
// The result is a QuantizedTensor of the same layout as scalesweep::quantize() (same scales
// and global scale as the RTN result for the same W, importance and config; different codes).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "scalesweep/quant/quantize.h"

namespace scalesweep::gptq {

struct GptqConfig {
  QuantConfig quant;            // format must be NVFP4 or MXFP4; selector, block size, global scale
  double damp = 0.01;           // relative damping: damp * mean(diag H), > 0
  int block_size = 128;         // lazy-batch column block; 0 = unblocked reference path
  bool act_order = true;        // static reordering by descending diag H
  bool compute_losses = false;  // fill GptqStats::loss_* (costs about one more GEMM pass)
};

struct GptqStats {
  int64_t dead_columns = 0;
  double damp_abs = 0;  // absolute damping added to the diagonal
  // Proxy losses tr((W - Q) H (W - Q)^T) with the undamped H = 2/n XtX, for GPTQ's result
  // and for the RTN result with the same scales (lower is better; GPTQ should win).
  double loss_gptq = 0, loss_rtn = 0;
  double seconds = 0;
};

// xtx: [cols, cols] row-major, symmetric (only the upper triangle, j >= i, is read),
// finite, non-negative diagonal. n_tokens > 0. w: [rows, cols] row-major, finite.
// Throws std::invalid_argument naming `name` (and the first bad index) on bad input, and
// std::runtime_error when H + damping is not positive definite ("increase --damp").
QuantizedTensor gptq_quantize(const float* w, int64_t rows, int64_t cols, const double* xtx,
                              int64_t n_tokens, const GptqConfig& cfg,
                              const std::string& name = "tensor", GptqStats* stats = nullptr);

// Layer-output proxy loss tr(D H D^T), D = W - W_hat, H = 2/n XtX (float64), as used above.
double hessian_loss(const float* w, const float* w_hat, int64_t rows, int64_t cols,
                    const double* xtx, int64_t n_tokens);

}  // namespace scalesweep::gptq
