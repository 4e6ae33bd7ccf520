#include "scalesweep/io/gguf_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "base/test_util.h"
#include "scalesweep/format/minifloat.h"
#include "scalesweep/io/convert.h"
#include "scalesweep/io/gguf_writer.h"
#include "scalesweep/io/hf.h"
#include "scalesweep/io/llama2c.h"
#include "scalesweep/io/load.h"
#include "scalesweep/model/transformer.h"
#include "scalesweep/model/weight.h"

namespace scalesweep::io {
namespace {

namespace fs = std::filesystem;
using VT = GgufValueType;

// ---- metadata values --------------------------------------------------------------------------
GgufValue vu(uint64_t x, VT t = VT::kU32) { return gguf_value(t, x); }
GgufValue vi(int64_t x) { return gguf_value(VT::kI32, x); }
GgufValue vf(double x) { return gguf_value(VT::kF32, x); }
GgufValue vb(bool x) { return gguf_value(VT::kBool, x); }
GgufValue vs(const std::string& x) { return gguf_value(VT::kString, x); }
GgufValue varr(VT et, std::vector<GgufValue> e) { return gguf_value_array(et, std::move(e)); }
GgufValue vstrs(const std::vector<std::string>& xs) {
  std::vector<GgufValue> e;
  for (const auto& x : xs) e.push_back(vs(x));
  return varr(VT::kString, e);
}
GgufValue vi32s(const std::vector<int64_t>& xs) {
  std::vector<GgufValue> e;
  for (auto x : xs) e.push_back(vi(x));
  return varr(VT::kI32, e);
}
GgufValue vf32s(const std::vector<double>& xs) {
  std::vector<GgufValue> e;
  for (auto x : xs) e.push_back(vf(x));
  return varr(VT::kF32, e);
}

// A tiny byte-level vocabulary (the "smollm" fixture's kind).
const std::vector<std::string> kBpeTokens = {"a",   "b", "c", "\xC4\xA0", "ab",
                                             "abc", "1", "2", "12",       "<|endoftext|>"};

GgufMetadata base_meta(const std::string& arch = "llama") {
  GgufMetadata m;
  gguf_set_kv(m, "general.architecture", vs(arch));
  gguf_set_kv(m, arch + ".block_count", vu(2));
  gguf_set_kv(m, arch + ".context_length", vu(64));
  gguf_set_kv(m, arch + ".embedding_length", vu(16));
  gguf_set_kv(m, arch + ".feed_forward_length", vu(32));
  gguf_set_kv(m, arch + ".attention.head_count", vu(2));
  gguf_set_kv(m, arch + ".attention.head_count_kv", vu(1));
  gguf_set_kv(m, arch + ".rope.freq_base", vf(100000.0));
  gguf_set_kv(m, arch + ".rope.dimension_count", vu(8));
  gguf_set_kv(m, arch + ".attention.layer_norm_rms_epsilon", vf(1e-5));
  gguf_set_kv(m, "tokenizer.ggml.model", vs("gpt2"));
  gguf_set_kv(m, "tokenizer.ggml.pre", vs("smollm"));
  gguf_set_kv(m, "tokenizer.ggml.tokens", vstrs(kBpeTokens));
  gguf_set_kv(m, "tokenizer.ggml.token_type", vi32s({1, 1, 1, 1, 1, 1, 1, 1, 1, 3}));
  gguf_set_kv(m, "tokenizer.ggml.merges", vstrs({"a b", "ab c", "1 2"}));
  gguf_set_kv(m, "tokenizer.ggml.bos_token_id", vu(9));
  gguf_set_kv(m, "tokenizer.ggml.eos_token_id", vu(9));
  gguf_set_kv(m, "tokenizer.ggml.add_bos_token", vb(false));
  return m;
}

bool no_tensors(std::string_view) { return false; }

std::string config_error(const GgufMetadata& m,
                         const std::function<bool(std::string_view)>& has = no_tensors) {
  try {
    gguf_model_config(m, has, "m.gguf");
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}
bool has(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

// One refusal: `key` set to `value` in an otherwise valid metadata list makes the reader's
// message name the file and contain `want`.
struct ErrorCase {
  std::string key;
  GgufValue value;
  std::string want;
};
void expect_errors(const GgufMetadata& base, const std::vector<ErrorCase>& cases,
                   const std::function<std::string(const GgufMetadata&)>& error_of) {
  for (const ErrorCase& c : cases) {
    GgufMetadata m = base;
    gguf_set_kv(m, c.key, c.value);
    const std::string e = error_of(m);
    EXPECT_TRUE(has(e, "m.gguf: ") && has(e, c.want)) << c.key << ": " << e;
  }
}

// ---- config -------------------------------------------------------------------------------------

TEST(GgufConfig, MapsTheLlamaKeys) {
  const model::Config c = gguf_model_config(base_meta(), no_tensors, "m.gguf");
  EXPECT_EQ(c.arch, model::Arch::kLlama);
  EXPECT_EQ(c.n_layers, 2);
  EXPECT_EQ(c.dim, 16);
  EXPECT_EQ(c.hidden_dim, 32);
  EXPECT_EQ(c.n_heads, 2);
  EXPECT_EQ(c.n_kv_heads, 1);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.max_seq_len, 64);
  EXPECT_EQ(c.rope_theta, 100000.0f);
  EXPECT_EQ(c.norm_eps, 1e-5f);
  EXPECT_EQ(c.vocab_size, 10);  // the token list (no llama.vocab_size)
  EXPECT_TRUE(c.tied_embeddings);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_EQ(c.bos_token_id, 9);
  EXPECT_EQ(c.eos_token_id, 9);
  const auto with_output = [](std::string_view n) { return n == "output.weight"; };
  EXPECT_FALSE(gguf_model_config(base_meta(), with_output, "m.gguf").tied_embeddings);
}

TEST(GgufConfig, QwenFlagsHeadDimAndVocabSize) {
  GgufMetadata m = base_meta("qwen3");
  gguf_set_kv(m, "qwen3.attention.key_length", vu(12));
  gguf_set_kv(m, "qwen3.attention.value_length", vu(12));
  gguf_set_kv(m, "qwen3.rope.dimension_count", vu(12));
  gguf_set_kv(m, "qwen3.vocab_size", vu(32));
  model::Config c = gguf_model_config(m, no_tensors, "m.gguf");
  EXPECT_EQ(c.arch, model::Arch::kQwen3);
  EXPECT_EQ(c.head_dim, 12);
  EXPECT_EQ(c.vocab_size, 32);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.qkv_bias);
  c = gguf_model_config(base_meta("qwen2"), no_tensors, "m.gguf");
  EXPECT_EQ(c.arch, model::Arch::kQwen2);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_FALSE(c.qk_norm);
  // Absent optional keys take llama.cpp's defaults: kv heads = heads, rope base 10000.
  m = base_meta();
  gguf_erase_kv(m, "llama.attention.head_count_kv");
  gguf_erase_kv(m, "llama.rope.freq_base");
  gguf_erase_kv(m, "llama.rope.dimension_count");
  gguf_erase_kv(m, "tokenizer.ggml.bos_token_id");
  gguf_erase_kv(m, "tokenizer.ggml.eos_token_id");
  c = gguf_model_config(m, no_tensors, "m.gguf");
  EXPECT_EQ(c.n_kv_heads, 2);
  EXPECT_EQ(c.rope_theta, 10000.0f);
  EXPECT_EQ(c.bos_token_id, -1);  // a gpt2 vocabulary without ids: none
  EXPECT_EQ(c.eos_token_id, -1);
  gguf_set_kv(m, "tokenizer.ggml.model", vs("llama"));  // SentencePiece: llama.cpp's <s> 1, </s> 2
  c = gguf_model_config(m, no_tensors, "m.gguf");
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_id, 2);
}

TEST(GgufConfig, ReadsLinearAndYarnRopeScaling) {
  GgufMetadata m = base_meta();
  gguf_set_kv(m, "llama.rope.scaling.type", vs("linear"));
  gguf_set_kv(m, "llama.rope.scaling.factor", vf(2.0));
  model::Config c = gguf_model_config(m, no_tensors, "m.gguf");
  EXPECT_EQ(c.rope_scaling.type, model::RopeType::kLinear);
  EXPECT_EQ(c.rope_scaling.factor, 2.0f);
  m = base_meta("qwen2");
  gguf_set_kv(m, "qwen2.rope.scaling.type", vs("yarn"));
  gguf_set_kv(m, "qwen2.rope.scaling.factor", vf(4.0));
  gguf_set_kv(m, "qwen2.rope.scaling.original_context_length", vu(64));
  gguf_set_kv(m, "qwen2.rope.scaling.yarn_beta_fast", vf(8.0));
  c = gguf_model_config(m, no_tensors, "m.gguf");
  EXPECT_EQ(c.rope_scaling.type, model::RopeType::kYarn);
  EXPECT_EQ(c.rope_scaling.factor, 4.0f);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 64);
  EXPECT_EQ(c.rope_scaling.beta_fast, 8.0f);
  EXPECT_EQ(c.rope_scaling.beta_slow, 1.0f);
  EXPECT_TRUE(c.rope_scaling.truncate);
  EXPECT_FLOAT_EQ(c.rope_scaling.attention_factor, 0.1f * std::log(4.0f) + 1.0f);
  gguf_erase_kv(m, "qwen2.rope.scaling.original_context_length");
  EXPECT_TRUE(has(config_error(m), "'qwen2.rope.scaling.original_context_length' is missing"));
}

TEST(GgufConfig, RefusesWhatItDoesNotImplement) {
  const std::vector<ErrorCase> cases = {
      {"general.architecture", vs("gemma2"), "'gemma2' is not supported (supported: llama"},
      {"llama.rope.scaling.type", vs("longrope"), "'llama.rope.scaling.type' = 'longrope'"},
      {"llama.rope.scaling.type", vs("yarn"), "'llama.rope.scaling.factor' is missing"},
      {"llama.rope.scaling.yarn_attn_factor", vf(0.5), "a RoPE attention factor"},
      {"llama.rope.scaling.yarn_log_multiplier", vf(0.1), "is not supported"},
      {"llama.rope.scaling.factor", vf(4.0), "'llama.rope.scaling.factor'"},
      {"llama.rope.scale_linear", vf(2.0), "'llama.rope.scale_linear'"},
      {"llama.rope.scaling.attn_factor", vf(0.5), "'llama.rope.scaling.attn_factor'"},
      {"llama.attention.sliding_window", vu(4096), "sliding-window attention"},
      // Experts make a llama file Mixtral, which needs expert_used_count.
      {"llama.expert_count", vu(8), "'llama.expert_used_count' is missing"},
      {"llama.expert_used_count", vu(2),
       "'llama.expert_used_count' = 2 without 'llama.expert_count'"},
      {"llama.attention.causal", vb(false), "non-causal"},
      {"llama.attention.layer_norm_epsilon", vf(1e-5), "LayerNorm"},
      {"llama.attn_logit_softcapping", vf(50.0), "softcapping"},
      {"llama.final_logit_softcapping", vf(30.0), "softcapping"},
      {"llama.embedding_scale", vf(12.0), "'llama.embedding_scale'"},
      {"llama.some_future_key", vu(1), "'llama.some_future_key' is not supported"},
      {"llama.rope.dimension_count", vu(4), "partial rotary"},
      {"llama.attention.value_length", vu(4), "'llama.attention.value_length' = 4"},
      {"llama.attention.head_count_kv", vu(3), "does not divide"},
      {"llama.block_count", vu(0), "'llama.block_count' = 0 is out of range"},
      {"llama.block_count", vs("2"), "'llama.block_count' is string, expected an integer"},
      {"llama.rope.freq_base", vf(-1.0), "'llama.rope.freq_base'"},
      {"llama.attention.layer_norm_rms_epsilon", vf(0.0), "layer_norm_rms_epsilon"},
      {"llama.vocab_size", vu(5), "tokenizer.ggml.tokens has 10 tokens"},
      {"tokenizer.ggml.bos_token_id", vu(10), "outside the vocabulary"},
  };
  expect_errors(base_meta(), cases, [](const GgufMetadata& m) { return config_error(m); });
  for (const char* k : {"llama.block_count", "llama.embedding_length", "llama.context_length",
                        "llama.attention.layer_norm_rms_epsilon", "general.architecture"}) {
    GgufMetadata m = base_meta();
    gguf_erase_kv(m, k);
    EXPECT_TRUE(has(config_error(m), std::string("'") + k + "' is missing")) << k;
  }
  GgufMetadata m = base_meta();
  gguf_erase_kv(m, "tokenizer.ggml.tokens");
  EXPECT_TRUE(has(config_error(m), "vocabulary size is unknown"));
  m = base_meta();
  gguf_set_kv(m, "llama.rope.scaling.type", vs("linear"));
  gguf_set_kv(m, "llama.rope.scaling.factor", vf(2.0));
  EXPECT_TRUE(has(config_error(m, [](std::string_view n) { return n == "rope_freqs.weight"; }),
                  "'rope_freqs.weight' (Llama-3 RoPE factors) is supported for the llama "
                  "architecture without other RoPE scaling only"));
  m = base_meta("qwen3");
  EXPECT_TRUE(has(config_error(m, [](std::string_view n) { return n == "rope_freqs.weight"; }),
                  "'rope_freqs.weight'"));
  // Harmless values of the checked keys pass.
  m = base_meta();
  gguf_set_kv(m, "llama.rope.scaling.type", vs("none"));
  gguf_set_kv(m, "llama.rope.scaling.factor", vf(1.0));
  gguf_set_kv(m, "llama.expert_count", vu(0));
  gguf_set_kv(m, "llama.attention.sliding_window", vu(0));
  EXPECT_EQ(config_error(m), "");
}

// llama.cpp's MoE keys: qwen3moe, and llama with experts (Mixtral).
TEST(GgufConfig, MixtureOfExpertsKeys) {
  GgufMetadata m = base_meta("qwen3moe");
  gguf_set_kv(m, "qwen3moe.expert_count", vu(4));
  gguf_set_kv(m, "qwen3moe.expert_used_count", vu(2));
  gguf_set_kv(m, "qwen3moe.expert_feed_forward_length", vu(8));
  model::Config c = gguf_model_config(m, no_tensors, "m.gguf");
  EXPECT_EQ(c.arch, model::Arch::kQwen3Moe);
  EXPECT_EQ(c.n_experts, 4);
  EXPECT_EQ(c.experts_per_tok, 2);
  EXPECT_EQ(c.moe_hidden_dim, 8);
  EXPECT_EQ(c.hidden_dim, 32);
  EXPECT_TRUE(c.norm_topk_prob);  // llama.cpp's qwen3moe graph normalises the top-k weights
  EXPECT_TRUE(c.qk_norm);
  EXPECT_TRUE(c.moe_layer(0) && c.moe_layer(1));
  // Neutral values of the checked keys pass.
  gguf_set_kv(m, "qwen3moe.expert_shared_count", vu(0));
  gguf_set_kv(m, "qwen3moe.leading_dense_block_count", vu(0));
  gguf_set_kv(m, "qwen3moe.expert_gating_func", vu(1));
  gguf_set_kv(m, "qwen3moe.expert_weights_norm", vb(true));
  EXPECT_EQ(config_error(m), "");

  GgufMetadata x = base_meta();
  gguf_set_kv(x, "llama.expert_count", vu(4));
  gguf_set_kv(x, "llama.expert_used_count", vu(2));
  c = gguf_model_config(x, no_tensors, "m.gguf");
  EXPECT_EQ(c.arch, model::Arch::kMixtral);
  EXPECT_EQ(c.moe_hidden_dim, 32);  // feed_forward_length
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_FALSE(c.qk_norm);

  const std::vector<ErrorCase> cases = {
      {"qwen3moe.expert_shared_count", vu(1), "'qwen3moe.expert_shared_count' = 1: shared"},
      {"qwen3moe.leading_dense_block_count", vu(1), "'qwen3moe.leading_dense_block_count' = 1"},
      {"qwen3moe.expert_gating_func", vu(2), "'qwen3moe.expert_gating_func' = 2: only softmax"},
      {"qwen3moe.expert_weights_norm", vb(false), "'qwen3moe.expert_weights_norm' = false"},
      {"qwen3moe.expert_weights_scale", vf(2.5), "scaled routing weights are not implemented"},
      {"qwen3moe.expert_used_count", vu(5), "'qwen3moe.expert_used_count' = 5 is out of range"},
      {"qwen3moe.expert_count", vu(0), "'qwen3moe.expert_count' is missing or 0"},
  };
  expect_errors(m, cases, [](const GgufMetadata& b) { return config_error(b); });
  GgufMetadata b = m;
  gguf_erase_kv(b, "qwen3moe.expert_feed_forward_length");
  EXPECT_TRUE(has(config_error(b), "'qwen3moe.expert_feed_forward_length' is missing"));
  gguf_set_kv(x, "llama.expert_feed_forward_length", vu(8));
  EXPECT_TRUE(has(config_error(x), "'llama.expert_feed_forward_length' is not read by llama.cpp"));
}

// ---- tokenizer ----------------------------------------------------------------------------------

TEST(GgufTokenizer, ByteLevelSpecFromMetadata) {
  model::BpeSpec s = gguf_tokenizer_spec(base_meta(), "m.gguf");
  EXPECT_EQ(s.flavor, model::BpeFlavor::kByteLevel);
  EXPECT_EQ(s.split, model::SplitRegex::kGpt2);
  EXPECT_TRUE(s.split_digits);  // smollm = Digits(individual) + GPT-2 regex
  EXPECT_EQ(s.vocab, kBpeTokens);
  ASSERT_EQ(s.merges.size(), 3u);
  EXPECT_EQ(s.merges[1], (std::pair<std::string, std::string>("ab", "c")));
  ASSERT_EQ(s.added.size(), 1u);
  EXPECT_EQ(s.added[0].id, 9);
  EXPECT_TRUE(s.added[0].special);
  EXPECT_EQ(s.bos_id, 9);
  EXPECT_FALSE(s.add_bos);
  EXPECT_FALSE(s.add_eos);
  model::HfBpeTokenizer tok(s);
  // Digits split individually: "12" is not merged.
  EXPECT_EQ(tok.encode("abc 12<|endoftext|>", false, false), (std::vector<int>{5, 3, 6, 7, 9}));
  // With GPT-2's split " 12" is one piece and the merge applies.
  GgufMetadata m = base_meta();
  gguf_set_kv(m, "tokenizer.ggml.pre", vs("gpt-2"));
  s = gguf_tokenizer_spec(m, "m.gguf");
  EXPECT_FALSE(s.split_digits);
  EXPECT_EQ(model::HfBpeTokenizer(s).encode("abc 12", false, false), (std::vector<int>{5, 3, 8}));
  gguf_set_kv(m, "tokenizer.ggml.pre", vs("llama-bpe"));
  s = gguf_tokenizer_spec(m, "m.gguf");
  EXPECT_EQ(s.split, model::SplitRegex::kLlama3);
  EXPECT_EQ(s.max_digits, 3);
  EXPECT_TRUE(s.ignore_merges);
  gguf_set_kv(m, "tokenizer.ggml.pre", vs("qwen2"));
  s = gguf_tokenizer_spec(m, "m.gguf");
  EXPECT_EQ(s.split, model::SplitRegex::kLlama3);
  EXPECT_EQ(s.max_digits, 1);
  EXPECT_TRUE(s.nfc);
  gguf_set_kv(m, "tokenizer.ggml.pre", vs("smaug-bpe"));
  EXPECT_EQ(gguf_tokenizer_spec(m, "m.gguf").max_digits, 3);
  // add_bos / add_eos follow the file.
  gguf_set_kv(m, "tokenizer.ggml.add_bos_token", vb(true));
  gguf_set_kv(m, "tokenizer.ggml.add_eos_token", vb(true));
  s = gguf_tokenizer_spec(m, "m.gguf");
  EXPECT_TRUE(s.add_bos);
  EXPECT_TRUE(s.add_eos);
  // tokenizer.ggml.padding_token_id is the spec's pad (absent: none), and the writer's
  // tokenizer keys give it back.
  EXPECT_EQ(s.pad_id, -1);
  gguf_set_kv(m, "tokenizer.ggml.padding_token_id", vu(9));
  s = gguf_tokenizer_spec(m, "m.gguf");
  EXPECT_EQ(s.pad_id, 9);
  EXPECT_EQ(gguf_tokenizer_spec(gguf_tokenizer_kv_spec(s, "t"), "t").pad_id, 9);
  gguf_set_kv(m, "tokenizer.ggml.padding_token_id", vu(10));
  EXPECT_THROW(gguf_tokenizer_spec(m, "m.gguf"), std::runtime_error);
  gguf_set_kv(m, "tokenizer.ggml.padding_token_id", vu(9));
  // A user-defined token (type 4) is a non-special added token.
  gguf_set_kv(m, "tokenizer.ggml.token_type", vi32s({1, 1, 1, 1, 1, 1, 1, 1, 1, 4}));
  s = gguf_tokenizer_spec(m, "m.gguf");
  ASSERT_EQ(s.added.size(), 1u);
  EXPECT_FALSE(s.added[0].special);
}

std::string tok_error(const GgufMetadata& m) {
  try {
    model::HfBpeTokenizer(gguf_tokenizer_spec(m, "m.gguf"));
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(GgufTokenizer, Refusals) {
  const std::vector<ErrorCase> cases = {
      {"tokenizer.ggml.model", vs("bert"), "'bert' is not supported (supported: gpt2, llama)"},
      {"tokenizer.ggml.pre", vs("tekken"), "'tekken' is not supported (supported: default"},
      {"tokenizer.ggml.merges", vstrs({"a b", "abc"}), "tokenizer.ggml.merges[1] = 'abc'"},
      {"tokenizer.ggml.token_type", vi32s({1, 1}), "2 entries for 10 tokens"},
      {"tokenizer.ggml.token_type", vi32s({1, 1, 1, 1, 1, 1, 1, 1, 1, 9}),
       "tokenizer.ggml.token_type[9] = 9"},
      {"tokenizer.ggml.tokens", vu(3), "'tokenizer.ggml.tokens' is u32, expected an array"},
      {"tokenizer.ggml.eos_token_id", vu(77), "'tokenizer.ggml.eos_token_id' = 77 is outside"},
      {"tokenizer.ggml.precompiled_charsmap", vu(0), "precompiled_charsmap"},
  };
  expect_errors(base_meta(), cases, tok_error);
  GgufMetadata m = base_meta();
  gguf_erase_kv(m, "tokenizer.ggml.merges");
  EXPECT_TRUE(has(tok_error(m), "'tokenizer.ggml.merges' is missing"));
  m = base_meta();
  gguf_erase_kv(m, "tokenizer.ggml.model");
  EXPECT_FALSE(gguf_has_tokenizer(m));
  EXPECT_TRUE(has(tok_error(m), "'tokenizer.ggml.model' is missing"));
  // A merge of tokens missing from the vocabulary: the tokenizer's own check.
  m = base_meta();
  gguf_set_kv(m, "tokenizer.ggml.merges", vstrs({"x y"}));
  EXPECT_TRUE(has(tok_error(m), "missing from the vocabulary"));
}

// A hand-made SentencePiece vocabulary (scores chosen so every tie-break rule matters).
const std::vector<std::string> kSpTokens = {"<unk>",
                                            "<s>",
                                            "</s>",
                                            "\xE2\x96\x81",
                                            "a",
                                            "b",
                                            "c",
                                            "ab",
                                            "bc",
                                            "abc",
                                            "\xE2\x96\x81"
                                            "a",
                                            "\xE2\x96\x81"
                                            "ab",
                                            "<0x64>"};
const std::vector<double> kSpScores = {0, 0, 0, -1, -2, -3, -4, -5, -1.5, -1, -3, -3, 0};

TEST(GgufTokenizer, SentencePieceMergesFromScores) {
  const std::vector<float> sc(kSpScores.begin(), kSpScores.end());
  const auto merges = sentencepiece_merges_from_scores(kSpTokens, sc);
  const std::string u = "\xE2\x96\x81";
  // transformers' generate_merges(vocab, scores) on the same vocabulary gives exactly this.
  const std::vector<std::pair<std::string, std::string>> want = {
      {"ab", "c"}, {"a", "bc"}, {"b", "c"}, {u + "a", "b"}, {u, "ab"}, {u, "a"}, {"a", "b"}};
  EXPECT_EQ(merges, want);
  EXPECT_THROW(sentencepiece_merges_from_scores({"a", "b", "a"}, {0, 0, 0}), std::runtime_error);
  EXPECT_THROW(sentencepiece_merges_from_scores({"a"}, {0, 0}), std::runtime_error);
}

TEST(GgufTokenizer, SentencePieceSpecFromMetadata) {
  GgufMetadata m = base_meta();
  gguf_set_kv(m, "tokenizer.ggml.model", vs("llama"));
  gguf_erase_kv(m, "tokenizer.ggml.pre");
  gguf_erase_kv(m, "tokenizer.ggml.merges");
  gguf_erase_kv(m, "tokenizer.ggml.add_bos_token");
  gguf_erase_kv(m, "tokenizer.ggml.bos_token_id");
  gguf_erase_kv(m, "tokenizer.ggml.eos_token_id");
  gguf_set_kv(m, "tokenizer.ggml.tokens", vstrs(kSpTokens));
  gguf_set_kv(m, "tokenizer.ggml.scores", vf32s(kSpScores));
  gguf_set_kv(m, "tokenizer.ggml.token_type", vi32s({2, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 6}));
  model::BpeSpec s = gguf_tokenizer_spec(m, "m.gguf");
  EXPECT_EQ(s.flavor, model::BpeFlavor::kSentencePiece);
  EXPECT_EQ(s.prepend, model::PrependScheme::kAlways);  // add_space_prefix absent: true
  EXPECT_TRUE(s.byte_fallback);
  EXPECT_EQ(s.merges.size(), 7u);
  EXPECT_EQ(s.unk_id, 0);
  EXPECT_EQ(s.bos_id, 1);
  EXPECT_EQ(s.eos_id, 2);
  EXPECT_TRUE(s.add_bos);  // llama.cpp's default for SentencePiece vocabularies
  EXPECT_EQ(s.added.size(), 3u);
  model::HfBpeTokenizer tok(s);
  // "▁abc" merges b+c (rank 2), then a+bc (rank 1); "d" falls back to its byte token,
  // "e" to <unk>.
  EXPECT_EQ(tok.encode("abc", true, false), (std::vector<int>{1, 3, 9}));
  EXPECT_EQ(tok.encode("ab d", false, false), (std::vector<int>{11, 3, 12}));
  EXPECT_EQ(tok.encode("e", false, false), (std::vector<int>{3, 0}));
  gguf_set_kv(m, "tokenizer.ggml.add_space_prefix", vb(false));
  gguf_set_kv(m, "tokenizer.ggml.add_bos_token", vb(false));
  s = gguf_tokenizer_spec(m, "m.gguf");
  EXPECT_EQ(s.prepend, model::PrependScheme::kNever);
  EXPECT_FALSE(s.add_bos);
  EXPECT_EQ(model::HfBpeTokenizer(s).encode("abc", false, false), (std::vector<int>{9}));
  gguf_erase_kv(m, "tokenizer.ggml.scores");
  EXPECT_TRUE(has(tok_error(m), "'tokenizer.ggml.scores' is missing"));
}

// ---- permutation --------------------------------------------------------------------------------

// convert_hf_to_gguf.py LlamaModel.permute written as its index map:
// w.reshape(n_head, 2, hd/2, cols).swapaxes(1, 2).reshape(w.shape).
std::vector<float> llama_cpp_permute(const std::vector<float>& w, int n_head, int hd, int cols) {
  std::vector<float> out(w.size());
  const int half = hd / 2;
  for (int h = 0; h < n_head; ++h)
    for (int j = 0; j < half; ++j)
      for (int a = 0; a < 2; ++a)  // out[h][j][a] = w[h][a][j]
        for (int c = 0; c < cols; ++c)
          out[((h * half + j) * 2 + a) * cols + c] = w[((h * 2 + a) * half + j) * cols + c];
  return out;
}

TEST(GgufWeights, UnpermuteInvertsLlamaCppPermute) {
  const int heads = 3, hd = 8, cols = 5;
  std::vector<float> w(heads * hd * cols);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i);
  const std::vector<float> p = llama_cpp_permute(w, heads, hd, cols);
  EXPECT_NE(p, w);
  std::vector<float> back(w.size());
  gguf_unpermute_qk_rows(p.data(), back.data(), heads, hd, cols);
  EXPECT_EQ(back, w);
  // The llama2.c loader's permutation is the same map (interleaved pairs -> rotate-half).
  std::vector<float> l2c(w.size());
  permute_rope_rows(p.data(), l2c.data(), heads, hd, cols, true);
  EXPECT_EQ(l2c, w);
}

// ---- whole files ------------------------------------------------------------------------------

struct Bytes {
  std::string b;
  template <typename T>
  void put(T v) {
    char c[sizeof(T)];
    std::memcpy(c, &v, sizeof(T));
    b.append(c, sizeof(T));
  }
  void str(const std::string& s) {
    put<uint64_t>(s.size());
    b += s;
  }
  void value(const GgufValue& v, bool with_type = true) {
    if (with_type) put(static_cast<uint32_t>(v.type));
    switch (v.type) {
      case VT::kU32:
        put(static_cast<uint32_t>(std::get<uint64_t>(v.scalar)));
        break;
      case VT::kI32:
        put(static_cast<int32_t>(std::get<int64_t>(v.scalar)));
        break;
      case VT::kF32:
        put(static_cast<float>(std::get<double>(v.scalar)));
        break;
      case VT::kBool:
        put(static_cast<uint8_t>(std::get<bool>(v.scalar)));
        break;
      case VT::kString:
        str(std::get<std::string>(v.scalar));
        break;
      case VT::kArray:
        put(static_cast<uint32_t>(v.elem_type));
        put<uint64_t>(v.array.size());
        for (const auto& e : v.array) value(e, false);
        break;
      default:
        throw std::logic_error("test writer: unsupported type");
    }
  }
};

struct NamedTensor {
  std::string name;
  std::vector<int64_t> shape;  // [out, in] or [n]
  std::vector<float> data;
  GgmlType type = GgmlType::kF32;  // with `raw`: the type of the stored bytes
  std::string raw;                 // non-empty: the tensor's bytes as stored
  NamedTensor(std::string n, std::vector<int64_t> s, std::vector<float> d)
      : name(std::move(n)), shape(std::move(s)), data(std::move(d)) {}
  NamedTensor(std::string n, std::vector<int64_t> s, GgmlType t, std::string r)
      : name(std::move(n)), shape(std::move(s)), type(t), raw(std::move(r)) {}
};

// A GGUF v3 file with F32 tensors (ne = reversed shape); `f16_matrices`: 2-D tensors as F16
// (their values must be f16-representable).
std::string gguf_bytes(const GgufMetadata& meta, const std::vector<NamedTensor>& ts,
                       bool f16_matrices = false) {
  const auto is_f16 = [&](const NamedTensor& t) { return f16_matrices && t.shape.size() == 2; };
  Bytes o;
  o.b = "GGUF";
  o.put<uint32_t>(3);
  o.put<uint64_t>(ts.size());
  o.put<uint64_t>(meta.size());
  for (const auto& [k, v] : meta) {
    o.str(k);
    o.value(v);
  }
  uint64_t off = 0;
  for (const auto& t : ts) {
    o.str(t.name);
    o.put<uint32_t>(static_cast<uint32_t>(t.shape.size()));
    for (auto it = t.shape.rbegin(); it != t.shape.rend(); ++it) o.put<uint64_t>(*it);
    o.put<uint32_t>(!t.raw.empty() ? static_cast<uint32_t>(t.type) : is_f16(t) ? 1 : 0);
    o.put<uint64_t>(off);
    off += (!t.raw.empty() ? t.raw.size() : t.data.size() * (is_f16(t) ? 2 : 4)) + 31;
    off = off / 32 * 32;
  }
  while (o.b.size() % 32) o.b.push_back('\0');
  for (const auto& t : ts) {
    if (!t.raw.empty()) {
      o.b += t.raw;
    } else if (is_f16(t)) {
      for (float x : t.data) o.put<uint16_t>(format::f32_to_f16(x));
    } else {
      o.b.append(reinterpret_cast<const char*>(t.data.data()), t.data.size() * 4);
    }
    while (o.b.size() % 32) o.b.push_back('\0');
  }
  return o.b;
}

class GgufModelFiles : public ::testing::Test {
 protected:
  std::string write(const std::string& name, const std::string& bytes) {
    const std::string p = (dir_ / name).string();
    std::ofstream(p, std::ios::binary)
        .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return p;
  }
  scalesweep::testing::TempDir tmp_{"gguf_model_test"};
  const fs::path& dir_ = tmp_.path();
};

// HF-convention tensors of the tiny model of base_meta(arch) and the GGUF tensors
// convert_hf_to_gguf.py would write for them (llama: q/k rows permuted).
struct TinyModel {
  std::vector<NamedTensor> hf;    // names are GGUF names, data in HF row order
  std::vector<NamedTensor> file;  // as stored
};

TinyModel tiny_model(const std::string& arch, bool tied = true) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 0.5f);
  TinyModel m;
  const auto add = [&](const std::string& name, std::vector<int64_t> shape, int permute_heads = 0) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    NamedTensor t{name, shape, std::vector<float>(static_cast<size_t>(n))};
    for (auto& x : t.data) x = nd(rng);
    m.hf.push_back(t);
    if (permute_heads > 0 && arch == "llama")
      t.data = llama_cpp_permute(t.data, permute_heads, 8, static_cast<int>(shape[1]));
    m.file.push_back(std::move(t));
  };
  add("token_embd.weight", {10, 16});
  for (int l = 0; l < 2; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    add(p + "attn_norm.weight", {16});
    add(p + "attn_q.weight", {16, 16}, 2);
    add(p + "attn_k.weight", {8, 16}, 1);
    add(p + "attn_v.weight", {8, 16});
    add(p + "attn_output.weight", {16, 16});
    if (arch == "qwen2") {
      add(p + "attn_q.bias", {16});
      add(p + "attn_k.bias", {8});
      add(p + "attn_v.bias", {8});
    }
    if (arch == "qwen3") {
      add(p + "attn_q_norm.weight", {8});
      add(p + "attn_k_norm.weight", {8});
    }
    add(p + "ffn_norm.weight", {16});
    add(p + "ffn_gate.weight", {32, 16});
    add(p + "ffn_up.weight", {32, 16});
    add(p + "ffn_down.weight", {16, 32});
  }
  add("output_norm.weight", {16});
  if (!tied) add("output.weight", {10, 16});
  return m;
}

// Any storage dtype (fp32, in the mapping, or a row decoder), read back as fp32.
void expect_tensor(const model::Tensor& got, const NamedTensor& want) {
  ASSERT_EQ(got.shape, want.shape) << want.name;
  ASSERT_TRUE(got.present()) << want.name;
  const std::vector<float> v = model::to_f32(got);
  for (size_t i = 0; i < want.data.size(); ++i)
    ASSERT_EQ(v[i], want.data[i]) << want.name << " [" << i << "]";
}

const NamedTensor& find(const TinyModel& m, const std::string& name) {
  for (const auto& t : m.hf)
    if (t.name == name) return t;
  throw std::logic_error("no " + name);
}

TEST_F(GgufModelFiles, LoadsEveryArchitectureInHfConventions) {
  for (const std::string arch : {"llama", "qwen2", "qwen3"}) {
    for (bool tied : {true, false}) {
      const TinyModel tm = tiny_model(arch, tied);
      const std::string p = write(arch + ".gguf", gguf_bytes(base_meta(arch), tm.file));
      const LoadedModel lm = load_model(p);
      EXPECT_EQ(lm.format, "gguf");
      ASSERT_NE(lm.tokenizer, nullptr);
      EXPECT_EQ(lm.tokenizer->vocab_size(), 10);
      const model::Weights& w = lm.weights;
      EXPECT_EQ(w.config.tied_embeddings, tied);
      expect_tensor(w.tok_embeddings, find(tm, "token_embd.weight"));
      expect_tensor(w.final_norm, find(tm, "output_norm.weight"));
      expect_tensor(w.lm_head, find(tm, tied ? "token_embd.weight" : "output.weight"));
      for (int l = 0; l < 2; ++l) {
        const auto& L = w.layers[static_cast<size_t>(l)];
        const std::string p2 = "blk." + std::to_string(l) + ".";
        expect_tensor(L.attn_norm, find(tm, p2 + "attn_norm.weight"));
        expect_tensor(L.wq, find(tm, p2 + "attn_q.weight"));
        expect_tensor(L.wk, find(tm, p2 + "attn_k.weight"));
        expect_tensor(L.wv, find(tm, p2 + "attn_v.weight"));
        expect_tensor(L.wo, find(tm, p2 + "attn_output.weight"));
        expect_tensor(L.ffn_norm, find(tm, p2 + "ffn_norm.weight"));
        expect_tensor(L.w1, find(tm, p2 + "ffn_gate.weight"));
        expect_tensor(L.w3, find(tm, p2 + "ffn_up.weight"));
        expect_tensor(L.w2, find(tm, p2 + "ffn_down.weight"));
        if (arch == "qwen2") {
          expect_tensor(L.bq, find(tm, p2 + "attn_q.bias"));
          expect_tensor(L.bk, find(tm, p2 + "attn_k.bias"));
          expect_tensor(L.bv, find(tm, p2 + "attn_v.bias"));
        }
        if (arch == "qwen3") {
          expect_tensor(L.q_norm, find(tm, p2 + "attn_q_norm.weight"));
          expect_tensor(L.k_norm, find(tm, p2 + "attn_k_norm.weight"));
        }
      }
    }
  }
}

// F16 matrices stay 16-bit in the mapping (not widened); llama's permuted q/k rows are read
// as ggml F16 blocks with the permutation undone by the runtime.
// The weights and the decode logits equal those of the all-fp32 load of the same file.
TEST_F(GgufModelFiles, F16MatricesStayInTheMapping) {
  TinyModel tm = tiny_model("llama", /*tied=*/false);
  for (auto* v : {&tm.hf, &tm.file})
    for (auto& t : *v)
      for (auto& x : t.data) x = format::f16_to_f32(format::f32_to_f16(x));
  const std::string p = write("f16.gguf", gguf_bytes(base_meta("llama"), tm.file, true));
  auto lm = std::make_shared<LoadedModel>(load_model(p));
  const model::Weights fp32 = load_gguf_weights(GgufFile::open(p));  // no `keep`: all fp32
  const auto& L = lm->weights.layers[1];
  const model::Weights& lw = lm->weights;
  for (const model::Tensor* t :
       {&L.wv, &L.wo, &L.w1, &L.w2, &L.w3, &lw.tok_embeddings, &lw.lm_head}) {
    EXPECT_EQ(t->dtype, model::WeightDType::kF16);
    EXPECT_EQ(t->data, nullptr);
  }
  EXPECT_EQ(L.wq.dtype, model::WeightDType::kGgml);  // permuted rows: ggml F16 rows, permuted
  EXPECT_EQ(L.wq.ggml_permute_head_dim, 8);
  EXPECT_EQ(L.attn_norm.dtype, model::WeightDType::kF32);
  EXPECT_EQ(model::to_f32(L.w2), find(tm, "blk.1.ffn_down.weight").data);
  EXPECT_EQ(model::to_f32(L.wq), find(tm, "blk.1.attn_q.weight").data);
  auto shared = std::shared_ptr<const model::Weights>(lm, &lm->weights);
  model::Transformer a(shared), b(std::make_shared<const model::Weights>(fp32));
  for (int pos = 0; pos < 3; ++pos) {
    const float* la = a.decode(pos + 1, pos);
    const std::vector<float> va(la, la + 10);
    const float* lb = b.decode(pos + 1, pos);
    EXPECT_EQ(va, std::vector<float>(lb, lb + 10)) << "position " << pos;
  }
}

std::string load_error(const std::string& path) {
  try {
    load_model(path);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// Random blocks of a ggml type whose scale fields are finite (the rest random bytes):
// `rows` rows of `cols` elements.
std::string random_blocks(GgmlType type, int64_t rows, int64_t cols, std::mt19937& rng) {
  const GgmlTypeTraits tr = *ggml_type_traits(static_cast<uint32_t>(type));
  const int64_t blocks = rows * cols / tr.block_elems;
  std::string b(static_cast<size_t>(blocks * tr.block_bytes), '\0');
  for (auto& c : b) c = static_cast<char>(rng());
  std::uniform_real_distribution<float> scale(0.001f, 0.01f);
  const auto half_at = [&](size_t at, float v) {
    const uint16_t h = format::f32_to_f16(v);
    std::memcpy(b.data() + at, &h, 2);
  };
  for (int64_t i = 0; i < blocks; ++i) {
    const auto at = static_cast<size_t>(i * tr.block_bytes);
    switch (type) {
      case GgmlType::kQ6_K:
        half_at(at + 208, scale(rng));
        break;
      case GgmlType::kMXFP4:
        b[at] = static_cast<char>(118 + rng() % 8);  // 2^-10 .. 2^-3
        break;
      case GgmlType::kNVFP4:
        for (size_t j = 0; j < 4; ++j) b[at + j] = static_cast<char>(0x08 + rng() % 0x30);
        break;
      case GgmlType::kQ4_1:
      case GgmlType::kQ5_1:
      case GgmlType::kQ4_K:
      case GgmlType::kQ5_K:
        half_at(at, scale(rng));
        half_at(at + 2, scale(rng));
        break;
      default:  // Q4_0, Q5_0, Q8_0: d first
        half_at(at, scale(rng));
    }
  }
  return b;
}

// A llama GGUF (dim 256, ffn 512, 2 heads of 128, 1 KV head, vocab 10, untied) whose matrices
// are random blocks of `type`; attn_output has a per-tensor scale of 0.75.
std::vector<NamedTensor> quantized_model(GgmlType type) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(1.0f, 0.1f);
  std::vector<NamedTensor> ts;
  const auto mat = [&](const std::string& name, int64_t rows, int64_t cols) {
    ts.push_back({name, {rows, cols}, type, random_blocks(type, rows, cols, rng)});
  };
  const auto vec = [&](const std::string& name, int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = nd(rng);
    ts.push_back({name, {n}, v});
  };
  const int64_t D = 256, H = 512, V = 10;
  mat("token_embd.weight", V, D);
  for (int l = 0; l < 2; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    vec(p + "attn_norm.weight", D);
    mat(p + "attn_q.weight", D, D);
    mat(p + "attn_k.weight", 128, D);
    mat(p + "attn_v.weight", 128, D);
    mat(p + "attn_output.weight", D, D);
    ts.push_back({p + "attn_output.scale", {1}, {0.75f}});
    vec(p + "ffn_norm.weight", D);
    mat(p + "ffn_gate.weight", H, D);
    mat(p + "ffn_up.weight", H, D);
    mat(p + "ffn_down.weight", D, H);
  }
  vec("output_norm.weight", D);
  mat("output.weight", V, D);
  return ts;
}

GgufMetadata quantized_model_meta() {
  GgufMetadata meta = base_meta("llama");
  gguf_set_kv(meta, "llama.embedding_length", vu(256));
  gguf_set_kv(meta, "llama.feed_forward_length", vu(512));
  gguf_set_kv(meta, "llama.rope.dimension_count", vu(128));
  return meta;
}

// Every quantized ggml type stays as stored (ggml blocks in the mapping, no fp32 copy): the
// rows read back with the bits of the all-fp32 load (llama's permuted q/k rows and a
// per-tensor scale included), and the decode and prefill logits are bit-identical to those of
// the fp32 load.
TEST_F(GgufModelFiles, QuantizedTypesStayAsStored) {
  const GgmlType types[] = {GgmlType::kQ4_0,  GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1,
                            GgmlType::kQ8_0,  GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K,
                            GgmlType::kMXFP4, GgmlType::kNVFP4};
  for (const GgmlType type : types) {
    SCOPED_TRACE(ggml_type_name(static_cast<uint32_t>(type)));
    const std::string name = "q" + std::to_string(static_cast<int>(type)) + ".gguf";
    const std::string p = write(name, gguf_bytes(quantized_model_meta(), quantized_model(type)));
    auto lm = std::make_shared<LoadedModel>(load_model(p));
    const auto fp32 = std::make_shared<const model::Weights>(
        load_gguf_weights(GgufFile::open(p)));  // no `keep`: all fp32
    const model::Weights& w = lm->weights;
    const auto& L = w.layers[1];
    const auto& F = fp32->layers[1];
    const std::pair<const model::Tensor*, const model::Tensor*> pairs[] = {
        {&L.wq, &F.wq},
        {&L.wk, &F.wk},
        {&L.wv, &F.wv},
        {&L.wo, &F.wo},
        {&L.w1, &F.w1},
        {&L.w2, &F.w2},
        {&L.w3, &F.w3},
        {&w.lm_head, &fp32->lm_head},
        {&w.tok_embeddings, &fp32->tok_embeddings}};
    for (const auto& [kept, wide] : pairs) {
      EXPECT_EQ(kept->dtype, model::WeightDType::kGgml);
      EXPECT_EQ(kept->data, nullptr);
      const std::vector<float> a = model::to_f32(*kept);
      ASSERT_EQ(a.size(), static_cast<size_t>(wide->numel()));
      EXPECT_EQ(std::memcmp(a.data(), wide->data, a.size() * 4), 0);
      // A row range read alone is the same rows.
      std::vector<float> mid(static_cast<size_t>(3 * kept->cols()));
      model::dequantize_rows(*kept, 2, 5, mid.data());
      EXPECT_EQ(std::memcmp(mid.data(), wide->data + 2 * kept->cols(), mid.size() * 4), 0);
    }
    EXPECT_EQ(L.attn_norm.dtype, model::WeightDType::kF32);
    auto shared = std::shared_ptr<const model::Weights>(lm, &lm->weights);
    model::Transformer a(shared, 8), b(fp32, 8);
    for (int pos = 0; pos < 3; ++pos) {
      const float* la = a.decode(pos + 1, pos);
      const std::vector<float> va(la, la + 10);
      const float* lb = b.decode(pos + 1, pos);
      EXPECT_EQ(va, std::vector<float>(lb, lb + 10)) << "decode at position " << pos;
    }
    const std::vector<int> toks = {1, 4, 2, 8, 3, 0, 5};
    model::Transformer c(shared, 8), d(fp32, 8);
    EXPECT_EQ(c.forward(toks.data(), 7, 0), d.forward(toks.data(), 7, 0)) << "prefill";
  }
}

// A block with an Inf scale in a tensor the loader permutes (llama attn_q): the index named is
// the block's first element in the file's row order, as the fp32 load names it.
TEST_F(GgufModelFiles, QuantizedNonFiniteIsNamedInFileOrder) {
  std::vector<NamedTensor> ts = quantized_model(GgmlType::kQ8_0);
  for (auto& t : ts)
    if (t.name == "blk.1.attn_q.weight") {
      const uint16_t inf = 0x7C00;
      std::memcpy(t.raw.data() + 37 * 34, &inf, 2);  // block 37: elements 1184 ..
    }
  const std::string p = write("q8inf.gguf", gguf_bytes(quantized_model_meta(), ts));
  const std::string e1 = load_error(p);
  std::string e2;
  try {
    (void)load_gguf_weights(GgufFile::open(p));
  } catch (const std::exception& e) {
    e2 = e.what();
  }
  EXPECT_TRUE(has(e1, "tensor 'blk.1.attn_q.weight' has a non-finite value")) << e1;
  EXPECT_TRUE(has(e1, "at flat index 1184")) << e1;
  EXPECT_EQ(e1, e2);
}

TEST_F(GgufModelFiles, F16NonFiniteIsNamed) {
  TinyModel tm = tiny_model("llama", true);
  for (auto& t : tm.file)
    for (auto& x : t.data) x = format::f16_to_f32(format::f32_to_f16(x));
  for (auto& t : tm.file)
    if (t.name == "blk.1.ffn_up.weight") t.data[5] = std::numeric_limits<float>::infinity();
  const std::string p = write("inf.gguf", gguf_bytes(base_meta("llama"), tm.file, true));
  try {
    (void)load_model(p);
    FAIL() << "loaded a GGUF with an Inf weight";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'blk.1.ffn_up.weight' has a non-finite value"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("at flat index 5"), std::string::npos) << e.what();
  }
}

TEST_F(GgufModelFiles, BadTensorsAreNamed) {
  TinyModel tm = tiny_model("llama");
  // Wrong shape.
  auto bad = tm.file;
  bad[2].shape = {8, 32};
  std::string e = load_error(write("shape.gguf", gguf_bytes(base_meta(), bad)));
  EXPECT_TRUE(has(e, "tensor 'blk.0.attn_q.weight': expected ne [16, 16], got [32, 8]")) << e;
  // Missing.
  bad = tm.file;
  bad.erase(bad.begin() + 3);
  e = load_error(write("missing.gguf", gguf_bytes(base_meta(), bad)));
  EXPECT_TRUE(has(e, "tensor 'blk.0.attn_k.weight' is missing")) << e;
  // Unused (a bias the llama architecture does not have).
  bad = tm.file;
  bad.push_back({"blk.0.attn_q.bias", {16}, std::vector<float>(16, 0.0f)});
  e = load_error(write("extra.gguf", gguf_bytes(base_meta(), bad)));
  EXPECT_TRUE(has(e, "'blk.0.attn_q.bias' is not used by the llama architecture")) << e;
  // rope_freqs.
  bad = tm.file;
  bad.push_back({"rope_freqs.weight", {4}, {1.0f, 2.0f, 3.0f, 4.0f}});
  e = load_error(write("rf.gguf", gguf_bytes(base_meta(), bad)));
  EXPECT_TRUE(has(e,
                  "tensor 'rope_freqs.weight' element 1 = 2.000000 is not Llama-3 RoPE "
                  "scaling with factor 4.000000"))
      << e;
  // Non-finite.
  bad = tm.file;
  bad[4].data[5] = std::numeric_limits<float>::quiet_NaN();
  e = load_error(write("nan.gguf", gguf_bytes(base_meta(), bad)));
  EXPECT_TRUE(has(e, "nan.gguf: tensor 'blk.0.attn_v.weight' has a non-finite value")) << e;
  EXPECT_TRUE(has(e, "at flat index 5")) << e;
}

TEST_F(GgufModelFiles, DispatchNamesUnrecognisedFiles) {
  std::string rnd(4096, '\0');
  std::mt19937 rng(3);
  for (auto& c : rnd) c = static_cast<char>(rng());
  rnd[0] = '\x7f';  // not "GGUF", and an implausible llama2.c dim
  const std::string want =
      "unrecognised model file (accepted: a Hugging Face model directory, "
      "a .gguf file, a llama2.c .bin checkpoint)";
  std::string e = load_error(write("random.bin", rnd));
  EXPECT_TRUE(has(e, "random.bin: " + want)) << e;
  e = load_error(write("text.gguf", "{\"not\": \"a model\"}\n"));
  EXPECT_TRUE(has(e, "text.gguf: " + want)) << e;
  // A truncated GGUF is reported by the GGUF reader, not as something else.
  const TinyModel tm = tiny_model("llama");
  const std::string full = gguf_bytes(base_meta(), tm.file);
  e = load_error(write("trunc.gguf", full.substr(0, full.size() / 2)));
  EXPECT_TRUE(has(e, "trunc.gguf")) << e;
  EXPECT_FALSE(has(e, "unrecognised")) << e;
  EXPECT_FALSE(has(e, "llama2.c")) << e;
  EXPECT_TRUE(has(load_error((dir_ / "absent.gguf").string()), "no such file")) << e;
}

TEST_F(GgufModelFiles, ConvertWritesAHfDirectoryThatLoadsTheSame) {
  const TinyModel tm = tiny_model("qwen2", false);
  const std::string p = write("m.gguf", gguf_bytes(base_meta("qwen2"), tm.file));
  const std::string out = (dir_ / "hf").string();
  ConvertOptions o;
  const ConvertReport r = convert_to_hf(p, out, o);
  EXPECT_EQ(r.source_format, "gguf");
  EXPECT_EQ(r.vocab, 10);
  EXPECT_EQ(r.merges, 3);
  const LoadedModel a = load_model(p), b = load_model(out);
  EXPECT_EQ(b.weights.config.arch, model::Arch::kQwen2);
  EXPECT_EQ(b.weights.config.rope_theta, 100000.0f);
  EXPECT_EQ(b.weights.config.max_seq_len, 64);
  expect_tensor(b.weights.layers[1].wq, find(tm, "blk.1.attn_q.weight"));
  expect_tensor(b.weights.layers[1].bk, find(tm, "blk.1.attn_k.bias"));
  expect_tensor(b.weights.lm_head, find(tm, "output.weight"));
  ASSERT_NE(b.tokenizer, nullptr);
  for (const char* text : {"abc 12", "ab<|endoftext|>c 1 2"})
    EXPECT_EQ(a.tokenizer->encode(text, false, false), b.tokenizer->encode(text, false, false));
  o.tokenizer = "tok.bin";
  EXPECT_THROW(convert_to_hf(p, (dir_ / "hf2").string(), o), std::runtime_error);
}

}  // namespace
}  // namespace scalesweep::io
