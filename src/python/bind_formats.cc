// The minifloat codecs in Python: encode, decode, format_info (format/minifloat.h).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "python/bindings.h"
#include "python/tensor_args.h"
#include "scalesweep/format/minifloat.h"

namespace scalesweep::python {
namespace {

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

}  // namespace

void bind_formats(py::module_& m) {
  py::list codecs;
  for (const char* c : kCodecNames) codecs.append(c);
  m.attr("FORMATS") = py::tuple(codecs);
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
}

}  // namespace scalesweep::python
