// llama2.c checkpoint loader and writer (see include/scalesweep/io/llama2c.h).
#include "scalesweep/io/llama2c.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "io/atomic_file.h"
#include "scalesweep/model/weight.h"

namespace scalesweep::io {

namespace {

constexpr uint32_t kMagicV1 = 0x616b3432;  // "ak42"
constexpr int64_t kV1HeaderBytes = 256;

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw std::runtime_error(path + ": " + what);
}

std::vector<uint8_t> read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) fail(path, "cannot open file");
  std::streamsize n = f.tellg();
  if (n < 0) fail(path, "cannot read file size");
  std::vector<uint8_t> buf(static_cast<size_t>(n));
  f.seekg(0);
  if (n > 0 && !f.read(reinterpret_cast<char*>(buf.data()), n)) fail(path, "read failed");
  return buf;
}

struct Header {
  int32_t dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len;
};

model::Config make_config(const Header& h, bool tied, const std::string& path) {
  auto check = [&](bool ok, const std::string& what) {
    if (!ok) fail(path, "bad llama2.c header: " + what);
  };
  check(h.dim > 0 && h.dim <= (1 << 16), "dim = " + std::to_string(h.dim));
  check(h.hidden_dim > 0 && h.hidden_dim <= (1 << 18),
        "hidden_dim = " + std::to_string(h.hidden_dim));
  check(h.n_layers > 0 && h.n_layers <= 1024, "n_layers = " + std::to_string(h.n_layers));
  check(h.n_heads > 0 && h.dim % h.n_heads == 0,
        "n_heads = " + std::to_string(h.n_heads) + " does not divide dim " + std::to_string(h.dim));
  check(h.n_kv_heads > 0 && h.n_kv_heads <= h.n_heads && h.n_heads % h.n_kv_heads == 0,
        "n_kv_heads = " + std::to_string(h.n_kv_heads) + " with n_heads " +
            std::to_string(h.n_heads));
  check((h.dim / h.n_heads) % 2 == 0,
        "head_dim " + std::to_string(h.dim / h.n_heads) + " is odd (RoPE needs pairs)");
  check(h.vocab_size > 0 && h.vocab_size <= (1 << 24),
        "vocab_size = " + std::to_string(h.vocab_size));
  check(h.seq_len > 0 && h.seq_len <= (1 << 24), "seq_len = " + std::to_string(h.seq_len));
  model::Config c;
  c.arch = model::Arch::kLlama;
  c.dim = h.dim;
  c.hidden_dim = h.hidden_dim;
  c.n_layers = h.n_layers;
  c.n_heads = h.n_heads;
  c.n_kv_heads = h.n_kv_heads;
  c.head_dim = h.dim / h.n_heads;
  c.vocab_size = h.vocab_size;
  c.max_seq_len = h.seq_len;
  c.rope_theta = 10000.0f;
  c.norm_eps = 1e-5f;
  c.tied_embeddings = tied;
  c.bos_token_id = 1;
  c.eos_token_id = 2;
  return c;
}

// Sequential reader over the fp32 payload.
struct Cursor {
  const float* base;
  int64_t n;  // floats available
  int64_t at = 0;
  const float* take(int64_t count) {
    const float* p = base + at;
    at += count;
    return p;
  }
};

void check_finite(const model::Tensor& t, const std::string& path, const std::string& name) {
  int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(t.data[i])) {
      fail(path, "tensor '" + name + "' element " + std::to_string(i) + " is " +
                     (std::isnan(t.data[i]) ? "NaN" : "Inf"));
    }
  }
}

void check_all_finite(const model::Weights& w, const std::string& path) {
  check_finite(w.tok_embeddings, path, "tok_embeddings");
  check_finite(w.final_norm, path, "norm");
  if (!w.config.tied_embeddings) check_finite(w.lm_head, path, "output");
  for (size_t l = 0; l < w.layers.size(); ++l) {
    const auto& L = w.layers[l];
    std::string p = "layers." + std::to_string(l) + ".";
    check_finite(L.attn_norm, path, p + "attention_norm");
    check_finite(L.wq, path, p + "wq");
    check_finite(L.wk, path, p + "wk");
    check_finite(L.wv, path, p + "wv");
    check_finite(L.wo, path, p + "wo");
    check_finite(L.ffn_norm, path, p + "ffn_norm");
    check_finite(L.w1, path, p + "w1");
    check_finite(L.w2, path, p + "w2");
    check_finite(L.w3, path, p + "w3");
  }
}

model::Tensor view(const float* p, std::vector<int64_t> shape) {
  model::Tensor t;
  t.shape = std::move(shape);
  t.data = p;
  return t;
}

int64_t payload_floats(const model::Config& c, bool legacy) {
  int64_t D = c.dim, H = c.hidden_dim, L = c.n_layers, V = c.vocab_size;
  int64_t kv = static_cast<int64_t>(c.n_kv_heads) * c.head_dim;
  int64_t qd = static_cast<int64_t>(c.n_heads) * c.head_dim;
  int64_t n = V * D + 2 * L * D + D + L * (qd * D + 2 * kv * D + D * qd + 3 * H * D);
  if (legacy) n += static_cast<int64_t>(c.max_seq_len) * c.head_dim;  // 2 tables of hd/2
  if (!c.tied_embeddings) n += V * D;
  return n;
}

}  // namespace

void permute_rope_rows(const float* src, float* dst, int n_heads, int head_dim, int64_t cols,
                       bool to_hf) {
  const int half = head_dim / 2;
  for (int h = 0; h < n_heads; ++h) {
    for (int i = 0; i < half; ++i) {
      for (int a = 0; a < 2; ++a) {
        int64_t inter = static_cast<int64_t>(h) * head_dim + 2 * i + a;
        int64_t rh = static_cast<int64_t>(h) * head_dim + a * half + i;
        int64_t from = to_hf ? inter : rh, to = to_hf ? rh : inter;
        std::memcpy(dst + to * cols, src + from * cols, sizeof(float) * cols);
      }
    }
  }
}

namespace {
// Legacy files mark untied embeddings by a negative vocab_size. INT32_MIN has no positive
// counterpart (negating it is undefined): it stays negative and make_config refuses it.
int32_t untied_vocab(int32_t v) {
  return v < 0 && v != std::numeric_limits<int32_t>::min() ? -v : v;
}

}  // namespace

bool is_llama2c_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  uint8_t head[8 + sizeof(Header) + 1] = {};
  f.read(reinterpret_cast<char*>(head), sizeof head);
  const std::streamsize got = f.gcount();
  if (got < static_cast<std::streamsize>(sizeof(Header))) return false;
  uint32_t magic;
  std::memcpy(&magic, head, 4);
  Header h{};
  bool tied = true;
  if (magic == kMagicV1) {
    if (got < static_cast<std::streamsize>(sizeof head)) return false;
    int32_t version;
    std::memcpy(&version, head + 4, 4);
    if (version != 1) return true;  // the loader names the unsupported version
    std::memcpy(&h, head + 8, sizeof(h));
    tied = head[8 + sizeof(h)] == 1;
  } else {
    std::memcpy(&h, head, sizeof(h));
    tied = h.vocab_size > 0;
    h.vocab_size = untied_vocab(h.vocab_size);
  }
  try {
    make_config(h, tied, path);
  } catch (const std::exception&) {
    return false;
  }
  return true;
}

model::Weights load_llama2c(const std::string& path, Llama2cFormat* format_out) {
  auto bytes = std::make_shared<std::vector<uint8_t>>(read_all(path));
  const int64_t size = static_cast<int64_t>(bytes->size());
  if (size < 28)
    fail(path, "file of " + std::to_string(size) +
                   " bytes is too small for a "
                   "llama2.c header");
  uint32_t magic;
  std::memcpy(&magic, bytes->data(), 4);
  Header h{};
  bool legacy = magic != kMagicV1;
  bool tied = true;
  int64_t offset = 0;
  if (!legacy) {
    if (size < kV1HeaderBytes)
      fail(path, "file of " + std::to_string(size) +
                     " bytes is too small for the 256-byte "
                     "v1 header");
    int32_t version;
    std::memcpy(&version, bytes->data() + 4, 4);
    if (version != 1)
      fail(path, "llama2.c magic \"ak42\" with unsupported version " + std::to_string(version) +
                     " (only version 1, fp32, is supported)");
    std::memcpy(&h, bytes->data() + 8, sizeof(h));
    uint8_t shared = (*bytes)[8 + sizeof(h)];
    if (shared > 1) fail(path, "v1 header shared_classifier = " + std::to_string(shared));
    tied = shared == 1;
    offset = kV1HeaderBytes;
  } else {
    std::memcpy(&h, bytes->data(), sizeof(h));
    tied = h.vocab_size > 0;
    h.vocab_size = untied_vocab(h.vocab_size);
    offset = sizeof(h);
  }
  model::Weights w;
  w.config = make_config(h, tied, path);
  const auto& c = w.config;
  int64_t need = payload_floats(c, legacy) * 4 + offset;
  if (need != size) {
    fail(path, std::string("llama2.c ") + (legacy ? "legacy" : "v1") + " file: header (dim " +
                   std::to_string(c.dim) + ", hidden " + std::to_string(c.hidden_dim) +
                   ", layers " + std::to_string(c.n_layers) + ", heads " +
                   std::to_string(c.n_heads) + "/" + std::to_string(c.n_kv_heads) + ", vocab " +
                   std::to_string(c.vocab_size) + (tied ? " tied" : " untied") + ", seq_len " +
                   std::to_string(c.max_seq_len) + ") needs " + std::to_string(need) +
                   " bytes but the file has " + std::to_string(size));
  }
  // Copy the payload into aligned float storage.
  int64_t nfl = (size - offset) / 4;
  auto fl = std::make_shared<std::vector<float>>(static_cast<size_t>(nfl));
  std::memcpy(fl->data(), bytes->data() + offset, static_cast<size_t>(nfl) * 4);
  bytes.reset();
  w.storage.push_back(fl);
  Cursor cur{fl->data(), nfl};

  const int64_t D = c.dim, H = c.hidden_dim, L = c.n_layers, V = c.vocab_size;
  const int64_t hd = c.head_dim, qd = c.n_heads * hd, kv = c.n_kv_heads * hd;
  w.layers.resize(static_cast<size_t>(L));
  auto per_layer = [&](auto member, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (auto s : shape) n *= s;
    for (int64_t l = 0; l < L; ++l) w.layers[l].*member = view(cur.take(n), shape);
  };
  using LW = model::LayerWeights;
  if (legacy) {
    w.tok_embeddings = view(cur.take(V * D), {V, D});
    per_layer(&LW::attn_norm, {D});
    per_layer(&LW::wq, {qd, D});
    per_layer(&LW::wk, {kv, D});
    per_layer(&LW::wv, {kv, D});
    per_layer(&LW::wo, {D, qd});
    per_layer(&LW::ffn_norm, {D});
    per_layer(&LW::w1, {H, D});
    per_layer(&LW::w2, {D, H});
    per_layer(&LW::w3, {H, D});
    w.final_norm = view(cur.take(D), {D});
    cur.take(c.max_seq_len * hd);  // freq_cis_real, freq_cis_imag (unused: RoPE is computed)
  } else {
    per_layer(&LW::attn_norm, {D});
    per_layer(&LW::ffn_norm, {D});
    w.final_norm = view(cur.take(D), {D});
    w.tok_embeddings = view(cur.take(V * D), {V, D});
    per_layer(&LW::wq, {qd, D});
    per_layer(&LW::wk, {kv, D});
    per_layer(&LW::wv, {kv, D});
    per_layer(&LW::wo, {D, qd});
    per_layer(&LW::w1, {H, D});
    per_layer(&LW::w2, {D, H});
    per_layer(&LW::w3, {H, D});
  }
  w.lm_head = tied ? w.tok_embeddings : view(cur.take(V * D), {V, D});
  if (cur.at != cur.n) fail(path, "internal: payload size mismatch");
  check_all_finite(w, path);
  // Interleaved RoPE pairs -> rotate-half rows.
  for (auto& lw : w.layers) {
    model::Tensor src = lw.wq;
    float* q = w.alloc(lw.wq, src.shape);
    permute_rope_rows(src.data, q, c.n_heads, static_cast<int>(hd), D, true);
    src = lw.wk;
    float* k = w.alloc(lw.wk, src.shape);
    permute_rope_rows(src.data, k, c.n_kv_heads, static_cast<int>(hd), D, true);
  }
  if (format_out) *format_out = legacy ? Llama2cFormat::kLegacy : Llama2cFormat::kV1;
  return w;
}

void save_llama2c(const model::Weights& w_in, const std::string& path, Llama2cFormat format) {
  // llama2.c stores fp32: weights held in another precision are widened first.
  model::Weights w = w_in;
  model::materialize_f32(w);
  const auto& c = w.config;
  if (c.arch != model::Arch::kLlama || c.head_dim * c.n_heads != c.dim)
    throw std::runtime_error(path +
                             ": llama2.c format holds only plain Llama models with "
                             "head_dim * n_heads == dim");
  std::vector<uint8_t> out;
  auto put = [&](const void* p, size_t n) {
    auto b = static_cast<const uint8_t*>(p);
    out.insert(out.end(), b, b + n);
  };
  auto put_t = [&](const model::Tensor& t) { put(t.data, sizeof(float) * t.numel()); };
  const int64_t hd = c.head_dim;
  std::vector<std::vector<float>> wq(c.n_layers), wk(c.n_layers);
  for (int l = 0; l < c.n_layers; ++l) {
    const auto& lw = w.layers[l];
    wq[l].resize(lw.wq.numel());
    wk[l].resize(lw.wk.numel());
    permute_rope_rows(lw.wq.data, wq[l].data(), c.n_heads, static_cast<int>(hd), c.dim, false);
    permute_rope_rows(lw.wk.data, wk[l].data(), c.n_kv_heads, static_cast<int>(hd), c.dim, false);
  }
  Header h{c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads, c.vocab_size, c.max_seq_len};
  auto layers = [&](auto member) {
    for (const auto& lw : w.layers) put_t(lw.*member);
  };
  auto put_vec = [&](const std::vector<std::vector<float>>& v) {
    for (const auto& x : v) put(x.data(), sizeof(float) * x.size());
  };
  using LW = model::LayerWeights;
  // The attention matrices (q and k with their rows permuted as llama2.c stores them) and the
  // FFN matrices, in the same order in both formats.
  auto put_attention = [&] {
    put_vec(wq);
    put_vec(wk);
    layers(&LW::wv);
    layers(&LW::wo);
  };
  auto put_ffn = [&] {
    layers(&LW::w1);
    layers(&LW::w2);
    layers(&LW::w3);
  };
  if (format == Llama2cFormat::kLegacy) {
    if (!c.tied_embeddings) h.vocab_size = -h.vocab_size;
    put(&h, sizeof(h));
    put_t(w.tok_embeddings);
    layers(&LW::attn_norm);
    put_attention();
    layers(&LW::ffn_norm);
    put_ffn();
    put_t(w.final_norm);
    std::vector<float> re(static_cast<size_t>(c.max_seq_len * hd / 2)), im(re.size());
    for (int64_t t = 0; t < c.max_seq_len; ++t) {
      for (int64_t i = 0; i < hd / 2; ++i) {
        float freq = 1.0f / std::pow(c.rope_theta, static_cast<float>(2 * i) / hd);
        float val = static_cast<float>(t) * freq;
        re[t * hd / 2 + i] = std::cos(val);
        im[t * hd / 2 + i] = std::sin(val);
      }
    }
    put(re.data(), 4 * re.size());
    put(im.data(), 4 * im.size());
  } else {
    uint32_t magic = kMagicV1;
    int32_t version = 1;
    put(&magic, 4);
    put(&version, 4);
    put(&h, sizeof(h));
    uint8_t shared = c.tied_embeddings ? 1 : 0;
    put(&shared, 1);
    out.resize(kV1HeaderBytes, 0);
    layers(&LW::attn_norm);
    layers(&LW::ffn_norm);
    put_t(w.final_norm);
    put_t(w.tok_embeddings);
    put_attention();
    put_ffn();
  }
  if (!c.tied_embeddings) put_t(w.lm_head);
  write_file_atomic(path, std::span<const uint8_t>(out.data(), out.size()));
}

}  // namespace scalesweep::io
