// Storage helpers of model::Weights and the readers of weights stored in any WeightDType
// (include/scalesweep/model/weight.h).
#include "scalesweep/model/weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/quant_kernels.h"
#include "scalesweep/format/ggml.h"
#include "scalesweep/format/minifloat.h"
#include "scalesweep/model/config.h"
#include "scalesweep/model/weight.h"
#include "scalesweep/quant/layout_index.h"

namespace scalesweep::model {

float* Weights::alloc(Tensor& t, std::vector<int64_t> shape) {
  t = Tensor{};
  t.shape = std::move(shape);
  auto buf = std::make_shared<std::vector<float>>(static_cast<size_t>(t.numel()), 0.0f);
  t.data = buf->data();
  storage.push_back(buf);
  return buf->data();
}

const float* Tensor::f32(const char* what) const {
  if (dtype != WeightDType::kF32)
    throw std::logic_error(std::string(what) + " is stored as " +
                           std::string(kWeightDTypeNames.name(dtype)) +
                           ", not fp32 (dequantize it first)");
  return data;
}

namespace {

void check_rows(const Tensor& t, int64_t r0, int64_t r1) {
  if (!t.present()) throw std::invalid_argument("dequantize_rows: tensor without data");
  if (r0 < 0 || r1 < r0 || r1 > t.rows())
    throw std::out_of_range("dequantize_rows: rows [" + std::to_string(r0) + ", " +
                            std::to_string(r1) + ") outside a tensor of " +
                            std::to_string(t.rows()) + " rows");
}

// Scale of NVFP4 block b of row r as fp32 (validated as finite and >= 0 by the loader).
inline float nvfp4_scale(const Tensor& t, int64_t r, int64_t b) {
  const int64_t bpr = (t.cols() + 15) / 16;
  return format::E4M3::decode_f(t.nvfp4_scales[r * bpr + b]);
}

__attribute__((target_clones("avx512f", "avx2", "default"))) void widen_bf16(const uint16_t* in,
                                                                             float* out,
                                                                             int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = static_cast<uint32_t>(in[i]) << 16;
    std::memcpy(out + i, &u, 4);
  }
}

// Row-wise dot products of small matrices: 16 independent partial sums per row (vectorized by
// the compiler for each target clone), then the pairwise tree, then the tail. W element j of
// row o is load(W, o, j); the fp32 and bf16 instances do the same arithmetic in the same
// order, so bf16 weights give the same bits as their fp32 widening.
template <typename Load>
inline void gemv_kernel(Load load, const float* x, float* y, int out, int in) {
  int o = 0;
  for (; o + 4 <= out; o += 4) {  // four rows at a time: independent chains
    float a0[16] = {}, a1[16] = {}, a2[16] = {}, a3[16] = {};
    int j = 0;
    for (; j + 16 <= in; j += 16)
      for (int k = 0; k < 16; ++k) {
        a0[k] += load(o, j + k) * x[j + k];
        a1[k] += load(o + 1, j + k) * x[j + k];
        a2[k] += load(o + 2, j + k) * x[j + k];
        a3[k] += load(o + 3, j + k) * x[j + k];
      }
    for (int width = 8; width >= 1; width /= 2)  // pairwise tree of the partial sums
      for (int k = 0; k < width; ++k) {
        a0[k] += a0[k + width];
        a1[k] += a1[k + width];
        a2[k] += a2[k + width];
        a3[k] += a3[k + width];
      }
    for (; j < in; ++j) {
      a0[0] += load(o, j) * x[j];
      a1[0] += load(o + 1, j) * x[j];
      a2[0] += load(o + 2, j) * x[j];
      a3[0] += load(o + 3, j) * x[j];
    }
    y[o] = a0[0];
    y[o + 1] = a1[0];
    y[o + 2] = a2[0];
    y[o + 3] = a3[0];
  }
  for (; o < out; ++o) {
    float acc[16] = {};
    int j = 0;
    for (; j + 16 <= in; j += 16)
      for (int k = 0; k < 16; ++k) acc[k] += load(o, j + k) * x[j + k];
    for (int width = 8; width >= 1; width /= 2)
      for (int k = 0; k < width; ++k) acc[k] += acc[k + width];
    for (; j < in; ++j) acc[0] += load(o, j) * x[j];
    y[o] = acc[0];
  }
}

__attribute__((target_clones("avx512f", "avx2", "default"))) void gemv_f32(const float* W,
                                                                           const float* x, float* y,
                                                                           int out, int in) {
  const size_t ld = static_cast<size_t>(in);
  gemv_kernel([W, ld](int o, int j) { return W[o * ld + j]; }, x, y, out, in);
}

__attribute__((target_clones("avx512f", "avx2", "default"))) void gemv_bf16(const uint16_t* W,
                                                                            const float* x,
                                                                            float* y, int out,
                                                                            int in) {
  const size_t ld = static_cast<size_t>(in);
  gemv_kernel(
      [W, ld](int o, int j) {
        const uint32_t u = static_cast<uint32_t>(W[o * ld + j]) << 16;
        float f;
        std::memcpy(&f, &u, 4);
        return f;
      },
      x, y, out, in);
}

}  // namespace

void dequantize_rows_reference(const Tensor& t, int64_t r0, int64_t r1, float* out) {
  check_rows(t, r0, r1);
  const int64_t cols = t.cols();
  if (t.dtype == WeightDType::kGgml) {
    // The stored row through the scalar ggml dequantizer, then the per-tensor scale.
    const int64_t rb = detail::ggml_row_bytes(t);
    for (int64_t r = r0; r < r1; ++r) {
      float* o = out + (r - r0) * cols;
      format::ggml_dequantize(
          t.ggml_type, static_cast<const uint8_t*>(t.raw) + detail::ggml_stored_row(t, r) * rb,
          cols, o);
      if (t.ggml_scale != 1.0f)
        for (int64_t c = 0; c < cols; ++c) o[c] *= t.ggml_scale;
    }
    return;
  }
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      float v = 0;
      const int64_t i = r * cols + c;
      switch (t.dtype) {
        case WeightDType::kF32:
          v = t.data[i];
          break;
        case WeightDType::kBF16:
          v = format::BF16::decode_f(static_cast<const uint16_t*>(t.raw)[i]);
          break;
        case WeightDType::kF16:
          v = format::F16::decode_f(static_cast<const uint16_t*>(t.raw)[i]);
          break;
        case WeightDType::kNvfp4: {
          const uint8_t b = static_cast<const uint8_t*>(t.raw)[r * packed_cols(cols) + c / 2];
          const uint8_t code =
              (c & 1) ? static_cast<uint8_t>(b >> 4) : static_cast<uint8_t>(b & 15);
          v = (format::kFp4Values.v[code] * nvfp4_scale(t, r, c / 16)) / t.nvfp4_global_scale;
          break;
        }
        case WeightDType::kGgml:
          break;  // handled above
      }
      out[(r - r0) * cols + c] = v;
    }
}

void dequantize_rows(const Tensor& t, int64_t r0, int64_t r1, float* out) {
  check_rows(t, r0, r1);
  if (detail::quant_kernel_available(t)) {
    detail::quant_dequantize_rows(t, r0, r1, out);
    return;
  }
  const int64_t cols = t.cols(), n = (r1 - r0) * cols;
  switch (t.dtype) {
    case WeightDType::kF32:
      std::memcpy(out, t.data + r0 * cols, sizeof(float) * n);
      return;
    case WeightDType::kBF16:
      widen_bf16(static_cast<const uint16_t*>(t.raw) + r0 * cols, out, n);
      return;
    case WeightDType::kF16: {
      const uint16_t* p = static_cast<const uint16_t*>(t.raw) + r0 * cols;
      for (int64_t i = 0; i < n; ++i) out[i] = format::f16_to_f32(p[i]);
      return;
    }
    case WeightDType::kNvfp4: {
      // Per block: the 16 products fl(fl(fp4 * s) / gs) in a table, then a lookup per code.
      const int64_t pc = packed_cols(cols), bpr = (cols + 15) / 16;
      const uint8_t* codes = static_cast<const uint8_t*>(t.raw);
      float tab[16];
      for (int64_t r = r0; r < r1; ++r) {
        float* o = out + (r - r0) * cols;
        const uint8_t* row = codes + r * pc;
        for (int64_t b = 0; b < bpr; ++b) {
          const float s = nvfp4_scale(t, r, b);
          for (int k = 0; k < 16; ++k)
            tab[k] = (format::kFp4Values.v[k] * s) / t.nvfp4_global_scale;
          const int64_t c1 = std::min(cols, (b + 1) * 16);
          for (int64_t c = b * 16; c < c1; c += 2) {
            const uint8_t byte = row[c / 2];
            o[c] = tab[byte & 15];
            if (c + 1 < c1) o[c + 1] = tab[byte >> 4];
          }
        }
      }
      return;
    }
    case WeightDType::kGgml:  // a type without a fused kernel: the scalar dequantizer
      dequantize_rows_reference(t, r0, r1, out);
      return;
  }
}

float tensor_amax(const Tensor& t) {
  float a = 0;
  std::vector<float> row(static_cast<size_t>(t.cols()));
  for (int64_t r = 0; r < t.rows(); ++r) {
    dequantize_rows(t, r, r + 1, row.data());
    for (float v : row) a = std::max(a, std::fabs(v));
  }
  return a;
}

std::vector<float> to_f32(const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  if (t.present() && t.numel() > 0) dequantize_rows(t, 0, t.rows(), v.data());
  return v;
}

Tensor as_f32(const Tensor& t, std::vector<std::shared_ptr<void>>& keep) {
  if (t.dtype == WeightDType::kF32) return t;
  auto v = std::make_shared<std::vector<float>>(to_f32(t));
  Tensor out;
  out.shape = t.shape;
  out.data = v->data();
  keep.push_back(std::move(v));
  return out;
}

void materialize_f32(Weights& w) {
  const bool tied = w.lm_head.raw == w.tok_embeddings.raw &&
                    w.lm_head.data == w.tok_embeddings.data && w.lm_head.present();
  auto fix = [&](Tensor& t) {
    if (t.present()) t = as_f32(t, w.storage);
  };
  fix(w.tok_embeddings);
  for (auto& L : w.layers)
    for (Tensor* t : {&L.attn_norm, &L.wq, &L.wk, &L.wv, &L.wo, &L.bq, &L.bk, &L.bv, &L.q_norm,
                      &L.k_norm, &L.ffn_norm, &L.w1, &L.w3, &L.w2})
      fix(*t);
  fix(w.final_norm);
  if (tied)
    w.lm_head = w.tok_embeddings;
  else
    fix(w.lm_head);
}

int64_t layer_f32_bytes(const Config& c) {
  const int64_t D = c.dim, H = c.hidden_dim, q = int64_t{c.n_heads} * c.head_dim,
                kv = int64_t{c.n_kv_heads} * c.head_dim;
  const int64_t bias = c.qkv_bias ? q + 2 * kv : 0, qk = c.qk_norm ? 2 * c.head_dim : 0;
  // The feed-forward of the largest layer: the dense SwiGLU, or a MoE layer's experts and
  // router (the seven Linears of the declaration's comment, or more).
  const int64_t ffn =
      std::max(3 * H * D, c.moe() ? int64_t{c.n_experts} * (3 * int64_t{c.moe_hidden_dim} + 1) * D
                                  : int64_t{0});
  return 4 * (2 * D + q * D + 2 * kv * D + D * q + ffn + bias + qk);
}

int64_t storage_bytes(const Tensor& t) {
  switch (t.dtype) {
    case WeightDType::kF32:
      return t.numel() * 4;
    case WeightDType::kBF16:
    case WeightDType::kF16:
      return t.numel() * 2;
    case WeightDType::kNvfp4:
      return t.rows() * ((t.cols() + 1) / 2 + (t.cols() + 15) / 16);
    case WeightDType::kGgml:
      return t.rows() * detail::ggml_row_bytes(t);
  }
  return 0;
}

int64_t weight_tile_rows(int64_t cols) {
  // About 256 KiB of fp32 per tile (L2), at least 16 rows.
  return std::max<int64_t>(16, (int64_t{1} << 16) / std::max<int64_t>(cols, 1));
}

int64_t prefill_tile_rows(int64_t cols) {
  return std::max<int64_t>(256, (int64_t{1} << 21) / std::max<int64_t>(cols, 1));
}

void gemv_rows(const Tensor& w, const float* x, int64_t o0, int64_t o1, float* y) {
  check_rows(w, o0, o1);
  const int64_t in = w.cols();
  if (detail::quant_kernel_available(w)) {
    detail::quant_gemv_rows(w, x, o0, o1, y);
    return;
  }
  if (w.dtype == WeightDType::kF32) {
    gemv_f32(w.data + o0 * in, x, y, static_cast<int>(o1 - o0), static_cast<int>(in));
    return;
  }
  if (w.dtype == WeightDType::kBF16) {
    gemv_bf16(static_cast<const uint16_t*>(w.raw) + o0 * in, x, y, static_cast<int>(o1 - o0),
              static_cast<int>(in));
    return;
  }
  const int64_t tile = weight_tile_rows(in);
  thread_local std::vector<float> scratch;
  scratch.resize(static_cast<size_t>(std::min(tile, o1 - o0) * in));
  for (int64_t r = o0; r < o1; r += tile) {
    const int64_t r1 = std::min(o1, r + tile);
    dequantize_rows(w, r, r1, scratch.data());
    gemv_f32(scratch.data(), x, y + (r - o0), static_cast<int>(r1 - r), static_cast<int>(in));
  }
}

}  // namespace scalesweep::model
