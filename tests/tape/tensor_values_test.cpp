// N-D values on the tape: Shape itself, leaves and Parameters from Eigen tensors, values and gradients read back
// as tensors, and the memory figures and checkpoint policies on a rank-4 graph.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "api_checks.hpp"
#include "expect_error.hpp"
#include "remat/remat.hpp"

namespace tensor_values_test {

using remat::Shape;
using remat::Tape;
using remat::Tensor;

TEST(ShapeTest, DimensionsCountsAndTheMatrixView) {
  const Shape s{2, 3, 8, 8};
  EXPECT_EQ(s.rank(), 4);
  EXPECT_EQ(s[2], 8);
  EXPECT_EQ(s.numel(), 384);
  EXPECT_EQ(s.rows(), 48);  // every dimension but the last
  EXPECT_EQ(s.cols(), 8);
  EXPECT_EQ(remat::to_string(s), "[2,3,8,8]");
  EXPECT_EQ(Shape::scalar().rank(), 0);
  EXPECT_EQ(Shape::scalar().numel(), 1);
  EXPECT_EQ(remat::to_string(Shape::scalar()), "[]");
  EXPECT_EQ(Shape{7}.rows(), 1);      // a vector reads as one row
  EXPECT_EQ(Shape{}, (Shape{0, 0}));  // "none" of the op recipe, as before N-D
  EXPECT_EQ(Shape{}.numel(), 0);
  EXPECT_NE((Shape{2, 3}), (Shape{2, 3, 1}));
  remat_test::expect_error_naming<remat::shape_error>([] { Shape{1, 2, 3, 4, 5, 6, 7, 8, 9}; }, {"9 dimensions", "8"});
}

TEST(TensorValues, ALeafFromATensorKeepsItsShapeAndValues) {
  Tensor<double, 4> x(2, 3, 4, 5);
  for (Eigen::Index i = 0; i < x.size(); ++i) x.data()[i] = 0.5 * static_cast<double>(i) - 3;
  Tape<double> tape;
  const auto v = tape.variable(x);
  EXPECT_EQ(v.shape(), (Shape{2, 3, 4, 5}));
  EXPECT_EQ(v.dim(), 4);
  EXPECT_EQ(v.size(1), 3);
  EXPECT_EQ(v.size(-1), 5);
  EXPECT_EQ(v.rows(), 24);
  const auto t = v.value<4>();
  EXPECT_EQ(t(1, 2, 3, 4), x(1, 2, 3, 4));
  EXPECT_EQ(t(0, 1, 0, 2), x(0, 1, 0, 2));
  EXPECT_EQ(v.value()(23, 4), x(1, 2, 3, 4));  // the matrix view of the same buffer
  remat_test::expect_error_naming<remat::shape_error>([&] { v.value<3>(); }, {"value<3>", "[2,3,4,5]", "value<4>"});
  remat_test::expect_error_naming<remat::index_error>([&] { v.size(4); }, {"size", "dim 4"});
}

TEST(TensorValues, AScalarTensorIsARankZeroLeaf) {
  Tensor<float, 0> s;
  s() = 2.5f;
  Tape<float> tape;
  const auto v = tape.constant(s);
  EXPECT_EQ(v.shape(), Shape::scalar());
  EXPECT_EQ(v.value<0>()(), 2.5f);
}

TEST(TensorValues, GradientsOfARankFourGraphReadBackAsTensors) {
  Tensor<double, 4> x(2, 1, 3, 2);
  for (Eigen::Index i = 0; i < x.size(); ++i) x.data()[i] = 0.1 * static_cast<double>(i) - 0.5;
  Tape<double> tape;
  const auto v = tape.variable(x);
  tape.backward(remat::sum(remat::tanh(v)));
  const auto g = v.grad<4>();
  for (Eigen::Index i = 0; i < x.size(); ++i) {
    const double th = std::tanh(x.data()[i]);
    EXPECT_DOUBLE_EQ(g.data()[i], 1 - th * th);
  }
  EXPECT_DOUBLE_EQ(g(1, 0, 2, 1), 1 - std::pow(std::tanh(x(1, 0, 2, 1)), 2));
}

TEST(TensorValues, AParameterFromATensorRecordsItsShape) {
  Tensor<float, 4> w(4, 3, 2, 2);
  w.setConstant(0.25f);
  remat::Parameter<float> p(w);
  EXPECT_EQ(p.shape(), (Shape{4, 3, 2, 2}));
  EXPECT_EQ(p.rows(), 24);
  EXPECT_EQ(p.value<4>()(3, 2, 1, 1), 0.25f);
  Tape<float> tape;
  const auto v = tape.variable(p);
  EXPECT_EQ(v.shape(), p.shape());
  tape.backward(remat::sum(remat::square(v)));
  EXPECT_EQ(p.grad<4>()(1, 1, 1, 0), 0.5f);
  p.mutable_value().resize(2, 3);  // another matrix view: the N-D dimensions no longer hold
  EXPECT_EQ(p.shape(), (Shape{2, 3}));
}

TEST(TensorValues, MemoryIsCountedExactlyAndEveryPolicyIsBitwiseEqualOnRankFour) {
  Tensor<float, 4> x(2, 3, 4, 5);
  for (Eigen::Index i = 0; i < x.size(); ++i) x.data()[i] = std::sin(0.3f * static_cast<float>(i));
  const std::size_t bytes = 2 * 3 * 4 * 5 * sizeof(float);
  auto step = [&](const remat_test::AnyPolicy* policy, remat::MemoryStats* after_forward) {
    Tape<float> tape;
    const auto v = tape.variable(x);
    auto f = [](const remat::Var<float>& a) { return remat::tanh(remat::sin(a) * a); };
    const auto y = policy ? remat::checkpoint(f, *policy)(v) : f(v);
    const auto loss = remat::sum(y);
    if (after_forward) *after_forward = tape.memory();
    tape.backward(loss);
    const auto g = v.grad();
    return remat::Matrix<float>(g);
  };
  remat::MemoryStats plain_memory;
  const remat::Matrix<float> plain = step(nullptr, &plain_memory);
  // Kept after the forward pass: x (read by the backwards of sin and multiply), sin(x) (multiply's), y = tanh(·)
  // (tanh's own backward reads its output; the product is read by nothing) and the [1,1] loss.
  EXPECT_EQ(plain_memory.live_bytes, 3 * bytes + sizeof(float));
  for (const auto& [name, policy] : remat_test::every_policy()) {
    SCOPED_TRACE(name);
    remat::MemoryStats m;
    EXPECT_TRUE(remat_test::same_bits(step(&policy, &m), plain));
  }
}

TEST(TensorValues, OpsDefinedOnMatricesRefuseOtherRanksByName) {
  Tape<float> tape;
  Tensor<float, 3> x(2, 3, 4);
  x.setConstant(1);
  const auto v = tape.variable(x);
  const std::size_t nodes = tape.size();
  remat_test::expect_error_naming<remat::shape_error>([&] { remat::transpose(v); }, {"transpose", "[2,3,4]", "rank-2"});
  remat_test::expect_error_naming<remat::shape_error>([&] { remat::sum_rows(v); }, {"sum_rows", "[2,3,4]"});
  remat_test::expect_error_naming<remat::shape_error>(
      [&] {
        remat::cross_entropy(v, {0, 1});
      },
      {"cross_entropy", "[2,3,4]"});
  EXPECT_EQ(tape.size(), nodes);
}

TEST(TensorValues, EstimateAndCapturedStepOnARankThreeStep) {
  remat::Parameter<float> w(remat::Matrix<float>::Constant(4, 6, 0.1f));
  Tensor<float, 3> x(2, 3, 4);
  x.setConstant(0.5f);
  auto step = [&](Tape<float>& tape) {
    const auto h =
        remat::checkpoint([&](const remat::Var<float>& v) { return remat::tanh(remat::matmul(v, tape.variable(w))); },
                          remat::policies::dots_saveable)(tape.constant(x));
    return remat::mean(h);
  };
  const remat::MemoryEstimate estimate = remat::estimate_memory<float>(step);
  Tape<float> tape;
  const auto loss = step(tape);
  const std::size_t saved = tape.memory().saved_bytes;
  tape.backward(loss);
  EXPECT_EQ(estimate.saved_bytes, saved);
  EXPECT_EQ(estimate.peak_bytes, tape.memory().peak_bytes);

  remat::Var<float> input;
  remat::CapturedStep<float> captured([&](Tape<float>& t) {
    input = t.constant(x);
    return remat::mean(remat::tanh(remat::matmul(input, t.variable(w))));
  });
  Tensor<float, 3> next(2, 3, 4);
  next.setConstant(-0.25f);
  captured.set_input(input, next);
  const float replayed = captured.replay();
  Tape<float> fresh;
  const float recorded = remat::mean(remat::tanh(remat::matmul(fresh.constant(next), fresh.variable(w)))).item();
  EXPECT_EQ(replayed, recorded);
  remat_test::expect_error_naming<remat::shape_error>([&] { captured.set_input(input, Tensor<float, 3>(3, 2, 4)); },
                                                      {"set_input", "[2,3,4]", "[3,2,4]"});
}

TEST(TensorValues, SchedulesAndTheMemoryBudgetOnARankThreeChain) {
  std::vector<remat::Parameter<double>> weights;
  for (int i = 0; i < 8; ++i)
    weights.emplace_back(remat::Matrix<double>::Constant(6, 6, 0.05 * (i + 1)) + remat::Matrix<double>::Identity(6, 6));
  Tensor<double, 3> x(4, 5, 6);
  for (Eigen::Index i = 0; i < x.size(); ++i) x.data()[i] = std::sin(0.1 * static_cast<double>(i));
  // mode 0: plain; 1: checkpoint_sequential in 3 segments; 2: a budget of 60 % of plain's peak.
  auto run = [&](int mode, std::size_t budget, remat::MemoryStats* memory) {
    Tape<double> tape;
    if (mode == 2) tape.set_memory_budget(budget);
    std::vector<std::function<remat::Var<double>(const remat::Var<double>&)>> layers;
    for (auto& w : weights)
      layers.push_back(
          [&tape, &w](const remat::Var<double>& h) { return remat::tanh(remat::matmul(h, tape.variable(w))); });
    remat::Var<double> h = tape.constant(x);
    if (mode == 1) {
      h = remat::checkpoint_sequential(layers, 3, h);
    } else {
      for (const auto& layer : layers) h = layer(h);
    }
    EXPECT_EQ(h.shape(), (Shape{4, 5, 6}));
    for (auto& w : weights) w.zero_grad();
    tape.backward(remat::sum(h));
    if (memory) *memory = tape.memory();
    std::vector<remat::Matrix<double>> grads;
    for (auto& w : weights) grads.emplace_back(w.grad());
    return grads;
  };
  remat::MemoryStats plain_memory, sequential_memory, budget_memory;
  const auto plain = run(0, 0, &plain_memory);
  const auto sequential = run(1, 0, &sequential_memory);
  const std::size_t budget = plain_memory.peak_bytes * 6 / 10;
  const auto budgeted = run(2, budget, &budget_memory);
  EXPECT_LT(sequential_memory.peak_bytes, plain_memory.peak_bytes);
  EXPECT_LE(budget_memory.peak_bytes, budget);
  EXPECT_GT(budget_memory.rematerialized_ops, 0u);
  for (std::size_t i = 0; i < plain.size(); ++i) {
    EXPECT_EQ(std::memcmp(budgeted[i].data(), plain[i].data(), sizeof(double) * 36), 0);
    EXPECT_EQ(std::memcmp(sequential[i].data(), plain[i].data(), sizeof(double) * 36), 0);
  }
}

}  // namespace tensor_values_test
