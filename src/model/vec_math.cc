// Vector math of the runtime (model/vec_math.h).
#include "model/vec_math.h"

#include <cmath>

namespace scalesweep::model {
namespace {

__attribute__((target_clones("avx512f", "avx2", "default"))) float row_max(const float* x, int n) {
  float m[16];
  for (int k = 0; k < 16; ++k) m[k] = -INFINITY;
  int j = 0;
  for (; j + 16 <= n; j += 16)
    for (int k = 0; k < 16; ++k) m[k] = x[j + k] > m[k] ? x[j + k] : m[k];
  float mx = -INFINITY;
  for (; j < n; ++j) mx = x[j] > mx ? x[j] : mx;
  for (int k = 0; k < 16; ++k) mx = m[k] > mx ? m[k] : mx;
  return mx;
}

// Σ exp(x[j] - mx) over j < n: 16 float lanes per chunk of 256, chunks summed in double.
__attribute__((target_clones("avx512f", "avx2", "default"))) double sum_exp(const float* x, int n,
                                                                            float mx) {
  double total = 0;
  int j = 0;
  while (j < n) {
    const int end = n - j >= 256 ? j + 256 : n;
    float s[16] = {};
    for (; j + 16 <= end; j += 16)
      for (int k = 0; k < 16; ++k) s[k] += exp_nonpos(x[j + k] - mx);
    float tail = 0;
    for (; j < end; ++j) tail += exp_nonpos(x[j] - mx);
    double chunk = tail;
    for (int k = 0; k < 16; ++k) chunk += s[k];
    total += chunk;
  }
  return total;
}

}  // namespace

__attribute__((target_clones("avx512f", "avx2", "default"))) void softmax_inplace(float* x, int n) {
  const float mx = row_max(x, n);
  float s[16] = {};
  int j = 0;
  for (; j + 16 <= n; j += 16)
    for (int k = 0; k < 16; ++k) {
      x[j + k] = exp_nonpos(x[j + k] - mx);
      s[k] += x[j + k];
    }
  float sum = 0.0f;
  for (; j < n; ++j) {
    x[j] = exp_nonpos(x[j] - mx);
    sum += x[j];
  }
  for (int k = 0; k < 16; ++k) sum += s[k];
  const float inv = 1.0f / sum;
  for (j = 0; j < n; ++j) x[j] *= inv;
}

namespace {

// The first index of `mx`, the row's maximum (row_max).
int first_index_of(const float* row, int n, float mx) {
  int j = 0;
  while (j < n - 1 && !(row[j] == mx)) ++j;
  return j;
}

}  // namespace

int argmax(const float* row, int n) { return first_index_of(row, n, row_max(row, n)); }

TokenLogprob token_logprob(const float* row, int vocab, int token) {
  const float mx = row_max(row, vocab);
  const double sum = sum_exp(row, vocab, mx);
  return {static_cast<double>(row[token]) - mx - std::log(sum),
          first_index_of(row, vocab, mx) == token};
}

TokenLogprob token_logprob_reference(const float* row, int vocab, int token) {
  int best = 0;
  float mx = row[0];
  for (int v = 1; v < vocab; ++v)
    if (row[v] > mx) mx = row[v], best = v;
  double sum = 0;
  for (int v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(row[v]) - mx);
  return {static_cast<double>(row[token]) - mx - std::log(sum), best == token};
}

// silu(g) = g · sigmoid(g), sigmoid from e = exp(-|g|) <= 1: 1 / (1 + e) for g >= 0,
// e / (1 + e) below.
__attribute__((target_clones("avx512f", "avx2", "default"))) void silu_mul(float* g, const float* u,
                                                                           size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float x = g[i];
    const float e = exp_nonpos(x < 0 ? x : -x);
    const float num = x < 0 ? e : 1.0f;
    g[i] = x * num / (1.0f + e) * u[i];
  }
}

void silu_mul_reference(float* g, const float* u, size_t n) {
  for (size_t i = 0; i < n; ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

}  // namespace scalesweep::model
