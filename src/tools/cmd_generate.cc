// scalesweep generate MODEL --prompt TEXT -n N [--temperature T] [--top-p P] [--seed S]
//   [--json] [--quant W|WA|WAKV|WAKVQ --format nvfp4|mxfp4 --method M --block B
//    (--stats STATS | --calib TEXT [--calib-seed S])]
#include <algorithm>
#include <cstdio>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "scalesweep/io/load.h"
#include "scalesweep/model/generate.h"
#include "tools/command.h"
#include "tools/options.h"
#include "tools/sim_quant_cli.h"

namespace scalesweep::tools {
namespace {

struct GenArgs {
  ModelOptions model;
  std::string prompt;
  model::GenerateOptions gen;  // --steps, --temperature, --top-p, --seed (sampling)
  OutputOptions out;           // --json
  SimQuantOptions sq;          // its --calib-seed defaults to --seed
  BosOption bos;
  int repeat = 1;
};

int run_generate(const GenArgs& a) {
  model::check_generate_options(a.gen);
  pipeline::RuntimeModel sm = load_sim_quant_model(a.model, a.sq, a.sq.calib.seed_or(a.gen.seed));
  io::LoadedModel& m = sm.model;
  const model::Config cfg = m.weights.config;
  std::unique_ptr<model::Tokenizer> tok = std::move(m.tokenizer);
  auto fp = std::make_shared<const model::Weights>(std::move(m.weights));
  const bool bos = resolve_bos(a.bos, *tok);
  const std::vector<int> prompt =
      model::generation_start(tok->encode(a.prompt, bos, false), *tok, cfg);
  const int np = static_cast<int>(prompt.size());
  auto tf = pipeline::make_runtime_transformer(
      sm, fp, model::generation_context(np, a.gen.steps, cfg.max_seq_len));
  const std::function<void(const std::string&)> print = [](const std::string& s) {
    std::fputs(s.c_str(), stdout);
    std::fflush(stdout);
  };
  double best_tps = 0;
  model::GenerateResult r;
  for (int rep = 0; rep < a.repeat; ++rep) {  // the last run's text is the one shown
    const bool show = !a.out.json && rep + 1 == a.repeat;
    r = model::generate(*tf, *tok, prompt, a.gen,
                        show ? print : std::function<void(const std::string&)>{});
    best_tps = std::max(best_tps, r.decode_tokens_per_s);
  }
  if (a.out.json) {
    nlohmann::json j = {{"prompt", a.prompt},
                        {"text", r.text},
                        {"tokens", r.tokens},
                        {"n_prompt_tokens", np},
                        {"n_generated", r.tokens.size()},
                        {"prefill_seconds", r.prefill_seconds},
                        {"decode_seconds", r.decode_seconds},
                        {"decode_tokens", r.decode_tokens},
                        {"decode_tokens_per_s", r.decode_tokens_per_s},
                        {"best_decode_tokens_per_s", best_tps},
                        {"repeat", a.repeat},
                        {"bos", bos}};
    j.update(sim_quant_json(sm));
    // Generated text may end inside a UTF-8 sequence (byte tokens): invalid bytes as U+FFFD.
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    std::printf("\n");
    std::fprintf(stderr, "[%d prompt tokens, %zu generated; decode %.1f tokens/s", np,
                 r.tokens.size(), r.decode_tokens_per_s);
    if (a.repeat > 1) std::fprintf(stderr, ", best of %d runs %.1f tokens/s", a.repeat, best_tps);
    std::fprintf(stderr, "]\n");
  }
  return 0;
}

}  // namespace

SS_COMMAND("generate", "Generate text from a model (optionally simulated NVFP4/MXFP4)",
           [](CLI::App& sub) -> std::function<int()> {
             auto a = std::make_shared<GenArgs>();
             add_model_options(sub, a->model);
             sub.add_option("--prompt", a->prompt, "prompt text; empty: start at BOS");
             sub.add_option("-n,--steps", a->gen.steps, "tokens to generate")
                 ->check(CLI::Range(0, 1 << 24));
             sub.add_option("--temperature", a->gen.temperature, "0 = greedy");
             sub.add_option("--top-p", a->gen.top_p, "nucleus sampling threshold");
             sub.add_option("--seed", a->gen.seed, "sampling seed");
             sub.add_flag(
                 "--special{false}", a->gen.skip_special,
                 "print special tokens (<|im_start|>, BOS, EOS) as the vocabulary spells them, as "
                 "transformers' decode with skip_special_tokens=False; without it they print as "
                 "nothing, as transformers' pipelines and chat outputs do");
             CalibSpelling calib;
             calib.seed_fallback = "--seed";  // one --seed seeded both before --calib-seed existed
             add_sim_quant_options(sub, a->sq, calib);
             add_bos_option(sub, a->bos);
             sub.add_option("--repeat", a->repeat,
                            "run the generation R times (speed measurement: best decode tok/s)")
                 ->check(CLI::Range(1, 100000));
             add_output_options(sub, a->out, json_only());
             return [a] { return run_generate(*a); };
           });

}  // namespace scalesweep::tools
