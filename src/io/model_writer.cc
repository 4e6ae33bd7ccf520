#include "scalesweep/io/model_writer.h"

#include "scalesweep/io/checkpoint.h"
#include "scalesweep/io/gguf_writer.h"

namespace scalesweep::io {

bool is_gguf_path(const std::string& out) { return out.ends_with(".gguf"); }

std::unique_ptr<ModelWriter> open_model_writer(const std::string& out,
                                               const std::function<CheckpointSpec()>& ct,
                                               const std::function<GgufModelSpec()>& gguf) {
  if (is_gguf_path(out)) return std::make_unique<GgufModelWriter>(out, gguf());
  return std::make_unique<CheckpointWriter>(out, ct());
}

}  // namespace scalesweep::io
