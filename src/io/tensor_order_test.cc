#include "scalesweep/io/tensor_order.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "base/test_util.h"
#include "scalesweep/io/file.h"

namespace scalesweep::io {
namespace {

std::string error_of(const std::function<void()>& f) {
  return scalesweep::testing::error_of<IoError>(f);
}

// Tensors complete in declaration order, whole or in parts (an empty part and an empty tensor
// among them); every misuse is refused with the one message, before anything is counted.
TEST(TensorWriteOrder, PartsInOrderAndEveryRefusal) {
  TensorWriteOrder o;
  o.declare("a", 10);
  o.declare("e", 0);
  o.declare("b", 4);
  EXPECT_EQ(error_of([&] { o.check_whole("f", "a", 9); }),
            "f: tensor 'a' has 9 bytes, declared 10");
  o.check_whole("f", "a", 10);
  o.check_whole("f", "b", 3);  // not due: add_part names it
  EXPECT_EQ(error_of([&] { o.add_part("f", "b", 4); }),
            "f: tensor 'b' written out of order (expected 'a', tensor 0)");
  EXPECT_FALSE(o.add_part("f", "a", 6));
  EXPECT_FALSE(o.add_part("f", "a", 0));
  EXPECT_EQ(o.written_part(), 6u);
  o.check_whole("f", "a", 3);  // partly written: only add_part's bound applies
  EXPECT_EQ(error_of([&] { o.add_part("f", "a", 5); }),
            "f: tensor 'a' has 11 bytes or more, declared 10");
  EXPECT_EQ(error_of([&] { o.check_complete("f"); }),
            "f: tensor 'a' (tensor 0) was not written whole (6 of 10 bytes)");
  EXPECT_TRUE(o.add_part("f", "a", 4));
  EXPECT_EQ(error_of([&] { o.check_complete("f"); }), "f: tensor 'e' (tensor 1) was not written");
  EXPECT_TRUE(o.add_part("f", "e", 0));
  EXPECT_TRUE(o.add_part("f", "b", 4));
  EXPECT_EQ(o.next(), 3u);
  EXPECT_EQ(error_of([&] { o.check_complete("f"); }), "");
  EXPECT_EQ(error_of([&] { o.add_part("f", "c", 1); }), "f: tensor 'c' was not declared");
}

}  // namespace
}  // namespace scalesweep::io
