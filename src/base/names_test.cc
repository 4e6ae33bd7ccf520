#include "scalesweep/base/names.h"

#include <gtest/gtest.h>

namespace scalesweep {
namespace {

enum class Color { kRed, kGreen, kBlue, kUnnamed };

constexpr auto kColors = make_names<Color>("color", {{Color::kRed, "red"},
                                                     {Color::kGreen, "green"},
                                                     {Color::kBlue, "blue"},
                                                     {Color::kGreen, "lime"}});

TEST(NameTable, CanonicalNamesAndAliases) {
  EXPECT_EQ(kColors.name(Color::kGreen), "green");
  EXPECT_EQ(kColors.parse("lime"), Color::kGreen);
  EXPECT_EQ(kColors.parse("blue"), Color::kBlue);
  EXPECT_EQ(kColors.values(), (std::vector<Color>{Color::kRed, Color::kGreen, Color::kBlue}));
  EXPECT_EQ(kColors.accepted(), "red, green, blue");
  EXPECT_EQ(kColors.accepted("|"), "red|green|blue");
}

TEST(NameTable, UnknownNameListsTheAcceptedOnes) {
  try {
    kColors.parse("Red");  // case matters unless the table says otherwise
    FAIL() << "no throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "unknown color 'Red' (accepted: red, green, blue)");
  }
  EXPECT_FALSE(kColors.find("").has_value());
  EXPECT_THROW(kColors.name(Color::kUnnamed), std::logic_error);
}

TEST(NameTable, IgnoreCase) {
  constexpr auto t = make_names<Color>("color", {{Color::kRed, "red"}}, /*ignore_case=*/true);
  EXPECT_EQ(t.parse("RED"), Color::kRed);
  EXPECT_EQ(t.parse("rEd"), Color::kRed);
  EXPECT_FALSE(t.find("reds").has_value());
}

}  // namespace
}  // namespace scalesweep
