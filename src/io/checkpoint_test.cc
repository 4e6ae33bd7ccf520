// io::CheckpointWriter on a small random model, its Linears quantized with quant calls only:
// the tensors and config.json it writes (read back byte for byte and loaded by the runtime),
// Hugging Face shards and their index, refusal of layers out of order or twice, and the
// atomic directory (a failure or a writer dropped before commit() leaves nothing).
#include "scalesweep/io/checkpoint.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>

#include "base/test_util.h"
#include "io/test_util.h"
#include "model/test_util.h"
#include "scalesweep/io/compressed_tensors.h"
#include "scalesweep/io/hf.h"
#include "scalesweep/io/hf_config.h"
#include "scalesweep/io/hf_names.h"
#include "scalesweep/io/safetensors.h"
#include "scalesweep/model/weight.h"
#include "scalesweep/quant/quantize.h"

namespace scalesweep::io {
namespace {
namespace fs = std::filesystem;
using model::LinearId;
using nlohmann::json;

// Every entry of `dir` (names), to see what a failed write left behind.
std::vector<std::string> entries(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

model::Config toy_config() {
  model::Config c = model::testing::tiny_config(/*tied=*/false);
  c.n_layers = 3;
  return c;
}

// The model, its Linears quantized (RTN, default selector), the dense ones of `dense` left out.
struct Toy {
  model::Weights w;
  std::vector<std::array<std::optional<QuantizedTensor>, 7>> q;  // [layer][LinearId]
};

Toy make_toy(const model::LinearSet& dense = {}) {
  Toy t;
  t.w = model::testing::random_model(toy_config(), 11);
  for (int l = 0; l < t.w.config.n_layers; ++l) {
    const model::LayerWeights& lw = t.w.layers[static_cast<size_t>(l)];
    auto& row = t.q.emplace_back();
    for (LinearId id : kAllLinears) {
      if (dense.contains(l, id)) continue;
      const model::Tensor& x = linear_weight(lw, id);
      row[static_cast<size_t>(id)] =
          quantize(x.data, x.shape[0], x.shape[1], {}, QuantConfig{}, hf_module_name(0, id));
    }
  }
  return t;
}

CheckpointSpec toy_spec(const Toy& t, const fs::path& d) {
  CheckpointSpec s;
  s.config = t.w.config;
  s.producer = "checkpoint_test";
  s.source = (d / "toy.bin").string();  // not read: a llama2.c source names config.json only
  return s;
}

std::vector<CheckpointLinear> linears_of(const Toy& t, int l, float igs = 0) {
  std::vector<CheckpointLinear> out;
  for (LinearId id : kAllLinears) {
    const auto& q = t.q[static_cast<size_t>(l)][static_cast<size_t>(id)];
    CheckpointLinear cl{id, q ? &*q : nullptr, std::nullopt};
    if (q && igs > 0) cl.input_global_scale = igs + static_cast<float>(id);
    out.push_back(cl);
  }
  return out;
}

CheckpointFiles write_all(const Toy& t, const std::string& out, const CheckpointSpec& s,
                          float igs = 0) {
  CheckpointWriter cw(out, s);
  cw.write_embeddings(t.w.tok_embeddings);
  for (int l = 0; l < t.w.config.n_layers; ++l)
    cw.write_layer(l, t.w.layers[static_cast<size_t>(l)], linears_of(t, l, igs));
  cw.write_head(t.w.final_norm, t.w.lm_head);
  return cw.commit();
}

bool same_bytes(std::span<const uint8_t> a, const model::Tensor& t) {
  return a.size() == static_cast<size_t>(t.numel()) * 4 &&
         std::memcmp(a.data(), t.data, a.size()) == 0;
}

TEST(CheckpointWriter, WritesEveryTensorConfigAndLoads) {
  const scalesweep::testing::TempDir tmp("ss_io_ckpt_test_full");
  const fs::path& d = tmp.path();
  model::LinearSet dense;
  dense.add_every_layer(LinearId::kV);  // one Linear stored dense in every layer
  dense.add(1, LinearId::kDown);        // and one in layer 1 only
  const Toy t = make_toy(dense);
  CheckpointSpec s = toy_spec(t, d);
  s.dense = dense;
  s.w4a4 = true;
  const std::string out = (d / "out").string();
  const CheckpointFiles files = write_all(t, out, s, 100.f);
  EXPECT_EQ(files.files, std::vector<std::string>{"model.safetensors"});
  EXPECT_EQ(files.bytes, fs::file_size(out + "/model.safetensors"));
  const std::vector<std::string> ignore = {
      "model.layers.0.self_attn.v_proj", "model.layers.1.self_attn.v_proj",
      "model.layers.1.mlp.down_proj", "model.layers.2.self_attn.v_proj", "lm_head"};
  EXPECT_EQ(files.ignore, ignore);
  EXPECT_FALSE(fs::exists(out + "/model.safetensors.index.json"));
  EXPECT_TRUE(fs::exists(out + "/generation_config.json"));
  EXPECT_EQ(entries(d), std::vector<std::string>{"out"}) << "a temporary directory is left";

  std::ifstream cf(out + "/config.json");
  const json cfg = json::parse(cf);
  EXPECT_EQ(cfg["quantization_config"]["ignore"].get<std::vector<std::string>>(), ignore);
  EXPECT_EQ(cfg["torch_dtype"], "float32");
  EXPECT_EQ(cfg["num_hidden_layers"], 3);
  EXPECT_EQ(cfg["intermediate_size"], 48);
  EXPECT_TRUE(parse_quantization_config(cfg, "config.json").w4a4);
  EXPECT_EQ(hf_quantization_config(out).ignore, ignore);  // the reader gets the list back

  const SafetensorsFile f = SafetensorsFile::open(out + "/model.safetensors");
  EXPECT_EQ(f.metadata().at("producer"), "checkpoint_test");
  const TensorLookup lk = [&](std::string_view n) -> TensorRef {
    const TensorInfo* ti = f.find(n);
    return ti ? TensorRef{&f, ti} : TensorRef{};
  };
  EXPECT_TRUE(same_bytes(f.raw("model.embed_tokens.weight"), t.w.tok_embeddings));
  EXPECT_TRUE(same_bytes(f.raw("lm_head.weight"), t.w.lm_head));
  EXPECT_TRUE(same_bytes(f.raw("model.norm.weight"), t.w.final_norm));
  size_t expected_tensors = 3 + 0;  // embeddings, final norm, lm_head
  for (int l = 0; l < 3; ++l) {
    const model::LayerWeights& lw = t.w.layers[static_cast<size_t>(l)];
    const std::string p = hf_layer_prefix(l);
    EXPECT_TRUE(same_bytes(f.raw(p + "input_layernorm.weight"), lw.attn_norm));
    EXPECT_TRUE(same_bytes(f.raw(p + "post_attention_layernorm.weight"), lw.ffn_norm));
    expected_tensors += 2;
    for (LinearId id : kAllLinears) {
      const std::string name = hf_module_name(l, id);
      const model::Tensor& src = linear_weight(lw, id);
      const auto& q = t.q[static_cast<size_t>(l)][static_cast<size_t>(id)];
      if (!q) {
        EXPECT_TRUE(same_bytes(f.raw(name + ".weight"), src)) << name;
        EXPECT_FALSE(f.contains(name + ".weight_packed")) << name;
        EXPECT_FALSE(f.contains(name + ".input_global_scale")) << name;
        expected_tensors += 1;
        continue;
      }
      EXPECT_FALSE(f.contains(name + ".weight")) << name;
      const std::vector<float> back = read_nvfp4_weight(lk, name, src.shape[0], src.shape[1]);
      const std::vector<float> ref = dequantize(*q);
      ASSERT_EQ(back.size(), ref.size());
      EXPECT_EQ(std::memcmp(back.data(), ref.data(), 4 * ref.size()), 0) << name;
      EXPECT_EQ(read_input_global_scale(lk, name), 100.f + static_cast<float>(id)) << name;
      expected_tensors += 4;
    }
  }
  EXPECT_EQ(f.tensors().size(), expected_tensors);

  // The runtime loads it: NVFP4 Linears as their dequantization, the dense one as given.
  const model::Weights back = load_hf_dir(out);
  for (int l = 0; l < 3; ++l)
    for (LinearId id : kAllLinears) {
      const auto& q = t.q[static_cast<size_t>(l)][static_cast<size_t>(id)];
      const model::Tensor& src = linear_weight(t.w.layers[static_cast<size_t>(l)], id);
      const std::vector<float> want =
          q ? dequantize(*q) : std::vector<float>(src.data, src.data + src.numel());
      EXPECT_EQ(model::to_f32(linear_weight(back.layers[static_cast<size_t>(l)], id)), want)
          << hf_module_name(l, id);
    }
}

// Shards of at most max_shard_bytes of tensor data, named as Hugging Face names them, with an
// index mapping every tensor to its shard; the same tensors, byte for byte, as one file.
TEST(CheckpointWriter, ShardsAndIndex) {
  const scalesweep::testing::TempDir tmp("ss_io_ckpt_test_shards");
  const fs::path& d = tmp.path();
  const Toy t = make_toy();
  CheckpointSpec s = toy_spec(t, d);
  const std::string one = (d / "one").string(), sharded = (d / "sharded").string();
  s.max_shard_bytes = 0;
  const CheckpointFiles f1 = write_all(t, one, s);
  EXPECT_EQ(f1.files, std::vector<std::string>{"model.safetensors"});
  s.max_shard_bytes = 4000;  // the embeddings and lm_head (40 x 32 x 4 = 5120) alone
  const CheckpointFiles fn = write_all(t, sharded, s);
  ASSERT_GT(fn.files.size(), 3u);
  for (size_t i = 0; i < fn.files.size(); ++i) {
    char want[64];
    std::snprintf(want, sizeof want, "model-%05zu-of-%05zu.safetensors", i + 1, fn.files.size());
    EXPECT_EQ(fn.files[i], want);
  }
  const SafetensorsFile single = SafetensorsFile::open(one + "/model.safetensors");
  json idx;
  ASSERT_NO_FATAL_FAILURE(testing::expect_shard_index(sharded, single, idx));
  std::map<std::string, std::unique_ptr<SafetensorsFile>> shards;
  uint64_t on_disk = 0;
  for (const std::string& name : fn.files) {
    shards[name] = std::make_unique<SafetensorsFile>(SafetensorsFile::open(sharded + "/" + name));
    uint64_t data = 0;
    for (const TensorInfo& ti : shards[name]->tensors()) data += ti.nbytes;
    EXPECT_TRUE(data <= 4000 || shards[name]->tensors().size() == 1) << name;
    on_disk += fs::file_size(sharded + "/" + name);
  }
  EXPECT_EQ(fn.bytes, on_disk);
  for (const TensorInfo& ti : single.tensors()) {
    ASSERT_TRUE(idx["weight_map"].contains(ti.name)) << ti.name;
    const SafetensorsFile& sf = *shards.at(idx["weight_map"][ti.name].get<std::string>());
    const TensorInfo& tj = sf.at(ti.name);
    EXPECT_EQ(tj.dtype, ti.dtype) << ti.name;
    EXPECT_EQ(tj.shape, ti.shape) << ti.name;
    const auto a = single.raw(ti), b = sf.raw(tj);
    EXPECT_TRUE(std::equal(a.begin(), a.end(), b.begin(), b.end())) << ti.name;
  }
}

using scalesweep::testing::error_of;
using scalesweep::testing::throws_with;

// Layers must be pushed 0 .. n-1, once each, after the embeddings; every refusal, and every
// writer dropped before commit(), leaves neither the output nor a temporary directory.
TEST(CheckpointWriter, RefusesOutOfOrderAndDuplicateLayers) {
  const scalesweep::testing::TempDir tmp("ss_io_ckpt_test_order");
  const fs::path& d = tmp.path();
  const Toy t = make_toy();
  const CheckpointSpec s = toy_spec(t, d);
  const std::string out = (d / "out").string();
  const auto& L = t.w.layers;
  {
    CheckpointWriter cw(out, s);
    cw.write_embeddings(t.w.tok_embeddings);
    EXPECT_TRUE(throws_with([&] { cw.write_layer(1, L[1], linears_of(t, 1)); },
                            "layer 1 written out of order"));
    cw.write_layer(0, L[0], linears_of(t, 0));
    EXPECT_TRUE(throws_with([&] { cw.write_layer(0, L[0], linears_of(t, 0)); },
                            "layer 0 written out of order"))
        << "a duplicate layer is accepted";
    cw.write_layer(1, L[1], linears_of(t, 1));
    EXPECT_TRUE(throws_with([&] { cw.write_layer(3, L[2], linears_of(t, 2)); },
                            "layer 3 written out of order"))
        << "a layer beyond n_layers is accepted";
    // The head before layer 2: the file's tensor order is refused, naming the tensor.
    const std::string e = error_of([&] { cw.write_head(t.w.final_norm, t.w.lm_head); });
    EXPECT_NE(e.find("model.norm.weight"), std::string::npos) << e;
    EXPECT_FALSE(fs::exists(out));
  }
  EXPECT_TRUE(entries(d).empty()) << "left behind: " << entries(d).front();
  {  // a layer before the embeddings
    CheckpointWriter cw(out, s);
    const std::string e = error_of([&] { cw.write_layer(0, L[0], linears_of(t, 0)); });
    EXPECT_NE(e.find("model.layers.0.input_layernorm.weight"), std::string::npos) << e;
  }
  EXPECT_TRUE(entries(d).empty());
  {  // Linears out of order, or quantized where the spec declared them dense
    CheckpointWriter cw(out, s);
    cw.write_embeddings(t.w.tok_embeddings);
    std::vector<CheckpointLinear> swapped = linears_of(t, 0);
    std::swap(swapped[0], swapped[1]);
    EXPECT_TRUE(throws_with([&] { cw.write_layer(0, L[0], swapped); }, "mismatch"));
  }
  EXPECT_TRUE(entries(d).empty());
  {  // commit() with a layer missing: refused naming the first tensor never written
    CheckpointWriter cw(out, s);
    cw.write_embeddings(t.w.tok_embeddings);
    cw.write_layer(0, L[0], linears_of(t, 0));
    cw.write_layer(1, L[1], linears_of(t, 1));
    const std::string e = error_of([&] { cw.commit(); });
    EXPECT_NE(e.find("model.layers.2.input_layernorm.weight"), std::string::npos) << e;
  }
  EXPECT_TRUE(entries(d).empty()) << "left behind: " << entries(d).front();
}

// The output directory appears complete at commit() or not at all: a writer dropped half way
// (sharded: completed shards exist only in the temporary directory), a missing tensor, an
// existing output without overwrite (left untouched), a source already quantized.
TEST(CheckpointWriter, AtomicDirectory) {
  const scalesweep::testing::TempDir tmp("ss_io_ckpt_test_atomic");
  const fs::path& d = tmp.path();
  const Toy t = make_toy();
  CheckpointSpec s = toy_spec(t, d);
  s.max_shard_bytes = 4000;
  const std::string out = (d / "out").string();
  {
    CheckpointWriter cw(out, s);
    cw.write_embeddings(t.w.tok_embeddings);
    cw.write_layer(0, t.w.layers[0], linears_of(t, 0));
    cw.write_layer(1, t.w.layers[1], linears_of(t, 1));
    // Shards already completed live in a temporary directory beside `out`.
    const std::vector<std::string> during = entries(d);
    ASSERT_EQ(during.size(), 1u);
    EXPECT_EQ(during[0].rfind(".out.tmp.", 0), 0u) << during[0];
    EXPECT_GE(entries(d / during[0]).size(), 1u);
  }
  EXPECT_TRUE(entries(d).empty()) << "left behind: " << entries(d).front();
  {  // a tensor missing from the model: an error naming it, nothing written
    model::Weights w = t.w;
    w.layers[1].ffn_norm = {};
    CheckpointWriter cw(out, s);
    cw.write_embeddings(w.tok_embeddings);
    cw.write_layer(0, w.layers[0], linears_of(t, 0));
    const std::string e = error_of([&] { cw.write_layer(1, w.layers[1], linears_of(t, 1)); });
    EXPECT_NE(e.find("model.layers.1.post_attention_layernorm.weight' is missing"),
              std::string::npos)
        << e;
    EXPECT_NE(e.find("toy.bin"), std::string::npos) << e;
  }
  EXPECT_TRUE(entries(d).empty());
  // A complete write; then the same output again without overwrite is refused before
  // anything is written, and the first checkpoint stays as it was.
  s.max_shard_bytes = 0;
  write_all(t, out, s);
  const auto before = fs::file_size(out + "/model.safetensors");
  EXPECT_THROW(CheckpointWriter(out, s), std::exception);
  EXPECT_EQ(fs::file_size(out + "/model.safetensors"), before);
  EXPECT_EQ(entries(d), std::vector<std::string>{"out"});
  // With overwrite: replaced (here by a sharded checkpoint: no model.safetensors remains).
  s.overwrite = true;
  s.max_shard_bytes = 4000;
  write_all(t, out, s);
  EXPECT_FALSE(fs::exists(out + "/model.safetensors"));
  EXPECT_TRUE(fs::exists(out + "/model.safetensors.index.json"));
  EXPECT_EQ(entries(d), std::vector<std::string>{"out"});
  // The chat metadata: a non-HF source's goes to generation_config.json and
  // chat_template.jinja; a HF source's files are copied, and a generation_config.json is
  // added only where it has none.
  {
    CheckpointSpec cs = toy_spec(t, d);
    ChatMeta meta;
    meta.chat_template = "{{ messages[0]['content'] }}";
    meta.bos_id = 1;
    meta.eos_ids = {2, 3};
    meta.sampling.temperature = 0.6;
    cs.chat = meta;
    const std::string chat_out = (d / "chat").string();
    write_all(t, chat_out, cs);
    EXPECT_EQ(chat_meta_from_hf_dir(chat_out), meta);
    // A dense HF source without generation_config.json: its files are copied and one is
    // added (from its tokenizer files; here none, so no ids).
    const fs::path src = d / "hf_src";
    fs::create_directories(src);
    std::ofstream(src / "config.json") << hf_config_json(t.w.config, DType::kF32) << "\n";
    std::ofstream(src / "chat_template.jinja") << meta.chat_template;
    CheckpointSpec hs2 = toy_spec(t, d);
    hs2.source = src.string();
    hs2.source_is_hf_dir = true;
    const std::string from_hf = (d / "from_hf").string();
    write_all(t, from_hf, hs2);
    const ChatMeta got = chat_meta_from_hf_dir(from_hf);
    EXPECT_EQ(got.chat_template, meta.chat_template);
    EXPECT_TRUE(fs::exists(from_hf + "/generation_config.json"));
    EXPECT_TRUE(got.eos_ids.empty());
    fs::remove_all(src);
    fs::remove_all(from_hf);
    fs::remove_all(chat_out);
  }
  // A Hugging Face source that is already quantized is refused, naming its config.json.
  CheckpointSpec hs = toy_spec(t, d);
  hs.source = out;
  hs.source_is_hf_dir = true;
  const std::string e = error_of([&] { CheckpointWriter cw((d / "again").string(), hs); });
  EXPECT_NE(e.find("already quantized"), std::string::npos) << e;
  EXPECT_NE(e.find(out + "/config.json"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(d / "again"));
}

// A MoE model (Qwen3-MoE, layer 1 MoE with 3 experts, layers 0 and 2 dense): written from a
// Hugging Face source only; q/k/v/o then every expert's gate/up/down quantized under their
// per-expert names, the router dense and in ignore; experts out of place, keep-dense of an
// expert Linear and a non-HF source are refused by name; the checkpoint loads (W4A16).
TEST(CheckpointWriter, MixtureOfExperts) {
  const scalesweep::testing::TempDir tmp("ss_io_ckpt_test_moe");
  const fs::path& d = tmp.path();
  model::Config c = testing::with_experts(toy_config(), model::Arch::kQwen3Moe, 3, 1, 16);
  c.moe_sparse_step = 2;
  const model::Weights w = model::testing::random_model(c, 13);
  CheckpointSpec s;
  s.config = c;
  s.producer = "checkpoint_test";
  s.source = (d / "toy.bin").string();
  const std::string out = (d / "out").string();
  EXPECT_TRUE(throws_with([&] { CheckpointWriter cw(out, s); },
                          "is written from a Hugging Face source directory only"));
  fs::create_directories(d / "src");
  std::ofstream(d / "src" / "config.json")
      << nlohmann::json({{"architectures", {"Qwen3MoeForCausalLM"}}, {"model_type", "qwen3_moe"}})
             .dump();
  s.source = (d / "src").string();
  s.source_is_hf_dir = true;
  CheckpointSpec bad = s;
  bad.dense.add(1, LinearId::kGate);
  EXPECT_TRUE(throws_with([&] { CheckpointWriter cw(out, bad); },
                          "model.layers.1: gate_proj kept dense in a mixture-of-experts layer"));
  std::vector<std::vector<QuantizedTensor>> q(3);
  const auto quant = [](const model::Tensor& x) {
    return quantize(x.data, x.shape[0], x.shape[1], {}, QuantConfig{});
  };
  std::vector<std::vector<CheckpointLinear>> cl(3);
  for (int l = 0; l < 3; ++l) {
    const model::LayerWeights& lw = w.layers[static_cast<size_t>(l)];
    auto& ql = q[static_cast<size_t>(l)];
    ql.reserve(16);
    for (LinearId id : kAllLinears) {
      if (c.moe_layer(l) && static_cast<int>(id) > static_cast<int>(LinearId::kO)) break;
      ql.push_back(quant(linear_weight(lw, id)));
      cl[static_cast<size_t>(l)].push_back({id, &ql.back(), std::nullopt});
    }
    if (!c.moe_layer(l)) continue;
    for (int e = 0; e < 3; ++e) {
      const auto& ex = lw.experts[static_cast<size_t>(e)];
      const std::pair<LinearId, const model::Tensor*> ls[3] = {
          {LinearId::kGate, &ex.w1}, {LinearId::kUp, &ex.w3}, {LinearId::kDown, &ex.w2}};
      for (const auto& [id, t] : ls) {
        ql.push_back(quant(*t));
        cl[static_cast<size_t>(l)].push_back({id, &ql.back(), std::nullopt, e});
      }
    }
  }
  {
    CheckpointWriter cw(out, s);
    cw.write_embeddings(w.tok_embeddings);
    cw.write_layer(0, w.layers[0], cl[0]);
    std::vector<CheckpointLinear> swapped = cl[1];
    std::swap(swapped[4], swapped[7]);  // expert 1's gate where expert 0's is expected
    EXPECT_TRUE(throws_with([&] { cw.write_layer(1, w.layers[1], swapped); },
                            "model.layers.1.mlp.experts.0.gate_proj: given expert 1 gate_proj"));
    EXPECT_TRUE(throws_with([&] { cw.write_layer(1, w.layers[1], cl[0]); },
                            "layer 1 has 13 Linears, given 7"));
    cw.write_layer(1, w.layers[1], cl[1]);
    cw.write_layer(2, w.layers[2], cl[2]);
    cw.write_head(w.final_norm, w.lm_head);
    cw.commit();
  }
  const SafetensorsFile f = SafetensorsFile::open(out + "/model.safetensors");
  for (int e = 0; e < 3; ++e)
    for (const char* n : {"gate_proj", "up_proj", "down_proj"})
      EXPECT_TRUE(f.contains("model.layers.1.mlp.experts." + std::to_string(e) + "." + n +
                             ".weight_packed"));
  EXPECT_TRUE(f.contains("model.layers.1.mlp.gate.weight"));
  EXPECT_FALSE(f.contains("model.layers.1.mlp.down_proj.weight_packed"));
  EXPECT_TRUE(f.contains("model.layers.2.mlp.down_proj.weight_packed"));
  std::ifstream cj(out + "/config.json");
  const nlohmann::json cfg = nlohmann::json::parse(cj);
  EXPECT_EQ(cfg["quantization_config"]["ignore"],
            nlohmann::json({"model.layers.1.mlp.gate", "lm_head"}));
}

}  // namespace
}  // namespace scalesweep::io
