// Recording without gradients (Tape::set_grad_enabled, NoGradGuard: torch.no_grad's role): values as with
// gradients, no residual kept, nothing replayed, and the setting restored.
#include <gtest/gtest.h>

#include "memory.hpp"
#include "random.hpp"
#include "remat/remat.hpp"

namespace no_grad_test {

using remat::Matrix;
using remat::Parameter;
using remat::Tape;
using remat::Var;

/// A two-layer tanh MLP on x [8,16] (float: every activation 512 B), its second layer a nothing_saveable
/// region; returns the loss.
Var<float> mlp(Tape<float>& tape, Parameter<float>& w1, Parameter<float>& w2, const Matrix<float>& x) {
  const Var<float> h = remat::tanh(remat::matmul(tape.constant(x), tape.variable(w1)));
  const Var<float> y = remat::checkpoint([&](Var<float> v) { return remat::tanh(remat::matmul(v, tape.variable(w2))); },
                                         remat::policies::nothing_saveable)(h);
  return remat::sum(y);
}

TEST(NoGrad, KeepsNoResidualAndComputesTheSameValues) {
  Parameter<float> w1(remat_test::random_matrix<float>(16, 16, 1) * 0.3f),
      w2(remat_test::random_matrix<float>(16, 16, 2) * 0.3f);
  const Matrix<float> x = remat_test::random_matrix<float>(8, 16, 3);
  Tape<float> with;
  const float expected = mlp(with, w1, w2, x).item();
  EXPECT_GT(with.memory().saved_bytes, 0u);  // x, h (the region's source), ... for the backward

  Tape<float> tape;
  {
    remat::NoGradGuard<float> guard(tape);
    EXPECT_FALSE(tape.grad_enabled());
    const Var<float> loss = mlp(tape, w1, w2, x);
    EXPECT_EQ(loss.item(), expected);
    EXPECT_EQ(tape.memory().saved_bytes, 0u) << remat_test::describe(tape.memory());
    // Only what handles hold stays: the loss (4 B) and the constant x, whose Var died but which no reader holds.
    EXPECT_EQ(tape.memory().live_bytes, sizeof(float)) << remat_test::describe(tape.memory());
    tape.backward(loss);  // nothing requires a gradient: nothing to compute
    EXPECT_EQ(tape.memory().replayed_ops, 0u);
    EXPECT_FALSE(w1.has_grad());
    EXPECT_FALSE(w2.has_grad());
  }
  EXPECT_TRUE(tape.grad_enabled());
  // Nested guards restore in turn; set_grad_enabled is kept across clear().
  tape.clear();
  {
    remat::NoGradGuard<float> outer(tape);
    {
      remat::NoGradGuard<float> inner(tape);
      tape.set_grad_enabled(true);
    }
    EXPECT_FALSE(tape.grad_enabled());
  }
  tape.set_grad_enabled(false);
  tape.clear();
  EXPECT_FALSE(tape.grad_enabled());
}

TEST(NoGrad, OpsRecordedWithGradientsOnStillDifferentiate) {
  // A variable recorded with gradients off still receives gradients from ops recorded after they are on.
  Tape<double> tape;
  Var<double> v;
  {
    remat::NoGradGuard<double> guard(tape);
    v = tape.variable(remat_test::random_matrix<double>(2, 3, 4));
    const Var<double> unused = remat::tanh(v);
    EXPECT_FALSE(unused.requires_grad());
  }
  tape.backward(remat::sum(remat::square(v)));
  EXPECT_TRUE(Matrix<double>(v.grad()).isApprox(2 * Matrix<double>(v.value())));
}

}  // namespace no_grad_test
