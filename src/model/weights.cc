// Storage helpers of model::Weights.
#include <memory>
#include <vector>

#include "scalesweep/model/config.h"

namespace scalesweep::model {

float* Weights::alloc(Tensor& t, std::vector<int64_t> shape) {
  t.shape = std::move(shape);
  auto buf = std::make_shared<std::vector<float>>(static_cast<size_t>(t.numel()), 0.0f);
  t.data = buf->data();
  storage.push_back(buf);
  return buf->data();
}

}  // namespace scalesweep::model
