// The task table: lm-eval 0.4.13's definitions of each task `eval` runs (see
// scalesweep/pipeline/eval.h), one row each, read by prepare_tasks.
#include "pipeline/eval_tasks.h"

#include <regex>
#include <stdexcept>

namespace scalesweep::pipeline::detail {
namespace {

using nlohmann::json;

// Python's str.isspace on the characters these data sets hold (ASCII and U+00A0 as UTF-8).
bool ascii_space(char c) {
  return c == ' ' || (c >= '\t' && c <= '\r') || c == '\x1c' || c == '\x1d' || c == '\x1e' ||
         c == '\x1f';
}

}  // namespace

std::string py_strip(const std::string& s) {
  size_t b = 0, e = s.size();
  for (;;) {
    if (b < e && ascii_space(s[b])) {
      ++b;
    } else if (e - b >= 2 && s.compare(b, 2, "\xc2\xa0") == 0) {
      b += 2;
    } else {
      break;
    }
  }
  for (;;) {
    if (e > b && ascii_space(s[e - 1])) {
      --e;
    } else if (e - b >= 2 && s.compare(e - 2, 2, "\xc2\xa0") == 0) {
      e -= 2;
    } else {
      break;
    }
  }
  return s.substr(b, e - b);
}

std::string py_capitalize(const std::string& s) {
  std::string r = s;
  for (size_t i = 0; i < r.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(r[i]);
    if (c >= 0x80) continue;  // non-ASCII left as is
    r[i] = static_cast<char>(i == 0 ? std::toupper(c) : std::tolower(c));
  }
  return r;
}

int64_t code_points(const std::string& s) {
  int64_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

namespace {

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t p = 0; (p = s.find(from, p)) != std::string::npos; p += to.size())
    s.replace(p, from.size(), to);
  return s;
}

// hellaswag/utils.py preprocess.
std::string hellaswag_clean(const std::string& text) {
  static const std::regex brackets("\\[.*?\\]");
  std::string t = py_strip(text);
  t = replace_all(t, " [title]", ". ");
  t = std::regex_replace(t, brackets, "");
  // str.replace("  ", " "): one pass, non-overlapping.
  std::string out;
  for (size_t i = 0; i < t.size();) {
    if (t.compare(i, 2, "  ") == 0) {
      out += ' ';
      i += 2;
    } else {
      out += t[i++];
    }
  }
  return out;
}

const std::string& str(const json& doc, const char* field) {
  const auto it = doc.find(field);
  if (it == doc.end() || !it->is_string())
    throw std::runtime_error(std::string("field \"") + field + "\" missing or not a string");
  return it->get_ref<const std::string&>();
}

int64_t integer(const json& doc, const char* field) {
  const auto it = doc.find(field);
  if (it != doc.end() && it->is_number_integer()) return it->get<int64_t>();
  if (it != doc.end() && it->is_boolean()) return it->get<bool>() ? 1 : 0;
  if (it != doc.end() && it->is_string()) {
    const std::string& s = it->get_ref<const std::string&>();
    size_t used = 0;
    int64_t v = 0;
    try {
      v = std::stoll(s, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == s.size() && !s.empty()) return v;
  }
  throw std::runtime_error(std::string("field \"") + field + "\" missing or not an integer");
}

std::vector<std::string> strings(const json& v, const char* field) {
  if (!v.is_array()) throw std::runtime_error(std::string("field \"") + field + "\" not a list");
  std::vector<std::string> out;
  for (const json& x : v) {
    if (!x.is_string())
      throw std::runtime_error(std::string("field \"") + field + "\" holds a non-string");
    out.push_back(x.get<std::string>());
  }
  return out;
}

std::vector<std::string> field_strings(const json& doc, const char* field) {
  const auto it = doc.find(field);
  if (it == doc.end()) throw std::runtime_error(std::string("field \"") + field + "\" missing");
  return strings(*it, field);
}

DocParts check_gold(DocParts p) {
  if (p.gold < 0 || p.gold >= static_cast<int>(p.choices.size()))
    throw std::runtime_error("gold answer " + std::to_string(p.gold) + " outside the " +
                             std::to_string(p.choices.size()) + " choices");
  return p;
}

// `p` with its gold choice, the document's integer field `field`, checked.
DocParts with_gold(DocParts p, const json& d, const char* field) {
  p.gold = static_cast<int>(integer(d, field));
  return check_gold(std::move(p));
}

DocParts arc(const json& d) {
  DocParts p;
  p.text = "Question: " + str(d, "question") + "\nAnswer:";
  const auto ch = d.find("choices");
  if (ch == d.end() || !ch->is_object())
    throw std::runtime_error("field \"choices\" missing or not an object");
  p.choices = strings(ch->value("text", json()), "choices.text");
  const auto labels = strings(ch->value("label", json()), "choices.label");
  const std::string& key = str(d, "answerKey");
  p.gold = -1;
  for (size_t i = 0; i < labels.size(); ++i)
    if (labels[i] == key) p.gold = static_cast<int>(i);
  if (p.gold < 0) throw std::runtime_error("answerKey \"" + key + "\" is not among the labels");
  return check_gold(std::move(p));
}

DocParts hellaswag(const json& d) {
  DocParts p;
  const std::string ctx = str(d, "ctx_a") + " " + py_capitalize(str(d, "ctx_b"));
  p.text = hellaswag_clean(str(d, "activity_label") + ": " + ctx);
  for (const std::string& e : field_strings(d, "endings")) p.choices.push_back(hellaswag_clean(e));
  return with_gold(std::move(p), d, "label");
}

DocParts winogrande(const json& d) {
  DocParts p;
  const std::string& s = str(d, "sentence");
  const size_t idx = s.find('_');
  if (idx == std::string::npos) throw std::runtime_error("sentence has no \"_\"");
  p.choices = {s.substr(0, idx) + str(d, "option1"), s.substr(0, idx) + str(d, "option2")};
  p.target = py_strip(s.substr(idx + 1));
  const std::string& a = str(d, "answer");
  if (a != "1" && a != "2") throw std::runtime_error("answer \"" + a + "\" is not \"1\" or \"2\"");
  p.gold = a == "1" ? 0 : 1;
  return p;
}

DocParts piqa(const json& d) {
  DocParts p;
  p.text = "Question: " + str(d, "goal") + "\nAnswer:";
  p.choices = {str(d, "sol1"), str(d, "sol2")};
  return with_gold(std::move(p), d, "label");
}

DocParts boolq(const json& d) {
  DocParts p;
  p.text = str(d, "passage") + "\nQuestion: " + str(d, "question") + "?\nAnswer:";
  p.choices = {"no", "yes"};
  return with_gold(std::move(p), d, "label");
}

DocParts lambada(const json& d) {
  DocParts p;
  const std::string& t = str(d, "text");
  const size_t sp = t.rfind(' ');
  // text.split(' ')[:-1] joined by ' ' and ' ' + the last piece.
  p.text = sp == std::string::npos ? "" : t.substr(0, sp);
  p.target = " " + (sp == std::string::npos ? t : t.substr(sp + 1));
  if (p.text.empty()) throw std::runtime_error("text has a single word: no context");
  return p;
}

DocParts mmlu(const json& d) {
  DocParts p;
  const auto ch = field_strings(d, "choices");
  if (ch.size() != 4) throw std::runtime_error("choices: " + std::to_string(ch.size()) + ", not 4");
  p.text = py_strip(str(d, "question")) + "\nA. " + ch[0] + "\nB. " + ch[1] + "\nC. " + ch[2] +
           "\nD. " + ch[3] + "\nAnswer:";
  p.choices = {"A", "B", "C", "D"};
  return with_gold(std::move(p), d, "answer");
}

DocParts gsm8k_cot(const json& d) {
  DocParts p;
  p.text = "Q: " + str(d, "question") + "\nA:";
  const std::string& a = str(d, "answer");
  const size_t h = a.rfind("####");
  p.target = py_strip(h == std::string::npos ? a : a.substr(h + 4));
  return p;
}

// ifeval.yaml: doc_to_text "prompt", doc_to_target 0; the fields process_results reads are
// passed to the scorer as they are (kwargs' None values are dropped by lm-eval's checkers).
DocParts ifeval(const json& d) {
  DocParts p;
  p.text = str(d, "prompt");
  p.target = "0";
  const auto key = d.find("key");
  if (key == d.end() || !key->is_number_integer())
    throw std::runtime_error("field \"key\" missing or not an integer");
  const auto ids = field_strings(d, "instruction_id_list");
  const auto kw = d.find("kwargs");
  if (kw == d.end() || !kw->is_array() || kw->size() != ids.size())
    throw std::runtime_error(
        "field \"kwargs\" missing, or not a list as long as "
        "instruction_id_list");
  for (const json& k : *kw)
    if (!k.is_object()) throw std::runtime_error("field \"kwargs\" holds a non-object");
  p.fields = {{"key", *key}, {"prompt", p.text}, {"instruction_id_list", ids}, {"kwargs", *kw}};
  return p;
}

// gsm8k-cot.yaml's fewshot_config.samples (question, target), in order.
const std::vector<std::pair<std::string, std::string>>& gsm8k_cot_shots() {
  static const std::vector<std::pair<std::string, std::string>> shots = {
      {"There are 15 trees in the grove. Grove workers will plant trees in the grove today. After "
       "they are done, there will be 21 trees. How many trees did the grove workers plant today?",
       "There are 15 trees originally. Then there were 21 trees after some more were planted. So "
       "there must have been 21 - 15 = 6. The answer is 6."},
      {"If there are 3 cars in the parking lot and 2 more cars arrive, how many cars are in the "
       "parking lot?",
       "There are originally 3 cars. 2 more cars arrive. 3 + 2 = 5. The answer is 5."},
      {"Leah had 32 chocolates and her sister had 42. If they ate 35, how many pieces do they have "
       "left in total?",
       "Originally, Leah had 32 chocolates. Her sister had 42. So in total they had 32 + 42 = 74. "
       "After eating 35, they had 74 - 35 = 39. The answer is 39."},
      {"Jason had 20 lollipops. He gave Denny some lollipops. Now Jason has 12 lollipops. How many "
       "lollipops did Jason give to Denny?",
       "Jason started with 20 lollipops. Then he had 12 after giving some to Denny. So he gave "
       "Denny 20 - 12 = 8. The answer is 8."},
      {"Shawn has five toys. For Christmas, he got two toys each from his mom and dad. How many "
       "toys does he have now?",
       "Shawn started with 5 toys. If he got 2 toys each from his mom and dad, then that is 4 more "
       "toys. 5 + 4 = 9. The answer is 9."},
      {"There were nine computers in the server room. Five more computers were installed each "
       "day, from monday to thursday. How many computers are now in the server room?",
       "There were originally 9 computers. For each of 4 days, 5 more computers were added. So 5 "
       "* 4 = 20 computers were added. 9 + 20 is 29. The answer is 29."},
      {"Michael had 58 golf balls. On tuesday, he lost 23 golf balls. On wednesday, he lost 2 "
       "more. How many golf balls did he have at the end of wednesday?",
       "Michael started with 58 golf balls. After losing 23 on tuesday, he had 58 - 23 = 35. After "
       "losing 2 more, he had 35 - 2 = 33 golf balls. The answer is 33."},
      {"Olivia has $23. She bought five bagels for $3 each. How much money does she have left?",
       "Olivia had 23 dollars. 5 bagels for 3 dollars each will be 5 x 3 = 15 dollars. So she has "
       "23 - 15 dollars left. 23 - 15 is 8. The answer is 8."},
  };
  return shots;
}

}  // namespace

const std::vector<MmluSubject>& mmlu_subjects() {
  // lm_eval/tasks/mmlu/default/mmlu_<subject>.yaml: each subject's tag (category).
  static const std::vector<MmluSubject> s = {
      {"abstract_algebra", "stem"},
      {"anatomy", "stem"},
      {"astronomy", "stem"},
      {"business_ethics", "other"},
      {"clinical_knowledge", "other"},
      {"college_biology", "stem"},
      {"college_chemistry", "stem"},
      {"college_computer_science", "stem"},
      {"college_mathematics", "stem"},
      {"college_medicine", "other"},
      {"college_physics", "stem"},
      {"computer_security", "stem"},
      {"conceptual_physics", "stem"},
      {"econometrics", "social_sciences"},
      {"electrical_engineering", "stem"},
      {"elementary_mathematics", "stem"},
      {"formal_logic", "humanities"},
      {"global_facts", "other"},
      {"high_school_biology", "stem"},
      {"high_school_chemistry", "stem"},
      {"high_school_computer_science", "stem"},
      {"high_school_european_history", "humanities"},
      {"high_school_geography", "social_sciences"},
      {"high_school_government_and_politics", "social_sciences"},
      {"high_school_macroeconomics", "social_sciences"},
      {"high_school_mathematics", "stem"},
      {"high_school_microeconomics", "social_sciences"},
      {"high_school_physics", "stem"},
      {"high_school_psychology", "social_sciences"},
      {"high_school_statistics", "stem"},
      {"high_school_us_history", "humanities"},
      {"high_school_world_history", "humanities"},
      {"human_aging", "other"},
      {"human_sexuality", "social_sciences"},
      {"international_law", "humanities"},
      {"jurisprudence", "humanities"},
      {"logical_fallacies", "humanities"},
      {"machine_learning", "stem"},
      {"management", "other"},
      {"marketing", "other"},
      {"medical_genetics", "other"},
      {"miscellaneous", "other"},
      {"moral_disputes", "humanities"},
      {"moral_scenarios", "humanities"},
      {"nutrition", "other"},
      {"philosophy", "humanities"},
      {"prehistory", "humanities"},
      {"professional_accounting", "other"},
      {"professional_law", "humanities"},
      {"professional_medicine", "other"},
      {"professional_psychology", "social_sciences"},
      {"public_relations", "social_sciences"},
      {"security_studies", "social_sciences"},
      {"sociology", "social_sciences"},
      {"us_foreign_policy", "social_sciences"},
      {"virology", "other"},
      {"world_religions", "humanities"},
  };
  return s;
}

const std::vector<TaskDef>& task_table() {
  static const std::vector<TaskDef> t = [] {
    std::vector<TaskDef> v;
    // A task's name, data file, kind, document reader, metrics and headline metric.
    auto task = [](const char* name, const char* file, TaskKind kind, DocParts (*fn)(const json&),
                   std::vector<std::string> metrics, const char* headline) {
      TaskDef d;
      d.name = name;
      d.file = file;
      d.kind = kind;
      d.doc = fn;
      d.metrics = std::move(metrics);
      d.headline = headline;
      return d;
    };
    auto mc = [&](const char* name, const char* file, DocParts (*fn)(const json&), bool norm) {
      return task(
          name, file, TaskKind::kMultipleChoice, fn,
          norm ? std::vector<std::string>{"acc", "acc_norm"} : std::vector<std::string>{"acc"},
          norm ? "acc_norm" : "acc");
    };
    v.push_back(mc("arc_easy", "arc_easy/test.jsonl", arc, true));
    v.push_back(mc("arc_challenge", "arc_challenge/test.jsonl", arc, true));
    v.push_back(mc("hellaswag", "hellaswag/validation.jsonl", hellaswag, true));
    TaskDef w = mc("winogrande", "winogrande/validation.jsonl", winogrande, false);
    w.multiple_input = true;
    v.push_back(w);
    v.push_back(mc("piqa", "piqa/validation.jsonl", piqa, true));
    v.push_back(mc("boolq", "boolq/validation.jsonl", boolq, false));
    v.push_back(task("lambada_openai", "lambada_openai/test.jsonl", TaskKind::kLoglikelihood,
                     lambada, {"perplexity", "acc"}, "acc"));
    TaskDef m = mc("mmlu", "mmlu/test.jsonl", mmlu, false);
    m.fewshot_file = "mmlu/dev.jsonl";
    m.num_fewshot = 5;
    m.group_field = "subject";
    v.push_back(m);
    TaskDef g = task("gsm8k_cot", "gsm8k/test.jsonl", TaskKind::kGenerateUntil, gsm8k_cot,
                     {"exact_match,strict-match", "exact_match,flexible-extract"},
                     "exact_match,strict-match");
    g.num_fewshot = 8;
    g.fixed_shots = &gsm8k_cot_shots();
    g.until = {"Q:", "</s>", "<|im_end|>"};
    g.max_gen_tokens = 256;  // not in the YAML: HFLM's default
    g.scorer = GenScorer::kGsm8k;
    v.push_back(g);
    TaskDef f = task("ifeval", "ifeval/train.jsonl", TaskKind::kGenerateUntil, ifeval,
                     {"prompt_level_strict_acc", "inst_level_strict_acc", "prompt_level_loose_acc",
                      "inst_level_loose_acc"},
                     "prompt_level_strict_acc");
    f.until = {};  // until: []: only the EOS token ends a generation
    f.max_gen_tokens = 1280;
    f.scorer = GenScorer::kIfeval;
    v.push_back(f);
    return v;
  }();
  return t;
}

std::string description_for(const TaskDef& t, const std::string& group) {
  if (t.name != "mmlu") return "";
  return "The following are multiple choice questions (with answers) about " +
         replace_all(group, "_", " ") + ".\n\n";
}

// gsm8k-cot.yaml filters: strict-match "The answer is (\-?[0-9\.\,]+)." (first match, group 1)
// and flexible-extract "(-?[$0-9.,]{2,})|(-?[0-9]+)" (last match, its non-empty group); no
// match: "[invalid]". Python's re.findall semantics (leftmost, non-overlapping).
std::map<std::string, std::string> gsm8k_filters(const std::string& gen) {
  static const std::regex strict("The answer is (\\-?[0-9\\.\\,]+).");
  static const std::regex flexible("(-?[$0-9.,]{2,})|(-?[0-9]+)");
  std::map<std::string, std::string> out;
  std::smatch m;
  out["strict-match"] = std::regex_search(gen, m, strict) ? py_strip(m[1].str()) : "[invalid]";
  std::string last = "[invalid]";
  for (auto it = std::sregex_iterator(gen.begin(), gen.end(), flexible);
       it != std::sregex_iterator(); ++it) {
    const std::smatch& x = *it;
    last = x[1].matched && x[1].length() > 0 ? x[1].str() : x[2].str();
    if (last.empty()) last = "[invalid]";
  }
  out["flexible-extract"] = py_strip(last);
  return out;
}

// exact_match with ignore_case and regexes_to_ignore [",", "\$", "(?s).*#### ", "\.$"] on both.
bool gsm8k_exact_match(const std::string& pred, const std::string& ref) {
  static const std::vector<std::regex> ignore = {std::regex(","), std::regex("\\$"),
                                                 std::regex("[\\s\\S]*#### "), std::regex("\\.$")};
  auto norm = [&](std::string s) {
    for (const auto& r : ignore) s = std::regex_replace(s, r, "");
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  };
  return norm(pred) == norm(ref);
}

}  // namespace scalesweep::pipeline::detail
