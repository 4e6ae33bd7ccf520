#include "tools/seqlen.h"

#include <cstdio>
#include <stdexcept>

namespace scalesweep::tools {

int64_t cap_seqlen(int64_t seqlen, int64_t max_seq_len, const std::string& model,
                   const std::string& option) {
  if (max_seq_len < 1)
    throw std::invalid_argument(model + ": max_seq_len " + std::to_string(max_seq_len) +
                                " in its config is not a sequence length");
  if (seqlen <= max_seq_len) return seqlen;
  std::fprintf(stderr, "note: %s %lld exceeds %s's max_seq_len %lld; using %lld\n", option.c_str(),
               static_cast<long long>(seqlen), model.c_str(), static_cast<long long>(max_seq_len),
               static_cast<long long>(max_seq_len));
  std::fflush(stderr);
  return max_seq_len;
}

}  // namespace scalesweep::tools
