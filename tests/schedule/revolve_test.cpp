// revolve(): step re-evaluations equal t(n, s) of Griewank & Walther (counted by an op that counts its
// forward calls), stored states stay within s, gradients are bitwise those of the plain tape.
#include <gtest/gtest.h>

#include <cstdio>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "memory.hpp"
#include "random.hpp"
#include "remat/remat.hpp"
#include "remat/schedule/revolve.hpp"

// Named after the file: this directory's test files are compiled as one translation unit (tests/CMakeLists.txt).
namespace revolve_test {

// tanh that counts its forward evaluations (first sweep and replays alike).
long tanh_evaluations = 0;

struct CountingTanhOp : remat::UnaryElementwise<CountingTanhOp> {
  static constexpr const char* name = "counting_tanh";
  static constexpr unsigned residuals = remat::reads_output;
  static constexpr double flops_per_element = 10;
  template <class X>
  static auto value(const X& x, const Params&) {
    ++tanh_evaluations;
    return x.tanh();
  }
  template <class X, class Y, class G>
  static auto derivative(const X&, const Y& y, const G& g, const Params&) {
    using T = typename X::Scalar;
    return g * (T(1) - y.square());
  }
};

// Reference values of t(n, s), the least number of forward recomputations of n steps with s checkpoints
// (binomial checkpointing, Griewank & Walther's revolve): (n, s) → t(n, s).
struct Oracle {
  std::int64_t steps, checkpoints, recomputations;
};
const Oracle oracle[] = {{10, 1, 45},   {10, 2, 20},   {10, 3, 15},      {10, 5, 13},     {100, 2, 845},
                         {100, 3, 490}, {100, 5, 316}, {1000, 3, 12155}, {1000, 10, 3636}};

/// Least step re-evaluations by exhaustive recursion over the first checkpoint position:
/// t(1, s) = 0; t(n, s) = min over m of m + t(m, s) + t(n − m, s − 1) (advance m, store, reverse the
/// right part with one state fewer, then the left part); t(n, 0) = ∞ for n > 1.
std::vector<std::vector<std::int64_t>> exhaustive_table(int max_steps, int max_checkpoints) {
  const std::int64_t infinity = std::numeric_limits<std::int64_t>::max() / 4;
  std::vector<std::vector<std::int64_t>> t(static_cast<std::size_t>(max_steps + 1),
                                           std::vector<std::int64_t>(static_cast<std::size_t>(max_checkpoints + 1)));
  for (int s = 0; s <= max_checkpoints; ++s) t[1][static_cast<std::size_t>(s)] = 0;
  for (int n = 2; n <= max_steps; ++n) {
    t[static_cast<std::size_t>(n)][0] = infinity;
    for (int s = 1; s <= max_checkpoints; ++s) {
      std::int64_t best = infinity;
      for (int m = 1; m < n; ++m)
        best = std::min(best, m + t[static_cast<std::size_t>(m)][static_cast<std::size_t>(s)] +
                                  t[static_cast<std::size_t>(n - m)][static_cast<std::size_t>(s - 1)]);
      t[static_cast<std::size_t>(n)][static_cast<std::size_t>(s)] = best;
    }
  }
  return t;
}

TEST(Revolve, ClosedFormMatchesOracleAndExhaustiveSearch) {
  for (const auto& o : oracle)
    EXPECT_EQ(remat::revolve_recomputations(o.steps, o.checkpoints), o.recomputations)
        << o.steps << "," << o.checkpoints;
  const auto t = exhaustive_table(300, 8);
  for (int n = 1; n <= 300; ++n)
    for (int s = 1; s <= 8; ++s) {
      const auto expected = t[static_cast<std::size_t>(n)][static_cast<std::size_t>(s)];
      ASSERT_EQ(remat::revolve_recomputations(n, s), expected) << n << "," << s;
      if (n == 1) continue;
      // The split the executor uses is an optimal one.
      const auto m = remat::detail::revolve_split(n, s);
      ASSERT_GE(m, 1);
      ASSERT_LT(m, n);
      ASSERT_EQ(m + t[static_cast<std::size_t>(m)][static_cast<std::size_t>(s)] +
                    t[static_cast<std::size_t>(n - m)][static_cast<std::size_t>(s - 1)],
                expected)
          << "split " << m << " for " << n << "," << s;
    }
}

constexpr remat::Index rows = 32, width = 16;
constexpr std::size_t state_bytes = remat_test::bytes<float>(rows, width);

struct Model {
  remat::Parameter<float> weight{remat_test::random_matrix<float>(width, width, 11) * 0.5f};
  remat::Parameter<float> bias{remat_test::random_matrix<float>(1, width, 12)};
  remat::Matrix<float> x0 = remat_test::random_matrix<float>(rows, width, 13);
};

struct Result {
  remat::Matrix<float> grad_weight, grad_bias, grad_x0;
  long evaluations_forward = 0, evaluations_backward = 0;
  remat::MemoryStats after_forward, after_backward;
  float loss = 0;
};

/// Explicit Euler step of dx/dt = tanh(x·W + b), h = 0.05, n steps; revolve with s checkpoints (s = 0: plain).
Result run(Model& model, std::int64_t steps, std::int64_t checkpoints) {
  model.weight.zero_grad();  // Parameters accumulate gradients across backward passes
  model.bias.zero_grad();
  remat::Tape<float> tape;
  auto w = tape.variable(model.weight);
  auto b = tape.variable(model.bias);
  auto x0 = tape.variable(model.x0);
  auto step = [&](remat::Var<float> x) { return x + remat::apply_op<CountingTanhOp>(remat::linear(x, w, b)) * 0.05; };
  Result r;
  tanh_evaluations = 0;
  remat::Var<float> x;
  if (checkpoints == 0) {
    x = x0;
    for (std::int64_t i = 0; i < steps; ++i) x = step(x);
  } else {
    x = remat::revolve(step, x0, steps, checkpoints);
  }
  auto loss = remat::mean(remat::square(x));
  r.evaluations_forward = tanh_evaluations;
  r.after_forward = tape.memory();
  r.loss = loss.item();
  x = remat::Var<float>();
  tape.backward(loss);
  r.evaluations_backward = tanh_evaluations - r.evaluations_forward;
  r.after_backward = tape.memory();
  r.grad_weight = w.grad();
  r.grad_bias = b.grad();
  r.grad_x0 = x0.grad();
  return r;
}

bool bitwise_equal(const remat::Matrix<float>& a, const remat::Matrix<float>& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() && (a.array() == b.array()).all();
}

// Counts far beyond the exhaustive table, against closed forms that share nothing with the search for r:
// one stored state reverses n steps in n(n − 1)/2 re-evaluations; s ≥ n − 1 states in n − 1 (each step but the
// last once); and two states in r·n − C(r + 2, 3) with r the least integer with (r + 1)(r + 2)/2 ≥ n.
// Before 128-bit counts, the first two overflowed or ran for minutes, and huge checkpoint counts overflowed.
TEST(Revolve, HugeCountsMatchClosedFormsOrThrow) {
  const std::int64_t big = std::int64_t{1000000000};
  EXPECT_EQ(remat::revolve_recomputations(big, 1), big * (big - 1) / 2);
  const std::int64_t max = std::numeric_limits<std::int64_t>::max();
  EXPECT_EQ(remat::revolve_recomputations(max, max), max - 1);
  EXPECT_EQ(remat::revolve_recomputations(1000000, max), 999999);
  const std::int64_t n = std::int64_t{1} << 40;
  std::int64_t r = 0;
  while ((r + 1) * (r + 2) / 2 < n) ++r;
  EXPECT_EQ(remat::revolve_recomputations(n, 2), r * n - (r + 2) * (r + 1) * r / 6);
  EXPECT_THROW(remat::revolve_recomputations(max, 1), remat::domain_error);  // about 2^125
  // revolve() itself with far more checkpoints than steps: the schedule of s = steps, each step but the last
  // re-evaluated once, gradients bitwise the plain tape's.
  Model model;
  const Result plain = run(model, 20, 0), huge = run(model, 20, max), exact = run(model, 20, 20);
  EXPECT_EQ(huge.evaluations_backward, 19);
  EXPECT_EQ(exact.evaluations_backward, 19);
  EXPECT_TRUE(bitwise_equal(huge.grad_weight, plain.grad_weight));
  EXPECT_TRUE(bitwise_equal(huge.grad_x0, plain.grad_x0));
  EXPECT_EQ(huge.after_backward.peak_bytes, exact.after_backward.peak_bytes);
}

// revolve()'s doc names where its regions first nest deeper than the tape's 62 levels: 64 steps with 1
// checkpoint (depth steps − 1), 2 017 with 2, 43 681 with 3. Both sides of each threshold.
TEST(Revolve, NestingLimitThresholdsAreTheDocumented) {
  const int limit = remat::detail::max_region_depth;
  for (const auto& [steps, checkpoints] : {std::pair<std::int64_t, std::int64_t>{64, 1}, {2017, 2}, {43681, 3}}) {
    SCOPED_TRACE(std::to_string(steps) + " steps, " + std::to_string(checkpoints) + " checkpoints");
    EXPECT_LE(remat::detail::revolve_depth(steps - 1, checkpoints, limit), limit);
    EXPECT_GT(remat::detail::revolve_depth(steps, checkpoints, limit), limit);
  }
  EXPECT_EQ(remat::detail::revolve_depth(63, 1, limit), 62);  // exact below the limit: steps − 1
  remat::Tape<double> tape;
  auto x = tape.variable(remat::Matrix<double>::Constant(1, 1, 0.5));
  const auto step = [](remat::Var<double> v) { return remat::tanh(v); };
  EXPECT_THROW(remat::revolve(step, x, 64, 1), remat::domain_error);
  EXPECT_EQ(tape.size(), 1u);
  EXPECT_NO_THROW(remat::revolve(step, x, 63, 1));
}

TEST(Revolve, StepEvaluationsMemoryAndGradientsOnTheTape) {
  Model model;
  for (const auto& o : oracle) {
    SCOPED_TRACE("n = " + std::to_string(o.steps) + ", s = " + std::to_string(o.checkpoints));
    const Result plain = run(model, o.steps, 0);
    const Result binomial = run(model, o.steps, o.checkpoints);
    EXPECT_EQ(plain.evaluations_backward, 0);
    EXPECT_EQ(binomial.evaluations_forward, o.steps);
    EXPECT_EQ(binomial.evaluations_backward, o.recomputations);
    EXPECT_EQ(binomial.loss, plain.loss);
    EXPECT_TRUE(bitwise_equal(binomial.grad_weight, plain.grad_weight));
    EXPECT_TRUE(bitwise_equal(binomial.grad_bias, plain.grad_bias));
    EXPECT_TRUE(bitwise_equal(binomial.grad_x0, plain.grad_x0));
    // After the forward pass the tape keeps at most s stored states (x_0 and region boundaries), the input
    // of the last step (the boundary it starts from: the current state of Revolve, not a stored one),
    // the last step's tanh output, and x_n, which the loss's square() reads.
    EXPECT_LE(binomial.after_forward.saved_bytes, (o.checkpoints + 3) * state_bytes)
        << remat_test::describe(binomial.after_forward);
    // The peak adds to at most s stored states the step being reversed: its tanh output, and during its
    // backward the state gradient in and out and the transients of linear / tanh / scale / add; plus the
    // weight and bias gradients and the [1,1] loss values.
    const std::size_t parameters = remat_test::bytes<float>(width, width) + remat_test::bytes<float>(1, width);
    EXPECT_LE(binomial.after_backward.peak_bytes, (o.checkpoints + 6) * state_bytes + parameters + 64)
        << remat_test::describe(binomial.after_backward);
    std::printf(
        "n=%4lld s=%2lld: step re-evaluations %6ld (t = %6lld), peak %8zu B (plain tape %9zu B), "
        "replayed ops %zu\n",
        static_cast<long long>(o.steps), static_cast<long long>(o.checkpoints), binomial.evaluations_backward,
        static_cast<long long>(o.recomputations), binomial.after_backward.peak_bytes, plain.after_backward.peak_bytes,
        binomial.after_backward.replayed_ops);
  }
}

TEST(Revolve, StepIndexAndEdgeCases) {
  remat::Tape<double> tape;
  auto x0 = tape.variable(remat::Matrix<double>::Constant(1, 1, 1.0));
  std::vector<std::int64_t> seen;
  // x_{i+1} = x_i · (i + 1): x_n = n!, so d x_n / d x_0 = n!.
  auto y = remat::revolve(
      [&](std::int64_t i, remat::Var<double> x) {
        seen.push_back(i);
        return x * static_cast<double>(i + 1);
      },
      x0, 6, 2);
  EXPECT_EQ(y.item(), 720.0);
  EXPECT_EQ(seen, (std::vector<std::int64_t>{0, 1, 2, 3, 4, 5}));
  tape.backward(remat::sum(y));
  EXPECT_EQ(x0.grad()(0, 0), 720.0);

  remat::Tape<double> t2;
  auto one = t2.variable(remat::Matrix<double>::Constant(1, 1, 2.0));
  auto same = remat::revolve([](remat::Var<double> x) { return x * 3.0; }, one, 1, 1);
  EXPECT_EQ(same.item(), 6.0);
  EXPECT_THROW(remat::revolve([](remat::Var<double> x) { return x; }, one, 0, 1), remat::domain_error);
  EXPECT_THROW(remat::revolve([](remat::Var<double> x) { return x; }, one, 5, 0), remat::domain_error);
  // One stored state for 1000 steps would nest 999 regions.
  EXPECT_THROW(remat::revolve([](remat::Var<double> x) { return x; }, one, 1000, 1), remat::domain_error);
  EXPECT_THROW(remat::revolve_recomputations(0, 3), remat::domain_error);
}

}  // namespace revolve_test
