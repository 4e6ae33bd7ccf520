// scalesweep convert LLAMA2C.bin|MODEL.gguf [--tokenizer tok.bin] -o DIR [--dtype f32|bf16|f16]
//   [--shard-mb N] [--force] [--json]
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "scalesweep/io/convert.h"
#include "scalesweep/io/gguf_writer.h"
#include "scalesweep/pipeline/gguf_convert.h"
#include "scalesweep/pipeline/quantize_model.h"
#include "tools/command.h"
#include "tools/options.h"
#include "tools/ui.h"

namespace scalesweep::tools {
namespace {

struct ConvertArgs {
  std::string input, tokenizer, dtype = "f32";
  double shard_mb = 0;
  bool dequantize = false;
  OutputOptions out;  // -o DIR, --force, --json
};

// NVFP4 without re-quantizing: compressed-tensors directory -> .gguf, NVFP4 GGUF -> directory.
int run_nvfp4_convert(const ConvertArgs& a, bool to_gguf) {
  if (!a.tokenizer.empty())
    throw std::invalid_argument(
        "--tokenizer is not used by NVFP4 conversion (the tokenizer "
        "comes from the source)");
  if (a.shard_mb != 0) throw std::invalid_argument("--shard-mb is not used by NVFP4 conversion");
  pipeline::Nvfp4ConvertReport r;
  if (to_gguf) {
    const auto d = io::kGgufDenseNames.find(a.dtype == "float32"    ? "f32"
                                            : a.dtype == "float16"  ? "f16"
                                            : a.dtype == "bfloat16" ? "bf16"
                                                                    : a.dtype);
    if (!d)
      throw std::invalid_argument("--dtype '" + a.dtype + "': expected " +
                                  io::kGgufDenseNames.accepted() + " for a GGUF output");
    a.out.check_file({a.input});
    r = pipeline::convert_ct_to_gguf(a.input, a.out.path, *d, a.out.force, print_note);
  } else {
    const DType d = parse_named(kDTypeNames, "--dtype", a.dtype);
    a.out.check_dir({a.input});
    r = pipeline::convert_gguf_to_ct(a.input, a.out.path, d, a.out.force, print_note);
  }
  if (a.out.json) {
    nlohmann::json j = {{"output", r.out},
                        {"direction", to_gguf ? "ct->gguf" : "gguf->ct"},
                        {"nvfp4_linears", r.nvfp4_linears},
                        {"dense_linears", r.dense_linears},
                        {"global_scales_recorded", r.global_scales_recorded},
                        {"bytes", r.bytes},
                        {"seconds", r.seconds}};
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf(
      "wrote %s (%s, %d NVFP4 Linears carried over bit for bit, %d dense%s, %.2f MB) in "
      "%.2f s\n",
      r.out.c_str(), to_gguf ? "compressed-tensors -> GGUF" : "GGUF -> compressed-tensors",
      r.nvfp4_linears, r.dense_linears,
      to_gguf                    ? ""
      : r.global_scales_recorded ? ", global scales from the record"
                                 : ", global scales = 1/scale",
      static_cast<double>(r.bytes) / 1e6, r.seconds);
  return 0;
}

int run_convert(const ConvertArgs& a) {
  if (io::is_gguf_path(a.out.path)) {
    if (!pipeline::is_nvfp4_checkpoint(a.input))
      throw std::invalid_argument(a.input +
                                  ": -o .gguf converts a compressed-tensors NVFP4 checkpoint "
                                  "directory (use `quantize -o OUT.gguf` for other models)");
    return run_nvfp4_convert(a, true);
  }
  if (!a.dequantize && pipeline::gguf_has_nvfp4(a.input)) return run_nvfp4_convert(a, false);
  a.out.check_dir({a.input, a.tokenizer});
  io::ConvertOptions o;
  o.tokenizer = a.tokenizer;
  o.overwrite = a.out.force;
  o.dtype = parse_named(kDTypeNames, "--dtype", a.dtype);
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
    "Face directory (config.json, model.safetensors with rotate-half q/k rows, tokenizer.json); "
    "NVFP4 without re-quantizing: a compressed-tensors directory -> OUT.gguf, an NVFP4 GGUF -> "
    "a compressed-tensors directory",
    [](CLI::App& sub) -> std::function<int()> {
      auto a = std::make_shared<ConvertArgs>();
      sub.add_option("input", a->input,
                     "llama2.c checkpoint (.bin, legacy or v1), GGUF file, or (with -o "
                     "OUT.gguf) a compressed-tensors NVFP4 directory")
          ->required();
      sub.add_option("--tokenizer", a->tokenizer,
                     "llama2.c tokenizer.bin; empty: tokenizer.bin / tok<vocab>.bin beside "
                     "the model (not used with a GGUF input)");
      sub.add_option("--dtype", a->dtype,
                     "weights dtype: f32 | bf16 | f16 (| q8_0 for a .gguf output); NVFP4 "
                     "conversion: the dtype of the dense tensors");
      sub.add_flag("--dequantize", a->dequantize,
                   "an NVFP4 GGUF input: write a dense Hugging Face directory (weights x "
                   ".scale in fp32) instead of a compressed-tensors NVFP4 checkpoint");
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
