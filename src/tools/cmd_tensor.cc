// scalesweep tensor: NVFP4 / MXFP4 quantization of one 2-D tensor with one block-scale
// selector, or a comparison of every selector on it (--compare); the jobs are
// pipeline::quantize_tensor_file and pipeline::compare_tensor_file.
//
//   scalesweep tensor IN --method M [--importance W.npy] [--block B] [--max-block-scale C]
//                     [--global-scale GS] [--window L,R] [--format nvfp4|mxfp4] [--threads T]
//                     [-o OUT.safetensors [--force]] [--dequant] [--json]
//   scalesweep tensor IN --compare [--importance W.npy] [...] [--json]
//
// IN is a 2-D .npy (float32/float16/float64) or FILE.safetensors:TENSOR (F32/F16/BF16/F64).
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "scalesweep/io/safetensors.h"
#include "scalesweep/pipeline/tensor.h"
#include "tools/command.h"
#include "tools/options.h"
#include "tools/output.h"
#include "tools/ui.h"

namespace scalesweep::tools {
namespace {

using nlohmann::json;

struct TensorArgs {
  pipeline::TensorRequest req;  // input, importance, output, dequant
  QuantOptions q;               // method: none (--compare); block: 16 unless given
  bool json_out = false, compare = false, force = false;
};

// The request with the quantization options parsed (validated by the pipeline call).
pipeline::TensorRequest request_of(const TensorArgs& a) {
  pipeline::TensorRequest req = a.req;
  req.config = parse_quant_settings(a.q);
  if (!a.q.method.empty()) req.method = req.config.selector.method;
  return req;
}

json result_json(const pipeline::TensorMethodResult& m, const OptFp32Refs& opt) {
  const MethodRun& r = m.run;
  const QuantConfig& cfg = m.cfg;
  json j;
  j["method"] = std::string(kMethodNames.name(r.method));
  j["format"] = std::string(kTensorFormatNames.name(cfg.format));
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
  j["opt_fp32_nmse"] = opt.nmse();
  j["opt_fp32_nwmse"] = opt.nwmse();
  j["gap_nmse_pct"] = m.gaps.nmse_pct;
  j["gap_nwmse_pct"] = m.gaps.nwmse_pct;
  j["gap_vs_opt_fp32_pct"] = m.gaps.own_pct;  // the gap in the method's own objective
  j["seconds"] = r.seconds;
  return j;
}

std::string pct(double v) { return std::isfinite(v) ? strf("%.2f%%", v) : "inf"; }

int run_single(const TensorArgs& a) {
  pipeline::TensorRequest req = request_of(a);
  if (!req.output.empty()) {
    req.before_load = [&a] {
      std::string file, tensor;
      check_output_file(a.req.output, "-o", a.force,
                        {io::split_tensor_spec(a.req.input, &file, &tensor) ? file : a.req.input,
                         a.req.importance});
    };
  }
  StageBars bars;
  const pipeline::TensorResult res = pipeline::quantize_tensor_file(req, cli_events(bars));
  bars.finish();
  const pipeline::TensorMethodResult& m = res.results.at(0);
  const MethodRun& r = m.run;
  json j = result_json(m, res.opt);
  j["input"] = res.input;
  j["shape"] = {res.rows, res.cols};
  j["importance"] = res.importance.empty() ? json(nullptr) : json(res.importance);
  j["output"] = req.output.empty() ? json(nullptr) : json(req.output);
  if (a.json_out) {
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("%s [%lld, %lld]  %s b=%d  method %s  global scale %.9g\n", res.input.c_str(),
              static_cast<long long>(res.rows), static_cast<long long>(res.cols),
              kTensorFormatNames.name(m.cfg.format).data(), m.cfg.block, a.q.method.c_str(),
              r.global_scale);
  Table t({"metric", "value", "opt-fp32", "gap"});
  t.add_row({"NMSE", strf("%.6e", r.err.nmse), strf("%.6e", res.opt.nmse()), pct(m.gaps.nmse_pct)});
  t.add_row({res.weighted ? "NWMSE" : "NWMSE (no importance)", strf("%.6e", r.err.nwmse),
             strf("%.6e", res.opt.nwmse()), pct(m.gaps.nwmse_pct)});
  t.print();
  std::printf("time %.3f s", r.seconds);
  if (!req.output.empty()) std::printf("; wrote %s", req.output.c_str());
  std::printf("\n");
  return 0;
}

int run_compare(const TensorArgs& a) {
  StageBars bars;
  const pipeline::TensorResult res = pipeline::compare_tensor_file(request_of(a), cli_events(bars));
  bars.finish();
  const QuantConfig& cfg = res.cfg;
  json rows = json::array();
  for (const auto& m : res.results) rows.push_back(result_json(m, res.opt));
  if (a.json_out) {
    json j;
    j["input"] = res.input;
    j["shape"] = {res.rows, res.cols};
    j["importance"] = res.importance.empty() ? json(nullptr) : json(res.importance);
    j["format"] = std::string(kTensorFormatNames.name(cfg.format));
    j["block"] = cfg.block;
    j["results"] = rows;
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("%s [%lld, %lld]  %s b=%d  importance: %s\n", res.input.c_str(),
              static_cast<long long>(res.rows), static_cast<long long>(res.cols),
              kTensorFormatNames.name(cfg.format).data(), cfg.block,
              res.importance.empty() ? "none" : res.importance.c_str());
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
              res.weighted ? "; NWMSE gaps to the weighted optimum" : "");
  return 0;
}

SS_COMMAND("tensor", "Quantize one 2-D tensor to NVFP4/MXFP4 (or --compare every method)",
           [](CLI::App& sub) -> std::function<int()> {
             auto a = std::make_shared<TensorArgs>();
             a->q.method.clear();
             a->q.block = 16;
             sub.add_option("input", a->req.input,
                            "2-D .npy (float32/float16/float64) or FILE.safetensors:TENSOR")
                 ->required();
             sub.add_option("--method", a->q.method,
                            "absmax | 4over6 | sweep-mse | sweep-wmse | sweep | exhaustive-mse | "
                            "exhaustive-wmse | opt-fp8-mse | opt-fp8-wmse | opt-fp32");
             sub.add_flag("--compare", a->compare, "run every method, print one row each");
             sub.add_option("--importance", a->req.importance,
                            "importance weights .npy, shape [K] or [N, K] (WMSE methods)");
             sub.add_option("--block", a->q.block, "block size 8 | 16 | 32 | 64");
             sub.add_option("--max-block-scale", a->q.max_block_scale,
                            "C in S = amax/(6C); unset: 448 for absmax, 256 otherwise");
             sub.add_option("--global-scale", a->q.global_scale,
                            "explicit encode-direction global scale gs = 1/S");
             sub.add_option("--window", a->q.window,
                            "sweep offsets L,R around the base scale pattern (sweep*)");
             sub.add_option("--format", a->q.format, "nvfp4 | mxfp4");
             sub.add_option("--threads", a->q.threads, "threads (0 = all cores)");
             sub.add_option("-o,--output", a->req.output, "output .safetensors");
             add_force_flag(sub, a->force);
             sub.add_flag("--dequant", a->req.dequant, "also store the dequantized tensor");
             sub.add_flag("--json", a->json_out, "print one JSON object");
             return [a] { return a->compare ? run_compare(*a) : run_single(*a); };
           });

}  // namespace
}  // namespace scalesweep::tools
