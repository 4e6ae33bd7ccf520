// Error metrics in Python: error_metrics, evaluate (the figures of `scalesweep tensor
// --json`), gap_percent and the global-scale rule (quant/evaluate.h).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "python/bindings.h"
#include "python/quantized.h"
#include "python/tensor_args.h"
#include "scalesweep/quant/evaluate.h"
#include "scalesweep/quant/index_string.h"
#include "scalesweep/scale/selector.h"

namespace scalesweep::python {
namespace {

py::dict error_metrics_py(const py::handle& xo, const py::handle& xhat_o,
                          const py::handle& importance) {
  const Tensor2D x = tensor_arg(xo, "x");
  py::object xh_keep;
  const float* xh_data = nullptr;
  if (is_dlpack(xhat_o)) {
    Borrowed b = borrow_dlpack(py::reinterpret_borrow<py::object>(xhat_o), "xhat");
    if (!(b.dtype.code == dl::kFloat && b.dtype.bits == 32 && b.dtype.lanes == 1)) {
      throw py::type_error("xhat: dtype " + b.dtype_name +
                           " is not supported; use float32 (what dequantize returns)");
    }
    if (b.shape != std::vector<int64_t>{x.rows, x.cols}) {
      throw py::value_error("xhat: shape " + shape_str(b.shape) + " does not match x of shape (" +
                            std::to_string(x.rows) + ", " + std::to_string(x.cols) + ")");
    }
    xh_keep = b.owner;
    xh_data = static_cast<const float*>(b.data);
  } else {
    py::array xh = require_array(xhat_o, "xhat");
    if (!(dt_kind(xh.dtype()) == 'f' && dt_itemsize(xh.dtype()) == 4)) {
      throw py::type_error("xhat: dtype " + dtype_str(xh.dtype()) +
                           " is not supported; use float32 (what dequantize returns)");
    }
    if (xh.ndim() != 2 || xh.shape(0) != x.rows || xh.shape(1) != x.cols) {
      throw py::value_error("xhat: shape " + shape_str(xh) + " does not match x of shape (" +
                            std::to_string(x.rows) + ", " + std::to_string(x.cols) + ")");
    }
    xh_keep = xh;
    xh_data = static_cast<const float*>(xh.data());
  }
  const ImportanceArg ia = importance_arg(importance, x);
  if (ia.imp.kind != ImportanceKind::kNone && ia.imp.kind != ImportanceKind::kBlockHessian) {
    // error_metrics() does not validate; the same check (and message) as quantize().
    const int64_t n = ia.imp.kind == ImportanceKind::kPerColumn ? x.cols : x.rows * x.cols;
    for (int64_t i = 0; i < n; ++i) {
      const float v = ia.imp.data[i];
      if (std::isfinite(v) && v >= 0.0f) continue;
      const std::string where = ia.imp.kind == ImportanceKind::kPerColumn
                                    ? "[" + std::to_string(i) + "]"
                                    : index_string(i / x.cols, i % x.cols);
      throw py::value_error("importance: element " + where + " is " +
                            (std::isnan(v)   ? std::string("NaN")
                             : std::isinf(v) ? std::string("infinite")
                                             : "negative (" + std::to_string(v) + ")") +
                            "; importance must be finite and >= 0");
    }
  }
  ErrorMetrics m;
  {
    py::gil_scoped_release nogil;
    // Finite inputs (the library's scan and message, "tensor 'x': element [r, c] is NaN").
    resolve_global_scale(x.data, x.dtype, x.rows, x.cols, QuantConfig{}, "x");
    resolve_global_scale(xh_data, DType::kF32, x.rows, x.cols, QuantConfig{}, "xhat");
    m = error_metrics(x.data, x.dtype, xh_data, x.rows, x.cols, ia.imp);
  }
  py::dict d;
  d["nmse"] = m.nmse;
  d["nwmse"] = m.nwmse;
  return d;
}

// One method on one tensor with the gaps to the exact continuous optimum, the figures of
// `scalesweep tensor --json` (same library calls in the same order).
py::dict evaluate_py(const py::handle& xo, const std::string& method, int block,
                     const std::string& format, std::optional<float> global_scale,
                     std::optional<float> max_block_scale, const py::handle& importance,
                     std::optional<std::pair<int, int>> window, int threads,
                     const std::string& name) {
  const Tensor2D x = tensor_arg(xo, "x");
  const ImportanceArg ia = importance_arg(importance, x);
  const QuantConfig cfg =
      make_config(method, block, format, global_scale, max_block_scale, window, threads);
  const Method m = cfg.selector.method;
  Evaluation ev;
  {
    py::gil_scoped_release nogil;
    ev = evaluate(x.ref(), ia.imp, cfg, name);
  }
  py::dict d;
  d["method"] = std::string(kMethodNames.name(m));
  d["format"] = std::string(kTensorFormatNames.name(cfg.format));
  d["block"] = cfg.block;
  if (cfg.format == TensorFormat::kNvfp4) {
    if (cfg.global_scale)
      d["max_block_scale"] = py::none();
    else
      d["max_block_scale"] = cfg.max_block_scale.value_or(default_max_block_scale(m));
  }
  d["global_scale"] = ev.run.global_scale;
  d["nmse"] = ev.run.err.nmse;
  d["nwmse"] = ev.run.err.nwmse;
  d["opt_fp32_nmse"] = ev.opt.nmse();
  d["opt_fp32_nwmse"] = ev.opt.nwmse();
  d["gap_nmse_pct"] = ev.gaps.nmse_pct;
  d["gap_nwmse_pct"] = ev.gaps.nwmse_pct;
  d["gap_vs_opt_fp32_pct"] = ev.gaps.own_pct;
  return d;
}

}  // namespace

void bind_metrics(py::module_& m) {
  m.def("error_metrics", &error_metrics_py, py::arg("x"), py::arg("xhat"),
        py::arg("importance") = py::none(),
        "{'nmse', 'nwmse'}: sum (x - xhat)^2 / sum x^2, and the importance-weighted version\n"
        "(equal to nmse without importance); sums in double.");
  m.def(
      "global_scale_for_amax",
      [](float amax, float max_block_scale) {
        check_max_block_scale(max_block_scale);
        return global_scale_for_amax(amax, max_block_scale);
      },
      py::arg("amax"), py::arg("max_block_scale") = 256.0f,
      "Encode-direction global scale gs = fl(fl(6 C) / amax) (1 for amax 0): pass the amax of\n"
      "several tensors (fused q/k/v or gate/up) to share one global scale via global_scale=.");
  m.def(
      "default_max_block_scale",
      [](const std::string& method) { return default_max_block_scale(kMethodNames.parse(method)); },
      py::arg("method"), "C used when none is given: 448 for absmax, 256 otherwise.");
  m.def("gap_percent", &gap_percent, py::arg("err"), py::arg("err_opt"),
        "100 (err - err_opt) / err_opt (0 when both are 0, inf when only err_opt is 0).");
  def_with_options(
      m, "evaluate", &evaluate_py,
      "One method on one tensor: NMSE/NWMSE and the gaps to opt-fp32 (unweighted, and\n"
      "weighted given an importance), as `scalesweep tensor --json` reports them.");
}

}  // namespace scalesweep::python
