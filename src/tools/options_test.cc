// The shared option groups: every canonical spelling and every alias parses to the same struct,
// aliases exist only where a command asks for them, the quantization group's one validation
// and its messages, and --help showing each default from the bound variable.
#include "tools/options.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "scalesweep/scale/selector.h"

namespace scalesweep::tools {
namespace {

// An app set up as main.cc sets up the real one (defaults captured), with one subcommand.
struct Cli {
  CLI::App app{"test"};
  CLI::App* sub = nullptr;
  Cli() {
    show_defaults_in_help(app);
    sub = app.add_subcommand("cmd", "a command");
  }
  void parse(const std::string& args) { app.parse("cmd " + args, false); }
  std::string help() const { return sub->help(); }
};

CalibOptions parse_calib(const std::string& args, const CalibSpelling& s) {
  Cli c;
  CalibOptions o;
  add_calib_options(*c.sub, o, s);
  c.parse(args);
  o.seed_opt = nullptr;  // points into the app, gone with it
  return o;
}

void expect_same(const CalibOptions& a, const CalibOptions& b) {
  EXPECT_EQ(a.text, b.text);
  EXPECT_EQ(a.stats, b.stats);
  EXPECT_EQ(a.nsamples, b.nsamples);
  EXPECT_EQ(a.seqlen, b.seqlen);
  EXPECT_EQ(a.seed, b.seed);
}

TEST(CalibOptions, AliasesParseLikeTheCanonicalSpellings) {
  CalibSpelling all;
  all.text_alias = all.size_aliases = all.seed_alias = true;
  const CalibOptions canon = parse_calib(
      "--calib c.txt --stats s.st --calib-nsamples 7 --calib-seqlen 33 --calib-seed 9", all);
  EXPECT_EQ(canon.text, "c.txt");
  EXPECT_EQ(canon.stats, "s.st");
  EXPECT_EQ(canon.nsamples, 7);
  EXPECT_EQ(canon.seqlen, 33);
  EXPECT_EQ(canon.seed, 9u);
  expect_same(canon,
              parse_calib("--text c.txt --stats s.st --nsamples 7 --seqlen 33 --seed 9", all));
  // Mixed: each alias independently.
  expect_same(
      canon,
      parse_calib("--text c.txt --stats s.st --calib-nsamples 7 --seqlen 33 --calib-seed 9", all));
}

TEST(CalibOptions, DefaultsAndNoAliasesUnlessAsked) {
  const CalibOptions d = parse_calib("", {});
  EXPECT_EQ(d.nsamples, 128);
  EXPECT_EQ(d.seqlen, 512);
  EXPECT_EQ(d.seed, 0u);
  EXPECT_TRUE(d.text.empty());
  for (const char* alias : {"--text x", "--nsamples 3", "--seqlen 3", "--seed 3"})
    EXPECT_THROW(parse_calib(alias, {}), CLI::ParseError) << alias;
  CalibSpelling no_stats;
  no_stats.stats = false;
  EXPECT_THROW(parse_calib("--stats s", no_stats), CLI::ParseError);
}

TEST(CalibOptions, RequiredTextAndRanges) {
  CalibSpelling req;
  req.text_required = true;
  EXPECT_THROW(parse_calib("", req), CLI::RequiredError);
  EXPECT_EQ(parse_calib("--calib t", req).text, "t");
  EXPECT_THROW(parse_calib("--calib-nsamples 0", {}), CLI::ValidationError);
  EXPECT_THROW(parse_calib("--calib-seqlen 1", {}), CLI::ValidationError);
}

TEST(CalibOptions, SeedFallsBackToAnotherOptionWhenAbsent) {
  // generate: --seed is the sampling seed; --calib-seed defaults to its value.
  Cli c;
  CalibOptions o;
  uint64_t sampling = 0;
  c.sub->add_option("--seed", sampling, "sampling seed");
  CalibSpelling s;
  s.seed_fallback = "--seed";
  add_calib_options(*c.sub, o, s);
  c.parse("--seed 5");
  EXPECT_EQ(o.seed_or(sampling), 5u);
  Cli c2;
  CalibOptions o2;
  uint64_t sampling2 = 0;
  c2.sub->add_option("--seed", sampling2, "sampling seed");
  add_calib_options(*c2.sub, o2, s);
  c2.parse("--seed 5 --calib-seed 11");
  EXPECT_EQ(sampling2, 5u);
  EXPECT_EQ(o2.seed_or(sampling2), 11u);
  // Its help names the fallback instead of a captured default.
  EXPECT_NE(c2.help().find("default: the --seed value"), std::string::npos) << c2.help();
  EXPECT_EQ(c2.help().find("--calib-seed UINT="), std::string::npos) << c2.help();
}

OutputOptions parse_output(const std::string& args, const OutputSpelling& s) {
  Cli c;
  OutputOptions o;
  add_output_options(*c.sub, o, s);
  c.parse(args);
  return o;
}

TEST(OutputOptions, AliasesParseLikeTheCanonicalSpellings) {
  OutputSpelling s;
  s.path_help = "output";
  s.out_alias = s.overwrite_alias = true;
  for (const char* args : {"-o d --force --json", "--output d --force --json",
                           "--out d --overwrite --json", "-o d --overwrite --json"}) {
    const OutputOptions o = parse_output(args, s);
    EXPECT_EQ(o.path, "d") << args;
    EXPECT_TRUE(o.force) << args;
    EXPECT_TRUE(o.json) << args;
  }
  const OutputOptions d = parse_output("", s);
  EXPECT_FALSE(d.force);
  EXPECT_FALSE(d.json);
  OutputSpelling plain;
  plain.path_help = "output";
  EXPECT_THROW(parse_output("--out d", plain), CLI::ParseError);
  EXPECT_THROW(parse_output("--overwrite", plain), CLI::ParseError);
  plain.path_required = true;
  EXPECT_THROW(parse_output("", plain), CLI::RequiredError);
  OutputSpelling no_path;
  EXPECT_THROW(parse_output("-o x", no_path), CLI::ParseError);
}

TEST(OutputOptions, ChecksGoThroughThePolicy) {
  OutputOptions o;
  o.path = ::testing::TempDir();  // an existing directory
  EXPECT_THROW(o.check_file(), std::invalid_argument);
  try {
    o.check_dir();
    FAIL() << "an existing directory without --force";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("pass --force"), std::string::npos) << e.what();
  }
  o.force = true;
  EXPECT_NO_THROW(o.check_dir());
  o.path = "/nonexistent-dir-for-options-test/x.npy";
  o.force = false;
  EXPECT_NO_THROW(o.check_file());
}

QuantOptions parse_quant(const std::string& args, const QuantSpelling& s = {}) {
  Cli c;
  QuantOptions o;
  add_quant_options(*c.sub, o, s);
  c.parse(args);
  o.method_opt = o.format_opt = o.block_opt = nullptr;
  return o;
}

QuantSpelling every_quant_option() {
  QuantSpelling s;
  s.window = s.scales = s.threads = true;
  return s;
}

TEST(QuantOptions, ParsesToOneQuantConfig) {
  const QuantOptions o = parse_quant(
      "--method sweep --format nvfp4 --block 32 --window -2,5 --max-block-scale 300 "
      "--threads 3",
      every_quant_option());
  const QuantConfig cfg = parse_quant_config(o);
  EXPECT_EQ(cfg.selector.method, Method::kSweep);
  EXPECT_EQ(cfg.format, TensorFormat::kNvfp4);
  EXPECT_EQ(cfg.block, 32);
  ASSERT_TRUE(cfg.selector.window.has_value());
  EXPECT_EQ(cfg.selector.window->lo, -2);
  EXPECT_EQ(cfg.selector.window->hi, 5);
  ASSERT_TRUE(cfg.max_block_scale.has_value());
  EXPECT_EQ(*cfg.max_block_scale, 300.0f);
  EXPECT_FALSE(cfg.global_scale.has_value());
  EXPECT_EQ(cfg.threads, 3);
  // Defaults: sweep-mse, nvfp4, the format's block.
  const QuantConfig d = parse_quant_config(parse_quant(""));
  EXPECT_EQ(d.selector.method, Method::kSweepMse);
  EXPECT_EQ(d.format, TensorFormat::kNvfp4);
  EXPECT_EQ(d.block, 16);
  EXPECT_FALSE(d.selector.window.has_value());
  EXPECT_EQ(parse_quant_config(parse_quant("--format mxfp4")).block, 32);
  // Options a command did not declare are refused.
  EXPECT_THROW(parse_quant("--window -1,1"), CLI::ParseError);
  EXPECT_THROW(parse_quant("--threads 2"), CLI::ParseError);
}

// What a command declaring every quantization option prints for `o`: a parse error as it is,
// the library's one validation (quant::validate) named as the option (option_message).
std::string message_of(const QuantOptions& o) {
  Cli c;
  QuantOptions declared;
  add_quant_options(*c.sub, declared, every_quant_option());
  set_current_command(c.sub);
  std::string m = "(no error)";
  try {
    validate(parse_quant_config(o));
  } catch (const OptionError& e) {
    m = option_message(e);
  } catch (const std::invalid_argument& e) {
    m = e.what();
  }
  set_current_command(nullptr);
  return m;
}

TEST(QuantOptions, UnknownNamesGetOneMessageListingTheAcceptedNames) {
  QuantOptions o;
  o.method = "sweep-msx";
  const std::string m = message_of(o);
  EXPECT_NE(m.find("unknown method 'sweep-msx' (accepted: "), std::string::npos) << m;
  for (Method x : kMethodNames.values())
    EXPECT_NE(m.find(std::string(kMethodNames.name(x))), std::string::npos) << m;
  o.method = "";
  EXPECT_NE(message_of(o).find("(accepted: " + accepted_methods() + ")"), std::string::npos);
  o = QuantOptions{};
  o.format = "nvfp8";
  EXPECT_EQ(message_of(o), "--format: unknown format 'nvfp8' (accepted: nvfp4, mxfp4)");
}

TEST(QuantOptions, OneMessagePerBadValue) {
  auto msg = [](void (*set)(QuantOptions&)) {
    QuantOptions o;
    set(o);
    return message_of(o);
  };
  EXPECT_EQ(msg([](QuantOptions& o) { o.block = 12; }),
            "--block: block size 12 is not supported (accepted: 8, 16, 32, 64)");
  EXPECT_EQ(msg([](QuantOptions& o) {
              o.format = "mxfp4";
              o.block = 16;
            }),
            "--block: MXFP4 requires block 32 (got 16)");
  EXPECT_EQ(msg([](QuantOptions& o) { o.method = "sweep"; }),
            "--window: method sweep needs a window L,R (offsets around the base scale pattern, "
            "e.g. -3,7)");
  EXPECT_EQ(msg([](QuantOptions& o) {
              o.method = "absmax";
              o.window = "-1,1";
            }),
            "--window: applies only to sweep, sweep-mse and sweep-wmse");
  EXPECT_EQ(msg([](QuantOptions& o) { o.window = "3,1"; }),
            "--window '3,1': lo (3) > hi (1); expected L,R with L <= R");
  EXPECT_EQ(msg([](QuantOptions& o) { o.window = "-126,1"; }),
            "--window '-126,1': offsets must lie in [-125, 125] for e4m3 scales");
  EXPECT_EQ(msg([](QuantOptions& o) { o.window = "x"; }),
            "--window 'x': expected L,R (two integers, e.g. -3,7)");
  EXPECT_EQ(msg([](QuantOptions& o) { o.max_block_scale = 500.0f; }),
            "--max-block-scale: C must satisfy 0 < C <= 448 (the largest FP8 E4M3 value)");
  EXPECT_EQ(msg([](QuantOptions& o) { o.global_scale = -1.0f; }),
            "--global-scale: must be a finite value > 0 (got -1)");
  EXPECT_EQ(msg([](QuantOptions& o) {
              o.global_scale = 1.0f;
              o.max_block_scale = 256.0f;
            }),
            "--global-scale: the max block scale also sets the global scale; give one");
  EXPECT_EQ(msg([](QuantOptions& o) {
              o.format = "mxfp4";
              o.global_scale = 1.0f;
            }),
            "--global-scale: MXFP4 has no global scale; it does not apply");
  EXPECT_EQ(msg([](QuantOptions& o) { o.threads = -1; }),
            "--threads: must be >= 0 (0 = all cores)");
}

TEST(OptionNames, AFieldIsNamedAsTheOptionTyped) {
  Cli c;
  CalibOptions o;
  CalibSpelling s;
  s.size_aliases = true;
  add_calib_options(*c.sub, o, s);
  const char* argv[] = {"scalesweep", "cmd", "--seqlen", "64"};
  set_command_args(4, argv);
  c.parse("--seqlen 64");
  set_current_command(c.sub);
  EXPECT_EQ(option_of("calib_seqlen"), "--seqlen");
  EXPECT_EQ(option_message(OptionError("calib_nsamples", "x")), "--calib-nsamples: x");
  EXPECT_EQ(option_message(OptionError("no_such_field", "x")), "no_such_field: x");
  set_current_command(nullptr);
  set_command_args(0, nullptr);
  EXPECT_EQ(option_of("calib_seqlen"), "");
}

TEST(SimQuantOptions, DeclaresQuantAndCalibrationWithTheirSpellings) {
  Cli c;
  SimQuantOptions o;
  CalibSpelling s;
  s.seed_alias = true;  // ppl
  add_sim_quant_options(*c.sub, o, s);
  BosOption bos;
  add_bos_option(*c.sub, bos);
  c.parse(
      "--quant WA --method absmax --format mxfp4 --block 32 --calib t.txt --calib-nsamples 4 "
      "--calib-seqlen 64 --seed 3 --force-requant --no-bos");
  EXPECT_EQ(o.quant, "WA");
  EXPECT_EQ(o.q.method, "absmax");
  EXPECT_EQ(o.q.format, "mxfp4");
  EXPECT_EQ(o.q.block, 32);
  EXPECT_TRUE(given(o.q.method_opt));
  EXPECT_EQ(o.calib.text, "t.txt");
  EXPECT_EQ(o.calib.nsamples, 4);
  EXPECT_EQ(o.calib.seqlen, 64);
  EXPECT_EQ(o.calib.seed, 3u);
  EXPECT_TRUE(o.force_requant);
  EXPECT_TRUE(given(bos.opt));
  EXPECT_FALSE(bos.bos);
}

// Each group's --help shows each default from the bound variable.
TEST(Help, ShowsEveryDefaultFromTheCode) {
  Cli c;
  SimQuantOptions sq;
  CalibSpelling s;
  s.size_aliases = s.seed_alias = true;
  add_sim_quant_options(*c.sub, sq, s);
  QuantOptions q;  // a second group on another app, with every option
  Cli c2;
  q.method = "absmax";  // a command's own default is what the help shows
  add_quant_options(*c2.sub, q, every_quant_option());
  OutputOptions out;
  OutputSpelling os;
  os.path_help = "output file";
  os.out_alias = os.overwrite_alias = true;
  add_output_options(*c2.sub, out, os);
  const std::string h = c.help(), h2 = c2.help();
  // Each option's line: its names, then (after the type and any range) "=default".
  auto expect_default = [](const std::string& help, const std::string& names,
                           const std::string& def) {
    const size_t at = help.find("  " + names + " ");
    ASSERT_NE(at, std::string::npos) << names << "\n" << help;
    const std::string line = help.substr(at, help.find('\n', at) - at);
    EXPECT_NE(line.find("=" + def), std::string::npos) << line;
  };
  expect_default(h, "--quant", "none");
  expect_default(h, "--method", "sweep-mse");
  expect_default(h, "--format", "nvfp4");
  expect_default(h, "--block", "0");
  expect_default(h, "--calib-nsamples,--nsamples", "128");
  expect_default(h, "--calib-seqlen,--seqlen", "512");
  expect_default(h, "--calib-seed,--seed", "0");
  expect_default(h2, "--method", "absmax");
  expect_default(h2, "--threads", "0");
  EXPECT_NE(h2.find("  -o,--output,--out TEXT"), std::string::npos) << h2;
  EXPECT_NE(h2.find("  --force,--overwrite "), std::string::npos) << h2;
  // The accepted names come from the code.
  EXPECT_NE(h.find(accepted_methods()), std::string::npos) << h;
  EXPECT_EQ(h.find("(default"), std::string::npos) << h;
  EXPECT_EQ(h2.find("(default"), std::string::npos) << h2;
}

TEST(Options, SplitCommas) {
  EXPECT_EQ(split_commas("a,b,,c"), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(split_commas(""), std::vector<std::string>{});
  EXPECT_EQ(split_commas(",x,"), std::vector<std::string>{"x"});
}

}  // namespace
}  // namespace scalesweep::tools
