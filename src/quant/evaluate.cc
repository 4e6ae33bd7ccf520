// The evaluation API (include/scalesweep/quant/evaluate.h): method runs, opt-fp32 references,
// gaps and per-block losses, in terms of quantize / fake_quantize / error_metrics.
#include "scalesweep/quant/evaluate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>

#include "quant/row_job.h"

namespace scalesweep {

namespace {

// A job over x for the per-block loops (load_block / block_weights).
detail::RowJob block_job(const TensorRef& x, const Importance& imp, Method method,
                         TensorFormat format, int block, float gs) {
  detail::RowJob job;
  job.x = x.data;
  job.dtype = x.dtype;
  job.rows = x.rows;
  job.cols = x.cols;
  job.block = block;
  job.format = format;
  job.gs = gs;
  job.selector.method = method;
  job.selector.scale_format = scale_format_of(format);
  if (method_uses_weights(method) && imp.kind != ImportanceKind::kNone) {
    job.imp_kind = imp.kind;
    job.imp = imp.data;
  }
  return job;
}

// Calls fn(r, b, c0, n, y, w) for every block of the job, in row-major block order.
template <class Fn>
void for_each_block(const detail::RowJob& job, Fn&& fn) {
  const int64_t nb = job.blocks_per_row();
  float y[64];
  for (int64_t r = 0; r < job.rows; ++r) {
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t c0 = b * job.block;
      const int n = static_cast<int>(std::min<int64_t>(job.block, job.cols - c0));
      detail::load_block(job, r, c0, n, y);
      fn(r * nb + b, n, static_cast<const float*>(y), detail::block_weights(job, r, c0));
    }
  }
}

}  // namespace

MethodRun run_method(const TensorRef& x, const Importance& imp, const QuantConfig& cfg,
                     const std::string& name, const Importance& metric_imp) {
  MethodRun r;
  r.method = cfg.selector.method;
  const auto t0 = std::chrono::steady_clock::now();
  if (r.method == Method::kOptFp32) {
    r.xhat = fake_quantize(x.data, x.dtype, x.rows, x.cols, imp, cfg, name);
    r.global_scale = resolve_global_scale(x.data, x.dtype, x.rows, x.cols, cfg, name);
  } else {
    r.q = quantize(x.data, x.dtype, x.rows, x.cols, imp, cfg, name);
    r.xhat = dequantize(*r.q);
    r.global_scale = r.q->global_scale;
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.err = error_metrics(x.data, x.dtype, r.xhat.data(), x.rows, x.cols, metric_imp);
  return r;
}

MethodRun run_method(const TensorRef& x, const Importance& imp, const QuantConfig& cfg,
                     const std::string& name) {
  return run_method(x, imp, cfg, name, imp);
}

OptFp32Refs opt_fp32_refs(const TensorRef& x, const Importance& imp, const QuantConfig& cfg,
                          const std::string& name, const std::function<void()>& step) {
  QuantConfig oc = cfg;
  oc.selector.window.reset();  // a sweep window does not apply to opt-fp32
  oc.selector.method = Method::kOptFp32;
  OptFp32Refs o;
  o.plain = run_method(x, Importance{}, oc, name, imp);
  o.plain.xhat = {};
  if (step) step();
  if (imp.kind == ImportanceKind::kNone) {
    o.weighted = o.plain;
  } else {
    o.weighted = run_method(x, imp, oc, name, imp);
    o.weighted.xhat = {};
    if (step) step();
  }
  return o;
}

Gaps gaps_to_opt(const ErrorMetrics& err, const OptFp32Refs& opt, Method m, bool has_importance) {
  Gaps g;
  g.nmse_pct = gap_percent(err.nmse, opt.nmse());
  g.nwmse_pct = gap_percent(err.nwmse, opt.nwmse());
  g.own_pct =
      has_importance && (method_is_weighted(m) || m == Method::kSweep) ? g.nwmse_pct : g.nmse_pct;
  return g;
}

Evaluation evaluate(const TensorRef& x, const Importance& imp, const QuantConfig& cfg,
                    const std::string& name, const std::function<void()>& step) {
  Evaluation e;
  e.run = run_method(x, imp, cfg, name);
  if (step) step();
  e.opt = opt_fp32_refs(x, imp, cfg, name, step);
  e.gaps = gaps_to_opt(e.run.err, e.opt, cfg.selector.method, imp.kind != ImportanceKind::kNone);
  return e;
}

std::vector<double> block_losses(const TensorRef& x, const Importance& imp, Method method,
                                 const QuantizedTensor& q) {
  if (q.rows != x.rows || q.cols != x.cols)
    throw std::invalid_argument("block_losses: quantized tensor [" + std::to_string(q.rows) + ", " +
                                std::to_string(q.cols) + "] does not match the source [" +
                                std::to_string(x.rows) + ", " + std::to_string(x.cols) + "]");
  if (static_cast<int64_t>(q.scales.size()) != q.rows * q.blocks_per_row())
    throw std::invalid_argument("block_losses: " + std::to_string(q.scales.size()) +
                                " scales do not match the shape (" +
                                std::to_string(q.rows * q.blocks_per_row()) + " blocks)");
  const detail::RowJob job = block_job(x, imp, method, q.format, q.block, q.global_scale);
  const ScaleFormat sf = job.selector.scale_format;
  std::vector<double> out(q.scales.size());
  const bool hess = method_uses_hessian(method);
  if (hess && (imp.kind != ImportanceKind::kBlockHessian || imp.block != q.block || !imp.hessian))
    throw std::invalid_argument("block_losses: method '" + std::string(kMethodNames.name(method)) +
                                "' needs the block Hessians it quantized with");
  const int64_t nb = q.blocks_per_row(), bb = int64_t{q.block} * q.block;
  for_each_block(job, [&](int64_t i, int n, const float* y, const float* w) {
    const int p = q.scales[static_cast<size_t>(i)];
    out[static_cast<size_t>(i)] =
        hess ? hessian_loss(y, imp.hessian + (i % nb) * bb, q.block, n, p, sf)
             : contract_loss(y, w, n, p, sf);
  });
  return out;
}

std::vector<double> opt_fp32_block_scales(const TensorRef& x, const Importance& imp,
                                          const QuantConfig& cfg, const std::string& name) {
  QuantConfig oc = cfg;
  oc.selector.window.reset();
  oc.selector.method = Method::kOptFp32;
  const float gs = resolve_global_scale(x.data, x.dtype, x.rows, x.cols, oc, name);
  detail::check_importance(imp, x.rows, x.cols, name);
  const detail::RowJob job = block_job(x, imp, Method::kOptFp32, oc.format, oc.block, gs);
  std::vector<double> out(static_cast<size_t>(x.rows * job.blocks_per_row()));
  for_each_block(job, [&](int64_t i, int n, const float* y, const float* w) {
    out[static_cast<size_t>(i)] = opt_fp32_scale(y, w, n);
  });
  return out;
}

std::vector<float> global_scale_candidates(float amax, const QuantConfig& cfg, int steps) {
  if (steps < 1)
    throw std::invalid_argument("global-scale search: steps must be >= 1 (got " +
                                std::to_string(steps) + ")");
  const float c_rule = cfg.max_block_scale.value_or(default_max_block_scale(cfg.selector.method));
  std::vector<float> out{global_scale_for_amax(amax, c_rule)};
  for (int k = 0; k < steps; ++k) {
    const float c = static_cast<float>(448.0 * std::exp2(-static_cast<double>(k) / steps));
    const float gs = global_scale_for_amax(amax, c);
    if (std::find(out.begin(), out.end(), gs) == out.end()) out.push_back(gs);
  }
  return out;
}

GlobalScaleSearch search_global_scale(const std::vector<GlobalScaleMember>& members,
                                      const QuantConfig& cfg, int steps) {
  if (cfg.format != TensorFormat::kNvfp4)
    throw std::invalid_argument("global-scale search: only NVFP4 has a global scale");
  if (members.empty()) throw std::invalid_argument("global-scale search: no tensors");
  float amax = 0;
  for (const GlobalScaleMember& m : members) {
    QuantConfig probe = cfg;
    probe.global_scale.reset();
    // The rule's scale of the member alone gives its amax back: validates and scans it.
    const float gs = resolve_global_scale(m.x.data, m.x.dtype, m.x.rows, m.x.cols, probe, m.name);
    (void)gs;
    for (int64_t i = 0; i < m.x.rows * m.x.cols; ++i)
      amax = std::max(amax, std::fabs(load_element(m.x.data, m.x.dtype, i)));
  }
  GlobalScaleSearch r;
  r.candidates = global_scale_candidates(amax, cfg, steps);
  for (size_t c = 0; c < r.candidates.size(); ++c) {
    QuantConfig qc = cfg;
    qc.global_scale = r.candidates[c];
    qc.max_block_scale.reset();
    const double g = r.candidates[c];
    double total = 0;
    for (const GlobalScaleMember& m : members) {
      const QuantizedTensor q =
          quantize(m.x.data, m.x.dtype, m.x.rows, m.x.cols, m.imp, qc, m.name);
      for (double l : block_losses(m.x, m.imp, cfg.selector.method, q)) total += l;
    }
    r.objective.push_back(total / (g * g));
    if (r.objective[c] < r.objective[static_cast<size_t>(r.best)]) r.best = static_cast<int>(c);
  }
  r.global_scale = r.candidates[static_cast<size_t>(r.best)];
  return r;
}

}  // namespace scalesweep
