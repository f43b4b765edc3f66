// The schedules over a multi-value state: a chain whose layers map (h, c) to (h, c), as an LSTM's timesteps
// do, run by checkpoint_sequential, revolve, run_schedule (persistent and not) and checkpoint_sequential_auto.
// Each against the plain tape (the layers called in a loop): gradients bitwise equal, every layer evaluated as
// often as the schedule says, and the peak within checkpoint_sequential_auto's budget.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "counting_op.hpp"
#include "expect_error.hpp"
#include "random.hpp"
#include "remat/remat.hpp"
#include "remat/schedule/checkpoint_sequential_auto.hpp"
#include "remat/schedule/revolve.hpp"

namespace tuple_state_test {

using remat::Var;
using State = std::tuple<Var<float>, Var<float>>;
using Layer = std::function<State(State)>;
constexpr remat::Index rows = 32, width = 8;  // activations (1 KiB) dominate the weights (256 B)

/// How layer i treats the state: an LSTM-like cell updating both, one that passes c through unchanged, or one
/// that returns h twice (a state holding one value in two places).
enum class Cell { both, pass_c, twice };

/// Layer i: a = h·W_i, g = tanh(a) (counted for layer i), c' = c ⊙ sigmoid(a) + g, h' = tanh(c') ⊙ g.
State cell(const State& s, const Var<float>& w, int i, Cell kind) {
  const auto& [h, c] = s;
  const Var<float> a = remat::matmul(h, w);
  const Var<float> g = remat_test::layer_counting_tanh(a, i);
  const Var<float> c_next = c * remat::sigmoid(a) + g;
  const Var<float> h_next = remat::tanh(c_next) * g;
  switch (kind) {
    case Cell::both:
      return {h_next, c_next};
    case Cell::pass_c:
      return {h_next, c};
    case Cell::twice:
      break;
  }
  return {h_next, h_next};
}

struct ChainRun {
  std::vector<int> evaluations;
  std::vector<remat::Matrix<float>> grads;  // the weights', then h_0's and c_0's
  remat::MemoryStats memory;
};

/// L layers on (h_0, c_0); `schedule` runs them (given the layers and the state) or, empty, a plain loop does.
/// The loss is sum(h_L) + sum(c_L).
ChainRun run_chain(
    int L, const std::function<State(const std::vector<Layer>&, State)>& schedule,
    const std::function<Cell(int)>& kind = [](int) { return Cell::both; }) {
  remat::Tape<float> tape;
  std::vector<Var<float>> weights;
  for (int i = 0; i < L; ++i)
    weights.push_back(
        tape.variable(remat_test::random_matrix<float>(width, width, static_cast<std::uint64_t>(i + 1)) * 0.5f));
  std::vector<Layer> layers;
  for (int i = 0; i < L; ++i)
    layers.push_back(
        [&weights, &kind, i](State s) { return cell(s, weights[static_cast<std::size_t>(i)], i, kind(i)); });
  auto h0 = tape.variable(remat_test::random_matrix<float>(rows, width, 100));
  auto c0 = tape.variable(remat_test::random_matrix<float>(rows, width, 101));
  remat_test::evaluations.assign(static_cast<std::size_t>(L), 0);
  State s{h0, c0};
  if (schedule) {
    s = schedule(layers, s);
  } else {
    for (const Layer& layer : layers) s = layer(s);
  }
  auto loss = remat::sum(std::get<0>(s)) + remat::sum(std::get<1>(s));
  s = {};
  tape.backward(loss);
  ChainRun r;
  r.evaluations = remat_test::evaluations;
  r.memory = tape.memory();
  for (auto& w : weights) r.grads.emplace_back(w.grad());
  r.grads.emplace_back(h0.grad());
  r.grads.emplace_back(c0.grad());
  return r;
}

bool bitwise_equal(const remat::Matrix<float>& a, const remat::Matrix<float>& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() &&
         std::memcmp(a.data(), b.data(), sizeof(float) * static_cast<std::size_t>(a.size())) == 0;
}
void expect_same_gradients(const ChainRun& run, const ChainRun& plain) {
  ASSERT_EQ(run.grads.size(), plain.grads.size());
  for (std::size_t i = 0; i < run.grads.size(); ++i) EXPECT_TRUE(bitwise_equal(run.grads[i], plain.grads[i])) << i;
}

TEST(TupleState, CheckpointSequentialReplaysEachSegmentOnce) {
  const int L = 8;
  const ChainRun plain = run_chain(L, nullptr);
  EXPECT_EQ(plain.evaluations, std::vector<int>(L, 1));
  for (int segments = 1; segments <= L; ++segments) {
    SCOPED_TRACE("segments = " + std::to_string(segments));
    const ChainRun r = run_chain(L, [segments](const std::vector<Layer>& layers, State s) {
      return remat::checkpoint_sequential(layers, segments, std::move(s));
    });
    // PyTorch's segments: every layer before the last segment twice (forward, replay), the last segment's once.
    const int last = (segments - 1) * (L / segments);
    for (int i = 0; i < L; ++i) EXPECT_EQ(r.evaluations[static_cast<std::size_t>(i)], i < last ? 2 : 1) << i;
    expect_same_gradients(r, plain);
  }
}

TEST(TupleState, CheckpointSequentialKeepsBothValuesOfEachBoundary) {
  // Every layer its own segment but the last: after the forward pass the tape keeps the states at the L − 1
  // segment boundaries (h and c, each [rows, width]) and the last layer's residuals, nothing else of the chain.
  // Against the plain tape, which keeps per layer h, c (read by the product and by c ⊙ σ), g, σ and tanh(c')
  // (read by their own backwards): five values a layer, measured on the tape after the forward pass.
  const int L = 6;
  constexpr std::size_t value = sizeof(float) * rows * width;
  auto saved_after_forward = [&](bool checkpointed) {
    remat::Tape<float> tape;
    std::vector<Var<float>> weights;
    for (int i = 0; i < L; ++i)
      weights.push_back(tape.variable(remat_test::random_matrix<float>(width, width, static_cast<std::uint64_t>(i))));
    std::vector<Layer> layers;
    for (int i = 0; i < L; ++i)
      layers.push_back([&weights, i](State s) { return cell(s, weights[static_cast<std::size_t>(i)], i, Cell::both); });
    remat_test::evaluations.assign(static_cast<std::size_t>(L), 0);
    State s{tape.variable(remat_test::random_matrix<float>(rows, width, 1)),
            tape.variable(remat_test::random_matrix<float>(rows, width, 2))};
    const std::size_t before = tape.memory().saved_bytes;
    if (checkpointed) {
      s = remat::checkpoint_sequential(layers, L, std::move(s));
    } else {
      for (const Layer& layer : layers) s = layer(s);
    }
    s = {};
    return tape.memory().saved_bytes - before;
  };
  // Both keep the leaves the chain reads, tape-owned: h_0, c_0 and the L weights [width, width].
  const std::size_t leaves = 2 * value + L * sizeof(float) * width * width;
  // Plain: h_{i−1}, c_{i−1} of every layer but the first (whose are the leaves), g, σ, tanh(c') of every layer:
  // 2 (L − 1) + 3 L values.
  EXPECT_EQ(saved_after_forward(false), leaves + (2 * (L - 1) + 3 * L) * value);
  // Checkpointed: the boundaries x_1 … x_{L−1} (h and c) and the last layer's g, σ, tanh(c').
  EXPECT_EQ(saved_after_forward(true), leaves + (2 * (L - 1) + 3) * value);
}

TEST(TupleState, RevolveReevaluatesTheBinomialCountWithLayersTakingTheVarsUnpacked) {
  const int steps = 12;
  std::vector<Var<float>> weights;
  for (int checkpoints = 1; checkpoints <= 5; ++checkpoints) {
    SCOPED_TRACE("checkpoints = " + std::to_string(checkpoints));
    const ChainRun plain = run_chain(steps, nullptr);
    const ChainRun r = run_chain(steps, [steps, checkpoints](const std::vector<Layer>& layers, State s) {
      // The step takes the index and the Vars unpacked.
      auto step = [&layers](std::int64_t i, Var<float> h, Var<float> c) {
        return layers[static_cast<std::size_t>(i)](State{std::move(h), std::move(c)});
      };
      return remat::revolve(step, std::move(s), steps, checkpoints);
    });
    int total = 0;
    for (int e : r.evaluations) total += e;
    EXPECT_EQ(total, steps + remat::revolve_recomputations(steps, checkpoints));
    expect_same_gradients(r, plain);
  }
}

/// Random chains planned by plan_schedule (persistent or not) and run on the tuple state, with every cell kind.
TEST(TupleState, RunScheduleFollowsRandomSchedulesPersistentOrNot) {
  std::mt19937 rng(7);
  int checked = 0, non_persistent = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const int L = 2 + static_cast<int>(rng() % 6);
    remat::Chain c;
    for (int i = 0; i <= L; ++i) c.activation_size.push_back(1 + static_cast<std::int64_t>(rng() % 4));
    for (int i = 0; i < L; ++i) {
      c.forward_time.push_back(1 + rng() % 10);
      c.backward_time.push_back(1 + rng() % 20);
      c.tape_size.push_back(c.activation_size[static_cast<std::size_t>(i + 1)] + static_cast<std::int64_t>(rng() % 8));
    }
    const bool persistent = trial % 2 == 0;
    std::int64_t least = 0, high = 400;
    while (high - least > 1) {
      const std::int64_t mid = (least + high) / 2;
      (remat::plan_schedule(c, mid, persistent).feasible ? high : least) = mid;
    }
    const remat::Schedule schedule = remat::plan_schedule(c, high + static_cast<std::int64_t>(rng() % 4), persistent);
    ASSERT_TRUE(schedule.feasible);
    non_persistent += remat::detail::persistent(schedule) ? 0 : 1;
    const Cell kinds[] = {Cell::both, Cell::pass_c, Cell::twice};
    const Cell kind = kinds[trial % 3];
    const auto kind_of = [kind](int i) { return i % 2 == 0 ? Cell::both : kind; };
    SCOPED_TRACE("trial " + std::to_string(trial));
    const ChainRun plain = run_chain(L, nullptr, kind_of);
    const ChainRun r = run_chain(
        L, [&schedule](const std::vector<Layer>& layers, State s) { return remat::run_schedule(layers, schedule, s); },
        kind_of);
    EXPECT_EQ(r.evaluations, schedule.forward_counts(L));
    expect_same_gradients(r, plain);
    ++checked;
  }
  EXPECT_GE(non_persistent, 5);
  std::printf("%d schedules run on (h, c), %d of them non-persistent\n", checked, non_persistent);
}

/// Every other layer updates both values; the others as `kind` says (a value passed through unchanged, or one
/// value held twice, counted once in the planner's sizes).
TEST(TupleState, CheckpointSequentialAutoKeepsThePeakWithinTheBudget) {
  const int L = 10;
  for (Cell kind : {Cell::both, Cell::pass_c, Cell::twice}) {
    const auto kind_of = [kind](int i) { return i % 2 == 0 ? Cell::both : kind; };
    const ChainRun plain = run_chain(L, nullptr, kind_of);
    int within = 0;
    for (double fraction : {1.0, 0.8, 0.6, 0.45, 0.3}) {
      SCOPED_TRACE("cell kind " + std::to_string(static_cast<int>(kind)) + ", fraction " + std::to_string(fraction));
      const auto budget = static_cast<std::size_t>(fraction * static_cast<double>(plain.memory.peak_bytes));
      remat::AutoScheduleReport report;
      auto planned = [&report](std::size_t bytes) {
        return [bytes, &report](const std::vector<Layer>& layers, State s) {
          return remat::checkpoint_sequential_auto(layers, std::move(s), bytes, &report);
        };
      };
      try {
        const ChainRun r = run_chain(L, planned(budget), kind_of);
        EXPECT_LE(r.memory.peak_bytes, budget);
        // The probe once, then the schedule's evaluations.
        std::vector<int> expected = report.schedule.forward_counts(L);
        for (int& e : expected) ++e;
        EXPECT_EQ(r.evaluations, expected);
        expect_same_gradients(r, plain);
        ++within;
      } catch (const remat::memory_budget_error& e) {
        std::printf("cell kind %d, %.2f of the plain peak %zu B: below the least budget, %zu B\n",
                    static_cast<int>(kind), fraction, plain.memory.peak_bytes, e.least_budget_bytes());
        // Only below the least budget, which the message names; that budget then works.
        EXPECT_LT(budget, e.least_budget_bytes());
        const ChainRun r = run_chain(L, planned(e.least_budget_bytes()), kind_of);
        EXPECT_LE(r.memory.peak_bytes, e.least_budget_bytes());
        expect_same_gradients(r, plain);
      }
    }
    EXPECT_GE(within, 4);  // down to 45 % of the plain peak
  }
}

TEST(TupleState, AStateOnTwoTapesOrWithAnEmptyVarIsRefused) {
  remat::Tape<float> a, b;
  auto w = a.variable(remat_test::random_matrix<float>(width, width, 1));
  std::vector<Layer> layers(3, [&w](State s) { return cell(s, w, 0, Cell::both); });
  remat_test::evaluations.assign(1, 0);
  const State mixed{a.variable(remat_test::random_matrix<float>(rows, width, 2)),
                    b.variable(remat_test::random_matrix<float>(rows, width, 3))};
  remat_test::expect_error_naming<remat::tape_error>([&] { remat::checkpoint_sequential(layers, 2, mixed); },
                                                     {"checkpoint_sequential", "Var 1", "another tape"});
  remat_test::expect_error_naming<remat::tape_error>(
      [&] { remat::revolve([&](State s) { return layers[0](std::move(s)); }, mixed, 3, 1); },
      {"revolve", "Var 1", "another tape"});
  const State empty{a.variable(remat_test::random_matrix<float>(rows, width, 2)), Var<float>()};
  EXPECT_THROW(remat::checkpoint_sequential_auto(layers, empty, 1 << 20), remat::tape_error);
  EXPECT_EQ(a.memory().replayed_ops, 0u);
}

}  // namespace tuple_state_test
