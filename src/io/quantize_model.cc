// Whole-model NVFP4 quantization and the streaming compressed-tensors checkpoint writer.
#include "scalesweep/io/quantize_model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "io/atomic_file.h"
#include "scalesweep/format/minifloat.h"
#include "scalesweep/io/compressed_tensors.h"
#include "scalesweep/model/hf_tokenizer.h"
#include "scalesweep/model/tokenizer.h"

namespace scalesweep::io {
namespace fs = std::filesystem;
using model::InputId;
using model::LinearId;
using nlohmann::json;

namespace {

float tensor_amax(const model::Tensor& t) {
  float a = 0;
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i) a = std::max(a, std::fabs(t.data[i]));
  return a;
}

int group_of(LinearId id) {
  switch (id) {
    case LinearId::kQ:
    case LinearId::kK:
    case LinearId::kV:
      return 0;
    case LinearId::kO:
      return 1;
    case LinearId::kGate:
    case LinearId::kUp:
      return 2;
    case LinearId::kDown:
      return 3;
  }
  return 3;
}

std::vector<uint8_t> dense_bytes(const model::Tensor& t, DenseDType d) {
  const int64_t n = t.numel();
  std::vector<uint8_t> out;
  if (d == DenseDType::kF32) {
    out.resize(static_cast<size_t>(n) * 4);
    std::memcpy(out.data(), t.data, out.size());
    return out;
  }
  out.resize(static_cast<size_t>(n) * 2);
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t h =
        d == DenseDType::kBF16 ? format::f32_to_bf16(t.data[i]) : format::f32_to_f16(t.data[i]);
    out[2 * i] = static_cast<uint8_t>(h & 0xFF);
    out[2 * i + 1] = static_cast<uint8_t>(h >> 8);
  }
  return out;
}

DType dense_dtype(DenseDType d) {
  return d == DenseDType::kF32 ? DType::kF32 : d == DenseDType::kBF16 ? DType::kBF16 : DType::kF16;
}
const char* torch_dtype(DenseDType d) {
  return d == DenseDType::kF32 ? "float32" : d == DenseDType::kBF16 ? "bfloat16" : "float16";
}

bool is_weight_file(const std::string& name) {
  auto ends = [&](const char* s) {
    const size_t n = std::strlen(s);
    return name.size() >= n && name.compare(name.size() - n, n, s) == 0;
  };
  return ends(".safetensors") || name == "model.safetensors.index.json" || ends(".bin") ||
         ends(".pt") || ends(".pth") || ends(".gguf") || ends(".index.json") ||
         name == "config.json" || name == "hf_quant_config.json";
}

}  // namespace

bool needs_calibration(const QuantizeOptions& o) {
  return o.gptq || o.w4a4 || method_is_weighted(o.method);
}

void check_quantize_options(const QuantizeOptions& o, const model::CalibStats* calib,
                            bool for_checkpoint) {
  if (o.method == Method::kOptFp32)
    throw std::invalid_argument(
        "method opt-fp32 is a continuous lower bound without FP8 scales; it cannot produce "
        "quantized weights (use it in `experiment` reports only)");
  if (o.method == Method::kSweep)
    throw std::invalid_argument(
        "method 'sweep' needs a custom window; use sweep-mse or "
        "sweep-wmse");
  if (o.block != 8 && o.block != 16 && o.block != 32 && o.block != 64)
    throw std::invalid_argument("block size " + std::to_string(o.block) +
                                " is not supported (8, 16, 32, 64)");
  if (for_checkpoint && o.block != 16)
    throw std::invalid_argument(
        "compressed-tensors NVFP4 checkpoints use block 16 (vLLM's "
        "kernels); block " +
        std::to_string(o.block) + " is only available for simulation (`experiment`, `ppl`)");
  if (needs_calibration(o) && !calib) {
    std::string why = o.gptq   ? "--gptq"
                      : o.w4a4 ? "--quant WA"
                               : std::string(method_name(o.method));
    throw std::invalid_argument(
        why +
        " needs calibration statistics (Hessians, amax, importance): pass --calib TEXT "
        "(sampled with --nsamples/--seqlen/--seed) or --stats STATS.safetensors (written by "
        "`scalesweep calibrate`)");
  }
  if (o.gptq && !(o.damp > 0)) throw std::invalid_argument("--damp must be > 0");
}

std::string hf_module_name(int layer, LinearId id) {
  const std::string p = "model.layers." + std::to_string(layer) + ".";
  const std::string sub = (id == LinearId::kGate || id == LinearId::kUp || id == LinearId::kDown)
                              ? "mlp."
                              : "self_attn.";
  return p + sub + std::string(model::linear_name(id));
}

const model::Tensor& linear_weight(const model::LayerWeights& lw, LinearId id) {
  switch (id) {
    case LinearId::kQ:
      return lw.wq;
    case LinearId::kK:
      return lw.wk;
    case LinearId::kV:
      return lw.wv;
    case LinearId::kO:
      return lw.wo;
    case LinearId::kGate:
      return lw.w1;
    case LinearId::kUp:
      return lw.w3;
    case LinearId::kDown:
      return lw.w2;
  }
  return lw.w2;
}
model::Tensor& linear_weight(model::LayerWeights& lw, LinearId id) {
  return const_cast<model::Tensor&>(linear_weight(static_cast<const model::LayerWeights&>(lw), id));
}

std::vector<LinearResult> quantize_layer(const model::Weights& w, int layer,
                                         const model::CalibStats* calib,
                                         const QuantizeOptions& opt) {
  if (layer < 0 || layer >= static_cast<int>(w.layers.size()))
    throw std::invalid_argument("quantize_layer: no layer " + std::to_string(layer));
  if (calib && static_cast<int>(calib->layers.size()) != static_cast<int>(w.layers.size()))
    throw std::invalid_argument("calibration statistics have " +
                                std::to_string(calib->layers.size()) + " layers, the model " +
                                std::to_string(w.layers.size()));
  const model::LayerWeights& lw = w.layers[static_cast<size_t>(layer)];
  const float C = default_max_block_scale(opt.method);
  float group_amax[4] = {0, 0, 0, 0};
  for (LinearId id : kAllLinears)
    group_amax[group_of(id)] =
        std::max(group_amax[group_of(id)], tensor_amax(linear_weight(lw, id)));

  std::vector<LinearResult> out;
  for (LinearId id : kAllLinears) {
    const auto t0 = std::chrono::steady_clock::now();
    const model::Tensor& t = linear_weight(lw, id);
    LinearResult r;
    r.layer = layer;
    r.id = id;
    r.name = hf_module_name(layer, id);
    if (t.shape.size() != 2 || !t.data)
      throw std::invalid_argument(r.name + ": weight is not a 2-D tensor");
    const int64_t rows = t.shape[0], cols = t.shape[1];
    const model::InputStats* st = nullptr;
    if (calib) {
      st = &calib->layers[static_cast<size_t>(layer)].input(model::input_of(id));
      if (st->dim != cols || st->xtx.size() != static_cast<size_t>(cols * cols))
        throw std::invalid_argument(r.name + ": calibration input '" +
                                    std::string(model::input_name(model::input_of(id))) +
                                    "' has dimension " + std::to_string(st->dim) +
                                    ", the weight has " + std::to_string(cols) + " columns");
    }
    QuantConfig cfg;
    cfg.format = TensorFormat::kNvfp4;
    cfg.block = opt.block;
    cfg.selector.method = opt.method;
    cfg.threads = opt.threads;
    cfg.global_scale = global_scale_for_amax(group_amax[group_of(id)], C);
    if (opt.gptq) {
      if (!st) throw std::invalid_argument(r.name + ": GPTQ needs calibration statistics");
      gptq::GptqConfig g;
      g.quant = cfg;
      g.damp = opt.damp;
      g.block_size = opt.gptq_block;
      g.act_order = opt.act_order;
      g.compute_losses = true;
      gptq::GptqStats gs;
      r.q = gptq::gptq_quantize(t.data, rows, cols, st->xtx.data(), st->tokens, g, r.name, &gs);
      r.loss_rtn = gs.loss_rtn;
      r.loss_gptq = gs.loss_gptq;
    } else {
      std::vector<float> imp;
      Importance im;
      if (method_is_weighted(opt.method)) {
        if (!st) throw std::invalid_argument(r.name + ": a weighted method needs calibration");
        imp.resize(static_cast<size_t>(cols));
        for (int64_t j = 0; j < cols; ++j) imp[j] = static_cast<float>(st->diag(j));
        im = {ImportanceKind::kPerColumn, imp.data()};
      }
      r.q = quantize(t.data, rows, cols, im, cfg, r.name);
    }
    const std::vector<float> dq = dequantize(r.q);
    r.nmse = error_metrics(t.data, dq.data(), rows, cols, {}).nmse;
    if (opt.w4a4) {
      if (!st) throw std::invalid_argument(r.name + ": W4A4 needs calibration statistics");
      if (!std::isfinite(st->amax))
        throw std::invalid_argument(r.name + ": calibration input amax is not finite");
      r.input_global_scale = global_scale_for_amax(st->amax, C);
    }
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    out.push_back(std::move(r));
  }
  return out;
}

model::Weights quantized_weights(const model::Weights& w, const model::CalibStats* calib,
                                 const QuantizeOptions& opt,
                                 const std::function<void(int64_t, int64_t)>& progress,
                                 std::vector<LinearResult>* results) {
  check_quantize_options(opt, calib, false);
  model::Weights out;
  out.config = w.config;
  out.tok_embeddings = w.tok_embeddings;
  out.layers = w.layers;
  out.final_norm = w.final_norm;
  out.lm_head = w.lm_head;
  out.storage = w.storage;
  const int64_t total = static_cast<int64_t>(w.layers.size()) * 7;
  int64_t done = 0;
  for (int l = 0; l < static_cast<int>(w.layers.size()); ++l) {
    std::vector<LinearResult> rs = quantize_layer(w, l, calib, opt);
    for (auto& r : rs) {
      const std::vector<float> dq = dequantize(r.q);
      model::Tensor& t = linear_weight(out.layers[static_cast<size_t>(l)], r.id);
      const std::vector<int64_t> shape = t.shape;
      float* p = out.alloc(t, shape);
      std::copy(dq.begin(), dq.end(), p);
      if (results) {
        r.q.codes.clear();
        r.q.codes.shrink_to_fit();
        results->push_back(std::move(r));
      }
      if (progress) progress(++done, total);
    }
  }
  return out;
}

std::string hf_config_json(const model::Config& c) {
  json j = json::object();
  const char* arch = c.arch == model::Arch::kQwen2   ? "Qwen2ForCausalLM"
                     : c.arch == model::Arch::kQwen3 ? "Qwen3ForCausalLM"
                                                     : "LlamaForCausalLM";
  const char* type = c.arch == model::Arch::kQwen2   ? "qwen2"
                     : c.arch == model::Arch::kQwen3 ? "qwen3"
                                                     : "llama";
  j["architectures"] = json::array({arch});
  j["model_type"] = type;
  j["hidden_size"] = c.dim;
  j["intermediate_size"] = c.hidden_dim;
  j["num_hidden_layers"] = c.n_layers;
  j["num_attention_heads"] = c.n_heads;
  j["num_key_value_heads"] = c.n_kv_heads;
  j["head_dim"] = c.head_dim;
  j["vocab_size"] = c.vocab_size;
  j["max_position_embeddings"] = c.max_seq_len;
  j["rms_norm_eps"] = c.norm_eps;
  j["rope_theta"] = c.rope_theta;
  if (c.rope_scaling.factor > 0) {
    j["rope_scaling"] =
        json{{"rope_type", "llama3"},
             {"factor", c.rope_scaling.factor},
             {"low_freq_factor", c.rope_scaling.low_freq_factor},
             {"high_freq_factor", c.rope_scaling.high_freq_factor},
             {"original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  j["tie_word_embeddings"] = c.tied_embeddings;
  j["hidden_act"] = "silu";
  j["attention_bias"] = c.qkv_bias;
  j["bos_token_id"] = c.bos_token_id;
  j["eos_token_id"] = c.eos_token_id;
  j["torch_dtype"] = "float32";
  return j.dump(2);
}

QuantizeReport write_quantized_checkpoint(const LoadedModel& src, const std::string& src_path,
                                          const model::CalibStats* calib,
                                          const QuantizeOptions& opt, const std::string& out_dir,
                                          const WriteOptions& wopt,
                                          const std::function<void(int64_t, int64_t)>& progress) {
  const auto t0 = std::chrono::steady_clock::now();
  check_quantize_options(opt, calib, true);
  const model::Weights& w = src.weights;
  const model::Config& c = w.config;
  const bool hf_src = fs::is_directory(src_path);

  // config.json: the source's own (HF) or one made from the model config (llama2.c).
  json config;
  if (hf_src) {
    const std::string p = (fs::path(src_path) / "config.json").string();
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
    config = json::parse(hf_config_json(c));
  }
  config["torch_dtype"] = torch_dtype(wopt.dense);
  config["quantization_config"] = nvfp4_quantization_config(opt.w4a4, 16, {"lm_head"});

  AtomicDir dir(out_dir, wopt.overwrite);
  const std::string tmp = dir.path();
  const DType dd = dense_dtype(wopt.dense);

  // Declare every tensor (shapes are known before quantizing), then stream layer by layer.
  SafetensorsStreamWriter st;
  st.set_metadata("format", "pt");
  st.set_metadata("producer", "scalesweep " + std::string(method_name(opt.method)) +
                                  (opt.gptq ? " gptq" : " rtn"));
  auto declare_dense = [&](const std::string& name, const model::Tensor& t) {
    if (t.data && t.numel() > 0) st.declare(name, dd, t.shape);
  };
  auto declare_linear = [&](int l, LinearId id) {
    const std::string p = hf_module_name(l, id);
    const model::Tensor& t = linear_weight(w.layers[static_cast<size_t>(l)], id);
    const int64_t rows = t.shape.at(0), cols = t.shape.at(1);
    st.declare(p + ".weight_packed", DType::kU8, {rows, (cols + 1) / 2});
    st.declare(p + ".weight_scale", DType::kF8E4M3, {rows, (cols + 15) / 16});
    st.declare(p + ".weight_global_scale", DType::kF32, {1});
    if (opt.w4a4) st.declare(p + ".input_global_scale", DType::kF32, {1});
  };
  const std::string tok_name = "model.embed_tokens.weight";
  declare_dense(tok_name, w.tok_embeddings);
  for (int l = 0; l < c.n_layers; ++l) {
    const auto& lw = w.layers[static_cast<size_t>(l)];
    const std::string p = "model.layers." + std::to_string(l) + ".";
    declare_dense(p + "input_layernorm.weight", lw.attn_norm);
    for (LinearId id : {LinearId::kQ, LinearId::kK, LinearId::kV, LinearId::kO})
      declare_linear(l, id);
    declare_dense(p + "self_attn.q_proj.bias", lw.bq);
    declare_dense(p + "self_attn.k_proj.bias", lw.bk);
    declare_dense(p + "self_attn.v_proj.bias", lw.bv);
    declare_dense(p + "self_attn.q_norm.weight", lw.q_norm);
    declare_dense(p + "self_attn.k_norm.weight", lw.k_norm);
    declare_dense(p + "post_attention_layernorm.weight", lw.ffn_norm);
    for (LinearId id : {LinearId::kGate, LinearId::kUp, LinearId::kDown}) declare_linear(l, id);
  }
  declare_dense("model.norm.weight", w.final_norm);
  const bool write_lm_head = !c.tied_embeddings && w.lm_head.data != w.tok_embeddings.data;
  if (write_lm_head) declare_dense("lm_head.weight", w.lm_head);
  if (!write_lm_head) config["tie_word_embeddings"] = true;

  const std::string st_path = (fs::path(tmp) / "model.safetensors").string();
  st.open(st_path);
  auto write_dense = [&](const std::string& name, const model::Tensor& t) {
    if (t.data && t.numel() > 0) st.write(name, dense_bytes(t, wopt.dense));
  };
  QuantizeReport rep;
  rep.out_dir = out_dir;
  const int64_t total = static_cast<int64_t>(c.n_layers) * 7;
  int64_t done = 0;
  write_dense(tok_name, w.tok_embeddings);
  for (int l = 0; l < c.n_layers; ++l) {
    const auto& lw = w.layers[static_cast<size_t>(l)];
    const std::string p = "model.layers." + std::to_string(l) + ".";
    std::vector<LinearResult> rs = quantize_layer(w, l, calib, opt);
    auto write_linear = [&](LinearResult& r) {
      for (const TensorBlob& b : nvfp4_linear_tensors(r.name, r.q, r.input_global_scale))
        st.write(b.name, b.bytes);
      r.q.codes.clear();
      r.q.codes.shrink_to_fit();
      rep.linears.push_back(std::move(r));
      if (progress) progress(++done, total);
    };
    write_dense(p + "input_layernorm.weight", lw.attn_norm);
    for (int i = 0; i < 4; ++i) write_linear(rs[static_cast<size_t>(i)]);
    write_dense(p + "self_attn.q_proj.bias", lw.bq);
    write_dense(p + "self_attn.k_proj.bias", lw.bk);
    write_dense(p + "self_attn.v_proj.bias", lw.bv);
    write_dense(p + "self_attn.q_norm.weight", lw.q_norm);
    write_dense(p + "self_attn.k_norm.weight", lw.k_norm);
    write_dense(p + "post_attention_layernorm.weight", lw.ffn_norm);
    for (int i = 4; i < 7; ++i) write_linear(rs[static_cast<size_t>(i)]);
    if (wopt.after_layer) wopt.after_layer(l);
  }
  write_dense("model.norm.weight", w.final_norm);
  if (write_lm_head) write_dense("lm_head.weight", w.lm_head);
  st.commit();
  rep.bytes = st.total_bytes();

  write_file_atomic((fs::path(tmp) / "config.json").string(), config.dump(2) + "\n");
  // Tokenizer and the other non-weight files.
  if (hf_src) {
    for (const auto& e : fs::directory_iterator(src_path)) {
      if (!e.is_regular_file()) continue;
      const std::string name = e.path().filename().string();
      if (is_weight_file(name)) continue;
      fs::copy_file(e.path(), fs::path(tmp) / name);
    }
  } else {
    // llama2.c source: the tokenizer as Hugging Face tokenizer.json (as `convert` writes it).
    json gen{{"_from_model_config", true},
             {"bos_token_id", c.bos_token_id},
             {"eos_token_id", c.eos_token_id}};
    write_file_atomic((fs::path(tmp) / "generation_config.json").string(), gen.dump(2) + "\n");
    if (const auto* lt = dynamic_cast<const model::Llama2cTokenizer*>(src.tokenizer.get())) {
      const model::BpeSpec spec = model::sentencepiece_spec_from_llama2c(lt->vocab(), lt->scores());
      write_file_atomic((fs::path(tmp) / "tokenizer.json").string(),
                        model::tokenizer_json_string(spec));
      write_file_atomic((fs::path(tmp) / "tokenizer_config.json").string(),
                        model::tokenizer_config_json_string(spec, c.max_seq_len));
    }
  }
  dir.commit();
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return rep;
}

}  // namespace scalesweep::io
