// Vector math of the runtime's elementwise steps, each beside its plain reference:
// exp for non-positive arguments, softmax, the log-probability of one token under a row of
// logits (scoring), and SwiGLU's silu(g)·u. The fast forms are written for the compiler to
// vectorize (AVX-512 / AVX2 clones); model/vec_math_test.cc holds them to the references.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace scalesweep::model {

// exp(x) for x <= 0 (softmax after subtracting the max): Cody-Waite reduction to
// r in [-ln2/2, ln2/2], degree-6 Taylor polynomial, times 2^n: within 2.5e-7 relative (about
// 2 ulp; model/vec_math_test.cc sweeps it).
// Inputs below -87 give exp(-87).
inline float exp_nonpos(float x) {
  x = x < -87.0f ? -87.0f : x;
  const float t = x * 1.44269504088896341f;
  const float fn = (t + 12582912.0f) - 12582912.0f;  // round to nearest
  float r = x - fn * 0.693145751953125f;
  r = r - fn * 1.428606765330187045e-06f;
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(fn) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return p * scale;
}

// In-place softmax over x[0, n), n >= 1.
void softmax_inplace(float* x, int n);

// log softmax(row)[token] and whether `token` is the row's first maximum (greedy).
struct TokenLogprob {
  double logprob;
  bool greedy;
};
// Fast: max and exp in 16 float lanes, the exponentials summed in double per 256 entries.
TokenLogprob token_logprob(const float* row, int vocab, int token);
// Reference: one scalar pass, std::exp in double.
TokenLogprob token_logprob_reference(const float* row, int vocab, int token);

// The index of the row's first maximum.
int argmax(const float* row, int n);

// g[i] = silu(g[i]) · u[i] = g[i] / (1 + exp(-g[i])) · u[i] for i < n.
void silu_mul(float* g, const float* u, size_t n);
void silu_mul_reference(float* g, const float* u, size_t n);

}  // namespace scalesweep::model
