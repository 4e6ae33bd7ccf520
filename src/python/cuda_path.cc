// The CUDA path of the Python module (cuda_path.h). This file is compiled only with the CUDA
// kernels (src/python/CMakeLists.txt adds it when the target ss_cuda exists).
#include "python/cuda_path.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "python/tensor_args.h"
#include "scalesweep/cuda/quantize.h"
#include "scalesweep/quant/index_string.h"
#include "scalesweep/quant/layout.h"
#include "scalesweep/scale/selector.h"

namespace scalesweep::python {
namespace {

// x and its importance as the kernels take them, with the global scale and torch's stream.
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
  cuda::QuantizeArgs a = cuda::input_args(
      reinterpret_cast<const void*>(c.x.attr("data_ptr")().cast<uintptr_t>()), c.dtype, c.rows,
      c.cols, m, c.gs,
      c.imp.is_none() ? nullptr
                      : reinterpret_cast<const float*>(c.imp.attr("data_ptr")().cast<uintptr_t>()));
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

}  // namespace

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

}  // namespace scalesweep::python
