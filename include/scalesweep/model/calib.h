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
// A mixture-of-experts layer (Config::moe_layer) has no dense gate/up/down: its kMlpIn record
// is the router's input (every token) and its kMlpOut record is empty (dim 0); each expert e
// has its own records (LayerStats::experts[e]): the gate/up input [dim] and the down input
// [moe_hidden_dim] of the tokens the router sent to e, or of every token with all_experts
// (calibrate(): llm-compressor's calibrate-all-experts and ModelOpt's practice), and the count
// of tokens the router sent to e either way.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "scalesweep/base/names.h"
#include "scalesweep/model/config.h"
#include "scalesweep/model/weights.h"

namespace scalesweep::model {

enum class LinearId { kQ, kK, kV, kO, kGate, kUp, kDown };
// HF module names first (canonical), then the short forms the CLI also accepts.
inline constexpr auto kLinearIdNames =
    make_names<LinearId>("Linear", {{LinearId::kQ, "q_proj"},
                                    {LinearId::kK, "k_proj"},
                                    {LinearId::kV, "v_proj"},
                                    {LinearId::kO, "o_proj"},
                                    {LinearId::kGate, "gate_proj"},
                                    {LinearId::kUp, "up_proj"},
                                    {LinearId::kDown, "down_proj"},
                                    {LinearId::kQ, "q"},
                                    {LinearId::kK, "k"},
                                    {LinearId::kV, "v"},
                                    {LinearId::kO, "o"},
                                    {LinearId::kGate, "gate"},
                                    {LinearId::kUp, "up"},
                                    {LinearId::kDown, "down"}});
enum class InputId { kAttnIn = 0, kAttnOut = 1, kMlpIn = 2, kMlpOut = 3 };
constexpr int kNumInputs = 4;

InputId input_of(LinearId l);
// Whether Linear `l` is a feed-forward one (gate, up, down): in a MoE layer, an expert's.
constexpr bool is_ffn_linear(LinearId l) {
  return l == LinearId::kGate || l == LinearId::kUp || l == LinearId::kDown;
}
std::string_view linear_name(LinearId l);  // "q_proj", "k_proj", ... (HF names)
std::string_view input_name(InputId i);    // "attn_in", "attn_out", "mlp_in", "mlp_out"

struct InputStats {
  int64_t dim = 0;
  int64_t tokens = 0;         // number of input rows accumulated
  float amax = 0;             // max |x| over all rows
  std::vector<double> xtx;    // [dim, dim] row-major, sum over rows of x xᵀ (float64, not
                              // normalized: GPTQ's H = 2/tokens * xtx); empty when accumulated or
                              // loaded without it (simulated quantization needs only the diagonal)
  std::vector<double> xdiag;  // [dim] sum over rows of x_j², the diagonal of xtx (always filled)
  bool has_xtx() const { return !xtx.empty(); }
  double diag(int64_t j) const { return xdiag[static_cast<size_t>(j)]; }
};

// One expert's statistics in a MoE layer.
struct ExpertStats {
  InputStats in;       // gate/up input [dim]
  InputStats mid;      // down input silu(gate x) * (up x) [moe_hidden_dim]
  int64_t routed = 0;  // tokens the router sent to this expert (in.tokens without all_experts)
  const InputStats& input(InputId i) const { return i == InputId::kMlpOut ? mid : in; }
};

struct LayerStats {
  std::array<InputStats, kNumInputs> inputs;
  std::vector<ExpertStats> experts;  // n_experts in a MoE layer, else empty
  const InputStats& input(InputId i) const { return inputs[static_cast<int>(i)]; }
  InputStats& input(InputId i) { return inputs[static_cast<int>(i)]; }
  // Attention states as they enter the scores / the KV cache (after bias, q/k norm, RoPE):
  // max |.| and per-channel sums of squares over calibration tokens.
  float q_amax = 0, k_amax = 0, v_amax = 0;
  std::vector<double> q_sqnorm;  // [n_heads*head_dim]
  std::vector<double> k_sqnorm;  // [n_kv_heads*head_dim]
  std::vector<double> v_sqnorm;  // [n_kv_heads*head_dim]
};

// Where the calibration windows lie in the tokenized text: kRandom, starts drawn uniformly by
// a splitmix64 generator seeded by `seed`; kSpread, evenly spaced from the text's start, start
// i = i * max(1, (n - body) / max(1, nsamples - 1)) (integer division; n the text's tokens,
// body the text tokens of a window), the windows llm-compressor's examples and
// bench/llmcompressor_blocks.py's calibration_ids take (with a tokenizer that adds no BOS the
// same token ids), so that a comparison with it calibrates on the same tokens. The seed is
// unused there.
enum class CalibWindows { kRandom, kSpread };
inline constexpr auto kCalibWindowNames = make_names<CalibWindows>(
    "calibration windows", {{CalibWindows::kRandom, "random"}, {CalibWindows::kSpread, "spread"}});

// How the calibration sequences are drawn from the text. A bare seed (the implicit
// conversion) means random windows.
struct CalibDraw {
  uint64_t seed = 0;
  CalibWindows windows = CalibWindows::kRandom;
  CalibDraw(uint64_t s = 0, CalibWindows w = CalibWindows::kRandom)  // NOLINT: implicit
      : seed(s), windows(w) {}
};

// How reports name a draw: "seed S" (random windows) or "spread windows".
std::string calib_draw_label(CalibDraw d);

struct CalibStats {
  int64_t nsamples = 0, seqlen = 0;
  CalibDraw draw;  // how the sequences were drawn (a statistics file's seed and windows)
  std::vector<LayerStats> layers;
};

// Hooks for calibration: called with the tensors as the forward pass computes them.
class Observer {
 public:
  virtual ~Observer() = default;
  // Input rows [rows, cols] of the Linears reading `which` in layer `layer`.
  virtual void on_input(int layer, InputId which, const float* x, int rows, int cols) = 0;
  // Query [rows, n_heads*hd], key and value [rows, n_kv_heads*hd] after bias, q/k norm and
  // RoPE, before any simulated quantization.
  virtual void on_qkv(int layer, const float* q, const float* k, const float* v, int rows) = 0;
  // MoE layers: the input rows of expert `expert`'s gate/up (which = kMlpIn, [rows, dim]) or
  // down (kMlpOut, [rows, moe_hidden_dim]), and the router's choice for `rows` tokens
  // (chosen [rows, k] expert indices). The router's input arrives through on_input(kMlpIn).
  // Observers that do not look at experts ignore them.
  virtual void on_expert_input(int /*layer*/, int /*expert*/, InputId /*which*/, const float* /*x*/,
                               int /*rows*/, int /*cols*/) {}
  virtual void on_routes(int /*layer*/, const int* /*chosen*/, int /*rows*/, int /*k*/) {}
};

// Accumulates the statistics of ONE layer from the Observer hooks (the layer index passed to
// the hooks is ignored): amax over floats, tokens, ΣxxT as a float64 copy of the rows through
// dsyrk into the upper triangle (mirrored by finish()), q/k/v sums of squares and amax. With
// need_xtx = false only amax, tokens, the diagonal (sum of squares per column) and q/k/v are
// kept; `xtx_inputs` chooses per input (a MoE layer's experts: their kMlpIn and kMlpOut), so
// that an input whose Linears all stay dense costs no ΣxxT. The one accumulation used by
// calibrate(), calibrate_layers() and streamed GPTQ.
class LayerAccumulator : public Observer {
 public:
  // Resets *out to the shapes of layer `layer` of `c` (zeros; a MoE layer's experts included);
  // xtx is allocated for the inputs that keep it.
  LayerAccumulator(const Config& c, int layer, LayerStats* out,
                   const std::array<bool, kNumInputs>& xtx_inputs);
  LayerAccumulator(const Config& c, int layer, LayerStats* out, bool need_xtx = true)
      : LayerAccumulator(c, layer, out, {need_xtx, need_xtx, need_xtx, need_xtx}) {}
  void on_input(int layer, InputId which, const float* x, int rows, int cols) override;
  void on_qkv(int layer, const float* q, const float* k, const float* v, int rows) override;
  void on_expert_input(int layer, int expert, InputId which, const float* x, int rows,
                       int cols) override;
  void on_routes(int layer, const int* chosen, int rows, int k) override;
  // Mirrors the upper triangle and fills xdiag; call once, after the last row.
  void finish();
  double seconds() const { return seconds_; }  // spent in on_input/on_qkv/finish

 private:
  LayerStats* s_;
  int layer_;  // the layer being accumulated (messages name it; the hooks' index is ignored)
  double seconds_ = 0;
  std::vector<double> xd_;
  void accumulate(const std::string& what, InputStats& s, const float* x, int rows, int cols);
};

// Width of the input `i` of a dense layer of `c` (dim, n_heads*head_dim or hidden_dim).
int64_t input_dim(const Config& c, InputId i);
// Width of the input `i` of layer `layer`: input_dim(c, i), except kMlpOut of a MoE layer: 0.
int64_t input_dim(const Config& c, InputId i, int layer);

// Samples `nsamples` sequences of `seqlen` tokens: sequence i is BOS followed by
// tokens[start_i, start_i + seqlen - 1) (bos_token < 0, a tokenizer that adds no BOS:
// tokens[start_i, start_i + seqlen)), start_i placed by `draw` (CalibWindows: random starts
// drawn with a splitmix64 generator seeded by draw.seed, the same on every platform, or
// evenly spread). Runs the FP
// model over each and accumulates the statistics above. `progress(done, nsamples)` is called
// after each sequence. Throws std::invalid_argument when the text is too short. all_experts:
// MoE layers also run every token through every expert for the experts' statistics (the
// forward's output stays the routed one).
// The whole model per sequence (Transformer::forward_hidden): the reference of
// calibrate_layers(); all layers' statistics in memory. need_xtx = false: without ΣxxT.
CalibStats calibrate(const Weights& w, const std::vector<int>& tokens, int64_t nsamples,
                     int64_t seqlen, CalibDraw draw, int bos_token,
                     const std::function<void(int64_t, int64_t)>& progress = {},
                     bool need_xtx = true, bool all_experts = false);

// Layer-by-layer calibration (the same sequences and the same values as calibrate()): the
// hidden states of all samples, nsamples * seqlen * dim floats, stay in memory and go through
// one decoder layer at a time (Transformer::forward_layer); after layer l, `sink(l, stats)`
// receives its statistics, which are freed when it returns. Peak memory: the weights + the
// hidden states + one layer's statistics. `progress(done, n_layers * nsamples)` after each
// sequence of each layer.
void calibrate_layers(const Weights& w, const std::vector<int>& tokens, int64_t nsamples,
                      int64_t seqlen, CalibDraw draw, int bos_token, bool need_xtx,
                      const std::function<void(int, LayerStats&)>& sink,
                      const std::function<void(int64_t, int64_t)>& progress = {},
                      bool all_experts = false);

class Transformer;  // model/transformer.h

// The calibration samples stepped through a model one decoder layer at a time: their hidden
// states [nsamples, len, dim] stay in memory and each layer runs on all of them in place, on a
// one-layer runtime that takes the role of layer l (a MoE layer exactly when layer l of the
// model is one). The one layer-stepping forward of calibrate_layers() and of streamed
// quantization (pipeline/quantize_stream.cc), where the layers come from a file one at a time.
class LayerStepper {
 public:
  // `seqs`: the token ids [nsamples * len] (calibration_sequences), checked against the
  // vocabulary (std::out_of_range naming the index). all_experts: MoE layers also run every
  // token through every expert for the statistics (Transformer::set_calib_all_experts).
  LayerStepper(const Config& c, std::vector<int> seqs, int64_t nsamples, int64_t len,
               bool all_experts);
  ~LayerStepper();
  LayerStepper(const LayerStepper&) = delete;
  LayerStepper& operator=(const LayerStepper&) = delete;
  // The hidden states entering layer 0: rows of the token embeddings.
  void embed(const Tensor& tok_embeddings);
  // Runs every sample through `lw`, the weights of layer l; keep_input: the hidden states stay
  // as they were (the statistics only). `done(s)` after sample s.
  void run(int l, const LayerWeights& lw, bool keep_input,
           const std::function<void(int64_t)>& done = {});
  // run() with the statistics of layer l into *out (LayerAccumulator with `xtx_inputs`).
  // Returns the seconds spent accumulating (LayerAccumulator::seconds).
  double observe(int l, const LayerWeights& lw, LayerStats* out,
                 const std::array<bool, kNumInputs>& xtx_inputs, bool keep_input,
                 const std::function<void(int64_t)>& done = {});
  // Frees the hidden states.
  void clear();
  int64_t nsamples() const { return nsamples_; }
  int64_t len() const { return len_; }

 private:
  void as_layer(int l);
  Config c_;
  std::vector<int> seqs_;
  int64_t nsamples_, len_, dim_;
  std::vector<float> x_, tmp_;
  std::shared_ptr<Weights> skel_;  // the one-layer runtime's config
  std::unique_ptr<Transformer> tf_;
};

// The token sequences calibrate() runs, flattened [nsamples * seqlen] (same sampling, same
// checks and messages; `max_seq_len` is the model's). Used by layer-by-layer streaming,
// which runs the samples through one decoder layer at a time.
// Spread windows need nsamples distinct starts: a text of fewer than body + nsamples - 1
// tokens is refused.
std::vector<int> calibration_sequences(const std::vector<int>& tokens, int64_t nsamples,
                                       int64_t seqlen, CalibDraw draw, int bos_token,
                                       int max_seq_len);

// Refuses, before any work (OptionError "calib_nsamples" from base/memory.h check_fits), a
// calibration whose working set beside the weights exceeds the memory available: the hidden
// states of every sample (`layer_by_layer`; else one sample's), the statistics of
// `layers_held` layers (float64 ΣxxT of each input when need_xtx), a runtime of `seqlen`
// rows (one layer's KV cache layer by layer, every layer's otherwise) and `extra` bytes (the
// layer being quantized while streaming: its fp32 weights and GPTQ's work arrays).
void check_calibration_memory(const Config& c, int64_t nsamples, int64_t seqlen, bool need_xtx,
                              bool layer_by_layer, int layers_held, int64_t extra = 0);

// Checks that `s` matches the model's shapes (layers, dims, the diagonal, a MoE layer's
// experts; ΣxxT where present, it may be absent); throws std::invalid_argument naming the
// first mismatch.
void check_calib_stats(const CalibStats& s, const Config& c);

}  // namespace scalesweep::model
