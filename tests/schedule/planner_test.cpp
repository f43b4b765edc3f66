// plan_schedule(): reference values for uniform chains (which the exhaustive search reproduces too), and a
// comparison with an exhaustive search over all schedules (chain_oracle.hpp) on a few hundred random chains.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <random>

#include "chain_oracle.hpp"
#include "remat/schedule/planner.hpp"

// Named after the file: this directory's test files are compiled as one translation unit (tests/CMakeLists.txt).
namespace planner_test {

remat::Chain uniform_chain(int L, double uf, double ub, std::int64_t wx, std::int64_t wa) {
  remat::Chain c;
  c.forward_time.assign(static_cast<std::size_t>(L), uf);
  c.backward_time.assign(static_cast<std::size_t>(L), ub);
  c.activation_size.assign(static_cast<std::size_t>(L + 1), wx);
  c.tape_size.assign(static_cast<std::size_t>(L), wa);
  return c;
}

/// Plans, checks the schedule in the independent simulator, and returns its time (+∞ if infeasible).
double planned_time(const remat::Chain& c, std::int64_t budget, bool persistent = false) {
  const remat::Schedule s = remat::plan_schedule(c, budget, persistent);
  if (!s.feasible) return std::numeric_limits<double>::infinity();
  const auto sim = remat_test::simulate(c, s.operations);
  EXPECT_TRUE(sim.valid) << sim.error;
  EXPECT_EQ(sim.time, s.time);
  EXPECT_LE(sim.peak, budget);
  return s.time;
}

// A uniform chain, L = 6, uf = 1, ub = 2, wx = 1, wa = 2: 33, 25, 23, 21, 21, 20, 20, 19, 19, 18 for M = 6…15.
TEST(Planner, UniformChainOracleTapeTwiceActivation) {
  const auto c = uniform_chain(6, 1, 2, 1, 2);
  const double expected[] = {33, 25, 23, 21, 21, 20, 20, 19, 19, 18};
  for (int M = 6; M <= 15; ++M) {
    EXPECT_EQ(remat_test::brute_force_optimum(c, M), expected[M - 6]) << "brute force, M = " << M;
    EXPECT_EQ(planned_time(c, M), expected[M - 6]) << "planner, M = " << M;
    EXPECT_EQ(planned_time(c, M, true), expected[M - 6]) << "persistent planner, M = " << M;
  }
  for (int M = 0; M <= 5; ++M) {
    EXPECT_FALSE(remat::plan_schedule(c, M).feasible) << M;
    EXPECT_EQ(remat_test::brute_force_optimum(c, M), std::numeric_limits<double>::infinity()) << M;
  }
}

// The same chain with wa = 1: 28, 21, 20, 19, 18 for M = 5…9.
TEST(Planner, UniformChainOracleTapeEqualsActivation) {
  const auto c = uniform_chain(6, 1, 2, 1, 1);
  const double expected[] = {28, 21, 20, 19, 18};
  for (int M = 5; M <= 9; ++M) {
    EXPECT_EQ(remat_test::brute_force_optimum(c, M), expected[M - 5]) << "brute force, M = " << M;
    EXPECT_EQ(planned_time(c, M), expected[M - 5]) << "planner, M = " << M;
    EXPECT_EQ(planned_time(c, M, true), expected[M - 5]) << "persistent planner, M = " << M;
  }
  EXPECT_FALSE(remat::plan_schedule(c, 4).feasible);
}

TEST(Planner, SequentialScheduleSimulatesAsExpected) {
  // One segment = store everything: L forwards + L backwards; L segments of one layer: each layer twice.
  const auto c = uniform_chain(6, 1, 2, 1, 2);
  const auto all = remat_test::simulate(c, remat_test::sequential_operations(6, 1));
  ASSERT_TRUE(all.valid) << all.error;
  EXPECT_EQ(all.time, 18);
  EXPECT_EQ(all.peak, 15);
  const auto each = remat_test::simulate(c, remat_test::sequential_operations(6, 6));
  ASSERT_TRUE(each.valid) << each.error;
  EXPECT_EQ(each.time, 6 + 5 + 12);
}

TEST(Planner, RejectsInconsistentChains) {
  auto c = uniform_chain(3, 1, 2, 2, 1);  // tape smaller than its output
  EXPECT_THROW(remat::plan_schedule(c, 100), remat::domain_error);
  c = uniform_chain(3, 1, 2, 1, 1);
  c.activation_size.pop_back();
  EXPECT_THROW(remat::plan_schedule(c, 100), remat::domain_error);
  c = uniform_chain(3, 1, 2, 1, 2);
  c.checkpoint_size = {1, 1, 0, 1};  // below its activation
  EXPECT_THROW(remat::plan_schedule(c, 100), remat::domain_error);
  c.checkpoint_size = {1, 1, 3, 1};  // above its layer's tape
  EXPECT_THROW(remat::plan_schedule(c, 100), remat::domain_error);
  c.checkpoint_size = {1, 1};
  EXPECT_THROW(remat::plan_schedule(c, 100), remat::domain_error);
  c.checkpoint_size = {1, 2, 2, 2};
  EXPECT_TRUE(remat::plan_schedule(c, 100).feasible);
}

/// Budgets from the least feasible one to "store everything".
void budgets(const remat::Chain& c, std::int64_t& low, std::int64_t& high) {
  high = 0;
  for (auto v : c.activation_size) high += v;
  for (auto v : c.tape_size) high += v;
  low = 0;
  while (remat_test::brute_force_optimum(c, low) == std::numeric_limits<double>::infinity()) ++low;
  high = std::max(high, low);  // storing everything can need more than the sum of sizes (δ's at B_1)
}

TEST(Planner, MatchesExhaustiveSearchOnUniformChains) {
  int cases = 0;
  for (int L = 1; L <= 7; ++L)
    for (int uf = 1; uf <= 3; ++uf)
      for (int wa = 1; wa <= 3; ++wa) {
        const auto c = uniform_chain(L, uf, 2 * uf, 1, wa);
        std::int64_t low, high;
        budgets(c, low, high);
        for (std::int64_t M = low; M <= high; ++M, ++cases) {
          const double optimum = remat_test::brute_force_optimum(c, M);
          ASSERT_EQ(planned_time(c, M), optimum) << "L=" << L << " uf=" << uf << " wa=" << wa << " M=" << M;
          ASSERT_EQ(planned_time(c, M, true), optimum) << "persistent, L=" << L << " uf=" << uf << " wa=" << wa;
        }
      }
  std::printf("uniform chains: %d (chain, budget) cases, all optimal\n", cases);
}

/// A random heterogeneous chain of L layers; with `overheads`, also random overhead terms of docs/schedules.md's cost
/// model (o_f, o_f̄, g, o_b).
remat::Chain random_chain(std::mt19937& rng, int L, bool overheads, bool checkpoint_sizes = false) {
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  remat::Chain c;
  for (int i = 0; i < L; ++i) {
    c.forward_time.push_back(uniform(1, 10));
    c.backward_time.push_back(uniform(1, 20));
  }
  for (int i = 0; i <= L; ++i) c.activation_size.push_back(uniform(1, 6));
  for (int i = 1; i <= L; ++i) {
    c.tape_size.push_back(c.activation_size[static_cast<std::size_t>(i)] + uniform(0, 6));
    if (!overheads) continue;
    c.forward_overhead.push_back(uniform(0, 6));
    c.forward_all_overhead.push_back(uniform(0, 3));
    c.gradient_size.push_back(uniform(0, 3));
    c.backward_overhead.push_back(c.gradient_size.back() + uniform(0, 6));
  }
  if (checkpoint_sizes) {  // between the activation and its layer's tape (x_0: up to 3 more)
    for (int i = 0; i <= L; ++i) {
      const std::int64_t x = c.activation_size[static_cast<std::size_t>(i)];
      const std::int64_t most = i == 0 ? x + 3 : c.tape_size[static_cast<std::size_t>(i - 1)];
      c.checkpoint_size.push_back(x + uniform(0, static_cast<int>(most - x)));
    }
  }
  return c;
}

TEST(Planner, NearOptimalOnRandomHeterogeneousChains) {
  std::mt19937 rng(20261130);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  int cases = 0, matched = 0, persistent_matched = 0;
  double worst_gap = 0, persistent_worst_gap = 0;
  int sequential_checks = 0;
  for (int chain = 0; chain < 300; ++chain) {
    const int L = uniform(2, 7);
    const remat::Chain c = random_chain(rng, L, false);
    std::int64_t low, high;
    budgets(c, low, high);
    // A few budgets per chain, from the tightest to the loosest.
    for (int k = 0; k < 4; ++k) {
      const std::int64_t M = low + (high - low) * k / 3;
      const double optimum = remat_test::brute_force_optimum(c, M);
      const double planned = planned_time(c, M);
      ASSERT_LT(optimum, std::numeric_limits<double>::infinity()) << "every budget tested is feasible";
      ASSERT_GE(planned, optimum) << "the exhaustive search must be a lower bound";
      ++cases;
      if (planned == optimum) ++matched;
      worst_gap = std::max(worst_gap, (planned - optimum) / optimum);
      const double persistent = planned_time(c, M, true);
      if (persistent == optimum) ++persistent_matched;
      persistent_worst_gap = std::max(persistent_worst_gap, (persistent - optimum) / optimum);
    }
    // Never worse than checkpoint_sequential with any segment count, at that schedule's own peak.
    for (int segments = 1; segments <= L; ++segments) {
      const auto seq = remat_test::simulate(c, remat_test::sequential_operations(L, segments));
      ASSERT_TRUE(seq.valid) << seq.error;
      EXPECT_LE(planned_time(c, seq.peak), seq.time) << "chain " << chain << " segments " << segments;
      EXPECT_LE(planned_time(c, seq.peak, true), seq.time) << "chain " << chain << " segments " << segments;
      ++sequential_checks;
    }
  }
  const double fraction = static_cast<double>(matched) / cases;
  std::printf(
      "heterogeneous chains: %d cases, planner optimal in %d (%.2f%%), worst gap %.2f%% of total time; "
      "persistent-only planner optimal in %d (%.2f%%), worst gap %.2f%%; %d checkpoint_sequential comparisons\n",
      cases, matched, 100 * fraction, 100 * worst_gap, persistent_matched, 100.0 * persistent_matched / cases,
      100 * persistent_worst_gap, sequential_checks);
  EXPECT_GE(fraction, 0.98);
  EXPECT_LT(worst_gap, 0.10);
}

/// Against the exhaustive search on 300 random chains with overheads and gradient sizes (and checkpoint
/// sizes, if asked), 4 budgets each from the least feasible one: every planned schedule's peak stays within
/// the budget in the simulator (planned_time), neither planner beats the optimum, and no schedule fits
/// below the least budget.
struct Comparison {
  int cases = 0, matched = 0, persistent_matched = 0;
  double persistent_worst_gap = 0;
  int heavier = 0;  // cases whose optimum costs more than with ω_c = ω_x
};
Comparison compare_with_exhaustive_search(std::uint32_t seed, bool checkpoint_sizes) {
  std::mt19937 rng(seed);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  Comparison r;
  for (int chain = 0; chain < 300; ++chain) {
    const remat::Chain c = random_chain(rng, uniform(1, 7), true, checkpoint_sizes);
    remat::Chain light = c;  // the same chain whose checkpoints weigh their activation
    light.checkpoint_size.clear();
    std::int64_t low, high;
    budgets(c, low, high);
    high += 20;  // the sum of sizes leaves out the overheads
    for (int k = 0; k < 4; ++k, ++r.cases) {
      const std::int64_t M = low + (high - low) * k / 3;
      const double optimum = remat_test::brute_force_optimum(c, M);
      EXPECT_LT(optimum, std::numeric_limits<double>::infinity());
      const double planned = planned_time(c, M);  // checks the peak in the simulator
      const double persistent = planned_time(c, M, true);
      EXPECT_GE(planned, optimum);
      EXPECT_GE(persistent, optimum);
      if (planned == optimum) ++r.matched;
      if (persistent == optimum) ++r.persistent_matched;
      r.persistent_worst_gap = std::max(r.persistent_worst_gap, (persistent - optimum) / optimum);
      if (checkpoint_sizes && remat_test::brute_force_optimum(light, M) < optimum) ++r.heavier;
    }
    EXPECT_FALSE(remat::plan_schedule(c, low - 1).feasible) << "chain " << chain;
  }
  return r;
}

// With per-layer forward / forward-all / backward overheads and weight-gradient sizes (what a tape
// really allocates), the planner matches the exhaustive search.
TEST(Planner, MatchesExhaustiveSearchWithOverheadsAndGradients) {
  const Comparison r = compare_with_exhaustive_search(20261201, false);
  std::printf(
      "chains with overheads: %d cases, planner optimal in %d (%.2f%%); persistent-only in %d (%.2f%%), worst gap "
      "%.2f%%\n",
      r.cases, r.matched, 100.0 * r.matched / r.cases, r.persistent_matched, 100.0 * r.persistent_matched / r.cases,
      100 * r.persistent_worst_gap);
  EXPECT_GE(r.matched, r.cases * 98 / 100);
}

TEST(Planner, MatchesExhaustiveSearchWithCheckpointSizes) {
  // An activation kept as a checkpoint weighs ω_c (its op's extra buffers with it), its gradient ω_x: the
  // planned schedule's peak, in the simulator that counts the two apart, stays within the budget.
  const Comparison r = compare_with_exhaustive_search(20261202, true);
  std::printf(
      "chains with checkpoint sizes: %d cases, planner optimal in %d (%.2f%%); persistent-only in %d (%.2f%%); "
      "the optimum costs more than with ω_c = ω_x in %d\n",
      r.cases, r.matched, 100.0 * r.matched / r.cases, r.persistent_matched, 100.0 * r.persistent_matched / r.cases,
      r.heavier);
  EXPECT_GE(r.matched, r.cases * 98 / 100);
  EXPECT_GT(r.heavier, r.cases / 10) << "the test must draw chains where ω_c changes the optimum";
}

}  // namespace planner_test