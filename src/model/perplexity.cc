// Sliding-window perplexity (include/scalesweep/model/perplexity.h).
#include "scalesweep/model/perplexity.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>
#include <string>

#include "scalesweep/base/memory.h"

namespace scalesweep::model {

void check_ppl_window(const PplOptions& opt, int max_seq_len) {
  const int ctx = opt.ctx > 0 ? opt.ctx : std::min(max_seq_len, 2048);
  if (ctx < 2) throw std::invalid_argument("ppl: ctx must be at least 2");
  if (ctx > max_seq_len)
    throw std::invalid_argument("ppl: ctx " + std::to_string(ctx) +
                                " exceeds the model's max_seq_len " + std::to_string(max_seq_len));
  const int stride = opt.stride > 0 ? opt.stride : ctx;
  if (stride > ctx)
    throw std::invalid_argument("ppl: stride " + std::to_string(stride) + " exceeds ctx " +
                                std::to_string(ctx) + " (tokens would be skipped)");
}

namespace {

struct Plan {
  int ctx, stride;
  int64_t n, prefill;
};

Plan plan(int64_t n_stream, const PplOptions& opt, int max_seq_len) {
  check_ppl_window(opt, max_seq_len);
  Plan p;
  p.ctx = opt.ctx > 0 ? opt.ctx : std::min(max_seq_len, 2048);
  p.stride = opt.stride > 0 ? opt.stride : p.ctx;
  p.n = n_stream;
  if (opt.max_tokens > 0) p.n = std::min(p.n, opt.max_tokens);
  if (p.n < 2) throw std::invalid_argument("ppl: the text has fewer than 2 tokens");
  p.prefill = 0;  // tokens the windows will prefill (progress counts these)
  for (int64_t b = 0;; b += p.stride) {
    const int64_t e = std::min(b + p.ctx, p.n);
    p.prefill += e - b;
    if (e >= p.n) break;
  }
  return p;
}

}  // namespace

int64_t ppl_prefill_tokens(int64_t n_stream, const PplOptions& opt, int max_seq_len) {
  return plan(n_stream, opt, max_seq_len).prefill;
}

PplResult perplexity(Transformer& tf, const std::vector<int>& all_tokens, const PplOptions& opt,
                     const std::function<void(int64_t, int64_t)>& progress) {
  const Config& c = tf.config();
  const Plan pl = plan(static_cast<int64_t>(all_tokens.size()), opt, c.max_seq_len);
  const int ctx = pl.ctx, stride = pl.stride;
  const int64_t N = pl.n, total = pl.prefill;
  const int V = c.vocab_size;
  constexpr int kChunk = 64;  // rows of logits at a time (large vocabularies)
  {
    const int64_t run = runtime_working_bytes(c, ctx, ctx), lg = int64_t{kChunk} * V * 4;
    check_fits("ctx", "perplexity with a context of " + std::to_string(ctx) + " tokens", run + lg,
               "KV cache and activations " + format_bytes(run) + ", logits " + format_bytes(lg),
               "the KV cache and activations");
  }
  PplResult r;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<float> logits(static_cast<size_t>(kChunk) * V);
  int64_t scored_to = 1;  // next position to score
  for (int64_t b = 0;; b += stride) {
    const int64_t e = std::min(b + ctx, N);
    const int n = static_cast<int>(e - b);
    const float* hidden = tf.forward_hidden(all_tokens.data() + b, n, 0);
    r.prefill_tokens += n;
    ++r.windows;
    // Row i predicts position b + i + 1.
    const int first = static_cast<int>(std::max<int64_t>(scored_to, b + 1) - b - 1);
    for (int i0 = first; i0 < n - 1; i0 += kChunk) {
      const int rows = std::min(kChunk, n - 1 - i0);
      tf.logits(hidden + static_cast<size_t>(i0) * c.dim, rows, logits.data());
      for (int i = 0; i < rows; ++i) {
        const float* lg = logits.data() + static_cast<size_t>(i) * V;
        float mx = lg[0];
        for (int j = 1; j < V; ++j) mx = std::max(mx, lg[j]);
        double sum = 0;
        for (int j = 0; j < V; ++j) sum += std::exp(static_cast<double>(lg[j]) - mx);
        const int target = all_tokens[static_cast<size_t>(b + i0 + i + 1)];
        const double nll = std::log(sum) + mx - lg[target];
        if (!std::isfinite(nll))
          throw std::runtime_error("ppl: non-finite loss at token " +
                                   std::to_string(b + i0 + i + 1));
        r.nll_sum += nll;
        ++r.tokens;
      }
    }
    scored_to = e;
    if (progress) progress(r.prefill_tokens, total);
    if (e >= N) break;
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.nll_per_token = r.nll_sum / static_cast<double>(r.tokens);
  r.ppl = std::exp(r.nll_per_token);
  r.prefill_tokens_per_s = r.seconds > 0 ? static_cast<double>(r.prefill_tokens) / r.seconds : 0;
  return r;
}

}  // namespace scalesweep::model
