// scalesweep quantize: RTN or GPTQ NVFP4 quantization of a whole model into a
// compressed-tensors checkpoint (vLLM-loadable); scalesweep inspect: reads such a checkpoint
// back (any producer's) and optionally dumps its dequantized weights; scalesweep gptq-bench:
// times blocked GPTQ against the unblocked reference path on one large layer.
#include <cblas.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "scalesweep/gptq/gptq.h"
#include "scalesweep/io/calib_stats.h"
#include "scalesweep/io/compressed_tensors.h"
#include "scalesweep/io/gguf.h"
#include "scalesweep/io/hf.h"
#include "scalesweep/io/load.h"
#include "scalesweep/io/safetensors.h"
#include "scalesweep/pipeline/quantize_model.h"
#include "tools/calib_cli.h"
#include "tools/command.h"
#include "tools/inspect_gguf.h"
#include "tools/output.h"
#include "tools/ui.h"

namespace scalesweep::tools {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct QuantizeArgs {
  std::string model, out, method = "sweep-mse", calib, stats, tokenizer, quant = "W";
  std::string dense = "auto", partial_blocks = "dense", max_shard_size = "5GB";
  int64_t nsamples = 128, seqlen = 512;
  uint64_t seed = 0;
  int block = 16, gptq_block = 128, threads = 0, tp = 1;
  double damp = 0.01;
  bool gptq = false, no_act_order = false, overwrite = false, json_out = false;
  bool no_stream = false, no_sequential = false;
};

int run_quantize(const QuantizeArgs& a) {
  pipeline::QuantizeRequest rq;
  pipeline::QuantizeOptions& o = rq.options;
  o.method = parse_method(a.method);
  o.block = a.block;
  o.gptq = a.gptq;
  o.damp = a.damp;
  o.gptq_block = a.gptq_block;
  o.act_order = !a.no_act_order;
  o.threads = a.threads;
  if (a.quant == "W" || a.quant == "WA") {
    o.w4a4 = a.quant == "WA";
  } else {
    throw std::invalid_argument("--quant '" + a.quant +
                                "': a checkpoint stores W (weights only, W4A16) or WA (W4A4 with "
                                "static input global scales); KV/Q quantization is simulation "
                                "only (`ppl --quant`, `experiment`)");
  }
  rq.out_dir = a.out;
  rq.tokenizer = a.tokenizer;
  rq.calib_text = a.calib;
  rq.stats = a.stats;
  rq.nsamples = a.nsamples;
  rq.seqlen = a.seqlen;
  rq.seed = a.seed;
  if (a.dense != "auto") {
    const auto d = kDTypeNames.find(a.dense);
    if (!d)
      throw std::invalid_argument("--dense-dtype '" + a.dense + "': expected f32, bf16 or f16");
    rq.dense = *d;
  }
  if (const auto pb = pipeline::kPartialBlocksNames.find(a.partial_blocks)) {
    rq.partial_blocks = *pb;
  } else {
    throw std::invalid_argument("--partial-blocks '" + a.partial_blocks +
                                "': expected dense (vLLM-loadable, the default) or quantize");
  }
  rq.max_shard_bytes = io::parse_byte_size(a.max_shard_size, "--max-shard-size");
  rq.tp = a.tp;
  rq.overwrite = a.overwrite;
  rq.stream = !a.no_stream;
  rq.sequential = !a.no_sequential;
  pipeline::check_quantize_request(rq);
  // Never replace an input (the model, a directory holding it, calibration files), even with
  // --overwrite: the replaced directory is deleted once the output is in place.
  check_output_dir(a.out, "-o", a.overwrite, {a.model, a.calib, a.stats, a.tokenizer},
                   "--overwrite");

  std::unique_ptr<ProgressBar> bar;  // one per stage, made when the stage reports first
  pipeline::Stage bar_stage = pipeline::Stage::kCalibrate;
  pipeline::QuantizeEvents ev;
  ev.note = print_note;
  ev.progress = [&](pipeline::Stage s, int64_t done, int64_t total) {
    if (!bar || bar_stage != s) {
      if (bar) bar->finish();
      bar = s == pipeline::Stage::kCalibrate
                ? std::make_unique<ProgressBar>("calibrate", total, "seq")
                // without a terminal: a line per decoder layer
                : std::make_unique<ProgressBar>("quantize", total, "linear", false, 7);
      bar_stage = s;
    }
    bar->update(done);
  };
  const pipeline::QuantizeResult res = pipeline::quantize_model(a.model, rq, ev);
  if (bar) bar->finish();
  const pipeline::QuantizeReport& rep = res.report;

  if (a.json_out) {
    json j;
    j["out"] = rep.out_dir;
    j["method"] = a.method;
    j["gptq"] = a.gptq;
    j["quant"] = a.quant;
    j["seconds"] = rep.seconds;
    j["phases"] = {{"load", rep.phases.load},
                   {"forward", rep.phases.forward},
                   {"hessians", rep.phases.hessians},
                   {"quantize", rep.phases.quantize},
                   {"write", rep.phases.write}};
    j["bytes"] = rep.bytes;
    j["files"] = rep.files;
    j["ignore"] = rep.ignore;
    json ls = json::array();
    for (const auto& r : rep.linears) {
      json l{{"name", r.name}, {"rows", r.q.rows}, {"cols", r.q.cols}, {"dense", r.dense}};
      if (r.dense) {
        ls.push_back(l);
        continue;
      }
      l["nmse"] = r.nmse;
      l["seconds"] = r.seconds;
      l["global_scale"] = r.q.global_scale;
      if (a.gptq) {
        l["loss_rtn"] = r.loss_rtn;
        l["loss_gptq"] = r.loss_gptq;
      }
      if (r.input_global_scale) l["input_global_scale"] = *r.input_global_scale;
      ls.push_back(l);
    }
    j["linears"] = ls;
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::vector<std::string> hdr = {"linear", "shape", "global scale", "weight NMSE"};
  if (a.gptq) {
    hdr.push_back("H-loss RTN");
    hdr.push_back("H-loss GPTQ");
    hdr.push_back("GPTQ/RTN");
  }
  Table t(hdr);
  double sum_r = 0, sum_g = 0;
  for (const auto& r : rep.linears) {
    if (r.dense) {
      std::vector<std::string> row = {
          r.name, strf("%lldx%lld", (long long)r.q.rows, (long long)r.q.cols), "dense", "-"};
      row.resize(hdr.size(), "-");
      t.add_row(row);
      continue;
    }
    std::vector<std::string> row = {r.name,
                                    strf("%lldx%lld", (long long)r.q.rows, (long long)r.q.cols),
                                    strf("%.6g", r.q.global_scale), strf("%.5f", r.nmse)};
    if (a.gptq) {
      row.push_back(strf("%.4e", r.loss_rtn));
      row.push_back(strf("%.4e", r.loss_gptq));
      row.push_back(strf("%.3f", r.loss_rtn > 0 ? r.loss_gptq / r.loss_rtn : 0.0));
      sum_r += r.loss_rtn;
      sum_g += r.loss_gptq;
    }
    t.add_row(row);
  }
  t.print();
  size_t n_dense = 0;
  for (const auto& r : rep.linears) n_dense += r.dense;
  std::printf("wrote %s (%s, %s%s, %.2f MB in %zu file%s%s) in %.2f s\n", rep.out_dir.c_str(),
              a.method.c_str(), a.gptq ? "GPTQ" : "RTN", o.w4a4 ? ", W4A4" : ", W4A16",
              static_cast<double>(rep.bytes) / 1e6, rep.files.size(),
              rep.files.size() == 1 ? "" : "s + model.safetensors.index.json",
              n_dense ? strf(", %zu Linears dense", n_dense).c_str() : "", rep.seconds);
  if (a.gptq && sum_r > 0)
    std::printf("GPTQ layer-output loss / RTN: %.3f (sum over linears)\n", sum_g / sum_r);
  const auto& ph = rep.phases;
  std::printf(
      "time: load %.2f s, forward %.2f s, Hessians %.2f s, %s %.2f s, write %.2f s, other %.2f "
      "s\n",
      ph.load, ph.forward, ph.hessians, a.gptq ? "GPTQ" : "quantize", ph.quantize, ph.write,
      rep.seconds - ph.load - ph.forward - ph.hessians - ph.quantize - ph.write);
  return 0;
}

// ---- inspect ----------------------------------------------------------------------------

struct InspectArgs {
  std::string dir, dump;
  std::vector<std::string> tensors;  // --tensor (GGUF files only)
  bool json_out = false, force = false;
};

int64_t in_features(const json& cfg, const std::string& prefix, const std::string& where) {
  auto geti = [&](const char* k) -> int64_t {
    if (!cfg.contains(k) || !cfg[k].is_number_integer())
      throw io::IoError(where + ": config.json has no integer '" + std::string(k) + "'");
    return cfg[k].get<int64_t>();
  };
  auto ends = [&](const char* s) {
    const std::string x(s);
    return prefix.size() >= x.size() && prefix.compare(prefix.size() - x.size(), x.size(), x) == 0;
  };
  if (ends("o_proj")) {
    const int64_t hd = cfg.contains("head_dim") && cfg["head_dim"].is_number_integer()
                           ? cfg["head_dim"].get<int64_t>()
                           : geti("hidden_size") / geti("num_attention_heads");
    return geti("num_attention_heads") * hd;
  }
  if (ends("down_proj")) return geti("intermediate_size");
  return geti("hidden_size");
}

int run_inspect(const InspectArgs& a) {
  if (!fs::is_directory(a.dir) && io::GgufFile::sniff(a.dir))
    return run_inspect_gguf({a.dir, a.dump, a.tensors, a.json_out, a.force});
  if (!a.tensors.empty())
    throw std::invalid_argument("--tensor applies to a GGUF file; " + a.dir + " is not one");
  if (!fs::is_directory(a.dir))
    throw io::IoError(a.dir + (fs::exists(a.dir)
                                   ? ": not a directory nor a GGUF file (inspect reads a "
                                     "compressed-tensors checkpoint directory or a "
                                     "GGUF file)"
                                   : ": no such directory"));
  if (!a.dump.empty()) {  // never one of the checkpoint's own files, even with --force
    std::vector<std::string> inputs;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(a.dir, ec)) inputs.push_back(e.path().string());
    check_output_file(a.dump, "--dump-dequant", a.force, inputs);
  }
  const std::string cfg_path = (fs::path(a.dir) / "config.json").string();
  std::ifstream f(cfg_path);
  if (!f) throw io::IoError(cfg_path + ": cannot read");
  json cfg;
  try {
    cfg = json::parse(f);
  } catch (const std::exception& e) {
    throw io::IoError(cfg_path + ": invalid JSON: " + e.what());
  }
  const io::CtInfo info = io::parse_quantization_config(cfg, cfg_path);
  if (!info.present)
    throw io::IoError(cfg_path + ": no quantization_config: not a quantized checkpoint");
  // Files: model.safetensors or the shards of model.safetensors.index.json, as the model
  // loader reads them (io::HfTensorFiles).
  const io::HfTensorFiles files(a.dir);
  const io::TensorLookup lookup = files.lookup();
  io::SafetensorsWriter dump;
  Table t({"linear", "shape", "weight global scale", "input global scale", "mean |w|"});
  json lin = json::array();
  std::vector<std::string> file_names;
  for (const auto& flp : files.files()) file_names.push_back(fs::path(flp->path()).filename());
  for (const auto& flp : files.files())
    for (const auto& ti : flp->tensors()) {
      const io::SafetensorsFile& fl = *flp;
      const std::string suf = ".weight_packed";
      if (ti.name.size() <= suf.size() ||
          ti.name.compare(ti.name.size() - suf.size(), suf.size(), suf) != 0)
        continue;
      const std::string prefix = ti.name.substr(0, ti.name.size() - suf.size());
      if (ti.shape.size() != 2) throw io::IoError(fl.path() + ": '" + ti.name + "' is not 2-D");
      const int64_t rows = ti.shape[0], cols = in_features(cfg, prefix, cfg_path);
      const std::vector<float> w = io::read_nvfp4_weight(lookup, prefix, rows, cols);
      const QuantizedTensor q = io::read_nvfp4_quantized(lookup, prefix, rows, cols);
      const auto igs = io::read_input_global_scale(lookup, prefix);
      double s = 0;
      for (float v : w) s += std::fabs(v);
      t.add_row({prefix, strf("%lldx%lld", (long long)rows, (long long)cols),
                 strf("%.6g", q.global_scale), igs ? strf("%.6g", *igs) : "-",
                 strf("%.5g", s / static_cast<double>(w.size()))});
      lin.push_back({{"name", prefix},
                     {"rows", rows},
                     {"cols", cols},
                     {"weight_global_scale", q.global_scale},
                     {"input_global_scale", igs ? json(*igs) : json(nullptr)}});
      if (!a.dump.empty()) dump.add_f32(prefix + ".weight", {rows, cols}, w);
    }
  // Modules the config leaves dense (ignore) that are stored as a plain PREFIX.weight.
  std::vector<std::string> dense;
  for (const std::string& m : info.ignore) {
    const io::TensorRef r = files.find(m + ".weight");
    if (r.info && r.info->shape.size() == 2) {
      dense.push_back(m);
      t.add_row({m, strf("%lldx%lld", (long long)r.info->shape[0], (long long)r.info->shape[1]),
                 "dense " + std::string(io::dtype_name(r.info->dtype)), "-", "-"});
    }
  }
  if (!a.dump.empty()) dump.write(a.dump);
  if (a.json_out) {
    json j{{"dir", a.dir},   {"format", info.format}, {"w4a4", info.w4a4}, {"ignore", info.ignore},
           {"dense", dense}, {"files", file_names},   {"linears", lin}};
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    t.print();
    std::printf("%s: compressed-tensors %s, %s, %zu quantized linears, %zu dense, %zu file%s%s\n",
                a.dir.c_str(), info.format.c_str(), info.w4a4 ? "W4A4" : "W4A16", lin.size(),
                dense.size(), file_names.size(), file_names.size() == 1 ? "" : "s",
                a.dump.empty() ? "" : (", dequantized weights written to " + a.dump).c_str());
  }
  return 0;
}

// ---- gptq-bench ---------------------------------------------------------------------------

struct BenchArgs {
  int64_t rows = 4096, cols = 4096, tokens = 8192;
  std::string method = "sweep-mse";
  bool json_out = false, skip_unblocked = false;
};

int run_bench(const BenchArgs& a) {
  if (a.rows <= 0 || a.cols <= 0 || a.tokens <= 0)
    throw std::invalid_argument("--rows, --cols and --tokens must be positive");
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> w(static_cast<size_t>(a.rows * a.cols));
  for (auto& v : w) v = 0.02f * nd(rng);
  // Correlated inputs X = Z A (A = I + noise/sqrt(K)) with per-channel scales.
  std::vector<double> x(static_cast<size_t>(a.tokens * a.cols)), z(x.size()),
      am(static_cast<size_t>(a.cols * a.cols));
  for (auto& v : z) v = nd(rng);
  for (auto& v : am) v = 0.3 * nd(rng) / std::sqrt(static_cast<double>(a.cols));
  for (int64_t j = 0; j < a.cols; ++j) am[static_cast<size_t>(j * a.cols + j)] += 1.0;
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)a.tokens, (int)a.cols, (int)a.cols,
              1.0, z.data(), (int)a.cols, am.data(), (int)a.cols, 0.0, x.data(), (int)a.cols);
  std::vector<double> xtx(static_cast<size_t>(a.cols * a.cols), 0.0);
  cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, (int)a.cols, (int)a.tokens, 1.0, x.data(),
              (int)a.cols, 0.0, xtx.data(), (int)a.cols);
  gptq::GptqConfig cfg;
  cfg.quant.selector.method = parse_method(a.method);
  auto time_it = [&](int block, QuantizedTensor* q) {
    gptq::GptqConfig c = cfg;
    c.block_size = block;
    const auto t0 = std::chrono::steady_clock::now();
    *q = gptq::gptq_quantize(w.data(), a.rows, a.cols, xtx.data(), a.tokens, c, "bench");
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  QuantizedTensor qb, qu;
  const double tb = time_it(128, &qb);
  double tu = 0;
  int64_t diff = -1;
  if (!a.skip_unblocked) {
    tu = time_it(0, &qu);
    diff = 0;
    for (size_t i = 0; i < qb.codes.size(); ++i) diff += qb.codes[i] != qu.codes[i];
  }
  if (a.json_out) {
    json j{{"rows", a.rows},
           {"cols", a.cols},
           {"tokens", a.tokens},
           {"method", a.method},
           {"blocked_s", tb},
           {"unblocked_s", tu},
           {"speedup", tb > 0 ? tu / tb : 0},
           {"differing_bytes", diff}};
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("GPTQ %lldx%lld (%s, H from %lld tokens)\n", (long long)a.rows, (long long)a.cols,
                a.method.c_str(), (long long)a.tokens);
    std::printf("  blocked (128-column lazy batch, dgemm): %.3f s\n", tb);
    if (!a.skip_unblocked) {
      std::printf("  unblocked (rank-1 dger per column):     %.3f s\n", tu);
      std::printf("  speed-up %.2fx; packed bytes that differ: %lld of %zu\n", tu / tb,
                  (long long)diff, qb.codes.size());
    }
  }
  return 0;
}

SS_COMMAND(
    "quantize", "Quantize a model to a compressed-tensors NVFP4 checkpoint (RTN or GPTQ)",
    [](CLI::App& sub) -> std::function<int()> {
      auto a = std::make_shared<QuantizeArgs>();
      sub.add_option("model", a->model, "llama2.c .bin, .gguf or HF directory")->required();
      sub.add_option("-o,--out", a->out, "output directory (written atomically)")->required();
      sub.add_option("--method", a->method,
                     "block-scale selector: absmax, 4over6, sweep-mse, sweep-wmse, "
                     "exhaustive-mse, exhaustive-wmse, opt-fp8-mse, opt-fp8-wmse");
      sub.add_flag("--gptq", a->gptq, "GPTQ/LDLQ with the selector's static scales");
      sub.add_option("--calib", a->calib, "calibration text file");
      sub.add_option("--stats", a->stats,
                     "calibration statistics from `scalesweep calibrate` (instead of "
                     "--calib)");
      sub.add_option("--nsamples", a->nsamples, "calibration sequences (default 128)")
          ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
      sub.add_option("--seqlen", a->seqlen, "calibration sequence length (default 512)")
          ->check(CLI::Range(int64_t{2}, int64_t{1} << 24));
      sub.add_option("--seed", a->seed, "calibration sampling seed (default 0)");
      sub.add_option("--quant", a->quant, "W (W4A16) or WA (W4A4)");
      sub.add_option("--block", a->block, "block size (checkpoints: 16)");
      sub.add_option("--damp", a->damp, "GPTQ relative damping (default 0.01)");
      sub.add_option("--gptq-block", a->gptq_block,
                     "GPTQ lazy-batch block (default 128; 0 = unblocked)")
          ->check(CLI::Range(0, 1 << 30));
      sub.add_flag("--no-act-order", a->no_act_order, "GPTQ in natural column order");
      sub.add_option("--dense-dtype", a->dense,
                     "dtype of embeddings/norms/lm_head: auto (default: the HF source's "
                     "torch_dtype, f32 for llama2.c), f32, bf16, f16");
      sub.add_option("--tokenizer", a->tokenizer, "tokenizer file (llama2.c models)");
      sub.add_option("--partial-blocks", a->partial_blocks,
                     "Linears vLLM cannot load as NVFP4 (K % 16 != 0, o_proj/down_proj with "
                     "(K / tp) % 16 != 0 under --tp, and their fused q/k/v or "
                     "gate/up partners): dense (default: kept in the dense dtype, listed in "
                     "quantization_config.ignore) or quantize (NVFP4 with a partial last "
                     "block, loadable by scalesweep only)");
      sub.add_option("--tp", a->tp,
                     "vLLM tensor_parallel_size the checkpoint must load under (default 1, "
                     "1..1024): o_proj/down_proj whose K / tp is not a multiple of 16 are "
                     "handled as --partial-blocks says")
          ->check(CLI::Range(1, pipeline::kMaxTp));
      sub.add_option("--max-shard-size", a->max_shard_size,
                     "largest safetensors shard, as Hugging Face: 5GB (default), 500MB, 2GiB "
                     "or bytes; a model that fits is one model.safetensors");
      sub.add_option("--threads", a->threads, "threads (0 = all)");
      sub.add_flag("--overwrite,--force", a->overwrite,
                   "replace an existing output directory (never an input)");
      sub.add_flag("--no-stream", a->no_stream,
                   "load the whole model and calibrate it in one forward pass (the default "
                   "for a HF directory streams it layer by layer, bounded memory)");
      sub.add_flag("--no-sequential", a->no_sequential,
                   "streamed GPTQ: calibrate every layer on the full-precision model's "
                   "activations (default: on the outputs of the quantized earlier layers)");
      sub.add_flag("--json", a->json_out, "print a JSON report");
      return [a] { return run_quantize(*a); };
    });

SS_COMMAND("inspect",
           "Read a compressed-tensors NVFP4 checkpoint back (any producer), or list a GGUF file",
           [](CLI::App& sub) -> std::function<int()> {
             auto a = std::make_shared<InspectArgs>();
             sub.add_option("dir", a->dir, "checkpoint directory, or a .gguf file")->required();
             sub.add_option("--dump-dequant", a->dump,
                            "write the dequantized fp32 weights (PREFIX.weight; for a GGUF "
                            "file every tensor under its GGUF name) to this .safetensors file");
             sub.add_option("--tensor", a->tensors,
                            "GGUF file: dump only this tensor (repeatable)");
             add_force_flag(sub, a->force)->description("replace an existing --dump-dequant file");
             sub.add_flag("--json", a->json_out, "print JSON");
             return [a] { return run_inspect(*a); };
           });

SS_COMMAND("gptq-bench", "Time blocked GPTQ against the unblocked reference on one layer",
           [](CLI::App& sub) -> std::function<int()> {
             auto a = std::make_shared<BenchArgs>();
             sub.add_option("--rows", a->rows, "output channels (default 4096)");
             sub.add_option("--cols", a->cols, "input channels (default 4096)");
             sub.add_option("--tokens", a->tokens, "tokens behind the Hessian (default 8192)");
             sub.add_option("--method", a->method, "selector (default sweep-mse)");
             sub.add_flag("--skip-unblocked", a->skip_unblocked, "time the blocked path only");
             sub.add_flag("--json", a->json_out, "print JSON");
             return [a] { return run_bench(*a); };
           });

}  // namespace
}  // namespace scalesweep::tools
