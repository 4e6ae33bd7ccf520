#include "tools/options.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

#include "scalesweep/model/simquant.h"
#include "scalesweep/scale/selector.h"
#include "tools/output.h"
#include "tools/ui.h"

namespace scalesweep::tools {

void show_defaults_in_help(CLI::App& app) { app.option_defaults()->always_capture_default(); }

bool given(const CLI::Option* o) { return o != nullptr && o->count() > 0; }

namespace {
std::vector<std::string>& command_args() {
  static std::vector<std::string> args;
  return args;
}
}  // namespace

void set_command_args(int argc, const char* const* argv) {
  command_args().assign(argv, argv + argc);
}

std::string spelling_given(const CLI::Option* o) {
  if (o == nullptr) return "";
  const std::vector<std::string>& names = o->get_lnames();
  std::string found = names.empty() ? o->get_name() : "--" + names.front();
  if (!given(o)) return found;
  for (const std::string& a : command_args())
    for (const std::string& n : names) {
      const std::string dashed = "--" + n;
      if (a == dashed || a.rfind(dashed + "=", 0) == 0) found = dashed;
    }
  return found;
}

namespace {

// CLI11 names an option by its first long name in a validation error; with aliases the
// message also lists every spelling, so the one the user typed appears in it.
CLI::Validator range_naming(int64_t lo, int64_t hi, const std::string& names) {
  const CLI::Validator range = CLI::Range(lo, hi);
  if (names.find(',') == std::string::npos) return range;
  return CLI::Validator(
      [range, names](std::string& v) {
        const std::string e = range(v);
        return e.empty() ? e : e + " (" + names + ")";
      },
      range.get_description());
}

}  // namespace

void add_model_options(CLI::App& sub, ModelOptions& o) {
  sub.add_option("model", o.path, "llama2.c .bin, .gguf or HF directory")->required();
  sub.add_option("--tokenizer", o.tokenizer,
                 "tokenizer file (llama2.c tokenizer.bin); default: the model's own");
}

void add_calib_options(CLI::App& sub, CalibOptions& o, const CalibSpelling& s) {
  CLI::Option* text =
      sub.add_option(s.text_alias ? "--calib,--text" : "--calib", o.text, s.text_help);
  if (s.text_required) text->required();
  if (s.stats) sub.add_option("--stats", o.stats, "calibration statistics (scalesweep calibrate)");
  const std::string nsamples = s.size_aliases ? "--calib-nsamples,--nsamples" : "--calib-nsamples";
  const std::string seqlen = s.size_aliases ? "--calib-seqlen,--seqlen" : "--calib-seqlen";
  sub.add_option(nsamples, o.nsamples, "calibration sequences")
      ->check(range_naming(1, int64_t{1} << 24, nsamples));
  o.seqlen_opt =
      sub.add_option(seqlen, o.seqlen,
                     "calibration tokens per sequence (BOS + seqlen-1), capped at the model's "
                     "max_seq_len")
          ->check(range_naming(2, int64_t{1} << 24, seqlen));
  CLI::Option* seed = sub.add_option(s.seed_alias ? "--calib-seed,--seed" : "--calib-seed", o.seed,
                                     "calibration sampling seed");
  if (!s.seed_fallback.empty()) {
    // Run-time default: the other option's value.
    seed->default_str("");
    seed->description("calibration sampling seed; default: the " + s.seed_fallback + " value");
  }
  o.seed_opt = seed;
  sub.add_option("--calib-windows", o.windows_name,
                 "where the calibration sequences lie in the text: random (starts drawn with "
                 "--calib-seed) or spread (evenly spaced from the start, llm-compressor's "
                 "examples' windows; no seed)");
  sub.add_flag("--calib-all-experts", o.all_experts,
               "mixture-of-experts models: every calibration token also goes through every "
               "expert for the experts' statistics (the forward keeps the routed output)");
  sub.add_option("--expert-min-tokens", o.expert_min_tokens,
                 "mixture-of-experts models: experts the router sent fewer calibration tokens are "
                 "reported, and an expert whose statistics hold fewer (routed ones, or every "
                 "token with --calib-all-experts) is quantized data-free; default: the model's "
                 "hidden size")
      ->default_str("")
      ->check(range_naming(int64_t{0}, int64_t{1} << 40, "--expert-min-tokens"));
}

pipeline::CalibSource calib_source(const CalibOptions& o) {
  pipeline::CalibSource c = o;  // the library's fields, without the command line's
  c.windows = parse_named(model::kCalibWindowNames, "--calib-windows", o.windows_name);
  if (c.windows == model::CalibWindows::kSpread && given(o.seed_opt))
    throw OptionError("calib_seed",
                      "--calib-seed draws random windows; --calib-windows spread places them "
                      "evenly and takes no seed (drop one of the two)");
  return c;
}

void OutputOptions::check_file(const std::vector<std::string>& inputs) const {
  check_output_file(path, "-o", force, inputs);
}

void OutputOptions::check_dir(const std::vector<std::string>& inputs) const {
  check_output_dir(path, "-o", force, inputs, "--force");
}

void add_output_options(CLI::App& sub, OutputOptions& o, const OutputSpelling& s) {
  if (!s.path_help.empty()) {
    CLI::Option* p =
        sub.add_option(s.out_alias ? "-o,--output,--out" : "-o,--output", o.path, s.path_help);
    if (s.path_required) p->required();
  }
  if (!s.force_help.empty())
    sub.add_flag(s.overwrite_alias ? "--force,--overwrite" : "--force", o.force, s.force_help);
  if (!s.json_help.empty()) sub.add_flag("--json", o.json, s.json_help);
}

OutputSpelling json_only(const std::string& json_help) {
  OutputSpelling s;
  s.force_help.clear();
  s.json_help = json_help;
  return s;
}

OutputSpelling required_output(const std::string& path_help, const std::string& force_help,
                               const std::string& json_help) {
  OutputSpelling s;
  s.path_help = path_help;
  s.path_required = true;
  s.force_help = force_help;
  s.json_help = json_help;
  return s;
}

OutputSpelling force_and_json(const std::string& force_help, const std::string& json_help) {
  OutputSpelling s;
  s.force_help = force_help;
  s.json_help = json_help;
  return s;
}

std::string accepted_methods() { return kMethodNames.accepted(); }

std::string accepted_formats() { return kTensorFormatNames.accepted(); }

void add_quant_options(CLI::App& sub, QuantOptions& o, const QuantSpelling& s) {
  if (s.method)
    o.method_opt =
        sub.add_option("--method", o.method, "block-scale selector: " + accepted_methods());
  if (s.format)
    o.format_opt = sub.add_option("--format", o.format,
                                  "tensor format: " + accepted_formats() +
                                      " (nvfp4: E4M3 block scales and a global scale; mxfp4: "
                                      "UE8M0 block scales, block 32)");
  if (s.block)
    o.block_opt = sub.add_option("--block", o.block,
                                 "block size: 8, 16, 32, 64 (mxfp4: 32); 0: the format's "
                                 "(16 nvfp4, 32 mxfp4)");
  if (s.window)
    sub.add_option("--window", o.window,
                   "L,R: sweep offsets around the base scale pattern (sweep, sweep-mse, "
                   "sweep-wmse; sweep needs it); empty: the method's own window");
  if (s.scales || s.max_block_scale)
    sub.add_option("--max-block-scale", o.max_block_scale,
                   "C in S = amax/(6C); empty: 448 for absmax, 256 for the other methods");
  if (s.scales) {
    sub.add_option("--global-scale", o.global_scale,
                   "explicit encode-direction global scale gs = 1/S (instead of "
                   "--max-block-scale)");
  }
  if (s.threads) sub.add_option("--threads", o.threads, "threads (0: all cores)");
}

QuantConfig parse_quant_settings(const QuantOptions& o) {
  QuantConfig cfg;
  cfg.format = parse_named(kTensorFormatNames, "--format", o.format);
  if (!o.method.empty()) cfg.selector.method = parse_named(kMethodNames, "--method", o.method);
  cfg.block = o.block;
  if (!o.window.empty())
    cfg.selector.window = parse_window(o.window, scale_format_of(cfg.format), "--window");
  cfg.max_block_scale = o.max_block_scale;
  cfg.global_scale = o.global_scale;
  cfg.threads = o.threads;
  return cfg;
}

QuantConfig parse_quant_config(const QuantOptions& o) {
  if (o.method.empty())
    throw std::invalid_argument("--method: no method given (accepted: " + accepted_methods() + ")");
  QuantConfig cfg = parse_quant_settings(o);
  if (o.block == 0) cfg.block = model::default_block(cfg.format);
  return cfg;
}

namespace {
const CLI::App*& current_command() {
  static const CLI::App* sub = nullptr;
  return sub;
}
}  // namespace

void set_current_command(const CLI::App* sub) { current_command() = sub; }

std::string option_of(const std::string& field) {
  if (current_command() == nullptr) return "";
  std::string dashed = field;
  std::replace(dashed.begin(), dashed.end(), '_', '-');
  const CLI::Option* o = current_command()->get_option_no_throw("--" + dashed);
  return o ? spelling_given(o) : "";
}

std::string cli_message(std::string_view message) {
  return render_option_refs(message, [](std::string_view field) {
    const std::string option = option_of(std::string(field));
    return option.empty() ? std::string(field) : option;
  });
}

std::string option_message(const OptionError& e) {
  const std::string option = option_of(e.field());
  return (option.empty() ? e.field() : option) + ": " + cli_message(e.what());
}

std::string option_note(const std::string& raw) {
  const std::string text = cli_message(raw);
  const std::string word = text.substr(0, text.find(' '));
  if (word.find('_') == std::string::npos) return text;
  const std::string option = option_of(word);
  return option.empty() ? text : option + text.substr(word.size());
}

void print_option_note(const std::string& text) { print_note(option_note(text)); }

pipeline::JobEvents cli_events(StageBars& bars) {
  pipeline::JobEvents ev;
  ev.note = print_option_note;
  ev.progress = [&bars](const std::string& stage, const char* unit, int64_t done, int64_t total) {
    bars.report(stage, unit, done, total);
  };
  return ev;
}

void add_sim_quant_options(CLI::App& sub, SimQuantOptions& o, const CalibSpelling& calib) {
  sub.add_option("--quant", o.quant,
                 "simulated quantization: none, W, WA, WAKV, WAKVQ (--method, --format and "
                 "--block shape it)");
  add_quant_options(sub, o.q, QuantSpelling{});
  add_calib_options(sub, o.calib, calib);
  sub.add_flag("--force-requant", o.force_requant,
               "with --quant on a checkpoint whose weights are already NVFP4: quantize the "
               "dequantized weights again (and replace the checkpoint's activation scheme)");
  sub.add_option("--compute", o.compute,
                 "arithmetic of the prefill matrix products: fp32 (the reference) or bf16 "
                 "(activations rounded to bf16, bf16 weights, fp32 accumulation; oneDNN "
                 "AVX512-BF16; changes the numerics). Decode and attention stay fp32");
}

void add_bos_option(CLI::App& sub, BosOption& o) {
  o.opt = sub.add_flag("--bos,!--no-bos", o.bos,
                       "prepend BOS to the text (--bos) or not (--no-bos); when neither is "
                       "given: the tokenizer's own policy (tokenizer_config.json "
                       "add_bos_token; llama2.c: always)");
}

std::string eval_data_dir(const std::string& given) {
  if (!given.empty()) return given;
  const char* e = std::getenv("SS_EVAL_DATA");
  return e && *e ? e : "data/eval";
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  size_t b = 0;
  while (b <= s.size()) {
    const size_t e = std::min(s.find(',', b), s.size());
    if (e > b) out.push_back(s.substr(b, e - b));
    b = e + 1;
  }
  return out;
}

}  // namespace scalesweep::tools
