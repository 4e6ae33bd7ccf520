// Perplexity of a token stream with a sliding window (layer `model`).
//
// The stream (usually BOS + the whole text) is cut into windows of `ctx` tokens starting
// every `stride` tokens; each window is a fresh sequence (empty KV cache, positions from 0)
// run in one batched prefill. A token counts once: in the first window that predicts it
// (tokens at positions already scored by the previous window are context only), as in the
// Hugging Face sliding-window perplexity recipe. Token 0 of the stream is never predicted.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "scalesweep/model/transformer.h"

namespace scalesweep::model {

struct PplOptions {
  int ctx = 0;             // window length; 0 = min(max_seq_len, 2048)
  int stride = 0;          // 0 = ctx (non-overlapping windows)
  int64_t max_tokens = 0;  // 0 = all; else only the first max_tokens tokens of the stream
};

struct PplResult {
  int64_t tokens = 0;  // predicted (scored) tokens
  double nll_sum = 0;  // nats
  double nll_per_token = 0;
  double ppl = 0;  // exp(nll_per_token)
  double seconds = 0;
  int64_t prefill_tokens = 0;  // tokens run through the model (windows overlap with stride)
  double prefill_tokens_per_s = 0;
  int windows = 0;
};

// Tokens perplexity() will prefill for a stream of `n_stream` tokens (the total its progress
// reaches); throws the same std::invalid_argument as perplexity() for bad options.
int64_t ppl_prefill_tokens(int64_t n_stream, const PplOptions& opt, int max_seq_len);

// The window checks of perplexity that need only the model's max_seq_len (ctx at least 2 and
// at most max_seq_len, stride at most ctx): std::invalid_argument. Run by perplexity itself and,
// before any weight is read, by the pipelines that know the config first.
void check_ppl_window(const PplOptions& opt, int max_seq_len);

// `progress(prefilled, total_to_prefill)` after each window: tokens run through the model so
// far, the count PplResult::prefill_tokens ends with (its rate is prefill_tokens_per_s).
PplResult perplexity(Transformer& tf, const std::vector<int>& tokens, const PplOptions& opt,
                     const std::function<void(int64_t, int64_t)>& progress = {});

}  // namespace scalesweep::model
