// The chat metadata of a model: what a server or a chat front end needs besides the weights
// and the vocabulary. One struct, read from every source format and written by every writer
// (quantize, convert; compressed-tensors, Hugging Face and GGUF outputs), so that an
// Instruct model keeps its chat template, its stop tokens and its sampling defaults.
//
//   field            Hugging Face directory                      GGUF
//   chat_template    chat_template.jinja, else tokenizer_config  tokenizer.chat_template
//                    .json chat_template (a string, or the
//                    "default" entry of a list)
//   bos_id           generation_config.json bos_token_id,        tokenizer.ggml.bos_token_id
//                    else the tokenizer's bos_token
//   eos_ids          generation_config.json eos_token_id (an     tokenizer.ggml.eos_token_id,
//                    int or a list), else the tokenizer's        eot_token_id, eom_token_id
//                    eos_token                                   (more than 3: kGgufEosIdsKey)
//   pad_id           generation_config.json pad_token_id, else   tokenizer.ggml.padding_token_id
//                    the tokenizer's pad_token
//   sampling         generation_config.json do_sample,           general.sampling.temp, top_k,
//                    temperature, top_k, top_p, min_p,           top_p, min_p, penalty_repeat
//                    repetition_penalty                          (no do_sample)
//
// Written as transformers 5 writes them: chat_template.jinja (transformers reads it before
// tokenizer_config.json's chat_template, which the tokenizer writer also keeps for older
// readers and llama.cpp's converter) and generation_config.json. Special tokens themselves
// (<|im_start|> ...) travel in the tokenizer: tokenizer.json's added_tokens with their
// `special` flag, GGUF token_type CONTROL.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "scalesweep/io/gguf.h"
#include "scalesweep/model/config.h"
#include "scalesweep/model/tokenizer.h"

namespace scalesweep::io {

// Sampling defaults of generation_config.json; absent fields are absent in every output.
struct SamplingDefaults {
  std::optional<bool> do_sample;  // Hugging Face only (GGUF has no key for it)
  std::optional<double> temperature, top_p, min_p, repetition_penalty;
  std::optional<int64_t> top_k;
  bool empty() const {
    return !do_sample && !temperature && !top_p && !min_p && !repetition_penalty && !top_k;
  }
  bool operator==(const SamplingDefaults&) const = default;
};

struct ChatMeta {
  std::string chat_template;  // Jinja text; "" none
  int bos_id = -1;            // -1 none
  std::vector<int> eos_ids;   // generation stops at any; [0] is the tokenizer's EOS
  int pad_id = -1;            // -1 none
  SamplingDefaults sampling;
  bool operator==(const ChatMeta&) const = default;
};

// The full EOS list when it has more than the 3 ids GGUF's eos/eot/eom keys hold (llama.cpp
// ignores the key).
inline constexpr const char* kGgufEosIdsKey = "scalesweep.generation.eos_token_ids";

// From GGUF metadata (`file` names the file in messages). EOS ids: kGgufEosIdsKey when
// present, else eos, eot, eom in that order without repeats. Float sampling values are
// stored f32 and read back as the shortest decimal that gives the same f32 (0.7, not
// 0.699999988). Throws IoError naming the file and key on a wrong type or a negative id.
ChatMeta chat_meta_from_gguf(const GgufMetadata& m, const std::string& file);
// Sets the keys of `meta` in `kv`, replacing those present (so a source's verbatim tokenizer
// keys may be passed): tokenizer.chat_template, bos/eos/eot/eom/padding ids,
// general.sampling.*. A key whose field is absent is left as `kv` has it.
void set_chat_meta_kv(GgufMetadata& kv, const ChatMeta& meta);

// generation_config.json text: bos/eos/pad/sampling only (chat_template stays ""). `file`
// names it in messages; throws std::runtime_error on invalid JSON or a field of the wrong
// type ("generation_config.json: eos_token_id: expected an integer or a list of integers").
ChatMeta parse_generation_config(std::string_view json, const std::string& file);
// generation_config.json as transformers writes it: bos_token_id, eos_token_id (an int for
// one id, a list for several), pad_token_id, then the sampling fields present.
std::string generation_config_json(const ChatMeta& meta);

// A Hugging Face directory: generation_config.json where present, the template, BOS/EOS/pad
// from the tokenizer files where generation_config.json has none.
ChatMeta chat_meta_from_hf_dir(const std::string& dir);
// What a tokenizer alone gives (template, BOS, EOS, pad when it is a Hugging Face BPE one),
// with the config's BOS/EOS where the tokenizer has none (llama2.c sources).
ChatMeta chat_meta_from_tokenizer(const model::Tokenizer* t, const model::Config& c);
// The chat metadata of a job's source: a HF directory, a GGUF file, else the tokenizer's.
ChatMeta read_chat_meta(const std::string& source, const model::Tokenizer* t,
                        const model::Config& c);

// Writes generation_config.json and, with a template, chat_template.jinja into `dir`.
void write_hf_chat_meta(const std::string& dir, const ChatMeta& meta);

}  // namespace scalesweep::io
