// Tests of the training pieces a GPT needs (include/remat/nn): nn::AdamW and nn::SGD against hand-written
// references and against PyTorch 1.13, saving and restoring their state, nn::clip_grad_norm and
// nn::WarmupCosineSchedule.
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
#include <remat/nn/clip_grad_norm.hpp>
#include <remat/nn/linear.hpp>
#include <remat/nn/sgd.hpp>
#include <remat/nn/warmup_cosine_schedule.hpp>
#include <remat/remat.hpp>

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

// ---- saving and restoring the state ----

// Gradient of Σ θ⁴/4 − cos(t)·θ at the current parameter values, written into the parameters.
void set_gradients(const std::vector<Parameter<float>*>& parameters, std::uint64_t t) {
  for (Parameter<float>* p : parameters) {
    auto g = p->mutable_grad();
    for (remat::Index i = 0; i < g.size(); ++i)
      g.data()[i] = std::pow(p->value().data()[i], 3.0f) - static_cast<float>(std::cos(static_cast<double>(t) + i));
  }
}

std::vector<Parameter<float>> make_parameters() {
  remat::nn::Generator random(11);
  std::vector<Parameter<float>> parameters;
  for (remat::Index cols : {3, 700, 1}) {  // 700 · 2: more than one 512-element block
    Matrix<float> m(2, cols);
    for (remat::Index i = 0; i < m.size(); ++i) m.data()[i] = static_cast<float>(random.uniform() * 2 - 1);
    parameters.emplace_back(m);
  }
  return parameters;
}

std::vector<Parameter<float>*> pointers(std::vector<Parameter<float>>& parameters) {
  std::vector<Parameter<float>*> result;
  for (auto& p : parameters) result.push_back(&p);
  return result;
}

// Trains 2N steps in one run, and N steps, then copies the parameters and the optimizer's state (through
// `copy_state`, the public accessors) into fresh ones that train the other N: the two must agree bitwise.
// make(pointers) builds an optimizer; a warm-up-cosine schedule sets the learning rate every step.
template <class Make, class CopyState>
void expect_resume_is_bitwise(Make make, CopyState copy_state) {
  constexpr std::uint64_t n = 6;
  const nn::WarmupCosineSchedule schedule(0.05, 3, 2 * n, 0.005);
  auto train = [&](auto& optimizer, std::vector<Parameter<float>*> parameters, std::uint64_t steps) {
    for (std::uint64_t i = 0; i < steps; ++i) {
      optimizer.zero_grad();
      set_gradients(parameters, optimizer.step_count());
      optimizer.set_learning_rate(schedule.at(optimizer.step_count()));
      optimizer.step();
    }
  };
  std::vector<Parameter<float>> uninterrupted = make_parameters();
  auto one = make(pointers(uninterrupted));
  train(one, pointers(uninterrupted), 2 * n);

  std::vector<Parameter<float>> first_half = make_parameters();
  auto before = make(pointers(first_half));
  train(before, pointers(first_half), n);
  std::vector<Parameter<float>> resumed;  // as if loaded from a file: new Parameters with the values
  for (std::size_t k = 0; k < before.size(); ++k) resumed.emplace_back(before.value(k));
  auto after = make(pointers(resumed));
  const auto& saved = before;  // read through the const accessors
  copy_state(saved, after);
  EXPECT_EQ(after.step_count(), n);
  train(after, pointers(resumed), n);

  ASSERT_EQ(resumed.size(), uninterrupted.size());
  for (std::size_t k = 0; k < resumed.size(); ++k)
    EXPECT_TRUE(same_bits(resumed[k].value(), uninterrupted[k].value())) << "parameter " << k;
  EXPECT_EQ(after.step_count(), one.step_count());
}

TEST(OptimizerState, AdamWResumesBitwise) {
  auto make = [](std::vector<Parameter<float>*> p) {
    nn::AdamW<float>::Options o;
    o.weight_decay = 0.1;
    return nn::AdamW<float>({{{p[0], p[1]}}, {{p[2]}, 0.0}}, o);
  };
  expect_resume_is_bitwise(make, [](const nn::AdamW<float>& from, nn::AdamW<float>& to) {
    to.step_count() = from.step_count();
    for (std::size_t k = 0; k < from.size(); ++k) {
      to.first_moment(k) = from.first_moment(k);
      to.second_moment(k) = from.second_moment(k);
    }
  });
}

TEST(OptimizerState, AdamResumesBitwise) {
  auto make = [](std::vector<Parameter<float>*> p) { return nn::Adam<float>(p); };
  expect_resume_is_bitwise(make, [](const nn::Adam<float>& from, nn::Adam<float>& to) {
    to.step_count() = from.step_count();
    for (std::size_t k = 0; k < from.size(); ++k) {
      to.first_moment(k) = from.first_moment(k);
      to.second_moment(k) = from.second_moment(k);
    }
  });
}

TEST(OptimizerState, SGDResumesBitwise) {
  for (bool nesterov : {false, true}) {
    auto make = [nesterov](std::vector<Parameter<float>*> p) {
      nn::SGD<float>::Options o;
      o.momentum = 0.9;
      o.weight_decay = 0.01;
      o.nesterov = nesterov;
      return nn::SGD<float>(p, o);
    };
    expect_resume_is_bitwise(make, [](const nn::SGD<float>& from, nn::SGD<float>& to) {
      to.step_count() = from.step_count();
      for (std::size_t k = 0; k < from.size(); ++k) to.momentum_buffer(k) = from.momentum_buffer(k);
    });
  }
}

TEST(OptimizerState, WithoutTheStateTheResumedRunDiffers) {
  // The resume test would be vacuous if the state did not matter: without copying it, the parameters differ.
  std::vector<Parameter<float>> a = make_parameters(), b = make_parameters();
  nn::AdamW<float> one(pointers(a)), two(pointers(b));
  for (int i = 0; i < 2; ++i) {
    set_gradients(pointers(a), one.step_count());
    one.step();
  }
  nn::AdamW<float> fresh(pointers(b));
  set_gradients(pointers(b), 0);
  two.step();
  set_gradients(pointers(b), 1);
  fresh.step();
  EXPECT_FALSE(same_bits(a[1].value(), b[1].value()));
}

// ---- clip_grad_norm ----

TEST(ClipGradNorm, ReturnsTheGlobalNormAndScalesOnlyAboveTheBound) {
  Parameter<double> a(Matrix<double>::Zero(1, 2)), b(Matrix<double>::Zero(2, 1)), idle(Matrix<double>::Zero(1, 1));
  auto set = [&] {
    a.mutable_grad() << 3, -4;
    b.mutable_grad() << 12, 0;
  };
  set();
  const std::vector<Parameter<double>*> all = {&a, &idle, &b};
  // √(9 + 16 + 144 + 0) = 13, exact; idle has no gradient and is skipped.
  EXPECT_EQ(nn::clip_grad_norm(all, 13.5), 13.0);
  EXPECT_EQ(a.grad()(0, 0), 3.0) << "13 + 1e-6 < 13.5: unchanged";
  EXPECT_EQ(b.grad()(0, 0), 12.0);
  EXPECT_FALSE(idle.has_grad());

  EXPECT_EQ(nn::clip_grad_norm(all, 6.5), 13.0);
  const double factor = 6.5 / (13.0 + 1e-6);
  EXPECT_EQ(a.grad()(0, 0), 3.0 * factor);
  EXPECT_EQ(a.grad()(0, 1), -4.0 * factor);
  EXPECT_EQ(b.grad()(0, 0), 12.0 * factor);
  EXPECT_EQ(b.grad()(1, 0), 0.0);
  EXPECT_FALSE(idle.has_grad()) << "still no gradient";
  EXPECT_NEAR(nn::clip_grad_norm(all, std::numeric_limits<double>::infinity()), 6.5, 1e-6);

  EXPECT_EQ(nn::clip_grad_norm(std::vector<Parameter<double>*>{&idle}, 1.0), 0.0) << "no gradients";
}

TEST(ClipGradNorm, TheNormIsTheHandSumOfSquaresOfFloatGradients) {
  remat::nn::Generator random(3);
  std::vector<Parameter<float>> parameters;
  double sum = 0;
  for (remat::Index cols : {1, 17, 1000}) {
    Parameter<float> p(Matrix<float>::Zero(3, cols));
    auto g = p.mutable_grad();
    for (remat::Index i = 0; i < g.size(); ++i) {
      g.data()[i] = static_cast<float>(random.uniform() * 4 - 2);
      sum += static_cast<double>(g.data()[i]) * g.data()[i];
    }
    parameters.push_back(std::move(p));
  }
  std::vector<Parameter<float>*> list;
  for (auto& p : parameters) list.push_back(&p);
  const double norm = nn::clip_grad_norm(list, 1.0);
  EXPECT_NEAR(norm, std::sqrt(sum), 1e-14 * std::sqrt(sum)) << "summed in double, in another order";
  double after = 0;
  for (auto& p : parameters) after += p.grad().cast<double>().squaredNorm();
  EXPECT_NEAR(std::sqrt(after), 1.0, 1e-6);
}

TEST(ClipGradNorm, ANonFiniteNormLeavesTheGradientsOrThrows) {
  for (double bad : {std::nan(""), std::numeric_limits<double>::infinity()}) {
    Parameter<double> a(Matrix<double>::Zero(1, 2)), b(Matrix<double>::Zero(1, 1));
    a.mutable_grad() << 1, bad;
    b.mutable_grad() << 5;
    const std::vector<Parameter<double>*> all = {&a, &b};
    const double norm = nn::clip_grad_norm(all, 1.0);
    EXPECT_FALSE(std::isfinite(norm));
    EXPECT_EQ(std::isnan(norm), std::isnan(bad));
    EXPECT_EQ(a.grad()(0, 0), 1.0) << "unchanged";
    EXPECT_EQ(b.grad()(0, 0), 5.0) << "unchanged";
    expect_throw_naming<remat::domain_error>([&] { nn::clip_grad_norm(all, 1.0, true); },
                                             {"nn::clip_grad_norm", std::isnan(bad) ? "nan" : "inf"});
    EXPECT_EQ(b.grad()(0, 0), 5.0) << "unchanged";
  }
}

TEST(ClipGradNorm, RejectsBadArgumentsChangingNothing) {
  Parameter<double> a(Matrix<double>::Zero(1, 1));
  a.mutable_grad() << 10;
  expect_throw_naming<remat::domain_error>([&] { nn::clip_grad_norm(std::vector<Parameter<double>*>{&a}, -1.0); },
                                           {"nn::clip_grad_norm", "-1"});
  expect_throw_naming<remat::domain_error>(
      [&] { nn::clip_grad_norm(std::vector<Parameter<double>*>{&a}, std::nan("")); }, {"nn::clip_grad_norm", "nan"});
  expect_throw_naming<remat::domain_error>(
      [&] {
        nn::clip_grad_norm(std::vector<Parameter<double>*>{&a, nullptr}, 1.0);
      },
      {"nn::clip_grad_norm", "parameter 1", "null"});
  EXPECT_EQ(a.grad()(0, 0), 10.0);
}

// ---- WarmupCosineSchedule ----

TEST(WarmupCosineSchedule, RisesLinearlyThenFollowsTheCosineDownToTheMinimum) {
  const double peak = 6e-4, min = 6e-5;
  const nn::WarmupCosineSchedule s(peak, 10, 110, min);
  EXPECT_DOUBLE_EQ(s.at(0), peak / 10);
  EXPECT_DOUBLE_EQ(s.at(4), peak * 5 / 10);
  EXPECT_DOUBLE_EQ(s.at(9), peak) << "warmup − 1: the warm-up ends at peak";
  EXPECT_DOUBLE_EQ(s.at(10), peak) << "warmup: the decay starts at peak";
  EXPECT_DOUBLE_EQ(s.at(35), min + 0.5 * (peak - min) * (1 + std::cos(M_PI * 0.25)));
  EXPECT_NEAR(s.at(60), (peak + min) / 2, 1e-18) << "midpoint";
  EXPECT_DOUBLE_EQ(s.at(109), min + 0.5 * (peak - min) * (1 - std::cos(M_PI / 100)));
  EXPECT_GT(s.at(109), min);
  EXPECT_EQ(s.at(110), min) << "total";
  EXPECT_EQ(s.at(111), min);
  EXPECT_EQ(s.at(std::uint64_t{1} << 62), min) << "beyond";
  for (std::uint64_t t = 0; t < 9; ++t) EXPECT_LT(s.at(t), s.at(t + 1)) << t;
  for (std::uint64_t t = 10; t < 110; ++t) EXPECT_GT(s.at(t), s.at(t + 1)) << t;
  EXPECT_EQ(s.peak_lr(), peak);
  EXPECT_EQ(s.min_lr(), min);
  EXPECT_EQ(s.warmup_steps(), 10u);
  EXPECT_EQ(s.total_steps(), 110u);
}

TEST(WarmupCosineSchedule, NoWarmupStartsAtThePeakAndTheMinimumDefaultsToZero) {
  const nn::WarmupCosineSchedule s(1.0, 0, 4);
  EXPECT_EQ(s.at(0), 1.0);
  EXPECT_DOUBLE_EQ(s.at(2), 0.5);
  EXPECT_EQ(s.at(4), 0.0);
  const nn::WarmupCosineSchedule one(1.0, 1, 2);  // one warm-up step, one decay step
  EXPECT_EQ(one.at(0), 1.0);
  EXPECT_EQ(one.at(1), 1.0);
  EXPECT_EQ(one.at(2), 0.0);
}

TEST(WarmupCosineSchedule, RejectsBadArgumentsNamingThem) {
  using S = nn::WarmupCosineSchedule;
  expect_throw_naming<remat::domain_error>([] { S(0.0, 1, 10); }, {"nn::WarmupCosineSchedule", "peak_lr 0"});
  expect_throw_naming<remat::domain_error>([] { S(std::numeric_limits<double>::infinity(), 1, 10); }, {"peak_lr inf"});
  expect_throw_naming<remat::domain_error>([] { S(std::nan(""), 1, 10); }, {"peak_lr nan"});
  expect_throw_naming<remat::domain_error>([] { S(1e-3, 1, 10, 2e-3); }, {"min_lr 0.002"});
  expect_throw_naming<remat::domain_error>([] { S(1e-3, 1, 10, -1e-4); }, {"min_lr -1e-04"});
  expect_throw_naming<remat::domain_error>([] { S(1e-3, 1, 10, std::nan("")); }, {"min_lr nan"});
  expect_throw_naming<remat::domain_error>([] { S(1e-3, -1, 10); }, {"warmup_steps -1"});
  expect_throw_naming<remat::domain_error>([] { S(1e-3, 10, 10); }, {"warmup_steps 10", "total_steps 10"});
  expect_throw_naming<remat::domain_error>([] { S(1e-3, 10, 5); }, {"total_steps 5"});
  EXPECT_NO_THROW(S(1e-3, 0, 1, 1e-3));
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

// The schedule's documented values, exactly: lr(W − 1) = lr(W) = peak, never above peak, never below min.
// peak · (t+1) / W rounded above peak for peak 0.1 and W = 3 (0.10000000000000002), in 42 of 1400 pairs.
TEST(WarmupCosineSchedule, TheWarmUpEndsExactlyAtThePeakAndNoRateLeavesMinToPeak) {
  for (const double peak : {0.1, 6e-4, 3e-4, 0.3, 0.7, 1e-3})
    for (const double min : {0.0, peak / 10, peak / 3})
      for (std::int64_t w = 1; w <= 60; ++w) {
        const nn::WarmupCosineSchedule s(peak, w, w + 37, min);
        ASSERT_EQ(s.at(static_cast<std::uint64_t>(w - 1)), peak) << "peak " << peak << " W " << w;
        ASSERT_EQ(s.at(static_cast<std::uint64_t>(w)), peak) << "peak " << peak << " W " << w;
        for (std::uint64_t t = 0; t < static_cast<std::uint64_t>(w + 40); ++t) {
          ASSERT_LE(s.at(t), peak) << "peak " << peak << " min " << min << " W " << w << " t " << t;
          if (t < static_cast<std::uint64_t>(w))
            ASSERT_GT(s.at(t), 0.0) << "peak " << peak << " W " << w << " t " << t;
          else
            ASSERT_GE(s.at(t), min) << "peak " << peak << " min " << min << " W " << w << " t " << t;
        }
      }
}

// "In (0, peak_lr] during warm-up" also for a tiny peak over a long warm-up, whose product rounded to 0.
TEST(WarmupCosineSchedule, WarmUpRatesStayPositiveForATinyPeak) {
  EXPECT_GT(nn::WarmupCosineSchedule(5e-324, 2, 4).at(0), 0.0);
  EXPECT_GT(nn::WarmupCosineSchedule(1e-310, std::int64_t{1} << 62, INT64_MAX).at(0), 0.0);
  EXPECT_LE(nn::WarmupCosineSchedule(5e-324, 2, 4).at(0), 5e-324);
}

// below(0) divided by zero (SIGFPE): the empty range is a typed error.
TEST(Generator, BelowZeroThrowsDomainError) {
  nn::Generator g(1);
  expect_throw_naming<remat::domain_error>([&] { (void)g.below(0); }, {"nn::Generator::below", "0"});
  EXPECT_LT(g.below(1), 1u);
}

// clip_grad_norm in float leaves the norm at max_norm up to float rounding (it ended above max_norm in 982 of
// 2000 random trials, by at most 5.9e-8 relative): the doc's bound, checked in double.
TEST(ClipGradNorm, FloatClippedNormIsMaxNormToFloatPrecision) {
  nn::Generator random(1);
  for (int trial = 0; trial < 200; ++trial) {
    Parameter<float> p(Matrix<float>::Zero(1, 37));
    auto g = p.mutable_grad();
    for (int i = 0; i < 37; ++i) g(0, i) = static_cast<float>((random.uniform() * 20 - 10) * 1000);
    const double max_norm = 1.0 + trial * 1e-3;
    nn::clip_grad_norm<float>({&p}, max_norm);
    const double norm = p.grad().cast<double>().norm();
    ASSERT_LE(std::abs(norm - max_norm), 1e-6 * max_norm) << "trial " << trial;
  }
}

}  // namespace optimizer_test
