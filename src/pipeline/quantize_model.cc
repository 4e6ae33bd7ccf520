// Whole-model NVFP4 quantization: the request, checked once, and the one entry
// (quantize_model) that picks the in-memory (quantize_write.cc) or streamed
// (quantize_stream.cc) path; the per-layer step is quantize_layer.cc.
#include "scalesweep/pipeline/quantize_model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "pipeline/quantize_internal.h"
#include "scalesweep/base/clock.h"
#include "scalesweep/base/option_error.h"
#include "scalesweep/base/parallel.h"
#include "scalesweep/format/minifloat.h"
#include "scalesweep/gptq/gptq.h"
#include "scalesweep/io/calib_stats.h"
#include "scalesweep/io/chat_meta.h"
#include "scalesweep/io/checkpoint.h"
#include "scalesweep/io/gguf.h"
#include "scalesweep/io/gguf_writer.h"
#include "scalesweep/io/hf.h"
#include "scalesweep/io/hf_config.h"
#include "scalesweep/io/hf_names.h"
#include "scalesweep/model/hf_tokenizer.h"
#include "scalesweep/model/tokenizer.h"
#include "scalesweep/model/transformer.h"
#include "scalesweep/model/weight.h"
#include "scalesweep/pipeline/calibrate.h"
#include "scalesweep/quant/evaluate.h"

namespace scalesweep::pipeline {
namespace fs = std::filesystem;
using io::hf_module_name;
using io::kAllLinears;
using model::LinearId;

void check_quantize_request(const QuantizeRequest& rq) {
  const QuantizeOptions& o = rq.options;
  check_threads(o.threads);  // before anything is read, whatever else the options need
  check_tp(rq.tp);
  // Impossible options fail before anything is loaded (calibration is checked below).
  if (!method_needs_calibration(o.method)) {
    QuantizeOptions no_cal = o;
    no_cal.gptq = false;
    no_cal.w4a4 = false;
    check_quantize_options(no_cal, nullptr, true);
  }
  if (needs_calibration(o) && rq.calib.text.empty() && rq.calib.stats.empty())
    check_quantize_options(o, nullptr, true);  // throws the user-facing message
  if (rq.target_bpw) {
    check_target_bpw(*rq.target_bpw);
    if (rq.calib.text.empty() && rq.calib.stats.empty())
      throw OptionError("target_bpw",
                        "mixed precision measures each Linear's sensitivity on calibration "
                        "data: pass " +
                            option_ref("calib") + " TEXT (sampled with " +
                            option_ref("calib_nsamples") + "/" + option_ref("calib_seqlen") + "/" +
                            option_ref("calib_seed") + ") or " + option_ref("stats") +
                            " STATS.safetensors (written by `scalesweep calibrate`)");
    if (sensitivity_is_measured(rq.sensitivity) && rq.calib.text.empty())
      throw OptionError("sensitivity", std::string(kSensitivityNames.name(rq.sensitivity)) +
                                           " runs the model on calibration text: pass " +
                                           option_ref("calib") + " TEXT");
    if (rq.sensitivity_samples < 1) throw OptionError("sensitivity_samples", "must be >= 1");
  }
  if (!io::is_gguf_path(rq.out_dir)) {
    if (rq.dense_q8_0)
      throw OptionError("dense_dtype", "q8_0 is for GGUF outputs only (-o OUT.gguf)");
    if (rq.gguf_qwen2_as) throw OptionError("gguf_arch", "is for GGUF outputs only (-o OUT.gguf)");
    return;
  }
  // Options of compressed-tensors checkpoints that a GGUF cannot honour.
  if (o.w4a4)
    throw OptionError("quant",
                      "WA: llama.cpp applies NVFP4 input scales only to the LM head, not to "
                      "decoder Linears; a GGUF output is W4A16 (" +
                          option_ref("quant") + " W)");
  if (rq.partial_blocks != PartialBlocks::kDense)
    throw OptionError("partial_blocks",
                      "quantize: ggml NVFP4 needs rows of whole 64-element super-blocks; a GGUF "
                      "stores other Linears dense");
  if (rq.tp != 1) throw OptionError("tp", "applies to vLLM checkpoints, not to a GGUF output");
  if (rq.max_shard_bytes != QuantizeRequest{}.max_shard_bytes)
    throw OptionError("max_shard_size", "a GGUF output is one file");
}

namespace {

using SensitivityFn = std::function<std::vector<LinearSensitivity>(const QuantizeOptions&)>;

// One quantize_model job: the request, its options (--target-bpw adds its choice to
// o.dense), the writer's options and the result; the streamed and the whole-model paths share
// its steps.
class QuantizeJob {
 public:
  QuantizeJob(const std::string& source, const QuantizeRequest& rq, const QuantizeEvents& ev);
  // Layer-by-layer streaming (memory bounded by one layer) or the whole model in memory.
  bool streams() const { return (hf_dir_ || gguf_src_) && rq_.stream; }
  QuantizeResult streamed();
  QuantizeResult whole();

 private:
  void notes(const model::Config& c, DType dense) const;
  void gguf_notes(const model::Config& c, DType dense) const;
  void check_budget(const model::Config& c) const;
  void choose(const model::Config& c, const SensitivityFn& sens_of);
  std::vector<LinearSensitivity> measure(const io::LoadedModel& m, const model::CalibStats& cal,
                                         const QuantizeOptions& forced) const;
  model::CalibStats whole_stats(const io::LoadedModel& m,
                                const std::function<void(const std::string&)>& cap_note) const;
  QuantizeResult finish(double load_s, double calib_s, double sens_s);

  const std::string& source_;
  const QuantizeRequest& rq_;
  const QuantizeEvents& ev_;
  QuantizeOptions o_;
  bool gguf_ = false, hf_dir_ = false, gguf_src_ = false, calibrate_ = false, measured_ = false;
  WriteOptions wo_;
  QuantizeResult res_;
  std::optional<MixedPlan> plan_;
  std::vector<LinearSensitivity> sens_;
  std::function<void(int64_t, int64_t)> quantize_progress_, sens_progress_;
  std::function<void(const std::string&)> note_;
};

QuantizeJob::QuantizeJob(const std::string& source, const QuantizeRequest& rq,
                         const QuantizeEvents& ev)
    : source_(source), rq_(rq), ev_(ev) {
  check_quantize_request(rq);
  // The calibration file given is readable, before the model is read.
  if (needs_calibration(rq.options) || rq.target_bpw) check_calib_source(rq.calib);
  // Mixture-of-experts models: a Hugging Face directory to a compressed-tensors checkpoint or
  // a GGUF (io::check_gguf_config says which llama.cpp can run).
  if (const auto pc = io::peek_model_config(source); pc && pc->moe()) {
    if (!fs::is_directory(source))
      io::refuse_moe_model(source, "quantize from a file (a Hugging Face directory is needed)");
    if (io::is_gguf_path(rq.out_dir)) io::check_gguf_config(*pc, source);
    if (rq.target_bpw) io::refuse_moe_model(source, "quantize " + option_ref("target_bpw"));
  }
  o_ = rq.options;
  o_.expert_min_tokens = rq.calib.expert_min_tokens;
  note_ = [&ev](const std::string& s) { ev.say(s); };
  quantize_progress_ = [&ev](int64_t d, int64_t t) { ev.step("quantize", "linear", d, t); };
  sens_progress_ = [&ev](int64_t d, int64_t t) { ev.step("sensitivity", "linear", d, t); };
  gguf_ = io::is_gguf_path(rq.out_dir);
  hf_dir_ = fs::is_directory(source);
  res_.dense = rq.dense ? *rq.dense : hf_dir_ ? io::hf_dir_dtype(source) : DType::kF32;
  wo_ = {.dense = res_.dense,
         .partial_blocks = rq.partial_blocks,
         .tp = rq.tp,
         .max_shard_bytes = rq.max_shard_bytes,
         .overwrite = rq.overwrite,
         .dense_q8_0 = rq.dense_q8_0,
         .gguf_qwen2_as = rq.gguf_qwen2_as.value_or(io::GgufQwen2As::kLlama),
         .tokenizer_override = !rq.tokenizer.empty()};
  calibrate_ = needs_calibration(o_) || rq.target_bpw.has_value();
  gguf_src_ = !hf_dir_ && io::GgufFile::sniff(source);
  // Measured sensitivities run the layers after each Linear (measure).
  measured_ = rq.target_bpw && sensitivity_is_measured(rq.sensitivity);
}

// The notes on what the output stores dense (vLLM's or llama.cpp's limits); a GGUF's config is
// refused here, before calibration, not at the first write.
void QuantizeJob::notes(const model::Config& c, DType dense) const {
  if (gguf_) return gguf_notes(c, dense);
  for (const std::string& n : vllm_dense_notes(c, rq_.tp, rq_.partial_blocks, dense)) ev_.say(n);
  if (const std::string v = vllm_mixed_fused_note(c, o_.dense); !v.empty()) ev_.say(v);
}

void QuantizeJob::gguf_notes(const model::Config& c, DType dense) const {
  io::check_gguf_config(c, source_);  // refused before calibration, not at the first write
  const io::GgufQwen2As as = rq_.gguf_qwen2_as.value_or(io::GgufQwen2As::kLlama);
  if (c.arch == model::Arch::kQwen2 && as == io::GgufQwen2As::kLlama)
    ev_.say(
        "qwen2: stored as llama.cpp's architecture 'llama' (q/k/v biases; q/k rows permuted as "
        "llama's; every Linear NVFP4, since llama.cpp's qwen2 graph ignores the FFN "
        "Linears' .scale); " +
        option_ref("gguf_arch") + " qwen2 keeps qwen2 with gate/up/down dense");
  const std::array<bool, 7> d = io::gguf_dense_linears(c, as);
  const std::string dn = rq_.dense_q8_0 ? "q8_0" : std::string(kDTypeNames.name(dense));
  for (LinearId id : kAllLinears) {
    if (!d[static_cast<size_t>(id)]) continue;
    const int64_t cols = io::hf_linear_shape(c, id).second;
    const bool f16 = rq_.dense_q8_0 && cols % 32 != 0;
    ev_.say(std::string(model::linear_name(id)) + ": " + io::gguf_nvfp4_obstacle(c, id, as) +
            "; stored dense (" + (f16 ? "f16: not a multiple of Q8_0's 32 either" : dn) +
            ") in every layer");
  }
  if (rq_.dense_q8_0 && c.dim % 32 != 0)
    ev_.say("token_embd/output: row length " + std::to_string(c.dim) +
            " is not a multiple of 32; stored f16 instead of q8_0");
}

// Layers named by --keep-dense exist; a target below the model's least is refused before
// anything is measured.
void QuantizeJob::check_budget(const model::Config& c) const {
  if (o_.dense.single_layer_end() > c.n_layers) {
    const auto m = o_.dense.members(o_.dense.single_layer_end());
    throw OptionError("keep_dense", io::hf_module_name(m.back().first, m.back().second) +
                                        ": the model has " + std::to_string(c.n_layers) +
                                        " layers (0.." + std::to_string(c.n_layers - 1) + ")");
  }
  if (!rq_.target_bpw) return;
  plan_mixed_precision(c, linear_storage(c, res_.dense, gguf_, rq_.dense_q8_0), {},
                       with_vllm_dense(o_, c, wo_, rq_.out_dir).dense, *rq_.target_bpw, !gguf_);
}

// --target-bpw: the plan from the sensitivities of the Linears that can be NVFP4; its choice
// joins o.dense. `sens_of(forced)` measures them.
void QuantizeJob::choose(const model::Config& c, const SensitivityFn& sens_of) {
  if (!rq_.target_bpw) return;
  const QuantizeOptions forced = with_vllm_dense(o_, c, wo_, rq_.out_dir);
  sens_ = sens_of(forced);
  plan_ = plan_mixed_precision(c, linear_storage(c, res_.dense, gguf_, rq_.dense_q8_0), sens_,
                               forced.dense, *rq_.target_bpw, !gguf_);
  o_.dense.add(plan_->dense);
}

// Measured sensitivities run the layers after each Linear, on the whole model `m` with its
// statistics `cal`, on the first sensitivity_samples calibration sequences.
std::vector<LinearSensitivity> QuantizeJob::measure(const io::LoadedModel& m,
                                                    const model::CalibStats& cal,
                                                    const QuantizeOptions& forced) const {
  const CalibTokens t = calib_tokens(m.tokenizer.get(), rq_.calib.text);
  const int64_t ns = std::min(rq_.calib.nsamples, rq_.sensitivity_samples);
  const int64_t len = std::min<int64_t>(rq_.calib.seqlen, m.weights.config.max_seq_len);
  const std::vector<int> seqs = model::calibration_sequences(t.tokens, ns, len, rq_.calib.draw(),
                                                             t.bos, m.weights.config.max_seq_len);
  return measured_sensitivities(m.weights, cal, forced, seqs, ns, len, rq_.sensitivity,
                                sens_progress_);
}

// The calibration statistics of a whole model (calib_stats_for), progress as "calibrate";
// the seqlen cap's note goes to `cap_note` (empty: already noted).
model::CalibStats QuantizeJob::whole_stats(
    const io::LoadedModel& m, const std::function<void(const std::string&)>& cap_note) const {
  CalibSource c = rq_.calib;
  if (c.stats.empty())
    c.seqlen = cap_calib_seqlen(c, m.weights.config.max_seq_len, source_, cap_note);
  const int64_t n = c.nsamples;
  return calib_stats_for(m, c,
                         [&](int64_t d, int64_t t) { ev_.step("calibrate", "seq", d * n / t, n); });
}

// The result once the writer's report is in: the phases timed here (load, calibration,
// sensitivities) added to it, and the mixed-precision plan.
QuantizeResult QuantizeJob::finish(double load_s, double calib_s, double sens_s) {
  res_.report.phases.load += load_s;
  res_.report.phases.forward += calib_s;
  res_.report.phases.sensitivity = sens_s;
  res_.report.seconds += load_s + calib_s + sens_s;
  res_.report.mixed = plan_;
  res_.report.sensitivities = std::move(sens_);
  return std::move(res_);
}

// Layer-by-layer streaming (memory bounded by one layer): a HF directory's tensors are read
// per layer; a GGUF is loaded as stored (its blocks stay in the mapping) and each layer
// widened when it is reached.
QuantizeResult QuantizeJob::streamed() {
  std::optional<io::HfLazyModel> hf;
  std::optional<io::StoredModelParts> stored;
  std::unique_ptr<model::Tokenizer> tok;
  StreamSource src;
  src.path = source_;
  src.hf_dir = hf_dir_;
  const auto l0 = std::chrono::steady_clock::now();
  if (hf_dir_) {
    src.parts = &hf.emplace(source_);
  } else {
    io::LoadedModel m = io::load_model(source_, rq_.tokenizer);
    tok = std::move(m.tokenizer);
    src.tokenizer = tok.get();
    src.parts =
        &stored.emplace(std::make_shared<const model::Weights>(std::move(m.weights)), source_);
  }
  const double load_s = seconds_since(l0);
  StreamOptions so;
  so.calib = rq_.calib;
  so.tokenizer = hf_dir_ ? rq_.tokenizer : std::string();  // a GGUF's override is in `tok`
  so.sequential = rq_.sequential;
  const model::Config& cfg = src.parts->config();
  if (calibrate_ && rq_.calib.stats.empty())
    so.calib.seqlen = cap_calib_seqlen(rq_.calib, cfg.max_seq_len, source_, note_);
  notes(cfg, res_.dense);
  check_budget(cfg);
  model::CalibStats stats;
  if (calibrate_ && !rq_.calib.stats.empty()) {
    stats = io::load_calib_stats(rq_.calib.stats);
    try {
      model::check_calib_stats(stats, cfg);
    } catch (const std::exception& e) {
      throw std::runtime_error(rq_.calib.stats + ": " + e.what());
    }
    so.stats = &stats;
  }
  const auto s0 = std::chrono::steady_clock::now();
  choose(cfg, [&](const QuantizeOptions& forced) {
    if (!measured_) return streamed_sensitivities(src, so, forced, rq_.sensitivity, sens_progress_);
    // Measured: the whole model for this pass only (then streamed as always).
    const io::LoadedModel loaded = io::load_model(source_, rq_.tokenizer);
    return measure(loaded, so.stats ? *so.stats : whole_stats(loaded, {}), forced);
  });
  const double sens_s = plan_ ? seconds_since(s0) : 0.0;
  res_.report =
      write_quantized_checkpoint_streamed(src, so, o_, rq_.out_dir, wo_, quantize_progress_);
  res_.streamed = true;
  return finish(load_s, 0.0, sens_s);
}

// Whole-model sources (llama2.c, HF or GGUF without streaming): the load and the calibration
// come before the writer's clock; they are timed here and added to its report, so that the
// phases and `seconds` cover the whole job (load; calibration as forward, its Hessian
// accumulation included).
QuantizeResult QuantizeJob::whole() {
  const auto l0 = std::chrono::steady_clock::now();
  const io::LoadedModel m = io::load_model(source_, rq_.tokenizer);
  const double load_s = seconds_since(l0);
  notes(m.weights.config, res_.dense);
  check_budget(m.weights.config);
  model::CalibStats calib;
  const model::CalibStats* cal = nullptr;
  double calib_s = 0;
  if (calibrate_) {
    const auto c0 = std::chrono::steady_clock::now();
    calib = whole_stats(m, note_);
    cal = &calib;
    calib_s = seconds_since(c0);
  }
  const auto s0 = std::chrono::steady_clock::now();
  choose(m.weights.config, [&](const QuantizeOptions& forced) {
    if (measured_) return measure(m, *cal, forced);
    std::vector<LinearSensitivity> out;
    const int n = m.weights.config.n_layers;
    sens_progress_(0, int64_t{n} * 7);
    for (int l = 0; l < n; ++l) {
      for (const LinearSensitivity& x :
           layer_sensitivities(m.weights, l, *cal, forced, rq_.sensitivity))
        out.push_back(x);
      sens_progress_(int64_t{l + 1} * 7, int64_t{n} * 7);
    }
    return out;
  });
  const double sens_s = plan_ ? seconds_since(s0) : 0.0;
  res_.report =
      write_quantized_checkpoint(m, source_, cal, o_, rq_.out_dir, wo_, quantize_progress_);
  return finish(load_s, calib_s, sens_s);
}

}  // namespace

QuantizeResult quantize_model(const std::string& source, const QuantizeRequest& rq,
                              const QuantizeEvents& ev) {
  QuantizeJob job(source, rq, ev);
  return job.streams() ? job.streamed() : job.whole();
}

}  // namespace scalesweep::pipeline
