// The name tables of model/config.h and model/weights.h: every value named, parse(name(v)) == v, unknown names
// refused with the accepted ones listed.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "scalesweep/model/config.h"
#include "scalesweep/model/weights.h"

namespace scalesweep::model {
namespace {

template <class Table, class E>
void check_table(const Table& t, const std::vector<E>& all, const std::string& what) {
  EXPECT_EQ(std::string(t.what()), what);
  EXPECT_EQ(t.values(), all) << what;
  for (E v : all) EXPECT_EQ(t.parse(t.name(v)), v) << what << " " << t.name(v);
  try {
    t.parse("no-such-name");
    ADD_FAILURE() << what << ": an unknown name was accepted";
  } catch (const std::invalid_argument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("unknown " + what + " 'no-such-name' (accepted: " + t.accepted() + ")"),
              std::string::npos)
        << m;
    for (E v : all) EXPECT_NE(m.find(std::string(t.name(v))), std::string::npos) << m;
  }
}

TEST(ConfigNames, EveryTableRoundTrips) {
  const std::vector<Arch> arch = {Arch::kLlama, Arch::kQwen2, Arch::kQwen3, Arch::kQwen3Moe,
                                  Arch::kMixtral};
  check_table(kArchNames, arch, "architecture");
  check_table(kArchClassNames, arch, "architecture class");
  EXPECT_EQ(kArchClassNames.name(Arch::kQwen3), "Qwen3ForCausalLM");
  EXPECT_EQ(kArchNames.name(Arch::kQwen3Moe), "qwen3_moe");
  EXPECT_EQ(kArchClassNames.name(Arch::kMixtral), "MixtralForCausalLM");
  check_table(kRopeTypeNames,
              std::vector<RopeType>{RopeType::kDefault, RopeType::kLinear, RopeType::kLlama3,
                                    RopeType::kYarn, RopeType::kDynamic},
              "rope type");
  EXPECT_EQ(model::kRopeTypeNames.name(RopeType::kYarn), "yarn");
  check_table(kWeightDTypeNames,
              std::vector<WeightDType>{WeightDType::kF32, WeightDType::kBF16, WeightDType::kF16,
                                       WeightDType::kNvfp4, WeightDType::kGgml},
              "weight dtype");
}

}  // namespace
}  // namespace scalesweep::model
