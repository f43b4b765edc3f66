// The backward's dry run is skipped only when it is redundant (detail/dry_run_cache.hpp): a training loop that
// records the same graph every step skips it from its third step on, and any change that changes what the
// sweep allocates — the policy's saved set with the same ops, the shapes, a Parameter whose gradient is
// defined, gradient() instead of backward(), a pool emptied in between — runs it again. Each step's memory()
// figures (the predicted peak included) must equal those of a tape that ran the changed step on its own,
// and its gradients the fresh tape's. In builds with assertions on, every skip also runs the dry run and
// asserts that it finds what the skip assumed (the test suite's safety net); here the skip's decisions
// themselves are checked, in every build.
#include <gtest/gtest.h>

#include <cstddef>
#include <new>
#include <vector>

#include "random.hpp"
#include "remat/remat.hpp"

namespace dry_run_skip_test {

using remat::Matrix;
using remat::Parameter;
using remat::Tape;
using V = remat::Var<double>;

enum class Policy { none, nothing_saveable, everything_saveable };

/// One recorded step: two tanh layers (each in a checkpoint region unless Policy::none) and a sum.
struct Step {
  remat::Index batch = 4;
  Policy policy = Policy::none;
  bool zero_grad = true;
};

struct Model {
  Parameter<double> w1{remat_test::random_matrix<double>(3, 5, 11)}, b1{remat_test::random_matrix<double>(1, 5, 12)};
  Parameter<double> w2{remat_test::random_matrix<double>(5, 2, 13)}, b2{remat_test::random_matrix<double>(1, 2, 14)};
  std::vector<Parameter<double>*> all() { return {&w1, &b1, &w2, &b2}; }
};

/// Records `s` on `tape` (cleared first) and returns the loss; `w1`, if given, gets w1's Var.
V record(Tape<double>& tape, Model& m, const Step& s, V* w1_out = nullptr) {
  tape.clear();
  if (s.zero_grad)
    for (Parameter<double>* p : m.all()) p->zero_grad();
  V w1 = tape.variable(m.w1), b1 = tape.variable(m.b1), w2 = tape.variable(m.w2), b2 = tape.variable(m.b2);
  if (w1_out) *w1_out = w1;
  auto layer1 = [&](V h) { return remat::tanh(remat::linear(h, w1, b1)); };
  auto layer2 = [&](V h) { return remat::tanh(remat::linear(h, w2, b2)); };
  V h = tape.constant(remat_test::random_matrix<double>(s.batch, 3, 15));
  switch (s.policy) {
    case Policy::none:
      h = layer2(layer1(h));
      break;
    case Policy::nothing_saveable:
      h = remat::checkpoint(
          layer2, remat::policies::nothing_saveable)(remat::checkpoint(layer1, remat::policies::nothing_saveable)(h));
      break;
    case Policy::everything_saveable:
      h = remat::checkpoint(layer2, remat::policies::everything_saveable)(
          remat::checkpoint(layer1, remat::policies::everything_saveable)(h));
      break;
  }
  return remat::sum(h);
}

std::size_t skipped(const V& loss) {
  return remat::detail::VarAccess::state(loss)->dry_runs_skipped();
}

/// The figures that do not depend on the pool's history (cached_bytes does).
void expect_same_figures(const remat::MemoryStats& a, const remat::MemoryStats& b) {
  EXPECT_EQ(a.live_bytes, b.live_bytes);
  EXPECT_EQ(a.peak_bytes, b.peak_bytes);
  EXPECT_EQ(a.saved_bytes, b.saved_bytes);
  EXPECT_EQ(a.replayed_bytes, b.replayed_bytes);
  EXPECT_EQ(a.replayed_ops, b.replayed_ops);
}

std::vector<Matrix<double>> gradients(Model& m) {
  std::vector<Matrix<double>> g;
  for (Parameter<double>* p : m.all()) g.emplace_back(p->grad());
  return g;
}

/// What running steps in order on one tape gives.
struct History {
  remat::MemoryStats before_backward, after_backward;
  std::vector<Matrix<double>> grads;
  std::vector<std::size_t> skipped;  // after each step
};

History run_steps(const std::vector<Step>& steps) {
  Tape<double> tape;
  Model m;
  History r;
  for (const Step& s : steps) {
    V loss = record(tape, m, s);
    r.before_backward = tape.memory();
    tape.backward(loss);
    r.after_backward = tape.memory();
    r.skipped.push_back(skipped(loss));
  }
  r.grads = gradients(m);
  return r;
}

/// The last step of `changed` must not skip its dry run, and its figures and gradients must equal those
/// of `reference` (the same gradients history, no skip possible at its last step).
void expect_changed_step_runs_its_dry_run(const std::vector<Step>& changed, const std::vector<Step>& reference) {
  const History a = run_steps(changed), b = run_steps(reference);
  ASSERT_GE(a.skipped.size(), 2u);
  EXPECT_EQ(a.skipped.back(), a.skipped[a.skipped.size() - 2]) << "the changed step skipped its dry run";
  expect_same_figures(a.after_backward, b.after_backward);
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (std::size_t k = 0; k < a.grads.size(); ++k) EXPECT_EQ(a.grads[k], b.grads[k]) << "parameter " << k;
}

TEST(DryRunSkip, ASteadyLoopSkipsFromItsThirdStepWithTheSameFigures) {
  for (Policy policy : {Policy::none, Policy::nothing_saveable, Policy::everything_saveable}) {
    SCOPED_TRACE(static_cast<int>(policy));
    const Step s{4, policy, true};
    // Step 1 finds no Parameter gradient buffer to exchange, step 2 does: both run their dry run.
    const History r = run_steps({s, s, s, s});
    EXPECT_EQ(r.skipped, (std::vector<std::size_t>{0, 0, 1, 2}));
    const History two = run_steps({s, s});
    expect_same_figures(r.after_backward, two.after_backward);
    EXPECT_EQ(r.after_backward.cached_bytes, two.after_backward.cached_bytes) << "the skip reserved nothing less";
    for (std::size_t k = 0; k < r.grads.size(); ++k) EXPECT_EQ(r.grads[k], two.grads[k]);
  }
}

TEST(DryRunSkip, TheSameOpsWithAnotherSavedSetRunTheDryRun) {
  const Step nothing{4, Policy::nothing_saveable, true}, everything{4, Policy::everything_saveable, true};
  expect_changed_step_runs_its_dry_run({nothing, nothing, nothing, everything}, {nothing, everything});
  expect_changed_step_runs_its_dry_run({everything, everything, everything, nothing}, {everything, nothing});
}

TEST(DryRunSkip, OtherShapesRunTheDryRun) {
  const Step small{4, Policy::none, true}, large{7, Policy::none, true};
  expect_changed_step_runs_its_dry_run({small, small, small, large}, {small, large});
  const Step small_region{4, Policy::nothing_saveable, true}, large_region{7, Policy::nothing_saveable, true};
  expect_changed_step_runs_its_dry_run({small_region, small_region, small_region, large_region},
                                       {small_region, large_region});
}

TEST(DryRunSkip, AParameterWhoseGradientIsDefinedRunsTheDryRun) {
  const Step zeroed{4, Policy::none, true}, accumulating{4, Policy::none, false};
  expect_changed_step_runs_its_dry_run({zeroed, zeroed, zeroed, accumulating}, {zeroed, zeroed, accumulating});
}

TEST(DryRunSkip, GradientAfterBackwardsRunsTheDryRun) {
  const Step s{4, Policy::none, true};
  Model m, fresh_model;
  Tape<double> tape, fresh;
  V w1, fresh_w1;
  for (int i = 0; i < 3; ++i) tape.backward(record(tape, m, s, &w1));
  V loss = record(tape, m, s, &w1);
  const std::size_t before = skipped(loss);
  ASSERT_EQ(before, 1u);
  const std::vector<Matrix<double>> g = tape.gradient(loss, {w1});
  EXPECT_EQ(skipped(loss), before);
  V fresh_loss = record(fresh, fresh_model, s, &fresh_w1);
  const std::vector<Matrix<double>> expected = fresh.gradient(fresh_loss, {fresh_w1});
  EXPECT_EQ(g[0], expected[0]);
  expect_same_figures(tape.memory(), fresh.memory());
}

/// The pool emptied between two equal steps: the dry run runs and its reservation meets the failing
/// system allocator, so the backward throws std::bad_alloc before changing anything.
TEST(DryRunSkip, AnEmptiedPoolRunsTheDryRunAndItsReservationCanFail) {
  Tape<double> tape;
  Model m;
  const Step s{4, Policy::none, true};
  for (int i = 0; i < 3; ++i) tape.backward(record(tape, m, s));
  V loss = record(tape, m, s);
  const std::size_t before = skipped(loss);
  ASSERT_EQ(before, 1u);
  tape.release_cached_memory();
  const remat::MemoryStats m0 = tape.memory();
  struct Hook {
    static void fail(std::size_t) { throw std::bad_alloc(); }
  };
  remat::detail::allocation_hook = &Hook::fail;
  EXPECT_THROW(tape.backward(loss), std::bad_alloc);
  remat::detail::allocation_hook = nullptr;
  const remat::MemoryStats m1 = tape.memory();
  expect_same_figures(m0, m1);
  EXPECT_EQ(m0.cached_bytes, m1.cached_bytes);
  tape.backward(loss);
  EXPECT_EQ(skipped(loss), before);
}

}  // namespace dry_run_skip_test
