// Writes the seed corpora of the fuzz harnesses (fuzz/corpus/<target>/) with the project's own
// writers: a few valid files per target, each with a truncated copy and a copy with one header
// byte changed. GGUF seeds come from fuzz/make_gguf_seeds.py (gguf-py's writer).
// Usage: make_corpus OUT_DIR [tok512.bin]
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/test_util.h"
#include "scalesweep/io/calib_stats.h"
#include "scalesweep/io/compressed_tensors.h"
#include "scalesweep/io/hf_config.h"
#include "scalesweep/io/llama2c.h"
#include "scalesweep/io/npy.h"
#include "scalesweep/io/safetensors.h"
#include "scalesweep/model/calib.h"
#include "scalesweep/model/hf_tokenizer.h"
#include "scalesweep/model/tokenizer.h"

namespace fs = std::filesystem;
using namespace scalesweep;

namespace {

fs::path g_out;

std::vector<uint8_t> read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

void put(const std::string& target, const std::string& name, const std::vector<uint8_t>& b) {
  fs::create_directories(g_out / target);
  std::ofstream o(g_out / target / name, std::ios::binary | std::ios::trunc);
  o.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }

// A valid seed plus two broken ones: cut in half, and one byte changed at `flip_at`.
void put3(const std::string& target, const std::string& name, const std::vector<uint8_t>& b,
          size_t flip_at) {
  put(target, name, b);
  put(target, "broken_truncated_" + name,
      std::vector<uint8_t>(b.begin(), b.begin() + b.size() / 2));
  std::vector<uint8_t> f = b;
  if (flip_at < f.size()) f[flip_at] ^= 0x5a;
  put(target, "broken_flipped_" + name, f);
}

// dim 16, hidden 24, 1 layer, 2 q / 1 kv heads of 8, vocab 32, 16 positions.
model::Config tiny_config() { return model::testing::shaped_config(16, 24, 1, 2, 1, 8, 32, 16); }

// GPT-2's byte-to-unicode table as UTF-8 strings.
std::vector<std::string> byte_level_alphabet() {
  std::vector<std::string> out(256);
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    const int cp = printable ? b : 256 + extra++;
    std::string s;
    if (cp < 0x80) {
      s += static_cast<char>(cp);
    } else {
      s += static_cast<char>(0xC0 | (cp >> 6));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    }
    out[b] = s;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: make_corpus OUT_DIR [tok512.bin]\n";
    return 2;
  }
  g_out = argv[1];
  const fs::path tmp = fs::temp_directory_path() / ("ss_make_corpus_" + std::to_string(::getpid()));
  fs::create_directories(tmp);

  // .npy
  {
    const std::vector<float> f = {1.5f, -2.0f, 0.0f, 3.25f, 1e-3f, -7.0f};
    std::vector<uint8_t> fb(reinterpret_cast<const uint8_t*>(f.data()),
                            reinterpret_cast<const uint8_t*>(f.data()) + f.size() * 4);
    put3("npy", "f32_2x3.npy", io::serialize_npy(io::StDType::kF32, {2, 3}, fb), 20);
    const std::vector<uint8_t> h = {0x00, 0x3c, 0x00, 0xc0, 0x00, 0x7c, 0x01, 0x00};
    put3("npy", "f16_4.npy", io::serialize_npy(io::StDType::kF16, {4}, h), 30);
    const std::vector<double> d = {1.0, 1e300};
    std::vector<uint8_t> db(reinterpret_cast<const uint8_t*>(d.data()),
                            reinterpret_cast<const uint8_t*>(d.data()) + 16);
    put3("npy", "f64_2.npy", io::serialize_npy(io::StDType::kF64, {2}, db), 8);
    put("npy", "i64_empty.npy",
        io::serialize_npy(io::StDType::kI64, {0, 3}, std::vector<uint8_t>{}));
    put("npy", "u8_scalar.npy", io::serialize_npy(io::StDType::kU8, {}, std::vector<uint8_t>{7}));
  }

  // safetensors
  {
    io::SafetensorsWriter w;
    const std::vector<float> v = {1, 2, 3, 4, 5, 6};
    w.add_f32("a.weight", {2, 3}, v);
    w.add("b", io::StDType::kBF16, {2}, std::vector<uint8_t>{0x80, 0x3f, 0x00, 0xc0});
    w.add("c", io::StDType::kU8, {3}, std::vector<uint8_t>{1, 2, 3});
    w.add("d", io::StDType::kF8E4M3, {2}, std::vector<uint8_t>{0x38, 0xfe});
    w.set_metadata("format", "pt");
    put3("safetensors", "mixed.safetensors", w.serialize(), 12);
    io::SafetensorsWriter e;
    put("safetensors", "empty.safetensors", e.serialize());
  }

  // model.safetensors.index.json (the harness's shards: a, b in shard 1, c in shard 2)
  {
    const std::string s1 = "model-00001-of-00002.safetensors",
                      s2 = "model-00002-of-00002.safetensors";
    nlohmann::json j = {{"metadata", {{"total_size", 32}}},
                        {"weight_map", {{"a", s1}, {"b", s1}, {"c", s2}}}};
    put("safetensors_index", "valid.json", bytes(j.dump(2)));
    j["weight_map"]["c"] = s1;
    put("safetensors_index", "broken_wrong_shard.json", bytes(j.dump()));
    j["weight_map"]["c"] = "../x.safetensors";
    put("safetensors_index", "broken_path.json", bytes(j.dump()));
    put("safetensors_index", "broken_no_map.json", bytes(R"({"metadata": {}})"));
    put("safetensors_index", "broken_truncated.json", bytes(R"({"weight_map": {"a": "model-0)"));
  }

  // config.json and quantization_config
  {
    model::Config c = model::testing::small_config();
    c.bos_token_id = 1;
    c.eos_token_id = 2;
    const std::string llama = io::hf_config_json(c, DType::kBF16);
    put3("hf_config", "llama.json", bytes(llama), 40);
    model::Config q = c;
    q.arch = model::Arch::kQwen3;
    q.qk_norm = true;
    q.tied_embeddings = true;
    const std::string qwen3 = io::hf_config_json(q, DType::kF16);
    put3("hf_config", "qwen3.json", bytes(qwen3), 60);
    q.arch = model::Arch::kQwen2;
    q.qk_norm = false;
    q.qkv_bias = true;
    put("hf_config", "qwen2.json", bytes(io::hf_config_json(q, DType::kF32)));

    // Mixture-of-experts configs as transformers writes them (our config.json writer refuses
    // MoE models): Qwen3-MoE with dense layers between MoE layers, Mixtral.
    nlohmann::json moe = nlohmann::json::parse(qwen3);
    moe["model_type"] = "qwen3_moe";
    moe["architectures"] = {"Qwen3MoeForCausalLM"};
    moe["num_experts"] = 4;
    moe["num_experts_per_tok"] = 2;
    moe["moe_intermediate_size"] = 32;
    moe["norm_topk_prob"] = true;
    moe["decoder_sparse_step"] = 1;
    moe["mlp_only_layers"] = {0};
    put3("hf_config", "qwen3_moe.json", bytes(moe.dump()), 70);
    nlohmann::json mixtral = nlohmann::json::parse(llama);
    mixtral["model_type"] = "mixtral";
    mixtral["architectures"] = {"MixtralForCausalLM"};
    mixtral["num_local_experts"] = 4;
    mixtral["num_experts_per_tok"] = 2;
    put3("hf_config", "mixtral.json", bytes(mixtral.dump()), 50);

    nlohmann::json j = nlohmann::json::parse(llama);
    j["quantization_config"] = io::nvfp4_quantization_config(true, 16, {"lm_head"});
    put("quantization_config", "w4a4.json", bytes(j.dump()));
    put("hf_config", "llama_w4a4.json", bytes(j.dump()));
    j["quantization_config"] =
        io::nvfp4_quantization_config(false, 16, {"lm_head", "model.layers.0.mlp.down_proj"});
    put("quantization_config", "w4a16.json", bytes(j.dump()));
    j["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] = 32;
    put("quantization_config", "broken_group32.json", bytes(j.dump()));
    j["quantization_config"] = {{"quant_method", "gptq"}, {"bits", 4}};
    put("quantization_config", "broken_gptq.json", bytes(j.dump()));
    put("quantization_config", "none.json", bytes(R"({"model_type": "llama"})"));
  }

  // llama2.c checkpoints and calibration statistics of one tiny random model
  {
    const model::Config c = tiny_config();
    const model::Weights w = model::testing::random_model(c, 5);
    for (auto [fmt, name] : {std::pair{io::Llama2cFormat::kLegacy, "legacy.bin"},
                             std::pair{io::Llama2cFormat::kV1, "v1.bin"}}) {
      const fs::path p = tmp / name;
      io::save_llama2c(w, p.string(), fmt);
      put3("llama2c", name, read_file(p), 9);
    }
    std::vector<int> toks(64);
    for (int i = 0; i < 64; ++i) toks[i] = (i * 5 + 1) % c.vocab_size;
    const model::CalibStats s = model::calibrate(w, toks, 2, 8, 7, 1);
    const fs::path p = tmp / "stats.safetensors";
    io::save_calib_stats(s, p.string());
    put3("calib_stats", "stats.safetensors", read_file(p), 20);
  }

  // tokenizer.bin and tokenizer.json (SentencePiece-style from tok512.bin; byte-level by hand)
  {
    if (argc > 2 && fs::exists(argv[2])) {
      const std::vector<uint8_t> tb = read_file(argv[2]);
      put3("llama2c_tokenizer", "tok512.bin", tb, 0);
      auto t = model::Llama2cTokenizer::load(argv[2]);
      const model::BpeSpec sp = model::sentencepiece_spec_from_llama2c(t->vocab(), t->scores());
      put("tokenizer_json", "sentencepiece.json", bytes(model::tokenizer_json_string(sp)));
    }
    // A small tokenizer.bin: <unk> <s> </s>, the 256 byte tokens, a few merges.
    std::vector<uint8_t> tb;
    auto i32 = [&](int32_t v) {
      tb.insert(tb.end(), reinterpret_cast<uint8_t*>(&v), reinterpret_cast<uint8_t*>(&v) + 4);
    };
    auto tok = [&](const std::string& s, float score) {
      tb.insert(tb.end(), reinterpret_cast<uint8_t*>(&score),
                reinterpret_cast<uint8_t*>(&score) + 4);
      i32(static_cast<int32_t>(s.size()));
      tb.insert(tb.end(), s.begin(), s.end());
    };
    i32(8);
    tok("<unk>", 0);
    tok("\n<s>\n", 0);
    tok("\n</s>\n", 0);
    for (int b = 0; b < 256; ++b) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "<0x%02X>", b);
      tok(buf, 0);
    }
    for (const char* s : {" ", "e", "t", "a", "o", " t", "he", " the", "on", "ce", "Once"})
      tok(s, -static_cast<float>(std::string(s).size()));
    put3("llama2c_tokenizer", "small.bin", tb, 4);

    const std::vector<std::string> alpha = byte_level_alphabet();
    model::BpeSpec bl;
    bl.flavor = model::BpeFlavor::kByteLevel;
    bl.vocab = alpha;
    const std::string G = alpha[' '];
    for (auto [a, b] : std::vector<std::pair<std::string, std::string>>{{G, "t"},
                                                                        {"h", "e"},
                                                                        {G + "t", "he"},
                                                                        {"l", "l"},
                                                                        {"H", "e"},
                                                                        {"He", "ll"},
                                                                        {"Hell", "o"}}) {
      bl.merges.emplace_back(a, b);
      bl.vocab.push_back(a + b);
    }
    bl.added.push_back({static_cast<int>(bl.vocab.size()), "<|endoftext|>", true});
    bl.vocab.push_back("");
    bl.bos_id = bl.eos_id = bl.added.back().id;
    put3("tokenizer_json", "byte_level.json", bytes(model::tokenizer_json_string(bl)), 50);
    bl.split = model::SplitRegex::kLlama3;
    bl.max_digits = 3;
    put("tokenizer_json", "byte_level_llama3.json", bytes(model::tokenizer_json_string(bl)));
  }
  fs::remove_all(tmp);
  return 0;
}
