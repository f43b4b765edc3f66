// nn::Conv2d and nn::BatchNorm2d (PyTorch's initialisations and layouts, forward equal to the functional ops,
// batch norm following the tape's mode), nn::OneCycleSchedule against PyTorch 1.13's OneCycleLR, and
// nn::SGD::set_momentum.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "expect_error.hpp"
#include "nd_gradcheck.hpp"
#include "remat/remat.hpp"

namespace cnn_layers_test {

using remat::Shape;
using remat::Tape;
using remat::Var;

TEST(Conv2dLayer, DrawsPyTorchsKaimingUniformBoundsInItsLayout) {
  remat::nn::Generator generator(3);
  remat::nn::Conv2d<float> conv(4, 6, 3, generator, remat::Conv2dOptions().padding(1).groups(2));
  EXPECT_EQ(conv.weight.shape(), (Shape{6, 2, 3, 3}));
  EXPECT_EQ(conv.bias.shape(), (Shape{6}));
  const double bound = 1 / std::sqrt(2.0 * 9);  // fan_in = in/groups · kH · kW = 18
  EXPECT_LE(conv.weight.value().cwiseAbs().maxCoeff(), bound);
  EXPECT_GT(conv.weight.value().cwiseAbs().maxCoeff(), 0.8 * bound);  // spread over the interval
  EXPECT_LE(conv.bias.value().cwiseAbs().maxCoeff(), bound);
  remat::nn::Conv2d<float> plain(3, 5, {1, 3}, generator, {}, false);
  EXPECT_FALSE(plain.has_bias());
  EXPECT_EQ(plain.weight.shape(), (Shape{5, 3, 1, 3}));
  EXPECT_EQ(plain.bias.value().size(), 0);
}

TEST(Conv2dLayer, ForwardIsConv2dOfItsParameters) {
  remat::nn::Generator generator(5);
  remat::nn::Conv2d<double> conv(2, 3, 3, generator, remat::Conv2dOptions().stride(2).padding(1));
  Tape<double> tape;
  const Var<double> x = tape.constant(Shape{2, 2, 5, 5}, remat_test::nd_values(Shape{2, 2, 5, 5}, 1).data());
  const Var<double> y = conv.forward(tape, x);
  const Var<double> z = remat::conv2d(x, tape.variable(conv.weight), tape.variable(conv.bias),
                                      remat::Conv2dOptions().stride(2).padding(1));
  EXPECT_EQ(y.shape(), (Shape{2, 3, 3, 3}));
  EXPECT_TRUE(y.value() == z.value());
}

TEST(Conv2dLayer, RefusesChannelsTheGroupsDoNotDivide) {
  remat::nn::Generator generator;
  remat_test::expect_error_naming<remat::shape_error>(
      [&] { remat::nn::Conv2d<float>(3, 4, 3, generator, remat::Conv2dOptions().groups(2)); },
      {"nn::Conv2d", "in 3", "groups 2"});
  remat_test::expect_error_naming<remat::domain_error>(
      [&] { remat::nn::Conv2d<float>(3, 4, 3, generator, remat::Conv2dOptions().stride(0)); }, {"conv2d", "stride"});
}

TEST(BatchNorm2dLayer, StartsAsPyTorchAndFollowsTheTapesMode) {
  remat::nn::BatchNorm2d<double> bn(3);
  EXPECT_EQ(bn.weight.shape(), (Shape{3}));
  EXPECT_TRUE(bn.weight.value().isOnes());
  EXPECT_TRUE(bn.bias.value().isZero());
  EXPECT_TRUE(bn.running_mean.value().isZero());
  EXPECT_TRUE(bn.running_var.value().isOnes());
  EXPECT_EQ(bn.num_batches_tracked(), 0);
  EXPECT_EQ(bn.momentum(), 0.1);
  const remat::Matrix<double> data = remat_test::nd_values(Shape{4, 3, 2, 2}, 2, 1, 3);  // means near 2
  {
    Tape<double> tape;  // training by default: batch statistics, running ones move toward them
    const Var<double> y = bn.forward(tape, tape.constant(Shape{4, 3, 2, 2}, data.data()));
    const remat::Matrix<double> v = y.value();
    EXPECT_NEAR(v.sum() / static_cast<double>(v.size()), 0, 1e-12);
    tape.backward(remat::sum(remat::square(y)));
    EXPECT_TRUE(bn.weight.grad().allFinite());
  }
  EXPECT_GT(bn.running_mean.value().minCoeff(), 0.1);  // 0.1 · a mean near 2
  EXPECT_EQ(bn.num_batches_tracked(), 1);
  EXPECT_EQ(bn.running_mean.grad().size(), 3);
  EXPECT_TRUE(bn.running_mean.grad().isZero());  // never given a gradient
  const remat::Matrix<double> mean = bn.running_mean.value(), var = bn.running_var.value();
  Tape<double> tape;
  tape.set_training(false);  // evaluation: the running statistics normalise and stay as they are
  const Var<double> y = bn.forward(tape, tape.constant(Shape{4, 3, 2, 2}, data.data()));
  const double want = (data(0, 0) - mean(0, 0)) / std::sqrt(var(0, 0) + 1e-5);
  EXPECT_NEAR(y.value()(0, 0), want, 1e-12);
  EXPECT_TRUE(bn.running_mean.value() == mean);
  EXPECT_EQ(bn.num_batches_tracked(), 1);  // evaluation counts nothing
}

TEST(OneCycleSchedule, EqualsPyTorchsOneCycleLR) {
  // torch.optim.lr_scheduler.OneCycleLR(SGD(momentum=0.9), max_lr=0.2, total_steps=10), PyTorch 1.13: the
  // learning rate and momentum of each of its ten steps.
  const double lr[] = {0.008000000000000007,
                       0.10400000000000001,
                       0.2,
                       0.19009692640269477,
                       0.1623491307899526,
                       0.12225240438725786,
                       0.07774839561274215,
                       0.0376516692100474,
                       0.009903873597305258,
                       8e-07};
  const double momentum[] = {0.95,
                             0.8999999999999999,
                             0.85,
                             0.854951556604879,
                             0.8688255099070633,
                             0.8888739533021842,
                             0.9111260466978157,
                             0.9311744900929366,
                             0.945048443395121,
                             0.95};
  const remat::nn::OneCycleSchedule s(0.2, 10);
  for (int t = 0; t < 10; ++t) {
    EXPECT_NEAR(s.learning_rate_at(t), lr[t], 1e-15) << t;
    EXPECT_NEAR(s.momentum_at(t), momentum[t], 1e-15) << t;
  }
  EXPECT_NEAR(s.learning_rate_at(25), 8e-07, 1e-20);  // stays at the end
  remat_test::expect_error_naming<remat::domain_error>([] { remat::nn::OneCycleSchedule(0.1, 2); },
                                                       {"nn::OneCycleSchedule", "pct_start"});
  remat_test::expect_error_naming<remat::domain_error>([&] { (void)s.learning_rate_at(-1); }, {"step -1"});
}

TEST(SgdMomentum, ASetMomentumAppliesToTheNextStepAndCannotStartMomentum) {
  remat::Parameter<double> p(remat::Matrix<double>::Ones(1, 1));
  remat::nn::SGD<double> sgd({&p}, {0.1, 0.5, 0, false});
  p.mutable_grad().setConstant(1);
  sgd.step();  // b = 1, θ = 1 − 0.1
  sgd.set_momentum(0.9);
  sgd.step();  // b = 0.9·1 + 1 = 1.9, θ = 0.9 − 0.19
  EXPECT_NEAR(p.value()(0, 0), 0.71, 1e-15);
  remat::Parameter<double> q(remat::Matrix<double>::Ones(1, 1));
  remat::nn::SGD<double> plain({&q}, {0.1, 0, 0, false});
  remat_test::expect_error_naming<remat::domain_error>([&] { plain.set_momentum(0.9); },
                                                       {"nn::SGD", "set_momentum", "made with 0"});
}

}  // namespace cnn_layers_test
