// GGUF: io::GgufFile::open (header, metadata, tensor infos, data bounds) over the bytes as a
// file, every typed getter on every key, dequantization of every (small) tensor, the model
// config and tokenizer spec that io/gguf_model reads from the metadata, and, for a small file,
// the model's weights (io::load_gguf_weights: shapes, q/k order, per-tensor and per-expert
// `.scale`, MoE expert stacks).
#include "fuzz_util.h"
#include "scalesweep/io/gguf.h"
#include "scalesweep/io/gguf_model.h"
#include "scalesweep/model/hf_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace scalesweep::io;
  ss_fuzz::MemFile f(data, size);
  ss_fuzz::expect_clear_refusal([&] {
    (void)GgufFile::sniff(f.path());
    GgufFile g = GgufFile::open(f.path());
    for (const auto& kv : g.metadata()) {
      const std::string& k = kv.first;
      ss_fuzz::expect_clear_refusal([&] { (void)g.get_string(k); });
      ss_fuzz::expect_clear_refusal([&] { (void)g.get_int(k); });
      ss_fuzz::expect_clear_refusal([&] { (void)g.get_float(k); });
      ss_fuzz::expect_clear_refusal([&] { (void)g.get_bool(k); });
      ss_fuzz::expect_clear_refusal([&] { (void)g.get_string_array(k); });
      ss_fuzz::expect_clear_refusal([&] { (void)g.get_float_array(k); });
      ss_fuzz::expect_clear_refusal([&] { (void)g.get_int_array(k); });
    }
    for (const GgufTensorInfo& t : g.tensors())
      if (t.numel() <= ss_fuzz::kMaxDecodeElems)
        ss_fuzz::expect_clear_refusal([&] {
          std::vector<float> v = g.dequantize(t);
          if (static_cast<int64_t>(v.size()) != t.numel()) std::abort();
        });
    ss_fuzz::expect_clear_refusal([&] {
      (void)gguf_model_config(
          g.metadata(), [&](std::string_view n) { return g.find_tensor(n) != nullptr; },
          "fuzz.gguf");
    });
    int64_t elems = 0;
    for (const GgufTensorInfo& t : g.tensors())
      if ((elems += t.numel()) > ss_fuzz::kMaxDecodeElems) break;
    if (elems <= ss_fuzz::kMaxDecodeElems)
      ss_fuzz::expect_clear_refusal([&] { (void)load_gguf_weights(g); });
    if (gguf_has_tokenizer(g.metadata()))
      ss_fuzz::expect_clear_refusal([&] {
        scalesweep::model::HfBpeTokenizer tok(gguf_tokenizer_spec(g.metadata(), "fuzz.gguf"));
        (void)tok.decode(tok.encode("Hello world 12", true, false));
      });
  });
  return 0;
}
