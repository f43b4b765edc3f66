// Tape::set_memory_budget (Dynamic Tensor Rematerialization, Kirisame et al. 2021): the peak stays within
// the budget, gradients are bitwise those of the run without a budget, evicted values are regenerated on
// every read path (a later op, Var::value(), the backward, a checkpoint replay's sources), and a budget that
// cannot be met throws memory_budget_error with the tape as it was.
//
// The oracles are independent of the tape's bookkeeping: the run without a budget (gradients, values), the
// budget itself (peak ≤ budget), hand-computed byte counts for the error's figures.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "random.hpp"
#include "remat/remat.hpp"

namespace memory_budget_test {

using remat::EvictionHeuristic;
using remat::Matrix;
using remat::Var;

constexpr EvictionHeuristic all_heuristics[] = {EvictionHeuristic::dtr, EvictionHeuristic::dtr_eq,
                                                EvictionHeuristic::local};
const char* name(EvictionHeuristic h) {
  return h == EvictionHeuristic::dtr ? "h_DTR" : h == EvictionHeuristic::dtr_eq ? "h_DTR^eq" : "h_local";
}

template <class T>
bool bitwise_equal(const Matrix<T>& a, const Matrix<T>& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() &&
         std::memcmp(a.data(), b.data(), static_cast<std::size_t>(a.size()) * sizeof(T)) == 0;
}

template <class T>
bool evicted(const Var<T>& v) {
  return remat::detail::VarAccess::state(v)->node(remat::detail::VarAccess::id(v)).evicted;
}

// ---- a chain of unary ops ----

struct ChainRun {
  Matrix<double> grad;
  remat::MemoryStats memory;
};

constexpr std::size_t value_bytes = 4 * 8 * sizeof(double);  // one [4,8] double value

/// loss = sum(tanh^n(x)) for a [4,8] x: n values of 256 bytes, each read by its own backward.
ChainRun chain(int n, std::size_t budget, EvictionHeuristic h = EvictionHeuristic::dtr_eq) {
  remat::Tape<double> tape;
  tape.set_memory_budget(budget, h);
  auto x = tape.variable(remat_test::random_matrix<double>(4, 8, 1));
  Var<double> y = x;
  for (int i = 0; i < n; ++i) y = remat::tanh(y);
  auto loss = remat::sum(y);
  y = {};
  tape.backward(loss);
  return {Matrix<double>(x.grad()), tape.memory()};
}

TEST(MemoryBudget, ChainGradientsBitwiseEqualAndPeakWithinEveryBudget) {
  const ChainRun plain = chain(16, 0);
  EXPECT_EQ(plain.memory.evictions, 0u);
  EXPECT_EQ(plain.memory.rematerialized_ops, 0u);
  // Every budget in 8-byte steps from the plain peak down to one value, which cannot work (x and its
  // gradient alone take two).
  int evicting = 0, failing = 0;
  for (std::size_t budget = plain.memory.peak_bytes; budget >= value_bytes; budget -= 8) {
    for (EvictionHeuristic h : all_heuristics) {
      ChainRun r;
      try {
        r = chain(16, budget, h);
      } catch (const remat::memory_budget_error& e) {
        EXPECT_EQ(e.budget_bytes(), budget);
        EXPECT_GT(e.least_budget_bytes(), budget);
        ++failing;
        continue;
      }
      EXPECT_LE(r.memory.peak_bytes, budget) << name(h);
      EXPECT_TRUE(bitwise_equal(r.grad, plain.grad)) << budget << " " << name(h);
      if (r.memory.evictions > 0) ++evicting;
      if (budget < plain.memory.peak_bytes) {
        EXPECT_GT(r.memory.evictions, 0u) << budget;
      }
    }
  }
  EXPECT_GT(evicting, 100);
  EXPECT_GT(failing, 0);  // the lowest budgets cannot work
}

/// The smallest budget (in multiples of 8 bytes) at which the chain runs, by a downward scan.
std::size_t least_chain_budget(int n, EvictionHeuristic h, std::size_t from) {
  std::size_t ok = from;
  for (std::size_t b = from; b >= 8; b -= 8) {
    try {
      chain(n, b, h);
      ok = b;
    } catch (const remat::memory_budget_error&) {
      break;
    }
  }
  return ok;
}

// Kirisame et al. (2021), Theorem 3.1: on a linear feedforward network of N ops, a budget of Θ(√N) values
// costs O(N) recomputations. Here the budget is 2·√N values plus the 4 the backward itself needs (x, its
// gradient, two flowing gradients); the counts are deterministic (a logical clock), so they are asserted
// exactly, and their ratio to N stays below a small constant while N quadruples.
TEST(MemoryBudget, ChainUnderSqrtNBudgetRecomputesLinearly) {
  // Recomputed ops: {h_DTR, h_DTR^eq, h_local} for N = 64, then N = 256 (the values of this code; a change
  // of the heuristic or the clock shows here first).
  const std::size_t expected[2][3] = {{47, 47, 90}, {223, 223, 868}};
  std::printf("  N    heuristic  budget(values)  peak(B)  evictions  recomputed  recomputed/N\n");
  for (int size = 0; size < 2; ++size) {
    const int n = size == 0 ? 64 : 256;
    const ChainRun plain = chain(n, 0);
    const std::size_t budget = (static_cast<std::size_t>(2 * std::ceil(std::sqrt(n))) + 4) * value_bytes + 16;
    for (int k = 0; k < 3; ++k) {
      const EvictionHeuristic h = all_heuristics[k];
      const ChainRun r = chain(n, budget, h);
      EXPECT_EQ(r.memory.rematerialized_ops, expected[size][k]) << name(h) << " N " << n;
      const double ratio = static_cast<double>(r.memory.rematerialized_ops) / n;
      std::printf("  %-4d %-10s %-15zu %-8zu %-10zu %-11zu %.2f\n", n, name(h), budget / value_bytes,
                  r.memory.peak_bytes, r.memory.evictions, r.memory.rematerialized_ops, ratio);
      EXPECT_LE(r.memory.peak_bytes, budget);
      EXPECT_TRUE(bitwise_equal(r.grad, plain.grad));
      EXPECT_GT(r.memory.rematerialized_ops, 0u);
      EXPECT_LE(ratio, 4.0) << name(h) << " N " << n;
    }
  }
}

// ---- regeneration on each read path ----

TEST(MemoryBudget, ValueOfAnEvictedValueRegeneratesIt) {
  auto record = [](remat::Tape<double>& tape, std::vector<Var<double>>& kept) {
    auto x = tape.constant(remat_test::random_matrix<double>(4, 8, 2));
    Var<double> y = x;
    for (int i = 0; i < 12; ++i) {
      y = remat::sin(y);  // sin's backward reads its input: nothing is read for a constant
      kept.push_back(y);
    }
  };
  remat::Tape<double> plain_tape;
  std::vector<Var<double>> plain;
  record(plain_tape, plain);
  remat::Tape<double> tape;
  tape.set_memory_budget(5 * value_bytes);  // x and 4 of the 12 values held by handles
  std::vector<Var<double>> kept;
  record(tape, kept);
  EXPECT_TRUE(evicted(kept[0]));
  EXPECT_LE(tape.memory().live_bytes, 5 * value_bytes);
  const std::size_t before = tape.memory().rematerialized_ops;
  // kept[0] = sin(x): one op from a leaf; kept[5] needs its evicted inputs regenerated recursively.
  EXPECT_TRUE(bitwise_equal(Matrix<double>(kept[0].value()), Matrix<double>(plain[0].value())));
  EXPECT_FALSE(evicted(kept[0]));
  EXPECT_EQ(tape.memory().rematerialized_ops, before + 1);
  for (std::size_t i = 0; i < kept.size(); ++i)
    EXPECT_TRUE(bitwise_equal(Matrix<double>(kept[i].value()), Matrix<double>(plain[i].value()))) << i;
  EXPECT_LE(tape.memory().peak_bytes, 5 * value_bytes);
}

TEST(MemoryBudget, AnEvictedValueReadByALaterOp) {
  struct Step {
    remat::Tape<double> tape;
    Var<double> x, early, y;
    explicit Step(std::size_t budget) {
      tape.set_memory_budget(budget);
      x = tape.variable(remat_test::random_matrix<double>(4, 8, 3));
      early = remat::exp(remat::tanh(x));
      y = early;
      for (int i = 0; i < 8; ++i) y = remat::tanh(y);
    }
    /// Reads `early` again, long after it was recorded, and runs backward.
    Var<double> finish() {
      auto loss = remat::sum(remat::multiply(y, early));
      y = {};
      tape.backward(loss);
      return loss;
    }
  };
  Step plain(0);
  const Var<double> plain_loss = plain.finish();
  // The largest budget (in 8-byte steps) under which `early` is evicted by the time the chain is recorded.
  std::size_t budget = plain.tape.memory().peak_bytes;
  for (; budget > value_bytes; budget -= 8)
    if (evicted(Step(budget).early)) break;
  ASSERT_GT(budget, value_bytes);
  Step s(budget);
  ASSERT_TRUE(evicted(s.early));
  const std::size_t before = s.tape.memory().rematerialized_ops;
  const Var<double> loss = s.finish();
  EXPECT_GT(s.tape.memory().rematerialized_ops, before);
  EXPECT_LE(s.tape.memory().peak_bytes, budget);
  EXPECT_TRUE(bitwise_equal(Matrix<double>(loss.value()), Matrix<double>(plain_loss.value())));
  EXPECT_TRUE(bitwise_equal(Matrix<double>(s.x.grad()), Matrix<double>(plain.x.grad())));
}

/// A checkpoint region whose replay source (its input) is evicted before the backward: the replay
/// regenerates the source first.
TEST(MemoryBudget, CheckpointReplayOfAnEvictedSource) {
  auto step = [](std::size_t budget, bool check_evicted) {
    remat::Tape<double> tape;
    tape.set_memory_budget(budget);
    auto x = tape.variable(remat_test::random_matrix<double>(4, 8, 4));
    Var<double> source = remat::sin(remat::sin(x));
    auto region = remat::checkpoint([](Var<double> h) { return remat::tanh(remat::exp(remat::tanh(h))); });
    Var<double> y = region(source);
    for (int i = 0; i < 10; ++i) y = remat::tanh(y);
    auto loss = remat::sum(y);
    y = {};
    if (check_evicted) {
      EXPECT_TRUE(evicted(source));
    }
    source = {};
    tape.backward(loss);
    return std::make_pair(Matrix<double>(x.grad()), tape.memory());
  };
  const auto plain = step(0, false);
  const auto budgeted = step(7 * value_bytes, true);
  EXPECT_TRUE(bitwise_equal(budgeted.first, plain.first));
  EXPECT_LE(budgeted.second.peak_bytes, 7 * value_bytes);
  EXPECT_GT(budgeted.second.rematerialized_ops, 0u);
  EXPECT_EQ(budgeted.second.replayed_ops, plain.second.replayed_ops);
}

/// memory()'s FLOP counts: the FLOP estimates (OpInfo::flops) of the ops a budget regenerated and of those a
/// checkpoint replay re-ran, by hand. tanh and exp take 10 FLOPs an element: on a [4,8] value, 320.
TEST(MemoryBudget, FlopsOfRegenerationsAndReplaysAreTheirOpsEstimates) {
  const ChainRun r = chain(64, 20 * value_bytes + 16, EvictionHeuristic::dtr);
  EXPECT_GT(r.memory.rematerialized_ops, 0u);
  EXPECT_EQ(r.memory.rematerialized_flops, 320.0 * static_cast<double>(r.memory.rematerialized_ops));
  EXPECT_EQ(r.memory.replayed_ops, 0u);
  EXPECT_EQ(r.memory.replayed_flops, 0.0);

  // No budget: the replay of tanh(exp(tanh(x))) re-runs all three ops (the outer tanh's output is the region's,
  // read only by its own backward: dropped like any other value, JAX's rule).
  remat::Tape<double> tape;
  auto x = tape.variable(remat_test::random_matrix<double>(4, 8, 5));
  Var<double> y = remat::checkpoint([](Var<double> h) { return remat::tanh(remat::exp(remat::tanh(h))); })(x);
  auto loss = remat::sum(y);
  y = {};
  tape.backward(loss);
  EXPECT_EQ(tape.memory().replayed_ops, 3u);
  EXPECT_EQ(tape.memory().replayed_flops, 960.0);
  EXPECT_EQ(tape.memory().rematerialized_flops, 0.0);
}

// ---- the budget lifted after evictions: the backward regenerates without pinning ----

/// Five blocks h ← tanh(matmul(h · exp(h/2), w)), optionally each in a checkpoint region saving nothing,
/// recorded under `budget` (0: none) and differentiated with the budget lifted (set_memory_budget(0)
/// leaves the evicted values evicted). exp reads its output e, the product reads h and e: e is a residual
/// of two backwards, and the product's backward regenerates both of its residuals in turn. `mode` 0: one
/// backward; 1: two retain_graph backwards, then one; 2: gradient() of w with retain_graph, then backward.
struct LiftedRun {
  std::vector<Matrix<double>> grads;
  remat::MemoryStats forward, first, second;
  std::size_t evicted_ops = 0, evicted_bytes = 0;  // evicted when the budget is lifted
};
LiftedRun lifted_budget_step(bool shapes, std::size_t budget, int mode, bool regions, EvictionHeuristic h) {
  remat::Tape<double> tape = shapes ? remat::Tape<double>(remat::shapes_only) : remat::Tape<double>();
  tape.set_memory_budget(budget, h);
  auto x = tape.variable(remat_test::random_matrix<double>(4, 8, 1));
  auto w = tape.variable(Matrix<double>(remat_test::random_matrix<double>(8, 8, 2) * 0.3));
  auto block = [&w](Var<double> v) {
    const Var<double> e = remat::exp(remat::affine(v, 0.5, 0.0));
    return remat::tanh(remat::matmul(v * e, w));
  };
  Var<double> y = x;
  for (int k = 0; k < 5; ++k) y = regions ? remat::checkpoint(block)(y) : block(y);
  auto loss = remat::sum(y);
  y = {};
  LiftedRun r;
  r.forward = tape.memory();
  for (std::int32_t i = 0; i < static_cast<std::int32_t>(tape.size()); ++i) {
    const auto& n = remat::detail::VarAccess::state(x)->node(i);
    if (!n.evicted) continue;
    ++r.evicted_ops;
    r.evicted_bytes += static_cast<std::size_t>(n.shape.numel()) * sizeof(double);
  }
  tape.set_memory_budget(0);
  if (mode == 0) {
    tape.backward(loss);
    r.first = tape.memory();
  } else if (mode == 1) {
    tape.backward(loss, true);
    r.first = tape.memory();
    tape.backward(loss, true);
    r.second = tape.memory();
    tape.backward(loss);
  } else {
    r.grads = tape.gradient(loss, {w}, true);
    r.first = tape.memory();
    tape.backward(loss);
    r.second = tape.memory();
  }
  if (!shapes) {
    r.grads.emplace_back(x.grad());
    r.grads.emplace_back(w.grad());
  }
  return r;
}

/// The figures of lifted_budget_step's tape after each backward, by hand: what stays is what stays
/// without a budget. Without regions, x, each block's e, its product and its tanh output, and w are saved
/// (a backward reads them); with regions saving nothing, x, the four region outputs the next region's replay
/// reads, and w (the last output is read only by its own backward: dropped and replayed). After a backward
/// that frees them, x and w and their gradients stay, and the loss.
void expect_lifted_figures(const LiftedRun& r, int mode, bool regions) {
  constexpr std::size_t v = value_bytes, w = 8 * 8 * sizeof(double), loss = sizeof(double);
  const std::size_t saved = (regions ? 1 + 4 : 1 + 3 * 5) * v + w, freed = 2 * v + 2 * w + loss;
  const remat::MemoryStats& last = mode == 0 ? r.first : r.second;
  if (mode == 1) {  // two retain_graph backwards: every residual stays, with the gradients of x and w
    for (const remat::MemoryStats* m : {&r.first, &r.second}) {
      EXPECT_EQ(m->saved_bytes, saved);
      EXPECT_EQ(m->live_bytes, saved + loss + v + w);
    }
    return;  // its last backward's figures are not kept
  }
  if (mode == 2) {  // gradient() with retain_graph: the residuals stay, no gradient does
    EXPECT_EQ(r.first.saved_bytes, saved);
    EXPECT_EQ(r.first.live_bytes, saved + loss);
  }
  EXPECT_EQ(last.saved_bytes, 0u);
  EXPECT_EQ(last.live_bytes, freed);
}

// Sweep::pin_residuals pins a backward's residuals only under a budget: with it lifted, the values left
// evicted are regenerated unpinned, each kept by its pending backward reads. Gradients are bitwise those of
// the tape that never had a budget, each evicted value is regenerated exactly once, and what stays after
// each backward (live, saved) is exactly what stays on that tape, by hand (a pin left behind would keep a
// residual); after a retained backward every residual is resident again, so a second one is the unbudgeted
// tape's to the byte. A shapes-only tape agrees.
TEST(MemoryBudget, BudgetLiftedAfterEvictionsBackwardRegeneratesEachValueOnceAndEndsAsWithoutABudget) {
  int evicting = 0;
  for (const bool regions : {false, true})
    for (int mode = 0; mode < 3; ++mode) {
      SCOPED_TRACE("mode " + std::to_string(mode) + (regions ? " regions" : ""));
      const LiftedRun plain = lifted_budget_step(false, 0, mode, regions, EvictionHeuristic::dtr_eq);
      ASSERT_EQ(plain.forward.evictions, 0u);
      expect_lifted_figures(plain, mode, regions);
      for (std::size_t budget : {std::size_t(4000), std::size_t(3000), std::size_t(2500), std::size_t(2000)})
        for (EvictionHeuristic h : all_heuristics) {
          SCOPED_TRACE(std::string(name(h)) + " budget " + std::to_string(budget));
          LiftedRun r;
          try {
            r = lifted_budget_step(false, budget, mode, regions, h);
          } catch (const remat::memory_budget_error&) {
            continue;  // the forward pass cannot meet it
          }
          if (r.evicted_ops == 0) continue;
          ++evicting;
          EXPECT_LE(r.forward.peak_bytes, budget);
          ASSERT_EQ(r.grads.size(), plain.grads.size());
          for (std::size_t k = 0; k < r.grads.size(); ++k) EXPECT_TRUE(bitwise_equal(r.grads[k], plain.grads[k])) << k;
          expect_lifted_figures(r, mode, regions);
          // Each value left evicted is regenerated once, in the first backward; nothing is evicted any more.
          EXPECT_EQ(r.first.rematerialized_ops, r.forward.rematerialized_ops + r.evicted_ops);
          EXPECT_EQ(r.first.rematerialized_bytes, r.forward.rematerialized_bytes + r.evicted_bytes);
          EXPECT_EQ(r.first.evictions, r.forward.evictions);
          if (mode > 0) {
            EXPECT_EQ(r.second.rematerialized_ops, r.first.rematerialized_ops);
            EXPECT_EQ(r.second.evictions, r.first.evictions);
          }
          if (!regions) {
            // Without regions each value is regenerated when its first reader's backward needs it, while the
            // unbudgeted tape still holds it. (A replay counts an evicted source as there and regenerates it
            // when it reads it, which may be earlier: with regions neither figure is the unbudgeted one.)
            EXPECT_EQ(r.first.replayed_ops, plain.first.replayed_ops);
            EXPECT_LE(r.first.peak_bytes, plain.first.peak_bytes);
          }
          if (mode == 1) {  // the second retained backward starts from the unbudgeted tape's state
            EXPECT_EQ(r.second.replayed_ops, plain.second.replayed_ops);
            if (!regions) {  // (a peak since the forward)
              EXPECT_EQ(r.second.peak_bytes, plain.second.peak_bytes);
            }
          }
          if (mode < 2) {  // gradient() computes nothing on a shapes-only tape
            const LiftedRun s = lifted_budget_step(true, budget, mode, regions, h);
            EXPECT_EQ(s.evicted_ops, r.evicted_ops);
            for (const auto& [a, b] : {std::make_pair(s.first, r.first), std::make_pair(s.second, r.second)}) {
              EXPECT_EQ(a.live_bytes, b.live_bytes);
              EXPECT_EQ(a.peak_bytes, b.peak_bytes);
              EXPECT_EQ(a.saved_bytes, b.saved_bytes);
              EXPECT_EQ(a.rematerialized_ops, b.rematerialized_ops);
              EXPECT_EQ(a.rematerialized_bytes, b.rematerialized_bytes);
            }
          }
        }
    }
  EXPECT_GT(evicting, 40);
}

// ---- when the budget cannot be met ----

TEST(MemoryBudget, ErrorNamesBudgetRequestAndLeastBudgetAndLeavesTheTapeAsItWas) {
  remat::Tape<double> tape;
  auto x = tape.variable(remat_test::random_matrix<double>(4, 8, 5));  // 256 bytes, a leaf: never evicted
  auto a = remat::tanh(x);                                             // 256 bytes, evictable
  tape.set_memory_budget(700);
  // exp(a) needs 256 bytes; a is its operand (pinned), x a leaf: nothing can be evicted, 512 live.
  const remat::MemoryStats before = tape.memory();
  const std::size_t size = tape.size();
  try {
    remat::exp(a);
    ADD_FAILURE() << "no memory_budget_error";
  } catch (const remat::memory_budget_error& e) {
    EXPECT_EQ(e.budget_bytes(), 700u);
    EXPECT_EQ(e.needed_bytes(), value_bytes);
    EXPECT_EQ(e.least_budget_bytes(), 3 * value_bytes);
    EXPECT_NE(std::string(e.what()).find("exp"), std::string::npos) << e.what();
  }
  EXPECT_EQ(tape.size(), size);
  EXPECT_EQ(tape.memory().live_bytes, before.live_bytes);
  EXPECT_EQ(tape.memory().peak_bytes, before.peak_bytes);
  EXPECT_FALSE(evicted(a));
  tape.set_memory_budget(3 * value_bytes - 1);
  EXPECT_THROW(remat::exp(a), remat::memory_budget_error);
  tape.set_memory_budget(3 * value_bytes);  // least_budget_bytes() serves it
  auto b = remat::exp(a);
  // sin(b) reads b; a (now held only by its handle and tanh's backward) is evicted for it.
  auto c = remat::sin(b);
  EXPECT_TRUE(evicted(a));
  EXPECT_LE(tape.memory().peak_bytes, 3 * value_bytes);
  (void)c;
}

TEST(MemoryBudget, BackwardThatCannotMeetTheBudgetThrowsBeforeChangingAnything) {
  // Forward within the budget, backward not: find such a budget on the chain, then check the tape.
  const ChainRun plain = chain(6, 0);
  bool found = false;
  for (std::size_t budget = plain.memory.peak_bytes; budget >= value_bytes && !found; budget -= 8) {
    remat::Tape<double> tape;
    tape.set_memory_budget(budget);
    Var<double> x, loss;
    try {
      x = tape.variable(remat_test::random_matrix<double>(4, 8, 1));
      Var<double> y = x;
      for (int i = 0; i < 6; ++i) y = remat::tanh(y);
      loss = remat::sum(y);
    } catch (const remat::memory_budget_error&) {
      break;  // the forward cannot either from here down
    }
    const remat::MemoryStats before = tape.memory();
    try {
      tape.backward(loss);
      continue;
    } catch (const remat::memory_budget_error& e) {
      found = true;
      EXPECT_EQ(e.budget_bytes(), budget);
      EXPECT_GT(e.least_budget_bytes(), budget);
    }
    const remat::MemoryStats after = tape.memory();
    EXPECT_EQ(after.live_bytes, before.live_bytes);
    EXPECT_EQ(after.peak_bytes, before.peak_bytes);
    EXPECT_EQ(after.saved_bytes, before.saved_bytes);
    EXPECT_EQ(after.evictions, before.evictions);
    EXPECT_EQ(after.rematerialized_ops, before.rematerialized_ops);
    // Usable: without a budget the same backward runs and gives the plain gradient.
    tape.set_memory_budget(0);
    tape.backward(loss);
    EXPECT_TRUE(bitwise_equal(Matrix<double>(x.grad()), plain.grad));
  }
  EXPECT_TRUE(found);
}

// ---- a model with regions, policies, extras, dropout; float and double ----

template <class T>
struct ModelRun {
  std::vector<Matrix<T>> grads;
  remat::MemoryStats memory;
};

enum class Regions { none, per_layer_nothing, per_layer_dots, nested };

/// Three layers tanh(layer_norm(linear(h))) with dropout, then cross_entropy: extras (layer_norm's
/// statistics, cross_entropy's softmax), a random op, Parameters and tape variables.
template <class T>
ModelRun<T> model_step(std::size_t budget, Regions regions, EvictionHeuristic h) {
  std::vector<remat::Parameter<T>> weights;
  for (int l = 0; l < 3; ++l) weights.emplace_back(remat_test::random_matrix<T>(12, 12, 10 + l));
  remat::Tape<T> tape(77);
  tape.set_memory_budget(budget, h);
  auto x = tape.constant(remat_test::random_matrix<T>(8, 12, 20));
  auto gain = tape.variable(remat_test::random_matrix<T>(1, 12, 21));
  auto bias = tape.variable(remat_test::random_matrix<T>(1, 12, 22));
  std::vector<Var<T>> w;
  for (auto& p : weights) w.push_back(tape.variable(p));
  auto layer = [&](std::size_t l) {
    return [&, l](Var<T> v) {
      return remat::dropout(remat::tanh(remat::layer_norm(remat::matmul(v, w[l]), gain, bias)), 0.25);
    };
  };
  Var<T> hval = x;
  if (regions == Regions::nested) {
    auto outer = remat::checkpoint(
        [&](Var<T> v) {
          v = layer(0)(v);
          return remat::checkpoint(layer(1), remat::policies::dots_saveable)(v);
        },
        remat::policies::nothing_saveable);
    hval = layer(2)(outer(hval));
  } else {
    for (std::size_t l = 0; l < 3; ++l) {
      if (regions == Regions::per_layer_nothing)
        hval = remat::checkpoint(layer(l))(hval);
      else if (regions == Regions::per_layer_dots)
        hval = remat::checkpoint(layer(l), remat::policies::dots_saveable)(hval);
      else
        hval = layer(l)(hval);
    }
  }
  const std::vector<int> labels = {0, 3, 5, 11, 2, 7, 7, 1};
  auto loss = remat::cross_entropy(hval, labels);
  hval = {};
  tape.backward(loss);
  ModelRun<T> r;
  for (auto& p : weights) r.grads.emplace_back(p.grad());
  r.grads.emplace_back(gain.grad());
  r.grads.emplace_back(bias.grad());
  r.memory = tape.memory();
  return r;
}

template <class T>
class MemoryBudgetModel : public ::testing::Test {};
using Scalars = ::testing::Types<float, double>;
TYPED_TEST_SUITE(MemoryBudgetModel, Scalars);

TYPED_TEST(MemoryBudgetModel, GradientsBitwiseEqualForEveryBudgetRegionAndPolicy) {
  using T = TypeParam;
  for (Regions regions : {Regions::none, Regions::per_layer_nothing, Regions::per_layer_dots, Regions::nested}) {
    const ModelRun<T> plain = model_step<T>(0, regions, EvictionHeuristic::dtr_eq);
    const std::size_t step = std::max<std::size_t>(sizeof(T), plain.memory.peak_bytes / 64 / sizeof(T) * sizeof(T));
    int ran = 0, evicting = 0;
    for (EvictionHeuristic h : all_heuristics) {
      for (std::size_t budget = plain.memory.peak_bytes; budget > step; budget -= step) {
        ModelRun<T> r;
        try {
          r = model_step<T>(budget, regions, h);
        } catch (const remat::memory_budget_error& e) {
          EXPECT_GT(e.least_budget_bytes(), budget);
          break;  // lower budgets are expected to fail too; the property test checks each one
        }
        ++ran;
        if (r.memory.evictions > 0) ++evicting;
        EXPECT_LE(r.memory.peak_bytes, budget);
        // Without evictions the replays are the plain run's; with them, a replay target that was evicted is
        // regenerated on demand instead (rematerialized_ops), so replayed_ops may be lower.
        if (r.memory.evictions == 0) {
          EXPECT_EQ(r.memory.replayed_ops, plain.memory.replayed_ops) << budget;
        }
        for (std::size_t k = 0; k < plain.grads.size(); ++k)
          EXPECT_TRUE(bitwise_equal(r.grads[k], plain.grads[k]))
              << "gradient " << k << " budget " << budget << " " << name(h) << " regions " << int(regions);
      }
    }
    EXPECT_GT(evicting, 10) << int(regions);
    EXPECT_GT(ran, evicting);
  }
}

TEST(MemoryBudget, ShapesOnlyTapeGivesTheSameFiguresUnderABudget) {
  auto step = [](remat::Tape<float>& tape, std::size_t budget) {
    tape.set_memory_budget(budget);
    auto x = tape.constant(Matrix<float>::Ones(8, 16));
    auto w = tape.variable(Matrix<float>::Ones(16, 16));
    Var<float> h = x;
    for (int i = 0; i < 6; ++i) h = remat::tanh(remat::matmul(h, w));
    auto loss = remat::mean(h);
    h = {};
    tape.backward(loss);
    return tape.memory();
  };
  remat::Tape<float> plain_tape;
  const std::size_t peak = step(plain_tape, 0).peak_bytes;
  for (std::size_t budget = peak; budget > peak / 3; budget -= 64) {
    remat::Tape<float> real, shapes(remat::shapes_only);
    remat::MemoryStats a{}, b{};
    bool real_failed = false, shapes_failed = false;
    try {
      a = step(real, budget);
    } catch (const remat::memory_budget_error&) {
      real_failed = true;
    }
    try {
      b = step(shapes, budget);
    } catch (const remat::memory_budget_error&) {
      shapes_failed = true;
    }
    ASSERT_EQ(real_failed, shapes_failed) << budget;
    if (real_failed) continue;
    EXPECT_EQ(a.peak_bytes, b.peak_bytes) << budget;
    EXPECT_EQ(a.live_bytes, b.live_bytes);
    EXPECT_EQ(a.evictions, b.evictions);
    EXPECT_EQ(a.rematerialized_ops, b.rematerialized_ops);
    EXPECT_EQ(a.rematerialized_bytes, b.rematerialized_bytes);
  }
}

}  // namespace memory_budget_test
