// scalesweep tensor: NVFP4 / MXFP4 quantization of one 2-D tensor with one block-scale
// selector, or a comparison of every selector on it (--compare).
//
//   scalesweep tensor IN --method M [--importance W.npy] [--block B] [--max-block-scale C]
//                     [--global-scale GS] [--window L,R] [--format nvfp4|mxfp4] [--threads T]
//                     [-o OUT.safetensors [--force]] [--dequant] [--json]
//   scalesweep tensor IN --compare [--importance W.npy] [...] [--json]
//
// IN is a 2-D .npy (float32/float16/float64) or FILE.safetensors:TENSOR (F32/F16/BF16/F64).
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "scalesweep/io/npy.h"
#include "scalesweep/io/safetensors.h"
#include "scalesweep/quant/quantize.h"
#include "tools/command.h"
#include "tools/output.h"
#include "tools/ui.h"

namespace scalesweep::tools {
namespace {

using nlohmann::json;

struct TensorArgs {
  std::string input, method, importance, window, format = "nvfp4", output;
  int block = 16;
  std::optional<float> max_block_scale, global_scale;
  int threads = 0;
  bool dequant = false, json_out = false, compare = false, force = false;
};

struct Input {
  std::string label;  // "x.npy" or "m.safetensors:w"
  int64_t rows = 0, cols = 0;
  std::vector<float> data;
};

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
                                ? "[" + std::to_string(i) + "]"
                                : "[" + std::to_string(i / static_cast<size_t>(in.cols)) + ", " +
                                      std::to_string(i % static_cast<size_t>(in.cols)) + "]";
    throw std::invalid_argument(path + ": importance element " + idx + " is " +
                                (std::isnan(v)   ? std::string("NaN")
                                 : std::isinf(v) ? std::string("infinite")
                                                 : "negative (" + strf("%g", v) + ")") +
                                "; importance must be finite and >= 0");
  }
  li.data = std::move(a.data);
  li.imp.data = li.data.data();
  return li;
}

Window parse_window(const std::string& s) {
  int lo = 0, hi = 0;
  char extra = 0;
  if (std::sscanf(s.c_str(), "%d,%d%c", &lo, &hi, &extra) != 2) {
    throw std::invalid_argument("--window '" + s + "': expected L,R (two integers, e.g. -3,7)");
  }
  if (lo > hi) {
    throw std::invalid_argument("--window " + s + ": L (" + std::to_string(lo) + ") > R (" +
                                std::to_string(hi) + ")");
  }
  if (lo < -126 || hi > 126) {
    throw std::invalid_argument("--window " + s + ": offsets must lie in [-126, 126]");
  }
  return Window{lo, hi};
}

TensorFormat parse_format(const std::string& s) {
  if (s == "nvfp4") return TensorFormat::kNvfp4;
  if (s == "mxfp4") return TensorFormat::kMxfp4;
  throw std::invalid_argument("--format '" + s + "': expected nvfp4 or mxfp4");
}

QuantConfig base_config(const TensorArgs& a) {
  QuantConfig cfg;
  cfg.format = parse_format(a.format);
  cfg.block = a.block;
  if (cfg.block != 8 && cfg.block != 16 && cfg.block != 32 && cfg.block != 64) {
    throw std::invalid_argument("--block " + std::to_string(a.block) +
                                ": block size must be 8, 16, 32 or 64");
  }
  if (cfg.format == TensorFormat::kMxfp4 && cfg.block != 32) {
    throw std::invalid_argument("--format mxfp4 requires --block 32 (got " +
                                std::to_string(a.block) + ")");
  }
  if (a.max_block_scale) {
    const float c = *a.max_block_scale;
    if (!(c > 0.0f && c <= 448.0f)) {
      throw std::invalid_argument("--max-block-scale " + strf("%g", c) +
                                  ": C must satisfy 0 < C <= 448 (the largest FP8 E4M3 value)");
    }
  }
  if (a.global_scale && !(*a.global_scale > 0.0f && std::isfinite(*a.global_scale))) {
    throw std::invalid_argument("--global-scale " + strf("%g", *a.global_scale) +
                                ": must be a finite value > 0");
  }
  if (a.global_scale && a.max_block_scale) {
    throw std::invalid_argument(
        "--global-scale and --max-block-scale both set the global scale; give one");
  }
  if (cfg.format == TensorFormat::kMxfp4 && (a.global_scale || a.max_block_scale)) {
    throw std::invalid_argument(
        "MXFP4 has no global scale: --global-scale/--max-block-scale "
        "do not apply");
  }
  if (a.threads < 0) throw std::invalid_argument("--threads must be >= 0 (0 = all cores)");
  cfg.max_block_scale = a.max_block_scale;
  cfg.global_scale = a.global_scale;
  cfg.threads = a.threads;
  return cfg;
}

struct MethodRun {
  Method method;
  std::optional<QuantizedTensor> q;  // absent for opt-fp32
  std::vector<float> xhat;
  ErrorMetrics err;
  double seconds = 0;
  float global_scale = 1;
};

MethodRun run_method(const Input& in, const Importance& imp, QuantConfig cfg, Method m) {
  cfg.selector.method = m;
  MethodRun r;
  r.method = m;
  const auto t0 = std::chrono::steady_clock::now();
  if (m == Method::kOptFp32) {
    r.xhat = fake_quantize(in.data.data(), in.rows, in.cols, imp, cfg, in.label);
    r.global_scale =
        resolve_global_scale(in.data.data(), DType::kF32, in.rows, in.cols, cfg, in.label);
  } else {
    r.q = quantize(in.data.data(), in.rows, in.cols, imp, cfg, in.label);
    r.xhat = dequantize(*r.q);
    r.global_scale = r.q->global_scale;
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.err = error_metrics(in.data.data(), r.xhat.data(), in.rows, in.cols, imp);
  return r;
}

// The two opt-fp32 references: unweighted (for NMSE gaps) and weighted (for NWMSE gaps).
struct OptRefs {
  double nmse = 0, nwmse = 0;
};
// `step` is called after each of the (one or two) runs, for a progress bar.
OptRefs opt_refs(const Input& in, const Importance& imp, QuantConfig cfg,
                 const std::function<void()>& step) {
  cfg.selector.window.reset();  // a sweep window does not apply to opt-fp32
  OptRefs o;
  const MethodRun plain = run_method(in, Importance{}, cfg, Method::kOptFp32);
  step();
  o.nmse = plain.err.nmse;
  if (imp.kind == ImportanceKind::kNone) {
    o.nwmse = plain.err.nwmse;
  } else {
    o.nwmse = run_method(in, imp, cfg, Method::kOptFp32).err.nwmse;
    step();
  }
  return o;
}

json result_json(const MethodRun& r, const TensorArgs& a, const QuantConfig& cfg,
                 const OptRefs& opt, bool weighted_imp) {
  const double gap_n = gap_percent(r.err.nmse, opt.nmse);
  const double gap_w = gap_percent(r.err.nwmse, opt.nwmse);
  json j;
  j["method"] = std::string(method_name(r.method));
  j["format"] = a.format;
  j["block"] = cfg.block;
  if (cfg.format == TensorFormat::kNvfp4) {
    if (cfg.global_scale) {
      j["max_block_scale"] = nullptr;
    } else {
      j["max_block_scale"] = cfg.max_block_scale.value_or(default_max_block_scale(r.method));
    }
  }
  j["global_scale"] = r.global_scale;
  j["nmse"] = r.err.nmse;
  j["nwmse"] = r.err.nwmse;
  j["opt_fp32_nmse"] = opt.nmse;
  j["opt_fp32_nwmse"] = opt.nwmse;
  j["gap_nmse_pct"] = gap_n;
  j["gap_nwmse_pct"] = gap_w;
  // The gap in the method's own objective (weighted methods with importance: NWMSE).
  j["gap_vs_opt_fp32_pct"] =
      (weighted_imp && (method_is_weighted(r.method) || r.method == Method::kSweep)) ? gap_w
                                                                                     : gap_n;
  j["seconds"] = r.seconds;
  return j;
}

std::string pct(double v) { return std::isfinite(v) ? strf("%.2f%%", v) : "inf"; }

int run_single(const TensorArgs& a) {
  if (a.method.empty()) throw std::invalid_argument("give --method M, or --compare");
  const Method m = parse_method(a.method);
  QuantConfig cfg = base_config(a);
  if (!a.window.empty()) cfg.selector.window = parse_window(a.window);
  if (m == Method::kSweep && !cfg.selector.window) {
    throw std::invalid_argument(
        "--method sweep needs --window L,R (offsets around the base "
        "scale pattern, e.g. -3,7)");
  }
  if (cfg.selector.window && m != Method::kSweep && m != Method::kSweepMse &&
      m != Method::kSweepWmse) {
    throw std::invalid_argument("--window applies only to sweep, sweep-mse and sweep-wmse");
  }
  if (m == Method::kOptFp32 && !a.output.empty() && !a.dequant) {
    throw std::invalid_argument(
        "opt-fp32 is a continuous lower bound with no FP8 scales: it "
        "has no packed output; add --dequant to write its dequantized "
        "tensor");
  }
  if (!a.output.empty() && ::access(dir_of(a.output).c_str(), W_OK) != 0) {
    throw std::invalid_argument("-o " + a.output + ": directory '" + dir_of(a.output) +
                                "' does not exist or is not writable");
  }
  if (a.dequant && a.output.empty()) throw std::invalid_argument("--dequant needs -o OUT");
  if (!a.output.empty()) {
    std::string file, tensor;
    check_output_file(
        a.output, "-o", a.force,
        {io::split_tensor_spec(a.input, &file, &tensor) ? file : a.input, a.importance});
  }

  const Input in = load_input(a.input);
  const LoadedImportance li = load_importance(a.importance, in);
  // Progress over the runs: the method, then the opt-fp32 reference(s) for the gaps.
  const bool weighted = li.imp.kind != ImportanceKind::kNone;
  ProgressBar bar("tensor", weighted ? 3 : 2, "runs");
  int64_t done = 0;
  const MethodRun r = run_method(in, li.imp, cfg, m);
  bar.update(++done);
  const OptRefs opt = opt_refs(in, li.imp, cfg, [&] { bar.update(++done); });
  bar.finish();

  if (!a.output.empty()) {
    io::SafetensorsWriter w;
    if (r.q) {
      const auto& q = *r.q;
      w.add("weight_packed", io::StDType::kU8, {q.rows, q.packed_cols()},
            std::span<const uint8_t>(q.codes));
      w.add("weight_scale", q.format == TensorFormat::kNvfp4 ? io::StDType::kF8E4M3 : io::StDType::kU8,
            {q.rows, q.blocks_per_row()}, std::span<const uint8_t>(q.scales));
      if (q.format == TensorFormat::kNvfp4) {
        w.add_f32("weight_global_scale", {1}, std::vector<float>{q.global_scale});
      }
    }
    if (a.dequant) w.add_f32("dequant", {in.rows, in.cols}, r.xhat);
    w.set_metadata("source", in.label);
    w.set_metadata("method", std::string(method_name(m)));
    w.set_metadata("format", a.format);
    w.set_metadata("block", std::to_string(cfg.block));
    w.set_metadata("scale_layout", "row-major [rows, ceil(cols/block)], not swizzled");
    w.set_metadata("nibble_order", "element 2i low nibble, 2i+1 high nibble");
    if (r.q && r.q->format == TensorFormat::kNvfp4) {
      w.set_metadata("weight_global_scale", "encode direction gs = 1/S = 6C/amax");
    }
    w.write(a.output);
  }

  const bool weighted_imp = li.imp.kind != ImportanceKind::kNone;
  json j = result_json(r, a, cfg, opt, weighted_imp);
  j["input"] = in.label;
  j["shape"] = {in.rows, in.cols};
  j["importance"] = li.path.empty() ? json(nullptr) : json(li.path);
  j["output"] = a.output.empty() ? json(nullptr) : json(a.output);
  if (a.json_out) {
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("%s [%lld, %lld]  %s b=%d  method %s  global scale %.9g\n", in.label.c_str(),
              static_cast<long long>(in.rows), static_cast<long long>(in.cols), a.format.c_str(),
              cfg.block, a.method.c_str(), r.global_scale);
  Table t({"metric", "value", "opt-fp32", "gap"});
  t.add_row({"NMSE", strf("%.6e", r.err.nmse), strf("%.6e", opt.nmse),
             pct(j["gap_nmse_pct"].get<double>())});
  t.add_row({weighted_imp ? "NWMSE" : "NWMSE (no importance)", strf("%.6e", r.err.nwmse),
             strf("%.6e", opt.nwmse), pct(j["gap_nwmse_pct"].get<double>())});
  t.print();
  std::printf("time %.3f s", r.seconds);
  if (!a.output.empty()) std::printf("; wrote %s", a.output.c_str());
  std::printf("\n");
  return 0;
}

int run_compare(const TensorArgs& a) {
  if (!a.method.empty()) throw std::invalid_argument("--compare runs every method; drop --method");
  if (!a.output.empty() || a.dequant) {
    throw std::invalid_argument("--compare writes no tensor; drop -o/--dequant");
  }
  QuantConfig cfg = base_config(a);
  std::optional<Window> win;
  if (!a.window.empty()) win = parse_window(a.window);
  const Input in = load_input(a.input);
  const LoadedImportance li = load_importance(a.importance, in);
  const bool weighted_imp = li.imp.kind != ImportanceKind::kNone;

  std::vector<Method> methods;
  for (Method m : all_methods()) {
    if (m == Method::kSweep && !win) continue;  // needs a custom window
    methods.push_back(m);
  }
  ProgressBar bar("compare", static_cast<int64_t>(methods.size()) + (weighted_imp ? 2 : 1), "runs");
  int64_t done = 0;
  const OptRefs opt = opt_refs(in, li.imp, cfg, [&] { bar.update(++done); });
  json rows = json::array();
  for (Method m : methods) {
    QuantConfig c = cfg;
    if (m == Method::kSweep) c.selector.window = win;
    const MethodRun r = run_method(in, li.imp, c, m);
    rows.push_back(result_json(r, a, c, opt, weighted_imp));
    bar.update(++done);
  }
  bar.finish();
  if (a.json_out) {
    json j;
    j["input"] = in.label;
    j["shape"] = {in.rows, in.cols};
    j["importance"] = li.path.empty() ? json(nullptr) : json(li.path);
    j["format"] = a.format;
    j["block"] = cfg.block;
    j["results"] = rows;
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("%s [%lld, %lld]  %s b=%d  importance: %s\n", in.label.c_str(),
              static_cast<long long>(in.rows), static_cast<long long>(in.cols), a.format.c_str(),
              cfg.block, li.path.empty() ? "none" : li.path.c_str());
  std::vector<std::string> hdr = {"method"};
  if (cfg.format == TensorFormat::kNvfp4) hdr.push_back("C");
  for (const char* h : {"NMSE", "gap NMSE", "NWMSE", "gap NWMSE", "time s"}) hdr.push_back(h);
  Table t(hdr);
  for (const auto& r : rows) {
    std::vector<std::string> row = {r["method"].get<std::string>()};
    if (cfg.format == TensorFormat::kNvfp4) {
      row.push_back(
          r["max_block_scale"].is_null() ? "gs" : strf("%g", r["max_block_scale"].get<double>()));
    }
    row.push_back(strf("%.5e", r["nmse"].get<double>()));
    row.push_back(pct(r["gap_nmse_pct"].get<double>()));
    row.push_back(strf("%.5e", r["nwmse"].get<double>()));
    row.push_back(pct(r["gap_nwmse_pct"].get<double>()));
    row.push_back(strf("%.3f", r["seconds"].get<double>()));
    t.add_row(row);
  }
  t.print();
  std::printf("gaps are relative to opt-fp32 (the exact continuous optimum per block)%s\n",
              weighted_imp ? "; NWMSE gaps to the weighted optimum" : "");
  return 0;
}

SS_COMMAND("tensor", "Quantize one 2-D tensor to NVFP4/MXFP4 (or --compare every method)",
           [](CLI::App& sub) -> std::function<int()> {
             auto a = std::make_shared<TensorArgs>();
             sub.add_option("input", a->input,
                            "2-D .npy (float32/float16/float64) or FILE.safetensors:TENSOR")
                 ->required();
             sub.add_option("--method", a->method,
                            "absmax | 4over6 | sweep-mse | sweep-wmse | sweep | exhaustive-mse | "
                            "exhaustive-wmse | opt-fp8-mse | opt-fp8-wmse | opt-fp32");
             sub.add_flag("--compare", a->compare, "run every method, print one row each");
             sub.add_option("--importance", a->importance,
                            "importance weights .npy, shape [K] or [N, K] (WMSE methods)");
             sub.add_option("--block", a->block, "block size 8 | 16 | 32 | 64 (default 16)");
             sub.add_option("--max-block-scale", a->max_block_scale,
                            "C in S = amax/(6C) (default 448 for absmax, 256 otherwise)");
             sub.add_option("--global-scale", a->global_scale,
                            "explicit encode-direction global scale gs = 1/S");
             sub.add_option("--window", a->window,
                            "sweep offsets L,R around the base scale pattern (sweep*)");
             sub.add_option("--format", a->format, "nvfp4 (default) | mxfp4");
             sub.add_option("--threads", a->threads, "threads (0 = all cores)");
             sub.add_option("-o,--output", a->output, "output .safetensors");
             add_force_flag(sub, a->force);
             sub.add_flag("--dequant", a->dequant, "also store the dequantized tensor");
             sub.add_flag("--json", a->json_out, "print one JSON object");
             return [a] { return a->compare ? run_compare(*a) : run_single(*a); };
           });

}  // namespace
}  // namespace scalesweep::tools
