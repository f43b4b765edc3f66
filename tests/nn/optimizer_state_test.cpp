// Saving and restoring the optimizers' state (nn::AdamW, nn::Adam, nn::SGD): a run resumed from the saved state
// is bitwise the uninterrupted run; without the state it differs.
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
#include <remat/nn/warmup_cosine_schedule.hpp>
#include <remat/remat.hpp>

// Named after the file: this directory's test files are compiled as one translation unit (tests/CMakeLists.txt).
namespace optimizer_state_test {

using remat::Matrix;
using remat::Parameter;
namespace nn = remat::nn;
bool same_bits(const Matrix<float>& a, const Matrix<float>& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() &&
         std::memcmp(a.data(), b.data(), static_cast<std::size_t>(a.size()) * sizeof(float)) == 0;
}
bool same_bits(const Matrix<double>& a, const Matrix<double>& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() &&
         std::memcmp(a.data(), b.data(), static_cast<std::size_t>(a.size()) * sizeof(double)) == 0;
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

}  // namespace optimizer_state_test
