// llama2.c checkpoints (legacy and version 1): io::is_llama2c_file and io::load_llama2c over
// the bytes as a file.
#include "fuzz_util.h"
#include "scalesweep/io/llama2c.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace scalesweep::io;
  ss_fuzz::MemFile f(data, size);
  ss_fuzz::expect_clear_refusal([&] {
    (void)is_llama2c_file(f.path());
    Llama2cFormat fmt{};
    scalesweep::model::Weights w = load_llama2c(f.path(), &fmt);
    (void)w;
  });
  return 0;
}
