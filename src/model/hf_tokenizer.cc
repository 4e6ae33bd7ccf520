// Hugging Face tokenizer.json BPE tokenizers: parsing, writing, encoding, decoding.
#include "scalesweep/model/hf_tokenizer.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <queue>
#include <sstream>
#include <stdexcept>
#include <tuple>

#include "model/hf_tokenizer_internal.h"

namespace scalesweep::model {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;
namespace fs = std::filesystem;
namespace bd = bpe_detail;

const char* const kMeta = "\xE2\x96\x81";  // U+2581 "▁"

// The pre-tokenizer regexes recognized by their text.
const char* const kGpt2Regex =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
const char* const kLlama3Head = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|";
const char* const kLlama3Tail = "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

[[noreturn]] void fail(const std::string& name, const std::string& what) {
  throw std::runtime_error(name + ": " + what);
}

// The largest token id accepted (a sanity bound on the vocabulary size).
constexpr int64_t kMaxTokenId = 50'000'000;

// A token id: a JSON integer in [0, kMaxTokenId], or nullopt. (nlohmann's get<int> of a float
// beyond int's range is undefined behaviour, and of a wider integer wraps.)
std::optional<int> token_id_of(const json& v) {
  if (!v.is_number_integer()) return std::nullopt;
  if (v.is_number_unsigned())
    return v.get<uint64_t>() <= static_cast<uint64_t>(kMaxTokenId)
               ? std::optional<int>(static_cast<int>(v.get<uint64_t>()))
               : std::nullopt;
  const int64_t x = v.get<int64_t>();
  return x >= 0 && x <= kMaxTokenId ? std::optional<int>(static_cast<int>(x)) : std::nullopt;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error(path + ": cannot open file");
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) throw std::runtime_error(path + ": read error");
  return ss.str();
}

bool get_bool(const json& o, const char* key, bool dflt) {
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return dflt;
  if (!it->is_boolean()) throw std::runtime_error(std::string("field '") + key + "' is not a bool");
  return it->get<bool>();
}

std::string get_str(const json& o, const char* key) {
  auto it = o.find(key);
  if (it == o.end() || !it->is_string())
    throw std::runtime_error(std::string("field '") + key + "' missing or not a string");
  return it->get<std::string>();
}

// A token given as "text" or {"content": "text"} (tokenizer_config.json); "" for null.
std::string token_name(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string())
    return v["content"].get<std::string>();
  return "";
}

std::string replace_all(std::string s, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    if (s.compare(i, from.size(), from) == 0) {
      out += to;
      i += from.size();
    } else {
      out += s[i++];
    }
  }
  return out;
}

struct ParseState {
  bool byte_level = false, use_regex_gpt2 = false, have_split = false;
  bool prepend_norm = false, replace_norm = false, metaspace = false, nfc = false;
};

void parse_normalizer(const json& n, ParseState& st, const std::string& name) {
  if (n.is_null()) return;
  const std::string type = get_str(n, "type");
  if (type == "Sequence") {
    for (const auto& c : n.at("normalizers")) parse_normalizer(c, st, name);
  } else if (type == "Prepend") {
    if (get_str(n, "prepend") != kMeta)
      fail(name, "normalizer Prepend of '" + get_str(n, "prepend") + "' is not supported");
    st.prepend_norm = true;
  } else if (type == "Replace") {
    const json& p = n.at("pattern");
    if (!p.contains("String") || p["String"] != " " || get_str(n, "content") != kMeta)
      fail(name, "normalizer Replace is only supported as ' ' -> '\xE2\x96\x81', got " + n.dump());
    st.replace_norm = true;
  } else if (type == "NFC") {
    st.nfc = true;
  } else {
    fail(name, "unsupported normalizer type '" + type + "'");
  }
}

void parse_pre_tokenizer(const json& p, ParseState& st, BpeSpec& spec, const std::string& name) {
  if (p.is_null()) return;
  const std::string type = get_str(p, "type");
  if (type == "Sequence") {
    for (const auto& c : p.at("pretokenizers")) parse_pre_tokenizer(c, st, spec, name);
  } else if (type == "ByteLevel") {
    st.byte_level = true;
    spec.add_prefix_space = get_bool(p, "add_prefix_space", false);
    if (get_bool(p, "use_regex", true)) st.use_regex_gpt2 = true;
  } else if (type == "Split") {
    const json& pat = p.at("pattern");
    if (!pat.contains("Regex") || !pat["Regex"].is_string())
      fail(name, "pre-tokenizer Split needs a Regex pattern, got " + pat.dump());
    const std::string behavior = p.value("behavior", "Isolated");
    if (behavior != "Isolated" || get_bool(p, "invert", false))
      fail(name, "pre-tokenizer Split: only behavior Isolated without invert is supported");
    const std::string re = pat["Regex"].get<std::string>();
    const std::string head = kLlama3Head, tail = kLlama3Tail;
    if (re == kGpt2Regex) {
      spec.split = SplitRegex::kGpt2;
    } else if (re.size() > head.size() + tail.size() && re.starts_with(head) &&
               re.ends_with(tail)) {
      const std::string digits = re.substr(head.size(), re.size() - head.size() - tail.size());
      int k = -1;
      if (digits == "\\p{N}")
        k = 1;
      else if (digits == "\\p{N}+")
        k = 0;
      else if (std::sscanf(digits.c_str(), "\\p{N}{1,%d}", &k) != 1 || k < 1 ||
               digits != "\\p{N}{1," + std::to_string(k) + "}")
        k = -1;
      if (k < 0) fail(name, "unsupported pre-tokenizer regex '" + re + "'");
      spec.split = SplitRegex::kLlama3;
      spec.max_digits = k;
    } else {
      fail(name, "unsupported pre-tokenizer regex '" + re +
                     "' (supported: the GPT-2, Llama-3 and Qwen2 patterns)");
    }
    st.have_split = true;
  } else if (type == "Digits") {
    if (!get_bool(p, "individual_digits", false))
      fail(name, "pre-tokenizer Digits is only supported with individual_digits=true");
    spec.split_digits = true;
  } else if (type == "Metaspace") {
    if (p.value("replacement", std::string(kMeta)) != kMeta)
      fail(name, "pre-tokenizer Metaspace with a replacement other than U+2581");
    st.metaspace = true;
    spec.metaspace = true;
    spec.metaspace_split = get_bool(p, "split", true);
    if (p.contains("prepend_scheme") && p["prepend_scheme"].is_string()) {
      const std::string s = p["prepend_scheme"].get<std::string>();
      spec.prepend = s == "always"  ? PrependScheme::kAlways
                     : s == "first" ? PrependScheme::kFirst
                     : s == "never" ? PrependScheme::kNever
                                    : (fail(name, "unknown Metaspace prepend_scheme '" + s + "'"),
                                       PrependScheme::kNever);
    } else {
      spec.prepend =
          get_bool(p, "add_prefix_space", true) ? PrependScheme::kAlways : PrependScheme::kNever;
    }
  } else {
    fail(name, "unsupported pre-tokenizer type '" + type + "'");
  }
}

void parse_post_processor(const json& p, BpeSpec& spec,
                          const std::unordered_map<std::string, int>& ids,
                          const std::string& name) {
  if (p.is_null() || !p.is_object()) return;
  const std::string type = p.value("type", "");
  if (type == "Sequence" && p.contains("processors")) {
    for (const auto& c : p["processors"]) parse_post_processor(c, spec, ids, name);
    return;
  }
  if (type != "TemplateProcessing" || !p.contains("single")) return;
  bool seen_seq = false;
  for (const auto& item : p["single"]) {
    if (item.contains("Sequence")) {
      seen_seq = true;
    } else if (item.contains("SpecialToken")) {
      const std::string tok = item["SpecialToken"].value("id", "");
      int id = -1;
      if (p.contains("special_tokens") && p["special_tokens"].contains(tok) &&
          !p["special_tokens"][tok].value("ids", json::array()).empty()) {
        const json& v = p["special_tokens"][tok]["ids"][0];
        const std::optional<int> valid = token_id_of(v);
        if (!valid)
          fail(name, "post_processor special token '" + tok + "' has id " + v.dump() +
                         ", not a token id");
        id = *valid;
      } else if (auto it = ids.find(tok); it != ids.end())
        id = it->second;
      if (id < 0) continue;
      if (!seen_seq)
        spec.bos_id = id, spec.add_bos = true;
      else
        spec.eos_id = id, spec.add_eos = true;
    }
  }
}

// Text of a token: an added token's content, else the model vocabulary entry.
std::string token_text(const BpeSpec& spec, int id) {
  for (const auto& a : spec.added)
    if (a.id == id) return a.content;
  return spec.vocab.at(static_cast<size_t>(id));
}

int find_id(const std::unordered_map<std::string, int>& ids, const std::string& tok) {
  auto it = ids.find(tok);
  return it == ids.end() ? -1 : it->second;
}

// The model object's checks: BPE, none of the options this tokenizer does not implement, a
// vocabulary.
void check_bpe_model(const json& m, const std::string& name) {
  const std::string type = m.value("type", "BPE");
  if (type != "BPE") fail(name, "unsupported tokenizer model type '" + type + "' (only BPE)");
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (m.contains(k) && m[k].is_string() && !m[k].get<std::string>().empty())
      fail(name, std::string("BPE ") + k + " is not supported");
  if (m.contains("dropout") && m["dropout"].is_number() && m["dropout"].get<double>() > 0)
    fail(name, "BPE dropout is not supported");
  if (!m.contains("vocab") || !m["vocab"].is_object()) fail(name, "model.vocab missing");
}

// spec.vocab and spec.added from model.vocab and added_tokens; returns every token's id by
// name (the added tokens included, for the BOS/EOS names).
std::unordered_map<std::string, int> read_vocab(const json& j, const json& m, BpeSpec& spec,
                                                const std::string& name) {
  std::unordered_map<std::string, int> ids;
  int max_id = -1;
  for (auto it = m["vocab"].begin(); it != m["vocab"].end(); ++it) {
    if (!it.value().is_number_integer()) fail(name, "vocab id of '" + it.key() + "' not an int");
    const std::optional<int> valid = token_id_of(it.value());
    if (!valid) fail(name, "vocab id " + it.value().dump() + " out of range");
    const int id = *valid;
    ids[it.key()] = id;
    max_id = std::max(max_id, id);
  }
  if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
    for (const auto& a : j["added_tokens"]) {
      HfAddedToken t;
      const std::optional<int> id = token_id_of(a.at("id"));
      t.id = id.value_or(-1);
      t.content = get_str(a, "content");
      if (!id || t.content.empty()) fail(name, "added token " + a.dump() + " is invalid");
      t.special = get_bool(a, "special", false);
      t.lstrip = get_bool(a, "lstrip", false);
      t.rstrip = get_bool(a, "rstrip", false);
      t.single_word = get_bool(a, "single_word", false);
      t.normalized = get_bool(a, "normalized", false);
      spec.added.push_back(t);
      max_id = std::max(max_id, t.id);
    }
  }
  spec.vocab.assign(static_cast<size_t>(max_id + 1), std::string());
  for (const auto& [tok, id] : ids) spec.vocab[static_cast<size_t>(id)] = tok;
  for (const auto& a : spec.added) {
    const auto& v = spec.vocab[static_cast<size_t>(a.id)];
    if (!v.empty() && v != a.content)
      fail(name, "added token " + std::to_string(a.id) + " '" + a.content +
                     "' conflicts with vocab entry '" + v + "'");
    ids.emplace(a.content, a.id);  // for BOS/EOS names; the model vocab stays as it is
  }
  return ids;
}

// spec.merges from model.merges, each "a b" or ["a", "b"].
void read_merges(const json& m, BpeSpec& spec, const std::string& name) {
  if (!m.contains("merges") || !m["merges"].is_array()) return;
  spec.merges.reserve(m["merges"].size());
  size_t idx = 0;
  for (const auto& mg : m["merges"]) {
    std::pair<std::string, std::string> pr;
    if (mg.is_string()) {
      const std::string s = mg.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        fail(name, "merge " + std::to_string(idx) + " '" + s + "' is not 'a b'");
      pr = {s.substr(0, sp), s.substr(sp + 1)};
    } else if (mg.is_array() && mg.size() == 2 && mg[0].is_string() && mg[1].is_string()) {
      pr = {mg[0].get<std::string>(), mg[1].get<std::string>()};
    } else {
      fail(name, "merge " + std::to_string(idx) + " is malformed: " + mg.dump());
    }
    spec.merges.push_back(std::move(pr));
    ++idx;
  }
}

// The BPE flavour from the normalizer and pre-tokenizer seen: byte-level or SentencePiece
// style; the combinations this tokenizer does not implement refused.
void choose_flavor(const ParseState& st, BpeSpec& spec, const std::string& name) {
  if (st.byte_level) {
    spec.flavor = BpeFlavor::kByteLevel;
    if (st.have_split && st.use_regex_gpt2)
      fail(name, "a Split regex followed by ByteLevel(use_regex=true) is not supported");
    if (spec.add_prefix_space && (st.have_split || spec.split_digits))
      fail(name, "ByteLevel add_prefix_space after a Split/Digits pre-tokenizer is not supported");
    if (!st.have_split) spec.split = st.use_regex_gpt2 ? SplitRegex::kGpt2 : SplitRegex::kNone;
    if (st.replace_norm || st.metaspace)
      fail(name, "mixes ByteLevel with SentencePiece-style normalization");
  } else if (st.replace_norm || st.metaspace) {
    spec.flavor = BpeFlavor::kSentencePiece;
    spec.split = SplitRegex::kNone;
    if (!st.metaspace)
      spec.prepend = st.prepend_norm ? PrependScheme::kAlways : PrependScheme::kNever;
  } else {
    fail(name,
         "cannot tell the BPE flavour: neither a ByteLevel pre-tokenizer nor "
         "SentencePiece-style '\xE2\x96\x81' handling (Replace normalizer or Metaspace)");
  }
}

}  // namespace

BpeSpec parse_tokenizer_json(std::string_view text, const std::string& name) {
  json j;
  try {
    j = json::parse(text);
  } catch (const std::exception& e) {
    fail(name, std::string("invalid JSON: ") + e.what());
  }
  if (!j.is_object() || !j.contains("model") || !j["model"].is_object())
    fail(name, "not a tokenizer.json (no 'model' object)");
  BpeSpec spec;
  ParseState st;
  try {
    const json& m = j["model"];
    check_bpe_model(m, name);
    const std::unordered_map<std::string, int> ids = read_vocab(j, m, spec, name);
    read_merges(m, spec, name);
    spec.byte_fallback = get_bool(m, "byte_fallback", false);
    spec.fuse_unk = get_bool(m, "fuse_unk", false);
    spec.ignore_merges = get_bool(m, "ignore_merges", false);
    if (m.contains("unk_token") && m["unk_token"].is_string()) {
      spec.unk_id = find_id(ids, m["unk_token"].get<std::string>());
      if (spec.unk_id < 0)
        fail(name,
             "unk_token '" + m["unk_token"].get<std::string>() + "' is not in the vocabulary");
    }
    parse_normalizer(j.value("normalizer", json()), st, name);
    parse_pre_tokenizer(j.value("pre_tokenizer", json()), st, spec, name);
    spec.nfc = st.nfc;
    parse_post_processor(j.value("post_processor", json()), spec, ids, name);
    // Without a template: the usual names of BOS/EOS (tokenizer_config.json may override).
    if (spec.bos_id < 0)
      for (const char* t : {"<s>", "<|begin_of_text|>"})
        if (spec.bos_id < 0) spec.bos_id = find_id(ids, t);
    if (spec.eos_id < 0)
      for (const char* t : {"</s>", "<|end_of_text|>", "<|endoftext|>"})
        if (spec.eos_id < 0) spec.eos_id = find_id(ids, t);
    choose_flavor(st, spec, name);
  } catch (const json::exception& e) {
    fail(name, std::string("malformed tokenizer.json: ") + e.what());
  }
  return spec;
}

BpeSpec load_tokenizer_json(const std::string& path) {
  fs::path p(path);
  if (fs::is_directory(p)) p /= "tokenizer.json";
  if (!fs::exists(p)) throw std::runtime_error(p.string() + ": no such file");
  BpeSpec spec = parse_tokenizer_json(read_file(p.string()), p.string());
  std::unordered_map<std::string, int> ids;
  for (size_t i = 0; i < spec.vocab.size(); ++i)
    if (!spec.vocab[i].empty()) ids.emplace(spec.vocab[i], static_cast<int>(i));
  for (const auto& a : spec.added) ids.emplace(a.content, a.id);
  const fs::path cfg = p.parent_path() / "tokenizer_config.json";
  if (fs::exists(cfg)) {
    json c;
    try {
      c = json::parse(read_file(cfg.string()));
    } catch (const json::exception& e) {
      throw std::runtime_error(cfg.string() + ": invalid JSON: " + e.what());
    }
    if (c.contains("bos_token")) {
      const std::string t = token_name(c["bos_token"]);
      spec.bos_id = t.empty() ? -1 : find_id(ids, t);
      if (!t.empty() && spec.bos_id < 0)
        throw std::runtime_error(cfg.string() + ": bos_token '" + t + "' is not in the vocabulary");
    }
    if (c.contains("eos_token")) {
      const std::string t = token_name(c["eos_token"]);
      spec.eos_id = t.empty() ? -1 : find_id(ids, t);
      if (!t.empty() && spec.eos_id < 0)
        throw std::runtime_error(cfg.string() + ": eos_token '" + t + "' is not in the vocabulary");
    }
    if (c.contains("pad_token")) {
      const std::string t = token_name(c["pad_token"]);
      spec.pad_id = t.empty() ? -1 : find_id(ids, t);
      if (!t.empty() && spec.pad_id < 0)
        throw std::runtime_error(cfg.string() + ": pad_token '" + t + "' is not in the vocabulary");
    }
    if (c.contains("add_bos_token") && c["add_bos_token"].is_boolean())
      spec.add_bos = c["add_bos_token"].get<bool>();
    if (c.contains("add_eos_token") && c["add_eos_token"].is_boolean())
      spec.add_eos = c["add_eos_token"].get<bool>();
    if (c.contains("chat_template")) {
      const json& t = c["chat_template"];
      if (t.is_string()) {
        spec.chat_template = t.get<std::string>();
      } else if (t.is_array()) {  // [{"name": ..., "template": ...}]: transformers' "default"
        for (const json& e : t)
          if (e.is_object() && e.value("name", "") == "default" && e.contains("template") &&
              e["template"].is_string())
            spec.chat_template = e["template"].get<std::string>();
      }
    }
  }
  // transformers reads chat_template.jinja in preference to tokenizer_config.json's.
  const fs::path jinja = p.parent_path() / "chat_template.jinja";
  if (fs::exists(jinja)) spec.chat_template = read_file(jinja.string());
  return spec;
}

std::string HfBpeTokenizer::token_text(int id) const {
  if (id < 0 || id >= vocab_size_) return {};
  for (const auto& a : spec_.added)
    if (a.id == id) return a.content;
  return static_cast<size_t>(id) < spec_.vocab.size() ? spec_.vocab[id] : std::string();
}

std::string tokenizer_json_string(const BpeSpec& spec) {
  ordered_json j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  ordered_json added = ordered_json::array();
  for (const auto& a : spec.added)
    added.push_back({{"id", a.id},
                     {"content", a.content},
                     {"single_word", a.single_word},
                     {"lstrip", a.lstrip},
                     {"rstrip", a.rstrip},
                     {"normalized", a.normalized},
                     {"special", a.special}});
  j["added_tokens"] = added;
  const bool sp = spec.flavor == BpeFlavor::kSentencePiece;
  if (sp && !spec.metaspace) {
    ordered_json seq = ordered_json::array();
    if (spec.nfc) seq.push_back({{"type", "NFC"}});
    if (spec.prepend != PrependScheme::kNever)
      seq.push_back({{"type", "Prepend"}, {"prepend", kMeta}});
    seq.push_back({{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kMeta}});
    j["normalizer"] = {{"type", "Sequence"}, {"normalizers", seq}};
    j["pre_tokenizer"] = nullptr;
  } else if (sp) {
    j["normalizer"] = spec.nfc ? ordered_json{{"type", "NFC"}} : ordered_json(nullptr);
    j["pre_tokenizer"] = {{"type", "Metaspace"},
                          {"replacement", kMeta},
                          {"prepend_scheme", spec.prepend == PrependScheme::kAlways  ? "always"
                                             : spec.prepend == PrependScheme::kFirst ? "first"
                                                                                     : "never"},
                          {"split", spec.metaspace_split}};
  } else {
    j["normalizer"] = spec.nfc ? ordered_json{{"type", "NFC"}} : ordered_json(nullptr);
    ordered_json seq = ordered_json::array();
    if (spec.split_digits) seq.push_back({{"type", "Digits"}, {"individual_digits", true}});
    if (spec.split == SplitRegex::kLlama3) {
      const std::string digits = spec.max_digits == 0 ? "\\p{N}+"
                                 : spec.max_digits == 1
                                     ? "\\p{N}"
                                     : "\\p{N}{1," + std::to_string(spec.max_digits) + "}";
      seq.push_back({{"type", "Split"},
                     {"pattern", {{"Regex", std::string(kLlama3Head) + digits + kLlama3Tail}}},
                     {"behavior", "Isolated"},
                     {"invert", false}});
    }
    seq.push_back({{"type", "ByteLevel"},
                   {"add_prefix_space", spec.add_prefix_space},
                   {"trim_offsets", true},
                   {"use_regex", spec.split == SplitRegex::kGpt2}});
    j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", seq}};
  }
  // Post-processor: BOS/EOS template when the spec asks for them.
  {
    ordered_json single = ordered_json::array(), pair = ordered_json::array();
    ordered_json specials = ordered_json::object();
    const auto tok = [&](int id) { return token_text(spec, id); };
    const auto add_special = [&](int id, ordered_json& arr, int type_id) {
      arr.push_back({{"SpecialToken", {{"id", tok(id)}, {"type_id", type_id}}}});
      specials[tok(id)] = {{"id", tok(id)}, {"ids", {id}}, {"tokens", {tok(id)}}};
    };
    const bool bos = spec.add_bos && spec.bos_id >= 0, eos = spec.add_eos && spec.eos_id >= 0;
    if (bos) add_special(spec.bos_id, single, 0), add_special(spec.bos_id, pair, 0);
    single.push_back({{"Sequence", {{"id", "A"}, {"type_id", 0}}}});
    pair.push_back({{"Sequence", {{"id", "A"}, {"type_id", 0}}}});
    if (eos) add_special(spec.eos_id, single, 0), add_special(spec.eos_id, pair, 0);
    if (bos) add_special(spec.bos_id, pair, 1);
    pair.push_back({{"Sequence", {{"id", "B"}, {"type_id", 1}}}});
    if (eos) add_special(spec.eos_id, pair, 1);
    j["post_processor"] = {{"type", "TemplateProcessing"},
                           {"single", single},
                           {"pair", pair},
                           {"special_tokens", specials}};
  }
  if (sp) {
    ordered_json dec = ordered_json::array();
    dec.push_back({{"type", "Replace"}, {"pattern", {{"String", kMeta}}}, {"content", " "}});
    if (spec.byte_fallback) dec.push_back({{"type", "ByteFallback"}});
    dec.push_back({{"type", "Fuse"}});
    if (spec.prepend != PrependScheme::kNever)
      dec.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
    j["decoder"] = {{"type", "Sequence"}, {"decoders", dec}};
  } else {
    j["decoder"] = {{"type", "ByteLevel"},
                    {"add_prefix_space", true},
                    {"trim_offsets", true},
                    {"use_regex", true}};
  }
  ordered_json model;
  model["type"] = "BPE";
  model["dropout"] = nullptr;
  model["unk_token"] =
      spec.unk_id >= 0 ? ordered_json(token_text(spec, spec.unk_id)) : ordered_json(nullptr);
  model["continuing_subword_prefix"] = nullptr;
  model["end_of_word_suffix"] = nullptr;
  model["fuse_unk"] = spec.fuse_unk;
  model["byte_fallback"] = spec.byte_fallback;
  model["ignore_merges"] = spec.ignore_merges;
  ordered_json vocab = ordered_json::object();
  std::vector<char> is_added(spec.vocab.size(), 0);
  for (const auto& a : spec.added)
    if (a.id >= 0 && static_cast<size_t>(a.id) < is_added.size()) is_added[a.id] = 1;
  for (size_t i = 0; i < spec.vocab.size(); ++i)
    if (!spec.vocab[i].empty()) vocab[spec.vocab[i]] = static_cast<int>(i);
  model["vocab"] = vocab;
  ordered_json merges = ordered_json::array();
  for (const auto& [a, b] : spec.merges) {
    if (a.find(' ') == std::string::npos && b.find(' ') == std::string::npos)
      merges.push_back(a + " " + b);
    else
      merges.push_back({a, b});
  }
  model["merges"] = merges;
  j["model"] = model;
  return j.dump(1) + "\n";
}

std::string tokenizer_config_json_string(const BpeSpec& spec, int model_max_length) {
  ordered_json c;
  const auto name = [&](int id) {
    return id >= 0 ? ordered_json(token_text(spec, id)) : ordered_json(nullptr);
  };
  c["add_bos_token"] = spec.add_bos;
  c["add_eos_token"] = spec.add_eos;
  c["bos_token"] = name(spec.bos_id);
  c["eos_token"] = name(spec.eos_id);
  c["unk_token"] = name(spec.unk_id);
  if (spec.pad_id >= 0) c["pad_token"] = name(spec.pad_id);
  c["clean_up_tokenization_spaces"] = false;
  c["model_max_length"] = model_max_length;
  c["tokenizer_class"] =
      spec.flavor == BpeFlavor::kSentencePiece ? "LlamaTokenizerFast" : "PreTrainedTokenizerFast";
  if (spec.flavor == BpeFlavor::kSentencePiece) c["legacy"] = true;
  if (!spec.chat_template.empty()) c["chat_template"] = spec.chat_template;
  return c.dump(2) + "\n";
}

BpeSpec sentencepiece_spec_from_llama2c(const std::vector<std::string>& pieces,
                                        const std::vector<float>& scores) {
  const size_t n = pieces.size();
  if (scores.size() != n)
    throw std::runtime_error("llama2.c vocabulary: scores/pieces size mismatch");
  if (n < 259)
    throw std::runtime_error("llama2.c vocabulary has " + std::to_string(n) +
                             " tokens; a SentencePiece byte-fallback vocabulary needs >= 259");
  BpeSpec spec;
  spec.flavor = BpeFlavor::kSentencePiece;
  spec.split = SplitRegex::kNone;
  spec.vocab.resize(n);
  spec.vocab[0] = "<unk>";
  spec.vocab[1] = "<s>";
  spec.vocab[2] = "</s>";
  for (int b = 0; b < 256; ++b) {
    char want[8];
    std::snprintf(want, sizeof want, "<0x%02X>", b);
    if (pieces[3 + b] != want)
      throw std::runtime_error("llama2.c vocabulary: token " + std::to_string(3 + b) + " is '" +
                               pieces[3 + b] + "', expected byte token " + want);
    spec.vocab[3 + b] = want;
  }
  std::unordered_map<std::string, int> ids;
  for (size_t i = 0; i < n; ++i) {
    if (i >= 259) {
      if (pieces[i].empty())
        throw std::runtime_error("llama2.c vocabulary: token " + std::to_string(i) + " is empty");
      spec.vocab[i] = replace_all(pieces[i], " ", kMeta);
    }
    auto [it, fresh] = ids.emplace(spec.vocab[i], static_cast<int>(i));
    if (!fresh)
      throw std::runtime_error("llama2.c vocabulary: tokens " + std::to_string(it->second) +
                               " and " + std::to_string(i) + " are both '" + spec.vocab[i] + "'");
  }
  struct Cand {
    float score;
    size_t id, split;
  };
  std::vector<Cand> cands;
  for (size_t i = 259; i < n; ++i) {
    const std::string& p = spec.vocab[i];
    for (size_t k = 1; k < p.size(); ++k) {
      if ((static_cast<uint8_t>(p[k]) & 0xC0) == 0x80) continue;  // inside a code point
      auto l = ids.find(p.substr(0, k)), r = ids.find(p.substr(k));
      if (l != ids.end() && r != ids.end() && l->second >= 259 && r->second >= 259)
        cands.push_back({scores[i], i, k});
    }
  }
  std::stable_sort(cands.begin(), cands.end(), [](const Cand& a, const Cand& b) {
    return std::tie(b.score, a.id, a.split) < std::tie(a.score, b.id, b.split);
  });
  for (const auto& c : cands)
    spec.merges.emplace_back(spec.vocab[c.id].substr(0, c.split), spec.vocab[c.id].substr(c.split));
  for (int i = 0; i < 3; ++i) {
    HfAddedToken t;
    t.id = i;
    t.content = spec.vocab[i];
    t.special = true;
    spec.added.push_back(t);
  }
  spec.byte_fallback = true;
  spec.fuse_unk = true;
  spec.prepend = PrependScheme::kAlways;
  spec.unk_id = 0;
  spec.bos_id = 1;
  spec.eos_id = 2;
  spec.add_bos = true;
  return spec;
}

// ---------------------------------------------------------------------------------------------

HfBpeTokenizer::HfBpeTokenizer(BpeSpec spec) : spec_(std::move(spec)) {
  std::fill(std::begin(byte_ids_), std::end(byte_ids_), -1);
  std::fill(std::begin(added_first_), std::end(added_first_), 0);
  vocab_size_ = static_cast<int>(spec_.vocab.size());
  for (const auto& a : spec_.added) vocab_size_ = std::max(vocab_size_, a.id + 1);
  if (vocab_size_ == 0) throw std::runtime_error("tokenizer: empty vocabulary");
  for (size_t i = 0; i < spec_.vocab.size(); ++i)
    if (!spec_.vocab[i].empty()) ids_.emplace(spec_.vocab[i], static_cast<int>(i));
  for (const auto& a : spec_.added) added_ids_.emplace(a.content, a.id);
  const auto id_of = [&](const std::string& t) { return model_id(t); };
  merges_.reserve(spec_.merges.size());
  for (size_t r = 0; r < spec_.merges.size(); ++r) {
    const auto& [a, b] = spec_.merges[r];
    const int ia = id_of(a), ib = id_of(b), ic = id_of(a + b);
    if (ia < 0 || ib < 0 || ic < 0)
      throw std::runtime_error("tokenizer: merge " + std::to_string(r) + " '" + a + " " + b +
                               "' uses a token missing from the vocabulary ('" +
                               (ia < 0   ? a
                                : ib < 0 ? b
                                         : a + b) +
                               "')");
    const uint64_t key =
        (static_cast<uint64_t>(static_cast<uint32_t>(ia)) << 32) | static_cast<uint32_t>(ib);
    merges_.emplace(key, MergeInfo{static_cast<int>(r), ic});  // first (lowest rank) wins
  }
  for (int id : {spec_.bos_id, spec_.eos_id, spec_.unk_id})
    if (id >= vocab_size_)
      throw std::runtime_error("tokenizer: special id " + std::to_string(id) + " >= vocab size");
  if (spec_.flavor == BpeFlavor::kSentencePiece && spec_.byte_fallback) {
    for (int b = 0; b < 256; ++b) {
      char t[8];
      std::snprintf(t, sizeof t, "<0x%02X>", b);
      byte_ids_[b] = id_of(t);
    }
  }
  // Decoded bytes of every id.
  id_bytes_.assign(static_cast<size_t>(vocab_size_), std::string());
  is_special_.assign(static_cast<size_t>(vocab_size_), 0);
  uint32_t inv[512];
  std::fill(std::begin(inv), std::end(inv), 0xFFFFFFFFu);
  const uint32_t* b2u = bd::byte_to_unicode();
  for (int b = 0; b < 256; ++b) inv[b2u[b]] = static_cast<uint32_t>(b);
  for (size_t i = 0; i < spec_.vocab.size(); ++i) {
    const std::string& t = spec_.vocab[i];
    std::string& out = id_bytes_[i];
    if (spec_.flavor == BpeFlavor::kByteLevel) {
      for (size_t k = 0; k < t.size();) {
        int len = 1;
        const uint32_t cp = bd::decode_utf8(t, k, &len);
        if (cp < 512 && inv[cp] != 0xFFFFFFFFu)
          out += static_cast<char>(inv[cp]);
        else
          out.append(t, k, static_cast<size_t>(len));
        k += static_cast<size_t>(len);
      }
    } else {
      out = replace_all(t, kMeta, " ");
    }
  }
  for (int b = 0; b < 256; ++b)
    if (byte_ids_[b] >= 0)
      id_bytes_[static_cast<size_t>(byte_ids_[b])] = std::string(1, static_cast<char>(b));
  for (size_t k = 0; k < spec_.added.size(); ++k) {
    const HfAddedToken& a = spec_.added[k];
    id_bytes_[static_cast<size_t>(a.id)] = a.content;
    is_special_[static_cast<size_t>(a.id)] = a.special ? 1 : 0;
    added_sorted_.push_back(k);
    added_first_[static_cast<uint8_t>(a.content[0])] = 1;
  }
  std::stable_sort(added_sorted_.begin(), added_sorted_.end(), [&](size_t a, size_t b) {
    return spec_.added[a].content.size() > spec_.added[b].content.size();
  });
}

int HfBpeTokenizer::token_id(std::string_view token) const {
  if (int id = model_id(token); id >= 0) return id;
  auto it = added_ids_.find(std::string(token));
  return it == added_ids_.end() ? -1 : it->second;
}

int HfBpeTokenizer::model_id(std::string_view token) const {
  auto it = ids_.find(std::string(token));
  return it == ids_.end() ? -1 : it->second;
}

void HfBpeTokenizer::sp_symbol(std::string_view ch, std::vector<int>& syms) const {
  if (int id = model_id(ch); id >= 0) {
    syms.push_back(id);
    return;
  }
  if (spec_.byte_fallback) {
    bool all = true;
    for (char c : ch) all = all && byte_ids_[static_cast<uint8_t>(c)] >= 0;
    if (all) {
      for (char c : ch) syms.push_back(byte_ids_[static_cast<uint8_t>(c)]);
      return;
    }
  }
  if (spec_.unk_id < 0)
    throw std::runtime_error("tokenizer: '" + std::string(ch) +
                             "' is not in the vocabulary and there is no unk token");
  if (spec_.fuse_unk && !syms.empty() && syms.back() == spec_.unk_id) return;
  syms.push_back(spec_.unk_id);
}

void HfBpeTokenizer::bpe_word(std::string_view word, std::vector<int>& out) const {
  if (word.empty()) return;
  if (spec_.ignore_merges) {
    if (int id = model_id(word); id >= 0) {
      out.push_back(id);
      return;
    }
  }
  std::vector<int> ids;
  for (size_t i = 0; i < word.size();) {
    int len = 1;
    bd::decode_utf8(word, i, &len);
    sp_symbol(word.substr(i, static_cast<size_t>(len)), ids);
    i += static_cast<size_t>(len);
  }
  struct Sym {
    int id, prev, next;
    bool alive;
  };
  const int n = static_cast<int>(ids.size());
  std::vector<Sym> s(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) s[i] = {ids[i], i - 1, i + 1 < n ? i + 1 : -1, true};
  using Entry = std::tuple<int, int, int>;  // rank, pos, new_id
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> q;
  const auto lookup = [&](int a, int b) -> const MergeInfo* {
    auto it = merges_.find((static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) |
                           static_cast<uint32_t>(b));
    return it == merges_.end() ? nullptr : &it->second;
  };
  for (int i = 0; i + 1 < n; ++i)
    if (auto* m = lookup(s[i].id, s[i + 1].id)) q.emplace(m->rank, i, m->new_id);
  while (!q.empty()) {
    const auto [rank, pos, new_id] = q.top();
    q.pop();
    (void)rank;
    Sym& l = s[pos];
    if (!l.alive || l.next < 0) continue;
    Sym& r = s[l.next];
    const MergeInfo* m = lookup(l.id, r.id);
    if (!m || m->new_id != new_id) continue;
    l.id = new_id;
    r.alive = false;
    l.next = r.next;
    if (r.next >= 0) s[r.next].prev = pos;
    if (l.prev >= 0)
      if (auto* m2 = lookup(s[l.prev].id, l.id)) q.emplace(m2->rank, l.prev, m2->new_id);
    if (l.next >= 0)
      if (auto* m2 = lookup(l.id, s[l.next].id)) q.emplace(m2->rank, pos, m2->new_id);
  }
  for (int i = 0; i >= 0 && n > 0; i = s[i].next) out.push_back(s[i].id);
}

void HfBpeTokenizer::encode_segment(std::string_view seg, bool first_segment,
                                    std::vector<int>& out) const {
  if (seg.empty()) return;
  std::string normalized;
  if (spec_.nfc) {
    normalized = bd::nfc(seg);
    seg = normalized;
  }
  if (spec_.flavor == BpeFlavor::kSentencePiece) {
    std::string s = replace_all(std::string(seg), " ", kMeta);
    const bool want = spec_.prepend == PrependScheme::kAlways ||
                      (spec_.prepend == PrependScheme::kFirst && first_segment);
    if (want && !(spec_.metaspace && s.starts_with(kMeta))) s = kMeta + s;
    if (!spec_.metaspace_split) {
      bpe_word(s, out);
      return;
    }
    size_t start = 0;
    for (size_t k = 1; k <= s.size(); ++k) {
      if (k == s.size() || s.compare(k, 3, kMeta) == 0) {
        bpe_word(std::string_view(s).substr(start, k - start), out);
        start = k;
      }
    }
    return;
  }
  std::string text(seg);
  if (spec_.add_prefix_space && !text.starts_with(' ')) text = " " + text;
  // Digits(individual_digits): every numeric code point is its own piece.
  std::vector<std::string_view> pieces;
  if (spec_.split_digits) {
    size_t start = 0;
    for (size_t i = 0; i < text.size();) {
      int len = 1;
      const uint32_t cp = bd::decode_utf8(text, i, &len);
      if (bd::is_number(cp)) {
        if (i > start) pieces.push_back(std::string_view(text).substr(start, i - start));
        pieces.push_back(std::string_view(text).substr(i, static_cast<size_t>(len)));
        start = i + static_cast<size_t>(len);
      }
      i += static_cast<size_t>(len);
    }
    if (start < text.size()) pieces.push_back(std::string_view(text).substr(start));
  } else {
    pieces.push_back(text);
  }
  const uint32_t* b2u = bd::byte_to_unicode();
  bd::SplitOptions so;
  so.llama3 = spec_.split == SplitRegex::kLlama3;
  so.max_digits = spec_.max_digits;
  std::string mapped;
  for (std::string_view piece : pieces) {
    std::vector<std::pair<size_t, size_t>> parts;
    if (spec_.split == SplitRegex::kNone)
      parts.emplace_back(0, piece.size());
    else
      parts = bd::regex_split(piece, so);
    for (auto [b, e] : parts) {
      mapped.clear();
      for (size_t k = b; k < e; ++k) bd::append_utf8(mapped, b2u[static_cast<uint8_t>(piece[k])]);
      bpe_word(mapped, out);
    }
  }
}

namespace {

bool is_word_char(uint32_t cp) { return cp == '_' || bd::is_letter(cp) || bd::is_number(cp); }

// single_word: the match [b, e) is neither preceded nor followed by a word character.
bool word_boundaries(std::string_view text, size_t b, size_t e) {
  if (b > 0) {
    size_t k = b - 1;
    while (k > 0 && (static_cast<uint8_t>(text[k]) & 0xC0) == 0x80) --k;
    int len = 1;
    if (is_word_char(bd::decode_utf8(text, k, &len))) return false;
  }
  if (e < text.size()) {
    int len = 1;
    if (is_word_char(bd::decode_utf8(text, e, &len))) return false;
  }
  return true;
}

}  // namespace

std::vector<int> HfBpeTokenizer::encode(std::string_view text, bool bos, bool eos) const {
  std::vector<int> out;
  if (bos && spec_.bos_id >= 0) out.push_back(spec_.bos_id);
  size_t seg_start = 0, pos = 0;
  const auto is_ws = [](char c) { return c == ' ' || (c >= '\t' && c <= '\r'); };
  while (pos < text.size()) {
    const HfAddedToken* hit = nullptr;
    if (!added_first_[static_cast<uint8_t>(text[pos])]) {
      ++pos;
      continue;
    }
    for (size_t k : added_sorted_) {
      const HfAddedToken* a = &spec_.added[k];
      if (text.compare(pos, a->content.size(), a->content) == 0) {
        hit = a;
        break;
      }
    }
    if (!hit) {
      ++pos;
      continue;
    }
    if (hit->single_word && !word_boundaries(text, pos, pos + hit->content.size())) {
      pos += hit->content.size();  // the rejected match is not searched again (as HF does)
      continue;
    }
    size_t seg_end = pos;
    if (hit->lstrip)
      while (seg_end > seg_start && is_ws(text[seg_end - 1])) --seg_end;
    encode_segment(text.substr(seg_start, seg_end - seg_start), seg_start == 0, out);
    out.push_back(hit->id);
    pos += hit->content.size();
    if (hit->rstrip)
      while (pos < text.size() && is_ws(text[pos])) ++pos;
    seg_start = pos;
  }
  encode_segment(text.substr(seg_start), seg_start == 0, out);
  if (eos && spec_.eos_id >= 0) out.push_back(spec_.eos_id);
  return out;
}

std::string HfBpeTokenizer::decode_token(int prev, int token) const {
  if (token < 0 || token >= vocab_size_)
    throw std::out_of_range("tokenizer: token id " + std::to_string(token) + " outside [0, " +
                            std::to_string(vocab_size_) + ")");
  if (is_special_[static_cast<size_t>(token)]) return "";
  const std::string& s = id_bytes_[static_cast<size_t>(token)];
  const bool at_start = prev < 0 || (prev == spec_.bos_id && prev >= 0);
  if (spec_.flavor == BpeFlavor::kSentencePiece && spec_.prepend != PrependScheme::kNever &&
      at_start && s.starts_with(' '))
    return s.substr(1);
  return s;
}

}  // namespace scalesweep::model
