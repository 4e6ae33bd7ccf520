// Layer-by-layer streaming of `quantize` (write_quantized_checkpoint_streamed) against the
// whole-model path, on stories260K converted to a bf16 Hugging Face directory (and from it an
// NVFP4 GGUF, a source streamed from its mapping):
// - RTN (unweighted, weighted, W4A4) writes byte-identical checkpoints;
// - GPTQ calibrated on full-precision activations (sequential = false) is byte-identical too;
// - sequential GPTQ runs, is deterministic, differs, and lowers the layer-output loss vs RTN;
// - memory stays bounded by one decoder layer (heap in use sampled at each progress event:
//   it does not grow from layer to layer, and on a model whose layers dominate it stays
//   under two layers); an interrupted run (a failing progress callback) leaves nothing on
//   disk and frees what it held.
#include <gtest/gtest.h>
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>

#include "model/test_util.h"
#include "scalesweep/io/gguf.h"
#include "scalesweep/io/hf.h"
#include "scalesweep/io/load.h"
#include "scalesweep/model/hf_tokenizer.h"
#include "scalesweep/model/tokenizer.h"
#include "scalesweep/model/weight.h"
#include "scalesweep/pipeline/calibrate.h"
#include "scalesweep/pipeline/quantize_model.h"

namespace scalesweep::pipeline {
using namespace ::scalesweep::io;
namespace {

namespace fs = std::filesystem;
const std::string kData = SS_SHARED_DATA_DIR;

using scalesweep::testing::slurp;

// Bytes the allocator has handed out and not taken back (glibc: in-use chunks of the main
// arena, where this thread's allocations live, plus mmap'ed blocks).
int64_t heap_in_use() {
  const struct mallinfo2 mi = mallinfo2();
  return static_cast<int64_t>(mi.uordblks + mi.hblkhd);
}

// A progress callback that checks the events (each Linear once, in order, `total` known up
// front) and samples heap_in_use() at each; `fail_at` > 0: throws once `done` reaches it (an
// interrupted run).
struct ProgressProbe {
  int64_t total = 0, last = 0, fail_at = 0;
  std::vector<int64_t> heap;  // heap_in_use() at event done = 1 .. total
  explicit ProgressProbe(int64_t t, int64_t fail = 0) : total(t), fail_at(fail) {
    heap.reserve(static_cast<size_t>(t));
  }
  std::function<void(int64_t, int64_t)> fn() {
    return [this](int64_t done, int64_t tot) {
      EXPECT_EQ(tot, total);
      if (done == 0) {  // the start, announced once before the first Linear
        EXPECT_EQ(last, 0);
        EXPECT_TRUE(heap.empty());
        return;
      }
      heap.push_back(heap_in_use());
      EXPECT_EQ(done, last + 1) << "progress counts each Linear once, in order";
      last = done;
      if (done == fail_at) throw std::runtime_error("interrupted");
    };
  }
  // Heap at the last Linear of layer `l` (7 Linears a layer).
  int64_t at_layer(int l) const { return heap.at(static_cast<size_t>(7 * l + 6)); }
  // The layers are freed as they are written: the heap at the last layer is not above the
  // heap at the first by half a layer or more (it would be by n-1 layers if they were kept).
  void expect_no_growth(int n_layers, int64_t layer_bytes) const {
    ASSERT_EQ(last, total);
    EXPECT_LT(at_layer(n_layers - 1) - at_layer(0), layer_bytes / 2)
        << "heap grows from layer 0 to layer " << n_layers - 1 << " (one layer: " << layer_bytes
        << " bytes)";
  }
};

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
      cs = calib_stats_for(m, CalibSource{text_, "", 8, 64, 3});
      cal = &cs;
    }
    WriteOptions wo;
    wo.dense = DType::kBF16;
    return write_quantized_checkpoint(m, hf_, cal, o, out, wo);
  }
  static QuantizeReport streamed(const QuantizeOptions& o, const std::string& out,
                                 bool sequential = true,
                                 const std::function<void(int64_t, int64_t)>& progress = {}) {
    StreamOptions so;
    so.calib = CalibSource{text_, "", 8, 64, 3};  // as whole()'s
    so.sequential = sequential;
    WriteOptions wo;
    wo.dense = DType::kBF16;
    return write_quantized_checkpoint_streamed(hf_, so, o, out, wo, progress);
  }
  static model::Config config() { return HfLazyModel(hf_).config(); }
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
    ProgressProbe probe(5 * 7);
    const QuantizeReport r = streamed(o, b, true, probe.fn());
    probe.expect_no_growth(5, model::layer_f32_bytes(config()));
    const std::string wa = weights_of(a), wb = weights_of(b);
    ASSERT_GT(wa.size(), 1000u);
    EXPECT_TRUE(wa == wb) << kMethodNames.name(c.m) << (c.w4a4 ? " W4A4" : "")
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
  ProgressProbe probe(5 * 7);
  const QuantizeReport r1 = streamed(o, a, true, probe.fn());
  probe.expect_no_growth(5, model::layer_f32_bytes(config()));
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
  so.calib.text = text_;
  so.calib.nsamples = 2;
  so.calib.seqlen = 32;
  const std::string out = (root_ / "interrupted").string();
  // A first run of the same job, so that what the code allocates once (tables, thread pool)
  // is in the baseline below.
  EXPECT_THROW(write_quantized_checkpoint_streamed(hf_, so, o, out, {}, ProgressProbe(35, 7).fn()),
               std::runtime_error);
  const int64_t before = heap_in_use();
  ProgressProbe probe(5 * 7, 3 * 7);  // fails once layer 2 is written
  EXPECT_THROW(write_quantized_checkpoint_streamed(hf_, so, o, out, {}, probe.fn()),
               std::runtime_error);
  EXPECT_EQ(probe.last, 21) << "the run went on after its progress callback failed";
  EXPECT_FALSE(fs::exists(out));
  for (const auto& e : fs::directory_iterator(root_))
    EXPECT_EQ(e.path().filename().string().find(".interrupted"), std::string::npos)
        << "left behind: " << e.path();
  // Everything the run held (layer, hidden states, statistics) is freed.
  EXPECT_LT(heap_in_use() - before, model::layer_f32_bytes(config()) / 2);
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
  const std::string out = (root_ / "sharded_interrupted").string();
  ProgressProbe failing(5 * 7, 4 * 7);  // fails once layer 3 is written
  EXPECT_THROW(write_quantized_checkpoint_streamed(hf_, so, o, out, wo, failing.fn()),
               std::runtime_error);
  EXPECT_EQ(failing.last, 28);
  EXPECT_FALSE(fs::exists(out));
  for (const auto& e : fs::directory_iterator(root_))
    EXPECT_EQ(e.path().filename().string().find(".sharded_interrupted"), std::string::npos)
        << "left behind: " << e.path();
  const std::string full = (root_ / "sharded").string(), one = (root_ / "one").string();
  ProgressProbe probe(5 * 7);
  const QuantizeReport r = write_quantized_checkpoint_streamed(hf_, so, o, full, wo, probe.fn());
  probe.expect_no_growth(5, model::layer_f32_bytes(config()));
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

// A GGUF source (stories260K written as an NVFP4 GGUF, its dense tensors Q8_0: every matrix a
// ggml blocks in the mapping) is streamed by quantize_model unless stream = false, and both
// paths write the same bytes: RTN and GPTQ on full-precision activations, to compressed-tensors
// and to a GGUF; a streamed run holds one layer at a time.
TEST_F(QuantizeStream, GgufSourceStreamsWithTheWholeModelsBytes) {
  const std::string src = (root_ / "src.gguf").string();
  {
    QuantizeRequest rq;
    rq.options.method = Method::kSweepMse;
    rq.out_dir = src;
    rq.dense_q8_0 = true;
    quantize_model(hf_, rq, {});
  }
  int i = 0;
  for (const bool gptq : {false, true})
    for (const bool to_gguf : {false, true}) {
      SCOPED_TRACE(std::string(gptq ? "gptq" : "rtn") + (to_gguf ? " -> gguf" : " -> ct"));
      QuantizeRequest rq;
      rq.options.method = Method::kSweepWmse;
      rq.options.gptq = gptq;
      rq.calib = CalibSource{text_, "", 8, 64, 3};
      rq.sequential = false;
      const std::string sfx = std::to_string(i++) + (to_gguf ? ".gguf" : "");
      rq.out_dir = (root_ / ("gs" + sfx)).string();
      int64_t linears = 0;
      ProgressProbe probe(5 * 7);
      const auto on_linear = probe.fn();
      QuantizeEvents ev;
      ev.progress = [&](const std::string& stage, const char*, int64_t d, int64_t t) {
        if (stage == "quantize") {
          on_linear(d, t);
          linears = d;
        }
      };
      const QuantizeResult s = quantize_model(src, rq, ev);
      EXPECT_TRUE(s.streamed);
      EXPECT_EQ(linears, 35);
      probe.expect_no_growth(5, model::layer_f32_bytes(config()));
      rq.stream = false;
      const std::string streamed_out = rq.out_dir;
      rq.out_dir = (root_ / ("gw" + sfx)).string();
      const QuantizeResult w = quantize_model(src, rq, {});
      EXPECT_FALSE(w.streamed);
      const std::string a = to_gguf ? slurp(streamed_out) : weights_of(streamed_out);
      const std::string b = to_gguf ? slurp(rq.out_dir) : weights_of(rq.out_dir);
      ASSERT_GT(a.size(), 1000u);
      EXPECT_TRUE(a == b) << "streamed GGUF source differs from the whole-model path";
    }
}

TEST_F(QuantizeStream, BadInputsAreReported) {
  QuantizeOptions o;
  o.gptq = true;
  StreamOptions so;  // no calibration text, no statistics
  const std::string out = (root_ / "bad").string();
  EXPECT_THROW(write_quantized_checkpoint_streamed(hf_, so, o, out, {}), std::invalid_argument);
  so.calib.text = text_;
  so.calib.seqlen = 1;
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
      const CalibSource calib{text_, "", 4, 32, 5};
      const model::CalibStats cs = calib_stats_for(m, calib);
      const std::string a = dir + "_whole", b = dir + "_stream";
      WriteOptions wopt;
      wopt.overwrite = true;
      write_quantized_checkpoint(m, dir, &cs, o, a, wopt);
      StreamOptions so;
      so.calib = calib;
      so.sequential = false;
      write_quantized_checkpoint_streamed(dir, so, o, b, wopt);
      EXPECT_TRUE(weights_of(a) == weights_of(b))
          << (arch == model::Arch::kQwen2 ? "qwen2" : "qwen3") << (gptq ? " gptq" : " rtn");
      if (arch != model::Arch::kQwen2) continue;
      // A GGUF in llama.cpp's qwen2 layout keeps the FFN dense: streamed, its inputs get no
      // ΣxxT (only the diagonal), and the file is still the whole-model path's, byte for byte.
      QuantizeOptions g = o;
      g.w4a4 = false;
      WriteOptions gw = wopt;
      gw.gguf_qwen2_as = io::GgufQwen2As::kQwen2;
      write_quantized_checkpoint(m, dir, &cs, g, a + ".gguf", gw);
      write_quantized_checkpoint_streamed(dir, so, g, b + ".gguf", gw);
      EXPECT_EQ(io::GgufFile::open(b + ".gguf").find_tensor("blk.0.ffn_up.scale"), nullptr);
      const auto bytes = [](const std::string& p) {
        std::ifstream f(p, std::ios::binary);
        return std::string(std::istreambuf_iterator<char>(f), {});
      };
      EXPECT_EQ(bytes(a + ".gguf"), bytes(b + ".gguf")) << (gptq ? "gptq" : "rtn");
    }
  }
}

// On a model whose decoder layers dominate (6 layers of 4 MiB fp32, tiny embeddings), the heap
// in use while streaming, sampled at each progress event (the layer being written is alive
// then), stays above the baseline by at least half a layer (the probe sees the layer) and
// less than two (one layer at a time, plus its codes); it does not grow from layer to layer,
// and everything is freed at the end. The source is a bf16 HF directory, then the same model
// as an NVFP4 GGUF (its blocks stay in the mapping).
TEST(QuantizeStreamMemory, BoundedByOneLayer) {
  const model::testing::TempDir tmp("ss_stream_mem_test");
  const fs::path& root = tmp.path();
  model::Config c = model::testing::shaped_config(256, 1024, 6, 4, 4, 64, 64, 64);
  c.tied_embeddings = true;
  const std::string dir = (root / "hf").string();
  {
    HfWriteOptions wo;
    wo.dtype = DType::kBF16;
    save_hf_dir(model::testing::random_model(c, 9), dir, wo);
  }
  const int64_t layer = model::layer_f32_bytes(c);
  ASSERT_EQ(layer, 4 * (2 * 256 + 4 * 256 * 256 + 3 * 1024 * 256));
  const std::string gguf = (root / "src.gguf").string();
  {
    QuantizeRequest rq;
    rq.options.method = Method::kAbsMax;
    rq.out_dir = gguf;
    quantize_model(dir, rq, {});
  }
  for (const std::string& src : {dir, gguf}) {
    SCOPED_TRACE(src);
    QuantizeRequest rq;
    rq.options.method = Method::kAbsMax;
    rq.dense = DType::kBF16;
    rq.overwrite = true;
    ProgressProbe probe(6 * 7);
    const auto on_linear = probe.fn();
    bool probing = false;
    QuantizeEvents ev;
    ev.progress = [&](const std::string& stage, const char*, int64_t d, int64_t t) {
      if (stage == "quantize" && probing) on_linear(d, t);
    };
    // A first run, so that what the code allocates once is in the baseline.
    rq.out_dir = (root / "warm").string();
    ASSERT_TRUE(quantize_model(src, rq, ev).streamed);
    const int64_t before = heap_in_use();
    probing = true;
    rq.out_dir = (root / "out").string();
    const QuantizeResult r = quantize_model(src, rq, ev);
    const int64_t after = heap_in_use();
    ASSERT_EQ(r.report.linears.size(), 42u);
    probe.expect_no_growth(6, layer);
    const int64_t peak = *std::max_element(probe.heap.begin(), probe.heap.end()) - before;
    std::printf(
        "streamed quantize (%s): heap above baseline at most %.2f MiB (one fp32 layer %.2f "
        "MiB)\n",
        src == dir ? "HF" : "GGUF", peak / 1048576.0, layer / 1048576.0);
    EXPECT_GT(peak, layer / 2) << "the probe does not see the layer being written";
    EXPECT_LT(peak, 2 * layer) << "more than one decoder layer resident";
    EXPECT_LT(after - before, layer / 4) << "memory kept after the run";
    // The same output as the first run.
    EXPECT_TRUE(slurp(root / "warm" / "model.safetensors") ==
                slurp(root / "out" / "model.safetensors"));
  }
}

}  // namespace
}  // namespace scalesweep::pipeline
