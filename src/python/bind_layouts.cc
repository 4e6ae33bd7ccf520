// Layouts in Python: the block-scale swizzle and FP4 packing (quant/layout.h).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <vector>

#include "python/bindings.h"
#include "python/tensor_args.h"
#include "scalesweep/quant/layout.h"

namespace scalesweep::python {
namespace {

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

}  // namespace

void bind_layouts(py::module_& m) {
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
}

}  // namespace scalesweep::python
