// scalesweep experiment: the paper's grid ({RTN, GPTQ} x selectors x {WA, WAKV, WAKVQ}) with
// perplexity and recovery against the FP model, plus a per-layer error report (Markdown +
// SVG) of every selector's NMSE/NWMSE gap to the continuous optimum: one
// pipeline::run_experiment call.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include "scalesweep/gptq/gptq.h"
#include "scalesweep/model/simquant.h"
#include "scalesweep/pipeline/experiment.h"
#include "tools/command.h"
#include "tools/options.h"
#include "tools/output.h"
#include "tools/ui.h"

namespace scalesweep::tools {
namespace {

using nlohmann::json;

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ",") + x;
  return s;
}

std::string method_list(const std::vector<Method>& ms) {
  std::vector<std::string> v;
  for (Method m : ms) v.emplace_back(kMethodNames.name(m));
  return join(v);
}

struct ExpArgs {
  ModelOptions model;
  CalibOptions calib;
  OutputOptions out;  // --force (report files), --json
  QuantOptions q;     // --format, --block
  pipeline::ExperimentOptions o;
  std::string eval, report_dir;
  std::string methods = method_list(pipeline::ExperimentOptions{}.methods);
  std::string settings = join(pipeline::ExperimentOptions{}.settings);
  int64_t error_tokens = pipeline::ExperimentRequest{}.error_tokens;
  std::string gptq_scales{gptq::kScaleTimingNames.name(pipeline::ExperimentOptions{}.gptq_scales)};
  std::string gptq_importance{
      gptq::kDynamicImportanceNames.name(pipeline::ExperimentOptions{}.gptq_importance)};
  bool no_rtn = false, no_gptq = false, no_errors = false, force_requant = false;
  std::string tasks, task_data_dir;  // --tasks, --task-data-dir
  int64_t task_limit = 0;
};

pipeline::ExperimentRequest make_request(const ExpArgs& a) {
  pipeline::ExperimentRequest rq;
  rq.model = a.model.path;
  rq.tokenizer = a.model.tokenizer;
  rq.calib = calib_source(a.calib);
  rq.eval_text = a.eval;
  rq.report_dir = a.report_dir;
  rq.error_tokens = a.error_tokens;
  rq.force_requant = a.force_requant;
  rq.options = a.o;
  pipeline::ExperimentOptions& o = rq.options;
  o.methods.clear();
  for (const auto& s : split_commas(a.methods)) o.methods.push_back(kMethodNames.parse(s));
  if (o.methods.empty())
    throw std::invalid_argument("--methods '" + a.methods + "' lists no method");
  o.settings = split_commas(a.settings);
  if (o.settings.empty())
    throw std::invalid_argument("--settings '" + a.settings + "' lists no setting");
  o.rtn = !a.no_rtn;
  o.gptq = !a.no_gptq;
  o.gptq_scales = parse_named(gptq::kScaleTimingNames, "--gptq-scales", a.gptq_scales);
  o.gptq_importance =
      parse_named(gptq::kDynamicImportanceNames, "--gptq-importance", a.gptq_importance);
  o.errors = !a.no_errors;
  o.format = kTensorFormatNames.parse(a.q.format);
  o.block = a.q.block;
  o.eval.tasks = split_commas(a.tasks);
  o.eval.limit = a.task_limit;
  rq.eval_data.dir = eval_data_dir(a.task_data_dir);
  return rq;
}

// Before the long run, so an unusable --report-dir fails at once.
void check_report_dir(const ExpArgs& a, const pipeline::ExperimentRequest& rq) {
  if (a.report_dir.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(a.report_dir, ec);
  if (ec || !std::filesystem::is_directory(a.report_dir))
    throw std::runtime_error("--report-dir " + a.report_dir + ": cannot create directory" +
                             (ec ? ": " + ec.message() : std::string()));
  const std::vector<std::string> inputs = {a.model.path, a.calib.text, a.calib.stats, a.eval,
                                           a.model.tokenizer};
  check_output_file(a.report_dir + "/experiment.md", "--report-dir", a.out.force, inputs);
  if (rq.options.errors)
    check_output_file(a.report_dir + "/layer_errors.svg", "--report-dir", a.out.force, inputs);
  if (!rq.options.eval.tasks.empty())
    check_output_file(a.report_dir + "/task_recovery.svg", "--report-dir", a.out.force, inputs);
}

void render_json(const pipeline::ExperimentRun& run, const pipeline::ExperimentRequest& rq) {
  const pipeline::ExperimentResult& r = run.result;
  json j;
  j["model"] = rq.model;
  j["format"] = std::string(kTensorFormatNames.name(rq.options.format));
  j["block"] = run.block;
  if (rq.options.gptq) {
    j["gptq_scales"] = std::string(gptq::kScaleTimingNames.name(rq.options.gptq_scales));
    if (rq.options.gptq_scales == gptq::ScaleTiming::kDynamic)
      j["gptq_importance"] =
          std::string(gptq::kDynamicImportanceNames.name(rq.options.gptq_importance));
  }
  j["eval_tokens"] = r.fp.tokens;
  j["fp"] = {{"ppl", r.fp.ppl}, {"nll_per_token", r.fp.nll_per_token}};
  json cells = json::array();
  for (const auto& c : r.cells)
    cells.push_back({{"setting", c.setting},
                     {"algo", c.algo},
                     {"method", std::string(kMethodNames.name(c.method))},
                     {"ppl", c.r.ppl},
                     {"nll_per_token", c.r.nll_per_token},
                     {"recovery", c.recovery},
                     {"weight_seconds", c.weight_seconds}});
  auto tasks_json = [&](const pipeline::TaskScores& ts) {
    json t = json::object();
    for (const auto& tr : ts.results) {
      json m = {{"n", tr.n}};
      for (const auto& [k, v] : tr.metrics) m[k] = v.value;
      t[tr.task] = m;
    }
    return t;
  };
  if (!r.task_names.empty()) {
    j["fp"]["tasks"] = tasks_json(r.fp_tasks);
    j["fp"]["task_average"] = r.fp_tasks.average;
    for (size_t i = 0; i < r.cells.size(); ++i) {
      cells[i]["tasks"] = tasks_json(r.cells[i].tasks);
      cells[i]["task_average"] = r.cells[i].tasks.average;
      cells[i]["task_recovery"] = r.cells[i].task_recovery;
    }
  }
  j["cells"] = cells;
  json errs = json::array();
  for (const auto& e : r.errors) {
    json g = json::object();
    for (size_t i = 0; i < r.methods.size(); ++i)
      g[std::string(kMethodNames.name(r.methods[i]))] = {{"nmse", e.nmse[i]},
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
}

void render_table(const pipeline::ExperimentRun& run, const pipeline::ExperimentRequest& rq) {
  const pipeline::ExperimentResult& r = run.result;
  const std::string gptq_scales =
      rq.options.gptq ? "; GPTQ scales " + pipeline::gptq_scales_label(rq.options) : "";
  if (!r.task_names.empty()) {  // the grid with task columns, as the report has it
    std::printf("%s", pipeline::experiment_markdown(r).c_str());
    std::printf("%s, block %d%s; %.1f s\n", kTensorFormatNames.name(rq.options.format).data(),
                run.block, gptq_scales.c_str(), r.seconds);
    if (!run.report_files.empty()) {
      std::string files;
      for (const auto& f : run.report_files) files += (files.empty() ? "" : ", ") + f;
      std::printf("report: %s\n", files.c_str());
    }
    return;
  }
  Table t({"setting", "method", "init", "ppl", "nll/token", "recovery %"});
  t.add_row({"FP", "-", "-", strf("%.4f", r.fp.ppl), strf("%.5f", r.fp.nll_per_token), "100.00"});
  std::string last;
  for (const auto& c : r.cells) {
    if (c.setting + c.algo != last) t.add_separator();
    last = c.setting + c.algo;
    t.add_row({c.setting, c.algo, std::string(kMethodNames.name(c.method)), strf("%.4f", c.r.ppl),
               strf("%.5f", c.r.nll_per_token), strf("%.2f", c.recovery)});
  }
  t.print();
  std::printf("%s, block %d%s; eval: %lld scored tokens of %s; %.1f s\n",
              kTensorFormatNames.name(rq.options.format).data(), run.block, gptq_scales.c_str(),
              (long long)r.fp.tokens, rq.eval_text.c_str(), r.seconds);
  if (!run.report_files.empty()) {
    std::string files;
    for (const auto& f : run.report_files) files += (files.empty() ? "" : ", ") + f;
    std::printf("report: %s\n", files.c_str());
  }
}

int run_experiment_cmd(const ExpArgs& a) {
  const pipeline::ExperimentRequest rq = make_request(a);
  pipeline::check_experiment_request(rq);
  check_report_dir(a, rq);
  StageBars bars;  // stages back to back: each bar's clock starts where the last one reported
  const pipeline::ExperimentRun run = pipeline::run_experiment(rq, cli_events(bars));
  bars.finish();
  if (a.out.json)
    render_json(run, rq);
  else
    render_table(run, rq);
  return 0;
}

}  // namespace

SS_COMMAND(
    "experiment",
    "The paper's grid {RTN,GPTQ} x selectors x {W,WA,WAKV,WAKVQ}: perplexity, task accuracy "
    "(--tasks), recovery, per-layer error report",
    [](CLI::App& sub) -> std::function<int()> {
      auto a = std::make_shared<ExpArgs>();
      add_model_options(sub, a->model);
      CalibSpelling calib;
      calib.size_aliases = calib.seed_alias = true;
      add_calib_options(sub, a->calib, calib);
      sub.add_option("--eval", a->eval, "evaluation text file")->required();
      sub.add_option("--max-tokens", a->o.ppl.max_tokens, "evaluate the first T tokens (0 = all)")
          ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
      sub.add_option("--ctx", a->o.ppl.ctx,
                     "perplexity window; when not given: min(max_seq_len, 2048)")
          ->check(CLI::Range(2, 1 << 20));
      sub.add_option("--stride", a->o.ppl.stride, "perplexity stride; when not given: the window")
          ->check(CLI::Range(1, 1 << 20));
      sub.add_option("--methods", a->methods, "comma list of block-scale selectors");
      sub.add_option("--settings", a->settings, "comma list of settings (W, WA, WAKV, WAKVQ)");
      std::string names;
      for (const std::string& t : pipeline::eval_task_names())
        names += (names.empty() ? "" : ", ") + t;
      sub.add_option("--tasks", a->tasks,
                     "task-accuracy columns for every row, as `eval` runs them: " + names);
      sub.add_option("--task-limit", a->task_limit,
                     "the first N documents of each task (each mmlu subject); 0: all")
          ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
      sub.add_option("--task-data-dir", a->task_data_dir,
                     "task data directory; default: $SS_EVAL_DATA, else data/eval");
      QuantSpelling qs;
      qs.method = false;  // --methods
      add_quant_options(sub, a->q, qs);
      sub.add_option("--damp", a->o.damp, "GPTQ relative damping");
      sub.add_option("--search-global-scale", a->o.global_scale_steps,
                     "N > 0: each fused group's global scale searched as `quantize "
                     "--search-global-scale N` does (NVFP4 rows); 0: the rule 6C/amax")
          ->check(CLI::Range(0, 1024));
      sub.add_option("--gptq-scales", a->gptq_scales,
                     "when the GPTQ rows' block scales are chosen: static or dynamic (as "
                     "quantize --gptq-scales)");
      sub.add_option("--gptq-importance", a->gptq_importance,
                     "importance of the GPTQ rows' dynamic scale choice: hdiag or obs (as "
                     "quantize --gptq-importance)");
      sub.add_flag("--no-rtn", a->no_rtn, "skip the RTN rows");
      sub.add_flag("--no-gptq", a->no_gptq, "skip the GPTQ rows (mxfp4 has none)");
      sub.add_flag("--no-errors", a->no_errors, "skip the per-layer error report");
      sub.add_option("--error-tokens", a->error_tokens,
                     "activation sample tokens for the error report")
          ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
      sub.add_option("--report-dir", a->report_dir,
                     "write experiment.md and layer_errors.svg here");
      add_output_options(
          sub, a->out,
          force_and_json("replace experiment.md / layer_errors.svg already in --report-dir",
                         "print JSON"));
      sub.add_flag("--force-requant", a->force_requant,
                   "run on a checkpoint whose weights are already NVFP4 (dequantized)");
      return [a] { return run_experiment_cmd(*a); };
    });

}  // namespace scalesweep::tools
