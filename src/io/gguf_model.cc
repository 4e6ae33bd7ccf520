// Llama-family models from GGUF files (include/scalesweep/io/gguf_model.h).
#include "scalesweep/io/gguf_model.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <numbers>
#include <optional>
#include <set>
#include <stdexcept>
#include <tuple>
#include <unordered_map>

#include "io/expert_tensors.h"
#include "io/weight_checks.h"
#include "scalesweep/base/parallel.h"
#include "scalesweep/io/llama2c.h"
#include "scalesweep/io/model_parts.h"
#include "scalesweep/model/weight.h"

namespace scalesweep::io {
namespace {

[[noreturn]] void fail(const std::string& name, const std::string& what) {
  throw std::runtime_error(name + ": " + what);
}

// ---- config ---------------------------------------------------------------------------------

// {arch}.* keys understood by the mapping (value-checked where they could change the math).
const std::set<std::string, std::less<>>& known_arch_keys() {
  static const std::set<std::string, std::less<>> k = {
      "block_count",
      "context_length",
      "embedding_length",
      "feed_forward_length",
      "attention.head_count",
      "attention.head_count_kv",
      "attention.key_length",
      "attention.value_length",
      "attention.layer_norm_rms_epsilon",
      "rope.freq_base",
      "rope.dimension_count",
      "vocab_size",
      "tensor_data_layout",                    // provenance note of old converters
      "rope.scaling.type",                     // none, linear or yarn
      "rope.scaling.factor",                   // linear, yarn (else 0 or 1)
      "rope.scaling.attn_factor",              // must be 1
      "rope.scale_linear",                     // must be 1
      "rope.scaling.original_context_length",  // yarn (unused without scaling)
      "rope.scaling.finetuned",                // unused
      "rope.scaling.yarn_beta_fast",           // yarn
      "rope.scaling.yarn_beta_slow",           // yarn
      "rope.scaling.yarn_ext_factor",          // must be 1 (yarn) or absent
      "rope.scaling.yarn_attn_factor",         // must be 1
      "attention.sliding_window",              // must be 0
      "attention.causal",                      // must be true
      "expert_count",                          // > 0: qwen3moe, llama (Mixtral)
      "expert_used_count",                     // with expert_count
      "expert_feed_forward_length",            // qwen3moe
      "expert_shared_count",                   // must be 0
      "leading_dense_block_count",             // must be 0
      "expert_weights_norm",                   // must be true (what llama.cpp applies)
      "expert_gating_func",                    // must be 1 (softmax)
  };
  return k;
}

// Why an {arch}.* key outside known_arch_keys() is refused.
std::string refusal(std::string_view rest) {
  static const std::map<std::string, std::string, std::less<>> why = {
      {"attention.layer_norm_epsilon", "LayerNorm (not RMSNorm) models are not supported"},
      {"attn_logit_softcapping", "attention logit softcapping is not implemented"},
      {"final_logit_softcapping", "final logit softcapping is not implemented"},
      {"attention.clamp_kqv", "clamped q/k/v are not implemented"},
      {"attention.scale", "a custom attention scale is not implemented"},
      {"embedding_scale", "a scaled embedding is not implemented"},
      {"residual_scale", "a scaled residual is not implemented"},
      {"logit_scale", "scaled logits are not implemented"},
      {"rope.dimension_sections", "multimodal (sectioned) RoPE is not implemented"},
      {"attention.q_lora_rank", "low-rank (MLA) attention is not implemented"},
      {"attention.kv_lora_rank", "low-rank (MLA) attention is not implemented"},
      {"expert_weights_scale", "scaled routing weights are not implemented"},
      {"expert_group_count", "grouped expert routing is not implemented"},
      {"expert_group_used_count", "grouped expert routing is not implemented"},
      {"expert_shared_feed_forward_length", "shared experts are not implemented"},
      {"use_parallel_residual", "parallel residual blocks are not implemented"},
      {"swin_norm", "swin norm is not implemented"},
  };
  if (auto it = why.find(rest); it != why.end()) return it->second;
  return "not understood by this loader (it may change the model's math)";
}

int positive(const GgufMetadata& m, const std::string& key, const std::string& name, int64_t max,
             std::optional<int64_t> dflt = std::nullopt) {
  std::optional<int64_t> v = gguf_get_int(m, key, name);
  if (!v) {
    if (!dflt) fail(name, "key '" + key + "' is missing");
    v = dflt;
  }
  if (*v <= 0 || *v > max)
    fail(name, "key '" + key + "' = " + std::to_string(*v) + " is out of range [1, " +
                   std::to_string(max) + "]");
  return static_cast<int>(*v);
}

// A float key that must be `want` when present.
void need_float_if_present(const GgufMetadata& meta, const std::string& key, double want,
                           const std::string& name, const std::string& why) {
  if (auto f = gguf_get_float(meta, key, name); f && *f != want)
    fail(name, "key '" + key + "' = " + std::to_string(*f) + ": " + why);
}

// transformers' default YaRN attention factor, which llama.cpp's rope applies (ext_factor 1).
float yarn_mscale(float factor) {
  return factor <= 1 ? 1.0f : static_cast<float>(0.1 * std::log(factor) + 1.0);
}

// RoPE scaling from the {arch}.rope.scaling.* keys and the rope_freqs.weight tensor, as
// llama.cpp reads them (llama-model.cpp load_hparams; ggml's rope_yarn).
model::RopeScaling gguf_rope_scaling(const GgufMetadata& meta, const std::string& p,
                                     model::Arch arch,
                                     const std::function<bool(std::string_view)>& has_tensor,
                                     const std::string& name) {
  const auto key = [&](const char* k) { return p + k; };
  model::RopeScaling r;
  const std::string type = gguf_get_string(meta, key("rope.scaling.type"), name).value_or("none");
  const std::optional<double> factor = gguf_get_float(meta, key("rope.scaling.factor"), name);
  need_float_if_present(meta, key("rope.scale_linear"), 1.0, name,
                        "the old linear RoPE scale is not implemented (use rope.scaling.*)");
  for (const char* k : {"rope.scaling.attn_factor", "rope.scaling.yarn_attn_factor"})
    need_float_if_present(meta, key(k), 1.0, name, "a RoPE attention factor is not implemented");
  if (type == "none") {
    if (factor && *factor != 0.0 && *factor != 1.0)
      fail(name, "key '" + key("rope.scaling.factor") + "' = " + std::to_string(*factor) +
                     " without a rope.scaling.type");
  } else if (type == "linear" || type == "yarn") {
    if (!factor || !(*factor > 0))
      fail(name, "key '" + key("rope.scaling.factor") + "' is missing or not positive (" + type +
                     " RoPE scaling)");
    r.type = type == "linear" ? model::RopeType::kLinear : model::RopeType::kYarn;
    r.factor = static_cast<float>(*factor);
  } else {
    fail(name, "key '" + key("rope.scaling.type") + "' = '" + type +
                   "': RoPE scaling other than none, linear and yarn is not implemented");
  }
  if (r.type == model::RopeType::kYarn) {
    r.original_max_position_embeddings =
        positive(meta, key("rope.scaling.original_context_length"), name, 1 << 24);
    r.beta_fast = static_cast<float>(
        gguf_get_float(meta, key("rope.scaling.yarn_beta_fast"), name).value_or(32.0));
    r.beta_slow = static_cast<float>(
        gguf_get_float(meta, key("rope.scaling.yarn_beta_slow"), name).value_or(1.0));
    need_float_if_present(meta, key("rope.scaling.yarn_ext_factor"), 1.0, name,
                          "a YaRN extrapolation mix other than 1 is not implemented");
    r.attention_factor = yarn_mscale(r.factor);
  }
  if (!has_tensor("rope_freqs.weight")) return r;
  if (arch != model::Arch::kLlama || r.type != model::RopeType::kDefault)
    fail(name,
         "tensor 'rope_freqs.weight' (Llama-3 RoPE factors) is supported for the llama "
         "architecture without other RoPE scaling only");
  r.type = model::RopeType::kLlama3;
  r.factor = 0;  // set from the tensor by load_gguf_weights unless recorded
  r.original_max_position_embeddings = 8192;
  if (const auto v = gguf_get_float_array(meta, kGgufLlama3RopeKey, name)) {
    if (v->size() != 4 || !((*v)[0] > 0) || !((*v)[1] > 0) || !((*v)[2] > (*v)[1]) ||
        !((*v)[3] >= 1))
      fail(name, std::string("key '") + kGgufLlama3RopeKey +
                     "' is not [factor > 0, 0 < low_freq_factor < high_freq_factor, original "
                     "context >= 1]");
    r.factor = static_cast<float>((*v)[0]);
    r.low_freq_factor = static_cast<float>((*v)[1]);
    r.high_freq_factor = static_cast<float>((*v)[2]);
    r.original_max_position_embeddings = static_cast<int>((*v)[3]);
  }
  return r;
}

// The mixture-of-experts keys as llama.cpp reads them (llama-model.cpp load_hparams; the
// graphs of qwen3moe and of llama with experts, i.e. Mixtral, call build_moe_ffn with softmax
// gating and normalised top-k weights): expert_count, expert_used_count and, for qwen3moe,
// expert_feed_forward_length (Mixtral's experts are feed_forward_length wide). Every layer is
// a MoE layer. Keys that would change that math are refused unless neutral.
void gguf_moe_config(const GgufMetadata& meta, const std::string& p, const std::string& name,
                     model::Config& c) {
  const auto key = [&](const char* k) { return p + k; };
  for (const char* k : {"expert_shared_count", "leading_dense_block_count"})
    if (auto v = gguf_get_int(meta, key(k), name); v && *v != 0)
      fail(name, "key '" + key(k) + "' = " + std::to_string(*v) +
                     ": shared experts and leading dense layers are not implemented");
  if (auto g = gguf_get_int(meta, key("expert_gating_func"), name); g && *g != 1)
    fail(name, "key '" + key("expert_gating_func") + "' = " + std::to_string(*g) +
                   ": only softmax gating (1) is implemented");
  if (auto nw = gguf_get_bool(meta, key("expert_weights_norm"), name); nw && !*nw)
    fail(name, "key '" + key("expert_weights_norm") +
                   "' = false: llama.cpp normalises the top-k routing weights of " +
                   p.substr(0, p.size() - 1) + " models; unnormalised weights are not implemented");
  const std::optional<int64_t> n = gguf_get_int(meta, key("expert_count"), name);
  const std::optional<int64_t> used = gguf_get_int(meta, key("expert_used_count"), name);
  if (!n || *n == 0) {
    if (c.arch == model::Arch::kQwen3Moe)
      fail(name, "key '" + key("expert_count") + "' is missing or 0 (qwen3moe needs experts)");
    if (used && *used != 0)
      fail(name, "key '" + key("expert_used_count") + "' = " + std::to_string(*used) +
                     " without '" + key("expert_count") + "'");
    if (gguf_find_kv(meta, key("expert_feed_forward_length")))
      fail(name,
           "key '" + key("expert_feed_forward_length") + "' without '" + key("expert_count") + "'");
    return;
  }
  c.n_experts = positive(meta, key("expert_count"), name, 1 << 16);
  c.experts_per_tok = positive(meta, key("expert_used_count"), name, c.n_experts);
  if (c.arch == model::Arch::kQwen3Moe) {
    c.moe_hidden_dim = positive(meta, key("expert_feed_forward_length"), name, 1 << 20);
  } else {
    if (gguf_find_kv(meta, key("expert_feed_forward_length")))
      fail(name, "key '" + key("expert_feed_forward_length") +
                     "' is not read by llama.cpp for this architecture (its experts are "
                     "feed_forward_length wide)");
    c.moe_hidden_dim = c.hidden_dim;
  }
  c.norm_topk_prob = true;
}

}  // namespace

std::optional<model::Arch> gguf_arch(std::string_view general_architecture, bool has_experts) {
  if (general_architecture == "llama")
    return has_experts ? model::Arch::kMixtral : model::Arch::kLlama;
  if (general_architecture == "qwen2") return model::Arch::kQwen2;
  if (general_architecture == "qwen3") return model::Arch::kQwen3;
  if (general_architecture == "qwen3moe") return model::Arch::kQwen3Moe;
  return std::nullopt;
}

model::Config gguf_model_config(const GgufMetadata& meta,
                                const std::function<bool(std::string_view)>& has_tensor,
                                const std::string& name) {
  const std::optional<std::string> arch = gguf_get_string(meta, "general.architecture", name);
  if (!arch) fail(name, "key 'general.architecture' is missing");
  model::Config c;
  const std::optional<int64_t> experts = gguf_get_int(meta, *arch + ".expert_count", name);
  if (const auto a = gguf_arch(*arch, experts && *experts > 0))
    c.arch = *a;
  else
    fail(name, "general.architecture '" + *arch +
                   "' is not supported (supported: llama, qwen2, qwen3, qwen3moe; Mixtral is "
                   "llama with experts)");
  // A Qwen2 model our writer stored in llama.cpp's llama layout (kGgufSourceArchKey): the
  // model is Qwen2 (q/k/v biases; the q/k rows, biases included, permuted as llama's).
  if (const auto src = gguf_get_string(meta, kGgufSourceArchKey, name)) {
    if (*src != "qwen2" || c.arch != model::Arch::kLlama)
      fail(name, "key '" + std::string(kGgufSourceArchKey) + "' = '" + *src +
                     "' with general.architecture '" + *arch +
                     "' (only qwen2 stored as llama is known)");
    c.arch = model::Arch::kQwen2;
  }
  const std::string p = *arch + ".";
  for (const auto& [k, v] : meta) {
    if (!k.starts_with(p)) continue;
    const std::string_view rest = std::string_view(k).substr(p.size());
    if (!known_arch_keys().contains(rest))
      fail(name, "key '" + k + "' is not supported: " + refusal(rest));
  }
  const auto key = [&](const char* k) { return p + k; };
  c.rope_scaling = gguf_rope_scaling(meta, p, c.arch, has_tensor, name);
  if (auto w = gguf_get_int(meta, key("attention.sliding_window"), name); w && *w != 0)
    fail(name, "key '" + key("attention.sliding_window") + "' = " + std::to_string(*w) +
                   ": sliding-window attention is not implemented");
  if (auto cz = gguf_get_bool(meta, key("attention.causal"), name); cz && !*cz)
    fail(name, "key '" + key("attention.causal") + "' = false: non-causal attention");

  c.n_layers = positive(meta, key("block_count"), name, 4096);
  c.dim = positive(meta, key("embedding_length"), name, 1 << 17);
  c.hidden_dim = positive(meta, key("feed_forward_length"), name, 1 << 20);
  gguf_moe_config(meta, p, name, c);
  c.n_heads = positive(meta, key("attention.head_count"), name, 4096);
  c.n_kv_heads = positive(meta, key("attention.head_count_kv"), name, 4096, c.n_heads);
  if (c.n_heads % c.n_kv_heads != 0)
    fail(name, "key '" + key("attention.head_count_kv") + "' = " + std::to_string(c.n_kv_heads) +
                   " does not divide the head count " + std::to_string(c.n_heads));
  const std::optional<int64_t> kl = gguf_get_int(meta, key("attention.key_length"), name);
  if (!kl && c.dim % c.n_heads != 0)
    fail(name, "key '" + key("attention.key_length") + "' is missing and the head count " +
                   std::to_string(c.n_heads) + " does not divide embedding_length " +
                   std::to_string(c.dim));
  c.head_dim = positive(meta, key("attention.key_length"), name, 1 << 14, c.dim / c.n_heads);
  const int vl = positive(meta, key("attention.value_length"), name, 1 << 14, c.head_dim);
  if (vl != c.head_dim)
    fail(name, "key '" + key("attention.value_length") + "' = " + std::to_string(vl) +
                   " differs from the key length " + std::to_string(c.head_dim) +
                   " (not supported)");
  if (c.head_dim % 2 != 0)
    fail(name, "head dimension " + std::to_string(c.head_dim) + " is odd (RoPE needs pairs)");
  const int rope_dims =
      positive(meta, key("rope.dimension_count"), name, 1 << 14, static_cast<int64_t>(c.head_dim));
  if (rope_dims != c.head_dim)
    fail(name, "key '" + key("rope.dimension_count") + "' = " + std::to_string(rope_dims) +
                   ": partial rotary embeddings (rope dimensions != head dimension " +
                   std::to_string(c.head_dim) + ") are not implemented");
  c.max_seq_len = positive(meta, key("context_length"), name, 1 << 24);
  const std::optional<double> theta = gguf_get_float(meta, key("rope.freq_base"), name);
  c.rope_theta = static_cast<float>(theta.value_or(10000.0));  // llama.cpp's default
  if (!(c.rope_theta > 0) || !std::isfinite(c.rope_theta))
    fail(name, "key '" + key("rope.freq_base") + "' = " + std::to_string(*theta) +
                   " is not a positive number");
  const std::optional<double> eps =
      gguf_get_float(meta, key("attention.layer_norm_rms_epsilon"), name);
  if (!eps) fail(name, "key '" + key("attention.layer_norm_rms_epsilon") + "' is missing");
  c.norm_eps = static_cast<float>(*eps);
  if (!(c.norm_eps > 0) || !std::isfinite(c.norm_eps))
    fail(name, "key '" + key("attention.layer_norm_rms_epsilon") + "' = " + std::to_string(*eps) +
                   " is not a positive number");
  const std::optional<int64_t> vs = gguf_get_int(meta, key("vocab_size"), name);
  const GgufValue* toks = gguf_find_kv(meta, "tokenizer.ggml.tokens");
  const int64_t ntok =
      toks && toks->type == GgufValueType::kArray ? static_cast<int64_t>(toks->array.size()) : -1;
  if (vs) {
    c.vocab_size = positive(meta, key("vocab_size"), name, 1 << 24);
    if (ntok > c.vocab_size)
      fail(name, "tokenizer.ggml.tokens has " + std::to_string(ntok) + " tokens but '" +
                     key("vocab_size") + "' is " + std::to_string(c.vocab_size));
  } else if (ntok > 0) {
    if (ntok > (1 << 24)) fail(name, "tokenizer.ggml.tokens has too many tokens");
    c.vocab_size = static_cast<int>(ntok);
  } else {
    fail(name, "the vocabulary size is unknown: neither '" + key("vocab_size") +
                   "' nor tokenizer.ggml.tokens is present");
  }
  c.tied_embeddings = !has_tensor("output.weight");
  c.qkv_bias = c.arch == model::Arch::kQwen2;
  c.qk_norm = c.arch == model::Arch::kQwen3 || c.arch == model::Arch::kQwen3Moe;
  // Absent ids: llama.cpp's SentencePiece defaults (<s> 1, </s> 2), as gguf_tokenizer_spec.
  const GgufValue* tm = gguf_find_kv(meta, "tokenizer.ggml.model");
  const bool spm =
      tm && tm->type == GgufValueType::kString && std::get<std::string>(tm->scalar) == "llama";
  const auto special = [&](const char* k, int spm_default) {
    const std::optional<int64_t> id = gguf_get_int(meta, k, name);
    if (!id) return spm && spm_default < c.vocab_size ? spm_default : -1;
    if (*id < 0 || *id >= c.vocab_size)
      fail(name, std::string("key '") + k + "' = " + std::to_string(*id) +
                     " is outside the vocabulary [0, " + std::to_string(c.vocab_size) + ")");
    return static_cast<int>(*id);
  };
  c.bos_token_id = special("tokenizer.ggml.bos_token_id", 1);
  c.eos_token_id = special("tokenizer.ggml.eos_token_id", 2);
  return c;
}

// ---- tokenizer ------------------------------------------------------------------------------

namespace {

struct PreTokenizer {
  const char* name;
  model::SplitRegex split;
  int max_digits;
  bool split_digits, nfc, ignore_merges, add_bos;  // add_bos: llama.cpp's default
};

// `tokenizer.ggml.pre` names and the splits llama.cpp's llama-vocab.cpp applies for them,
// expressed as the equivalent Hugging Face pre-tokenizer (what the original tokenizer.json of
// such a model has). "default" (and a missing key, as llama.cpp reads old files) is GPT-2's
// regex, as transformers' GGUF tokenizer builder reads it (llama.cpp's own DEFAULT splits
// additionally isolate punctuation runs and 3-digit groups, which no Hugging Face tokenizer
// does). Qwen2's tokenizer.json has an NFC normalizer (llama.cpp does not normalize).
const PreTokenizer kPreTokenizers[] = {
    {"default", model::SplitRegex::kGpt2, 0, false, false, false, false},
    {"gpt2", model::SplitRegex::kGpt2, 0, false, false, false, false},
    {"gpt-2", model::SplitRegex::kGpt2, 0, false, false, false, false},
    {"phi-2", model::SplitRegex::kGpt2, 0, false, false, false, false},
    {"llama3", model::SplitRegex::kLlama3, 3, false, false, true, true},
    {"llama-v3", model::SplitRegex::kLlama3, 3, false, false, true, true},
    {"llama-bpe", model::SplitRegex::kLlama3, 3, false, false, true, true},
    {"falcon3", model::SplitRegex::kLlama3, 3, false, false, true, true},
    {"smaug-bpe", model::SplitRegex::kLlama3, 3, false, false, false, false},
    {"dbrx", model::SplitRegex::kLlama3, 3, false, false, false, false},
    {"qwen2", model::SplitRegex::kLlama3, 1, false, true, false, false},
    {"deepseek-r1-qwen", model::SplitRegex::kLlama3, 1, false, true, false, false},
    {"smollm", model::SplitRegex::kGpt2, 0, true, false, false, false},
    {"starcoder", model::SplitRegex::kGpt2, 0, true, false, false, false},
    {"refact", model::SplitRegex::kGpt2, 0, true, false, false, false},
};

int decode_cp(std::string_view s, size_t i) {  // length of the UTF-8 sequence at i (>= 1)
  const auto b = static_cast<uint8_t>(s[i]);
  int len = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 1;
  if (i + static_cast<size_t>(len) > s.size()) len = 1;
  return len;
}

}  // namespace

std::vector<std::string> gguf_supported_pre_tokenizers() {
  std::vector<std::string> v;
  for (const auto& p : kPreTokenizers) v.emplace_back(p.name);
  return v;
}

std::optional<std::string> gguf_pre_tokenizer_name(const model::BpeSpec& s) {
  if (s.flavor != model::BpeFlavor::kByteLevel) return std::nullopt;
  for (const auto& p : kPreTokenizers) {
    // "default" is llama.cpp's own regex, not GPT-2's: name GPT-2's split "gpt2".
    if (std::string_view(p.name) == "default") continue;
    if (p.split == s.split && p.max_digits == s.max_digits && p.split_digits == s.split_digits &&
        p.nfc == s.nfc && p.ignore_merges == s.ignore_merges)
      return std::string(p.name);
  }
  return std::nullopt;
}

bool gguf_has_tokenizer(const GgufMetadata& meta) {
  return gguf_find_kv(meta, "tokenizer.ggml.model") != nullptr;
}

std::vector<std::pair<std::string, std::string>> sentencepiece_merges_from_scores(
    const std::vector<std::string>& tokens, const std::vector<float>& scores) {
  if (scores.size() != tokens.size())
    throw std::runtime_error("sentencepiece merges: " + std::to_string(tokens.size()) +
                             " tokens but " + std::to_string(scores.size()) + " scores");
  std::unordered_map<std::string_view, int> ids;
  ids.reserve(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    auto [it, fresh] = ids.emplace(tokens[i], static_cast<int>(i));
    if (!fresh)
      throw std::runtime_error("sentencepiece merges: tokens " + std::to_string(it->second) +
                               " and " + std::to_string(i) + " are both '" + tokens[i] + "'");
  }
  struct Cand {
    float score;
    int left_cps, right_cps;
    int id, left_id, right_id;
    size_t split;
  };
  std::vector<Cand> cands;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::string_view t = tokens[i];
    const size_t first = cands.size();
    int total = 0;
    for (size_t k = 0; k < t.size(); k += static_cast<size_t>(decode_cp(t, k))) ++total;
    int left = 0;
    for (size_t k = 0; k < t.size();) {
      k += static_cast<size_t>(decode_cp(t, k));
      ++left;
      if (k >= t.size()) break;
      auto l = ids.find(t.substr(0, k)), r = ids.find(t.substr(k));
      if (l != ids.end() && r != ids.end())
        cands.push_back(
            {scores[i], left, total - left, static_cast<int>(i), l->second, r->second, k});
    }
    // Within one token: by the parts' ids (transformers' `local` sort).
    std::stable_sort(cands.begin() + static_cast<std::ptrdiff_t>(first), cands.end(),
                     [](const Cand& a, const Cand& b) {
                       return std::tie(a.left_id, a.right_id) < std::tie(b.left_id, b.right_id);
                     });
  }
  // Score, left length, right length, all descending; ties keep their order (Python's stable
  // sorted(..., reverse=True)).
  std::stable_sort(cands.begin(), cands.end(), [](const Cand& a, const Cand& b) {
    return std::tie(b.score, b.left_cps, b.right_cps) < std::tie(a.score, a.left_cps, a.right_cps);
  });
  std::vector<std::pair<std::string, std::string>> out;
  out.reserve(cands.size());
  for (const auto& c : cands)
    out.emplace_back(tokens[static_cast<size_t>(c.id)].substr(0, c.split),
                     tokens[static_cast<size_t>(c.id)].substr(c.split));
  return out;
}

namespace {

// tokenizer.ggml.token_type when present: one llama.cpp token type (0..6) per token.
std::optional<std::vector<int64_t>> gguf_token_types(const GgufMetadata& meta,
                                                     const std::string& name, int64_t n) {
  std::optional<std::vector<int64_t>> types =
      gguf_get_int_array(meta, "tokenizer.ggml.token_type", name);
  if (types && static_cast<int64_t>(types->size()) != n)
    fail(name, "tokenizer.ggml.token_type has " + std::to_string(types->size()) + " entries for " +
                   std::to_string(n) + " tokens");
  if (types)
    for (size_t i = 0; i < types->size(); ++i)
      if ((*types)[i] < 0 || (*types)[i] > 6)
        fail(name, "tokenizer.ggml.token_type[" + std::to_string(i) + "] = " +
                       std::to_string((*types)[i]) + " is not a llama.cpp token type (0..6)");
  return types;
}

// Refuses the SentencePiece normalizers the tokenizer does not implement.
void refuse_normalizers(const GgufMetadata& meta, const std::string& name) {
  for (const char* k : {"tokenizer.ggml.precompiled_charsmap"})
    if (gguf_find_kv(meta, k))
      fail(name, std::string("key '") + k + "' (a SentencePiece normalizer) is not supported");
  if (auto r = gguf_get_bool(meta, "tokenizer.ggml.remove_extra_whitespaces", name); r && *r)
    fail(name, "key 'tokenizer.ggml.remove_extra_whitespaces' = true is not supported");
}

// tokenizer.ggml.merges into `merges` ("a b" each); false when the key is absent.
bool gguf_merges(const GgufMetadata& meta, const std::string& name,
                 std::vector<std::pair<std::string, std::string>>& merges) {
  std::optional<std::vector<std::string>> merges_s =
      gguf_get_string_array(meta, "tokenizer.ggml.merges", name);
  if (!merges_s) return false;
  merges.reserve(merges_s->size());
  for (size_t i = 0; i < merges_s->size(); ++i) {
    const std::string& s = (*merges_s)[i];
    const size_t sp = s.find(' ');
    if (sp == std::string::npos || sp == 0 || sp + 1 == s.size() ||
        s.find(' ', sp + 1) != std::string::npos)
      fail(name, "tokenizer.ggml.merges[" + std::to_string(i) + "] = '" + s +
                     "' is not two tokens 'a b'");
    merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
  }
  return true;
}

// The keys of a GGUF tokenizer that both kinds read.
struct GgufTokenizerKeys {
  const GgufMetadata& meta;
  const std::string& name;
  int64_t n;  // tokens
  std::optional<bool> add_bos, space;
  bool has_merges;

  // A special token id: key `k` within the token list, `dflt` when absent.
  int special(const char* k, int dflt) const {
    const std::optional<int64_t> id = gguf_get_int(meta, k, name);
    if (!id) return dflt;
    if (*id < 0 || *id >= n)
      fail(name, std::string("key '") + k + "' = " + std::to_string(*id) +
                     " is outside the token list [0, " + std::to_string(n) + ")");
    return static_cast<int>(*id);
  }
};

// tokenizer.ggml.model "gpt2": byte-level BPE with the pre-tokenizer tokenizer.ggml.pre names.
void byte_level_spec(const GgufTokenizerKeys& k, model::BpeSpec& spec) {
  const std::string& name = k.name;
  if (!k.has_merges) fail(name, "key 'tokenizer.ggml.merges' is missing (needed by gpt2 BPE)");
  const std::optional<std::string> pre_name = gguf_get_string(k.meta, "tokenizer.ggml.pre", name);
  const std::string pn = pre_name.value_or("default");
  const PreTokenizer* pre = nullptr;
  for (const auto& p : kPreTokenizers)
    if (pn == p.name) pre = &p;
  if (!pre) {
    std::string list;
    for (const auto& p : kPreTokenizers) list += std::string(list.empty() ? "" : ", ") + p.name;
    fail(name, "tokenizer.ggml.pre '" + pn + "' is not supported (supported: " + list + ")");
  }
  spec.flavor = model::BpeFlavor::kByteLevel;
  spec.split = pre->split;
  spec.max_digits = pre->max_digits;
  spec.split_digits = pre->split_digits;
  spec.nfc = pre->nfc;
  spec.ignore_merges = pre->ignore_merges;
  if (k.space && *k.space) {
    if (spec.split != model::SplitRegex::kGpt2 || spec.split_digits)
      fail(name, "tokenizer.ggml.add_space_prefix = true with pre-tokenizer '" + pn +
                     "' is not supported");
    spec.add_prefix_space = true;
  }
  spec.bos_id = k.special("tokenizer.ggml.bos_token_id", -1);
  spec.eos_id = k.special("tokenizer.ggml.eos_token_id", -1);
  spec.unk_id = k.special("tokenizer.ggml.unknown_token_id", -1);
  spec.add_bos = k.add_bos.value_or(pre->add_bos);
}

// tokenizer.ggml.model "llama": SentencePiece BPE, the merges derived from the scores when the
// file has none.
void sentencepiece_spec(const GgufTokenizerKeys& k, model::BpeSpec& spec) {
  const std::string& name = k.name;
  const int64_t n = k.n;
  const std::optional<std::vector<double>> sc =
      gguf_get_float_array(k.meta, "tokenizer.ggml.scores", name);
  if (!k.has_merges) {
    if (!sc) fail(name, "key 'tokenizer.ggml.scores' is missing (needed by llama tokenizers)");
    if (static_cast<int64_t>(sc->size()) != n)
      fail(name, "tokenizer.ggml.scores has " + std::to_string(sc->size()) + " entries for " +
                     std::to_string(n) + " tokens");
    std::vector<float> scores(sc->begin(), sc->end());
    try {
      spec.merges = sentencepiece_merges_from_scores(spec.vocab, scores);
    } catch (const std::exception& e) {
      fail(name, std::string("tokenizer.ggml.tokens: ") + e.what());
    }
  }
  spec.flavor = model::BpeFlavor::kSentencePiece;
  spec.split = model::SplitRegex::kNone;
  spec.metaspace = false;
  // llama.cpp prepends a space to the text and after every special token (add_space_prefix,
  // true unless the file says otherwise): the Hugging Face "legacy" Prepend normalizer.
  spec.prepend =
      k.space.value_or(true) ? model::PrependScheme::kAlways : model::PrependScheme::kNever;
  spec.byte_fallback = true;
  spec.fuse_unk = true;
  // llama.cpp's SentencePiece defaults: <unk> 0, <s> 1, </s> 2, BOS added.
  spec.unk_id = k.special("tokenizer.ggml.unknown_token_id", n > 0 ? 0 : -1);
  spec.bos_id = k.special("tokenizer.ggml.bos_token_id", n > 1 ? 1 : -1);
  spec.eos_id = k.special("tokenizer.ggml.eos_token_id", n > 2 ? 2 : -1);
  spec.add_bos = k.add_bos.value_or(true);
}

// Control (3) and unknown (2) tokens are special added tokens, user-defined (4) plain added
// tokens: all matched whole in the text before BPE, as llama.cpp and transformers do.
void add_typed_tokens(const std::vector<int64_t>& types, model::BpeSpec& spec) {
  for (size_t i = 0; i < types.size(); ++i) {
    const int64_t t = types[i];
    if (t != 2 && t != 3 && t != 4) continue;
    if (spec.vocab[i].empty()) continue;
    model::HfAddedToken a;
    a.id = static_cast<int>(i);
    a.content = spec.vocab[i];
    a.special = t != 4;
    spec.added.push_back(std::move(a));
  }
}

}  // namespace

model::BpeSpec gguf_tokenizer_spec(const GgufMetadata& meta, const std::string& name) {
  const std::optional<std::string> kind = gguf_get_string(meta, "tokenizer.ggml.model", name);
  if (!kind) fail(name, "key 'tokenizer.ggml.model' is missing (the file has no tokenizer)");
  if (*kind != "gpt2" && *kind != "llama")
    fail(name, "tokenizer.ggml.model '" + *kind + "' is not supported (supported: gpt2, llama)");
  std::optional<std::vector<std::string>> tokens =
      gguf_get_string_array(meta, "tokenizer.ggml.tokens", name);
  if (!tokens || tokens->empty()) fail(name, "key 'tokenizer.ggml.tokens' is missing or empty");
  const int64_t n = static_cast<int64_t>(tokens->size());
  if (n > (1 << 24)) fail(name, "tokenizer.ggml.tokens has too many tokens");
  const std::optional<std::vector<int64_t>> types = gguf_token_types(meta, name, n);
  refuse_normalizers(meta, name);

  model::BpeSpec spec;
  GgufTokenizerKeys k{meta, name, n, {}, {}, false};
  k.add_bos = gguf_get_bool(meta, "tokenizer.ggml.add_bos_token", name);
  const std::optional<bool> add_eos = gguf_get_bool(meta, "tokenizer.ggml.add_eos_token", name);
  k.space = gguf_get_bool(meta, "tokenizer.ggml.add_space_prefix", name);
  k.has_merges = gguf_merges(meta, name, spec.merges);
  spec.vocab = std::move(*tokens);
  if (*kind == "gpt2")
    byte_level_spec(k, spec);
  else
    sentencepiece_spec(k, spec);
  spec.add_eos = add_eos.value_or(false);
  spec.pad_id = k.special("tokenizer.ggml.padding_token_id", -1);
  if (auto t = gguf_get_string(meta, "tokenizer.chat_template", name)) spec.chat_template = *t;
  if (types) add_typed_tokens(*types, spec);
  return spec;
}

// ---- weights --------------------------------------------------------------------------------

void gguf_unpermute_qk_rows(const float* src, float* dst, int n_heads, int head_dim, int64_t cols) {
  // LlamaModel.permute: w.reshape(n_head, 2, hd/2, cols).swapaxes(1, 2) puts HF row
  // h*hd + a*hd/2 + i at h*hd + 2i + a, which is llama2.c's interleaved order.
  permute_rope_rows(src, dst, n_heads, head_dim, cols, /*to_hf=*/true);
}

namespace {

std::string dims(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

}  // namespace

std::vector<float> gguf_llama3_rope_factors(const model::Config& c) {
  const model::RopeScaling& r = c.rope_scaling;
  // convert_hf_to_gguf.py: freqs = 1 / base ** (arange(0, dim, 2) / dim) in float32, then per
  // frequency 1 (short wavelengths), factor (long ones) or the smooth blend between.
  const float old_len = static_cast<float>(r.original_max_position_embeddings);
  const float low_wl = old_len / r.low_freq_factor, high_wl = old_len / r.high_freq_factor;
  const int dim = c.head_dim;
  std::vector<float> out;
  for (int i = 0; i < dim; i += 2) {
    const float freq =
        1.0f / std::pow(c.rope_theta, static_cast<float>(i) / static_cast<float>(dim));
    const float wavelen = 2.0f * std::numbers::pi_v<float> / freq;
    if (wavelen < high_wl) {
      out.push_back(1.0f);
    } else if (wavelen > low_wl) {
      out.push_back(r.factor);
    } else {
      const float smooth =
          (old_len / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
      out.push_back(1.0f / ((1.0f - smooth) / r.factor + smooth));
    }
  }
  return out;
}

namespace {

// rope_freqs.weight of a Llama-3-scaled file: F32 [head_dim/2], the factors of c's parameters
// (c.rope_scaling.factor taken from the lowest frequency's entry when the file does not record
// it). Anything else is refused: the runtime implements Llama-3 scaling, not free factors.
void read_rope_freqs(const GgufFile& f, model::Config& c) {
  const GgufTensorInfo* t = f.find_tensor("rope_freqs.weight");
  const std::vector<int64_t> want = {c.head_dim / 2};
  if (t->type != static_cast<uint32_t>(GgmlType::kF32) || t->ne != want)
    fail(f.path(), "tensor 'rope_freqs.weight': expected F32 ne " + dims(want) + ", got " +
                       ggml_type_name(t->type) + " ne " + dims(t->ne));
  std::vector<float> got(want[0]);
  std::memcpy(got.data(), t->data, got.size() * sizeof(float));
  model::RopeScaling& r = c.rope_scaling;
  if (r.factor == 0) r.factor = got.back();
  if (!(r.factor > 0) || !std::isfinite(r.factor))
    fail(f.path(), "tensor 'rope_freqs.weight': factor " + std::to_string(r.factor) +
                       " is not a positive number");
  const std::vector<float> ref = gguf_llama3_rope_factors(c);
  for (size_t i = 0; i < ref.size(); ++i)
    if (!(std::fabs(got[i] - ref[i]) <= 1e-5f * ref[i]))
      fail(f.path(), "tensor 'rope_freqs.weight' element " + std::to_string(i) + " = " +
                         std::to_string(got[i]) + " is not Llama-3 RoPE scaling with factor " +
                         std::to_string(r.factor) + ", low/high_freq_factor " +
                         std::to_string(r.low_freq_factor) + "/" +
                         std::to_string(r.high_freq_factor) + ", original context " +
                         std::to_string(r.original_max_position_embeddings) + " (expected " +
                         std::to_string(ref[i]) + "; other frequency factors are not supported)");
}

}  // namespace

namespace {

// A 2-D tensor kept as stored in the mapping of `f` (whose lifetime the caller's weights hold):
// F16/BF16 and F32 matrices without a row permutation or per-tensor scale are read in place
// (kF16/kBF16/kF32); every other dequantizable type (and those with a permutation or scale)
// stays as ggml blocks (kGgml) that the runtime dequantizes as the fp32 load does (times the
// scale, the permutation undone), so that each row has the fp32 load's bits. The values are
// checked finite here, once, a tile of rows at a time in the file's row order (the fp32
// load's message and index). False: a type that is not dequantizable (the fp32 path then
// reports it).
bool keep_stored(const GgufFile& f, const GgufTensorInfo& t, const std::string& name,
                 model::Tensor& dst, const std::vector<int64_t>& shape, int permute_heads,
                 std::optional<float> scale, int64_t head_dim) {
  const std::optional<GgmlTypeTraits> tr = ggml_type_traits(t.type);
  if (!tr || !tr->dequantizable) return false;
  const int64_t rows = shape[0], cols = shape[1];
  // Marks dst as lying in the mapping and drops the pages the finiteness check read.
  const auto mapped = [&](model::Tensor& d) {
    d.mapped = t.data;
    d.mapped_bytes = t.numel() / tr->block_elems * tr->block_bytes;
    release_file_pages(d);
  };
  const bool plain = permute_heads == 0 && !scale;
  const auto type = static_cast<GgmlType>(t.type);
  if (plain && (type == GgmlType::kF16 || type == GgmlType::kBF16) &&
      reinterpret_cast<uintptr_t>(t.data) % alignof(uint16_t) == 0) {
    // 16-bit matrices stay in the mapping (read a tile at a time by the matmul), as for
    // safetensors.
    const auto* h = reinterpret_cast<const uint16_t*>(t.data);
    check_finite_16bit(h, t.numel(), type == GgmlType::kBF16, f.path(), name);
    dst = model::Tensor{};
    dst.shape = shape;
    dst.dtype = type == GgmlType::kBF16 ? model::WeightDType::kBF16 : model::WeightDType::kF16;
    dst.raw = h;
    mapped(dst);
    return true;
  }
  if (plain && type == GgmlType::kF32 &&
      reinterpret_cast<uintptr_t>(t.data) % alignof(float) == 0) {
    const auto* x = reinterpret_cast<const float*>(t.data);
    check_finite_f32(x, t.numel(), f.path(), name);
    dst = model::Tensor{};
    dst.shape = shape;
    dst.data = x;
    mapped(dst);
    return true;
  }
  // The blocks stay in the mapping (model::WeightDType::kGgml): checked finite in the file's
  // row order first (no permutation yet), then given the permutation.
  dst = model::Tensor{};
  dst.shape = shape;
  dst.dtype = model::WeightDType::kGgml;
  dst.raw = t.data;
  dst.ggml_type = t.type;
  if (scale) dst.ggml_scale = *scale;
  {
    const int64_t tile = model::weight_tile_rows(cols);
    const int64_t tiles = (rows + tile - 1) / tile;
    parallel_for(tiles, 0, [&](int64_t b, int64_t e, int) {
      std::vector<float> buf(static_cast<size_t>(tile * cols));
      for (int64_t i = b; i < e; ++i) {
        const int64_t r0 = i * tile, r1 = std::min(rows, r0 + tile);
        model::dequantize_rows(dst, r0, r1, buf.data());
        check_finite_f32(buf.data(), (r1 - r0) * cols, f.path(), name, r0 * cols);
      }
    });
  }
  if (permute_heads > 0) dst.ggml_permute_head_dim = head_dim;
  mapped(dst);
  return true;
}

}  // namespace

namespace {

// The reading of one GGUF file's tensors into model::Weights: every tensor it reads is marked
// used, so that the end can refuse the ones this loader does not understand.
class GgufWeightReader {
 public:
  GgufWeightReader(const GgufFile& f, const std::shared_ptr<const GgufFile>& keep,
                   model::Weights& w)
      : f_(f), keep_(keep), path_(f.path()), w_(w), c_(w.config) {}

  void mark_used(std::string name) { used_.insert(std::move(name)); }

  // Loads tensor `name` of shape `shape` ([out, in] or [n]; GGUF ne is the reverse) into `dst`;
  // `permute_heads` > 0 undoes llama.cpp's q/k row permutation over that many heads.
  // `stacked`: a 3-D tensor [n, rows, cols] (the experts of a MoE layer) read as the matrix
  // [n * rows, cols], each expert's rows times its scale from `per_expert` (when given; its
  // slices then carry the scale as their ggml_scale, or are scaled here when dequantized).
  // `f32`: always dequantized to owned fp32 (the router).
  void load(const std::string& name, model::Tensor& dst, std::vector<int64_t> shape,
            int permute_heads = 0, bool linear = false, bool f32 = false,
            const std::vector<float>* per_expert = nullptr);

  // The layers, the embeddings and the head, as the config describes them.
  void load_all();

  // Refuses a tensor that nothing read.
  void check_all_used() const;

 private:
  // The F32 scale tensor beside Linear `weight` (".weight" replaced by ".scale") of `n`
  // elements, marked used; its name in `sname`; nullopt when absent.
  std::optional<std::vector<float>> scale_tensor(const std::string& weight, int64_t n,
                                                 std::string& sname);
  // llama.cpp's optional per-tensor scale of a Linear (`blk.N.attn_q.scale`, F32 {1}, the
  // NVFP4 "scale2"): read, checked and marked used.
  std::optional<float> per_tensor_scale(const std::string& weight);
  // The experts' per-expert scales of a stacked tensor (`blk.N.ffn_gate_exps.scale`, F32
  // {n_expert}, 1/gs of each expert as our writer and llama.cpp's build_moe_ffn take them):
  // read, checked finite and marked used; empty when absent.
  std::vector<float> expert_scales(const std::string& weight, int64_t n);
  // A bias of permuted q/k rows back in Hugging Face order.
  void unpermute_bias(model::Tensor& b, int heads);
  void load_layer(int l, bool permute);
  void load_experts(const std::string& p, model::LayerWeights& L);

  const GgufFile& f_;
  const std::shared_ptr<const GgufFile>& keep_;
  const std::string& path_;
  model::Weights& w_;
  const model::Config& c_;
  std::set<std::string, std::less<>> used_;
};

std::optional<std::vector<float>> GgufWeightReader::scale_tensor(const std::string& weight,
                                                                 int64_t n, std::string& sname) {
  sname = weight.substr(0, weight.size() - 7) + ".scale";  // ".weight"
  const GgufTensorInfo* s = f_.find_tensor(sname);
  if (!s) return std::nullopt;
  used_.insert(sname);
  const std::vector<int64_t> want = {n};
  if (s->type != static_cast<uint32_t>(GgmlType::kF32) || s->ne != want)
    fail(path_, "tensor '" + sname + "': expected F32 ne " + dims(want) + ", got " +
                    ggml_type_name(s->type) + " ne " + dims(s->ne));
  std::vector<float> v(static_cast<size_t>(n));
  std::memcpy(v.data(), s->data, v.size() * sizeof(float));
  return v;
}

std::optional<float> GgufWeightReader::per_tensor_scale(const std::string& weight) {
  std::string sname;
  const std::optional<std::vector<float>> s = scale_tensor(weight, 1, sname);
  if (!s) return std::nullopt;
  const float v = (*s)[0];
  if (!std::isfinite(v))
    fail(path_, "tensor '" + sname + "' = " + std::to_string(v) + " is not finite");
  return v;
}

std::vector<float> GgufWeightReader::expert_scales(const std::string& weight, int64_t n) {
  std::string sname;
  std::optional<std::vector<float>> s = scale_tensor(weight, n, sname);
  if (!s) return {};
  const std::vector<float>& v = *s;
  for (int64_t e = 0; e < n; ++e)
    if (!std::isfinite(v[static_cast<size_t>(e)]))
      fail(path_, "tensor '" + sname + "' [" + std::to_string(e) +
                      "] = " + std::to_string(v[static_cast<size_t>(e)]) + " is not finite");
  return std::move(*s);
}

void GgufWeightReader::load(const std::string& name, model::Tensor& dst, std::vector<int64_t> shape,
                            int permute_heads, bool linear, bool f32,
                            const std::vector<float>* per_expert) {
  const GgufTensorInfo* t = f_.find_tensor(name);
  if (!t) fail(path_, "tensor '" + name + "' is missing");
  used_.insert(name);
  const std::optional<float> scale = linear ? per_tensor_scale(name) : std::nullopt;
  const bool scaled = per_expert && !per_expert->empty();
  const std::vector<int64_t> want(shape.rbegin(), shape.rend());
  if (t->ne != want)
    fail(path_, "tensor '" + name + "': expected ne " + dims(want) + ", got " + dims(t->ne));
  if (shape.size() == 3) shape = {shape[0] * shape[1], shape[2]};
  // Scaled experts stay in the mapping as ggml blocks (the slices' ggml_scale; "1" here
  // only keeps the 16-bit/fp32 shortcuts out).
  if (keep_ && !f32 && shape.size() == 2 &&
      keep_stored(f_, *t, name, dst, shape, permute_heads,
                  scaled ? std::optional<float>(1.0f) : scale, c_.head_dim)) {
    w_.storage.push_back(std::const_pointer_cast<GgufFile>(keep_));
    return;
  }
  auto v = std::make_shared<std::vector<float>>(f_.dequantize(*t));
  const int64_t numel = t->numel();
  if (static_cast<int64_t>(v->size()) != numel)
    fail(path_, "tensor '" + name + "': dequantized to " + std::to_string(v->size()) +
                    " values, expected " + std::to_string(numel));
  if (scale) {  // llama.cpp multiplies the matmul output: the same as w * scale in fp32
    const float sc = *scale;
    for (float& x : *v) x *= sc;
  }
  if (scaled) {
    const size_t per = v->size() / per_expert->size();
    for (size_t i = 0; i < v->size(); ++i) (*v)[i] *= (*per_expert)[i / per];
  }
  check_finite_f32(v->data(), numel, path_, name);
  if (permute_heads > 0) {
    float* d = w_.alloc(dst, shape);
    gguf_unpermute_qk_rows(v->data(), d, permute_heads, c_.head_dim, shape[1]);
    return;
  }
  dst.shape = std::move(shape);
  dst.data = v->data();
  w_.storage.push_back(std::move(v));
}

void GgufWeightReader::unpermute_bias(model::Tensor& b, int heads) {
  const std::vector<float> x = model::to_f32(b);
  float* d = w_.alloc(b, {static_cast<int64_t>(x.size())});
  gguf_unpermute_qk_rows(x.data(), d, heads, c_.head_dim, 1);  // rows of one column
}

// llama.cpp's MoE layout: the router ffn_gate_inp (ne [D, E]: [E, D], kept fp32) and every
// expert's Linear stacked in one 3-D tensor, ffn_{gate,up}_exps ne [D, I, E] and ffn_down_exps
// ne [I, D, E] (expert e: rows [e*I, (e+1)*I) of [E*I, D], resp. [e*D, (e+1)*D) of [E*D, I]).
void GgufWeightReader::load_experts(const std::string& p, model::LayerWeights& L) {
  const int64_t D = c_.dim, E = c_.n_experts, I = c_.moe_hidden_dim;
  load(p + "ffn_gate_inp.weight", L.router, {E, D}, 0, false, true);
  model::Tensor gate, up, down;
  const std::vector<float> sg = expert_scales(p + "ffn_gate_exps.weight", E),
                           su = expert_scales(p + "ffn_up_exps.weight", E),
                           sd = expert_scales(p + "ffn_down_exps.weight", E);
  load(p + "ffn_gate_exps.weight", gate, {E, I, D}, 0, false, false, &sg);
  load(p + "ffn_up_exps.weight", up, {E, I, D}, 0, false, false, &su);
  load(p + "ffn_down_exps.weight", down, {E, D, I}, 0, false, false, &sd);
  L.experts.resize(static_cast<size_t>(E));
  // A slice kept as ggml blocks takes its expert's scale; dequantized ones were scaled.
  const auto slice = [&](const model::Tensor& t, const std::vector<float>& s, int64_t e,
                         int64_t rows) {
    model::Tensor x = tensor_rows(t, e * rows, (e + 1) * rows);
    if (!s.empty() && x.dtype == model::WeightDType::kGgml)
      x.ggml_scale = s[static_cast<size_t>(e)];
    return x;
  };
  for (int64_t e = 0; e < E; ++e) {
    model::LayerWeights::Expert& ex = L.experts[static_cast<size_t>(e)];
    ex.w1 = slice(gate, sg, e, I);
    ex.w3 = slice(up, su, e, I);
    ex.w2 = slice(down, sd, e, D);
  }
}

// `permute`: q/k rows are in llama.cpp's permuted order.
void GgufWeightReader::load_layer(int l, bool permute) {
  const int64_t D = c_.dim, H = c_.hidden_dim, hd = c_.head_dim;
  const int64_t qd = int64_t{c_.n_heads} * hd, kvd = int64_t{c_.n_kv_heads} * hd;
  model::LayerWeights& L = w_.layers[static_cast<size_t>(l)];
  const std::string p = "blk." + std::to_string(l) + ".";
  load(p + "attn_norm.weight", L.attn_norm, {D});
  load(p + "attn_q.weight", L.wq, {qd, D}, permute ? c_.n_heads : 0, true);
  load(p + "attn_k.weight", L.wk, {kvd, D}, permute ? c_.n_kv_heads : 0, true);
  load(p + "attn_v.weight", L.wv, {kvd, D}, 0, true);
  load(p + "attn_output.weight", L.wo, {D, qd}, 0, true);
  if (c_.qkv_bias) {
    load(p + "attn_q.bias", L.bq, {qd});
    load(p + "attn_k.bias", L.bk, {kvd});
    load(p + "attn_v.bias", L.bv, {kvd});
    if (permute) {
      unpermute_bias(L.bq, c_.n_heads);
      unpermute_bias(L.bk, c_.n_kv_heads);
    }
  }
  if (c_.qk_norm) {
    load(p + "attn_q_norm.weight", L.q_norm, {hd});
    load(p + "attn_k_norm.weight", L.k_norm, {hd});
  }
  load(p + "ffn_norm.weight", L.ffn_norm, {D});
  if (c_.moe_layer(l)) {
    load_experts(p, L);
    return;
  }
  load(p + "ffn_gate.weight", L.w1, {H, D}, 0, true);
  load(p + "ffn_up.weight", L.w3, {H, D}, 0, true);
  load(p + "ffn_down.weight", L.w2, {D, H}, 0, true);
}

void GgufWeightReader::load_all() {
  const int64_t D = c_.dim, V = c_.vocab_size;
  // llama.cpp's converter permutes q/k for its llama architecture, Mixtral included (and our
  // writer for a Qwen2 model stored as llama).
  const bool permute = gguf_qk_permuted(f_);
  load("token_embd.weight", w_.tok_embeddings, {V, D});
  w_.layers.resize(static_cast<size_t>(c_.n_layers));
  for (int l = 0; l < c_.n_layers; ++l) load_layer(l, permute);
  load("output_norm.weight", w_.final_norm, {D});
  if (c_.tied_embeddings)
    w_.lm_head = w_.tok_embeddings;
  else
    load("output.weight", w_.lm_head, {V, D});
}

void GgufWeightReader::check_all_used() const {
  const std::vector<GgufTensorInfo>& all = f_.tensors();
  for (size_t i = 0; i < all.size(); ++i)
    if (!used_.contains(all[i].name))
      fail(path_, "tensor " + std::to_string(i) + " '" + all[i].name + "' is not used by the " +
                      *f_.get_string("general.architecture") +
                      " architecture as this loader implements it (not supported)");
}

}  // namespace

model::Weights load_gguf_weights(const GgufFile& f, const std::shared_ptr<const GgufFile>& keep) {
  if (keep && keep.get() != &f)
    throw std::invalid_argument("load_gguf_weights: `keep` must own the file being read");
  model::Weights w;
  w.config = gguf_model_config(
      f.metadata(), [&](std::string_view n) { return f.find_tensor(n) != nullptr; }, f.path());
  GgufWeightReader reader(f, keep, w);
  if (w.config.rope_scaling.type == model::RopeType::kLlama3) {
    read_rope_freqs(f, w.config);
    reader.mark_used("rope_freqs.weight");
  }
  reader.load_all();
  reader.check_all_used();
  return w;
}

bool gguf_qk_permuted(const GgufFile& f) {
  return f.get_string("general.architecture") == std::optional<std::string>("llama");
}

model::Weights load_gguf(const std::string& path) {
  const auto f = std::make_shared<const GgufFile>(GgufFile::open(path));
  return load_gguf_weights(*f, f);
}

std::unique_ptr<model::HfBpeTokenizer> load_gguf_tokenizer(const GgufFile& f) {
  if (!gguf_has_tokenizer(f.metadata())) return nullptr;
  model::BpeSpec spec = gguf_tokenizer_spec(f.metadata(), f.path());
  try {
    return std::make_unique<model::HfBpeTokenizer>(std::move(spec));
  } catch (const std::exception& e) {
    fail(f.path(), e.what());
  }
}

std::unique_ptr<model::HfBpeTokenizer> load_gguf_tokenizer(const std::string& path) {
  return load_gguf_tokenizer(GgufFile::open(path));
}

}  // namespace scalesweep::io
