// Text generation from a prompt: batched prefill of the prompt, then greedy (temperature 0) or
// temperature + nucleus (top-p) sampling one token at a time (layer `model`).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "scalesweep/model/tokenizer.h"
#include "scalesweep/model/transformer.h"

namespace scalesweep::model {

struct GenerateOptions {
  int steps = 256;           // tokens to generate at most (BOS/EOS ends earlier)
  float temperature = 1.0f;  // 0: greedy
  float top_p = 0.9f;        // nucleus threshold in (0, 1]
  uint64_t seed = 0;         // sampling seed (std::mt19937_64)
  bool skip_special = true;  // special tokens of the echoed prompt and the output print as ""
};

// Throws std::invalid_argument for a temperature that is not finite and >= 0 or a top-p
// outside (0, 1].
void check_generate_options(const GenerateOptions& opt);

// The tokens generation starts from: `prompt` as encoded, or, when it is empty, the BOS token
// (the tokenizer's, else cfg.bos_token_id). Throws std::invalid_argument when it is empty and
// there is no BOS, and when it does not fit cfg.max_seq_len.
std::vector<int> generation_start(std::vector<int> prompt, const Tokenizer& tok, const Config& cfg);

// Positions a run of `steps` tokens after `n_prompt` prompt tokens uses: the Transformer's
// context (min(max_seq_len, n_prompt + steps)).
int generation_context(int n_prompt, int steps, int max_seq_len);

struct GenerateResult {
  std::string text;         // the decoded prompt (after its first token) + the generated text
  std::vector<int> tokens;  // generated token ids
  double prefill_seconds = 0, decode_seconds = 0;
  int decode_tokens = 0;  // single-token forward passes
  double decode_tokens_per_s = 0;
};

// Runs `tf` (a fresh sequence: positions from 0, context generation_context(...)) on `prompt`
// (generation_start's) and generates up to opt.steps tokens, stopping at BOS/EOS or at the end
// of the context. `on_text` (optional) receives the decoded prompt, then each generated piece,
// as they are produced.
GenerateResult generate(Transformer& tf, const Tokenizer& tok, const std::vector<int>& prompt,
                        const GenerateOptions& opt,
                        const std::function<void(const std::string&)>& on_text = {});

}  // namespace scalesweep::model
