// Sets of decoder-layer Linears (include/scalesweep/model/linear_set.h).
#include "scalesweep/model/linear_set.h"

#include <gtest/gtest.h>

#include <stdexcept>

namespace scalesweep::model {
namespace {

TEST(LinearSet, EveryLayerAndSingleLayers) {
  LinearSet s;
  EXPECT_TRUE(s.empty());
  EXPECT_FALSE(s.any(4));
  s.add_every_layer(LinearId::kDown);
  s.add(2, LinearId::kQ);
  EXPECT_FALSE(s.empty());
  EXPECT_TRUE(s.every_layer(LinearId::kDown));
  EXPECT_FALSE(s.every_layer(LinearId::kQ));
  for (int l = 0; l < 100; ++l) EXPECT_TRUE(s.contains(l, LinearId::kDown)) << l;
  EXPECT_TRUE(s.contains(2, LinearId::kQ));
  EXPECT_FALSE(s.contains(1, LinearId::kQ));
  EXPECT_FALSE(s.contains(3, LinearId::kQ));
  EXPECT_FALSE(s.contains(-1, LinearId::kQ));
  const auto m = s.members(3);
  ASSERT_EQ(m.size(), 4u);  // down of 0, 1, 2 and q of 2, layer by layer in file order
  EXPECT_EQ(m[0], std::make_pair(0, LinearId::kDown));
  EXPECT_EQ(m[1], std::make_pair(1, LinearId::kDown));
  EXPECT_EQ(m[2], std::make_pair(2, LinearId::kQ));
  EXPECT_EQ(m[3], std::make_pair(2, LinearId::kDown));
  EXPECT_EQ(s.count(3), 4u);
  EXPECT_EQ(s.count(2), 2u);
  EXPECT_THROW(s.add(-1, LinearId::kK), std::invalid_argument);
  EXPECT_EQ(s.single_layer_end(), 3);
  EXPECT_EQ(LinearSet{}.single_layer_end(), 0);
}

TEST(LinearSet, SameComparesTheFill) {
  LinearSet every, single;
  every.add_every_layer(LinearId::kUp);
  for (int l = 0; l < 5; ++l) single.add(l, LinearId::kUp);
  EXPECT_TRUE(every.same(single, 5));
  EXPECT_FALSE(every.same(single, 6));
  LinearSet u;
  u.add(single);
  u.add(every);
  EXPECT_TRUE(u.every_layer(LinearId::kUp));
  EXPECT_TRUE(u.same(every, 9));
  LinearSet one;
  one.add(7, LinearId::kV);
  EXPECT_FALSE(one.any(7));
  EXPECT_TRUE(one.any(8));
}

}  // namespace
}  // namespace scalesweep::model
