// Internals of the tokenizer.json BPE tokenizers (src/model/hf_tokenizer*.cc): UTF-8 and Unicode
// classes, the byte-level alphabet and the hand-written pre-tokenizer splitters.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace scalesweep::model::bpe_detail {

// Unicode general category L (Lu|Ll|Lt|Lm|Lo) and N (Nd|Nl|No), Unicode 14.
bool is_letter(uint32_t cp);
bool is_number(uint32_t cp);
// Unicode White_Space (the \s of the Oniguruma/Rust regex engines used by `tokenizers`).
bool is_space(uint32_t cp);

// Decodes the code point at s[i]; sets *len to its byte length. Invalid UTF-8 decodes one
// byte as U+FFFD (len 1), as the regex engines treat a lossily converted string.
uint32_t decode_utf8(std::string_view s, size_t i, int* len);
void append_utf8(std::string& out, uint32_t cp);

// Unicode NFC (canonical decomposition, ordering, composition). Invalid UTF-8 bytes are kept
// as they are.
std::string nfc(std::string_view s);

// GPT-2 bytes_to_unicode(): the printable code point standing for each byte.
const uint32_t* byte_to_unicode();

struct SplitOptions {
  bool llama3 = false;  // Llama-3/Qwen2 regex (else GPT-2)
  int max_digits = 0;   // \p{N}{1,max_digits} (0: unbounded \p{N}+), llama3 only
};
// Splits `text` into the matches of the pre-tokenizer regex (which match every character,
// so the pieces concatenate back to `text`). Returns [begin, end) byte offsets.
std::vector<std::pair<size_t, size_t>> regex_split(std::string_view text, const SplitOptions& o);

}  // namespace scalesweep::model::bpe_detail
