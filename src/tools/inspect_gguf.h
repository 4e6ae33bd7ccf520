// scalesweep inspect FILE.gguf: lists a GGUF file's metadata and tensors (text or --json) and
// optionally writes its tensors dequantized to fp32 safetensors (--dump-dequant, --tensor).
#pragma once

#include <string>
#include <vector>

namespace scalesweep::tools {

struct InspectGgufArgs {
  std::string path, dump;
  std::vector<std::string> tensors;  // --tensor NAME (repeatable); empty: all
  bool json_out = false, force = false;
};

int run_inspect_gguf(const InspectGgufArgs& a);

}  // namespace scalesweep::tools
