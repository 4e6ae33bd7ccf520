// io::open_model_writer: the output path chooses the writer, only the chosen spec is built,
// and a writer dropped before commit() leaves nothing at the output path.
#include "scalesweep/io/model_writer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <stdexcept>
#include <string>

#include "model/test_util.h"
#include "scalesweep/io/checkpoint.h"
#include "scalesweep/io/gguf_writer.h"
#include "scalesweep/io/hf_names.h"

namespace scalesweep::io {
namespace {

namespace fs = std::filesystem;

TEST(ModelWriter, TheOutputPathChoosesTheFormat) {
  EXPECT_TRUE(is_gguf_path("m.gguf"));
  EXPECT_TRUE(is_gguf_path("a/b/model-nvfp4.gguf"));
  EXPECT_FALSE(is_gguf_path("a/b.gguf.d"));
  EXPECT_FALSE(is_gguf_path("out"));
  EXPECT_FALSE(is_gguf_path("m.GGUF"));  // as llama.cpp's tools name them: lower case
}

TEST(ModelWriter, OpensTheChosenWriterAndBuildsOnlyItsSpec) {
  const model::testing::TempDir tmp("model_writer");
  const model::Config c = model::testing::small_config();
  int ct_calls = 0, gguf_calls = 0;
  const auto ct = [&] {
    ++ct_calls;
    CheckpointSpec s;
    s.config = c;
    s.source = tmp.sub("toy.bin");  // not read: a llama2.c source names config.json only
    return s;
  };
  const auto gguf = [&] {
    ++gguf_calls;
    GgufModelSpec s;
    s.config = c;
    for (model::LinearId id : kAllLinears)
      if (!gguf_nvfp4_obstacle(c, id, GgufQwen2As::kLlama).empty()) s.dense.add_every_layer(id);
    s.name = "tiny";
    s.source = "test";
    return s;
  };
  {
    const std::string out = tmp.sub("m.gguf");
    const std::unique_ptr<ModelWriter> w = open_model_writer(out, ct, gguf);
    EXPECT_NE(dynamic_cast<GgufModelWriter*>(w.get()), nullptr);
    EXPECT_EQ(gguf_calls, 1);
    EXPECT_EQ(ct_calls, 0);
  }  // dropped before commit(): nothing in place
  EXPECT_FALSE(fs::exists(tmp.sub("m.gguf")));
  {
    const std::string out = tmp.sub("ckpt");
    const std::unique_ptr<ModelWriter> w = open_model_writer(out, ct, gguf);
    EXPECT_NE(dynamic_cast<CheckpointWriter*>(w.get()), nullptr);
    EXPECT_EQ(gguf_calls, 1);
    EXPECT_EQ(ct_calls, 1);
  }
  EXPECT_FALSE(fs::exists(tmp.sub("ckpt")));
}

}  // namespace
}  // namespace scalesweep::io
