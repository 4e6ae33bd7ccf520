#include "tools/sim_quant_cli.h"

#include <optional>
#include <stdexcept>

#include "tools/ui.h"

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

pipeline::SimQuantRequest sim_quant_request(const SimQuantOptions& a) {
  pipeline::SimQuantRequest q;
  q.setting = parse_named(model::kQuantSettingNames, "--quant", a.quant);
  if (given(a.q.format_opt)) q.format = parse_named(kTensorFormatNames, "--format", a.q.format);
  if (given(a.q.method_opt)) q.method = parse_named(kMethodNames, "--method", a.q.method);
  if (given(a.q.block_opt)) q.block = a.q.block;
  return q;
}

pipeline::RuntimeRequest runtime_request(const ModelOptions& model, const SimQuantOptions& a,
                                         uint64_t seed) {
  pipeline::RuntimeRequest r;
  r.model = model.path;
  r.tokenizer = model.tokenizer;
  r.sim = sim_quant_request(a);
  r.calib = calib_source(a.calib);
  r.calib.seed = seed;
  r.force_requant = a.force_requant;
  r.compute = parse_named(model::kComputeNames, "--compute", a.compute);
  return r;
}

pipeline::RuntimeModel load_sim_quant_model(
    const ModelOptions& model, const SimQuantOptions& a, uint64_t seed,
    std::function<void(const model::Config&)> check_config) {
  pipeline::RuntimeRequest request = runtime_request(model, a, seed);
  request.check_config = std::move(check_config);
  StageBars bars;
  pipeline::RuntimeProgress progress;
  progress.note = print_option_note;
  const int64_t n = request.calib.nsamples;
  progress.progress = [&](const std::string&, const char*, int64_t d, int64_t t) {
    bars.report("calibrate", "seq", d * n / t, n);
  };
  return pipeline::load_runtime(request, progress);
}

nlohmann::json sim_quant_json(const pipeline::RuntimeModel& rm) {
  const pipeline::RuntimeDescription d = pipeline::describe_runtime(rm);
  return {{"quant", d.quant}, {"method", d.method}, {"format", d.format},
          {"block", d.block}, {"source", d.source}, {"compute", d.compute}};
}

}  // namespace scalesweep::tools
