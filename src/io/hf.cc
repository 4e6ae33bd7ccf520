// Hugging Face model directories: loader and writer (include/scalesweep/io/hf.h).
#include "scalesweep/io/hf.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "io/atomic_file.h"
#include "io/expert_tensors.h"
#include "io/weight_checks.h"
#include "scalesweep/format/minifloat.h"
#include "scalesweep/io/compressed_tensors.h"
#include "scalesweep/io/hf_config.h"
#include "scalesweep/io/hf_names.h"
#include "scalesweep/io/safetensors.h"
#include "scalesweep/model/weight.h"

namespace scalesweep::io {

namespace {

using nlohmann::json;
using nlohmann::ordered_json;
namespace fs = std::filesystem;

[[noreturn]] void fail(const std::string& where, const std::string& what) {
  throw std::runtime_error(where + ": " + what);
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) fail(p.string(), "cannot open file");
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) fail(p.string(), "read error");
  return ss.str();
}

int get_int(const json& j, const char* key, const std::string& name, int dflt, bool required) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (required) fail(name, std::string("missing field '") + key + "'");
    return dflt;
  }
  if (!it->is_number_integer()) fail(name, std::string("field '") + key + "' is not an integer");
  const int64_t v = it->get<int64_t>();
  if (v < 0 || v > (int64_t{1} << 30))
    fail(name, std::string("field '") + key + "' = " + std::to_string(v) + " is out of range");
  return static_cast<int>(v);
}

double get_num(const json& j, const char* key, const std::string& name, double dflt) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  if (!it->is_number()) fail(name, std::string("field '") + key + "' is not a number");
  return it->get<double>();
}

// bos/eos ids: an int, a list (the first is used) or null (-1).
int token_id_field(const json& j, const char* key, int dflt) {
  auto it = j.find(key);
  if (it == j.end()) return dflt;
  if (it->is_number_integer()) return it->get<int>();
  if (it->is_array() && !it->empty() && (*it)[0].is_number_integer()) return (*it)[0].get<int>();
  return -1;
}

// One of the keys `allowed` or a refusal naming the key.
void only_keys(const json& o, const std::string& name, const std::string& where,
               std::initializer_list<const char*> allowed) {
  for (auto it = o.begin(); it != o.end(); ++it) {
    bool ok = false;
    for (const char* k : allowed) ok = ok || it.key() == k;
    if (!ok) {
      std::string list;
      for (const char* k : allowed) list += (list.empty() ? "" : ", ") + std::string(k);
      fail(name, where + " has key '" + it.key() + "', which this runtime does not implement " +
                     "(known for this rope type: " + list + ")");
    }
  }
}

double need_num(const json& o, const char* key, const std::string& name, const std::string& where) {
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) fail(name, where + " needs '" + key + "'");
  if (!it->is_number()) fail(name, where + "." + key + " is not a number");
  const double v = it->get<double>();
  if (!std::isfinite(v)) fail(name, where + "." + key + " is not finite");
  return v;
}

// The rope dict: rope_parameters (5.x) or rope_scaling (4.x), whichever is present (they must
// agree when both are); null when neither. `where` names the one used.
const json* rope_dict(const json& j, const std::string& name, std::string& where) {
  auto obj = [&](const char* key) -> const json* {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return nullptr;
    if (!it->is_object()) fail(name, std::string("field '") + key + "' is not an object");
    return &*it;
  };
  const json* scaling = obj("rope_scaling");
  const json* params = obj("rope_parameters");
  if (scaling && params && *scaling != *params) {
    // transformers 5 reads rope_scaling over rope_parameters; 4.x ignores rope_parameters.
    // Either would be a guess when they differ, except that rope_parameters may repeat
    // rope_theta, which rope_scaling (4.x) never holds.
    json a = *scaling, b = *params;
    a.erase("rope_theta");
    b.erase("rope_theta");
    if (a != b)
      fail(name, "rope_scaling " + scaling->dump() + " and rope_parameters " + params->dump() +
                     " disagree");
  }
  where = params ? "rope_parameters" : "rope_scaling";
  return params ? params : scaling;
}

// rope_theta: top level and/or inside the rope dict `rs`; both present must agree. Also
// refuses a partial_rotary_factor other than 1 in either place.
float rope_theta(const json& j, const json* rs, const std::string& where, const std::string& name) {
  std::optional<double> theta;
  for (const json* o : {&j, rs}) {
    if (!o) continue;
    auto it = o->find("rope_theta");
    if (it == o->end() || it->is_null()) continue;
    if (!it->is_number())
      fail(name, std::string(o == &j ? "" : where + ".") + "rope_theta is not a number");
    const double v = it->get<double>();
    if (theta && *theta != v)
      fail(name, "rope_theta " + std::to_string(*theta) + " (top level) and " + where +
                     ".rope_theta " + std::to_string(v) + " disagree");
    theta = v;
  }
  // transformers' default_theta when neither says (LlamaConfig, Qwen2Config, Qwen3Config).
  const double th = theta.value_or(10000.0);
  if (!(th > 0) || !std::isfinite(th)) fail(name, "rope_theta must be positive and finite");

  for (const json* o : {&j, rs}) {
    if (!o) continue;
    auto it = o->find("partial_rotary_factor");
    if (it == o->end() || it->is_null()) continue;
    if (!it->is_number() || it->get<double>() != 1.0)
      fail(name, std::string(o == &j ? "" : where + ".") + "partial_rotary_factor = " + it->dump() +
                     " is not supported (Llama/Qwen rotate the whole head; only 1.0 is accepted)");
  }
  return static_cast<float>(th);
}

// The rope dict's rope_type (or the older "type"; both present must agree); "default" without.
std::string rope_type(const json* rs, const std::string& where, const std::string& name) {
  if (!rs) return "default";
  const json* t1 = rs->contains("rope_type") ? &(*rs)["rope_type"] : nullptr;
  const json* t2 = rs->contains("type") ? &(*rs)["type"] : nullptr;
  for (const json* t : {t1, t2})
    if (t && !t->is_string()) fail(name, where + ".rope_type is not a string");
  if (t1 && t2 && *t1 != *t2)
    fail(name, where + ".rope_type " + t1->dump() + " and " + where + ".type " + t2->dump() +
                   " disagree");
  return t1 || t2 ? (t1 ? t1 : t2)->get<std::string>() : "default";
}

// The fields of one rope dict `rs` (of config `j`), `w` naming it and its type in messages.
struct RopeFields {
  const json& j;
  const json& rs;
  const std::string& name;
  const std::string& w;
  int max_seq_len;

  // A top-level original_max_position_embeddings (Phi-3 style) takes priority in
  // transformers; it must agree with the one in the rope dict when both exist.
  int orig_max() const {
    std::optional<int64_t> v;
    for (const json* o : {&rs, &j}) {
      auto it = o->find("original_max_position_embeddings");
      if (it == o->end() || it->is_null()) continue;
      if (!it->is_number_integer() || it->get<int64_t>() <= 0 ||
          it->get<int64_t>() > (int64_t{1} << 30))
        fail(name,
             "original_max_position_embeddings = " + it->dump() + " is not a positive integer");
      if (v && *v != it->get<int64_t>())
        fail(name, w + ": original_max_position_embeddings " + std::to_string(*v) +
                       " and the top-level one " + it->dump() + " disagree");
      v = it->get<int64_t>();
    }
    // transformers 5 (standardize_rope_params): max_position_embeddings when absent.
    return static_cast<int>(v.value_or(max_seq_len));
  }
  float factor() const {
    const double f = need_num(rs, "factor", name, w);
    if (!(f > 0)) fail(name, w + ": factor must be positive");
    return static_cast<float>(f);
  }
  std::optional<double> opt_num(const char* k) const {
    if (!rs.contains(k) || rs[k].is_null()) return std::nullopt;
    return need_num(rs, k, name, w);
  }
};

// Llama-3 scaling: factor, low/high_freq_factor and the original context.
void parse_llama3_rope(const RopeFields& p, model::RopeScaling& r) {
  only_keys(p.rs, p.name, p.w,
            {"rope_type", "type", "rope_theta", "partial_rotary_factor", "factor",
             "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"});
  r.type = model::RopeType::kLlama3;
  r.factor = p.factor();
  r.low_freq_factor = static_cast<float>(need_num(p.rs, "low_freq_factor", p.name, p.w));
  r.high_freq_factor = static_cast<float>(need_num(p.rs, "high_freq_factor", p.name, p.w));
  if (!p.rs.contains("original_max_position_embeddings") &&
      !p.j.contains("original_max_position_embeddings"))
    fail(p.name, p.w + " needs 'original_max_position_embeddings'");
  r.original_max_position_embeddings = p.orig_max();
  if (!(r.low_freq_factor > 0) || !(r.high_freq_factor > r.low_freq_factor))
    fail(p.name, p.w + " needs 0 < low_freq_factor < high_freq_factor");
}

// YaRN: factor (or max/original), the attention factor as transformers derives it, betas.
void parse_yarn_rope(const RopeFields& p, model::RopeScaling& r) {
  const json& rs = p.rs;
  only_keys(rs, p.name, p.w,
            {"rope_type", "type", "rope_theta", "partial_rotary_factor", "factor",
             "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow",
             "mscale", "mscale_all_dim", "truncate"});
  r.type = model::RopeType::kYarn;
  r.original_max_position_embeddings = p.orig_max();
  // transformers 5: factor = max_position_embeddings / original when factor is null.
  const double f = rs.contains("factor") && !rs["factor"].is_null()
                       ? need_num(rs, "factor", p.name, p.w)
                       : static_cast<double>(p.max_seq_len) / r.original_max_position_embeddings;
  if (!(f > 0)) fail(p.name, p.w + ": factor must be positive");
  r.factor = static_cast<float>(f);
  auto mscale = [](double scale, double m) {
    return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0;
  };
  const auto af = p.opt_num("attention_factor"), ms = p.opt_num("mscale"),
             msa = p.opt_num("mscale_all_dim");
  double att;
  if (af) {
    att = *af;
  } else if (ms && msa && *ms != 0 && *msa != 0) {
    att = mscale(f, *ms) / mscale(f, *msa);
  } else {
    att = mscale(f, 1);
  }
  if (!(att > 0)) fail(p.name, p.w + ": attention_factor must be positive");
  r.attention_factor = static_cast<float>(att);
  // `beta_fast or 32`: a 0 or null falls back to the default, as in transformers.
  const auto bf = p.opt_num("beta_fast"), bs = p.opt_num("beta_slow");
  r.beta_fast = static_cast<float>(bf && *bf != 0 ? *bf : 32);
  r.beta_slow = static_cast<float>(bs && *bs != 0 ? *bs : 1);
  if (rs.contains("truncate") && !rs["truncate"].is_null()) {
    if (!rs["truncate"].is_boolean()) fail(p.name, p.w + ".truncate is not a boolean");
    r.truncate = rs["truncate"].get<bool>();
  }
}

// RoPE, read completely: rope_theta at the top level (4.x) or in rope_parameters (5.x),
// rope_scaling (4.x) / rope_parameters (5.x) with rope_type (or the older "type"), and
// partial_rotary_factor. Implemented: default, linear, llama3, yarn, dynamic, as transformers'
// modeling_rope_utils.py computes them; anything else is refused by name.
void parse_rope(const json& j, const std::string& name, model::Config& c) {
  std::string where;
  const json* rs = rope_dict(j, name, where);
  c.rope_theta = rope_theta(j, rs, where, name);
  const std::string type = rope_type(rs, where, name);
  const std::string w = where + " (rope_type '" + type + "')";
  model::RopeScaling& r = c.rope_scaling;
  r = model::RopeScaling{};
  if (type == "default") {
    if (rs) only_keys(*rs, name, w, {"rope_type", "type", "rope_theta", "partial_rotary_factor"});
    return;
  }
  if (type != "linear" && type != "dynamic" && type != "llama3" && type != "yarn")
    fail(name, "unsupported " + where + " rope_type '" + type +
                   "' (supported: default, linear, llama3, yarn, dynamic)");
  const RopeFields p{j, *rs, name, w, c.max_seq_len};
  if (type == "llama3") {
    parse_llama3_rope(p, r);
  } else if (type == "yarn") {
    parse_yarn_rope(p, r);
  } else {
    only_keys(*rs, name, w, {"rope_type", "type", "rope_theta", "partial_rotary_factor", "factor"});
    r.type = type == "linear" ? model::RopeType::kLinear : model::RopeType::kDynamic;
    r.factor = p.factor();
  }
}

// Qwen2/Qwen3 configs carry sliding_window even when it is off (use_sliding_window = false);
// a window that actually applies (on a layer >= max_window_layers, or a "sliding_attention"
// entry of layer_types, and narrower than max_position_embeddings) is refused: the runtime
// attends over the whole causal prefix. LlamaForCausalLM never reads sliding_window.
void check_sliding_window(const json& j, const std::string& name, const model::Config& c) {
  if (c.arch == model::Arch::kLlama) return;
  if (c.arch == model::Arch::kMixtral) {  // MixtralConfig: a window whenever it is set
    auto sw = j.find("sliding_window");
    if (sw == j.end() || sw->is_null()) return;
    if (!sw->is_number_integer()) fail(name, "field 'sliding_window' is not an integer");
    if (sw->get<int64_t>() < c.max_seq_len)
      fail(name, "sliding_window " + sw->dump() + " < max_position_embeddings " +
                     std::to_string(c.max_seq_len) +
                     " applies a window to every layer; sliding-window attention is not supported");
    return;
  }
  auto it = j.find("use_sliding_window");
  const bool use = it != j.end() && !it->is_null() && it->get<bool>();
  if (!use) return;
  auto sw = j.find("sliding_window");
  if (sw == j.end() || sw->is_null()) return;  // transformers: no window at all
  if (!sw->is_number_integer()) fail(name, "field 'sliding_window' is not an integer");
  const int64_t window = sw->get<int64_t>();
  int first = -1;  // first layer with a sliding window
  auto lt = j.find("layer_types");
  if (lt != j.end() && !lt->is_null()) {
    if (!lt->is_array() || static_cast<int>(lt->size()) != c.n_layers)
      fail(name, "field 'layer_types' is not a list of num_hidden_layers entries");
    for (int l = 0; l < c.n_layers && first < 0; ++l) {
      const json& e = (*lt)[static_cast<size_t>(l)];
      if (!e.is_string()) fail(name, "layer_types[" + std::to_string(l) + "] is not a string");
      if (e.get<std::string>() == "sliding_attention") {
        first = l;
      } else if (e.get<std::string>() != "full_attention") {
        fail(name, "layer_types[" + std::to_string(l) + "] = " + e.dump() + " is not supported");
      }
    }
  } else if (c.arch == model::Arch::kQwen3Moe) {
    first = 0;  // Qwen3MoeConfig: every layer slides (no max_window_layers)
  } else {
    // Qwen2Config/Qwen3Config: layers i >= max_window_layers slide (default 28).
    const int mwl = get_int(j, "max_window_layers", name, 28, false);
    if (mwl < c.n_layers) first = mwl;
  }
  if (first >= 0 && window < c.max_seq_len)
    fail(name, "use_sliding_window = true with sliding_window " + std::to_string(window) +
                   " < max_position_embeddings " + std::to_string(c.max_seq_len) +
                   " applies a window from layer " + std::to_string(first) +
                   "; sliding-window attention is not supported");
}

// Fields of other mixture-of-experts families that change the math when set (shared experts,
// grouped or biased routing, scaled routing weights, leading dense layers): refused by name on
// a Qwen3-MoE or Mixtral config unless they hold their neutral value (null, or `neutral`).
struct MoeField {
  const char* key;
  const char* neutral;  // JSON text of the value that changes nothing
  const char* what;
};
constexpr MoeField kForeignMoeFields[] = {
    {"shared_expert_intermediate_size", "0", "shared experts"},
    {"n_shared_experts", "0", "shared experts"},
    {"num_shared_experts", "0", "shared experts"},
    {"moe_shared_expert_intermediate_size", "0", "shared experts"},
    {"routed_scaling_factor", "1", "scaled routing weights"},
    {"scoring_func", "\"softmax\"", "a router scoring function other than softmax"},
    {"topk_method", "\"greedy\"", "grouped top-k routing"},
    {"n_group", "1", "grouped top-k routing"},
    {"topk_group", "1", "grouped top-k routing"},
    {"first_k_dense_replace", "0", "leading dense layers"},
    {"moe_layer_freq", "1", "a MoE layer frequency"},
    {"router_bias", "false", "a router bias"},
    {"moe_router_bias", "false", "a router bias"},
};

// The mixture-of-experts fields of a Qwen3-MoE (Qwen3MoeConfig) or Mixtral (MixtralConfig)
// config.json, with transformers' defaults. Qwen3-MoE: num_experts (written as
// num_local_experts by transformers 5: both are read and must agree), num_experts_per_tok,
// moe_intermediate_size, norm_topk_prob, decoder_sparse_step, mlp_only_layers. Mixtral:
// num_local_experts, num_experts_per_tok, the experts' width intermediate_size, and always
// renormalised top-k weights (a norm_topk_prob = false, a decoder_sparse_step other than 1 or
// mlp_only_layers, which MixtralForCausalLM ignores, are refused as contradicting it);
// router_jitter_noise only acts in training and is ignored.
void parse_moe(const json& j, const std::string& name, model::Config& c) {
  const bool qwen = c.arch == model::Arch::kQwen3Moe;
  for (const MoeField& f : kForeignMoeFields) {
    auto it = j.find(f.key);
    if (it == j.end() || it->is_null() || *it == json::parse(f.neutral)) continue;
    if (it->is_boolean() && !it->get<bool>()) continue;
    fail(name, std::string("field '") + f.key + "' = " + it->dump() + " (" + f.what +
                   ") is not supported for " + std::string(model::kArchClassNames.name(c.arch)));
  }
  // num_experts and num_local_experts name one field (the configs' attribute_map).
  const int dflt_experts = qwen ? 128 : 8;
  const int a = get_int(j, "num_experts", name, -1, false);
  const int b = get_int(j, "num_local_experts", name, -1, false);
  if (a >= 0 && b >= 0 && a != b)
    fail(name, "num_experts " + std::to_string(a) + " and num_local_experts " + std::to_string(b) +
                   " disagree");
  c.n_experts = a >= 0 ? a : b >= 0 ? b : dflt_experts;
  c.experts_per_tok = get_int(j, "num_experts_per_tok", name, qwen ? 8 : 2, false);
  c.moe_hidden_dim = qwen ? get_int(j, "moe_intermediate_size", name, 768, false) : c.hidden_dim;
  auto flag = [&](const char* key, bool dflt) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return dflt;
    if (!it->is_boolean()) fail(name, std::string("field '") + key + "' is not a boolean");
    return it->get<bool>();
  };
  c.norm_topk_prob = flag("norm_topk_prob", !qwen);
  if (!qwen && !c.norm_topk_prob)
    fail(name,
         "norm_topk_prob = false: MixtralForCausalLM always renormalises the top-k routing "
         "weights (the field would be ignored)");
  c.moe_sparse_step = get_int(j, "decoder_sparse_step", name, 1, false);
  if (c.moe_sparse_step < 1)
    fail(name, "decoder_sparse_step " + std::to_string(c.moe_sparse_step) + " must be at least 1");
  c.dense_layers.clear();
  if (auto it = j.find("mlp_only_layers"); it != j.end() && !it->is_null()) {
    if (!it->is_array()) fail(name, "field 'mlp_only_layers' is not a list of layer indices");
    for (size_t i = 0; i < it->size(); ++i) {
      const json& e = (*it)[i];
      if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() >= c.n_layers)
        fail(name, "mlp_only_layers[" + std::to_string(i) + "] = " + e.dump() +
                       " is not a layer index in [0, " + std::to_string(c.n_layers) + ")");
      c.dense_layers.push_back(e.get<int>());
    }
  }
  if (!qwen && (c.moe_sparse_step != 1 || !c.dense_layers.empty()))
    fail(name, std::string(c.moe_sparse_step != 1 ? "decoder_sparse_step" : "mlp_only_layers") +
                   " is set, but MixtralForCausalLM makes every layer a mixture of experts "
                   "(the field would be ignored)");
  if (c.n_experts == 0) {  // Qwen3MoeDecoderLayer: dense feed-forward everywhere
    c.experts_per_tok = 0;
    c.moe_hidden_dim = 0;
    c.dense_layers.clear();
    c.moe_sparse_step = 1;
    return;
  }
  if (c.experts_per_tok < 1 || c.experts_per_tok > c.n_experts)
    fail(name, "num_experts_per_tok " + std::to_string(c.experts_per_tok) + " is outside [1, " +
                   std::to_string(c.n_experts) + "] (the number of experts)");
  if (c.moe_hidden_dim <= 0)
    fail(name,
         std::string(qwen ? "moe_intermediate_size" : "intermediate_size") + " must be positive");
}

}  // namespace

model::Config parse_hf_config(std::string_view text, const std::string& name) {
  json j;
  try {
    j = json::parse(text);
  } catch (const std::exception& e) {
    fail(name, std::string("invalid JSON: ") + e.what());
  }
  if (!j.is_object()) fail(name, "not a JSON object");
  model::Config c;
  std::string arch;
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty() &&
      j["architectures"][0].is_string())
    arch = j["architectures"][0].get<std::string>();
  if (j.contains("model_type") && !j["model_type"].is_string() && !j["model_type"].is_null())
    fail(name, "field 'model_type' is " + j["model_type"].dump() + ", not a string");
  const std::string type = j.contains("model_type") && j["model_type"].is_string()
                               ? j["model_type"].get<std::string>()
                               : "";
  // The architecture class names the model; model_type only when no class is given.
  const std::optional<model::Arch> a =
      arch.empty() ? model::kArchNames.find(type) : model::kArchClassNames.find(arch);
  if (!a)
    fail(name, "unsupported architecture '" + (arch.empty() ? type : arch) +
                   "' (supported: " + model::kArchClassNames.accepted() + ")");
  c.arch = *a;
  try {
    c.dim = get_int(j, "hidden_size", name, 0, true);
    c.hidden_dim = get_int(j, "intermediate_size", name, 0, true);
    c.n_layers = get_int(j, "num_hidden_layers", name, 0, true);
    c.n_heads = get_int(j, "num_attention_heads", name, 0, true);
    // Absent: num_attention_heads for LlamaConfig, 32 for Qwen2Config/Qwen3Config, 4 for
    // Qwen3MoeConfig, 8 for MixtralConfig (their declared defaults, kept by transformers unless
    // the field is null).
    const bool kv_null = j.contains("num_key_value_heads") && j["num_key_value_heads"].is_null();
    const int dflt_kv = c.arch == model::Arch::kLlama || kv_null ? c.n_heads
                        : c.arch == model::Arch::kQwen3Moe       ? 4
                        : c.arch == model::Arch::kMixtral        ? 8
                                                                 : 32;
    c.n_kv_heads = get_int(j, "num_key_value_heads", name, dflt_kv, false);
    c.vocab_size = get_int(j, "vocab_size", name, 0, true);
    if (c.dim <= 0 || c.hidden_dim <= 0 || c.n_layers <= 0 || c.n_heads <= 0 || c.n_kv_heads <= 0 ||
        c.vocab_size <= 0)
      fail(name,
           "hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, "
           "num_key_value_heads and vocab_size must be positive");
    if (c.n_heads % c.n_kv_heads != 0)
      fail(name, "num_attention_heads " + std::to_string(c.n_heads) +
                     " is not a multiple of num_key_value_heads " + std::to_string(c.n_kv_heads));
    // Absent: hidden_size / heads (Llama, Qwen2, Qwen3-MoE, Mixtral), 128 (Qwen3Config's
    // declared default).
    const int dflt_hd = c.arch == model::Arch::kQwen3 ? 128
                        : c.dim % c.n_heads == 0      ? c.dim / c.n_heads
                                                      : 0;
    c.head_dim = get_int(j, "head_dim", name, dflt_hd, false);
    if (c.head_dim <= 0 || c.head_dim % 2 != 0)
      fail(name, "head_dim " + std::to_string(c.head_dim) +
                     " is invalid (must be positive and even; hidden_size / heads when absent)");
    // transformers' per-architecture defaults (LlamaConfig 2048, Qwen2Config/Qwen3Config/
    // Qwen3MoeConfig 32768, MixtralConfig 4096 * 32).
    const bool mixtral = c.arch == model::Arch::kMixtral;
    c.max_seq_len = get_int(j, "max_position_embeddings", name,
                            c.arch == model::Arch::kLlama ? 2048
                            : mixtral                     ? 4096 * 32
                                                          : 32768,
                            false);
    if (c.max_seq_len <= 0) fail(name, "max_position_embeddings must be positive");
    c.norm_eps = static_cast<float>(get_num(j, "rms_norm_eps", name, mixtral ? 1e-5 : 1e-6));
    if (!(c.norm_eps > 0) || !std::isfinite(c.norm_eps))
      fail(name, "rms_norm_eps must be positive");
    parse_rope(j, name, c);
    // MixtralConfig's default_theta (the others': 10000).
    if (mixtral && !j.contains("rope_theta") &&
        !(j.contains("rope_parameters") && j["rope_parameters"].is_object() &&
          j["rope_parameters"].contains("rope_theta")) &&
        !(j.contains("rope_scaling") && j["rope_scaling"].is_object() &&
          j["rope_scaling"].contains("rope_theta")))
      c.rope_theta = 1e6f;
    check_sliding_window(j, name, c);
    const std::string act = j.value("hidden_act", std::string("silu"));
    if (act != "silu") fail(name, "unsupported hidden_act '" + act + "' (only silu)");
    if (j.value("mlp_bias", false)) fail(name, "mlp_bias = true is not supported");
    const bool attn_bias = j.value("attention_bias", false);
    if ((c.arch == model::Arch::kLlama || mixtral) && attn_bias)
      fail(name, "attention_bias = true is not supported for " +
                     std::string(mixtral ? "Mixtral" : "Llama") + " (o_proj bias)");
    c.qkv_bias = c.arch == model::Arch::kQwen2;
    const bool qwen3 = c.arch == model::Arch::kQwen3 || c.arch == model::Arch::kQwen3Moe;
    if (qwen3 && attn_bias)
      fail(name, "attention_bias = true is not supported for " +
                     std::string(c.arch == model::Arch::kQwen3 ? "Qwen3" : "Qwen3-MoE") +
                     " (o_proj bias)");
    c.qk_norm = qwen3;
    if (c.arch == model::Arch::kQwen3Moe || mixtral) parse_moe(j, name, c);
    // False by default for LlamaConfig, Qwen2Config and Qwen3Config (transformers 4.x and 5.x).
    c.tied_embeddings = j.value("tie_word_embeddings", false);
    for (const char* key : {"torch_dtype", "dtype"}) {
      auto it = j.find(key);
      if (it == j.end() || it->is_null()) continue;
      const std::string d = it->is_string() ? it->get<std::string>() : it->dump();
      if (!dtype_of_torch_dtype(d))
        fail(name, std::string("field '") + key + "' = '" + d +
                       "' is not a float dtype (float32, bfloat16, float16, float64)");
    }
    // MixtralConfig declares <s> 1 and </s> 2; the others none.
    c.bos_token_id = token_id_field(j, "bos_token_id", mixtral ? 1 : -1);
    c.eos_token_id = token_id_field(j, "eos_token_id", mixtral ? 2 : -1);
  } catch (const json::exception& e) {
    fail(name, std::string("malformed config: ") + e.what());
  }
  return c;
}

namespace {

// Tensor lookup over one or several safetensors shards.
class ShardSet {
 public:
  explicit ShardSet(const fs::path& dir) : dir_(dir) {
    const fs::path single = dir / "model.safetensors";
    const fs::path index = dir / "model.safetensors.index.json";
    if (fs::exists(index)) {
      json j;
      try {
        j = json::parse(slurp(index));
      } catch (const json::exception& e) {
        fail(index.string(), std::string("invalid JSON: ") + e.what());
      }
      if (!j.contains("weight_map") || !j["weight_map"].is_object())
        fail(index.string(), "no 'weight_map' object");
      std::map<std::string, size_t> file_idx;
      for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
        if (!it.value().is_string())
          fail(index.string(), "weight_map['" + it.key() + "'] is not a file name");
        const std::string f = it.value().get<std::string>();
        if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..")
          fail(index.string(),
               "weight_map['" + it.key() + "'] = '" + f + "' is not a file name in the directory");
        auto [fit, fresh] = file_idx.emplace(f, files_.size());
        if (fresh) {
          const fs::path p = dir / f;
          if (!fs::exists(p))
            fail(index.string(), "shard '" + f + "' (holding '" + it.key() + "') does not exist");
          files_.push_back(std::make_shared<SafetensorsFile>(SafetensorsFile::open(p.string())));
        }
        where_[it.key()] = fit->second;
      }
      // Every tensor named by the index must be in its shard.
      for (const auto& [tensor, fi] : where_)
        if (!files_[fi]->contains(tensor))
          fail(files_[fi]->path(), "tensor '" + tensor + "' listed in " +
                                       index.filename().string() + " is not in this file");
      // And every tensor of a shard must be listed by the index, for that shard (a tensor
      // missing from the index is invisible to every lookup: inspect and the loader both
      // open the checkpoint through this class, so both report it here).
      for (size_t fi = 0; fi < files_.size(); ++fi)
        for (const auto& t : files_[fi]->tensors()) {
          const auto w = where_.find(t.name);
          if (w == where_.end())
            fail(files_[fi]->path(), "tensor '" + t.name + "' is in this file but missing from " +
                                         index.filename().string());
          if (w->second != fi)
            fail(files_[fi]->path(), "tensor '" + t.name + "' is in this file but " +
                                         index.filename().string() + " places it in " +
                                         fs::path(files_[w->second]->path()).filename().string());
        }
    } else if (fs::exists(single)) {
      files_.push_back(std::make_shared<SafetensorsFile>(SafetensorsFile::open(single.string())));
      for (const auto& t : files_[0]->tensors()) where_[t.name] = 0;
    } else {
      fail(dir.string(),
           "no model.safetensors or model.safetensors.index.json "
           "(only safetensors checkpoints are supported)");
    }
  }

  bool has(const std::string& name) const { return where_.count(name) != 0; }

  TensorRef find(std::string_view name) const {
    auto it = where_.find(std::string(name));
    if (it == where_.end()) return {};
    return {files_[it->second].get(), files_[it->second]->find(name)};
  }
  const std::vector<std::shared_ptr<SafetensorsFile>>& files() const { return files_; }

  // A compressed-tensors NVFP4 Linear (PREFIX.weight_packed/weight_scale/weight_global_scale
  // instead of PREFIX.weight) stays packed (a kNvfp4 tensor into the mapping), or with `own`
  // is dequantized to fp32 (src/io/compressed_tensors.cc).
  bool get_compressed(const std::string& name, const std::vector<int64_t>& shape, model::Tensor& t,
                      model::Weights& w, bool own) const {
    const std::string suf = ".weight";
    if (shape.size() != 2 || name.size() <= suf.size() ||
        name.compare(name.size() - suf.size(), suf.size(), suf) != 0)
      return false;
    const std::string prefix = name.substr(0, name.size() - suf.size());
    const TensorLookup lookup = [this](std::string_view n) { return find(n); };
    if (!has_nvfp4_weight(lookup, prefix)) return false;
    if (!own) {  // codes and scales stay in the mapping
      t = view_nvfp4_weight(lookup, prefix, shape[0], shape[1]);
      for (const auto& f : files_) w.storage.push_back(f);
      return true;
    }
    const std::vector<float> v = read_nvfp4_weight(lookup, prefix, shape[0], shape[1]);
    float* dst = w.alloc(t, shape);
    std::memcpy(dst, v.data(), v.size() * sizeof(float));
    return true;
  }

  // Points `t` at tensor `name` of shape `shape` (fp32 in place when possible). `own`: always
  // an owned fp32 copy, and the file pages read are released afterwards (madvise), so that
  // resident memory holds only the copy (layer-by-layer streaming). A stacked 3-D tensor
  // [n, rows, cols] (fused experts) is given as the matrix [n * rows, cols] (`stacked`).
  void get(const std::string& name, std::vector<int64_t> shape, model::Tensor& t, model::Weights& w,
           bool own = false, bool stacked = false) const {
    if (!stacked && !has(name) && get_compressed(name, shape, t, w, own)) return;
    auto it = where_.find(name);
    if (it == where_.end())
      fail(dir_.string(),
           "missing tensor '" + name + "' (expected shape " + shape_str(shape) + ")");
    const auto& file = files_[it->second];
    const TensorInfo& info = file->at(name);
    if (info.shape != shape)
      fail(file->path(), "tensor '" + name + "': shape mismatch, expected " + shape_str(shape) +
                             ", got " + shape_str(info.shape));
    if (stacked) shape = {shape[0] * shape[1], shape[2]};
    if (!dtype_is_float(info.dtype))
      fail(file->path(), "tensor '" + name + "' has dtype " + std::string(dtype_name(info.dtype)) +
                             " (expected F32, BF16, F16 or F64)");
    const auto raw = file->raw(info);
    if (!own && shape.size() == 2 &&
        (info.dtype == StDType::kBF16 || info.dtype == StDType::kF16) &&
        reinterpret_cast<uintptr_t>(raw.data()) % alignof(uint16_t) == 0) {
      // Linear weights and embeddings stay 16-bit in the mapping (read a tile at a time).
      const auto* h = reinterpret_cast<const uint16_t*>(raw.data());
      const bool bf = info.dtype == StDType::kBF16;
      check_finite_16bit(h, info.numel(), bf, file->path(), name);
      t = model::Tensor{};
      t.shape = std::move(shape);
      t.dtype = bf ? model::WeightDType::kBF16 : model::WeightDType::kF16;
      t.raw = h;
      w.storage.push_back(file);  // keeps the mapping alive
      return;
    }
    const float* data = nullptr;
    if (!own && info.dtype == StDType::kF32 &&
        reinterpret_cast<uintptr_t>(raw.data()) % alignof(float) == 0) {
      data = reinterpret_cast<const float*>(raw.data());
      w.storage.push_back(file);  // keeps the mapping alive
      t = model::Tensor{};
      t.shape = std::move(shape);
      t.data = data;
    } else {
      // The widened buffer becomes the tensor's storage (no second copy).
      auto v = std::make_shared<std::vector<float>>(file->read_f32(info));
      t = model::Tensor{};
      t.shape = std::move(shape);
      t.data = data = v->data();
      w.storage.push_back(std::move(v));
      if (own) release_file_pages(raw.data(), static_cast<int64_t>(raw.size()));
    }
    check_finite_f32(data, t.numel(), file->path(), name);
  }

 private:
  fs::path dir_;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t> where_;
};

// The router and experts of MoE layer `l` into w.layers[l]. The router becomes an owned fp32
// matrix; the experts stay in the checkpoint's precision (as the dense Linears). Two layouts:
//  - per expert, as published checkpoints and transformers 5's save_pretrained write them:
//    Qwen3-MoE  mlp.gate.weight [E, D], mlp.experts.N.{gate,up,down}_proj.weight
//    Mixtral    block_sparse_moe.gate.weight, block_sparse_moe.experts.N.{w1,w3,w2}.weight
//               (w1 gate, w3 up, w2 down)
//  - fused, as transformers 5 holds them in memory (both architectures): mlp.gate.weight,
//    mlp.experts.gate_up_proj [E, 2I, D] (each expert's gate rows, then its up rows) and
//    mlp.experts.down_proj [E, D, I].
void load_moe(const ShardSet& shards, int l, model::Weights& w, bool own) {
  const model::Config& c = w.config;
  const int64_t D = c.dim, I = c.moe_hidden_dim, E = c.n_experts;
  const std::string p = hf_layer_prefix(l);
  model::LayerWeights& L = w.layers[static_cast<size_t>(l)];
  L.experts.assign(static_cast<size_t>(E), {});
  if (shards.has(p + "mlp.experts.gate_up_proj") || shards.has(p + "mlp.experts.down_proj")) {
    shards.get(p + "mlp.gate.weight", {E, D}, L.router, w, true);
    model::Tensor gate_up, down;
    shards.get(p + "mlp.experts.gate_up_proj", {E, 2 * I, D}, gate_up, w, own, true);
    shards.get(p + "mlp.experts.down_proj", {E, D, I}, down, w, own, true);
    for (int64_t e = 0; e < E; ++e) {
      model::LayerWeights::Expert& ex = L.experts[static_cast<size_t>(e)];
      ex.w1 = tensor_rows(gate_up, 2 * I * e, 2 * I * e + I);
      ex.w3 = tensor_rows(gate_up, 2 * I * e + I, 2 * I * (e + 1));
      ex.w2 = tensor_rows(down, D * e, D * (e + 1));
    }
    return;
  }
  const bool mixtral = c.arch == model::Arch::kMixtral;
  const std::string block = p + (mixtral ? "block_sparse_moe." : "mlp.");
  shards.get(block + "gate.weight", {E, D}, L.router, w, true);
  const char* names[3] = {"gate_proj", "up_proj", "down_proj"};
  if (mixtral) {
    names[0] = "w1";
    names[1] = "w3";
    names[2] = "w2";
  }
  for (int64_t e = 0; e < E; ++e) {
    model::LayerWeights::Expert& ex = L.experts[static_cast<size_t>(e)];
    const std::string ep = block + "experts." + std::to_string(e) + ".";
    try {
      shards.get(ep + names[0] + ".weight", {I, D}, ex.w1, w, own);
      shards.get(ep + names[1] + ".weight", {I, D}, ex.w3, w, own);
      shards.get(ep + names[2] + ".weight", {D, I}, ex.w2, w, own);
    } catch (const std::runtime_error& err) {
      throw std::runtime_error(std::string(err.what()) + " (expert " + std::to_string(e) + " of " +
                               std::to_string(E) + " in layer " + std::to_string(l) + ")");
    }
  }
}

// Reads the tensors of decoder layer `l` into w.layers[l] (`own`: see ShardSet::get).
void load_layer(const ShardSet& shards, int l, model::Weights& w, bool own) {
  const model::Config& c = w.config;
  const int64_t dim = c.dim, hd = c.head_dim, q_dim = int64_t{c.n_heads} * hd,
                kv_dim = int64_t{c.n_kv_heads} * hd, hidden = c.hidden_dim;
  const std::string p = hf_layer_prefix(l);
  model::LayerWeights& L = w.layers[static_cast<size_t>(l)];
  shards.get(p + "input_layernorm.weight", {dim}, L.attn_norm, w, own);
  shards.get(p + "self_attn.q_proj.weight", {q_dim, dim}, L.wq, w, own);
  shards.get(p + "self_attn.k_proj.weight", {kv_dim, dim}, L.wk, w, own);
  shards.get(p + "self_attn.v_proj.weight", {kv_dim, dim}, L.wv, w, own);
  shards.get(p + "self_attn.o_proj.weight", {dim, q_dim}, L.wo, w, own);
  if (c.qkv_bias) {
    shards.get(p + "self_attn.q_proj.bias", {q_dim}, L.bq, w, own);
    shards.get(p + "self_attn.k_proj.bias", {kv_dim}, L.bk, w, own);
    shards.get(p + "self_attn.v_proj.bias", {kv_dim}, L.bv, w, own);
  }
  if (c.qk_norm) {
    shards.get(p + "self_attn.q_norm.weight", {hd}, L.q_norm, w, own);
    shards.get(p + "self_attn.k_norm.weight", {hd}, L.k_norm, w, own);
  }
  shards.get(p + "post_attention_layernorm.weight", {dim}, L.ffn_norm, w, own);
  if (c.moe_layer(l)) {
    load_moe(shards, l, w, own);
    return;
  }
  shards.get(p + "mlp.gate_proj.weight", {hidden, dim}, L.w1, w, own);
  shards.get(p + "mlp.up_proj.weight", {hidden, dim}, L.w3, w, own);
  shards.get(p + "mlp.down_proj.weight", {dim, hidden}, L.w2, w, own);
}

model::Config load_hf_config_file(const fs::path& dir) {
  if (!fs::is_directory(dir)) fail(dir.string(), "not a directory");
  const fs::path cfg = dir / "config.json";
  if (!fs::exists(cfg)) fail(dir.string(), "no config.json (not a Hugging Face model directory)");
  const std::string text = slurp(cfg);
  model::Config c = parse_hf_config(text, cfg.string());
  // Rejects unsupported schemes.
  (void)parse_quantization_config(json::parse(text), cfg.string());
  return c;
}

}  // namespace

model::Config read_hf_config(const std::string& dir) { return load_hf_config_file(fs::path(dir)); }

model::Weights load_hf_dir(const std::string& dir_str) {
  const fs::path dir(dir_str);
  model::Weights w;
  w.config = load_hf_config_file(dir);
  const model::Config& c = w.config;
  ShardSet shards(dir);
  const int64_t dim = c.dim, vocab = c.vocab_size;
  shards.get("model.embed_tokens.weight", {vocab, dim}, w.tok_embeddings, w);
  w.layers.resize(static_cast<size_t>(c.n_layers));
  for (int l = 0; l < c.n_layers; ++l) load_layer(shards, l, w, false);
  shards.get("model.norm.weight", {dim}, w.final_norm, w);
  if (c.tied_embeddings) {
    w.lm_head = w.tok_embeddings;
  } else {
    shards.get("lm_head.weight", {vocab, dim}, w.lm_head, w);
  }
  return w;
}

CtInfo hf_quantization_config(const std::string& dir) {
  const fs::path cfg = fs::path(dir) / "config.json";
  if (!fs::exists(cfg)) fail(dir, "no config.json (not a Hugging Face model directory)");
  json j;
  try {
    j = json::parse(slurp(cfg));
  } catch (const json::exception& e) {
    fail(cfg.string(), std::string("invalid JSON: ") + e.what());
  }
  return parse_quantization_config(j, cfg.string());
}

CheckpointQuant read_hf_checkpoint_quant(const std::string& dir, const model::Config& c) {
  static_assert(model::kNumInputs == 4);
  const fs::path cfg = fs::path(dir) / "config.json";
  const CtInfo info = hf_quantization_config(dir);
  CheckpointQuant q;
  if (!info.present) return q;
  q.nvfp4_weights = info.nvfp4;
  q.w4a4 = info.w4a4;
  if (!q.w4a4) return q;
  const ShardSet shards{fs::path(dir)};
  const TensorLookup lookup = [&shards](std::string_view n) { return shards.find(n); };
  // The encode-direction global scale of one input from the Linears that read it: the largest
  // of their input_global_scale, or 0 when all of them are dense (quantization_config.ignore:
  // the input runs in full precision, as in vLLM); some dense and some W4A4 is refused.
  const auto shared_input_gs = [&](const std::vector<std::string>& readers) {
    float gs = 0;
    const std::string* dense = nullptr;
    const std::string* quant = nullptr;
    for (const std::string& prefix : readers) {
      if (!has_nvfp4_weight(lookup, prefix)) {
        dense = &prefix;
        continue;
      }
      const std::optional<float> g = read_input_global_scale(lookup, prefix);
      if (!g)
        fail(dir, cfg.filename().string() + " declares W4A4 (input_activations) but tensor '" +
                      prefix + ".input_global_scale' is missing");
      quant = &prefix;
      gs = std::max(gs, *g);
    }
    if (dense && quant)
      fail(dir, "'" + *dense + "' is dense but the Linears sharing its input are " +
                    "NVFP4 W4A4: one quantized input cannot feed both");
    return gs;
  };
  q.input_gs.resize(static_cast<size_t>(c.n_layers));
  q.expert_input_gs.resize(static_cast<size_t>(c.n_layers));
  for (int l = 0; l < c.n_layers; ++l) {
    const bool moe = c.moe_layer(l);
    std::array<std::vector<std::string>, model::kNumInputs> readers;
    for (model::LinearId id : kAllLinears)
      if (!moe || !model::is_ffn_linear(id))  // a MoE layer's MLP Linears are its experts'
        readers[static_cast<size_t>(model::input_of(id))].push_back(hf_module_name(l, id));
    auto& row = q.input_gs[static_cast<size_t>(l)];
    for (size_t in = 0; in < row.size(); ++in)
      row[in] = readers[in].empty() ? 0.0f : shared_input_gs(readers[in]);
    if (!moe) continue;
    // Each expert quantizes its own routed rows with its own scales; the router stays dense.
    auto& experts = q.expert_input_gs[static_cast<size_t>(l)];
    experts.resize(static_cast<size_t>(c.n_experts));
    for (int e = 0; e < c.n_experts; ++e) {
      const auto name = [&](model::LinearId id) { return hf_expert_module_name(c, l, e, id); };
      experts[static_cast<size_t>(e)] = {
          shared_input_gs({name(model::LinearId::kGate), name(model::LinearId::kUp)}),
          shared_input_gs({name(model::LinearId::kDown)})};
    }
  }
  return q;
}

struct HfLazyModel::Impl {
  model::Config config;
  std::string dir;
  std::unique_ptr<ShardSet> shards;
};

HfLazyModel::HfLazyModel(const std::string& dir) : impl_(std::make_unique<Impl>()) {
  impl_->config = load_hf_config_file(fs::path(dir));
  impl_->dir = dir;
  impl_->shards = std::make_unique<ShardSet>(fs::path(dir));
}
HfLazyModel::~HfLazyModel() = default;
HfLazyModel::HfLazyModel(HfLazyModel&&) noexcept = default;
HfLazyModel& HfLazyModel::operator=(HfLazyModel&&) noexcept = default;

const model::Config& HfLazyModel::config() const { return impl_->config; }
const std::string& HfLazyModel::dir() const { return impl_->dir; }

model::Weights HfLazyModel::layer(int l) const {
  const model::Config& c = impl_->config;
  if (l < 0 || l >= c.n_layers)
    fail(impl_->dir, "no decoder layer " + std::to_string(l) + " (the model has " +
                         std::to_string(c.n_layers) + ")");
  model::Weights w;
  w.config = c;
  w.layers.resize(static_cast<size_t>(c.n_layers));
  load_layer(*impl_->shards, l, w, true);
  return w;
}

model::Weights HfLazyModel::embeddings() const {
  model::Weights w;
  w.config = impl_->config;
  impl_->shards->get("model.embed_tokens.weight",
                     {int64_t{w.config.vocab_size}, int64_t{w.config.dim}}, w.tok_embeddings, w,
                     true);
  return w;
}

model::Weights HfLazyModel::head() const {
  model::Weights w;
  w.config = impl_->config;
  const int64_t dim = w.config.dim, vocab = w.config.vocab_size;
  impl_->shards->get("model.norm.weight", {dim}, w.final_norm, w, true);
  if (!w.config.tied_embeddings)
    impl_->shards->get("lm_head.weight", {vocab, dim}, w.lm_head, w, true);
  return w;
}

std::unique_ptr<model::HfBpeTokenizer> load_hf_tokenizer(const std::string& dir,
                                                         const model::Config& config) {
  const fs::path p = fs::path(dir) / "tokenizer.json";
  if (!fs::exists(p)) return nullptr;
  model::BpeSpec spec = model::load_tokenizer_json(p.string());
  const int vocab = static_cast<int>(spec.vocab.size());
  if (spec.bos_id < 0 && config.bos_token_id >= 0 && config.bos_token_id < vocab)
    spec.bos_id = config.bos_token_id;
  if (spec.eos_id < 0 && config.eos_token_id >= 0 && config.eos_token_id < vocab)
    spec.eos_id = config.eos_token_id;
  auto tok = std::make_unique<model::HfBpeTokenizer>(std::move(spec));
  if (tok->vocab_size() > config.vocab_size)
    fail(p.string(), "tokenizer has " + std::to_string(tok->vocab_size()) +
                         " tokens but the model's vocab_size is " +
                         std::to_string(config.vocab_size));
  return tok;
}

// ------------------------------------------------------------------------------------------

namespace {

struct NamedTensor {
  std::string name;
  const model::Tensor* t;
};

std::vector<NamedTensor> hf_tensor_list(const model::Weights& w) {
  const model::Config& c = w.config;
  std::vector<NamedTensor> out;
  out.push_back({"model.embed_tokens.weight", &w.tok_embeddings});
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = hf_layer_prefix(l);
    const model::LayerWeights& L = w.layers.at(static_cast<size_t>(l));
    out.push_back({p + "input_layernorm.weight", &L.attn_norm});
    out.push_back({p + "self_attn.q_proj.weight", &L.wq});
    out.push_back({p + "self_attn.k_proj.weight", &L.wk});
    out.push_back({p + "self_attn.v_proj.weight", &L.wv});
    out.push_back({p + "self_attn.o_proj.weight", &L.wo});
    if (c.qkv_bias) {
      out.push_back({p + "self_attn.q_proj.bias", &L.bq});
      out.push_back({p + "self_attn.k_proj.bias", &L.bk});
      out.push_back({p + "self_attn.v_proj.bias", &L.bv});
    }
    if (c.qk_norm) {
      out.push_back({p + "self_attn.q_norm.weight", &L.q_norm});
      out.push_back({p + "self_attn.k_norm.weight", &L.k_norm});
    }
    out.push_back({p + "post_attention_layernorm.weight", &L.ffn_norm});
    out.push_back({p + "mlp.gate_proj.weight", &L.w1});
    out.push_back({p + "mlp.up_proj.weight", &L.w3});
    out.push_back({p + "mlp.down_proj.weight", &L.w2});
  }
  out.push_back({"model.norm.weight", &w.final_norm});
  if (!c.tied_embeddings) out.push_back({"lm_head.weight", &w.lm_head});
  return out;
}

}  // namespace

void encode_dense_tensor(const model::Tensor& t, DType dt,
                         const std::function<void(std::span<const uint8_t>)>& sink) {
  const int64_t n = t.numel();
  if ((dt == DType::kBF16 && t.dtype == model::WeightDType::kBF16) ||
      (dt == DType::kF16 && t.dtype == model::WeightDType::kF16)) {  // already encoded
    sink({static_cast<const uint8_t*>(t.raw), static_cast<size_t>(n) * 2});
    return;
  }
  if (dt == DType::kF32 && t.dtype == model::WeightDType::kF32) {
    sink({reinterpret_cast<const uint8_t*>(t.data), static_cast<size_t>(n) * 4});
    return;
  }
  // Anything else is widened and encoded a tile of rows (about 8 MiB of fp32) at a time: no
  // copy of the whole tensor, as fp32 or as output bytes.
  const size_t width = dt == DType::kF32 ? 4 : 2;
  const int64_t rows = t.rows(), cols = t.cols();
  const int64_t tile = model::prefill_tile_rows(cols);
  const int64_t tr = std::min(rows, tile);
  std::vector<float> buf(t.dtype == model::WeightDType::kF32 ? 0 : static_cast<size_t>(tr * cols));
  std::vector<uint8_t> bytes(dt == DType::kF32 ? 0 : static_cast<size_t>(tr * cols) * width);
  for (int64_t r = 0; r < rows; r += tile) {
    const int64_t r1 = std::min(rows, r + tile), count = (r1 - r) * cols;
    const float* x = t.data ? t.data + r * cols : buf.data();
    if (!t.data) model::dequantize_rows(t, r, r1, buf.data());
    if (dt == DType::kF32) {
      sink({reinterpret_cast<const uint8_t*>(x), static_cast<size_t>(count) * 4});
      continue;
    }
    for (int64_t i = 0; i < count; ++i) {
      const uint16_t h = dt == DType::kBF16 ? format::f32_to_bf16(x[i]) : format::f32_to_f16(x[i]);
      std::memcpy(bytes.data() + 2 * i, &h, 2);
    }
    sink({bytes.data(), static_cast<size_t>(count) * 2});
  }
}

struct HfTensorFiles::Impl {
  ShardSet shards;
  explicit Impl(const fs::path& d) : shards(d) {}
};

HfTensorFiles::HfTensorFiles(const std::string& dir) {
  if (!fs::is_directory(dir)) fail(dir, "not a directory");
  impl_ = std::make_unique<Impl>(fs::path(dir));
}
HfTensorFiles::~HfTensorFiles() = default;
TensorRef HfTensorFiles::find(std::string_view name) const { return impl_->shards.find(name); }
TensorLookup HfTensorFiles::lookup() const {
  const Impl* p = impl_.get();
  return [p](std::string_view n) { return p->shards.find(n); };
}
const std::vector<std::shared_ptr<SafetensorsFile>>& HfTensorFiles::files() const {
  return impl_->shards.files();
}

void save_hf_dir(const model::Weights& w, const std::string& dir, const HfWriteOptions& opt) {
  const model::Config& c = w.config;
  model::refuse_moe(c, "the Hugging Face directory writer");
  const auto list = hf_tensor_list(w);
  for (const auto& nt : list)
    if (!nt.t->present() || nt.t->numel() <= 0)
      fail(dir, "cannot write: tensor '" + nt.name + "' is empty");
  const StDType dt = st_dtype(opt.dtype);
  AtomicDir out(dir, opt.overwrite);
  const fs::path tmp(out.path());

  write_file_atomic((tmp / "config.json").string(), hf_config_json(c, opt.dtype) + "\n");
  if (opt.chat) {
    write_hf_chat_meta(tmp.string(), *opt.chat);
  } else if (opt.tokenizer) {
    const model::HfBpeTokenizer t(*opt.tokenizer);
    write_hf_chat_meta(tmp.string(), chat_meta_from_tokenizer(&t, c));
  } else {
    write_hf_chat_meta(tmp.string(), chat_meta_from_tokenizer(nullptr, c));
  }

  // Group tensors into shards.
  std::vector<std::vector<size_t>> groups(1);
  uint64_t cur = 0;
  const uint64_t esize = dtype_size(dt);
  for (size_t i = 0; i < list.size(); ++i) {
    const uint64_t b = static_cast<uint64_t>(list[i].t->numel()) * esize;
    if (opt.shard_bytes > 0 && cur > 0 && cur + b > opt.shard_bytes) {
      groups.emplace_back();
      cur = 0;
    }
    groups.back().push_back(i);
    cur += b;
  }
  const bool sharded = opt.shard_bytes > 0;
  ordered_json weight_map = ordered_json::object();
  uint64_t total = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    char fname[64];
    if (sharded)
      std::snprintf(fname, sizeof fname, "model-%05zu-of-%05zu.safetensors", g + 1, groups.size());
    else
      std::snprintf(fname, sizeof fname, "model.safetensors");
    // Streamed: one tensor's bytes in memory at a time (a shard can be gigabytes).
    SafetensorsStreamWriter wr;
    wr.set_metadata("format", "pt");
    for (size_t i : groups[g]) {
      wr.declare(list[i].name, dt, list[i].t->shape);
      weight_map[list[i].name] = fname;
    }
    wr.open((tmp / fname).string());
    for (size_t i : groups[g])
      encode_dense_tensor(*list[i].t, opt.dtype, [&](std::span<const uint8_t> b) {
        total += b.size();
        wr.write_part(list[i].name, b);
      });
    wr.commit();
  }
  if (sharded) {
    ordered_json index;
    index["metadata"] = {{"total_size", total}};
    index["weight_map"] = weight_map;
    write_file_atomic((tmp / "model.safetensors.index.json").string(), index.dump(2) + "\n");
  }
  if (opt.tokenizer) {
    write_file_atomic((tmp / "tokenizer.json").string(),
                      model::tokenizer_json_string(*opt.tokenizer));
    write_file_atomic((tmp / "tokenizer_config.json").string(),
                      model::tokenizer_config_json_string(*opt.tokenizer, c.max_seq_len));
  }
  out.commit();
}

}  // namespace scalesweep::io
