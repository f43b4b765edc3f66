// The first thing to break if the headers do not compile together: one forward and backward of an MLP layer.
#include <gtest/gtest.h>

#include <cmath>

#include "remat/remat.hpp"

TEST(Smoke, TanhLayerGradientMatchesHandDerivation) {
  remat::Tape<double> tape;
  remat::Matrix<double> x_value(1, 2), w_value(2, 1);
  x_value << 1, 2;
  w_value << 0.1, 0.2;
  auto x = tape.constant(x_value);
  auto w = tape.variable(w_value);
  auto loss = remat::sum(remat::tanh(remat::matmul(x, w)));
  tape.backward(loss);
  const double d = 1 - std::tanh(0.5) * std::tanh(0.5);
  EXPECT_NEAR(w.grad()(0, 0), 1 * d, 1e-15);
  EXPECT_NEAR(w.grad()(1, 0), 2 * d, 1e-15);
}
