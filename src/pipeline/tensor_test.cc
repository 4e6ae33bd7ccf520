#include "scalesweep/pipeline/tensor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "scalesweep/base/option_error.h"
#include "scalesweep/io/npy.h"
#include "scalesweep/io/safetensors.h"

namespace scalesweep::pipeline {
namespace {

constexpr int64_t kRows = 4, kCols = 64;

std::string write_inputs() {
  const std::string dir = ::testing::TempDir();
  std::vector<float> x(kRows * kCols), w(kCols);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * i) * (1 + (i % 7));
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.5f + (i % 3);
  io::write_npy_f32(dir + "/tensor_x.npy", {kRows, kCols}, x);
  io::write_npy_f32(dir + "/tensor_w.npy", {kCols}, w);
  return dir;
}

TEST(TensorFile, QuantizesOneMethodAndWritesTheOutput) {
  const std::string dir = write_inputs();
  TensorRequest req;
  req.input = dir + "/tensor_x.npy";
  req.importance = dir + "/tensor_w.npy";
  req.method = Method::kSweepWmse;
  req.output = dir + "/tensor_out.safetensors";
  req.dequant = true;
  std::remove(req.output.c_str());
  int hooks = 0;
  req.before_load = [&] { ++hooks; };
  int64_t last = 0;
  JobEvents ev;
  ev.progress = [&](const std::string& stage, const char* unit, int64_t done, int64_t total) {
    EXPECT_EQ(stage + "/" + unit, "tensor/runs");
    EXPECT_EQ(total, 3);  // the method, opt-fp32 plain and weighted
    last = done;
  };
  const TensorResult r = quantize_tensor_file(req, ev);
  EXPECT_EQ(hooks, 1);
  EXPECT_EQ(last, 3);
  EXPECT_EQ(r.rows, kRows);
  EXPECT_EQ(r.cols, kCols);
  EXPECT_TRUE(r.weighted);
  ASSERT_EQ(r.results.size(), 1u);
  const TensorMethodResult& m = r.results[0];
  EXPECT_EQ(m.run.method, Method::kSweepWmse);
  EXPECT_EQ(m.gaps.nwmse_pct, gaps_to_opt(m.run.err, r.opt, m.run.method, true).nwmse_pct);
  EXPECT_GE(m.gaps.nwmse_pct, 0.0);
  const auto f = io::SafetensorsFile::open(req.output);
  EXPECT_EQ(f.at("weight_packed").shape, (std::vector<int64_t>{kRows, kCols / 2}));
  EXPECT_EQ(f.at("weight_scale").shape, (std::vector<int64_t>{kRows, kCols / 16}));
  EXPECT_EQ(f.read_f32("dequant"), m.run.xhat);
}

TEST(TensorFile, ComparesEveryMethod) {
  const std::string dir = write_inputs();
  TensorRequest req;
  req.input = dir + "/tensor_x.npy";
  const TensorResult r = compare_tensor_file(req);
  EXPECT_FALSE(r.weighted);
  // Every method but sweep (no window) and the two block-Hessian ones (no Hessian).
  ASSERT_EQ(r.results.size(), kMethodNames.values().size() - 3);
  for (const TensorMethodResult& m : r.results) {
    EXPECT_NE(m.run.method, Method::kSweep);
    EXPECT_FALSE(method_uses_hessian(m.run.method));
    EXPECT_TRUE(m.run.xhat.empty());
    EXPECT_GE(m.gaps.nmse_pct, -1e-9);
  }
  EXPECT_EQ(r.results.back().run.method, Method::kOptFp32);
  EXPECT_EQ(r.results.back().gaps.nmse_pct, 0.0);
  req.config.selector.window = Window{-2, 2};
  EXPECT_EQ(compare_tensor_file(req).results.size(), kMethodNames.values().size() - 2);
}

TEST(TensorFile, RejectsBadRequests) {
  const std::string dir = write_inputs();
  TensorRequest req;
  req.input = dir + "/tensor_x.npy";
  EXPECT_THROW(quantize_tensor_file(req), OptionError);  // no method
  req.method = Method::kSweep;
  EXPECT_THROW(quantize_tensor_file(req), OptionError);  // no window
  req.method = Method::kAbsMax;
  req.dequant = true;
  EXPECT_THROW(quantize_tensor_file(req), OptionError);  // dequant without an output
  req.dequant = false;
  req.importance = dir + "/tensor_x.npy";  // per element, with negative entries
  EXPECT_THROW(quantize_tensor_file(req), std::invalid_argument);
  req.importance.clear();
  EXPECT_THROW(compare_tensor_file(req), OptionError);  // a comparison with a method
  req.method.reset();
  req.config.block = 7;
  try {
    compare_tensor_file(req);
    ADD_FAILURE() << "block 7 accepted";
  } catch (const OptionError& e) {
    EXPECT_EQ(e.field(), "block");
  }
}

}  // namespace
}  // namespace scalesweep::pipeline
