// The mixture-of-experts router of Qwen3-MoE and Mixtral, as transformers 5.23 defines it
// (Qwen3MoeTopKRouter, MixtralTopKRouter) for one token:
//
//   p = softmax(logits)                       fp32, over all n_experts
//   (idx, w) = topk(p, k)                     torch.topk's order, ties included (topk_like_torch)
//   if renormalize: w /= (w[0] + ... + w[k-1])   Qwen3-MoE's norm_topk_prob; Mixtral always
//
// The forward pass (src/model/transformer.cc, Transformer::moe) then adds w[j] times expert
// idx[j]'s output to the token's output, experts in ascending index order.
#pragma once

namespace scalesweep::model {

// The indices of the k largest of v[0, n) (1 <= k <= n) in the order torch.topk(v, k,
// largest=True, sorted=True) returns them on the CPU (ATen's topk_impl_loop with libstdc++'s
// algorithms): (value, index) pairs in index order, then std::partial_sort of the first k when
// k * 64 <= n, else std::nth_element at k - 1 and std::sort of the first k - 1, comparing values
// only with a NaN above every number. Equal values therefore land where those algorithms leave
// them (not necessarily the lowest index first: torch picks experts {2, 3} of four equal
// probabilities for k = 2), which is what makes the choice among tied experts transformers'.
void topk_like_torch(const float* v, int n, int k, int* idx);

// Routes one token: probs = softmax(logits[0, n_experts)) (overwrites `logits`), the top k as
// topk_like_torch into idx[0, k), their probabilities into weight[0, k), divided by their sum
// (summed in idx order) when `renormalize`. Throws std::invalid_argument unless
// 1 <= k <= n_experts.
void route_token(float* logits, int n_experts, int k, bool renormalize, int* idx, float* weight);

}  // namespace scalesweep::model
