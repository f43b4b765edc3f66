// The optimizers (include/remat/nn/) against closed forms computed by hand in double: Adam's first step is the
// learning rate times the gradient's sign, zero betas keep no history, AdamW's decay is decoupled from the
// gradient, a step before any backward changes nothing but the step count, SGD's momentum and Nesterov follow
// PyTorch's formula over three steps, clip_grad_norm's factor and its zero, inf and NaN norms, the warm-up
// cosine schedule's closed form. OptimizerArguments: invalid hyperparameters and a Parameter given twice are
// refused with messages naming the exact values (regression tests for nn::Adam, which accepted them).
#include <gtest/gtest.h>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "remat/nn/adam.hpp"
#include "remat/nn/adamw.hpp"
#include "remat/nn/clip_grad_norm.hpp"
#include "remat/nn/sgd.hpp"
#include "remat/nn/warmup_cosine_schedule.hpp"
#include "remat/remat.hpp"

// Named after the file: this directory's test files are compiled as one translation unit (tests/CMakeLists.txt).
namespace optimizer_closed_forms_test {

using remat::Matrix;
using remat::Parameter;
using remat_test::expect_error_naming;
using MF = Matrix<float>;
using MD = Matrix<double>;

// ================================================================ include/remat/nn/

// Regression: include/remat/nn/adam.hpp:119-125 — nn::Adam's constructor never calls reject_duplicates(), unlike
// nn::AdamW and nn::SGD (optimizer.hpp:103: "Throws domain_error if a parameter was given twice (it would be updated
// twice per step)"; clip_grad_norm.hpp: "the optimizers refuse it too"). Adam({&p, &p}) is accepted and each step()
// updates p twice with two different moment pairs: a silently wrong result (the step is about 2α, not α).
// Expected: domain_error naming nn::Adam, both indices and "same parameter", as AdamW. torch.optim rejects a
// parameter in two groups (ValueError) and warns for one repeated within a group.
// Fix: `this->reject_duplicates();` after the loop in Adam's constructor.
TEST(OptimizerArguments, AdamRejectsAParameterGivenTwiceAsAdamWAndSGDDo) {
  Parameter<double> p(MD::Constant(1, 1, 1.0)), q(MD::Constant(1, 1, 2.0));
  expect_error_naming<remat::domain_error>(
      [&] {
        remat::nn::Adam<double> adam({&p, &q, &p});
      },
      {"nn::Adam", "0", "2", "same parameter"});
  // What the accepted optimizer does: one step with g = 1 moves p by about 2α (each copy by α·g/(|g|+ε)).
  remat::nn::Adam<double>::Options o;
  o.learning_rate = 0.1;
  try {
    remat::nn::Adam<double> adam({&p, &p}, o);
    p.mutable_grad() = MD::Constant(1, 1, 1.0);
    adam.step();
    EXPECT_NEAR(p.value()(0, 0), 1.0 - 0.1 * 1 / (1 + 1e-8), 1e-12) << "p was updated twice in one step";
  } catch (const remat::domain_error&) {
  }
}

// Regression: include/remat/nn/adam.hpp:121-124 and :135 format the offending values with std::to_string ("%f", six
// decimals), so the message of nn::Adam's constructor and set_learning_rate does not name the values: epsilon
// 1e-8 (the default) prints as "0.000000", a negative epsilon -1e-12 as "-0.000000", learning_rate -1e-9 as
// "-0.000000" — e.g. `mlp --lr nan` says "got nan, 0.900000, 0.999000, 0.000000", as if epsilon were the zero
// that is wrong. The project's standard (tests/support/expect_error.hpp) and its siblings nn::AdamW, nn::SGD,
// nn::WarmupCosineSchedule use remat::number_text ("1e-08") and name each value. Expected: the exact values,
// each with its name. Fix: remat::number_text and "learning_rate X, beta1 X, ..." as in adamw.hpp.
TEST(OptimizerArguments, AdamErrorMessagesNameTheOffendingValuesExactly) {
  Parameter<float> p(MF::Ones(1, 1));
  remat::nn::Adam<float>::Options o;
  o.epsilon = -1e-12;
  expect_error_naming<remat::domain_error>([&] { remat::nn::Adam<float>({&p}, o); }, {"nn::Adam", "epsilon", "-1e-12"});
  o = {};
  o.learning_rate = std::nan("");
  expect_error_naming<remat::domain_error>([&] { remat::nn::Adam<float>({&p}, o); },
                                           {"nn::Adam", "learning_rate nan", "epsilon 1e-08"});
  remat::nn::Adam<float> adam({&p});
  expect_error_naming<remat::domain_error>([&] { adam.set_learning_rate(-1e-9); }, {"nn::Adam", "-1e-09"});
  EXPECT_EQ(adam.options().learning_rate, 1e-3);
}

// Regression: include/remat/nn/adam.hpp:120 and :134 accept learning_rate = +inf and epsilon = +inf (the tests are
// "> 0"), which nn::AdamW (adamw.hpp:69: "0 ≤ α < ∞ ... 0 < ε < ∞"), nn::SGD and nn::WarmupCosineSchedule refuse.
// With α = inf a parameter whose gradient is 0 becomes NaN (inf · 0) and every other one ±inf after one step; with
// ε = inf nothing ever moves: silent. Expected: domain_error naming nn::Adam and the value, parameters unchanged,
// as AdamW. (torch.optim.Adam checks only 0 <= lr and 0 <= eps, so it would accept inf too; AdamW here is
// stricter, and Adam should agree with it — they share adam_update.) Fix: add std::isfinite to both checks.
TEST(OptimizerArguments, AdamRefusesAnInfiniteLearningRateOrEpsilonAsAdamWDoes) {
  const double inf = std::numeric_limits<double>::infinity();
  Parameter<float> p(MF::Ones(1, 2));
  remat::nn::AdamW<float>::Options w;
  w.learning_rate = inf;
  EXPECT_THROW(remat::nn::AdamW<float>({&p}, w), remat::domain_error);  // the sibling's documented behaviour
  remat::nn::Adam<float>::Options o;
  o.learning_rate = inf;
  EXPECT_THROW(remat::nn::Adam<float>({&p}, o), remat::domain_error) << "learning_rate inf accepted";
  o = {};
  o.epsilon = inf;
  EXPECT_THROW(remat::nn::Adam<float>({&p}, o), remat::domain_error) << "epsilon inf accepted";
  remat::nn::Adam<float> adam({&p});
  EXPECT_THROW(adam.set_learning_rate(inf), remat::domain_error) << "set_learning_rate(inf) accepted";
  // What an accepted α = inf does: a zero gradient makes the parameter NaN.
  try {
    adam.set_learning_rate(inf);
    MF g(1, 2);
    g << 0.0f, 1.0f;
    p.mutable_grad() = g;
    adam.step();
    EXPECT_FALSE(std::isnan(p.value()(0, 0))) << "a parameter with gradient 0 became NaN";
  } catch (const remat::domain_error&) {
  }
}

TEST(OptimizerClosedForms, AdamAndAdamWRefuseInvalidHyperparametersWithDomainError) {
  Parameter<float> p(MF::Ones(2, 2));
  const double nan = std::nan("");
  for (const auto& bad : std::vector<std::vector<double>>{{0, 0.9, 0.999, 1e-8},
                                                          {-1e-3, 0.9, 0.999, 1e-8},
                                                          {nan, 0.9, 0.999, 1e-8},
                                                          {1e-3, 1.0, 0.999, 1e-8},
                                                          {1e-3, -0.1, 0.999, 1e-8},
                                                          {1e-3, 0.9, 1.0, 1e-8},
                                                          {1e-3, 0.9, nan, 1e-8},
                                                          {1e-3, 0.9, 0.999, 0},
                                                          {1e-3, 0.9, 0.999, -1e-8},
                                                          {1e-3, 0.9, 0.999, nan}}) {
    remat::nn::Adam<float>::Options o{bad[0], bad[1], bad[2], bad[3]};
    EXPECT_THROW(remat::nn::Adam<float>({&p}, o), remat::domain_error);
  }
  for (const auto& bad : std::vector<std::vector<double>>{{-1e-3, 0.9, 0.999, 1e-8, 0.01},
                                                          {1e-3, 1.0, 0.999, 1e-8, 0.01},
                                                          {1e-3, 0.9, -0.5, 1e-8, 0.01},
                                                          {1e-3, 0.9, 0.999, 0, 0.01},
                                                          {1e-3, 0.9, 0.999, 1e-8, -0.01},
                                                          {1e-3, 0.9, 0.999, 1e-8, nan}}) {
    remat::nn::AdamW<float>::Options o{bad[0], bad[1], bad[2], bad[3], bad[4]};
    expect_error_naming<remat::domain_error>([&] { remat::nn::AdamW<float>({&p}, o); }, {"nn::AdamW"});
  }
  remat::nn::Adam<float> adam({&p});
  EXPECT_THROW(adam.set_learning_rate(0), remat::domain_error);
  EXPECT_THROW(adam.set_learning_rate(nan), remat::domain_error);
  EXPECT_EQ(adam.options().learning_rate, 1e-3);
  EXPECT_EQ(p.value(), MF::Ones(2, 2));
}

// Adam's first step moves every element by α·g/(|g| + ε) whatever β₁, β₂ (the bias corrections cancel
// (1 − β)): PyTorch's formula with m₁ = (1−β₁)g, v₁ = (1−β₂)g², hand-evaluated in double. A second step with
// β₁ = β₂ = 0 is again α·g/(|g| + ε) (m = g, v = g², corrections 1 − 0ᵗ = 1).
TEST(OptimizerClosedForms, AdamFirstStepIsLearningRateTimesSignAndZeroBetasKeepNoHistory) {
  for (const std::vector<double>& betas : std::vector<std::vector<double>>{{0.5, 0.25}, {0.9, 0.999}, {0.0, 0.0}}) {
    MD theta0(1, 4);
    theta0 << 1.0, -2.0, 0.5, 3.0;
    MD g(1, 4);
    g << 3.0, -2.0, 1e-3, 0.0;
    Parameter<double> p(theta0);
    remat::nn::Adam<double>::Options o;
    o.learning_rate = 0.1;
    o.beta1 = betas[0];
    o.beta2 = betas[1];
    remat::nn::Adam<double> adam({&p}, o);
    p.mutable_grad() = g;
    adam.step();
    for (int j = 0; j < 4; ++j)
      EXPECT_NEAR(p.value()(0, j), theta0(0, j) - 0.1 * g(0, j) / (std::abs(g(0, j)) + 1e-8), 1e-12);
    if (betas[0] == 0 && betas[1] == 0) {
      MD g2(1, 4);
      g2 << -1.0, 5.0, 2.0, 0.0;
      const MD theta1 = p.value();
      p.mutable_grad() = g2;
      adam.step();
      for (int j = 0; j < 4; ++j)
        EXPECT_NEAR(p.value()(0, j), theta1(0, j) - 0.1 * g2(0, j) / (std::abs(g2(0, j)) + 1e-8), 1e-12);
    }
  }
}

// torch.optim.AdamW: θ ← θ·(1 − αλ) before the Adam update; with zero gradients the update is 0, so after t steps
// θ = θ₀·(1 − αλ)ᵗ exactly (closed form, in double). The decay follows set_learning_rate, a group with λ = 0 does
// not decay, and nn::Adam (no decay) leaves θ bitwise unchanged under zero gradients.
TEST(OptimizerClosedForms, AdamWDecaysDecoupledFromTheGradientByLearningRateTimesLambda) {
  MD theta0(2, 2);
  theta0 << 1.0, -2.0, 4.0, 0.25;
  Parameter<double> decayed(theta0), undecayed(theta0), plain(theta0);
  remat::nn::AdamW<double>::Options o;
  o.learning_rate = 0.05;
  o.weight_decay = 0.2;
  remat::nn::AdamW<double> adamw({{{&decayed}}, {{&undecayed}, 0.0}}, o);
  remat::nn::Adam<double> adam({&plain});
  for (int t = 1; t <= 5; ++t) {
    decayed.mutable_grad() = MD::Zero(2, 2);
    undecayed.mutable_grad() = MD::Zero(2, 2);
    plain.mutable_grad() = MD::Zero(2, 2);
    adamw.step();
    adam.step();
  }
  const double factor = std::pow(1 - 0.05 * 0.2, 5);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(decayed.value().data()[i], theta0.data()[i] * factor, 1e-14);
  EXPECT_EQ(undecayed.value(), theta0);
  EXPECT_EQ(plain.value(), theta0);
  // α changed: the next decay is by 1 − α'λ.
  adamw.set_learning_rate(0.5);
  const MD before = decayed.value();
  decayed.mutable_grad() = MD::Zero(2, 2);
  adamw.step();
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(decayed.value().data()[i], before.data()[i] * (1 - 0.5 * 0.2), 1e-14);
  // α = 0 (allowed for AdamW): nothing moves, bitwise.
  adamw.set_learning_rate(0);
  const MD frozen = decayed.value();
  decayed.mutable_grad() = MD::Constant(2, 2, 3.0);
  adamw.step();
  EXPECT_EQ(decayed.value(), frozen);
}

// step() before any backward: no parameter has a gradient, so nothing changes (values and moments), while the
// step still counts (optimizer.hpp: "A parameter without a gradient ... is left unchanged (its state too) ... the
// step still counts in step_count()"). The same for an optimizer of no parameters.
TEST(OptimizerClosedForms, StepBeforeAnyBackwardChangesNothingButCounts) {
  Parameter<float> a(MF::Constant(2, 3, 0.5f)), b(MF::Constant(1, 3, -1.0f));
  remat::nn::Adam<float> adam({&a, &b});
  remat::nn::AdamW<float> adamw({&a, &b});
  remat::nn::SGD<float> sgd({&a, &b}, {0.1, 0.9, 0.1, true});
  adam.step();
  adamw.step();
  sgd.step();
  EXPECT_EQ(a.value(), MF::Constant(2, 3, 0.5f));
  EXPECT_EQ(b.value(), MF::Constant(1, 3, -1.0f));
  EXPECT_EQ(adam.first_moment(0), MF::Zero(2, 3));
  EXPECT_EQ(adamw.second_moment(1), MF::Zero(1, 3));
  EXPECT_EQ(sgd.momentum_buffer(0), MF::Zero(2, 3));
  EXPECT_EQ(adam.step_count(), 1u);
  EXPECT_EQ(sgd.step_count(), 1u);
  remat::nn::Adam<float> none(std::vector<Parameter<float>*>{});
  none.step();
  EXPECT_EQ(none.step_count(), 1u);
  expect_error_naming<remat::domain_error>([] { remat::nn::Adam<float>({nullptr}); }, {"nn::Adam", "null"});
}

// torch.optim.SGD (dampening 0): d = g + λθ; b = d at the first step, else μb + d; d = nesterov ? d + μb : b;
// θ ← θ − αd. Three steps hand-evaluated in double for plain, heavy-ball and Nesterov momentum.
TEST(OptimizerClosedForms, SGDMomentumAndNesterovFollowPyTorchsFormulaOverThreeSteps) {
  const double alpha = 0.1, mu = 0.9, lambda = 0.05;
  const double grads[3][2] = {{1.0, -2.0}, {0.5, 0.25}, {-3.0, 1.0}};
  for (int variant = 0; variant < 3; ++variant) {
    const bool momentum = variant > 0, nesterov = variant == 2;
    MD theta0(1, 2);
    theta0 << 2.0, -1.0;
    Parameter<double> p(theta0);
    remat::nn::SGD<double> sgd({&p}, {alpha, momentum ? mu : 0.0, lambda, nesterov});
    double theta[2] = {2.0, -1.0}, buffer[2] = {0, 0};
    for (int t = 0; t < 3; ++t) {
      MD g(1, 2);
      g << grads[t][0], grads[t][1];
      p.mutable_grad() = g;
      sgd.step();
      for (int j = 0; j < 2; ++j) {
        double d = grads[t][j] + lambda * theta[j];
        if (momentum) {
          buffer[j] = t == 0 ? d : mu * buffer[j] + d;
          d = nesterov ? d + mu * buffer[j] : buffer[j];
        }
        theta[j] -= alpha * d;
        EXPECT_NEAR(p.value()(0, j), theta[j], 1e-14) << "variant " << variant << " step " << t;
      }
    }
  }
  Parameter<float> q(MF::Ones(1, 1));
  expect_error_naming<remat::domain_error>(
      [&] {
        remat::nn::SGD<float>({&q}, {0.1, 0.0, 0.0, true});
      },
      {"nn::SGD", "nesterov"});
  expect_error_naming<remat::domain_error>(
      [&] {
        remat::nn::SGD<float>({&q}, {-0.1, 0.0, 0.0, false});
      },
      {"nn::SGD", "learning_rate -0.1"});
}

// torch.nn.utils.clip_grad_norm_: N = √Σg², scaled by c = max_norm/(N + 1e-6) when c < 1.
TEST(OptimizerClosedForms, ClipGradNormScalesByTorchsFactorAndHandlesZeroInfAndNaN) {
  Parameter<float> p(MF::Zero(1, 2)), q(MF::Zero(1, 2)), none(MF::Zero(1, 1));
  MF gp(1, 2), gq(1, 2);
  gp << 3.0f, 4.0f;
  gq << 0.0f, 12.0f;
  p.mutable_grad() = gp;
  q.mutable_grad() = gq;
  EXPECT_DOUBLE_EQ(remat::nn::clip_grad_norm<float>({&p, &q, &none}, 6.5), 13.0);
  const float c = static_cast<float>(6.5 / (13.0 + 1e-6));
  EXPECT_EQ(p.grad()(0, 0), 3.0f * c);
  EXPECT_EQ(p.grad()(0, 1), 4.0f * c);
  EXPECT_EQ(q.grad()(0, 1), 12.0f * c);
  EXPECT_FALSE(none.has_grad());  // skipped, not created
  // Below the bound: unchanged. All zero: norm 0, unchanged.
  p.mutable_grad() = gp;
  EXPECT_DOUBLE_EQ(remat::nn::clip_grad_norm<float>({&p}, 5.1), 5.0);
  EXPECT_EQ(MF(p.grad()), gp);
  p.mutable_grad() = MF::Zero(1, 2);
  EXPECT_DOUBLE_EQ(remat::nn::clip_grad_norm<float>({&p}, 1.0), 0.0);
  EXPECT_EQ(MF(p.grad()), MF::Zero(1, 2));
  // An infinite gradient: N = inf, unchanged (or domain_error with error_if_nonfinite).
  MF ginf = gp;
  ginf(0, 1) = std::numeric_limits<float>::infinity();
  p.mutable_grad() = ginf;
  EXPECT_TRUE(std::isinf(remat::nn::clip_grad_norm<float>({&p}, 1.0)));
  EXPECT_EQ(MF(p.grad()), ginf);
  expect_error_naming<remat::domain_error>([&] { remat::nn::clip_grad_norm<float>({&p}, 1.0, true); },
                                           {"clip_grad_norm", "inf"});
  // Float gradients whose float squared norm would overflow (1e20² > FLT_MAX) are measured in double.
  p.mutable_grad() = MF::Constant(1, 2, 1e20f);
  EXPECT_NEAR(remat::nn::clip_grad_norm<float>({&p}, 1.0), std::sqrt(2.0) * static_cast<double>(1e20f), 1e6);
  EXPECT_NEAR(MF(p.grad()).norm(), 1.0, 1e-6);
  for (const double bad : {-1.0, std::nan("")})
    expect_error_naming<remat::domain_error>([&] { remat::nn::clip_grad_norm<float>({&p}, bad); },
                                             {"clip_grad_norm", "max_norm"});
}

// The schedule's closed form (warmup_cosine_schedule.hpp), evaluated independently.
TEST(OptimizerClosedForms, WarmupCosineScheduleMatchesItsClosedFormAndRefusesBadStepCounts) {
  const double pi = std::acos(-1.0);
  const remat::nn::WarmupCosineSchedule s(1.0, 10, 110, 0.1);
  for (std::uint64_t t : {0, 1, 5, 9}) EXPECT_DOUBLE_EQ(s.at(t), (t + 1) / 10.0);
  for (std::uint64_t t : {10, 11, 35, 60, 100, 109})
    EXPECT_NEAR(s.at(t), 0.1 + 0.45 * (1 + std::cos(pi * (t - 10.0) / 100.0)), 1e-14);
  EXPECT_NEAR(s.at(60), 0.55, 1e-14);
  for (std::uint64_t t : {std::uint64_t{110}, std::uint64_t{1} << 40, std::numeric_limits<std::uint64_t>::max()})
    EXPECT_EQ(s.at(t), 0.1);
  expect_error_naming<remat::domain_error>([] { remat::nn::WarmupCosineSchedule(1.0, 20, 10); },
                                           {"WarmupCosineSchedule", "warmup_steps 20", "total_steps 10"});
  expect_error_naming<remat::domain_error>([] { remat::nn::WarmupCosineSchedule(1.0, 0, 0); }, {"total_steps 0"});
  expect_error_naming<remat::domain_error>([] { remat::nn::WarmupCosineSchedule(1.0, 0, -5); }, {"total_steps -5"});
  expect_error_naming<remat::domain_error>([] { remat::nn::WarmupCosineSchedule(1.0, 0, 5, 2.0); }, {"min_lr 2"});
  expect_error_naming<remat::domain_error>([] { remat::nn::WarmupCosineSchedule(1.0, 0, 5, -1e-9); },
                                           {"min_lr -1e-09"});
  expect_error_naming<remat::domain_error>(
      [] { remat::nn::WarmupCosineSchedule(std::numeric_limits<double>::infinity(), 0, 5); }, {"peak_lr inf"});
  expect_error_naming<remat::domain_error>([] { remat::nn::WarmupCosineSchedule(-1.0, 0, 5); }, {"peak_lr -1"});
}

}  // namespace optimizer_closed_forms_test
