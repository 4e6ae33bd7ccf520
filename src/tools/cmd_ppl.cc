// scalesweep ppl MODEL --text FILE [--ctx N] [--stride S] [--max-tokens T] [--json]
//   [--quant W|WA|WAKV|WAKVQ --format nvfp4|mxfp4 --method M --block B
//    (--stats STATS | --calib TEXT [--calib-nsamples N --calib-seqlen L --calib-seed S])]
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "scalesweep/io/load.h"
#include "scalesweep/model/perplexity.h"
#include "tools/command.h"
#include "tools/sim_quant_cli.h"
#include "tools/ui.h"

namespace scalesweep::tools {
namespace {

struct PplArgs {
  ModelOptions model;
  std::string text;  // the evaluation text
  int ctx = 0, stride = 0;
  int64_t max_tokens = 0;
  OutputOptions out;  // --json
  BosOption bos;
  SimQuantOptions sq;
};

int run_ppl(const PplArgs& a) {
  // The text and the window are checked before the weights are read.
  const std::string text = io::read_text_file(a.text);
  const model::PplOptions opt{a.ctx, a.stride, a.max_tokens};
  pipeline::RuntimeModel sm = load_sim_quant_model(
      a.model, a.sq, a.sq.calib.seed,
      [&](const model::Config& c) { model::check_ppl_window(opt, c.max_seq_len); });
  io::LoadedModel& m = sm.model;
  const bool bos = resolve_bos(a.bos, *m.tokenizer);
  const std::vector<int> tokens = m.tokenizer->encode(text, bos, false);
  const model::Config cfg = m.weights.config;
  auto fp = std::make_shared<const model::Weights>(std::move(m.weights));
  auto tf = pipeline::make_runtime_transformer(sm, fp, a.ctx);
  model::PplResult r;
  {
    // Prefilled tokens against wall time from the start of the work: the count and clock of
    // the summary's prefill tok/s.
    ProgressBar bar(
        "ppl", model::ppl_prefill_tokens(static_cast<int64_t>(tokens.size()), opt, cfg.max_seq_len),
        "tok");
    r = model::perplexity(*tf, tokens, opt, [&](int64_t done, int64_t) { bar.update(done); });
  }
  const int ctx = opt.ctx > 0 ? opt.ctx : std::min(cfg.max_seq_len, 2048);
  if (a.out.json) {
    nlohmann::json j = {{"tokens", r.tokens},
                        {"nll_per_token", r.nll_per_token},
                        {"ppl", r.ppl},
                        {"seconds", r.seconds},
                        {"prefill_tokens_per_s", r.prefill_tokens_per_s},
                        {"prefill_tokens", r.prefill_tokens},
                        {"windows", r.windows},
                        {"ctx", ctx},
                        {"stride", opt.stride > 0 ? opt.stride : ctx},
                        {"bos", bos}};
    j.update(sim_quant_json(sm));
    std::printf("%s\n", j.dump().c_str());
  } else {
    const nlohmann::json q = sim_quant_json(sm);
    const bool quantized = q["format"] != "none";
    Table t({"model", "quant", "format", "method", "source", "ctx", "tokens", "nll/token", "ppl",
             "seconds", "prefill tok/s"});
    t.add_row({a.model.path, q["quant"].get<std::string>(),
               quantized
                   ? strf("%s b%d", q["format"].get<std::string>().c_str(), q["block"].get<int>())
                   : "-",
               quantized ? q["method"].get<std::string>() : "-", q["source"].get<std::string>(),
               std::to_string(ctx), std::to_string(r.tokens), strf("%.5f", r.nll_per_token),
               strf("%.4f", r.ppl), strf("%.2f", r.seconds), strf("%.0f", r.prefill_tokens_per_s)});
    t.print();
  }
  return 0;
}

}  // namespace

SS_COMMAND("ppl", "Perplexity of a text under a model (optionally simulated NVFP4/MXFP4)",
           [](CLI::App& sub) -> std::function<int()> {
             auto a = std::make_shared<PplArgs>();
             add_model_options(sub, a->model);
             sub.add_option("--text", a->text, "evaluation text file")->required();
             sub.add_option("--ctx", a->ctx, "window length; 0: min(max_seq_len, 2048)")
                 ->check(CLI::Range(0, 1 << 20));
             sub.add_option("--stride", a->stride, "window stride; 0: the window length")
                 ->check(CLI::Range(0, 1 << 20));
             sub.add_option("--max-tokens", a->max_tokens,
                            "evaluate only the first T tokens (0 = all)")
                 ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
             add_bos_option(sub, a->bos);
             CalibSpelling calib;
             calib.seed_alias = true;  // ppl --seed: the calibration seed
             add_sim_quant_options(sub, a->sq, calib);
             add_output_options(sub, a->out, json_only());
             return [a] { return run_ppl(*a); };
           });

}  // namespace scalesweep::tools
