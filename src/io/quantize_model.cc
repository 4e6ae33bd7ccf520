// Whole-model NVFP4 quantization and the streaming compressed-tensors checkpoint writer.
#include "scalesweep/io/quantize_model.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "io/atomic_file.h"
#include "scalesweep/format/minifloat.h"
#include "scalesweep/io/compressed_tensors.h"
#include "scalesweep/io/hf.h"
#include "scalesweep/model/hf_tokenizer.h"
#include "scalesweep/model/tokenizer.h"
#include "scalesweep/model/transformer.h"
#include "scalesweep/model/weight.h"

namespace scalesweep::io {
namespace fs = std::filesystem;
using model::InputId;
using model::LinearId;
using nlohmann::json;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

float tensor_amax(const model::Tensor& t) {
  float a = 0;
  std::vector<float> row(static_cast<size_t>(t.cols()));
  for (int64_t r = 0; r < t.rows(); ++r) {  // a row at a time: any storage dtype
    model::dequantize_rows(t, r, r + 1, row.data());
    for (float v : row) a = std::max(a, std::fabs(v));
  }
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
  std::vector<float> widened;  // weights stored in another precision, one tensor at a time
  const float* data = t.data;
  if (t.dtype != model::WeightDType::kF32) {
    widened = model::to_f32(t);
    data = widened.data();
  }
  if (d == DenseDType::kF32) {
    out.resize(static_cast<size_t>(n) * 4);
    std::memcpy(out.data(), data, out.size());
    return out;
  }
  out.resize(static_cast<size_t>(n) * 2);
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t h =
        d == DenseDType::kBF16 ? format::f32_to_bf16(data[i]) : format::f32_to_f16(data[i]);
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

namespace {
// [N, K] of a Linear from the model config.
std::pair<int64_t, int64_t> linear_shape(const model::Config& c, LinearId id) {
  const int64_t dim = c.dim, qd = int64_t{c.n_heads} * c.head_dim,
                kvd = int64_t{c.n_kv_heads} * c.head_dim, hidden = c.hidden_dim;
  switch (id) {
    case LinearId::kQ:
      return {qd, dim};
    case LinearId::kK:
    case LinearId::kV:
      return {kvd, dim};
    case LinearId::kO:
      return {dim, qd};
    case LinearId::kGate:
    case LinearId::kUp:
      return {hidden, dim};
    case LinearId::kDown:
      return {dim, hidden};
  }
  return {0, 0};
}
}  // namespace

namespace {
void check_tp(int tp) {
  if (tp < 1 || tp > kMaxTp)
    throw std::invalid_argument("--tp " + std::to_string(tp) +
                                ": tensor-parallel size must be in 1.." + std::to_string(kMaxTp));
}
}  // namespace

bool vllm_row_parallel(LinearId id) { return id == LinearId::kO || id == LinearId::kDown; }

std::vector<UnsupportedLinear> vllm_unsupported_linears(const model::Config& c, int tp) {
  check_tp(tp);
  std::array<std::string, 7> why;
  for (LinearId id : kAllLinears) {
    const int64_t k = linear_shape(c, id).second;
    if (k % 16 != 0) {
      why[static_cast<size_t>(id)] =
          "K = " + std::to_string(k) +
          " is not a multiple of 16 (vLLM's NVFP4 layers hold weight_scale [N, K // 16] and "
          "whole 16-element blocks only)";
    } else if (tp > 1 && vllm_row_parallel(id)) {
      // vLLM (vllm/model_executor/layers/linear.py, RowParallelLinear.__init__):
      //   self.input_size_per_partition = divide(input_size, self.tp_size)
      // where divide() (vllm/distributed/utils.py) asserts input_size % tp_size == 0, then
      // quant_method.create_weights(input_size_per_partition=...); for compressed-tensors NVFP4
      // (compressed_tensors_w4a4_nvfp4.py, CompressedTensorsW4A4Fp4.create_weights; W4A16Fp4
      // alike) that allocates weight_packed [N, input_size_per_partition // 2] and
      // weight_scale [N, input_size_per_partition // group_size] with group_size 16: each
      // rank's K slice must be whole 16-element blocks.
      const std::string kt = "K = " + std::to_string(k);
      if (k % tp != 0)
        why[static_cast<size_t>(id)] =
            kt + " is not divisible by tp = " + std::to_string(tp) +
            " (vLLM's RowParallelLinear splits K across the tensor-parallel ranks)";
      else if ((k / tp) % 16 != 0)
        why[static_cast<size_t>(id)] =
            kt + " split over tp = " + std::to_string(tp) +
            " ranks gives K / tp = " + std::to_string(k / tp) +
            " per rank, not a multiple of 16 (vLLM's RowParallelLinear holds weight_scale "
            "[N, (K / tp) // 16] per rank)";
    }
  }
  // Fused in vLLM: one scheme per fused layer.
  const std::pair<std::vector<LinearId>, const char*> fused[] = {
      {{LinearId::kQ, LinearId::kK, LinearId::kV}, "qkv_proj"},
      {{LinearId::kGate, LinearId::kUp}, "gate_up_proj"}};
  for (const auto& [members, fname] : fused) {
    std::string cause;
    for (LinearId m : members)
      if (!why[static_cast<size_t>(m)].empty() && cause.empty())
        cause = std::string(model::linear_name(m)) + " cannot be quantized (" +
                why[static_cast<size_t>(m)] + ")";
    if (cause.empty()) continue;
    for (LinearId m : members)
      if (why[static_cast<size_t>(m)].empty())
        why[static_cast<size_t>(m)] = "fused into " + std::string(fname) +
                                      " in vLLM (one scheme per fused layer) and " + cause;
  }
  std::vector<UnsupportedLinear> out;
  for (LinearId id : kAllLinears)
    if (!why[static_cast<size_t>(id)].empty()) out.push_back({id, why[static_cast<size_t>(id)]});
  return out;
}

std::string vllm_tp_refusal(const model::Config& c, int tp) {
  check_tp(tp);
  for (LinearId id : kAllLinears) {
    if (vllm_row_parallel(id)) continue;
    const int64_t n = linear_shape(c, id).first;
    if (n % tp != 0)
      return "vLLM will refuse tensor_parallel_size = " + std::to_string(tp) +
             " for this model: " + std::string(model::linear_name(id)) +
             " has N = " + std::to_string(n) + " output rows, not divisible by " +
             std::to_string(tp) + " (vLLM's column-parallel Linears split N across the ranks)";
  }
  return {};
}

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
  auto is_dense = [&](LinearId id) { return opt.dense[static_cast<size_t>(id)]; };
  float group_amax[4] = {0, 0, 0, 0};
  for (LinearId id : kAllLinears)
    if (!is_dense(id))
      group_amax[group_of(id)] =
          std::max(group_amax[group_of(id)], tensor_amax(linear_weight(lw, id)));

  std::vector<LinearResult> out;
  for (LinearId id : kAllLinears) {
    const auto t0 = std::chrono::steady_clock::now();
    // GPTQ and quantize read fp32: a weight stored in another precision is widened here, one
    // Linear at a time.
    std::vector<std::shared_ptr<void>> keep;
    const model::Tensor t = model::as_f32(linear_weight(lw, id), keep);
    LinearResult r;
    r.layer = layer;
    r.id = id;
    r.name = hf_module_name(layer, id);
    if (t.shape.size() != 2 || !t.data)
      throw std::invalid_argument(r.name + ": weight is not a 2-D tensor");
    const int64_t rows = t.shape[0], cols = t.shape[1];
    if (is_dense(id)) {  // left unquantized: the writer stores the source values
      r.dense = true;
      r.q.format = TensorFormat::kNvfp4;
      r.q.rows = rows;
      r.q.cols = cols;
      r.q.block = opt.block;
      out.push_back(std::move(r));
      continue;
    }
    const model::InputStats* st = nullptr;
    if (calib) {
      // Only GPTQ reads ΣxxT; W4A4 reads the amax, weighted methods the diagonal.
      const bool need_xtx = opt.gptq;  // weighted methods read only the diagonal
      st = &calib->layers[static_cast<size_t>(layer)].input(model::input_of(id));
      if (st->dim != cols || (need_xtx && st->xtx.size() != static_cast<size_t>(cols * cols)))
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
  model::Weights out = w;  // shares every tensor and its storage; the Linears are replaced below
  const int64_t total = static_cast<int64_t>(w.layers.size()) * 7;
  int64_t done = 0;
  for (int l = 0; l < static_cast<int>(w.layers.size()); ++l) {
    std::vector<LinearResult> rs = quantize_layer(w, l, calib, opt);
    for (auto& r : rs) {
      if (r.dense) {  // the source tensor stays (shared)
        if (results) results->push_back(std::move(r));
        if (progress) progress(++done, total);
        continue;
      }
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

static json hf_rope_scaling_json(const model::RopeScaling& r) {
  using model::RopeType;
  if (r.type == RopeType::kDefault) return nullptr;
  json j = {{"rope_type", model::rope_type_name(r.type)}, {"factor", r.factor}};
  if (r.type == RopeType::kLlama3) {
    j["low_freq_factor"] = r.low_freq_factor;
    j["high_freq_factor"] = r.high_freq_factor;
    j["original_max_position_embeddings"] = r.original_max_position_embeddings;
  } else if (r.type == RopeType::kYarn) {
    j["original_max_position_embeddings"] = r.original_max_position_embeddings;
    j["attention_factor"] = r.attention_factor;
    j["beta_fast"] = r.beta_fast;
    j["beta_slow"] = r.beta_slow;
    j["truncate"] = r.truncate;
  }
  return j;
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
  j["rope_scaling"] = hf_rope_scaling_json(c.rope_scaling);
  j["tie_word_embeddings"] = c.tied_embeddings;
  j["hidden_act"] = "silu";
  j["attention_bias"] = c.qkv_bias;
  j["bos_token_id"] = c.bos_token_id;
  j["eos_token_id"] = c.eos_token_id;
  j["torch_dtype"] = "float32";
  return j.dump(2);
}

namespace {

std::atomic<int> g_live_layers{0}, g_peak_layers{0};

// A decoder layer materialized by the streamed path (instrumented: live count and peak).
struct LiveLayer {
  model::Weights w;
  explicit LiveLayer(model::Weights&& x) : w(std::move(x)) {
    const int n = ++g_live_layers;
    int p = g_peak_layers.load();
    while (n > p && !g_peak_layers.compare_exchange_weak(p, n)) {
    }
  }
  ~LiveLayer() { --g_live_layers; }
  LiveLayer(const LiveLayer&) = delete;
  LiveLayer& operator=(const LiveLayer&) = delete;
};

using WeightsPtr = std::shared_ptr<const model::Weights>;

// What the checkpoint writer pulls, in file order; each returned object is dropped as soon
// as its tensors are written.
struct CheckpointFeed {
  std::function<WeightsPtr()> embeddings;  // ->tok_embeddings
  // ->layers[l] (dense tensors) and the seven quantized Linears of layer l.
  std::function<WeightsPtr(int l, std::vector<LinearResult>& rs)> layer;
  std::function<WeightsPtr()> head;  // ->final_norm, ->lm_head
};

json checkpoint_config(const model::Config& c, const std::string& src_path, bool hf_src,
                       const QuantizeOptions& opt, const WriteOptions& wopt, bool write_lm_head,
                       const std::vector<std::string>& ignore) {
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
  config["quantization_config"] = nvfp4_quantization_config(opt.w4a4, 16, ignore);
  if (!write_lm_head) config["tie_word_embeddings"] = true;
  return config;
}

// Streams a compressed-tensors checkpoint: every tensor is declared from the config's shapes,
// then the feed is pulled embeddings, layer 0 .. n-1, head.
QuantizeReport write_checkpoint(const model::Config& c, bool write_lm_head,
                                const std::string& src_path, bool hf_src,
                                const model::Tokenizer* tokenizer, const QuantizeOptions& opt,
                                const std::string& out_dir, const WriteOptions& wopt,
                                const std::function<void(int64_t, int64_t)>& progress,
                                const CheckpointFeed& feed) {
  const auto t0 = std::chrono::steady_clock::now();
  // Module names left dense, as llm-compressor lists them (model order, then lm_head).
  std::vector<std::string> ignore;
  for (int l = 0; l < c.n_layers; ++l)
    for (LinearId id : kAllLinears)
      if (opt.dense[static_cast<size_t>(id)]) ignore.push_back(hf_module_name(l, id));
  ignore.push_back("lm_head");
  const json config = checkpoint_config(c, src_path, hf_src, opt, wopt, write_lm_head, ignore);
  AtomicDir dir(out_dir, wopt.overwrite);
  const std::string tmp = dir.path();
  const DType dd = dense_dtype(wopt.dense);
  const int64_t dim = c.dim, hd = c.head_dim, qd = int64_t{c.n_heads} * hd,
                kvd = int64_t{c.n_kv_heads} * hd, vocab = c.vocab_size;

  // Declare every tensor (shapes are known before quantizing), then stream layer by layer.
  ShardedStreamWriter st(wopt.max_shard_bytes);
  st.set_metadata("format", "pt");
  st.set_metadata("producer", "scalesweep " + std::string(method_name(opt.method)) +
                                  (opt.gptq ? " gptq" : " rtn"));
  auto declare_linear = [&](int l, LinearId id) {
    const std::string p = hf_module_name(l, id);
    const auto [rows, cols] = linear_shape(c, id);
    if (opt.dense[static_cast<size_t>(id)]) {
      st.declare(p + ".weight", dd, {rows, cols});
      return;
    }
    st.declare(p + ".weight_packed", DType::kU8, {rows, (cols + 1) / 2});
    st.declare(p + ".weight_scale", DType::kF8E4M3, {rows, (cols + 15) / 16});
    st.declare(p + ".weight_global_scale", DType::kF32, {1});
    if (opt.w4a4) st.declare(p + ".input_global_scale", DType::kF32, {1});
  };
  const std::string tok_name = "model.embed_tokens.weight";
  st.declare(tok_name, dd, {vocab, dim});
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
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
    for (LinearId id : {LinearId::kGate, LinearId::kUp, LinearId::kDown}) declare_linear(l, id);
  }
  st.declare("model.norm.weight", dd, {dim});
  if (write_lm_head) st.declare("lm_head.weight", dd, {vocab, dim});

  st.open(tmp);
  QuantizeReport rep;
  auto timed_write = [&](const std::string& name, const std::vector<uint8_t>& bytes) {
    const auto w0 = std::chrono::steady_clock::now();
    st.write(name, bytes);
    rep.phases.write += seconds_since(w0);
  };
  auto write_dense = [&](const std::string& name, const model::Tensor& t) {
    if (!t.present()) throw IoError(src_path + ": tensor '" + name + "' is missing");
    timed_write(name, dense_bytes(t, wopt.dense));
  };
  rep.out_dir = out_dir;
  rep.ignore = ignore;
  const int64_t total = static_cast<int64_t>(c.n_layers) * 7;
  int64_t done = 0;
  write_dense(tok_name, feed.embeddings()->tok_embeddings);
  for (int l = 0; l < c.n_layers; ++l) {
    std::vector<LinearResult> rs;
    WeightsPtr w = feed.layer(l, rs);
    if (rs.size() != 7) throw std::logic_error("write_checkpoint: a layer has 7 Linears");
    const auto& lw = w->layers.at(static_cast<size_t>(l));
    const std::string p = "model.layers." + std::to_string(l) + ".";
    auto write_linear = [&](LinearResult& r) {
      if (r.dense != opt.dense[static_cast<size_t>(r.id)])
        throw std::logic_error(r.name + ": dense/quantized mismatch with the declared layout");
      if (r.dense) {
        write_dense(r.name + ".weight", linear_weight(lw, r.id));
      } else {
        for (const TensorBlob& b : nvfp4_linear_tensors(r.name, r.q, r.input_global_scale))
          timed_write(b.name, b.bytes);
      }
      r.q.codes.clear();
      r.q.codes.shrink_to_fit();
      rep.linears.push_back(std::move(r));
      if (progress) progress(++done, total);
    };
    write_dense(p + "input_layernorm.weight", lw.attn_norm);
    for (int i = 0; i < 4; ++i) write_linear(rs[static_cast<size_t>(i)]);
    if (c.qkv_bias) {
      write_dense(p + "self_attn.q_proj.bias", lw.bq);
      write_dense(p + "self_attn.k_proj.bias", lw.bk);
      write_dense(p + "self_attn.v_proj.bias", lw.bv);
    }
    if (c.qk_norm) {
      write_dense(p + "self_attn.q_norm.weight", lw.q_norm);
      write_dense(p + "self_attn.k_norm.weight", lw.k_norm);
    }
    write_dense(p + "post_attention_layernorm.weight", lw.ffn_norm);
    for (int i = 4; i < 7; ++i) write_linear(rs[static_cast<size_t>(i)]);
    w.reset();
    if (wopt.after_layer) wopt.after_layer(l);
  }
  {
    WeightsPtr h = feed.head();
    write_dense("model.norm.weight", h->final_norm);
    if (write_lm_head) write_dense("lm_head.weight", h->lm_head);
  }
  {
    const auto c0 = std::chrono::steady_clock::now();
    st.commit();
    rep.phases.write += seconds_since(c0);
  }
  rep.bytes = st.file_bytes();
  rep.files = st.files();

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
    // llama2.c / GGUF source: the tokenizer as Hugging Face tokenizer.json (as `convert` writes
    // it).
    json gen{{"_from_model_config", true},
             {"bos_token_id", c.bos_token_id},
             {"eos_token_id", c.eos_token_id}};
    write_file_atomic((fs::path(tmp) / "generation_config.json").string(), gen.dump(2) + "\n");
    if (const auto* lt = dynamic_cast<const model::Llama2cTokenizer*>(tokenizer)) {
      const model::BpeSpec spec = model::sentencepiece_spec_from_llama2c(lt->vocab(), lt->scores());
      write_file_atomic((fs::path(tmp) / "tokenizer.json").string(),
                        model::tokenizer_json_string(spec));
      write_file_atomic((fs::path(tmp) / "tokenizer_config.json").string(),
                        model::tokenizer_config_json_string(spec, c.max_seq_len));
    } else if (const auto* ht = dynamic_cast<const model::HfBpeTokenizer*>(tokenizer)) {
      // GGUF source (or an explicit tokenizer.json): the tokenizer's spec, as `convert` writes.
      write_file_atomic((fs::path(tmp) / "tokenizer.json").string(),
                        model::tokenizer_json_string(ht->spec()));
      write_file_atomic((fs::path(tmp) / "tokenizer_config.json").string(),
                        model::tokenizer_config_json_string(ht->spec(), c.max_seq_len));
    }
  }
  dir.commit();
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return rep;
}

}  // namespace

namespace {
// `opt` with the Linears vLLM cannot take marked dense (WriteOptions::partial_blocks).
QuantizeOptions with_vllm_dense(const QuantizeOptions& opt, const model::Config& c,
                                const WriteOptions& wopt) {
  check_tp(wopt.tp);
  QuantizeOptions o = opt;
  if (wopt.partial_blocks == PartialBlocks::kDense)
    for (const UnsupportedLinear& u : vllm_unsupported_linears(c, wopt.tp))
      o.dense[static_cast<size_t>(u.id)] = true;
  return o;
}
}  // namespace

int streamed_layers_live() { return g_live_layers.load(); }
int streamed_layers_peak() { return g_peak_layers.load(); }
void reset_streamed_layers_peak() { g_peak_layers.store(g_live_layers.load()); }

QuantizeReport write_quantized_checkpoint(const LoadedModel& src, const std::string& src_path,
                                          const model::CalibStats* calib,
                                          const QuantizeOptions& opt_in, const std::string& out_dir,
                                          const WriteOptions& wopt,
                                          const std::function<void(int64_t, int64_t)>& progress) {
  check_quantize_options(opt_in, calib, true);
  const model::Weights& w = src.weights;
  const model::Config& c = w.config;
  const QuantizeOptions opt = with_vllm_dense(opt_in, c, wopt);
  if (static_cast<int>(w.layers.size()) != c.n_layers)
    throw std::invalid_argument(src_path + ": the model has " + std::to_string(w.layers.size()) +
                                " layers, its config " + std::to_string(c.n_layers));
  // Views of the loaded model (no copies).
  const WeightsPtr view(&w, [](const model::Weights*) {});
  CheckpointFeed feed;
  feed.embeddings = [&] { return view; };
  double quantize_s = 0;
  feed.layer = [&](int l, std::vector<LinearResult>& rs) {
    const auto q0 = std::chrono::steady_clock::now();
    rs = quantize_layer(w, l, calib, opt);
    quantize_s += seconds_since(q0);
    return view;
  };
  feed.head = [&] { return view; };
  const bool write_lm_head = !c.tied_embeddings && (w.lm_head.data != w.tok_embeddings.data ||
                                                    w.lm_head.raw != w.tok_embeddings.raw);
  QuantizeReport rep = write_checkpoint(c, write_lm_head, src_path, fs::is_directory(src_path),
                                        src.tokenizer.get(), opt, out_dir, wopt, progress, feed);
  rep.phases.quantize = quantize_s;
  return rep;
}

QuantizeReport write_quantized_checkpoint_streamed(
    const std::string& hf_dir, const StreamOptions& so, const QuantizeOptions& opt_in,
    const std::string& out_dir, const WriteOptions& wopt,
    const std::function<void(int64_t, int64_t)>& progress) {
  const bool calibrate = needs_calibration(opt_in) && !so.stats;
  if (calibrate && so.calib_text.empty())
    check_quantize_options(opt_in, nullptr, true);  // throws the user-facing message
  {
    model::CalibStats dummy;  // presence only: the real statistics come layer by layer
    check_quantize_options(opt_in, so.stats ? so.stats : (calibrate ? &dummy : nullptr), true);
  }
  const HfLazyModel src(hf_dir);
  const model::Config& c = src.config();
  const QuantizeOptions opt_d = with_vllm_dense(opt_in, c, wopt);
  const QuantizeOptions& opt = opt_d;
  if (so.stats) model::check_calib_stats(*so.stats, c);

  // Calibration: the sampled sequences' hidden states [nsamples, len, dim] stay in memory and
  // go through one layer at a time.
  std::vector<int> seqs;
  int64_t nsamp = 0, len = 0;
  std::unique_ptr<model::Tokenizer> tok;
  if (calibrate) {
    if (so.tokenizer.empty())
      tok = load_hf_tokenizer(hf_dir, c);
    else if (so.tokenizer.ends_with(".bin"))
      tok = model::Llama2cTokenizer::load(so.tokenizer, c.vocab_size);
    else
      tok = model::HfBpeTokenizer::load(so.tokenizer);
    if (!tok) throw std::runtime_error("calibration from text needs a tokenizer (--tokenizer)");
    const std::vector<int> toks = tok->encode(read_text_file(so.calib_text), false, false);
    len = std::min<int64_t>(so.seqlen, c.max_seq_len);
    const int bos = tok->add_bos() ? tok->bos() : -1;  // the tokenizer's own policy
    seqs = model::calibration_sequences(toks, so.nsamples, len, so.seed, bos, c.max_seq_len);
    nsamp = so.nsamples;
    for (size_t i = 0; i < seqs.size(); ++i)
      if (seqs[i] < 0 || seqs[i] >= c.vocab_size)
        throw std::out_of_range("token id " + std::to_string(seqs[i]) + " at index " +
                                std::to_string(i % static_cast<size_t>(len)) +
                                " outside the vocabulary of " + std::to_string(c.vocab_size));
  }
  // Weighted methods read only the diagonal, but take it from ΣxxT as the whole-model path
  // does (dsyrk's sums), so both give the same importance to the last bit.
  const bool need_xtx = opt.gptq || method_is_weighted(opt.method);
  const bool propagate_quantized = opt.gptq && so.sequential;
  std::vector<float> X;  // hidden states
  std::vector<float> tmp;
  model::CalibStats cs;  // only the current layer's entry is filled
  cs.layers.resize(static_cast<size_t>(c.n_layers));
  cs.nsamples = nsamp;
  cs.seqlen = len;
  cs.seed = so.seed;
  // One-layer runtime (KV cache for one layer, slot 0).
  std::unique_ptr<model::Transformer> tf;
  if (calibrate) {
    auto skel = std::make_shared<model::Weights>();
    skel->config = c;
    skel->config.n_layers = 1;
    skel->layers.resize(1);
    tf = std::make_unique<model::Transformer>(skel, static_cast<int>(len));
  }
  const int64_t D = c.dim;
  auto run_samples = [&](const model::LayerWeights& lw, bool observe) {
    for (int64_t s = 0; s < nsamp; ++s) {
      float* x = X.data() + s * len * D;
      if (observe && propagate_quantized) {  // statistics only: the input stays
        tmp.assign(x, x + len * D);
        x = tmp.data();
      }
      tf->forward_layer(0, lw, x, static_cast<int>(len), 0);
    }
  };

  QuantizeReport::Phases ph;
  CheckpointFeed feed;
  feed.embeddings = [&]() -> WeightsPtr {
    const auto l0 = std::chrono::steady_clock::now();
    auto e = std::make_shared<model::Weights>(src.embeddings());
    ph.load += seconds_since(l0);
    if (calibrate) {
      X.resize(static_cast<size_t>(nsamp * len * D));
      for (size_t i = 0; i < seqs.size(); ++i)
        model::dequantize_rows(e->tok_embeddings, seqs[i], seqs[i] + 1, X.data() + i * D);
    }
    return e;
  };
  feed.layer = [&](int l, std::vector<LinearResult>& rs) -> WeightsPtr {
    const auto l0 = std::chrono::steady_clock::now();
    auto holder = std::make_shared<LiveLayer>(src.layer(l));
    ph.load += seconds_since(l0);
    const model::Weights& w = holder->w;
    const model::LayerWeights& lw = w.layers[static_cast<size_t>(l)];
    const model::CalibStats* calib = so.stats;
    if (calibrate) {
      model::LayerStats& L = cs.layers[static_cast<size_t>(l)];
      model::LayerAccumulator acc(c, &L, need_xtx);
      tf->set_observer(&acc);
      const auto f0 = std::chrono::steady_clock::now();
      run_samples(lw, true);
      tf->set_observer(nullptr);
      acc.finish();
      ph.forward += seconds_since(f0) - acc.seconds();
      ph.hessians += acc.seconds();
      calib = &cs;
    }
    const auto q0 = std::chrono::steady_clock::now();
    rs = quantize_layer(w, l, calib, opt);
    ph.quantize += seconds_since(q0);
    if (calibrate) {
      cs.layers[static_cast<size_t>(l)] = {};  // free this layer's Hessians
      if (propagate_quantized) {
        // Sequential GPTQ: the next layer sees this layer's quantized outputs.
        model::LayerWeights ql = lw;
        std::vector<std::vector<float>> dq;
        for (const LinearResult& r : rs) {
          if (r.dense) continue;  // the full-precision tensor stays
          dq.push_back(dequantize(r.q));
          model::Tensor& t = linear_weight(ql, r.id);
          model::Tensor nt;
          nt.shape = t.shape;
          nt.data = dq.back().data();
          t = std::move(nt);
        }
        const auto f0 = std::chrono::steady_clock::now();
        run_samples(ql, false);
        ph.forward += seconds_since(f0);
      }
    }
    // Aliasing pointer: the layer stays alive (and counted) until the writer drops it.
    return WeightsPtr(holder, &holder->w);
  };
  feed.head = [&]() -> WeightsPtr {
    X.clear();
    X.shrink_to_fit();
    return std::make_shared<model::Weights>(src.head());
  };
  QuantizeReport rep = write_checkpoint(c, !c.tied_embeddings, hf_dir, true, nullptr, opt, out_dir,
                                        wopt, progress, feed);
  const double write_s = rep.phases.write;
  rep.phases = ph;
  rep.phases.write = write_s;
  return rep;
}

}  // namespace scalesweep::io
