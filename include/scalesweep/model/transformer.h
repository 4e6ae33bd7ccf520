// Llama-family CPU runtime (Llama 2/3, Qwen2 with q/k/v biases, Qwen3 with q/k RMSNorm, and
// the mixture-of-experts Qwen3-MoE and Mixtral): batched prefill with BLAS sgemm and
// single-token decode with a KV cache, optionally with simulated NVFP4 (quantize-dequantize) on
// Linear inputs (the experts' too, with a W4A4 checkpoint's scales), keys/values and queries.
//
//   x = embed(tokens)
//   for each layer:
//     h = rmsnorm(x) ; q,k,v = h Wqᵀ(+b), h Wkᵀ(+b), h Wvᵀ(+b) ; [qk_norm] ; RoPE(q, k)
//     k, v -> KV cache ; o = softmax(q kᵀ / sqrt(hd), causal) v ; x += o Woᵀ
//     h = rmsnorm(x) ; x += (silu(h W1ᵀ) * h W3ᵀ) W2ᵀ                 dense layer
//                      x += Σ_{e in topk(softmax(h Rᵀ))} p_e (silu(h W1_eᵀ) * h W3_eᵀ) W2_eᵀ
//                                                                   MoE layer (model/moe.h)
//   logits = rmsnorm(x) lm_headᵀ
#pragma once

#include <array>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "scalesweep/base/names.h"
#include "scalesweep/base/parallel.h"
#include "scalesweep/model/calib.h"
#include "scalesweep/model/config.h"
#include "scalesweep/model/weights.h"
#include "scalesweep/quant/quantize.h"

namespace scalesweep::model {

// Observer (calibration hooks) is declared in scalesweep/model/calib.h.

// Run-time simulated NVFP4 of activations (per token, static global scales).
struct RuntimeQuant {
  bool acts = false, kv = false, query = false;
  QuantConfig cfg;
  struct Layer {
    std::array<float, kNumInputs> input_gs{};  // encode-direction global scales
    // Inputs quantized when `acts` (a checkpoint may leave a Linear dense: its input stays FP).
    std::array<bool, kNumInputs> input_on{true, true, true, true};
    std::array<std::vector<float>, kNumInputs> input_imp;  // per column (weighted methods)
    // The block-Hessian methods: for each input, the diagonal blocks of W^T W summed over the
    // Linears reading it (the Hessian of their outputs' squared error), in quant's
    // kBlockHessian layout. The attention states have none: their block Hessians are the
    // diagonal ones of q/k/v_imp.
    std::array<std::vector<double>, kNumInputs> input_hess;
    float q_gs = 1, k_gs = 1, v_gs = 1;
    std::vector<float> q_imp, k_imp, v_imp;  // per flattened channel (weighted, Hessian methods)
    // A mixture-of-experts layer under `acts`: per expert, the global scales of its gate/up
    // input (0) and down input (1), 0 where that input stays in full precision. Each expert
    // quantizes the rows routed to it (per token, so the same as quantizing every row and
    // gathering); the router reads the unquantized hidden states, as vLLM's MoE layers do.
    // Unweighted selectors only (the experts have no importance here).
    std::vector<std::array<float, 2>> expert_input_gs;
  };
  std::vector<Layer> layers;
};

// Arithmetic of the prefill matrix products (Linear layers and lm_head on more than one row).
// kF32 (the default and the reference): fp32 sgemm on the weights widened to fp32.
// kBF16 (opt-in, it changes the numerics): the activations rounded to bf16 (round to nearest
// even), the weights as bf16 (bf16 weights as stored, other dtypes rounded from their fp32
// values), products accumulated in fp32 (model/bf16_gemm.h: oneDNN, AVX512-BF16 where the CPU
// has it). Single-token decode (GEMV) and attention stay fp32 in both modes.
enum class Compute { kF32, kBF16 };
inline constexpr auto kComputeNames =
    make_names<Compute>("compute mode", {{Compute::kF32, "fp32"},
                                         {Compute::kBF16, "bf16"},
                                         {Compute::kF32, "f32"},
                                         {Compute::kF32, "float32"},
                                         {Compute::kBF16, "bfloat16"}});
// Whether this build can run Compute::kBF16 (built with oneDNN).
bool compute_available(Compute c);

// Bytes a Transformer allocates beside its weights for a KV cache of `positions` positions and
// a batched prefill of `rows` rows: the cache (fp32 keys and values of every layer), the
// activations of `rows` rows, the attention-score tiles of every worker and a tile of
// dequantized weight rows. The estimate memory refusals are made from (base/memory.h).
int64_t runtime_working_bytes(const Config& c, int64_t positions, int64_t rows);

class Transformer {
 public:
  // `max_ctx` = initial KV cache positions (0: min(max_seq_len, 256)); it grows on demand up to the
  // model's max_seq_len.
  explicit Transformer(std::shared_ptr<const Weights> w, int max_ctx = 0);
  const Config& config() const { return w_->config; }
  const Weights& weights() const { return *w_; }

  // A new Transformer on the same weights, run-time quantization and compute mode, with an
  // empty KV cache and no observer (one per worker thread: nothing is shared but read-only
  // state).
  std::unique_ptr<Transformer> fresh(int max_ctx = 0) const;
  // The same, on other weights of the same config (e.g. the fp32 copy of these).
  std::unique_ptr<Transformer> with_weights(std::shared_ptr<const Weights> w,
                                            int max_ctx = 0) const;

  void set_observer(Observer* o) { observer_ = o; }
  // With an observer: every token also runs through every expert of a MoE layer for the
  // experts' statistics (Observer::on_expert_input with all rows); the layer's output stays
  // the routed one, computed as without it.
  void set_calib_all_experts(bool on) { calib_all_experts_ = on; }
  void set_runtime_quant(std::shared_ptr<const RuntimeQuant> rq) { rq_ = std::move(rq); }
  // Throws std::runtime_error for a mode this build cannot run (compute_available).
  void set_compute(Compute c);
  Compute compute() const { return compute_; }

  // Runs tokens at positions pos .. pos+n-1 (the cache must hold positions 0..pos-1 of the
  // same sequence), appends their keys/values to the cache and returns the final-normed
  // hidden states [n, dim] (valid until the next call).
  const float* forward_hidden(const int* tokens, int n, int pos);
  // Several continuations of the cached sequence (positions 0..pos-1) in one pass: branch b,
  // tokens [Σ_{c<b} lens[c], Σ_{c<=b} lens[c]) of `tokens`, has its token i at position pos + i
  // and sees the cache's 0..pos-1 and its own tokens 0..i, never another branch's. Every
  // Linear runs once on all rows (one read of the weights for all branches). Returns the
  // final-normed hidden states [Σ lens, dim], branch after branch (valid until the next call).
  // The branches' keys/values occupy cache slots pos.., branch after branch: afterwards the
  // cache holds the shared sequence 0..pos-1 only. Throws std::invalid_argument for no or an
  // empty branch, std::out_of_range when the slots (pos + Σ lens) pass max_seq_len.
  const float* forward_branches(const int* tokens, const int* lens, int n_branches, int pos);
  // logits [rows, vocab] = hidden lm_headᵀ.
  void logits(const float* hidden, int rows, float* out) const;
  // What forward() does after its layers, for hidden states x [rows, dim] that came out of the
  // last layer (forward_layer): the final norm, in place, then logits [rows, vocab].
  void final_logits(float* x, int rows, float* out) const;
  // forward_hidden + logits of every row: [n, vocab].
  std::vector<float> forward(const int* tokens, int n, int pos);
  // One token at `pos`: logits [vocab] (valid until the next call).
  const float* decode(int token, int pos);
  // Runs decoder layer `l` (KV cache slot l, observer and runtime quantization of layer l)
  // with the weights `lw` (not necessarily weights().layers[l]: layer-by-layer streaming
  // passes each layer as it is materialized) on the hidden states x [n, dim] at positions
  // pos .. pos+n-1, in place. The same arithmetic as forward_hidden's layer loop.
  void forward_layer(int l, const LayerWeights& lw, float* x, int n, int pos);

 private:
  const float* run_rows(const int* tokens, int n, int pos);
  void ensure_capacity(int positions);
  void ensure_scratch(int n);
  void set_rope(int n, int pos);
  void run_layer(int l, const LayerWeights& lw, float* x, int n, int pos);
  void linear(const float* x, int n, const Tensor& w, const Tensor& b, float* y) const;
  void moe(int l, const LayerWeights& lw, const float* h, int n, float* out);
  void rmsnorm(const float* x, const float* w, int n, int dim, float* y) const;
  void fake_quant_rows(float* x, int rows, int cols, float gs, const std::vector<float>& imp,
                       const std::string& name, const std::vector<double>* hess = nullptr) const;
  void fake_quant_heads(float* x, int rows, int n_heads, float gs, const std::vector<float>& imp,
                        const std::string& name) const;

  std::shared_ptr<const Weights> w_;
  std::shared_ptr<const RuntimeQuant> rq_;
  Observer* observer_ = nullptr;
  bool calib_all_experts_ = false;
  int cap_ = 0;
  // Per layer: keys channel-major [kv_dim, cap] (decode scores vectorize over positions),
  // values [cap, kv_dim].
  std::vector<std::vector<float>> kcache_, vcache_;
  int scratch_n_ = 0;
  std::vector<float> x_, xb_, q_, k_, v_, att_, hb_, hb2_, scores_, rope_cos_, rope_sin_;
  // MoE layers: router probabilities [n, n_experts], each row's experts and weights
  // [n, experts_per_tok], one expert's rows (token index, weight), its inputs [n, dim] and
  // outputs [n, dim], and the layer's output [n, dim].
  std::vector<float> route_p_, route_w_, moe_x_, moe_y_, moe_out_;
  std::vector<int> route_e_;
  std::vector<std::pair<int, float>> moe_rows_;
  std::vector<float> inv_freq_;
  // forward_branches: per row, the row where its branch starts (empty: one sequence).
  std::vector<int> branch_start_;
  float rope_scale_ = 1;  // Config::rope_scaling.attention_factor
  std::vector<float> logits_;
  mutable std::vector<float> wtile_;                 // prefill: dequantized weight rows
  mutable std::unique_ptr<WorkerPool> decode_pool_;  // decode products, started on first use
  WorkerPool& decode_pool() const;
  void dequantize_tile(const Tensor& w, int o0, int rows) const;  // into wtile_
  Compute compute_ = Compute::kF32;
  mutable std::vector<uint16_t> xbf_, wtile_bf_;  // Compute::kBF16: bf16 activations, weights
};

// RoPE inverse frequencies [head_dim/2] as transformers computes them for c.rope_scaling.type
// (theta^(-2i/hd), then linear / llama3 / yarn scaling; dynamic NTK recomputes the base for
// seq_len > max_seq_len, which the runtime never reaches: positions stop at max_seq_len, so
// dynamic runs with the original frequencies, as transformers does below that length).
// cos/sin are further multiplied by c.rope_scaling.attention_factor. Throws
// std::invalid_argument for an inconsistent scaling (a factor without a type).
std::vector<float> rope_inv_freq(const Config& c, int seq_len = 0);

}  // namespace scalesweep::model
