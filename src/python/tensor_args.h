// Tensor arguments of the Python module: numpy arrays and DLPack (torch) tensors in, checked
// (dtype, shape; TypeError or ValueError naming the argument), and results out as the
// caller's kind (numpy arrays, or torch tensors over the same memory).
//
// torch is never imported here: an argument is a torch tensor when torch is already loaded
// and it is an instance of torch.Tensor.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "scalesweep/format/dtype.h"
#include "scalesweep/quant/evaluate.h"
#include "scalesweep/quant/quantize.h"

namespace scalesweep::python {

namespace py = pybind11;

// ------------------------------------------------------------------ numpy arrays

std::string dtype_str(const py::dtype& d);
// "(a, b)" ("(a,)" for a vector), as numpy prints a shape.
std::string shape_str(const py::array& a);
std::string shape_str(const std::vector<int64_t>& s);
// Index of flat element i of an array of the given shape, "[a, b, ...]".
std::string nd_index(const std::vector<int64_t>& shape, int64_t i);
std::vector<int64_t> shape_of(const py::array& a);

// The argument as a numpy array (TypeError otherwise), C-contiguous and aligned (a copy only
// when it is not already).
py::array require_array(const py::handle& o, const char* what);

// dtype fields through the Python attributes: pybind11 2.10 reads them from the C struct of
// NumPy 1.x, whose layout NumPy 2 changed (its itemsize would be wrong).
int dt_itemsize(const py::dtype& d);
char dt_kind(const py::dtype& d);

// Input element type of a float array: float32, float16 or ml_dtypes.bfloat16.
std::optional<DType> float_dtype(const py::dtype& d);

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

bool is_torch(const py::handle& o);
bool is_dlpack(const py::handle& o);
bool on_cuda(const py::handle& o);

// The message for a CUDA tensor where it cannot go: a build without the CUDA kernels, or (with
// them) a function other than quantize / fake_quantize.
#ifdef SS_HAVE_CUDA
inline constexpr const char* kNoCudaHint =
    "only quantize() and fake_quantize() take CUDA tensors; move the tensor to the CPU (.cpu())";
#else
inline constexpr const char* kNoCudaHint =
    "this scalesweep was built without CUDA; move the tensor to the CPU (.cpu())";
#endif

// A CPU tensor borrowed through DLPack: `data` is valid while `owner` lives.
struct Borrowed {
  py::object owner;
  const void* data = nullptr;
  std::vector<int64_t> shape;
  dl::DataType dtype{};
  std::string dtype_name;
  bool copied = false;  // strided input gathered into a row-major copy
};

Borrowed borrow_dlpack(py::object o, const char* what);

// ------------------------------------------------------------------ checked arguments

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
void check_2d(const std::vector<int64_t>& shape, const char* what);

// A float32/float16/bfloat16 2-D numpy array or DLPack tensor.
Tensor2D tensor_arg(const py::handle& o, const char* what);

// Importance weights: None, float32 [K] (per column) or [N, K] (per element), or for the
// *-hessian methods float64 [ceil(K/b), b, b] block Hessians (the diagonal blocks of the
// input's sum x x^T, block size b). Finiteness and sign are checked by the library (the message
// names the first bad index).
struct ImportanceArg {
  py::object keep;
  Importance imp;
};

ImportanceArg importance_arg(const py::handle& o, const Tensor2D& x);

// A torch tensor of 1-byte elements (uint8, float8_*) as a numpy uint8 array over its bytes
// (row-major: a strided tensor is copied by .contiguous()); other dtypes come back unviewed
// for the caller's dtype check. `name` gets the dtype's name without "torch.".
py::array torch_bytes(const py::handle& o, const char* what, std::string* name);

// ------------------------------------------------------------------ results

// A numpy array that owns a std::vector (no copy).
template <class T>
py::array_t<T> to_numpy(std::vector<T>&& v, std::vector<py::ssize_t> shape) {
  auto* heap = new std::vector<T>(std::move(v));
  py::capsule owner(heap, [](void* p) { delete static_cast<std::vector<T>*>(p); });
  return py::array_t<T>(std::move(shape), heap->data(), owner);
}

py::object torch_module();

// A result as the caller's kind: the numpy array, or (torch input) a torch tensor over the
// same memory (torch.from_numpy: no copy).
py::object as_output(py::array a, bool torch);

// The torch dtype of a block-scale format's bit patterns.
py::object torch_scale_dtype(TensorFormat f);

// Block-scale bit patterns: uint8 numpy, or torch float8_e4m3fn (nvfp4) / float8_e8m0fnu
// (mxfp4) over the same bytes.
py::object scales_output(py::array a, TensorFormat f, bool torch);

// float32 values [rows, cols] as the caller's kind in dtype `dt`: numpy inputs always get
// float32 (as before); torch inputs get their own dtype, each value rounded to nearest even
// (overflow to Inf, as torch's .to(dtype)).
py::object dense_output(std::vector<float>&& v, int64_t rows, int64_t cols, DType dt, bool torch);

}  // namespace scalesweep::python
