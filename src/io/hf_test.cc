// Tests of the Hugging Face directory loader/writer on small synthetic models.
#include "scalesweep/io/hf.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "base/test_util.h"
#include "io/test_util.h"
#include "model/test_util.h"
#include "scalesweep/format/minifloat.h"
#include "scalesweep/io/hf_config.h"
#include "scalesweep/io/safetensors.h"
#include "scalesweep/model/transformer.h"
#include "scalesweep/model/weight.h"

namespace scalesweep::io {
namespace {

namespace fs = std::filesystem;

using scalesweep::testing::TempDir;

model::Config small_config(model::Arch arch) {
  model::Config c;
  c.arch = arch;
  c.dim = 32;
  c.hidden_dim = 40;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = arch == model::Arch::kQwen3 ? 16 : 8;  // Qwen3: head_dim != dim / heads
  c.vocab_size = 50;
  c.max_seq_len = 64;
  c.rope_theta = arch == model::Arch::kLlama ? 10000.0f : 1000000.0f;
  c.norm_eps = 1e-6f;
  c.tied_embeddings = arch != model::Arch::kLlama;
  c.qkv_bias = arch == model::Arch::kQwen2;
  c.qk_norm = arch == model::Arch::kQwen3;
  c.bos_token_id = 1;
  c.eos_token_id = 2;
  return c;
}

model::Weights random_weights(const model::Config& c, uint32_t seed) {
  model::Weights w;
  w.config = c;
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 0.2f);
  auto fill = [&](model::Tensor& t, std::vector<int64_t> shape, bool norm = false) {
    float* p = w.alloc(t, std::move(shape));
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = norm ? 1.0f + nd(rng) * 0.1f : nd(rng);
  };
  const int64_t d = c.dim, hd = c.head_dim, q = int64_t{c.n_heads} * hd,
                kv = int64_t{c.n_kv_heads} * hd, h = c.hidden_dim, v = c.vocab_size;
  fill(w.tok_embeddings, {v, d});
  w.layers.resize(static_cast<size_t>(c.n_layers));
  for (auto& L : w.layers) {
    fill(L.attn_norm, {d}, true);
    fill(L.wq, {q, d});
    fill(L.wk, {kv, d});
    fill(L.wv, {kv, d});
    fill(L.wo, {d, q});
    if (c.qkv_bias) fill(L.bq, {q}), fill(L.bk, {kv}), fill(L.bv, {kv});
    if (c.qk_norm) fill(L.q_norm, {hd}, true), fill(L.k_norm, {hd}, true);
    fill(L.ffn_norm, {d}, true);
    fill(L.w1, {h, d});
    fill(L.w3, {h, d});
    fill(L.w2, {d, h});
  }
  fill(w.final_norm, {d}, true);
  if (c.tied_embeddings)
    w.lm_head = w.tok_embeddings;
  else
    fill(w.lm_head, {v, d});
  return w;
}

// Every tensor of `b` equals `a` after rounding through `dt`.
void expect_same(const model::Weights& a, const model::Weights& b, DType dt) {
  auto round = [&](float x) {
    if (dt == DType::kBF16) return format::bf16_to_f32(format::f32_to_bf16(x));
    if (dt == DType::kF16) return format::f16_to_f32(format::f32_to_f16(x));
    return x;
  };
  auto same = [&](const model::Tensor& x, const model::Tensor& y, const char* what) {
    ASSERT_EQ(x.shape, y.shape) << what;
    if (!x.present()) {  // absent (no bias / no q_norm for this architecture)
      EXPECT_FALSE(y.present()) << what;
      return;
    }
    ASSERT_TRUE(y.present()) << what;
    const std::vector<float> xv = model::to_f32(x), yv = model::to_f32(y);
    for (int64_t i = 0; i < x.numel(); ++i)
      ASSERT_EQ(round(xv[i]), yv[i]) << what << " index " << i;
  };
  ASSERT_EQ(a.layers.size(), b.layers.size());
  model::testing::for_each_tensor_pair(a, b, same);
}

// Whether `p` lies in a mapping of `file` (from /proc/self/maps; false where unavailable).
bool in_file_mapping(const void* p, const std::string& file) {
  std::ifstream maps("/proc/self/maps");
  const std::string canon = fs::canonical(file).string();
  std::string line;
  const auto a = reinterpret_cast<uintptr_t>(p);
  while (std::getline(maps, line)) {
    if (!line.ends_with(canon)) continue;
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx", &lo, &hi) == 2 && a >= lo && a < hi) return true;
  }
  return false;
}

struct Case {
  model::Arch arch;
  DType dtype;
  uint64_t shard_bytes;
};

class HfRoundTrip : public ::testing::TestWithParam<Case> {};

TEST_P(HfRoundTrip, WriteThenLoad) {
  const Case k = GetParam();
  TempDir tmp;
  model::Config c = small_config(k.arch);
  if (k.arch == model::Arch::kLlama && k.dtype == DType::kBF16) {
    c.rope_scaling.type = model::RopeType::kLlama3;  // Llama 3 style
    c.rope_scaling.factor = 8;
    c.rope_scaling.original_max_position_embeddings = 32;
  }
  if (k.arch == model::Arch::kQwen2 && k.dtype == DType::kF16) {
    c.rope_scaling.type = model::RopeType::kYarn;
    c.rope_scaling.factor = 4;
    c.rope_scaling.original_max_position_embeddings = 16;
    c.rope_scaling.attention_factor = 1.1386294f;
    c.rope_scaling.beta_fast = 16;
    c.rope_scaling.truncate = false;
  }
  const model::Weights w = random_weights(c, 42);
  HfWriteOptions o;
  o.dtype = k.dtype;
  o.shard_bytes = k.shard_bytes;
  const std::string dir = tmp.sub("model");
  save_hf_dir(w, dir, o);
  EXPECT_TRUE(fs::exists(dir + "/config.json"));
  EXPECT_EQ(fs::exists(dir + "/model.safetensors.index.json"), k.shard_bytes > 0);
  int shards = 0;
  for (const auto& e : fs::directory_iterator(dir))
    shards += e.path().filename().string().starts_with("model-") ? 1 : 0;
  EXPECT_EQ(shards >= 2, k.shard_bytes > 0) << shards << " shard files";
  const model::Weights r = load_hf_dir(dir);
  testing::expect_same_config(c, r.config);
  expect_same(w, r, k.dtype);
  if (c.tied_embeddings) {
    EXPECT_EQ(r.lm_head.data, r.tok_embeddings.data);
    EXPECT_EQ(r.lm_head.raw, r.tok_embeddings.raw);
  }
  // Linear weights and embeddings are used in place inside the read-only mapping of the file
  // (zero copy) in their stored precision; 1-D tensors (norms, biases) are fp32.
  const model::WeightDType want = k.dtype == DType::kF32    ? model::WeightDType::kF32
                                  : k.dtype == DType::kBF16 ? model::WeightDType::kBF16
                                                            : model::WeightDType::kF16;
  EXPECT_EQ(r.layers[1].w2.dtype, want);
  EXPECT_EQ(r.tok_embeddings.dtype, want);
  EXPECT_EQ(r.final_norm.dtype, model::WeightDType::kF32);
  EXPECT_NE(r.final_norm.data, nullptr);
  const std::string file = k.shard_bytes ? "" : dir + "/model.safetensors";
  if (!file.empty()) {
    auto where = [](const model::Tensor& t) -> const void* { return t.data ? t.data : t.raw; };
    EXPECT_TRUE(in_file_mapping(where(r.layers[1].w2), file));
    EXPECT_TRUE(in_file_mapping(where(r.tok_embeddings), file));
    EXPECT_EQ(in_file_mapping(r.final_norm.data, file), k.dtype == DType::kF32);
  }
  // Same logits from the written-and-loaded model (fp32 only: exact).
  if (k.dtype == DType::kF32) {
    auto wa = std::make_shared<model::Weights>(random_weights(c, 42));
    auto wb = std::make_shared<model::Weights>(load_hf_dir(dir));
    model::Transformer ta(wa), tb(wb);
    const std::vector<int> toks = {1, 5, 7, 9, 11, 3};
    EXPECT_EQ(ta.forward(toks.data(), 6, 0), tb.forward(toks.data(), 6, 0));
  }
}

INSTANTIATE_TEST_SUITE_P(All, HfRoundTrip,
                         ::testing::Values(Case{model::Arch::kLlama, DType::kF32, 0},
                                           Case{model::Arch::kLlama, DType::kBF16, 0},
                                           Case{model::Arch::kLlama, DType::kF16, 6000},
                                           Case{model::Arch::kQwen2, DType::kF32, 0},
                                           Case{model::Arch::kQwen2, DType::kBF16, 8000},
                                           Case{model::Arch::kQwen3, DType::kF32, 9000},
                                           Case{model::Arch::kQwen3, DType::kF16, 0}),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           const Case& k = i.param;
                           return std::string(k.arch == model::Arch::kLlama   ? "Llama"
                                              : k.arch == model::Arch::kQwen2 ? "Qwen2"
                                                                              : "Qwen3") +
                                  (k.dtype == DType::kF32    ? "_F32"
                                   : k.dtype == DType::kBF16 ? "_BF16"
                                                             : "_F16") +
                                  (k.shard_bytes ? "_Sharded" : "_Single");
                         });

TEST(HfConfig, ParsesRealConfigs) {
  // Shapes of real config.json files (values abridged).
  const model::Config l3 = parse_hf_config(R"({
    "architectures": ["LlamaForCausalLM"], "hidden_size": 2048, "intermediate_size": 8192,
    "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
    "head_dim": 64, "vocab_size": 128256, "max_position_embeddings": 131072,
    "rope_theta": 500000.0, "rms_norm_eps": 1e-05, "tie_word_embeddings": true,
    "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009],
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "hidden_act": "silu", "attention_bias": false, "mlp_bias": false})",
                                           "llama3.json");
  EXPECT_EQ(l3.arch, model::Arch::kLlama);
  EXPECT_EQ(l3.head_dim, 64);
  EXPECT_EQ(l3.n_kv_heads, 8);
  EXPECT_EQ(l3.rope_theta, 500000.0f);
  EXPECT_EQ(l3.rope_scaling.factor, 32.0f);
  EXPECT_EQ(l3.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(l3.eos_token_id, 128001);
  EXPECT_TRUE(l3.tied_embeddings);
  const model::Config q2 = parse_hf_config(R"({
    "architectures": ["Qwen2ForCausalLM"], "hidden_size": 896, "intermediate_size": 4864,
    "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
    "vocab_size": 151936, "max_position_embeddings": 32768, "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-06, "tie_word_embeddings": true, "use_sliding_window": false,
    "bos_token_id": 151643, "eos_token_id": 151643, "rope_scaling": null})",
                                           "qwen2.json");
  EXPECT_EQ(q2.arch, model::Arch::kQwen2);
  EXPECT_TRUE(q2.qkv_bias);
  EXPECT_EQ(q2.head_dim, 64);
  const model::Config q3 = parse_hf_config(R"({
    "architectures": ["Qwen3ForCausalLM"], "hidden_size": 1024, "intermediate_size": 3072,
    "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
    "head_dim": 128, "vocab_size": 151936, "rope_theta": 1000000, "attention_bias": false,
    "rms_norm_eps": 1e-06, "tie_word_embeddings": true, "bos_token_id": null})",
                                           "qwen3.json");
  EXPECT_EQ(q3.arch, model::Arch::kQwen3);
  EXPECT_TRUE(q3.qk_norm);
  EXPECT_FALSE(q3.qkv_bias);
  EXPECT_EQ(q3.head_dim, 128);
  EXPECT_EQ(q3.bos_token_id, -1);
}

using scalesweep::testing::error_of;
using scalesweep::testing::throws_with;

#define EXPECT_ERROR(stmt, text) EXPECT_TRUE(throws_with([&] { stmt; }, text))

// A config.json with the Llama fields and `extra` (a JSON fragment) merged over them.
std::string llama_cfg(const std::string& extra) {
  return R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "vocab_size": 32, "max_position_embeddings": 4096)" +
         (extra.empty() ? "" : ", " + extra) + "}";
}

TEST(HfConfig, Transformers5RopeParameters) {
  // SmolLM2-135M as transformers 5 writes it: rope_theta only inside rope_parameters.
  const model::Config smol = parse_hf_config(R"({
    "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 1, "dtype": "bfloat16", "eos_token_id": 2, "head_dim": 64,
    "hidden_act": "silu", "hidden_size": 576, "initializer_range": 0.041,
    "intermediate_size": 1536, "max_position_embeddings": 8192, "mlp_bias": false,
    "model_type": "llama", "num_attention_heads": 9, "num_hidden_layers": 30,
    "num_key_value_heads": 3, "pad_token_id": 2, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"},
    "tie_word_embeddings": true, "transformers_version": "5.0.0", "use_cache": true,
    "vocab_size": 49152})",
                                             "smollm2.json");
  EXPECT_EQ(smol.rope_theta, 100000.0f);
  EXPECT_EQ(smol.rope_scaling.type, model::RopeType::kDefault);
  EXPECT_EQ(smol.max_seq_len, 8192);
  EXPECT_EQ(smol.norm_eps, 1e-5f);
  EXPECT_TRUE(smol.tied_embeddings);
  // Llama-3.1-8B as transformers 5 writes it.
  const model::Config l31 = parse_hf_config(R"({
    "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "vocab_size": 128256, "max_position_embeddings": 131072, "rms_norm_eps": 1e-05,
    "rope_parameters": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
      "original_max_position_embeddings": 8192, "rope_theta": 500000.0, "rope_type": "llama3"},
    "tie_word_embeddings": false, "dtype": "bfloat16"})",
                                            "llama31.json");
  EXPECT_EQ(l31.rope_theta, 500000.0f);
  EXPECT_EQ(l31.rope_scaling.type, model::RopeType::kLlama3);
  EXPECT_EQ(l31.rope_scaling.factor, 8.0f);
  EXPECT_EQ(l31.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_FALSE(l31.tied_embeddings);
  EXPECT_EQ(l31.head_dim, 128);
  // Both places, agreeing: accepted.
  EXPECT_EQ(parse_hf_config(llama_cfg(R"("rope_theta": 5e5,
              "rope_parameters": {"rope_theta": 500000, "rope_type": "default"})"),
                            "c.json")
                .rope_theta,
            500000.0f);
}

TEST(HfConfig, Qwen25SlidingWindowPresentButOff) {
  const model::Config q = parse_hf_config(R"({
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151645, "hidden_act": "silu", "hidden_size": 896,
    "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 21,
    "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24,
    "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "sliding_window": 32768, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
    "use_sliding_window": false, "vocab_size": 151936, "rope_scaling": null})",
                                          "qwen25.json");
  EXPECT_EQ(q.arch, model::Arch::kQwen2);
  EXPECT_EQ(q.rope_theta, 1e6f);
  EXPECT_EQ(q.head_dim, 64);
  // A window wider than every position never applies either.
  EXPECT_NO_THROW(parse_hf_config(R"({"architectures": ["Qwen2ForCausalLM"], "hidden_size": 64,
      "intermediate_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
      "num_key_value_heads": 2, "vocab_size": 8, "max_position_embeddings": 1024,
      "use_sliding_window": true, "sliding_window": 1024, "max_window_layers": 0})",
                                  "c.json"));
  // Nor does one whose max_window_layers covers every layer.
  EXPECT_NO_THROW(parse_hf_config(R"({"architectures": ["Qwen2ForCausalLM"], "hidden_size": 64,
      "intermediate_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
      "num_key_value_heads": 2, "vocab_size": 8, "max_position_embeddings": 1024,
      "use_sliding_window": true, "sliding_window": 128, "max_window_layers": 4})",
                                  "c.json"));
  EXPECT_ERROR(parse_hf_config(R"({"architectures": ["Qwen2ForCausalLM"], "hidden_size": 64,
      "intermediate_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
      "num_key_value_heads": 2, "vocab_size": 8, "max_position_embeddings": 1024,
      "use_sliding_window": true, "sliding_window": 128, "max_window_layers": 2})",
                               "c.json"),
               "c.json: use_sliding_window = true with sliding_window 128 < "
               "max_position_embeddings 1024 applies a window from layer 2");
  EXPECT_ERROR(parse_hf_config(R"({"architectures": ["Qwen3ForCausalLM"], "hidden_size": 64,
      "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
      "num_key_value_heads": 2, "vocab_size": 8, "max_position_embeddings": 1024,
      "use_sliding_window": true, "sliding_window": 128,
      "layer_types": ["full_attention", "sliding_attention"]})",
                               "c.json"),
               "applies a window from layer 1");
}

TEST(HfConfig, Qwen3HeadDimDefaultsTo128) {
  const model::Config q = parse_hf_config(R"({"architectures": ["Qwen3ForCausalLM"],
      "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 2,
      "num_attention_heads": 16, "num_key_value_heads": 8, "vocab_size": 64,
      "rope_parameters": {"rope_theta": 1000000, "rope_type": "default"}})",
                                          "c.json");
  EXPECT_EQ(q.head_dim, 128);  // not 1024 / 16
  EXPECT_EQ(q.max_seq_len, 32768);
  EXPECT_EQ(q.norm_eps, 1e-6f);
  EXPECT_FALSE(q.tied_embeddings);
  EXPECT_TRUE(q.qk_norm);
  // Qwen2/Qwen3 default num_key_value_heads is 32 (Qwen2Config), not num_attention_heads.
  EXPECT_EQ(parse_hf_config(R"({"architectures": ["Qwen2ForCausalLM"], "hidden_size": 2048,
      "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 64,
      "vocab_size": 8})",
                            "c.json")
                .n_kv_heads,
            32);
}

TEST(HfConfig, YarnLinearDynamic) {
  // Qwen2.5 long-context instructions (4.x "type" key).
  const model::Config y = parse_hf_config(R"({"architectures": ["Qwen2ForCausalLM"],
      "hidden_size": 896, "intermediate_size": 64, "num_hidden_layers": 1,
      "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 8,
      "max_position_embeddings": 131072, "rope_theta": 1000000.0,
      "rope_scaling": {"factor": 4.0, "original_max_position_embeddings": 32768,
                       "type": "yarn"}})",
                                          "c.json");
  EXPECT_EQ(y.rope_scaling.type, model::RopeType::kYarn);
  EXPECT_EQ(y.rope_scaling.factor, 4.0f);
  EXPECT_EQ(y.rope_scaling.original_max_position_embeddings, 32768);
  EXPECT_FLOAT_EQ(y.rope_scaling.attention_factor, 0.1f * std::log(4.0f) + 1);
  EXPECT_EQ(y.rope_scaling.beta_fast, 32.0f);
  EXPECT_EQ(y.rope_scaling.beta_slow, 1.0f);
  EXPECT_TRUE(y.rope_scaling.truncate);
  // Explicit attention_factor, betas, truncate; mscale / mscale_all_dim ratio.
  const model::Config y2 = parse_hf_config(llama_cfg(R"("rope_parameters": {"rope_type": "yarn",
      "rope_theta": 10000, "factor": 2, "original_max_position_embeddings": 2048,
      "attention_factor": 1.5, "beta_fast": 16, "beta_slow": 2, "truncate": false})"),
                                           "c.json");
  EXPECT_EQ(y2.rope_scaling.attention_factor, 1.5f);
  EXPECT_EQ(y2.rope_scaling.beta_fast, 16.0f);
  EXPECT_EQ(y2.rope_scaling.beta_slow, 2.0f);
  EXPECT_FALSE(y2.rope_scaling.truncate);
  const model::Config y3 = parse_hf_config(llama_cfg(R"("rope_scaling": {"rope_type": "yarn",
      "factor": 40, "original_max_position_embeddings": 4096, "mscale": 1,
      "mscale_all_dim": 0.5})"),
                                           "c.json");
  EXPECT_FLOAT_EQ(y3.rope_scaling.attention_factor,
                  (0.1f * std::log(40.0f) + 1) / (0.05f * std::log(40.0f) + 1));
  const model::Config lin =
      parse_hf_config(llama_cfg(R"("rope_scaling": {"type": "linear", "factor": 2.0})"), "c.json");
  EXPECT_EQ(lin.rope_scaling.type, model::RopeType::kLinear);
  EXPECT_EQ(lin.rope_scaling.factor, 2.0f);
  EXPECT_EQ(lin.rope_scaling.attention_factor, 1.0f);
  const model::Config dyn = parse_hf_config(
      llama_cfg(R"("rope_parameters": {"rope_type": "dynamic", "factor": 2.0})"), "c.json");
  EXPECT_EQ(dyn.rope_scaling.type, model::RopeType::kDynamic);
}

TEST(HfConfig, Errors) {
  EXPECT_ERROR(parse_hf_config(R"({"architectures": ["GPT2LMHeadModel"]})", "c.json"),
               "c.json: unsupported architecture 'GPT2LMHeadModel'");
  EXPECT_ERROR(
      parse_hf_config(R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 8})", "c.json"),
      "missing field 'intermediate_size'");
  EXPECT_ERROR(parse_hf_config("{", "c.json"), "c.json: invalid JSON");
  // Found by fuzz/hf_config_fuzz.cc: a non-string model_type escaped as nlohmann's type_error
  // ("type must be string, but is number"), naming neither the file nor the field.
  EXPECT_ERROR(parse_hf_config(llama_cfg(R"("model_type": 37)"), "c.json"),
               "c.json: field 'model_type' is 37, not a string");
  EXPECT_ERROR(parse_hf_config(R"({"model_type": ["llama"]})", "c.json"),
               "c.json: field 'model_type' is [\"llama\"], not a string");
  const std::vector<std::pair<std::string, std::string>> refused = {
      {R"("rope_scaling": {"type": "longrope", "short_factor": [1], "long_factor": [1]})",
       "c.json: unsupported rope_scaling rope_type 'longrope' (supported: default, linear, "
       "llama3, yarn, dynamic)"},
      {R"("rope_scaling": {"type": "su", "factor": 2})", "unsupported rope_scaling rope_type 'su'"},
      {R"("rope_parameters": {"rope_type": "linear", "factor": 2, "low_freq_factor": 1})",
       "rope_parameters (rope_type 'linear') has key 'low_freq_factor'"},
      {R"("rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "mystery": 1})",
       "has key 'mystery'"},
      {R"("rope_theta": 10000, "rope_parameters": {"rope_theta": 100000, "rope_type": "default"})",
       "rope_theta 10000.000000 (top level) and rope_parameters.rope_theta 100000.000000 disagree"},
      {R"("rope_scaling": {"type": "linear", "rope_type": "dynamic", "factor": 2})",
       "rope_scaling.rope_type \"dynamic\" and rope_scaling.type \"linear\" disagree"},
      {R"("rope_scaling": {"type": "linear", "factor": 2},
          "rope_parameters": {"rope_type": "linear", "factor": 4})",
       "disagree"},
      {R"("rope_scaling": {"rope_type": "llama3", "factor": 8, "low_freq_factor": 1,
          "high_freq_factor": 4})",
       "rope_scaling (rope_type 'llama3') needs 'original_max_position_embeddings'"},
      {R"("rope_scaling": {"rope_type": "llama3", "factor": 8, "high_freq_factor": 4,
          "original_max_position_embeddings": 8192})",
       "rope_scaling (rope_type 'llama3') needs 'low_freq_factor'"},
      {R"("rope_scaling": {"rope_type": "linear"})", "needs 'factor'"},
      {R"("rope_scaling": {"rope_type": "linear", "factor": -1})", "factor must be positive"},
      {R"("partial_rotary_factor": 0.5)", "partial_rotary_factor = 0.5 is not supported"},
      {R"("rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.25})",
       "rope_parameters.partial_rotary_factor = 0.25 is not supported"},
      {R"("rope_scaling": {"rope_type": "yarn", "factor": 4,
          "original_max_position_embeddings": 1024}, "original_max_position_embeddings": 2048)",
       "original_max_position_embeddings 1024 and the top-level one 2048 disagree"},
      {R"("attention_bias": true)", "attention_bias = true is not supported"},
      {R"("mlp_bias": true)", "mlp_bias = true is not supported"},
      {R"("hidden_act": "gelu")", "unsupported hidden_act 'gelu'"},
      {R"("torch_dtype": "int8")", "field 'torch_dtype' = 'int8' is not a float dtype"},
      {R"("rope_scaling": 4)", "field 'rope_scaling' is not an object"},
      {R"("head_dim": 7)", "head_dim 7 is invalid"},
  };
  for (const auto& r : refused)  // (clang 14: no structured bindings in the macro's lambda)
    EXPECT_ERROR(parse_hf_config(llama_cfg(r.first), "c.json"), r.second) << r.first;
  // The fields that do not change the math, and defaults that are transformers' own.
  const model::Config ok = parse_hf_config(llama_cfg(R"("attention_dropout": 0.1,
      "sliding_window": 16, "partial_rotary_factor": 1.0, "rope_scaling": null)"),
                                           "c.json");
  EXPECT_EQ(ok.rope_theta, 10000.0f);  // LlamaConfig default_theta
  EXPECT_EQ(ok.norm_eps, 1e-6f);
  EXPECT_FALSE(ok.tied_embeddings);
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

TEST(HfLoad, Errors) {
  TempDir tmp;
  const model::Config c = small_config(model::Arch::kLlama);
  const model::Weights w = random_weights(c, 1);
  const std::string dir = tmp.sub("m");
  save_hf_dir(w, dir, {});
  // Existing output without overwrite is refused and left intact.
  EXPECT_ERROR(save_hf_dir(w, dir, {}), dir);
  EXPECT_NO_THROW(load_hf_dir(dir));

  EXPECT_ERROR(load_hf_dir(tmp.sub("nope")), "not a directory");
  fs::create_directories(tmp.sub("empty"));
  EXPECT_ERROR(load_hf_dir(tmp.sub("empty")), "no config.json");

  // Shape mismatch: the config says a different intermediate size.
  const std::string cfg = dir + "/config.json";
  std::ifstream in(cfg);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  const std::string orig = text;
  text.replace(text.find("\"intermediate_size\": 40"), 23, "\"intermediate_size\": 48");
  write_text(cfg, text);
  EXPECT_ERROR(load_hf_dir(dir),
               "tensor 'model.layers.0.mlp.gate_proj.weight': shape mismatch, expected [48, "
               "32], got [40, 32]");
  write_text(cfg, orig);

  // Missing tensor: a file without the final norm.
  {
    SafetensorsFile f = SafetensorsFile::open(dir + "/model.safetensors");
    SafetensorsWriter wr;
    for (const auto& t : f.tensors())
      if (t.name != "model.norm.weight") wr.add(t.name, t.dtype, t.shape, f.raw(t));
    wr.write(tmp.sub("x.safetensors"));
  }
  fs::rename(tmp.sub("x.safetensors"), dir + "/model.safetensors");
  EXPECT_ERROR(load_hf_dir(dir), "missing tensor 'model.norm.weight'");

  // A non-finite weight and a non-float dtype are named.
  {
    model::Weights bad = random_weights(c, 2);
    const_cast<float*>(bad.layers[1].wk.data)[5] = NAN;
    save_hf_dir(bad, tmp.sub("nan"), {});
    EXPECT_ERROR(load_hf_dir(tmp.sub("nan")),
                 "tensor 'model.layers.1.self_attn.k_proj.weight' has a non-finite value");
  }
  {
    save_hf_dir(w, tmp.sub("i32"), {});
    SafetensorsFile f = SafetensorsFile::open(tmp.sub("i32") + "/model.safetensors");
    SafetensorsWriter wr;
    for (const auto& t : f.tensors()) {
      if (t.name == "model.norm.weight") {
        std::vector<uint8_t> b(static_cast<size_t>(t.numel()) * 4, 0);
        wr.add(t.name, StDType::kI32, t.shape, std::move(b));
      } else {
        wr.add(t.name, t.dtype, t.shape, f.raw(t));
      }
    }
    wr.write(tmp.sub("i32") + "/model.safetensors");
    EXPECT_ERROR(load_hf_dir(tmp.sub("i32")), "'model.norm.weight' has dtype I32");
  }
  // Sharded: a missing shard file is named.
  const std::string sh = tmp.sub("sharded");
  HfWriteOptions o;
  o.shard_bytes = 10000;
  save_hf_dir(w, sh, o);
  std::vector<std::string> shard_files;
  for (const auto& e : fs::directory_iterator(sh))
    if (e.path().filename().string().starts_with("model-"))
      shard_files.push_back(e.path().filename().string());
  ASSERT_GE(shard_files.size(), 2u);
  std::sort(shard_files.begin(), shard_files.end());
  fs::remove(sh + "/" + shard_files[1]);
  EXPECT_ERROR(load_hf_dir(sh), "shard '" + shard_files[1] + "'");
  fs::remove(sh + "/model.safetensors.index.json");
  EXPECT_ERROR(load_hf_dir(sh), "no model.safetensors or model.safetensors.index.json");
}

// A tensor present in a shard but missing from model.safetensors.index.json (or placed by
// the index in another shard) is an error naming the shard, the tensor and the index, for
// everything that opens the checkpoint (HfTensorFiles: inspect; load_hf_dir: the runtime).
// Was: inspect listed the checkpoint without noticing; only the loader's missing-tensor
// error caught a tensor it happened to need.
TEST(HfLoad, ShardTensorMissingFromIndex) {
  TempDir tmp;
  const model::Config c = small_config(model::Arch::kLlama);
  const model::Weights w = random_weights(c, 4);
  HfWriteOptions o;
  o.shard_bytes = 10000;
  const std::string sh = tmp.sub("sharded");
  save_hf_dir(w, sh, o);
  const std::string idx_path = sh + "/model.safetensors.index.json";
  std::ifstream in(idx_path);
  const std::string idx((std::istreambuf_iterator<char>(in)), {});
  in.close();
  EXPECT_NO_THROW(HfTensorFiles{sh});
  EXPECT_NO_THROW(load_hf_dir(sh));

  // Drop "model.norm.weight" from the index's weight_map.
  nlohmann::json j = nlohmann::json::parse(idx);
  ASSERT_TRUE(j["weight_map"].contains("model.norm.weight")) << idx;
  const std::string shard = j["weight_map"]["model.norm.weight"].get<std::string>();
  j["weight_map"].erase("model.norm.weight");
  write_text(idx_path, j.dump(2));
  const std::string want = shard + ": tensor 'model.norm.weight' is in this file but missing " +
                           "from model.safetensors.index.json";
  EXPECT_ERROR(HfTensorFiles{sh}, want);
  EXPECT_ERROR(load_hf_dir(sh), want);

  // The same tensor also in another shard than the one the index names.
  write_text(idx_path, idx);
  std::string other;
  for (const auto& de : fs::directory_iterator(sh)) {
    const std::string n = de.path().filename().string();
    if (n.starts_with("model-") && n != shard) other = n;
  }
  ASSERT_FALSE(other.empty());
  {
    const SafetensorsFile src = SafetensorsFile::open(sh + "/" + shard);
    const SafetensorsFile dst = SafetensorsFile::open(sh + "/" + other);
    SafetensorsWriter wr;
    for (const auto& t : dst.tensors()) wr.add(t.name, t.dtype, t.shape, dst.raw(t));
    const TensorInfo& norm = src.at("model.norm.weight");
    wr.add(norm.name, norm.dtype, norm.shape, src.raw(norm));
    wr.write(sh + "/" + other + ".new");
  }
  fs::rename(sh + "/" + other + ".new", sh + "/" + other);
  EXPECT_ERROR(HfTensorFiles{sh}, other + ": tensor 'model.norm.weight' is in this file but " +
                                      "model.safetensors.index.json places it in " + shard);
}

TEST(HfLoad, TokenizerFromDirectory) {
  TempDir tmp;
  model::Config c = small_config(model::Arch::kQwen2);
  const model::Weights w = random_weights(c, 3);
  // A byte-level tokenizer of 256 tokens (names are placeholders, nothing is encoded): too
  // big for vocab_size 50.
  model::BpeSpec spec;
  spec.flavor = model::BpeFlavor::kByteLevel;
  spec.split = model::SplitRegex::kLlama3;
  spec.max_digits = 1;
  for (int b = 0; b < 256; ++b) {
    char name[16];
    std::snprintf(name, sizeof name, "b%d", b);
    spec.vocab.emplace_back(name);
  }
  HfWriteOptions o;
  o.tokenizer = &spec;
  save_hf_dir(w, tmp.sub("q"), o);
  EXPECT_ERROR(load_hf_tokenizer(tmp.sub("q"), c), "vocab_size is 50");
  c.vocab_size = 300;
  auto t = load_hf_tokenizer(tmp.sub("q"), c);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->bos(), 1);  // from config.json: the tokenizer names none
  EXPECT_EQ(t->eos(), 2);
  EXPECT_EQ(load_hf_tokenizer(tmp.sub("none"), c), nullptr);
}

}  // namespace
}  // namespace scalesweep::io

// ---- mixture of experts ----------------------------------------------------------------------

namespace scalesweep::io {
namespace {

TEST(HfConfig, MixtureOfExpertsConfigs) {
  // Qwen3-30B-A3B's config.json (abridged) and Mixtral-8x7B's.
  const model::Config q = parse_hf_config(R"({
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
    "intermediate_size": 6144, "num_hidden_layers": 48, "num_attention_heads": 32,
    "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936,
    "max_position_embeddings": 40960, "rope_theta": 1000000.0, "rms_norm_eps": 1e-06,
    "decoder_sparse_step": 1, "moe_intermediate_size": 768, "num_experts": 128,
    "num_experts_per_tok": 8, "norm_topk_prob": true, "mlp_only_layers": [],
    "output_router_logits": false, "router_aux_loss_coef": 0.001, "use_sliding_window": false,
    "sliding_window": null, "max_window_layers": 48, "attention_bias": false,
    "tie_word_embeddings": false})",
                                          "qwen3moe.json");
  EXPECT_EQ(q.arch, model::Arch::kQwen3Moe);
  EXPECT_EQ(q.n_experts, 128);
  EXPECT_EQ(q.experts_per_tok, 8);
  EXPECT_EQ(q.moe_hidden_dim, 768);
  EXPECT_EQ(q.hidden_dim, 6144);
  EXPECT_TRUE(q.norm_topk_prob);
  EXPECT_TRUE(q.qk_norm);
  EXPECT_TRUE(q.moe_layer(0) && q.moe_layer(47));
  const model::Config m = parse_hf_config(R"({
    "architectures": ["MixtralForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "vocab_size": 32000, "max_position_embeddings": 32768, "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-05, "num_local_experts": 8, "num_experts_per_tok": 2,
    "router_aux_loss_coef": 0.02, "sliding_window": null, "tie_word_embeddings": false})",
                                          "mixtral.json");
  EXPECT_EQ(m.arch, model::Arch::kMixtral);
  EXPECT_EQ(m.n_experts, 8);
  EXPECT_EQ(m.experts_per_tok, 2);
  EXPECT_EQ(m.moe_hidden_dim, 14336);
  EXPECT_TRUE(m.norm_topk_prob);
  EXPECT_FALSE(m.qk_norm);
  EXPECT_EQ(m.head_dim, 128);
  // transformers' defaults: Qwen3MoeConfig (128 experts, 8 per token, width 768, head_dim
  // hidden / heads, 4 KV heads), MixtralConfig (8 experts, 2 per token, theta 1e6, eps 1e-5).
  const auto sizes_only = [](const std::string& cls, const std::string& name) {
    return parse_hf_config(std::string(R"({"architectures": [")") + cls + R"("],
    "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
    "num_attention_heads": 8, "vocab_size": 32})",
                           name);
  };
  const model::Config qd = sizes_only("Qwen3MoeForCausalLM", "qd.json");
  EXPECT_EQ(qd.n_experts, 128);
  EXPECT_EQ(qd.experts_per_tok, 8);
  EXPECT_EQ(qd.moe_hidden_dim, 768);
  EXPECT_FALSE(qd.norm_topk_prob);
  EXPECT_EQ(qd.head_dim, 8);
  EXPECT_EQ(qd.n_kv_heads, 4);
  const model::Config md = sizes_only("MixtralForCausalLM", "md.json");
  EXPECT_EQ(md.n_experts, 8);
  EXPECT_EQ(md.experts_per_tok, 2);
  EXPECT_EQ(md.rope_theta, 1e6f);
  EXPECT_FLOAT_EQ(md.norm_eps, 1e-5f);
  EXPECT_EQ(md.bos_token_id, 1);
  // Dense layers: decoder_sparse_step and mlp_only_layers; num_experts 0 is a dense model.
  const std::string base = R"({"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 64,
    "intermediate_size": 96, "num_hidden_layers": 4, "num_attention_heads": 8, "vocab_size": 32,
    "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16)";
  const model::Config s =
      parse_hf_config(base + R"(, "decoder_sparse_step": 2, "mlp_only_layers": [3]})", "s.json");
  EXPECT_FALSE(s.moe_layer(0));
  EXPECT_TRUE(s.moe_layer(1));
  EXPECT_FALSE(s.moe_layer(2));
  EXPECT_FALSE(s.moe_layer(3));
  const model::Config z = parse_hf_config(
      R"({"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 64, "intermediate_size": 96,
    "num_hidden_layers": 2, "num_attention_heads": 8, "vocab_size": 32, "num_experts": 0})",
      "z.json");
  EXPECT_FALSE(z.moe());
}

TEST(HfConfig, MixtureOfExpertsRefusals) {
  const std::string q = R"({"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 64,
    "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 8, "vocab_size": 32,
    "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16)";
  const std::string m = R"({"architectures": ["MixtralForCausalLM"], "hidden_size": 64,
    "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 8, "vocab_size": 32,
    "num_local_experts": 4)";
  const auto err = [](const std::string& text) {
    return error_of([&] { parse_hf_config(text + "}", "c.json"); });
  };
  const std::vector<std::pair<std::string, std::string>> cases = {
      {q + R"(, "shared_expert_intermediate_size": 32)",
       "c.json: field 'shared_expert_intermediate_size' = 32 (shared experts) is not supported "
       "for Qwen3MoeForCausalLM"},
      {q + R"(, "n_shared_experts": 1)", "field 'n_shared_experts' = 1 (shared experts)"},
      {q + R"(, "routed_scaling_factor": 2.5)", "field 'routed_scaling_factor' = 2.5"},
      {q + R"(, "topk_method": "noaux_tc")", "field 'topk_method' = \"noaux_tc\""},
      {q + R"(, "first_k_dense_replace": 1)", "field 'first_k_dense_replace' = 1"},
      {q + R"(, "norm_topk_prob": 1)", "field 'norm_topk_prob' is not a boolean"},
      {q + R"(, "num_experts_per_tok": 5)", "num_experts_per_tok 5 is outside [1, 4]"},
      {q + R"(, "num_local_experts": 8)", "num_experts 4 and num_local_experts 8 disagree"},
      {q + R"(, "decoder_sparse_step": 0)", "decoder_sparse_step 0 must be at least 1"},
      {q + R"(, "mlp_only_layers": [1, 2])",
       "mlp_only_layers[1] = 2 is not a layer index in [0, 2)"},
      {q + R"(, "mlp_only_layers": 1)", "field 'mlp_only_layers' is not a list"},
      {q + R"(, "attention_bias": true)", "attention_bias = true is not supported for Qwen3-MoE"},
      {q + R"(, "use_sliding_window": true, "sliding_window": 64, "max_position_embeddings": 128)",
       "sliding-window attention is not supported"},
      {m + R"(, "norm_topk_prob": false)", "norm_topk_prob = false: MixtralForCausalLM always"},
      {m + R"(, "mlp_only_layers": [0])", "mlp_only_layers is set, but MixtralForCausalLM"},
      {m + R"(, "sliding_window": 4096, "max_position_embeddings": 8192)",
       "sliding_window 4096 < max_position_embeddings 8192"},
      {m + R"(, "scoring_func": "sigmoid")", "is not supported for MixtralForCausalLM"},
  };
  for (const auto& [text, want] : cases)
    EXPECT_NE(err(text).find(want), std::string::npos) << err(text);
  // Neutral values pass: zero shared experts, softmax scoring, scale 1, Mixtral's training-only
  // jitter, a window no shorter than the context.
  EXPECT_EQ(err(q + R"(, "shared_expert_intermediate_size": 0, "scoring_func": "softmax",
    "routed_scaling_factor": 1.0, "n_group": 1, "norm_topk_prob": true)"),
            "");
  EXPECT_EQ(err(m + R"(, "router_jitter_noise": 0.1, "sliding_window": 131072)"), "");
}

// A MoE model written as per-expert tensors (Qwen3-MoE and Mixtral names) or in transformers 5's
// fused layout loads to the same weights: logits equal, bit for bit, to the in-memory model's.
// Experts in bf16 stay bf16 (in the mapping); the router is always fp32.
TEST(HfLoad, MixtureOfExpertsLayouts) {
  TempDir tmp;
  for (const model::Arch arch : {model::Arch::kQwen3Moe, model::Arch::kMixtral}) {
    const bool mixtral = arch == model::Arch::kMixtral;
    model::Config c = small_config(model::Arch::kQwen3);
    c = testing::with_experts(c, arch, 4, 2, mixtral ? c.hidden_dim : 12, /*norm_topk=*/true);
    c.moe_sparse_step = mixtral ? 1 : 2;  // Qwen3-MoE: layer 0 dense, layer 1 MoE
    c.qk_norm = !mixtral;
    c.head_dim = 8;
    c.tied_embeddings = false;
    const model::Weights w = model::testing::random_model(c, 21);
    const std::vector<int> toks = model::testing::token_stream(12, c.vocab_size);
    model::Transformer ref_tf(std::make_shared<const model::Weights>(w));
    const std::vector<float> ref = ref_tf.forward(toks.data(), 12, 0);
    // The dense fields as the config.json writer spells them (it refuses a MoE config: the
    // same config without experts), then the experts' keys by hand.
    model::Config dense = c;
    dense.n_experts = 0;
    nlohmann::json cfg = nlohmann::json::parse(hf_config_json(dense, DType::kF32));
    cfg["num_experts_per_tok"] = 2;
    cfg["norm_topk_prob"] = true;
    cfg[mixtral ? "num_local_experts" : "num_experts"] = 4;
    if (!mixtral) {
      cfg["moe_intermediate_size"] = c.moe_hidden_dim;
      cfg["decoder_sparse_step"] = 2;
    }
    const auto f32 = [](const model::Tensor& t) {
      return std::span<const float>(t.data, static_cast<size_t>(t.numel()));
    };
    for (const bool fused : {false, true}) {
      for (const bool bf16 : {false, true}) {
        const std::string dir = tmp.sub(std::string(mixtral ? "mixtral" : "qwen") +
                                        (fused ? "_fused" : "") + (bf16 ? "_bf16" : ""));
        fs::create_directories(dir);
        write_text(dir + "/config.json", cfg.dump());
        SafetensorsWriter wr;
        const auto add = [&](const std::string& name, std::vector<int64_t> shape,
                             std::vector<float> v, bool matrix = true) {
          if (bf16 && matrix) {
            std::vector<uint8_t> b(v.size() * 2);
            for (size_t i = 0; i < v.size(); ++i) {
              const uint16_t h = format::f32_to_bf16(v[i]);
              std::memcpy(&b[2 * i], &h, 2);
            }
            wr.add(name, StDType::kBF16, std::move(shape), b);
          } else {
            wr.add_f32(name, std::move(shape), v);
          }
        };
        const auto vec = [&](const model::Tensor& t) {
          return std::vector<float>(t.data, t.data + t.numel());
        };
        add("model.embed_tokens.weight", w.tok_embeddings.shape, vec(w.tok_embeddings));
        add("lm_head.weight", w.lm_head.shape, vec(w.lm_head));
        add("model.norm.weight", w.final_norm.shape, vec(w.final_norm), false);
        for (int l = 0; l < c.n_layers; ++l) {
          const model::LayerWeights& L = w.layers[static_cast<size_t>(l)];
          const std::string p = hf_layer_prefix(l);
          add(p + "input_layernorm.weight", L.attn_norm.shape, vec(L.attn_norm), false);
          add(p + "post_attention_layernorm.weight", L.ffn_norm.shape, vec(L.ffn_norm), false);
          add(p + "self_attn.q_proj.weight", L.wq.shape, vec(L.wq));
          add(p + "self_attn.k_proj.weight", L.wk.shape, vec(L.wk));
          add(p + "self_attn.v_proj.weight", L.wv.shape, vec(L.wv));
          add(p + "self_attn.o_proj.weight", L.wo.shape, vec(L.wo));
          if (c.qk_norm) {
            add(p + "self_attn.q_norm.weight", L.q_norm.shape, vec(L.q_norm), false);
            add(p + "self_attn.k_norm.weight", L.k_norm.shape, vec(L.k_norm), false);
          }
          if (!c.moe_layer(l)) {
            add(p + "mlp.gate_proj.weight", L.w1.shape, vec(L.w1));
            add(p + "mlp.up_proj.weight", L.w3.shape, vec(L.w3));
            add(p + "mlp.down_proj.weight", L.w2.shape, vec(L.w2));
            continue;
          }
          const int64_t E = c.n_experts, I = c.moe_hidden_dim, D = c.dim;
          if (fused) {
            std::vector<float> gu, dn;
            for (const auto& ex : L.experts) {
              for (const model::Tensor* t : {&ex.w1, &ex.w3})
                gu.insert(gu.end(), f32(*t).begin(), f32(*t).end());
              dn.insert(dn.end(), f32(ex.w2).begin(), f32(ex.w2).end());
            }
            add(p + "mlp.gate.weight", {E, D}, vec(L.router));
            add(p + "mlp.experts.gate_up_proj", {E, 2 * I, D}, gu);
            add(p + "mlp.experts.down_proj", {E, D, I}, dn);
            continue;
          }
          const std::string b = p + (mixtral ? "block_sparse_moe." : "mlp.");
          add(b + "gate.weight", {E, D}, vec(L.router));
          for (int64_t e = 0; e < E; ++e) {
            const auto& ex = L.experts[static_cast<size_t>(e)];
            const std::string ep = b + "experts." + std::to_string(e) + ".";
            add(ep + (mixtral ? "w1" : "gate_proj") + ".weight", {I, D}, vec(ex.w1));
            add(ep + (mixtral ? "w3" : "up_proj") + ".weight", {I, D}, vec(ex.w3));
            add(ep + (mixtral ? "w2" : "down_proj") + ".weight", {D, I}, vec(ex.w2));
          }
        }
        wr.write(dir + "/model.safetensors");
        const model::Weights got = load_hf_dir(dir);
        ASSERT_EQ(got.config.n_experts, 4) << dir;
        const model::LayerWeights& L1 = got.layers[1];
        ASSERT_EQ(L1.experts.size(), 4u) << dir;
        EXPECT_EQ(L1.router.dtype, model::WeightDType::kF32) << dir;
        EXPECT_EQ(L1.experts[3].w2.dtype,
                  bf16 ? model::WeightDType::kBF16 : model::WeightDType::kF32)
            << dir;
        model::Transformer tf(std::make_shared<const model::Weights>(got));
        const std::vector<float> out = tf.forward(toks.data(), 12, 0);
        ASSERT_EQ(out.size(), ref.size());
        double diff = 0;
        for (size_t i = 0; i < out.size(); ++i)
          diff = std::max(diff, std::fabs(double{out[i]} - ref[i]));
        if (bf16)
          EXPECT_GT(diff, 0) << dir;  // rounded weights (the router excepted) change the logits
        else
          EXPECT_EQ(diff, 0) << dir;
      }
    }
    const std::string dir = tmp.sub(std::string(mixtral ? "mixtral" : "qwen"));
    // A W4A4 MoE checkpoint: one pair of input global scales per expert of each MoE layer;
    // Linears left dense (here all of them) give 0, their inputs full precision (NVFP4
    // experts: python/tests/test_moe_quantize.py).
    const std::string qdir = tmp.sub(std::string(mixtral ? "mixtral" : "qwen") + "_ct");
    fs::create_directories(qdir);
    nlohmann::json qcfg = cfg;
    qcfg["quantization_config"] = nvfp4_quantization_config(true, 16, {"lm_head"});
    write_text(qdir + "/config.json", qcfg.dump());
    fs::copy_file(dir + "/model.safetensors", qdir + "/model.safetensors");
    const model::Weights qw = load_hf_dir(qdir);
    const CheckpointQuant cq = read_hf_checkpoint_quant(qdir, qw.config);
    EXPECT_TRUE(cq.w4a4);
    ASSERT_EQ(cq.expert_input_gs.size(), static_cast<size_t>(c.n_layers));
    for (int l = 0; l < c.n_layers; ++l) {
      const auto& ex = cq.expert_input_gs[static_cast<size_t>(l)];
      EXPECT_EQ(ex.size(), c.moe_layer(l) ? static_cast<size_t>(c.n_experts) : 0u) << l;
      for (const auto& g : ex) EXPECT_EQ(g, (std::array<float, 2>{0.0f, 0.0f})) << l;
    }
    // A missing expert tensor and a router of the wrong shape are named.
    const std::string gone = hf_layer_prefix(1) + (mixtral ? "block_sparse_moe.experts.2.w3.weight"
                                                           : "mlp.experts.2.up_proj.weight");
    const std::string router =
        hf_layer_prefix(1) + (mixtral ? "block_sparse_moe.gate.weight" : "mlp.gate.weight");
    {
      SafetensorsFile f = SafetensorsFile::open(dir + "/model.safetensors");
      SafetensorsWriter wr;
      for (const auto& t : f.tensors())
        if (t.name != gone) wr.add(t.name, t.dtype, t.shape, f.raw(t));
      wr.write(tmp.sub("x.safetensors"));
    }
    fs::rename(tmp.sub("x.safetensors"), dir + "/model.safetensors");
    EXPECT_ERROR(load_hf_dir(dir), dir + ": missing tensor '" + gone + "' (expected shape [" +
                                       std::to_string(c.moe_hidden_dim) +
                                       ", 32]) (expert 2 of 4 in layer 1)");
    {
      SafetensorsFile f = SafetensorsFile::open(dir + "/model.safetensors");
      SafetensorsWriter wr;
      for (const auto& t : f.tensors())
        if (t.name == router) {
          wr.add_f32(t.name, {3, c.dim}, std::vector<float>(static_cast<size_t>(3 * c.dim)));
        } else {
          wr.add(t.name, t.dtype, t.shape, f.raw(t));
        }
      wr.write(tmp.sub("x.safetensors"));
    }
    fs::rename(tmp.sub("x.safetensors"), dir + "/model.safetensors");
    EXPECT_ERROR(load_hf_dir(dir),
                 "tensor '" + router + "': shape mismatch, expected [4, 32], got [3, 32]");
    // Writers refuse MoE models.
    EXPECT_ERROR(
        save_hf_dir(w, tmp.sub("out"), {}),
        "mixture-of-experts models are not yet supported by the Hugging Face directory writer");
  }
}

// encode_dense_tensor gives, in parts, the bytes of the tensor's values encoded one by one, for
// a tensor held as fp32, as bf16 and packed (NVFP4: several tiles of rows, the last one short),
// for every output dtype; a tensor already held in the output dtype is one span of its own
// storage. The values: the fp32 ones, the bf16 ones widened, the NVFP4 decode.
TEST(HfWrite, DenseTensorInPartsEqualsTheWholeEncoding) {
  const int64_t rows = 2500, cols = 2048;  // tiles of 1024 rows: 1024, 1024, 452
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> byte(0, 255), scale(0x08, 0x60);
  std::vector<uint8_t> codes(static_cast<size_t>(rows * cols / 2)),
      scales(static_cast<size_t>(rows * cols / 16));
  for (auto& c : codes) c = static_cast<uint8_t>(byte(rng));
  for (auto& c : scales) c = static_cast<uint8_t>(scale(rng));
  model::Tensor nv;
  nv.shape = {rows, cols};
  nv.dtype = model::WeightDType::kNvfp4;
  nv.raw = codes.data();
  nv.nvfp4_scales = scales.data();
  nv.nvfp4_global_scale = 3.0f;
  std::vector<float> f(static_cast<size_t>(rows * cols));
  model::dequantize_rows(nv, 0, rows, f.data());
  model::Tensor f32;
  f32.shape = nv.shape;
  f32.data = f.data();
  std::vector<uint16_t> h(f.size());
  for (size_t i = 0; i < f.size(); ++i) h[i] = format::f32_to_bf16(f[i]);
  model::Tensor bf;
  bf.shape = nv.shape;
  bf.dtype = model::WeightDType::kBF16;
  bf.raw = h.data();
  std::vector<float> bfw(f.size());
  for (size_t i = 0; i < f.size(); ++i) bfw[i] = format::bf16_to_f32(h[i]);
  // The values' bytes as `dt`, one value at a time.
  const auto expected = [](const std::vector<float>& v, DType dt) {
    std::vector<uint8_t> out(v.size() * (dt == DType::kF32 ? 4 : 2));
    for (size_t i = 0; i < v.size(); ++i) {
      if (dt == DType::kF32) {
        std::memcpy(out.data() + 4 * i, &v[i], 4);
        continue;
      }
      const uint16_t x = dt == DType::kBF16 ? format::f32_to_bf16(v[i]) : format::f32_to_f16(v[i]);
      std::memcpy(out.data() + 2 * i, &x, 2);
    }
    return out;
  };
  for (const auto* t : {&f32, &bf, &nv})
    for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
      SCOPED_TRACE(std::to_string(static_cast<int>(t->dtype)) + " -> " +
                   std::to_string(static_cast<int>(dt)));
      const std::vector<uint8_t> whole = expected(t == &bf ? bfw : f, dt);
      std::vector<uint8_t> parts;
      int n = 0;
      encode_dense_tensor(*t, dt, [&](std::span<const uint8_t> b) {
        parts.insert(parts.end(), b.begin(), b.end());
        ++n;
      });
      EXPECT_EQ(parts, whole);
      const bool as_held = (t == &f32 && dt == DType::kF32) || (t == &bf && dt == DType::kBF16);
      EXPECT_EQ(n, as_held ? 1 : 3);
    }
}

}  // namespace
}  // namespace scalesweep::io
