// Every op that takes N-D values, gradchecked in double on rank-1, rank-3 and rank-4 inputs, with broadcasting in
// each direction and size-1 dimensions (the values against PyTorch are in nd_reference_test.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "gradcheck.hpp"
#include "nd_gradcheck.hpp"
#include "random.hpp"
#include "remat/remat.hpp"

namespace nd_gradcheck_test {

using remat::Shape;
using remat::Tape;
using V = remat::Var<double>;
using Inputs = std::vector<V>;
using remat_test::weighted_sum;

/// Random values of `shape` as the matrix gradcheck perturbs (one row), in [low, high].
const std::vector<Shape>& ranks = remat_test::nd_ranks;

TEST(NdGradcheck, UnaryOpsOnRanks1To4) {
  struct Unary {
    const char* name;
    V (*f)(const V&);
    double low, high;
  };
  const Unary ops[] = {{"neg", remat::neg<double>, -1, 1},          {"exp", remat::exp<double>, -1, 1},
                       {"log", remat::log<double>, 0.5, 2},         {"sqrt", remat::sqrt<double>, 0.5, 2},
                       {"square", remat::square<double>, -1, 1},    {"sin", remat::sin<double>, -1, 1},
                       {"cos", remat::cos<double>, -1, 1},          {"tanh", remat::tanh<double>, -1, 1},
                       {"sigmoid", remat::sigmoid<double>, -1, 1},  {"gelu", remat::gelu<double>, -1, 1},
                       {"softplus", remat::softplus<double>, -1, 1}};
  for (const Unary& op : ops)
    for (const Shape& s : ranks) {
      SCOPED_TRACE(std::string(op.name) + " " + remat::to_string(s));
      EXPECT_TRUE(remat_test::nd_check([&](Tape<double>& t, const Inputs& x) { return weighted_sum(t, op.f(x[0])); },
                                       {s}, op.low, op.high));
    }
}

TEST(NdGradcheck, BinaryOpsBroadcastInEachDirection) {
  const std::vector<std::pair<Shape, Shape>> pairs{{Shape{2, 3, 4}, Shape{2, 3, 4}},
                                                   {Shape{2, 3, 4}, Shape{4}},
                                                   {Shape{4}, Shape{2, 3, 4}},
                                                   {Shape{2, 1, 4}, Shape{3, 1}},
                                                   {Shape{1, 3, 1, 2}, Shape{2, 1, 4, 1}},
                                                   {Shape{2, 3}, Shape::scalar()},
                                                   {Shape{3, 1}, Shape{1, 4}},
                                                   {Shape{2, 3, 1}, Shape{2, 1, 4}}};
  for (const auto& [a, b] : pairs) {
    SCOPED_TRACE(remat::to_string(a) + " with " + remat::to_string(b));
    EXPECT_TRUE(
        remat_test::nd_check([](Tape<double>& t, const Inputs& x) { return weighted_sum(t, x[0] + x[1]); }, {a, b}));
    EXPECT_TRUE(
        remat_test::nd_check([](Tape<double>& t, const Inputs& x) { return weighted_sum(t, x[0] - x[1]); }, {a, b}));
    EXPECT_TRUE(
        remat_test::nd_check([](Tape<double>& t, const Inputs& x) { return weighted_sum(t, x[0] * x[1]); }, {a, b}));
    EXPECT_TRUE(remat_test::nd_check([](Tape<double>& t, const Inputs& x) { return weighted_sum(t, x[0] / x[1]); },
                                     {a, b}, 0.5, 2));
  }
}

TEST(NdGradcheck, LinearTakesLeadingBatchDimensions) {
  for (const Shape& x : {Shape{4}, Shape{2, 3, 4}, Shape{2, 1, 3, 4}})
    for (const Shape& b : {Shape{5}, Shape{1, 5}}) {
      SCOPED_TRACE(remat::to_string(x) + " bias " + remat::to_string(b));
      EXPECT_TRUE(remat_test::nd_check(
          [](Tape<double>& t, const Inputs& v) { return weighted_sum(t, remat::linear(v[0], v[1], v[2])); },
          {x, Shape{4, 5}, b}));
    }
}

// matmul beyond two matrices records detail::GeneralMatmulOp (include/remat/ops/batched_matmul.hpp).
TEST(NdGradcheck, MatmulWithTorchMatmulsRules) {
  const std::vector<std::pair<Shape, Shape>> pairs{{Shape{4}, Shape{4}},
                                                   {Shape{3, 4}, Shape{4}},
                                                   {Shape{4}, Shape{4, 5}},
                                                   {Shape{2, 3, 4}, Shape{4, 5}},
                                                   {Shape{3, 4}, Shape{2, 4, 5}},
                                                   {Shape{2, 3, 4}, Shape{2, 4, 5}},
                                                   {Shape{2, 1, 3, 4}, Shape{5, 4, 2}},
                                                   {Shape{4}, Shape{2, 4, 5}},
                                                   {Shape{2, 3, 4}, Shape{4}}};
  for (const auto& [a, b] : pairs) {
    SCOPED_TRACE(remat::to_string(a) + " · " + remat::to_string(b));
    EXPECT_TRUE(remat_test::nd_check(
        [](Tape<double>& t, const Inputs& x) { return weighted_sum(t, remat::matmul(x[0], x[1])); }, {a, b}));
  }
  // One Var as both operands: its gradient is assigned by the first and added to by the second.
  EXPECT_TRUE(remat_test::nd_check(
      [](Tape<double>& t, const Inputs& x) { return weighted_sum(t, remat::matmul(x[0], x[0])); }, {Shape{3, 4, 4}}));
}

TEST(NdGradcheck, BatchedMatmulIsBitwiseEqualAtOneAndTwoThreads) {
  auto run = [](int threads) {
    remat::set_num_threads(threads);
    Tape<float> tape;
    const auto a = remat_test::random_matrix<float>(1, 16 * 32 * 16, 5, remat_test::Domain{-1, 1, 0});
    const auto b = remat_test::random_matrix<float>(1, 4 * 16 * 32, 6, remat_test::Domain{-1, 1, 0});
    const auto va = tape.variable(Shape{16, 32, 16}, a.data());
    const auto vb = tape.variable(Shape{4, 1, 16, 32}, b.data());  // broadcast over a's batch: summed gradients
    const auto c = remat::matmul(va, vb);
    EXPECT_EQ(c.shape(), (Shape{4, 16, 32, 32}));
    tape.backward(remat::sum(remat::tanh(c)));
    return std::vector<remat::Matrix<float>>{c.value(), va.grad(), vb.grad()};
  };
  const int before = remat::num_threads();
  const auto one = run(1), two = run(2);
  remat::set_num_threads(before);
  for (std::size_t i = 0; i < one.size(); ++i)
    EXPECT_TRUE(one[i].size() == two[i].size() &&
                std::memcmp(one[i].data(), two[i].data(), sizeof(float) * static_cast<std::size_t>(one[i].size())) == 0)
        << "result " << i;
}

}  // namespace nd_gradcheck_test

namespace nd_gradcheck_test {

// Causal attention written on [B, heads, S, d] tensors from matmul, transpose, softmax and an additive mask
// equals the fused scaled_dot_product_attention in its [B·S, H] layout: values and the gradients of q, k, v.
TEST(NdAttention, CausalAttentionFromNdOpsEqualsTheFusedOp) {
  const remat::Index B = 2, heads = 3, S = 5, d = 4;
  const double inf = std::numeric_limits<double>::infinity();
  remat::Matrix<double> mask(S, S);
  for (remat::Index i = 0; i < S; ++i)
    for (remat::Index j = 0; j < S; ++j) mask(i, j) = j > i ? -inf : 0.0;
  const Shape shape{B, heads, S, d};
  std::vector<remat::Matrix<double>> data;
  for (int k = 0; k < 3; ++k) data.push_back(remat_test::nd_values(shape, 40 + static_cast<std::uint64_t>(k)));
  const remat::Matrix<double> weights = remat_test::nd_values(shape, 50);
  auto run = [&](bool fused) {
    Tape<double> tape;
    std::vector<V> in;
    for (const auto& m : data) in.push_back(tape.variable(shape, m.data()));
    V y;
    if (fused) {
      auto to_rows = [&](const V& x) { return remat::reshape(remat::permute(x, {0, 2, 1, 3}), {B * S, heads * d}); };
      const V out = remat::scaled_dot_product_attention(to_rows(in[0]), to_rows(in[1]), to_rows(in[2]), heads, S, true);
      y = remat::permute(remat::reshape(out, {B, S, heads, d}), {0, 2, 1, 3});
    } else {
      const double scale = 1.0 / std::sqrt(static_cast<double>(d));
      const V scores = remat::matmul(in[0], remat::transpose(in[1], -2, -1)) * tape.constant(Shape::scalar(), &scale) +
                       tape.constant(Shape{S, S}, mask.data());
      y = remat::matmul(remat::softmax(scores, -1), in[2]);
    }
    EXPECT_EQ(y.shape(), shape);
    tape.backward(remat::sum(y * tape.constant(shape, weights.data())));
    std::vector<remat::Matrix<double>> r{y.value()};
    for (const V& v : in) r.emplace_back(v.grad());
    return r;
  };
  const auto composed = run(false), fused = run(true);
  for (std::size_t i = 0; i < composed.size(); ++i) {
    SCOPED_TRACE(i == 0 ? "output" : "gradient of input " + std::to_string(i - 1));
    EXPECT_LE((composed[i] - fused[i]).cwiseAbs().maxCoeff(), 1e-12);
  }
}

}  // namespace nd_gradcheck_test
