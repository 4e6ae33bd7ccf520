// Task-evaluation engine: loglikelihoods with shared contexts, greedy generation until stop
// strings (scalesweep/model/scoring.h).
#include "scalesweep/model/scoring.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>

#include "model/f32_gemm.h"
#include "model/vec_math.h"
#include "scalesweep/base/parallel.h"

namespace scalesweep::model {
namespace {

// A shared preamble shorter than this runs with each document (no gain in keeping it apart).
constexpr int kMinPrefix = 32;
// Rows of logits computed in one product ([rows, vocab] floats of scratch).
constexpr int kLogitRows = 256;

void check_ids(const std::vector<int>& ids, int vocab, const char* what, size_t doc, size_t req) {
  if (ids.empty())
    throw std::invalid_argument("document " + std::to_string(doc) + ", request " +
                                std::to_string(req) + ": empty " + what);
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= vocab)
      throw std::invalid_argument("document " + std::to_string(doc) + ", request " +
                                  std::to_string(req) + ": " + what + " token " +
                                  std::to_string(i) + " = " + std::to_string(ids[i]) +
                                  " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
}

// Runs `body(worker_tf, doc)` for every doc index on `threads` workers taking documents in
// order from a shared counter; the first exception stops the others and is rethrown.
template <class Init, class Body>
void run_docs(size_t n_docs, int threads, const TransformerFactory& make, Init&& init, Body&& body,
              const std::function<void(int64_t, int64_t)>& progress) {
  const int workers =
      static_cast<int>(std::min<size_t>(std::max<size_t>(n_docs, 1), resolve_threads(threads)));
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::atomic<int64_t> done{0};
  std::mutex progress_mu;
  OneBlasThread one_blas;
  parallel_for(workers, workers, [&](int64_t, int64_t, int) {
    // The workers occupy every core: each one's products run on its own thread.
    const int saved_gemm = set_gemm_threads(1);
    struct Restore {
      int v;
      ~Restore() { set_gemm_threads(v); }
    } restore{saved_gemm};
    try {
      std::unique_ptr<Transformer> tf = make();
      init(*tf);
      for (size_t d; !failed.load() && (d = next.fetch_add(1)) < n_docs;) {
        body(*tf, d);
        const int64_t k = ++done;
        if (progress) {
          std::lock_guard<std::mutex> lock(progress_mu);
          progress(k, static_cast<int64_t>(n_docs));
        }
      }
    } catch (...) {
      failed = true;
      throw;
    }
  });
}

// The context every request is scored after, checked first: its tokens and the
// continuation's in the vocabulary, the continuation within max_len, and the context cut from
// the left so that context + continuation fits (ctx + cont)[-(L+1):][:-1].
std::vector<std::vector<std::vector<int>>> scored_contexts(
    const std::vector<std::vector<LoglikelihoodRequest>>& docs, int vocab_size, int max_len) {
  std::vector<std::vector<std::vector<int>>> ctx(docs.size());
  for (size_t d = 0; d < docs.size(); ++d) {
    if (docs[d].empty())
      throw std::invalid_argument("document " + std::to_string(d) + ": no request");
    for (size_t r = 0; r < docs[d].size(); ++r) {
      const LoglikelihoodRequest& q = docs[d][r];
      check_ids(q.context, vocab_size, "context", d, r);
      check_ids(q.continuation, vocab_size, "continuation", d, r);
      if (static_cast<int64_t>(q.continuation.size()) > max_len)
        throw std::invalid_argument(
            "document " + std::to_string(d) + ", request " + std::to_string(r) +
            ": the continuation has " + std::to_string(q.continuation.size()) +
            " tokens, more than the model's context of " + std::to_string(max_len));
      // (ctx + cont)[-(L+1):][:-1]: drop context tokens from the left.
      const int64_t over = static_cast<int64_t>(q.context.size() + q.continuation.size()) -
                           (static_cast<int64_t>(max_len) + 1);
      std::vector<int> c = q.context;
      if (over > 0) c.erase(c.begin(), c.begin() + std::min<int64_t>(over, c.size() - 1));
      // Whole context cut away (a continuation of max_len tokens): its first token stays as
      // context and is not scored, which lm-eval does the same way.
      ctx[d].push_back(std::move(c));
    }
  }
  return ctx;
}

// The prefix shared by every context, kept one token short of the shortest context (empty
// when shorter than kMinPrefix).
std::vector<int> shared_prefix(const std::vector<std::vector<std::vector<int>>>& ctx) {
  size_t prefix = std::string::npos;
  for (size_t d = 0; d < ctx.size(); ++d)
    for (const auto& c : ctx[d]) {
      if (prefix == std::string::npos) {
        prefix = c.size() - 1;
        continue;
      }
      const auto& c0 = ctx[0][0];
      size_t k = 0;
      while (k < prefix && k < c.size() - 1 && c[k] == c0[k]) ++k;
      prefix = k;
    }
  if (prefix == std::string::npos || prefix < static_cast<size_t>(kMinPrefix)) prefix = 0;
  return prefix > 0 ? std::vector<int>(ctx[0][0].begin(), ctx[0][0].begin() + prefix)
                    : std::vector<int>{};
}

// A worker's buffers, reused from one context to the next.
struct ScoreScratch {
  std::vector<float> rows, logits;
  std::vector<int> branch_tokens, branch_lens;
};

// The hidden rows that predict the continuations of the requests `reqs` of one context c
// (tokens P.. run after the shared prefix): per request the context's last row, then its
// branch rows.
void continuation_rows(Transformer& tf, const std::vector<LoglikelihoodRequest>& doc,
                       const std::vector<int>& c, const std::vector<size_t>& reqs, int P,
                       ScoreScratch& s) {
  const int dim = tf.config().dim;
  const int n_ctx = static_cast<int>(c.size());
  const float* h = tf.forward_hidden(c.data() + P, n_ctx - P, P);
  const std::vector<float> last(h + static_cast<size_t>(n_ctx - P - 1) * dim,
                                h + static_cast<size_t>(n_ctx - P) * dim);
  // Every continuation but its last token, as branches of this context in one pass
  // (one read of the weights for all of them) when their cache slots fit; else one
  // pass each.
  s.branch_tokens.clear();
  s.branch_lens.clear();
  for (size_t r : reqs) {
    const std::vector<int>& t = doc[r].continuation;
    if (t.size() > 1) {
      s.branch_tokens.insert(s.branch_tokens.end(), t.begin(), t.end() - 1);
      s.branch_lens.push_back(static_cast<int>(t.size()) - 1);
    }
  }
  const bool batched =
      !s.branch_lens.empty() &&
      n_ctx + static_cast<int64_t>(s.branch_tokens.size()) <= tf.config().max_seq_len;
  const float* hb = batched ? tf.forward_branches(s.branch_tokens.data(), s.branch_lens.data(),
                                                  static_cast<int>(s.branch_lens.size()), n_ctx)
                            : nullptr;
  s.rows.clear();
  for (size_t r : reqs) {
    const std::vector<int>& t = doc[r].continuation;
    const int n = static_cast<int>(t.size());
    s.rows.insert(s.rows.end(), last.begin(), last.end());
    if (n > 1) {
      const float* hc = batched ? hb : tf.forward_hidden(t.data(), n - 1, n_ctx);
      s.rows.insert(s.rows.end(), hc, hc + static_cast<size_t>(n - 1) * dim);
      if (batched) hb += static_cast<size_t>(n - 1) * dim;
    }
  }
}

// Scores the requests `reqs` of one context from their rows in s.rows into res: all rows'
// logits at once (bounded: at most kLogitRows rows a product).
void score_rows(Transformer& tf, const std::vector<LoglikelihoodRequest>& doc,
                const std::vector<size_t>& reqs, int vocab_size, ScoreScratch& s,
                std::vector<LoglikelihoodResult>& res) {
  const int dim = tf.config().dim;
  const int total = static_cast<int>(s.rows.size() / dim);
  size_t next_req = 0;
  int req_row = 0;  // rows of the current request already scored
  for (int r0 = 0; r0 < total; r0 += kLogitRows) {
    const int nr = std::min(kLogitRows, total - r0);
    s.logits.resize(static_cast<size_t>(nr) * vocab_size);
    tf.logits(s.rows.data() + static_cast<size_t>(r0) * dim, nr, s.logits.data());
    for (int i = 0; i < nr; ++i) {
      const std::vector<int>& t = doc[reqs[next_req]].continuation;
      LoglikelihoodResult& lr = res[reqs[next_req]];
      if (req_row == 0) {
        lr.greedy = true;
        lr.tokens = static_cast<int>(t.size());
      }
      const auto [lp, top] = token_logprob(s.logits.data() + static_cast<size_t>(i) * vocab_size,
                                           vocab_size, t[req_row]);
      lr.logprob += lp;
      lr.greedy = lr.greedy && top;
      if (++req_row == static_cast<int>(t.size())) {
        req_row = 0;
        ++next_req;
      }
    }
  }
}

// The requests of one document, its distinct contexts each run once (in first-seen order)
// after the shared prefix of P tokens.
std::vector<LoglikelihoodResult> score_document(Transformer& tf,
                                                const std::vector<LoglikelihoodRequest>& doc,
                                                const std::vector<std::vector<int>>& ctx, int P,
                                                int vocab_size) {
  std::vector<LoglikelihoodResult> res(doc.size());
  std::map<std::vector<int>, std::vector<size_t>> by_ctx;
  std::vector<const std::vector<int>*> order;
  for (size_t r = 0; r < doc.size(); ++r) {
    auto [it, fresh] = by_ctx.try_emplace(ctx[r]);
    if (fresh) order.push_back(&it->first);
    it->second.push_back(r);
  }
  ScoreScratch s;
  for (const std::vector<int>* cp : order) {
    const std::vector<size_t>& reqs = by_ctx.at(*cp);
    continuation_rows(tf, doc, *cp, reqs, P, s);
    score_rows(tf, doc, reqs, vocab_size, s, res);
  }
  return res;
}

}  // namespace

std::pair<std::string, bool> cut_at_stop(const std::string& text,
                                         const std::vector<std::string>& until) {
  size_t cut = std::string::npos;
  for (const std::string& s : until)
    if (!s.empty()) cut = std::min(cut, text.find(s));
  if (cut == std::string::npos) return {text, false};
  return {text.substr(0, cut), true};
}

std::vector<std::vector<LoglikelihoodResult>> score_loglikelihood(
    const TransformerFactory& make, const Config& cfg,
    const std::vector<std::vector<LoglikelihoodRequest>>& docs, const ScoringOptions& opt,
    const std::function<void(int64_t, int64_t)>& progress) {
  const int vocab_size = cfg.vocab_size;
  const int max_len =
      opt.max_length > 0 ? std::min(opt.max_length, cfg.max_seq_len) : cfg.max_seq_len;
  const std::vector<std::vector<std::vector<int>>> ctx = scored_contexts(docs, vocab_size, max_len);
  const std::vector<int> pre = shared_prefix(ctx);
  std::vector<std::vector<LoglikelihoodResult>> out(docs.size());
  run_docs(
      docs.size(), opt.threads, make,
      [&](Transformer& tf) {
        if (!pre.empty()) tf.forward_hidden(pre.data(), static_cast<int>(pre.size()), 0);
      },
      [&](Transformer& tf, size_t d) {
        out[d] = score_document(tf, docs[d], ctx[d], static_cast<int>(pre.size()), vocab_size);
      },
      progress);
  return out;
}

std::vector<GenerationResult> generate_until(
    const TransformerFactory& make, const Config& cfg, const Tokenizer& tok,
    const std::vector<GenerationRequest>& requests, const ScoringOptions& opt,
    const std::function<void(int64_t, int64_t)>& progress) {
  const int vocab_size = cfg.vocab_size;
  const int max_len =
      opt.max_length > 0 ? std::min(opt.max_length, cfg.max_seq_len) : cfg.max_seq_len;
  for (size_t d = 0; d < requests.size(); ++d) {
    check_ids(requests[d].context, vocab_size, "context", d, 0);
    if (requests[d].max_tokens < 1 || requests[d].max_tokens >= max_len)
      throw std::invalid_argument("document " + std::to_string(d) + ": max_tokens " +
                                  std::to_string(requests[d].max_tokens) +
                                  " must be in [1, model context " + std::to_string(max_len) + ")");
  }
  std::vector<GenerationResult> out(requests.size());
  run_docs(
      requests.size(), opt.threads, make, [](Transformer&) {},
      [&](Transformer& tf, size_t d) {
        const GenerationRequest& q = requests[d];
        const int keep = max_len - q.max_tokens;  // lm-eval: context cut to L - max_gen_toks
        std::vector<int> c = q.context;
        if (static_cast<int>(c.size()) > keep) c.erase(c.begin(), c.end() - keep);
        const int dim = tf.config().dim;
        const int n = static_cast<int>(c.size());
        const float* h = tf.forward_hidden(c.data(), n, 0);
        std::vector<float> row(vocab_size);
        tf.logits(h + static_cast<size_t>(n - 1) * dim, 1, row.data());
        const float* lg = row.data();
        GenerationResult& g = out[d];
        std::string text;
        int prev = -1, pos = n;
        const int eos = tok.eos();
        while (g.tokens < q.max_tokens) {
          const int next = argmax(lg, vocab_size);
          if (next == eos) {
            g.stopped = true;
            break;
          }
          ++g.tokens;
          text += tok.decode_token(prev, next);
          prev = next;
          auto [cut, found] = cut_at_stop(text, q.until);
          if (found) {
            text = std::move(cut);
            g.stopped = true;
            break;
          }
          if (pos >= tf.config().max_seq_len) break;
          lg = tf.decode(next, pos++);
        }
        g.text = std::move(text);
      },
      progress);
  return out;
}

}  // namespace scalesweep::model
