// The engine behind task evaluation (layer `model`): loglikelihoods of continuations given
// contexts, and greedy generation until stop strings, over many documents on worker threads.
//
// Each document is a group of requests. Per worker, one Transformer (its own KV cache) runs:
//   prefix      the tokens every request of the call starts with (a few-shot preamble), once
//   context     the rest of a document's context, once per distinct context of the document
//   each continuation but its last token, from that context's KV cache
// so a context shared by four choices is computed once. What each request computes depends
// only on its document and the call's prefix: results are the same for every thread count.
//
// log P(cont | ctx) = Σ_i log softmax(logits at ctx_len-1+i)[cont_i]; `greedy` when every
// continuation token is the argmax of its row (the first maximum on ties), as lm-eval.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "scalesweep/model/tokenizer.h"
#include "scalesweep/model/transformer.h"

namespace scalesweep::model {

struct LoglikelihoodRequest {
  std::vector<int> context;       // non-empty
  std::vector<int> continuation;  // non-empty
};

struct LoglikelihoodResult {
  double logprob = 0;   // nats, summed over the continuation tokens
  bool greedy = false;  // every continuation token is its row's argmax
  int tokens = 0;       // continuation tokens scored
};

struct GenerationRequest {
  std::vector<int> context;        // non-empty
  std::vector<std::string> until;  // stop strings (the text ends before the first one found)
  int max_tokens = 256;            // generated tokens at most
};

struct GenerationResult {
  std::string text;      // the generated text, cut before the first stop string
  int tokens = 0;        // tokens generated (decode steps)
  bool stopped = false;  // ended by a stop string or the EOS token (not by max_tokens)
};

// One Transformer per worker, all on the same weights (pipeline::make_runtime_transformer);
// `cfg` below is their config.
using TransformerFactory = std::function<std::unique_ptr<Transformer>()>;

struct ScoringOptions {
  int threads = 0;  // workers; 0: all cores
  // Requests longer than this are cut from the left as lm-eval does ((ctx + cont)[-(L+1):]
  // scores the same continuation on fewer context tokens); 0: the model's max_seq_len.
  int max_length = 0;
};

// Checks every request (non-empty context and continuation, ids inside the vocabulary) and
// throws std::invalid_argument naming the document and request index otherwise.
// `progress(done, total)` counts documents, from the worker that finished one.
std::vector<std::vector<LoglikelihoodResult>> score_loglikelihood(
    const TransformerFactory& make, const Config& cfg,
    const std::vector<std::vector<LoglikelihoodRequest>>& docs, const ScoringOptions& opt,
    const std::function<void(int64_t, int64_t)>& progress = {});

// Greedy generation of every request, one per document. The context is cut from the left to
// max_length - max_tokens tokens (lm-eval's rule); generation stops at the tokenizer's EOS,
// at a stop string (checked on the decoded text after each token) or after max_tokens.
std::vector<GenerationResult> generate_until(
    const TransformerFactory& make, const Config& cfg, const Tokenizer& tok,
    const std::vector<GenerationRequest>& requests, const ScoringOptions& opt,
    const std::function<void(int64_t, int64_t)>& progress = {});

// The text before the first occurrence of any of `until` (empty strings ignored), and whether
// one was found.
std::pair<std::string, bool> cut_at_stop(const std::string& text,
                                         const std::vector<std::string>& until);

}  // namespace scalesweep::model
