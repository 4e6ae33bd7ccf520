// Hugging Face tokenizer.json: model::parse_tokenizer_json, the tokenizer built from it
// (which validates the spec), then an encode/decode of a fixed text.
#include "fuzz_util.h"
#include "scalesweep/model/hf_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace scalesweep::model;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  ss_fuzz::expect_clear_refusal([&] {
    HfBpeTokenizer tok(parse_tokenizer_json(text, "tokenizer.json"));
    const std::vector<int> ids =
        tok.encode("Hello, world! 123 caf\xc3\xa9 \xe2\x96\x81x\n\t  y", true, true);
    for (int id : ids)
      if (id < 0 || id >= tok.vocab_size()) std::abort();
    (void)tok.decode(ids);
  });
  return 0;
}
