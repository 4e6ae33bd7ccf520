// Python bindings: the extension module `scalesweep` (layer `python`, beside tools).
//
// Argument checking plus library calls only: every number this module returns is computed by
// the format / scale / quant layers (the same code the CLI runs, so the bytes are the CLI's).
// Bad arguments raise TypeError (wrong type or dtype) or ValueError (shape, value, option;
// the library's std::invalid_argument becomes ValueError), never a crash. The heavy calls run
// with the GIL released.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "scalesweep/format/minifloat.h"
#include "scalesweep/quant/evaluate.h"
#include "scalesweep/quant/index_string.h"
#include "scalesweep/quant/layout.h"
#include "scalesweep/quant/quantize.h"
#include "scalesweep/scale/bounds.h"
#include "scalesweep/scale/selector.h"

namespace py = pybind11;

namespace scalesweep::python {
namespace {

// ------------------------------------------------------------------ small helpers

std::string type_name(const py::handle& o) { return py::str(py::type::of(o).attr("__name__")); }

std::string dtype_str(const py::dtype& d) { return py::str(py::handle(d)); }

std::string shape_str(const py::array& a) {
  std::string s = "(";
  for (py::ssize_t i = 0; i < a.ndim(); ++i) {
    if (i) s += ", ";
    s += std::to_string(a.shape(i));
  }
  if (a.ndim() == 1) s += ",";
  return s + ")";
}

// Index of flat element i of an array of the given shape, "[a, b, ...]".
std::string nd_index(const std::vector<int64_t>& shape, int64_t i) {
  if (shape.size() == 2) return index_string(i / shape[1], i % shape[1]);
  std::vector<int64_t> idx(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    idx[d] = shape[d] ? i % shape[d] : 0;
    if (shape[d]) i /= shape[d];
  }
  std::string s = "[";
  for (size_t d = 0; d < idx.size(); ++d) s += (d ? ", " : "") + std::to_string(idx[d]);
  return s + "]";
}

std::vector<int64_t> shape_of(const py::array& a) {
  std::vector<int64_t> s(static_cast<size_t>(a.ndim()));
  for (py::ssize_t i = 0; i < a.ndim(); ++i) s[static_cast<size_t>(i)] = a.shape(i);
  return s;
}

// The argument as a numpy array (TypeError otherwise), C-contiguous and aligned (a copy only
// when it is not already).
py::array require_array(const py::handle& o, const char* what) {
  if (!py::isinstance<py::array>(o)) {
    throw py::type_error(std::string(what) + ": expected a numpy.ndarray, got " + type_name(o) +
                         " (convert with numpy.asarray(...))");
  }
  auto a = py::reinterpret_borrow<py::array>(o);
  if (!a.dtype().attr("isnative").cast<bool>()) {
    throw py::type_error(std::string(what) + ": dtype " + dtype_str(a.dtype()) +
                         " is not in native byte order (use .astype(its native dtype))");
  }
  const int flags = a.flags();
  if ((flags & py::detail::npy_api::NPY_ARRAY_C_CONTIGUOUS_) &&
      (flags & py::detail::npy_api::NPY_ARRAY_ALIGNED_)) {
    return a;
  }
  py::list req;
  req.append("C");
  req.append("A");
  return py::module_::import("numpy").attr("require")(a, py::none(), req);
}

// dtype fields through the Python attributes: pybind11 2.10 reads them from the C struct of
// NumPy 1.x, whose layout NumPy 2 changed (its itemsize would be wrong).
int dt_itemsize(const py::dtype& d) { return d.attr("itemsize").cast<int>(); }
char dt_kind(const py::dtype& d) { return d.attr("kind").cast<std::string>().at(0); }

bool is_bfloat16(const py::dtype& d) {
  return dt_itemsize(d) == 2 && py::str(d.attr("name")).cast<std::string>() == "bfloat16";
}

// Input element type of a float array: float32, float16 or ml_dtypes.bfloat16.
std::optional<DType> float_dtype(const py::dtype& d) {
  if (dt_kind(d) == 'f' && dt_itemsize(d) == 4) return DType::kF32;
  if (dt_kind(d) == 'f' && dt_itemsize(d) == 2) return DType::kF16;
  if (is_bfloat16(d)) return DType::kBF16;
  return std::nullopt;
}

// A 2-D input tensor X[N, K].
struct Tensor2D {
  py::array arr;  // keeps the data alive while the GIL is released
  const void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t rows = 0, cols = 0;
  TensorRef ref() const { return {data, dtype, rows, cols}; }
};

Tensor2D tensor_arg(const py::handle& o, const char* what) {
  py::array a = require_array(o, what);
  const auto dt = float_dtype(a.dtype());
  if (!dt) {
    throw py::type_error(std::string(what) + ": dtype " + dtype_str(a.dtype()) +
                         " is not supported; use float32, float16 or ml_dtypes.bfloat16 (e.g. " +
                         what + ".astype(numpy.float32))");
  }
  if (a.ndim() != 2) {
    throw py::value_error(std::string(what) + ": expected a 2-D array [N, K], got shape " +
                          shape_str(a) + (a.ndim() == 1 ? " (reshape a vector to [1, K])" : ""));
  }
  if (a.shape(0) == 0 || a.shape(1) == 0) {
    throw py::value_error(std::string(what) + ": array is empty (shape " + shape_str(a) + ")");
  }
  Tensor2D t;
  t.arr = a;
  t.data = a.data();
  t.dtype = *dt;
  t.rows = a.shape(0);
  t.cols = a.shape(1);
  return t;
}

// Importance weights: None, float32 [K] (per column) or [N, K] (per element). Finiteness and
// sign are checked by the library (the message names the first bad index).
struct ImportanceArg {
  py::array arr;
  Importance imp;
};

ImportanceArg importance_arg(const py::handle& o, const Tensor2D& x) {
  ImportanceArg r;
  if (o.is_none()) return r;
  py::array a = require_array(o, "importance");
  if (!(dt_kind(a.dtype()) == 'f' && dt_itemsize(a.dtype()) == 4)) {
    throw py::type_error("importance: dtype " + dtype_str(a.dtype()) +
                         " is not supported; use float32 (importance.astype(numpy.float32))");
  }
  const std::string expect = "; expected (" + std::to_string(x.cols) + ",) (per column) or (" +
                             std::to_string(x.rows) + ", " + std::to_string(x.cols) +
                             ") (per element)";
  if (a.ndim() == 1 && a.shape(0) == x.cols) {
    r.imp.kind = ImportanceKind::kPerColumn;
  } else if (a.ndim() == 2 && a.shape(0) == x.rows && a.shape(1) == x.cols) {
    r.imp.kind = ImportanceKind::kPerElement;
  } else {
    throw py::value_error("importance: shape " + shape_str(a) + " does not match x of shape (" +
                          std::to_string(x.rows) + ", " + std::to_string(x.cols) + ")" + expect);
  }
  r.arr = a;
  r.imp.data = static_cast<const float*>(a.data());
  return r;
}

enum class ScaleLayout { kRow, kSwizzled };
// row: [N, ceil(K/block)] row-major; swizzled: the vLLM/FlashInfer 128x4 layout.
inline constexpr auto kScaleLayoutNames = make_names<ScaleLayout>(
    "scale_layout", {{ScaleLayout::kRow, "row"}, {ScaleLayout::kSwizzled, "swizzled"}});

// The options shared by quantize, fake_quantize and evaluate.
QuantConfig make_config(const std::string& method, int block, const std::string& format,
                        std::optional<float> global_scale, std::optional<float> max_block_scale,
                        std::optional<std::pair<int, int>> window, int threads) {
  QuantConfig cfg;
  cfg.selector.method = kMethodNames.parse(method);  // std::invalid_argument -> ValueError
  cfg.format = kTensorFormatNames.parse(format);
  cfg.block = block;
  cfg.global_scale = global_scale;
  cfg.max_block_scale = max_block_scale;
  if (global_scale && max_block_scale) {
    throw py::value_error(
        "global_scale and max_block_scale both set the global scale; give one of them");
  }
  if (window) cfg.selector.window = Window{window->first, window->second};
  if (threads < 0) throw py::value_error("threads must be >= 0 (0 = all cores)");
  cfg.threads = threads;
  // Everything else (block sizes, MXFP4 rules, C and gs ranges, windows) is checked by the
  // library with the same messages as the CLI.
  return cfg;
}

// A numpy array that owns a std::vector (no copy).
template <class T>
py::array_t<T> to_numpy(std::vector<T>&& v, std::vector<py::ssize_t> shape) {
  auto* heap = new std::vector<T>(std::move(v));
  py::capsule owner(heap, [](void* p) { delete static_cast<std::vector<T>*>(p); });
  return py::array_t<T>(std::move(shape), heap->data(), owner);
}

// ------------------------------------------------------------------ formats (codecs)

struct CodecInfo {
  const char* name;
  int bits, exp_bits, man_bits, bias;
  bool is_signed, subnormals;
  const char* nan_policy;
  uint32_t max_pattern, nan_pattern;
  double max_value;
};

template <class F>
CodecInfo info_of(const char* name) {
  const char* pol = format::kNanPolicyNames.name(F::kPolicy).data();
  return {name,           F::kBits, F::kExpBits,    F::kManBits,    F::kBias,    F::kSigned,
          F::kSubnormals, pol,      F::kMaxPattern, F::kNanPattern, F::kMaxValue};
}

// Calls fn.template operator()<Format>() for the named format.
template <class Fn>
auto with_format(const std::string& name, Fn&& fn) {
  if (name == "e2m1") return fn.template operator()<format::E2M1>();
  if (name == "e4m3") return fn.template operator()<format::E4M3>();
  if (name == "ue8m0") return fn.template operator()<format::UE8M0>();
  if (name == "e3m2") return fn.template operator()<format::E3M2>();
  if (name == "e2m3") return fn.template operator()<format::E2M3>();
  if (name == "e5m2") return fn.template operator()<format::E5M2>();
  if (name == "f16") return fn.template operator()<format::F16>();
  if (name == "bf16") return fn.template operator()<format::BF16>();
  throw py::value_error("format '" + name +
                        "': expected one of e2m1, e4m3, ue8m0, e3m2, e2m3, e5m2, f16, bf16");
}

const char* const kCodecNames[] = {"e2m1", "e3m2", "e2m3", "e4m3", "e5m2", "ue8m0", "f16", "bf16"};

py::dict format_info(const std::string& name) {
  const CodecInfo i = with_format(name, [&]<class F>() { return info_of<F>(name.c_str()); });
  py::dict d;
  d["name"] = i.name;
  d["bits"] = i.bits;
  d["exp_bits"] = i.exp_bits;
  d["man_bits"] = i.man_bits;
  d["bias"] = i.bias;
  d["signed"] = i.is_signed;
  d["subnormals"] = i.subnormals;
  d["nan_policy"] = i.nan_policy;
  d["max_pattern"] = i.max_pattern;
  d["nan_pattern"] = i.nan_pattern;
  d["max_value"] = i.max_value;
  return d;
}

float widen(const void* p, DType t, int64_t i) { return load_element(p, t, i); }

py::array encode(const py::handle& xo, const std::string& fmt, const std::string& rounding,
                 bool allow_nonfinite) {
  py::array a = require_array(xo, "x");
  const auto dt = float_dtype(a.dtype());
  if (!dt) {
    throw py::type_error("x: dtype " + dtype_str(a.dtype()) +
                         " is not supported; use float32, float16 or ml_dtypes.bfloat16 "
                         "(float64 would be rounded twice: cast it yourself first)");
  }
  const format::Round mode = format::kRoundNames.parse(rounding);
  const auto shape = shape_of(a);
  const int64_t n = a.size();
  const void* src = a.data();
  const DType t = *dt;
  if (!allow_nonfinite) {
    for (int64_t i = 0; i < n; ++i) {
      const float v = widen(src, t, i);
      if (!std::isfinite(v)) {
        throw py::value_error("x: element " + nd_index(shape, i) + " is " +
                              (std::isnan(v) ? "NaN" : "infinite") +
                              "; pass allow_nonfinite=True to encode it (Inf saturates or "
                              "becomes Inf, NaN gives the format's NaN, or its max for "
                              "formats without NaN)");
      }
    }
  }
  std::vector<py::ssize_t> pshape(shape.begin(), shape.end());
  return with_format(fmt, [&]<class F>() -> py::array {
    using Out = std::conditional_t<(F::kBits > 8), uint16_t, uint8_t>;
    std::vector<Out> out(static_cast<size_t>(n));
    {
      py::gil_scoped_release nogil;
      for (int64_t i = 0; i < n; ++i)
        out[static_cast<size_t>(i)] = static_cast<Out>(F::encode(widen(src, t, i), mode));
    }
    return to_numpy(std::move(out), pshape);
  });
}

py::array decode(const py::handle& po, const std::string& fmt) {
  py::array a = require_array(po, "patterns");
  const py::dtype d = a.dtype();
  if (dt_kind(d) != 'u' || (dt_itemsize(d) != 1 && dt_itemsize(d) != 2)) {
    throw py::type_error("patterns: dtype " + dtype_str(d) +
                         " is not supported; use uint8 (or uint16 for f16/bf16); view "
                         "ml_dtypes arrays with .view(numpy.uint8)");
  }
  const auto shape = shape_of(a);
  const int64_t n = a.size();
  const int isz = dt_itemsize(d);
  const void* src = a.data();
  std::vector<py::ssize_t> pshape(shape.begin(), shape.end());
  return with_format(fmt, [&]<class F>() -> py::array {
    auto pat = [&](int64_t i) -> uint32_t {
      return isz == 1 ? static_cast<const uint8_t*>(src)[i] : static_cast<const uint16_t*>(src)[i];
    };
    for (int64_t i = 0; i < n; ++i) {
      if (pat(i) >= F::kNumPatterns) {
        throw py::value_error("patterns: element " + nd_index(shape, i) + " = " +
                              std::to_string(pat(i)) + " is not a " + fmt + " pattern (0.." +
                              std::to_string(F::kNumPatterns - 1) + ")");
      }
    }
    std::vector<float> out(static_cast<size_t>(n));
    {
      py::gil_scoped_release nogil;
      for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = F::decode_f(pat(i));
    }
    return to_numpy(std::move(out), pshape);
  });
}

// ------------------------------------------------------------------ quantization

struct PyQuantized {
  QuantizedTensor q;  // row-major scales (the library's form)
  std::string method;
  ScaleLayout layout = ScaleLayout::kRow;
  py::array codes, scales;  // scales in `layout`
  py::object losses = py::none();
};

PyQuantized quantize_py(const py::handle& xo, const std::string& method, int block,
                        const std::string& format, std::optional<float> global_scale,
                        std::optional<float> max_block_scale, const py::handle& importance,
                        std::optional<std::pair<int, int>> window, const std::string& scale_layout,
                        int threads, bool losses, const std::string& name) {
  const Tensor2D x = tensor_arg(xo, "x");
  const ImportanceArg ia = importance_arg(importance, x);
  const QuantConfig cfg =
      make_config(method, block, format, global_scale, max_block_scale, window, threads);
  PyQuantized r;
  r.layout = kScaleLayoutNames.parse(scale_layout);
  r.method = std::string(kMethodNames.name(cfg.selector.method));
  std::vector<uint8_t> swz;
  std::vector<double> loss;
  {
    py::gil_scoped_release nogil;
    r.q = quantize(x.data, x.dtype, x.rows, x.cols, ia.imp, cfg, name);
    if (r.layout == ScaleLayout::kSwizzled)
      swz = swizzle_scales(r.q.scales.data(), r.q.rows, r.q.blocks_per_row());
    if (losses) loss = block_losses(x.ref(), ia.imp, cfg.selector.method, r.q);
  }
  r.codes = to_numpy(std::vector<uint8_t>(r.q.codes), {r.q.rows, r.q.packed_cols()});
  if (r.layout == ScaleLayout::kSwizzled) {
    const SwizzledShape sh{r.q.rows, r.q.blocks_per_row()};
    r.scales = to_numpy(std::move(swz), {sh.padded_rows(), sh.padded_blocks()});
  } else {
    r.scales = to_numpy(std::vector<uint8_t>(r.q.scales), {r.q.rows, r.q.blocks_per_row()});
  }
  if (losses) r.losses = to_numpy(std::move(loss), {r.q.rows, r.q.blocks_per_row()});
  return r;
}

py::array dequantize_q(const PyQuantized& p) {
  std::vector<float> out;
  {
    py::gil_scoped_release nogil;
    out = dequantize(p.q);
  }
  return to_numpy(std::move(out), {p.q.rows, p.q.cols});
}

// Accepts uint8, or the ml_dtypes type of the scale format (float8_e4m3fn / float8_e8m0fnu).
void check_scale_dtype(const py::array& a, TensorFormat f) {
  const py::dtype d = a.dtype();
  const std::string n = py::str(d.attr("name"));
  const char* ml = f == TensorFormat::kNvfp4 ? "float8_e4m3fn" : "float8_e8m0fnu";
  if (dt_itemsize(d) == 1 && (n == "uint8" || n == ml)) return;
  throw py::type_error("scales: dtype " + dtype_str(d) + " is not supported; use uint8 (" +
                       (f == TensorFormat::kNvfp4 ? "E4M3" : "UE8M0") + " bit patterns) or " + ml);
}

py::array dequantize_arrays(const py::handle& codes_o, const py::handle& scales_o,
                            std::optional<float> global_scale, int64_t cols, int block,
                            const std::string& format, const std::string& scale_layout) {
  const TensorFormat f = kTensorFormatNames.parse(format);
  const ScaleLayout layout = kScaleLayoutNames.parse(scale_layout);
  py::array codes = require_array(codes_o, "codes");
  py::array scales = require_array(scales_o, "scales");
  if (!(dt_kind(codes.dtype()) == 'u' && dt_itemsize(codes.dtype()) == 1)) {
    throw py::type_error("codes: dtype " + dtype_str(codes.dtype()) +
                         " is not supported; use uint8 (two FP4 codes per byte)");
  }
  check_scale_dtype(scales, f);
  if (codes.ndim() != 2) {
    throw py::value_error("codes: expected a 2-D array [N, ceil(K/2)], got shape " +
                          shape_str(codes));
  }
  check_block(f, block);
  if (cols <= 0) throw py::value_error("cols must be > 0 (got " + std::to_string(cols) + ")");
  const int64_t rows = codes.shape(0);
  if (rows == 0) throw py::value_error("codes: array is empty (shape " + shape_str(codes) + ")");
  if (codes.shape(1) != packed_cols(cols)) {
    throw py::value_error("codes: shape " + shape_str(codes) +
                          " does not match cols = " + std::to_string(cols) + "; expected (" +
                          std::to_string(rows) + ", " + std::to_string(packed_cols(cols)) + ")");
  }
  float gs = 1.0f;
  if (f == TensorFormat::kNvfp4) {
    if (!global_scale) throw py::value_error("NVFP4 needs the (encode-direction) global_scale");
    gs = *global_scale;
    if (!(gs > 0.0f) || !std::isfinite(gs)) {
      throw py::value_error("global_scale " + std::to_string(gs) +
                            " is invalid; need a finite value > 0");
    }
  } else if (global_scale && *global_scale != 1.0f) {
    throw py::value_error("MXFP4 has no global scale; pass global_scale=None (or 1)");
  }
  const int64_t nb = (cols + block - 1) / block;
  QuantizedTensor q;
  q.format = f;
  q.rows = rows;
  q.cols = cols;
  q.block = block;
  q.global_scale = gs;
  const auto* cp = static_cast<const uint8_t*>(codes.data());
  q.codes.assign(cp, cp + codes.size());
  const auto* sp = static_cast<const uint8_t*>(scales.data());
  if (layout == ScaleLayout::kRow) {
    if (scales.ndim() != 2 || scales.shape(0) != rows || scales.shape(1) != nb) {
      throw py::value_error("scales: shape " + shape_str(scales) + " does not match (" +
                            std::to_string(rows) + ", " + std::to_string(nb) +
                            ") (rows, ceil(cols/block)) of the row layout");
    }
    q.scales.assign(sp, sp + scales.size());
  } else {
    const SwizzledShape sh{rows, nb};
    if (scales.size() != sh.bytes()) {
      throw py::value_error(
          "scales: " + std::to_string(scales.size()) + " bytes (shape " + shape_str(scales) +
          ") do not match the swizzled "
          "layout of (" +
          std::to_string(rows) + ", " + std::to_string(nb) + ") scales: expected (" +
          std::to_string(sh.padded_rows()) + ", " + std::to_string(sh.padded_blocks()) + ") bytes");
    }
    q.scales = unswizzle_scales(sp, scales.size(), rows, nb);
  }
  const int maxp = max_scale_pattern(scale_format_of(f));
  for (size_t i = 0; i < q.scales.size(); ++i) {
    if (q.scales[i] > maxp) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02x", q.scales[i]);
      throw py::value_error(
          "scales: block " +
          index_string(static_cast<int64_t>(i) / nb, static_cast<int64_t>(i) % nb) + " = " + hex +
          " is not a valid " + (f == TensorFormat::kNvfp4 ? "E4M3" : "UE8M0") +
          " block scale (patterns 0.." + std::to_string(maxp) + ": non-negative and finite)");
    }
  }
  std::vector<float> out;
  {
    py::gil_scoped_release nogil;
    out = dequantize(q);
  }
  return to_numpy(std::move(out), {rows, cols});
}

py::array fake_quantize_py(const py::handle& xo, const std::string& method, int block,
                           const std::string& format, std::optional<float> global_scale,
                           std::optional<float> max_block_scale, const py::handle& importance,
                           std::optional<std::pair<int, int>> window, int threads,
                           const std::string& name) {
  const Tensor2D x = tensor_arg(xo, "x");
  const ImportanceArg ia = importance_arg(importance, x);
  const QuantConfig cfg =
      make_config(method, block, format, global_scale, max_block_scale, window, threads);
  std::vector<float> out;
  {
    py::gil_scoped_release nogil;
    out = fake_quantize(x.data, x.dtype, x.rows, x.cols, ia.imp, cfg, name);
  }
  return to_numpy(std::move(out), {x.rows, x.cols});
}

py::dict error_metrics_py(const py::handle& xo, const py::handle& xhat_o,
                          const py::handle& importance) {
  const Tensor2D x = tensor_arg(xo, "x");
  py::array xh = require_array(xhat_o, "xhat");
  if (!(dt_kind(xh.dtype()) == 'f' && dt_itemsize(xh.dtype()) == 4)) {
    throw py::type_error("xhat: dtype " + dtype_str(xh.dtype()) +
                         " is not supported; use float32 (what dequantize returns)");
  }
  if (xh.ndim() != 2 || xh.shape(0) != x.rows || xh.shape(1) != x.cols) {
    throw py::value_error("xhat: shape " + shape_str(xh) + " does not match x of shape (" +
                          std::to_string(x.rows) + ", " + std::to_string(x.cols) + ")");
  }
  const ImportanceArg ia = importance_arg(importance, x);
  if (ia.imp.kind != ImportanceKind::kNone) {
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
    resolve_global_scale(xh.data(), DType::kF32, x.rows, x.cols, QuantConfig{}, "xhat");
    m = error_metrics(x.data, x.dtype, static_cast<const float*>(xh.data()), x.rows, x.cols,
                      ia.imp);
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

// ------------------------------------------------------------------ layouts

py::array uint8_2d(const py::handle& o, const char* what) {
  py::array a = require_array(o, what);
  if (!(dt_kind(a.dtype()) == 'u' && dt_itemsize(a.dtype()) == 1) &&
      !(dt_itemsize(a.dtype()) == 1 && dt_kind(a.dtype()) == 'V')) {
    throw py::type_error(std::string(what) + ": dtype " + dtype_str(a.dtype()) +
                         " is not supported; use uint8");
  }
  if (a.ndim() != 2) {
    throw py::value_error(std::string(what) + ": expected a 2-D array, got shape " + shape_str(a));
  }
  return a;
}

py::array swizzle_py(const py::handle& o) {
  py::array a = uint8_2d(o, "scales");
  const int64_t rows = a.shape(0), nb = a.shape(1);
  const SwizzledShape sh{rows, nb};
  auto v = swizzle_scales(static_cast<const uint8_t*>(a.data()), rows, nb);
  return to_numpy(std::move(v), {sh.padded_rows(), sh.padded_blocks()});
}

py::array unswizzle_py(const py::handle& o, int64_t rows, int64_t nblocks) {
  py::array a = require_array(o, "swizzled");
  if (dt_itemsize(a.dtype()) != 1) {
    throw py::type_error("swizzled: dtype " + dtype_str(a.dtype()) +
                         " is not supported; use uint8 (view an int32 buffer with "
                         ".view(numpy.uint8))");
  }
  if (rows <= 0 || nblocks <= 0) throw py::value_error("rows and nblocks must be > 0");
  auto v = unswizzle_scales(static_cast<const uint8_t*>(a.data()), a.size(), rows, nblocks);
  return to_numpy(std::move(v), {rows, nblocks});
}

py::array pack_py(const py::handle& o) {
  py::array a = uint8_2d(o, "codes");
  const auto* p = static_cast<const uint8_t*>(a.data());
  const auto shape = shape_of(a);
  for (int64_t i = 0; i < a.size(); ++i) {
    if (p[i] > 15) {
      throw py::value_error("codes: element " + nd_index(shape, i) + " = " + std::to_string(p[i]) +
                            " is not a 4-bit FP4 code (0..15)");
    }
  }
  auto v = pack_fp4(p, a.shape(0), a.shape(1));
  return to_numpy(std::move(v), {a.shape(0), packed_cols(a.shape(1))});
}

py::array unpack_py(const py::handle& o, int64_t cols) {
  py::array a = uint8_2d(o, "packed");
  if (cols <= 0 || a.shape(1) != packed_cols(cols)) {
    throw py::value_error("packed: shape " + shape_str(a) +
                          " does not match cols = " + std::to_string(cols) + " (expected " +
                          std::to_string(packed_cols(cols)) + " bytes per row)");
  }
  auto v = unpack_fp4(static_cast<const uint8_t*>(a.data()), a.shape(0), cols);
  return to_numpy(std::move(v), {a.shape(0), cols});
}

// ------------------------------------------------------------------ bounds

py::object window_obj(const std::optional<bounds::PatternWindow>& w) {
  if (!w) return py::none();
  return py::make_tuple(w->lo, w->hi);
}

py::dict bounds_py(int block, const std::string& elem, const std::string& scale) {
  const bounds::ElemFormat e = bounds::kElemFormatNames.parse(elem);
  const ScaleFormat s = kScaleFormatNames.parse(scale);
  if (block < 1 || block > 1024) {
    throw py::value_error("block " + std::to_string(block) + ": must lie in 1..1024");
  }
  bounds::Derivation d;
  {
    py::gil_scoped_release nogil;
    d = bounds::derive(e, s, block);
  }
  py::dict r;
  r["elem"] = std::string(bounds::kElemFormatNames.name(e));
  r["scale"] = std::string(kScaleFormatNames.name(s));
  r["block"] = block;
  r["window"] = py::make_tuple(d.window.lo, d.window.hi);
  r["upper_hi"] = d.upper.hi;
  r["lower_lo"] = d.lower.lo;
  py::list per;
  for (const auto& b : d.per_base) {
    py::dict x;
    x["pattern"] = b.pattern;
    x["window"] = window_obj(b.window);
    x["note"] = b.note;
    per.append(x);
  }
  r["per_base"] = per;
  return r;
}

py::dict sweep_windows_py(const std::vector<int>& blocks, const std::string& elem,
                          const std::string& scale) {
  const bounds::ElemFormat e = bounds::kElemFormatNames.parse(elem);
  const ScaleFormat s = kScaleFormatNames.parse(scale);
  for (int b : blocks)
    if (b < 1 || b > 1024)
      throw py::value_error("block " + std::to_string(b) + ": must lie in 1..1024");
  std::vector<bounds::PatternWindow> w(blocks.size());
  {
    py::gil_scoped_release nogil;
    for (size_t i = 0; i < blocks.size(); ++i) w[i] = bounds::derive(e, s, blocks[i]).window;
  }
  py::dict r;
  for (size_t i = 0; i < blocks.size(); ++i)
    r[py::int_(blocks[i])] = py::make_tuple(w[i].lo, w[i].hi);
  return r;
}

py::object proven_window_py(int base_pattern, int block, const std::string& elem,
                            const std::string& scale) {
  const bounds::ElemFormat e = bounds::kElemFormatNames.parse(elem);
  const ScaleFormat s = kScaleFormatNames.parse(scale);
  if (block < 1 || block > 1024) {
    throw py::value_error("block " + std::to_string(block) + ": must lie in 1..1024");
  }
  const int maxp = bounds::scale_max_pattern(s);
  if (base_pattern < 0 || base_pattern > maxp) {
    throw py::value_error("base_pattern " + std::to_string(base_pattern) + ": must lie in 0.." +
                          std::to_string(maxp));
  }
  std::optional<bounds::PatternWindow> w;
  {
    py::gil_scoped_release nogil;
    w = bounds::proven_window(e, s, block, base_pattern);
  }
  return window_obj(w);
}

}  // namespace
}  // namespace scalesweep::python

PYBIND11_MODULE(scalesweep, m) {
  using namespace scalesweep;
  using namespace scalesweep::python;
  m.doc() =
      "scalesweep: accurate NVFP4 / MXFP4 quantization (ScaleSweep) on numpy arrays.\n"
      "Bindings of the C++ library: the same bytes as the `scalesweep` CLI.";
  m.attr("__version__") = "0.1.0";
  py::list methods;
  for (Method x : kMethodNames.values()) methods.append(std::string(kMethodNames.name(x)));
  m.attr("METHODS") = py::tuple(methods);
  py::list codecs;
  for (const char* c : kCodecNames) codecs.append(c);
  m.attr("FORMATS") = py::tuple(codecs);

  // ---- formats
  m.def("encode", &encode, py::arg("x"), py::arg("format"), py::arg("rounding") = "rne",
        py::arg("allow_nonfinite") = false,
        "Encode float32/float16/bfloat16 values to bit patterns of a minifloat format\n"
        "(e2m1, e3m2, e2m3, e4m3, e5m2, ue8m0, f16, bf16). rounding: 'rne' (saturates to the\n"
        "max finite value), 'floor', 'ceil', 'toward-zero'. Returns uint8 (uint16 for f16/bf16)\n"
        "of the same shape. NaN/Inf raise ValueError naming the index unless\n"
        "allow_nonfinite=True.");
  m.def("decode", &decode, py::arg("patterns"), py::arg("format"),
        "Decode uint8/uint16 bit patterns of a minifloat format to float32 (exact).");
  m.def("format_info", &format_info, py::arg("format"),
        "Parameters of a minifloat format: bits, exp_bits, man_bits, bias, max_value, ...");

  // ---- quantization
  py::class_<PyQuantized>(m, "QuantizedTensor",
                          "Result of quantize(): packed FP4 codes, block scales, global scale.")
      .def_readonly("codes", &PyQuantized::codes,
                    "uint8 [N, ceil(K/2)]: element 2i in the low nibble, 2i+1 in the high one")
      .def_readonly("scales", &PyQuantized::scales,
                    "uint8 block-scale bit patterns (E4M3 for nvfp4, UE8M0 for mxfp4): "
                    "[N, ceil(K/block)] row-major, or the swizzled buffer [roundup(N,128), "
                    "roundup(ceil(K/block),4)]")
      .def_property_readonly(
          "global_scale", [](const PyQuantized& p) { return p.q.global_scale; },
          "encode-direction global scale gs = 1/S (float32 value; 1 for mxfp4)")
      .def_readonly("losses", &PyQuantized::losses,
                    "float64 [N, ceil(K/block)] contract loss of each block's chosen scale "
                    "(y domain; weighted for the methods that use weights), or None")
      .def_readonly("method", &PyQuantized::method)
      .def_property_readonly(
          "format",
          [](const PyQuantized& p) { return std::string(kTensorFormatNames.name(p.q.format)); })
      .def_property_readonly("block", [](const PyQuantized& p) { return p.q.block; })
      .def_property_readonly(
          "shape", [](const PyQuantized& p) { return py::make_tuple(p.q.rows, p.q.cols); })
      .def_property_readonly(
          "scale_layout",
          [](const PyQuantized& p) { return std::string(kScaleLayoutNames.name(p.layout)); })
      .def("dequantize", &dequantize_q, "x_hat = q * s / gs as float32 [N, K]")
      .def("__repr__", [](const PyQuantized& p) {
        return "<scalesweep.QuantizedTensor " + std::string(kTensorFormatNames.name(p.q.format)) +
               " shape=(" + std::to_string(p.q.rows) + ", " + std::to_string(p.q.cols) +
               ") block=" + std::to_string(p.q.block) + " method=" + p.method +
               " scale_layout=" + std::string(kScaleLayoutNames.name(p.layout)) +
               " global_scale=" + std::to_string(p.q.global_scale) + ">";
      });

  m.def("quantize", &quantize_py, py::arg("x"), py::arg("method") = "sweep-mse",
        py::arg("block") = 16, py::arg("format") = "nvfp4", py::arg("global_scale") = py::none(),
        py::arg("max_block_scale") = py::none(), py::arg("importance") = py::none(),
        py::arg("window") = py::none(), py::arg("scale_layout") = "row", py::arg("threads") = 0,
        py::arg("losses") = false, py::arg("name") = "x",
        "Quantize a 2-D float32/float16/bfloat16 array X[N, K] to NVFP4 (or MXFP4) with one\n"
        "block-scale selector (METHODS; not opt-fp32, which has no FP8 scales: use\n"
        "fake_quantize). global_scale: explicit encode-direction gs (float32); otherwise\n"
        "gs = 6C/amax with C = max_block_scale (default 448 for absmax, 256 otherwise).\n"
        "importance: float32 [K] or [N, K] for the weighted methods. window=(lo, hi): sweep\n"
        "offsets (method 'sweep', or to override sweep-mse/sweep-wmse). threads: 0 = all\n"
        "cores (same bytes for any count). losses=True also returns each block's contract\n"
        "loss. Returns a QuantizedTensor; the same bytes as `scalesweep tensor`.");
  m.def("dequantize", &dequantize_q, py::arg("q"), "Dequantize a QuantizedTensor.");
  m.def("dequantize", &dequantize_arrays, py::arg("codes"), py::arg("scales"),
        py::arg("global_scale"), py::arg("cols"), py::arg("block") = 16,
        py::arg("format") = "nvfp4", py::arg("scale_layout") = "row",
        "Dequantize packed codes (uint8 [N, ceil(cols/2)]) with block scales (uint8 or\n"
        "float8_e4m3fn / float8_e8m0fnu, row or swizzled layout) and the encode-direction\n"
        "global scale (None for mxfp4): x_hat = q * s / gs, float32 [N, cols].");
  m.def("fake_quantize", &fake_quantize_py, py::arg("x"), py::arg("method") = "sweep-mse",
        py::arg("block") = 16, py::arg("format") = "nvfp4", py::arg("global_scale") = py::none(),
        py::arg("max_block_scale") = py::none(), py::arg("importance") = py::none(),
        py::arg("window") = py::none(), py::arg("threads") = 0, py::arg("name") = "x",
        "Quantize-dequantize in one step (float32 [N, K]); the only path for opt-fp32 (each\n"
        "block at its exact continuous optimum scale).");
  m.def("error_metrics", &error_metrics_py, py::arg("x"), py::arg("xhat"),
        py::arg("importance") = py::none(),
        "{'nmse', 'nwmse'}: sum (x - xhat)^2 / sum x^2, and the importance-weighted version\n"
        "(equal to nmse without importance); sums in double.");
  m.def(
      "global_scale_for_amax",
      [](float amax, float max_block_scale) {
        if (!(max_block_scale > 0.0f && max_block_scale <= 448.0f))
          throw py::value_error("max_block_scale C must satisfy 0 < C <= 448");
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
  m.def("evaluate", &evaluate_py, py::arg("x"), py::arg("method") = "sweep-mse",
        py::arg("block") = 16, py::arg("format") = "nvfp4", py::arg("global_scale") = py::none(),
        py::arg("max_block_scale") = py::none(), py::arg("importance") = py::none(),
        py::arg("window") = py::none(), py::arg("threads") = 0, py::arg("name") = "x",
        "One method on one tensor: NMSE/NWMSE and the gaps to opt-fp32 (unweighted, and\n"
        "weighted given an importance), as `scalesweep tensor --json` reports them.");

  // ---- layouts
  m.def("swizzle_scales", &swizzle_py, py::arg("scales"),
        "Row-major scales uint8 [N, nb] -> the vLLM/FlashInfer swizzled buffer\n"
        "[roundup(N,128), roundup(nb,4)]; byte ((m>>7)*ceil(nb/4) + (k>>2))*512 + (m&31)*16 +\n"
        "((m>>5)&3)*4 + (k&3) holds scale (m, k); padding is 0.");
  m.def("unswizzle_scales", &unswizzle_py, py::arg("swizzled"), py::arg("rows"), py::arg("nblocks"),
        "Inverse of swizzle_scales.");
  m.def("pack_fp4", &pack_py, py::arg("codes"),
        "uint8 [N, K] FP4 codes (0..15) -> packed [N, ceil(K/2)] (2i low nibble).");
  m.def("unpack_fp4", &unpack_py, py::arg("packed"), py::arg("cols"),
        "Packed [N, ceil(cols/2)] -> uint8 [N, cols] FP4 codes.");

  // ---- bounds
  m.def("bounds", &bounds_py, py::arg("block") = 16, py::arg("elem") = "e2m1",
        py::arg("scale") = "e4m3",
        "The proven sweep window (paper Tables 1-3, derived in exact arithmetic) and the\n"
        "per-base-pattern windows, as `scalesweep bounds --json` prints them.");
  m.def("sweep_windows", &sweep_windows_py, py::arg("blocks") = std::vector<int>{8, 16, 32, 64},
        py::arg("elem") = "e2m1", py::arg("scale") = "e4m3",
        "{block: (lo, hi)}: the proven sweep window for normal bases per block length.");
  m.def("proven_window", &proven_window_py, py::arg("base_pattern"), py::arg("block") = 16,
        py::arg("elem") = "e2m1", py::arg("scale") = "e4m3",
        "(lo, hi) offsets proven for this base scale pattern (blocks of <= block elements),\n"
        "or None where nothing is proven.");
}
