#include "scalesweep/model/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
#include <stdexcept>
#include <utility>

#include "scalesweep/base/option_error.h"

namespace scalesweep::model {
namespace {

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

}  // namespace

void check_generate_options(const GenerateOptions& opt) {
  if (!(opt.temperature >= 0.0f) || !std::isfinite(opt.temperature))
    throw OptionError("temperature", "must be a finite value >= 0");
  if (!(opt.top_p > 0.0f && opt.top_p <= 1.0f)) throw OptionError("top_p", "must be in (0, 1]");
}

std::vector<int> generation_start(std::vector<int> prompt, const Tokenizer& tok,
                                  const Config& cfg) {
  if (prompt.empty()) {  // nothing to condition on: start at BOS whatever the policy
    const int start = tok.bos() >= 0 ? tok.bos() : cfg.bos_token_id;
    if (start < 0 || start >= cfg.vocab_size)
      throw std::invalid_argument("empty prompt and no BOS token to start from; give " +
                                  option_ref("prompt"));
    prompt.push_back(start);
  }
  if (static_cast<int>(prompt.size()) >= cfg.max_seq_len)
    throw std::invalid_argument("prompt of " + std::to_string(prompt.size()) +
                                " tokens does not fit the model's max_seq_len " +
                                std::to_string(cfg.max_seq_len));
  return prompt;
}

int generation_context(int n_prompt, int steps, int max_seq_len) {
  return static_cast<int>(std::min<int64_t>(max_seq_len, static_cast<int64_t>(n_prompt) + steps));
}

GenerateResult generate(Transformer& tf, const Tokenizer& tok, const std::vector<int>& prompt,
                        const GenerateOptions& opt,
                        const std::function<void(const std::string&)>& on_text) {
  check_generate_options(opt);
  const Config& cfg = tf.config();
  const int np = static_cast<int>(prompt.size());
  if (np == 0) throw std::invalid_argument("generate: empty prompt (see generation_start)");
  const int total = generation_context(np, opt.steps, cfg.max_seq_len);
  GenerateResult r;
  std::mt19937_64 rng(opt.seed);
  std::vector<std::pair<float, int>> buf;
  std::vector<float> logits(static_cast<size_t>(cfg.vocab_size));
  using clk = std::chrono::steady_clock;
  // Prefill the prompt in one batch; its last row gives the first prediction.
  const auto t0 = clk::now();
  const float* hidden = tf.forward_hidden(prompt.data(), np, 0);  // a fresh sequence
  tf.logits(hidden + static_cast<size_t>(np - 1) * cfg.dim, 1, logits.data());
  const auto t1 = clk::now();
  // The whole prompt (its special tokens, BOS included, as "" unless !skip_special).
  r.text = tok.decode(prompt, opt.skip_special);
  if (on_text) on_text(r.text);
  int prev = prompt.back();
  int pos = np;
  const float* lg = logits.data();
  while (static_cast<int>(r.tokens.size()) < opt.steps && pos <= total) {
    const int next = opt.temperature == 0.0f
                         ? argmax(lg, cfg.vocab_size)
                         : sample(lg, cfg.vocab_size, opt.temperature, opt.top_p, rng, buf);
    if (next == tok.bos() || next == tok.eos()) break;
    r.tokens.push_back(next);
    const std::string piece = tok.piece(prev, next, opt.skip_special);
    r.text += piece;
    if (on_text) on_text(piece);
    prev = next;
    if (pos >= total) break;
    lg = tf.decode(next, pos++);
  }
  const auto t2 = clk::now();
  r.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
  r.decode_seconds = std::chrono::duration<double>(t2 - t1).count();
  r.decode_tokens = pos - np;
  r.decode_tokens_per_s = r.decode_seconds > 0 ? r.decode_tokens / r.decode_seconds : 0;
  return r;
}

}  // namespace scalesweep::model
