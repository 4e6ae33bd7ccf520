// Calibration statistics of a model (layer `model`), in memory. Produced by
// model::calibrate() and consumed by simulated activation/KV/Q quantization (global scales,
// importance) and by GPTQ (Hessians). Saved/loaded by io::save_calib_stats/load_calib_stats.
//
// Every Linear reads one of four inputs per layer; Linears that read the same input share
// one statistics record (q/k/v read the attention input, gate/up the MLP input):
//   kAttnIn  : attn_norm(x)        -> wq, wk, wv      [dim]
//   kAttnOut : attention output    -> wo              [n_heads*head_dim]
//   kMlpIn   : ffn_norm(x)         -> w1 (gate), w3 (up)   [dim]
//   kMlpOut  : silu(w1 x) * (w3 x) -> w2 (down)       [hidden_dim]
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string_view>
#include <vector>

#include "scalesweep/model/config.h"

namespace scalesweep::model {

enum class LinearId { kQ, kK, kV, kO, kGate, kUp, kDown };
enum class InputId { kAttnIn = 0, kAttnOut = 1, kMlpIn = 2, kMlpOut = 3 };
constexpr int kNumInputs = 4;

InputId input_of(LinearId l);
std::string_view linear_name(LinearId l);  // "q_proj", "k_proj", ... (HF names)
std::string_view input_name(InputId i);    // "attn_in", "attn_out", "mlp_in", "mlp_out"

struct InputStats {
  int64_t dim = 0;
  int64_t tokens = 0;       // number of input rows accumulated
  float amax = 0;           // max |x| over all rows
  std::vector<double> xtx;  // [dim, dim] row-major, sum over rows of x xᵀ (float64, not
                            // normalized: GPTQ's H = 2/tokens * xtx)
  double diag(int64_t j) const { return xtx[static_cast<size_t>(j * dim + j)]; }
};

struct LayerStats {
  std::array<InputStats, kNumInputs> inputs;
  const InputStats& input(InputId i) const { return inputs[static_cast<int>(i)]; }
  InputStats& input(InputId i) { return inputs[static_cast<int>(i)]; }
  // Attention states as they enter the scores / the KV cache (after bias, q/k norm, RoPE):
  // max |.| and per-channel sums of squares over calibration tokens.
  float q_amax = 0, k_amax = 0, v_amax = 0;
  std::vector<double> q_sqnorm;  // [n_heads*head_dim]
  std::vector<double> k_sqnorm;  // [n_kv_heads*head_dim]
  std::vector<double> v_sqnorm;  // [n_kv_heads*head_dim]
};

struct CalibStats {
  int64_t nsamples = 0, seqlen = 0;
  uint64_t seed = 0;
  std::vector<LayerStats> layers;
};

// Samples `nsamples` sequences of `seqlen` tokens: sequence i is BOS followed by
// tokens[start_i, start_i + seqlen - 1) (bos_token < 0, a tokenizer that adds no BOS:
// tokens[start_i, start_i + seqlen)), start_i drawn uniformly from the valid starts with a
// splitmix64 generator seeded by `seed` (the same starts on every platform). Runs the FP
// model over each and accumulates the statistics above. `progress(done, nsamples)` is called
// after each sequence. Throws std::invalid_argument when the text is too short.
CalibStats calibrate(const Weights& w, const std::vector<int>& tokens, int64_t nsamples,
                     int64_t seqlen, uint64_t seed, int bos_token,
                     const std::function<void(int64_t, int64_t)>& progress = {});

// The token sequences calibrate() runs, flattened [nsamples * seqlen] (same sampling, same
// checks and messages; `max_seq_len` is the model's). Used by layer-by-layer streaming,
// which runs the samples through one decoder layer at a time.
std::vector<int> calibration_sequences(const std::vector<int>& tokens, int64_t nsamples,
                                       int64_t seqlen, uint64_t seed, int bos_token,
                                       int max_seq_len);

// Checks that `s` matches the model's shapes (layers, dims); throws std::invalid_argument
// naming the first mismatch.
void check_calib_stats(const CalibStats& s, const Config& c);

}  // namespace scalesweep::model
