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

// The umbrella header is the one include a program needs, the training pieces (remat/nn/) included: this
// file includes nothing else of remat (and is compiled on its own, outside the unity build, so that no other
// test file's includes can stand in for the umbrella's). One SGD step on a Linear layer lowers the loss.
TEST(Smoke, UmbrellaHeaderHasTheTrainingPieces) {
  remat::nn::Generator generator(7);
  remat::nn::Linear<double> layer(3, 2, generator, remat::nn::Init::glorot_uniform);
  const remat::Matrix<double> x = remat::Matrix<double>::Ones(4, 3);
  const auto step_loss = [&] {
    remat::Tape<double> tape;
    const auto y = remat::linear(tape.constant(x), tape.variable(layer.weight), tape.variable(layer.bias));
    const auto loss = remat::sum(remat::square(y));
    tape.backward(loss);
    return loss.value()(0, 0);
  };
  remat::nn::SGD<double> sgd({&layer.weight, &layer.bias}, {/*learning_rate=*/0.01});
  const double before = step_loss();
  EXPECT_GT(remat::nn::clip_grad_norm<double>({&layer.weight, &layer.bias}, 1e9), 0.0);
  sgd.step();
  layer.weight.zero_grad();
  layer.bias.zero_grad();
  EXPECT_LT(step_loss(), before);
  // The other optimizers and the schedule are there too.
  remat::nn::Adam<double> adam({&layer.weight, &layer.bias});
  remat::nn::AdamW<double> adamw({&layer.weight, &layer.bias});
  (void)adam;
  (void)adamw;
  const remat::nn::WarmupCosineSchedule schedule(1e-3, 10, 100);
  EXPECT_GT(schedule.at(5), 0.0);
}
