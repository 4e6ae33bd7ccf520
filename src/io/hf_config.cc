#include "scalesweep/io/hf_config.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "scalesweep/io/file.h"

namespace scalesweep::io {
namespace {
using nlohmann::json;

// The shortest decimal that reads back as `f` (as Python prints a float32 widened by HF).
double shortest_decimal(float f) {
  for (int digits = 1; digits <= 9; ++digits) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.*g", digits, static_cast<double>(f));
    const double d = std::strtod(buf, nullptr);
    if (static_cast<float>(d) == f) return d;
  }
  return static_cast<double>(f);
}

json rope_scaling_json(const model::RopeScaling& r) {
  using model::RopeType;
  if (r.type == RopeType::kDefault) return nullptr;
  json j = {{"rope_type", std::string(model::kRopeTypeNames.name(r.type))},
            {"factor", shortest_decimal(r.factor)}};
  if (r.type == RopeType::kLlama3) {
    j["low_freq_factor"] = shortest_decimal(r.low_freq_factor);
    j["high_freq_factor"] = shortest_decimal(r.high_freq_factor);
    j["original_max_position_embeddings"] = r.original_max_position_embeddings;
  } else if (r.type == RopeType::kYarn) {
    j["original_max_position_embeddings"] = r.original_max_position_embeddings;
    j["attention_factor"] = shortest_decimal(r.attention_factor);
    j["beta_fast"] = shortest_decimal(r.beta_fast);
    j["beta_slow"] = shortest_decimal(r.beta_slow);
    j["truncate"] = r.truncate;
  }
  return j;
}

}  // namespace

std::string hf_config_json(const model::Config& c, DType dtype) {
  model::refuse_moe(c, "the config.json writer");
  json j = json::object();
  j["architectures"] = json::array({std::string(model::kArchClassNames.name(c.arch))});
  j["model_type"] = std::string(model::kArchNames.name(c.arch));
  j["hidden_size"] = c.dim;
  j["intermediate_size"] = c.hidden_dim;
  j["num_hidden_layers"] = c.n_layers;
  j["num_attention_heads"] = c.n_heads;
  j["num_key_value_heads"] = c.n_kv_heads;
  j["head_dim"] = c.head_dim;
  j["vocab_size"] = c.vocab_size;
  j["max_position_embeddings"] = c.max_seq_len;
  j["rms_norm_eps"] = shortest_decimal(c.norm_eps);
  j["rope_theta"] = shortest_decimal(c.rope_theta);
  j["rope_scaling"] = rope_scaling_json(c.rope_scaling);
  j["tie_word_embeddings"] = c.tied_embeddings;
  j["hidden_act"] = "silu";
  j["attention_bias"] = c.qkv_bias;
  j["bos_token_id"] = c.bos_token_id;
  j["eos_token_id"] = c.eos_token_id;
  j["torch_dtype"] = std::string(kDTypeNames.name(dtype));
  if (c.arch == model::Arch::kQwen2 || c.arch == model::Arch::kQwen3)
    j["use_sliding_window"] = false;
  return j.dump(2);
}

std::optional<DType> dtype_of_torch_dtype(std::string_view d) {
  if (d == "float64" || d == "auto") return DType::kF32;
  for (DType t : kDTypeNames.values())
    if (d == kDTypeNames.name(t)) return t;  // the torch spellings only (not f32/bf16/f16)
  return std::nullopt;
}

DType hf_dir_dtype(const std::string& dir) {
  const std::string p = (std::filesystem::path(dir) / "config.json").string();
  std::ifstream f(p);
  if (!f) throw IoError(p + ": cannot read");
  json c;
  try {
    c = json::parse(f);
  } catch (const std::exception& e) {
    throw IoError(p + ": invalid JSON: " + e.what());
  }
  for (const char* key : {"torch_dtype", "dtype"}) {
    auto it = c.find(key);
    if (it == c.end() || it->is_null()) continue;
    const std::string d = it->is_string() ? it->get<std::string>() : it->dump();
    if (const auto t = dtype_of_torch_dtype(d)) return *t;
    throw IoError(p + ": field '" + key + "' = '" + d +
                  "' is not a float dtype (float32, bfloat16, float16, float64)");
  }
  return DType::kF32;
}

}  // namespace scalesweep::io
