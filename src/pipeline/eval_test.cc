// Task definitions (prompts as lm-eval 0.4.13 renders them), metrics, statistics and the
// refusals of pipeline/eval. Agreement with lm-eval itself on a real model:
// python/tests/test_eval_lmeval.py.
#include "scalesweep/pipeline/eval.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "model/test_util.h"
#include "pipeline/eval_tasks.h"
#include "pipeline/eval_test_util.h"
#include "scalesweep/base/option_error.h"

namespace scalesweep::pipeline {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct TempData {
  fs::path dir;
  TempData() {
    dir = fs::temp_directory_path() /
          ("ss_eval_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter()++));
    fs::create_directories(dir);
  }
  ~TempData() { fs::remove_all(dir); }
  static int& counter() {
    static int c = 0;
    return c;
  }
  void write(const std::string& rel, const std::vector<json>& docs) const {
    fs::create_directories((dir / rel).parent_path());
    std::ofstream f(dir / rel);
    for (const json& d : docs) f << d.dump() << "\n";
  }
  EvalData data() const {
    EvalData d;
    d.dir = dir.string();
    return d;
  }
};

// f() throws E with `part` in its message.
template <class E, class F>
void expect_error(F&& f, const std::string& part) {
  try {
    f();
    ADD_FAILURE() << "no exception; expected one saying: " << part;
  } catch (const E& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

const detail::TaskDef& task(const std::string& name) {
  for (const auto& t : detail::task_table())
    if (t.name == name) return t;
  throw std::runtime_error("no task " + name);
}

TEST(EvalTasks, HellaswagPreprocessingAsLmEval) {
  const json d = {{"activity_label", "Removing ice from car"},
                  {"ctx_a", "Then, the man writes over the snow covering the window of a car."},
                  {"ctx_b", "a woman wearing winter clothes"},
                  {"endings", {" [header] Step one.  done", "b", "c", "d"}},
                  {"label", "3"}};
  const auto p = task("hellaswag").doc(d);
  EXPECT_EQ(p.text,
            "Removing ice from car: Then, the man writes over the snow covering the window of a "
            "car. A woman wearing winter clothes");
  EXPECT_EQ(p.choices[0], " Step one. done");
  EXPECT_EQ(p.gold, 3);
  EXPECT_EQ(detail::py_capitalize("hELLO World"), "Hello world");
  EXPECT_EQ(detail::py_strip(" \t x y \n"), "x y");
}

TEST(EvalTasks, PromptsOfEachTask) {
  const auto arc = task("arc_easy")
                       .doc({{"question", "Q?"},
                             {"choices", {{"text", {"a", "b"}}, {"label", {"1", "2"}}}},
                             {"answerKey", "2"}});
  EXPECT_EQ(arc.text, "Question: Q?\nAnswer:");
  EXPECT_EQ(arc.gold, 1);
  const auto wg =
      task("winogrande")
          .doc({{"sentence",
                 "Sarah was a much better surgeon than Maria so _ always got the harder cases."},
                {"option1", "Sarah"},
                {"option2", "Maria"},
                {"answer", "1"}});
  EXPECT_EQ(wg.choices[1], "Sarah was a much better surgeon than Maria so Maria");
  EXPECT_EQ(wg.target, "always got the harder cases.");
  EXPECT_EQ(wg.gold, 0);
  const auto bq = task("boolq").doc({{"passage", "P"}, {"question", "is it"}, {"label", 1}});
  EXPECT_EQ(bq.text, "P\nQuestion: is it?\nAnswer:");
  EXPECT_EQ(bq.choices[bq.gold], "yes");
  const auto lb = task("lambada_openai").doc({{"text", "the cat sat on the mat"}});
  EXPECT_EQ(lb.text, "the cat sat on the");
  EXPECT_EQ(lb.target, " mat");
  const auto pq = task("piqa").doc({{"goal", "g"}, {"sol1", "x"}, {"sol2", "y"}, {"label", 0}});
  EXPECT_EQ(pq.text, "Question: g\nAnswer:");
  const auto mm = task("mmlu").doc({{"question", " What? "},
                                    {"choices", {"1", "2", "3", "4"}},
                                    {"answer", 2},
                                    {"subject", "anatomy"}});
  EXPECT_EQ(mm.text, "What?\nA. 1\nB. 2\nC. 3\nD. 4\nAnswer:");
  const auto gs = task("gsm8k_cot").doc({{"question", "How many?"}, {"answer", "x\n#### 1,234"}});
  EXPECT_EQ(gs.text, "Q: How many?\nA:");
  EXPECT_EQ(gs.target, "1,234");
  // Bad documents name the field.
  EXPECT_THROW(task("piqa").doc({{"goal", "g"}, {"sol1", "x"}, {"label", 0}}), std::runtime_error);
  EXPECT_THROW(task("piqa").doc({{"goal", "g"}, {"sol1", "x"}, {"sol2", "y"}, {"label", 5}}),
               std::runtime_error);
}

TEST(EvalTasks, Gsm8kFiltersAndExactMatch) {
  auto f = detail::gsm8k_filters("He has 3 + 4 = 7 apples. The answer is 1,234.\n\n");
  EXPECT_EQ(f["strict-match"], "1,234");
  EXPECT_EQ(f["flexible-extract"], "1,234.");
  EXPECT_TRUE(detail::gsm8k_exact_match(f["strict-match"], "1,234"));
  EXPECT_TRUE(detail::gsm8k_exact_match(f["flexible-extract"], "1234"));
  f = detail::gsm8k_filters("no number here");
  EXPECT_EQ(f["strict-match"], "[invalid]");
  EXPECT_EQ(f["flexible-extract"], "[invalid]");
  f = detail::gsm8k_filters("costs $5 and then 9");
  EXPECT_EQ(f["flexible-extract"], "9");
  EXPECT_TRUE(detail::gsm8k_exact_match("$18", "18"));
  EXPECT_FALSE(detail::gsm8k_exact_match("17", "18"));
}

TEST(EvalStats, AsLmEval) {
  // mean_stderr: sample std / sqrt(n).
  EXPECT_NEAR(mean_stderr({1, 0, 1, 1}), std::sqrt(0.25 / 4.0), 1e-12);
  EXPECT_TRUE(std::isnan(mean_stderr({1})));
  // Pooled stderr of two equal groups equals the stderr over all items (lm-eval's claim).
  const std::vector<double> a = {1, 0, 1, 1, 0}, b = {0, 0, 1, 0, 1};
  std::vector<double> all = a;
  all.insert(all.end(), b.begin(), b.end());
  EXPECT_NEAR(pooled_stderr({mean_stderr(a), mean_stderr(b)}, {5, 5}), mean_stderr(all), 0.01);
}

TEST(EvalOptions, Refusals) {
  EvalOptions o;
  EXPECT_THROW(check_eval_options(o), std::invalid_argument);
  o.tasks = {"hellaswag", "nope"};
  expect_error<std::invalid_argument>([&] { check_eval_options(o); },
                                      "unknown task \"nope\" (known: arc_easy,");
  o.tasks = {"hellaswag", "hellaswag"};
  EXPECT_THROW(check_eval_options(o), std::invalid_argument);
  o.tasks = {"hellaswag"};
  o.num_fewshot = 3;
  EXPECT_THROW(check_eval_options(o), std::invalid_argument);  // no pool
  o.tasks = {"gsm8k_cot"};
  o.num_fewshot = 9;
  EXPECT_THROW(check_eval_options(o), std::invalid_argument);  // 8 exemplars
  o.num_fewshot = 4;
  EXPECT_NO_THROW(check_eval_options(o));
  o.max_gen_tokens = -1;
  EXPECT_THROW(check_eval_options(o), std::invalid_argument);
  o.max_gen_tokens = 0;  // the task's own
  EXPECT_NO_THROW(check_eval_options(o));
}

TEST(EvalData, MissingAndBadFilesAreNamed) {
  TempData td;
  EvalOptions o;
  o.tasks = {"piqa"};
  expect_error<std::runtime_error>([&] { prepare_tasks(o, td.data()); },
                                   "piqa/validation.jsonl: no such file (task piqa; run "
                                   "scripts/get-eval-data.sh");
  td.write("piqa/validation.jsonl",
           {{{"goal", "g"}, {"sol1", "a"}, {"sol2", "b"}, {"label", 0}}, {{"goal", "g"}}});
  expect_error<std::runtime_error>([&] { prepare_tasks(o, td.data()); },
                                   "document 1 (task piqa): field \"sol1\"");
}

TEST(EvalData, MmluFewShotFromDevFirstN) {
  TempData td;
  std::vector<json> dev, test;
  for (int i = 0; i < 6; ++i)
    dev.push_back({{"question", std::string(1, static_cast<char>('a' + i))},
                   {"choices", {"w", "x", "y", "z"}},
                   {"answer", i % 4},
                   {"subject", "anatomy"}});
  for (int i = 0; i < 3; ++i)
    test.push_back({{"question", std::string(2, static_cast<char>('a' + i))},
                    {"choices", {"w", "x", "y", "z"}},
                    {"answer", 0},
                    {"subject", i == 2 ? "abstract_algebra" : "anatomy"}});
  td.write("mmlu/dev.jsonl", dev);
  td.write("mmlu/test.jsonl", test);
  EvalOptions o;
  o.tasks = {"mmlu"};
  o.num_fewshot = 2;
  // abstract_algebra has no dev documents: refused with the subject named.
  expect_error<std::runtime_error>([&] { prepare_tasks(o, td.data()); },
                                   "subject abstract_algebra has 0 few-shot documents");
  o.num_fewshot = 0;
  EXPECT_NO_THROW(prepare_tasks(o, td.data()));
}

// A tiny model whose vocabulary is one token per printable ASCII byte: every prompt encodes.
std::unique_ptr<model::Llama2cTokenizer> byte_tokenizer(int vocab) {
  std::vector<std::string> v;
  const char* special[3] = {"<unk>", "<s>", "</s>"};
  for (int i = 0; i < vocab; ++i)
    v.push_back(i < 3    ? std::string(special[i])
                : i == 3 ? std::string("\n")
                         : std::string(1, static_cast<char>(' ' + (i - 4) % 95)));
  return std::make_unique<model::Llama2cTokenizer>(v, std::vector<float>(vocab, 0.0f));
}

// A random model over byte_tokenizer's vocabulary (context 256 unless given).
struct TinyLm {
  model::Config c;
  std::shared_ptr<const model::Weights> w;
  std::unique_ptr<model::Llama2cTokenizer> tok;
  model::TransformerFactory make;
  explicit TinyLm(uint64_t seed, int max_seq_len = 256) : c(model::testing::small_config()) {
    c.vocab_size = 98;
    c.max_seq_len = max_seq_len;
    w = std::make_shared<const model::Weights>(model::testing::random_model(c, seed));
    tok = byte_tokenizer(c.vocab_size);
    make = [w = w] { return std::make_unique<model::Transformer>(w); };
  }
  // evaluate() on this model, with `t` as the tokenizer (default: the byte tokenizer).
  EvalResult run(const PreparedTasks& tasks, const EvalOptions& o,
                 const model::Tokenizer* t = nullptr) const {
    return evaluate(tasks, t ? *t : *tok, c, make, o);
  }
  // The engine's loglikelihood of `cont` after `ctx` (byte tokens), scored alone: the
  // reference of evaluate()'s, which scores each request beside its sibling branches.
  double loglikelihood(const std::string& ctx, const std::string& cont) const {
    model::LoglikelihoodRequest lr{tok->encode(ctx, false, false), {}};
    const auto whole = tok->encode(ctx + cont, false, false);
    lr.continuation.assign(whole.begin() + lr.context.size(), whole.end());
    return model::score_loglikelihood(make, c, {{lr}}, {.threads = 1})[0][0].logprob;
  }
};

TEST(Eval, EndToEndOnATinyModelMatchesTheEngine) {
  const TinyLm lm(3);
  TempData td;
  td.write("piqa/validation.jsonl",
           {{{"goal", "a b"}, {"sol1", "cd"}, {"sol2", "efg"}, {"label", 1}},
            {{"goal", "h"}, {"sol1", "i j"}, {"sol2", "k"}, {"label", 0}},
            {{"goal", "l m"}, {"sol1", "n"}, {"sol2", "op"}, {"label", 0}}});
  td.write("lambada_openai/test.jsonl", {{{"text", "x y z"}}, {{"text", "u v"}}});
  EvalOptions o;
  o.tasks = {"piqa", "lambada_openai"};
  o.threads = 2;
  o.bos = false;
  const auto tasks = prepare_tasks(o, td.data());
  const EvalResult r = lm.run(tasks, o);
  ASSERT_EQ(r.samples.size(), 5u);
  ASSERT_EQ(r.tasks.size(), 2u);
  // Each request's loglikelihood as the engine computes it on the same tokens.
  for (const EvalSample& s : r.samples) {
    for (const EvalRequestLog& q : s.requests)
      EXPECT_NEAR(q.loglikelihood, lm.loglikelihood(q.context, q.continuation), 1e-4);
  }
  // acc from the loglikelihoods; acc_norm divides by the choice's characters.
  double acc = 0;
  for (int i = 0; i < 3; ++i) {
    const EvalSample& s = r.samples[i];
    EXPECT_EQ(s.task, "piqa");
    EXPECT_EQ(s.requests[0].context.substr(0, 10), "Question: ");
    EXPECT_EQ(s.requests[0].continuation[0], ' ');
    const int pred = s.requests[1].loglikelihood > s.requests[0].loglikelihood ? 1 : 0;
    EXPECT_EQ(s.metrics.at("acc"), pred == std::stoi(s.target) ? 1.0 : 0.0);
    acc += s.metrics.at("acc");
  }
  EXPECT_NEAR(r.tasks[0].metrics.at("acc").value, acc / 3, 1e-12);
  // lambada: perplexity = exp(-mean ll).
  const double ll = r.samples[3].requests[0].loglikelihood + r.samples[4].requests[0].loglikelihood;
  EXPECT_NEAR(r.tasks[1].metrics.at("perplexity").value, std::exp(-ll / 2), 1e-9);
  const json j = json::parse(eval_results_json(r));
  EXPECT_EQ(j["piqa"]["n"], 3);
  EXPECT_TRUE(j["piqa"].contains("acc_norm_stderr"));
  const json line = json::parse(eval_sample_json(r.samples[0]));
  EXPECT_EQ(line["requests"].size(), 2u);
  EXPECT_TRUE(line["requests"][0].contains("loglikelihood"));
  // --limit: the first N documents.
  o.limit = 1;
  const EvalResult r1 = lm.run(prepare_tasks(o, td.data()), o);
  EXPECT_EQ(r1.samples.size(), 2u);
  EXPECT_EQ(r1.samples[0].requests[0].loglikelihood, r.samples[0].requests[0].loglikelihood);
}

TEST(Eval, MmluSubjectsCategoriesAndOverallWeightedBySize) {
  const TinyLm lm(5);
  TempData td;
  std::vector<json> test;
  for (int i = 0; i < 5; ++i)  // marketing (other) first in the file: table order wins
    test.push_back({{"question", std::string(1, static_cast<char>('a' + i))},
                    {"choices", {"p", "q", "r", "s"}},
                    {"answer", i % 4},
                    {"subject", i < 3 ? "marketing" : "anatomy"}});
  td.write("mmlu/test.jsonl", test);
  EvalOptions o;
  o.tasks = {"mmlu"};
  o.num_fewshot = 0;
  const EvalResult r = lm.run(prepare_tasks(o, td.data()), o);
  ASSERT_EQ(r.samples.size(), 5u);
  EXPECT_EQ(r.samples[0].task, "mmlu_anatomy");  // subjects in lm-eval's (alphabetical) order
  EXPECT_EQ(r.samples[0].doc_id, 0);
  EXPECT_EQ(r.samples[2].task, "mmlu_marketing");
  EXPECT_EQ(r.samples[2].requests[0].context,
            "The following are multiple choice questions (with answers) about marketing.\n\na\n"
            "A. p\nB. q\nC. r\nD. s\nAnswer:");
  const TaskResult& t = r.tasks[0];
  double sum = 0;
  for (const EvalSample& x : r.samples) sum += x.metrics.at("acc");
  EXPECT_EQ(t.n, 5);
  EXPECT_NEAR(t.metrics.at("acc").value, sum / 5, 1e-12);
  std::vector<std::string> names;
  for (const TaskResult& x : t.subtasks) names.push_back(x.task);
  EXPECT_EQ(names, (std::vector<std::string>{"mmlu_other", "mmlu_stem", "mmlu_anatomy",
                                             "mmlu_marketing"}));
  const std::string md = eval_markdown(r);
  EXPECT_NE(md.find("| - mmlu_stem | 2 |"), std::string::npos) << md;
  EXPECT_EQ(md.find("mmlu_anatomy"), std::string::npos) << md;
  const json j = json::parse(eval_results_json(r));
  EXPECT_EQ(j["mmlu_marketing"]["n"], 3);
  EXPECT_EQ(j["mmlu"]["n"], 5);
  // lm-eval's names of a part: one subject, one category; the same numbers.
  o.tasks = {"mmlu_anatomy", "mmlu_other"};
  const EvalResult p = lm.run(prepare_tasks(o, td.data()), o);
  ASSERT_EQ(p.tasks.size(), 2u);
  EXPECT_EQ(p.tasks[0].task, "mmlu_anatomy");
  EXPECT_EQ(p.tasks[0].n, 2);
  EXPECT_TRUE(p.tasks[0].subtasks.empty());
  EXPECT_EQ(p.tasks[1].task, "mmlu_other");
  EXPECT_EQ(p.tasks[1].n, 3);
  EXPECT_EQ(p.samples[0].requests[0].loglikelihood, r.samples[0].requests[0].loglikelihood);
  const json pj = json::parse(eval_results_json(p));
  EXPECT_EQ(pj["mmlu_other"]["acc"], j["mmlu_other"]["acc"]);
  EXPECT_EQ(task_headline_metric("mmlu_anatomy"), "acc");
  o.tasks = {"mmlu_virology"};  // a subject the file lacks
  EXPECT_THROW(prepare_tasks(o, td.data()), std::runtime_error);
  o.tasks = {"mmlu_nonsense"};
  EXPECT_THROW(check_eval_options(o), std::invalid_argument);
}

TEST(EvalTasks, IfevalRowAsLmEval) {
  const auto& t = task("ifeval");
  EXPECT_EQ(t.kind, detail::TaskKind::kGenerateUntil);
  EXPECT_EQ(t.file, "ifeval/train.jsonl");  // test_split: train
  EXPECT_TRUE(t.until.empty());             // until: []: EOS only
  EXPECT_EQ(t.max_gen_tokens, 1280);
  EXPECT_EQ(task("gsm8k_cot").max_gen_tokens, 256);  // HFLM's default
  EXPECT_EQ(t.num_fewshot, 0);
  EXPECT_EQ(t.metrics,
            (std::vector<std::string>{"prompt_level_strict_acc", "inst_level_strict_acc",
                                      "prompt_level_loose_acc", "inst_level_loose_acc"}));
  EXPECT_EQ(task_headline_metric("ifeval"), "prompt_level_strict_acc");
  const json d = {
      {"key", 1000},
      {"prompt", "Write a poem.\nNo commas."},
      {"instruction_id_list", {"punctuation:no_comma", "length_constraints:number_words"}},
      {"kwargs", {json::object(), {{"relation", "at least"}, {"num_words", 300}}}}};
  const auto p = t.doc(d);
  EXPECT_EQ(p.text, "Write a poem.\nNo commas.");  // doc_to_text: prompt, nothing added
  EXPECT_EQ(p.fields, d);
  json bad = d;
  bad["kwargs"] = {json::object()};
  EXPECT_THROW(t.doc(bad), std::runtime_error);
  bad = d;
  bad.erase("key");
  EXPECT_THROW(t.doc(bad), std::runtime_error);
}

// A fake ifeval scorer (sh): per document of n instructions, strict [true, false * (n-1)] and
// loose all true. The real one against lm-eval: python/tests/test_eval_ifeval.py.
std::string fake_ifeval_scorer(const fs::path& dir) {
  const fs::path p = dir / "fake_scorer.sh";
  std::ofstream(p) << testing::fake_ifeval_scorer_script();
  return p.string();
}

TEST(Eval, IfevalGeneratesScoresAndAggregatesPerInstruction) {
  const TinyLm lm(3);
  TempData td;
  auto doc = [](int key, int n) {
    json ids = json::array(), kw = json::array();
    for (int i = 0; i < n; ++i) {
      ids.push_back("punctuation:no_comma");
      kw.push_back(json::object());
    }
    return json{{"key", key},
                {"prompt", "Say " + std::to_string(key)},
                {"instruction_id_list", ids},
                {"kwargs", kw}};
  };
  td.write("ifeval/train.jsonl", {doc(1, 2), doc(2, 1), doc(3, 3)});
  EvalData data = td.data();
  data.python = "sh";
  data.ifeval_scorer = fake_ifeval_scorer(td.dir);
  EvalOptions o;
  o.tasks = {"ifeval"};
  o.threads = 2;
  o.bos = false;
  const auto tasks = prepare_tasks(o, data);
  // Default: ifeval's own 1280 tokens, more than this model's context allows.
  expect_error<std::invalid_argument>([&] { lm.run(tasks, o); },
                                      "task ifeval: document 0: max_tokens 1280");
  o.max_gen_tokens = 6;
  const EvalResult r = lm.run(tasks, o);
  ASSERT_EQ(r.samples.size(), 3u);
  for (const EvalSample& s : r.samples) {
    EXPECT_TRUE(s.generated);
    EXPECT_EQ(s.requests.at(0).context, "Say " + std::to_string(s.doc_id + 1));
    EXPECT_LE(s.generation.size(), 6u);  // one byte a token here
  }
  // The engine's greedy text, EOS being the only stop.
  model::GenerationRequest g{lm.tok->encode("Say 1", false, false), {}, 6};
  EXPECT_EQ(r.samples[0].generation,
            model::generate_until(lm.make, lm.c, *lm.tok, {g}, {.threads = 1})[0].text);
  EXPECT_EQ(r.samples[0].metric_lists.at("inst_level_strict_acc"), (std::vector<double>{1, 0}));
  EXPECT_EQ(r.samples[1].metrics.at("prompt_level_strict_acc"), 1);
  EXPECT_EQ(r.samples[2].metrics.at("prompt_level_strict_acc"), 0);
  // prompt level: the mean over documents (1 of 3 follows all); instruction level: over all 6
  // instructions (3 followed), not the mean of per-document means.
  const TaskResult& t = r.tasks.at(0);
  EXPECT_NEAR(t.metrics.at("prompt_level_strict_acc").value, 1.0 / 3, 1e-12);
  EXPECT_NEAR(t.metrics.at("prompt_level_strict_acc").stderr_, mean_stderr({0, 1, 0}), 1e-12);
  EXPECT_NEAR(t.metrics.at("inst_level_strict_acc").value, 0.5, 1e-12);
  EXPECT_EQ(t.metrics.at("prompt_level_loose_acc").value, 1);
  EXPECT_EQ(t.metrics.at("inst_level_loose_acc").value, 1);
  const json j = json::parse(eval_results_json(r));
  EXPECT_EQ(j["ifeval"]["inst_level_strict_acc_stderr"], "N/A");  // as lm-eval prints it
  EXPECT_TRUE(j["ifeval"]["prompt_level_strict_acc_stderr"].is_number());
  const json line = json::parse(eval_sample_json(r.samples[0]));
  EXPECT_EQ(line["generation"], r.samples[0].generation);
  EXPECT_LE(line["generated_tokens"].get<int>(), 6);
  EXPECT_EQ(line["metrics"]["inst_level_strict_acc"], json({1.0, 0.0}));
  EXPECT_EQ(line["metrics"]["prompt_level_strict_acc"], 0.0);
  EXPECT_FALSE(line.contains("filtered"));
  // A scorer that cannot run is refused before any generation.
  data.python = "/nonexistent/python3";
  expect_error<std::runtime_error>([&] { prepare_tasks(o, data); }, "scripts/get-lm-eval.sh");
}

TEST(Eval, PromptOutsideTheVocabularyIsRefused) {
  model::Config c = model::testing::small_config();  // vocab 37: no room for every byte
  c.max_seq_len = 256;
  auto w = std::make_shared<const model::Weights>(model::testing::random_model(c, 3));
  std::vector<std::string> v(c.vocab_size, "a");
  // Byte fallback tokens beyond the vocabulary: "<0x..>" ids are byte + 3 (up to 258).
  model::Llama2cTokenizer tok(v, std::vector<float>(c.vocab_size, 0.0f));
  model::TransformerFactory make = [&] { return std::make_unique<model::Transformer>(w); };
  TempData td;
  td.write("piqa/validation.jsonl", {{{"goal", "zz"}, {"sol1", "a"}, {"sol2", "b"}, {"label", 1}}});
  EvalOptions o;
  o.tasks = {"piqa"};
  expect_error<std::invalid_argument>(
      [&] { evaluate(prepare_tasks(o, td.data()), tok, c, make, o); },
      "task piqa, document 0: tokenizer: byte 0x51");
}

// A tokenizer that carries a chat template (the byte tokenizer underneath; BOS spelled "B").
class ChatTok : public model::Tokenizer {
 public:
  ChatTok(const model::Tokenizer& t, std::string tmpl) : t_(t), tmpl_(std::move(tmpl)) {}
  std::vector<int> encode(std::string_view s, bool bos, bool eos) const override {
    return t_.encode(s, bos, eos);
  }
  std::string decode_token(int p, int x) const override { return t_.decode_token(p, x); }
  int bos() const override { return t_.bos(); }
  bool add_bos() const override { return t_.add_bos(); }
  int eos() const override { return t_.eos(); }
  int vocab_size() const override { return t_.vocab_size(); }
  std::string chat_template() const override { return tmpl_; }
  std::string token_text(int id) const override { return id == t_.bos() ? "B" : ""; }

 private:
  const model::Tokenizer& t_;
  std::string tmpl_;
};

const std::string kSmolTemplate =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
    "'<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|im_start|>assistant\n' }}{% endif %}";
const std::string kLlama3Template =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | "
    "trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% "
    "endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";

std::string smol(const std::string& system, const std::string& user) {
  return "<|im_start|>system\n" + system + "<|im_end|>\n<|im_start|>user\n" + user +
         "<|im_end|>\n<|im_start|>assistant\n";
}

TEST(EvalChat, RequestsAsLmEvalBuildsThemUnderTheTemplate) {
  const TinyLm lm(3, 512);
  const ChatTok tok(*lm.tok, kSmolTemplate);
  TempData td;
  td.write("piqa/validation.jsonl",
           {{{"goal", "a b"}, {"sol1", "cd"}, {"sol2", "e"}, {"label", 1}}});
  td.write("winogrande/validation.jsonl",
           {{{"sentence", "x _ y z."}, {"option1", "p"}, {"option2", "q"}, {"answer", "2"}}});
  td.write("lambada_openai/test.jsonl", {{{"text", "u v w"}}});
  EvalOptions o;
  o.tasks = {"piqa", "winogrande", "lambada_openai"};
  o.threads = 1;
  o.bos = false;
  o.apply_chat_template = true;
  const std::string def = "You are a helpful AI assistant named SmolLM, trained by Hugging Face";
  const EvalResult r = lm.run(prepare_tasks(o, td.data()), o, &tok);
  ASSERT_EQ(r.samples.size(), 3u);
  // Multiple choice: the question as the user message, the template's default system message,
  // the generation prompt; no target delimiter in front of the choices.
  EXPECT_EQ(r.samples[0].requests[0].context, smol(def, "Question: a b\nAnswer:"));
  EXPECT_EQ(r.samples[0].requests[0].continuation, "cd");
  EXPECT_EQ(r.samples[0].requests[1].continuation, "e");
  // Winogrande: one rendered context per option, the shared continuation without its space.
  EXPECT_EQ(r.samples[1].requests[1].context, smol(def, "x q"));
  EXPECT_EQ(r.samples[1].requests[1].continuation, "y z.");
  // Loglikelihood tasks keep their target as the task writes it.
  EXPECT_EQ(r.samples[2].requests[0].context, smol(def, "u v"));
  EXPECT_EQ(r.samples[2].requests[0].continuation, " w");
  // The rendered context's trailing "\n" moves to the continuation (lm-eval's _encode_pair):
  // the scores are those of the engine on those tokens.
  for (const EvalSample& s : r.samples)
    for (const EvalRequestLog& q : s.requests) {
      std::string ctx = q.context, cont = q.continuation;
      ASSERT_EQ(ctx.back(), '\n');
      ctx.pop_back();
      cont = "\n" + cont;
      // (The requests share the system message as a prefix, computed once: rounding.)
      EXPECT_NEAR(q.loglikelihood, lm.loglikelihood(ctx, cont), 1e-4);
    }
  // --system-instruction replaces the default system message.
  o.tasks = {"piqa"};
  o.system_instruction = "Be brief.";
  const EvalResult rs = lm.run(prepare_tasks(o, td.data()), o, &tok);
  EXPECT_EQ(rs.samples[0].requests[0].context, smol("Be brief.", "Question: a b\nAnswer:"));
  // Without the template it is put in front of the context as it is (lm-eval: no separator).
  o.apply_chat_template = false;
  const EvalResult rp = lm.run(prepare_tasks(o, td.data()), o, &tok);
  EXPECT_EQ(rp.samples[0].requests[0].context, "Be brief.Question: a b\nAnswer:");
  EXPECT_EQ(rp.samples[0].requests[0].continuation, " cd");
}

TEST(EvalChat, FewShotAsOneMessageOrAsTurns) {
  TempData td;
  std::vector<json> dev, test;
  for (int i = 0; i < 2; ++i)
    dev.push_back({{"subject", "anatomy"},
                   {"question", "d" + std::to_string(i)},
                   {"choices", {"w", "x", "y", "z"}},
                   {"answer", i}});
  test.push_back({{"subject", "anatomy"},
                  {"question", "t"},
                  {"choices", {"w", "x", "y", "z"}},
                  {"answer", 3}});
  td.write("mmlu/dev.jsonl", dev);
  td.write("mmlu/test.jsonl", test);
  EvalOptions o;
  o.tasks = {"mmlu"};
  o.num_fewshot = 2;
  o.apply_chat_template = true;
  o.fewshot_as_multiturn = false;
  const TinyLm lm(3, 512);
  const ChatTok tok(*lm.tok, kSmolTemplate);
  const std::string desc =
      "The following are multiple choice questions (with answers) about "
      "anatomy.\n\n";
  const std::string q0 = "d0\nA. w\nB. x\nC. y\nD. z\nAnswer:",
                    q1 = "d1\nA. w\nB. x\nC. y\nD. z\nAnswer:",
                    qt = "t\nA. w\nB. x\nC. y\nD. z\nAnswer:";
  // One user message: the examples as plain text, then the question; the description is the
  // system message.
  EvalResult r = lm.run(prepare_tasks(o, td.data()), o, &tok);
  EXPECT_EQ(r.samples[0].requests[0].context, smol(desc, q0 + " A\n\n" + q1 + " B\n\n" + qt));
  EXPECT_EQ(r.samples[0].requests[0].continuation, "A");
  // As turns (lm-eval's CLI default with the template): no delimiters inside the turns.
  o.fewshot_as_multiturn.reset();
  r = lm.run(prepare_tasks(o, td.data()), o, &tok);
  EXPECT_EQ(r.samples[0].requests[0].context,
            "<|im_start|>system\n" + desc + "<|im_end|>\n<|im_start|>user\n" + q0 +
                "<|im_end|>\n<|im_start|>assistant\nA<|im_end|>\n<|im_start|>user\n" + q1 +
                "<|im_end|>\n<|im_start|>assistant\nB<|im_end|>\n<|im_start|>user\n" + qt +
                "<|im_end|>\n<|im_start|>assistant\n");
  // Plain text with a system instruction: joined with the description by "\n\n".
  o.apply_chat_template = false;
  o.system_instruction = "S";
  r = lm.run(prepare_tasks(o, td.data()), o, &tok);
  EXPECT_EQ(r.samples[0].requests[0].context, "S\n\n" + desc + q0 + " A\n\n" + q1 + " B\n\n" + qt);
  // Multi-turn without the template is refused, as lm-eval does.
  o.fewshot_as_multiturn = true;
  EXPECT_THROW(check_eval_options(o), std::invalid_argument);
}

TEST(EvalChat, NoBosInFrontOfATemplateThatStartsWithIt) {
  const TinyLm lm(3, 512);
  const ChatTok tok(*lm.tok, kLlama3Template);  // renders "B<|start_header_id|>..."
  TempData td;
  td.write("piqa/validation.jsonl", {{{"goal", "a"}, {"sol1", "cd"}, {"sol2", "e"}, {"label", 1}}});
  EvalOptions o;
  o.tasks = {"piqa"};
  o.apply_chat_template = true;
  o.bos = true;  // lm-eval's add_bos_token=True: still none before the template's own BOS text
  const EvalResult r = lm.run(prepare_tasks(o, td.data()), o, &tok);
  const EvalRequestLog& q = r.samples[0].requests[0];
  EXPECT_EQ(q.context,
            "B<|start_header_id|>user<|end_header_id|>\n\nQuestion: a\nAnswer:<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  std::string ctx = q.context;
  ctx.resize(ctx.size() - 2);
  EXPECT_NEAR(q.loglikelihood, lm.loglikelihood(ctx, "\n\n" + q.continuation), 1e-4);
}

TEST(EvalChat, ModelsWithoutASupportedTemplateAreRefused) {
  const auto bytes = byte_tokenizer(98);
  const auto msg = [&](const std::string& tmpl) {
    try {
      eval_chat_template(ChatTok(*bytes, tmpl), "models/m.gguf");
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string none = msg("");
  EXPECT_NE(none.find("models/m.gguf: " + option_ref("apply_chat_template") +
                      ": the model's tokenizer has no chat template"),
            std::string::npos)
      << none;
  const std::string other =
      msg("{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}");
  EXPECT_NE(other.find("models/m.gguf"), std::string::npos) << other;
  EXPECT_NE(other.find("supported: ChatML"), std::string::npos) << other;
  EXPECT_NE(other.find("Llama-3"), std::string::npos) << other;
  EXPECT_EQ(eval_chat_template(ChatTok(*bytes, kSmolTemplate), "m").name.substr(0, 6), "chatml");
  // evaluate() itself refuses too (no template given by run_eval).
  const TinyLm lm(3);
  TempData td;
  td.write("piqa/validation.jsonl", {{{"goal", "a"}, {"sol1", "cd"}, {"sol2", "e"}, {"label", 1}}});
  EvalOptions o;
  o.tasks = {"piqa"};
  o.apply_chat_template = true;
  EXPECT_THROW(evaluate(prepare_tasks(o, td.data()), *bytes, lm.c, lm.make, o),
               std::invalid_argument);
}

}  // namespace
}  // namespace scalesweep::pipeline
