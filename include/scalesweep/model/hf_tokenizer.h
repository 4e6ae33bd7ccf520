// Hugging Face `tokenizer.json` BPE tokenizers (model.type "BPE"), two flavours:
//
//  - byte-level (GPT-2, Llama 3, Qwen2/2.5/3, SmolLM): text is split by the pre-tokenizer
//    regex, each piece's UTF-8 bytes are mapped through GPT-2's byte-to-unicode table, then
//    BPE merges apply by rank. The regexes are not run by a regex engine: the GPT-2,
//    Llama-3 (`\p{N}{1,3}`) and Qwen2 (`\p{N}`) patterns are recognized by their text and
//    executed by hand-written splitters that follow the regex alternation and backtracking
//    rules exactly (\p{L}/\p{N} from Unicode 14 general categories, \s = White_Space).
//  - SentencePiece-style (Llama 2, TinyLlama, Mistral): spaces become U+2581 "▁", a "▁" is
//    prepended, code points missing from the vocabulary fall back to `<0xXX>` byte tokens,
//    then BPE merges apply by rank over the whole text.
//
// Merges follow the Hugging Face algorithm: the adjacent pair with the lowest merge rank is
// merged first, leftmost on ties. Added tokens (special or not) are matched in the raw text
// first (leftmost, longest), honouring lstrip/rstrip.
//
// The NFC normalizer (Qwen2) is implemented (Unicode 14 tables). `single_word` added tokens
// match only between non-word characters (word = \p{L}, \p{N} or '_'). Documented
// approximation: added tokens are matched on the raw (not normalized) text.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "scalesweep/model/tokenizer.h"

namespace scalesweep::model {

struct HfAddedToken {
  int id = -1;
  std::string content;
  bool special = false;
  bool lstrip = false, rstrip = false, single_word = false, normalized = false;
};

enum class BpeFlavor { kByteLevel, kSentencePiece };
// Pre-tokenizer split regex of a byte-level tokenizer.
enum class SplitRegex { kNone, kGpt2, kLlama3 };
// When the SentencePiece "▁" prefix is prepended: never, to the first segment of the text
// only, or to every segment between added tokens (the "legacy" Prepend normalizer).
enum class PrependScheme { kNever, kFirst, kAlways };

// Everything the tokenizer needs from a tokenizer.json (plain data, no JSON).
struct BpeSpec {
  BpeFlavor flavor = BpeFlavor::kByteLevel;
  std::vector<std::string> vocab;  // model vocabulary: id -> token (file spelling), "" = none
  std::vector<std::pair<std::string, std::string>> merges;  // in rank order
  std::vector<HfAddedToken> added;
  bool nfc = false;  // NFC normalizer (Qwen2)
  // byte-level
  SplitRegex split = SplitRegex::kGpt2;
  int max_digits = 0;             // Llama-3 family: \p{N}{1,max_digits}; 0 = unbounded
  bool split_digits = false;      // Digits(individual_digits=true) pre-tokenizer first
  bool add_prefix_space = false;  // ByteLevel add_prefix_space
  // SentencePiece-style
  PrependScheme prepend = PrependScheme::kAlways;
  bool metaspace = false;        // Metaspace pre-tokenizer (no "▁" added before a "▁")
  bool metaspace_split = false;  // Metaspace split=true: pieces start at each "▁"
  bool byte_fallback = false;
  bool fuse_unk = false;
  bool ignore_merges = false;  // a whole pre-token found in the vocabulary is not merged
  int unk_id = -1, bos_id = -1, eos_id = -1;
  int pad_id = -1;  // tokenizer_config.json pad_token, GGUF tokenizer.ggml.padding_token_id
  bool add_bos = false, add_eos = false;  // what the file's post-processor/config asks for
  std::string chat_template;              // Jinja text (Tokenizer::chat_template); "" none
};

// Parses tokenizer.json text. `name` is used in error messages. Throws std::runtime_error
// naming `name` and the offending field for anything unsupported (non-BPE model, unknown
// normalizer/pre-tokenizer/regex, a merge whose parts are not in the vocabulary, ...).
BpeSpec parse_tokenizer_json(std::string_view json, const std::string& name);
// Reads `path` (a tokenizer.json file, or a directory holding one). BOS/EOS come from a
// tokenizer_config.json beside it (bos_token/eos_token/add_bos_token) when present, else
// from the post-processor template, else from the usual token names. The chat template:
// chat_template.jinja beside it, else tokenizer_config.json `chat_template` (a string, or a
// list of {name, template} whose "default" entry is taken).
BpeSpec load_tokenizer_json(const std::string& path);
// Serializes a spec as a tokenizer.json that Hugging Face `tokenizers` loads (Llama-2
// layout for the SentencePiece flavour, GPT-2/Llama-3 layout for byte-level).
std::string tokenizer_json_string(const BpeSpec& spec);
// tokenizer_config.json text for the spec (bos/eos/unk/pad names, add_bos_token, class, and
// chat_template when the spec has one).
std::string tokenizer_config_json_string(const BpeSpec& spec, int model_max_length);

// SentencePiece-style spec equivalent to a llama2.c tokenizer.bin vocabulary: ids 0/1/2
// become <unk>/<s>/</s>, ids 3..258 must be the byte tokens <0x00>..<0xFF>, spaces become
// "▁", and every split of a piece into two vocabulary pieces becomes a merge, ranked by the
// piece's score (higher score = earlier merge), so HF BPE reproduces llama2.c's
// highest-score-first merging whenever scores are distinct. Throws on a malformed vocabulary.
BpeSpec sentencepiece_spec_from_llama2c(const std::vector<std::string>& pieces,
                                        const std::vector<float>& scores);

class HfBpeTokenizer : public Tokenizer {
 public:
  explicit HfBpeTokenizer(BpeSpec spec);  // validates; throws std::runtime_error
  static std::unique_ptr<HfBpeTokenizer> load(const std::string& path) {
    return std::make_unique<HfBpeTokenizer>(load_tokenizer_json(path));
  }

  std::vector<int> encode(std::string_view text, bool bos, bool eos) const override;
  // Byte tokens give their byte; "▁" gives a space (the first one of the stream, i.e. when
  // prev is -1 or a special token, is dropped for the SentencePiece flavour); special added
  // tokens give "".
  std::string decode_token(int prev, int token) const override;
  bool is_special(int id) const override {
    return Tokenizer::is_special(id) ||
           (id >= 0 && id < vocab_size_ && is_special_[static_cast<size_t>(id)]);
  }
  int bos() const override { return spec_.bos_id; }
  bool add_bos() const override { return spec_.add_bos; }
  int eos() const override { return spec_.eos_id; }
  int vocab_size() const override { return vocab_size_; }
  std::string chat_template() const override { return spec_.chat_template; }
  std::string token_text(int id) const override;

  const BpeSpec& spec() const { return spec_; }
  int token_id(std::string_view token) const;  // model vocabulary or added token; -1 absent

 private:
  struct PairHash {
    size_t operator()(uint64_t k) const { return std::hash<uint64_t>()(k); }
  };
  struct MergeInfo {
    int rank, new_id;
  };
  void encode_segment(std::string_view text, bool first_segment, std::vector<int>& out) const;
  void bpe_word(std::string_view word, std::vector<int>& out) const;  // word in vocab spelling
  void sp_symbol(std::string_view ch, std::vector<int>& syms) const;

  BpeSpec spec_;
  int vocab_size_ = 0;
  int model_id(std::string_view token) const;  // model vocabulary only (what BPE sees)

  std::unordered_map<std::string, int> ids_, added_ids_;
  std::unordered_map<uint64_t, MergeInfo, PairHash> merges_;
  std::vector<std::string> id_bytes_;  // decoded bytes per id (before leading-space rules)
  std::vector<char> is_special_;       // per id: special added token
  std::vector<size_t> added_sorted_;   // indices into spec_.added, longest content first
  int byte_ids_[256];                  // SentencePiece byte-fallback ids (-1 absent)
  char added_first_[256];              // first bytes of added tokens
};

}  // namespace scalesweep::model
