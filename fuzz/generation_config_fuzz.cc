// Hugging Face generation_config.json (the EOS list, pad and sampling defaults carried to every
// output): io::parse_generation_config over the text; what parses must write back to text
// that parses to the same ids.
#include "fuzz_util.h"
#include "scalesweep/io/chat_meta.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace scalesweep::io;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  ss_fuzz::expect_clear_refusal([&] {
    const ChatMeta m = parse_generation_config(text, "generation_config.json");
    const ChatMeta back = parse_generation_config(generation_config_json(m), "written.json");
    if (back.bos_id != m.bos_id || back.eos_ids != m.eos_ids || back.pad_id != m.pad_id)
      std::abort();  // the writer lost or changed an id it had read
  });
  return 0;
}
