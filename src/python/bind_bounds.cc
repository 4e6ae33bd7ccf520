// The proven sweep windows in Python (scale/bounds.h, docs/BOUNDS.md).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <vector>

#include "python/bindings.h"
#include "scalesweep/scale/bounds.h"

namespace scalesweep::python {

namespace py = pybind11;

namespace {

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

void bind_bounds(py::module_& m) {
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

}  // namespace scalesweep::python
