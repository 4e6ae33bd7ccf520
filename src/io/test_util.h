// Test helpers of the io layer's tests and the layers above (header-only, gtest): a random
// model saved in a stored precision and loaded as stored, beside its fp32 widening.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "model/test_util.h"
#include "scalesweep/format/dtype.h"
#include "scalesweep/io/gguf.h"
#include "scalesweep/io/hf.h"
#include "scalesweep/io/load.h"
#include "scalesweep/io/safetensors.h"
#include "scalesweep/model/config.h"
#include "scalesweep/model/weight.h"

namespace scalesweep::io::testing {

// model::testing::random_model(c, 5) saved as a Hugging Face directory `dir` in `dtype` (bf16 or
// f16) and loaded into `stored`, its weights left in the mapping; `wide` is the same model
// widened to fp32. Call under ASSERT_NO_FATAL_FAILURE: the weights must be stored as 16-bit.
inline void load_stored_and_widened(const model::Config& c, DType dtype, const std::string& dir,
                                    LoadedModel& stored, LoadedModel& wide) {
  HfWriteOptions wo;
  wo.dtype = dtype;
  save_hf_dir(model::testing::random_model(c, 5), dir, wo);
  stored = load_model(dir);
  ASSERT_EQ(stored.weights.layers[0].wq.dtype,
            dtype == DType::kBF16 ? model::WeightDType::kBF16 : model::WeightDType::kF16);
  ASSERT_EQ(stored.weights.layers[0].wq.data, nullptr);
  wide.weights = stored.weights;
  model::materialize_f32(wide.weights);
  wide.format = stored.format;
}

// Calls fn(c, stored, wide, tmp) for a tied and an untied model::testing::tiny_config, each in
// a fresh TempDir(prefix) where load_stored_and_widened saved it in `dtype` as tmp.sub("src").
// Returns early (a fatal failure) when the weights were not stored as 16-bit.
template <class F>
void for_tiny_stored_models(DType dtype, const std::string& prefix, F fn) {
  for (bool tied : {true, false}) {
    model::testing::TempDir tmp(prefix);
    const model::Config c = model::testing::tiny_config(tied);
    LoadedModel stored, wide;
    ASSERT_NO_FATAL_FAILURE(load_stored_and_widened(c, dtype, tmp.sub("src"), stored, wide));
    fn(c, stored, wide, tmp);
  }
}

// `c` made a mixture of experts of `arch` (model::testing::with_experts); every layer is MoE
// unless the caller sets moe_sparse_step.
inline model::Config with_experts(model::Config c, model::Arch arch, int n_experts, int top_k,
                                  int moe_hidden_dim, bool norm_topk = false) {
  c.arch = arch;
  return model::testing::with_experts(c, n_experts, top_k, moe_hidden_dim, norm_topk);
}

// Checks the index of the sharded checkpoint `sharded` against `single`, the same checkpoint in
// one file: no model.safetensors beside the shards, total_size the single file's tensor bytes,
// a weight_map entry per tensor. Call under ASSERT_NO_FATAL_FAILURE; the index goes to `idx`.
inline void expect_shard_index(const std::string& sharded, const SafetensorsFile& single,
                               nlohmann::json& idx) {
  EXPECT_FALSE(std::filesystem::exists(sharded + "/model.safetensors"));
  std::ifstream in(sharded + "/model.safetensors.index.json");
  ASSERT_TRUE(in) << "no index";
  idx = nlohmann::json::parse(in);
  uint64_t total = 0;
  for (const TensorInfo& ti : single.tensors()) total += ti.nbytes;
  EXPECT_EQ(idx["metadata"]["total_size"].get<uint64_t>(), total);
  EXPECT_EQ(idx["weight_map"].size(), single.tensors().size());
}

// The scalar metadata values the GGUF reader's and writer's tests both store, under
// `prefix` + the type name: each narrow integer type at an extreme (u8 200, i8 -100, u16 60000,
// i16 -30000, u32 4000000000), f32 0.1f, bool true, string "héllo".
inline void expect_common_scalars(const GgufFile& f, const std::string& prefix) {
  EXPECT_EQ(*f.get_int(prefix + "u8"), 200);
  EXPECT_EQ(*f.get_int(prefix + "i8"), -100);
  EXPECT_EQ(*f.get_int(prefix + "u16"), 60000);
  EXPECT_EQ(*f.get_int(prefix + "i16"), -30000);
  EXPECT_EQ(*f.get_int(prefix + "u32"), 4000000000LL);
  EXPECT_EQ(*f.get_float(prefix + "f32"), static_cast<double>(0.1f));
  EXPECT_EQ(*f.get_bool(prefix + "bool"), true);
  EXPECT_EQ(*f.get_string(prefix + "string"), "h\xC3\xA9llo");
}

// Every field of two dense configs equal (a config written and read back).
inline void expect_same_config(const model::Config& a, const model::Config& b) {
  EXPECT_EQ(a.arch, b.arch);
  EXPECT_EQ(a.dim, b.dim);
  EXPECT_EQ(a.hidden_dim, b.hidden_dim);
  EXPECT_EQ(a.n_layers, b.n_layers);
  EXPECT_EQ(a.n_heads, b.n_heads);
  EXPECT_EQ(a.n_kv_heads, b.n_kv_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.max_seq_len, b.max_seq_len);
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.norm_eps, b.norm_eps);
  EXPECT_EQ(a.tied_embeddings, b.tied_embeddings);
  EXPECT_EQ(a.qkv_bias, b.qkv_bias);
  EXPECT_EQ(a.qk_norm, b.qk_norm);
  EXPECT_EQ(a.bos_token_id, b.bos_token_id);
  EXPECT_EQ(a.eos_token_id, b.eos_token_id);
  EXPECT_EQ(a.rope_scaling.type, b.rope_scaling.type);
  EXPECT_EQ(a.rope_scaling.factor, b.rope_scaling.factor);
  EXPECT_EQ(a.rope_scaling.low_freq_factor, b.rope_scaling.low_freq_factor);
  EXPECT_EQ(a.rope_scaling.high_freq_factor, b.rope_scaling.high_freq_factor);
  EXPECT_EQ(a.rope_scaling.original_max_position_embeddings,
            b.rope_scaling.original_max_position_embeddings);
  EXPECT_EQ(a.rope_scaling.beta_fast, b.rope_scaling.beta_fast);
  EXPECT_EQ(a.rope_scaling.beta_slow, b.rope_scaling.beta_slow);
  EXPECT_EQ(a.rope_scaling.truncate, b.rope_scaling.truncate);
  EXPECT_EQ(a.rope_scaling.attention_factor, b.rope_scaling.attention_factor);
}

// The test name suffix of a stored precision ("BF16", "F16").
inline std::string stored_dtype_name(const ::testing::TestParamInfo<DType>& i) {
  return i.param == DType::kBF16 ? "BF16" : "F16";
}

}  // namespace scalesweep::io::testing
