// The shapes-only tape behind remat::estimate_memory: reading a value throws shapes_only_error naming what
// was read; the user's Parameters and data are left untouched; custom ops are estimated like built-in ones
// (temporaries and extras included) unless they declare estimable = false; the tape's other reports
// (print_saved_residuals, diagnostics) and a second backward with retain_graph agree with a tape that computes.
#include <gtest/gtest.h>

#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "estimate_support.hpp"
#include "expect_error.hpp"
#include "gradcheck.hpp"
#include "random.hpp"
#include "remat/remat.hpp"

namespace user_ops {  // written against the public op recipe only

/// y = x² / (1 + s) per row, s = Σⱼ xᵢⱼ² (kept as its [m,1] extra); its forward and backward use an [m,n]
/// temporary. dx = 2x ⊙ g / (1 + s) − 2x (Σⱼ gᵢⱼ xᵢⱼ²) / (1 + s)².
struct RowNormalizedSquareOp : remat::OpBase {
  static constexpr const char* name = "row_normalized_square";
  static constexpr remat::OpKind kind = remat::OpKind::normalization;
  static unsigned reads(remat::GradInputs g) {
    return remat::wants(g, 0) ? remat::reads_input0 | remat::reads_extra : remat::reads_nothing;
  }
  static remat::Shape output_shape(const remat::Shape* in, const Params&) { return in[0]; }
  static remat::Shape extra_shape(const remat::Shape* in, const Params&) { return {in[0].rows(), 1}; }
  static remat::Shape scratch_shape(const remat::Shape* in, const Params&) { return in[0]; }
  template <class T>
  static void forward(const remat::ForwardContext<T>& c) {
    auto square = c.scratch();
    square = c.in(0).array().square().matrix();
    c.extra() = square.rowwise().sum();
    c.out() = (square.array().colwise() / (T(1) + c.extra().col(0).array())).matrix();
  }
  template <class T>
  static void backward(const remat::BackwardContext<T>& c) {
    const auto x = c.in(0).array();
    const auto denominator = (T(1) + c.extra().col(0).array()).eval();
    auto weighted = c.scratch();
    weighted = (c.grad_out().array() * x.square()).matrix();
    const auto row = (weighted.rowwise().sum().array() / denominator.square()).eval();
    c.add_grad(0, T(2) * x * (c.grad_out().array().colwise() / denominator) - T(2) * (x.colwise() * row.col(0)));
  }
  static double flops(const remat::Shape*, int, const remat::Shape& out) {
    return 6.0 * static_cast<double>(out.size());
  }
};

/// Writes the number of positive elements of its input through a pointer in its Params: a program that
/// reads it to decide what to record next cannot be estimated, so the op says so.
struct CountPositiveOp : remat::OpBase {
  static constexpr const char* name = "count_positive";
  static constexpr remat::OpKind kind = remat::OpKind::reduction;
  static constexpr bool estimable = false;
  struct Params {
    int* count = nullptr;
  };
  static unsigned reads(remat::GradInputs) { return remat::reads_nothing; }
  static remat::Shape output_shape(const remat::Shape*, const Params&) { return {1, 1}; }
  template <class T>
  static void forward(const remat::ForwardContext<T>& c) {
    const int n = static_cast<int>((c.in(0).array() > T(0)).count());
    *c.template params<Params>().count = n;
    c.out()(0, 0) = static_cast<T>(n);
  }
  template <class T>
  static void backward(const remat::BackwardContext<T>& c) {
    if (c.wants_grad(0)) c.add_grad(0, remat::Matrix<T>::Zero(c.in_shape(0).rows(), c.in_shape(0).cols()));
  }
  static double flops(const remat::Shape* in, int, const remat::Shape&) { return static_cast<double>(in[0].size()); }
};

}  // namespace user_ops

namespace shapes_only_tape_test {

using remat::Matrix;
using remat::Parameter;
using remat::Tape;
using remat::Var;
using remat_test::expect_error_naming;

TEST(ShapesOnlyTape, ReadingAValueOrGradientThrowsNamingTheNode) {
  Parameter<float> P(remat_test::random_matrix<float>(4, 3, 1));
  Tape<float> tape(remat::shapes_only);
  EXPECT_TRUE(tape.shapes_only());
  const Var<float> x = tape.constant(Matrix<float>::Zero(5, 4));
  const Var<float> v = tape.variable(Matrix<float>::Ones(5, 4));
  const Var<float> p = tape.variable(P);
  const Var<float> h = remat::tanh(remat::matmul(x + v, p));
  const Var<float> loss = remat::sum(h);
  using E = remat::shapes_only_error;
  expect_error_naming<E>([&] { h.value(); }, {"value", "node #5", "tanh [5,3]", "shapes-only"});
  expect_error_naming<E>([&] { loss.item(); }, {"item", "node #6", "sum [1,1]", "shapes-only"});
  expect_error_naming<E>([&] { x.value(); }, {"value", "node #0", "constant [5,4]"});
  expect_error_naming<E>([&] { remat::argmax_rows(h); }, {"value", "tanh [5,3]"});
  expect_error_naming<E>([&] { tape.gradient(loss, {v}); }, {"gradient", "shapes-only"});
  tape.backward(loss);
  expect_error_naming<E>([&] { v.grad(); }, {"grad", "node #1", "variable [5,4]", "gradient"});
  expect_error_naming<E>([&] { p.grad(); }, {"grad", "node #2", "variable [4,3]"});
  // shapes_only_error is a tape_error: code that handles tape misuse handles it.
  EXPECT_THROW(h.value(), remat::tape_error);
  EXPECT_FALSE(Tape<float>().shapes_only());
}

TEST(ShapesOnlyTape, AnEstimateWhoseModelReadsAValueThrowsAndNamesIt) {
  expect_error_naming<remat::shapes_only_error>(
      [] {
        remat::estimate_memory([](Tape<float>& tape) {
          const Var<float> loss = remat::mean(remat::exp(tape.variable(Matrix<float>::Ones(2, 3))));
          if (loss.item() > 1) return loss;  // data-dependent control flow: an estimate cannot follow it
          return loss * loss;
        });
      },
      {"item", "mean [1,1]", "shapes-only"});
}

TEST(ShapesOnlyTape, ParametersAndDataAreLeftUntouched) {
  // Parameters with a gradient from a real backward, and one zeroed since.
  std::vector<Parameter<double>> ps;
  for (int k = 0; k < 3; ++k) ps.emplace_back(remat_test::random_matrix<double>(4, 4, 10 + k));
  const Matrix<double> data = remat_test::random_matrix<double>(3, 4, 9);
  auto build = [&](Tape<double>& tape) {
    Var<double> h = tape.constant(data);
    for (auto& p : ps)
      h = remat::checkpoint([&](Var<double> a) { return remat::sin(remat::matmul(a, tape.variable(p))); },
                            remat::policies::nothing_saveable)(h);
    for (auto& p : ps) tape.variable(p).zero_grad();  // a step that zeroes gradients between forward and backward
    return remat::sum(h);
  };
  {
    Tape<double> tape;
    tape.backward(build(tape));
  }
  ps[2].zero_grad();
  std::vector<Matrix<double>> values, grads;
  std::vector<const double*> grad_buffers;
  std::vector<std::uint64_t> versions;
  std::vector<bool> defined;
  for (auto& p : ps) {
    values.push_back(p.value());
    versions.push_back(p.version());
    defined.push_back(p.has_grad());
    grads.push_back(p.grad());
    grad_buffers.push_back(p.grad().data());
  }
  const Matrix<double> data_before = data;
  const auto e = remat::estimate_memory<double>(build);
  EXPECT_GT(e.replayed_ops, 0u);
  for (std::size_t k = 0; k < ps.size(); ++k) {
    SCOPED_TRACE("parameter " + std::to_string(k));
    EXPECT_EQ(std::memcmp(ps[k].value().data(), values[k].data(), sizeof(double) * 16), 0);
    EXPECT_EQ(ps[k].version(), versions[k]);
    EXPECT_EQ(ps[k].has_grad(), defined[k]);
    EXPECT_EQ(ps[k].grad().data(), grad_buffers[k]) << "the estimate handed a gradient buffer over";
    EXPECT_EQ(std::memcmp(ps[k].grad().data(), grads[k].data(), sizeof(double) * 16), 0);
  }
  EXPECT_EQ(std::memcmp(data.data(), data_before.data(), sizeof(double) * 12), 0);
}

TEST(ShapesOnlyTape, CustomOpWithExtraAndTemporaryIsEstimatedExactly) {
  const auto check = remat::gradcheck(
      [](Tape<double>&, const std::vector<Var<double>>& v) {
        return remat::sum(remat::apply_op<user_ops::RowNormalizedSquareOp>(v[0]) * v[1]);
      },
      {remat_test::random_matrix<double>(3, 4, 1), remat_test::random_matrix<double>(3, 4, 2)});
  EXPECT_TRUE(remat_test::passes(check));
  const Matrix<float> x = remat_test::random_matrix<float>(6, 5, 3);
  for (int policy = 0; policy < 3; ++policy) {
    const auto e = estimate_test::expect_estimate_equals_real_run<float>(
        [&](Tape<float>& tape) {
          const Var<float> w = tape.variable(x);
          auto f = [](Var<float> a) { return remat::tanh(remat::apply_op<user_ops::RowNormalizedSquareOp>(a)); };
          Var<float> y = policy == 0   ? f(w)
                         : policy == 1 ? remat::checkpoint(f, remat::policies::nothing_saveable)(w)
                                       : remat::checkpoint(f, remat::policies::everything_saveable)(w);
          return remat::sum(remat::apply_op<user_ops::RowNormalizedSquareOp>(y));
        },
        "custom op, policy " + std::to_string(policy));
    // The temporary [6,5] counts in the peak: at least the leaf, its gradient, and one op's output, extra and
    // temporary live at once.
    EXPECT_GE(e.peak_bytes, remat_test::bytes<float>(6, 5) * 4 + remat_test::bytes<float>(6, 1));
  }
}

TEST(ShapesOnlyTape, AnOpThatCannotBeEstimatedThrowsNamingItAndLeavesTheTapeUsable) {
  int count = -1;
  user_ops::CountPositiveOp::Params params{&count};
  {
    Tape<float> tape;  // a tape that computes records it
    const Var<float> x = tape.variable(Matrix<float>::Ones(2, 3));
    EXPECT_EQ(remat::apply_op<user_ops::CountPositiveOp>(params, x).item(), 6.0f);
    EXPECT_EQ(count, 6);
  }
  count = -1;
  Tape<float> tape(remat::shapes_only);
  const Var<float> x = tape.variable(Matrix<float>::Ones(2, 3));
  const std::size_t nodes = tape.size();
  const auto before = tape.memory();
  expect_error_naming<remat::shapes_only_error>([&] { remat::apply_op<user_ops::CountPositiveOp>(params, x); },
                                                {"count_positive", "cannot be estimated", "estimable"});
  EXPECT_EQ(count, -1) << "its forward ran";
  EXPECT_EQ(tape.size(), nodes);
  EXPECT_EQ(tape.memory().live_bytes, before.live_bytes);
  tape.backward(remat::sum(remat::square(x)));  // still usable
  EXPECT_GT(tape.memory().peak_bytes, before.peak_bytes);
}

/// A step recorded on `tape` for the report tests: a region of each diagnosis, a name policy.
Var<float> reported_step(Tape<float>& tape, const Matrix<float>& x, const Matrix<float>& w) {
  const Var<float> W = tape.variable(w), X = tape.constant(x);
  Var<float> h = remat::checkpoint([&](Var<float> a) { return remat::tanh(remat::matmul(a, W)); },
                                   remat::policies::nothing_saveable)(X);
  h = remat::checkpoint([&](Var<float> a) { return remat::checkpoint_name(remat::sin(remat::matmul(a, W)), "s"); },
                        remat::policies::save_only_these_names({"s"}))(h);
  h = remat::checkpoint([&](Var<float> a) { return remat::exp(a); }, remat::policies::everything_saveable)(h);
  const Var<float> frozen =
      remat::checkpoint([&](Var<float> a) { return remat::cos(a); }, remat::policies::nothing_saveable)(X);
  return remat::sum(remat::checkpoint([&](Var<float> a) { return remat::gelu(a * a); },
                                      remat::policies::nothing_saveable)(h + frozen));
}

TEST(ShapesOnlyTape, SavedResidualsAndDiagnosticsReadAsOnATapeThatComputes) {
  const Matrix<float> x = remat_test::random_matrix<float>(4, 4, 1), w = remat_test::random_matrix<float>(4, 4, 2);
  Tape<float> real, shapes(remat::shapes_only);
  const Var<float> a = reported_step(real, x, w), b = reported_step(shapes, x, w);
  std::ostringstream r, s, dr, ds;
  real.print_saved_residuals(r);
  shapes.print_saved_residuals(s);
  EXPECT_EQ(s.str(), r.str());
  real.diagnose(dr);
  shapes.diagnose(ds);
  EXPECT_EQ(ds.str(), dr.str());
  EXPECT_NE(ds.str(), "") << "the step has regions the diagnostics report";
}

TEST(ShapesOnlyTape, RetainGraphTwoBackwardsEvaluationModeAndClearAgreeWithARealTape) {
  const Matrix<double> x = remat_test::random_matrix<double>(5, 3, 1), w = remat_test::random_matrix<double>(3, 3, 2);
  auto record = [&](Tape<double>& tape) {
    const Var<double> W = tape.variable(w);  // a tape variable: its gradient stays on the tape
    const Var<double> h = remat::checkpoint([&](Var<double> a) { return remat::dropout(remat::tanh(a), 0.5); },
                                            remat::policies::dots_saveable)(remat::matmul(tape.constant(x), W));
    return remat::mean(remat::square(h));
  };
  for (bool training : {true, false}) {
    Tape<double> real, shapes(remat::shapes_only);
    real.set_training(training);
    shapes.set_training(training);
    for (int step = 0; step < 2; ++step) {  // the second step after clear()
      SCOPED_TRACE("training " + std::to_string(training) + ", step " + std::to_string(step));
      const Var<double> a = record(real), b = record(shapes);
      EXPECT_EQ(shapes.memory().saved_bytes, real.memory().saved_bytes);
      real.backward(a, /*retain_graph=*/true);
      shapes.backward(b, /*retain_graph=*/true);
      EXPECT_EQ(shapes.memory().live_bytes, real.memory().live_bytes);
      EXPECT_EQ(shapes.memory().peak_bytes, real.memory().peak_bytes);
      real.backward(a);
      shapes.backward(b);
      EXPECT_EQ(shapes.memory().live_bytes, real.memory().live_bytes);
      EXPECT_EQ(shapes.memory().peak_bytes, real.memory().peak_bytes);
      EXPECT_EQ(shapes.memory().replayed_bytes, real.memory().replayed_bytes);
      EXPECT_THROW(shapes.backward(b), remat::freed_value_error);  // as on the real tape
      real.clear();
      shapes.clear();
      EXPECT_EQ(shapes.memory().live_bytes, real.memory().live_bytes);
    }
  }
}

TEST(ShapesOnlyTape, GradientReadyCallbacksAreNotCalled) {
  Parameter<float> P(remat_test::random_matrix<float>(3, 3, 1));
  Tape<float> tape(remat::shapes_only);
  int calls = 0;
  tape.on_gradient_ready([&](Parameter<float>&) { ++calls; });
  tape.backward(remat::sum(remat::tanh(tape.variable(P))));
  EXPECT_EQ(calls, 0);
  EXPECT_FALSE(P.has_grad());
}

}  // namespace shapes_only_tape_test
