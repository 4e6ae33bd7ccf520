// The CUDA path of the Python module: a torch CUDA tensor goes to the kernels of
// src/kernels/cuda (cuda/quantize.h) on its device and torch's current stream; the outputs are
// torch tensors allocated there. They implement NVFP4 with b = 16, the methods
// cuda::method_supported names and per-column importance; anything else is refused with a
// message (the CPU path has it: .cpu()). Built only with the CUDA kernels (SS_HAVE_CUDA).
#pragma once

#ifdef SS_HAVE_CUDA
#include <pybind11/pybind11.h>

#include <string>

#include "python/quantized.h"

namespace scalesweep::python {

// quantize() of a CUDA tensor: codes, scales (in `layout`) and, with `losses`, each block's
// loss, all device tensors; the row-major scales and x_hat kept for state_dict / dequantize.
PyQuantized cuda_quantize(const py::handle& xo, const py::handle& importance,
                          const QuantConfig& cfg, ScaleLayout layout, bool losses,
                          const std::string& name);

// fake_quantize() of a CUDA tensor: x_hat in the input's dtype on its device.
py::object cuda_fake_quantize(const py::handle& xo, const py::handle& importance,
                              const QuantConfig& cfg, const std::string& name);

}  // namespace scalesweep::python
#endif  // SS_HAVE_CUDA
