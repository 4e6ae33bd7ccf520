#include "scalesweep/pipeline/tensor.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <span>
#include <stdexcept>
#include <utility>

#include "scalesweep/base/option_error.h"
#include "scalesweep/io/npy.h"
#include "scalesweep/io/safetensors.h"

namespace scalesweep::pipeline {
namespace {

std::string fmt_g(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

struct Input {
  std::string label;  // "x.npy" or "m.safetensors:w"
  int64_t rows = 0, cols = 0;
  std::vector<float> data;
  TensorRef ref() const { return tensor_ref(data.data(), rows, cols); }
};

QuantConfig cfg_for(QuantConfig cfg, Method m) {
  cfg.selector.method = m;
  return cfg;
}

std::string dir_of(const std::string& path) {
  const size_t s = path.rfind('/');
  if (s == std::string::npos) return ".";
  return s == 0 ? "/" : path.substr(0, s);
}

Input load_input(const std::string& spec) {
  Input in;
  in.label = spec;
  std::vector<int64_t> shape;
  std::string file, tensor;
  if (io::split_tensor_spec(spec, &file, &tensor)) {
    if (tensor.empty()) throw std::invalid_argument(spec + ": no tensor name after ':'");
    const auto f = io::SafetensorsFile::open(file);
    const auto& t = f.at(tensor);
    if (!io::dtype_is_float(t.dtype)) {
      throw std::invalid_argument(file + ": tensor '" + tensor + "' has dtype " +
                                  std::string(io::dtype_name(t.dtype)) +
                                  "; need F32, F16, BF16 or F64");
    }
    shape = t.shape;
    in.data = f.read_f32(t);
  } else if (spec.size() >= 12 && spec.compare(spec.size() - 12, 12, ".safetensors") == 0) {
    const auto f = io::SafetensorsFile::open(spec);
    std::string names;
    for (size_t i = 0; i < f.tensors().size() && i < 8; ++i) {
      names += (i ? ", " : "") + f.tensors()[i].name;
    }
    throw std::invalid_argument(spec + ": name a tensor as " + spec + ":TENSOR (it has " +
                                std::to_string(f.tensors().size()) + ": " + names + ")");
  } else {
    auto a = io::read_npy_f32(spec);
    shape = a.shape;
    in.data = std::move(a.data);
  }
  if (shape.size() != 2) {
    throw std::invalid_argument(spec + ": expected a 2-D tensor [N, K], got shape " +
                                io::shape_str(shape) +
                                (shape.size() == 1 ? " (reshape a vector to [1, K])" : ""));
  }
  if (shape[0] == 0 || shape[1] == 0) {
    throw std::invalid_argument(spec + ": tensor is empty (shape " + io::shape_str(shape) + ")");
  }
  in.rows = shape[0];
  in.cols = shape[1];
  return in;
}

struct LoadedImportance {
  Importance imp;
  std::vector<float> data;
  std::string path;
};

LoadedImportance load_importance(const std::string& path, const Input& in) {
  LoadedImportance li;
  if (path.empty()) return li;
  li.path = path;
  auto a = io::read_npy_f32(path);
  if (a.shape == std::vector<int64_t>{in.cols}) {
    li.imp.kind = ImportanceKind::kPerColumn;
  } else if (a.shape == std::vector<int64_t>{in.rows, in.cols}) {
    li.imp.kind = ImportanceKind::kPerElement;
  } else {
    throw std::invalid_argument(
        path + ": importance shape " + io::shape_str(a.shape) + " does not match " + in.label +
        " of shape [" + std::to_string(in.rows) + ", " + std::to_string(in.cols) + "]; expected [" +
        std::to_string(in.cols) + "] (per column) or [" + std::to_string(in.rows) + ", " +
        std::to_string(in.cols) + "] (per element)");
  }
  for (size_t i = 0; i < a.data.size(); ++i) {
    const float v = a.data[i];
    if (std::isfinite(v) && v >= 0) continue;
    const std::string idx = li.imp.kind == ImportanceKind::kPerColumn
                                ? std::string("[") + std::to_string(i) + "]"
                                : std::string("[") +
                                      std::to_string(i / static_cast<size_t>(in.cols)) + ", " +
                                      std::to_string(i % static_cast<size_t>(in.cols)) + "]";
    throw std::invalid_argument(path + ": importance element " + idx + " is " +
                                (std::isnan(v)   ? std::string("NaN")
                                 : std::isinf(v) ? std::string("infinite")
                                                 : "negative (" + fmt_g(v) + ")") +
                                "; importance must be finite and >= 0");
  }
  li.data = std::move(a.data);
  li.imp.data = li.data.data();
  return li;
}

// The request's configuration with method `m`, validated (quant::validate).
QuantConfig config_for(const TensorRequest& a, Method m) {
  QuantConfig cfg = a.config;
  cfg.selector.method = m;
  validate(cfg);
  return cfg;
}

void check_output(const TensorRequest& a, Method m) {
  if (m == Method::kOptFp32 && !a.output.empty() && !a.dequant)
    throw OptionError("dequant",
                      "opt-fp32 is a continuous lower bound with no FP8 scales: it has no packed "
                      "output; give it to write its dequantized tensor");
  if (!a.output.empty() && ::access(dir_of(a.output).c_str(), W_OK) != 0)
    throw OptionError("output", a.output + ": directory '" + dir_of(a.output) +
                                    "' does not exist or is not writable");
  if (a.dequant && a.output.empty()) throw OptionError("dequant", "needs an output file");
}

void write_output(const TensorRequest& a, const Input& in, const MethodRun& r,
                  const QuantConfig& cfg) {
  io::SafetensorsWriter w;
  if (r.q) {
    const auto& q = *r.q;
    w.add("weight_packed", io::StDType::kU8, {q.rows, q.packed_cols()},
          std::span<const uint8_t>(q.codes));
    w.add("weight_scale",
          q.format == TensorFormat::kNvfp4 ? io::StDType::kF8E4M3 : io::StDType::kU8,
          {q.rows, q.blocks_per_row()}, std::span<const uint8_t>(q.scales));
    if (q.format == TensorFormat::kNvfp4) {
      w.add_f32("weight_global_scale", {1}, std::vector<float>{q.global_scale});
    }
  }
  if (a.dequant) w.add_f32("dequant", {in.rows, in.cols}, r.xhat);
  w.set_metadata("source", in.label);
  w.set_metadata("method", std::string(kMethodNames.name(cfg.selector.method)));
  w.set_metadata("format", std::string(kTensorFormatNames.name(cfg.format)));
  w.set_metadata("block", std::to_string(cfg.block));
  w.set_metadata("scale_layout", "row-major [rows, ceil(cols/block)], not swizzled");
  w.set_metadata("nibble_order", "element 2i low nibble, 2i+1 high nibble");
  if (r.q && r.q->format == TensorFormat::kNvfp4) {
    w.set_metadata("weight_global_scale", "encode direction gs = 1/S = 6C/amax");
  }
  w.write(a.output);
}

TensorResult result_of(const Input& in, const LoadedImportance& li, const QuantConfig& cfg) {
  TensorResult res;
  res.input = in.label;
  res.rows = in.rows;
  res.cols = in.cols;
  res.importance = li.path;
  res.weighted = li.imp.kind != ImportanceKind::kNone;
  res.cfg = cfg;
  res.cfg.selector = SelectorConfig{};  // the base configuration: no method, no window
  return res;
}

}  // namespace

TensorResult quantize_tensor_file(const TensorRequest& a, const JobEvents& events) {
  if (!a.method)
    throw OptionError("method", "no method given (accepted: " + kMethodNames.accepted() +
                                    "), or compare every method");
  const Method m = *a.method;
  const QuantConfig cfg = config_for(a, m);
  check_output(a, m);
  if (a.before_load) a.before_load();

  const Input in = load_input(a.input);
  const LoadedImportance li = load_importance(a.importance, in);
  TensorResult res = result_of(in, li, cfg);
  // Progress over the runs: the method, then the opt-fp32 reference(s) for the gaps.
  const int64_t total = res.weighted ? 3 : 2;
  int64_t done = 0;
  events.step("tensor", "runs", 0, total);  // the job starts: its clock too
  Evaluation ev = evaluate(in.ref(), li.imp, cfg, in.label, [&] {
    ++done;
    events.step("tensor", "runs", done, total);
  });
  if (!a.output.empty()) write_output(a, in, ev.run, cfg);
  res.opt = std::move(ev.opt);
  res.results.push_back({std::move(ev.run), cfg, ev.gaps});
  return res;
}

TensorResult compare_tensor_file(const TensorRequest& a, const JobEvents& events) {
  if (a.method) throw OptionError("method", "a comparison runs every method; give none");
  if (!a.output.empty() || a.dequant)
    throw OptionError(a.dequant ? "dequant" : "output", "a comparison writes no tensor");
  const std::optional<Window> win = a.config.selector.window;
  const QuantConfig cfg = config_for(a, win ? Method::kSweep : Method::kAbsMax);
  if (a.before_load) a.before_load();
  const Input in = load_input(a.input);
  const LoadedImportance li = load_importance(a.importance, in);
  TensorResult res = result_of(in, li, cfg);

  std::vector<Method> methods;
  for (Method m : kMethodNames.values()) {
    if (m == Method::kSweep && !win) continue;  // needs a custom window
    if (method_uses_hessian(m)) continue;       // needs block Hessians (calibrated models)
    methods.push_back(m);
  }
  const int64_t total = static_cast<int64_t>(methods.size()) + (res.weighted ? 2 : 1);
  int64_t done = 0;
  events.step("compare", "runs", 0, total);  // the job starts: its clock too
  auto step = [&] {
    ++done;
    events.step("compare", "runs", done, total);
  };
  res.opt = opt_fp32_refs(in.ref(), li.imp, cfg, in.label, step);
  for (Method m : methods) {
    QuantConfig c = cfg_for(cfg, m);
    c.selector.window = m == Method::kSweep ? win : std::nullopt;
    MethodRun r = run_method(in.ref(), li.imp, c, in.label);
    r.xhat = {};
    r.q.reset();
    const Gaps g = gaps_to_opt(r.err, res.opt, r.method, res.weighted);
    res.results.push_back({std::move(r), c, g});
    step();
  }
  return res;
}

}  // namespace scalesweep::pipeline
