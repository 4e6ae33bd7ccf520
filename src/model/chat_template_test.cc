// The chat-template renderer against transformers' renderings (src/model/testdata/
// chat_templates.json, checked against transformers by python/tests/test_chat_template.py),
// the recognition of template texts, the refusal of others, and where tokenizers find them.
#include "scalesweep/model/chat_template.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "scalesweep/model/hf_tokenizer.h"

namespace scalesweep::model {
namespace {

using nlohmann::json;

json fixture() {
  std::ifstream f(std::string(SS_SOURCE_DIR) + "/src/model/testdata/chat_templates.json");
  std::stringstream ss;
  ss << f.rdbuf();
  return json::parse(ss.str());
}

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t p = 0; (p = s.find(from, p)) != std::string::npos; p += to.size())
    s.replace(p, from.size(), to);
  return s;
}

TEST(ChatTemplate, RendersAsTransformers) {
  const json fx = fixture();
  std::map<std::string, json> templates;
  for (const json& t : fx["templates"]) templates[t["name"]] = t;
  ASSERT_EQ(templates.size(), 5u);
  int n = 0;
  for (const json& c : fx["cases"]) {
    const json& t = templates.at(c["template"]);
    const auto ct = recognize_chat_template(t["text"].get<std::string>(), t.value("bos_token", ""));
    ASSERT_TRUE(ct) << t["name"];
    EXPECT_EQ(ct->family, t["family"] == "llama3" ? ChatFamily::kLlama3 : ChatFamily::kChatMl);
    if (t["default_system"].is_null()) {
      EXPECT_FALSE(ct->default_system) << t["name"];
    } else {
      EXPECT_EQ(ct->default_system.value_or("(none)"), t["default_system"]) << t["name"];
    }
    std::vector<ChatMessage> m;
    for (const json& x : c["messages"]) m.push_back({x["role"], x["content"]});
    EXPECT_EQ(ct->render(m, c["add_generation_prompt"]), c["expected"].get<std::string>())
        << t["name"] << " case " << n;
    ++n;
  }
  EXPECT_EQ(n, 40);
}

TEST(ChatTemplate, NewlineSpellingsAndTrailingNewline) {
  const json fx = fixture();
  for (const json& t : fx["templates"]) {
    const std::string text = t["text"];
    const std::string bos = t.value("bos_token", "");
    // Newlines inside string literals as `\n` escapes or as real newlines (SmolLM2's GGUF has
    // real ones, Qwen2's tokenizer_config.json escapes): the same template. Qwen2.5's real
    // newlines between tags are structure and stay. With or without one trailing newline
    // (Jinja drops it).
    const std::string escaped = t["name"] == "qwen2.5" ? text : replace_all(text, "\n", "\\n");
    const std::string real = replace_all(text, "\\n", "\n");
    const std::string trailing =
        text.ends_with('\n') ? text.substr(0, text.size() - 1) : text + "\n";
    for (const std::string& v : {escaped, real, trailing}) {
      const auto ct = recognize_chat_template(v, bos);
      ASSERT_TRUE(ct) << t["name"].get<std::string>() << ": " << v;
      if (!t["default_system"].is_null()) {
        EXPECT_EQ(*ct->default_system, t["default_system"]);
      }
    }
  }
}

TEST(ChatTemplate, OtherTemplatesAreRefused) {
  const json fx = fixture();
  for (const json& t : fx["templates"]) {
    std::string text = t["text"];
    const std::string bos = t.value("bos_token", "");
    EXPECT_FALSE(recognize_chat_template(text + "x", bos)) << t["name"];
    EXPECT_FALSE(recognize_chat_template(text.substr(1), bos)) << t["name"];
    EXPECT_FALSE(recognize_chat_template(text + "\n\n", bos)) << t["name"];
    // One character changed anywhere in the message loop.
    const size_t p = text.find("message['content']") != std::string::npos
                         ? text.find("message['content']")
                         : text.find("message.content");
    ASSERT_NE(p, std::string::npos);
    text[p] = 'M';
    EXPECT_FALSE(recognize_chat_template(text, bos)) << t["name"];
  }
  // Llama-3 needs the BOS text it starts with.
  for (const json& t : fx["templates"])
    if (t["name"] == "llama3") {
      EXPECT_FALSE(recognize_chat_template(t["text"].get<std::string>(), ""));
    }
  // A default system message with a quote or backslash (escapes are not decoded here).
  const std::string smol = fx["templates"][0]["text"].get<std::string>();
  ASSERT_EQ(fx["templates"][0]["name"], "smollm2");
  EXPECT_FALSE(recognize_chat_template(replace_all(smol, "named SmolLM", "named \\'S\\'"), ""));
  // Gemma's, Mistral's, and none.
  EXPECT_FALSE(recognize_chat_template(
      "{{ bos_token }}{% for message in messages %}{{ '<start_of_turn>' + message['role'] + '\\n' "
      "+ message['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}{% if add_generation_prompt "
      "%}{{'<start_of_turn>model\\n'}}{% endif %}",
      "<bos>"));
  EXPECT_FALSE(recognize_chat_template("", ""));
  EXPECT_NE(supported_chat_templates().find("Llama-3"), std::string::npos);
}

TEST(ChatTemplate, RenderRefusesWhatTheTemplatesDoNotHandle) {
  ChatTemplate t;
  EXPECT_THROW(t.render({}, true), std::invalid_argument);
  EXPECT_THROW(t.render({{"tool", "x"}}, true), std::invalid_argument);
  EXPECT_EQ(t.render({{"user", "x"}}, false), "<|im_start|>user\nx<|im_end|>\n");
}

TEST(ChatTemplate, TokenizerCarriesTheTemplate) {
  const std::string tj = R"({
    "added_tokens": [{"id": 3, "content": "<|im_start|>", "special": true}],
    "normalizer": null,
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
                      "use_regex": true},
    "decoder": {"type": "ByteLevel"},
    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": [["a", "b"]]}})";
  const auto dir = std::filesystem::temp_directory_path() /
                   ("ss_chat_template_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tokenizer.json") << tj;
  EXPECT_EQ(load_tokenizer_json(dir.string()).chat_template, "");
  std::ofstream(dir / "tokenizer_config.json") << R"({"chat_template": "T1"})";
  EXPECT_EQ(load_tokenizer_json(dir.string()).chat_template, "T1");
  std::ofstream(dir / "tokenizer_config.json")
      << R"({"chat_template": [{"name": "tool_use", "template": "T2"},
                               {"name": "default", "template": "T3"}]})";
  const BpeSpec s = load_tokenizer_json(dir.string());
  EXPECT_EQ(s.chat_template, "T3");
  // chat_template.jinja wins over tokenizer_config.json, as in transformers.
  std::ofstream(dir / "chat_template.jinja") << "T4";
  const HfBpeTokenizer tok(load_tokenizer_json(dir.string()));
  EXPECT_EQ(tok.chat_template(), "T4");
  EXPECT_EQ(tok.token_text(3), "<|im_start|>");
  EXPECT_EQ(tok.token_text(2), "ab");
  EXPECT_EQ(tok.token_text(99), "");
  // Written back into tokenizer_config.json (HF exports).
  EXPECT_EQ(json::parse(tokenizer_config_json_string(tok.spec(), 64))["chat_template"], "T4");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace scalesweep::model
