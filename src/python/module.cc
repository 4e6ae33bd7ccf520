// Python bindings: the extension module `scalesweep._core` (layer `python`, beside tools),
// re-exported by the package python/scalesweep/__init__.py.
//
// Argument checking plus library calls only: every number this module returns is computed by
// the format / scale / quant layers (the same code the CLI runs, so the bytes are the CLI's).
// Bad arguments raise TypeError (wrong type or dtype) or ValueError (shape, value, option;
// the library's std::invalid_argument becomes ValueError), never a crash. The heavy calls run
// with the GIL released.
//
// Tensors: numpy arrays in -> numpy arrays out (as always); torch tensors (any object with
// __dlpack__) in -> torch tensors out. torch is never imported here: an argument is a torch
// tensor when torch is already loaded and it is an instance of torch.Tensor.
//
// The parts: tensor_args.h (numpy / DLPack arguments and results), cuda_path.h (torch CUDA
// tensors), bindings.h (the functions, one group per file bind_*.cc).
#include <pybind11/pybind11.h>

#include <exception>
#include <string>
#include <string_view>

#include "python/bindings.h"
#include "scalesweep/base/option_error.h"
#include "scalesweep/scale/selector.h"

namespace py = pybind11;

PYBIND11_MODULE(_core, m) {
  using namespace scalesweep;
  using namespace scalesweep::python;
  m.doc() =
      "scalesweep: accurate NVFP4 / MXFP4 quantization (ScaleSweep) on numpy arrays.\n"
      "Bindings of the C++ library: the same bytes as the `scalesweep` CLI.";
  m.attr("__version__") = SS_VERSION;  // CMakeLists.txt project(VERSION), the one place
  // The library's one message of an invalid parameter, named by its keyword.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const OptionError& e) {
      const std::string msg = render_option_refs(e.what(), [](std::string_view f) {
        return std::string(f);  // Python: the keyword
      });
      PyErr_SetString(PyExc_ValueError, (e.field() + ": " + msg).c_str());
    }
  });
#ifdef SS_HAVE_CUDA
  m.attr("CUDA") = true;
#else
  m.attr("CUDA") = false;
#endif
  py::list methods;
  for (Method x : kMethodNames.values()) methods.append(std::string(kMethodNames.name(x)));
  m.attr("METHODS") = py::tuple(methods);
  bind_formats(m);
  bind_quantize(m);
  bind_metrics(m);
  bind_layouts(m);
  bind_bounds(m);
}
