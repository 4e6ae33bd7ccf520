// scalesweep eval MODEL --tasks LIST [--limit N] [--data DIR] [--task-data TASK=FILE ...]
//   [--num-fewshot K] [--threads T] [--max-length L] [--max-gen-tokens N] [--bos|--no-bos]
//   [--log-samples FILE]
//   [--apply-chat-template [--fewshot-as-multiturn true|false]] [--system-instruction TEXT]
//   [--json] [--quant W|WA|WAKV|WAKVQ --method M ... (as ppl)]
// Task accuracy as lm-evaluation-harness 0.4.13 defines the tasks: one pipeline::run_eval.
#include <cstdio>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "scalesweep/pipeline/eval.h"
#include "tools/command.h"
#include "tools/output.h"
#include "tools/sim_quant_cli.h"
#include "tools/ui.h"

namespace scalesweep::tools {
namespace {

struct EvalArgs {
  ModelOptions model;
  SimQuantOptions sq;
  OutputOptions out;  // --json
  BosOption bos;
  std::string tasks, data, log_samples, system_instruction, fewshot_as_multiturn;
  std::vector<std::string> task_data;
  bool apply_chat_template = false;
  int64_t limit = 0;
  int num_fewshot = -1, threads = 0, max_length = 0, max_gen_tokens = 0;
  bool force = false;
};

int run_eval_cmd(const EvalArgs& a) {
  pipeline::EvalRequest req;
  req.runtime = runtime_request(a.model, a.sq, a.sq.calib.seed);
  req.options.tasks = split_commas(a.tasks);
  req.options.limit = a.limit;
  req.options.num_fewshot = a.num_fewshot;
  req.options.threads = a.threads;
  req.options.max_length = a.max_length;
  req.options.max_gen_tokens = a.max_gen_tokens;
  if (a.bos.opt && a.bos.opt->count() > 0) req.options.bos = a.bos.bos;
  req.options.apply_chat_template = a.apply_chat_template;
  req.options.system_instruction = a.system_instruction;
  if (!a.fewshot_as_multiturn.empty())
    req.options.fewshot_as_multiturn = a.fewshot_as_multiturn == "true";
  req.data.dir = eval_data_dir(a.data);
  for (const std::string& kv : a.task_data) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == kv.size())
      throw std::invalid_argument("--task-data " + kv +
                                  ": expected TASK=FILE (or TASK:fewshot=FILE)");
    req.data.files[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  for (const auto& [key, path] : req.data.files) {
    const std::string task = key.substr(0, key.find(':'));
    bool known = false;
    for (const std::string& t : req.options.tasks) known = known || t == task;
    if (!known)
      throw std::invalid_argument("--task-data " + key + ": task " + task + " is not in --tasks");
  }
  req.log_samples = a.log_samples;
  pipeline::check_eval_options(req.options);
  if (!a.log_samples.empty())
    check_output_file(a.log_samples, "--log-samples", a.force, {a.model.path});

  std::optional<StageBars> bars(std::in_place);
  pipeline::EvalRun run = pipeline::run_eval(req, cli_events(*bars));
  bars.reset();  // the last bar's final line before the results
  const pipeline::EvalResult& r = run.result;
  const pipeline::RuntimeDescription& d = run.runtime;
  const nlohmann::json rt = {{"quant", d.quant}, {"method", d.method}, {"format", d.format},
                             {"block", d.block}, {"source", d.source}, {"compute", d.compute}};
  if (a.out.json) {
    nlohmann::json j = {{"results", nlohmann::json::parse(pipeline::eval_results_json(r))},
                        {"model", a.model.path},
                        {"runtime", rt},
                        {"limit", a.limit},
                        {"documents", r.documents},
                        {"requests", r.requests},
                        {"seconds", r.seconds}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("model %s, %s%s, %lld documents, %lld requests, %.1f s\n\n", a.model.path.c_str(),
                d.quant.c_str(),
                d.format == "none"
                    ? ""
                    : (" " + d.format + " " + d.method + " b" + std::to_string(d.block)).c_str(),
                static_cast<long long>(r.documents), static_cast<long long>(r.requests), r.seconds);
    std::printf("%s", pipeline::eval_markdown(r).c_str());
  }
  return 0;
}

}  // namespace

SS_COMMAND("eval", "Task accuracy as lm-evaluation-harness measures it (arc, hellaswag, mmlu, ...)",
           [](CLI::App& sub) -> std::function<int()> {
             auto a = std::make_shared<EvalArgs>();
             add_model_options(sub, a->model);
             std::string names;
             for (const std::string& t : pipeline::eval_task_names())
               names += (names.empty() ? "" : ", ") + t;
             sub.add_option("--tasks", a->tasks, "comma-separated tasks: " + names)->required();
             sub.add_option("--limit", a->limit,
                            "the first N documents of each task (each mmlu subject); 0: all")
                 ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
             sub.add_option("--data", a->data,
                            "task data directory; default: $SS_EVAL_DATA, else data/eval (as "
                            "scripts/get-eval-data.sh writes it)");
             sub.add_option("--task-data", a->task_data,
                            "TASK=FILE: a task's own documents (JSONL, Parquet or an Arrow "
                            "folder); TASK:fewshot=FILE its few-shot pool");
             sub.add_option(
                    "--num-fewshot", a->num_fewshot,
                    "few-shot examples; default: the task's (mmlu 5, gsm8k_cot 8, others 0)")
                 ->check(CLI::Range(0, 64));
             sub.add_option("--threads", a->threads, "worker threads; 0: all cores")
                 ->check(CLI::Range(0, 4096));
             sub.add_option("--max-length", a->max_length,
                            "context length requests are cut to (from the left); 0: the model's")
                 ->check(CLI::Range(0, 1 << 24));
             sub.add_option("--max-gen-tokens", a->max_gen_tokens,
                            "tokens generated at most per document (generation tasks; default: "
                            "the task's, gsm8k_cot 256, ifeval 1280)")
                 ->check(CLI::Range(1, 1 << 20));
             sub.add_option("--log-samples", a->log_samples,
                            "write one JSON line per document (requests, loglikelihoods, metrics)");
             sub.add_flag("--force", a->force, "replace an existing --log-samples file");
             sub.add_flag("--apply-chat-template", a->apply_chat_template,
                          "render each context with the model's chat template, as lm-eval's "
                          "--apply_chat_template (ChatML and Llama-3 templates)");
             sub.add_option(
                    "--fewshot-as-multiturn", a->fewshot_as_multiturn,
                    "with --apply-chat-template: few-shot examples as user/assistant "
                    "turns (true, as lm-eval's CLI when this is not given) or one user message")
                 ->check(CLI::IsMember({"true", "false"}));
             sub.add_option("--system-instruction", a->system_instruction,
                            "a system message (lm-eval's --system_instruction; without the chat "
                            "template it is put in front of each context as it is)");
             add_bos_option(sub, a->bos);
             add_sim_quant_options(sub, a->sq);
             add_output_options(sub, a->out, json_only());
             return [a] { return run_eval_cmd(*a); };
           });

}  // namespace scalesweep::tools
