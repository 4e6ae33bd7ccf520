#include "scalesweep/base/option_error.h"

#include <gtest/gtest.h>

#include <string>

namespace scalesweep {
namespace {

std::string dashed(std::string_view f) {
  std::string s = "--" + std::string(f);
  for (char& c : s)
    if (c == '_') c = '-';
  return s;
}

TEST(OptionError, ReferencesRenderAsTheFrontEndNamesThem) {
  std::string m = "pass ";
  m.append(option_ref("calib")).append(" TEXT (sampled with ");
  m.append(option_ref("calib_nsamples")).append(") or ").append(option_ref("stats"));
  EXPECT_EQ(render_option_refs(m, dashed),
            "pass --calib TEXT (sampled with --calib-nsamples) or --stats");
  EXPECT_EQ(render_option_refs(m, [](std::string_view f) { return std::string(f) + "="; }),
            "pass calib= TEXT (sampled with calib_nsamples=) or stats=");
  // Text that is no reference stays as it is, braces included (a quoted chat template).
  EXPECT_EQ(render_option_refs("no refs", dashed), "no refs");
  std::string braces = "{{bos_token}} and ";
  braces.append(option_ref("b"));
  EXPECT_EQ(render_option_refs(braces, dashed), "{{bos_token}} and --b");
  const std::string open =
      "open \x1e"
      "calib";
  EXPECT_EQ(render_option_refs(open, dashed), open);
  std::string not_field =
      "\x1e"
      "Not A Field\x1f ";
  const std::string kept = not_field;
  not_field.append(option_ref("c"));
  EXPECT_EQ(render_option_refs(not_field, dashed), kept + "--c");
  EXPECT_EQ(render_option_refs("", dashed), "");
}

}  // namespace
}  // namespace scalesweep
