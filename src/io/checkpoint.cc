// The compressed-tensors checkpoint writer (include/scalesweep/io/checkpoint.h).
#include "scalesweep/io/checkpoint.h"

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "io/atomic_file.h"
#include "scalesweep/base/clock.h"
#include "scalesweep/io/compressed_tensors.h"
#include "scalesweep/io/file.h"
#include "scalesweep/io/hf.h"
#include "scalesweep/io/hf_config.h"
#include "scalesweep/io/hf_names.h"
#include "scalesweep/model/hf_tokenizer.h"

namespace scalesweep::io {
namespace fs = std::filesystem;
using model::LinearId;
using nlohmann::json;

namespace {

bool is_weight_file(const std::string& name) {
  auto ends = [&](const char* s) {
    const size_t n = std::strlen(s);
    return name.size() >= n && name.compare(name.size() - n, n, s) == 0;
  };
  return ends(".safetensors") || name == "model.safetensors.index.json" || ends(".bin") ||
         ends(".pt") || ends(".pth") || ends(".gguf") || ends(".index.json") ||
         name == "config.json" || name == "hf_quant_config.json";
}

// config.json: the source's own (HF) or one made from the model config (llama2.c, GGUF).
json checkpoint_config(const CheckpointSpec& s, const std::vector<std::string>& ignore) {
  json config;
  if (s.source_is_hf_dir) {
    const std::string p = (fs::path(s.source) / "config.json").string();
    std::ifstream f(p);
    if (!f) throw IoError(p + ": cannot read");
    try {
      config = json::parse(f);
    } catch (const std::exception& e) {
      throw IoError(p + ": invalid JSON: " + e.what());
    }
    if (config.contains("quantization_config"))
      throw IoError(p + ": the source model is already quantized (quantization_config present)");
  } else {
    config = json::parse(hf_config_json(s.config, s.dense_dtype));
  }
  config["torch_dtype"] = std::string(kDTypeNames.name(s.dense_dtype));
  config["quantization_config"] = nvfp4_quantization_config(s.w4a4, 16, ignore);
  if (!s.write_lm_head) config["tie_word_embeddings"] = true;
  return config;
}

}  // namespace

struct CheckpointWriter::Impl {
  CheckpointSpec spec;
  std::vector<std::string> ignore;
  json config;
  AtomicDir dir;
  ShardedStreamWriter st;
  double write_s = 0;
  int next_layer = 0;

  Impl(const std::string& out_dir, const CheckpointSpec& s, std::vector<std::string> ign)
      : spec(s),
        ignore(std::move(ign)),
        config(checkpoint_config(s, ignore)),
        dir(out_dir, s.overwrite),
        st(s.max_shard_bytes) {}

  void write(const std::string& name, const std::vector<uint8_t>& bytes) {
    const auto w0 = std::chrono::steady_clock::now();
    st.write(name, bytes);
    write_s += seconds_since(w0);
  }
  void write_dense(const std::string& name, const model::Tensor& t) {
    if (!t.present()) throw IoError(spec.source + ": tensor '" + name + "' is missing");
    // A tile of rows at a time: a GGUF's quantized embeddings are never widened whole.
    const auto w0 = std::chrono::steady_clock::now();
    encode_dense_tensor(t, spec.dense_dtype,
                        [&](std::span<const uint8_t> b) { st.write_part(name, b); });
    write_s += seconds_since(w0);
  }
};

CheckpointWriter::CheckpointWriter(const std::string& out_dir, const CheckpointSpec& s) {
  const model::Config& c = s.config;
  // A MoE model's config.json (its experts, router and routing fields) is the source's own.
  if (c.moe() && !s.source_is_hf_dir)
    throw IoError(s.source +
                  ": a compressed-tensors checkpoint of a mixture-of-experts model "
                  "is written from a Hugging Face source directory only (its "
                  "config.json); convert the model to one first");
  // Module names left dense, as llm-compressor lists them (model order, then lm_head); the
  // routers of MoE layers.
  std::vector<std::string> ignore;
  for (int l = 0; l < c.n_layers; ++l) {
    for (LinearId id : kAllLinears) {
      if (!s.dense.contains(l, id)) continue;
      if (c.moe_layer(l) && id != LinearId::kQ && id != LinearId::kK && id != LinearId::kV &&
          id != LinearId::kO)
        throw IoError("model.layers." + std::to_string(l) + ": " +
                      std::string(model::linear_name(id)) +
                      " kept dense in a mixture-of-experts layer: its experts are always "
                      "quantized (keep-dense applies to q/k/v/o there)");
      ignore.push_back(hf_module_name(l, id));
    }
    if (c.moe_layer(l)) ignore.push_back(hf_router_module_name(c, l));
  }
  ignore.push_back("lm_head");
  impl_ = std::make_unique<Impl>(out_dir, s, std::move(ignore));
  ShardedStreamWriter& st = impl_->st;
  const StDType dd = st_dtype(s.dense_dtype);
  const int64_t dim = c.dim, hd = c.head_dim, qd = int64_t{c.n_heads} * hd,
                kvd = int64_t{c.n_kv_heads} * hd, vocab = c.vocab_size;
  st.set_metadata("format", "pt");
  st.set_metadata("producer", s.producer);
  auto declare_nvfp4 = [&](const std::string& p, int64_t rows, int64_t cols) {
    st.declare(p + ".weight_packed", StDType::kU8, {rows, (cols + 1) / 2});
    st.declare(p + ".weight_scale", StDType::kF8E4M3, {rows, (cols + 15) / 16});
    st.declare(p + ".weight_global_scale", StDType::kF32, {1});
    if (s.w4a4) st.declare(p + ".input_global_scale", StDType::kF32, {1});
  };
  auto declare_linear = [&](int l, LinearId id) {
    const std::string p = hf_module_name(l, id);
    const auto [rows, cols] = hf_linear_shape(c, id);
    if (s.dense.contains(l, id)) {
      st.declare(p + ".weight", dd, {rows, cols});
      return;
    }
    declare_nvfp4(p, rows, cols);
  };
  st.declare("model.embed_tokens.weight", dd, {vocab, dim});
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = hf_layer_prefix(l);
    st.declare(p + "input_layernorm.weight", dd, {dim});
    for (LinearId id : {LinearId::kQ, LinearId::kK, LinearId::kV, LinearId::kO})
      declare_linear(l, id);
    if (c.qkv_bias) {
      st.declare(p + "self_attn.q_proj.bias", dd, {qd});
      st.declare(p + "self_attn.k_proj.bias", dd, {kvd});
      st.declare(p + "self_attn.v_proj.bias", dd, {kvd});
    }
    if (c.qk_norm) {
      st.declare(p + "self_attn.q_norm.weight", dd, {hd});
      st.declare(p + "self_attn.k_norm.weight", dd, {hd});
    }
    st.declare(p + "post_attention_layernorm.weight", dd, {dim});
    if (c.moe_layer(l)) {
      st.declare(hf_router_module_name(c, l) + ".weight", dd, {c.n_experts, dim});
      for (int e = 0; e < c.n_experts; ++e) {
        declare_nvfp4(hf_expert_module_name(c, l, e, LinearId::kGate), c.moe_hidden_dim, dim);
        declare_nvfp4(hf_expert_module_name(c, l, e, LinearId::kUp), c.moe_hidden_dim, dim);
        declare_nvfp4(hf_expert_module_name(c, l, e, LinearId::kDown), dim, c.moe_hidden_dim);
      }
      continue;
    }
    for (LinearId id : {LinearId::kGate, LinearId::kUp, LinearId::kDown}) declare_linear(l, id);
  }
  st.declare("model.norm.weight", dd, {dim});
  if (s.write_lm_head) st.declare("lm_head.weight", dd, {vocab, dim});
  st.open(impl_->dir.path());
}

CheckpointWriter::~CheckpointWriter() = default;

void CheckpointWriter::write_embeddings(const model::Tensor& tok_embeddings) {
  impl_->write_dense("model.embed_tokens.weight", tok_embeddings);
}

void CheckpointWriter::write_layer(int l, const model::LayerWeights& lw,
                                   const std::vector<CheckpointLinear>& rs) {
  Impl& m = *impl_;
  const model::Config& c = m.spec.config;
  if (l != m.next_layer || l >= c.n_layers)
    throw std::logic_error("CheckpointWriter: layer " + std::to_string(l) +
                           " written out of order");
  const bool moe = c.moe_layer(l);
  const size_t n_linears = moe ? 4 + 3 * static_cast<size_t>(c.n_experts) : 7;
  if (rs.size() != n_linears)
    throw std::logic_error("CheckpointWriter: layer " + std::to_string(l) + " has " +
                           std::to_string(n_linears) + " Linears, given " +
                           std::to_string(rs.size()));
  const std::string p = hf_layer_prefix(l);
  // A MoE layer's experts in their places (checked before anything of the layer is written).
  static constexpr LinearId kExpert[3] = {LinearId::kGate, LinearId::kUp, LinearId::kDown};
  for (size_t i = moe ? 4 : n_linears; i < n_linears; ++i) {
    const CheckpointLinear& r = rs[i];
    const int e = static_cast<int>((i - 4) / 3);
    if (r.expert != e || r.id != kExpert[(i - 4) % 3] || !r.q)
      throw std::logic_error(hf_expert_module_name(c, l, e, kExpert[(i - 4) % 3]) +
                             ": given expert " + std::to_string(r.expert) + " " +
                             std::string(model::linear_name(r.id)) + (r.q ? "" : " dense") +
                             " in its place");
  }
  auto write_linear = [&](size_t i) {
    const CheckpointLinear& r = rs[i];
    const std::string name = hf_module_name(l, r.id);
    if (r.id != kAllLinears[i] || r.expert >= 0 ||
        (r.q == nullptr) != m.spec.dense.contains(l, r.id))
      throw std::logic_error(name + ": dense/quantized mismatch with the declared layout");
    if (!r.q) {
      m.write_dense(name + ".weight", linear_weight(lw, r.id));
    } else {
      for (const TensorBlob& b : nvfp4_linear_tensors(name, *r.q, r.input_global_scale))
        m.write(b.name, b.bytes);
    }
  };
  m.write_dense(p + "input_layernorm.weight", lw.attn_norm);
  for (size_t i = 0; i < 4; ++i) write_linear(i);
  if (c.qkv_bias) {
    m.write_dense(p + "self_attn.q_proj.bias", lw.bq);
    m.write_dense(p + "self_attn.k_proj.bias", lw.bk);
    m.write_dense(p + "self_attn.v_proj.bias", lw.bv);
  }
  if (c.qk_norm) {
    m.write_dense(p + "self_attn.q_norm.weight", lw.q_norm);
    m.write_dense(p + "self_attn.k_norm.weight", lw.k_norm);
  }
  m.write_dense(p + "post_attention_layernorm.weight", lw.ffn_norm);
  if (!moe) {
    for (size_t i = 4; i < 7; ++i) write_linear(i);
  } else {
    m.write_dense(hf_router_module_name(c, l) + ".weight", lw.router);
    for (size_t i = 4; i < n_linears; ++i) {
      const int e = static_cast<int>((i - 4) / 3);
      const std::string name = hf_expert_module_name(c, l, e, kExpert[(i - 4) % 3]);
      for (const TensorBlob& b : nvfp4_linear_tensors(name, *rs[i].q, rs[i].input_global_scale))
        m.write(b.name, b.bytes);
    }
  }
  ++m.next_layer;
}

void CheckpointWriter::write_head(const model::Tensor& final_norm, const model::Tensor& lm_head) {
  impl_->write_dense("model.norm.weight", final_norm);
  if (impl_->spec.write_lm_head) impl_->write_dense("lm_head.weight", lm_head);
}

CheckpointFiles CheckpointWriter::commit() {
  Impl& m = *impl_;
  const CheckpointSpec& s = m.spec;
  const model::Config& c = s.config;
  const fs::path tmp(m.dir.path());
  {
    const auto c0 = std::chrono::steady_clock::now();
    m.st.commit();
    m.write_s += seconds_since(c0);
  }
  CheckpointFiles out;
  out.bytes = m.st.file_bytes();
  out.files = m.st.files();
  out.ignore = m.ignore;
  write_file_atomic((tmp / "config.json").string(), m.config.dump(2) + "\n");
  // Tokenizer and the other non-weight files.
  if (s.source_is_hf_dir) {
    for (const auto& e : fs::directory_iterator(s.source)) {
      if (!e.is_regular_file()) continue;
      const std::string name = e.path().filename().string();
      if (is_weight_file(name)) continue;
      fs::copy_file(e.path(), tmp / name);
    }
    // Its own files as they are; without a generation_config.json, one from its tokenizer
    // (EOS, pad) so that a server knows where generation stops.
    if (!fs::exists(tmp / "generation_config.json"))
      write_file_atomic((tmp / "generation_config.json").string(),
                        generation_config_json(s.chat ? *s.chat : chat_meta_from_hf_dir(s.source)));
  } else {
    // llama2.c / GGUF source: the tokenizer as Hugging Face tokenizer.json (as `convert`
    // writes it).
    write_hf_chat_meta(tmp.string(), s.chat ? *s.chat : chat_meta_from_tokenizer(s.tokenizer, c));
    if (const auto* lt = dynamic_cast<const model::Llama2cTokenizer*>(s.tokenizer)) {
      const model::BpeSpec spec = model::sentencepiece_spec_from_llama2c(lt->vocab(), lt->scores());
      write_file_atomic((tmp / "tokenizer.json").string(), model::tokenizer_json_string(spec));
      write_file_atomic((tmp / "tokenizer_config.json").string(),
                        model::tokenizer_config_json_string(spec, c.max_seq_len));
    } else if (const auto* ht = dynamic_cast<const model::HfBpeTokenizer*>(s.tokenizer)) {
      // GGUF source (or an explicit tokenizer.json): the tokenizer's spec, as `convert` writes.
      write_file_atomic((tmp / "tokenizer.json").string(),
                        model::tokenizer_json_string(ht->spec()));
      write_file_atomic((tmp / "tokenizer_config.json").string(),
                        model::tokenizer_config_json_string(ht->spec(), c.max_seq_len));
    }
  }
  m.dir.commit();
  out.write_seconds = m.write_s;
  return out;
}

}  // namespace scalesweep::io
