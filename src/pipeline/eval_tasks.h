// Internal to pipeline/eval: the task table and lm-eval's text helpers.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace scalesweep::pipeline::detail {

enum class TaskKind { kMultipleChoice, kLoglikelihood, kGenerateUntil };
// How a generate_until task's generations are scored: gsm8k_cot's filters and exact_match (in
// process), or ifeval's checkers (lm-eval's own, through scripts/ifeval_score.py: ifeval.h).
enum class GenScorer { kNone, kGsm8k, kIfeval };

// One document through lm-eval's doc_to_text / doc_to_choice / doc_to_target.
struct DocParts {
  std::string text;                  // doc_to_text (multiple input: unused)
  std::vector<std::string> choices;  // doc_to_choice (winogrande: the contexts)
  int gold = -1;                     // the right choice
  std::string target;                // loglikelihood / generation / multiple input: the target text
  nlohmann::json fields;             // what an external scorer reads (ifeval: key, prompt,
                                     // instruction_id_list, kwargs)
};

struct TaskDef {
  std::string name, file, fewshot_file;  // files relative to the data directory
  TaskKind kind = TaskKind::kMultipleChoice;
  DocParts (*doc)(const nlohmann::json&) = nullptr;  // throws std::runtime_error on bad docs
  std::vector<std::string> metrics;
  std::string headline;  // the metric of the task's column (experiment) and average
  int num_fewshot = 0;
  bool multiple_input = false;  // winogrande: one context per choice, one continuation
  std::string group_field;      // mmlu: "subject" (one subtask per value)
  std::string target_delimiter = " ", fewshot_delimiter = "\n\n";
  // Few-shot exemplars fixed in the task's YAML (question, target): gsm8k_cot.
  const std::vector<std::pair<std::string, std::string>>* fixed_shots = nullptr;
  std::vector<std::string> until;  // generate_until stop strings (the EOS token always stops)
  int max_gen_tokens = 256;        // generate_until: lm-eval's max_gen_toks (HFLM default 256)
  GenScorer scorer = GenScorer::kNone;
};

struct MmluSubject {
  std::string name, category;
};

const std::vector<TaskDef>& task_table();
const std::vector<MmluSubject>& mmlu_subjects();
// The task's description for one group (mmlu: "The following are ... about {subject}.\n\n").
std::string description_for(const TaskDef& t, const std::string& group);

// Python's str.strip() (ASCII whitespace and U+00A0), str.capitalize() (ASCII), len() of a str.
std::string py_strip(const std::string& s);
std::string py_capitalize(const std::string& s);
int64_t code_points(const std::string& s);

// gsm8k_cot's filters and exact_match.
std::map<std::string, std::string> gsm8k_filters(const std::string& generation);
bool gsm8k_exact_match(const std::string& pred, const std::string& ref);

}  // namespace scalesweep::pipeline::detail
