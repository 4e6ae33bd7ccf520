// Hugging Face config.json: io::parse_hf_config over the text.
#include "fuzz_util.h"
#include "scalesweep/io/hf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace scalesweep::io;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  ss_fuzz::expect_clear_refusal([&] { (void)parse_hf_config(text, "config.json"); });
  return 0;
}
