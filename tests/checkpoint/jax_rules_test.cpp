// JAX's checkpoint rules, checked where remat once differed from them, with the counts JAX's own tests
// expect (tests/api_test.py in jax-ml/jax): what a checkpointed function returns is one of its values like
// any other, so a policy that drops it drops it, and its region's replay regenerates it for the region's own
// readers; a reader outside the function reads it at the level of the functions enclosing both.
#include <gtest/gtest.h>

#include <functional>
#include <vector>

#include "checkpoint_support.hpp"
#include "memory.hpp"
#include "remat/op.hpp"
#include "remat/remat.hpp"

namespace jax_rules_test {

using remat::Matrix;
using remat::Tape;
using remat::Var;

/// Forward evaluations of add_one since the last reset.
inline int evaluations = 0;

/// JAX's test primitive add_one: y = x + 1, whose derivative rule reads its own output (JAX: pout * t), counted
/// on every forward evaluation (the first pass and replays alike).
struct AddOneOp : remat::UnaryElementwise<AddOneOp> {
  static constexpr const char* name = "add_one";
  static constexpr unsigned residuals = remat::reads_output;
  static constexpr double flops_per_element = 1;
  struct Params {};
  template <class X>
  static auto value(const X& x, const Params&) {
    ++evaluations;
    return x + typename X::Scalar(1);
  }
  template <class X, class Y, class G>
  static auto derivative(const X&, const Y& y, const G& g, const Params&) {
    return g * y;
  }
};

Var<double> add_one(const Var<double>& x) {
  return remat::apply_op<AddOneOp>(x);
}

using Fn = std::function<Var<double>(Var<double>)>;

Fn checkpointed(Fn f) {
  return [f](Var<double> x) { return remat::checkpoint(f, remat::policies::nothing_saveable)(x); };
}

/// The forward and backward evaluations of add_one for loss = sum(f(x)), x a [1,1] variable; sum reads nothing.
std::pair<int, int> evaluations_of(const Fn& f) {
  Tape<double> tape;
  const Var<double> x = tape.variable(Matrix<double>::Constant(1, 1, 0.5));
  evaluations = 0;
  const Var<double> loss = remat::sum(f(x));
  const int forward = evaluations;
  evaluations = 0;
  tape.backward(loss);
  return {forward, evaluations};
}

TEST(JaxRules, RematEvalCounter) {
  // JAX's test_remat_eval_counter: f = remat(add_one), g = remat(x ↦ add_one(f(x))). 2 calls evaluate g;
  // the backward makes 3: 2 transposing g (its replay recomputes f's output and its own), 1 transposing f.
  const Fn f = checkpointed(add_one);
  const Fn g = checkpointed([f](Var<double> x) { return add_one(f(x)); });
  EXPECT_EQ(evaluations_of(g), std::make_pair(2, 3));
  // The same with f not checkpointed (JAX: call(add_one)): 2, then 2 transposing g.
  const Fn g2 = checkpointed([](Var<double> x) { return add_one(add_one(x)); });
  EXPECT_EQ(evaluations_of(g2), std::make_pair(2, 2));
}

/// JAX's recursive_checkpoint (the jax.checkpoint docstring): f1(checkpoint(f2)(x)) over the halves.
Fn recursive_checkpoint(const std::vector<Fn>& funs) {
  if (funs.size() == 1) return funs[0];
  if (funs.size() == 2) {
    const Fn a = funs[0], b = funs[1];
    return [a, b](Var<double> x) { return a(b(x)); };
  }
  const std::size_t half = funs.size() / 2;
  const Fn f1 = recursive_checkpoint(std::vector<Fn>(funs.begin(), funs.begin() + static_cast<std::ptrdiff_t>(half)));
  const Fn f2 =
      checkpointed(recursive_checkpoint(std::vector<Fn>(funs.begin() + static_cast<std::ptrdiff_t>(half), funs.end())));
  return [f1, f2](Var<double> x) { return f1(f2(x)); };
}

TEST(JaxRules, RecursiveCheckpointRecomputeCounts) {
  // JAX's counts for n add_ones under recursive_checkpoint: the backward evaluates 2, 8, 24 for n = 4, 8, 16
  // (n/2 + twice the count of n/2: each checkpoint's replay recomputes its whole function, outputs included,
  // and its nested checkpoints replay again). remat made 1, 5, 17 while it kept every output.
  for (const auto& [n, backward] : std::vector<std::pair<int, int>>{{4, 2}, {8, 8}, {16, 24}}) {
    SCOPED_TRACE("n = " + std::to_string(n));
    const Fn f = recursive_checkpoint(std::vector<Fn>(static_cast<std::size_t>(n), add_one));
    EXPECT_EQ(evaluations_of(f), std::make_pair(n, backward));
  }
}

TEST(JaxRules, AnOutputReadOutsideStaysAtTheEnclosingLevelAndIsStillReplayedForItsRegion) {
  // y = checkpoint(tanh(x·W1))(x) under nothing_saveable, then z = y·W2 (dW2 reads y), loss = sum(z). y is
  // read outside (by the second product's backward), so it stays after the forward pass as a residual of
  // level 0 (JAX: a residual of the enclosing function); tanh's backward, inside the region, reads y at the
  // region's level, so the replay recomputes the product and tanh (2 ops), as JAX's does: the value kept for
  // the outside reader went once that reader's backward ran.
  Tape<double> tape;
  const Var<double> x = tape.constant(checkpoint_test::random_matrix<double>(4, 8, 1));
  const Var<double> w1 = tape.variable(checkpoint_test::random_matrix<double>(8, 8, 2, 0.3));
  const Var<double> w2 = tape.variable(checkpoint_test::random_matrix<double>(8, 8, 3, 0.3));
  const Var<double> loss =
      remat::sum(remat::matmul(remat::checkpoint([&](Var<double> h) { return remat::tanh(remat::matmul(h, w1)); },
                                                 remat::policies::nothing_saveable)(x),
                               w2));
  // x (dW1, and the replay), y (dW2), W1 (the replay re-runs x·W1: JAX's residual of a captured input) and W2
  // (dy).
  EXPECT_EQ(tape.memory().saved_bytes, 2 * remat_test::bytes<double>(4, 8) + 2 * remat_test::bytes<double>(8, 8));
  tape.backward(loss);
  EXPECT_EQ(tape.memory().replayed_ops, 2u);
}

TEST(JaxRules, ConstantsMadeInsideAreNotResiduals) {
  // JAX's test_constants_not_hoisted (jax PR 8191): checkpoint(x ↦ zeros_like(x)·x) under nothing_saveable
  // saves nothing: the product's dx reads the zeros, which the replay writes again (zeros_like reads no tensor),
  // and nothing reads x. zeros_like(x)·sin(x) saves only x (sin's backward reads it). [3,4] doubles: 96 B.
  const std::size_t x_bytes = remat_test::bytes<double>(3, 4);
  for (const bool with_sin : {false, true}) {
    SCOPED_TRACE(with_sin ? "zeros_like(x) * sin(x)" : "zeros_like(x) * x");
    Tape<double> tape;
    const Var<double> x = tape.variable(checkpoint_test::random_matrix<double>(3, 4, 4));
    const Var<double> loss = remat::sum(
        remat::checkpoint([with_sin](Var<double> v) { return remat::zeros_like(v) * (with_sin ? remat::sin(v) : v); },
                          remat::policies::nothing_saveable)(x));
    EXPECT_EQ(tape.memory().saved_bytes, with_sin ? x_bytes : 0u);
    tape.backward(loss);
    EXPECT_TRUE((Matrix<double>(x.grad()).array() == 0).all());
    EXPECT_EQ(tape.memory().replayed_ops, 1u) << "the zeros, written again";
  }
  // full_like's value and shape, on a tape that computes and one that only counts.
  Tape<float> tape;
  const Var<float> a = tape.constant(Matrix<float>::Random(2, 5));
  const Var<float> f = remat::full_like(a, 2.5);
  EXPECT_EQ(f.rows(), 2);
  EXPECT_EQ(f.cols(), 5);
  EXPECT_TRUE((Matrix<float>(f.value()).array() == 2.5f).all());
  EXPECT_TRUE((Matrix<float>(remat::ones_like(a).value()).array() == 1.0f).all());
}

}  // namespace jax_rules_test
