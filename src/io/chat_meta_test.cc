#include "scalesweep/io/chat_meta.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "model/test_util.h"
#include "scalesweep/io/file.h"
#include "scalesweep/io/gguf_writer.h"

namespace scalesweep::io {
namespace {

using model::testing::TempDir;

ChatMeta full_meta() {
  ChatMeta m;
  m.chat_template = "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}";
  m.bos_id = 1;
  m.eos_ids = {2, 7};
  m.pad_id = 3;
  m.sampling.temperature = 0.7;
  m.sampling.top_p = 0.9;
  m.sampling.min_p = 0.05;
  m.sampling.repetition_penalty = 1.1;
  m.sampling.top_k = 20;
  return m;
}

TEST(ChatMeta, GgufKeysRoundTrip) {
  const ChatMeta m = full_meta();
  GgufMetadata kv;
  set_chat_meta_kv(kv, m);
  EXPECT_EQ(*gguf_get_int(kv, "tokenizer.ggml.eos_token_id", "t"), 2);
  EXPECT_EQ(*gguf_get_int(kv, "tokenizer.ggml.eot_token_id", "t"), 7);
  EXPECT_EQ(gguf_find_kv(kv, kGgufEosIdsKey), nullptr);
  EXPECT_EQ(gguf_find_kv(kv, "general.sampling.temp")->type, GgufValueType::kF32);
  // f32 storage reads back as the shortest decimal: 0.7, not 0.699999988.
  EXPECT_EQ(chat_meta_from_gguf(kv, "t"), m);
}

TEST(ChatMeta, GgufKeysThroughAFile) {
  TempDir d("ss_chat_meta_");
  const std::string path = d.sub("m.gguf");
  ChatMeta m = full_meta();
  m.eos_ids = {2, 7, 9, 11};  // more than eos/eot/eom hold: the full list key too
  GgufMetadata kv;
  set_chat_meta_kv(kv, m);
  ASSERT_NE(gguf_find_kv(kv, kGgufEosIdsKey), nullptr);
  GgufWriter w;
  for (const auto& [k, v] : kv) w.add_kv(k, v);
  w.declare("x", GgmlType::kF32, {1});
  w.open(path);
  const float x = 0;
  w.write("x", {reinterpret_cast<const uint8_t*>(&x), sizeof x});
  w.commit();
  const GgufFile f = GgufFile::open(path);
  EXPECT_EQ(*f.get_int("tokenizer.ggml.eom_token_id"), 9);
  EXPECT_EQ(chat_meta_from_gguf(f.metadata(), path), m);
}

TEST(ChatMeta, SetReplacesAndDropsStaleEndOfTurn) {
  GgufMetadata kv;
  kv.emplace_back("tokenizer.ggml.eos_token_id", gguf_value_u32(5));
  kv.emplace_back("tokenizer.ggml.eot_token_id", gguf_value_u32(6));
  kv.emplace_back("tokenizer.chat_template", gguf_value_string("old"));
  ChatMeta m;
  m.eos_ids = {4};
  m.chat_template = "new";
  set_chat_meta_kv(kv, m);
  EXPECT_EQ(kv.size(), 2u);  // replaced in place, eot removed, nothing else added
  const ChatMeta back = chat_meta_from_gguf(kv, "t");
  EXPECT_EQ(back.eos_ids, std::vector<int>{4});
  EXPECT_EQ(back.chat_template, "new");
  EXPECT_TRUE(back.sampling.empty());
}

TEST(ChatMeta, GgufEosIdsWithoutRepeats) {
  GgufMetadata kv;
  kv.emplace_back("tokenizer.ggml.eos_token_id", gguf_value_u32(5));
  kv.emplace_back("tokenizer.ggml.eot_token_id", gguf_value_u32(5));
  kv.emplace_back("tokenizer.ggml.eom_token_id", gguf_value_u32(8));
  EXPECT_EQ(chat_meta_from_gguf(kv, "t").eos_ids, (std::vector<int>{5, 8}));
}

TEST(ChatMeta, GgufErrorsNameFileAndKey) {
  GgufMetadata kv;
  kv.emplace_back("tokenizer.ggml.padding_token_id", gguf_value_i32(-3));
  try {
    chat_meta_from_gguf(kv, "x.gguf");
    FAIL();
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("x.gguf: key 'tokenizer.ggml.padding_token_id'"),
              std::string::npos)
        << e.what();
  }
  GgufMetadata kv2;
  kv2.emplace_back("general.sampling.temp", gguf_value_string("hot"));
  EXPECT_THROW(chat_meta_from_gguf(kv2, "x.gguf"), IoError);
}

TEST(ChatMeta, GenerationConfigRoundTrips) {
  ChatMeta m = full_meta();
  m.chat_template.clear();  // not a generation_config.json field
  m.sampling.do_sample = true;
  const std::string text = generation_config_json(m);
  const nlohmann::json j = nlohmann::json::parse(text);
  EXPECT_EQ(j["eos_token_id"], nlohmann::json({2, 7}));
  EXPECT_FALSE(j.contains("_from_model_config"));  // it carries real sampling defaults
  EXPECT_EQ(parse_generation_config(text, "g.json"), m);
  ChatMeta one;
  one.bos_id = 1;
  one.eos_ids = {2};
  const nlohmann::json j1 = nlohmann::json::parse(generation_config_json(one));
  EXPECT_EQ(j1["eos_token_id"], 2);  // one id: an integer, as transformers writes it
  EXPECT_EQ(j1["_from_model_config"], true);
  EXPECT_FALSE(j1.contains("pad_token_id"));
  EXPECT_EQ(parse_generation_config(generation_config_json(one), "g.json"), one);
}

TEST(ChatMeta, GenerationConfigErrorsNameFileAndField) {
  const auto msg = [](const std::string& text) {
    try {
      parse_generation_config(text, "d/generation_config.json");
    } catch (const std::runtime_error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(msg(R"({"eos_token_id": "x"})"),
            "d/generation_config.json: eos_token_id: expected an integer or a list of integers");
  EXPECT_EQ(msg(R"({"eos_token_id": [1, -2]})"),
            "d/generation_config.json: eos_token_id: expected an integer or a list of integers");
  EXPECT_EQ(msg(R"({"temperature": "hot"})"),
            "d/generation_config.json: temperature: expected a number");
  EXPECT_EQ(msg(R"({"bos_token_id": 1.5})"),
            "d/generation_config.json: bos_token_id: expected a token id (a non-negative integer)");
  EXPECT_NE(msg("{").find("d/generation_config.json: invalid JSON"), std::string::npos);
  // null means absent, as transformers writes it
  EXPECT_EQ(parse_generation_config(R"({"pad_token_id": null})", "g").pad_id, -1);
}

TEST(ChatMeta, HfDirectoryRoundTrip) {
  TempDir d("ss_chat_meta_");
  const ChatMeta m = full_meta();
  write_hf_chat_meta(d.p.string(), m);
  EXPECT_EQ(model::testing::slurp(d.sub("chat_template.jinja")), m.chat_template);
  EXPECT_EQ(chat_meta_from_hf_dir(d.p.string()), m);
  // Without a template no chat_template.jinja is written.
  TempDir e("ss_chat_meta_none_");
  ChatMeta plain;
  plain.eos_ids = {2};
  write_hf_chat_meta(e.p.string(), plain);
  EXPECT_FALSE(std::filesystem::exists(e.sub("chat_template.jinja")));
  EXPECT_EQ(chat_meta_from_hf_dir(e.p.string()), plain);
}

TEST(ChatMeta, FromTokenizerFallsBackToConfig) {
  model::Config c;
  c.bos_token_id = 1;
  c.eos_token_id = 2;
  const ChatMeta m = chat_meta_from_tokenizer(nullptr, c);
  EXPECT_EQ(m.bos_id, 1);
  EXPECT_EQ(m.eos_ids, std::vector<int>{2});
  EXPECT_TRUE(m.chat_template.empty());
}

}  // namespace
}  // namespace scalesweep::io
