// Layer-by-layer streaming of `quantize` (write_quantized_checkpoint_streamed) against the
// whole-model path, on stories260K converted to a bf16 Hugging Face directory:
// - RTN (unweighted, weighted, W4A4) writes byte-identical checkpoints;
// - GPTQ calibrated on full-precision activations (sequential = false) is byte-identical too;
// - sequential GPTQ runs, is deterministic, differs, and lowers the layer-output loss vs RTN;
// - at most one decoder layer is materialized at a time; an interrupted run leaves nothing.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>

#include "model/test_util.h"
#include "scalesweep/io/hf.h"
#include "scalesweep/io/load.h"
#include "scalesweep/model/hf_tokenizer.h"
#include "scalesweep/model/tokenizer.h"
#include "scalesweep/pipeline/calibrate.h"
#include "scalesweep/pipeline/quantize_model.h"

namespace scalesweep::pipeline {
using namespace ::scalesweep::io;
namespace {

namespace fs = std::filesystem;
const std::string kData = SS_SHARED_DATA_DIR;

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

class QuantizeStream : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string model = kData + "/models/stories260K/stories260K.bin";
    text_ = kData + "/text/tinystories_val.txt";
    if (!fs::exists(model) || !fs::exists(text_)) return;
    root_ = fs::temp_directory_path() / ("ss_stream_test_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_);
    const LoadedModel m = load_model(model);
    const auto* lt = dynamic_cast<const model::Llama2cTokenizer*>(m.tokenizer.get());
    ASSERT_TRUE(lt);
    const model::BpeSpec spec = model::sentencepiece_spec_from_llama2c(lt->vocab(), lt->scores());
    HfWriteOptions wo;
    wo.dtype = DType::kBF16;
    wo.shard_bytes = 200'000;  // sharded: exercises the index
    wo.tokenizer = &spec;
    hf_ = (root_ / "hf").string();
    save_hf_dir(m.weights, hf_, wo);
  }
  static void TearDownTestSuite() {
    if (!root_.empty()) fs::remove_all(root_);
  }
  void SetUp() override {
    if (hf_.empty()) GTEST_SKIP() << "stories260K / tinystories_val.txt not found under " << kData;
  }

  // Whole-model path (as `quantize --no-stream`).
  static QuantizeReport whole(const QuantizeOptions& o, const std::string& out) {
    const LoadedModel m = load_model(hf_);
    model::CalibStats cs;
    const model::CalibStats* cal = nullptr;
    if (needs_calibration(o)) {
      cs = calib_stats_for(m, "", text_, 8, 64, 3);
      cal = &cs;
    }
    WriteOptions wo;
    wo.dense = DType::kBF16;
    return write_quantized_checkpoint(m, hf_, cal, o, out, wo);
  }
  static QuantizeReport streamed(const QuantizeOptions& o, const std::string& out,
                                 bool sequential = true) {
    StreamOptions so;
    so.calib_text = text_;
    so.nsamples = 8;
    so.seqlen = 64;
    so.seed = 3;
    so.sequential = sequential;
    WriteOptions wo;
    wo.dense = DType::kBF16;
    return write_quantized_checkpoint_streamed(hf_, so, o, out, wo);
  }
  static std::string weights_of(const std::string& out) {
    return slurp(fs::path(out) / "model.safetensors");
  }

  static inline fs::path root_;
  static inline std::string hf_, text_;
};

TEST_F(QuantizeStream, RtnIsByteIdenticalToWholeModel) {
  struct Case {
    Method m;
    bool w4a4;
  };
  int i = 0;
  for (const Case& c : {Case{Method::kSweepMse, false}, Case{Method::kAbsMax, true},
                        Case{Method::kSweepWmse, false}, Case{Method::kSweepWmse, true}}) {
    QuantizeOptions o;
    o.method = c.m;
    o.w4a4 = c.w4a4;
    const std::string a = (root_ / ("whole" + std::to_string(i))).string();
    const std::string b = (root_ / ("stream" + std::to_string(i))).string();
    ++i;
    whole(o, a);
    reset_streamed_layers_peak();
    const QuantizeReport r = streamed(o, b);
    EXPECT_EQ(streamed_layers_peak(), 1) << "one decoder layer materialized at a time";
    EXPECT_EQ(streamed_layers_live(), 0);
    const std::string wa = weights_of(a), wb = weights_of(b);
    ASSERT_GT(wa.size(), 1000u);
    EXPECT_TRUE(wa == wb) << method_name(c.m) << (c.w4a4 ? " W4A4" : "")
                          << ": streamed checkpoint differs from the whole-model one";
    EXPECT_EQ(slurp(fs::path(a) / "config.json"), slurp(fs::path(b) / "config.json"));
    EXPECT_TRUE(fs::exists(fs::path(b) / "tokenizer.json"));
    EXPECT_EQ(r.linears.size(), 5u * 7u);
  }
}

TEST_F(QuantizeStream, GptqOnFullPrecisionActivationsIsByteIdentical) {
  QuantizeOptions o;
  o.method = Method::kSweepMse;
  o.gptq = true;
  o.w4a4 = true;
  const std::string a = (root_ / "gptq_whole").string(), b = (root_ / "gptq_fp").string();
  whole(o, a);
  streamed(o, b, /*sequential=*/false);
  EXPECT_TRUE(weights_of(a) == weights_of(b));
}

TEST_F(QuantizeStream, SequentialGptqIsDeterministicAndBeatsRtn) {
  QuantizeOptions o;
  o.method = Method::kSweepMse;
  o.gptq = true;
  const std::string a = (root_ / "seq1").string(), b = (root_ / "seq2").string(),
                    fp = (root_ / "seq_fp").string();
  reset_streamed_layers_peak();
  const QuantizeReport r1 = streamed(o, a);
  EXPECT_EQ(streamed_layers_peak(), 1);
  streamed(o, b);
  streamed(o, fp, false);
  EXPECT_TRUE(weights_of(a) == weights_of(b)) << "sequential GPTQ is not deterministic";
  EXPECT_FALSE(weights_of(a) == weights_of(fp))
      << "sequential GPTQ should calibrate later layers on quantized outputs";
  double sr = 0, sg = 0;
  for (const LinearResult& r : r1.linears) {
    EXPECT_LE(r.loss_gptq, r.loss_rtn) << r.name;
    sr += r.loss_rtn;
    sg += r.loss_gptq;
  }
  std::printf("sequential GPTQ on stories260K: layer-output loss RTN %.4f GPTQ %.4f (%.1f%%)\n", sr,
              sg, 100.0 * sg / sr);
  EXPECT_LT(sg, 0.9 * sr);
}

TEST_F(QuantizeStream, InterruptedRunLeavesNoOutputAndFreesLayers) {
  QuantizeOptions o;
  o.method = Method::kAbsMax;
  o.gptq = true;
  StreamOptions so;
  so.calib_text = text_;
  so.nsamples = 2;
  so.seqlen = 32;
  WriteOptions wo;
  wo.after_layer = [](int l) {
    if (l == 2) throw std::runtime_error("interrupted");
  };
  const std::string out = (root_ / "interrupted").string();
  EXPECT_THROW(write_quantized_checkpoint_streamed(hf_, so, o, out, wo), std::runtime_error);
  EXPECT_FALSE(fs::exists(out));
  EXPECT_EQ(streamed_layers_live(), 0);
}

// Sharded output while streaming: shards completed before an interruption live only in the
// temporary directory, which is removed; a full run holds one layer at a time and writes
// the same tensors as the single file.
TEST_F(QuantizeStream, ShardedStreamingIsAtomicAndBounded) {
  QuantizeOptions o;
  o.method = Method::kSweepMse;
  StreamOptions so;
  WriteOptions wo;
  wo.max_shard_bytes = 20000;
  wo.after_layer = [](int l) {
    if (l == 3) throw std::runtime_error("interrupted");
  };
  const std::string out = (root_ / "sharded_interrupted").string();
  EXPECT_THROW(write_quantized_checkpoint_streamed(hf_, so, o, out, wo), std::runtime_error);
  EXPECT_FALSE(fs::exists(out));
  for (const auto& e : fs::directory_iterator(root_))
    EXPECT_EQ(e.path().filename().string().find(".sharded_interrupted"), std::string::npos)
        << "left behind: " << e.path();
  wo.after_layer = nullptr;
  reset_streamed_layers_peak();
  const std::string full = (root_ / "sharded").string(), one = (root_ / "one").string();
  const QuantizeReport r = write_quantized_checkpoint_streamed(hf_, so, o, full, wo);
  EXPECT_EQ(streamed_layers_peak(), 1);
  ASSERT_GT(r.files.size(), 5u);
  EXPECT_FALSE(fs::exists(fs::path(full) / "model.safetensors"));
  const QuantizeReport r1 = write_quantized_checkpoint_streamed(hf_, so, o, one, {});
  EXPECT_EQ(r1.files, std::vector<std::string>{"model.safetensors"});
  const SafetensorsFile single = SafetensorsFile::open(one + "/model.safetensors");
  const HfTensorFiles shards(full);
  EXPECT_EQ(shards.files().size(), r.files.size());
  for (const TensorInfo& t : single.tensors()) {
    const TensorRef ref = shards.find(t.name);
    ASSERT_TRUE(ref.info) << t.name;
    EXPECT_EQ(ref.info->shape, t.shape);
    const auto a = single.raw(t), b = ref.file->raw(*ref.info);
    EXPECT_TRUE(std::equal(a.begin(), a.end(), b.begin(), b.end())) << t.name;
  }
}

TEST_F(QuantizeStream, BadInputsAreReported) {
  QuantizeOptions o;
  o.gptq = true;
  StreamOptions so;  // no calibration text, no statistics
  const std::string out = (root_ / "bad").string();
  EXPECT_THROW(write_quantized_checkpoint_streamed(hf_, so, o, out, {}), std::invalid_argument);
  so.calib_text = text_;
  so.seqlen = 1;
  EXPECT_THROW(write_quantized_checkpoint_streamed(hf_, so, o, out, {}), std::invalid_argument);
  EXPECT_THROW(write_quantized_checkpoint_streamed((root_ / "nope").string(), so, o, out, {}),
               std::runtime_error);
  EXPECT_FALSE(fs::exists(out));
}

// Qwen2 (q/k/v biases, untied lm_head) and Qwen3 (q/k RMSNorm) layers go through the streamed
// forward and writer like the whole-model path.
TEST_F(QuantizeStream, QwenArchitecturesMatchWholeModel) {
  const std::string tokp = kData + "/models/stories260K/tok512.bin";
  if (!fs::exists(tokp)) GTEST_SKIP() << tokp << " not found";
  const auto tok = model::Llama2cTokenizer::load(tokp, 512);
  const model::BpeSpec spec = model::sentencepiece_spec_from_llama2c(tok->vocab(), tok->scores());
  for (const model::Arch arch : {model::Arch::kQwen2, model::Arch::kQwen3}) {
    model::Config c = model::testing::small_config();
    c.arch = arch;
    c.vocab_size = 512;
    c.n_layers = 3;
    c.qkv_bias = arch == model::Arch::kQwen2;
    c.qk_norm = arch == model::Arch::kQwen3;
    c.tied_embeddings = arch == model::Arch::kQwen3;
    const model::Weights w = model::testing::random_model(c, 7);
    HfWriteOptions wo;
    wo.dtype = DType::kBF16;
    wo.tokenizer = &spec;
    const std::string dir = (root_ / ("qwen" + std::to_string(static_cast<int>(arch)))).string();
    save_hf_dir(w, dir, wo);
    for (const bool gptq : {false, true}) {
      QuantizeOptions o;
      o.method = Method::kSweepWmse;
      o.w4a4 = true;
      o.gptq = gptq;
      const LoadedModel m = load_model(dir);
      const model::CalibStats cs = calib_stats_for(m, "", text_, 4, 32, 5);
      const std::string a = dir + "_whole", b = dir + "_stream";
      WriteOptions wopt;
      wopt.overwrite = true;
      write_quantized_checkpoint(m, dir, &cs, o, a, wopt);
      StreamOptions so;
      so.calib_text = text_;
      so.nsamples = 4;
      so.seqlen = 32;
      so.seed = 5;
      so.sequential = false;
      write_quantized_checkpoint_streamed(dir, so, o, b, wopt);
      EXPECT_TRUE(weights_of(a) == weights_of(b))
          << (arch == model::Arch::kQwen2 ? "qwen2" : "qwen3") << (gptq ? " gptq" : " rtn");
    }
  }
}

}  // namespace
}  // namespace scalesweep::pipeline
