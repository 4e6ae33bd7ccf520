// scalesweep convert LLAMA2C.bin|MODEL.gguf [--tokenizer tok.bin] -o DIR [--dtype f32|bf16|f16]
//   [--shard-mb N] [--force] [--json]
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "scalesweep/io/convert.h"
#include "tools/command.h"
#include "tools/options.h"
#include "tools/ui.h"

namespace scalesweep::tools {
namespace {

struct ConvertArgs {
  std::string input, tokenizer, dtype = "f32";
  double shard_mb = 0;
  OutputOptions out;  // -o DIR, --force, --json
};

int run_convert(const ConvertArgs& a) {
  a.out.check_dir({a.input, a.tokenizer});
  io::ConvertOptions o;
  o.tokenizer = a.tokenizer;
  o.overwrite = a.out.force;
  if (a.dtype == "f32" || a.dtype == "float32")
    o.dtype = DType::kF32;
  else if (a.dtype == "bf16" || a.dtype == "bfloat16")
    o.dtype = DType::kBF16;
  else if (a.dtype == "f16" || a.dtype == "float16")
    o.dtype = DType::kF16;
  else
    throw std::invalid_argument("--dtype must be f32, bf16 or f16, got '" + a.dtype + "'");
  if (!(a.shard_mb >= 0)) throw std::invalid_argument("--shard-mb must be >= 0");
  o.shard_bytes = static_cast<uint64_t>(a.shard_mb * 1024.0 * 1024.0);
  const io::ConvertReport r = io::convert_to_hf(a.input, a.out.path, o);
  const model::Config& c = r.config;
  if (a.out.json) {
    nlohmann::json j = {{"output", a.out.path},
                        {"source_format", r.source_format},
                        {"architecture", std::string(model::kArchClassNames.name(c.arch))},
                        {"dtype", a.dtype},
                        {"parameters", r.parameters},
                        {"tensors", r.tensors},
                        {"bytes", r.bytes},
                        {"tokenizer", r.tokenizer_path.empty() ? nlohmann::json(nullptr)
                                                               : nlohmann::json(r.tokenizer_path)},
                        {"vocab", r.vocab},
                        {"merges", r.merges},
                        {"seconds", r.seconds}};
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  Table t({"field", "value"});
  t.add_row({"source", a.input + " (" + r.source_format + ")"});
  t.add_row({"output", a.out.path});
  t.add_row({"layers x dim", strf("%d x %d (hidden %d)", c.n_layers, c.dim, c.hidden_dim)});
  t.add_row(
      {"heads / kv heads", strf("%d / %d (head_dim %d)", c.n_heads, c.n_kv_heads, c.head_dim)});
  t.add_row({"vocab / max seq", strf("%d / %d", c.vocab_size, c.max_seq_len)});
  t.add_row({"tied embeddings", c.tied_embeddings ? "yes" : "no"});
  t.add_row({"parameters", strf("%lld", static_cast<long long>(r.parameters))});
  t.add_row({"weights",
             strf("%s, %llu bytes", a.dtype.c_str(), static_cast<unsigned long long>(r.bytes))});
  t.add_row({"tokenizer", r.tokenizer_path.empty()
                              ? std::string(r.source_format == "gguf"
                                                ? "none (the GGUF file has no tokenizer)"
                                                : "none (no tokenizer.bin found; give --tokenizer)")
                              : strf("%s -> tokenizer.json (%d tokens, %d merges)",
                                     r.tokenizer_path.c_str(), r.vocab, r.merges)});
  t.add_row({"seconds", strf("%.3f", r.seconds)});
  t.print();
  return 0;
}

SS_COMMAND(
    "convert",
    "Convert a llama2.c checkpoint (+ tokenizer.bin) or a GGUF file (dequantized) to a Hugging "
    "Face directory (config.json, model.safetensors with rotate-half q/k rows, tokenizer.json)",
    [](CLI::App& sub) -> std::function<int()> {
      auto a = std::make_shared<ConvertArgs>();
      sub.add_option("input", a->input, "llama2.c checkpoint (.bin, legacy or v1) or GGUF file")
          ->required();
      sub.add_option("--tokenizer", a->tokenizer,
                     "llama2.c tokenizer.bin; empty: tokenizer.bin / tok<vocab>.bin beside "
                     "the model (not used with a GGUF input)");
      sub.add_option("--dtype", a->dtype, "weights dtype: f32 | bf16 | f16");
      sub.add_option("--shard-mb", a->shard_mb,
                     "split weights into shards of about this many MiB (0 = one file)");
      add_output_options(
          sub, a->out,
          required_output("output directory (created atomically)",
                          "replace an existing output (never the input or a directory holding it)",
                          "print a JSON summary"));
      return [a] { return run_convert(*a); };
    });

}  // namespace
}  // namespace scalesweep::tools
