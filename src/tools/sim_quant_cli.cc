#include "tools/sim_quant_cli.h"

#include <filesystem>
#include <stdexcept>

#include "scalesweep/scale/selector.h"
#include "tools/calib_cli.h"

namespace scalesweep::tools {

bool resolve_bos(const BosOption& a, const model::Tokenizer& tok) {
  const bool bos = a.opt && a.opt->count() > 0 ? a.bos : tok.add_bos();
  if (bos && tok.bos() < 0)
    throw std::invalid_argument(
        a.opt && a.opt->count() > 0
            ? "--bos: the tokenizer has no BOS token"
            : "the tokenizer asks for BOS (add_bos_token) but has no BOS token; give --no-bos");
  return bos;
}

namespace {

std::string shaping_given(const SimQuantOptions& a) {  // the options that only shape --quant
  std::string shaping;
  for (const CLI::Option* o : {a.q.format_opt, a.q.method_opt, a.q.block_opt})
    if (o && o->count() > 0) shaping += (shaping.empty() ? "" : ", ") + o->get_name();
  return shaping;
}

void refuse_shaping_alone(const std::string& shaping) {
  throw std::invalid_argument(shaping + " given without --quant: simulated quantization is " +
                              "off and the run would be full precision; add --quant W, WA, " +
                              "WAKV or WAKVQ, or drop " + shaping);
}

model::SimQuantSpec parse_spec(const SimQuantOptions& a) {
  const TensorFormat f = kTensorFormatNames.parse(a.q.format);
  const Method m = kMethodNames.parse(a.q.method);
  try {
    return model::parse_sim_quant(a.quant, m, a.q.block, f);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(
        "--quant " + a.quant + " --format " + a.q.format + " --method " + a.q.method +
        (a.q.block ? " --block " + std::to_string(a.q.block) : "") + ": " + e.what());
  }
}

}  // namespace

model::SimQuantSpec parse_sim_quant_args(const SimQuantOptions& a) {
  model::SimQuantSpec spec = parse_spec(a);
  const std::string shaping = shaping_given(a);
  if (!spec.any() && !shaping.empty()) refuse_shaping_alone(shaping);
  return spec;
}

static nlohmann::json sim_quant_fields(const SimQuantModel& sm, const SimQuantOptions& a) {
  const model::SimQuantSpec& spec = sm.spec;
  const io::CheckpointQuant& cq = sm.model.quant;
  if (cq.nvfp4_weights && !spec.any())
    return {{"quant", cq.w4a4 ? "WA" : "W"},
            {"method", cq.w4a4 ? sm.act_method : "checkpoint"},
            {"format", "nvfp4"},
            {"block", 16},
            {"source", "checkpoint"}};
  return {{"quant", spec.name()},
          {"method", spec.any() ? a.q.method : "none"},
          {"format", spec.any() ? std::string(kTensorFormatNames.name(spec.cfg.format)) : "none"},
          {"block", spec.cfg.block},
          {"source", !spec.any()        ? "none"
                     : cq.nvfp4_weights ? "checkpoint+simulated"
                                        : "simulated"}};
}

nlohmann::json sim_quant_json(const SimQuantModel& sm, const SimQuantOptions& a) {
  nlohmann::json j = sim_quant_fields(sm, a);
  j["compute"] = std::string(model::kComputeNames.name(sm.compute));
  return j;
}

std::unique_ptr<model::Transformer> make_run_transformer(const SimQuantModel& sm,
                                                         std::shared_ptr<const model::Weights> fp,
                                                         int max_ctx) {
  std::unique_ptr<model::Transformer> tf;
  if (!sm.checkpoint_rq) {
    tf = model::make_sim_quant_transformer(std::move(fp), sm.spec, sm.stats.get(), max_ctx);
  } else {
    tf = std::make_unique<model::Transformer>(std::move(fp), max_ctx);
    tf->set_runtime_quant(sm.checkpoint_rq);
  }
  tf->set_compute(sm.compute);
  return tf;
}

namespace {

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

SimQuantModel load_sim_quant_model(const ModelOptions& model, const SimQuantOptions& a,
                                   uint64_t seed) {
  const std::string& model_path = model.path;
  SimQuantModel r;
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
  r.model = io::load_model(model_path, model.tokenizer);
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
    if (given(a.q.format_opt) && kTensorFormatNames.parse(a.q.format) != TensorFormat::kNvfp4)
      throw std::invalid_argument(model_path + ": --format " + a.q.format +
                                  ": the W4A4 checkpoint's activations are NVFP4");
    if (given(a.q.block_opt) && a.q.block != 16)
      throw std::invalid_argument(model_path + ": --block " + std::to_string(a.q.block) +
                                  ": the W4A4 checkpoint's activations use 16-blocks");
  }
  if (cq.w4a4 && !r.spec.any()) {
    r.act_method = given(a.q.method_opt) ? a.q.method : "absmax";
    r.checkpoint_rq = checkpoint_runtime_quant(cq, r.act_method, model_path);
  }
  if (r.spec.needs_stats()) {
    const CalibOptions& c = a.calib;
    const int64_t seqlen =
        c.stats.empty()
            ? cap_seqlen(c.seqlen, r.model.weights.config.max_seq_len, model_path, "--calib-seqlen")
            : c.seqlen;
    r.stats = std::make_unique<model::CalibStats>(
        // Simulated quantization reads amax and the diagonal only: no ΣxxT.
        calib_stats_with_progress(r.model, c.stats, c.text, c.nsamples, seqlen, seed, false));
  }
  return r;
}

}  // namespace scalesweep::tools
