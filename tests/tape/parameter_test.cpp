// Parameters between forward and backward: destroyed, moved, reallocated inside a std::vector,
// reassigned; temporaries rejected at compile time; gradients that accumulate across backward passes and
// tapes (micro-batches), zero_grad, gradient() leaving accumulated gradients alone; nn::Adam sharing the
// parameters' storage. The sanitizer build runs every case: none may read freed memory.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "expect_error.hpp"
#include "random.hpp"
#include "remat/nn/adam.hpp"
#include "remat/remat.hpp"

namespace parameter_test {

using remat::Matrix;
using remat::Parameter;
using remat::Tape;
using remat::Var;

template <class A, class B>
bool same_bits(const A& a, const B& b) {
  const Matrix<double> x = a, y = b;
  return x.rows() == y.rows() && x.cols() == y.cols() &&
         std::memcmp(x.data(), y.data(), sizeof(double) * static_cast<std::size_t>(x.size())) == 0;
}

Matrix<double> input() {
  return remat_test::random_matrix(5, 3, 1);
}
Matrix<double> weight() {
  return remat_test::random_matrix(3, 4, 2);
}

/// loss(W) = sum(tanh(x·W)) and its gradient, from a Parameter that stays alive throughout.
Matrix<double> reference_gradient() {
  Parameter<double> p(weight());
  Tape<double> tape;
  tape.backward(remat::sum(remat::tanh(remat::matmul(tape.constant(input()), tape.variable(p)))));
  return p.grad();
}

// ---- lifetime: the tape shares the Parameter's storage ----

TEST(Parameter, DestroyedBeforeBackwardStillGetsItsGradient) {
  Tape<double> tape;
  Var<double> w, loss;
  {
    Parameter<double> p(weight());
    w = tape.variable(p);
    loss = remat::sum(remat::tanh(remat::matmul(tape.constant(input()), w)));
  }  // p is gone; the tape's node still references its storage
  tape.backward(loss);
  EXPECT_TRUE(same_bits(w.grad(), reference_gradient()));
  EXPECT_TRUE(same_bits(w.value(), weight()));
}

TEST(Parameter, VectorReallocatedBetweenForwardAndBackward) {
  std::vector<Parameter<double>> ps;
  ps.emplace_back(weight());
  Tape<double> tape;
  Var<double> loss = remat::sum(remat::tanh(remat::matmul(tape.constant(input()), tape.variable(ps[0]))));
  const Parameter<double>* before = ps.data();
  for (int i = 0; i < 100; ++i) ps.emplace_back(Matrix<double>::Zero(1, 1));
  ASSERT_NE(ps.data(), before) << "the vector must have reallocated for this test to mean anything";
  tape.backward(loss);
  EXPECT_TRUE(same_bits(ps[0].grad(), reference_gradient())) << "the moved element carries the gradient";
  for (std::size_t i = 1; i < ps.size(); ++i) EXPECT_FALSE(ps[i].has_grad());
}

TEST(Parameter, MovedAfterRecordingCarriesItsGradient) {
  Parameter<double> p(weight());
  Tape<double> tape;
  Var<double> loss = remat::sum(remat::tanh(remat::matmul(tape.constant(input()), tape.variable(p))));
  Parameter<double> q = std::move(p);
  EXPECT_EQ(p.rows(), 0) << "a moved-from Parameter is empty";
  tape.backward(loss);
  EXPECT_TRUE(same_bits(q.grad(), reference_gradient()));
  EXPECT_FALSE(p.has_grad());
  p = Parameter<double>(weight());  // a moved-from Parameter may be assigned and used again
  EXPECT_EQ(p.rows(), 3);
}

TEST(Parameter, MoveAssignedOverARecordedOneIsStale) {
  Parameter<double> p(weight());
  Tape<double> tape;
  Var<double> x = tape.variable(input());  // dx reads the Parameter
  Var<double> loss = remat::sum(remat::tanh(remat::matmul(x, tape.variable(p))));
  p = Parameter<double>(Matrix<double>::Ones(3, 4));  // replaces the recorded value
  EXPECT_THROW(tape.backward(loss), remat::stale_value_error);
}

TEST(Parameter, MovedFromSourceOfAMoveAssignmentIsStale) {
  Parameter<double> p(weight()), target;
  Tape<double> tape;
  Var<double> x = tape.variable(input());
  Var<double> loss = remat::sum(remat::tanh(remat::matmul(x, tape.variable(p))));
  target = std::move(p);  // p's value moved out of the storage the tape references
  EXPECT_THROW(tape.backward(loss), remat::stale_value_error);
}

template <class T, class = void>
struct can_record : std::false_type {};
template <class T>
struct can_record<T, std::void_t<decltype(std::declval<Tape<float>&>().variable(std::declval<T>()))>> : std::true_type {
};

TEST(Parameter, TemporariesCannotBeRecorded) {
  static_assert(can_record<Parameter<float>&>::value, "a named Parameter records");
  static_assert(!can_record<Parameter<float>&&>::value, "a temporary would take its gradient with it");
  static_assert(!can_record<const Parameter<float>&>::value, "backward writes the Parameter's gradient");
}

// ---- gradients accumulate ----

TEST(Parameter, BackwardPassesAddIntoTheGradientUntilZeroGrad) {
  Parameter<double> p(weight());
  const Matrix<double> g = reference_gradient();
  for (int pass = 1; pass <= 3; ++pass) {
    Tape<double> tape;
    tape.backward(remat::sum(remat::tanh(remat::matmul(tape.constant(input()), tape.variable(p)))));
    EXPECT_TRUE(Matrix<double>(p.grad()).isApprox(Matrix<double>(pass * g), 1e-14)) << "pass " << pass;
  }
  p.zero_grad();
  EXPECT_FALSE(p.has_grad());
  EXPECT_TRUE(Matrix<double>(p.grad()).isZero(0)) << "no gradient reads as zeros";
  Tape<double> tape;
  tape.backward(remat::sum(remat::tanh(remat::matmul(tape.constant(input()), tape.variable(p)))));
  EXPECT_TRUE(same_bits(p.grad(), g)) << "after zero_grad the next backward assigns";
}

// Micro-batch gradient accumulation across tapes, with and without checkpointing: two halves of a batch,
// each loss scaled by 1/2, add up to the full batch's mean-loss gradient.
TEST(Parameter, MicroBatchAccumulationMatchesTheFullBatch) {
  const Matrix<double> x = remat_test::random_matrix(8, 3, 3);
  const std::vector<int> labels = {0, 1, 2, 3, 0, 1, 2, 3};
  auto model = [](Tape<double>& tape, Parameter<double>& w1, Parameter<double>& w2, const Matrix<double>& rows,
                  const std::vector<int>& y, bool use_checkpoint) {
    Var<double> a = tape.variable(w1), b = tape.variable(w2);
    auto f = [&](Var<double> h) { return remat::tanh(remat::matmul(remat::tanh(remat::matmul(h, a)), b)); };
    Var<double> logits = use_checkpoint ? remat::checkpoint(f, remat::policies::dots_saveable)(tape.constant(rows))
                                        : f(tape.constant(rows));
    return remat::cross_entropy(logits, y);
  };
  Parameter<double> w1(remat_test::random_matrix(3, 6, 4)), w2(remat_test::random_matrix(6, 4, 5));
  {
    Tape<double> tape;
    tape.backward(model(tape, w1, w2, x, labels, false));
  }
  const Matrix<double> full1 = w1.grad(), full2 = w2.grad();
  Matrix<double> plain1, plain2;
  for (bool use_checkpoint : {false, true}) {
    w1.zero_grad();
    w2.zero_grad();
    for (int half = 0; half < 2; ++half) {
      Tape<double> tape;
      const std::vector<int> y(labels.begin() + 4 * half, labels.begin() + 4 * half + 4);
      tape.backward(model(tape, w1, w2, x.middleRows(4 * half, 4), y, use_checkpoint) * 0.5);
    }
    EXPECT_TRUE(Matrix<double>(w1.grad()).isApprox(full1, 1e-12));
    EXPECT_TRUE(Matrix<double>(w2.grad()).isApprox(full2, 1e-12));
    if (!use_checkpoint) {
      plain1 = w1.grad();
      plain2 = w2.grad();
    } else {
      EXPECT_TRUE(same_bits(w1.grad(), plain1)) << "checkpointing composes with accumulation bitwise";
      EXPECT_TRUE(same_bits(w2.grad(), plain2));
    }
  }
}

TEST(Parameter, GradientOfASubsetLeavesAccumulatedGradientsAlone) {
  Parameter<double> p(weight());
  Tape<double> tape;
  Var<double> x = tape.variable(input());
  Var<double> w = tape.variable(p);
  Var<double> loss = remat::sum(remat::tanh(remat::matmul(x, w)));
  tape.backward(loss, /*retain_graph=*/true);
  const Matrix<double> dx = x.grad(), dw = p.grad();
  const auto only_x = tape.gradient(loss, {x}, /*retain_graph=*/true);
  EXPECT_TRUE(same_bits(only_x[0], dx)) << "gradient() computes afresh";
  EXPECT_TRUE(same_bits(x.grad(), dx)) << "and does not add into x's accumulated gradient";
  EXPECT_TRUE(same_bits(p.grad(), dw)) << "nor zero the others'";
  const auto both = tape.gradient(loss, {w, x});
  EXPECT_TRUE(same_bits(both[0], dw));
  EXPECT_TRUE(same_bits(both[1], dx));
  EXPECT_TRUE(same_bits(p.grad(), dw));
  EXPECT_TRUE(same_bits(x.grad(), dx));
}

TEST(Parameter, TapeVariablesAccumulateAcrossBackwardsOnOneTape) {
  Tape<double> tape;
  Var<double> x = tape.variable(input());
  Var<double> loss = remat::sum(remat::square(x));
  tape.backward(loss, true);
  tape.backward(loss, true);
  EXPECT_TRUE(same_bits(x.grad(), Matrix<double>(4 * input())));  // 2x + 2x, exact in binary
  x.zero_grad();
  tape.backward(loss);
  EXPECT_TRUE(same_bits(x.grad(), Matrix<double>(2 * input())));
}

// ---- the optimizer shares the storage too ----

TEST(Adam, UpdatesParametersThatMovedAndSkipsThoseWithoutGradient) {
  std::vector<Parameter<double>> ps;
  ps.emplace_back(weight());
  ps.emplace_back(Matrix<double>::Ones(1, 4));
  remat::nn::Adam<double> adam({&ps[0], &ps[1]});
  for (int i = 0; i < 100; ++i) ps.emplace_back(Matrix<double>::Zero(1, 1));  // reallocates: ps[0], ps[1] moved
  {
    Tape<double> tape;
    tape.backward(remat::sum(remat::tanh(remat::matmul(tape.constant(input()), tape.variable(ps[0])))));
  }
  adam.step();
  // First Adam step: θ − α·sign(g) (m̂ = g, √v̂ = |g|, ε negligible) where g ≠ 0.
  const Matrix<double> g = reference_gradient();
  const Matrix<double> expected = weight().array() - 1e-3 * g.array().sign();
  EXPECT_TRUE(ps[0].value().isApprox(expected, 1e-9));
  EXPECT_TRUE(same_bits(ps[1].value(), Matrix<double>(Matrix<double>::Ones(1, 4)))) << "no gradient: unchanged";
  adam.zero_grad();
  EXPECT_FALSE(ps[0].has_grad());
}

TEST(Adam, KeepsUpdatingAParameterAssignedAfterItWasBuilt) {
  Parameter<double> p(Matrix<double>::Zero(3, 4));
  remat::nn::Adam<double> adam({&p});
  p = Parameter<double>(weight());  // e.g. weights loaded after the optimizer was made
  {
    Tape<double> tape;
    tape.backward(remat::sum(remat::tanh(remat::matmul(tape.constant(input()), tape.variable(p)))));
  }
  adam.step();
  const Matrix<double> expected = weight().array() - 1e-3 * reference_gradient().array().sign();
  EXPECT_TRUE(p.value().isApprox(expected, 1e-9)) << "the optimizer updates the object, not its old value";
}

TEST(Adam, OutlivesItsParameters) {
  auto p = std::make_unique<Parameter<double>>(weight());
  remat::nn::Adam<double> adam({p.get()});
  p->mutable_grad().setOnes();
  p.reset();
  adam.step();  // updates the storage it shares; no parameter object is touched
  adam.zero_grad();
  EXPECT_EQ(adam.value(0).rows(), 3);
}

// A copy assignment from a Parameter whose gradient no longer fits its value threw shape_error after it had
// replaced the value, without moving the version: a tape that recorded the target then computed a gradient
// from the new value without a word. Now the target is unchanged (value, version, gradient).
TEST(Parameter, CopyAssignmentThatThrowsLeavesTheTargetUnchanged) {
  Parameter<double> a(Matrix<double>::Constant(2, 2, 1.0)), x(Matrix<double>::Constant(2, 2, 3.0));
  a.mutable_grad().setConstant(5.0);
  Tape<double> tape;
  Var<double> loss = remat::sum(tape.variable(x) * tape.variable(a));  // d loss / d x = a, read at backward
  Parameter<double> b(Matrix<double>::Constant(3, 3, 7.0));
  b.mutable_grad().setOnes();
  b.mutable_value() = Matrix<double>::Constant(2, 2, 100.0);  // a gradient of 9 elements for a value of 4
  const std::uint64_t version = a.version();
  EXPECT_THROW(a = b, remat::shape_error);
  EXPECT_EQ(a.value(), Matrix<double>(Matrix<double>::Constant(2, 2, 1.0)));
  EXPECT_EQ(a.version(), version);
  EXPECT_EQ(a.grad(), Matrix<double>(Matrix<double>::Constant(2, 2, 5.0)));
  tape.backward(loss);
  EXPECT_EQ(x.grad(), Matrix<double>(Matrix<double>::Constant(2, 2, 1.0)));
  // The assignment that succeeds copies value and gradient and makes the tape's record stale.
  Parameter<double> c(Matrix<double>::Constant(2, 2, 4.0));
  c.mutable_grad().setConstant(2.0);
  Tape<double> second;
  Var<double> again = remat::sum(second.variable(x) * second.variable(a));
  a = c;
  EXPECT_EQ(a.value(), c.value());
  EXPECT_EQ(a.grad(), c.grad());
  EXPECT_THROW(second.backward(again), remat::stale_value_error);
}

// Assigning between two handles of one storage (a gradient-ready callback's Parameter is one) cleared the
// gradient (copy) or emptied the value (move). Both are no-ops, as assigning an object to itself is.
TEST(Parameter, AssignmentFromAHandleOfTheSameStorageChangesNothing) {
  for (const bool move : {false, true}) {
    Parameter<double> w(Matrix<double>::Constant(1, 2, 2.0));
    Tape<double> tape;
    tape.on_gradient_ready([&](Parameter<double>& handle) {
      if (move)
        w = std::move(handle);
      else
        w = handle;
    });
    tape.backward(remat::sum(tape.variable(w) * tape.constant(Matrix<double>::Constant(1, 2, 3.0))));
    ASSERT_EQ(w.rows(), 1) << "move " << move;
    ASSERT_EQ(w.cols(), 2) << "move " << move;
    ASSERT_TRUE(w.has_grad()) << "move " << move;
    EXPECT_EQ(w.value(), Matrix<double>(Matrix<double>::Constant(1, 2, 2.0))) << "move " << move;
    EXPECT_EQ(w.grad(), Matrix<double>(Matrix<double>::Constant(1, 2, 3.0))) << "move " << move;
  }
}

// A gradient-ready callback that assigns another recorded Parameter whose gradient is still pending. Before, the
// sweep wrote the old value's gradient into the object now holding the new value, without a word, and a 2×2
// gradient into a 1×1 one's buffer when the new value was smaller (a heap overflow when that buffer was
// defined); later the gradient was withheld and backward() threw stale_value_error, but a smaller value while
// ops that read it were still to run was undefined behaviour. Now the assignment itself throws tape_error, b
// keeps its value, and the sweep completes with every gradient of the recorded values: b's is 3·a = 3.
TEST(Parameter, AssigningAPendingParameterInAGradientReadyCallbackThrowsAndChangesNothing) {
  for (const bool smaller : {false, true}) {
    Parameter<double> a(Matrix<double>::Constant(2, 2, 1.0)), b(Matrix<double>::Constant(2, 2, 2.0));
    Parameter<double> other(smaller ? Matrix<double>::Constant(1, 1, 9.0) : Matrix<double>::Constant(2, 2, 9.0));
    other.mutable_grad().setConstant(7.0);
    Tape<double> tape;
    // b is recorded first, so its gradient is delivered after a's.
    Var<double> scaled = tape.variable(b) * tape.constant(Matrix<double>::Constant(2, 2, 3.0));
    Var<double> loss = remat::sum(scaled * tape.variable(a));
    tape.on_gradient_ready([&](Parameter<double>& handle) {
      if (&handle.value() == &a.value()) b = other;
    });
    remat_test::expect_error_naming<remat::tape_error>([&] { tape.backward(loss); },
                                                       {"Parameter: assignment", "still reads"});
    EXPECT_EQ(b.value(), Matrix<double>(Matrix<double>::Constant(2, 2, 2.0))) << "smaller " << smaller;
    EXPECT_EQ(b.grad(), Matrix<double>(Matrix<double>::Constant(2, 2, 3.0))) << "smaller " << smaller;
    EXPECT_EQ(a.grad(), Matrix<double>(Matrix<double>::Constant(2, 2, 6.0))) << "smaller " << smaller;
    b = other;  // after backward() nothing holds it
    EXPECT_EQ(b.value(), other.value()) << "smaller " << smaller;
  }
}

}  // namespace parameter_test
