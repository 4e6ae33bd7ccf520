// scalesweep cast: element-wise conversion through the generic minifloat codec.
//   cast IN.npy --to e2m1|e4m3|ue8m0 [--round rne|floor|ceil] -o OUT.npy   float -> uint8 patterns
//   cast IN.npy --from e2m1|e4m3|ue8m0 -o OUT.npy                          uint8 patterns ->
//   float32
// An existing OUT.npy is replaced only with --force.
// Used by python/tests/test_codec_ml_dtypes.py to compare the codec with ml_dtypes.
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "scalesweep/format/minifloat.h"
#include "scalesweep/io/npy.h"
#include "tools/command.h"
#include "tools/options.h"
#include "tools/ui.h"

namespace scalesweep::tools {
namespace {

namespace fmt = ::scalesweep::format;

struct CastArgs {
  std::string in, to, from, round = "rne";
  bool allow_nonfinite = false;
  OutputOptions out;  // -o OUT.npy, --force
};

template <typename F>
uint8_t encode_as(float x, fmt::Round r) {
  return static_cast<uint8_t>(F::encode(x, r));
}

int run_cast(const CastArgs& a) {
  if (a.to.empty() == a.from.empty()) {
    throw std::invalid_argument(
        "give exactly one of --to FORMAT (encode) or --from FORMAT (decode)");
  }
  a.out.check_file({a.in});
  if (!a.to.empty()) {
    const fmt::Round r = parse_named(fmt::kRoundNames, "--round", a.round);
    const io::NpyF32 x = io::read_npy_f32(a.in);
    std::vector<uint8_t> out(x.data.size());
    for (size_t i = 0; i < x.data.size(); ++i) {
      const float v = x.data[i];
      if (!a.allow_nonfinite && !std::isfinite(v)) {
        throw std::invalid_argument(a.in + ": element " + std::to_string(i) + " is " +
                                    (std::isnan(v) ? "NaN" : "Inf") +
                                    " (pass --allow-nonfinite to apply the codec's NaN/Inf rule)");
      }
      if (a.to == "e2m1") {
        out[i] = encode_as<fmt::E2M1>(v, r);
      } else if (a.to == "e4m3") {
        out[i] = encode_as<fmt::E4M3>(v, r);
      } else if (a.to == "ue8m0") {
        out[i] = encode_as<fmt::UE8M0>(v, r);
      } else {
        throw std::invalid_argument("--to '" + a.to + "': expected e2m1, e4m3 or ue8m0");
      }
    }
    io::write_npy(a.out.path, io::StDType::kU8, x.shape, out);
    std::printf("cast: %zu elements -> %s patterns (%s) in %s\n", out.size(), a.to.c_str(),
                a.round.c_str(), a.out.path.c_str());
    return 0;
  }
  const io::NpyArray p = io::read_npy(a.in);
  if (p.dtype != io::StDType::kU8) {
    throw std::invalid_argument(a.in + ": --from needs a uint8 array of bit patterns, got " +
                                std::string(io::dtype_name(p.dtype)));
  }
  std::vector<float> out(p.data.size());
  for (size_t i = 0; i < p.data.size(); ++i) {
    const uint8_t b = p.data[i];
    if (a.from == "e2m1") {
      if (b > 15) {
        throw std::invalid_argument(a.in + ": element " + std::to_string(i) + " = " +
                                    std::to_string(b) + " is not a 4-bit pattern");
      }
      out[i] = fmt::E2M1::decode_f(b);
    } else if (a.from == "e4m3") {
      out[i] = fmt::E4M3::decode_f(b);
    } else if (a.from == "ue8m0") {
      out[i] = fmt::UE8M0::decode_f(b);
    } else {
      throw std::invalid_argument("--from '" + a.from + "': expected e2m1, e4m3 or ue8m0");
    }
  }
  io::write_npy_f32(a.out.path, p.shape, out);
  std::printf("cast: %zu %s patterns -> float32 in %s\n", out.size(), a.from.c_str(),
              a.out.path.c_str());
  return 0;
}

SS_COMMAND(
    "cast", "Convert float32 .npy to FP4/FP8/UE8M0 bit patterns (uint8) or back",
    [](CLI::App& sub) -> std::function<int()> {
      auto a = std::make_shared<CastArgs>();
      sub.add_option("input", a->in, "input .npy (float for --to, uint8 for --from)")->required();
      sub.add_option("--to", a->to, "encode into e2m1 | e4m3 | ue8m0");
      sub.add_option("--from", a->from, "decode patterns of e2m1 | e4m3 | ue8m0");
      sub.add_option("--round", a->round, "rounding for --to: " + fmt::kRoundNames.accepted(" | "));
      sub.add_flag("--allow-nonfinite", a->allow_nonfinite,
                   "apply the codec's NaN/Inf rule instead of rejecting NaN/Inf");
      add_output_options(sub, a->out, required_output("output .npy"));
      return [a] { return run_cast(*a); };
    });

}  // namespace
}  // namespace scalesweep::tools
