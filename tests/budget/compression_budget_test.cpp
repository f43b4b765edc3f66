// Compressed residuals (policies::save_compressed) under a memory budget (Tape::set_memory_budget): the budget is
// transparent to them. Each step is compared with the same step without a budget, an oracle that shares none of
// the budget's bookkeeping: gradients bitwise equal (the lossy formats' error included: the budget changes no bit
// of it), the peak within the budget, and estimate_memory equal to the real run.
//
// What each case would catch: a compressed value evicted and regenerated exact (its readers would read it exact
// where the run without a budget reads it decoded); a consumer regenerated from a decoded input it was first
// computed from exactly, or holding such an input past the moment it is packed; a relu mask read from a lossy
// int8 decode (small positive values decode to 0); a packed buffer allocated over the budget.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "random.hpp"
#include "remat/estimate.hpp"
#include "remat/remat.hpp"

namespace compression_budget_test {

using remat::Compression;
using remat::EvictionHeuristic;
using remat::Matrix;
using remat::Parameter;
using remat::Tape;
using remat::Var;
namespace policies = remat::policies;
using V = Var<float>;
using Policy = std::function<policies::Decision(const remat::OpInfo&)>;

constexpr remat::Index N = 32, D = 64;
constexpr int blocks = 6;

bool bitwise_equal(const Matrix<float>& a, const Matrix<float>& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() &&
         std::memcmp(a.data(), b.data(), static_cast<std::size_t>(a.size()) * sizeof(float)) == 0;
}

/// One block: two products, three relus, a tanh. relu(b)'s output is read only by its own backward (its sign);
/// relu(a)'s also by the second product's backward (in full).
V block(const V& h, const V& w1, const V& w2) {
  const V a = remat::matmul(h, w1);
  const V r = remat::relu(a);
  const V b = remat::matmul(r, w2);
  return remat::tanh(remat::relu(b) + r);
}

struct Model {
  std::vector<Parameter<float>> w;
  Matrix<float> x = remat_test::random_matrix<float>(N, D, 3);
  Model() {
    for (int i = 0; i < 2 * blocks; ++i) w.emplace_back(remat_test::random_matrix<float>(D, D, 10 + i) * 0.25f);
  }
  /// The loss of `blocks` blocks, each checkpointed with `policy` (nested: pairs of blocks under an outer region
  /// that saves nothing, when `nested`).
  V loss(Tape<float>& tape, const Policy& policy, bool nested) {
    std::vector<V> ws;
    for (Parameter<float>& p : w) ws.push_back(tape.variable(p));
    V h = tape.constant(x);
    auto one = [&](const V& in, int i) {
      return remat::checkpoint(block, i % 2 == 0 ? policy : Policy(policies::dots_saveable))(in, ws[2 * i],
                                                                                             ws[2 * i + 1]);
    };
    for (int i = 0; i < blocks; i += 2) {
      if (nested) {
        h = remat::checkpoint([&](const V& in) { return one(one(in, i), i + 1); }, policies::nothing_saveable)(h);
      } else {
        h = one(one(h, i), i + 1);
      }
    }
    return remat::sum(remat::square(h));
  }
  std::vector<Matrix<float>> take_grads() {
    std::vector<Matrix<float>> g;
    for (Parameter<float>& p : w) {
      g.push_back(p.grad());
      p.zero_grad();
    }
    return g;
  }
};

struct Case {
  const char* name;
  Policy policy;
  bool nested;
};

std::vector<Case> cases() {
  const Policy relus = policies::ops_named({"relu"});
  return {
      {"control: dots, uncompressed", policies::dots_saveable, false},
      {"int8 per row, everything",
       policies::save_compressed(Compression::int8_per_row(), policies::everything_saveable), false},
      {"bf16, dots", policies::save_compressed(Compression::bf16(), policies::dots_saveable), false},
      {"sign, relus", policies::save_compressed(Compression::sign(), relus), false},
      {"int8 groups of 32, relus", policies::save_compressed(Compression::int8_per_group(32), relus), false},
      {"bf16, everything, nested", policies::save_compressed(Compression::bf16(), policies::everything_saveable), true},
  };
}

TEST(CompressionUnderABudget, GradientsAreTheUnbudgetedRunsBitwiseAndThePeakStaysWithin) {
  Model m;
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    std::vector<Matrix<float>> want;
    std::size_t peak = 0;
    {
      Tape<float> tape;
      tape.backward(m.loss(tape, c.policy, c.nested));
      want = m.take_grads();
      peak = tape.memory().peak_bytes;
    }
    int evicting_runs = 0;
    for (const EvictionHeuristic h : {EvictionHeuristic::dtr, EvictionHeuristic::dtr_eq, EvictionHeuristic::local}) {
      for (int percent = 100; percent >= 40; percent -= 3) {
        const double fraction = percent / 100.0;
        const auto budget = static_cast<std::size_t>(fraction * static_cast<double>(peak));
        SCOPED_TRACE("budget " + std::to_string(budget) + " of a peak of " + std::to_string(peak) + ", heuristic " +
                     std::to_string(static_cast<int>(h)));
        Tape<float> tape;
        tape.set_memory_budget(budget, h);
        try {
          tape.backward(m.loss(tape, c.policy, c.nested));
        } catch (const remat::memory_budget_error& e) {
          m.take_grads();
          continue;  // below what this step can hold: the error says so; the budgets above must pass
        }
        const std::vector<Matrix<float>> got = m.take_grads();
        for (std::size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(bitwise_equal(got[i], want[i])) << "weight " << i;
        const remat::MemoryStats s = tape.memory();
        EXPECT_LE(s.peak_bytes, budget);
        if (s.evictions > 0) ++evicting_runs;
        const remat::MemoryEstimate e = remat::estimate_memory<float>([&](Tape<float>& t) {
          t.set_memory_budget(budget, h);
          return m.loss(t, c.policy, c.nested);
        });
        EXPECT_EQ(e.peak_bytes, s.peak_bytes);
      }
    }
    EXPECT_GT(evicting_runs, 0) << "no budget evicted anything: the test tests nothing";
  }
}

/// Two weights, a batch and the int8 policy of the two tests below, and their budget sweep.
struct TwoWeights {
  Parameter<float> w1, w2;
  Matrix<float> xm;
  Policy int8 = policies::save_compressed(Compression::int8_per_row(), policies::everything_saveable);
  explicit TwoWeights(std::uint64_t seed)
      : w1(remat_test::random_matrix<float>(D, D, seed) * 0.25f),
        w2(remat_test::random_matrix<float>(D, D, seed + 1) * 0.25f),
        xm(remat_test::random_matrix<float>(N, D, seed + 2)) {}
  std::vector<Matrix<float>> take_grads() {
    std::vector<Matrix<float>> g{w1.grad(), w2.grad()};
    w1.zero_grad();
    w2.zero_grad();
    return g;
  }
  /// Runs `step` without a budget, then with budgets from `from` % of its peak down to 40 % in steps of `by` under
  /// every heuristic; after each run a budget meets, `each(tape, budget, gradients, unbudgeted gradients)`.
  template <class Step, class Each>
  void sweep(const Step& step, int from, int by, const Each& each) {
    std::vector<Matrix<float>> want;
    std::size_t peak = 0;
    {
      Tape<float> tape;
      tape.backward(step(tape));
      want = take_grads();
      peak = tape.memory().peak_bytes;
    }
    for (const EvictionHeuristic h : {EvictionHeuristic::dtr, EvictionHeuristic::dtr_eq, EvictionHeuristic::local}) {
      for (int percent = from; percent >= 40; percent -= by) {
        const std::size_t budget = peak * static_cast<std::size_t>(percent) / 100;
        SCOPED_TRACE("budget " + std::to_string(budget) + ", heuristic " + std::to_string(static_cast<int>(h)));
        Tape<float> tape;
        tape.set_memory_budget(budget, h);
        try {
          tape.backward(step(tape));
        } catch (const remat::memory_budget_error&) {
          take_grads();
          continue;
        }
        each(tape, budget, take_grads(), want);
      }
    }
  }
};

/// y = square(x·W1) checkpointed with its product stored as int8 (read by square's backward), then z = y·W2 (whose
/// backward reads y) and a chain of tanh that needs room: y, computed from the product exact, is the cheap victim.
/// Regenerated from the product's int8 decode it would differ from the y dW2 reads without a budget: it may be
/// evicted only while it can be computed again as it was, so the budget evicts the chain's values instead.
TEST(CompressionUnderABudget, AValueComputedFromAnExactInputIsNotRegeneratedFromItsDecode) {
  TwoWeights m(41);
  auto step = [&](Tape<float>& tape) {
    const V y = remat::checkpoint([](const V& x, const V& w) { return remat::square(remat::matmul(x, w)); }, m.int8)(
        tape.constant(m.xm), tape.variable(m.w1));
    V z = remat::matmul(y, tape.variable(m.w2));
    for (int i = 0; i < 8; ++i) z = remat::tanh(z);
    return remat::sum(z);
  };
  int evicting_runs = 0;
  m.sweep(step, 95, 5,
          [&](const Tape<float>& tape, std::size_t budget, const std::vector<Matrix<float>>& got,
              const std::vector<Matrix<float>>& want) {
            EXPECT_TRUE(bitwise_equal(got[0], want[0]));
            EXPECT_TRUE(bitwise_equal(got[1], want[1]));
            EXPECT_LE(tape.memory().peak_bytes, budget);
            if (tape.memory().evictions > 0) ++evicting_runs;
          });
  EXPECT_GT(evicting_runs, 0) << "no budget evicted anything: the test tests nothing";
}

/// A chain of tanh fills the budget, then a checkpointed square(x·W1) whose product is stored as int8: packing it
/// takes a packed buffer before the product's goes, at the step's fullest moment. The budget makes room for that
/// buffer first, so the peak stays within the budget at every budget the step can meet.
TEST(CompressionUnderABudget, PackingAValueMakesRoomForItsPackedBuffer) {
  TwoWeights m(44);
  auto step = [&](Tape<float>& tape) {
    V z = remat::matmul(tape.constant(m.xm), tape.variable(m.w2));
    for (int i = 0; i < 8; ++i) z = remat::tanh(z);
    const V y = remat::checkpoint([](const V& x, const V& w) { return remat::square(remat::matmul(x, w)); }, m.int8)(
        z, tape.variable(m.w1));
    return remat::sum(y);
  };
  int met = 0;
  m.sweep(step, 100, 1,
          [&](const Tape<float>& tape, std::size_t budget, const std::vector<Matrix<float>>&,
              const std::vector<Matrix<float>>&) {
            EXPECT_LE(tape.memory().peak_bytes, budget);
            ++met;
          });
  EXPECT_GT(met, 30);
}

}  // namespace compression_budget_test
