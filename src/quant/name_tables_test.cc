// Every name table of the layers up to quant: each enum value has a name, parse(name(v)) == v,
// aliases parse to their value, and an unknown name is refused with a message listing every
// accepted name.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "scalesweep/base/option_error.h"
#include "scalesweep/format/dtype.h"
#include "scalesweep/format/minifloat.h"
#include "scalesweep/quant/quantize.h"
#include "scalesweep/scale/bounds.h"
#include "scalesweep/scale/selector.h"

namespace scalesweep {
namespace {

// `all` lists every enumerator of E (written out here, independently of the table).
template <class Table, class E>
void check_table(const Table& t, const std::vector<E>& all, const std::string& what) {
  EXPECT_EQ(std::string(t.what()), what);
  EXPECT_EQ(t.values(), all) << what << ": every value once, in table order";
  for (E v : all) {
    const std::string n(t.name(v));
    EXPECT_FALSE(n.empty()) << what;
    EXPECT_EQ(t.parse(n), v) << what << " " << n;
  }
  try {
    t.parse("no-such-name");
    ADD_FAILURE() << what << ": an unknown name was accepted";
  } catch (const std::invalid_argument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("unknown " + what + " 'no-such-name'"), std::string::npos) << m;
    for (E v : all)
      EXPECT_NE(m.find(std::string(t.name(v))), std::string::npos) << m << " lacks " << t.name(v);
    EXPECT_NE(m.find("(accepted: " + t.accepted() + ")"), std::string::npos) << m;
  }
}

TEST(NameTables, Method) {
  check_table(
      kMethodNames,
      std::vector<Method>{Method::kAbsMax, Method::kFourOverSix, Method::kSweepMse,
                          Method::kSweepWmse, Method::kSweep, Method::kExhaustiveMse,
                          Method::kExhaustiveWmse, Method::kOptFp8Mse, Method::kOptFp8Wmse,
                          Method::kOptFp32, Method::kSweepHessian, Method::kExhaustiveHessian},
      "method");
  // The CLI spellings, unchanged.
  EXPECT_EQ(kMethodNames.name(Method::kFourOverSix), "4over6");
  EXPECT_EQ(kMethodNames.name(Method::kOptFp8Wmse), "opt-fp8-wmse");
  EXPECT_EQ(kMethodNames.name(Method::kSweepHessian), "sweep-hessian");
  EXPECT_THROW(kMethodNames.parse("AbsMax"), std::invalid_argument);  // case matters
}

TEST(NameTables, ScaleAndElementFormats) {
  check_table(kScaleFormatNames, std::vector<ScaleFormat>{ScaleFormat::kE4M3, ScaleFormat::kUE8M0},
              "scale format");
  using bounds::ElemFormat;
  check_table(bounds::kElemFormatNames,
              std::vector<ElemFormat>{ElemFormat::kE2M1, ElemFormat::kE3M2, ElemFormat::kE2M3,
                                      ElemFormat::kE4M3, ElemFormat::kE5M2},
              "element format");
}

TEST(NameTables, TensorFormatIgnoresCase) {
  check_table(kTensorFormatNames,
              std::vector<TensorFormat>{TensorFormat::kNvfp4, TensorFormat::kMxfp4}, "format");
  EXPECT_EQ(kTensorFormatNames.parse("NVFP4"), TensorFormat::kNvfp4);
  EXPECT_EQ(kTensorFormatNames.parse("MxFp4"), TensorFormat::kMxfp4);
}

TEST(NameTables, DTypeRoundNanPolicy) {
  check_table(kDTypeNames, std::vector<DType>{DType::kF32, DType::kBF16, DType::kF16}, "dtype");
  EXPECT_EQ(kDTypeNames.parse("bf16"), DType::kBF16);
  EXPECT_EQ(kDTypeNames.parse("fp32"), DType::kF32);
  EXPECT_EQ(kDTypeNames.parse("fp16"), DType::kF16);
  using format::NanPolicy;
  using format::Round;
  check_table(
      format::kRoundNames,
      std::vector<Round>{Round::kNearestEven, Round::kFloor, Round::kCeil, Round::kTowardZero},
      "rounding");
  EXPECT_EQ(format::kRoundNames.parse("nearest-even"), Round::kNearestEven);
  EXPECT_EQ(format::kRoundNames.parse("trunc"), Round::kTowardZero);
  check_table(
      format::kNanPolicyNames,
      std::vector<NanPolicy>{NanPolicy::kFiniteOnly, NanPolicy::kAllOnesNan, NanPolicy::kIeee},
      "NaN policy");
}

TEST(Windows, OneParserWithTheRangeOfTheScaleFormat) {
  EXPECT_EQ(max_window_offset(ScaleFormat::kE4M3), 125);
  EXPECT_EQ(max_window_offset(ScaleFormat::kUE8M0), 254);
  const Window w = parse_window("-3,7", ScaleFormat::kE4M3);
  EXPECT_EQ(w.lo, -3);
  EXPECT_EQ(w.hi, 7);
  EXPECT_EQ(parse_window("-254,254", ScaleFormat::kUE8M0).lo, -254);
  EXPECT_EQ(parse_window("-125,125", ScaleFormat::kE4M3).hi, 125);
  auto msg = [](const std::string& s, ScaleFormat f) -> std::string {
    try {
      parse_window(s, f, "--window");
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(msg("-126,3", ScaleFormat::kE4M3).find("[-125, 125]"), std::string::npos);
  EXPECT_NE(msg("-3,255", ScaleFormat::kUE8M0).find("[-254, 254]"), std::string::npos);
  EXPECT_NE(msg("5,2", ScaleFormat::kE4M3).find("--window '5,2': lo (5) > hi (2)"),
            std::string::npos);
  for (const char* bad : {"a,b", "3", "3,", ",3", "3,4,5", "3;4", ""})
    EXPECT_NE(msg(bad, ScaleFormat::kE4M3).find("expected L,R"), std::string::npos) << bad;
  EXPECT_THROW(check_window(Window{2, 1}, ScaleFormat::kE4M3), std::invalid_argument);
  EXPECT_NO_THROW(check_window(Window{-254, 254}, ScaleFormat::kUE8M0));
}

TEST(Blocks, OneCheck) {
  for (int b : {8, 16, 32, 64}) EXPECT_NO_THROW(check_block(TensorFormat::kNvfp4, b));
  EXPECT_NO_THROW(check_block(TensorFormat::kMxfp4, 32));
  for (int b : {0, 12, 24, 128}) {
    try {
      check_block(TensorFormat::kNvfp4, b);
      ADD_FAILURE() << b;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("block size " + std::to_string(b) +
                                           " is not supported (accepted: 8, 16, 32, 64)"),
                std::string::npos)
          << e.what();
    }
  }
  for (int b : {8, 16, 64}) {
    try {
      check_block(TensorFormat::kMxfp4, b);
      ADD_FAILURE() << b;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("MXFP4 requires block 32 (got " + std::to_string(b)),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(MaxBlockScale, OneCheckOneMessage) {
  for (float c : {1e-3f, 256.0f, 448.0f}) EXPECT_NO_THROW(check_max_block_scale(c));
  for (float c : {0.0f, -5.0f, 448.5f, 500.0f, NAN}) {
    try {
      check_max_block_scale(c);
      ADD_FAILURE() << c;
    } catch (const OptionError& e) {
      EXPECT_EQ(e.field(), "max_block_scale");
      EXPECT_EQ(std::string(e.what()), "C must satisfy 0 < C <= 448 (the largest FP8 E4M3 value)");
    }
  }
}

}  // namespace
}  // namespace scalesweep
