// Tests of the small training helpers in include/remat/nn: Adam's update and Linear's initialisation.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include <remat/nn/adam.hpp>
#include <remat/nn/linear.hpp>
#include <remat/remat.hpp>

// Named after the file: this directory's test files are compiled as one translation unit (tests/CMakeLists.txt).
namespace nn_test {

using remat::Matrix;

// Kingma & Ba 2015, Algorithm 1, written out in double as in the paper (bias-corrected m̂ and v̂).
struct ReferenceAdam {
  double alpha = 1e-3, beta1 = 0.9, beta2 = 0.999, epsilon = 1e-8;
  double m = 0, v = 0;
  int t = 0;
  double step(double theta, double g) {
    ++t;
    m = beta1 * m + (1 - beta1) * g;
    v = beta2 * v + (1 - beta2) * g * g;
    const double m_hat = m / (1 - std::pow(beta1, t));
    const double v_hat = v / (1 - std::pow(beta2, t));
    return theta - alpha * m_hat / (std::sqrt(v_hat) + epsilon);
  }
};

TEST(Adam, FirstStepMovesEachWeightByTheLearningRateAgainstTheGradientSign) {
  remat::Parameter<double> p(Matrix<double>{{1.0, -2.0, 0.5}});
  remat::nn::Adam<double> adam({&p});
  adam.step(std::vector<Matrix<double>>{Matrix<double>{{0.3, -4.0, 1e-3}}});
  // m̂ = g and v̂ = g² after one step, so the update is α·g/(|g| + ε) ≈ α·sign(g).
  EXPECT_NEAR(p.value()(0, 0), 1.0 - 1e-3, 1e-10);
  EXPECT_NEAR(p.value()(0, 1), -2.0 + 1e-3, 1e-10);
  EXPECT_NEAR(p.value()(0, 2), 0.5 - 1e-3 * 1e-3 / (1e-3 + 1e-8), 1e-12);
  EXPECT_EQ(adam.step_count(), 1u);
}

TEST(Adam, MatchesThePapersAlgorithmOverManySteps) {
  const std::vector<double> start = {0.7, -1.3, 2.0, 0.0};
  remat::Parameter<double> p(Matrix<double>{{start[0], start[1]}, {start[2], start[3]}});
  remat::nn::Adam<double>::Options o;
  o.learning_rate = 0.01;
  remat::nn::Adam<double> adam({&p}, o);
  std::vector<ReferenceAdam> reference(4);
  std::vector<double> theta = start;
  for (auto& r : reference) r.alpha = 0.01;
  for (int step = 0; step < 50; ++step) {
    // Gradient of Σ θ⁴/4 + sin(step) θ, evaluated at the current parameters.
    Matrix<double> g(2, 2);
    for (int k = 0; k < 4; ++k) {
      g.data()[k] = std::pow(p.value().data()[k], 3) + std::sin(step);
      theta[static_cast<std::size_t>(k)] = reference[static_cast<std::size_t>(k)].step(
          theta[static_cast<std::size_t>(k)], std::pow(theta[static_cast<std::size_t>(k)], 3) + std::sin(step));
    }
    adam.step(std::vector<Matrix<double>>{g});
  }
  for (int k = 0; k < 4; ++k) EXPECT_NEAR(p.value().data()[k], theta[static_cast<std::size_t>(k)], 1e-12) << k;
}

TEST(Adam, WritesThroughMutableValueSoATapeSeesTheParameterAsStale) {
  remat::Parameter<float> p(Matrix<float>::Ones(2, 2));
  remat::nn::Adam<float> adam({&p});
  remat::Tape<float> tape;
  auto w = tape.variable(p);
  auto loss = remat::sum(remat::square(w));
  adam.step(std::vector<Matrix<float>>{Matrix<float>::Ones(2, 2)});
  EXPECT_THROW(tape.backward(loss), remat::stale_value_error);
}

TEST(Adam, RejectsMismatchedGradientsWithoutChangingAnything) {
  remat::Parameter<float> p(Matrix<float>::Ones(2, 3));
  remat::nn::Adam<float> adam({&p});
  EXPECT_THROW(adam.step(std::vector<Matrix<float>>{Matrix<float>::Ones(3, 2)}), remat::shape_error);
  EXPECT_THROW(adam.step(std::vector<Matrix<float>>{}), remat::shape_error);
  EXPECT_EQ(adam.step_count(), 0u);
  EXPECT_EQ(p.version(), 0u);
  remat::nn::Adam<float>::Options bad;
  bad.beta2 = 1;
  EXPECT_THROW(remat::nn::Adam<float>({&p}, bad), remat::domain_error);
}

TEST(Linear, HeUniformInitialisationHasTheBoundAndVarianceOfHeEtAl) {
  remat::nn::Generator g(7);
  remat::nn::Linear<double> layer(400, 300, g, remat::nn::Init::he_uniform);
  const double bound = std::sqrt(6.0 / 400);
  const auto& w = layer.weight.value();
  EXPECT_EQ(w.rows(), 400);
  EXPECT_EQ(w.cols(), 300);
  EXPECT_LE(w.cwiseAbs().maxCoeff(), bound);
  EXPECT_GT(w.cwiseAbs().maxCoeff(), 0.99 * bound);
  const double variance = w.array().square().mean();
  EXPECT_NEAR(variance, 2.0 / 400, 0.02 * 2.0 / 400);  // 120000 draws: relative error ~0.4%
  EXPECT_NEAR(w.mean(), 0.0, 1e-3);
  EXPECT_TRUE(layer.bias.value().isZero());
  EXPECT_EQ(layer.bias.value().rows(), 1);
  EXPECT_EQ(layer.bias.value().cols(), 300);
}

TEST(Linear, GlorotUniformUsesFanInPlusFanOut) {
  remat::nn::Generator g(8);
  remat::nn::Linear<double> layer(100, 500, g, remat::nn::Init::glorot_uniform);
  const double bound = std::sqrt(6.0 / 600);
  EXPECT_LE(layer.weight.value().cwiseAbs().maxCoeff(), bound);
  EXPECT_NEAR(layer.weight.value().array().square().mean(), 2.0 / 600, 0.02 * 2.0 / 600);
}

TEST(Linear, TheSameSeedGivesTheSameWeightsAndTheGeneratorStateRoundTrips) {
  remat::nn::Generator a(123), b(123);
  remat::nn::Linear<float> la(5, 4, a), lb(5, 4, b);
  EXPECT_EQ(la.weight.value(), lb.weight.value());
  remat::nn::Generator c(0);
  c.set_state(a.state());
  EXPECT_EQ(c.next(), a.next());
  EXPECT_THROW(remat::nn::Linear<float>(0, 4, a), remat::shape_error);
}

TEST(Generator, BelowIsInRangeAndCoversIt) {
  remat::nn::Generator g(1);
  std::vector<int> seen(7, 0);
  for (int i = 0; i < 7000; ++i) ++seen[static_cast<std::size_t>(g.below(7))];
  for (int s : seen) EXPECT_NEAR(s, 1000, 150);
}

}  // namespace nn_test