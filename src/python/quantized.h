// The quantized tensor the Python module returns (scalesweep.QuantizedTensor), shared by the
// CPU path (bind_quantize.cc) and the CUDA path (cuda_path.cc), and the options they share.
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <utility>

#include "scalesweep/base/names.h"
#include "scalesweep/quant/quantize.h"

namespace scalesweep::python {

namespace py = pybind11;

enum class ScaleLayout { kRow, kSwizzled };
// row: [N, ceil(K/block)] row-major; swizzled: the vLLM/FlashInfer 128x4 layout.
inline constexpr auto kScaleLayoutNames = make_names<ScaleLayout>(
    "scale_layout", {{ScaleLayout::kRow, "row"}, {ScaleLayout::kSwizzled, "swizzled"}});

struct PyQuantized {
  QuantizedTensor q;  // row-major scales (the library's form)
  std::string method;
  ScaleLayout layout = ScaleLayout::kRow;
  bool torch = false;        // results as torch tensors (the input was one)
  py::object codes, scales;  // scales in `layout`
  py::object losses = py::none();
  // A CUDA result (codes/scales are device tensors, q holds no bytes): the row-major scales
  // and x_hat, written by the same kernel launch (state_dict, dequantize).
  py::object cuda_row_scales = py::none(), cuda_dequant = py::none();
};

// The options shared by quantize, fake_quantize and evaluate, checked by the library's one
// validation (its OptionError becomes ValueError "<keyword>: <message>").
QuantConfig make_config(const std::string& method, int block, const std::string& format,
                        std::optional<float> global_scale, std::optional<float> max_block_scale,
                        std::optional<std::pair<int, int>> window, int threads);

// Defines m.<name>(x, method, block, format, global_scale, max_block_scale, importance, window,
// threads, name): a function of one tensor and the options of make_config (fake_quantize,
// evaluate), with quantize's defaults.
template <class F>
void def_with_options(py::module_& m, const char* name, F&& f, const char* doc) {
  m.def(name, std::forward<F>(f), py::arg("x"), py::arg("method") = "sweep-mse",
        py::arg("block") = 16, py::arg("format") = "nvfp4", py::arg("global_scale") = py::none(),
        py::arg("max_block_scale") = py::none(), py::arg("importance") = py::none(),
        py::arg("window") = py::none(), py::arg("threads") = 0, py::arg("name") = "x", doc);
}

}  // namespace scalesweep::python
