// Tape::set_memory_budget through the public API only, on the situations a budget must survive: every region
// kind at every boundary, errors caught mid-recording, budgets changed while recording, retained and partial
// backwards, evicted dropout values, shapes-only tapes and throwing user ops. Oracles: the run without a
// budget (values, gradients), the budget itself (peak ≤ budget).
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "random.hpp"
#include "remat/remat.hpp"

// Named after the file: this directory's test files are compiled as one translation unit (tests/CMakeLists.txt).
namespace set_memory_budget_test {

using remat::EvictionHeuristic;
using remat::Matrix;
using remat::Tape;
using remat::Var;

constexpr EvictionHeuristic heuristics[] = {EvictionHeuristic::dtr, EvictionHeuristic::dtr_eq,
                                            EvictionHeuristic::local};

template <class T>
bool same(const Matrix<T>& a, const Matrix<T>& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() &&
         std::memcmp(a.data(), b.data(), static_cast<std::size_t>(a.size()) * sizeof(T)) == 0;
}

// A step: records on the tape, returns the loss; `grads` collects the gradients after backward.
template <class T>
struct Step {
  std::function<Var<T>(Tape<T>&)> record;
  std::function<std::vector<Matrix<T>>()> grads;
};

struct Result {
  bool threw = false;
  std::size_t least = 0;
  remat::MemoryStats memory;
};

/// Runs `make()` (a fresh Step) with `budget`; on a throw in backward checks the strong guarantee and that
/// the tape is usable (budget 0 then backward gives plain grads).
template <class T>
Result run_checked(const std::function<Step<T>()>& make, std::size_t budget, EvictionHeuristic h,
                   const std::vector<Matrix<T>>& plain, const char* what) {
  Result r;
  Step<T> s = make();
  Tape<T> tape(99);
  tape.set_memory_budget(budget, h);
  Var<T> loss;
  try {
    loss = s.record(tape);
  } catch (const remat::memory_budget_error& e) {
    EXPECT_EQ(e.budget_bytes(), budget) << what;
    EXPECT_GT(e.least_budget_bytes(), budget) << what;
    EXPECT_LE(tape.memory().peak_bytes, budget) << what;
    r.threw = true;
    r.least = e.least_budget_bytes();
    return r;
  }
  EXPECT_LE(tape.memory().peak_bytes, budget) << what << " forward, budget " << budget;
  const remat::MemoryStats before = tape.memory();
  try {
    tape.backward(loss);
  } catch (const remat::memory_budget_error& e) {
    EXPECT_GT(e.least_budget_bytes(), budget) << what;
    const remat::MemoryStats after = tape.memory();
    EXPECT_EQ(after.live_bytes, before.live_bytes) << what;
    EXPECT_EQ(after.peak_bytes, before.peak_bytes) << what;
    EXPECT_EQ(after.evictions, before.evictions) << what;
    for (const auto& g : s.grads()) EXPECT_TRUE(g.isZero(0)) << what << " gradient written by a failed backward";
    tape.set_memory_budget(0);
    tape.backward(loss);
    auto g = s.grads();
    for (std::size_t k = 0; k < g.size(); ++k) EXPECT_TRUE(same(g[k], plain[k])) << what << " after retry " << k;
    r.threw = true;
    r.least = e.least_budget_bytes();
    return r;
  }
  r.memory = tape.memory();
  EXPECT_LE(r.memory.peak_bytes, budget) << what << " budget " << budget;
  auto g = s.grads();
  for (std::size_t k = 0; k < g.size(); ++k)
    EXPECT_TRUE(same(g[k], plain[k])) << what << " gradient " << k << " budget " << budget;
  return r;
}

template <class T>
std::vector<Matrix<T>> plain_grads(const std::function<Step<T>()>& make, remat::MemoryStats* m = nullptr) {
  Step<T> s = make();
  Tape<T> tape(99);
  Var<T> loss = s.record(tape);
  tape.backward(loss);
  if (m) *m = tape.memory();
  return s.grads();
}

/// Scans budgets from the plain peak down in `steps` steps; returns how many evicted and how many threw.
template <class T>
std::pair<int, int> scan(const std::function<Step<T>()>& make, const char* what, int steps = 40) {
  remat::MemoryStats pm;
  const auto plain = plain_grads<T>(make, &pm);
  const std::size_t step = std::max<std::size_t>(sizeof(T), pm.peak_bytes / steps / sizeof(T) * sizeof(T));
  int evicting = 0, threw = 0;
  for (EvictionHeuristic h : heuristics)
    for (std::size_t b = pm.peak_bytes; b > step; b -= step) {
      Result r = run_checked<T>(make, b, h, plain, what);
      if (r.threw) {
        ++threw;
        // the boundary: least − 1 must throw, and whatever least does, it must keep its promises
        if (r.least > 1) run_checked<T>(make, r.least - 1, h, plain, what);
        run_checked<T>(make, r.least, h, plain, what);
        run_checked<T>(make, r.least + 1, h, plain, what);
        break;
      }
      if (r.memory.evictions > 0) ++evicting;
    }
  return {evicting, threw};
}

// ---- steps ----

/// A transformer-ish block: sdpa (temporaries), layer_norm (extra), dropout, cross_entropy (extra), a shared
/// Parameter used by two layers, named values under save_only_these_names, nested regions.
template <class T>
std::function<Step<T>()> block_step(int regions) {
  return [regions] {
    auto w = std::make_shared<remat::Parameter<T>>(remat_test::random_matrix<T>(8, 8, 31));
    auto wo = std::make_shared<remat::Parameter<T>>(remat_test::random_matrix<T>(8, 8, 32));
    auto gain = std::make_shared<Var<T>>(), bias = std::make_shared<Var<T>>(), xin = std::make_shared<Var<T>>();
    Step<T> s;
    s.record = [=](Tape<T>& tape) {
      *xin = tape.variable(remat_test::random_matrix<T>(8, 8, 30));
      *gain = tape.variable(remat_test::random_matrix<T>(1, 8, 33));
      *bias = tape.variable(remat_test::random_matrix<T>(1, 8, 34));
      auto layer = [=, &tape](Var<T> h) {
        auto W = tape.variable(*w);  // the shared Parameter, recorded in each layer
        auto q = remat::checkpoint_name(remat::matmul(h, W), "q");
        auto a = remat::scaled_dot_product_attention(q, h, h, 2, 4, true);
        auto n = remat::layer_norm(remat::add(a, h), *gain, *bias);
        return remat::dropout(remat::tanh(remat::matmul(n, tape.variable(*wo))), 0.2);
      };
      Var<T> h = *xin;
      for (int l = 0; l < 3; ++l) {
        if (regions == 0)
          h = layer(h);
        else if (regions == 1)
          h = remat::checkpoint(layer, remat::policies::save_only_these_names({"q"}))(h);
        else if (regions == 2)
          h = remat::checkpoint(layer, remat::policies::dots_saveable)(h);
        else
          h = remat::checkpoint(
              [=](Var<T> v) { return remat::checkpoint(layer, remat::policies::nothing_saveable)(layer(v)); },
              remat::policies::save_only_these_names({"q"}))(h);
      }
      return remat::cross_entropy(h, std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7});
    };
    s.grads = [=] {
      return std::vector<Matrix<T>>{Matrix<T>(w->grad()), Matrix<T>(wo->grad()), Matrix<T>(gain->grad()),
                                    Matrix<T>(bias->grad()), Matrix<T>(xin->grad())};
    };
    return s;
  };
}

TEST(SetMemoryBudget, BlockDoubleEveryRegionKindAndBoundary) {
  for (int regions = 0; regions < 4; ++regions) {
    auto [evicting, threw] = scan<double>(block_step<double>(regions), "block double", 25);
    EXPECT_GT(evicting, 0) << regions;
    EXPECT_GT(threw, 0) << regions;
  }
}

TEST(SetMemoryBudget, BlockFloatEveryRegionKindAndBoundary) {
  for (int regions = 0; regions < 4; ++regions) {
    auto [evicting, threw] = scan<float>(block_step<float>(regions), "block float", 25);
    EXPECT_GT(evicting, 0) << regions;
    EXPECT_GT(threw, 0) << regions;
  }
}

// ---- error mid-recording, then budget 0 and go on with the same recording ----

TEST(SetMemoryBudget, CaughtErrorThenBudgetZeroContinuesTheSameRecording) {
  auto rec = [](Tape<double>& tape, Var<double>& x, bool catch_it, std::size_t budget) {
    x = tape.variable(remat_test::random_matrix<double>(6, 6, 40));
    Var<double> y = x;
    int caught = 0;
    for (int i = 0; i < 20; ++i) {
      if (catch_it && i == 5) tape.set_memory_budget(budget);
      try {
        y = remat::sin(remat::dropout(y, 0.1));
      } catch (const remat::memory_budget_error&) {
        ++caught;
        tape.set_memory_budget(0);
        y = remat::sin(remat::dropout(y, 0.1));
      }
    }
    return std::make_pair(remat::sum(y), caught);
  };
  Tape<double> plain(5);
  Var<double> px;
  auto pl = rec(plain, px, false, 0).first;
  plain.backward(pl);
  for (std::size_t budget : {std::size_t(100), std::size_t(600), std::size_t(900), std::size_t(1500)}) {
    Tape<double> tape(5);
    Var<double> x;
    auto [loss, caught] = rec(tape, x, true, budget);
    EXPECT_TRUE(same(Matrix<double>(loss.value()), Matrix<double>(pl.value()))) << budget;
    try {
      tape.backward(loss);
    } catch (const remat::memory_budget_error&) {
      tape.set_memory_budget(0);
      tape.backward(loss);
    }
    EXPECT_TRUE(same(Matrix<double>(x.grad()), Matrix<double>(px.grad()))) << budget;
    std::printf("budget %zu caught %d\n", budget, caught);
  }
}

// ---- budget changes mid recording and between forward and backward ----

TEST(SetMemoryBudget, BudgetLoweredBelowLiveBytesRaisedAndZeroedMidRecording) {
  auto rec = [](Tape<double>& tape, Var<double>& x, const std::vector<std::size_t>& budgets) {
    x = tape.variable(remat_test::random_matrix<double>(4, 8, 41));
    Var<double> y = x;
    std::vector<Var<double>> kept;
    for (int i = 0; i < 24; ++i) {
      if (i % 6 == 0 && !budgets.empty()) tape.set_memory_budget(budgets[static_cast<std::size_t>(i / 6)]);
      y = remat::tanh(remat::exp(remat::sin(y)));
      if (i % 3 == 0) kept.push_back(y);
    }
    Var<double> s = y;
    for (auto& k : kept) s = remat::add(s, k);
    return remat::sum(s);
  };
  Tape<double> plain;
  Var<double> px;
  auto pl = rec(plain, px, {});
  plain.backward(pl);
  const std::size_t v = 4 * 8 * sizeof(double);
  // (A budget set to 0 after evictions, followed by an op that reads an evicted value, crashes: not here.)
  for (auto budgets : std::vector<std::vector<std::size_t>>{
           {60 * v, 12 * v, 60 * v, 10 * v}, {12 * v, 0, 10 * v, 14 * v}, {40 * v, 10 * v, 9 * v, 30 * v}}) {
    Tape<double> tape;
    Var<double> x, loss;
    try {
      loss = rec(tape, x, budgets);
    } catch (const remat::memory_budget_error& e) {
      ADD_FAILURE() << "forward threw: " << e.what();
      continue;
    }
    if (tape.memory_budget() > 0) {
      EXPECT_LE(tape.memory().live_bytes, tape.memory_budget());
    }
    EXPECT_TRUE(same(Matrix<double>(loss.value()), Matrix<double>(pl.value())));
    // between forward and backward: lower it further, then raise it on failure
    tape.set_memory_budget(8 * v);
    try {
      tape.backward(loss, true);
    } catch (const remat::memory_budget_error&) {
      tape.set_memory_budget(30 * v);
      tape.backward(loss, true);
    }
    EXPECT_LE(tape.memory().live_bytes, tape.memory_budget());
    EXPECT_TRUE(same(Matrix<double>(x.grad()), Matrix<double>(px.grad())));
  }
}

// ---- gradient() and retain_graph twice under a budget ----

TEST(SetMemoryBudget, GradientAndRetainGraphTwiceUnderABudget) {
  auto rec = [](Tape<double>& tape, Var<double>& x, Var<double>& mid) {
    x = tape.variable(remat_test::random_matrix<double>(4, 8, 42));
    Var<double> y = x;
    for (int i = 0; i < 16; ++i) {
      y = remat::tanh(remat::dropout(y, 0.3));
      if (i == 7) mid = y;
    }
    return remat::sum(remat::multiply(y, mid));
  };
  Tape<double> plain(3);
  Var<double> px, pm;
  auto pl = rec(plain, px, pm);
  auto pg = plain.gradient(pl, {px, pm}, true);
  plain.backward(pl, true);
  plain.backward(pl);
  const std::size_t v = 4 * 8 * sizeof(double);
  for (EvictionHeuristic h : heuristics)
    for (std::size_t budget = 12 * v; budget >= 5 * v; budget -= 40) {
      Tape<double> tape(3);
      tape.set_memory_budget(budget, h);
      Var<double> x, mid, loss;
      try {
        loss = rec(tape, x, mid);
        auto g1 = tape.gradient(loss, {x, mid}, true);
        EXPECT_LE(tape.memory().peak_bytes, budget);
        auto g2 = tape.gradient(loss, {x, mid}, true);
        for (int k = 0; k < 2; ++k) {
          EXPECT_TRUE(same(g1[k], pg[k])) << budget << " g1 " << k;
          EXPECT_TRUE(same(g2[k], pg[k])) << budget << " g2 " << k;
        }
        tape.backward(loss, true);
        tape.backward(loss);
        EXPECT_LE(tape.memory().peak_bytes, budget);
        EXPECT_TRUE(same(Matrix<double>(x.grad()), Matrix<double>(px.grad()))) << budget;
        EXPECT_TRUE(same(Matrix<double>(mid.value()), Matrix<double>(pm.value()))) << budget;
      } catch (const remat::memory_budget_error& e) {
        EXPECT_GT(e.least_budget_bytes(), budget);
      }
    }
}

// ---- value() of evicted values with several handles, dropout ----

TEST(SetMemoryBudget, ValueOfEvictedDropoutValuesWithSeveralHandles) {
  auto rec = [](Tape<float>& tape, std::vector<Var<float>>& kept) {
    auto x = tape.constant(remat_test::random_matrix<float>(8, 8, 43));
    Var<float> y = x;
    for (int i = 0; i < 14; ++i) {
      y = remat::dropout(remat::sin(y), 0.5);
      kept.push_back(y);
      kept.push_back(y);  // a second handle
    }
  };
  Tape<float> plain(11);
  std::vector<Var<float>> pk;
  rec(plain, pk);
  const std::size_t v = 8 * 8 * sizeof(float);
  for (std::size_t budget : {4 * v, 5 * v, 7 * v}) {
    Tape<float> tape(11);
    tape.set_memory_budget(budget);
    std::vector<Var<float>> kept;
    rec(tape, kept);
    for (std::size_t i = kept.size(); i-- > 0;) {
      Matrix<float> a(kept[i].value());
      EXPECT_TRUE(same(a, Matrix<float>(pk[i].value()))) << budget << " " << i;
    }
    EXPECT_LE(tape.memory().peak_bytes, budget);
    kept.erase(kept.begin(), kept.begin() + 10);  // drop some handles, read again
    for (std::size_t i = 0; i < kept.size(); ++i)
      EXPECT_TRUE(same(Matrix<float>(kept[i].value()), Matrix<float>(pk[i + 10].value()))) << i;
  }
}

// ---- shapes-only under a budget gives the real run's figures ----

TEST(SetMemoryBudget, ShapesOnlyMatchesRealRunOnTheBlock) {
  for (int regions = 0; regions < 4; ++regions) {
    remat::MemoryStats pm;
    plain_grads<float>(block_step<float>(regions), &pm);
    for (std::size_t b = pm.peak_bytes; b > pm.peak_bytes / 4; b -= pm.peak_bytes / 20 / 4 * 4) {
      remat::MemoryStats m[2];
      bool failed[2] = {false, false};
      for (int k = 0; k < 2; ++k) {
        Step<float> s = block_step<float>(regions)();
        auto tape = k == 0 ? std::make_unique<Tape<float>>(99) : std::make_unique<Tape<float>>(remat::shapes_only, 99);
        tape->set_memory_budget(b);
        try {
          auto loss = s.record(*tape);
          tape->backward(loss);
          m[k] = tape->memory();
        } catch (const remat::memory_budget_error&) {
          failed[k] = true;
        }
      }
      ASSERT_EQ(failed[0], failed[1]) << regions << " " << b;
      if (failed[0]) break;
      EXPECT_EQ(m[0].peak_bytes, m[1].peak_bytes) << regions << " " << b;
      EXPECT_EQ(m[0].evictions, m[1].evictions) << regions << " " << b;
      EXPECT_EQ(m[0].rematerialized_ops, m[1].rematerialized_ops) << regions << " " << b;
      EXPECT_EQ(m[0].rematerialized_bytes, m[1].rematerialized_bytes) << regions << " " << b;
      EXPECT_EQ(m[0].replayed_ops, m[1].replayed_ops) << regions << " " << b;
    }
  }
}

// ---- a custom op whose forward throws under a budget ----

struct ThrowingOp : remat::OpBase {
  static constexpr const char* name = "throwing";
  static constexpr remat::OpKind kind = remat::OpKind::elementwise;
  static inline bool armed = false;
  static unsigned reads(remat::GradInputs) { return remat::reads_input0; }
  static remat::Shape output_shape(const remat::Shape* in, const Params&) { return in[0]; }
  template <class T>
  static void forward(const remat::ForwardContext<T>& c) {
    if (armed) throw std::runtime_error("boom");
    c.out().array() = c.in(0).array() * c.in(0).array();
  }
  template <class T>
  static void backward(const remat::BackwardContext<T>& c) {
    if (c.wants_grad(0)) c.add_grad(0, T(2) * c.grad_out().array() * c.in(0).array());
  }
  static double flops(const remat::Shape*, int, const remat::Shape& out) { return double(out.size()); }
};

TEST(SetMemoryBudget, CustomOpThrowingUnderABudgetLeavesTheTapeAsItWas) {
  auto rec = [](Tape<double>& tape, Var<double>& x, bool throw_once) {
    x = tape.variable(remat_test::random_matrix<double>(4, 8, 44));
    Var<double> y = x;
    std::vector<Var<double>> kept;
    for (int i = 0; i < 12; ++i) {
      y = remat::tanh(y);
      kept.push_back(y);
    }
    if (throw_once) {
      const std::size_t size = tape.size();
      const remat::MemoryStats before = tape.memory();
      ThrowingOp::armed = true;
      EXPECT_THROW(remat::apply_op<ThrowingOp>(kept[0]), std::runtime_error);  // kept[0] is likely evicted
      ThrowingOp::armed = false;
      EXPECT_EQ(tape.size(), size);
      EXPECT_LE(tape.memory().live_bytes, std::max(before.live_bytes, tape.memory_budget()));
      EXPECT_LE(tape.memory().peak_bytes, tape.memory_budget());
    }
    Var<double> s = remat::apply_op<ThrowingOp>(y);
    for (auto& k : kept) s = remat::add(s, remat::apply_op<ThrowingOp>(k));
    return remat::sum(s);
  };
  Tape<double> plain;
  Var<double> px;
  auto pl = rec(plain, px, false);
  plain.backward(pl);
  const std::size_t v = 4 * 8 * sizeof(double);
  for (std::size_t budget : {6 * v, 8 * v, 10 * v}) {
    Tape<double> tape;
    tape.set_memory_budget(budget);
    Var<double> x;
    Var<double> loss;
    try {
      loss = rec(tape, x, true);
      tape.backward(loss);
    } catch (const remat::memory_budget_error& e) {
      EXPECT_GT(e.least_budget_bytes(), budget);
      continue;
    }
    EXPECT_LE(tape.memory().peak_bytes, budget);
    EXPECT_TRUE(same(Matrix<double>(x.grad()), Matrix<double>(px.grad()))) << budget;
  }
}

// An op reading a value evicted under a budget, after the budget was set to 0: the op regenerates it (a regression
// test: it read a null buffer, a SIGSEGV), and the result is bitwise the unbudgeted one.
TEST(SetMemoryBudget, OpReadingEvictedValueAfterBudgetZero) {
  const std::size_t v = 4 * 8 * sizeof(double);
  auto run = [&](bool budget) {
    remat::Tape<double> tape;
    if (budget) tape.set_memory_budget(3 * v);
    auto x = tape.constant(remat_test::random_matrix<double>(4, 8, 41));
    remat::Var<double> a = remat::sin(x);
    remat::Var<double> y = a;
    for (int i = 0; i < 6; ++i) y = remat::sin(y);
    if (budget) {
      EXPECT_GT(tape.memory().evictions, 0u);
      tape.set_memory_budget(0);
    }
    remat::Matrix<double> s = remat::add(y, a).value();
    return s;
  };
  const remat::Matrix<double> plain = run(false), budgeted = run(true);
  ASSERT_EQ(plain.size(), budgeted.size());
  EXPECT_EQ(std::memcmp(plain.data(), budgeted.data(), sizeof(double) * static_cast<std::size_t>(plain.size())), 0);
}

}  // namespace set_memory_budget_test
