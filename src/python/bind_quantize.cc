// Quantization in Python: quantize, dequantize, fake_quantize and the QuantizedTensor they
// return, on the CPU (quant/quantize.h) or, for a torch CUDA tensor, through cuda_path.h.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "python/bindings.h"
#include "python/cuda_path.h"
#include "python/quantized.h"
#include "python/tensor_args.h"
#include "scalesweep/quant/evaluate.h"
#include "scalesweep/quant/index_string.h"
#include "scalesweep/quant/layout.h"
#include "scalesweep/scale/selector.h"

namespace scalesweep::python {

QuantConfig make_config(const std::string& method, int block, const std::string& format,
                        std::optional<float> global_scale, std::optional<float> max_block_scale,
                        std::optional<std::pair<int, int>> window, int threads) {
  QuantConfig cfg;
  cfg.selector.method = kMethodNames.parse(method);  // std::invalid_argument -> ValueError
  cfg.format = kTensorFormatNames.parse(format);
  cfg.block = block;
  cfg.global_scale = global_scale;
  cfg.max_block_scale = max_block_scale;
  if (window) cfg.selector.window = Window{window->first, window->second};
  cfg.threads = threads;
  // The library's one validation (block, MXFP4 rules, C and gs, window, threads): its
  // OptionError becomes ValueError "<keyword>: <message>".
  validate(cfg);
  return cfg;
}

namespace {

PyQuantized quantize_py(const py::handle& xo, const std::string& method, int block,
                        const std::string& format, std::optional<float> global_scale,
                        std::optional<float> max_block_scale, const py::handle& importance,
                        std::optional<std::pair<int, int>> window, const std::string& scale_layout,
                        int threads, bool losses, const std::string& name) {
#ifdef SS_HAVE_CUDA
  if (on_cuda(xo)) {
    return cuda_quantize(
        xo, importance,
        make_config(method, block, format, global_scale, max_block_scale, window, threads),
        kScaleLayoutNames.parse(scale_layout), losses, name);
  }
#endif
  const Tensor2D x = tensor_arg(xo, "x");
  const ImportanceArg ia = importance_arg(importance, x);
  const QuantConfig cfg =
      make_config(method, block, format, global_scale, max_block_scale, window, threads);
  PyQuantized r;
  r.torch = x.torch;
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
  r.codes =
      as_output(to_numpy(std::vector<uint8_t>(r.q.codes), {r.q.rows, r.q.packed_cols()}), r.torch);
  if (r.layout == ScaleLayout::kSwizzled) {
    const SwizzledShape sh{r.q.rows, r.q.blocks_per_row()};
    r.scales = scales_output(to_numpy(std::move(swz), {sh.padded_rows(), sh.padded_blocks()}),
                             cfg.format, r.torch);
  } else {
    r.scales =
        scales_output(to_numpy(std::vector<uint8_t>(r.q.scales), {r.q.rows, r.q.blocks_per_row()}),
                      cfg.format, r.torch);
  }
  if (losses)
    r.losses = as_output(to_numpy(std::move(loss), {r.q.rows, r.q.blocks_per_row()}), r.torch);
  return r;
}

py::object dequantize_q(const PyQuantized& p) {
  if (!p.cuda_dequant.is_none()) return p.cuda_dequant;  // written by the quantize launch
  std::vector<float> out;
  {
    py::gil_scoped_release nogil;
    out = dequantize(p.q);
  }
  return as_output(to_numpy(std::move(out), {p.q.rows, p.q.cols}), p.torch);
}

// The compressed-tensors ("nvfp4-pack-quantized") tensors of one Linear, as its checkpoints
// store them (io/compressed_tensors.cc writes the same): weight_packed uint8 [N, ceil(K/2)]
// (element 2i in the low nibble), weight_scale [N, ceil(K/16)] row-major E4M3 (torch
// float8_e4m3fn; numpy: uint8 bit patterns), weight_global_scale float32 [1] (the
// encode-direction gs: x_hat = q * s / gs).
py::dict state_dict(const PyQuantized& p, const std::string& prefix) {
  if (p.q.format != TensorFormat::kNvfp4) {
    throw py::value_error(
        "state_dict: the compressed-tensors layout here is nvfp4's; this "
        "tensor is " +
        std::string(kTensorFormatNames.name(p.q.format)));
  }
  const std::string pre = prefix.empty() || prefix.back() == '.' ? prefix : prefix + ".";
  py::dict d;
  if (!p.cuda_row_scales.is_none()) {  // a CUDA result: the device tensors
    d[py::str(pre + "weight_packed")] = p.codes;
    d[py::str(pre + "weight_scale")] = p.cuda_row_scales;
    py::dict kw;
    kw["dtype"] = torch_module().attr("float32");
    kw["device"] = p.codes.attr("device");
    d[py::str(pre + "weight_global_scale")] =
        torch_module().attr("tensor")(py::make_tuple(p.q.global_scale), **kw);
    return d;
  }
  d[py::str(pre + "weight_packed")] =
      as_output(to_numpy(std::vector<uint8_t>(p.q.codes), {p.q.rows, p.q.packed_cols()}), p.torch);
  d[py::str(pre + "weight_scale")] =
      scales_output(to_numpy(std::vector<uint8_t>(p.q.scales), {p.q.rows, p.q.blocks_per_row()}),
                    p.q.format, p.torch);
  d[py::str(pre + "weight_global_scale")] =
      as_output(to_numpy(std::vector<float>{p.q.global_scale}, {1}), p.torch);
  return d;
}

// Accepts uint8, or the ml_dtypes / torch type of the scale format (float8_e4m3fn /
// float8_e8m0fnu). `name`: the dtype's name without "torch.".
void check_scale_dtype(const std::string& name, int itemsize, const std::string& shown,
                       TensorFormat f) {
  const char* ml = f == TensorFormat::kNvfp4 ? "float8_e4m3fn" : "float8_e8m0fnu";
  if (itemsize == 1 && (name == "uint8" || name == ml)) return;
  throw py::type_error("scales: dtype " + shown + " is not supported; use uint8 (" +
                       (f == TensorFormat::kNvfp4 ? "E4M3" : "UE8M0") + " bit patterns) or " + ml);
}

// dequantize(codes, scales, ...)'s arrays as uint8 numpy arrays (a torch tensor viewed over
// its bytes), their dtypes checked: the scales' first, then the codes'.
struct PackedArrays {
  py::array codes, scales;
  bool torch = false;  // the codes are a torch tensor: the result is one
};

PackedArrays packed_arrays(const py::handle& codes_o, const py::handle& scales_o, TensorFormat f) {
  PackedArrays r;
  r.torch = is_torch(codes_o);
  std::string codes_name;
  if (r.torch) {
    r.codes = torch_bytes(codes_o, "codes", &codes_name);
    codes_name = "torch." + codes_name;
  } else {
    r.codes = require_array(codes_o, "codes");
    codes_name = dtype_str(r.codes.dtype());
  }
  if (is_torch(scales_o)) {
    std::string n;
    r.scales = torch_bytes(scales_o, "scales", &n);
    check_scale_dtype(n, dt_itemsize(r.scales.dtype()), "torch." + n, f);
  } else {
    r.scales = require_array(scales_o, "scales");
    check_scale_dtype(py::str(r.scales.dtype().attr("name")), dt_itemsize(r.scales.dtype()),
                      dtype_str(r.scales.dtype()), f);
  }
  if (codes_name != "uint8" && codes_name != "torch.uint8") {
    throw py::type_error("codes: dtype " + codes_name +
                         " is not supported; use uint8 (two FP4 codes per byte)");
  }
  return r;
}

// The number of rows of the packed codes, their shape checked against cols (and the block
// between the two checks of the codes' shape, the order of the messages).
int64_t check_codes(const py::array& codes, int64_t cols, int block, TensorFormat f) {
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
  return rows;
}

// The encode-direction global scale: required for NVFP4; MXFP4 has none (None or 1).
float dequantize_global_scale(TensorFormat f, std::optional<float> global_scale) {
  if (f == TensorFormat::kNvfp4) {
    if (!global_scale) throw py::value_error("NVFP4 needs the (encode-direction) global_scale");
    check_global_scale(*global_scale);
    return *global_scale;
  }
  if (global_scale && *global_scale != 1.0f) {
    throw py::value_error("MXFP4 has no global scale; pass global_scale=None (or 1)");
  }
  return 1.0f;
}

// The block scales [rows, nb] row-major from either layout, the array's shape checked.
std::vector<uint8_t> row_major_scales(const py::array& scales, ScaleLayout layout, int64_t rows,
                                      int64_t nb) {
  const auto* sp = static_cast<const uint8_t*>(scales.data());
  if (layout == ScaleLayout::kRow) {
    if (scales.ndim() != 2 || scales.shape(0) != rows || scales.shape(1) != nb) {
      throw py::value_error("scales: shape " + shape_str(scales) + " does not match (" +
                            std::to_string(rows) + ", " + std::to_string(nb) +
                            ") (rows, ceil(cols/block)) of the row layout");
    }
    return std::vector<uint8_t>(sp, sp + scales.size());
  }
  const SwizzledShape sh{rows, nb};
  if (scales.size() != sh.bytes()) {
    throw py::value_error(
        "scales: " + std::to_string(scales.size()) + " bytes (shape " + shape_str(scales) +
        ") do not match the swizzled "
        "layout of (" +
        std::to_string(rows) + ", " + std::to_string(nb) + ") scales: expected (" +
        std::to_string(sh.padded_rows()) + ", " + std::to_string(sh.padded_blocks()) + ") bytes");
  }
  return unswizzle_scales(sp, scales.size(), rows, nb);
}

// Every block scale a pattern of the format's scale type that is non-negative and finite.
void check_scale_patterns(const std::vector<uint8_t>& scales, TensorFormat f, int64_t nb) {
  const int maxp = max_scale_pattern(scale_format_of(f));
  for (size_t i = 0; i < scales.size(); ++i) {
    if (scales[i] > maxp) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02x", scales[i]);
      throw py::value_error(
          "scales: block " +
          index_string(static_cast<int64_t>(i) / nb, static_cast<int64_t>(i) % nb) + " = " + hex +
          " is not a valid " + (f == TensorFormat::kNvfp4 ? "E4M3" : "UE8M0") +
          " block scale (patterns 0.." + std::to_string(maxp) + ": non-negative and finite)");
    }
  }
}

py::object dequantize_arrays(const py::handle& codes_o, const py::handle& scales_o,
                             std::optional<float> global_scale, int64_t cols, int block,
                             const std::string& format, const std::string& scale_layout) {
  const TensorFormat f = kTensorFormatNames.parse(format);
  const ScaleLayout layout = kScaleLayoutNames.parse(scale_layout);
  const PackedArrays a = packed_arrays(codes_o, scales_o, f);
  const int64_t rows = check_codes(a.codes, cols, block, f);
  const float gs = dequantize_global_scale(f, global_scale);
  const int64_t nb = (cols + block - 1) / block;
  const auto* cp = static_cast<const uint8_t*>(a.codes.data());
  QuantizedTensor q{.format = f,
                    .rows = rows,
                    .cols = cols,
                    .block = block,
                    .global_scale = gs,
                    .codes = std::vector<uint8_t>(cp, cp + a.codes.size()),
                    .scales = row_major_scales(a.scales, layout, rows, nb)};
  check_scale_patterns(q.scales, f, nb);
  std::vector<float> out;
  {
    py::gil_scoped_release nogil;
    out = dequantize(q);
  }
  return as_output(to_numpy(std::move(out), {rows, cols}), a.torch);
}

py::object fake_quantize_py(const py::handle& xo, const std::string& method, int block,
                            const std::string& format, std::optional<float> global_scale,
                            std::optional<float> max_block_scale, const py::handle& importance,
                            std::optional<std::pair<int, int>> window, int threads,
                            const std::string& name) {
#ifdef SS_HAVE_CUDA
  if (on_cuda(xo)) {
    return cuda_fake_quantize(
        xo, importance,
        make_config(method, block, format, global_scale, max_block_scale, window, threads), name);
  }
#endif
  const Tensor2D x = tensor_arg(xo, "x");
  const ImportanceArg ia = importance_arg(importance, x);
  const QuantConfig cfg =
      make_config(method, block, format, global_scale, max_block_scale, window, threads);
  std::vector<float> out;
  {
    py::gil_scoped_release nogil;
    out = fake_quantize(x.data, x.dtype, x.rows, x.cols, ia.imp, cfg, name);
  }
  return dense_output(std::move(out), x.rows, x.cols, x.dtype, x.torch);
}

// The class QuantizedTensor (what quantize() returns).
void bind_quantized_tensor(py::module_& m) {
  py::class_<PyQuantized>(m, "QuantizedTensor",
                          "Result of quantize(): packed FP4 codes, block scales, global scale.")
      .def_readonly("codes", &PyQuantized::codes,
                    "uint8 [N, ceil(K/2)]: element 2i in the low nibble, 2i+1 in the high one")
      .def_readonly("scales", &PyQuantized::scales,
                    "uint8 block-scale bit patterns (E4M3 for nvfp4, UE8M0 for mxfp4): "
                    "[N, ceil(K/block)] row-major, or the swizzled buffer [roundup(N,128), "
                    "roundup(ceil(K/block),4)]; for torch input a torch tensor of dtype "
                    "float8_e4m3fn (nvfp4) / float8_e8m0fnu (mxfp4) over the same bytes")
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
      .def("state_dict", &state_dict, py::arg("prefix") = "",
           "The compressed-tensors (nvfp4-pack-quantized) tensors of this weight:\n"
           "{prefix.weight_packed: uint8 [N, ceil(K/2)], prefix.weight_scale: [N, ceil(K/16)]\n"
           "E4M3 (torch.float8_e4m3fn for torch input, uint8 bit patterns for numpy),\n"
           "prefix.weight_global_scale: float32 [1]} (x_hat = q * s / global_scale).")
      .def_property_readonly(
          "is_torch", [](const PyQuantized& p) { return p.torch; },
          "True when the arrays are torch tensors (the input was one)")
      .def("__repr__", [](const PyQuantized& p) {
        return "<scalesweep.QuantizedTensor " + std::string(kTensorFormatNames.name(p.q.format)) +
               " shape=(" + std::to_string(p.q.rows) + ", " + std::to_string(p.q.cols) +
               ") block=" + std::to_string(p.q.block) + " method=" + p.method +
               " scale_layout=" + std::string(kScaleLayoutNames.name(p.layout)) +
               " global_scale=" + std::to_string(p.q.global_scale) + ">";
      });
}

}  // namespace

void bind_quantize(py::module_& m) {
  bind_quantized_tensor(m);
  m.def("quantize", &quantize_py, py::arg("x"), py::arg("method") = "sweep-mse",
        py::arg("block") = 16, py::arg("format") = "nvfp4", py::arg("global_scale") = py::none(),
        py::arg("max_block_scale") = py::none(), py::arg("importance") = py::none(),
        py::arg("window") = py::none(), py::arg("scale_layout") = "row", py::arg("threads") = 0,
        py::arg("losses") = false, py::arg("name") = "x",
        "Quantize a 2-D float32/float16/bfloat16 array X[N, K] to NVFP4 (or MXFP4) with one\n"
        "block-scale selector (METHODS; not opt-fp32, which has no FP8 scales: use\n"
        "fake_quantize). global_scale: explicit encode-direction gs (float32); otherwise\n"
        "gs = 6C/amax with C = max_block_scale (default 448 for absmax, 256 otherwise).\n"
        "importance: float32 [K] or [N, K] for the weighted methods; float64\n"
        "[ceil(K/block), block, block] block Hessians (diagonal blocks of the input's sum\n"
        "x x^T) for sweep-hessian / exhaustive-hessian. window=(lo, hi): sweep\n"
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
  def_with_options(
      m, "fake_quantize", &fake_quantize_py,
      "Quantize-dequantize in one step (float32 [N, K]); the only path for opt-fp32 (each\n"
      "block at its exact continuous optimum scale).");
  m.def(
      "_input_view",
      [](const py::handle& x) {
        const Tensor2D t = tensor_arg(x, "x");
        py::dict d;
        d["address"] = reinterpret_cast<uintptr_t>(t.data);
        d["dtype"] = std::string(kDTypeNames.name(t.dtype));
        d["shape"] = py::make_tuple(t.rows, t.cols);
        d["copied"] = t.copied;
        d["torch"] = t.torch;
        return d;
      },
      py::arg("x"),
      "Testing aid: how quantize() reads x: {'address' (of the data it reads), 'dtype',\n"
      "'shape', 'copied' (a strided tensor gathered into a row-major copy), 'torch'}.");
}

}  // namespace scalesweep::python
