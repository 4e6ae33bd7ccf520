// `scalesweep experiment` as one call: the request checked, the model, calibration and token
// streams prepared, the grid run and the report written (include/scalesweep/pipeline/
// experiment.h, ExperimentRequest).
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "io/atomic_file.h"
#include "scalesweep/base/option_error.h"
#include "scalesweep/io/load.h"
#include "scalesweep/model/simquant.h"
#include "scalesweep/pipeline/calibrate.h"
#include "scalesweep/pipeline/experiment.h"

namespace scalesweep::pipeline {
namespace {

int resolved_block(const ExperimentOptions& o) {
  return o.block > 0 ? o.block : model::default_block(o.format);
}

}  // namespace

void check_experiment_request(const ExperimentRequest& r) {
  const ExperimentOptions& o = r.options;
  if (o.methods.empty()) throw OptionError("methods", "lists no method");
  if (o.settings.empty()) throw OptionError("settings", "lists no setting");
  if (!o.eval.tasks.empty()) check_eval_options(o.eval);
  // The format/block check first (the more basic error, as ppl reports it).
  for (Method mt : o.methods) (void)model::parse_sim_quant("W", mt, resolved_block(o), o.format);
  if (o.format == TensorFormat::kMxfp4 && o.gptq)
    throw OptionError("format",
                      "mxfp4: the GPTQ rows are NVFP4 only (the checkpoint quantizer has no "
                      "MXFP4 scales); add " +
                          option_ref("no_gptq"));
  if (!o.rtn && !o.gptq)
    throw OptionError("no_rtn", "leaves nothing to run with no GPTQ rows either");
  if (!(o.damp > 0) || !std::isfinite(o.damp))
    throw OptionError("damp", "must be a finite value > 0");
  if (r.calib.text.empty() && r.calib.stats.empty())
    throw std::invalid_argument("experiment needs calibration: " + option_ref("calib") +
                                " TEXT or " + option_ref("stats") + " FILE");
}

ExperimentRun run_experiment(const ExperimentRequest& r, const ExperimentEvents& ev) {
  check_experiment_request(r);
  ExperimentOptions o = r.options;
  // Task data read (and refused) before the model.
  PreparedTasks tasks;
  if (!o.eval.tasks.empty()) {
    tasks = prepare_tasks(o.eval, r.eval_data);
    o.tasks = &tasks;
  }
  o.block = resolved_block(o);
  io::refuse_moe_model(r.model, "experiment");
  const io::LoadedModel m = io::load_model(r.model, r.tokenizer);
  if (m.quant.nvfp4_weights && !r.force_requant)
    throw std::invalid_argument(r.model +
                                ": its weights are already NVFP4 (config.json "
                                "quantization_config); the experiment would quantize them "
                                "again: give " +
                                option_ref("force_requant") + " to use the dequantized weights");
  if (!m.tokenizer)
    throw std::invalid_argument(r.model + ": no tokenizer found (" + option_ref("tokenizer") + ")");
  ExperimentRun run;
  run.block = o.block;
  CalibSource calib = r.calib;
  if (calib.stats.empty())
    calib.seqlen = cap_calib_seqlen(calib, m.weights.config.max_seq_len, r.model, ev.note);
  run.seqlen = calib.seqlen;
  const int64_t ns = calib.nsamples;
  // The rows that read ΣxxT (GPTQ, block-Hessian selectors) are built layer by layer while
  // calibrating, each layer's ΣxxT freed once they have used it; the rest of the grid reads
  // amax and the diagonal. MXFP4 rows with a block-Hessian selector read ΣxxT of every layer.
  std::vector<PrebuiltRow> prebuilt;
  const bool stream = !rows_needing_xtx(o).empty();
  const std::string stage = stream ? "calibrate and quantize (GPTQ rows)" : "calibrate";
  const auto calib_progress = [&](int64_t d, int64_t t) {
    if (ev.progress) ev.progress(stage, "seq", d * ns / t, ns);
  };
  const model::CalibStats stats =
      stream
          ? prebuild_rows(m, calib, o, &prebuilt, calib_progress)
          : calib_stats_for(m, calib, calib_progress,
                            std::any_of(o.methods.begin(), o.methods.end(), method_uses_hessian));
  const bool bos = m.tokenizer->add_bos();  // the tokenizer's own policy, as ppl by default
  const std::vector<int> eval = io::text_file_tokens(*m.tokenizer, r.eval_text, bos);
  std::vector<int> sample;
  if (o.errors) {
    const std::string src = calib.text.empty() ? r.eval_text : calib.text;
    sample = io::text_file_tokens(*m.tokenizer, src, bos);
    if (static_cast<int64_t>(sample.size()) > r.error_tokens)
      sample.resize(static_cast<size_t>(r.error_tokens));
  }
  run.result = run_experiment(m, stats, eval, sample, o, ev.progress, prebuilt);
  const ExperimentResult& res = run.result;
  run.markdown = "# scalesweep experiment: " + r.model + "\n\nEval: " + r.eval_text + ", " +
                 std::to_string(res.fp.tokens) + " scored tokens; calibration: " +
                 (calib.stats.empty() ? calib.text + " (" + std::to_string(calib.nsamples) + " x " +
                                            std::to_string(run.seqlen) + " tokens, " +
                                            model::calib_draw_label(calib.draw()) + ")"
                                      : calib.stats) +
                 "; format " + std::string(kTensorFormatNames.name(o.format)) + ", block " +
                 std::to_string(o.block) + (o.gptq ? "; GPTQ scales " + gptq_scales_label(o) : "") +
                 "\n\n" + experiment_markdown(res);
  if (o.errors) run.markdown += "\n## Per-layer error report\n\n" + layer_errors_markdown(res);
  if (!r.report_dir.empty()) {
    run.report_files.push_back(r.report_dir + "/experiment.md");
    io::write_file_atomic(run.report_files.back(), run.markdown);
    if (o.tasks) {
      run.report_files.push_back(r.report_dir + "/task_recovery.svg");
      io::write_file_atomic(run.report_files.back(), task_recovery_svg(res));
    }
    if (o.errors) {
      run.report_files.push_back(r.report_dir + "/layer_errors.svg");
      io::write_file_atomic(run.report_files.back(), layer_errors_svg(res));
    }
  }
  return run;
}

}  // namespace scalesweep::pipeline
