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

#include "scalesweep/base/names.h"
#include "scalesweep/base/option_error.h"
#ifdef SS_HAVE_CUDA
#include "scalesweep/cuda/quantize.h"
#endif
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

// ------------------------------------------------------------------ DLPack (torch tensors)
//
// Tensors of other libraries come in through the DLPack protocol: o.__dlpack__() hands over a
// capsule named "dltensor" holding a DLManagedTensor (the DLPack 0.x ABI below, what torch
// exports when no max_version is asked for); the consumer renames it "used_dltensor" and
// calls its deleter when done. The data is read in place: no copy for a row-major tensor
// (float32, float16 and bfloat16 are all read by the library as they are); a strided
// (non-contiguous) tensor is gathered into a row-major copy first.
namespace dl {
struct Device {
  int32_t type;
  int32_t id;
};
struct DataType {
  uint8_t code, bits;
  uint16_t lanes;
};
struct Tensor {
  void* data;
  Device device;
  int32_t ndim;
  DataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements; null = row-major
  uint64_t byte_offset;
};
struct Managed {
  Tensor t;
  void* manager_ctx;
  void (*deleter)(Managed*);
};
enum DeviceType : int32_t { kCPU = 1, kCUDA = 2, kCUDAHost = 3, kCUDAManaged = 13 };
enum TypeCode : uint8_t { kInt = 0, kUInt = 1, kFloat = 2, kBfloat = 4 };
}  // namespace dl

bool is_torch(const py::handle& o) {
  // sys.modules["torch"] may be None (a blocked import): then nothing is a torch tensor.
  const py::object torch = py::module_::import("sys").attr("modules").attr("get")("torch");
  return !torch.is_none() && py::hasattr(torch, "Tensor") &&
         py::isinstance(o, torch.attr("Tensor"));
}

bool is_dlpack(const py::handle& o) {
  return !py::isinstance<py::array>(o) && py::hasattr(o, "__dlpack__");
}

// The message for a CUDA tensor where it cannot go: a build without the CUDA kernels, or (with
// them) a function other than quantize / fake_quantize.
#ifdef SS_HAVE_CUDA
const char* const kNoCudaHint =
    "only quantize() and fake_quantize() take CUDA tensors; move the tensor to the CPU (.cpu())";
#else
const char* const kNoCudaHint =
    "this scalesweep was built without CUDA; move the tensor to the CPU (.cpu())";
#endif

// (device type, device id) of a DLPack tensor, without exporting it.
std::pair<int, int> dlpack_device(const py::handle& o) {
  if (!py::hasattr(o, "__dlpack_device__")) return {dl::kCPU, 0};
  const auto t = o.attr("__dlpack_device__")().cast<py::tuple>();
  return {t[0].cast<int>(), t[1].cast<int>()};
}

bool on_cuda(const py::handle& o) {
  if (!is_dlpack(o)) return false;
  const int type = dlpack_device(o).first;
  return type == dl::kCUDA || type == dl::kCUDAManaged;
}

// The element type's name for messages: torch's own ("torch.int32"), else the DLPack code.
std::string dl_dtype_name(const py::handle& o, const dl::DataType& t) {
  if (py::hasattr(o, "dtype")) return py::str(o.attr("dtype"));
  return "DLPack (code " + std::to_string(t.code) + ", " + std::to_string(t.bits) + " bits, " +
         std::to_string(t.lanes) + " lanes)";
}

// A CPU tensor borrowed through DLPack: `data` is valid while `owner` lives.
struct Borrowed {
  py::object owner;
  const void* data = nullptr;
  std::vector<int64_t> shape;
  dl::DataType dtype{};
  std::string dtype_name;
  bool copied = false;  // strided input gathered into a row-major copy
};

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

std::optional<DType> dl_float_dtype(const dl::DataType& t) {
  if (t.lanes != 1) return std::nullopt;
  if (t.code == dl::kFloat && t.bits == 32) return DType::kF32;
  if (t.code == dl::kFloat && t.bits == 16) return DType::kF16;
  if (t.code == dl::kBfloat && t.bits == 16) return DType::kBF16;
  return std::nullopt;
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "(";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + (s.size() == 1 ? ",)" : ")");
}

// A 2-D input tensor X[N, K].
struct Tensor2D {
  py::object keep;  // keeps the data alive while the GIL is released
  const void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t rows = 0, cols = 0;
  bool torch = false;   // results are returned as torch tensors
  bool copied = false;  // the data was copied (strided input)
  TensorRef ref() const { return {data, dtype, rows, cols}; }
};

// The 2-D checks shared by numpy and DLPack inputs.
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

// Importance weights: None, float32 [K] (per column) or [N, K] (per element), or for the
// *-hessian methods float64 [ceil(K/b), b, b] block Hessians (the diagonal blocks of the
// input's sum x x^T, block size b). Finiteness and sign are checked by the library (the message
// names the first bad index).
struct ImportanceArg {
  py::object keep;
  Importance imp;
};

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
  if (window) cfg.selector.window = Window{window->first, window->second};
  cfg.threads = threads;
  // The library's one validation (block, MXFP4 rules, C and gs, window, threads): its
  // OptionError becomes ValueError "<keyword>: <message>".
  validate(cfg);
  return cfg;
}

// A numpy array that owns a std::vector (no copy).
template <class T>
py::array_t<T> to_numpy(std::vector<T>&& v, std::vector<py::ssize_t> shape) {
  auto* heap = new std::vector<T>(std::move(v));
  py::capsule owner(heap, [](void* p) { delete static_cast<std::vector<T>*>(p); });
  return py::array_t<T>(std::move(shape), heap->data(), owner);
}

py::object torch_module() { return py::module_::import("torch"); }

// A result as the caller's kind: the numpy array, or (torch input) a torch tensor over the
// same memory (torch.from_numpy: no copy).
py::object as_output(py::array a, bool torch) {
  if (!torch) return a;
  return torch_module().attr("from_numpy")(a);
}

// The torch dtype of a block-scale format's bit patterns.
py::object torch_scale_dtype(TensorFormat f) {
  return torch_module().attr(f == TensorFormat::kNvfp4 ? "float8_e4m3fn" : "float8_e8m0fnu");
}

// Block-scale bit patterns: uint8 numpy, or torch float8_e4m3fn (nvfp4) / float8_e8m0fnu
// (mxfp4) over the same bytes.
py::object scales_output(py::array a, TensorFormat f, bool torch) {
  if (!torch) return a;
  return as_output(a, true).attr("view")(torch_scale_dtype(f));
}

// float32 values [rows, cols] as the caller's kind in dtype `dt`: numpy inputs always get
// float32 (as before); torch inputs get their own dtype, each value rounded to nearest even
// (overflow to Inf, as torch's .to(dtype)).
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
  bool torch = false;        // results as torch tensors (the input was one)
  py::object codes, scales;  // scales in `layout`
  py::object losses = py::none();
  // A CUDA result (codes/scales are device tensors, q holds no bytes): the row-major scales
  // and x_hat, written by the same kernel launch (state_dict, dequantize).
  py::object cuda_row_scales = py::none(), cuda_dequant = py::none();
};

#ifdef SS_HAVE_CUDA
// ------------------------------------------------------------------ CUDA tensors
//
// A torch CUDA tensor goes to the kernels of src/kernels/cuda (cuda/quantize.h) on its device
// and torch's current stream; the outputs are torch tensors allocated there. They implement
// NVFP4 with b = 16, the methods cuda::method_supported names and per-column importance;
// anything else is refused with a message (the CPU path has it: .cpu()).
struct CudaInput {
  py::object x;  // contiguous, detached
  py::object device;
  DType dtype = DType::kF32;
  int64_t rows = 0, cols = 0;
  py::object imp = py::none();  // float32 [cols] on the same device, or None
  float gs = 1.0f;
  uintptr_t stream = 0;
};

CudaInput cuda_input(const py::handle& xo, const py::handle& importance, const QuantConfig& cfg) {
  if (!is_torch(xo)) {
    throw py::value_error(
        "x: a CUDA tensor that is not a torch tensor; only torch CUDA "
        "tensors are supported (or move it to the CPU)");
  }
  py::object torch = torch_module();
  CudaInput c;
  c.x = xo.attr("detach")().attr("contiguous")();
  c.device = c.x.attr("device");
  const py::object dt = c.x.attr("dtype");
  if (dt.is(torch.attr("float32"))) {
    c.dtype = DType::kF32;
  } else if (dt.is(torch.attr("float16"))) {
    c.dtype = DType::kF16;
  } else if (dt.is(torch.attr("bfloat16"))) {
    c.dtype = DType::kBF16;
  } else {
    throw py::type_error("x: dtype " + std::string(py::str(dt)) +
                         " is not supported; use float32, float16 or bfloat16 (e.g. x.float())");
  }
  std::vector<int64_t> shape;
  for (auto d : c.x.attr("shape")) shape.push_back(d.cast<int64_t>());
  check_2d(shape, "x");
  c.rows = shape[0];
  c.cols = shape[1];
  auto refuse = [](const std::string& what) {
    throw py::value_error("CUDA tensors: " + what + "; move the tensor to the CPU (.cpu())");
  };
  if (cfg.format != TensorFormat::kNvfp4 || cfg.block != 16)
    refuse("the kernels implement nvfp4 with block 16 only");
  if (!cuda::method_supported(cfg.selector.method))
    refuse("method '" + std::string(kMethodNames.name(cfg.selector.method)) +
           "' has no CUDA kernel (absmax, 4over6, sweep-mse, sweep-wmse, exhaustive-mse, "
           "exhaustive-wmse have)");
  if (cfg.selector.window) refuse("the kernels have no window option");
  if (!importance.is_none()) {
    if (!is_torch(importance) || !on_cuda(importance))
      refuse("importance must be a torch float32 [K] tensor on the same device as x");
    py::object imp = importance.attr("detach")().attr("contiguous")();
    if (!imp.attr("dtype").is(torch.attr("float32")) || imp.attr("dim")().cast<int>() != 1 ||
        imp.attr("shape").attr("__getitem__")(0).cast<int64_t>() != c.cols ||
        !py::object(imp.attr("device")).equal(c.device)) {
      refuse("importance must be a float32 [K] tensor (per column) on x's device; got " +
             std::string(py::str(imp.attr("dtype"))) + " of shape " +
             std::string(py::str(imp.attr("shape"))) + " on " +
             std::string(py::str(imp.attr("device"))));
    }
    c.imp = imp;
  }
  // The global scale: given, or gs = 6C/amax from the tensor's amax (one reduction by torch).
  if (cfg.global_scale) {
    c.gs = *cfg.global_scale;
  } else {
    const float amax =
        c.x.attr("abs")().attr("amax")().attr("float")().attr("item")().cast<float>();
    if (std::isfinite(amax)) {
      const float C = cfg.max_block_scale.value_or(default_max_block_scale(cfg.selector.method));
      check_max_block_scale(C);
      c.gs = global_scale_for_amax(amax, C);
    }  // non-finite: the kernel reports the first bad element below
  }
  c.stream =
      torch.attr("cuda").attr("current_stream")(c.device).attr("cuda_stream").cast<uintptr_t>();
  return c;
}

// One launch; `fill` sets the outputs. Raises ValueError naming the first element that is
// non-finite or too large for the global scale (the CPU path's rule).
template <class Fill>
void cuda_launch(const CudaInput& c, Method m, const std::string& name, Fill&& fill) {
  py::object torch = torch_module();
  py::dict on_dev;
  on_dev["device"] = c.device;
  on_dev["dtype"] = torch.attr("int64");
  py::object bad = torch.attr("empty")(1, **on_dev);
  cuda::QuantizeArgs a;
  a.x = reinterpret_cast<const void*>(c.x.attr("data_ptr")().cast<uintptr_t>());
  a.dtype = c.dtype;
  a.rows = c.rows;
  a.cols = c.cols;
  a.method = m;
  a.global_scale = c.gs;
  if (!c.imp.is_none())
    a.importance = reinterpret_cast<const float*>(c.imp.attr("data_ptr")().cast<uintptr_t>());
  a.first_nonfinite = reinterpret_cast<int64_t*>(bad.attr("data_ptr")().cast<uintptr_t>());
  fill(a);
  {
    py::gil_scoped_release nogil;
    cuda::quantize(a, reinterpret_cast<cuda::CudaStream>(c.stream));  // validates first
  }
  const int64_t i = bad.attr("item")().cast<int64_t>();  // synchronizes the stream
  if (i != cuda::kNoBadIndex) {
    throw py::value_error("tensor '" + name + "': element " + index_string(i / c.cols, i % c.cols) +
                          " is non-finite or |x * global_scale| exceeds 2^48");
  }
}

template <class T>
T* dev_ptr(const py::object& t) {
  return reinterpret_cast<T*>(t.attr("data_ptr")().cast<uintptr_t>());
}

py::object cuda_empty(const CudaInput& c, py::tuple shape, const char* dtype) {
  py::dict kw;
  kw["device"] = c.device;
  kw["dtype"] = torch_module().attr(dtype);
  return torch_module().attr("empty")(shape, **kw);
}

PyQuantized cuda_quantize(const py::handle& xo, const py::handle& importance,
                          const QuantConfig& cfg, ScaleLayout layout, bool losses,
                          const std::string& name) {
  const CudaInput c = cuda_input(xo, importance, cfg);
  const int64_t nb = cuda::blocks_per_row(c.cols);
  PyQuantized r;
  r.torch = true;
  r.layout = layout;
  r.method = std::string(kMethodNames.name(cfg.selector.method));
  r.q.format = TensorFormat::kNvfp4;
  r.q.rows = c.rows;
  r.q.cols = c.cols;
  r.q.block = 16;
  r.q.global_scale = c.gs;
  r.codes = cuda_empty(c, py::make_tuple(c.rows, packed_cols(c.cols)), "uint8");
  r.cuda_row_scales = cuda_empty(c, py::make_tuple(c.rows, nb), "uint8");
  r.cuda_dequant = cuda_empty(c, py::make_tuple(c.rows, c.cols), "float32");
  py::object swz = py::none(), loss = py::none();
  if (layout == ScaleLayout::kSwizzled) {
    const SwizzledShape sh{c.rows, nb};
    swz = cuda_empty(c, py::make_tuple(sh.padded_rows(), sh.padded_blocks()), "uint8");
  }
  if (losses) loss = cuda_empty(c, py::make_tuple(c.rows, nb), "float32");
  cuda_launch(c, cfg.selector.method, name, [&](cuda::QuantizeArgs& a) {
    a.codes = dev_ptr<uint8_t>(r.codes);
    a.scales = dev_ptr<uint8_t>(r.cuda_row_scales);
    if (!swz.is_none()) a.scales_swizzled = dev_ptr<uint8_t>(swz);
    if (!loss.is_none()) a.block_loss = dev_ptr<float>(loss);
    a.dequant = dev_ptr<void>(r.cuda_dequant);
    a.dequant_dtype = DType::kF32;
  });
  py::object e4m3 = torch_scale_dtype(TensorFormat::kNvfp4);
  r.cuda_row_scales = r.cuda_row_scales.attr("view")(e4m3);
  r.scales = swz.is_none() ? r.cuda_row_scales : swz.attr("view")(e4m3);
  r.losses = loss;
  return r;
}

py::object cuda_fake_quantize(const py::handle& xo, const py::handle& importance,
                              const QuantConfig& cfg, const std::string& name) {
  const CudaInput c = cuda_input(xo, importance, cfg);
  const char* tname = c.dtype == DType::kF32   ? "float32"
                      : c.dtype == DType::kF16 ? "float16"
                                               : "bfloat16";
  py::object out = cuda_empty(c, py::make_tuple(c.rows, c.cols), tname);
  cuda_launch(c, cfg.selector.method, name, [&](cuda::QuantizeArgs& a) {
    a.dequant = dev_ptr<void>(out);
    a.dequant_dtype = c.dtype;  // the input's dtype, rounded to nearest even
  });
  return out;
}
#endif  // SS_HAVE_CUDA

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

// A torch tensor of 1-byte elements (uint8, float8_*) as a numpy uint8 array over its bytes
// (row-major: a strided tensor is copied by .contiguous()); other dtypes come back unviewed
// for the caller's dtype check. `name` gets the dtype's name without "torch.".
py::array torch_bytes(const py::handle& o, const char* what, std::string* name) {
  if (on_cuda(o)) throw py::value_error(std::string(what) + ": a CUDA tensor; " + kNoCudaHint);
  const std::string full = py::str(o.attr("dtype"));
  *name = full.rfind("torch.", 0) == 0 ? full.substr(6) : full;
  py::object t = o.attr("detach")().attr("contiguous")();
  if (t.attr("element_size")().cast<int>() == 1) t = t.attr("view")(torch_module().attr("uint8"));
  return t.attr("cpu")().attr("numpy")();
}

py::object dequantize_arrays(const py::handle& codes_o, const py::handle& scales_o,
                             std::optional<float> global_scale, int64_t cols, int block,
                             const std::string& format, const std::string& scale_layout) {
  const TensorFormat f = kTensorFormatNames.parse(format);
  const ScaleLayout layout = kScaleLayoutNames.parse(scale_layout);
  const bool torch = is_torch(codes_o);
  std::string codes_name, scales_name;
  py::array codes, scales;
  if (torch) {
    codes = torch_bytes(codes_o, "codes", &codes_name);
    codes_name = "torch." + codes_name;
  } else {
    codes = require_array(codes_o, "codes");
    codes_name = dtype_str(codes.dtype());
  }
  if (is_torch(scales_o)) {
    std::string n;
    scales = torch_bytes(scales_o, "scales", &n);
    check_scale_dtype(n, dt_itemsize(scales.dtype()), "torch." + n, f);
  } else {
    scales = require_array(scales_o, "scales");
    check_scale_dtype(py::str(scales.dtype().attr("name")), dt_itemsize(scales.dtype()),
                      dtype_str(scales.dtype()), f);
  }
  if (codes_name != "uint8" && codes_name != "torch.uint8") {
    throw py::type_error("codes: dtype " + codes_name +
                         " is not supported; use uint8 (two FP4 codes per byte)");
  }
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
    check_global_scale(gs);
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
  return as_output(to_numpy(std::move(out), {rows, cols}), torch);
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

py::dict error_metrics_py(const py::handle& xo, const py::handle& xhat_o,
                          const py::handle& importance) {
  const Tensor2D x = tensor_arg(xo, "x");
  py::object xh_keep;
  const float* xh_data = nullptr;
  if (is_dlpack(xhat_o)) {
    Borrowed b = borrow_dlpack(py::reinterpret_borrow<py::object>(xhat_o), "xhat");
    if (!(b.dtype.code == dl::kFloat && b.dtype.bits == 32 && b.dtype.lanes == 1)) {
      throw py::type_error("xhat: dtype " + b.dtype_name +
                           " is not supported; use float32 (what dequantize returns)");
    }
    if (b.shape != std::vector<int64_t>{x.rows, x.cols}) {
      throw py::value_error("xhat: shape " + shape_str(b.shape) + " does not match x of shape (" +
                            std::to_string(x.rows) + ", " + std::to_string(x.cols) + ")");
    }
    xh_keep = b.owner;
    xh_data = static_cast<const float*>(b.data);
  } else {
    py::array xh = require_array(xhat_o, "xhat");
    if (!(dt_kind(xh.dtype()) == 'f' && dt_itemsize(xh.dtype()) == 4)) {
      throw py::type_error("xhat: dtype " + dtype_str(xh.dtype()) +
                           " is not supported; use float32 (what dequantize returns)");
    }
    if (xh.ndim() != 2 || xh.shape(0) != x.rows || xh.shape(1) != x.cols) {
      throw py::value_error("xhat: shape " + shape_str(xh) + " does not match x of shape (" +
                            std::to_string(x.rows) + ", " + std::to_string(x.cols) + ")");
    }
    xh_keep = xh;
    xh_data = static_cast<const float*>(xh.data());
  }
  const ImportanceArg ia = importance_arg(importance, x);
  if (ia.imp.kind != ImportanceKind::kNone && ia.imp.kind != ImportanceKind::kBlockHessian) {
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
    resolve_global_scale(xh_data, DType::kF32, x.rows, x.cols, QuantConfig{}, "xhat");
    m = error_metrics(x.data, x.dtype, xh_data, x.rows, x.cols, ia.imp);
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
        check_max_block_scale(max_block_scale);
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
