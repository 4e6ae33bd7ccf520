// `quantize --tp N`: row-parallel Linears (o_proj, down_proj) whose per-rank K slice vLLM
// cannot hold as NVFP4 stay dense (io::vllm_unsupported_linears with tp, WriteOptions::tp).
#include "scalesweep/pipeline/vllm_compat.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/test_util.h"
#include "scalesweep/base/option_error.h"
#include "scalesweep/io/hf_names.h"
#include "scalesweep/pipeline/quantize_model.h"

namespace scalesweep::pipeline {
using namespace ::scalesweep::io;
namespace {

namespace fs = std::filesystem;
using model::LinearId;

// hidden 64 (o_proj K = n_heads * head_dim = 64), intermediate 176 (down_proj K = 176).
model::Config tp_config() {
  model::Config c = model::testing::tiny_config(false);  // 2 layers, 4 q / 2 kv heads, vocab 40
  c.dim = 64;
  c.hidden_dim = 176;
  c.head_dim = 16;
  c.max_seq_len = 32;
  return c;
}

std::vector<LinearId> ids(const std::vector<UnsupportedLinear>& u) {
  std::vector<LinearId> out;
  for (const auto& x : u) out.push_back(x.id);
  return out;
}

bool has(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

TEST(TensorParallel, RowParallelLinearsNeedWholeBlocksPerRank) {
  const model::Config c = tp_config();
  EXPECT_TRUE(vllm_row_parallel(LinearId::kO));
  EXPECT_TRUE(vllm_row_parallel(LinearId::kDown));
  for (LinearId id : {LinearId::kQ, LinearId::kK, LinearId::kV, LinearId::kGate, LinearId::kUp})
    EXPECT_FALSE(vllm_row_parallel(id));

  // tp 1 (and the default): K = 176 and 64 are multiples of 16.
  EXPECT_TRUE(vllm_unsupported_linears(c).empty());
  EXPECT_TRUE(vllm_unsupported_linears(c, 1).empty());

  // tp 2: down_proj 176 / 2 = 88 is not a multiple of 16; o_proj 64 / 2 = 32 is.
  auto u = vllm_unsupported_linears(c, 2);
  ASSERT_EQ(ids(u), std::vector<LinearId>{LinearId::kDown});
  EXPECT_TRUE(has(u[0].reason, "K = 176")) << u[0].reason;
  EXPECT_TRUE(has(u[0].reason, "tp = 2")) << u[0].reason;
  EXPECT_TRUE(has(u[0].reason, "K / tp = 88")) << u[0].reason;

  // tp 4: o_proj 16 fine, down_proj 44 not.
  EXPECT_EQ(ids(vllm_unsupported_linears(c, 4)), std::vector<LinearId>{LinearId::kDown});

  // tp 8: o_proj 64 / 8 = 8 and down_proj 176 / 8 = 22: both dense; no fused partner follows
  // (o_proj and down_proj are not fused in vLLM).
  u = vllm_unsupported_linears(c, 8);
  ASSERT_EQ(ids(u), (std::vector<LinearId>{LinearId::kO, LinearId::kDown}));
  EXPECT_TRUE(has(u[0].reason, "K = 64")) << u[0].reason;
  EXPECT_TRUE(has(u[0].reason, "tp = 8")) << u[0].reason;
  EXPECT_TRUE(has(u[0].reason, "K / tp = 8 ")) << u[0].reason;
  EXPECT_TRUE(has(u[1].reason, "K / tp = 22")) << u[1].reason;

  // tp 11: 176 / 11 = 16 is fine, 64 % 11 != 0 is not divisible at all.
  u = vllm_unsupported_linears(c, 11);
  ASSERT_EQ(ids(u), std::vector<LinearId>{LinearId::kO});
  EXPECT_TRUE(has(u[0].reason, "not divisible by tp = 11")) << u[0].reason;

  // tp 16: 64 / 16 = 4 and 176 / 16 = 11.
  EXPECT_EQ(ids(vllm_unsupported_linears(c, 16)),
            (std::vector<LinearId>{LinearId::kO, LinearId::kDown}));

  // A larger model is fine at tp 8: K = 4096 and 11008 (11008 / 8 = 1376 = 86 * 16).
  model::Config big = c;
  big.dim = 4096;
  big.n_heads = 32;
  big.n_kv_heads = 8;
  big.head_dim = 128;
  big.hidden_dim = 11008;
  EXPECT_TRUE(vllm_unsupported_linears(big, 8).empty());
  EXPECT_TRUE(vllm_unsupported_linears(big, 16).empty());  // 688 = 43 * 16
  // tp 32: 4096 / 32 = 128 fine, 11008 / 32 = 344 not.
  EXPECT_EQ(ids(vllm_unsupported_linears(big, 32)), std::vector<LinearId>{LinearId::kDown});
}

TEST(TensorParallel, KMod16ReasonAndFusedPartnersUnchanged) {
  model::Config c = tp_config();
  c.hidden_dim = 172;  // K % 16 != 0 for down_proj: the tp-independent reason stays
  for (int tp : {1, 2, 4}) {
    const auto u = vllm_unsupported_linears(c, tp);
    ASSERT_EQ(ids(u), std::vector<LinearId>{LinearId::kDown}) << "tp " << tp;
    EXPECT_TRUE(has(u[0].reason, "K = 172 is not a multiple of 16")) << u[0].reason;
  }
  c = tp_config();
  c.dim = 40;  // q/k/v and gate/up (K = dim) unsupported for any tp, with their partners
  const auto u = vllm_unsupported_linears(c, 8);
  EXPECT_EQ(ids(u), (std::vector<LinearId>{LinearId::kQ, LinearId::kK, LinearId::kV, LinearId::kO,
                                           LinearId::kGate, LinearId::kUp, LinearId::kDown}));
  // o_proj (K = 64): the tp reason; gate/up: K = 40 (column-parallel, tp does not split K).
  EXPECT_TRUE(has(u[3].reason, "tp = 8")) << u[3].reason;
  EXPECT_TRUE(has(u[4].reason, "K = 40 is not a multiple of 16")) << u[4].reason;
}

TEST(TensorParallel, InvalidTpAndRefusalNote) {
  const model::Config c = tp_config();
  for (int tp : {0, -1, kMaxTp + 1}) {
    EXPECT_THROW(vllm_unsupported_linears(c, tp), std::invalid_argument) << tp;
    EXPECT_THROW(vllm_tp_refusal(c, tp), std::invalid_argument) << tp;
  }
  EXPECT_NO_THROW(vllm_unsupported_linears(c, kMaxTp));
  // Column-parallel N: q 64, k/v 32, gate/up 176.
  for (int tp : {1, 2, 4, 8, 16}) EXPECT_EQ(vllm_tp_refusal(c, tp), "") << tp;
  std::string r = vllm_tp_refusal(c, 11);  // 64 % 11
  EXPECT_TRUE(has(r, "tensor_parallel_size = 11")) << r;
  EXPECT_TRUE(has(r, "q_proj has N = 64")) << r;
  r = vllm_tp_refusal(c, 32);  // k_proj N = 32 ok, gate N = 176 % 32 != 0
  EXPECT_TRUE(has(r, "gate_proj has N = 176")) << r;
}

// Llama-shaped random model with the tp_config() shapes.
LoadedModel tp_model() {
  LoadedModel m;
  model::Weights& w = m.weights;
  w.config = tp_config();
  const model::Config& c = w.config;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 0.1f);
  auto fill = [&](model::Tensor& t, std::vector<int64_t> shape) {
    float* p = w.alloc(t, shape);
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = nd(rng);
  };
  const int64_t d = c.dim, h = c.hidden_dim, qd = int64_t{c.n_heads} * c.head_dim,
                kvd = int64_t{c.n_kv_heads} * c.head_dim;
  fill(w.tok_embeddings, {c.vocab_size, d});
  fill(w.lm_head, {c.vocab_size, d});
  fill(w.final_norm, {d});
  w.layers.resize(static_cast<size_t>(c.n_layers));
  for (auto& L : w.layers) {
    fill(L.attn_norm, {d});
    fill(L.ffn_norm, {d});
    fill(L.wq, {qd, d});
    fill(L.wk, {kvd, d});
    fill(L.wv, {kvd, d});
    fill(L.wo, {d, qd});
    fill(L.w1, {h, d});
    fill(L.w3, {h, d});
    fill(L.w2, {d, h});
  }
  m.format = "llama2c-legacy";
  return m;
}

std::vector<std::string> config_ignore(const fs::path& out) {
  std::ifstream f(out / "config.json");
  const nlohmann::json j = nlohmann::json::parse(f);
  EXPECT_FALSE(j["quantization_config"].contains("tp"));  // nothing new recorded
  return j["quantization_config"]["ignore"].get<std::vector<std::string>>();
}

TEST(TensorParallel, CheckpointKeepsRowParallelLinearsDense) {
  const fs::path d = fs::temp_directory_path() / ("ss_tp_test_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  const LoadedModel m = tp_model();
  QuantizeOptions o;
  o.method = Method::kAbsMax;
  struct Case {
    int tp;
    PartialBlocks pb;
    std::vector<std::string> ignore;
  };
  const std::vector<Case> cases = {
      {1, PartialBlocks::kDense, {"lm_head"}},
      {2,
       PartialBlocks::kDense,
       {"model.layers.0.mlp.down_proj", "model.layers.1.mlp.down_proj", "lm_head"}},
      {8,
       PartialBlocks::kDense,
       {"model.layers.0.self_attn.o_proj", "model.layers.0.mlp.down_proj",
        "model.layers.1.self_attn.o_proj", "model.layers.1.mlp.down_proj", "lm_head"}},
      {8, PartialBlocks::kQuantize, {"lm_head"}},  // whole blocks at tp 1: NVFP4 anyway
  };
  for (const Case& k : cases) {
    WriteOptions wo;
    wo.tp = k.tp;
    wo.partial_blocks = k.pb;
    const fs::path out = d / ("tp" + std::to_string(k.tp) + "_" + std::to_string(int(k.pb)));
    const QuantizeReport rep =
        write_quantized_checkpoint(m, "tp.bin", nullptr, o, out.string(), wo);
    EXPECT_EQ(rep.ignore, k.ignore) << "tp " << k.tp;
    EXPECT_EQ(config_ignore(out), k.ignore) << "tp " << k.tp;
    ASSERT_EQ(rep.linears.size(), 14u);
    for (const auto& r : rep.linears) {
      const bool want_dense =
          k.pb == PartialBlocks::kDense &&
          ((k.tp == 8 && r.id == LinearId::kO) || (k.tp >= 2 && r.id == LinearId::kDown));
      EXPECT_EQ(r.dense, want_dense) << r.name << " tp " << k.tp;
    }
  }
  // An impossible tp: an error, and no output directory.
  WriteOptions wo;
  wo.tp = 0;
  EXPECT_THROW(write_quantized_checkpoint(m, "tp.bin", nullptr, o, (d / "bad").string(), wo),
               std::invalid_argument);
  wo.partial_blocks = PartialBlocks::kQuantize;
  EXPECT_THROW(write_quantized_checkpoint(m, "tp.bin", nullptr, o, (d / "bad").string(), wo),
               std::invalid_argument);
  EXPECT_FALSE(fs::exists(d / "bad"));
  fs::remove_all(d);
}

// The notes `quantize` prints about vLLM's rules: vLLM's refusal of tp first, then (policy
// dense) one line per Linear and layer that stays dense, in kAllLinears order then layer
// order, naming the module, the dense dtype and the rule.
TEST(VllmDenseNotes, OneNotePerDenseLinearAndLayer) {
  model::Config c = tp_config();  // K = 64 (q/k/v, gate/up, o), 176 (down)
  EXPECT_TRUE(vllm_dense_notes(c, 1, PartialBlocks::kDense, DType::kF32).empty());
  EXPECT_TRUE(vllm_dense_notes(c, 2, PartialBlocks::kQuantize, DType::kF32).empty());

  // K % 16 != 0 (any tp): down_proj in both layers, in the dense dtype's short spelling.
  c.hidden_dim = 172;
  for (const auto& [dt, spelling] : {std::pair{DType::kF32, "f32"}, std::pair{DType::kBF16, "bf16"},
                                     std::pair{DType::kF16, "f16"}}) {
    const auto n = vllm_dense_notes(c, 1, PartialBlocks::kDense, dt);
    ASSERT_EQ(n.size(), 2u);
    for (int l = 0; l < 2; ++l) {
      const std::string& s = n[static_cast<size_t>(l)];
      EXPECT_EQ(s.rfind("model.layers." + std::to_string(l) + ".mlp.down_proj stays dense (" +
                            spelling + ", listed in quantization_config.ignore): ",
                        0),
                0u)
          << s;
      EXPECT_TRUE(has(s, "K = 172 is not a multiple of 16")) << s;
      EXPECT_TRUE(has(s, option_ref("partial_blocks") + " quantize")) << s;
    }
  }
  // Policy quantize: no per-Linear note.
  EXPECT_TRUE(vllm_dense_notes(c, 1, PartialBlocks::kQuantize, DType::kF32).empty());

  // (K / tp) % 16 for the row-parallel Linears only: tp 2 -> down_proj (176 / 2 = 88);
  // tp 8 -> o_proj too (64 / 8 = 8), listed before down_proj; q/k/v and gate/up (K = 64,
  // column-parallel) never.
  c = tp_config();
  auto n = vllm_dense_notes(c, 2, PartialBlocks::kDense, DType::kF32);
  ASSERT_EQ(n.size(), 2u);
  EXPECT_TRUE(has(n[0], "model.layers.0.mlp.down_proj stays dense")) << n[0];
  EXPECT_TRUE(has(n[0], "K / tp = 88 per rank")) << n[0];
  EXPECT_TRUE(has(n[1], "model.layers.1.mlp.down_proj stays dense")) << n[1];
  n = vllm_dense_notes(c, 8, PartialBlocks::kDense, DType::kF32);
  ASSERT_EQ(n.size(), 4u);
  EXPECT_TRUE(has(n[0], "model.layers.0.self_attn.o_proj stays dense")) << n[0];
  EXPECT_TRUE(has(n[0], "K / tp = 8 per rank")) << n[0];
  EXPECT_TRUE(has(n[1], "model.layers.1.self_attn.o_proj")) << n[1];
  EXPECT_TRUE(has(n[2], "model.layers.0.mlp.down_proj")) << n[2];
  EXPECT_TRUE(has(n[3], "model.layers.1.mlp.down_proj")) << n[3];

  // K not divisible by tp: vLLM's refusal of tp comes first (q_proj N = 64 % 3), then o_proj
  // and down_proj (64 and 176 not divisible by 3).
  n = vllm_dense_notes(c, 3, PartialBlocks::kDense, DType::kF32);
  ASSERT_EQ(n.size(), 5u);
  EXPECT_EQ(n[0], vllm_tp_refusal(c, 3));
  EXPECT_TRUE(has(n[0], "tensor_parallel_size = 3")) << n[0];
  EXPECT_TRUE(has(n[1], "self_attn.o_proj stays dense")) << n[1];
  EXPECT_TRUE(has(n[1], "not divisible by tp = 3")) << n[1];
  EXPECT_TRUE(has(n[3], "mlp.down_proj stays dense")) << n[3];
  // With policy quantize the refusal is still said, and nothing else.
  n = vllm_dense_notes(c, 3, PartialBlocks::kQuantize, DType::kF32);
  EXPECT_EQ(n, std::vector<std::string>{vllm_tp_refusal(c, 3)});

  // Fused groups stay dense together: K = dim = 40 puts q/k/v (qkv_proj) and gate/up
  // (gate_up_proj) all dense, and o_proj (K = 64) under tp 8 with them: every Linear of
  // every layer gets its note. (The members of a fused group share K = dim, so no Config
  // makes one member alone unquantizable: the "fused into" reason of
  // vllm_unsupported_linears cannot be reached from a Config.)
  c.dim = 40;
  n = vllm_dense_notes(c, 8, PartialBlocks::kDense, DType::kF32);
  ASSERT_EQ(n.size(), 14u);
  for (size_t i = 0; i < 7; ++i)
    for (int l = 0; l < 2; ++l) {
      const std::string& s = n[i * 2 + static_cast<size_t>(l)];
      EXPECT_TRUE(has(s, io::hf_module_name(l, io::kAllLinears[i]) + " stays dense")) << s;
    }

  for (int tp : {0, kMaxTp + 1})
    EXPECT_THROW(vllm_dense_notes(c, tp, PartialBlocks::kDense, DType::kF32),
                 std::invalid_argument);
}

}  // namespace
}  // namespace scalesweep::pipeline
