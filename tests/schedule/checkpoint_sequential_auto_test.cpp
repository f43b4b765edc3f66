// run_schedule() follows the planned forward counts on the tape; checkpoint_sequential_auto() on a reduced W2
// (the workload of bench/workloads.hpp) with half the plain saved bytes: runs, saves less, gradients bitwise equal to
// the plain run.
#include <gtest/gtest.h>

#include <cstdio>
#include <functional>
#include <random>
#include <vector>

#include "counting_op.hpp"
#include "memory.hpp"
#include "random.hpp"
#include "remat/remat.hpp"
#include "remat/schedule/checkpoint_sequential_auto.hpp"
#include "w2_half_budget.hpp"

// Named after the file: this directory's test files are compiled as one translation unit (tests/CMakeLists.txt).
namespace checkpoint_sequential_auto_test {

using remat_test::evaluations;

bool bitwise_equal(const remat::Matrix<float>& a, const remat::Matrix<float>& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() && (a.array() == b.array()).all();
}

TEST(RunSchedule, LayerEvaluationsFollowThePlan) {
  std::mt19937 rng(7);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  constexpr int width = 8;
  int checked = 0, non_persistent = 0;
  for (int trial = 0; trial < 80; ++trial) {
    // Even trials plan persistent schedules (nested regions run them), odd ones any schedule (a chain
    // region runs the non-persistent ones by their operations).
    const bool persistent = trial % 2 == 0;
    const int L = uniform(1, 9);
    remat::Chain c;
    for (int i = 0; i < L; ++i) {
      c.forward_time.push_back(uniform(1, 10));
      c.backward_time.push_back(uniform(1, 20));
    }
    for (int i = 0; i <= L; ++i) c.activation_size.push_back(uniform(1, 6));
    for (int i = 1; i <= L; ++i) c.tape_size.push_back(c.activation_size[static_cast<std::size_t>(i)] + uniform(0, 6));
    std::int64_t total = 0;
    for (auto v : c.activation_size) total += v;
    for (auto v : c.tape_size) total += v;
    const remat::Schedule schedule =
        remat::plan_schedule(c, uniform(static_cast<int>(total / 3), static_cast<int>(total)), persistent);
    if (!schedule.feasible) continue;
    if (!remat::detail::persistent(schedule)) ++non_persistent;

    remat::Tape<float> tape;
    std::vector<remat::Var<float>> weights;
    for (int i = 0; i < L; ++i)
      weights.push_back(tape.variable(remat_test::random_matrix<float>(width, width, static_cast<std::uint64_t>(i))));
    std::vector<std::function<remat::Var<float>(remat::Var<float>)>> layers;
    for (int i = 0; i < L; ++i)
      layers.push_back([&weights, i](remat::Var<float> x) {
        // tanh's output is a residual of square(), not the layer's output: every forward of the layer in
        // the plan (F or Fall) must evaluate it.
        return remat::square(
            remat_test::layer_counting_tanh(remat::matmul(x, weights[static_cast<std::size_t>(i)]), i));
      });
    auto x0 = tape.variable(remat_test::random_matrix<float>(4, width, 99));
    evaluations.assign(static_cast<std::size_t>(L), 0);
    auto y = remat::run_schedule(layers, schedule, x0);
    tape.backward(remat::sum(y));
    EXPECT_EQ(evaluations, schedule.forward_counts(L)) << "trial " << trial;

    // Gradients equal the plain tape's, bitwise.
    remat::Tape<float> plain_tape;
    std::vector<remat::Var<float>> plain_weights;
    for (int i = 0; i < L; ++i)
      plain_weights.push_back(
          plain_tape.variable(remat_test::random_matrix<float>(width, width, static_cast<std::uint64_t>(i))));
    auto h = plain_tape.variable(remat_test::random_matrix<float>(4, width, 99));
    auto plain_x0 = h;
    for (int i = 0; i < L; ++i)
      h = remat::square(remat::tanh(remat::matmul(h, plain_weights[static_cast<std::size_t>(i)])));
    plain_tape.backward(remat::sum(h));
    for (int i = 0; i < L; ++i)
      EXPECT_TRUE(bitwise_equal(weights[static_cast<std::size_t>(i)].grad(),
                                plain_weights[static_cast<std::size_t>(i)].grad()));
    EXPECT_TRUE(bitwise_equal(x0.grad(), plain_x0.grad()));
    ++checked;
  }
  EXPECT_GE(checked, 40);
  EXPECT_GE(non_persistent, 5);  // 11 on this seed
  std::printf("%d schedules run, %d of them non-persistent\n", checked, non_persistent);
}

TEST(RunSchedule, RunsANonPersistentOptimum) {
  // A chain whose optimum (203, found by the exhaustive search of chain_oracle.hpp) frees a checkpoint
  // before its sub-chain is done: nested regions cannot express it, a chain region runs its operations.
  remat::Chain c{{10, 10, 10, 3, 8, 1},
                 {2, 19, 19, 11, 4, 15},
                 {6, 4, 2, 6, 4, 2, 4},
                 {10, 8, 7, 4, 6, 9},
                 {},
                 {},
                 {},
                 {},
                 {},
                 {}};
  const auto free_plan = remat::plan_schedule(c, 26);
  const auto persistent_plan = remat::plan_schedule(c, 26, true);
  EXPECT_EQ(free_plan.time, 203);
  EXPECT_GT(persistent_plan.time, free_plan.time);
  ASSERT_FALSE(remat::detail::persistent(free_plan));

  constexpr int L = 6, width = 6;
  auto run = [&](const remat::Schedule* schedule, std::vector<remat::Matrix<float>>& grads) {
    remat::Tape<float> tape;
    std::vector<remat::Var<float>> weights;
    for (int i = 0; i < L; ++i)
      weights.push_back(tape.variable(remat_test::random_matrix<float>(width, width, static_cast<std::uint64_t>(i))));
    std::vector<std::function<remat::Var<float>(remat::Var<float>)>> layers;
    for (int i = 0; i < L; ++i)
      layers.push_back([&weights, i](remat::Var<float> x) {
        return remat::square(
            remat_test::layer_counting_tanh(remat::matmul(x, weights[static_cast<std::size_t>(i)]), i));
      });
    auto x0 = tape.variable(remat_test::random_matrix<float>(3, width, 99));
    evaluations.assign(static_cast<std::size_t>(L), 0);
    remat::Var<float> y = x0;
    if (schedule) {
      y = remat::run_schedule(layers, *schedule, x0);
    } else {
      for (const auto& layer : layers) y = layer(y);
    }
    tape.backward(remat::sum(y));
    grads.clear();
    for (auto& w : weights) grads.push_back(w.grad());
    grads.push_back(x0.grad());
  };
  std::vector<remat::Matrix<float>> plain, scheduled;
  run(nullptr, plain);
  run(&free_plan, scheduled);
  EXPECT_EQ(evaluations, free_plan.forward_counts(L));
  ASSERT_EQ(plain.size(), scheduled.size());
  for (std::size_t k = 0; k < plain.size(); ++k) EXPECT_TRUE(bitwise_equal(plain[k], scheduled[k])) << k;
}

TEST(RunSchedule, RejectsMismatchedSchedulesAndNonPersistentOnesInsideRegions) {
  remat::Chain c{{10, 10, 10, 3, 8, 1},
                 {2, 19, 19, 11, 4, 15},
                 {6, 4, 2, 6, 4, 2, 4},
                 {10, 8, 7, 4, 6, 9},
                 {},
                 {},
                 {},
                 {},
                 {},
                 {}};
  const auto free_plan = remat::plan_schedule(c, 26);
  const auto persistent_plan = remat::plan_schedule(c, 26, true);
  remat::Tape<float> tape;
  auto x = tape.variable(remat::Matrix<float>::Ones(2, 2));
  std::vector<std::function<remat::Var<float>(remat::Var<float>)>> layers(
      6, [](remat::Var<float> v) { return remat::tanh(v); });
  // Inside a checkpoint region the enclosing replay would not know the schedule's holds.
  auto inside = remat::checkpoint([&](remat::Var<float> v) { return remat::run_schedule(layers, free_plan, v); });
  const auto nodes = tape.size();
  EXPECT_THROW(inside(x), remat::domain_error);
  EXPECT_EQ(tape.size(), nodes);
  layers.pop_back();
  EXPECT_THROW(remat::run_schedule(layers, persistent_plan, x), remat::domain_error);
  EXPECT_THROW(remat::run_schedule(layers, free_plan, x), remat::domain_error);
}

using w2_half_budget::check_w2_at_half_budget;
using w2_half_budget::W2;

TEST(CheckpointSequentialAuto, W2WithHalfThePlainPeak) {
  check_w2_at_half_budget(512, 64);
}

TEST(CheckpointSequentialAuto, TooSmallABudgetSaysWhatFits) {
  W2 model(64, 16);
  try {
    model.run(1000);
    FAIL() << "expected memory_budget_error";
  } catch (const remat::memory_budget_error& e) {
    EXPECT_NE(std::string(e.what()).find("least budget"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("1000 bytes"), std::string::npos) << e.what();
    EXPECT_EQ(e.budget_bytes(), 1000u);
    EXPECT_GT(e.least_budget_bytes(), 1000u);
    // The least budget works, and the tape that threw stays usable (run() records a fresh one; see below).
    const auto fits = model.run(e.least_budget_bytes());
    EXPECT_TRUE(fits.report.schedule.feasible);
    EXPECT_LE(fits.after_backward.peak_bytes, e.least_budget_bytes());
  }
}

// A chain whose layers record their Parameters where they use them (as bench/budget_step's W1 does): the
// sweep hands each weight gradient to its Parameter when it passes the layer's leaf, so nothing of it stays
// for the rest of the backward (g = 0) and the least budget is below the plain peak. Counted as left behind
// (the model before this test), the 8 weight gradients of 64 KiB alone exceed the plain peak.
TEST(CheckpointSequentialAuto, ParametersRecordedInTheLayerLeaveNoGradientBehind) {
  constexpr int L = 8;
  constexpr remat::Index rows = 64, width = 128;
  std::vector<remat::Parameter<float>> weight, bias;
  for (int l = 0; l < L; ++l) {
    weight.emplace_back(remat_test::random_matrix<float>(width, width, 10 + static_cast<std::uint64_t>(l)) * 0.1f);
    bias.emplace_back(remat_test::random_matrix<float>(1, width, 40 + static_cast<std::uint64_t>(l)) * 0.1f);
  }
  remat::Parameter<float> head(remat_test::random_matrix<float>(width, 3, 99));
  std::vector<int> labels;
  for (remat::Index r = 0; r < rows; ++r) labels.push_back(static_cast<int>(r % 3));
  struct Result {
    remat::MemoryStats memory;
    remat::AutoScheduleReport report;
    std::vector<remat::Matrix<float>> grads;
  };
  auto step = [&](std::size_t budget) {
    remat::Tape<float> tape;
    std::vector<std::function<remat::Var<float>(remat::Var<float>)>> layers;
    for (int l = 0; l < L; ++l)
      layers.push_back([&, l](remat::Var<float> h) {
        return remat::tanh(remat::linear(h, tape.variable(weight[static_cast<std::size_t>(l)]),
                                         tape.variable(bias[static_cast<std::size_t>(l)])));
      });
    layers.push_back(
        [&](remat::Var<float> h) { return remat::cross_entropy(remat::matmul(h, tape.variable(head)), labels); });
    for (auto* list : {&weight, &bias})
      for (auto& p : *list) p.zero_grad();
    head.zero_grad();
    Result r;
    auto x = tape.constant(remat_test::random_matrix<float>(rows, width, 7));
    remat::Var<float> loss = x;
    if (budget == 0)
      for (auto& layer : layers) loss = layer(loss);
    else
      loss = remat::checkpoint_sequential_auto(layers, x, budget, &r.report);
    tape.backward(loss);
    r.memory = tape.memory();
    for (auto* list : {&weight, &bias})
      for (auto& p : *list) r.grads.emplace_back(p.grad());
    r.grads.emplace_back(head.grad());
    return r;
  };
  const Result plain = step(0);
  std::size_t least = 0;
  try {
    step(64);
  } catch (const remat::memory_budget_error& e) {
    least = e.least_budget_bytes();
  }
  ASSERT_GT(least, 0u);
  EXPECT_LT(least, plain.memory.peak_bytes) << "least " << least << ", plain peak " << plain.memory.peak_bytes;
  for (const std::size_t budget : {least, (least + plain.memory.peak_bytes) / 2}) {
    const Result planned = step(budget);
    for (int l = 0; l < L; ++l) EXPECT_EQ(planned.report.chain.gradient_size[static_cast<std::size_t>(l)], 0) << l;
    EXPECT_LE(planned.memory.peak_bytes, budget) << remat_test::describe(planned.memory);
    ASSERT_EQ(planned.grads.size(), plain.grads.size());
    for (std::size_t i = 0; i < plain.grads.size(); ++i)
      EXPECT_TRUE(bitwise_equal(planned.grads[i], plain.grads[i])) << i;
  }
}

// After memory_budget_error the tape is usable: the same tape records the chain plainly and its backward
// gives the plain gradients, bitwise.
TEST(CheckpointSequentialAuto, TapeStaysUsableAfterABudgetError) {
  auto step = [](bool try_auto_first) {
    remat::Tape<float> tape;
    auto w = tape.variable(remat_test::random_matrix<float>(6, 6, 3));
    std::vector<std::function<remat::Var<float>(remat::Var<float>)>> layers(
        4, [w](remat::Var<float> h) { return remat::tanh(remat::matmul(h, w)); });
    layers.push_back([](remat::Var<float> h) { return remat::sum(remat::square(h)); });
    auto x = tape.variable(remat_test::random_matrix<float>(16, 6, 4));
    if (try_auto_first) {
      EXPECT_THROW(remat::checkpoint_sequential_auto(layers, x, 64), remat::memory_budget_error);
    }
    auto h = x;
    for (auto& layer : layers) h = layer(h);
    tape.backward(h);
    return std::vector<remat::Matrix<float>>{w.grad(), x.grad()};
  };
  const auto plain = step(false), after_error = step(true);
  EXPECT_TRUE(bitwise_equal(plain[0], after_error[0]));
  EXPECT_TRUE(bitwise_equal(plain[1], after_error[1]));
}

}  // namespace checkpoint_sequential_auto_test