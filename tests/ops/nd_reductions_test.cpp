// The N-D reductions over dims (sum, mean, max), softmax and log_softmax over any dim, maximum, minimum, where,
// clamp, leaky_relu, silu and layer_norm over trailing dims: gradchecks in double on rank-1, rank-3 and rank-4
// inputs, the tie rules of max and maximum (the gradient shared equally, as PyTorch), the bitwise agreement of
// the dim forms with the older ones, the same bits at every thread count, and the errors, which name the op.
// (Their values against PyTorch are in nd_reference_test.cpp.)
#include <gtest/gtest.h>

#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "gradcheck.hpp"
#include "nd_gradcheck.hpp"
#include "random.hpp"
#include "remat/remat.hpp"

namespace nd_reductions_test {

using remat::Shape;
using remat::Tape;
using V = remat::Var<double>;
using Inputs = std::vector<V>;
using remat_test::weighted_sum;

const std::vector<Shape>& ranks = remat_test::nd_ranks;

/// Dims lists for a rank: each single dim (and its negative form), pairs, and the empty list (every dim).
std::vector<std::vector<int>> dims_lists(int rank) {
  std::vector<std::vector<int>> lists{{}};
  for (int d = 0; d < rank; ++d) lists.push_back({d});
  lists.push_back({-1});
  if (rank >= 3) {
    lists.push_back({0, 2});
    lists.push_back({-3, -1});
    lists.push_back({1, 0});
  }
  if (rank >= 4) lists.push_back({0, 1, 3});
  return lists;
}

std::string describe(const Shape& s, const std::vector<int>& dims, bool keepdim) {
  std::string text = remat::to_string(s) + " dims {";
  for (int d : dims) text += std::to_string(d) + " ";
  return text + "} keepdim " + std::to_string(keepdim);
}

TEST(NdReductions, SumMeanMaxOverDimsGradcheckOnRanks1To4) {
  using Reduce = V (*)(const V&, remat::ArrayRef<int>, bool);
  const std::pair<const char*, Reduce> ops[] = {
      {"sum", remat::sum<double>}, {"mean", remat::mean<double>}, {"max", remat::max<double>}};
  for (const auto& [name, f] : ops)
    for (const Shape& s : ranks)
      for (const auto& dims : dims_lists(s.rank()))
        for (bool keepdim : {false, true}) {
          SCOPED_TRACE(std::string(name) + " " + describe(s, dims, keepdim));
          EXPECT_TRUE(remat_test::nd_check(
              [&, f = f](Tape<double>& t, const Inputs& x) { return weighted_sum(t, f(x[0], dims, keepdim)); }, {s}));
        }
}

TEST(NdReductions, OutputShapesFollowDimsAndKeepdim) {
  Tape<double> tape;
  const remat::Matrix<double> v = remat_test::nd_values(Shape{2, 3, 1, 4}, 1);
  const V x = tape.variable(Shape{2, 3, 1, 4}, v.data());
  EXPECT_EQ(remat::sum(x, {}).shape(), Shape::scalar());
  EXPECT_EQ(remat::mean(x, {}, true).shape(), (Shape{1, 1, 1, 1}));
  EXPECT_EQ(remat::max(x, {1, 3}).shape(), (Shape{2, 1}));
  EXPECT_EQ(remat::max(x, {-3, -1}, true).shape(), (Shape{2, 1, 1, 1}));
  EXPECT_EQ(remat::sum(x, {-2}).shape(), (Shape{2, 3, 4}));
  // Every dim listed is the empty list's result; the old sum(x) and mean(x) stay [1,1].
  EXPECT_EQ(remat::sum(x, {0, 1, 2, 3}).shape(), Shape::scalar());
  EXPECT_EQ(remat::sum(x).shape(), (Shape{1, 1}));
  EXPECT_EQ(remat::mean(x).shape(), (Shape{1, 1}));
  EXPECT_DOUBLE_EQ(remat::sum(x, {}).item(), remat::sum(x).item());
  EXPECT_DOUBLE_EQ(remat::mean(x, {}).item(), remat::mean(x).item());
}

/// x's gradient of sum(y ⊙ g) for g = 1, 2, 3, ... over y.
std::vector<double> grad_of(const std::vector<double>& data, const Shape& s, V (*build)(const V&)) {
  Tape<double> tape;
  const V x = tape.variable(s, data.data());
  const V y = build(x);
  std::vector<double> g(static_cast<std::size_t>(y.shape().numel()));
  for (std::size_t i = 0; i < g.size(); ++i) g[i] = static_cast<double>(i + 1);
  tape.backward(remat::sum(y * tape.constant(y.shape(), g.data())));
  const auto d = x.grad();
  return {d.data(), d.data() + d.size()};
}

TEST(NdReductions, MaxSharesTheGradientEquallyAmongTiedMaxima) {
  // Rows of [2,2,3]: {1,3,3} (two maxima), {2,2,2} (three), {0,5,-1} (one), {4,4,4} again.
  const std::vector<double> x{1, 3, 3, 2, 2, 2, 0, 5, -1, 4, 4, 4};
  const Shape s{2, 2, 3};
  const auto last = grad_of(x, s, [](const V& v) { return remat::max(v, {-1}); });
  const std::vector<double> want{0, 0.5, 0.5, 2.0 / 3, 2.0 / 3, 2.0 / 3, 0, 3, 0, 4.0 / 3, 4.0 / 3, 4.0 / 3};
  ASSERT_EQ(last.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) EXPECT_DOUBLE_EQ(last[i], want[i]) << "element " << i;
  // Over everything: the maximum 5 is unique.
  const auto all = grad_of(x, s, [](const V& v) { return remat::max(v, {}); });
  for (std::size_t i = 0; i < all.size(); ++i) EXPECT_EQ(all[i], i == 7 ? 1.0 : 0.0) << "element " << i;
  // Over dims 0 and 2 (each output reads 6 elements): output 0 reads {1,3,3,0,5,-1} (max 5), output 1 reads
  // {2,2,2,4,4,4} (three 4s share g = 2).
  const auto outer = grad_of(x, s, [](const V& v) { return remat::max(v, {0, 2}, true); });
  const std::vector<double> want_outer{0, 0, 0, 0, 0, 0, 0, 1, 0, 2.0 / 3, 2.0 / 3, 2.0 / 3};
  for (std::size_t i = 0; i < want_outer.size(); ++i) EXPECT_DOUBLE_EQ(outer[i], want_outer[i]) << "element " << i;
}

TEST(NdReductions, MaximumAndMinimumSplitTheGradientAtTies) {
  Tape<double> tape;
  const std::vector<double> a{1, 2, 3, 4, 5, 6}, b{1, 0, 3};  // a [2,3], b [3]: ties at a = 1 and a = 3
  const V va = tape.variable(Shape{2, 3}, a.data()), vb = tape.variable(Shape{3}, b.data());
  const V y = remat::maximum(va, vb) + remat::minimum(va, vb) * remat::minimum(va, vb);
  tape.backward(remat::sum(y));
  // d/da of max(a,b) + min(a,b)²: at a tie, ½ + ½·2·min.
  const std::vector<double> da_want{0.5 + 1, 1, 0.5 + 3, 1, 1, 1};
  const std::vector<double> db_want{(0.5 + 1) + 2 * 1, 0 + 2 * 0, (0.5 + 3) + 2 * 3};
  const auto da = va.grad(), db = vb.grad();
  for (int i = 0; i < 6; ++i) EXPECT_DOUBLE_EQ(da.data()[i], da_want[static_cast<std::size_t>(i)]) << "da " << i;
  for (int i = 0; i < 3; ++i) EXPECT_DOUBLE_EQ(db.data()[i], db_want[static_cast<std::size_t>(i)]) << "db " << i;
}

TEST(NdReductions, MaximumMinimumGradcheckBroadcastingInEachDirection) {
  const std::vector<std::pair<Shape, Shape>> pairs{
      {Shape{5}, Shape{5}},           {Shape{2, 3, 4}, Shape{2, 3, 4}}, {Shape{2, 3, 4}, Shape{4}},
      {Shape{4}, Shape{2, 3, 4}},     {Shape{2, 1, 4}, Shape{3, 1}},    {Shape{1, 3, 1, 2}, Shape{2, 1, 4, 1}},
      {Shape{2, 3}, Shape::scalar()}, {Shape{3, 1}, Shape{1, 4}}};
  for (const auto& [a, b] : pairs) {
    SCOPED_TRACE(remat::to_string(a) + " with " + remat::to_string(b));
    EXPECT_TRUE(remat_test::nd_check(
        [](Tape<double>& t, const Inputs& x) { return weighted_sum(t, remat::maximum(x[0], x[1])); }, {a, b}));
    EXPECT_TRUE(remat_test::nd_check(
        [](Tape<double>& t, const Inputs& x) { return weighted_sum(t, remat::minimum(x[0], x[1])); }, {a, b}));
  }
  // Ties by construction (x against itself): the central difference of max(x, x) is 1 = ½ + ½.
  EXPECT_TRUE(
      remat_test::nd_check([](Tape<double>& t, const Inputs& x) { return weighted_sum(t, remat::maximum(x[0], x[0])); },
                           {Shape{2, 1, 3, 2}}));
}

TEST(NdReductions, SoftmaxAndLogSoftmaxOverEveryDimGradcheck) {
  for (const Shape& s : ranks)
    for (int dim = -s.rank(); dim < s.rank(); ++dim) {
      SCOPED_TRACE(remat::to_string(s) + " dim " + std::to_string(dim));
      EXPECT_TRUE(remat_test::nd_check(
          [dim](Tape<double>& t, const Inputs& x) { return weighted_sum(t, remat::softmax(x[0], dim)); }, {s}, -2, 2));
      EXPECT_TRUE(remat_test::nd_check(
          [dim](Tape<double>& t, const Inputs& x) { return weighted_sum(t, remat::log_softmax(x[0], dim)); }, {s}, -2,
          2));
    }
}

bool same_bits(const Eigen::Ref<const remat::Matrix<double>>& a, const Eigen::Ref<const remat::Matrix<double>>& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), sizeof(double) * static_cast<std::size_t>(a.size())) == 0;
}

TEST(NdReductions, SoftmaxOverTheLastDimIsTheOneArgumentFormBitwise) {
  for (const Shape& s : {Shape{7}, Shape{3, 4, 5}, Shape{2, 3, 1, 300}}) {
    SCOPED_TRACE(remat::to_string(s));
    for (bool log : {false, true}) {
      const remat::Matrix<double> v = remat_test::nd_values(s, 5, -3, 3);
      remat::Matrix<double> value[2], grad[2];
      for (int form = 0; form < 2; ++form) {
        Tape<double> tape;
        const V x = tape.variable(s, v.data());
        const int dim = form == 0 ? -1 : s.rank() - 1;
        const V y = log ? (form ? remat::log_softmax(x, dim) : remat::log_softmax(x))
                        : (form ? remat::softmax(x, dim) : remat::softmax(x));
        value[form] = y.value();
        tape.backward(weighted_sum(tape, y));
        grad[form] = x.grad();
      }
      EXPECT_TRUE(same_bits(value[0], value[1]));
      EXPECT_TRUE(same_bits(grad[0], grad[1]));
    }
  }
}

TEST(NdReductions, WhereGradcheckWithABroadcastCondition) {
  struct Case {
    Shape cond, a, b;
  };
  const Case cases[] = {{Shape{2, 1, 4}, Shape{2, 3, 4}, Shape{4}},
                        {Shape{5}, Shape{5}, Shape{5}},
                        {Shape{4}, Shape{2, 3, 1}, Shape::scalar()},
                        {Shape{3, 1, 1, 2}, Shape{4, 1, 1}, Shape{2, 1}}};
  for (const Case& c : cases) {
    SCOPED_TRACE(remat::to_string(c.cond) + " " + remat::to_string(c.a) + " " + remat::to_string(c.b));
    std::vector<double> cond(static_cast<std::size_t>(c.cond.numel()));
    for (std::size_t i = 0; i < cond.size(); ++i) cond[i] = i % 3 == 1 ? 0.0 : (i % 2 ? -2.5 : 1.0);
    EXPECT_TRUE(remat_test::nd_check(
        [&](Tape<double>& t, const Inputs& x) {
          return weighted_sum(t, remat::where(t.constant(c.cond, cond.data()), x[0], x[1]));
        },
        {c.a, c.b}));
  }
  // A variable condition receives a zero gradient.
  Tape<double> tape;
  const std::vector<double> cond{1, 0, 2}, a{1, 2, 3}, b{4, 5, 6};
  const V vc = tape.variable(Shape{3}, cond.data());
  const V va = tape.variable(Shape{3}, a.data()), vb = tape.variable(Shape{3}, b.data());
  const V y = remat::where(vc, va, vb);
  EXPECT_EQ(y.value()(0, 0), 1);
  EXPECT_EQ(y.value()(0, 1), 5);
  EXPECT_EQ(y.value()(0, 2), 3);
  tape.backward(remat::sum(y));
  EXPECT_TRUE(vc.grad().isZero(0));
  EXPECT_EQ(va.grad()(0, 1), 0);
  EXPECT_EQ(vb.grad()(0, 1), 1);
}

TEST(NdReductions, ClampLeakyReluSiluGradcheckOnRanks1To4) {
  for (const Shape& s : ranks) {
    SCOPED_TRACE(remat::to_string(s));
    const std::pair<std::optional<double>, std::optional<double>> bounds[] = {
        {-0.3, 0.4}, {-0.3, std::nullopt}, {std::nullopt, 0.4}};
    for (const auto& [lo, hi] : bounds)
      EXPECT_TRUE(remat_test::nd_check(
          [lo = lo, hi = hi](Tape<double>& t, const Inputs& x) { return weighted_sum(t, remat::clamp(x[0], lo, hi)); },
          {s}));
    for (double slope : {0.01, 0.2, -0.5})
      EXPECT_TRUE(remat_test::nd_check(
          [slope](Tape<double>& t, const Inputs& x) { return weighted_sum(t, remat::leaky_relu(x[0], slope)); }, {s}));
    EXPECT_TRUE(remat_test::nd_check(
        [](Tape<double>& t, const Inputs& x) { return weighted_sum(t, remat::silu(x[0])); }, {s}, -4, 4));
  }
}

TEST(NdReductions, ClampAndLeakyReluGradientsAtTheKinksAreThoseOfPyTorch) {
  Tape<double> tape;
  const std::vector<double> v{-0.3, 0.4, 0.0, -1, 1};
  const V x = tape.variable(Shape{5}, v.data());
  tape.backward(remat::sum(remat::clamp(x, -0.3, 0.4)) + remat::sum(remat::leaky_relu(x, 0.2)));
  // clamp: 1 at the bounds (inclusive) and inside; leaky_relu: the slope at 0.
  const std::vector<double> want{1 + 0.2, 1 + 1, 1 + 0.2, 0 + 0.2, 0 + 1};
  for (int i = 0; i < 5; ++i) EXPECT_DOUBLE_EQ(x.grad().data()[i], want[static_cast<std::size_t>(i)]) << i;
}

TEST(NdReductions, LayerNormOverTrailingDimsGradcheck) {
  const std::pair<Shape, Shape> cases[] = {{Shape{5}, Shape{5}},
                                           {Shape{2, 3, 4}, Shape{4}},
                                           {Shape{2, 3, 4}, Shape{3, 4}},
                                           {Shape{2, 3, 4}, Shape{2, 3, 4}},
                                           {Shape{2, 1, 3, 2}, Shape{1, 3, 2}}};
  for (const auto& [x, ns] : cases) {
    SCOPED_TRACE(remat::to_string(x) + " over " + remat::to_string(ns));
    EXPECT_TRUE(remat_test::nd_check(
        [ns = ns](Tape<double>& t, const Inputs& v) {
          return weighted_sum(t, remat::layer_norm(v[0], ns, v[1], v[2], 1e-5));
        },
        {x, ns, ns}));
  }
}

TEST(NdReductions, LayerNormOverTheLastDimIsTheGainBiasFormBitwise) {
  const Shape s{3, 4, 40};
  const remat::Matrix<double> v = remat_test::nd_values(s, 3), w = remat_test::nd_values(Shape{40}, 4, 0.5, 1.5),
                              b = remat_test::nd_values(Shape{40}, 5);
  remat::Matrix<double> out[2], grads[2][3];
  for (int form = 0; form < 2; ++form) {
    Tape<double> tape;
    const V x = tape.variable(s, v.data()), g = tape.variable(Shape{40}, w.data()),
            bias = tape.variable(Shape{40}, b.data());
    const V y = form ? remat::layer_norm(x, Shape{40}, g, bias) : remat::layer_norm(x, g, bias);
    out[form] = y.value();
    tape.backward(weighted_sum(tape, y));
    grads[form][0] = x.grad();
    grads[form][1] = g.grad();
    grads[form][2] = bias.grad();
  }
  EXPECT_TRUE(same_bits(out[0], out[1]));
  for (int k = 0; k < 3; ++k) EXPECT_TRUE(same_bits(grads[0][k], grads[1][k])) << "input " << k;
}

/// Values and gradient of build(x) on a large x, at `threads` threads.
std::pair<remat::Matrix<double>, remat::Matrix<double>> run_at(int threads, const Shape& s, V (*build)(const V&)) {
  remat::set_num_threads(threads);
  const remat::Matrix<double> v = remat_test::nd_values(s, 8, -3, 3);
  Tape<double> tape;
  const V x = tape.variable(s, v.data());
  const V y = build(x);
  remat::Matrix<double> value = y.value();
  tape.backward(weighted_sum(tape, y));
  return {value, x.grad()};
}

TEST(NdReductions, TheSameBitsAtEveryThreadCount) {
  const int saved = remat::num_threads();
  using Build = V (*)(const V&);
  const std::pair<const char*, Build> builds[] = {
      {"sum {0,2}",
       [](const V& x) {
         return remat::sum(x, {0, 2});
       }},
      {"sum {}", [](const V& x) { return remat::sum(x, {}); }},
      {"mean {1}", [](const V& x) { return remat::mean(x, {1}, true); }},
      {"max {0}", [](const V& x) { return remat::max(x, {0}); }},
      {"max {2}", [](const V& x) { return remat::max(x, {-1}); }},
      {"softmax 0", [](const V& x) { return remat::softmax(x, 0); }},
      {"log_softmax 1", [](const V& x) { return remat::log_softmax(x, 1); }},
      {"elementwise", [](const V& x) { return remat::silu(remat::clamp(remat::leaky_relu(x, 0.1), -2.0, 2.5)); }}};
  const Shape s{24, 70, 40};  // 67200 elements: above the grain, many blocks
  for (const auto& [name, build] : builds) {
    SCOPED_TRACE(name);
    const auto one = run_at(1, s, build);
    const auto two = run_at(2, s, build);
    const auto three = run_at(3, s, build);
    EXPECT_TRUE(same_bits(one.first, two.first));
    EXPECT_TRUE(same_bits(one.second, two.second));
    EXPECT_TRUE(same_bits(one.first, three.first));
    EXPECT_TRUE(same_bits(one.second, three.second));
  }
  remat::set_num_threads(saved);
}

TEST(NdReductions, BadDimsThrowIndexErrorNamingTheOp) {
  Tape<double> tape;
  const remat::Matrix<double> v = remat_test::nd_values(Shape{2, 3, 4}, 1);
  const V x = tape.variable(Shape{2, 3, 4}, v.data());
  using remat::index_error;
  using remat_test::expect_error_naming;
  expect_error_naming<index_error>([&] { remat::sum(x, {3}); }, {"sum", "dim 3", "rank-3"});
  expect_error_naming<index_error>([&] { remat::sum(x, {-4}); }, {"sum", "dim -4"});
  expect_error_naming<index_error>([&] { remat::sum(x, {1, -2}); }, {"sum", "dim -2", "more than once"});
  expect_error_naming<index_error>([&] { remat::mean(x, {0, 5}, true); }, {"mean", "dim 5"});
  expect_error_naming<index_error>([&] { remat::mean(x, {2, 2}); }, {"mean", "dim 2", "more than once"});
  expect_error_naming<index_error>([&] { remat::max(x, {-7}); }, {"max", "dim -7"});
  expect_error_naming<index_error>([&] { remat::max(x, {0, 0}); }, {"max", "more than once"});
  expect_error_naming<index_error>([&] { remat::softmax(x, 3); }, {"softmax", "dim 3"});
  expect_error_naming<index_error>([&] { remat::log_softmax(x, -4); }, {"log_softmax", "dim -4"});
  EXPECT_EQ(tape.size(), 1u) << "a refused op records nothing";
}

TEST(NdReductions, BadShapesThrowShapeErrorNamingTheOp) {
  Tape<double> tape;
  const remat::Matrix<double> v = remat_test::nd_values(Shape{2, 3, 4}, 1);
  const V x = tape.variable(Shape{2, 3, 4}, v.data());
  const V y = tape.variable(Shape{3, 3}, v.data());
  const V w = tape.variable(Shape{3, 4}, v.data());
  const V w4 = tape.variable(Shape{4}, v.data());
  using remat::shape_error;
  using remat_test::expect_error_naming;
  expect_error_naming<shape_error>([&] { remat::maximum(x, y); }, {"maximum", "[2,3,4]", "[3,3]"});
  expect_error_naming<shape_error>([&] { remat::minimum(y, x); }, {"minimum", "[3,3]", "[2,3,4]"});
  expect_error_naming<shape_error>([&] { remat::where(y, x, x); }, {"where", "[3,3]", "[2,3,4]"});
  expect_error_naming<shape_error>([&] { remat::where(x, x, y); }, {"where", "[2,3,4]", "[3,3]"});
  expect_error_naming<shape_error>(
      [&] {
        remat::layer_norm(x, Shape{4, 4}, w, w);
      },
      {"layer_norm", "[4,4]", "[2,3,4]"});
  expect_error_naming<shape_error>([&] { remat::layer_norm(x, Shape{3, 4}, w4, w); }, {"layer_norm", "weight", "[4]"});
  expect_error_naming<shape_error>([&] { remat::layer_norm(x, Shape{3, 4}, w, w4); }, {"layer_norm", "bias", "[4]"});
  expect_error_naming<remat::domain_error>([&] { remat::clamp(x, std::nullopt, std::nullopt); }, {"clamp"});
}

}  // namespace nd_reductions_test
