// conv2d, max_pool2d, avg_pool2d, adaptive_avg_pool2d and upsample_nearest2d against PyTorch 1.13 float64 values
// (tests/ops/conv_reference.txt, written by tests/ops/make_conv_reference.py) plain and under every policy (bitwise
// equal to plain); conv2d's and the pools' gradchecks over
// stride, padding, dilation, groups, kernel 1 and output size 1; the policies' view of it (a convolution: kept by
// dots_saveable, not by dots_with_no_batch_dims_saveable, as JAX's); its temporary counted in the peak; errors.
// (Two upsample_nearest2d cases have values only: there PyTorch's backward is not its forward's derivative;
// tests/ops/upsample_test.cpp checks remat's, and the rest of that op.)
#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "api_checks.hpp"
#include "expect_error.hpp"
#include "nd_gradcheck.hpp"
#include "nd_reference.hpp"
#include "remat/remat.hpp"

namespace conv2d_test {

using remat::Conv2dOptions;
using remat::Shape;
using remat::Tape;
using remat::Var;
using remat_test::ReferenceCase;
using V = Var<double>;
using Matrix = remat::Matrix<double>;

Conv2dOptions options_of(const ReferenceCase& c) {
  const auto s = c.dims("stride"), p = c.dims("padding"), d = c.dims("dilation");
  return Conv2dOptions().stride({s[0], s[1]}).padding({p[0], p[1]}).dilation({d[0], d[1]}).groups(c.dims("groups")[0]);
}

remat::Size2 pair(const ReferenceCase& c, const char* key) {
  const auto v = c.dims(key);
  return {v.at(0), v.at(1)};
}

/// The case's op on its inputs, by the file's name.
V build(const std::vector<V>& x, const ReferenceCase& c) {
  const bool ceil_mode = c.has("ceil_mode") && c.ints("ceil_mode").at(0) != 0;  // absent: false
  if (c.name == "max_pool2d")
    return remat::max_pool2d(x[0], remat::MaxPool2dOptions(pair(c, "kernel"))
                                       .stride(pair(c, "stride"))
                                       .padding(pair(c, "padding"))
                                       .dilation(pair(c, "dilation"))
                                       .ceil_mode(ceil_mode));
  if (c.name == "avg_pool2d")
    return remat::avg_pool2d(x[0], remat::AvgPool2dOptions(pair(c, "kernel"))
                                       .stride(pair(c, "stride"))
                                       .padding(pair(c, "padding"))
                                       .count_include_pad(c.ints("count_include_pad").at(0) != 0)
                                       .ceil_mode(ceil_mode));
  if (c.name == "adaptive_avg_pool2d") return remat::adaptive_avg_pool2d(x[0], pair(c, "output_size"));
  if (c.name == "upsample_nearest2d") {
    remat::UpsampleNearest2dOptions o;
    if (c.has("size"))
      o.size(pair(c, "size"));
    else
      o.scale_factor({c.attributes.at("scale_factor").at(0), c.attributes.at("scale_factor").at(1)});
    return remat::upsample_nearest2d(x[0], o.recompute_scale_factor(c.ints("recompute_scale_factor").at(0) != 0));
  }
  EXPECT_EQ(c.name, "conv2d");
  return x.size() == 3 ? remat::conv2d(x[0], x[1], x[2], options_of(c)) : remat::conv2d(x[0], x[1], options_of(c));
}

struct Result {
  Shape shape;
  std::vector<double> output;
  std::vector<std::vector<double>> grads;
};

Result run(const ReferenceCase& c, const remat_test::AnyPolicy* policy) {
  Tape<double> tape;
  std::vector<V> x;
  for (const auto& in : c.inputs) x.push_back(tape.variable(in.shape, in.values.data()));
  V y;
  if (!policy)
    y = build(x, c);
  else if (x.size() == 1)
    y = remat::checkpoint([&](const V& a) { return build({a}, c); }, *policy)(x[0]);
  else if (x.size() == 3)
    y = remat::checkpoint(
        [&](const V& a, const V& w, const V& b) {
          return build({a, w, b}, c);
        },
        *policy)(x[0], x[1], x[2]);
  else
    y = remat::checkpoint([&](const V& a, const V& w) { return build({a, w}, c); }, *policy)(x[0], x[1]);
  Result r;
  r.shape = y.shape();
  const auto value = y.value();
  r.output.assign(value.data(), value.data() + value.size());
  tape.backward(remat::sum(remat::tanh(y) * tape.constant(c.output.shape, c.weight.data())));
  for (const V& v : x) r.grads.emplace_back(v.grad().data(), v.grad().data() + v.grad().size());
  return r;
}

TEST(Conv2d, ItAndThePoolingOpsMatchPyTorchAndEveryPolicyIsBitwiseEqualToPlain) {
  const auto cases = remat_test::read_reference_cases(REMAT_SOURCE_DIR "/tests/ops/conv_reference.txt");
  ASSERT_EQ(cases.size(), 51u);
  for (const ReferenceCase& c : cases) {
    SCOPED_TRACE(c.name + " at conv_reference.txt:" + std::to_string(c.line));
    // The file's gradients are of sum(y ⊙ g); check the values and those first, on a tape of their own.
    Tape<double> tape;
    std::vector<V> x;
    for (const auto& in : c.inputs) x.push_back(tape.variable(in.shape, in.values.data()));
    const V y = build(x, c);
    ASSERT_EQ(y.shape(), c.output.shape);
    EXPECT_TRUE(remat_test::close_to_reference(y.value(), c.output.values));
    tape.backward(remat::sum(y * tape.constant(c.output.shape, c.weight.data())));
    for (const auto& [k, g] : c.grads) {
      const auto got = x[static_cast<std::size_t>(k)].grad();
      EXPECT_TRUE(remat_test::close_to_reference(got, g.values)) << "input " << k;
    }
    // Behind a tanh, whose backward reads the output: every policy replays to the same bits.
    const Result plain = run(c, nullptr);
    for (const auto& [name, policy] : remat_test::every_policy()) {
      const Result r = run(c, &policy);
      EXPECT_TRUE(r.output == plain.output) << name;
      for (std::size_t k = 0; k < r.grads.size(); ++k)
        EXPECT_TRUE(std::memcmp(r.grads[k].data(), plain.grads[k].data(), r.grads[k].size() * sizeof(double)) == 0)
            << name << ", input " << k;
    }
  }
}

struct Geometry {
  Shape x, w;
  Conv2dOptions options;
  bool bias;
};

TEST(Conv2d, PassesTheGradcheckOverStridePaddingDilationGroupsAndBias) {
  const std::vector<Geometry> grid = {
      {{2, 3, 5, 4}, {2, 3, 3, 3}, Conv2dOptions(), true},
      {{1, 2, 6, 6}, {3, 2, 3, 2}, Conv2dOptions().stride(2).padding(1), true},
      {{1, 2, 5, 7}, {2, 2, 2, 3}, Conv2dOptions().stride({1, 3}).padding({2, 0}), false},
      {{1, 2, 7, 7}, {2, 2, 3, 3}, Conv2dOptions().dilation(2).padding(1), true},
      {{2, 4, 4, 4}, {2, 2, 3, 3}, Conv2dOptions().groups(2).padding(1), true},
      {{1, 3, 4, 5}, {6, 1, 3, 3}, Conv2dOptions().groups(3).stride(2).padding(1), false},  // depthwise, ×2
      {{2, 3, 3, 4}, {4, 3, 1, 1}, Conv2dOptions(), true},                                  // kernel 1
      {{1, 2, 3, 3}, {2, 2, 3, 3}, Conv2dOptions(), true},                                  // output 1×1
  };
  for (const Geometry& g : grid) {
    std::vector<Shape> shapes{g.x, g.w};
    if (g.bias) shapes.push_back(Shape{g.w[0]});
    EXPECT_TRUE(remat_test::nd_check(
        [&](Tape<double>& tape, const std::vector<V>& v) {
          const V y = g.bias ? remat::conv2d(v[0], v[1], v[2], g.options) : remat::conv2d(v[0], v[1], g.options);
          return remat_test::weighted_sum(tape, y);
        },
        shapes))
        << remat::to_string(g.x) << " * " << remat::to_string(g.w);
  }
}

TEST(Conv2d, IsAConvolutionToThePolicies) {
  Tape<float> tape;
  Var<float> x =
      tape.variable(Shape{2, 3, 6, 6}, remat_test::nd_values(Shape{2, 3, 6, 6}, 1).cast<float>().eval().data());
  Var<float> w =
      tape.variable(Shape{4, 3, 3, 3}, remat_test::nd_values(Shape{4, 3, 3, 3}, 2).cast<float>().eval().data());
  std::vector<remat::OpInfo> seen;
  auto block = [&](const Var<float>& in) { return remat::relu(remat::conv2d(in, w, Conv2dOptions().padding(1))); };
  Var<float> y = remat::checkpoint(block, [&](const remat::OpInfo& op) {
    seen.push_back(op);
    return false;
  })(x);
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].name, "conv2d");
  EXPECT_EQ(seen[0].kind, remat::OpKind::convolution);
  EXPECT_EQ(seen[0].shape, (Shape{2, 4, 6, 6}));
  EXPECT_EQ(seen[0].flops, 2.0 * 2 * 4 * 36 * 27);
  EXPECT_TRUE(remat::policies::dots_saveable(seen[0]));
  EXPECT_FALSE(remat::policies::dots_with_no_batch_dims_saveable(seen[0]));
  EXPECT_FALSE(remat::policies::dots_saveable(seen[1]));
}

TEST(Conv2d, ItsTemporaryCountsInThePeakAndNothingElseStays) {
  // x [1,2,5,5] (50 values), w [3,2,3,3] (54), y [1,3,3,3] (27); im2col [18, 9] (162), only during the kernel.
  // In double, whose conv2d is always im2col (conv2d_onednn_test.cpp counts oneDNN's temporary).
  Tape<double> tape;
  Var<double> x = tape.constant(Shape{1, 2, 5, 5}, remat_test::nd_values(Shape{1, 2, 5, 5}, 3).data());
  Var<double> w = tape.constant(Shape{3, 2, 3, 3}, remat_test::nd_values(Shape{3, 2, 3, 3}, 4).data());
  const std::size_t before = tape.memory().live_bytes;
  EXPECT_EQ(before, (50u + 54u) * sizeof(double));
  Var<double> y = remat::conv2d(x, w);
  EXPECT_EQ(tape.memory().live_bytes, before + 27 * sizeof(double));
  EXPECT_EQ(tape.memory().peak_bytes, before + (27 + 162) * sizeof(double));
}

TEST(Conv2d, BadShapesAndOptionsThrowNamingConv2dAndRecordNothing) {
  Tape<double> tape;
  auto var = [&](const Shape& s) { return tape.variable(s, remat_test::nd_values(s, 5).data()); };
  const V x = var({2, 4, 5, 5}), w = var({6, 2, 3, 3}), b = var({6});
  const std::size_t size = tape.size();
  const auto shape_error = [&](auto f, const char* what) {
    remat_test::expect_error_naming<remat::shape_error>(f, {"conv2d", what});
  };
  shape_error([&] { remat::conv2d(var({4, 5, 5}), w); }, "[N,C,H,W]");
  shape_error([&] { remat::conv2d(x, var({6, 2, 3})); }, "weight must be");
  shape_error([&] { remat::conv2d(x, w); }, "must equal the input's channels");  // groups 1: 2 ≠ 4
  shape_error([&] { remat::conv2d(x, w, Conv2dOptions().groups(4)); }, "groups (4) must divide");
  shape_error([&] { remat::conv2d(x, w, var({5}), Conv2dOptions().groups(2)); }, "[out_channels]");
  shape_error([&] { remat::conv2d(x, var({6, 4, 7, 3})); }, "smaller than the dilated kernel");
  shape_error([&] { remat::conv2d(x, var({6, 4, 3, 3}), Conv2dOptions().dilation(3)); }, "smaller than the dilated");
  const auto domain_error = [&](auto f, const char* what) {
    remat_test::expect_error_naming<remat::domain_error>(f, {"conv2d", what});
  };
  domain_error([&] { remat::conv2d(x, w, Conv2dOptions().stride(0)); }, "stride is 0");
  domain_error([&] { remat::conv2d(x, w, Conv2dOptions().padding({0, -1})); }, "padding is -1");
  domain_error([&] { remat::conv2d(x, w, Conv2dOptions().groups(0)); }, "groups is 0");
  EXPECT_EQ(tape.size(), size + 5) << "only the five Vars the checks made";
  EXPECT_EQ(remat::conv2d(x, w, b, Conv2dOptions().groups(2)).shape(), (Shape{2, 6, 3, 3}));
}

TEST(Pooling, PassesTheGradcheck) {
  const Shape x{2, 2, 5, 6};
  auto check = [&](auto pool) {
    return remat_test::nd_check(
        [&](Tape<double>& tape, const std::vector<V>& v) { return remat_test::weighted_sum(tape, pool(v[0])); }, {x},
        -1, 1, 31);
  };
  // Random values: no two in a window lie within the finite-difference step (max_pool2d would then cross a kink).
  EXPECT_TRUE(check([](const V& v) { return remat::max_pool2d(v, remat::MaxPool2dOptions(3).stride(2).padding(1)); }));
  EXPECT_TRUE(check([](const V& v) {
    return remat::avg_pool2d(v, remat::AvgPool2dOptions({2, 3}).stride(1).padding(1).count_include_pad(false));
  }));
  EXPECT_TRUE(check([](const V& v) { return remat::adaptive_avg_pool2d(v, {4, 4}); }));
  // ceil_mode: the last windows run past the input (5 → 3 rows, 6 → 3 columns instead of 2 and 2).
  EXPECT_TRUE(
      check([](const V& v) { return remat::max_pool2d(v, remat::MaxPool2dOptions(3).stride(2).ceil_mode(true)); }));
  EXPECT_TRUE(check([](const V& v) {
    return remat::avg_pool2d(v, remat::AvgPool2dOptions(2).stride(2).padding(1).ceil_mode(true));
  }));
}

/// ceil_mode's output sizes by PyTorch's rule, worked by hand: ⌈(H + 2p − d(k − 1) − 1) / s⌉ + 1, less one when the
/// last window would start at or past H + p. Each row changes the size from ceil_mode false, or keeps it by the rule.
TEST(Pooling, CeilModeSizesFollowPyTorchsRule) {
  Tape<double> tape;
  auto rows = [&](remat::Index h, int k, int s, int p, int d) {
    const V x = tape.constant(Shape{1, 1, h, 1}, std::vector<double>(static_cast<std::size_t>(h), 1.0).data());
    return remat::max_pool2d(
               x, remat::MaxPool2dOptions({k, 1}).stride({s, 1}).padding({p, 0}).dilation({d, 1}).ceil_mode(true))
        .shape()[2];
  };
  EXPECT_EQ(rows(6, 3, 2, 0, 1), 3);  // (6 − 3) / 2 = 1.5 → 2, + 1; without ceil_mode 2
  EXPECT_EQ(rows(5, 2, 2, 1, 1), 3);  // (5 + 2 − 2) / 2 = 2.5 → 3, + 1 = 4; window 4 would start at 6 = 5 + 1: 3
  EXPECT_EQ(rows(4, 3, 2, 1, 1), 3);  // (4 + 2 − 3) / 2 = 1.5 → 2, + 1 = 3; window 3 starts at 4 < 5: kept
  EXPECT_EQ(rows(7, 2, 3, 0, 2), 3);  // extent 3: (7 − 3) / 3 = 1.33 → 2, + 1; without ceil_mode 2
  EXPECT_EQ(rows(6, 2, 2, 0, 1), 3);  // exact division: the same as without ceil_mode
  // avg_pool2d: the last window of 5 with k 2, s 2 holds one row; its divisor is that one row (the padded input
  // ends at row 5), so y = x there.
  std::vector<double> v{1, 2, 3, 4, 5};
  const V x = tape.constant(Shape{1, 1, 5, 1}, v.data());
  const V y = remat::avg_pool2d(x, remat::AvgPool2dOptions({2, 1}).stride({2, 1}).ceil_mode(true));
  ASSERT_EQ(y.shape(), (Shape{1, 1, 3, 1}));
  EXPECT_EQ(y.value()(0, 0), 1.5);
  EXPECT_EQ(y.value()(2, 0), 5.0);
}

TEST(Pooling, MaxPoolRoutesTiesToTheFirstMaximumAndNaNToTheLast) {
  Tape<double> tape;
  // One 2x2 window per case: [1, 1; 0, 0] ties (the first wins), [NaN, 2; NaN, 0] (the last NaN wins).
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<double> values{1, 1, 0, 0, nan, 2, nan, 0};
  V x = tape.variable(Shape{2, 1, 2, 2}, values.data());
  V y = remat::max_pool2d(x, remat::MaxPool2dOptions(2));
  tape.backward(remat::sum(y * tape.constant(Shape{2, 1, 1, 1}, std::vector<double>{3, 5}.data())));
  const auto g = x.grad();
  EXPECT_EQ(std::vector<double>(g.data(), g.data() + 8), (std::vector<double>{3, 0, 0, 0, 0, 0, 5, 0}));
  EXPECT_TRUE(std::isnan(y.value()(1, 0)));
}

/// max_pool2d keeps each window's argmax, not its input: with x·2 (whose backward reads nothing) before it, what
/// stays for the backward is the argmax alone, one byte an output ([2,3,4,4]: 96 B, in whole doubles 96 B), where
/// the input would be 2·3·8·8·8 = 3072 B; a window of 256 positions takes two bytes an output, one of 65536 four.
/// The gradients route as the input says (the gradcheck and the PyTorch cases check the values).
TEST(Pooling, MaxPoolKeepsItsArgmaxInSmallIntegersNotItsInput) {
  struct Case {
    Shape x;
    remat::MaxPool2dOptions options;
    std::size_t saved;
  };
  const Case cases[] = {{Shape{2, 3, 8, 8}, remat::MaxPool2dOptions(2), 2 * 3 * 4 * 4},
                        {Shape{1, 2, 16, 16}, remat::MaxPool2dOptions(16), 8},      // 2 outputs · 2 B, a whole double
                        {Shape{1, 1, 256, 256}, remat::MaxPool2dOptions(256), 8}};  // 1 output · 4 B
  for (const Case& c : cases) {
    SCOPED_TRACE(remat::to_string(c.x));
    Tape<double> tape;
    const V x = tape.variable(c.x, remat_test::nd_values(c.x, 3).data());
    const V y = remat::max_pool2d(x * 2.0, c.options);
    const V loss = remat::sum(y * y);
    EXPECT_EQ(tape.memory().saved_bytes, c.saved + y.shape().numel() * sizeof(double))  // and y, for y·y
        << remat::to_string(y.shape());
    tape.backward(loss);
    // dx = 2 · 2y at each window's maximum, 0 elsewhere: its sum is 4·sum(y) (the positions: the gradcheck).
    const auto g = x.grad();
    double routed = 0, expected = 0;
    for (remat::Index i = 0; i < g.size(); ++i) routed += g.data()[i];
    for (remat::Index i = 0; i < y.shape().numel(); ++i) expected += 4 * y.value().data()[i];
    EXPECT_NEAR(routed, expected, 1e-9 * std::abs(expected));
  }
}

TEST(Pooling, BadOptionsAndShapesThrowNamingTheOp) {
  Tape<double> tape;
  const V x = tape.variable(Shape{1, 1, 4, 4}, remat_test::nd_values(Shape{1, 1, 4, 4}, 1).data());
  remat_test::expect_error_naming<remat::domain_error>(
      [&] { remat::max_pool2d(x, remat::MaxPool2dOptions(2).padding(2)); }, {"max_pool2d", "more than half"});
  remat_test::expect_error_naming<remat::domain_error>([&] { remat::avg_pool2d(x, remat::AvgPool2dOptions(0)); },
                                                       {"avg_pool2d", "kernel_size is 0"});
  remat_test::expect_error_naming<remat::shape_error>([&] { remat::max_pool2d(x, remat::MaxPool2dOptions(5)); },
                                                      {"max_pool2d", "smaller than the window"});
  remat_test::expect_error_naming<remat::shape_error>(
      [&] {
        remat::avg_pool2d(remat::reshape(x, {4, 4}), remat::AvgPool2dOptions(2));
      },
      {"avg_pool2d", "[N,C,H,W]"});
  remat_test::expect_error_naming<remat::domain_error>(
      [&] {
        remat::adaptive_avg_pool2d(x, {0, 2});
      },
      {"adaptive_avg_pool2d", "at least 1"});
}

TEST(Pooling, AMaxPoolWindowWhollyInThePaddingGivesMinusInfinityAndNoGradient) {
  // Dilation 3 over a 2x2 input padded by 1: the one window's taps are at -1 and 2 in both dims (PyTorch: -inf).
  Tape<double> tape;
  const std::vector<double> values{0, 1, 2, 3};
  V x = tape.variable(Shape{1, 1, 2, 2}, values.data());
  V y = remat::max_pool2d(x, remat::MaxPool2dOptions(2).stride(1).padding(1).dilation(3));
  ASSERT_EQ(y.shape(), (Shape{1, 1, 1, 1}));
  EXPECT_EQ(y.value()(0, 0), -std::numeric_limits<double>::infinity());
  tape.backward(remat::sum(y * tape.constant(Shape{1, 1, 1, 1}, std::vector<double>{2}.data())));
  EXPECT_EQ(std::vector<double>(x.grad().data(), x.grad().data() + 4), (std::vector<double>{0, 0, 0, 0}));
}

TEST(Pooling, OptionsNearTheInt32LimitAreComputedWithoutOverflow) {
  Tape<double> tape;
  const V x = tape.variable(Shape{1, 1, 4, 4}, remat_test::nd_values(Shape{1, 1, 4, 4}, 2).data());
  // 2 · padding and dilation · (kernel − 1) overflow int32: the checks must still see them.
  remat_test::expect_error_naming<remat::domain_error>(
      [&] { remat::max_pool2d(x, remat::MaxPool2dOptions(1).padding(INT_MAX)); }, {"max_pool2d", "more than half"});
  remat_test::expect_error_naming<remat::shape_error>(
      [&] {
        remat::max_pool2d(x, remat::MaxPool2dOptions({65537, 1}).stride(1).dilation({65536, 1}));
      },
      {"max_pool2d", "smaller than the window"});
  // PyTorch: a valid [1,1,2,2] of zeros (both windows lie in the padding).
  const V one = tape.variable(Shape{1, 1, 1, 1}, std::vector<double>{5}.data());
  const V y = remat::conv2d(one, one, Conv2dOptions().stride(INT_MAX).padding(1 << 30));
  EXPECT_EQ(y.shape(), (Shape{1, 1, 2, 2}));
  EXPECT_EQ(Matrix(y.value()), Matrix::Zero(2, 2));
  remat_test::expect_error_naming<remat::shape_error>([&] { remat::conv2d(x, one, Conv2dOptions().padding(INT_MAX)); },
                                                      {"conv2d", "2^48 bytes"});
}

}  // namespace conv2d_test
