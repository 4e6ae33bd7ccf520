#include "scalesweep/base/bytes.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace scalesweep {
namespace {

TEST(Bytes, ParseByteSize) {
  EXPECT_EQ(parse_byte_size("5GB", "--max-shard-size"), 5'000'000'000u);
  EXPECT_EQ(parse_byte_size("500MB", "x"), 500'000'000u);
  EXPECT_EQ(parse_byte_size("2GiB", "x"), 2ull << 30);
  EXPECT_EQ(parse_byte_size("1.5kb", "x"), 1500u);
  EXPECT_EQ(parse_byte_size("4096", "x"), 4096u);
  EXPECT_EQ(parse_byte_size(" 10 MiB ", "x"), 10u << 20);
  // "." and ".GB" were passed to std::stod (the bare message "stod"); 400 digits overflow it
  // (std::out_of_range).
  const std::string huge(400, '9');
  for (const std::string& bad : std::vector<std::string>{
           "", "GB", "5XB", "-5GB", "0", "1.2.3MB", "5 GB x", "0.1B", ".", ".GB", " . KB", huge}) {
    try {
      parse_byte_size(bad, "--max-shard-size");
      FAIL() << bad;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("--max-shard-size"), std::string::npos);
    }
  }
}

}  // namespace
}  // namespace scalesweep
