#include "scalesweep/pipeline/runtime.h"

#include <filesystem>
#include <stdexcept>

#include "scalesweep/base/option_error.h"
#include "scalesweep/io/hf.h"
#include "scalesweep/pipeline/calibrate.h"
#include "scalesweep/scale/selector.h"

namespace scalesweep::pipeline {
namespace {

// The field of the first option that only shapes the setting, given without one.
void refuse_shaping_alone(const SimQuantRequest& q) {
  const char* field = q.format ? "format" : q.method ? "method" : "block";
  throw OptionError(field,
                    "given without a simulated-quantization setting (quant): simulated "
                    "quantization is off and the run would be full precision; set quant to W, "
                    "WA, WAKV or WAKVQ, or drop it");
}

model::SimQuantSpec parse_spec(const SimQuantRequest& q) {
  return model::parse_sim_quant(model::kQuantSettingNames.name(q.setting),
                                q.method.value_or(Method::kSweepMse), q.block.value_or(0),
                                q.format.value_or(TensorFormat::kNvfp4));
}

// The run-time activation quantizer a W4A4 checkpoint declares: NVFP4, 16-blocks, block
// scales per token from `method` (absmax: vLLM's), the stored encode-direction global scales.
std::shared_ptr<const model::RuntimeQuant> checkpoint_runtime_quant(const io::CheckpointQuant& cq,
                                                                    Method m,
                                                                    const std::string& path) {
  if (method_needs_calibration(m))
    throw OptionError("method", std::string(kMethodNames.name(m)) +
                                    " needs calibration (importance or Hessians), which the "
                                    "checkpoint " +
                                    path +
                                    " does not carry; its W4A4 activations take an unweighted "
                                    "selector (absmax, 4over6, sweep-mse, ...)");
  const model::SimQuantSpec wa = model::parse_sim_quant("WA", m, 16, TensorFormat::kNvfp4);
  auto rq = std::make_shared<model::RuntimeQuant>();
  rq->acts = true;
  rq->cfg = wa.cfg;
  rq->layers.resize(cq.input_gs.size());
  for (size_t l = 0; l < cq.input_gs.size(); ++l)
    for (int i = 0; i < model::kNumInputs; ++i) {
      const float gs = cq.input_gs[l][static_cast<size_t>(i)];
      rq->layers[l].input_gs[static_cast<size_t>(i)] = gs > 0 ? gs : 1.0f;
      rq->layers[l].input_on[static_cast<size_t>(i)] = gs > 0;
    }
  for (size_t l = 0; l < cq.expert_input_gs.size() && l < rq->layers.size(); ++l)
    rq->layers[l].expert_input_gs = cq.expert_input_gs[l];
  return rq;
}

}  // namespace

model::SimQuantSpec runtime_spec(const RuntimeRequest& a) {
  model::SimQuantSpec spec = parse_spec(a.sim);
  if (!spec.any() && a.sim.shaped()) refuse_shaping_alone(a.sim);
  return spec;
}

RuntimeDescription describe_runtime(const RuntimeModel& rm) {
  const model::SimQuantSpec& spec = rm.spec;
  const io::CheckpointQuant& cq = rm.model.quant;
  const std::string compute(model::kComputeNames.name(rm.compute));
  if (cq.nvfp4_weights && !spec.any())
    return {cq.w4a4 ? "WA" : "W",
            cq.w4a4 ? rm.act_method : "checkpoint",
            "nvfp4",
            16,
            "checkpoint",
            compute};
  return {spec.name(),
          spec.any() ? rm.method : "none",
          spec.any() ? std::string(kTensorFormatNames.name(spec.cfg.format)) : "none",
          spec.cfg.block,
          !spec.any()        ? "none"
          : cq.nvfp4_weights ? "checkpoint+simulated"
                             : "simulated",
          compute};
}

std::unique_ptr<model::Transformer> make_runtime_transformer(
    const RuntimeModel& rm, std::shared_ptr<const model::Weights> fp, int max_ctx) {
  std::unique_ptr<model::Transformer> tf;
  if (!rm.checkpoint_rq) {
    tf = model::make_sim_quant_transformer(std::move(fp), rm.spec, rm.stats.get(), max_ctx);
  } else {
    tf = std::make_unique<model::Transformer>(std::move(fp), max_ctx);
    tf->set_runtime_quant(rm.checkpoint_rq);
  }
  tf->set_compute(rm.compute);
  return tf;
}

namespace {

void check_compute(model::Compute c) {
  if (!model::compute_available(c))
    throw OptionError("compute", std::string(model::kComputeNames.name(c)) +
                                     ": this build has no oneDNN (install libdnnl-dev, e.g. with "
                                     "scripts/setup.sh, and configure again)");
}

// A W4A4 checkpoint run as it declares: sim.method names the run-time activation selector;
// the format and block are the checkpoint's (NVFP4, 16).
void check_w4a4_shaping(const SimQuantRequest& q, const std::string& path) {
  if (q.format && *q.format != TensorFormat::kNvfp4)
    throw OptionError("format", std::string(kTensorFormatNames.name(*q.format)) +
                                    ": the W4A4 checkpoint " + path +
                                    " quantizes its activations as NVFP4");
  if (q.block && *q.block != 16)
    throw OptionError("block", std::to_string(*q.block) + ": the W4A4 checkpoint " + path +
                                   " quantizes its activations in 16-blocks");
}

// --quant on a checkpoint that declares NVFP4 weights (its config.json's quantization_config,
// read before the weights), unless --force-requant.
void refuse_requant(const RuntimeRequest& a, const io::CtInfo& ct) {
  throw std::invalid_argument(
      a.model + ": the checkpoint's weights are already NVFP4 (config.json " +
      "quantization_config" + (ct.w4a4 ? ", W4A4" : ", weight-only") +
      ") and it runs as declared without " + option_ref("quant") + "; " + option_ref("quant") +
      " " + std::string(model::kQuantSettingNames.name(a.sim.setting)) +
      " would quantize the quantized weights again: drop " + option_ref("quant") + ", or give " +
      option_ref("force_requant"));
}

}  // namespace

RuntimeModel load_runtime(const RuntimeRequest& a, const RuntimeProgress& progress) {
  const std::string& model_path = a.model;
  RuntimeModel r;
  r.method = kMethodNames.name(a.sim.method.value_or(Method::kSweepMse));
  r.spec = parse_spec(a.sim);  // before the (possibly long) load
  r.compute = a.compute;
  check_compute(r.compute);
  // Only a HF directory can declare its own quantization (which sim.method may shape).
  std::error_code ec;
  const bool may_declare = std::filesystem::is_directory(model_path, ec);
  if (!r.spec.any() && a.sim.shaped() && !may_declare) refuse_shaping_alone(a.sim);
  if (r.spec.any()) io::refuse_moe_model(model_path, "simulated quantization (quant)");
  // Everything that can be refused without the weights is refused before they are read.
  if (r.spec.needs_stats()) check_calib_source(a.calib);
  const std::optional<model::Config> peeked = io::peek_model_config(model_path);
  if (peeked && a.check_config) a.check_config(*peeked);
  if (may_declare && r.spec.any() && !a.force_requant) {
    const io::CtInfo ct = io::hf_quantization_config(model_path);
    if (ct.nvfp4) refuse_requant(a, ct);
  }
  r.model = io::load_model(model_path, a.tokenizer);
  if (!peeked && a.check_config) a.check_config(r.model.weights.config);
  if (!r.model.tokenizer)
    throw std::runtime_error(model_path + ": no tokenizer found; give " + option_ref("tokenizer") +
                             " FILE");
  // (--quant on NVFP4 weights without --force-requant was refused above, from config.json.)
  const io::CheckpointQuant& cq = r.model.quant;
  if (!r.spec.any() && a.sim.shaped()) {
    if (!cq.w4a4) refuse_shaping_alone(a.sim);
    check_w4a4_shaping(a.sim, model_path);
  }
  if (cq.w4a4 && !r.spec.any()) {
    const Method m = a.sim.method.value_or(Method::kAbsMax);
    r.act_method = kMethodNames.name(m);
    r.checkpoint_rq = checkpoint_runtime_quant(cq, m, model_path);
  }
  if (r.spec.needs_stats()) {
    CalibSource c = a.calib;
    if (c.stats.empty())
      c.seqlen = cap_calib_seqlen(c, r.model.weights.config.max_seq_len, model_path, progress.note);
    // Simulated quantization reads amax and the diagonal only: no ΣxxT.
    r.stats = std::make_unique<model::CalibStats>(calib_stats_for(
        r.model, c, [&](int64_t d, int64_t t) { progress.step("calibrate", "seq", d, t); }, false));
  }
  return r;
}

}  // namespace scalesweep::pipeline
