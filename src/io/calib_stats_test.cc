// The calibration-statistics file format (save_calib_stats / load_calib_stats /
// CalibStatsWriter): round trip, refusal of wrong files, the streamed writer's bytes, loading
// without the matrices. Statistics come from model::calibrate (no pipeline).
#include "scalesweep/io/calib_stats.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>

#include "io/test_util.h"
#include "model/test_util.h"
#include "scalesweep/io/file.h"
#include "scalesweep/io/safetensors.h"
#include "scalesweep/model/calib.h"
#include "scalesweep/model/simquant.h"
#include "scalesweep/model/transformer.h"

namespace scalesweep::io {
namespace {

TEST(CalibStatsFile, RoundTrip) {
  const model::Config c = model::testing::small_config();
  const model::Weights w = model::testing::random_model(c, 3);
  std::vector<int> toks(200);
  for (int i = 0; i < 200; ++i) toks[i] = (i * 11) % c.vocab_size;
  const model::CalibStats s = model::calibrate(w, toks, 3, 16, 7, 1);
  const std::string path = ::testing::TempDir() + "/stats.safetensors";
  save_calib_stats(s, path);
  const model::CalibStats r = load_calib_stats(path);
  EXPECT_EQ(r.nsamples, 3);
  EXPECT_EQ(r.seqlen, 16);
  EXPECT_EQ(r.draw.seed, 7u);
  EXPECT_EQ(r.draw.windows, model::CalibWindows::kRandom);  // no "windows" key
  EXPECT_EQ(SafetensorsFile::open(path).metadata().count("windows"), 0u);
  ASSERT_EQ(r.layers.size(), s.layers.size());
  for (size_t l = 0; l < s.layers.size(); ++l) {
    for (int i = 0; i < model::kNumInputs; ++i) {
      EXPECT_EQ(r.layers[l].inputs[i].xtx, s.layers[l].inputs[i].xtx);
      EXPECT_EQ(r.layers[l].inputs[i].tokens, s.layers[l].inputs[i].tokens);
      EXPECT_EQ(r.layers[l].inputs[i].amax, s.layers[l].inputs[i].amax);
      EXPECT_EQ(r.layers[l].inputs[i].dim, s.layers[l].inputs[i].dim);
    }
    EXPECT_EQ(r.layers[l].q_sqnorm, s.layers[l].q_sqnorm);
    EXPECT_EQ(r.layers[l].v_sqnorm, s.layers[l].v_sqnorm);
    EXPECT_EQ(r.layers[l].k_amax, s.layers[l].k_amax);
  }
  EXPECT_NO_THROW(model::check_calib_stats(r, c));
}

TEST(CalibStatsFile, RejectsWrongFiles) {
  const std::string path = ::testing::TempDir() + "/not_stats.safetensors";
  SafetensorsWriter w;
  std::vector<float> x = {1, 2};
  w.add_f32("x", {2}, x);
  w.write(path);
  try {
    load_calib_stats(path);
    FAIL();
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("not_stats.safetensors"), std::string::npos);
  }
  // Right metadata, missing tensors.
  SafetensorsWriter w2;
  w2.add_f32("x", {2}, x);
  w2.set_metadata("format", "scalesweep-calib-v1");
  w2.set_metadata("n_layers", "1");
  w2.set_metadata("nsamples", "1");
  w2.set_metadata("seqlen", "2");
  w2.set_metadata("seed", "0");
  const std::string p2 = ::testing::TempDir() + "/missing.safetensors";
  w2.write(p2);
  try {
    load_calib_stats(p2);
    FAIL();
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("layers.0.attn_in.xtx"), std::string::npos) << e.what();
  }
  EXPECT_THROW(load_calib_stats(path + ".absent"), IoError);
  // A windows key that names no placement.
  w2.set_metadata("windows", "sideways");
  w2.write(p2);
  try {
    load_calib_stats(p2);
    FAIL();
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("metadata windows 'sideways', expected one of random, "
                                         "spread"),
              std::string::npos)
        << e.what();
  }
}

TEST(CalibStatsFile, SpreadWindowsRoundTrip) {
  const model::Config c = model::testing::small_config();
  const model::Weights w = model::testing::random_model(c, 3);
  std::vector<int> toks(200);
  for (int i = 0; i < 200; ++i) toks[i] = (i * 11) % c.vocab_size;
  const model::CalibStats s =
      model::calibrate(w, toks, 3, 16, {0, model::CalibWindows::kSpread}, 1);
  const std::string path = ::testing::TempDir() + "/spread.safetensors";
  save_calib_stats(s, path);
  EXPECT_EQ(SafetensorsFile::open(path).metadata().at("windows"), "spread");
  const model::CalibStats r = load_calib_stats(path);
  EXPECT_EQ(r.draw.windows, model::CalibWindows::kSpread);
  EXPECT_EQ(r.layers[0].inputs[0].xtx, s.layers[0].inputs[0].xtx);
}

std::vector<uint8_t> file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// The streamed writer (one layer at a time) writes the same bytes as save_calib_stats; a
// stream that is not finished leaves no file; layers out of order are refused by name.
TEST(CalibStatsFile, StreamWriterMatchesSave) {
  const model::Config c = model::testing::small_config();
  const model::Weights w = model::testing::random_model(c, 4);
  std::vector<int> toks(300);
  for (int i = 0; i < 300; ++i) toks[i] = (i * 7 + 3) % c.vocab_size;
  const model::CalibStats s = model::calibrate(w, toks, 4, 16, 9, 1);
  const std::string a = ::testing::TempDir() + "/saved.safetensors";
  const std::string b = ::testing::TempDir() + "/streamed.safetensors";
  save_calib_stats(s, a);
  {
    CalibStatsWriter sw(c, 4, 16, 9, b);
    for (int l = 0; l < c.n_layers; ++l) sw.write_layer(l, s.layers[static_cast<size_t>(l)]);
    sw.commit();
  }
  EXPECT_EQ(file_bytes(a), file_bytes(b));
  EXPECT_GT(file_bytes(a).size(), 1000u);

  const std::string partial = ::testing::TempDir() + "/partial.safetensors";
  std::filesystem::remove(partial);
  {
    CalibStatsWriter sw(c, 4, 16, 9, partial);
    sw.write_layer(0, s.layers[0]);
    try {
      sw.write_layer(2, s.layers[2]);
      FAIL() << "layer 2 after layer 0 accepted";
    } catch (const IoError& e) {
      EXPECT_NE(std::string(e.what()).find("layer 2 written out of order"), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("partial.safetensors"), std::string::npos);
    }
    EXPECT_THROW(sw.commit(), IoError);
  }
  EXPECT_FALSE(std::filesystem::exists(partial));
  // A layer without ΣxxT cannot be written (the file format holds it).
  model::CalibStats no_xtx = model::calibrate(w, toks, 2, 16, 9, 1, {}, false);
  EXPECT_THROW(save_calib_stats(no_xtx, partial), IoError);
  EXPECT_FALSE(std::filesystem::exists(partial));
}

// load_calib_stats without ΣxxT: the same amax, tokens, q/k/v and diagonal, no matrix.
TEST(CalibStatsFile, LoadWithoutXtx) {
  const model::Config c = model::testing::small_config();
  const model::Weights w = model::testing::random_model(c, 6);
  std::vector<int> toks(300);
  for (int i = 0; i < 300; ++i) toks[i] = (i * 5 + 1) % c.vocab_size;
  const std::string path = ::testing::TempDir() + "/noxtx.safetensors";
  save_calib_stats(model::calibrate(w, toks, 3, 16, 1, 1), path);
  const model::CalibStats full = load_calib_stats(path);
  const model::CalibStats lite = load_calib_stats(path, false);
  ASSERT_EQ(lite.layers.size(), full.layers.size());
  EXPECT_EQ(lite.nsamples, full.nsamples);
  for (size_t l = 0; l < full.layers.size(); ++l) {
    for (int i = 0; i < model::kNumInputs; ++i) {
      const auto& f = full.layers[l].inputs[static_cast<size_t>(i)];
      const auto& g = lite.layers[l].inputs[static_cast<size_t>(i)];
      EXPECT_TRUE(f.has_xtx());
      EXPECT_FALSE(g.has_xtx());
      EXPECT_EQ(g.dim, f.dim);
      EXPECT_EQ(g.tokens, f.tokens);
      EXPECT_EQ(g.amax, f.amax);
      ASSERT_EQ(g.xdiag.size(), static_cast<size_t>(f.dim));
      for (int64_t j = 0; j < f.dim; ++j) {
        EXPECT_EQ(g.diag(j), f.xtx[j * f.dim + j]);
        EXPECT_EQ(f.diag(j), f.xtx[j * f.dim + j]);
      }
    }
    EXPECT_EQ(lite.layers[l].k_sqnorm, full.layers[l].k_sqnorm);
    EXPECT_EQ(lite.layers[l].q_amax, full.layers[l].q_amax);
  }
  EXPECT_NO_THROW(model::check_calib_stats(lite, c));
  // The simulated quantization that reads the statistics gives the same model either way.
  const model::SimQuantSpec spec = model::parse_sim_quant("WAKVQ", Method::kOptFp8Wmse, 16);
  ASSERT_TRUE(spec.needs_stats());
  auto fp = std::make_shared<const model::Weights>(w);
  const auto ta = model::make_sim_quant_transformer(fp, spec, &full);
  const auto tb = model::make_sim_quant_transformer(fp, spec, &lite);
  const auto tf =
      model::make_sim_quant_transformer(fp, model::parse_sim_quant("FP", Method::kAbsMax), nullptr);
  std::vector<int> probe(toks.begin(), toks.begin() + 12);
  const std::vector<float> la = ta->forward(probe.data(), 12, 0);
  EXPECT_EQ(la, tb->forward(probe.data(), 12, 0));
  EXPECT_NE(la, tf->forward(probe.data(), 12, 0));  // the quantization did act
}

// model::testing::random_model(c, 5) calibrated on token_stream(tokens, c.vocab_size)
// (nsamples sequences of seqlen, seed 7), saved to `path` by save_calib_stats; returns the
// statistics.
model::CalibStats save_random_model_stats(const model::Config& c, int tokens, int64_t nsamples,
                                          int64_t seqlen, const std::string& path) {
  const model::Weights w = model::testing::random_model(c, 5);
  model::CalibStats s = model::calibrate(w, model::testing::token_stream(tokens, c.vocab_size),
                                         nsamples, seqlen, 7, 1);
  save_calib_stats(s, path);
  return s;
}

// A MoE model's file: per-expert records (layer 1 only: layers 0 and 2 are dense), metadata
// n_experts, the same values back with and without the matrices; a dense model's file has no
// expert entries and no n_experts (the files before MoE support load unchanged).
TEST(CalibStatsFile, MoeExpertsRoundTrip) {
  model::Config c = testing::with_experts(model::testing::small_config(), model::Arch::kMixtral, 4,
                                          2, 24, /*norm_topk=*/true);
  c.n_layers = 3;
  c.moe_sparse_step = 2;
  const std::string path = ::testing::TempDir() + "/moe_stats.safetensors";
  const model::CalibStats s = save_random_model_stats(c, 200, 3, 16, path);
  {
    const SafetensorsFile f = SafetensorsFile::open(path);
    EXPECT_EQ(f.metadata().at("n_experts"), "4");
    EXPECT_TRUE(f.contains("layers.1.experts.3.mlp_out.xtx"));
    EXPECT_TRUE(f.contains("layers.1.experts.0.routed"));
    EXPECT_FALSE(f.contains("layers.1.mlp_out.xtx"));
    EXPECT_TRUE(f.contains("layers.2.mlp_out.xtx"));
    EXPECT_FALSE(f.contains("layers.2.experts.0.routed"));
  }
  // The streamed writer writes the same bytes.
  const std::string streamed = ::testing::TempDir() + "/moe_stats_streamed.safetensors";
  {
    CalibStatsWriter sw(c, 3, 16, 7, streamed);
    for (int l = 0; l < 3; ++l) sw.write_layer(l, s.layers[static_cast<size_t>(l)]);
    sw.commit();
  }
  std::ifstream a(path, std::ios::binary), b(streamed, std::ios::binary);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(a), {}),
            std::string(std::istreambuf_iterator<char>(b), {}));
  for (const bool with_xtx : {true, false}) {
    const model::CalibStats r = load_calib_stats(path, with_xtx);
    EXPECT_NO_THROW(model::check_calib_stats(r, c));
    ASSERT_EQ(r.layers[1].experts.size(), 4u);
    EXPECT_TRUE(r.layers[0].experts.empty());
    EXPECT_EQ(r.layers[1].inputs[3].dim, 0);
    for (size_t e = 0; e < 4; ++e) {
      const model::ExpertStats &x = r.layers[1].experts[e], &y = s.layers[1].experts[e];
      EXPECT_EQ(x.routed, y.routed);
      EXPECT_EQ(x.in.tokens, y.in.tokens);
      EXPECT_EQ(x.mid.amax, y.mid.amax);
      EXPECT_EQ(x.in.xdiag, y.in.xdiag);
      EXPECT_EQ(x.mid.xdiag, y.mid.xdiag);
      if (with_xtx)
        EXPECT_EQ(x.mid.xtx, y.mid.xtx);
      else
        EXPECT_TRUE(x.in.xtx.empty());
    }
  }
  const std::string dense_path = ::testing::TempDir() + "/dense_stats.safetensors";
  const model::Config dc = model::testing::small_config();
  save_calib_stats(model::calibrate(model::testing::random_model(dc, 3),
                                    model::testing::token_stream(200, dc.vocab_size), 2, 16, 7, 1),
                   dense_path);
  EXPECT_EQ(SafetensorsFile::open(dense_path).metadata().count("n_experts"), 0u);
}

// A file whose expert record is missing or negative is refused naming the tensor.
TEST(CalibStatsFile, MoeRefusesBrokenExpertRecords) {
  model::Config c =
      testing::with_experts(model::testing::small_config(), model::Arch::kQwen3Moe, 3, 1, 16);
  c.n_layers = 1;
  const std::string path = ::testing::TempDir() + "/moe_broken.safetensors";
  save_random_model_stats(c, 100, 2, 8, path);
  // Rewrite the file without expert 2's down-input ΣxxT.
  const SafetensorsFile f = SafetensorsFile::open(path);
  SafetensorsWriter out;
  for (const auto& [k, v] : f.metadata()) out.set_metadata(k, v);
  for (const TensorInfo& t : f.tensors()) {
    if (t.name == "layers.0.experts.2.mlp_out.xtx") continue;
    out.add(t.name, t.dtype, t.shape, f.raw(t));
  }
  const std::string broken = ::testing::TempDir() + "/moe_broken2.safetensors";
  out.write(broken);
  try {
    load_calib_stats(broken);
    FAIL() << "a missing expert record was accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("layers.0.experts.2.mlp_out.xtx"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace scalesweep::io
