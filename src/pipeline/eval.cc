// Task evaluation as lm-eval 0.4.13 computes it (scalesweep/pipeline/eval.h).
#include "scalesweep/pipeline/eval.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>
#include <stdexcept>

#include "io/atomic_file.h"
#include "pipeline/eval_tasks.h"
#include "pipeline/ifeval.h"
#include "scalesweep/base/option_error.h"
#include "scalesweep/base/parallel.h"
#include "scalesweep/io/eval_data.h"
#include "scalesweep/model/weight.h"

namespace scalesweep::pipeline {

using detail::DocParts;
using detail::TaskDef;
using detail::TaskKind;
using nlohmann::json;

struct PreparedDoc {
  std::string group;   // mmlu: the subject; else ""
  int64_t doc_id = 0;  // within the group, as lm-eval numbers a subtask's documents
  DocParts parts;
  // (context, continuation); under the chat template the context is rendered from `chats`
  // (one message list per request) by evaluate().
  std::vector<std::pair<std::string, std::string>> requests;
  std::vector<std::vector<model::ChatMessage>> chats;
};

struct PreparedTask {
  const TaskDef* def = nullptr;
  std::string name;                 // as asked: the task, or mmlu_<subject> / mmlu_<category>
  std::vector<std::string> groups;  // in table order; {""} for ungrouped tasks
  std::vector<PreparedDoc> docs;    // grouped, in group order
  detail::IfevalScorer scorer;      // ifeval: found and checked by prepare_tasks
};

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

const char* const kMmluCategories[] = {"humanities", "other", "social_sciences", "stem"};

// A grouped task's part as lm-eval names it: "mmlu_<subject>" or "mmlu_<category>" -> the
// subjects it covers (empty: not such a name).
std::vector<std::string> subjects_of(const std::string& name) {
  std::vector<std::string> v;
  if (name.rfind("mmlu_", 0) != 0) return v;
  const std::string rest = name.substr(5);
  for (const detail::MmluSubject& s : detail::mmlu_subjects())
    if (s.name == rest || s.category == rest) v.push_back(s.name);
  return v;
}

const TaskDef* find_task(const std::string& name) {
  for (const TaskDef& t : detail::task_table())
    if (t.name == name) return &t;
  if (!subjects_of(name).empty()) return find_task("mmlu");
  return nullptr;
}

std::string known_tasks() {
  std::string s;
  for (const TaskDef& t : detail::task_table()) s += (s.empty() ? "" : ", ") + t.name;
  return s + ", mmlu_<subject>, mmlu_<category>";
}

// The task's file: the user's (EvalData::files) or the data directory's.
std::string task_path(const EvalData& data, const std::string& key, const std::string& rel) {
  const auto it = data.files.find(key);
  if (it != data.files.end()) return it->second;
  return (std::filesystem::path(data.dir) / rel).string();
}

std::vector<json> load_docs(const std::string& path, const std::string& task, bool own) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    throw std::runtime_error(
        path + ": no such file (task " + task + "; " +
        (own ? "given with " + option_ref("task_data") + ")"
             : "run scripts/get-eval-data.sh, or give the task's own file with " +
                   option_ref("task_data") + " " + task + "=FILE)"));
  std::vector<json> docs = io::read_documents(path);
  if (docs.empty()) throw std::runtime_error(path + ": no documents (task " + task + ")");
  return docs;
}

DocParts parse_doc(const TaskDef& t, const json& d, const std::string& path, size_t row) {
  try {
    return t.doc(d);
  } catch (const std::exception& e) {
    throw std::runtime_error(path + ": document " + std::to_string(row) + " (task " + t.name +
                             "): " + e.what());
  }
}

// Python's str.isspace() on the ASCII characters (lm-eval's maybe_delimit looks at one).
bool py_space(char c) {
  return c == ' ' || (c >= '\t' && c <= '\r') || (c >= '\x1c' && c <= '\x1f');
}

// lm-eval's maybe_delimit: prefix + delimiter + suffix, without the delimiter when either is
// empty or has whitespace at the join.
std::string maybe_delimit(const std::string& prefix, const std::string& suffix,
                          const std::string& delimiter) {
  if (prefix.empty()) return suffix;
  if (suffix.empty()) return prefix;
  return py_space(prefix.back()) || py_space(suffix.front()) ? prefix + suffix
                                                             : prefix + delimiter + suffix;
}

// What comes before a document's question in lm-eval's fewshot_context: the system prompt
// (--system_instruction and the task's description) and the few-shot examples, as plain text
// (build_qa_turn: text + target_delimiter + answer + fewshot_delimiter each) and as turns.
struct Preamble {
  std::string system;
  std::string shots;
  std::vector<model::ChatMessage> turns;  // user, assistant per example
};

Preamble make_preamble(const TaskDef& t, const EvalOptions& opt, const std::string& description,
                       const std::vector<DocParts>& shots) {
  Preamble pre;
  pre.system = maybe_delimit(opt.system_instruction, description, t.fewshot_delimiter);
  for (const DocParts& p : shots) {
    const std::string& answer =
        t.kind == TaskKind::kMultipleChoice && !t.multiple_input ? p.choices.at(p.gold) : p.target;
    const std::string& q = t.multiple_input ? p.choices.at(p.gold) : p.text;
    pre.shots += q + t.target_delimiter + answer + t.fewshot_delimiter;
    pre.turns.push_back({"user", q});
    pre.turns.push_back({"assistant", answer});
  }
  return pre;
}

bool multiturn(const EvalOptions& opt) {
  return opt.fewshot_as_multiturn.value_or(opt.apply_chat_template);
}

// lm-eval's fewshot_context + construct_requests for one document. Plain text: the system
// prompt, the examples and the question joined; chat template: the message list
// (multiturn_to_singleturn: the examples and the question in one user message; or turns), and
// no target delimiter in front of a multiple-choice continuation (construct_requests: a task
// without gen_prefix).
void build_requests(const TaskDef& t, const Preamble& pre, const EvalOptions& opt, PreparedDoc& d) {
  const DocParts& p = d.parts;
  const bool chat = opt.apply_chat_template;
  auto add = [&](const std::string& q, const std::string& cont) {
    if (!chat) {
      d.requests.emplace_back(pre.system + pre.shots + q, cont);
      return;
    }
    std::vector<model::ChatMessage> m;
    if (!pre.system.empty()) m.push_back({"system", pre.system});
    if (multiturn(opt)) {
      m.insert(m.end(), pre.turns.begin(), pre.turns.end());
      m.push_back({"user", q});
    } else {
      m.push_back({"user", pre.shots + q});
    }
    d.requests.emplace_back("", cont);  // the context: rendered by evaluate()
    d.chats.push_back(std::move(m));
  };
  const std::string delim = chat ? "" : t.target_delimiter;
  switch (t.kind) {
    case TaskKind::kMultipleChoice:
      if (t.multiple_input) {
        for (const std::string& c : p.choices) add(c, delim + p.target);
      } else {
        for (const std::string& c : p.choices) add(p.text, delim + c);
      }
      break;
    case TaskKind::kLoglikelihood:
      add(p.text, p.target);
      break;
    case TaskKind::kGenerateUntil:
      add(p.text, "");
      break;
  }
}

int fewshot_count(const TaskDef& t, const EvalOptions& opt) {
  return opt.num_fewshot >= 0 ? opt.num_fewshot : t.num_fewshot;
}

double mean(const std::vector<double>& xs) {
  return xs.empty() ? 0 : std::accumulate(xs.begin(), xs.end(), 0.0) / xs.size();
}

// Argmax with the first maximum on ties (numpy.argmax).
size_t first_max(const std::vector<double>& v) {
  size_t b = 0;
  for (size_t i = 1; i < v.size(); ++i)
    if (v[i] > v[b]) b = i;
  return b;
}

}  // namespace

std::vector<std::string> eval_task_names() {
  std::vector<std::string> v;
  for (const TaskDef& t : detail::task_table()) v.push_back(t.name);
  return v;
}

void check_eval_options(const EvalOptions& opt) {
  if (opt.tasks.empty())
    throw std::invalid_argument("no task given (known: " + known_tasks() + ")");
  std::set<std::string> seen;
  for (const std::string& name : opt.tasks) {
    const TaskDef* t = find_task(name);
    if (!t)
      throw std::invalid_argument("unknown task \"" + name + "\" (known: " + known_tasks() + ")");
    if (!seen.insert(name).second) throw std::invalid_argument("task \"" + name + "\" given twice");
    if (opt.num_fewshot > 0 && t->fewshot_file.empty() && !t->fixed_shots)
      throw std::invalid_argument("task " + name +
                                  " has no few-shot pool in the installed data (lm-eval draws its "
                                  "shots from a train split): use " +
                                  option_ref("num_fewshot") + " 0 or leave it out");
    if (t->fixed_shots && opt.num_fewshot > static_cast<int>(t->fixed_shots->size()))
      throw std::invalid_argument("task " + name + " has " +
                                  std::to_string(t->fixed_shots->size()) + " few-shot exemplars; " +
                                  option_ref("num_fewshot") + " " +
                                  std::to_string(opt.num_fewshot) + " asks for more");
  }
  if (opt.limit < 0) throw std::invalid_argument("limit must be >= 0");
  check_threads(opt.threads);
  if (opt.max_length < 0) throw std::invalid_argument("max length must be >= 0");
  if (opt.max_gen_tokens < 0)
    throw std::invalid_argument("max generated tokens must be >= 0 (0: the task's own)");
  if (opt.fewshot_as_multiturn.value_or(false) && !opt.apply_chat_template)
    throw std::invalid_argument("few-shot examples as multi-turn need the chat template (" +
                                option_ref("apply_chat_template") + "), as in lm-eval");
}

PreparedTasks prepare_tasks(const EvalOptions& opt, const EvalData& data) {
  check_eval_options(opt);
  PreparedTasks out;
  for (const std::string& name : opt.tasks) {
    const TaskDef& t = *find_task(name);
    auto pt = std::make_shared<PreparedTask>();
    pt->def = &t;
    pt->name = name;
    const std::vector<std::string> only = subjects_of(name);  // empty: every subject
    const std::string path = task_path(data, t.name, t.file);
    const std::vector<json> raw = load_docs(path, t.name, data.files.count(t.name) > 0);
    const int k = fewshot_count(t, opt);
    if (t.group_field.empty()) {
      pt->groups = {""};
      std::vector<DocParts> shots;
      if (t.fixed_shots && k > 0) {
        for (int i = 0; i < k; ++i) {
          const auto& [q, a] = (*t.fixed_shots)[i];
          DocParts p = t.doc(json{{"question", q}, {"answer", "#### " + a}});
          p.target = a;
          shots.push_back(std::move(p));
        }
      }
      const Preamble preamble = make_preamble(t, opt, "", shots);
      const size_t n = opt.limit > 0 ? std::min<size_t>(raw.size(), opt.limit) : raw.size();
      for (size_t i = 0; i < n; ++i) {
        PreparedDoc d;
        d.doc_id = static_cast<int64_t>(i);
        d.parts = parse_doc(t, raw[i], path, i);
        build_requests(t, preamble, opt, d);
        pt->docs.push_back(std::move(d));
      }
    } else {
      // Grouped (mmlu): documents by subject, subjects in table order; the few-shot pool's
      // first k documents of the same subject (lm-eval's first_n sampler on dev).
      std::map<std::string, std::vector<size_t>> by_group;
      for (size_t i = 0; i < raw.size(); ++i) {
        const auto f = raw[i].find(t.group_field);
        if (f == raw[i].end() || !f->is_string())
          throw std::runtime_error(path + ": document " + std::to_string(i) + " (task " + t.name +
                                   "): field \"" + t.group_field + "\" missing or not a string");
        by_group[f->get<std::string>()].push_back(i);
      }
      std::map<std::string, std::vector<DocParts>> pool;
      std::string pool_path;
      if (k > 0) {
        pool_path = task_path(data, t.name + ":fewshot", t.fewshot_file);
        const std::vector<json> dev =
            load_docs(pool_path, t.name + ":fewshot", data.files.count(t.name + ":fewshot") > 0);
        for (size_t i = 0; i < dev.size(); ++i) {
          const auto f = dev[i].find(t.group_field);
          if (f == dev[i].end() || !f->is_string())
            throw std::runtime_error(pool_path + ": document " + std::to_string(i) + ": field \"" +
                                     t.group_field + "\" missing or not a string");
          pool[f->get<std::string>()].push_back(parse_doc(t, dev[i], pool_path, i));
        }
      }
      for (const detail::MmluSubject& s : detail::mmlu_subjects()) {
        const auto g = by_group.find(s.name);
        if (g == by_group.end()) continue;
        if (!only.empty() && std::find(only.begin(), only.end(), s.name) == only.end()) {
          by_group.erase(g);
          continue;
        }
        std::vector<DocParts> shots;
        if (k > 0) {
          const auto& all = pool[s.name];
          if (static_cast<int>(all.size()) < k)
            throw std::runtime_error(pool_path + ": subject " + s.name + " has " +
                                     std::to_string(all.size()) + " few-shot documents, " +
                                     std::to_string(k) + " needed");
          shots.assign(all.begin(), all.begin() + k);
        }
        const Preamble preamble = make_preamble(t, opt, detail::description_for(t, s.name), shots);
        pt->groups.push_back(s.name);
        const size_t n =
            opt.limit > 0 ? std::min<size_t>(g->second.size(), opt.limit) : g->second.size();
        for (size_t j = 0; j < n; ++j) {
          PreparedDoc d;
          d.group = s.name;
          d.doc_id = static_cast<int64_t>(j);
          d.parts = parse_doc(t, raw[g->second[j]], path, g->second[j]);
          build_requests(t, preamble, opt, d);
          pt->docs.push_back(std::move(d));
        }
        by_group.erase(g);
      }
      if (!by_group.empty())
        throw std::runtime_error(path + ": unknown " + t.group_field + " \"" +
                                 by_group.begin()->first + "\" (task " + t.name + ")");
      if (pt->groups.empty())
        throw std::runtime_error(path + ": no document of " + name + " (task " + t.name + ")");
    }
    if (t.scorer == detail::GenScorer::kIfeval) {
      // Refused now rather than after hours of generation.
      pt->scorer = detail::find_ifeval_scorer(data);
      detail::check_ifeval_scorer(pt->scorer);
    }
    out.tasks.push_back(std::move(pt));
  }
  return out;
}

std::string task_headline_metric(const std::string& task) {
  const TaskDef* t = find_task(task);
  if (!t) throw std::invalid_argument("unknown task \"" + task + "\"");
  return t->headline;
}

double task_average(const std::vector<TaskResult>& results) {
  if (results.empty()) return 0;
  double s = 0;
  for (const TaskResult& r : results) s += r.metrics.at(task_headline_metric(r.task)).value;
  return s / static_cast<double>(results.size());
}

std::vector<std::string> prepared_task_names(const PreparedTasks& tasks) {
  std::vector<std::string> v;
  for (const auto& t : tasks.tasks) v.push_back(t->name);
  return v;
}

double mean_stderr(const std::vector<double>& xs) {
  const size_t n = xs.size();
  if (n < 2) return std::nan("");
  const double mu = mean(xs);
  double ss = 0;
  for (double x : xs) ss += (x - mu) * (x - mu);
  return std::sqrt(ss / static_cast<double>(n - 1)) / std::sqrt(static_cast<double>(n));
}

double pooled_stderr(const std::vector<double>& stderrs, const std::vector<int64_t>& sizes) {
  // lm_eval.api.metrics.pooled_sample_stderr.
  double num = 0;
  int64_t N = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    num += static_cast<double>(sizes[i] - 1) * stderrs[i] * stderrs[i] * sizes[i];
    N += sizes[i];
  }
  const int64_t dof = N - static_cast<int64_t>(sizes.size());
  if (dof <= 0) return std::nan("");
  return std::sqrt(num / static_cast<double>(dof) / static_cast<double>(N));
}

namespace {

// lm-eval's _encode_pair: trailing whitespace of the context moves to the continuation; the
// continuation's tokens are those of encode(context + continuation) after encode(context).
// tok_encode: no BOS in front of a text that already starts with the prefix token's text (BOS,
// else EOS), as a chat template's rendering does (has_bos_prefix).
struct Encoder {
  const model::Tokenizer& tok;
  bool bos;
  std::string prefix_text;  // tok.token_text(BOS, else EOS)
  std::vector<int> enc(const std::string& s) const {
    const bool has_prefix = !prefix_text.empty() && s.starts_with(prefix_text);
    return tok.encode(s, bos && !has_prefix, false);
  }
  model::LoglikelihoodRequest pair(std::string ctx, std::string cont) const {
    size_t keep = ctx.size();
    while (keep > 0 && (ctx[keep - 1] == ' ' || (ctx[keep - 1] >= '\t' && ctx[keep - 1] <= '\r')))
      --keep;
    cont = ctx.substr(keep) + cont;
    ctx.resize(keep);
    model::LoglikelihoodRequest r;
    if (ctx.empty()) {
      // lm-eval: an empty context is the prefix token (BOS, else EOS) alone.
      const int p = tok.bos() >= 0 ? tok.bos() : tok.eos();
      r.context = {p};
      r.continuation = tok.encode(cont, false, false);
      return r;
    }
    std::vector<int> whole = enc(ctx + cont);
    r.context = enc(ctx);
    const size_t n = std::min(r.context.size(), whole.size());
    r.continuation.assign(whole.begin() + n, whole.end());
    return r;
  }
};

// Tokenizer errors (a prompt the vocabulary cannot encode) named by task and document.
template <class F>
auto encode_doc(const TaskDef& t, const PreparedDoc& d, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::exception& e) {
    throw std::invalid_argument("task " + (d.group.empty() ? t.name : t.name + "_" + d.group) +
                                ", document " + std::to_string(d.doc_id) + ": " + e.what());
  }
}

// Multiple-choice metrics of one document from its choices' loglikelihoods.
void mc_metrics(const TaskDef& t, const DocParts& p, const std::vector<double>& lls,
                std::map<std::string, double>& m) {
  const size_t pred = first_max(lls);
  m["acc"] = pred == static_cast<size_t>(p.gold) ? 1.0 : 0.0;
  if (std::find(t.metrics.begin(), t.metrics.end(), "acc_norm") != t.metrics.end()) {
    std::vector<double> norm(lls.size());
    for (size_t i = 0; i < lls.size(); ++i)
      norm[i] = lls[i] / static_cast<double>(detail::code_points(p.choices[i]));
    m["acc_norm"] = first_max(norm) == static_cast<size_t>(p.gold) ? 1.0 : 0.0;
  }
}

// Aggregates per-document metric values into a TaskResult (means with lm-eval's stderr;
// perplexity = exp(-mean ll) with a delta-method stderr).
TaskResult aggregate(const std::string& name, const std::vector<const EvalSample*>& samples,
                     const std::vector<std::string>& metrics) {
  TaskResult r;
  r.task = name;
  r.n = static_cast<int64_t>(samples.size());
  for (const std::string& m : metrics) {
    if (m == "perplexity") {
      std::vector<double> ll;
      for (const EvalSample* s : samples) ll.push_back(s->requests.at(0).loglikelihood);
      const double ppl = std::exp(-mean(ll));
      // lm-eval bootstraps this stderr (100 resamples); the delta method estimates the same.
      r.metrics[m] = {ppl, ppl * mean_stderr(ll)};
      continue;
    }
    std::vector<double> xs;
    if (!samples.empty() && samples[0]->metric_lists.count(m)) {
      // lm-eval's agg_inst_level_acc: the mean over every item of every document; no stderr
      // (lm-eval has none for a task's own aggregation function: "N/A").
      for (const EvalSample* s : samples) {
        const std::vector<double>& l = s->metric_lists.at(m);
        xs.insert(xs.end(), l.begin(), l.end());
      }
      r.metrics[m] = {mean(xs), std::nan("")};
      continue;
    }
    for (const EvalSample* s : samples) xs.push_back(s->metrics.at(m));
    r.metrics[m] = {mean(xs), mean_stderr(xs)};
  }
  return r;
}

// A size-weighted group of subtask results (lm-eval's weight_by_size with pooled stderr).
TaskResult group_result(const std::string& name, const std::vector<const TaskResult*>& parts,
                        const std::string& metric) {
  TaskResult r;
  r.task = name;
  double sum = 0;
  std::vector<double> se;
  std::vector<int64_t> sizes;
  for (const TaskResult* p : parts) {
    r.n += p->n;
    sum += p->metrics.at(metric).value * static_cast<double>(p->n);
    se.push_back(p->metrics.at(metric).stderr_);
    sizes.push_back(p->n);
  }
  r.metrics[metric] = {r.n > 0 ? sum / static_cast<double>(r.n) : 0, pooled_stderr(se, sizes)};
  return r;
}

}  // namespace

model::ChatTemplate eval_chat_template(const model::Tokenizer& tok, const std::string& model) {
  const std::string text = tok.chat_template();
  if (text.empty())
    throw std::invalid_argument(model + ": " + option_ref("apply_chat_template") +
                                ": the model's tokenizer has no chat "
                                "template (GGUF tokenizer.chat_template, HF chat_template.jinja or "
                                "tokenizer_config.json chat_template)");
  const std::string bos = tok.bos() >= 0 ? tok.token_text(tok.bos()) : "";
  std::optional<model::ChatTemplate> t = model::recognize_chat_template(text, bos);
  if (!t) {
    const std::string head = text.substr(0, 80);
    throw std::invalid_argument(model + ": " + option_ref("apply_chat_template") +
                                ": the model's chat template is not one this build "
                                "renders (it starts \"" +
                                head + (text.size() > head.size() ? "..." : "") +
                                "\"); supported: " + model::supported_chat_templates());
  }
  return *t;
}

namespace {

// Each document's (context, continuation) requests of one task.
using RequestTexts = std::vector<std::vector<std::pair<std::string, std::string>>>;

// The requests' texts, contexts rendered under the chat template with its generation prompt
// (lm-eval: add_generation_prompt = no gen_prefix).
RequestTexts request_texts(const PreparedTask& pt, const EvalOptions& opt,
                           const model::ChatTemplate* chat) {
  RequestTexts text(pt.docs.size());
  for (size_t i = 0; i < pt.docs.size(); ++i) {
    text[i] = pt.docs[i].requests;
    if (!opt.apply_chat_template) continue;
    for (size_t r = 0; r < text[i].size(); ++r)
      text[i][r].first = chat->render(pt.docs[i].chats.at(r), true);
  }
  return text;
}

// What running one prepared task reads: the task, its requests' texts, the encoder, the
// model and the scoring options; `progress` counts its documents.
struct TaskRun {
  const PreparedTask& pt;
  const RequestTexts& text;
  const Encoder& encoder;
  const model::TransformerFactory& make;
  const model::Config& cfg;
  const model::Tokenizer& tok;
  const model::ScoringOptions& so;
  const EvalOptions& opt;
  const std::function<void(int64_t, int64_t)>& progress;
};

// ifeval: the scorer's instruction-following verdicts of every document's generation.
void ifeval_metrics(const PreparedTask& pt, const std::vector<model::GenerationResult>& gens,
                    std::vector<EvalSample>& samples) {
  std::vector<json> docs;
  std::vector<std::string> texts;
  for (size_t i = 0; i < pt.docs.size(); ++i) {
    docs.push_back(pt.docs[i].parts.fields);
    texts.push_back(gens[i].text);
  }
  const std::vector<detail::IfevalFollow> f = detail::ifeval_score(pt.scorer, docs, texts);
  for (size_t i = 0; i < pt.docs.size(); ++i) {
    EvalSample& s = samples[i];
    const auto both = {std::pair{"strict", &f[i].strict}, std::pair{"loose", &f[i].loose}};
    for (const auto& [kind, follow] : both) {
      std::vector<double> v(follow->begin(), follow->end());
      s.metrics[std::string("prompt_level_") + kind + "_acc"] =
          std::all_of(follow->begin(), follow->end(), [](bool b) { return b; }) ? 1 : 0;
      s.metric_lists[std::string("inst_level_") + kind + "_acc"] = std::move(v);
    }
  }
}

// A generate_until task: greedy generations until the stop strings, scored (gsm8k's filters,
// ifeval's checkers). Returns the number of requests.
int64_t run_generation(const TaskRun& run, std::vector<EvalSample>& samples) {
  const PreparedTask& pt = run.pt;
  const TaskDef& t = *pt.def;
  const size_t n_docs = pt.docs.size();
  std::vector<model::GenerationRequest> reqs(n_docs);
  parallel_for(static_cast<int64_t>(n_docs), run.opt.threads, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) {
      reqs[i].context =
          encode_doc(t, pt.docs[i], [&] { return run.encoder.enc(run.text[i].at(0).first); });
      reqs[i].until = t.until;  // and the EOS token, which ends generation itself
      reqs[i].max_tokens = run.opt.max_gen_tokens > 0 ? run.opt.max_gen_tokens : t.max_gen_tokens;
    }
  });
  std::vector<model::GenerationResult> gens;
  try {
    gens = model::generate_until(run.make, run.cfg, run.tok, reqs, run.so, run.progress);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument("task " + t.name + ": " + e.what());
  }
  for (size_t i = 0; i < n_docs; ++i) {
    EvalSample& s = samples[i];
    const PreparedDoc& d = pt.docs[i];
    s.task = t.name;
    s.doc_id = d.doc_id;
    s.target = d.parts.target;
    s.requests.push_back(
        {run.text[i][0].first, "", 0, false, static_cast<int>(reqs[i].context.size())});
    s.generation = gens[i].text;
    s.generated = true;
    s.generated_tokens = gens[i].tokens;
    if (t.scorer == detail::GenScorer::kGsm8k) {
      s.filtered = detail::gsm8k_filters(gens[i].text);
      for (const auto& [name, ans] : s.filtered)
        s.metrics["exact_match," + name] = detail::gsm8k_exact_match(ans, d.parts.target) ? 1 : 0;
    }
  }
  if (t.scorer == detail::GenScorer::kIfeval) ifeval_metrics(pt, gens, samples);
  return static_cast<int64_t>(n_docs);
}

// One scoring call per group (mmlu: per subject), so that the group's few-shot preamble is
// the shared prefix each worker keeps in its KV cache. `reqs` are moved out and back.
std::vector<std::vector<model::LoglikelihoodResult>> score_groups(
    const TaskRun& run, std::vector<std::vector<model::LoglikelihoodRequest>>& reqs) {
  const PreparedTask& pt = run.pt;
  const size_t n_docs = pt.docs.size();
  std::vector<std::vector<model::LoglikelihoodResult>> lls(n_docs);
  int64_t done_before = 0;
  for (size_t b = 0; b < n_docs;) {
    size_t e = b + 1;
    while (e < n_docs && pt.docs[e].group == pt.docs[b].group) ++e;
    std::vector<std::vector<model::LoglikelihoodRequest>> part(
        std::make_move_iterator(reqs.begin() + b), std::make_move_iterator(reqs.begin() + e));
    std::vector<std::vector<model::LoglikelihoodResult>> got;
    try {
      got = model::score_loglikelihood(run.make, run.cfg, part, run.so, [&](int64_t d, int64_t) {
        run.progress(done_before + d, static_cast<int64_t>(n_docs));
      });
    } catch (const std::invalid_argument& x) {
      const std::string& g = pt.docs[b].group;
      const std::string& name = pt.def->name;
      throw std::invalid_argument("task " + (g.empty() ? name : name + "_" + g) + ": " + x.what());
    }
    for (size_t i = b; i < e; ++i) {
      lls[i] = std::move(got[i - b]);
      reqs[i] = std::move(part[i - b]);
    }
    done_before += static_cast<int64_t>(e - b);
    b = e;
  }
  return lls;
}

// A loglikelihood or multiple-choice task: every request scored, the documents' metrics.
// Returns the number of requests.
int64_t run_loglikelihood(const TaskRun& run, std::vector<EvalSample>& samples) {
  const PreparedTask& pt = run.pt;
  const TaskDef& t = *pt.def;
  const size_t n_docs = pt.docs.size();
  std::vector<std::vector<model::LoglikelihoodRequest>> reqs(n_docs);
  parallel_for(static_cast<int64_t>(n_docs), run.opt.threads, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i)
      for (const auto& cx : run.text[i])
        reqs[i].push_back(
            encode_doc(t, pt.docs[i], [&] { return run.encoder.pair(cx.first, cx.second); }));
  });
  for (size_t i = 0; i < n_docs; ++i)
    for (size_t r = 0; r < reqs[i].size(); ++r)
      if (reqs[i][r].continuation.empty())
        throw std::invalid_argument("task " + t.name + ", document " +
                                    std::to_string(pt.docs[i].doc_id) + ": continuation \"" +
                                    pt.docs[i].requests[r].second + "\" encodes to no token");
  const std::vector<std::vector<model::LoglikelihoodResult>> lls = score_groups(run, reqs);
  for (size_t i = 0; i < n_docs; ++i) {
    EvalSample& s = samples[i];
    const PreparedDoc& d = pt.docs[i];
    s.task = d.group.empty() ? t.name : t.name + "_" + d.group;
    s.doc_id = d.doc_id;
    s.target = t.kind == TaskKind::kMultipleChoice ? std::to_string(d.parts.gold) : d.parts.target;
    std::vector<double> v;
    for (size_t r = 0; r < lls[i].size(); ++r) {
      s.requests.push_back({run.text[i][r].first, run.text[i][r].second, lls[i][r].logprob,
                            lls[i][r].greedy, lls[i][r].tokens});
      v.push_back(lls[i][r].logprob);
    }
    if (t.kind == TaskKind::kMultipleChoice) {
      mc_metrics(t, d.parts, v, s.metrics);
    } else {
      s.metrics["acc"] = lls[i][0].greedy ? 1 : 0;
      s.metrics["loglikelihood"] = lls[i][0].logprob;
    }
  }
  int64_t n = 0;
  for (const auto& r : reqs) n += static_cast<int64_t>(r.size());
  return n;
}

// Results: the task, and for grouped tasks its categories and subjects.
TaskResult task_result(const PreparedTask& pt, const std::vector<EvalSample>& samples) {
  const TaskDef& t = *pt.def;
  if (t.group_field.empty()) {
    std::vector<const EvalSample*> all;
    for (const EvalSample& s : samples) all.push_back(&s);
    return aggregate(pt.name, all, t.metrics);
  }
  std::vector<TaskResult> subjects;
  for (const std::string& g : pt.groups) {
    std::vector<const EvalSample*> part;
    for (size_t i = 0; i < pt.docs.size(); ++i)
      if (pt.docs[i].group == g) part.push_back(&samples[i]);
    subjects.push_back(aggregate(t.name + "_" + g, part, t.metrics));
  }
  if (pt.groups.size() == 1 && pt.name == t.name + "_" + pt.groups[0])
    return std::move(subjects[0]);  // one subject asked for: its own result
  std::vector<const TaskResult*> ptrs;
  for (const TaskResult& s : subjects) ptrs.push_back(&s);
  TaskResult tr = group_result(pt.name, ptrs, "acc");
  // The categories of the whole task (a category asked for is the result itself).
  for (const char* cat : kMmluCategories) {
    std::vector<const TaskResult*> in;
    for (size_t k = 0; k < pt.groups.size(); ++k)
      for (const detail::MmluSubject& s : detail::mmlu_subjects())
        if (s.name == pt.groups[k] && s.category == cat) in.push_back(&subjects[k]);
    if (!in.empty() && pt.name == t.name)
      tr.subtasks.push_back(group_result(t.name + "_" + cat, in, "acc"));
  }
  for (TaskResult& s : subjects) tr.subtasks.push_back(std::move(s));
  return tr;
}

}  // namespace

EvalResult evaluate(const PreparedTasks& tasks, const model::Tokenizer& tok,
                    const model::Config& cfg, const model::TransformerFactory& make,
                    const EvalOptions& opt, const EvalEvents& events,
                    const model::ChatTemplate* chat) {
  const auto t0 = Clock::now();
  if (opt.bos.value_or(false) && tok.bos() < 0)
    throw OptionError("bos", "the tokenizer has no BOS token");
  const Encoder encoder{tok, opt.bos.value_or(tok.add_bos()) && tok.bos() >= 0,
                        tok.token_text(tok.bos() >= 0 ? tok.bos() : tok.eos())};
  std::optional<model::ChatTemplate> own_chat;
  if (opt.apply_chat_template && !chat) chat = &own_chat.emplace(eval_chat_template(tok, "model"));
  model::ScoringOptions so;
  so.threads = opt.threads;
  so.max_length = opt.max_length;
  EvalResult res;
  for (const auto& ptp : tasks.tasks) {
    const PreparedTask& pt = *ptp;
    const auto tt = Clock::now();
    const RequestTexts text = request_texts(pt, opt, chat);
    std::vector<EvalSample> samples(pt.docs.size());
    const std::function<void(int64_t, int64_t)> progress = [&](int64_t done, int64_t total) {
      if (events.progress) events.progress(pt.name, "doc", done, total);
    };
    progress(0, static_cast<int64_t>(pt.docs.size()));  // the task starts: its clock too
    const TaskRun run{pt, text, encoder, make, cfg, tok, so, opt, progress};
    res.requests += pt.def->kind == TaskKind::kGenerateUntil ? run_generation(run, samples)
                                                             : run_loglikelihood(run, samples);
    TaskResult tr = task_result(pt, samples);
    tr.seconds = since(tt);
    res.documents += static_cast<int64_t>(pt.docs.size());
    res.tasks.push_back(std::move(tr));
    for (EvalSample& s : samples) res.samples.push_back(std::move(s));
  }
  res.seconds = since(t0);
  return res;
}

std::string eval_sample_json(const EvalSample& s) {
  json j = {{"task", s.task}, {"doc_id", s.doc_id}, {"target", s.target}};
  json reqs = json::array();
  for (const EvalRequestLog& r : s.requests) {
    json x = {{"context", r.context}};
    if (!s.generated) {
      x["continuation"] = r.continuation;
      x["loglikelihood"] = r.loglikelihood;
      x["is_greedy"] = r.is_greedy;
      x["tokens"] = r.tokens;
    } else {
      x["context_tokens"] = r.tokens;
    }
    reqs.push_back(x);
  }
  j["requests"] = reqs;
  if (s.generated) {
    j["generation"] = s.generation;
    j["generated_tokens"] = s.generated_tokens;
  }
  if (!s.filtered.empty()) j["filtered"] = s.filtered;
  json m = s.metrics;
  for (const auto& [k, v] : s.metric_lists) m[k] = v;  // ifeval: one 0/1 per instruction
  j["metrics"] = m;
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

namespace {
void add_result(json& out, const TaskResult& t) {
  json r = {{"n", t.n}};
  for (const auto& [m, v] : t.metrics) {
    // lm-eval's key for a filtered metric is "exact_match,strict-match"; its stderr
    // "exact_match_stderr,strict-match".
    const size_t comma = m.find(',');
    const std::string se = comma == std::string::npos
                               ? m + "_stderr"
                               : m.substr(0, comma) + "_stderr" + m.substr(comma);
    r[m] = v.value;
    r[se] = std::isfinite(v.stderr_) ? json(v.stderr_) : json("N/A");
  }
  out[t.task] = r;
  for (const TaskResult& s : t.subtasks) add_result(out, s);
}
}  // namespace

std::string eval_results_json(const EvalResult& r) {
  json out = json::object();
  for (const TaskResult& t : r.tasks) add_result(out, t);
  return out.dump();
}

std::string eval_markdown(const EvalResult& r) {
  std::string s = "| task | n | metric | value | stderr |\n|---|---:|---|---:|---:|\n";
  auto row = [&](const TaskResult& t, const std::string& indent) {
    for (const auto& [m, v] : t.metrics) {
      char buf[64], se[64];
      std::snprintf(buf, sizeof buf, "%.4f", v.value);
      std::snprintf(se, sizeof se, std::isfinite(v.stderr_) ? "%.4f" : "N/A", v.stderr_);
      s += "| " + indent + t.task + " | " + std::to_string(t.n) + " | " + m + " | " + buf + " | " +
           se + " |\n";
    }
  };
  for (const TaskResult& t : r.tasks) {
    row(t, "");
    // Grouped tasks: the categories (the subjects are in --json and the log).
    for (const TaskResult& sub : t.subtasks)
      for (const char* cat : kMmluCategories)
        if (sub.task == t.task + "_" + cat) row(sub, "- ");
  }
  return s;
}

model::TransformerFactory eval_transformer_factory(
    const model::Transformer& proto, const std::function<void(const std::string&)>& note) {
  const model::Weights& w = proto.weights();
  int64_t narrow = 0, f32_bytes = 0;
  auto count = [&](const model::Tensor& t) {
    if (!t.present()) return;
    f32_bytes += t.numel() * 4;
    narrow += t.dtype != model::WeightDType::kF32;
  };
  count(w.tok_embeddings);
  count(w.lm_head);
  for (const auto& l : w.layers)
    for (const model::Tensor* t : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w1, &l.w2, &l.w3}) count(*t);
  const int64_t pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  const int64_t budget = pages > 0 && page > 0 ? pages / 4 * page : 0;
  if (narrow == 0 || proto.compute() != model::Compute::kF32)
    return [&proto] { return proto.fresh(); };
  if (f32_bytes > budget) {
    if (note)
      note("weights kept in their stored precision (an fp32 copy would take " +
           std::to_string(f32_bytes >> 20) + " MiB, over a quarter of memory): slower");
    return [&proto] { return proto.fresh(); };
  }
  auto w32 = std::make_shared<model::Weights>(w);
  model::materialize_f32(*w32);
  std::shared_ptr<const model::Weights> cw = std::move(w32);
  return [&proto, cw] { return proto.with_weights(cw); };
}

EvalRun run_eval(const EvalRequest& request, const EvalEvents& events) {
  // Everything that can be refused without reading the model first.
  PreparedTasks tasks = prepare_tasks(request.options, request.data);
  RuntimeModel rm = load_runtime(request.runtime, events);
  std::optional<model::ChatTemplate> chat;
  if (request.options.apply_chat_template) {
    chat = eval_chat_template(*rm.model.tokenizer, request.runtime.tokenizer.empty()
                                                       ? request.runtime.model
                                                       : request.runtime.tokenizer);
    if (events.note) events.note("chat template: " + chat->name);
  }
  EvalRun run;
  run.runtime = describe_runtime(rm);
  const model::Config cfg = rm.model.weights.config;
  auto fp = std::make_shared<const model::Weights>(std::move(rm.model.weights));
  const std::unique_ptr<model::Transformer> proto = make_runtime_transformer(rm, fp, 0);
  const model::TransformerFactory make = eval_transformer_factory(*proto, events.note);
  run.result = evaluate(tasks, *rm.model.tokenizer, cfg, make, request.options, events,
                        chat ? &*chat : nullptr);
  if (!request.log_samples.empty()) {
    std::string text;
    for (const EvalSample& s : run.result.samples) text += eval_sample_json(s) + "\n";
    io::write_file_atomic(request.log_samples, std::string_view(text));
  }
  return run;
}

}  // namespace scalesweep::pipeline
