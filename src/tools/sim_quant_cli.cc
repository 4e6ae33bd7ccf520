#include "tools/sim_quant_cli.h"

#include <stdexcept>

#include "scalesweep/scale/selector.h"
#include "tools/calib_cli.h"

namespace scalesweep::tools {

void add_sim_quant_options(CLI::App& sub, SimQuantArgs& a) {
  sub.add_option("--quant", a.quant, "simulated NVFP4: none, W, WA, WAKV, WAKVQ");
  sub.add_option("--method", a.method,
                 "block-scale selector (absmax, 4over6, "
                 "sweep-mse, sweep-wmse, ...)");
  sub.add_option("--block", a.block, "block size (8, 16, 32, 64)");
  sub.add_option("--stats", a.stats, "calibration statistics (scalesweep calibrate)");
  sub.add_option("--calib", a.calib, "text file to calibrate on when --stats is absent");
  sub.add_option("--calib-nsamples", a.calib_nsamples, "sequences for --calib")
      ->check(CLI::Range(1, 1 << 20));
  sub.add_option("--calib-seqlen", a.calib_seqlen, "sequence length for --calib")
      ->check(CLI::Range(2, 1 << 20));
}

SimQuantModel load_sim_quant_model(const std::string& model_path, const std::string& tokenizer,
                                   const SimQuantArgs& a, uint64_t seed) {
  SimQuantModel r;
  r.model = io::load_model(model_path, tokenizer);
  if (!r.model.tokenizer)
    throw std::runtime_error(model_path + ": no tokenizer found; give --tokenizer FILE");
  r.spec = model::parse_sim_quant(a.quant, parse_method(a.method), a.block);
  if (r.spec.needs_stats())
    r.stats = std::make_unique<model::CalibStats>(calib_stats_with_progress(
        r.model, a.stats, a.calib, a.calib_nsamples, a.calib_seqlen, seed));
  return r;
}

}  // namespace scalesweep::tools
