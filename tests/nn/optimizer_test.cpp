// nn::AdamW, nn::Adam and nn::SGD against hand-written references of their papers' algorithms and against
// PyTorch 1.13 (values printed by tests/nn/make_optimizer_reference.py), parameter groups, skipped parameters,
// bad arguments refused naming them, and float settings that round badly refused.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <remat/nn/adam.hpp>
#include <remat/nn/adamw.hpp>
#include <remat/nn/linear.hpp>
#include <remat/nn/sgd.hpp>
#include <remat/remat.hpp>

// Named after the file: this directory's test files are compiled as one translation unit (tests/CMakeLists.txt).
namespace optimizer_test {

using remat::Matrix;
using remat::Parameter;
namespace nn = remat::nn;

// ---- fixed inputs, the same as tests/nn/make_optimizer_reference.py's START and GRADIENTS ----

const std::vector<double> start_values = {0.5, -1.25, 2.0, 0.0, 3.0, -0.75};
const std::vector<std::vector<double>> gradient_values = {
    {0.1, -2.0, 0.5, 1e-3, 0.0, -0.3},
    {-0.4, 1.5, 0.25, 2e-3, -1.0, 0.7},
    {0.3, 0.5, -1.0, -5e-3, 2.0, 0.0},
};

Matrix<double> as_matrix(const std::vector<double>& values) {
  Matrix<double> m(2, 3);
  for (int i = 0; i < 6; ++i) m.data()[i] = values[static_cast<std::size_t>(i)];
  return m;
}

// Values printed by tests/nn/make_optimizer_reference.py with torch 1.13.0a0 (Debian's, /usr/bin/python3):
// the parameter (row-major) after 3 steps from start_values with gradient_values, in double.
const std::vector<double> torch_adam = {0.45472732305024477, -1.1585831963242381, 1.8381638844606578,
                                        -0.1624564021853897, 3.0404281095101404,  -0.73170167600777147};
const std::vector<double> torch_adamw_default = {0.49951819987199109,    -1.2489308713015121, 1.9982142073505482,
                                                 -0.0016863614919500167, 3.000339844104615,   -0.74972250596410961};
const std::vector<double> torch_adamw = {0.39012260906277868,  -0.99020918686440862, 1.5672384894106572,
                                         -0.14780754266348006, 2.6086345772657804,   -0.63211422502420012};
const std::vector<double> torch_adamw_no_decay = {0.45472732305024477, -1.1585831963242381, 1.8381638844606578,
                                                  -0.1624564021853897, 3.0404281095101404,  -0.73170167600777147};
const std::vector<double> torch_sgd = {
    0.5, -1.25, 2.0249999999999999, 0.00020000000000000001, 2.8999999999999999, -0.78999999999999992};
const std::vector<double> torch_sgd_momentum = {0.50492468749999997,     -1.0111323437499999, 1.8622135,
                                                -0.00014810250000000017, 2.9057096250000001,  -0.78097165625000009};
const std::vector<double> torch_sgd_nesterov = {0.49685210656250006,    -1.0213835082812499, 1.8735208614999999,
                                                7.2841852499999917e-05, 2.7695005278749996,  -0.80688243771875001};

// |actual − expected| ≤ relative·|expected| for each element.
void expect_relative(const Matrix<double>& actual, const std::vector<double>& expected, double relative,
                     const std::string& what) {
  ASSERT_EQ(actual.size(), static_cast<remat::Index>(expected.size())) << what;
  for (std::size_t i = 0; i < expected.size(); ++i)
    EXPECT_LE(std::abs(actual.data()[i] - expected[i]), relative * std::abs(expected[i]))
        << what << " element " << i << ": " << actual.data()[i] << " vs " << expected[i];
}

// Three steps of `optimizer` on `p` (made from start_values) with gradient_values, through step(gradients).
template <class Optimizer>
void three_steps(Optimizer& optimizer) {
  for (const auto& g : gradient_values) optimizer.step(std::vector<Matrix<double>>{as_matrix(g)});
}

bool same_bits(const Matrix<float>& a, const Matrix<float>& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() &&
         std::memcmp(a.data(), b.data(), static_cast<std::size_t>(a.size()) * sizeof(float)) == 0;
}
bool same_bits(const Matrix<double>& a, const Matrix<double>& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() &&
         std::memcmp(a.data(), b.data(), static_cast<std::size_t>(a.size()) * sizeof(double)) == 0;
}

// Expects `f` to throw E with a message containing each of `parts`.
template <class E, class F>
void expect_throw_naming(F&& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no exception";
  } catch (const E& e) {
    for (const auto& part : parts) EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

// ---- AdamW ----

// Loshchilov & Hutter 2019, Algorithm 2 as torch applies it (decay α·λ·θ, bias-corrected m̂ and v̂),
// written out per element in double.
std::vector<double> reference_adamw(double alpha, double beta1, double beta2, double epsilon, double lambda) {
  std::vector<double> theta = start_values, m(6, 0.0), v(6, 0.0);
  for (int t = 1; t <= 3; ++t) {
    const std::vector<double>& g = gradient_values[static_cast<std::size_t>(t - 1)];
    for (std::size_t i = 0; i < 6; ++i) {
      theta[i] -= alpha * lambda * theta[i];
      m[i] = beta1 * m[i] + (1 - beta1) * g[i];
      v[i] = beta2 * v[i] + (1 - beta2) * g[i] * g[i];
      const double m_hat = m[i] / (1 - std::pow(beta1, t));
      const double v_hat = v[i] / (1 - std::pow(beta2, t));
      theta[i] -= alpha * m_hat / (std::sqrt(v_hat) + epsilon);
    }
  }
  return theta;
}

nn::AdamW<double>::Options adamw_options(double weight_decay) {
  nn::AdamW<double>::Options o;
  o.learning_rate = 0.1;
  o.beta1 = 0.8;
  o.beta2 = 0.99;
  o.epsilon = 1e-6;
  o.weight_decay = weight_decay;
  return o;
}

TEST(AdamW, ThreeStepsMatchTheHandWrittenAlgorithm) {
  for (double lambda : {0.0, 0.5}) {
    Parameter<double> p(as_matrix(start_values));
    nn::AdamW<double> adamw({&p}, adamw_options(lambda));
    three_steps(adamw);
    expect_relative(p.value(), reference_adamw(0.1, 0.8, 0.99, 1e-6, lambda), 1e-12,
                    "lambda " + std::to_string(lambda));
    EXPECT_EQ(adamw.step_count(), 3u);
  }
  Parameter<double> p(as_matrix(start_values));
  nn::AdamW<double> adamw({&p});  // torch's defaults
  three_steps(adamw);
  expect_relative(p.value(), reference_adamw(1e-3, 0.9, 0.999, 1e-8, 0.01), 1e-12, "defaults");
}

TEST(AdamW, ThreeStepsMatchPyTorch) {
  struct Case {
    nn::AdamW<double>::Options options;
    const std::vector<double>& expected;
    const char* name;
  };
  for (const Case& c : {Case{nn::AdamW<double>::Options{}, torch_adamw_default, "defaults"},
                        Case{adamw_options(0.5), torch_adamw, "lr 0.1, betas (0.8, 0.99), eps 1e-6, wd 0.5"},
                        Case{adamw_options(0.0), torch_adamw_no_decay, "wd 0"}}) {
    Parameter<double> p(as_matrix(start_values));
    nn::AdamW<double> adamw({&p}, c.options);
    three_steps(adamw);
    expect_relative(p.value(), c.expected, 1e-12, c.name);
  }
}

TEST(AdamW, DefaultsAreTorchs) {
  const nn::AdamW<float>::Options o;
  EXPECT_EQ(o.learning_rate, 1e-3);
  EXPECT_EQ(o.beta1, 0.9);
  EXPECT_EQ(o.beta2, 0.999);
  EXPECT_EQ(o.epsilon, 1e-8);
  EXPECT_EQ(o.weight_decay, 0.01);
}

TEST(Adam, ThreeStepsMatchPyTorch) {
  Parameter<double> p(as_matrix(start_values));
  nn::Adam<double>::Options o;
  o.learning_rate = 0.1;
  o.beta1 = 0.8;
  o.beta2 = 0.99;
  o.epsilon = 1e-6;
  nn::Adam<double> adam({&p}, o);
  three_steps(adam);
  expect_relative(p.value(), torch_adam, 1e-12, "adam");
}

TEST(AdamW, WithoutWeightDecayIsAdamBitwise) {
  remat::nn::Generator random(5);
  Matrix<float> start(7, 300);  // more than one 512-element block
  for (remat::Index i = 0; i < start.size(); ++i) start.data()[i] = static_cast<float>(random.uniform() - 0.5);
  Parameter<float> a(start), b(start);
  nn::Adam<float>::Options adam_options;
  adam_options.learning_rate = 0.05;
  nn::AdamW<float>::Options adamw_options;
  adamw_options.learning_rate = 0.05;
  adamw_options.weight_decay = 0;
  nn::Adam<float> adam({&a}, adam_options);
  nn::AdamW<float> adamw({&b}, adamw_options);
  for (int step = 0; step < 20; ++step) {
    Matrix<float> g(7, 300);
    for (remat::Index i = 0; i < g.size(); ++i) g.data()[i] = static_cast<float>(random.uniform() - 0.5);
    adam.step(std::vector<Matrix<float>>{g});
    adamw.step(std::vector<Matrix<float>>{g});
  }
  EXPECT_TRUE(same_bits(a.value(), b.value()));
  EXPECT_TRUE(same_bits(adam.first_moment(0), adamw.first_moment(0)));
  EXPECT_TRUE(same_bits(adam.second_moment(0), adamw.second_moment(0)));
}

TEST(AdamW, ParameterGroupsSetTheirOwnDecay) {
  Parameter<double> matrix(Matrix<double>::Constant(2, 2, 2.0)), bias(Matrix<double>::Constant(1, 2, 2.0)),
      gain(Matrix<double>::Constant(1, 2, 2.0));
  nn::AdamW<double>::Options o;
  o.learning_rate = 0.1;
  o.weight_decay = 0.3;
  nn::AdamW<double> adamw({{{&matrix}}, {{&bias}, 0.0}, {{&gain}, 0.5}}, o);
  ASSERT_EQ(adamw.size(), 3u);
  EXPECT_EQ(adamw.weight_decay(0), 0.3);  // the group sets none: Options::weight_decay
  EXPECT_EQ(adamw.weight_decay(1), 0.0);
  EXPECT_EQ(adamw.weight_decay(2), 0.5);
  // Zero gradients: m = v = 0, so the Adam part moves nothing and only the decay acts.
  for (int step = 0; step < 3; ++step) {
    for (Parameter<double>* p : {&matrix, &bias, &gain}) p->mutable_grad().setZero();
    adamw.step();
  }
  for (remat::Index i = 0; i < 4; ++i) EXPECT_EQ(matrix.value().data()[i], 2.0 * (1 - 0.03) * (1 - 0.03) * (1 - 0.03));
  EXPECT_TRUE(same_bits(bias.value(), Matrix<double>(Matrix<double>::Constant(1, 2, 2.0)))) << "not decayed";
  for (remat::Index i = 0; i < 2; ++i) EXPECT_EQ(gain.value().data()[i], 2.0 * (1 - 0.05) * (1 - 0.05) * (1 - 0.05));
}

TEST(AdamW, SkipsAParameterWithoutGradientEntirely) {
  Parameter<double> a(Matrix<double>::Ones(1, 3)), b(Matrix<double>::Ones(1, 3));
  nn::AdamW<double> adamw({&a, &b});
  a.mutable_grad().setConstant(0.5);
  adamw.step();
  EXPECT_LT(a.value()(0, 0), 1.0);
  EXPECT_TRUE(same_bits(b.value(), Matrix<double>(Matrix<double>::Ones(1, 3)))) << "no gradient: no decay either";
  EXPECT_TRUE(adamw.first_moment(1).isZero());
  EXPECT_EQ(b.version(), 0u);
}

TEST(AdamW, RejectsBadArgumentsNamingThemAndChangesNothing) {
  Parameter<float> p(Matrix<float>::Ones(2, 3));
  auto with = [](auto change) {
    nn::AdamW<float>::Options o;
    change(o);
    return o;
  };
  expect_throw_naming<remat::domain_error>(
      [&] { nn::AdamW<float>({&p}, with([](auto& o) { o.learning_rate = -1e-9; })); },
      {"nn::AdamW", "learning_rate -1e-09"});
  expect_throw_naming<remat::domain_error>([&] { nn::AdamW<float>({&p}, with([](auto& o) { o.beta1 = 1; })); },
                                           {"nn::AdamW", "beta1 1"});
  expect_throw_naming<remat::domain_error>([&] { nn::AdamW<float>({&p}, with([](auto& o) { o.beta2 = -0.5; })); },
                                           {"nn::AdamW", "beta2 -0.5"});
  expect_throw_naming<remat::domain_error>([&] { nn::AdamW<float>({&p}, with([](auto& o) { o.epsilon = 0; })); },
                                           {"nn::AdamW", "epsilon 0"});
  expect_throw_naming<remat::domain_error>(
      [&] { nn::AdamW<float>({&p}, with([](auto& o) { o.weight_decay = std::nan(""); })); },
      {"nn::AdamW", "weight_decay nan"});
  expect_throw_naming<remat::domain_error>([&] { nn::AdamW<float>({{{&p}, -0.1}}); }, {"nn::AdamW", "group 0", "-0.1"});
  expect_throw_naming<remat::domain_error>([&] { nn::AdamW<float>({&p, nullptr}); }, {"nn::AdamW", "null"});
  expect_throw_naming<remat::domain_error>(
      [&] {
        nn::AdamW<float>({{{&p}}, {{&p}, 0.0}});
      },
      {"nn::AdamW", "parameters 0 and 1"});

  nn::AdamW<float> adamw({&p});
  expect_throw_naming<remat::domain_error>([&] { adamw.set_learning_rate(-2); }, {"nn::AdamW", "-2"});
  EXPECT_THROW(adamw.set_learning_rate(std::numeric_limits<double>::infinity()), remat::domain_error);
  EXPECT_EQ(adamw.options().learning_rate, 1e-3) << "unchanged";
  adamw.set_learning_rate(0);  // allowed, as in torch: a schedule may end at 0
  EXPECT_EQ(adamw.options().learning_rate, 0.0);

  expect_throw_naming<remat::shape_error>([&] { adamw.step(std::vector<Matrix<float>>{Matrix<float>::Ones(3, 2)}); },
                                          {"nn::AdamW::step", "gradient 0 is [3,2]", "[2,3]"});
  expect_throw_naming<remat::shape_error>([&] { adamw.step(std::vector<Matrix<float>>{}); },
                                          {"nn::AdamW::step", "0 gradients for 1 parameters"});
  adamw.second_moment(0) = Matrix<float>::Zero(3, 2);  // a restored state that does not fit
  p.mutable_grad().setOnes();
  const std::uint64_t version = p.version();
  expect_throw_naming<remat::shape_error>([&] { adamw.step(); },
                                          {"nn::AdamW::step", "second moment of parameter 0 is [3,2]", "[2,3]"});
  EXPECT_EQ(adamw.step_count(), 0u);
  EXPECT_EQ(p.version(), version);
  EXPECT_TRUE(same_bits(p.value(), Matrix<float>(Matrix<float>::Ones(2, 3))));
  EXPECT_TRUE(adamw.first_moment(0).isZero());
}

// ---- SGD ----

// torch.optim.SGD's documented algorithm with dampening 0, written out per element in double.
std::vector<double> reference_sgd(double alpha, double mu, double lambda, bool nesterov) {
  std::vector<double> theta = start_values, b(6, 0.0);
  for (int t = 1; t <= 3; ++t) {
    const std::vector<double>& gradient = gradient_values[static_cast<std::size_t>(t - 1)];
    for (std::size_t i = 0; i < 6; ++i) {
      double g = gradient[i] + lambda * theta[i];
      if (mu != 0) {
        b[i] = t == 1 ? g : mu * b[i] + g;
        g = nesterov ? g + mu * b[i] : b[i];
      }
      theta[i] -= alpha * g;
    }
  }
  return theta;
}

nn::SGD<double>::Options sgd_options(double momentum, double weight_decay, bool nesterov) {
  nn::SGD<double>::Options o;
  o.learning_rate = 0.1;
  o.momentum = momentum;
  o.weight_decay = weight_decay;
  o.nesterov = nesterov;
  return o;
}

TEST(SGD, ThreeStepsMatchTheHandWrittenAlgorithm) {
  for (double mu : {0.0, 0.9})
    for (double lambda : {0.0, 0.05})
      for (bool nesterov : {false, true}) {
        if (nesterov && mu == 0) continue;
        Parameter<double> p(as_matrix(start_values));
        nn::SGD<double> sgd({&p}, sgd_options(mu, lambda, nesterov));
        three_steps(sgd);
        expect_relative(p.value(), reference_sgd(0.1, mu, lambda, nesterov), 1e-12,
                        "momentum " + std::to_string(mu) + ", weight_decay " + std::to_string(lambda) +
                            (nesterov ? ", nesterov" : ""));
      }
}

TEST(SGD, ThreeStepsMatchPyTorch) {
  struct Case {
    nn::SGD<double>::Options options;
    const std::vector<double>& expected;
    const char* name;
  };
  for (const Case& c : {Case{sgd_options(0, 0, false), torch_sgd, "lr 0.1"},
                        Case{sgd_options(0.9, 0.05, false), torch_sgd_momentum, "momentum 0.9, weight_decay 0.05"},
                        Case{sgd_options(0.9, 0.05, true), torch_sgd_nesterov, "nesterov"}}) {
    Parameter<double> p(as_matrix(start_values));
    nn::SGD<double> sgd({&p}, c.options);
    three_steps(sgd);
    expect_relative(p.value(), c.expected, 1e-12, c.name);
  }
}

TEST(SGD, TheFirstStepSetsTheBufferToTheGradientAndPlainSGDKeepsNone) {
  Parameter<double> p(as_matrix(start_values));
  nn::SGD<double> sgd({&p}, sgd_options(0.9, 0.05, false));
  EXPECT_TRUE(sgd.momentum_buffer(0).isZero());
  sgd.step(std::vector<Matrix<double>>{as_matrix(gradient_values[0])});
  const Matrix<double> expected = as_matrix(gradient_values[0]) + 0.05 * as_matrix(start_values);
  EXPECT_TRUE(same_bits(sgd.momentum_buffer(0), expected)) << "b = g + λθ, as torch's clone";

  Parameter<double> q(as_matrix(start_values));
  nn::SGD<double> plain({&q}, sgd_options(0, 0, false));
  EXPECT_EQ(plain.momentum_buffer(0).size(), 0);
  plain.step(std::vector<Matrix<double>>{as_matrix(gradient_values[0])});
  EXPECT_TRUE(same_bits(q.value(), Matrix<double>(as_matrix(start_values) - 0.1 * as_matrix(gradient_values[0]))));
}

TEST(SGD, ParameterGroupsSetTheirOwnDecayAndAParameterWithoutGradientStays) {
  Parameter<double> w(Matrix<double>::Constant(1, 2, 1.0)), b(Matrix<double>::Constant(1, 2, 1.0)),
      idle(Matrix<double>::Constant(1, 2, 1.0));
  nn::SGD<double>::Options o = sgd_options(0.9, 0.5, false);
  nn::SGD<double> sgd({{{&w, &idle}}, {{&b}, 0.0}}, o);
  EXPECT_EQ(sgd.weight_decay(0), 0.5);
  EXPECT_EQ(sgd.weight_decay(1), 0.5);
  EXPECT_EQ(sgd.weight_decay(2), 0.0);
  w.mutable_grad().setZero();
  b.mutable_grad().setZero();
  sgd.step();
  EXPECT_EQ(w.value()(0, 0), 1.0 - 0.1 * 0.5);  // g = 0 + λθ
  EXPECT_EQ(b.value()(0, 0), 1.0);
  EXPECT_EQ(idle.value()(0, 0), 1.0);
  EXPECT_TRUE(sgd.momentum_buffer(1).isZero());
}

TEST(SGD, RejectsBadArgumentsNamingThemAndChangesNothing) {
  Parameter<float> p(Matrix<float>::Ones(2, 3));
  auto with = [](double lr, double momentum, double weight_decay, bool nesterov) {
    nn::SGD<float>::Options o;
    o.learning_rate = lr;
    o.momentum = momentum;
    o.weight_decay = weight_decay;
    o.nesterov = nesterov;
    return o;
  };
  expect_throw_naming<remat::domain_error>([&] { nn::SGD<float>({&p}, with(0.1, 0, 0, true)); },
                                           {"nn::SGD", "momentum 0", "nesterov true"});
  expect_throw_naming<remat::domain_error>([&] { nn::SGD<float>({&p}, with(0.1, -0.9, 0, false)); },
                                           {"nn::SGD", "momentum -0.9"});
  expect_throw_naming<remat::domain_error>([&] { nn::SGD<float>({&p}, with(std::nan(""), 0.9, 0, false)); },
                                           {"nn::SGD", "learning_rate nan"});
  expect_throw_naming<remat::domain_error>([&] { nn::SGD<float>({&p}, with(0.1, 0.9, -1, false)); },
                                           {"nn::SGD", "weight_decay -1"});
  expect_throw_naming<remat::domain_error>([&] { nn::SGD<float>({{{&p}, -3.0}}); }, {"nn::SGD", "group 0", "-3"});
  expect_throw_naming<remat::domain_error>([&] { nn::SGD<float>({nullptr}); }, {"nn::SGD", "null"});
  expect_throw_naming<remat::domain_error>([&] { nn::SGD<float>({&p, &p}); }, {"nn::SGD", "parameters 0 and 1"});

  nn::SGD<float> sgd({&p}, with(0.1, 0.9, 0, true));
  expect_throw_naming<remat::domain_error>([&] { sgd.set_learning_rate(-0.5); }, {"nn::SGD", "-0.5"});
  EXPECT_EQ(sgd.options().learning_rate, 0.1);
  expect_throw_naming<remat::shape_error>([&] { sgd.step(std::vector<Matrix<float>>{Matrix<float>::Ones(2, 2)}); },
                                          {"nn::SGD::step", "gradient 0 is [2,2]"});
  sgd.momentum_buffer(0) = Matrix<float>();
  p.mutable_grad().setOnes();
  expect_throw_naming<remat::shape_error>([&] { sgd.step(); },
                                          {"nn::SGD::step", "momentum buffer of parameter 0 is [0,0]", "[2,3]"});
  EXPECT_EQ(sgd.step_count(), 0u);
  EXPECT_EQ(p.version(), 0u);
  EXPECT_TRUE(same_bits(p.value(), Matrix<float>(Matrix<float>::Ones(2, 3))));
}

// ---- settings that are valid as doubles but not once rounded to float, where a float optimizer computes ----

// Each was accepted and then broke the update: β₁ = 0.99999999 is 1 in float (θ never moves), β₂ likewise (v
// stays 0: a step of −5e4 instead of −1e-3), ε = 1e-46 is 0 (0/0 for a zero gradient), α = 1e38 makes the
// first step's α/(1 − β₁) inf, α·λ = 1e40 makes AdamW's decay factor −inf in float (1e400 in double), and SGD's α, μ or
// λ = 1e39 is inf. Each must be refused naming the optimizer, the setting and float; the same settings in double stay
// valid.
TEST(Optimizers, FloatSettingsThatRoundBadlyAreRefusedNamingThem) {
  Parameter<float> p(Matrix<float>::Ones(1, 2));
  Parameter<double> q(Matrix<double>::Ones(1, 2));
  using A = nn::Adam<float>::Options;
  for (const auto& [o, setting] : std::vector<std::pair<A, std::string>>{{{1e-3, 0.99999999, 0.999, 1e-8}, "beta1"},
                                                                         {{1e-3, 0.9, 0.99999999, 1e-8}, "beta2"},
                                                                         {{1e-3, 0.9, 0.999, 1e-46}, "epsilon"},
                                                                         {{1e-3, 0.9, 0.999, 1e-40}, "subnormal"},
                                                                         {{1e-40, 0.9, 0.999, 1e-8}, "learning_rate"},
                                                                         {{1e-3, 0.9, 0.999, 1e39}, "epsilon"},
                                                                         {{1e38, 0.9, 0.999, 1e-8}, "learning_rate"}}) {
    expect_throw_naming<remat::domain_error>([&] { nn::Adam<float>(std::vector<Parameter<float>*>{&p}, o); },
                                             {"nn::Adam", setting, "float"});
    nn::AdamW<float>::Options w;
    w.learning_rate = o.learning_rate;
    w.beta1 = o.beta1;
    w.beta2 = o.beta2;
    w.epsilon = o.epsilon;
    expect_throw_naming<remat::domain_error>([&] { nn::AdamW<float>({&p}, w); }, {"nn::AdamW", setting, "float"});
    EXPECT_NO_THROW(
        nn::Adam<double>(std::vector<Parameter<double>*>{&q}, {o.learning_rate, o.beta1, o.beta2, o.epsilon}));
  }
  nn::Adam<float> adam(std::vector<Parameter<float>*>{&p});
  expect_throw_naming<remat::domain_error>([&] { adam.set_learning_rate(1e38); },
                                           {"nn::Adam", "learning_rate", "float"});
  // A step size that rounds to 0 in float would never move the parameters.
  expect_throw_naming<remat::domain_error>([&] { adam.set_learning_rate(1e-50); }, {"nn::Adam", "1e-50", "float"});
  EXPECT_EQ(adam.options().learning_rate, 1e-3);  // unchanged

  nn::AdamW<float>::Options w;
  w.learning_rate = 1e10;  // α/(1 − β₁) = 1e11 is a float, 1 − α·λ = −1e40 is not
  w.weight_decay = 1e30;
  expect_throw_naming<remat::domain_error>([&] { nn::AdamW<float>({&p}, w); }, {"nn::AdamW", "decay factor", "float"});
  nn::AdamW<double>::Options wd;
  wd.learning_rate = 1e200;
  wd.weight_decay = 1e200;  // 1 − α·λ = −inf in double too
  expect_throw_naming<remat::domain_error>([&] { nn::AdamW<double>({&q}, wd); },
                                           {"nn::AdamW", "decay factor", "double"});
  nn::AdamW<float> adamw({&p});
  expect_throw_naming<remat::domain_error>([&] { adamw.set_learning_rate(1e39); }, {"nn::AdamW", "float"});

  using O = nn::SGD<float>::Options;
  for (const auto& [o, setting] : std::vector<std::pair<O, std::string>>{{{1e39, 0, 0, false}, "learning_rate"},
                                                                         {{0.1, 1e39, 0, false}, "momentum"},
                                                                         {{0.1, 0, 1e39, false}, "weight_decay"}})
    expect_throw_naming<remat::domain_error>([&] { nn::SGD<float>({&p}, o); }, {"nn::SGD", setting, "float"});
  nn::SGD<float> sgd({&p});
  expect_throw_naming<remat::domain_error>([&] { sgd.set_learning_rate(1e39); }, {"nn::SGD", "learning_rate", "float"});
  expect_throw_naming<remat::domain_error>([&] { sgd.set_learning_rate(1e-40); }, {"nn::SGD", "subnormal", "float"});
  EXPECT_NO_THROW(sgd.set_learning_rate(0));  // a rate of 0 (a frozen phase) stays allowed
  EXPECT_NO_THROW(nn::SGD<double>({&q}, nn::SGD<double>::Options{1e39, 1e39, 1e39, false}));
}

// Adam in float against Kingma & Ba in double, one step from zero moments, where float can carry the settings:
// β₂ = 1 − 1e-7 with 1 − β₂ computed in float (1.19e-7, the float next to 1 − 0.99999988) made the step 8 %
// short; computed in double and rounded, as torch does, it is the paper's step to float precision. And the
// second moment after one step of g = 1 is float(1 − β₂) exactly, torch's value (not 1 − float(β₂), 111 ulps off
// for β₂ = 0.999).
TEST(Adam, FloatStepFollowsThePaperAndOneMinusBetaIsRoundedFromDouble) {
  for (const double beta2 : {0.999, 1 - 1e-7}) {
    Parameter<float> p(Matrix<float>::Ones(1, 2));
    nn::Adam<float>::Options o;
    o.beta2 = beta2;
    nn::Adam<float> adam(std::vector<Parameter<float>*>{&p}, o);
    adam.step(std::vector<Matrix<float>>{Matrix<float>{{0.5f, 0.0f}}});
    const double m = (1 - o.beta1) * 0.5, v = (1 - beta2) * 0.25;
    const double want = 1 - o.learning_rate * (m / (1 - o.beta1)) / (std::sqrt(v / (1 - beta2)) + o.epsilon);
    EXPECT_NEAR(p.value()(0, 0), want, 1e-6) << "beta2 " << beta2;
    EXPECT_EQ(p.value()(0, 1), 1.0f) << "a zero gradient moves nothing";
    EXPECT_EQ(adam.second_moment(0)(0, 0), static_cast<float>((1 - beta2) * 0.25f)) << "beta2 " << beta2;
  }
}

// The largest learning rate the float check accepts, α = 0.999·FLT_MAX·(1 − β₁), with a gradient of 100: the
// first step is −α·m̂/(√v̂ + ε) ≈ −α, finite. The update multiplied step_size by m before dividing, which
// overflowed to −inf for any gradient above 10.
TEST(Adam, TheLargestAcceptedFloatLearningRateGivesAFiniteFirstStep) {
  const double lr = static_cast<double>(std::numeric_limits<float>::max()) * (1 - 0.9) * 0.999;
  Parameter<float> p(Matrix<float>::Zero(1, 1));
  nn::Adam<float>::Options o;
  o.learning_rate = lr;
  nn::Adam<float> adam(std::vector<Parameter<float>*>{&p}, o);
  adam.step(std::vector<Matrix<float>>{Matrix<float>::Constant(1, 1, 100.0f)});
  ASSERT_TRUE(std::isfinite(p.value()(0, 0))) << p.value()(0, 0);
  EXPECT_NEAR(p.value()(0, 0) / -lr, 1.0, 1e-6);
}

}  // namespace optimizer_test
