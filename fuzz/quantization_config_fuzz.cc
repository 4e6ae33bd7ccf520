// compressed-tensors quantization_config: io::parse_quantization_config over a config.json
// object (the harness parses the JSON; bytes that are not JSON are skipped).
#include <nlohmann/json.hpp>

#include "fuzz_util.h"
#include "scalesweep/io/compressed_tensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace scalesweep::io;
  nlohmann::json j = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return -1;  // not JSON: keep out of the corpus
  ss_fuzz::expect_clear_refusal([&] {
    CtInfo ct = parse_quantization_config(j, "config.json");
    if (ct.present && ct.nvfp4 && ct.group_size != 16) std::abort();
  });
  return 0;
}
