#include "scalesweep/pipeline/runtime.h"

#include <filesystem>
#include <stdexcept>

#include "scalesweep/pipeline/calibrate.h"
#include "scalesweep/scale/selector.h"

namespace scalesweep::pipeline {
namespace {

std::string shaping_given(const RuntimeRequest& a) {  // the options that only shape --quant
  std::string shaping;
  for (const auto& [given, name] :
       {std::pair{a.format_given, "--format"}, std::pair{a.method_given, "--method"},
        std::pair{a.block_given, "--block"}})
    if (given) shaping += (shaping.empty() ? "" : ", ") + std::string(name);
  return shaping;
}

void refuse_shaping_alone(const std::string& shaping) {
  throw std::invalid_argument(shaping + " given without --quant: simulated quantization is " +
                              "off and the run would be full precision; add --quant W, WA, " +
                              "WAKV or WAKVQ, or drop " + shaping);
}

model::SimQuantSpec parse_spec(const RuntimeRequest& a) {
  const TensorFormat f = kTensorFormatNames.parse(a.format);
  const Method m = kMethodNames.parse(a.method);
  try {
    return model::parse_sim_quant(a.quant, m, a.block, f);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument("--quant " + a.quant + " --format " + a.format + " --method " +
                                a.method + (a.block ? " --block " + std::to_string(a.block) : "") +
                                ": " + e.what());
  }
}

// The run-time activation quantizer a W4A4 checkpoint declares: NVFP4, 16-blocks, block
// scales per token from `method` (absmax: vLLM's), the stored encode-direction global scales.
std::shared_ptr<const model::RuntimeQuant> checkpoint_runtime_quant(const io::CheckpointQuant& cq,
                                                                    const std::string& method,
                                                                    const std::string& path) {
  const Method m = kMethodNames.parse(method);
  if (method_is_weighted(m))
    throw std::invalid_argument(path + ": --method " + method +
                                " needs importance weights, which a checkpoint does not carry; "
                                "its W4A4 activations take an unweighted selector (absmax, "
                                "4over6, sweep-mse, ...)");
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
  return rq;
}

}  // namespace

model::SimQuantSpec runtime_spec(const RuntimeRequest& a) {
  model::SimQuantSpec spec = parse_spec(a);
  const std::string shaping = shaping_given(a);
  if (!spec.any() && !shaping.empty()) refuse_shaping_alone(shaping);
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

RuntimeModel load_runtime(const RuntimeRequest& a, const RuntimeProgress& progress) {
  const std::string& model_path = a.model;
  RuntimeModel r;
  r.method = a.method;
  r.spec = parse_spec(a);  // before the (possibly long) load
  try {
    r.compute = model::kComputeNames.parse(a.compute);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string("--compute: ") + e.what());
  }
  if (!model::compute_available(r.compute))
    throw std::invalid_argument("--compute " + a.compute +
                                ": this build has no oneDNN (install libdnnl-dev, e.g. with "
                                "scripts/setup.sh, and configure again)");
  const std::string shaping = shaping_given(a);
  // Only a HF directory can declare its own quantization (which --method may shape).
  std::error_code ec;
  const bool may_declare = std::filesystem::is_directory(model_path, ec);
  if (!r.spec.any() && !shaping.empty() && !may_declare) refuse_shaping_alone(shaping);
  r.model = io::load_model(model_path, a.tokenizer);
  if (!r.model.tokenizer)
    throw std::runtime_error(model_path + ": no tokenizer found; give --tokenizer FILE");
  const io::CheckpointQuant& cq = r.model.quant;
  if (cq.nvfp4_weights && r.spec.any() && !a.force_requant)
    throw std::invalid_argument(
        model_path + ": the checkpoint's weights are already NVFP4 (config.json " +
        "quantization_config" + (cq.w4a4 ? ", W4A4" : ", weight-only") +
        ") and it runs as declared without --quant; --quant " + a.quant +
        " would quantize the quantized weights again: drop --quant, or give --force-requant");
  if (!r.spec.any() && !shaping.empty()) {
    if (!cq.w4a4) refuse_shaping_alone(shaping);
    // A W4A4 checkpoint: --method names the run-time activation selector; the format and
    // block are the checkpoint's (NVFP4, 16).
    if (a.format_given && kTensorFormatNames.parse(a.format) != TensorFormat::kNvfp4)
      throw std::invalid_argument(model_path + ": --format " + a.format +
                                  ": the W4A4 checkpoint's activations are NVFP4");
    if (a.block_given && a.block != 16)
      throw std::invalid_argument(model_path + ": --block " + std::to_string(a.block) +
                                  ": the W4A4 checkpoint's activations use 16-blocks");
  }
  if (cq.w4a4 && !r.spec.any()) {
    r.act_method = a.method_given ? a.method : "absmax";
    r.checkpoint_rq = checkpoint_runtime_quant(cq, r.act_method, model_path);
  }
  if (r.spec.needs_stats()) {
    const int64_t seqlen = a.stats.empty()
                               ? cap_seqlen(a.seqlen, r.model.weights.config.max_seq_len,
                                            model_path, "--calib-seqlen", progress.note)
                               : a.seqlen;
    r.stats = std::make_unique<model::CalibStats>(
        // Simulated quantization reads amax and the diagonal only: no ΣxxT.
        calib_stats_for(r.model, a.stats, a.calib_text, a.nsamples, seqlen, a.seed,
                        progress.calibrate, false));
  }
  return r;
}

}  // namespace scalesweep::pipeline
