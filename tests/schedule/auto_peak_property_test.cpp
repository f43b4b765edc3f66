// checkpoint_sequential_auto's budget holds on the tape (docs/schedules.md): random chains of small layers
// (random widths, layer kinds and count, tape variables or Parameters, the loss as the last layer) and
// random budgets between the least feasible one and the plain tape's peak. Every time: the measured
// peak_bytes ≤ budget, loss and gradients bitwise those of the plain tape, the run follows the schedule,
// and the schedule's time is compared with an exhaustive search over all schedules (chain_oracle.hpp,
// which shares none of the planner's code) on the measured chain.
#include <gtest/gtest.h>

#include <cstdio>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "chain_oracle.hpp"
#include "memory.hpp"
#include "random.hpp"
#include "remat/remat.hpp"
#include "remat/schedule/checkpoint_sequential_auto.hpp"

namespace auto_peak_property_test {

using Layer = std::function<remat::Var<float>(remat::Var<float>)>;

/// One random chain: its layers' kinds and widths, its weights' values, how the weights are held.
struct RandomChain {
  remat::Index rows = 0;
  std::vector<int> kinds;                     // per hidden layer
  std::vector<remat::Index> width;            // width[0] input, width[i] output of layer i (the loss layer excluded)
  bool parameters = false;                    // weights as Parameters (not tape-owned) or tape variables (tape-owned)
  bool in_layer = false;                      // Parameters recorded by each layer where it uses them, not before
  bool input_variable = false;                // x_0 receives a gradient
  std::vector<remat::Matrix<float>> weights;  // in order of use
  std::vector<int> labels;

  static constexpr int kinds_count = 5;

  explicit RandomChain(std::mt19937& rng) {
    auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
    rows = uniform(8, 48);        // activations, not weights, dominate the memory: budgets below the plain peak exist
    const int L = uniform(1, 6);  // hidden layers; + the loss layer: chains of 2 … 7 layers
    width.push_back(uniform(2, 12));
    for (int i = 0; i < L; ++i) {
      const int kind = uniform(0, kinds_count - 1);
      kinds.push_back(kind);
      // kinds 1 (residual MLP block) and 3 (elementwise) keep the width
      width.push_back(kind == 1 || kind == 3 ? width.back() : uniform(2, 12));
    }
    parameters = uniform(0, 1) == 1;
    input_variable = uniform(0, 1) == 1;
    std::uint64_t seed = static_cast<std::uint64_t>(uniform(1, 1 << 30));
    in_layer = parameters && (seed & 1) != 0;  // from the seed: the chains of the other draws stay as they were
    auto add = [&](remat::Index m, remat::Index n, float scale) {
      weights.push_back(remat_test::random_matrix<float>(m, n, seed++) * scale);
    };
    for (int i = 0; i < L; ++i) {
      const remat::Index a = width[static_cast<std::size_t>(i)], b = width[static_cast<std::size_t>(i) + 1];
      switch (kinds[static_cast<std::size_t>(i)]) {
        case 0:  // tanh(linear(h))
        case 4:  // softplus(linear(h)) · sigmoid(linear(h))
          add(a, b, 0.5f);
          add(1, b, 0.1f);
          if (kinds[static_cast<std::size_t>(i)] == 4) {
            add(a, b, 0.5f);
            add(1, b, 0.1f);
          }
          break;
        case 1:  // h + linear(gelu(linear(layer_norm(h))))
          add(1, a, 1.0f);
          add(1, a, 0.1f);
          add(a, 2 * a, 0.5f);
          add(1, 2 * a, 0.1f);
          add(2 * a, a, 0.3f);
          add(1, a, 0.1f);
          break;
        case 2:  // matmul then relu, with a square of the input beside: relu(h·W) + square(h)·V
          add(a, b, 0.5f);
          add(a, b, 0.5f);
          break;
        case 3:  // square(tanh(h)): no weights
          break;
      }
    }
    add(width.back(), 3, 0.5f);  // the loss layer: cross_entropy(linear(h), labels) over 3 classes
    add(1, 3, 0.1f);
    for (remat::Index r = 0; r < rows; ++r) labels.push_back(static_cast<int>(r % 3));
  }

  int length() const { return static_cast<int>(kinds.size()) + 1; }
};

struct Outcome {
  float loss = 0;
  std::vector<remat::Matrix<float>> grads;  // weights', then x_0's if it is a variable
  remat::MemoryStats memory;
  remat::AutoScheduleReport report;
  std::vector<int> evaluations;
};

/// budget 0: the plain tape; otherwise checkpoint_sequential_auto over every layer, the loss included.
Outcome run(const RandomChain& c, std::size_t budget) {
  remat::Tape<float> tape;
  std::vector<remat::Parameter<float>> params;
  std::vector<remat::Var<float>> before;  // weights recorded before the chain
  params.reserve(c.weights.size());
  for (const auto& m : c.weights) {
    if (c.parameters) {
      params.emplace_back(m);
      if (!c.in_layer) before.push_back(tape.variable(params.back()));
    } else {
      before.push_back(tape.variable(m));
    }
  }
  // Weight k as a layer records it: the Var recorded before the chain, or a new leaf of its Parameter.
  auto w = [&](std::size_t k) { return c.in_layer ? tape.variable(params[k]) : before[k]; };
  std::vector<Layer> layers;
  std::size_t next = 0;
  for (int kind : c.kinds) {
    const std::size_t k = next;
    switch (kind) {
      case 0:
        layers.push_back([&w, k](remat::Var<float> h) { return remat::tanh(remat::linear(h, w(k), w(k + 1))); });
        next += 2;
        break;
      case 4:
        layers.push_back([&w, k](remat::Var<float> h) {
          return remat::softplus(remat::linear(h, w(k), w(k + 1))) *
                 remat::sigmoid(remat::linear(h, w(k + 2), w(k + 3)));
        });
        next += 4;
        break;
      case 1:
        layers.push_back([&w, k](remat::Var<float> h) {
          return h + remat::linear(remat::gelu(remat::linear(remat::layer_norm(h, w(k), w(k + 1)), w(k + 2), w(k + 3))),
                                   w(k + 4), w(k + 5));
        });
        next += 6;
        break;
      case 2:
        layers.push_back([&w, k](remat::Var<float> h) {
          auto a = remat::relu(remat::matmul(h, w(k)));
          auto b = remat::matmul(remat::square(h), w(k + 1));
          return a + b;
        });
        next += 2;
        break;
      case 3:
        layers.push_back([](remat::Var<float> h) { return remat::square(remat::tanh(h)); });
        break;
    }
  }
  const std::size_t head = next;
  layers.push_back([&w, &c, head](remat::Var<float> h) {
    return remat::cross_entropy(remat::linear(h, w(head), w(head + 1)), c.labels);
  });

  Outcome o;
  const remat::Matrix<float> x0_value = remat_test::random_matrix<float>(c.rows, c.width[0], 4242);
  auto x0 = c.input_variable ? tape.variable(x0_value) : tape.constant(x0_value);
  remat::Var<float> loss;
  if (budget == 0) {
    loss = x0;
    for (auto& layer : layers) loss = layer(loss);
  } else {
    loss = remat::checkpoint_sequential_auto(layers, x0, budget, &o.report);
  }
  o.loss = loss.item();
  tape.backward(loss);
  o.memory = tape.memory();
  if (c.in_layer)
    for (auto& p : params) o.grads.emplace_back(p.grad());
  else
    for (auto& v : before) o.grads.emplace_back(v.grad());
  if (c.input_variable) o.grads.emplace_back(x0.grad());
  return o;
}

bool bitwise_equal(const remat::Matrix<float>& a, const remat::Matrix<float>& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() && (a.array() == b.array()).all();
}

TEST(CheckpointSequentialAutoProperty, PeakWithinBudgetOnRandomChains) {
  std::mt19937 rng(20261201);
  constexpr int chains = 300;
  int cases = 0, optimal = 0, above_plain = 0, non_persistent = 0;
  double worst_gap = 0, tightest = 1, loosest = 0;
  for (int chain = 0; chain < chains; ++chain) {
    const RandomChain c(rng);
    const Outcome plain = run(c, 0);
    const std::size_t plain_peak = plain.memory.peak_bytes;
    // The least feasible budget, from the typed error of a hopeless one.
    std::size_t least = 0;
    try {
      run(c, 16);
      least = 16;
    } catch (const remat::memory_budget_error& e) {
      EXPECT_EQ(e.budget_bytes(), 16u);
      least = e.least_budget_bytes();
    }
    if (least > plain_peak) ++above_plain;  // the model's leanest plan needs more than the plain tape's peak
    const std::size_t high = std::max(least, plain_peak);
    for (int k = 0; k < 2; ++k, ++cases) {
      const std::size_t budget = k == 0 ? least : std::uniform_int_distribution<std::size_t>(least, high)(rng);
      const Outcome planned = run(c, budget);
      const std::string where = "chain " + std::to_string(chain) + " (L = " + std::to_string(c.length()) +
                                "), budget " + std::to_string(budget) + ", plain peak " + std::to_string(plain_peak);
      ASSERT_TRUE(planned.report.schedule.feasible) << where;
      EXPECT_LE(planned.memory.peak_bytes, budget) << where << "\n" << remat_test::describe(planned.memory);
      tightest = std::min(tightest, static_cast<double>(planned.memory.peak_bytes) / static_cast<double>(budget));
      loosest = std::max(loosest, static_cast<double>(planned.memory.peak_bytes) / static_cast<double>(budget));
      EXPECT_EQ(planned.loss, plain.loss) << where;
      ASSERT_EQ(planned.grads.size(), plain.grads.size());
      for (std::size_t i = 0; i < plain.grads.size(); ++i)
        EXPECT_TRUE(bitwise_equal(planned.grads[i], plain.grads[i])) << where << ", gradient " << i;
      // The executed schedule against the exhaustive search over all schedules of the measured chain, and the
      // schedule's operations replayed in the oracle's own simulator (peak within the budget, same time).
      const remat::Chain& model = planned.report.chain;
      const remat::Schedule& s = planned.report.schedule;
      if (!remat::detail::persistent(s)) ++non_persistent;
      const auto sim = remat_test::simulate(model, s.operations);
      ASSERT_TRUE(sim.valid) << where << ": " << sim.error;
      EXPECT_EQ(sim.time, s.time) << where;
      EXPECT_LE(sim.peak, s.budget) << where;
      const double optimum = remat_test::brute_force_optimum(model, s.budget);
      ASSERT_GE(s.time, optimum) << where << ": the exhaustive search must be a lower bound";
      if (s.time == optimum) ++optimal;
      worst_gap = std::max(worst_gap, (s.time - optimum) / optimum);
    }
  }
  std::printf(
      "checkpoint_sequential_auto on %d random chains, %d budgets: peak/budget in [%.3f, %.3f]; executed "
      "schedule optimal among all schedules in %d (%.1f%%), worst gap %.1f%%; %d of the schedules non-persistent "
      "(run by a chain region); least budget above the plain peak for %d chains\n",
      chains, cases, tightest, loosest, optimal, 100.0 * optimal / cases, 100 * worst_gap, non_persistent, above_plain);
  // Every executed schedule is the exhaustive optimum. Planning persistent schedules only (nested regions),
  // 598 of 600 were: the two non-persistent optima were missed.
  EXPECT_EQ(optimal, cases);
  EXPECT_GE(non_persistent, 1);
}

}  // namespace auto_peak_property_test
