// The CLI's shared option groups. Each group is a struct holding what its options bind to,
// with the defaults as member initializers, and one add_* function that declares its options
// on a subcommand, one canonical spelling each (older spellings a command had stay accepted as
// aliases, listed after the canonical name in --help). Defaults are shown in --help from the
// bound variables themselves (main.cc turns on CLI11's default capture for every option), so
// no help string types a default by hand; where a default is computed at run time the help
// says how, in words.
//
//   group          options                                              struct
//   model          MODEL (positional), --tokenizer                      ModelOptions
//   calibration    --calib, --stats, --calib-nsamples, --calib-seqlen,  CalibOptions
//                  --calib-seed, --calib-all-experts, --expert-min-tokens
//   output         -o/--output, --force, --json                         OutputOptions
//   quantization   --method, --format, --block, --window,               QuantOptions
//                  --max-block-scale, --global-scale, --threads
//   simulated      --quant + quantization (method, format, block) +     SimQuantOptions
//   quantization   calibration + --force-requant (ppl, generate)
//   BOS policy     --bos / --no-bos (ppl, generate)                     BosOption
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "scalesweep/base/option_error.h"
#include "scalesweep/pipeline/calibrate.h"
#include "scalesweep/pipeline/events.h"
#include "scalesweep/quant/quantize.h"
#include "tools/ui.h"

namespace scalesweep::tools {

// Turns on CLI11's default capture for every option declared after it on `app` and on its
// subcommands (they inherit the app's option defaults): --help then shows each option's
// default from the variable it binds ("--calib-nsamples INT=128"). main.cc calls it first.
void show_defaults_in_help(CLI::App& app);

// Whether option `o` was given on the command line (false for a null option).
bool given(const CLI::Option* o);

// The process's arguments, recorded by main.cc before parsing (CLI11 does not record which of
// an option's names matched).
void set_command_args(int argc, const char* const* argv);
// The spelling of `o` the command line used, at its last occurrence ("--seqlen" for
// `--seqlen 64` or `--seqlen=64` on "--calib-seqlen,--seqlen"), so a message names what the
// user typed; the first long name when it was not given (or no arguments were recorded).
std::string spelling_given(const CLI::Option* o);

// A comma list ("a,b,,c" -> {"a", "b", "c"}: empty items dropped), as --methods, --settings
// and --tasks take them.
std::vector<std::string> split_commas(const std::string& s);

// The task data directory of eval and experiment --tasks: the option when given, else
// $SS_EVAL_DATA when set, else data/eval (where scripts/get-eval-data.sh writes).
std::string eval_data_dir(const std::string& given);

// ---------------------------------------------------------------------------------------------
// Model: the positional `model` and --tokenizer.
struct ModelOptions {
  std::string path;       // MODEL: llama2.c .bin, .gguf or HF directory
  std::string tokenizer;  // --tokenizer: separate tokenizer file (llama2.c tokenizer.bin)
};
// Declares the positional `model` (required) and --tokenizer.
void add_model_options(CLI::App& sub, ModelOptions& o);

// ---------------------------------------------------------------------------------------------
// Calibration: where the statistics come from (a text to calibrate on, or a file written by
// `scalesweep calibrate`) and how the calibration sequences are drawn.
// The values are the library's own fields, with its defaults: text (--calib FILE), stats
// (--stats FILE from `scalesweep calibrate`), nsamples, seqlen (capped at max_seq_len,
// cap_calib_seqlen), seed, all_experts (--calib-all-experts), expert_min_tokens
// (--expert-min-tokens; -1: the model's hidden size).
struct CalibOptions : pipeline::CalibSource {
  // --calib-windows as typed, parsed by calib_source (model::kCalibWindowNames).
  std::string windows_name{model::kCalibWindowNames.name(model::CalibWindows::kRandom)};
  const CLI::Option* seed_opt = nullptr;    // --calib-seed (set by add_calib_options)
  const CLI::Option* seqlen_opt = nullptr;  // --calib-seqlen (set by add_calib_options)
  // The calibration seed: --calib-seed when given, else `fallback` when the command declared
  // one (CalibSpelling::seed_fallback; generate: its --seed), else the default above.
  uint64_t seed_or(uint64_t fallback) const { return given(seed_opt) ? seed : fallback; }
};

// Which options a command declares and which older spellings it keeps accepting.
struct CalibSpelling {
  bool text_alias = false;     // --text for --calib (calibrate)
  bool size_aliases = false;   // --nsamples, --seqlen (quantize, calibrate, experiment)
  bool seed_alias = false;     // --seed for --calib-seed (quantize, calibrate, experiment, ppl)
  bool text_required = false;  // --calib required (calibrate)
  bool stats = true;           // declare --stats (calibrate writes statistics, reads none)
  std::string seed_fallback;   // non-empty: --calib-seed defaults to this option's value
  std::string text_help = "calibration text file (when --stats is absent)";
};
void add_calib_options(CLI::App& sub, CalibOptions& o, const CalibSpelling& s = {});
// The group as the pipeline's calibration source (its seed as given; --calib-windows parsed,
// and refused beside --calib-seed when spread, which draws nothing).
pipeline::CalibSource calib_source(const CalibOptions& o);

// ---------------------------------------------------------------------------------------------
// Output: one output path (a file or a directory), --force and --json. The policy (an existing
// output is never replaced without --force; an output that is an input is always refused) is
// tools/output.h's, reached through check_file / check_dir.
struct OutputOptions {
  std::string path;  // -o/--output
  bool force = false;
  bool json = false;
  // check_output_file(path, "-o", force, inputs).
  void check_file(const std::vector<std::string>& inputs = {}) const;
  // check_output_dir(path, "-o", force, inputs, "--force").
  void check_dir(const std::vector<std::string>& inputs = {}) const;
};

struct OutputSpelling {
  std::string path_help;  // help of -o/--output; empty: the command declares no -o
  bool path_required = false;
  bool out_alias = false;                                 // --out for --output (quantize)
  bool overwrite_alias = false;                           // --overwrite for --force (quantize)
  std::string force_help = "replace an existing output";  // empty: no --force
  std::string json_help = "print one JSON object";        // empty: no --json
};
void add_output_options(CLI::App& sub, OutputOptions& o, const OutputSpelling& s);
// The common shapes: only --json (a command that prints its result); a required -o/--output
// with --force (plus --json when json_help is non-empty); --force and --json without -o (a
// command whose files are named by its own options).
OutputSpelling json_only(const std::string& json_help = "print one JSON object");
OutputSpelling required_output(const std::string& path_help,
                               const std::string& force_help = "replace an existing output",
                               const std::string& json_help = "");
OutputSpelling force_and_json(const std::string& force_help, const std::string& json_help);

// ---------------------------------------------------------------------------------------------
// Quantization: what a block-scale quantizer is told. Parsed to a QuantConfig once, by
// parse_quant_config, with one message per bad value.
struct QuantOptions {
  std::string method = "sweep-mse";  // empty: none chosen (parse_quant_config refuses it)
  std::string format = "nvfp4";
  int block = 0;       // 0: the format's block (16 NVFP4, 32 MXFP4)
  std::string window;  // "L,R": sweep offsets around the base scale pattern
  std::optional<float> max_block_scale, global_scale;
  int threads = 0;  // 0: all cores
  // Set by add_quant_options for the options it declares: given on the command line or not.
  const CLI::Option* method_opt = nullptr;
  const CLI::Option* format_opt = nullptr;
  const CLI::Option* block_opt = nullptr;
};

// Which of the group's options a command declares.
struct QuantSpelling {
  bool method = true, format = true, block = true;
  bool window = false;
  bool scales = false;  // --max-block-scale and --global-scale
  // --max-block-scale alone (quantize: a model has one global scale per fused group, so an
  // explicit --global-scale does not apply)
  bool max_block_scale = false;
  bool threads = false;
};
void add_quant_options(CLI::App& sub, QuantOptions& o, const QuantSpelling& s = {});

// The accepted names, as the help strings and error messages list them.
std::string accepted_methods();
std::string accepted_formats();

// `s` parsed with a name table, the table's one message prefixed with the option ("--method:
// unknown method 'x' (accepted: ...)").
template <class Table>
auto parse_named(const Table& table, const std::string& option, const std::string& s) {
  try {
    return table.parse(s);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(option + ": " + e.what());
  }
}

// The group parsed into a QuantConfig: --format and --method with their name tables (the
// method only when given), --window with scale::parse_window ("--window '3,1': ..."), the block,
// the scales and threads as given. The values are validated once, by the library call that
// takes the config (quant::validate; its OptionError is named as an option by option_message).
QuantConfig parse_quant_settings(const QuantOptions& o);
// parse_quant_settings with a method required ("--method: no method given (accepted: ...)")
// and block 0 meaning the format's.
QuantConfig parse_quant_config(const QuantOptions& o);

// The command being run (main.cc sets it after parsing): option_of looks its options up.
void set_current_command(const CLI::App* sub);
// The option of the current command that a library field names ("max_block_scale" ->
// --max-block-scale, "calib_seqlen" -> --calib-seqlen or its alias --seqlen as typed), spelled
// as the command line gave it (spelling_given); "" when the command has no such option.
std::string option_of(const std::string& field);
// A library message with its option references (base/option_error.h option_ref) named as the
// current command's options (option_of; the field itself when the command has none).
std::string cli_message(std::string_view message);
// The message of an OptionError as the command line names it: "<option>: <message>" (the field
// itself when the command has no option for it), references rendered (cli_message).
std::string option_message(const OptionError& e);
// A pipeline note whose first word is a field (snake_case, e.g. the cap of "calib_seqlen")
// with that word named as the option typed (option_of); other notes as they are.
std::string option_note(const std::string& text);
// tools/ui.h print_note of option_note(text): the note sink every command passes.
void print_option_note(const std::string& text);
// The events of a long job as every command renders them: notes by print_option_note, the
// stages' progress by `bars` (which must outlive the job).
pipeline::JobEvents cli_events(StageBars& bars);

// ---------------------------------------------------------------------------------------------
// Simulated quantization at run time (ppl, generate): --quant with the quantization group's
// --method/--format/--block, the calibration group and --force-requant.
struct SimQuantOptions {
  std::string quant = "none";  // none, W, WA, WAKV, WAKVQ
  QuantOptions q;              // method, format, block (0: the format's)
  CalibOptions calib;
  // --quant on a checkpoint whose weights are already NVFP4 quantizes the dequantized weights
  // again (refused without it).
  bool force_requant = false;
  // --compute: the arithmetic of the prefill matrix products (model::kComputeNames).
  std::string compute = "fp32";
};
void add_sim_quant_options(CLI::App& sub, SimQuantOptions& o, const CalibSpelling& calib = {});

// --bos / --no-bos (one option, the same on ppl and generate): overrides the tokenizer's own
// add-BOS policy (model::Tokenizer::add_bos).
struct BosOption {
  bool bos = false;
  const CLI::Option* opt = nullptr;
};
void add_bos_option(CLI::App& sub, BosOption& o);

}  // namespace scalesweep::tools
