// remat/shape.hpp compiles on its own (its first include here; this file is compiled outside the unity build,
// tests/CMakeLists.txt) and gives an N-D op author what the built-in ops use: PackedShape (a shape in an op's
// Params), make_shape, insert_dim, Shape::numel(begin, end), check_rank, and errors.hpp's number_text.
#include "remat/shape.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>

namespace shape_header_test {

using remat::Index;
using remat::PackedShape;
using remat::Shape;

constexpr Index two_to(int bits) {
  return Index{1} << bits;
}

/// PackedShape(s) is packable and unpacks to s, also after a byte copy (as an op's Params are stored).
void expect_round_trip(const Shape& s) {
  SCOPED_TRACE(remat::to_string(s));
  ASSERT_TRUE(PackedShape::packable(s));
  const PackedShape p(s);
  EXPECT_EQ(p.rank(), s.rank());
  EXPECT_EQ(p.unpack(), s);
  unsigned char bytes[sizeof(PackedShape)];
  std::memcpy(bytes, &p, sizeof p);
  PackedShape copy;
  std::memcpy(&copy, bytes, sizeof copy);
  EXPECT_EQ(copy.unpack(), s);
}

/// PackedShape(s) throws shape_error naming PackedShape and s.
void expect_refused(const Shape& s) {
  SCOPED_TRACE(remat::to_string(s));
  EXPECT_FALSE(PackedShape::packable(s));
  try {
    PackedShape p(s);
    ADD_FAILURE() << "no exception";
  } catch (const remat::shape_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("PackedShape"), std::string::npos) << what;
    EXPECT_NE(what.find(remat::to_string(s)), std::string::npos) << what;
  }
}

TEST(PackedShape, IsSmallEnoughForAnOpsParamsAndTriviallyCopyable) {
  static_assert(sizeof(PackedShape) == 36, "");
  static_assert(sizeof(Shape) == 72, "");
  static_assert(std::is_trivially_copyable<PackedShape>::value, "");
  EXPECT_EQ(PackedShape().rank(), 0);
  EXPECT_EQ(PackedShape().unpack(), Shape::scalar());  // a default PackedShape is the scalar shape
}

TEST(PackedShape, RoundTripsEveryRankAndTheLargestDimensions) {
  expect_round_trip(Shape::scalar());
  expect_round_trip(Shape{1});
  expect_round_trip(Shape{2, 3});
  expect_round_trip(Shape{1, 1, 1, 1, 1, 1, 1, 1});
  expect_round_trip(Shape{2, 3, 4, 5, 6, 7, 8, 9});
  const Index low_max = two_to(32) - 1;  // every dimension below 2^32: no high bits
  expect_round_trip(Shape{low_max, low_max, low_max, low_max, low_max, low_max, low_max, low_max});
  // One dimension of 2^32 or more, at each position, the others as large as they may be.
  for (const Index large : {two_to(32), two_to(32) + 1, two_to(40) + 12345, two_to(48) - 1})
    for (int d = 0; d < Shape::max_rank; ++d) {
      Shape s{low_max, low_max, low_max, low_max, low_max, low_max, low_max, low_max};
      s[d] = large;
      expect_round_trip(s);
    }
  expect_round_trip(Shape{two_to(48) - 1});
  expect_round_trip(Shape{3, two_to(33), 1});
}

TEST(PackedShape, RefusesWhatItCannotHold) {
  expect_refused(Shape{two_to(48)});  // bits above 47
  expect_refused(Shape{2, std::numeric_limits<Index>::max()});
  expect_refused(Shape{two_to(32), two_to(32)});  // two dimensions of 2^32 or more
  expect_refused(Shape{2, two_to(40), 3, two_to(33)});
  expect_refused(Shape{2, 0, 3});  // no elements
  expect_refused(Shape{});         // [0,0], an op recipe's "none"
  expect_refused(Shape{4, -1});    // a -1 not yet inferred
}

TEST(MakeShape, BuildsEveryRankAndRefusesOthers) {
  const Index dims[Shape::max_rank] = {2, 3, 4, 5, 6, 7, 8, 9};
  for (int rank = 0; rank <= Shape::max_rank; ++rank) {
    const Shape s = remat::make_shape(dims, rank);
    ASSERT_EQ(s.rank(), rank);
    for (int d = 0; d < rank; ++d) EXPECT_EQ(s[d], dims[d]);
  }
  EXPECT_EQ(remat::make_shape(dims, 0), Shape::scalar());
  EXPECT_THROW(remat::make_shape(dims, Shape::max_rank + 1), remat::shape_error);
  EXPECT_THROW(remat::make_shape(dims, -1), remat::shape_error);
}

TEST(InsertDim, InsertsAtEveryPositionAsUnsqueezeCountsThem) {
  EXPECT_EQ(remat::insert_dim(Shape{2, 3}, 0, 5), (Shape{5, 2, 3}));
  EXPECT_EQ(remat::insert_dim(Shape{2, 3}, 1, 5), (Shape{2, 5, 3}));
  EXPECT_EQ(remat::insert_dim(Shape{2, 3}, 2, 5), (Shape{2, 3, 5}));
  EXPECT_EQ(remat::insert_dim(Shape{2, 3}, -1, 5), (Shape{2, 3, 5}));  // -1 appends
  EXPECT_EQ(remat::insert_dim(Shape{2, 3}, -3, 5), (Shape{5, 2, 3}));
  EXPECT_EQ(remat::insert_dim(Shape::scalar(), 0, 7), (Shape{7}));
  EXPECT_THROW(remat::insert_dim(Shape{2, 3}, 3, 1), remat::index_error);
  EXPECT_THROW(remat::insert_dim(Shape{2, 3}, -4, 1), remat::index_error);
  EXPECT_THROW(remat::insert_dim(Shape{1, 1, 1, 1, 1, 1, 1, 1}, 0, 1), remat::shape_error);
}

TEST(ShapeNumel, OfARangeOfDimensions) {
  const Shape s{2, 3, 4};
  EXPECT_EQ(s.numel(0, 0), 1);
  EXPECT_EQ(s.numel(0, 1), 2);
  EXPECT_EQ(s.numel(1, 3), 12);
  EXPECT_EQ(s.numel(0, 3), s.numel());
  EXPECT_EQ(Shape::scalar().numel(0, 0), 1);
}

TEST(CheckRank, NamesTheOpTheOperandAndBothRanks) {
  EXPECT_NO_THROW(remat::check_rank("my_op", "A", Shape{2, 3}, 2));
  try {
    remat::check_rank("my_op", "A", Shape{2, 3, 4}, 2);
    ADD_FAILURE() << "no exception";
  } catch (const remat::shape_error& e) {
    EXPECT_STREQ(e.what(), "my_op: A is [2,3,4], of rank 3; my_op takes a rank-2 A");
  }
}

TEST(NumberText, TheShortestTextThatReadsBack) {
  EXPECT_EQ(remat::number_text(1e-9), "1e-09");
  EXPECT_EQ(remat::number_text(0.1), "0.1");
  EXPECT_EQ(remat::number_text(-2.5), "-2.5");
  EXPECT_EQ(remat::number_text(static_cast<double>(0.1f)), "0.10000000149011612");
  EXPECT_EQ(remat::number_text(std::numeric_limits<double>::infinity()), "inf");
  EXPECT_EQ(remat::number_text(std::numeric_limits<double>::quiet_NaN()), "nan");
  EXPECT_EQ(remat::number_text(-std::numeric_limits<double>::max()), "-1.7976931348623157e+308");
}

}  // namespace shape_header_test
