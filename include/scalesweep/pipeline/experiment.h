// The paper's experiment grid on one model (layer `io`, behind `scalesweep experiment`):
//   {RTN, GPTQ} x {selectors} x {WA, WAKV, WAKVQ} perplexity, recovery = FP nll / quantized
//   nll (per token, %), with the FP model as reference row;
// and a per-layer error report: for every quantized tensor (Linear weights, Linear inputs,
// Q, K, V) the NMSE and NWMSE gap (%) of each selector to the continuous optimum (opt-fp32,
// MSE optimum for NMSE, importance-weighted optimum for NWMSE), as the paper's Figures 5/7.
//
// Weights: RTN or GPTQ with fused global scales, exactly as `scalesweep quantize` writes them
// (pipeline::quantized_weights); MXFP4 (no global scale): RTN through model::quantize_weights.
// Activations / KV / Q: the runtime's simulated NVFP4 (model::make_runtime_quant: static global
// scales from calibration, per-token block scales).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "scalesweep/gptq/gptq.h"
#include "scalesweep/io/load.h"
#include "scalesweep/model/calib.h"
#include "scalesweep/model/perplexity.h"
#include "scalesweep/pipeline/calibrate.h"
#include "scalesweep/pipeline/eval.h"
#include "scalesweep/pipeline/events.h"
#include "scalesweep/quant/quantize.h"

namespace scalesweep::pipeline {

struct ExperimentOptions {
  std::vector<Method> methods = {Method::kAbsMax, Method::kFourOverSix, Method::kSweepMse,
                                 Method::kSweepWmse};
  std::vector<std::string> settings = {"WA", "WAKV", "WAKVQ"};
  bool rtn = true, gptq = true;
  TensorFormat format = TensorFormat::kNvfp4;  // MXFP4: RTN only (gptq must be false)
  int block = 16;                              // 0: the format's (16 NVFP4, 32 MXFP4)
  double damp = 0.01;
  int global_scale_steps = 0;  // QuantizeOptions::global_scale_steps of every row (NVFP4)
  // The GPTQ rows' block-scale timing and dynamic importance (QuantizeOptions, gptq/gptq.h).
  gptq::ScaleTiming gptq_scales = gptq::ScaleTiming::kStatic;
  gptq::DynamicImportance gptq_importance = gptq::GptqConfig{}.importance;
  model::PplOptions ppl;
  bool errors = true;  // per-layer error report
  // Task accuracy of every row (experiment --tasks): prepared tasks and how they run.
  const PreparedTasks* tasks = nullptr;
  EvalOptions eval;
};

// Task columns of one row: each task's headline metric (task_headline_metric) and their mean.
struct TaskScores {
  std::vector<TaskResult> results;
  double average = 0;  // mean over tasks of the headline metric (fraction)
};

struct ExperimentCell {
  std::string setting;  // WA, WAKV, WAKVQ
  std::string algo;     // RTN, GPTQ
  Method method = Method::kAbsMax;
  model::PplResult r;
  double recovery = 0;        // 100 * fp nll / nll
  double weight_seconds = 0;  // quantizing the row's weights (RTN or GPTQ, every Linear)
  TaskScores tasks;
  double task_recovery = 0;  // 100 * task average / FP task average (the paper's recovery)
};

struct LayerError {
  int layer = 0;
  std::string tensor;  // "q_proj.weight", "attn_in", "Q", "K", "V", ...
  std::string kind;    // "weight", "activation", "query", "key", "value"
  int64_t rows = 0, cols = 0;
  double nmse_opt = 0, nwmse_opt = 0;       // opt-fp32 (MSE optimum; WMSE optimum)
  std::vector<double> nmse, nwmse;          // per method (ExperimentResult::methods)
  std::vector<double> nmse_gap, nwmse_gap;  // % to the optimum
};

struct ExperimentResult {
  std::vector<Method> methods;
  model::PplResult fp;
  TaskScores fp_tasks;
  std::vector<std::string> task_names;  // empty without --tasks
  std::vector<ExperimentCell> cells;
  std::vector<LayerError> errors;
  int64_t sample_tokens = 0;  // activation samples behind the error report
  double seconds = 0;
};

// A row's weights built before run_experiment (experiment's GPTQ rows, built layer by layer
// while calibrating so that one layer's ΣxxT is held at a time): the row's algorithm and
// selector, its weights (quantized Linears packed, pipeline::QuantizedForm::kPacked) and the
// seconds spent quantizing them.
struct PrebuiltRow {
  bool gptq = false;
  Method method = Method::kAbsMax;
  std::shared_ptr<const model::Weights> weights;
  double seconds = 0;
};

// The rows whose weights read ΣxxT (NVFP4: GPTQ rows, and RTN rows of block-Hessian
// selectors), in run order; empty for MXFP4 (its RTN rows quantize through
// model::quantize_weights, from the statistics as given).
std::vector<std::pair<bool, Method>> rows_needing_xtx(const ExperimentOptions& opt);

// `eval_tokens`: the perplexity stream (BOS + text). `sample_tokens`: tokens whose
// activations feed the error report (run through the FP model in windows of the model's
// context). `progress(stage, unit, done, total)` reports each step, counted in `unit`
// ("tok" for perplexity and activation samples, "linear" for weight quantization, "tensor"
// for the error report).
ExperimentResult run_experiment(
    const io::LoadedModel& m, const model::CalibStats& stats, const std::vector<int>& eval_tokens,
    const std::vector<int>& sample_tokens, const ExperimentOptions& opt,
    const std::function<void(const std::string&, const char*, int64_t, int64_t)>& progress = {},
    const std::vector<PrebuiltRow>& prebuilt = {});

// Builds the rows of rows_needing_xtx(opt) from `m` layer by layer while the calibration of
// `calib` runs (pipeline::calib_stats_by_layer): each layer's ΣxxT is used by every such row
// and freed. Returns the statistics without ΣxxT (all that the rest of the grid reads) and
// fills *rows. The same weights, bit for bit, as run_experiment builds from whole-model
// statistics. Refuses (OptionError "methods") rows that do not fit in the memory available.
model::CalibStats prebuild_rows(const io::LoadedModel& m, const CalibSource& calib,
                                const ExperimentOptions& opt, std::vector<PrebuiltRow>* rows,
                                const std::function<void(int64_t, int64_t)>& progress = {});

// The GPTQ rows' block-scale timing as the reports name it: "static" or "dynamic, importance
// obs" (the name tables of gptq/gptq.h).
std::string gptq_scales_label(const ExperimentOptions& o);

// Markdown table of the grid (paper layout: setting, method, init, ppl, nll, recovery; with
// tasks: each task's headline metric, their average and its recovery).
std::string experiment_markdown(const ExperimentResult& r);
// Self-contained SVG: task-average recovery (%) of every row, grouped by setting (empty string
// without tasks).
std::string task_recovery_svg(const ExperimentResult& r);
// Markdown table of the per-layer error report, and a self-contained SVG plot of the gaps
// (NMSE and NWMSE panels, one line per method, tensors along x grouped by layer).
std::string layer_errors_markdown(const ExperimentResult& r);
std::string layer_errors_svg(const ExperimentResult& r);

// `scalesweep experiment`: the model to load, where its calibration comes from (a text, or
// statistics from `scalesweep calibrate`), the evaluation text and the report directory.
struct ExperimentRequest {
  std::string model, tokenizer;
  CalibSource calib;            // text or stats needed; calib.text also feeds the error report
  std::string eval_text;        // perplexity (and the error report's sample without calib.text)
  std::string report_dir;       // non-empty: experiment.md (+ layer_errors.svg) written there
  int64_t error_tokens = 2048;  // activation sample tokens behind the error report
  bool force_requant = false;   // accept a checkpoint whose weights are already NVFP4
  ExperimentOptions options;    // block 0: the format's
  // Task accuracy columns: options.eval.tasks non-empty; their data.
  EvalData eval_data;
};

// Throws std::invalid_argument, before anything is read, for a request that cannot run: an
// empty method or setting list, a format/block that a method cannot use, GPTQ rows with
// MXFP4, neither RTN nor GPTQ rows, damp not finite > 0, no calibration.
void check_experiment_request(const ExperimentRequest& request);

// Progress as run_experiment's, with the stage "calibrate" (unit "seq") first when
// calibrating from a text.
using ExperimentEvents = JobEvents;

struct ExperimentRun {
  ExperimentResult result;
  int block = 16;                         // the block used
  int64_t seqlen = 0;                     // the calibration sequence length used (after the cap)
  std::string markdown;                   // the report (grid, then the per-layer errors)
  std::vector<std::string> report_files;  // written under report_dir
};

// check_experiment_request, load the model (refusing NVFP4 weights without force_requant and
// a model without a tokenizer), the calibration statistics (ΣxxT only for the GPTQ rows), the
// evaluation and error-report token streams (the tokenizer's own BOS policy), run_experiment,
// and the report files written atomically.
ExperimentRun run_experiment(const ExperimentRequest& request, const ExperimentEvents& events = {});

}  // namespace scalesweep::pipeline
