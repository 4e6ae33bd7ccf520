// Lossless NVFP4 conversion CT <-> GGUF (include/scalesweep/pipeline/gguf_convert.h).
#include "scalesweep/pipeline/gguf_convert.h"

#include <array>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <stdexcept>

#include "scalesweep/base/clock.h"
#include "scalesweep/io/chat_meta.h"
#include "scalesweep/io/checkpoint.h"
#include "scalesweep/io/compressed_tensors.h"
#include "scalesweep/io/gguf.h"
#include "scalesweep/io/gguf_model.h"
#include "scalesweep/io/hf.h"
#include "scalesweep/io/hf_names.h"
#include "scalesweep/io/load.h"
#include "scalesweep/model/hf_tokenizer.h"
#include "scalesweep/pipeline/quantize_model.h"
#include "scalesweep/pipeline/vllm_compat.h"

namespace scalesweep::pipeline {
namespace fs = std::filesystem;
using io::kAllLinears;
using model::LinearId;

namespace {

void say(const NoteSink& note, const std::string& s) {
  if (note) note(s);
}

// The Linears that are not NVFP4 (`is_nvfp4(l, id)` per layer): a kind dense in every layer
// is an every-layer member; others are listed per layer.
model::LinearSet dense_linears_of(const model::Config& c,
                                  const std::function<bool(int, LinearId)>& is_nvfp4) {
  model::LinearSet d;
  for (LinearId id : kAllLinears) {
    std::vector<int> layers;
    for (int l = 0; l < c.n_layers; ++l)
      if (!is_nvfp4(l, id)) layers.push_back(l);
    if (c.n_layers > 0 && static_cast<int>(layers.size()) == c.n_layers)
      d.add_every_layer(id);
    else
      for (int l : layers) d.add(l, id);
  }
  return d;
}

// "in every layer" or "in layers 1, 4" for the dense members of kind `id`.
std::string where_dense(const model::LinearSet& d, LinearId id, int n_layers) {
  if (d.every_layer(id)) return "in every layer";
  std::string s;
  for (const auto& [l, i] : d.members(n_layers))
    if (i == id) s += (s.empty() ? "in layer" : ",") + std::string(" ") + std::to_string(l);
  return s;
}

}  // namespace

bool gguf_has_nvfp4(const std::string& path) {
  if (!io::GgufFile::sniff(path)) return false;
  const io::GgufFile f = io::GgufFile::open(path);
  for (const io::GgufTensorInfo& t : f.tensors())
    if (t.type == static_cast<uint32_t>(io::GgmlType::kNVFP4)) return true;
  return false;
}

bool is_nvfp4_checkpoint(const std::string& dir) {
  if (!fs::is_directory(dir) || !fs::exists(fs::path(dir) / "config.json")) return false;
  const io::CtInfo info = io::hf_quantization_config(dir);
  return info.present && info.nvfp4;
}

Nvfp4ConvertReport convert_ct_to_gguf(const std::string& ct_dir, const std::string& out,
                                      io::GgufDense dense, bool overwrite, const NoteSink& note) {
  const auto t0 = std::chrono::steady_clock::now();
  io::refuse_moe_model(ct_dir, "convert");
  const io::CtInfo info = io::hf_quantization_config(ct_dir);
  if (!info.present || !info.nvfp4)
    throw std::runtime_error(ct_dir +
                             ": config.json declares no NVFP4 compressed-tensors "
                             "quantization_config (nvfp4-pack-quantized)");
  if (info.w4a4)
    throw std::runtime_error(
        ct_dir +
        ": a W4A4 checkpoint (input_activations): llama.cpp applies NVFP4 input scales only "
        "to the LM head, so its decoder Linears' input global scales cannot be carried over");
  const io::HfLazyModel src(ct_dir);
  const model::Config& c = src.config();
  const io::HfTensorFiles files(ct_dir);
  const io::TensorLookup lookup = files.lookup();
  const model::LinearSet not_in_ct = dense_linears_of(c, [&](int l, LinearId id) {
    return io::has_nvfp4_weight(lookup, io::hf_module_name(l, id));
  });
  // A Qwen2 checkpoint goes in llama.cpp's llama layout (every Linear NVFP4: GgufQwen2As).
  const std::array<bool, 7> too_short = io::gguf_dense_linears(c, io::GgufQwen2As::kLlama);
  io::GgufModelSpec spec;
  spec.config = c;
  spec.write_lm_head = !c.tied_embeddings;
  spec.dense_type = dense;
  spec.source = ct_dir;
  spec.overwrite = overwrite;
  spec.name = fs::path(ct_dir).filename().string();
  if (spec.name.empty()) spec.name = fs::path(ct_dir).parent_path().filename().string();
  Nvfp4ConvertReport rep;
  rep.out = out;
  spec.dense = not_in_ct;
  for (LinearId id : kAllLinears) {
    if (!too_short[static_cast<size_t>(id)]) continue;
    spec.dense.add_every_layer(id);
    if (!not_in_ct.every_layer(id))
      say(note, std::string(model::linear_name(id)) + ": " +
                    io::gguf_nvfp4_obstacle(c, id, io::GgufQwen2As::kLlama) +
                    "; its dequantized values are stored " +
                    std::string(io::kGgufDenseNames.name(dense)) + " in every layer");
  }
  // The global scales, known before the header is written.
  for (int l = 0; l < c.n_layers; ++l)
    for (LinearId id : kAllLinears) {
      if (spec.dense.contains(l, id)) continue;
      const auto [rows, cols] = io::hf_linear_shape(c, id);
      spec.global_scales.push_back(
          io::read_nvfp4_quantized(lookup, io::hf_module_name(l, id), rows, cols).global_scale);
    }
  spec.chat = io::chat_meta_from_hf_dir(ct_dir);
  spec.tokenizer_kv = io::gguf_tokenizer_kv_of_hf_dir(ct_dir);
  if (spec.tokenizer_kv.empty())
    say(note, ct_dir + " has no tokenizer.json: the GGUF gets no tokenizer (llama.cpp needs one)");
  io::GgufModelWriter w(out, spec);
  w.write_embeddings(src.embeddings().tok_embeddings);
  for (int l = 0; l < c.n_layers; ++l) {
    const model::Weights lw = src.layer(l);
    std::vector<QuantizedTensor> qs(7);
    std::vector<io::CheckpointLinear> cl;
    for (LinearId id : kAllLinears) {
      const size_t i = static_cast<size_t>(id);
      if (spec.dense.contains(l, id)) {
        cl.push_back({id, nullptr, std::nullopt});
        ++rep.dense_linears;
        continue;
      }
      const auto [rows, cols] = io::hf_linear_shape(c, id);
      qs[i] = io::read_nvfp4_quantized(lookup, io::hf_module_name(l, id), rows, cols);
      cl.push_back({id, &qs[i], std::nullopt});
      ++rep.nvfp4_linears;
    }
    w.write_layer(l, lw.layers.at(static_cast<size_t>(l)), cl);
  }
  {
    const model::Weights h = src.head();
    w.write_head(h.final_norm, h.lm_head);  // lm_head unused when tied
  }
  rep.bytes = w.commit().bytes;
  rep.seconds = seconds_since(t0);
  return rep;
}

Nvfp4ConvertReport convert_gguf_to_ct(const std::string& gguf, const std::string& out_dir,
                                      DType dense, bool overwrite, const NoteSink& note) {
  const auto t0 = std::chrono::steady_clock::now();
  io::refuse_moe_model(gguf, "convert");
  const auto f = std::make_shared<const io::GgufFile>(io::GgufFile::open(gguf));
  const model::Weights w = io::load_gguf_weights(*f, f);  // as stored, read a tensor at a time
  const model::Config& c = w.config;
  const bool permuted = io::gguf_qk_permuted(*f);
  const auto wname = [](int l, LinearId id) { return io::gguf_linear_name(l, id) + ".weight"; };
  const model::LinearSet not_nv = dense_linears_of(c, [&](int l, LinearId id) {
    return f->find_tensor(wname(l, id))->type == static_cast<uint32_t>(io::GgmlType::kNVFP4);
  });
  const auto nv = [&](int l, LinearId id) { return !not_nv.contains(l, id); };
  Nvfp4ConvertReport rep;
  rep.out = out_dir;
  io::CheckpointSpec spec;
  spec.config = c;
  spec.write_lm_head = !c.tied_embeddings;
  spec.dense = not_nv;
  for (LinearId id : kAllLinears)
    if (const std::string w = where_dense(not_nv, id, c.n_layers); !w.empty())
      say(note, std::string(model::linear_name(id)) + " is not NVFP4 in " + gguf +
                    ": kept dense (dequantized) " + w);
  if (const std::string v = vllm_mixed_fused_note(c, not_nv); !v.empty()) say(note, v);
  spec.producer = "scalesweep convert (gguf)";
  spec.dense_dtype = dense;
  spec.overwrite = overwrite;
  spec.source = gguf;
  spec.source_is_hf_dir = false;
  const std::unique_ptr<model::HfBpeTokenizer> tok = io::load_gguf_tokenizer(*f);
  spec.tokenizer = tok.get();
  spec.chat = io::read_chat_meta(gguf, tok.get(), c);
  // Recorded global scales (our writer), used when consistent with every .scale.
  std::vector<double> recorded;
  if (auto g = f->get_float_array(io::kGgufGlobalScalesKey)) recorded = *g;
  std::vector<float> gs;
  std::vector<float> scales;
  for (int l = 0; l < c.n_layers; ++l)
    for (LinearId id : kAllLinears) {
      if (!nv(l, id)) continue;
      const std::string sname = io::gguf_linear_name(l, id) + ".scale";
      const io::GgufTensorInfo* st = f->find_tensor(sname);
      float s = 1.0f;
      if (st) std::memcpy(&s, st->data, 4);  // type and shape checked by load_gguf_weights
      if (!(s > 0))
        throw std::runtime_error(gguf + ": tensor '" + sname + "' = " + std::to_string(s) +
                                 " is not positive (compressed-tensors needs gs > 0)");
      scales.push_back(s);
    }
  rep.global_scales_recorded = recorded.size() == scales.size() && !scales.empty();
  for (size_t i = 0; rep.global_scales_recorded && i < scales.size(); ++i) {
    const float g = static_cast<float>(recorded[i]);
    rep.global_scales_recorded = g > 0 && 1.0f / g == scales[i];
  }
  for (size_t i = 0; i < scales.size(); ++i)
    gs.push_back(rep.global_scales_recorded ? static_cast<float>(recorded[i]) : 1.0f / scales[i]);
  if (!rep.global_scales_recorded && !scales.empty())
    say(note, std::string("no consistent ") + io::kGgufGlobalScalesKey +
                  " record: global scales are fl(1 / scale), so dequantized values may differ "
                  "from the GGUF's in the last bit");

  io::CheckpointWriter cw(out_dir, spec);
  cw.write_embeddings(w.tok_embeddings);
  size_t k = 0;
  for (int l = 0; l < c.n_layers; ++l) {
    std::vector<QuantizedTensor> qs(7);
    std::vector<io::CheckpointLinear> cl;
    for (LinearId id : kAllLinears) {
      const size_t i = static_cast<size_t>(id);
      if (!nv(l, id)) {
        cl.push_back({id, nullptr, std::nullopt});
        ++rep.dense_linears;
        continue;
      }
      const std::string name = wname(l, id);
      const io::GgufTensorInfo* t = f->find_tensor(name);
      const int64_t cols = t->ne[0], rows = t->ne[1];
      QuantizedTensor g = io::decode_ggml_nvfp4(t->data, rows, cols, gs[k++]);
      for (size_t b = 0; b < g.scales.size(); ++b) {
        const uint8_t s = g.scales[b];
        if ((s & 0x80) || s == 0x7F)
          throw std::runtime_error(
              gguf + ": tensor '" + name + "' row " + std::to_string(b / g.blocks_per_row()) +
              " block " + std::to_string(b % g.blocks_per_row()) + ": scale byte 0x" +
              [&] {
                char h[4];
                std::snprintf(h, sizeof h, "%02X", s);
                return std::string(h);
              }() +
              (s == 0x7F ? " (ggml reads it as 0, E4M3 as NaN)" : " (negative E4M3 scale)") +
              " has no compressed-tensors equivalent");
      }
      if (permuted && (id == LinearId::kQ || id == LinearId::kK)) {  // rows back to HF order
        const std::vector<int64_t> inv = io::gguf_qk_row_order_inverse(
            id == LinearId::kQ ? c.n_heads : c.n_kv_heads, c.head_dim);
        QuantizedTensor h = g;
        const int64_t pc = g.packed_cols(), bpr = g.blocks_per_row();
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t from = inv[static_cast<size_t>(r)];
          std::memcpy(h.codes.data() + r * pc, g.codes.data() + from * pc, static_cast<size_t>(pc));
          std::memcpy(h.scales.data() + r * bpr, g.scales.data() + from * bpr,
                      static_cast<size_t>(bpr));
        }
        g = std::move(h);
      }
      qs[i] = std::move(g);
      cl.push_back({id, &qs[i], std::nullopt});
      ++rep.nvfp4_linears;
    }
    cw.write_layer(l, w.layers.at(static_cast<size_t>(l)), cl);
  }
  cw.write_head(w.final_norm, w.lm_head);
  rep.bytes = cw.commit().bytes;
  rep.seconds = seconds_since(t0);
  return rep;
}

}  // namespace scalesweep::pipeline
