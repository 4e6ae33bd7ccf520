// scalesweep ppl MODEL --text FILE [--ctx N] [--stride S] [--max-tokens T] [--json]
//   [--quant W|WA|WAKV|WAKVQ --format nvfp4|mxfp4 --method M --block B
//    (--stats STATS | --calib TEXT [--calib-nsamples N --calib-seqlen L])]
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "scalesweep/io/load.h"
#include "scalesweep/model/perplexity.h"
#include "scalesweep/model/simquant.h"
#include "tools/command.h"
#include "tools/sim_quant_cli.h"
#include "tools/ui.h"

namespace scalesweep::tools {
namespace {

struct PplArgs {
  std::string model, tokenizer, text;
  int ctx = 0, stride = 0;
  int64_t max_tokens = 0;
  bool json = false, no_bos = false;
  SimQuantArgs sq;
  uint64_t seed = 0;
};

int run_ppl(const PplArgs& a) {
  SimQuantModel sm = load_sim_quant_model(a.model, a.tokenizer, a.sq, a.seed);
  io::LoadedModel& m = sm.model;
  const model::SimQuantSpec& spec = sm.spec;
  const std::vector<int> tokens = m.tokenizer->encode(io::read_text_file(a.text), !a.no_bos, false);
  const model::Config cfg = m.weights.config;
  auto fp = std::make_shared<const model::Weights>(std::move(m.weights));
  auto tf = model::make_sim_quant_transformer(fp, spec, sm.stats.get(), a.ctx);
  model::PplOptions opt{a.ctx, a.stride, a.max_tokens};
  model::PplResult r;
  {
    ProgressBar bar("ppl", 1, "tok");
    bool sized = false;
    r = model::perplexity(*tf, tokens, opt, [&](int64_t done, int64_t total) {
      if (!sized) {
        bar = ProgressBar("ppl", total, "tok");
        sized = true;
      }
      bar.update(done);
    });
  }
  const int ctx = opt.ctx > 0 ? opt.ctx : std::min(cfg.max_seq_len, 2048);
  if (a.json) {
    nlohmann::json j = {{"tokens", r.tokens},
                        {"nll_per_token", r.nll_per_token},
                        {"ppl", r.ppl},
                        {"seconds", r.seconds},
                        {"prefill_tokens_per_s", r.prefill_tokens_per_s},
                        {"prefill_tokens", r.prefill_tokens},
                        {"windows", r.windows},
                        {"ctx", ctx},
                        {"stride", opt.stride > 0 ? opt.stride : ctx}};
    j.update(sim_quant_json(spec, a.sq));
    std::printf("%s\n", j.dump().c_str());
  } else {
    Table t({"model", "quant", "format", "method", "ctx", "tokens", "nll/token", "ppl", "seconds",
             "prefill tok/s"});
    t.add_row({a.model, spec.name(),
               spec.any()
                   ? strf("%s b%d", model::tensor_format_name(spec.cfg.format), spec.cfg.block)
                   : "-",
               spec.any() ? a.sq.method : "-", std::to_string(ctx), std::to_string(r.tokens),
               strf("%.5f", r.nll_per_token), strf("%.4f", r.ppl), strf("%.2f", r.seconds),
               strf("%.0f", r.prefill_tokens_per_s)});
    t.print();
  }
  return 0;
}

}  // namespace

SS_COMMAND(
    "ppl", "Perplexity of a text under a model (optionally simulated NVFP4/MXFP4)",
    [](CLI::App& sub) -> std::function<int()> {
      auto a = std::make_shared<PplArgs>();
      sub.add_option("model", a->model, "llama2.c .bin, .gguf or HF directory")->required();
      sub.add_option("--text", a->text, "text file")->required();
      sub.add_option("--tokenizer", a->tokenizer, "tokenizer file (llama2.c tokenizer.bin)");
      sub.add_option("--ctx", a->ctx, "window length (default min(max_seq_len, 2048))")
          ->check(CLI::Range(2, 1 << 20));
      sub.add_option("--stride", a->stride, "window stride (default ctx)")
          ->check(CLI::Range(1, 1 << 20));
      sub.add_option("--max-tokens", a->max_tokens, "evaluate only the first T tokens (0 = all)")
          ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
      sub.add_flag("--no-bos", a->no_bos, "do not prepend BOS to the text");
      add_sim_quant_options(sub, a->sq);
      sub.add_option("--seed", a->seed, "calibration sampling seed");
      sub.add_flag("--json", a->json, "print one JSON object");
      return [a] { return run_ppl(*a); };
    });

}  // namespace scalesweep::tools
