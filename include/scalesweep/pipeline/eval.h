// Task accuracy as lm-evaluation-harness measures it (layer `pipeline`, behind
// `scalesweep eval` and `experiment --tasks`).
//
// The tasks follow lm-eval 0.4.13's definitions (lm_eval/tasks/<task>/*.yaml and their
// utils.py): prompt templates, target delimiters, preprocessing, few-shot selection, metrics
// and standard errors. Each task is one row of the table in src/pipeline/eval_tasks.cc:
//
//   arc_easy, arc_challenge   "Question: {question}\nAnswer:" + " {choice}"; acc, acc_norm
//   hellaswag                 "{activity_label}: {ctx_a} {Ctx_b}" bracket-cleaned; acc, acc_norm
//   winogrande                partial scoring: contexts "{sentence up to _}{option}", the
//                             continuation " {rest of the sentence}"; acc
//   piqa                      "Question: {goal}\nAnswer:" + " {sol}"; acc, acc_norm
//   boolq                     "{passage}\nQuestion: {question}?\nAnswer:" + " no"/" yes"; acc
//   lambada_openai            all words but the last, then " {last}"; acc (greedy), perplexity
//   mmlu                      5-shot from dev (first 5), per subject mmlu_<subject>; acc per
//                             subject, per category (stem, humanities, social_sciences, other)
//                             and overall weighted by size
//   gsm8k_cot                 lm-eval's gsm8k-cot: the 8 fixed chain-of-thought exemplars,
//                             greedy until "Q:", "</s>", "<|im_end|>" (max 256 tokens),
//                             exact_match after strict-match and flexible-extract filters
//   ifeval                    "{prompt}", greedy until EOS (max 1280 tokens); lm-eval's own
//                             checkers (scripts/ifeval_score.py, a subprocess) give
//                             prompt_level_{strict,loose}_acc (mean over documents) and
//                             inst_level_{strict,loose}_acc (mean over all instructions)
//
// lm-eval's `gsm8k` draws its 5 shots from the train split, which the installable data does
// not have; gsm8k_cot needs only the test split. acc_norm divides each choice's loglikelihood
// by its length in characters (UTF-8 bytes here, code points in lm-eval: equal on ASCII).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "scalesweep/model/chat_template.h"
#include "scalesweep/model/scoring.h"
#include "scalesweep/model/tokenizer.h"
#include "scalesweep/pipeline/events.h"
#include "scalesweep/pipeline/runtime.h"

namespace scalesweep::pipeline {

// The tasks `eval` knows, in table order.
std::vector<std::string> eval_task_names();

// Where a task's documents come from.
struct EvalData {
  std::string dir = "data/eval";  // scripts/get-eval-data.sh writes here
  // Per task, the user's own file for its test split (JSONL, Parquet, Arrow): "TASK" -> path;
  // "TASK:fewshot" -> the few-shot pool (mmlu's dev split).
  std::map<std::string, std::string> files;
  // ifeval's scorer (scripts/ifeval_score.py) and the python that runs it; empty: found as
  // src/pipeline/ifeval.h says ($SS_IFEVAL_SCORER, beside the executable or the data; $SS_PYTHON
  // else python3). NLTK's punkt_tab: <dir>/nltk (scripts/get-ifeval.sh).
  std::string python, ifeval_scorer;
};

struct EvalOptions {
  std::vector<std::string> tasks;
  int64_t limit = 0;     // first N documents of each task (each mmlu subject), 0: all
  int num_fewshot = -1;  // -1: the task's own (mmlu 5, gsm8k_cot 8, others 0)
  int threads = 0;       // 0: all cores
  int max_length = 0;    // 0: the model's max_seq_len (lm-eval: max_position_embeddings)
  // BOS in front of every request: unset, the tokenizer's own policy (lm-eval's default);
  // true/false as lm-eval's add_bos_token.
  std::optional<bool> bos;
  int max_gen_tokens = 0;  // generated tokens at most; 0: the task's (gsm8k_cot 256, ifeval 1280)
  // lm-eval's --apply_chat_template: each context is lm-eval's message list (an optional
  // system message, then the few-shot examples and the question as one user message, or as
  // turns with fewshot_as_multiturn) rendered with the model's chat template and its generation
  // prompt (model/chat_template.h); multiple-choice continuations then have no target
  // delimiter ("Paris", not " Paris").
  bool apply_chat_template = false;
  // lm-eval's --fewshot_as_multiturn: each few-shot example a user turn and an assistant turn.
  // Unset: as lm-eval's CLI, on with the chat template (it changes only few-shot tasks);
  // true without the chat template is refused, as lm-eval does.
  std::optional<bool> fewshot_as_multiturn;
  // lm-eval's --system_instruction: joined with the task's description (mmlu) by "\n\n"
  // unless one side has whitespace there; the system message under the chat template, else
  // put in front of the context as it is (lm-eval adds no separator).
  std::string system_instruction;
};

// Throws std::invalid_argument for an unknown task (listing the known ones), a negative
// limit or max_gen_tokens, a few-shot count above what the task's pool has, or an empty task list.
void check_eval_options(const EvalOptions& opt);

// One request of one document, as lm-eval logs it.
struct EvalRequestLog {
  std::string context, continuation;  // continuation empty for generation
  double loglikelihood = 0;
  bool is_greedy = false;
  int tokens = 0;
};

// One document's log line (lm-eval --log_samples): what was asked and answered.
struct EvalSample {
  std::string task;  // mmlu: mmlu_<subject>
  int64_t doc_id = 0;
  std::string target;  // gold index (multiple choice) or target text
  std::vector<EvalRequestLog> requests;
  std::string generation;                       // generate_until tasks
  std::map<std::string, std::string> filtered;  // filter name -> extracted answer
  std::map<std::string, double> metrics;        // per-document metric values
  // Per-document lists whose task value is the mean over all items of all documents
  // (ifeval's inst_level_*: one 0/1 per instruction; lm-eval's agg_inst_level_acc).
  std::map<std::string, std::vector<double>> metric_lists;
  bool generated = false;    // a generate_until document: `generation` holds the text
  int generated_tokens = 0;  // its decode steps
};

struct MetricValue {
  double value = 0, stderr_ = 0;
};

struct TaskResult {
  std::string task;
  int64_t n = 0;                               // documents
  std::map<std::string, MetricValue> metrics;  // acc, acc_norm, perplexity, exact_match,...
  std::vector<TaskResult> subtasks;            // mmlu: categories, then subjects
  double seconds = 0;
};

struct EvalResult {
  std::vector<TaskResult> tasks;
  std::vector<EvalSample> samples;  // every document, in task order
  double seconds = 0;
  int64_t documents = 0, requests = 0;
};

// Progress stages: each task's name, unit "doc".
using EvalEvents = JobEvents;

// Documents of every task turned into requests (model-independent); throws std::runtime_error
// naming the file (and the script that installs it) for missing or bad data, and for ifeval
// when its scorer cannot run (python, lm-eval, the checkers' modules, punkt_tab: checked here,
// before any generation).
struct PreparedTask;
struct PreparedTasks {
  std::vector<std::shared_ptr<const PreparedTask>> tasks;
};
PreparedTasks prepare_tasks(const EvalOptions& opt, const EvalData& data);
std::vector<std::string> prepared_task_names(const PreparedTasks& tasks);

// Runs prepared tasks on a model: `make` builds one Transformer per worker (all on the same
// weights, configured as `cfg`). Throws std::invalid_argument when the tokenizer cannot encode
// a prompt (an id outside the model's vocabulary) naming task and document.
// With opt.apply_chat_template, `chat` is the template contexts are rendered with (null: the
// tokenizer's, by eval_chat_template).
EvalResult evaluate(const PreparedTasks& tasks, const model::Tokenizer& tok,
                    const model::Config& cfg, const model::TransformerFactory& make,
                    const EvalOptions& opt, const EvalEvents& events = {},
                    const model::ChatTemplate* chat = nullptr);

// The chat template of --apply-chat-template: the tokenizer's (Tokenizer::chat_template)
// recognized. Throws std::invalid_argument naming `model` (the file the tokenizer came from)
// when it carries none, or one that is not supported (naming the supported families).
model::ChatTemplate eval_chat_template(const model::Tokenizer& tok, const std::string& model);

// The factory evaluate() runs on: Transformers like `proto`, on an fp32 copy of its weights
// when they are stored narrower (GGUF blocks, NVFP4, bf16) and the copy fits in a quarter of
// the machine's memory: the runtime then skips dequantizing every weight tile on every call
// (same values: dequantization is exact and the fp32 kernels are the reference), which
// matters for the many short forward passes of task evaluation. Otherwise (or with bf16
// compute) the stored weights, with a note.
model::TransformerFactory eval_transformer_factory(
    const model::Transformer& proto, const std::function<void(const std::string&)>& note = {});

// `scalesweep eval`: a model as `ppl` loads it (load_runtime: simulated --quant, checkpoints
// as they run, --compute), the tasks, and the per-document log written atomically.
struct EvalRequest {
  RuntimeRequest runtime;
  EvalOptions options;
  EvalData data;
  std::string log_samples;  // JSONL path; empty: none
};
struct EvalRun {
  EvalResult result;
  RuntimeDescription runtime;
};
EvalRun run_eval(const EvalRequest& request, const EvalEvents& events = {});

// {"results": {TASK: {"acc": .., "acc_stderr": .., "n": ..}}} (subtasks as their own keys, as
// lm-eval), and the markdown table.
std::string eval_results_json(const EvalResult& r);  // the "results" object only
std::string eval_markdown(const EvalResult& r);
// One JSON line per document.
std::string eval_sample_json(const EvalSample& s);

// The metric a task's column and average use: acc_norm for arc_*, hellaswag and piqa (the
// length-normalized score the literature reports), acc for winogrande, boolq, lambada_openai
// and mmlu, exact_match,strict-match for gsm8k_cot, prompt_level_strict_acc for ifeval.
std::string task_headline_metric(const std::string& task);
// Mean over tasks of their headline metric.
double task_average(const std::vector<TaskResult>& results);

// lm-eval's statistics: the mean's standard error (sample standard deviation / sqrt(n)) and
// the pooled standard error of a size-weighted group mean.
double mean_stderr(const std::vector<double>& xs);
double pooled_stderr(const std::vector<double>& stderrs, const std::vector<int64_t>& sizes);

}  // namespace scalesweep::pipeline
