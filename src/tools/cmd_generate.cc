// scalesweep generate MODEL --prompt TEXT -n N [--temperature T] [--top-p P] [--seed S]
//   [--json] [--quant W|WA|WAKV|WAKVQ --format nvfp4|mxfp4 --method M --block B
//    (--stats STATS | --calib TEXT)]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "scalesweep/io/load.h"
#include "scalesweep/model/simquant.h"
#include "tools/command.h"
#include "tools/sim_quant_cli.h"
#include "tools/ui.h"

namespace scalesweep::tools {
namespace {

struct GenArgs {
  std::string model, tokenizer, prompt;
  int steps = 256;
  float temperature = 1.0f, top_p = 0.9f;
  uint64_t seed = 0;
  bool json = false;
  SimQuantArgs sq;
  BosArg bos;
  int repeat = 1;
};

int argmax(const float* x, int n) { return static_cast<int>(std::max_element(x, x + n) - x); }

// Temperature + nucleus (top-p) sampling.
int sample(const float* logits, int n, float temperature, float top_p, std::mt19937_64& rng,
           std::vector<std::pair<float, int>>& buf) {
  const float mx = *std::max_element(logits, logits + n);
  buf.resize(n);
  double sum = 0;
  for (int i = 0; i < n; ++i) {
    const float p = std::exp((logits[i] - mx) / temperature);
    buf[i] = {p, i};
    sum += p;
  }
  std::sort(buf.begin(), buf.end(), [](auto& a, auto& b) { return a.first > b.first; });
  double cum = 0;
  int last = n - 1;
  for (int i = 0; i < n; ++i) {
    cum += buf[i].first / sum;
    if (top_p < 1.0f && cum > top_p) {
      last = i;
      break;
    }
  }
  double mass = 0;
  for (int i = 0; i <= last; ++i) mass += buf[i].first;
  const double r = std::uniform_real_distribution<double>(0.0, mass)(rng);
  double acc = 0;
  for (int i = 0; i <= last; ++i) {
    acc += buf[i].first;
    if (r < acc) return buf[i].second;
  }
  return buf[last].second;
}

int run_generate(const GenArgs& a) {
  if (!(a.temperature >= 0.0f) || !std::isfinite(a.temperature))
    throw std::invalid_argument("--temperature must be a finite value >= 0");
  if (!(a.top_p > 0.0f && a.top_p <= 1.0f))
    throw std::invalid_argument("--top-p must be in (0, 1]");
  SimQuantModel sm = load_sim_quant_model(a.model, a.tokenizer, a.sq, a.seed);
  io::LoadedModel& m = sm.model;
  const model::Config cfg = m.weights.config;
  std::unique_ptr<model::Tokenizer> tok = std::move(m.tokenizer);
  auto fp = std::make_shared<const model::Weights>(std::move(m.weights));
  const bool bos = resolve_bos(a.bos, *tok);
  std::vector<int> prompt = tok->encode(a.prompt, bos, false);
  if (prompt.empty()) {  // nothing to condition on: start at BOS whatever the policy
    const int start = tok->bos() >= 0 ? tok->bos() : cfg.bos_token_id;
    if (start < 0 || start >= cfg.vocab_size)
      throw std::invalid_argument("empty prompt and no BOS token to start from; give --prompt");
    prompt.push_back(start);
  }
  if (static_cast<int>(prompt.size()) >= cfg.max_seq_len)
    throw std::invalid_argument("prompt of " + std::to_string(prompt.size()) +
                                " tokens does not fit the model's max_seq_len " +
                                std::to_string(cfg.max_seq_len));
  const int total = std::min<int>(cfg.max_seq_len, static_cast<int>(prompt.size()) + a.steps);
  auto tf = make_run_transformer(sm, fp, total);

  double best_tps = 0;
  for (int rep = 0; rep < a.repeat; ++rep) {
    const bool last_rep = rep + 1 == a.repeat;
    std::mt19937_64 rng(a.seed);
    std::vector<std::pair<float, int>> buf;
    std::vector<float> logits(static_cast<size_t>(cfg.vocab_size));
    using clk = std::chrono::steady_clock;
    // Prefill the prompt in one batch; its last row gives the first prediction.
    const auto t0 = clk::now();
    const int np = static_cast<int>(prompt.size());
    const float* hidden = tf->forward_hidden(prompt.data(), np, 0);  // a fresh sequence
    tf->logits(hidden + static_cast<size_t>(np - 1) * cfg.dim, 1, logits.data());
    const auto t1 = clk::now();
    std::string text;
    for (int i = 1; i < np; ++i) text += tok->decode_token(prompt[i - 1], prompt[i]);
    if (!a.json && last_rep) {
      std::fputs(text.c_str(), stdout);
      std::fflush(stdout);
    }
    std::vector<int> generated;
    int prev = prompt.back();
    int pos = np;
    const float* lg = logits.data();
    while (static_cast<int>(generated.size()) < a.steps && pos <= total) {
      const int next = a.temperature == 0.0f
                           ? argmax(lg, cfg.vocab_size)
                           : sample(lg, cfg.vocab_size, a.temperature, a.top_p, rng, buf);
      if (next == tok->bos() || next == tok->eos()) break;
      generated.push_back(next);
      const std::string piece = tok->decode_token(prev, next);
      text += piece;
      if (!a.json && last_rep) {
        std::fputs(piece.c_str(), stdout);
        std::fflush(stdout);
      }
      prev = next;
      if (pos >= total) break;
      lg = tf->decode(next, pos++);
    }
    const auto t2 = clk::now();
    const double prefill_s = std::chrono::duration<double>(t1 - t0).count();
    const double decode_s = std::chrono::duration<double>(t2 - t1).count();
    const int n_decoded = pos - np;  // forward passes of single tokens
    const double tps = decode_s > 0 ? n_decoded / decode_s : 0;
    best_tps = std::max(best_tps, tps);
    if (!last_rep) continue;
    if (a.json) {
      nlohmann::json j = {{"prompt", a.prompt},
                          {"text", text},
                          {"tokens", generated},
                          {"n_prompt_tokens", np},
                          {"n_generated", generated.size()},
                          {"prefill_seconds", prefill_s},
                          {"decode_seconds", decode_s},
                          {"decode_tokens", n_decoded},
                          {"decode_tokens_per_s", tps},
                          {"best_decode_tokens_per_s", best_tps},
                          {"repeat", a.repeat},
                          {"bos", bos}};
      j.update(sim_quant_json(sm, a.sq));
      // Generated text may end inside a UTF-8 sequence (byte tokens): invalid bytes as U+FFFD.
      std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    } else {
      std::printf("\n");
      std::fprintf(stderr, "[%d prompt tokens, %zu generated; decode %.1f tokens/s", np,
                   generated.size(), tps);
      if (a.repeat > 1) std::fprintf(stderr, ", best of %d runs %.1f tokens/s", a.repeat, best_tps);
      std::fprintf(stderr, "]\n");
    }
  }
  return 0;
}

}  // namespace

SS_COMMAND(
    "generate", "Generate text from a model (optionally simulated NVFP4/MXFP4)",
    [](CLI::App& sub) -> std::function<int()> {
      auto a = std::make_shared<GenArgs>();
      sub.add_option("model", a->model, "llama2.c .bin, .gguf or HF directory")->required();
      sub.add_option("--prompt", a->prompt, "prompt text (default: empty, start at BOS)");
      sub.add_option("-n,--steps", a->steps, "tokens to generate")->check(CLI::Range(0, 1 << 24));
      sub.add_option("--temperature", a->temperature, "0 = greedy");
      sub.add_option("--top-p", a->top_p, "nucleus sampling threshold");
      sub.add_option("--seed", a->seed, "sampling and calibration seed");
      sub.add_option("--tokenizer", a->tokenizer, "tokenizer file (llama2.c tokenizer.bin)");
      add_sim_quant_options(sub, a->sq);
      add_bos_option(sub, a->bos);
      sub.add_option("--repeat", a->repeat,
                     "run the generation R times (speed measurement: best decode tok/s)")
          ->check(CLI::Range(1, 100000));
      sub.add_flag("--json", a->json, "print one JSON object");
      return [a] { return run_generate(*a); };
    });

}  // namespace scalesweep::tools
