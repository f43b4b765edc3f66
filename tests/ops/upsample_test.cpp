// upsample_nearest2d beyond the PyTorch float64 values of tests/ops/conv2d_test.cpp (conv_reference.txt): the
// gradcheck over integer and non-integer scales, sizes up and down, size 1 and a 1x1 image; the two index rules of
// PyTorch 1.13's forward (which one, in float and in double) and a backward that is the forward's derivative where
// PyTorch's is not; what the policies see and that it keeps nothing; errors that name the op and leave the tape
// as it was.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "nd_gradcheck.hpp"
#include "remat/remat.hpp"

namespace upsample_test {

using remat::Shape;
using remat::Tape;
using remat::UpsampleNearest2dOptions;
using remat::Var;
using V = Var<double>;

struct Case {
  Shape x;
  UpsampleNearest2dOptions options;
  Shape expected;
};

TEST(UpsampleNearest2d, PassesTheGradcheckUpAndDownByScaleAndBySize) {
  const std::vector<Case> grid = {
      {{2, 2, 3, 4}, UpsampleNearest2dOptions().scale_factor(2), {2, 2, 6, 8}},
      {{1, 3, 3, 2}, UpsampleNearest2dOptions().scale_factor({1.5, 2.5}), {1, 3, 4, 5}},
      {{1, 2, 5, 6}, UpsampleNearest2dOptions().scale_factor({1.1, 1.7}), {1, 2, 5, 10}},  // generic rule
      {{1, 1, 5, 6}, UpsampleNearest2dOptions().scale_factor({1.1, 1.7}), {1, 1, 5, 10}},  // channels-last rule
      {{1, 2, 5, 4}, UpsampleNearest2dOptions().scale_factor({1.7, 2.3}).recompute_scale_factor(true), {1, 2, 8, 9}},
      {{2, 2, 7, 9}, UpsampleNearest2dOptions().scale_factor({0.5, 0.4}), {2, 2, 3, 3}},
      {{2, 2, 7, 5}, UpsampleNearest2dOptions().size({3, 2}), {2, 2, 3, 2}},  // pixels no output reads
      {{1, 2, 4, 5}, UpsampleNearest2dOptions().size({6, 2}), {1, 2, 6, 2}},
      {{1, 2, 3, 4}, UpsampleNearest2dOptions().size(1), {1, 2, 1, 1}},
      {{2, 3, 1, 1}, UpsampleNearest2dOptions().size({3, 2}), {2, 3, 3, 2}},
  };
  for (const Case& c : grid) {
    SCOPED_TRACE(remat::to_string(c.x) + " -> " + remat::to_string(c.expected));
    Shape got;
    EXPECT_TRUE(remat_test::nd_check(
        [&](Tape<double>& tape, const std::vector<V>& v) {
          const V y = remat::upsample_nearest2d(v[0], c.options);
          got = y.shape();
          return remat_test::weighted_sum(tape, y);
        },
        {c.x}));
    EXPECT_EQ(got, c.expected);
  }
}

/// y[0, c, 0, 37] of x = [0, 1, ..., 5] in every channel of [1, channels, 1, 6], resized to [1, 74], and the input
/// element its gradient reaches.
template <class T>
std::pair<T, int> source_at_37(remat::Index channels) {
  Tape<T> tape;
  std::vector<T> values;
  for (remat::Index c = 0; c < channels; ++c)
    for (int i = 0; i < 6; ++i) values.push_back(static_cast<T>(i));
  const Var<T> x = tape.variable(Shape{1, channels, 1, 6}, values.data());
  const Var<T> y = remat::upsample_nearest2d(x, UpsampleNearest2dOptions().size({1, 74}));
  std::vector<T> pick(static_cast<std::size_t>(channels * 74), T(0));
  pick[37] = 1;  // channel 0, column 37
  tape.backward(remat::sum(y * tape.constant(Shape{1, channels, 1, 74}, pick.data())));
  int reached = -1;
  for (int i = 0; i < 6; ++i)
    if (x.grad().data()[i] == T(1)) reached = i;
  return {y.value().data()[37], reached};
}

TEST(UpsampleNearest2d, PicksTheSourcesPyTorchsForwardPicksInFloatAndDoubleAndItsBackwardIsTheirDerivative) {
  // PyTorch 1.13, F.interpolate(x, size=(1, 74)) with x = arange(6) in each channel: at column 37 (37·6/74 = 3
  // exactly) float32 gives 2 for either C, float64 gives 3 for C = 2 (the product rounds up) and 2 for C = 1
  // (the channels-last kernel computes in float).
  EXPECT_EQ(source_at_37<float>(2), std::make_pair(2.0f, 2));
  EXPECT_EQ(source_at_37<double>(2), std::make_pair(3.0, 3));  // PyTorch's backward would send it to 2
  EXPECT_EQ(source_at_37<float>(1), std::make_pair(2.0f, 2));
  EXPECT_EQ(source_at_37<double>(1), std::make_pair(2.0, 2));

  // A scale factor 1.1 on 5 rows keeps 5: the channels-last rule (C = 1) copies, the generic one reads
  // ⌊i / 1.1⌋ = 0, 0, 1, 2, 3 (PyTorch 1.13: the same; its backward would copy the gradient back instead).
  Tape<double> tape;
  const std::vector<double> rows{0, 1, 2, 3, 4, 0, 1, 2, 3, 4};
  const V one = tape.variable(Shape{1, 1, 5, 1}, rows.data());
  const V two = tape.variable(Shape{1, 2, 5, 1}, rows.data());
  const auto options = UpsampleNearest2dOptions().scale_factor({1.1, 1.0});
  const V y1 = remat::upsample_nearest2d(one, options), y2 = remat::upsample_nearest2d(two, options);
  EXPECT_EQ(std::vector<double>(y1.value().data(), y1.value().data() + 5), (std::vector<double>{0, 1, 2, 3, 4}));
  EXPECT_EQ(std::vector<double>(y2.value().data(), y2.value().data() + 10),
            (std::vector<double>{0, 0, 1, 2, 3, 0, 0, 1, 2, 3}));
  tape.backward(remat::sum(y2));
  EXPECT_EQ(std::vector<double>(two.grad().data(), two.grad().data() + 5), (std::vector<double>{2, 1, 1, 1, 0}));
  // recompute_scale_factor: the index uses in/out = 1, a copy, for any C.
  const V y3 =
      remat::upsample_nearest2d(two, UpsampleNearest2dOptions().scale_factor({1.1, 1.0}).recompute_scale_factor(true));
  EXPECT_EQ(std::vector<double>(y3.value().data(), y3.value().data() + 10), rows);
}

TEST(UpsampleNearest2d, IsDataMovementToThePoliciesAndKeepsNothingForItsBackward) {
  Tape<float> tape;
  const std::vector<float> values(2 * 3 * 4 * 4, 0.5f);
  const Var<float> x = tape.constant(Shape{2, 3, 4, 4}, values.data());
  std::vector<remat::OpInfo> seen;
  const Var<float> y = remat::checkpoint(
      [](const Var<float>& in) { return remat::upsample_nearest2d(in, UpsampleNearest2dOptions().scale_factor(2)); },
      [&](const remat::OpInfo& op) {
        seen.push_back(op);
        return true;
      })(x);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].name, "upsample_nearest2d");
  EXPECT_EQ(seen[0].kind, remat::OpKind::data_movement);
  EXPECT_EQ(seen[0].shape, (Shape{2, 3, 8, 8}));
  EXPECT_EQ(seen[0].bytes, 2u * 3 * 8 * 8 * sizeof(float));
  EXPECT_EQ(seen[0].flops, 2.0 * 3 * 8 * 8);
  EXPECT_FALSE(remat::policies::dots_saveable(seen[0]));
  // Its backward reads nothing: on a plain tape the input (a variable, so there is a backward) is kept by nobody
  // once the op has run, and only its output, which square's backward reads, is saved.
  Tape<float> plain;
  const Var<float> c = plain.variable(Shape{2, 3, 4, 4}, values.data());
  const Var<float> u = remat::upsample_nearest2d(c, UpsampleNearest2dOptions().scale_factor(2));
  const Var<float> loss = remat::sum(remat::square(u));
  EXPECT_EQ(plain.memory().saved_bytes, 2u * 3 * 8 * 8 * sizeof(float));
  (void)loss;
  (void)y;
}

TEST(UpsampleNearest2d, BadOptionsAndShapesThrowNamingTheOpAndRecordNothing) {
  Tape<double> tape;
  const V x = tape.variable(Shape{1, 2, 3, 4}, remat_test::nd_values(Shape{1, 2, 3, 4}, 1).data());
  const V flat = tape.variable(Shape{2, 3, 4}, remat_test::nd_values(Shape{2, 3, 4}, 2).data());
  const std::size_t size = tape.size();
  const auto domain_error = [&](UpsampleNearest2dOptions o, std::vector<std::string> words) {
    words.insert(words.begin(), "upsample_nearest2d");
    remat_test::expect_error_naming<remat::domain_error>([&] { remat::upsample_nearest2d(x, o); }, words);
  };
  domain_error(UpsampleNearest2dOptions(), {"neither size nor scale_factor", "exactly one"});
  domain_error(UpsampleNearest2dOptions().size(2).scale_factor(2), {"both size and scale_factor", "exactly one"});
  domain_error(UpsampleNearest2dOptions().size({0, 3}), {"[0,3]", "at least 1"});
  domain_error(UpsampleNearest2dOptions().size({2, -1}), {"[2,-1]", "at least 1"});
  domain_error(UpsampleNearest2dOptions().scale_factor({2, 0}), {"along W is 0", "finite and above 0"});
  domain_error(UpsampleNearest2dOptions().scale_factor({-1.5, 2}), {"along H is -1.5", "finite and above 0"});
  domain_error(UpsampleNearest2dOptions().scale_factor(std::numeric_limits<double>::infinity()), {"inf"});
  domain_error(UpsampleNearest2dOptions().scale_factor(std::nan("")), {"nan"});
  domain_error(UpsampleNearest2dOptions().size(4).recompute_scale_factor(true),
               {"not meaningful with an explicit size"});
  const auto shape_error = [&](const V& in, UpsampleNearest2dOptions o, std::vector<std::string> words) {
    words.insert(words.begin(), "upsample_nearest2d");
    remat_test::expect_error_naming<remat::shape_error>([&] { remat::upsample_nearest2d(in, o); }, words);
  };
  shape_error(flat, UpsampleNearest2dOptions().scale_factor(2), {"[2,3,4]", "[N,C,H,W]", "unsqueeze"});
  shape_error(x, UpsampleNearest2dOptions().scale_factor({2, 0.2}),
              {"[1,2,3,4]", "along W is 0.2", "output 0 wide", "at least 1/4"});
  shape_error(x, UpsampleNearest2dOptions().scale_factor({0.3, 1}), {"along H is 0.29999999999999999", "0 high"});
  shape_error(x, UpsampleNearest2dOptions().scale_factor({1e300, 1}), {"2^48 bytes"});
  shape_error(x, UpsampleNearest2dOptions().size({1 << 30, 1 << 30}), {"2^48 bytes"});
  EXPECT_EQ(tape.size(), size) << "a refused op records nothing";
  remat_test::expect_error_naming<remat::tape_error>(
      [&] { remat::upsample_nearest2d(V(), UpsampleNearest2dOptions().scale_factor(2)); }, {"upsample_nearest2d"});
  EXPECT_EQ(remat::upsample_nearest2d(x, UpsampleNearest2dOptions().scale_factor({0.34, 0.25})).shape(),
            (Shape{1, 2, 1, 1}));  // ⌊3 · 0.34⌋ = ⌊4 · 0.25⌋ = 1, on the same tape
}

}  // namespace upsample_test
