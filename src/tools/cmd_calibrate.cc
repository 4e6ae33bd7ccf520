// scalesweep calibrate MODEL --calib FILE [--calib-nsamples N --calib-seqlen L --calib-seed S]
//   -o STATS.safetensors [--force] [--json]
// (--text, --nsamples, --seqlen, --seed: the older spellings, still accepted)
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "scalesweep/model/calib.h"
#include "scalesweep/pipeline/calibrate.h"
#include "tools/command.h"
#include "tools/options.h"
#include "tools/output.h"
#include "tools/ui.h"

namespace scalesweep::tools {
namespace {

struct CalibArgs {
  ModelOptions model;
  CalibOptions calib;
  OutputOptions out;
};

// Mixture-of-experts models: per MoE layer, the routed tokens of every expert and the experts
// below the threshold (pipeline::expert_coverage).
void render_calibrate(const model::CalibStats& s, const OutputOptions& out,
                      const CalibOptions& calib) {
  const int64_t dim = s.layers.empty() ? 0 : s.layers[0].inputs[0].dim;
  const int64_t min_tokens = pipeline::expert_min_tokens(calib_source(calib), dim);
  const std::vector<pipeline::ExpertCoverage> cover = pipeline::expert_coverage(s, min_tokens);
  bool moe = false;
  for (const auto& L : s.layers) moe |= !L.experts.empty();
  if (out.json) {
    nlohmann::json layers = nlohmann::json::array();
    for (const auto& L : s.layers) {
      nlohmann::json j;
      for (int i = 0; i < model::kNumInputs; ++i)
        j[std::string(model::input_name(static_cast<model::InputId>(i))) + "_amax"] =
            L.inputs[i].amax;
      j["q_amax"] = L.q_amax;
      j["k_amax"] = L.k_amax;
      j["v_amax"] = L.v_amax;
      if (!L.experts.empty()) {
        nlohmann::json routed = nlohmann::json::array();
        for (const auto& e : L.experts) routed.push_back(e.routed);
        j["expert_routed_tokens"] = routed;
      }
      layers.push_back(j);
    }
    nlohmann::json j = {{"output", out.path},
                        {"nsamples", s.nsamples},
                        {"seqlen", s.seqlen},
                        {"seed", s.draw.seed},
                        {"windows", model::kCalibWindowNames.name(s.draw.windows)},
                        {"tokens", s.layers.empty() ? 0 : s.layers[0].inputs[0].tokens},
                        {"layers", layers}};
    if (moe) {
      nlohmann::json cj = nlohmann::json::array();
      for (const auto& c : cover) {
        nlohmann::json few = nlohmann::json::array();
        for (const auto& [e, n] : c.few) few.push_back({{"expert", e}, {"tokens", n}});
        cj.push_back({{"layer", c.layer}, {"unseen", c.unseen}, {"few", few}});
      }
      j["experts"] = {
          {"all_experts", calib.all_experts}, {"min_tokens", min_tokens}, {"under_calibrated", cj}};
    }
    std::printf("%s\n", j.dump().c_str());
    return;
  }
  Table t({"layer", "attn_in amax", "attn_out amax", "mlp_in amax", "mlp_out amax", "q amax",
           "k amax", "v amax"});
  for (size_t l = 0; l < s.layers.size(); ++l) {
    const auto& L = s.layers[l];
    t.add_row({std::to_string(l), strf("%.4g", L.inputs[0].amax), strf("%.4g", L.inputs[1].amax),
               strf("%.4g", L.inputs[2].amax), strf("%.4g", L.inputs[3].amax),
               strf("%.4g", L.q_amax), strf("%.4g", L.k_amax), strf("%.4g", L.v_amax)});
  }
  t.print();
  if (moe) {
    std::printf("experts: routed calibration tokens below %lld%s\n",
                static_cast<long long>(min_tokens),
                calib.all_experts ? " (statistics of every token through every expert)" : "");
    if (cover.empty()) std::printf("  none: every expert of every MoE layer reached it\n");
    for (const auto& c : cover) {
      std::string unseen, few;
      for (const int e : c.unseen) unseen += (unseen.empty() ? "" : ", ") + std::to_string(e);
      for (const auto& [e, n] : c.few)
        few += (few.empty() ? "" : ", ") + std::to_string(e) + " (" + std::to_string(n) + ")";
      std::printf("  layer %d: no tokens: %s; few: %s\n", c.layer,
                  unseen.empty() ? "none" : unseen.c_str(), few.empty() ? "none" : few.c_str());
    }
  }
  std::printf("wrote %s (%lld sequences x %lld tokens, %s)\n", out.path.c_str(),
              static_cast<long long>(s.nsamples), static_cast<long long>(s.seqlen),
              model::calib_draw_label(s.draw).c_str());
}

int run_calibrate(const CalibArgs& a) {
  a.out.check_file({a.model.path, a.calib.text, a.model.tokenizer});
  pipeline::CalibrateRequest rq;
  rq.model = a.model.path;
  rq.tokenizer = a.model.tokenizer;
  rq.calib = calib_source(a.calib);
  rq.out = a.out.path;
  // Layer by layer: each layer's statistics are appended to the file and freed. The bar is
  // made when the total (layers x sequences) is known, its clock started here.
  StageBars bars;
  const model::CalibStats s = pipeline::calibrate(rq, cli_events(bars));
  bars.finish();
  render_calibrate(s, a.out, a.calib);
  return 0;
}

}  // namespace

SS_COMMAND("calibrate",
           "Calibration statistics (Hessians, amax, channel norms) for simulated NVFP4 and GPTQ",
           [](CLI::App& sub) -> std::function<int()> {
             auto a = std::make_shared<CalibArgs>();
             add_model_options(sub, a->model);
             CalibSpelling calib;
             calib.text_alias = calib.size_aliases = calib.seed_alias = true;
             calib.text_required = true;
             calib.stats = false;  // writes statistics, reads none
             calib.text_help = "calibration text file";
             add_calib_options(sub, a->calib, calib);
             add_output_options(
                 sub, a->out,
                 required_output("output STATS.safetensors", "replace an existing output",
                                 "print a JSON summary"));
             return [a] { return run_calibrate(*a); };
           });

}  // namespace scalesweep::tools
