// llama2.c tokenizer.bin tokenizer (include/scalesweep/model/tokenizer.h).
#include "scalesweep/model/tokenizer.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <queue>
#include <stdexcept>
#include <string>
#include <vector>

namespace scalesweep::model {

std::string Tokenizer::piece(int prev, int token, bool skip_special) const {
  if (is_special(token)) return skip_special ? std::string() : token_text(token);
  return decode_token(prev, token);
}

std::string Tokenizer::decode(const std::vector<int>& ids, bool skip_special) const {
  std::string out;
  int prev = -1;
  for (int id : ids) {
    out += piece(prev, id, skip_special);
    prev = id;
  }
  return out;
}

std::unique_ptr<Llama2cTokenizer> Llama2cTokenizer::load(const std::string& path, int vocab_size) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) throw std::runtime_error(path + ": cannot open tokenizer file");
  const int64_t size = static_cast<int64_t>(f.tellg());
  f.seekg(0);
  std::vector<char> buf(static_cast<size_t>(size));
  if (size > 0 && !f.read(buf.data(), size)) throw std::runtime_error(path + ": read failed");
  auto err = [&](const std::string& what) {
    return std::runtime_error(path + ": bad llama2.c tokenizer: " + what);
  };
  if (size < 4) throw err("file of " + std::to_string(size) + " bytes has no header");
  int32_t max_len;
  std::memcpy(&max_len, buf.data(), 4);
  if (max_len <= 0 || max_len > 1 << 16) throw err("max_token_length = " + std::to_string(max_len));
  std::vector<std::string> vocab;
  std::vector<float> scores;
  int64_t at = 4;
  while (at < size) {
    const int64_t id = static_cast<int64_t>(vocab.size());
    if (size - at < 8)
      throw err("token " + std::to_string(id) + " at byte " + std::to_string(at) +
                ": truncated score/length");
    float score;
    int32_t len;
    std::memcpy(&score, buf.data() + at, 4);
    std::memcpy(&len, buf.data() + at + 4, 4);
    at += 8;
    if (len < 0 || len > max_len || len > size - at)
      throw err("token " + std::to_string(id) + " at byte " + std::to_string(at - 8) + ": length " +
                std::to_string(len) + " (max_token_length " + std::to_string(max_len) + ", " +
                std::to_string(size - at) + " bytes left)");
    if (!std::isfinite(score)) throw err("token " + std::to_string(id) + ": score is not finite");
    vocab.emplace_back(buf.data() + at, static_cast<size_t>(len));
    scores.push_back(score);
    at += len;
  }
  if (vocab.empty()) throw err("no tokens");
  if (vocab_size > 0 && static_cast<int>(vocab.size()) != vocab_size)
    throw err("holds " + std::to_string(vocab.size()) + " tokens but the model's vocab_size is " +
              std::to_string(vocab_size));
  auto t = std::make_unique<Llama2cTokenizer>(std::move(vocab), std::move(scores));
  t->max_token_length_ = max_len;
  return t;
}

Llama2cTokenizer::Llama2cTokenizer(std::vector<std::string> vocab, std::vector<float> scores)
    : vocab_(std::move(vocab)), scores_(std::move(scores)) {
  if (vocab_.size() != scores_.size())
    throw std::invalid_argument("Llama2cTokenizer: vocab and scores differ in size");
  if (vocab_.size() < 3) throw std::invalid_argument("Llama2cTokenizer: vocab too small");
  for (const auto& p : vocab_)
    max_token_length_ = std::max(max_token_length_, static_cast<int>(p.size()));
  sorted_.resize(vocab_.size());
  for (size_t i = 0; i < sorted_.size(); ++i) sorted_[i] = static_cast<int>(i);
  // Stable: among equal pieces the lowest id is found first.
  std::stable_sort(sorted_.begin(), sorted_.end(),
                   [&](int a, int b) { return vocab_[a] < vocab_[b]; });
}

int Llama2cTokenizer::lookup(std::string_view piece) const {
  auto it = std::lower_bound(sorted_.begin(), sorted_.end(), piece,
                             [&](int id, std::string_view p) { return vocab_[id] < p; });
  if (it != sorted_.end() && vocab_[*it] == piece) return *it;
  return -1;
}

std::vector<int> Llama2cTokenizer::encode(std::string_view text, bool bos, bool eos) const {
  std::vector<int> toks;
  toks.reserve(text.size() + 3);
  if (!text.empty()) {
    int sp = lookup(" ");
    if (sp >= 0) toks.push_back(sp);
  }
  auto push_bytes = [&](std::string_view s) {
    for (unsigned char b : s) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      int id = lookup(name);
      if (id < 0)
        throw std::runtime_error("tokenizer: byte 0x" + std::string(name + 3, 2) +
                                 " is not in the vocabulary (no byte fallback token)");
      toks.push_back(id);
    }
  };
  // One token per UTF-8 code point (at most 4 bytes), else byte fallback.
  size_t i = 0;
  while (i < text.size()) {
    size_t j = i + 1;
    while (j < text.size() && (static_cast<unsigned char>(text[j]) & 0xC0) == 0x80 && j - i < 4)
      ++j;
    std::string_view cp = text.substr(i, j - i);
    int id = lookup(cp);
    if (id >= 0)
      toks.push_back(id);
    else
      push_bytes(cp);
    i = j;
  }
  // Merge: repeatedly the adjacent pair of highest score whose concatenation is a token,
  // leftmost on ties (llama2.c's quadratic loop, done with a heap and a linked list).
  const int n = static_cast<int>(toks.size());
  if (n > 1) {
    std::vector<int> prev(n), next(n);
    std::vector<char> alive(n, 1);
    for (int k = 0; k < n; ++k) {
      prev[k] = k - 1;
      next[k] = k + 1 < n ? k + 1 : -1;
    }
    struct Cand {
      float score;
      int left, right, left_id, right_id, merged;
    };
    auto worse = [](const Cand& a, const Cand& b) {
      if (a.score != b.score) return a.score < b.score;
      return a.left > b.left;
    };
    std::priority_queue<Cand, std::vector<Cand>, decltype(worse)> heap(worse);
    std::string buf;
    auto consider = [&](int l) {
      if (l < 0) return;
      int r = next[l];
      if (r < 0) return;
      buf = vocab_[toks[l]];
      buf += vocab_[toks[r]];
      int id = lookup(buf);
      if (id >= 0 && scores_[id] > -1e10f) heap.push({scores_[id], l, r, toks[l], toks[r], id});
    };
    for (int k = 0; k + 1 < n; ++k) consider(k);
    while (!heap.empty()) {
      Cand c = heap.top();
      heap.pop();
      if (!alive[c.left] || !alive[c.right] || next[c.left] != c.right ||
          toks[c.left] != c.left_id || toks[c.right] != c.right_id)
        continue;
      toks[c.left] = c.merged;
      alive[c.right] = 0;
      next[c.left] = next[c.right];
      if (next[c.right] >= 0) prev[next[c.right]] = c.left;
      consider(prev[c.left]);
      consider(c.left);
    }
    std::vector<int> merged;
    merged.reserve(n);
    for (int k = 0; k >= 0; k = next[k]) merged.push_back(toks[k]);
    toks.swap(merged);
  }
  if (bos) toks.insert(toks.begin(), this->bos());
  if (eos) toks.push_back(this->eos());
  return toks;
}

std::string Llama2cTokenizer::decode_token(int prev, int token) const {
  if (token < 0 || token >= vocab_size())
    throw std::out_of_range("tokenizer: token id " + std::to_string(token) +
                            " outside the vocabulary of " + std::to_string(vocab_size()));
  std::string_view piece = vocab_[token];
  if (prev == bos() && !piece.empty() && piece[0] == ' ') piece.remove_prefix(1);
  if (piece.size() == 6 && piece.substr(0, 3) == "<0x" && piece[5] == '>') {
    auto hex = [](char ch) -> int {
      if (ch >= '0' && ch <= '9') return ch - '0';
      if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
      if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
      return -1;
    };
    int hi = hex(piece[3]), lo = hex(piece[4]);
    if (hi >= 0 && lo >= 0) return std::string(1, static_cast<char>(hi * 16 + lo));
  }
  return std::string(piece);
}

}  // namespace scalesweep::model
