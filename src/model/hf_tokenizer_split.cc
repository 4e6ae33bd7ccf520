// Hand-written equivalents of the byte-level BPE pre-tokenizer regexes (see
// hf_tokenizer_internal.h). Each splitter tries the regex alternatives in order at the current
// position, as a backtracking regex engine does, and returns the end of the first match.
//
// GPT-2:   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// Llama-3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//          ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// Qwen2:   as Llama-3 with \p{N} (one digit per piece).
// The case-insensitive contractions fold ASCII letters only (not U+017F, U+212A).
#include <algorithm>

#include "model/hf_tokenizer_internal.h"

namespace scalesweep::model::bpe_detail {

bool is_space(uint32_t cp) {
  if (cp < 0x80) return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20;
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
         cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

uint32_t decode_utf8(std::string_view s, size_t i, int* len) {
  const auto b = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  const uint8_t c = b(i);
  *len = 1;
  if (c < 0x80) return c;
  int n = 0;
  uint32_t cp = 0, min = 0;
  if ((c & 0xE0) == 0xC0) {
    n = 2, cp = c & 0x1F, min = 0x80;
  } else if ((c & 0xF0) == 0xE0) {
    n = 3, cp = c & 0x0F, min = 0x800;
  } else if ((c & 0xF8) == 0xF0) {
    n = 4, cp = c & 0x07, min = 0x10000;
  } else {
    return 0xFFFD;
  }
  if (i + n > s.size()) return 0xFFFD;
  for (int k = 1; k < n; ++k) {
    if ((b(i + k) & 0xC0) != 0x80) return 0xFFFD;
    cp = (cp << 6) | (b(i + k) & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0xFFFD;
  *len = n;
  return cp;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

const uint32_t* byte_to_unicode() {
  static const auto table = [] {
    struct T {
      uint32_t v[256];
    } t{};
    bool direct[256] = {};
    for (int b = '!'; b <= '~'; ++b) direct[b] = true;
    for (int b = 0xA1; b <= 0xAC; ++b) direct[b] = true;
    for (int b = 0xAE; b <= 0xFF; ++b) direct[b] = true;
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) t.v[b] = direct[b] ? static_cast<uint32_t>(b) : next++;
    return t;
  }();
  return table.v;
}

namespace {

enum Cls : uint8_t { kOther, kLetter, kNumber, kSpace };

struct Text {
  std::vector<uint32_t> cp;
  std::vector<size_t> off;  // byte offset of each code point, plus the end
  std::vector<uint8_t> cls;
};

uint32_t ascii_lower(uint32_t c) { return (c >= 'A' && c <= 'Z') ? c + 32 : c; }

// End of the contraction at i ('s 't 're 've 'm 'll 'd), or i when none matches.
size_t contraction(const Text& t, size_t i, bool fold) {
  const size_t n = t.cp.size();
  if (t.cp[i] != '\'' || i + 1 >= n) return i;
  const auto at = [&](size_t k) { return fold ? ascii_lower(t.cp[k]) : t.cp[k]; };
  const uint32_t a = at(i + 1);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
  if (i + 2 < n) {
    const uint32_t b = at(i + 2);
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
  }
  return i;
}

size_t run_of(const Text& t, size_t k, Cls c) {
  while (k < t.cp.size() && t.cls[k] == c) ++k;
  return k;
}

bool is_crlf(uint32_t c) { return c == '\r' || c == '\n'; }

// Whitespace alternatives shared by both regexes: \s+(?!\S)|\s+ at a whitespace position.
size_t trailing_space(const Text& t, size_t i) {
  const size_t j = run_of(t, i, kSpace);
  if (j == t.cp.size()) return j;
  return j - i >= 2 ? j - 1 : j;
}

size_t match_gpt2(const Text& t, size_t i) {
  const size_t n = t.cp.size();
  if (size_t e = contraction(t, i, false); e != i) return e;
  const bool sp = t.cp[i] == ' ' && i + 1 < n;
  for (Cls c : {kLetter, kNumber, kOther}) {
    if (sp && t.cls[i + 1] == c) return run_of(t, i + 1, c);
    if (t.cls[i] == c) return run_of(t, i, c);
  }
  return trailing_space(t, i);
}

size_t match_llama3(const Text& t, size_t i, int max_digits) {
  const size_t n = t.cp.size();
  if (size_t e = contraction(t, i, true); e != i) return e;
  const Cls c = static_cast<Cls>(t.cls[i]);
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (c != kLetter && c != kNumber && !is_crlf(t.cp[i]) && i + 1 < n && t.cls[i + 1] == kLetter)
    return run_of(t, i + 1, kLetter);
  if (c == kLetter) return run_of(t, i, kLetter);
  // \p{N}{1,K}
  if (c == kNumber) {
    const size_t e = run_of(t, i, kNumber);
    return max_digits > 0 ? std::min(e, i + static_cast<size_t>(max_digits)) : e;
  }
  // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
  size_t k = n;
  if (t.cp[i] == ' ' && i + 1 < n && t.cls[i + 1] == kOther)
    k = i + 1;
  else if (c == kOther)
    k = i;
  if (k != n) {
    size_t e = run_of(t, k, kOther);
    while (e < n && is_crlf(t.cp[e])) ++e;
    return e;
  }
  // \s*[\r\n]+ : up to and including the last CR/LF of the whitespace run
  const size_t j = run_of(t, i, kSpace);
  for (size_t p = j; p > i; --p)
    if (is_crlf(t.cp[p - 1])) return p;
  return trailing_space(t, i);
}

}  // namespace

std::vector<std::pair<size_t, size_t>> regex_split(std::string_view text, const SplitOptions& o) {
  Text t;
  for (size_t i = 0; i < text.size();) {
    int len = 1;
    const uint32_t cp = decode_utf8(text, i, &len);
    t.cp.push_back(cp);
    t.off.push_back(i);
    t.cls.push_back(is_space(cp)    ? kSpace
                    : is_letter(cp) ? kLetter
                    : is_number(cp) ? kNumber
                                    : kOther);
    i += static_cast<size_t>(len);
  }
  t.off.push_back(text.size());
  std::vector<std::pair<size_t, size_t>> out;
  for (size_t i = 0; i < t.cp.size();) {
    const size_t j = o.llama3 ? match_llama3(t, i, o.max_digits) : match_gpt2(t, i);
    out.emplace_back(t.off[i], t.off[j]);
    i = j;
  }
  return out;
}

}  // namespace scalesweep::model::bpe_detail
