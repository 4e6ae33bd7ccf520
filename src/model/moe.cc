// The mixture-of-experts router (include/scalesweep/model/moe.h) and the refusal of paths that
// do not handle MoE models yet (model/config.h refuse_moe).
#include "scalesweep/model/moe.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "model/vec_math.h"
#include "scalesweep/model/config.h"

namespace scalesweep::model {

void refuse_moe(const Config& c, const std::string& what) {
  if (c.moe())
    throw std::invalid_argument("mixture-of-experts models are not yet supported by " + what);
}

void topk_like_torch(const float* v, int n, int k, int* idx) {
  if (k < 1 || k > n)
    throw std::invalid_argument("topk: k = " + std::to_string(k) + " outside [1, " +
                                std::to_string(n) + "]");
  // ATen compares in the accumulation type (double for float); the order is the same.
  using Elem = std::pair<double, int64_t>;
  std::vector<Elem> q(static_cast<size_t>(n));
  for (int j = 0; j < n; ++j) q[static_cast<size_t>(j)] = {v[j], j};
  const auto greater = [](const Elem& x, const Elem& y) {
    return (std::isnan(x.first) && !std::isnan(y.first)) || x.first > y.first;
  };
  if (int64_t{k} * 64 <= n) {
    std::partial_sort(q.begin(), q.begin() + k, q.end(), greater);
  } else {
    std::nth_element(q.begin(), q.begin() + (k - 1), q.end(), greater);
    std::sort(q.begin(), q.begin() + (k - 1), greater);
  }
  for (int j = 0; j < k; ++j) idx[j] = static_cast<int>(q[static_cast<size_t>(j)].second);
}

void route_token(float* logits, int n_experts, int k, bool renormalize, int* idx, float* weight) {
  if (k < 1 || k > n_experts)
    throw std::invalid_argument("router: experts per token " + std::to_string(k) + " outside [1, " +
                                std::to_string(n_experts) + "]");
  softmax_inplace(logits, n_experts);
  topk_like_torch(logits, n_experts, k, idx);
  float sum = 0.0f;
  for (int j = 0; j < k; ++j) {
    weight[j] = logits[idx[j]];
    sum += weight[j];
  }
  if (renormalize)
    for (int j = 0; j < k; ++j) weight[j] /= sum;
}

}  // namespace scalesweep::model
