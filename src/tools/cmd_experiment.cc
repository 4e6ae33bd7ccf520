// scalesweep experiment: the paper's grid ({RTN, GPTQ} x selectors x {WA, WAKV, WAKVQ}) with
// perplexity and recovery against the FP model, plus a per-layer error report (Markdown +
// SVG) of every selector's NMSE/NWMSE gap to the continuous optimum.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include "io/atomic_file.h"
#include "scalesweep/io/load.h"
#include "scalesweep/model/simquant.h"
#include "scalesweep/pipeline/experiment.h"
#include "tools/calib_cli.h"
#include "tools/command.h"
#include "tools/output.h"
#include "tools/ui.h"

namespace scalesweep::tools {
namespace {

using nlohmann::json;

struct ExpArgs {
  std::string model, calib, stats, eval, tokenizer, report_dir, methods, settings, format = "nvfp4";
  int64_t nsamples = 128, seqlen = 512, max_tokens = 0, error_tokens = 2048;
  uint64_t seed = 0;
  int ctx = 0, stride = 0, block = 0;  // block 0: the format's (16 NVFP4, 32 MXFP4)
  double damp = 0.01;
  bool json_out = false, no_rtn = false, no_gptq = false, no_errors = false, force = false;
  bool force_requant = false;
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string t;
  while (std::getline(ss, t, ','))
    if (!t.empty()) out.push_back(t);
  return out;
}

int run_experiment_cmd(const ExpArgs& a) {
  pipeline::ExperimentOptions o;
  if (!a.methods.empty()) {
    o.methods.clear();
    for (const auto& s : split(a.methods)) o.methods.push_back(parse_method(s));
    if (o.methods.empty())
      throw std::invalid_argument("--methods '" + a.methods + "' lists no method");
  }
  if (!a.settings.empty()) {
    o.settings = split(a.settings);
    if (o.settings.empty())
      throw std::invalid_argument("--settings '" + a.settings + "' lists no setting");
  }
  o.rtn = !a.no_rtn;
  o.gptq = !a.no_gptq;
  o.errors = !a.no_errors;
  o.format = model::parse_tensor_format(a.format);
  o.block = a.block > 0 ? a.block : model::default_block(o.format);
  for (Method mt : o.methods) {
    try {
      (void)model::parse_sim_quant("W", mt, o.block, o.format);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument("--format " + a.format + " --block " + std::to_string(o.block) +
                                  ": " + e.what());
    }
  }
  // After the format/block check (the more basic error, reported first as ppl does).
  if (o.format == TensorFormat::kMxfp4 && o.gptq)
    throw std::invalid_argument(
        "--format mxfp4: the GPTQ rows are NVFP4 only (the checkpoint quantizer has no MXFP4 "
        "scales); add --no-gptq");
  o.damp = a.damp;
  o.ppl.ctx = a.ctx;
  o.ppl.stride = a.stride;
  o.ppl.max_tokens = a.max_tokens;
  if (!o.rtn && !o.gptq) throw std::invalid_argument("--no-rtn and --no-gptq leave nothing to run");
  if (!(a.damp > 0) || !std::isfinite(a.damp))
    throw std::invalid_argument("--damp must be a finite value > 0");
  if (a.calib.empty() && a.stats.empty())
    throw std::invalid_argument("experiment needs calibration: --calib TEXT or --stats FILE");

  if (!a.report_dir.empty()) {  // before the long run, so an unusable path fails at once
    std::error_code ec;
    std::filesystem::create_directories(a.report_dir, ec);
    if (ec || !std::filesystem::is_directory(a.report_dir))
      throw std::runtime_error("--report-dir " + a.report_dir + ": cannot create directory" +
                               (ec ? ": " + ec.message() : std::string()));
    const std::vector<std::string> inputs = {a.model, a.calib, a.stats, a.eval, a.tokenizer};
    check_output_file(a.report_dir + "/experiment.md", "--report-dir", a.force, inputs);
    if (o.errors)
      check_output_file(a.report_dir + "/layer_errors.svg", "--report-dir", a.force, inputs);
  }

  const io::LoadedModel m = io::load_model(a.model, a.tokenizer);
  if (m.quant.nvfp4_weights && !a.force_requant)
    throw std::invalid_argument(a.model +
                                ": its weights are already NVFP4 (config.json "
                                "quantization_config); the experiment would quantize them "
                                "again: give --force-requant to use the dequantized weights");
  if (!m.tokenizer) throw std::invalid_argument(a.model + ": no tokenizer found (--tokenizer)");
  const int64_t seqlen =
      a.stats.empty() ? cap_seqlen(a.seqlen, m.weights.config.max_seq_len, a.model) : a.seqlen;
  const model::CalibStats stats =
      // ΣxxT only for the GPTQ rows; the rest reads amax and the diagonal.
      calib_stats_with_progress(m, a.stats, a.calib, a.nsamples, seqlen, a.seed, o.gptq);
  const bool bos = m.tokenizer->add_bos();  // the tokenizer's own policy, as ppl by default
  const std::vector<int> eval = m.tokenizer->encode(io::read_text_file(a.eval), bos, false);
  std::vector<int> sample;
  if (o.errors) {
    const std::string src = a.calib.empty() ? a.eval : a.calib;
    sample = m.tokenizer->encode(io::read_text_file(src), bos, false);
    if (static_cast<int64_t>(sample.size()) > a.error_tokens)
      sample.resize(static_cast<size_t>(a.error_tokens));
  }
  std::unique_ptr<ProgressBar> bar;
  std::string stage;
  // Stages run back to back: a stage announced by its first callback began when the
  // previous one reported last (or here, for the first), and its bar's clock starts there.
  double last_tick = progress_clock();
  const pipeline::ExperimentResult r = pipeline::run_experiment(
      m, stats, eval, sample, o, [&](const std::string& s, const char* unit, int64_t d, int64_t t) {
        if (s != stage) {
          if (bar) bar->finish();
          ProgressOptions po = progress_options();
          po.start = last_tick;
          bar = std::make_unique<ProgressBar>(s, t, unit, po);
          stage = s;
        }
        bar->update(d);
        last_tick = progress_clock();
      });
  if (bar) bar->finish();

  std::string md = "# scalesweep experiment: " + a.model + "\n\nEval: " + a.eval + ", " +
                   std::to_string(r.fp.tokens) + " scored tokens; calibration: " +
                   (a.stats.empty() ? a.calib + " (" + std::to_string(a.nsamples) + " x " +
                                          std::to_string(seqlen) + " tokens, seed " +
                                          std::to_string(a.seed) + ")"
                                    : a.stats) +
                   "; format " + model::tensor_format_name(o.format) + ", block " +
                   std::to_string(o.block) + "\n\n" + pipeline::experiment_markdown(r);
  if (o.errors) md += "\n## Per-layer error report\n\n" + pipeline::layer_errors_markdown(r);
  if (!a.report_dir.empty()) {
    io::write_file_atomic(a.report_dir + "/experiment.md", md);
    if (o.errors)
      io::write_file_atomic(a.report_dir + "/layer_errors.svg", pipeline::layer_errors_svg(r));
  }
  if (a.json_out) {
    json j;
    j["model"] = a.model;
    j["format"] = model::tensor_format_name(o.format);
    j["block"] = o.block;
    j["eval_tokens"] = r.fp.tokens;
    j["fp"] = {{"ppl", r.fp.ppl}, {"nll_per_token", r.fp.nll_per_token}};
    json cells = json::array();
    for (const auto& c : r.cells)
      cells.push_back({{"setting", c.setting},
                       {"algo", c.algo},
                       {"method", std::string(method_name(c.method))},
                       {"ppl", c.r.ppl},
                       {"nll_per_token", c.r.nll_per_token},
                       {"recovery", c.recovery}});
    j["cells"] = cells;
    json errs = json::array();
    for (const auto& e : r.errors) {
      json g = json::object();
      for (size_t i = 0; i < r.methods.size(); ++i)
        g[std::string(method_name(r.methods[i]))] = {{"nmse", e.nmse[i]},
                                                     {"nwmse", e.nwmse[i]},
                                                     {"nmse_gap", e.nmse_gap[i]},
                                                     {"nwmse_gap", e.nwmse_gap[i]}};
      errs.push_back({{"layer", e.layer},
                      {"tensor", e.tensor},
                      {"kind", e.kind},
                      {"rows", e.rows},
                      {"cols", e.cols},
                      {"opt_nmse", e.nmse_opt},
                      {"opt_nwmse", e.nwmse_opt},
                      {"methods", g}});
    }
    j["layer_errors"] = errs;
    j["seconds"] = r.seconds;
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  Table t({"setting", "method", "init", "ppl", "nll/token", "recovery %"});
  t.add_row({"FP", "-", "-", strf("%.4f", r.fp.ppl), strf("%.5f", r.fp.nll_per_token), "100.00"});
  std::string last;
  for (const auto& c : r.cells) {
    if (c.setting + c.algo != last) t.add_separator();
    last = c.setting + c.algo;
    t.add_row({c.setting, c.algo, std::string(method_name(c.method)), strf("%.4f", c.r.ppl),
               strf("%.5f", c.r.nll_per_token), strf("%.2f", c.recovery)});
  }
  t.print();
  std::printf("%s, block %d; eval: %lld scored tokens of %s; %.1f s\n",
              model::tensor_format_name(o.format), o.block, (long long)r.fp.tokens, a.eval.c_str(),
              r.seconds);
  if (!a.report_dir.empty())
    std::printf("report: %s/experiment.md%s\n", a.report_dir.c_str(),
                o.errors ? (", " + a.report_dir + "/layer_errors.svg").c_str() : "");
  return 0;
}

SS_COMMAND("experiment",
           "The paper's grid {RTN,GPTQ} x selectors x {WA,WAKV,WAKVQ}: perplexity, recovery, "
           "per-layer error report",
           [](CLI::App& sub) -> std::function<int()> {
             auto a = std::make_shared<ExpArgs>();
             sub.add_option("model", a->model, "llama2.c .bin, .gguf or HF directory")->required();
             sub.add_option("--calib", a->calib, "calibration text file");
             sub.add_option("--stats", a->stats, "calibration statistics (scalesweep calibrate)");
             sub.add_option("--eval", a->eval, "evaluation text file")->required();
             sub.add_option("--tokenizer", a->tokenizer, "tokenizer (llama2.c models)");
             sub.add_option("--nsamples", a->nsamples, "calibration sequences (default 128)")
                 ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
             sub.add_option("--seqlen", a->seqlen,
                            "calibration sequence length (default 512, capped at max_seq_len)")
                 ->check(CLI::Range(int64_t{2}, int64_t{1} << 24));
             sub.add_option("--seed", a->seed, "calibration seed (default 0)");
             sub.add_option("--max-tokens", a->max_tokens, "evaluate the first T tokens (0 = all)")
                 ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
             sub.add_option("--ctx", a->ctx, "perplexity window (default min(max_seq_len, 2048))")
                 ->check(CLI::Range(2, 1 << 20));
             sub.add_option("--stride", a->stride, "perplexity stride (default ctx)")
                 ->check(CLI::Range(1, 1 << 20));
             sub.add_option("--methods", a->methods,
                            "comma list (default absmax,4over6,sweep-mse,sweep-wmse)");
             sub.add_option("--settings", a->settings, "comma list (default WA,WAKV,WAKVQ)");
             sub.add_option("--format", a->format,
                            "nvfp4 (default) | mxfp4 (UE8M0 scales, block 32, RTN rows only)");
             sub.add_option("--block", a->block, "block size (default 16; mxfp4: 32)");
             sub.add_option("--damp", a->damp, "GPTQ damping (default 0.01)");
             sub.add_flag("--no-rtn", a->no_rtn, "skip the RTN rows");
             sub.add_flag("--no-gptq", a->no_gptq, "skip the GPTQ rows");
             sub.add_flag("--no-errors", a->no_errors, "skip the per-layer error report");
             sub.add_option("--error-tokens", a->error_tokens,
                            "activation sample tokens for the error report (default 2048)")
                 ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
             sub.add_option("--report-dir", a->report_dir,
                            "write experiment.md and layer_errors.svg here");
             add_force_flag(sub, a->force)
                 ->description("replace experiment.md / layer_errors.svg already in --report-dir");
             sub.add_flag("--force-requant", a->force_requant,
                          "run on a checkpoint whose weights are already NVFP4 (dequantized)");
             sub.add_flag("--json", a->json_out, "print JSON");
             return [a] { return run_experiment_cmd(*a); };
           });

}  // namespace
}  // namespace scalesweep::tools
