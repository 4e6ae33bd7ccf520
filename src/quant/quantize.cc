// NVFP4 / MXFP4 tensor quantization: validation, global scale, the scalar reference row kernel,
// threading over row ranges, dequantization, opt-fp32 simulation and error metrics.
#include "scalesweep/quant/quantize.h"

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <exception>
#include <sstream>
#include <stdexcept>

#include "quant/row_job.h"
#include "quant/simd/kernels.h"
#include "scalesweep/base/option_error.h"
#include "scalesweep/base/parallel.h"
#include "scalesweep/format/minifloat.h"
#include "scalesweep/quant/index_string.h"

namespace scalesweep {

float load_element(const void* x, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kF32:
      return static_cast<const float*>(x)[i];
    case DType::kBF16:
      return format::bf16_to_f32(static_cast<const uint16_t*>(x)[i]);
    case DType::kF16:
      return format::f16_to_f32(static_cast<const uint16_t*>(x)[i]);
  }
  return 0;
}

namespace detail {

void load_block(const RowJob& job, int64_t r, int64_t c0, int n, float* y) {
  const int64_t base = r * job.cols + c0;
  const float gs = job.gs;
  switch (job.dtype) {
    case DType::kF32: {
      const float* x = static_cast<const float*>(job.x) + base;
      for (int i = 0; i < n; ++i) y[i] = x[i] * gs;
      break;
    }
    case DType::kBF16: {
      const uint16_t* x = static_cast<const uint16_t*>(job.x) + base;
      for (int i = 0; i < n; ++i) y[i] = format::bf16_to_f32(x[i]) * gs;
      break;
    }
    case DType::kF16: {
      const uint16_t* x = static_cast<const uint16_t*>(job.x) + base;
      for (int i = 0; i < n; ++i) y[i] = format::f16_to_f32(x[i]) * gs;
      break;
    }
  }
}

const float* block_weights(const RowJob& job, int64_t r, int64_t c0) {
  if (!job.imp) return nullptr;
  switch (job.imp_kind) {
    case ImportanceKind::kNone:
      return nullptr;
    case ImportanceKind::kPerColumn:
      return job.imp + c0;
    case ImportanceKind::kPerElement:
      return job.imp + r * job.cols + c0;
    case ImportanceKind::kBlockHessian:
      return nullptr;
  }
  return nullptr;
}

void quantize_rows_reference(const RowJob& job, int64_t r0, int64_t r1) {
  const int64_t nb = job.blocks_per_row(), pc = job.packed_cols();
  float y[64];
  uint8_t code[64];
  for (int64_t r = r0; r < r1; ++r) {
    uint8_t* crow = job.codes + r * pc;
    uint8_t* srow = job.scales + r * nb;
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t c0 = b * job.block;
      const int n = static_cast<int>(std::min<int64_t>(job.block, job.cols - c0));
      load_block(job, r, c0, n, y);
      const BlockScale bs =
          job.hessian ? select_block_scale_hessian(y, job.hessian + b * job.block * job.block,
                                                   job.block, n, job.selector)
                      : select_block_scale(y, block_weights(job, r, c0), n, job.selector);
      srow[b] = bs.pattern;
      const float s = scale_value(bs.pattern, job.selector.scale_format);
      for (int i = 0; i < n; ++i) code[i] = fp4_code(y[i], s);
      // c0 is even (block is even), so pairs never straddle blocks.
      for (int i = 0; i < n; i += 2) {
        const uint8_t hi = i + 1 < n ? code[i + 1] : 0;
        crow[(c0 + i) / 2] = static_cast<uint8_t>(code[i] | (hi << 4));
      }
    }
  }
}

}  // namespace detail

namespace {

std::string idx_str(int64_t r, int64_t c) { return index_string(r, c); }

std::string col_str(int64_t c) {
  std::ostringstream os;
  os << '[' << c << ']';
  return os.str();
}

std::string fmt_float(double v) {
  std::ostringstream os;
  os.precision(9);
  os << v;
  return os.str();
}

void validate_options(const QuantConfig& cfg, int64_t rows, int64_t cols, const std::string& name) {
  if (rows <= 0 || cols <= 0)
    throw std::invalid_argument("tensor '" + name + "': empty shape [" + std::to_string(rows) +
                                ", " + std::to_string(cols) + "]; need a non-empty 2-D tensor");
  validate(cfg);
}

// The block-Hessian importance: the methods that need it have it, the others are not given it;
// entries finite, diagonals >= 0.
void validate_hessian(const Importance& imp, Method m, int64_t cols, int block,
                      const std::string& name) {
  const bool given = imp.kind == ImportanceKind::kBlockHessian;
  if (method_uses_hessian(m) && !given)
    throw std::invalid_argument("tensor '" + name + "': method '" +
                                std::string(kMethodNames.name(m)) +
                                "' needs the block Hessians of the input (calibration ΣxxT); "
                                "none given");
  if (!given) return;
  if (!method_uses_hessian(m))
    throw std::invalid_argument("tensor '" + name + "': block-Hessian importance is read by the " +
                                "*-hessian methods only, not by '" +
                                std::string(kMethodNames.name(m)) + "'");
  if (!imp.hessian)
    throw std::invalid_argument("importance of '" + name + "': kind set but no data");
  if (imp.block != block)
    throw std::invalid_argument("block Hessian of '" + name + "': built for blocks of " +
                                std::to_string(imp.block) + ", the quantization uses " +
                                std::to_string(block));
  const int64_t nb = (cols + block - 1) / block;
  for (int64_t b = 0; b < nb; ++b)
    for (int i = 0; i < block; ++i)
      for (int j = 0; j < block; ++j) {
        const double v = imp.hessian[(b * block + i) * block + j];
        if (std::isfinite(v) && (i != j || v >= 0)) continue;
        throw std::invalid_argument("block Hessian of '" + name + "': block " + col_str(b) +
                                    " element " + idx_str(i, j) + " is " +
                                    (std::isfinite(v)
                                         ? "negative on the diagonal (" + fmt_float(v) + ")"
                                         : std::string("not finite")) +
                                    "; it must be finite with a non-negative diagonal");
      }
}

void validate_importance(const Importance& imp, int64_t rows, int64_t cols,
                         const std::string& name) {
  if (imp.kind == ImportanceKind::kNone || imp.kind == ImportanceKind::kBlockHessian) return;
  if (!imp.data) throw std::invalid_argument("importance of '" + name + "': kind set but no data");
  const int64_t n = imp.kind == ImportanceKind::kPerColumn ? cols : rows * cols;
  for (int64_t i = 0; i < n; ++i) {
    const float v = imp.data[i];
    if (std::isfinite(v) && v >= 0.0f) continue;
    const std::string where =
        imp.kind == ImportanceKind::kPerColumn ? col_str(i) : idx_str(i / cols, i % cols);
    const std::string what = std::isnan(v)   ? "NaN"
                             : std::isinf(v) ? "infinite"
                                             : "negative (" + fmt_float(v) + ")";
    throw std::invalid_argument("importance of '" + name + "': element " + where + " is " + what +
                                "; importance must be finite and >= 0");
  }
}

// Finite check (first bad index in row-major order) and amax.
// threads > 0: SIMD scan first (src/quant/simd), the scalar loop only to report a bad element.
float scan_input(const void* x, DType dtype, int64_t rows, int64_t cols, const std::string& name,
                 int threads = 0) {
  if (!x) throw std::invalid_argument("tensor '" + name + "': no data");
  float fast_amax = 0;
  if (threads > 0 && simd::scan_finite_amax(x, dtype, rows * cols, threads, &fast_amax))
    return fast_amax;
  float amax = 0;
  const int64_t n = rows * cols;
  for (int64_t i = 0; i < n; ++i) {
    const float v = load_element(x, dtype, i);
    if (!std::isfinite(v))
      throw std::invalid_argument("tensor '" + name + "': element " + idx_str(i / cols, i % cols) +
                                  " is " + (std::isnan(v) ? "NaN" : "infinite") +
                                  "; the input must be finite");
    amax = std::max(amax, std::fabs(v));
  }
  return amax;
}

float compute_gs(float amax, const QuantConfig& cfg, const std::string& name) {
  if (cfg.format == TensorFormat::kMxfp4) return 1.0f;
  float gs;
  if (cfg.global_scale) {
    gs = *cfg.global_scale;
    // Keeps the float contract loss finite (|y| <= 2^48; y beyond 6 * 448 saturates anyway).
    if (!(amax * gs <= 0x1p48f))
      throw std::invalid_argument("tensor '" + name + "': global scale " + fmt_float(gs) +
                                  " times amax " + fmt_float(amax) +
                                  " exceeds 2^48; the global scale is far too large");
  } else {
    gs = global_scale_for_amax(
        amax, cfg.max_block_scale.value_or(default_max_block_scale(cfg.selector.method)));
  }
  return gs;
}

int thread_count(const QuantConfig& cfg, int64_t rows, int64_t cols) {
  const int t = resolve_threads(cfg.threads);
  const int64_t by_work = std::max<int64_t>(1, rows * cols / 8192);
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>({t, rows, by_work})));
}

// Runs fn(r0, r1) over contiguous row ranges on `threads` threads (each row is processed by
// exactly one call, so results do not depend on the split; base/parallel.h).
template <class Fn>
void parallel_rows(int64_t rows, int threads, Fn&& fn) {
  parallel_for(rows, threads, [&](int64_t r0, int64_t r1, int) { fn(r0, r1); });
}

struct Prepared {
  float gs = 1;
  detail::RowJob job;
};

// The per-rows job of a validated call (shared by the computed- and given-scale paths).
void fill_job(detail::RowJob& j, const void* x, DType dtype, int64_t rows, int64_t cols,
              const Importance& imp, const QuantConfig& cfg, float gs) {
  j.x = x;
  j.dtype = dtype;
  j.rows = rows;
  j.cols = cols;
  j.block = cfg.block;
  j.format = cfg.format;
  j.gs = gs;
  j.selector = cfg.selector;
  // The tensor format decides the scale format (selector.scale_format is not consulted).
  j.selector.scale_format = scale_format_of(cfg.format);
  if (imp.kind == ImportanceKind::kBlockHessian) {
    j.imp_kind = imp.kind;
    j.hessian = imp.hessian;
  } else if (method_uses_weights(cfg.selector.method) && imp.kind != ImportanceKind::kNone) {
    j.imp_kind = imp.kind;
    j.imp = imp.data;
  }
}

Prepared prepare(const void* x, DType dtype, int64_t rows, int64_t cols, const Importance& imp,
                 const QuantConfig& cfg, const std::string& name) {
  validate_options(cfg, rows, cols, name);
  validate_importance(imp, rows, cols, name);
  validate_hessian(imp, cfg.selector.method, cols, cfg.block, name);
  const float amax = scan_input(x, dtype, rows, cols, name,
                                cfg.reference_only ? 0 : thread_count(cfg, rows, cols));
  Prepared p;
  p.gs = compute_gs(amax, cfg, name);
  fill_job(p.job, x, dtype, rows, cols, imp, cfg, p.gs);
  return p;
}

}  // namespace

void detail::check_importance(const Importance& imp, int64_t rows, int64_t cols,
                              const std::string& name) {
  validate_importance(imp, rows, cols, name);
}

void check_block(TensorFormat f, int block) {
  if (block != 8 && block != 16 && block != 32 && block != 64)
    throw OptionError("block", "block size " + std::to_string(block) +
                                   " is not supported (accepted: 8, 16, 32, 64)");
  if (f == TensorFormat::kMxfp4 && block != 32)
    throw OptionError("block", "MXFP4 requires block 32 (got " + std::to_string(block) + ")");
}

void check_max_block_scale(float c) {
  if (!(c > 0.0f && c <= 448.0f))
    throw OptionError("max_block_scale",
                      "C must satisfy 0 < C <= 448 (the largest FP8 E4M3 value)");
}

void check_global_scale(float gs) {
  if (!(gs > 0.0f && std::isfinite(gs)))
    throw OptionError("global_scale", "must be a finite value > 0 (got " + fmt_float(gs) + ")");
}

namespace {

void validate_scales(const QuantConfig& cfg) {
  if (cfg.max_block_scale) check_max_block_scale(*cfg.max_block_scale);
  if (cfg.global_scale) check_global_scale(*cfg.global_scale);
  if (cfg.global_scale && cfg.max_block_scale)
    throw OptionError("global_scale", "the max block scale also sets the global scale; give one");
  if (cfg.format == TensorFormat::kMxfp4 && (cfg.global_scale || cfg.max_block_scale))
    throw OptionError(cfg.global_scale ? "global_scale" : "max_block_scale",
                      "MXFP4 has no global scale; it does not apply");
}

void validate_window(const QuantConfig& cfg) {
  const Method m = cfg.selector.method;
  if (m == Method::kSweep && !cfg.selector.window)
    throw OptionError("window",
                      "method sweep needs a window L,R (offsets around the base scale pattern, "
                      "e.g. -3,7)");
  if (!cfg.selector.window) return;
  if (m != Method::kSweep && m != Method::kSweepMse && m != Method::kSweepWmse)
    throw OptionError("window", "applies only to sweep, sweep-mse and sweep-wmse");
  check_window(*cfg.selector.window, scale_format_of(cfg.format), "window");
}

}  // namespace

void validate(const QuantConfig& cfg) {
  check_block(cfg.format, cfg.block);
  validate_scales(cfg);
  validate_window(cfg);
  check_threads(cfg.threads);
}

float default_max_block_scale(Method m) { return m == Method::kAbsMax ? 448.0f : 256.0f; }

float global_scale_for_amax(float amax, float max_block_scale) {
  // An Inf amax gave gs = 0 and a NaN amax gs = 1, silently: refused.
  if (!std::isfinite(amax) || amax < 0.0f)
    throw std::invalid_argument("global scale: amax " + fmt_float(amax) +
                                " is not a finite value >= 0");
  if (amax == 0.0f) return 1.0f;  // all zero: any gs works; 1 keeps 1/gs finite
  const float six_c = 6.0f * max_block_scale;
  const float gs = six_c / amax;
  if (!std::isfinite(gs)) return FLT_MAX;  // tiny amax: 6C/amax overflows
  // Huge amax: a search may pick any E4M3 scale up to 448 (above C), so the largest code
  // times scale, 6 * 448, must decode to a finite value: gs >= the smallest such float.
  static const float kMinGs = [] {
    float g = 2688.0f / FLT_MAX;
    while (!std::isfinite(2688.0f / g)) g = std::nextafter(g, FLT_MAX);
    return g;
  }();
  return std::max(gs, kMinGs);
}

float resolve_global_scale(const void* x, DType dtype, int64_t rows, int64_t cols,
                           const QuantConfig& cfg, const std::string& name) {
  validate_options(cfg, rows, cols, name);
  const int threads = cfg.reference_only ? 0 : thread_count(cfg, rows, cols);  // 0: scalar scan
  return compute_gs(scan_input(x, dtype, rows, cols, name, threads), cfg, name);
}

void quantize_into(const void* x, DType dtype, int64_t rows, int64_t cols, const Importance& imp,
                   const QuantConfig& cfg, QuantizedTensor& out, const std::string& name) {
  if (cfg.selector.method == Method::kOptFp32)
    throw std::invalid_argument(
        "opt-fp32 is a continuous lower bound with no FP8 block scales; it has no packed "
        "output (use fake_quantize / " +
        option_ref("dequant") + " metrics)");
  const auto shape_out = [&](float gs) {
    out.format = cfg.format;
    out.rows = rows;
    out.cols = cols;
    out.block = cfg.block;
    out.global_scale = gs;
    // resize keeps the capacity; the row kernels overwrite every byte
    out.codes.resize(static_cast<size_t>(rows * out.packed_cols()));
    out.scales.resize(static_cast<size_t>(rows * out.blocks_per_row()));
  };
  const bool ref = cfg.reference_only;
  const int threads = thread_count(cfg, rows, cols);
  // Given global scale (NVFP4, fast path): no separate input scan; the row kernels check
  // |fl(x * gs)| <= 2^48, which fails exactly when scan_input or compute_gs would throw.
  if (cfg.global_scale && !ref && cfg.format == TensorFormat::kNvfp4 && x != nullptr) {
    validate_options(cfg, rows, cols, name);
    validate_importance(imp, rows, cols, name);
    validate_hessian(imp, cfg.selector.method, cols, cfg.block, name);
    Prepared p;
    p.gs = *cfg.global_scale;
    detail::RowJob& j = p.job;
    fill_job(j, x, dtype, rows, cols, imp, cfg, p.gs);  // NVFP4 here: E4M3 scales
    shape_out(p.gs);
    j.codes = out.codes.data();
    j.scales = out.scales.data();
    std::atomic<bool> fail{false};  // unhandled job or a violation in some range
    parallel_rows(rows, threads, [&](int64_t r0, int64_t r1) {
      bool b = false;
      if (!simd::quantize_rows_checked(j, r0, r1, &b) || b) fail = true;
    });
    const bool all_ok = !fail;
    if (all_ok) return;
    // A violation (the checked scan below throws the precise error) or a job the fast path
    // does not handle: the general path.
  }
  Prepared p = prepare(x, dtype, rows, cols, imp, cfg, name);
  shape_out(p.gs);
  p.job.codes = out.codes.data();
  p.job.scales = out.scales.data();
  const detail::RowJob& job = p.job;
  parallel_rows(rows, threads, [&](int64_t r0, int64_t r1) {
    if (ref || !simd::quantize_rows(job, r0, r1)) detail::quantize_rows_reference(job, r0, r1);
  });
}

QuantizedTensor quantize(const void* x, DType dtype, int64_t rows, int64_t cols,
                         const Importance& imp, const QuantConfig& cfg, const std::string& name) {
  QuantizedTensor q;
  quantize_into(x, dtype, rows, cols, imp, cfg, q, name);
  return q;
}

QuantizedTensor quantize(const float* x, int64_t rows, int64_t cols, const Importance& imp,
                         const QuantConfig& cfg, const std::string& name) {
  return quantize(static_cast<const void*>(x), DType::kF32, rows, cols, imp, cfg, name);
}

std::vector<float> dequantize(const QuantizedTensor& q) {
  const int64_t nb = q.blocks_per_row(), pc = q.packed_cols();
  if (q.rows < 0 || q.cols < 0 || static_cast<int64_t>(q.codes.size()) != q.rows * pc ||
      static_cast<int64_t>(q.scales.size()) != q.rows * nb)
    throw std::invalid_argument("dequantize: codes/scales sizes do not match the shape");
  const ScaleFormat sf = scale_format_of(q.format);
  std::vector<float> out(static_cast<size_t>(q.rows * q.cols));
  const float gs = q.global_scale;
  for (int64_t r = 0; r < q.rows; ++r) {
    for (int64_t c = 0; c < q.cols; ++c) {
      const uint8_t byte = q.codes[r * pc + c / 2];
      const uint8_t code = (c & 1) ? (byte >> 4) : (byte & 15);
      const float s = scale_value(q.scales[r * nb + c / q.block], sf);
      const float qs = format::kFp4Values.v[code] * s;  // exact
      // Saturates: an MXFP4 scale up to 2^127 (or a tiny given gs) can put 6 * s / gs past
      // FLT_MAX; the value is finite in the format, so the nearest float is FLT_MAX.
      out[r * q.cols + c] = std::clamp(gs == 1.0f ? qs : qs / gs, -FLT_MAX, FLT_MAX);
    }
  }
  return out;
}

std::vector<float> fake_quantize(const void* x, DType dtype, int64_t rows, int64_t cols,
                                 const Importance& imp, const QuantConfig& cfg,
                                 const std::string& name) {
  if (cfg.selector.method != Method::kOptFp32)
    return dequantize(quantize(x, dtype, rows, cols, imp, cfg, name));
  // opt-fp32: every block at its exact continuous optimum (double), weighted when given.
  Prepared p = prepare(x, dtype, rows, cols, imp, cfg, name);
  std::vector<float> out(static_cast<size_t>(rows * cols));
  const detail::RowJob& job = p.job;
  const double gs = p.gs;
  parallel_rows(rows, thread_count(cfg, rows, cols), [&](int64_t r0, int64_t r1) {
    float y[64];
    const int64_t nb = job.blocks_per_row();
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t b = 0; b < nb; ++b) {
        const int64_t c0 = b * job.block;
        const int n = static_cast<int>(std::min<int64_t>(job.block, cols - c0));
        detail::load_block(job, r, c0, n, y);
        const double s = opt_fp32_scale(y, detail::block_weights(job, r, c0), n);
        for (int i = 0; i < n; ++i) {
          double v = 0;
          if (s > 0) {
            const double ay = std::fabs(static_cast<double>(y[i]));
            const double qd = ay / s;
            const int idx = (qd > 0.25) + (qd >= 0.75) + (qd > 1.25) + (qd >= 1.75) + (qd > 2.5) +
                            (qd >= 3.5) + (qd > 5.0);
            v = static_cast<double>(format::kFp4Values.v[idx]) * s / gs;
          }
          v = std::min(v, static_cast<double>(FLT_MAX));  // saturates, as dequantize() does
          out[r * cols + c0 + i] = static_cast<float>(std::signbit(y[i]) ? -v : v);
        }
      }
    }
  });
  return out;
}

std::vector<float> fake_quantize(const float* x, int64_t rows, int64_t cols, const Importance& imp,
                                 const QuantConfig& cfg, const std::string& name) {
  return fake_quantize(static_cast<const void*>(x), DType::kF32, rows, cols, imp, cfg, name);
}

std::vector<double> block_hessians(const double* h, int64_t k, int block, double scale) {
  if (k <= 0 || block <= 0 || !h)
    throw std::invalid_argument("block_hessians: needs a [k, k] matrix with k > 0 and a block > 0");
  const int64_t nb = (k + block - 1) / block;
  std::vector<double> out(static_cast<size_t>(nb * block * block), 0.0);
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t c0 = b * block;
    const int n = static_cast<int>(std::min<int64_t>(block, k - c0));
    double* o = out.data() + b * block * block;
    for (int i = 0; i < n; ++i)
      for (int j = i; j < n; ++j) {
        const double v = scale * h[(c0 + i) * k + c0 + j];
        o[i * block + j] = v;
        o[j * block + i] = v;
      }
  }
  return out;
}

std::vector<double> diagonal_block_hessians(const float* w, int64_t k, int block) {
  if (k <= 0 || block <= 0 || !w)
    throw std::invalid_argument("diagonal_block_hessians: needs k > 0 weights and a block > 0");
  std::vector<double> out(static_cast<size_t>((k + block - 1) / block * block * block), 0.0);
  for (int64_t c = 0; c < k; ++c)
    out[static_cast<size_t>((c / block) * block * block + (c % block) * (block + 1))] = w[c];
  return out;
}

ErrorMetrics error_metrics(const void* x, DType dtype, const float* xhat, int64_t rows,
                           int64_t cols, const Importance& imp) {
  double num = 0, den = 0, wnum = 0, wden = 0;
  if (imp.kind == ImportanceKind::kBlockHessian) {
    const int B = imp.block;
    std::vector<double> d(static_cast<size_t>(B)), v(static_cast<size_t>(B));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c0 = 0; c0 < cols; c0 += B) {
        const int n = static_cast<int>(std::min<int64_t>(B, cols - c0));
        const double* h = imp.hessian + (c0 / B) * B * B;
        for (int i = 0; i < n; ++i) {
          v[i] = load_element(x, dtype, r * cols + c0 + i);
          d[i] = v[i] - static_cast<double>(xhat[r * cols + c0 + i]);
          num += d[i] * d[i];
          den += v[i] * v[i];
        }
        for (int i = 0; i < n; ++i)
          for (int j = 0; j < n; ++j) {
            wnum += d[i] * h[i * B + j] * d[j];
            wden += v[i] * h[i * B + j] * v[j];
          }
      }
    ErrorMetrics m;
    m.nmse = den > 0 ? num / den : 0.0;
    m.nwmse = wden > 0 ? wnum / wden : 0.0;
    return m;
  }
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t i = r * cols + c;
      const double v = load_element(x, dtype, i);
      const double d = v - static_cast<double>(xhat[i]);
      num += d * d;
      den += v * v;
      double w = 1;
      if (imp.kind == ImportanceKind::kPerColumn)
        w = imp.data[c];
      else if (imp.kind == ImportanceKind::kPerElement)
        w = imp.data[i];
      wnum += w * d * d;
      wden += w * v * v;
    }
  }
  ErrorMetrics m;
  m.nmse = den > 0 ? num / den : 0.0;
  m.nwmse = wden > 0 ? wnum / wden : 0.0;
  return m;
}

ErrorMetrics error_metrics(const float* x, const float* xhat, int64_t rows, int64_t cols,
                           const Importance& imp) {
  return error_metrics(static_cast<const void*>(x), DType::kF32, xhat, rows, cols, imp);
}

double gap_percent(double err, double err_opt) {
  if (err_opt == 0) return err == 0 ? 0.0 : INFINITY;
  return 100.0 * (err - err_opt) / err_opt;
}

}  // namespace scalesweep
