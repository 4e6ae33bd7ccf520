// Tensor arguments of the Python module (tensor_args.h): numpy and DLPack conversion, the
// checks of dtype and shape, and results as the caller's kind.
#include "python/tensor_args.h"

#include <cmath>
#include <cstring>
#include <stdexcept>

#include "scalesweep/format/minifloat.h"
#include "scalesweep/quant/index_string.h"

namespace scalesweep::python {
namespace {

std::string type_name(const py::handle& o) { return py::str(py::type::of(o).attr("__name__")); }

bool is_bfloat16(const py::dtype& d) {
  return dt_itemsize(d) == 2 && py::str(d.attr("name")).cast<std::string>() == "bfloat16";
}

// (device type, device id) of a DLPack tensor, without exporting it.
std::pair<int, int> dlpack_device(const py::handle& o) {
  if (!py::hasattr(o, "__dlpack_device__")) return {dl::kCPU, 0};
  const auto t = o.attr("__dlpack_device__")().cast<py::tuple>();
  return {t[0].cast<int>(), t[1].cast<int>()};
}

// The element type's name for messages: torch's own ("torch.int32"), else the DLPack code.
std::string dl_dtype_name(const py::handle& o, const dl::DataType& t) {
  if (py::hasattr(o, "dtype")) return py::str(o.attr("dtype"));
  return "DLPack (code " + std::to_string(t.code) + ", " + std::to_string(t.bits) + " bits, " +
         std::to_string(t.lanes) + " lanes)";
}

std::optional<DType> dl_float_dtype(const dl::DataType& t) {
  if (t.lanes != 1) return std::nullopt;
  if (t.code == dl::kFloat && t.bits == 32) return DType::kF32;
  if (t.code == dl::kFloat && t.bits == 16) return DType::kF16;
  if (t.code == dl::kBfloat && t.bits == 16) return DType::kBF16;
  return std::nullopt;
}

Tensor2D tensor_arg_dlpack(const py::handle& o, const char* what) {
  Borrowed b = borrow_dlpack(py::reinterpret_borrow<py::object>(o), what);
  const auto dt = dl_float_dtype(b.dtype);
  if (!dt) {
    throw py::type_error(std::string(what) + ": dtype " + b.dtype_name +
                         " is not supported; use float32, float16 or bfloat16 (e.g. " + what +
                         ".float())");
  }
  check_2d(b.shape, what);
  Tensor2D t;
  t.keep = b.owner;
  t.data = b.data;
  t.dtype = *dt;
  t.rows = b.shape[0];
  t.cols = b.shape[1];
  t.torch = is_torch(o);
  t.copied = b.copied;
  return t;
}

}  // namespace

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

int dt_itemsize(const py::dtype& d) { return d.attr("itemsize").cast<int>(); }
char dt_kind(const py::dtype& d) { return d.attr("kind").cast<std::string>().at(0); }

std::optional<DType> float_dtype(const py::dtype& d) {
  if (dt_kind(d) == 'f' && dt_itemsize(d) == 4) return DType::kF32;
  if (dt_kind(d) == 'f' && dt_itemsize(d) == 2) return DType::kF16;
  if (is_bfloat16(d)) return DType::kBF16;
  return std::nullopt;
}

bool is_torch(const py::handle& o) {
  // sys.modules["torch"] may be None (a blocked import): then nothing is a torch tensor.
  const py::object torch = py::module_::import("sys").attr("modules").attr("get")("torch");
  return !torch.is_none() && py::hasattr(torch, "Tensor") &&
         py::isinstance(o, torch.attr("Tensor"));
}

bool is_dlpack(const py::handle& o) {
  return !py::isinstance<py::array>(o) && py::hasattr(o, "__dlpack__");
}

bool on_cuda(const py::handle& o) {
  if (!is_dlpack(o)) return false;
  const int type = dlpack_device(o).first;
  return type == dl::kCUDA || type == dl::kCUDAManaged;
}

Borrowed borrow_dlpack(py::object o, const char* what) {
  const auto [dev, dev_id] = dlpack_device(o);
  if (dev == dl::kCUDA || dev == dl::kCUDAManaged) {
    throw py::value_error(std::string(what) + ": a CUDA tensor (device cuda:" +
                          std::to_string(dev_id) + "); " + kNoCudaHint);
  }
  if (dev != dl::kCPU && dev != dl::kCUDAHost) {
    throw py::value_error(std::string(what) + ": tensor on DLPack device type " +
                          std::to_string(dev) + " is not supported; move it to the CPU (.cpu())");
  }
  // torch refuses to export a tensor that requires grad; its data is what we read.
  if (py::hasattr(o, "requires_grad") && o.attr("requires_grad").cast<bool>())
    o = o.attr("detach")();
  py::object cap = o.attr("__dlpack__")();
  if (!PyCapsule_IsValid(cap.ptr(), "dltensor")) {
    throw py::type_error(std::string(what) +
                         ": __dlpack__() did not return a \"dltensor\" "
                         "capsule (an unsupported DLPack version)");
  }
  auto* mt = static_cast<dl::Managed*>(PyCapsule_GetPointer(cap.ptr(), "dltensor"));
  PyCapsule_SetName(cap.ptr(), "used_dltensor");  // ours now: the producer will not free it
  Borrowed b;
  b.owner = py::capsule(mt, [](void* p) {
    auto* m = static_cast<dl::Managed*>(p);
    if (m->deleter) m->deleter(m);
  });
  const dl::Tensor& t = mt->t;
  b.dtype = t.dtype;
  b.dtype_name = dl_dtype_name(o, t.dtype);
  b.shape.assign(t.shape, t.shape + t.ndim);
  const auto* base = static_cast<const uint8_t*>(t.data) + t.byte_offset;
  b.data = base;
  bool row_major = true;
  int64_t expect = 1;
  if (t.strides) {
    for (int32_t d = t.ndim; d-- > 0;) {
      if (t.shape[d] != 1 && t.strides[d] != expect) row_major = false;
      expect *= t.shape[d];
    }
  }
  if (!row_major) {
    const size_t esize = (t.dtype.bits * t.dtype.lanes + 7u) / 8u;
    int64_t n = 1;
    for (int64_t v : b.shape) n *= v;
    auto* copy = new std::vector<uint8_t>(static_cast<size_t>(n) * esize);
    py::capsule keep(copy, [](void* p) { delete static_cast<std::vector<uint8_t>*>(p); });
    std::vector<int64_t> idx(b.shape.size(), 0);
    for (int64_t i = 0; i < n; ++i) {
      int64_t off = 0;
      for (size_t d = 0; d < idx.size(); ++d) off += idx[d] * t.strides[d];
      std::memcpy(copy->data() + static_cast<size_t>(i) * esize, base + off * int64_t(esize),
                  esize);
      for (size_t d = idx.size(); d-- > 0;) {
        if (++idx[d] < b.shape[d]) break;
        idx[d] = 0;
      }
    }
    b.owner = py::make_tuple(b.owner, keep);
    b.data = copy->data();
    b.copied = true;
  }
  return b;
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "(";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + (s.size() == 1 ? ",)" : ")");
}

void check_2d(const std::vector<int64_t>& shape, const char* what) {
  if (shape.size() != 2) {
    throw py::value_error(std::string(what) + ": expected a 2-D array [N, K], got shape " +
                          shape_str(shape) +
                          (shape.size() == 1 ? " (reshape a vector to [1, K])" : ""));
  }
  if (shape[0] == 0 || shape[1] == 0) {
    throw py::value_error(std::string(what) + ": array is empty (shape " + shape_str(shape) + ")");
  }
}

Tensor2D tensor_arg(const py::handle& o, const char* what) {
  if (is_dlpack(o)) return tensor_arg_dlpack(o, what);
  py::array a = require_array(o, what);
  const auto dt = float_dtype(a.dtype());
  if (!dt) {
    throw py::type_error(std::string(what) + ": dtype " + dtype_str(a.dtype()) +
                         " is not supported; use float32, float16 or ml_dtypes.bfloat16 (e.g. " +
                         what + ".astype(numpy.float32))");
  }
  check_2d(shape_of(a), what);
  Tensor2D t;
  t.keep = a;
  t.data = a.data();
  t.dtype = *dt;
  t.rows = a.shape(0);
  t.cols = a.shape(1);
  return t;
}

ImportanceArg importance_arg(const py::handle& o, const Tensor2D& x) {
  ImportanceArg r;
  if (o.is_none()) return r;
  std::vector<int64_t> shape;
  bool f64 = false;
  const void* data = nullptr;
  std::string dtype_name;
  if (is_dlpack(o)) {
    Borrowed b = borrow_dlpack(py::reinterpret_borrow<py::object>(o), "importance");
    if (!(b.dtype.code == dl::kFloat && (b.dtype.bits == 32 || b.dtype.bits == 64) &&
          b.dtype.lanes == 1)) {
      throw py::type_error("importance: dtype " + b.dtype_name +
                           " is not supported; use float32 (importance.float())");
    }
    f64 = b.dtype.bits == 64;
    dtype_name = b.dtype_name;
    r.keep = b.owner;
    data = b.data;
    shape = b.shape;
  } else {
    py::array a = require_array(o, "importance");
    if (!(dt_kind(a.dtype()) == 'f' &&
          (dt_itemsize(a.dtype()) == 4 || dt_itemsize(a.dtype()) == 8))) {
      throw py::type_error("importance: dtype " + dtype_str(a.dtype()) +
                           " is not supported; use float32 (importance.astype(numpy.float32))");
    }
    f64 = dt_itemsize(a.dtype()) == 8;
    dtype_name = dtype_str(a.dtype());
    r.keep = a;
    data = a.data();
    shape = shape_of(a);
  }
  const std::string expect = "; expected (" + std::to_string(x.cols) + ",) (per column), (" +
                             std::to_string(x.rows) + ", " + std::to_string(x.cols) +
                             ") (per element) or (ceil(K/b), b, b) float64 block Hessians";
  if (shape.size() == 3) {
    const int64_t b = shape[1];
    if (!f64)
      throw py::type_error("importance: block Hessians must be float64 (got " + dtype_name + ")");
    if (b < 1 || shape[2] != b || shape[0] != (x.cols + b - 1) / b)
      throw py::value_error("importance: shape " + shape_str(shape) +
                            " does not match x of shape (" + std::to_string(x.rows) + ", " +
                            std::to_string(x.cols) + ")" + expect);
    r.imp = {ImportanceKind::kBlockHessian, nullptr, static_cast<const double*>(data),
             static_cast<int>(b)};
    return r;
  }
  if (f64)
    throw py::type_error("importance: dtype " + dtype_name +
                         " is not supported for per-column or per-element importance; use "
                         "float32 (float64 is for (ceil(K/b), b, b) block Hessians)");
  r.imp.data = static_cast<const float*>(data);
  if (shape.size() == 1 && shape[0] == x.cols) {
    r.imp.kind = ImportanceKind::kPerColumn;
  } else if (shape.size() == 2 && shape[0] == x.rows && shape[1] == x.cols) {
    r.imp.kind = ImportanceKind::kPerElement;
  } else {
    throw py::value_error("importance: shape " + shape_str(shape) + " does not match x of shape (" +
                          std::to_string(x.rows) + ", " + std::to_string(x.cols) + ")" + expect);
  }
  return r;
}

py::array torch_bytes(const py::handle& o, const char* what, std::string* name) {
  if (on_cuda(o)) throw py::value_error(std::string(what) + ": a CUDA tensor; " + kNoCudaHint);
  const std::string full = py::str(o.attr("dtype"));
  *name = full.rfind("torch.", 0) == 0 ? full.substr(6) : full;
  py::object t = o.attr("detach")().attr("contiguous")();
  if (t.attr("element_size")().cast<int>() == 1) t = t.attr("view")(torch_module().attr("uint8"));
  return t.attr("cpu")().attr("numpy")();
}

py::object torch_module() { return py::module_::import("torch"); }

py::object as_output(py::array a, bool torch) {
  if (!torch) return a;
  return torch_module().attr("from_numpy")(a);
}

py::object torch_scale_dtype(TensorFormat f) {
  return torch_module().attr(f == TensorFormat::kNvfp4 ? "float8_e4m3fn" : "float8_e8m0fnu");
}

py::object scales_output(py::array a, TensorFormat f, bool torch) {
  if (!torch) return a;
  return as_output(a, true).attr("view")(torch_scale_dtype(f));
}

py::object dense_output(std::vector<float>&& v, int64_t rows, int64_t cols, DType dt, bool torch) {
  if (!torch || dt == DType::kF32) return as_output(to_numpy(std::move(v), {rows, cols}), torch);
  std::vector<int16_t> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    uint16_t b;
    if (dt == DType::kBF16) {
      b = format::f32_to_bf16(v[i]);
    } else if (std::isfinite(v[i]) && std::fabs(v[i]) >= 65520.0f) {  // past max + half ulp
      b = std::signbit(v[i]) ? 0xFC00 : 0x7C00;
    } else {
      b = format::f32_to_f16(v[i]);
    }
    std::memcpy(&h[i], &b, 2);
  }
  return as_output(to_numpy(std::move(h), {rows, cols}), true)
      .attr("view")(torch_module().attr(dt == DType::kBF16 ? "bfloat16" : "float16"));
}

}  // namespace scalesweep::python
