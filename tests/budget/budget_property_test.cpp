// Property: on random programs (tests/checkpoint/random_program.hpp: DAGs of every op, checkpoint regions
// nested three deep with every policy, dropout, extras, Parameters) under random memory budgets between the
// least budget that works and the peak without one, memory().peak_bytes ≤ budget, the gradients are bitwise
// those without a budget, a shapes-only tape reports the same figures, and a budget below the least one
// throws memory_budget_error leaving a tape whose backward still runs.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "../checkpoint/checkpoint_support.hpp"
#include "../checkpoint/random_program.hpp"
#include "random.hpp"
#include "remat/remat.hpp"

namespace budget_property_test {

using random_program::Generator;
using random_program::Program;
using random_program::Run;
using remat::EvictionHeuristic;
using remat::Matrix;
using Scalar = float;

constexpr int cases = 150;

bool same_bits(const Matrix<Scalar>& a, const Matrix<Scalar>& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() &&
         std::memcmp(a.data(), b.data(), static_cast<std::size_t>(a.size()) * sizeof(Scalar)) == 0;
}

struct Outcome {
  bool failed = false;  // memory_budget_error, in the forward pass or in backward
  bool failed_in_backward = false;
  std::size_t least = 0;
  remat::MemoryStats memory;
  std::vector<Matrix<Scalar>> grads;
};

/// Records `program` under `budget` (0: none) and runs backward. After a backward that throws, checks the
/// tape is usable: the budget lifted, the same backward runs (its gradients are returned).
Outcome execute(const Program& program, std::uint64_t seed, bool shapes, std::size_t budget, EvictionHeuristic h) {
  Outcome o;
  std::unique_ptr<Run<Scalar>> run;
  try {
    run = std::make_unique<Run<Scalar>>(program, seed, shapes, budget, h);
  } catch (const remat::memory_budget_error& e) {
    EXPECT_EQ(e.budget_bytes(), budget);
    EXPECT_GT(e.least_budget_bytes(), budget);
    o.failed = true;
    o.least = e.least_budget_bytes();
    return o;
  }
  try {
    run->tape.backward(run->loss.var);
  } catch (const remat::memory_budget_error& e) {
    EXPECT_EQ(e.budget_bytes(), budget);
    EXPECT_GT(e.least_budget_bytes(), budget);
    o.failed = o.failed_in_backward = true;
    o.least = e.least_budget_bytes();
    run->tape.set_memory_budget(0);
    run->tape.backward(run->loss.var);  // the tape is as before the failed backward
  }
  o.memory = run->tape.memory();
  run->tape.set_memory_budget(0);  // grad() of a variable no gradient reached allocates its zeros
  if (!shapes) o.grads = checkpoint_test::gradients_of(run->differentiable());
  return o;
}

/// The least budget (to `resolution` bytes) at which the program runs, by bisection on a shapes-only tape,
/// assuming that larger budgets keep working (the random budgets above it check that).
std::size_t least_budget(const Program& program, std::uint64_t seed, std::size_t peak, EvictionHeuristic h,
                         std::size_t resolution) {
  std::size_t lo = 0, hi = peak;  // lo fails (0 is no budget: treated as failing), hi works
  while (hi - lo > resolution) {
    const std::size_t mid = lo + (hi - lo) / 2;
    if (execute(program, seed, true, mid, h).failed)
      lo = mid;
    else
      hi = mid;
  }
  return hi;
}

TEST(MemoryBudgetProperty, RandomProgramsUnderRandomBudgets) {
  std::mt19937_64 draw(4242);
  int evicting = 0, below_failed = 0, below_backward = 0;
  for (int i = 0; i < cases; ++i) {
    const auto seed = 52000 + static_cast<std::uint64_t>(i);
    const Program program = Generator(seed).generate();
    SCOPED_TRACE("graph " + std::to_string(i) + ":\n" + random_program::describe(program));
    const EvictionHeuristic h = i % 3 == 0   ? EvictionHeuristic::dtr
                                : i % 3 == 1 ? EvictionHeuristic::dtr_eq
                                             : EvictionHeuristic::local;
    const Outcome plain = execute(program, seed, false, 0, h);
    ASSERT_FALSE(plain.failed);
    const std::size_t peak = plain.memory.peak_bytes;
    const std::size_t least = least_budget(program, seed, peak, h, 4);
    for (int k = 0; k < 3; ++k) {
      const std::size_t budget = least + static_cast<std::size_t>(draw() % (peak - least + 1));
      SCOPED_TRACE("budget " + std::to_string(budget) + " (least " + std::to_string(least) + ", peak " +
                   std::to_string(peak) + ")");
      const Outcome r = execute(program, seed, false, budget, h);
      ASSERT_FALSE(r.failed) << "memory_budget_error, least_budget_bytes " << r.least;
      EXPECT_LE(r.memory.peak_bytes, budget);
      if (r.memory.evictions > 0) ++evicting;
      ASSERT_EQ(r.grads.size(), plain.grads.size());
      for (std::size_t g = 0; g < r.grads.size(); ++g) EXPECT_TRUE(same_bits(r.grads[g], plain.grads[g])) << g;
      const Outcome s = execute(program, seed, true, budget, h);
      ASSERT_FALSE(s.failed);
      EXPECT_EQ(s.memory.peak_bytes, r.memory.peak_bytes);
      EXPECT_EQ(s.memory.live_bytes, r.memory.live_bytes);
      EXPECT_EQ(s.memory.evictions, r.memory.evictions);
      EXPECT_EQ(s.memory.rematerialized_ops, r.memory.rematerialized_ops);
    }
    if (least > 8) {
      const std::size_t below = least - 8 - static_cast<std::size_t>(draw() % (least - 8));
      const Outcome r = execute(program, seed, false, below, h);
      EXPECT_TRUE(r.failed) << "budget " << below << " below the least " << least;
      if (r.failed) ++below_failed;
      if (r.failed_in_backward) {
        ++below_backward;
        for (std::size_t g = 0; g < r.grads.size(); ++g) EXPECT_TRUE(same_bits(r.grads[g], plain.grads[g])) << g;
      }
    }
  }
  std::printf("%d of %d budgeted runs evicted; %d below the least failed (%d in backward)\n", evicting, 3 * cases,
              below_failed, below_backward);
  EXPECT_GT(evicting, cases);
}

}  // namespace budget_property_test
