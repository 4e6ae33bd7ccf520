#include "tools/sim_quant_cli.h"

#include <stdexcept>

#include "scalesweep/scale/selector.h"
#include "tools/calib_cli.h"
#include "tools/seqlen.h"

namespace scalesweep::tools {

void add_sim_quant_options(CLI::App& sub, SimQuantArgs& a) {
  sub.add_option("--quant", a.quant, "simulated quantization: none, W, WA, WAKV, WAKVQ");
  a.format_opt = sub.add_option("--format", a.format,
                                "nvfp4 (default; E4M3 scales) or mxfp4 (UE8M0, block 32)");
  a.method_opt = sub.add_option("--method", a.method,
                                "block-scale selector (absmax, 4over6, "
                                "sweep-mse, sweep-wmse, ...)");
  a.block_opt =
      sub.add_option("--block", a.block, "block size (nvfp4: 8, 16 (default), 32, 64; mxfp4: 32)");
  sub.add_option("--stats", a.stats, "calibration statistics (scalesweep calibrate)");
  sub.add_option("--calib", a.calib, "text file to calibrate on when --stats is absent");
  sub.add_option("--calib-nsamples", a.calib_nsamples, "sequences for --calib")
      ->check(CLI::Range(1, 1 << 20));
  sub.add_option("--calib-seqlen", a.calib_seqlen,
                 "sequence length for --calib (capped at the model's max_seq_len)")
      ->check(CLI::Range(2, 1 << 20));
}

model::SimQuantSpec parse_sim_quant_args(const SimQuantArgs& a) {
  const TensorFormat f = model::parse_tensor_format(a.format);
  const Method m = parse_method(a.method);
  std::string shaping;  // the options that only say how --quant quantizes
  for (const CLI::Option* o : {a.format_opt, a.method_opt, a.block_opt})
    if (o && o->count() > 0) shaping += (shaping.empty() ? "" : ", ") + o->get_name();
  model::SimQuantSpec spec;
  try {
    spec = model::parse_sim_quant(a.quant, m, a.block, f);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument("--quant " + a.quant + " --format " + a.format + " --method " +
                                a.method + (a.block ? " --block " + std::to_string(a.block) : "") +
                                ": " + e.what());
  }
  if (!spec.any() && !shaping.empty())
    throw std::invalid_argument(shaping + " given without --quant: simulated quantization is " +
                                "off and the run would be full precision; add --quant W, WA, " +
                                "WAKV or WAKVQ, or drop " + shaping);
  return spec;
}

nlohmann::json sim_quant_json(const model::SimQuantSpec& spec, const SimQuantArgs& a) {
  return {{"quant", spec.name()},
          {"method", spec.any() ? a.method : "none"},
          {"format", spec.any() ? model::tensor_format_name(spec.cfg.format) : "none"},
          {"block", spec.cfg.block}};
}

SimQuantModel load_sim_quant_model(const std::string& model_path, const std::string& tokenizer,
                                   const SimQuantArgs& a, uint64_t seed) {
  SimQuantModel r;
  r.spec = parse_sim_quant_args(a);  // before the (possibly long) load
  r.model = io::load_model(model_path, tokenizer);
  if (!r.model.tokenizer)
    throw std::runtime_error(model_path + ": no tokenizer found; give --tokenizer FILE");
  if (r.spec.needs_stats()) {
    const int64_t seqlen = a.stats.empty()
                               ? cap_seqlen(a.calib_seqlen, r.model.weights.config.max_seq_len,
                                            model_path, "--calib-seqlen")
                               : a.calib_seqlen;
    r.stats = std::make_unique<model::CalibStats>(
        calib_stats_with_progress(r.model, a.stats, a.calib, a.calib_nsamples, seqlen, seed));
  }
  return r;
}

}  // namespace scalesweep::tools
