// GPTQ / LDLQ with NVFP4/MXFP4 block scales chosen by a ScaleSweep selector, either once
// before the column loop (static, SPEC "GPTQ (LDLQ) as the paper uses it"; paper App. "GPTQ",
// static reordering as in MR-GPTQ) or inside it from the error-compensated weights (dynamic).
// Layer `gptq`: depends on `quant` (selectors, tensor quantization) and LAPACKE/BLAS.
//
// Algorithm, for a weight W[N, K] (rows = output channels) and the calibration statistic
// XtX = sum_t x_t x_t^T [K, K] over n tokens (float64):
//   1. H = 2/n * XtX. Dead columns (H_jj == 0): H_jj = 1 and W[:, j] = 0.
//   2. Damping: H += damp * mean(diag H) * I.
//   3. Columns are processed in descending H_jj order (stable sort; ties keep index order),
//      with U = chol(H_p^-1)^T upper triangular (H_p the permuted, damped H).
//   4. The global scale is the one scalesweep::quantize() gives this (dead-zeroed) W. Static
//      timing: the block scales too are chosen ONCE from this W by the selector, with
//      importance Imp_j = H_jj (undamped) for the weighted methods. Dynamic timing: below.
//   5. For each column i (in the processing order): q = quantize(w_i) with the scales of its
//      original block, e = (w_i - q) / U_ii, W[:, j] -= e * U_ij for j > i. Updates inside a
//      block of `block_size` columns are applied column by column; the rest of the matrix
//      gets one BLAS GEMM per block (lazy batch updates). block_size = 0 selects the
//      unblocked reference path (a rank-1 BLAS update of all remaining columns per column),
//      used to measure the speed-up.
//   The weight is held in float64 throughout; quantizing one element follows
//   docs/NUMERICS.md exactly: x = (float)w, y = fl(x * gs), code = RNE_fp4(y / s).
// The result is a QuantizedTensor of the same layout as scalesweep::quantize() (static: same
// scales and global scale as the RTN result for the same W, importance and config; different
// codes. Dynamic: same global scale, its own scales).
//
// Dynamic scales (ScaleTiming::kDynamic). When the loop first reaches a column of a scale
// block (of cfg.quant.block columns; with act-order the block's columns are spread over the
// processing order, and the first of them processed is meant; none of the block's columns is
// quantized yet), each row's scale of that block is chosen by the selector
// (select_block_scale, y = fl((float)w * gs) with the global scale of step 4; a value beyond
// the float range saturates to +-FLT_MAX first) from the CURRENT values of all the block's
// columns, i.e. with every error update of the columns processed so far. With the lazy batch
// updates, a column of the block beyond the current batch has not received the batch's GEMM
// yet: its current value is computed on the fly as w_j - sum_{m in batch, m < i} E_m U_mj
// (the batch's error rows so far, subtracted in order; the GEMM later applies the same update
// to W itself, unchanged). The block's columns are then quantized with those scales as the
// loop reaches them.
//
// Importance of the dynamic selection (weighted methods; DynamicImportance). Write one row
// as w (its values at the start), w~_i its value when column i is quantized, q_i = Q(w~_i)
// and d_i = (w~_i - q_i) / U_ii (the loop's e). The updates give w~_j = w_j - sum_{i<j} d_i U_ij,
// so w_j - q_j = d_j U_jj + sum_{i<j} d_i U_ij, i.e. the row's final error is D = d U (row
// vectors, U upper). With H^-1 = U^T U (damped H), U H U^T = I and the row's loss is exactly
//     D H D^T = d U H U^T d^T = sum_i d_i^2 = sum_i (w~_i - q_i)^2 / U_ii^2.
// GPTQ's objective is thus a sum over columns of the squared rounding error of the value each
// column has when it is quantized, weighted by 1 / U_ii^2 = 1 / [H_F^-1]_ii (F = the columns
// not yet quantized at step i, i and later in the processing order; the OBS loss of
// quantizing column i while all later columns stay free to compensate; equal to the Schur
// complement H_ii - H_iR H_RR^-1 H_Ri, R = the later columns: the part of H_ii that the later
// columns cannot absorb). A block scale s enters this sum directly only through the block's
// own terms (its errors also move the later columns, whose terms GPTQ then compensates; the
// choice is greedy and ignores that), so with the values w~ frozen at the current ones the
// best scale minimizes sum_{j in block} (w~_j - q_j(s))^2 / U_jj^2: the weighted loss of the
// selectors with per-column weights 1 / U_jj^2 ("obs"; in the y = w * gs domain the factor
// gs^2 is common to the block and does not change the choice). The values are frozen
// because the block's later columns still move (by the errors of the block's earlier
// columns and of the columns processed in between); the first column of the block processed
// is exact. "hdiag" uses H_jj (undamped), static's importance: the diagonal term of D H D^T,
// the loss of column j's rounding error if nothing compensated it. Since 1 / U_jj^2 <= H_jj
// + damping, obs gives less weight to the columns whose error the later ones can absorb;
// with uncorrelated columns (H diagonal, no updates) the two differ only by the damping, and
// dynamic gives quantize()'s result for the same importance. The loss above is exact for the
// damped H; GptqStats's losses use the undamped one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "scalesweep/base/names.h"
#include "scalesweep/quant/quantize.h"

namespace scalesweep::gptq {

// When the block scales are chosen: once before the column loop from the original weights
// (static), or in the loop from the error-compensated weights (dynamic; header comment).
enum class ScaleTiming { kStatic, kDynamic };
inline constexpr auto kScaleTimingNames = make_names<ScaleTiming>(
    "GPTQ scale timing", {{ScaleTiming::kStatic, "static"}, {ScaleTiming::kDynamic, "dynamic"}});

// Per-column importance of the dynamic selection for the weighted methods (header comment):
// H_jj (static's importance) or the OBS weight 1 / U_jj^2. hdiag is the default: obs gives the
// lower layer loss tr(D H D^T) but hdiag the lower NLL on SmolLM2-135M (docs/PERF.md, 7).
enum class DynamicImportance { kHessianDiag, kObs };
inline constexpr auto kDynamicImportanceNames = make_names<DynamicImportance>(
    "GPTQ importance",
    {{DynamicImportance::kHessianDiag, "hdiag"}, {DynamicImportance::kObs, "obs"}});

struct GptqConfig {
  QuantConfig quant;      // format must be NVFP4 or MXFP4; selector, block size, global scale
  double damp = 0.01;     // relative damping: damp * mean(diag H), > 0
  int block_size = 128;   // lazy-batch column block; 0 = unblocked reference path
  bool act_order = true;  // static reordering by descending diag H
  ScaleTiming scale_timing = ScaleTiming::kStatic;
  // Dynamic timing only, weighted methods only (static always uses H_jj; the block-Hessian
  // methods use H's undamped diagonal blocks in both timings).
  DynamicImportance importance = DynamicImportance::kHessianDiag;
  bool compute_losses = false;  // fill GptqStats::loss_* (costs about one more GEMM pass)
};

struct GptqStats {
  int64_t dead_columns = 0;
  double damp_abs = 0;  // absolute damping added to the diagonal
  // Proxy losses tr((W - Q) H (W - Q)^T) with the undamped H = 2/n XtX, for GPTQ's result
  // and for the RTN result of quantize() with the same importance (static: the same scales;
  // lower is better; GPTQ should win).
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
