// The chat metadata of a model (chat_meta.h): one struct, its GGUF keys and its Hugging Face
// files.
#include "scalesweep/io/chat_meta.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "io/atomic_file.h"
#include "scalesweep/io/file.h"
#include "scalesweep/io/gguf_writer.h"
#include "scalesweep/io/load.h"
#include "scalesweep/model/hf_tokenizer.h"

namespace scalesweep::io {

namespace {

using nlohmann::json;
using nlohmann::ordered_json;
namespace fs = std::filesystem;

// The f32 `f` as the shortest decimal that reads back as `f` (0.7f -> 0.7).
double shortest(float f) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, f);
  return std::strtod(std::string(buf, r.ptr).c_str(), nullptr);
}

void add_eos(std::vector<int>& eos, int id) {
  if (id >= 0 && std::find(eos.begin(), eos.end(), id) == eos.end()) eos.push_back(id);
}

struct SamplingKey {
  const char* gguf;
  const char* hf;
  std::optional<double> SamplingDefaults::*field;
};
constexpr SamplingKey kFloatKeys[] = {
    {"general.sampling.temp", "temperature", &SamplingDefaults::temperature},
    {"general.sampling.top_p", "top_p", &SamplingDefaults::top_p},
    {"general.sampling.min_p", "min_p", &SamplingDefaults::min_p},
    {"general.sampling.penalty_repeat", "repetition_penalty",
     &SamplingDefaults::repetition_penalty},
};
constexpr const char* kGgufTopK = "general.sampling.top_k";

}  // namespace

ChatMeta chat_meta_from_gguf(const GgufMetadata& m, const std::string& file) {
  ChatMeta out;
  const auto id = [&](const char* key) {
    const std::optional<int64_t> v = gguf_get_int(m, key, file);
    if (!v) return -1;
    if (*v < 0 || *v > INT32_MAX)
      throw IoError(file + ": key '" + key + "' = " + std::to_string(*v) + " is not a token id");
    return static_cast<int>(*v);
  };
  if (auto t = gguf_get_string(m, "tokenizer.chat_template", file)) out.chat_template = *t;
  out.bos_id = id("tokenizer.ggml.bos_token_id");
  out.pad_id = id("tokenizer.ggml.padding_token_id");
  if (auto list = gguf_get_int_array(m, kGgufEosIdsKey, file)) {
    for (size_t i = 0; i < list->size(); ++i) {
      const int64_t v = (*list)[i];
      if (v < 0 || v > INT32_MAX)
        throw IoError(file + ": key '" + kGgufEosIdsKey + "' element " + std::to_string(i) + " = " +
                      std::to_string(v) + " is not a token id");
      add_eos(out.eos_ids, static_cast<int>(v));
    }
  } else {
    for (const char* k : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                          "tokenizer.ggml.eom_token_id"})
      add_eos(out.eos_ids, id(k));
  }
  for (const SamplingKey& k : kFloatKeys)
    if (auto v = gguf_get_float(m, k.gguf, file))
      out.sampling.*k.field = shortest(static_cast<float>(*v));
  if (auto v = gguf_get_int(m, kGgufTopK, file)) out.sampling.top_k = *v;
  return out;
}

void set_chat_meta_kv(GgufMetadata& kv, const ChatMeta& meta) {
  const auto u = [](int v) { return gguf_value_u32(static_cast<uint32_t>(v)); };
  if (!meta.chat_template.empty())
    gguf_set_kv(kv, "tokenizer.chat_template", gguf_value_string(meta.chat_template));
  if (meta.bos_id >= 0) gguf_set_kv(kv, "tokenizer.ggml.bos_token_id", u(meta.bos_id));
  if (meta.pad_id >= 0) gguf_set_kv(kv, "tokenizer.ggml.padding_token_id", u(meta.pad_id));
  if (!meta.eos_ids.empty()) {
    static constexpr const char* kKeys[] = {"tokenizer.ggml.eos_token_id",
                                            "tokenizer.ggml.eot_token_id",
                                            "tokenizer.ggml.eom_token_id"};
    for (size_t i = 0; i < 3; ++i) {
      if (i < meta.eos_ids.size())
        gguf_set_kv(kv, kKeys[i], u(meta.eos_ids[i]));
      else
        gguf_erase_kv(kv, kKeys[i]);  // the list is the whole truth: no stale eot/eom
    }
    if (meta.eos_ids.size() > 3)
      gguf_set_kv(
          kv, kGgufEosIdsKey,
          gguf_value_i32_array(std::vector<int32_t>(meta.eos_ids.begin(), meta.eos_ids.end())));
    else
      gguf_erase_kv(kv, kGgufEosIdsKey);
  }
  for (const SamplingKey& k : kFloatKeys)
    if (const auto& v = meta.sampling.*k.field)
      gguf_set_kv(kv, k.gguf, gguf_value_f32(static_cast<float>(*v)));
  if (meta.sampling.top_k)
    gguf_set_kv(kv, kGgufTopK, gguf_value_i32(static_cast<int32_t>(*meta.sampling.top_k)));
}

ChatMeta parse_generation_config(std::string_view text, const std::string& file) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw std::runtime_error(file + ": invalid JSON: " + e.what());
  }
  if (!j.is_object()) throw std::runtime_error(file + ": expected a JSON object");
  const auto bad = [&](const char* key, const char* want) {
    throw std::runtime_error(file + ": " + key + ": expected " + want);
  };
  const auto id = [&](const json& v, const char* key) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX)
      bad(key, "a token id (a non-negative integer)");
    return v.get<int>();
  };
  ChatMeta out;
  if (j.contains("bos_token_id") && !j["bos_token_id"].is_null())
    out.bos_id = id(j["bos_token_id"], "bos_token_id");
  if (j.contains("pad_token_id") && !j["pad_token_id"].is_null())
    out.pad_id = id(j["pad_token_id"], "pad_token_id");
  if (j.contains("eos_token_id") && !j["eos_token_id"].is_null()) {
    const json& e = j["eos_token_id"];
    if (e.is_array()) {
      for (const json& x : e) {
        if (!x.is_number_integer() || x.get<int64_t>() < 0)
          bad("eos_token_id", "an integer or a list of integers");
        add_eos(out.eos_ids, x.get<int>());
      }
    } else if (e.is_number_integer() && e.get<int64_t>() >= 0) {
      out.eos_ids.push_back(e.get<int>());
    } else {
      bad("eos_token_id", "an integer or a list of integers");
    }
  }
  for (const SamplingKey& k : kFloatKeys)
    if (j.contains(k.hf) && !j[k.hf].is_null()) {
      if (!j[k.hf].is_number()) bad(k.hf, "a number");
      out.sampling.*k.field = j[k.hf].get<double>();
    }
  if (j.contains("top_k") && !j["top_k"].is_null()) {
    if (!j["top_k"].is_number_integer()) bad("top_k", "an integer");
    out.sampling.top_k = j["top_k"].get<int64_t>();
  }
  if (j.contains("do_sample") && !j["do_sample"].is_null()) {
    if (!j["do_sample"].is_boolean()) bad("do_sample", "true or false");
    out.sampling.do_sample = j["do_sample"].get<bool>();
  }
  return out;
}

std::string generation_config_json(const ChatMeta& meta) {
  ordered_json g;
  // transformers marks a generation config derived from config.json so; one with sampling
  // defaults came from a real generation_config.json.
  if (meta.sampling.empty()) g["_from_model_config"] = true;
  if (meta.bos_id >= 0) g["bos_token_id"] = meta.bos_id;
  if (meta.eos_ids.size() == 1)
    g["eos_token_id"] = meta.eos_ids[0];
  else if (!meta.eos_ids.empty())
    g["eos_token_id"] = meta.eos_ids;
  if (meta.pad_id >= 0) g["pad_token_id"] = meta.pad_id;
  const SamplingDefaults& s = meta.sampling;
  if (s.do_sample) g["do_sample"] = *s.do_sample;
  for (const SamplingKey& k : kFloatKeys)
    if (const auto& v = s.*k.field) g[k.hf] = *v;
  if (s.top_k) g["top_k"] = *s.top_k;
  return g.dump(2) + "\n";
}

ChatMeta chat_meta_from_tokenizer(const model::Tokenizer* t, const model::Config& c) {
  ChatMeta out;
  if (t) {
    out.chat_template = t->chat_template();
    out.bos_id = t->bos();
    add_eos(out.eos_ids, t->eos());
    if (const auto* h = dynamic_cast<const model::HfBpeTokenizer*>(t))
      out.pad_id = h->spec().pad_id;
  }
  if (out.bos_id < 0) out.bos_id = c.bos_token_id;
  if (out.eos_ids.empty()) add_eos(out.eos_ids, c.eos_token_id);
  return out;
}

ChatMeta chat_meta_from_hf_dir(const std::string& dir) {
  const fs::path d(dir);
  ChatMeta out;
  const fs::path gen = d / "generation_config.json";
  if (fs::exists(gen)) out = parse_generation_config(read_text_file(gen.string()), gen.string());
  if (fs::exists(d / "tokenizer.json")) {
    const model::BpeSpec s = model::load_tokenizer_json(dir);
    out.chat_template = s.chat_template;
    if (out.bos_id < 0) out.bos_id = s.bos_id;
    if (out.eos_ids.empty()) add_eos(out.eos_ids, s.eos_id);
    if (out.pad_id < 0) out.pad_id = s.pad_id;
  } else if (fs::exists(d / "chat_template.jinja")) {
    out.chat_template = read_text_file((d / "chat_template.jinja").string());
  }
  return out;
}

ChatMeta read_chat_meta(const std::string& source, const model::Tokenizer* t,
                        const model::Config& c) {
  if (fs::is_directory(source)) {
    ChatMeta m = chat_meta_from_hf_dir(source);
    const ChatMeta tm = chat_meta_from_tokenizer(t, c);  // an explicit --tokenizer
    if (m.chat_template.empty()) m.chat_template = tm.chat_template;
    if (m.bos_id < 0) m.bos_id = tm.bos_id;
    if (m.eos_ids.empty()) m.eos_ids = tm.eos_ids;
    if (m.pad_id < 0) m.pad_id = tm.pad_id;
    return m;
  }
  if (GgufFile::sniff(source)) {
    const GgufFile f = GgufFile::open(source);
    ChatMeta m = chat_meta_from_gguf(f.metadata(), source);
    if (m.bos_id < 0) m.bos_id = c.bos_token_id;
    if (m.eos_ids.empty()) add_eos(m.eos_ids, c.eos_token_id);
    return m;
  }
  return chat_meta_from_tokenizer(t, c);
}

void write_hf_chat_meta(const std::string& dir, const ChatMeta& meta) {
  const fs::path d(dir);
  write_file_atomic((d / "generation_config.json").string(), generation_config_json(meta));
  if (!meta.chat_template.empty())
    write_file_atomic((d / "chat_template.jinja").string(), meta.chat_template);
}

}  // namespace scalesweep::io
