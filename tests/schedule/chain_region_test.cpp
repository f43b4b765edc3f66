// A non-persistent schedule run by a chain region (run_schedule; detail/sweep.hpp, run_chain) against the
// plain tape, in the sweeps other than one backward: a retained backward run twice, gradient(), a runtime
// memory budget on the same tape, and the shapes-only estimate.
#include <gtest/gtest.h>

#include <cstdio>
#include <functional>
#include <stdexcept>
#include <vector>

#include "random.hpp"
#include "remat/estimate.hpp"
#include "remat/remat.hpp"
#include "remat/schedule/checkpoint_sequential_auto.hpp"

namespace chain_region_test {

constexpr int L = 6, width = 6, rows = 48;  // activations (1152 B) dominate weights (144 B)

/// The chain of checkpoint_sequential_auto_test's RunsANonPersistentOptimum: its optimum at budget 26
/// frees a checkpoint before its sub-chain is done.
remat::Schedule non_persistent_plan() {
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
  return remat::plan_schedule(c, 26);
}

/// Weights and input of one run, recorded on `tape`; the loss is sum(x_L), with or without the schedule.
struct Model {
  std::vector<remat::Var<float>> weights;
  remat::Var<float> x0, loss;

  Model(remat::Tape<float>& tape, const remat::Schedule* schedule) {
    for (int i = 0; i < L; ++i)
      weights.push_back(tape.variable(remat_test::random_matrix<float>(width, width, static_cast<std::uint64_t>(i))));
    std::vector<std::function<remat::Var<float>(remat::Var<float>)>> layers;
    for (int i = 0; i < L; ++i)
      layers.push_back([this, i](remat::Var<float> x) {
        return remat::square(remat::tanh(remat::matmul(x, weights[static_cast<std::size_t>(i)])));
      });
    x0 = tape.variable(remat_test::random_matrix<float>(rows, width, 99));
    remat::Var<float> y = x0;
    if (schedule) {
      y = remat::run_schedule(layers, *schedule, x0);
    } else {
      for (const auto& layer : layers) y = layer(y);
    }
    loss = remat::sum(y);
  }
  std::vector<remat::Var<float>> all() const {
    std::vector<remat::Var<float>> v = weights;
    v.push_back(x0);
    return v;
  }
};

bool bitwise_equal(const remat::Matrix<float>& a, const remat::Matrix<float>& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() && (a.array() == b.array()).all();
}

void expect_same_grads(const Model& a, const Model& b, const char* what) {
  const auto va = a.all(), vb = b.all();
  for (std::size_t k = 0; k < va.size(); ++k)
    EXPECT_TRUE(bitwise_equal(va[k].grad(), vb[k].grad())) << what << " " << k;
}

TEST(ChainRegion, ThePlanIsNonPersistent) {
  EXPECT_FALSE(remat::detail::persistent(non_persistent_plan()));
}

TEST(ChainRegion, RetainedBackwardTwiceAccumulatesAsThePlainTape) {
  const remat::Schedule plan = non_persistent_plan();
  remat::Tape<float> plain_tape, tape;
  Model plain(plain_tape, nullptr), chained(tape, &plan);
  plain_tape.backward(plain.loss, true);
  tape.backward(chained.loss, true);
  expect_same_grads(plain, chained, "first backward");
  // The forward pass's checkpoints stay for the second backward, which runs the same operations.
  const std::size_t saved_after_first = tape.memory().saved_bytes;
  plain_tape.backward(plain.loss);
  tape.backward(chained.loss);
  expect_same_grads(plain, chained, "second backward");
  EXPECT_GT(saved_after_first, 0u);
  EXPECT_EQ(tape.memory().saved_bytes, 0u);  // the last backward released every hold
}

TEST(ChainRegion, GradientLeavesAccumulatedGradientsAndMatchesThePlainTape) {
  const remat::Schedule plan = non_persistent_plan();
  remat::Tape<float> plain_tape, tape;
  Model plain(plain_tape, nullptr), chained(tape, &plan);
  const auto want = plain_tape.gradient(plain.loss, plain.all());
  const auto got = tape.gradient(chained.loss, chained.all());
  ASSERT_EQ(want.size(), got.size());
  for (std::size_t k = 0; k < want.size(); ++k) EXPECT_TRUE(bitwise_equal(want[k], got[k])) << k;
  for (const auto& v : chained.all()) EXPECT_TRUE((v.grad().array() == 0).all());
}

TEST(ChainRegion, UnderAMemoryBudgetGradientsAreBitwiseAndThePeakHolds) {
  const remat::Schedule plan = non_persistent_plan();
  remat::Tape<float> plain_tape;
  Model plain(plain_tape, nullptr);
  plain_tape.backward(plain.loss);
  std::size_t chained_peak = 0;
  {
    remat::Tape<float> tape;
    Model chained(tape, &plan);
    tape.backward(chained.loss);
    chained_peak = tape.memory().peak_bytes;
  }
  int met = 0, refused = 0;
  for (std::size_t percent = 40; percent <= 100; percent += 5) {
    const std::size_t budget = chained_peak * percent / 100;
    remat::Tape<float> tape;
    tape.set_memory_budget(budget);
    try {
      Model chained(tape, &plan);
      tape.backward(chained.loss);
      EXPECT_LE(tape.memory().peak_bytes, budget) << percent << " %";
      expect_same_grads(plain, chained, "under a budget");
      ++met;
    } catch (const remat::memory_budget_error& e) {
      EXPECT_EQ(e.budget_bytes(), budget);
      EXPECT_GT(e.least_budget_bytes(), budget);
      ++refused;
    }
  }
  EXPECT_GE(met, 3);  // 8 of 13 here: 75 % of the chain's peak and up (weights and their gradients cannot go)
  std::printf("budgets met %d, refused %d (chain peak %zu B)\n", met, refused, chained_peak);
}

TEST(ChainRegion, TheShapesOnlyEstimateIsTheRealRun) {
  const remat::Schedule plan = non_persistent_plan();
  const remat::MemoryEstimate e = remat::estimate_memory<float>([&](remat::Tape<float>& tape) {
    Model chained(tape, &plan);
    return chained.loss;
  });
  remat::Tape<float> tape;
  Model chained(tape, &plan);
  const std::size_t saved = tape.memory().saved_bytes, forward_peak = tape.memory().peak_bytes;
  tape.backward(chained.loss);
  EXPECT_EQ(e.saved_bytes, saved);
  EXPECT_EQ(e.forward_peak_bytes, forward_peak);
  EXPECT_EQ(e.peak_bytes, tape.memory().peak_bytes);
  EXPECT_EQ(e.replayed_ops, tape.memory().replayed_ops);
  EXPECT_EQ(e.replayed_bytes, tape.memory().replayed_bytes);
  EXPECT_GT(e.replayed_ops, 0u);
}

TEST(ChainRegion, IsNotDiagnosedAsARegionThatSavesNothing) {
  // The chain region is the last region before the loss and replays at once; but the planner chose what it
  // keeps, so the policy diagnostics (tape.diagnose) say nothing of it.
  const remat::Schedule plan = non_persistent_plan();
  remat::Tape<float> tape;
  Model chained(tape, &plan);
  EXPECT_TRUE(tape.diagnostics().empty());
}

TEST(ChainRegion, ALayerThatThrowsLeavesTheTapeUsable) {
  const remat::Schedule plan = non_persistent_plan();
  remat::Tape<float> tape;
  auto w = tape.variable(remat_test::random_matrix<float>(width, width, 1));
  std::vector<std::function<remat::Var<float>(remat::Var<float>)>> layers;
  for (int i = 0; i < L; ++i)
    layers.push_back([&w, i](remat::Var<float> x) {
      if (i == 3) throw std::runtime_error("layer 4");
      return remat::tanh(remat::matmul(x, w));
    });
  auto x0 = tape.variable(remat_test::random_matrix<float>(3, width, 2));
  EXPECT_THROW(remat::run_schedule(layers, plan, x0), std::runtime_error);
  // The aborted chain's schedule holds went with it: what stays saved is the two leaves its ops read.
  EXPECT_LE(tape.memory().saved_bytes, sizeof(float) * (width * width + 3 * width));
  auto loss = remat::sum(remat::tanh(remat::matmul(x0, w)));
  tape.backward(loss);
  remat::Tape<float> plain_tape;
  auto pw = plain_tape.variable(remat_test::random_matrix<float>(width, width, 1));
  auto px = plain_tape.variable(remat_test::random_matrix<float>(3, width, 2));
  plain_tape.backward(remat::sum(remat::tanh(remat::matmul(px, pw))));
  EXPECT_TRUE(bitwise_equal(w.grad(), pw.grad()));
  EXPECT_TRUE(bitwise_equal(x0.grad(), px.grad()));
}

}  // namespace chain_region_test
