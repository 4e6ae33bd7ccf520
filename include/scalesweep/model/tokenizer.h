// Tokenizers used by the runtime. `Tokenizer` is the interface every tokenizer implements
// (llama2.c tokenizer.bin here; Hugging Face tokenizer.json BPE in hf_* files).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace scalesweep::model {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Token ids of `text`, with BOS prepended / EOS appended on request (ids from bos()/eos();
  // a tokenizer without such a token ignores the request).
  virtual std::vector<int> encode(std::string_view text, bool bos, bool eos) const = 0;
  // Bytes of `token` when it follows `prev` (-1 = none) in a stream: lets a tokenizer drop
  // the space it inserted after BOS, and turns byte tokens into their byte.
  virtual std::string decode_token(int prev, int token) const = 0;
  // Concatenation of decode_token over the sequence. Special tokens (is_special) give "" when
  // `skip_special` (the default, as transformers' pipelines and chat outputs print text), else
  // their spelling (token_text: "<|im_start|>"), as transformers' decode with
  // skip_special_tokens=False.
  virtual std::string decode(const std::vector<int>& ids, bool skip_special = true) const;
  // Whether `id` is a special token: BOS/EOS, and a tokenizer's special added tokens.
  virtual bool is_special(int id) const { return id >= 0 && (id == bos() || id == eos()); }
  // One generated token as a stream prints it: decode_token, or the spelling of a special
  // token when !skip_special ("" when skipped).
  std::string piece(int prev, int token, bool skip_special = true) const;
  virtual int bos() const = 0;  // -1 when absent
  // The tokenizer's own policy: whether a text is encoded with BOS in front (llama2.c:
  // always; HF/GGUF: BpeSpec::add_bos, from tokenizer_config.json add_bos_token or the
  // post-processor). Callers that mean to encode "as the tokenizer does" pass
  // add_bos() && bos() >= 0 to encode().
  virtual bool add_bos() const = 0;
  virtual int eos() const = 0;  // -1 when absent
  virtual int vocab_size() const = 0;
  // The model's chat template, Jinja source text as the model file carries it (GGUF
  // `tokenizer.chat_template`; HF `chat_template.jinja`, else tokenizer_config.json
  // `chat_template`); "" when it has none. Rendered by model/chat_template.h.
  virtual std::string chat_template() const { return {}; }
  // The vocabulary's spelling of token `id` (special tokens as written: "<|begin_of_text|>");
  // "" when out of range or unknown.
  virtual std::string token_text(int /*id*/) const { return {}; }
};

// llama2.c `tokenizer.bin`: int32 max_token_length, then per token: float32 score,
// int32 length, `length` bytes. Encoding as llama2.c's encode(): a dummy-prefix space when
// the text is non-empty, one token per UTF-8 code point (byte fallback to `<0xXX>` = id
// byte + 3 when the code point is not in the vocabulary), then repeatedly merge the adjacent
// pair whose concatenation is in the vocabulary with the highest score (first pair on ties).
// BOS = 1, EOS = 2.
class Llama2cTokenizer : public Tokenizer {
 public:
  // Reads `path`; `vocab_size` > 0 checks the token count (the file has no count of its
  // own: it is read to its end). Throws std::runtime_error naming the file on bad input.
  static std::unique_ptr<Llama2cTokenizer> load(const std::string& path, int vocab_size = 0);
  // From an in-memory vocabulary (tests, converters).
  Llama2cTokenizer(std::vector<std::string> vocab, std::vector<float> scores);

  std::vector<int> encode(std::string_view text, bool bos, bool eos) const override;
  std::string decode_token(int prev, int token) const override;
  int bos() const override { return 1; }
  bool add_bos() const override { return true; }
  int eos() const override { return 2; }
  int vocab_size() const override { return static_cast<int>(vocab_.size()); }

  const std::vector<std::string>& vocab() const { return vocab_; }
  const std::vector<float>& scores() const { return scores_; }
  int max_token_length() const { return max_token_length_; }
  int lookup(std::string_view piece) const;  // -1 when absent

 private:
  std::vector<std::string> vocab_;
  std::vector<float> scores_;
  int max_token_length_ = 0;
  std::vector<int> sorted_;  // ids sorted by piece, for lookup
};

}  // namespace scalesweep::model
