// llama2.c tokenizer.bin: model::Llama2cTokenizer::load over the bytes as a file, then an
// encode/decode of a fixed text.
#include "fuzz_util.h"
#include "scalesweep/model/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace scalesweep::model;
  ss_fuzz::MemFile f(data, size);
  ss_fuzz::expect_clear_refusal([&] {
    auto tok = Llama2cTokenizer::load(f.path());
    const std::vector<int> ids = tok->encode("Once upon a time, caf\xc3\xa9 42!\n", true, true);
    for (int id : ids)
      if (id < 0 || id >= tok->vocab_size()) std::abort();
    (void)tok->decode(ids);
  });
  return 0;
}
