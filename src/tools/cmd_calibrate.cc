// scalesweep calibrate MODEL --text FILE --nsamples N --seqlen L --seed 0 -o STATS.safetensors
//   [--force] [--json]
#include <algorithm>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "scalesweep/io/calib_stats.h"
#include "scalesweep/model/calib.h"
#include "scalesweep/pipeline/calibrate.h"
#include "tools/calib_cli.h"
#include "tools/command.h"
#include "tools/output.h"
#include "tools/ui.h"

namespace scalesweep::tools {
namespace {

struct CalibArgs {
  std::string model, tokenizer, text, out;
  int64_t nsamples = 128, seqlen = 512;
  uint64_t seed = 0;
  bool json = false, force = false;
};

int run_calibrate(const CalibArgs& a) {
  check_output_file(a.out, "-o", a.force, {a.model, a.text, a.tokenizer});
  io::LoadedModel m = io::load_model(a.model, a.tokenizer);
  if (!m.tokenizer)
    throw std::runtime_error(a.model + ": no tokenizer found; give --tokenizer FILE");
  const int64_t seqlen = cap_seqlen(a.seqlen, m.weights.config.max_seq_len, a.model);
  // Layer by layer: each layer's statistics are appended to the file and freed.
  const int64_t total = int64_t{m.weights.config.n_layers} * a.nsamples;
  ProgressBar bar("calibrate", total, "seq");
  const model::CalibStats s = pipeline::calibrate_to_file(
      m, a.text, a.nsamples, seqlen, a.seed, a.out, [&](int64_t d, int64_t) { bar.update(d); });
  if (a.json) {
    nlohmann::json layers = nlohmann::json::array();
    for (const auto& L : s.layers) {
      nlohmann::json j;
      for (int i = 0; i < model::kNumInputs; ++i)
        j[std::string(model::input_name(static_cast<model::InputId>(i))) + "_amax"] =
            L.inputs[i].amax;
      j["q_amax"] = L.q_amax;
      j["k_amax"] = L.k_amax;
      j["v_amax"] = L.v_amax;
      layers.push_back(j);
    }
    nlohmann::json out = {{"output", a.out},
                          {"nsamples", s.nsamples},
                          {"seqlen", s.seqlen},
                          {"seed", s.seed},
                          {"tokens", s.layers.empty() ? 0 : s.layers[0].inputs[0].tokens},
                          {"layers", layers}};
    std::printf("%s\n", out.dump().c_str());
  } else {
    Table t({"layer", "attn_in amax", "attn_out amax", "mlp_in amax", "mlp_out amax", "q amax",
             "k amax", "v amax"});
    for (size_t l = 0; l < s.layers.size(); ++l) {
      const auto& L = s.layers[l];
      t.add_row({std::to_string(l), strf("%.4g", L.inputs[0].amax), strf("%.4g", L.inputs[1].amax),
                 strf("%.4g", L.inputs[2].amax), strf("%.4g", L.inputs[3].amax),
                 strf("%.4g", L.q_amax), strf("%.4g", L.k_amax), strf("%.4g", L.v_amax)});
    }
    t.print();
    std::printf("wrote %s (%lld sequences x %lld tokens, seed %llu)\n", a.out.c_str(),
                static_cast<long long>(s.nsamples), static_cast<long long>(s.seqlen),
                static_cast<unsigned long long>(s.seed));
  }
  return 0;
}

}  // namespace

SS_COMMAND("calibrate",
           "Calibration statistics (Hessians, amax, channel norms) for simulated NVFP4 and GPTQ",
           [](CLI::App& sub) -> std::function<int()> {
             auto a = std::make_shared<CalibArgs>();
             sub.add_option("model", a->model, "llama2.c .bin, .gguf or HF directory")->required();
             sub.add_option("--text", a->text, "calibration text file")->required();
             sub.add_option("--tokenizer", a->tokenizer, "tokenizer file (llama2.c tokenizer.bin)");
             sub.add_option("--nsamples", a->nsamples, "number of sequences")
                 ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
             sub.add_option(
                    "--seqlen", a->seqlen,
                    "tokens per sequence (BOS + seqlen-1), capped at the model's max_seq_len")
                 ->check(CLI::Range(int64_t{2}, int64_t{1} << 24));
             sub.add_option("--seed", a->seed, "sampling seed");
             sub.add_option("-o,--output", a->out, "output STATS.safetensors")->required();
             add_force_flag(sub, a->force);
             sub.add_flag("--json", a->json, "print a JSON summary");
             return [a] { return run_calibrate(*a); };
           });

}  // namespace scalesweep::tools
