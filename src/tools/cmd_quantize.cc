// scalesweep quantize: RTN or GPTQ NVFP4 quantization of a whole model into a
// compressed-tensors checkpoint (vLLM-loadable), one pipeline::quantize_model call.
#include <cctype>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "scalesweep/base/bytes.h"
#include "scalesweep/base/option_error.h"
#include "scalesweep/gptq/gptq.h"
#include "scalesweep/io/gguf_writer.h"
#include "scalesweep/io/hf_names.h"
#include "scalesweep/pipeline/quantize_model.h"
#include "scalesweep/pipeline/vllm_compat.h"
#include "tools/command.h"
#include "tools/options.h"
#include "tools/output.h"
#include "tools/ui.h"

namespace scalesweep::tools {
namespace {

using nlohmann::json;

struct QuantizeArgs {
  ModelOptions model;
  CalibOptions calib;
  OutputOptions out;
  QuantOptions q;  // --method, --block, --threads
  std::string quant = "W", dense = "auto", partial_blocks = "dense", max_shard_size = "5GB";
  std::string keep_dense;  // --keep-dense: comma-separated Linear names
  std::string gguf_arch;   // --gguf-arch: empty = not given
  std::optional<double> target_bpw;
  std::string sensitivity = "relative";
  int64_t sensitivity_samples = 4;
  int gptq_block = 128, tp = 1, global_scale_steps = 0;
  double damp = 0.01;
  std::string gptq_scales{gptq::kScaleTimingNames.name(pipeline::QuantizeOptions{}.gptq_scales)};
  std::string gptq_importance{
      gptq::kDynamicImportanceNames.name(pipeline::QuantizeOptions{}.gptq_importance)};
  bool gptq = false, no_act_order = false, no_stream = false, no_sequential = false;
  std::string preset;  // --preset: empty = none
  // The options a preset sets, to refuse them beside --preset (given on the command line).
  const CLI::Option* gptq_opt = nullptr;
  const CLI::Option* gs_steps_opt = nullptr;
  const CLI::Option* gptq_scales_opt = nullptr;
  const CLI::Option* gptq_importance_opt = nullptr;
};

// One item of --keep-dense: a Linear kind (every layer) or one layer's Linear by its name in
// the report, HF ("model.layers.3.mlp.down_proj") or GGUF ("blk.3.ffn_down").
void add_keep_dense(model::LinearSet& set, const std::string& item) {
  if (const auto id = model::kLinearIdNames.find(item)) {
    set.add_every_layer(*id);
    return;
  }
  for (const char* prefix : {"model.layers.", "blk."}) {
    const size_t n = std::string(prefix).size();
    if (item.compare(0, n, prefix) != 0) continue;
    size_t e = n;
    while (e < item.size() && e - n < 6 && std::isdigit(static_cast<unsigned char>(item[e]))) ++e;
    if (e == n || e >= item.size() || item[e] != '.') break;
    const int layer = std::stoi(item.substr(n, e - n));
    for (model::LinearId id : io::kAllLinears)
      if (item == (n == 4 ? io::gguf_linear_name(layer, id) : io::hf_module_name(layer, id))) {
        set.add(layer, id);
        return;
      }
  }
  throw std::invalid_argument(
      "--keep-dense '" + item +
      "': expected a Linear for every layer (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "
      "down_proj or q, k, ..., down) or one layer's by name (model.layers.3.mlp.down_proj or "
      "blk.3.ffn_down)");
}

// The command line as a request (every value checked here or by check_quantize_request).
pipeline::QuantizeRequest make_request(const QuantizeArgs& a) {
  pipeline::QuantizeRequest rq;
  pipeline::QuantizeOptions& o = rq.options;
  const QuantConfig qc = parse_quant_config(a.q);
  o.method = qc.selector.method;
  o.block = qc.block;
  o.threads = qc.threads;
  o.max_block_scale = qc.max_block_scale;
  o.gptq = a.gptq;
  o.damp = a.damp;
  o.gptq_block = a.gptq_block;
  o.act_order = !a.no_act_order;
  o.gptq_scales = parse_named(gptq::kScaleTimingNames, "--gptq-scales", a.gptq_scales);
  o.gptq_importance =
      parse_named(gptq::kDynamicImportanceNames, "--gptq-importance", a.gptq_importance);
  o.global_scale_steps = a.global_scale_steps;
  if (!a.preset.empty()) {
    const pipeline::Preset p = parse_named(pipeline::kPresetNames, "--preset", a.preset);
    std::vector<std::string> clash;
    if (a.q.method_opt && a.q.method_opt->count() > 0) clash.push_back("--method");
    if (a.gptq_opt && a.gptq_opt->count() > 0) clash.push_back("--gptq");
    if (a.gs_steps_opt && a.gs_steps_opt->count() > 0) clash.push_back("--search-global-scale");
    if (a.gptq_scales_opt && a.gptq_scales_opt->count() > 0) clash.push_back("--gptq-scales");
    if (a.gptq_importance_opt && a.gptq_importance_opt->count() > 0)
      clash.push_back("--gptq-importance");
    if (!clash.empty()) {
      std::string list;
      for (const std::string& c : clash) list += (list.empty() ? "" : ", ") + c;
      throw OptionError("preset", "--preset " + a.preset + " sets " + list + " itself; drop " +
                                      list + " or the preset");
    }
    pipeline::apply_preset(p, o);
  }
  if (a.quant != "W" && a.quant != "WA")
    throw std::invalid_argument("--quant '" + a.quant +
                                "': a checkpoint stores W (weights only, W4A16) or WA (W4A4 with "
                                "static input global scales); KV/Q quantization is simulation "
                                "only (`ppl --quant`, `experiment`)");
  o.w4a4 = a.quant == "WA";
  for (size_t b = 0; b < a.keep_dense.size();) {
    size_t e = a.keep_dense.find(',', b);
    if (e == std::string::npos) e = a.keep_dense.size();
    add_keep_dense(o.dense, a.keep_dense.substr(b, e - b));
    b = e + 1;
  }
  rq.out_dir = a.out.path;
  rq.tokenizer = a.model.tokenizer;
  rq.calib = calib_source(a.calib);
  if (const auto g = io::kGgufDenseNames.find(a.dense); g && *g == io::GgufDense::kQ8_0) {
    rq.dense_q8_0 = true;  // GGUF outputs only (check_quantize_request)
  } else if (a.dense != "auto") {
    const auto d = kDTypeNames.find(a.dense);
    if (!d)
      throw std::invalid_argument("--dense-dtype '" + a.dense +
                                  "': expected f32, bf16, f16 or (GGUF outputs) q8_0");
    rq.dense = *d;
  }
  if (!a.gguf_arch.empty()) {
    const auto g = io::kGgufQwen2AsNames.find(a.gguf_arch);
    if (!g)
      throw std::invalid_argument("--gguf-arch '" + a.gguf_arch + "': expected " +
                                  io::kGgufQwen2AsNames.accepted(" or "));
    rq.gguf_qwen2_as = *g;
  }
  const auto pb = pipeline::kPartialBlocksNames.find(a.partial_blocks);
  if (!pb)
    throw std::invalid_argument("--partial-blocks '" + a.partial_blocks +
                                "': expected dense (vLLM-loadable) or quantize");
  rq.partial_blocks = *pb;
  rq.max_shard_bytes = parse_byte_size(a.max_shard_size, "--max-shard-size");
  rq.tp = a.tp;
  rq.overwrite = a.out.force;
  rq.stream = !a.no_stream;
  rq.sequential = !a.no_sequential;
  rq.target_bpw = a.target_bpw;
  rq.sensitivity = parse_named(pipeline::kSensitivityNames, "--sensitivity", a.sensitivity);
  rq.sensitivity_samples = a.sensitivity_samples;
  return rq;
}

// The Linear's name in the output: "blk.3.ffn_down" in a GGUF, the HF module otherwise.
std::string out_name(int layer, model::LinearId id, const std::string& out) {
  return io::is_gguf_path(out) ? io::gguf_linear_name(layer, id) : io::hf_module_name(layer, id);
}

// --target-bpw: the budget, the result and the greedy's steps.
json mixed_json(const pipeline::QuantizeReport& rep, const QuantizeArgs& a) {
  const pipeline::MixedPlan& p = *rep.mixed;
  json steps = json::array();
  for (const pipeline::MixedStep& s : p.steps) {
    json names = json::array();
    for (const auto& [l, id] : s.linears) names.push_back(out_name(l, id, a.out.path));
    steps.push_back({{"linears", names},
                     {"gain", s.gain},
                     {"extra_bits", s.extra_bits},
                     {"bits", s.bits},
                     {"bpw", static_cast<double>(s.bits) / static_cast<double>(p.weights)}});
  }
  json sens = json::array();
  for (const pipeline::LinearSensitivity& x : rep.sensitivities)
    sens.push_back({{"name", out_name(x.layer, x.id, a.out.path)},
                    {"loss", x.loss},
                    {"energy", x.energy},
                    {"kl", x.kl},
                    {"dnll", x.dnll},
                    {"score", x.score},
                    {"dense", p.dense.contains(x.layer, x.id)}});
  return {{"target_bpw", p.target_bpw},
          {"sensitivity", a.sensitivity},
          {"weights", p.weights},
          {"budget_bits", p.budget_bits},
          {"base_bits", p.base_bits},
          {"base_bpw", p.base_bpw()},
          {"bits", p.bits},
          {"bpw", p.bpw()},
          {"steps", steps},
          {"sensitivities", sens}};
}

// "GPTQ", "GPTQ, dynamic scales (obs)" or "RTN", as the summary line names the algorithm.
std::string algorithm(const pipeline::QuantizeOptions& o) {
  if (!o.gptq) return "RTN";
  if (o.gptq_scales == gptq::ScaleTiming::kStatic) return "GPTQ";
  return "GPTQ, dynamic scales (" +
         std::string(gptq::kDynamicImportanceNames.name(o.gptq_importance)) + ")";
}

// The reports name the options the job ran with (a preset's, not the command line's).

// MoE experts quantized data-free (no or too few routed calibration tokens), one entry per
// expert: "layer L expert E (N tokens)", comma-separated; empty when none.
std::string fallback_experts(const pipeline::QuantizeReport& rep,
                             const pipeline::QuantizeOptions&) {
  std::string out;
  for (const auto& r : rep.linears) {
    if (!r.data_free || r.id != model::LinearId::kGate) continue;
    out += (out.empty() ? "" : ", ") + std::string("layer ") + std::to_string(r.layer) +
           " expert " + std::to_string(r.expert) + " (" + std::to_string(r.routed) + " tokens)";
  }
  return out;
}

void render_json(const pipeline::QuantizeReport& rep, const QuantizeArgs& a,
                 const pipeline::QuantizeOptions& o) {
  json j;
  j["out"] = rep.out_dir;
  j["method"] = std::string(kMethodNames.name(o.method));
  j["gptq"] = o.gptq;
  if (o.gptq) {
    j["gptq_scales"] = std::string(gptq::kScaleTimingNames.name(o.gptq_scales));
    if (o.gptq_scales == gptq::ScaleTiming::kDynamic)
      j["gptq_importance"] = std::string(gptq::kDynamicImportanceNames.name(o.gptq_importance));
  }
  j["search_global_scale"] = o.global_scale_steps;
  if (!a.preset.empty()) j["preset"] = a.preset;
  j["quant"] = a.quant;
  j["seconds"] = rep.seconds;
  j["phases"] = {{"load", rep.phases.load},
                 {"forward", rep.phases.forward},
                 {"hessians", rep.phases.hessians},
                 {"quantize", rep.phases.quantize},
                 {"write", rep.phases.write}};
  if (rep.mixed) j["phases"]["sensitivity"] = rep.phases.sensitivity;  // --target-bpw only
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
    if (o.gptq) {
      l["loss_rtn"] = r.loss_rtn;
      l["loss_gptq"] = r.loss_gptq;
    }
    if (r.input_global_scale) l["input_global_scale"] = *r.input_global_scale;
    if (r.expert >= 0) {
      l["expert"] = r.expert;
      l["routed_tokens"] = r.routed;
      l["data_free"] = r.data_free;
      if (r.input_scale_source)
        l["input_scale_source"] =
            std::string(pipeline::kInputScaleSourceNames.name(*r.input_scale_source));
    }
    ls.push_back(l);
  }
  j["linears"] = ls;
  if (const std::string fb = fallback_experts(rep, o); !fb.empty()) j["data_free_experts"] = fb;
  if (rep.mixed) j["mixed"] = mixed_json(rep, a);
  std::printf("%s\n", j.dump(2).c_str());
}

void render_table(const pipeline::QuantizeReport& rep, const QuantizeArgs& a,
                  const pipeline::QuantizeOptions& o) {
  if (const std::string fb = fallback_experts(rep, o); !fb.empty())
    std::printf("experts below --expert-min-tokens, quantized data-free (RTN %s): %s\n",
                std::string(kMethodNames.name(pipeline::data_free_method(o.method))).c_str(),
                fb.c_str());
  if (a.quant == "WA") {
    size_t borrowed = 0;
    for (const auto& r : rep.linears)
      borrowed += r.input_scale_source == pipeline::InputScaleSource::kLayerMax;
    if (borrowed > 0)
      std::printf(
          "%zu expert Linears take their layer's largest calibrated input amax for the "
          "input global scale (no or few routed tokens)\n",
          borrowed);
  }
  std::vector<std::string> hdr = {"linear", "shape", "global scale", "weight NMSE"};
  if (o.gptq) hdr.insert(hdr.end(), {"H-loss RTN", "H-loss GPTQ", "GPTQ/RTN"});
  Table t(hdr);
  double sum_r = 0, sum_g = 0;
  size_t n_dense = 0;
  for (const auto& r : rep.linears) {
    const std::string shape = strf("%lldx%lld", (long long)r.q.rows, (long long)r.q.cols);
    if (r.dense) {
      std::vector<std::string> row = {r.name, shape, "dense", "-"};
      row.resize(hdr.size(), "-");
      t.add_row(row);
      ++n_dense;
      continue;
    }
    std::vector<std::string> row = {r.name, shape, strf("%.6g", r.q.global_scale),
                                    strf("%.5f", r.nmse)};
    if (o.gptq) {
      row.push_back(strf("%.4e", r.loss_rtn));
      row.push_back(strf("%.4e", r.loss_gptq));
      row.push_back(strf("%.3f", r.loss_rtn > 0 ? r.loss_gptq / r.loss_rtn : 0.0));
      sum_r += r.loss_rtn;
      sum_g += r.loss_gptq;
    }
    t.add_row(row);
  }
  t.print();
  std::printf("wrote %s (%s, %s%s, %.2f MB in %zu file%s%s) in %.2f s\n", rep.out_dir.c_str(),
              std::string(kMethodNames.name(o.method)).c_str(), algorithm(o).c_str(),
              a.quant == "WA" ? ", W4A4" : ", W4A16", static_cast<double>(rep.bytes) / 1e6,
              rep.files.size(), rep.files.size() == 1 ? "" : "s + model.safetensors.index.json",
              n_dense ? strf(", %zu Linears dense", n_dense).c_str() : "", rep.seconds);
  if (o.gptq && sum_r > 0)
    std::printf("GPTQ layer-output loss / RTN: %.3f (sum over linears)\n", sum_g / sum_r);
  if (rep.mixed) {
    const pipeline::MixedPlan& p = *rep.mixed;
    std::printf(
        "mixed precision (--target-bpw %g, sensitivity %s): %.4f bpw with every Linear "
        "that can be NVFP4 in NVFP4\n",
        p.target_bpw, a.sensitivity.c_str(), p.base_bpw());
    for (size_t i = 0; i < p.steps.size(); ++i) {
      const pipeline::MixedStep& s = p.steps[i];
      std::string names;
      for (const auto& [l, id] : s.linears)
        names += (names.empty() ? "" : "+") + out_name(l, id, a.out.path);
      std::printf("  %3zu. dense %s: gain %.4g, +%.3f Mbit, %.4f bpw\n", i + 1, names.c_str(),
                  s.gain, static_cast<double>(s.extra_bits) / 1e6,
                  static_cast<double>(s.bits) / static_cast<double>(p.weights));
    }
    std::printf(
        "  %zu step%s: %.4f bits per weight (%llu of %llu budget bits) over %llu Linear "
        "weights\n",
        p.steps.size(), p.steps.size() == 1 ? "" : "s", p.bpw(),
        static_cast<unsigned long long>(p.bits), static_cast<unsigned long long>(p.budget_bits),
        static_cast<unsigned long long>(p.weights));
  }
  const auto& ph = rep.phases;
  std::printf(
      "time: load %.2f s, forward %.2f s, Hessians %.2f s, %s %.2f s, write %.2f s, %sother "
      "%.2f s\n",
      ph.load, ph.forward, ph.hessians, o.gptq ? "GPTQ" : "quantize", ph.quantize, ph.write,
      rep.mixed ? strf("sensitivity %.2f s, ", ph.sensitivity).c_str() : "",
      rep.seconds - ph.load - ph.forward - ph.hessians - ph.quantize - ph.write - ph.sensitivity);
}

int run_quantize(const QuantizeArgs& a) {
  const pipeline::QuantizeRequest rq = make_request(a);
  pipeline::check_quantize_request(rq);
  // Never replace an input (the model, a directory holding it, calibration files), even with
  // --force: the replaced directory is deleted once the output is in place.
  const std::vector<std::string> inputs = {a.model.path, a.calib.text, a.calib.stats,
                                           a.model.tokenizer};
  if (io::is_gguf_path(rq.out_dir))
    a.out.check_file(inputs);
  else
    a.out.check_dir(inputs);

  StageBars bars;
  bars.set_line_step("quantize", 7);  // without a terminal: a line per decoder layer
  const pipeline::QuantizeResult res = pipeline::quantize_model(a.model.path, rq, cli_events(bars));
  bars.finish();
  if (a.out.json)
    render_json(res.report, a, rq.options);
  else
    render_table(res.report, a, rq.options);
  return 0;
}

}  // namespace

SS_COMMAND(
    "quantize",
    "Quantize a model to a compressed-tensors NVFP4 checkpoint or an NVFP4 GGUF (RTN or GPTQ)",
    [](CLI::App& sub) -> std::function<int()> {
      auto a = std::make_shared<QuantizeArgs>();
      add_model_options(sub, a->model);
      OutputSpelling out = required_output(
          "output directory (written atomically), or OUT.gguf: an NVFP4 GGUF for llama.cpp",
          "replace an existing output directory (never an input)", "print a JSON report");
      out.out_alias = out.overwrite_alias = true;
      add_output_options(sub, a->out, out);
      QuantSpelling qs;
      qs.format = false;  // checkpoints are NVFP4
      qs.threads = true;
      qs.max_block_scale = true;
      add_quant_options(sub, a->q, qs);
      CalibSpelling calib;
      calib.size_aliases = calib.seed_alias = true;
      add_calib_options(sub, a->calib, calib);
      a->gptq_opt = sub.add_flag("--gptq", a->gptq, "GPTQ/LDLQ with the selector's block scales");
      sub.add_option("--preset", a->preset,
                     "a recipe: best (the combination of selector, GPTQ and scale choices "
                     "measured best, docs/PEERS.md; needs --calib or --stats; sets --method, "
                     "--gptq, --gptq-scales, --gptq-importance and --search-global-scale itself)");
      sub.add_option("--quant", a->quant, "W (W4A16) or WA (W4A4)");
      sub.add_option("--damp", a->damp, "GPTQ relative damping");
      sub.add_option("--gptq-block", a->gptq_block, "GPTQ lazy-batch block (0 = unblocked)")
          ->check(CLI::Range(0, 1 << 30));
      sub.add_flag("--no-act-order", a->no_act_order, "GPTQ in natural column order");
      a->gs_steps_opt =
          sub.add_option(
                 "--search-global-scale", a->global_scale_steps,
                 "N > 0: choose each fused group's global scale among the rule's 6C/amax and "
                 "6*448*2^(-k/N)/amax (k < N) by the least total objective of the method "
                 "over the group's blocks; 0: the rule")
              ->check(CLI::Range(0, 1024));
      a->gptq_scales_opt =
          sub.add_option("--gptq-scales", a->gptq_scales,
                         "when GPTQ's block scales are chosen: static (once, from the original "
                         "weights) or dynamic (in the column loop, from the error-compensated "
                         "weights)");
      a->gptq_importance_opt =
          sub.add_option("--gptq-importance", a->gptq_importance,
                         "importance of the dynamic scale choice for the weighted selectors: hdiag "
                         "(diag H, as static) or obs (1/[H_F^-1]_jj, each column's share of GPTQ's "
                         "loss)");
      sub.add_option("--dense-dtype", a->dense,
                     "dtype of embeddings/norms/lm_head: f32, bf16, f16, q8_0 (GGUF outputs "
                     "only; norms stay f32), or auto: the HF source's torch_dtype (f32 for "
                     "llama2.c and GGUF)");
      sub.add_option("--gguf-arch", a->gguf_arch,
                     "how a Qwen2 model is stored in a GGUF output: llama (llama.cpp's llama "
                     "graph, which adds the q/k/v biases and applies every Linear's .scale: "
                     "every Linear NVFP4, q/k rows permuted; our reader reads it back as Qwen2), "
                     "the choice when not given, or qwen2 (llama.cpp's own layout, whose graph "
                     "ignores the FFN Linears' .scale, so gate/up/down stay in the dense dtype). "
                     "Other architectures are stored as themselves");
      sub.add_option("--keep-dense", a->keep_dense,
                     "Linears kept in the dense dtype, comma-separated: a kind in every layer "
                     "(q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj or q, k, "
                     "..., down) or one layer's by name (model.layers.3.mlp.down_proj or "
                     "blk.3.ffn_down, as the report names them): mixed precision, e.g. "
                     "down_proj with --dense-dtype q8_0 in a GGUF");
      sub.add_option("--target-bpw", a->target_bpw,
                     "mixed precision: at most B bits per Linear weight (B >= 4.5; counted over "
                     "the decoder Linears' weight tensors as written: NVFP4 4.5, q8_0 8.5, "
                     "bf16/f16 16, f32 32); the Linears whose quantization costs most per extra "
                     "bit (--sensitivity, measured on the calibration data) stay in the dense "
                     "dtype, e.g. q8_0 in a GGUF; whole q/k/v and gate/up groups in a "
                     "compressed-tensors checkpoint (vLLM). Needs --calib or --stats");
      sub.add_option("--sensitivity", a->sensitivity,
                     "what --target-bpw ranks: relative (a Linear's output squared error on the "
                     "calibration tokens over its output energy, tr(D H D^T) / tr(W H W^T)) or "
                     "output (tr(D H D^T)); measured, the model run once per Linear with only "
                     "it quantized (loaded whole): kl (mean KL divergence from the dense "
                     "model's next-token distribution) or nll (increase of the calibration "
                     "NLL)");
      sub.add_option("--sensitivity-samples", a->sensitivity_samples,
                     "kl/nll: the calibration sequences they run on (the first N)")
          ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
      sub.add_option("--partial-blocks", a->partial_blocks,
                     "Linears vLLM cannot load as NVFP4 (K % 16 != 0, o_proj/down_proj with "
                     "(K / tp) % 16 != 0 under --tp, and their fused q/k/v or "
                     "gate/up partners): dense (kept in the dense dtype, listed in "
                     "quantization_config.ignore) or quantize (NVFP4 with a partial last "
                     "block, loadable by scalesweep only)");
      sub.add_option("--tp", a->tp,
                     "vLLM tensor_parallel_size the checkpoint must load under (1..1024): "
                     "o_proj/down_proj whose K / tp is not a multiple of 16 are handled as "
                     "--partial-blocks says")
          ->check(CLI::Range(1, pipeline::kMaxTp));
      sub.add_option("--max-shard-size", a->max_shard_size,
                     "largest safetensors shard, as Hugging Face: 5GB, 500MB, 2GiB or bytes; a "
                     "model that fits is one model.safetensors");
      sub.add_flag("--no-stream", a->no_stream,
                   "load the whole model and calibrate it in one forward pass (otherwise a HF "
                   "directory or a GGUF is streamed layer by layer, bounded memory)");
      sub.add_flag("--no-sequential", a->no_sequential,
                   "streamed GPTQ: calibrate every layer on the full-precision model's "
                   "activations (otherwise: on the outputs of the quantized earlier layers)");
      return [a] { return run_quantize(*a); };
    });

}  // namespace scalesweep::tools
