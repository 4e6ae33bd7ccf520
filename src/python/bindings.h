// The functions and classes of the Python module scalesweep._core, one group per function
// (module.cc calls them all).
#pragma once

#include <pybind11/pybind11.h>

namespace scalesweep::python {

// encode, decode, format_info, FORMATS (minifloat codecs).
void bind_formats(pybind11::module_& m);
// QuantizedTensor, quantize, dequantize, fake_quantize, _input_view.
void bind_quantize(pybind11::module_& m);
// error_metrics, evaluate, gap_percent, global_scale_for_amax, default_max_block_scale.
void bind_metrics(pybind11::module_& m);
// swizzle_scales, unswizzle_scales, pack_fp4, unpack_fp4.
void bind_layouts(pybind11::module_& m);
// bounds, sweep_windows, proven_window.
void bind_bounds(pybind11::module_& m);

}  // namespace scalesweep::python
