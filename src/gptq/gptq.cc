// GPTQ / LDLQ with block scales chosen before (static) or in (dynamic) the column loop. See
// include/scalesweep/gptq/gptq.h.
#include "scalesweep/gptq/gptq.h"

#include <cblas.h>
#include <lapacke.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "scalesweep/base/option_error.h"
#include "scalesweep/base/parallel.h"
#include "scalesweep/format/minifloat.h"
#include "scalesweep/quant/index_string.h"
#include "scalesweep/scale/selector.h"

namespace scalesweep::gptq {
namespace {

// Full symmetric H = scale * XtX from the upper triangle of xtx (row-major).
std::vector<double> symmetric_hessian(const double* xtx, int64_t k, double scale) {
  std::vector<double> h(static_cast<size_t>(k * k));
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = i; j < k; ++j) {
      const double v = scale * xtx[i * k + j];
      h[i * k + j] = v;
      h[j * k + i] = v;
    }
  return h;
}

constexpr double kFloatMax = static_cast<double>(std::numeric_limits<float>::max());

float scale_value(const QuantizedTensor& q, uint8_t pattern) {
  if (q.format == TensorFormat::kMxfp4) return format::UE8M0::decode_f(pattern);
  return format::E4M3::decode_f(pattern);
}

void set_nibble(std::vector<uint8_t>& packed, int64_t pc, int64_t r, int64_t c, uint8_t code) {
  uint8_t& b = packed[static_cast<size_t>(r * pc + c / 2)];
  if (c & 1)
    b = static_cast<uint8_t>((b & 0x0F) | (code << 4));
  else
    b = static_cast<uint8_t>((b & 0xF0) | (code & 0x0F));
}

uint8_t get_nibble(const std::vector<uint8_t>& packed, int64_t pc, int64_t r, int64_t c) {
  const uint8_t b = packed[static_cast<size_t>(r * pc + c / 2)];
  return (c & 1) ? static_cast<uint8_t>(b >> 4) : static_cast<uint8_t>(b & 0x0F);
}

// Dequantized matrix of a QuantizedTensor, x = fl(q * s) / gs (q * s is exact).
std::vector<float> dequant(const QuantizedTensor& q) {
  const int64_t bpr = q.blocks_per_row(), pc = q.packed_cols();
  std::vector<float> out(static_cast<size_t>(q.rows * q.cols));
  for (int64_t r = 0; r < q.rows; ++r)
    for (int64_t c = 0; c < q.cols; ++c) {
      const float s = scale_value(q, q.scales[static_cast<size_t>(r * bpr + c / q.block)]);
      const float v = format::kFp4Values.v[get_nibble(q.codes, pc, r, c)];
      out[static_cast<size_t>(r * q.cols + c)] = (v * s) / q.global_scale;
    }
  return out;
}

void validate(const float* w, int64_t rows, int64_t cols, const double* xtx, int64_t n_tokens,
              const GptqConfig& cfg, const std::string& name) {
  if (rows <= 0 || cols <= 0)
    throw std::invalid_argument(name + ": GPTQ needs a non-empty 2-D weight, got " +
                                index_string(rows, cols));
  if (!w || !xtx) throw std::invalid_argument(name + ": null weight or Hessian");
  if (n_tokens <= 0)
    throw std::invalid_argument(name + ": Hessian token count must be > 0 (got " +
                                std::to_string(n_tokens) + "); calibration recorded no tokens");
  if (!(cfg.damp > 0) || !std::isfinite(cfg.damp))
    throw std::invalid_argument(name + ": damping must be a finite number > 0");
  if (cfg.block_size < 0) throw std::invalid_argument(name + ": GPTQ block size must be >= 0");
  if (cfg.quant.selector.method == Method::kOptFp32)
    throw std::invalid_argument(name +
                                ": opt-fp32 has no FP8 scales; it cannot be used with "
                                "GPTQ or written to a checkpoint");
  // The quantization config's one validation (quantize() repeats it after the Cholesky
  // factorization; a bad option is reported first).
  scalesweep::validate(cfg.quant);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      if (!std::isfinite(w[r * cols + c]))
        throw std::invalid_argument(name + ": weight element " + index_string(r, c) + " is " +
                                    (std::isnan(w[r * cols + c]) ? "NaN" : "Inf"));
  for (int64_t i = 0; i < cols; ++i) {
    for (int64_t j = i; j < cols; ++j)
      if (!std::isfinite(xtx[i * cols + j]))
        throw std::invalid_argument(name + ": Hessian element " + index_string(i, j) +
                                    " is not finite");
    if (xtx[i * cols + i] < 0)
      throw std::invalid_argument(name + ": Hessian diagonal element " + index_string(i, i) +
                                  " is negative");
  }
}

}  // namespace

double hessian_loss(const float* w, const float* w_hat, int64_t rows, int64_t cols,
                    const double* xtx, int64_t n_tokens) {
  const std::vector<double> h = symmetric_hessian(xtx, cols, 2.0 / static_cast<double>(n_tokens));
  std::vector<double> d(static_cast<size_t>(rows * cols)), dh(d.size());
  for (size_t i = 0; i < d.size(); ++i)
    d[i] = static_cast<double>(w[i]) - static_cast<double>(w_hat[i]);
  // dh = D * H (H symmetric)
  cblas_dsymm(CblasRowMajor, CblasRight, CblasUpper, static_cast<int>(rows), static_cast<int>(cols),
              1.0, h.data(), static_cast<int>(cols), d.data(), static_cast<int>(cols), 0.0,
              dh.data(), static_cast<int>(cols));
  double loss = 0;
  for (size_t i = 0; i < d.size(); ++i) loss += d[i] * dh[i];
  return loss;
}

QuantizedTensor gptq_quantize(const float* w, int64_t rows, int64_t cols, const double* xtx,
                              int64_t n_tokens, const GptqConfig& cfg, const std::string& name,
                              GptqStats* stats) {
  const auto t0 = std::chrono::steady_clock::now();
  validate(w, rows, cols, xtx, n_tokens, cfg, name);
  const int64_t k = cols, n = rows;
  const bool dynamic = cfg.scale_timing == ScaleTiming::kDynamic;

  // 1. H = 2/n XtX, dead columns.
  std::vector<double> h = symmetric_hessian(xtx, k, 2.0 / static_cast<double>(n_tokens));
  std::vector<float> w0(w, w + n * k);
  int64_t dead = 0;
  for (int64_t j = 0; j < k; ++j) {
    if (h[j * k + j] == 0.0) {
      ++dead;
      h[j * k + j] = 1.0;
      for (int64_t r = 0; r < n; ++r) w0[static_cast<size_t>(r * k + j)] = 0.0f;
    }
  }
  std::vector<double> diag(static_cast<size_t>(k));
  for (int64_t j = 0; j < k; ++j) diag[j] = h[j * k + j];
  // The block-Hessian methods read H's (undamped) diagonal blocks, statically and dynamically.
  std::vector<double> hb;
  if (method_uses_hessian(cfg.quant.selector.method))
    hb = block_hessians(h.data(), k, cfg.quant.block);

  // 2. Damping, 3. static order.
  const double mean_diag = std::accumulate(diag.begin(), diag.end(), 0.0) / static_cast<double>(k);
  const double damp_abs = cfg.damp * mean_diag;
  std::vector<int64_t> perm(static_cast<size_t>(k));
  std::iota(perm.begin(), perm.end(), int64_t{0});
  if (cfg.act_order)
    std::stable_sort(perm.begin(), perm.end(),
                     [&](int64_t a, int64_t b) { return diag[a] > diag[b]; });
  // Permuted, damped H (symmetric, so row- and column-major agree).
  std::vector<double> u(static_cast<size_t>(k * k));
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = 0; j < k; ++j) u[i * k + j] = h[perm[i] * k + perm[j]];
  for (int64_t i = 0; i < k; ++i) u[i * k + i] += damp_abs;
  h.clear();
  h.shrink_to_fit();

  // U = chol(H^-1)^T, upper, row-major. Column-major 'L' on the same bytes is row-major 'U':
  // potrf L gives H = L L^T; potri gives H^-1 (lower, col-major); potrf L again gives
  // H^-1 = L2 L2^T, i.e. row-major U = L2^T with H^-1 = U^T U.
  const lapack_int kk = static_cast<lapack_int>(k);
  lapack_int info = LAPACKE_dpotrf(LAPACK_COL_MAJOR, 'L', kk, u.data(), kk);
  if (info == 0) info = LAPACKE_dpotri(LAPACK_COL_MAJOR, 'L', kk, u.data(), kk);
  if (info == 0) info = LAPACKE_dpotrf(LAPACK_COL_MAJOR, 'L', kk, u.data(), kk);
  if (info != 0)
    throw std::runtime_error(name +
                             ": Cholesky factorization of the damped Hessian failed "
                             "(LAPACK info " +
                             std::to_string(info) +
                             "): the Hessian is not positive definite; increase the damping (" +
                             option_ref("damp") + ") or the number of calibration tokens");
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = 0; j < i; ++j) u[i * k + j] = 0.0;  // strictly lower: unused garbage

  // 4. Importance (static: H_jj; dynamic: as configured), the global scale and the RTN result
  // of the (dead-zeroed) original weight; static keeps its scales.
  std::vector<float> imp(static_cast<size_t>(k));
  for (int64_t j = 0; j < k; ++j) imp[j] = static_cast<float>(diag[j]);
  if (dynamic && cfg.importance == DynamicImportance::kObs)
    for (int64_t i = 0; i < k; ++i) {
      const double d = u[i * k + i];
      imp[static_cast<size_t>(perm[i])] = static_cast<float>(1.0 / (d * d));
    }
  const bool weighted = method_is_weighted(cfg.quant.selector.method);
  const bool hessian = method_uses_hessian(cfg.quant.selector.method);
  Importance importance;
  if (hessian) {
    importance = {ImportanceKind::kBlockHessian, nullptr, hb.data(), cfg.quant.block};
  } else if (weighted) {
    importance.kind = ImportanceKind::kPerColumn;
    importance.data = imp.data();
  }
  QuantizedTensor rtn = quantize(w0.data(), n, k, importance, cfg.quant, name);
  QuantizedTensor out = rtn;  // same global scale (and static: scales); codes rewritten below
  std::fill(out.codes.begin(), out.codes.end(), uint8_t{0});
  const int64_t bpr = out.blocks_per_row(), pc = out.packed_cols();
  const int block = out.block;
  const float gs = out.global_scale;
  std::vector<float> sval(out.scales.size());
  if (dynamic)
    std::fill(out.scales.begin(), out.scales.end(), uint8_t{0});  // chosen in the loop
  else
    for (size_t i = 0; i < sval.size(); ++i) sval[i] = scale_value(out, out.scales[i]);

  // Wt[i, r] = W0[r, perm[i]] in double: column i of the permuted W is contiguous.
  std::vector<double> wt(static_cast<size_t>(k * n));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = 0; i < k; ++i) wt[i * n + r] = static_cast<double>(w0[r * k + perm[i]]);

  const int bs = cfg.block_size > 0 ? cfg.block_size : static_cast<int>(k);
  std::vector<double> err(
      static_cast<size_t>((cfg.block_size > 0 ? std::min<int64_t>(bs, k) : 1) * n));

  // Dynamic selection state: the processing position of each column, which scale blocks are
  // chosen, the current values of a block's columns beyond the lazy batch.
  std::vector<int64_t> pos;
  std::vector<char> chosen;
  std::vector<double> ahead;
  SelectorConfig sel = cfg.quant.selector;
  sel.scale_format = scale_format_of(cfg.quant.format);
  int sel_threads = 1;
  if (dynamic) {
    pos.resize(static_cast<size_t>(k));
    for (int64_t i = 0; i < k; ++i) pos[static_cast<size_t>(perm[i])] = i;
    chosen.assign(static_cast<size_t>(bpr), 0);
    ahead.resize(static_cast<size_t>(block * n));
    sel_threads = static_cast<int>(
        std::clamp<int64_t>(n * block / 8192, 1, resolve_threads(cfg.quant.threads)));
  }
  // Chooses every row's scale of block `blk` when the loop reaches position i of the lazy
  // batch [i1, i2): the block's columns at positions < i2 are current in wt (the in-batch
  // updates are applied column by column); those at positions >= i2 lack the batch's update
  // from positions i1..i-1, subtracted here in order.
  auto choose_block = [&](int64_t blk, int64_t i, int64_t i1, int64_t i2) {
    const int64_t c0 = blk * block;
    const int nb = static_cast<int>(std::min<int64_t>(block, k - c0));
    const double* colv[64];
    for (int t = 0; t < nb; ++t) {
      const int64_t p = pos[static_cast<size_t>(c0 + t)];
      colv[t] = wt.data() + p * n;
      if (p >= i2 && i > i1) {
        double* a = ahead.data() + t * n;
        std::copy(colv[t], colv[t] + n, a);
        for (int64_t m = i1; m < i; ++m) {
          const double um = u[m * k + p];
          const double* em = err.data() + (m - i1) * n;
          for (int64_t r = 0; r < n; ++r) a[r] -= um * em[r];
        }
        colv[t] = a;
      }
    }
    const float* wb = weighted ? imp.data() + c0 : nullptr;
    parallel_for(n, sel_threads, [&](int64_t r0, int64_t r1, int) {
      float y[64];
      for (int64_t r = r0; r < r1; ++r) {
        for (int t = 0; t < nb; ++t) {
          const float x = static_cast<float>(std::clamp(colv[t][r], -kFloatMax, kFloatMax));
          y[t] = x * gs;
        }
        const uint8_t pattern =
            hessian ? select_block_scale_hessian(y, hb.data() + blk * block * block, block, nb, sel)
                          .pattern
                    : select_block_scale(y, wb, nb, sel).pattern;
        const size_t si = static_cast<size_t>(r * bpr + blk);
        out.scales[si] = pattern;
        sval[si] = scale_value(out, pattern);
      }
    });
  };

  const int nn = static_cast<int>(n);
  for (int64_t i1 = 0; i1 < k; i1 += bs) {
    const int64_t i2 = std::min<int64_t>(i1 + bs, k);
    for (int64_t i = i1; i < i2; ++i) {
      double* col = wt.data() + i * n;
      const int64_t c = perm[i];
      const int64_t blk = c / block;
      if (dynamic && !chosen[static_cast<size_t>(blk)]) {
        choose_block(blk, i, i1, i2);
        chosen[static_cast<size_t>(blk)] = 1;
      }
      const double d = u[i * k + i];
      double* e = err.data() + (cfg.block_size > 0 ? (i - i1) * n : 0);
      for (int64_t r = 0; r < n; ++r) {
        const float s = sval[static_cast<size_t>(r * bpr + blk)];
        const float x = static_cast<float>(col[r]);
        const float y = x * gs;
        const uint8_t code = fp4_code(y, s);
        const float deq = (format::kFp4Values.v[code] * s) / gs;
        set_nibble(out.codes, pc, r, c, code);
        e[r] = (col[r] - static_cast<double>(deq)) / d;
      }
      // Updates of the remaining columns of this block (all remaining columns when
      // unblocked): Wt[j, :] -= U[i, j] * e for j in (i, i2).
      const int64_t rest = (cfg.block_size > 0 ? i2 : k) - i - 1;
      if (rest > 0)
        cblas_dger(CblasRowMajor, static_cast<int>(rest), nn, -1.0, u.data() + i * k + i + 1, 1, e,
                   1, wt.data() + (i + 1) * n, nn);
    }
    // Lazy batch update of the columns after the block: Wt[i2:, :] -= U[i1:i2, i2:]^T Err.
    if (cfg.block_size > 0 && i2 < k)
      cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, static_cast<int>(k - i2), nn,
                  static_cast<int>(i2 - i1), -1.0, u.data() + i1 * k + i2, static_cast<int>(k),
                  err.data(), nn, 1.0, wt.data() + i2 * n, nn);
  }

  if (stats) {
    stats->dead_columns = dead;
    stats->damp_abs = damp_abs;
    if (cfg.compute_losses) {
      const std::vector<float> dq_g = dequant(out), dq_r = dequant(rtn);
      stats->loss_gptq = hessian_loss(w0.data(), dq_g.data(), n, k, xtx, n_tokens);
      stats->loss_rtn = hessian_loss(w0.data(), dq_r.data(), n, k, xtx, n_tokens);
    }
    stats->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  return out;
}

}  // namespace scalesweep::gptq
