// Misuse of the tape's public API must throw a typed error and leave the tape usable: handles after clear() or
// the tape's destruction, moved-from and self-assigned Vars, Vars of different tapes, backward and gradient
// misuse (non-scalar or constant losses, a second backward without retain_graph, backward inside a
// checkpointed function), Parameters changed, resized or reassigned after recording; clear() returning every
// byte to the pool; two tapes on two threads.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <thread>
#include <vector>

#include "remat/remat.hpp"

// Named after the file: this directory's test files are compiled as one translation unit (tests/CMakeLists.txt).
namespace misuse_test {
using remat::Matrix;
using remat::Parameter;
using remat::Tape;
using remat::Var;

template <class T>
Matrix<T> rnd(remat::Index r, remat::Index c, unsigned seed) {
  std::srand(seed);
  return Matrix<T>::Random(r, c);
}

template <class T>
bool same_bits(const Matrix<T>& a, const Matrix<T>& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() &&
         std::memcmp(a.data(), b.data(), sizeof(T) * static_cast<std::size_t>(a.size())) == 0;
}

// ---------------------------------------------------------------- handles and lifetimes

TEST(VarLifetime, VarAfterClearThrowsTapeErrorEverywhere) {
  Tape<float> tape;
  auto x = tape.variable(rnd<float>(2, 3, 1));
  auto y = remat::tanh(x);
  tape.clear();
  EXPECT_FALSE(x.valid());
  EXPECT_THROW(x.value(), remat::tape_error);
  EXPECT_THROW(x.grad(), remat::tape_error);
  EXPECT_THROW(x.shape(), remat::tape_error);
  EXPECT_THROW(remat::tanh(y), remat::tape_error);
  EXPECT_THROW(tape.backward(remat::sum(y)), remat::tape_error);
  EXPECT_THROW(remat::checkpoint([](Var<float> v) { return remat::sin(v); })(x), remat::tape_error);
  EXPECT_THROW(remat::cross_entropy(x, {0, 1}), remat::tape_error);
  EXPECT_THROW(remat::dropout(x, 0.5), remat::tape_error);
  EXPECT_THROW(remat::checkpoint_name(x, "a"), remat::tape_error);
  EXPECT_EQ(tape.memory().live_bytes, 0u);
  // Copies/assignments of stale handles are harmless, and the tape works again.
  Var<float> copy = y;
  copy = x;
  auto z = tape.variable(rnd<float>(1, 1, 2));
  tape.backward(remat::sum(remat::square(z)));
  EXPECT_FLOAT_EQ(z.grad()(0, 0), 2 * z.value()(0, 0));
}

TEST(VarLifetime, VarOutlivesTape) {
  Var<double> x, y;
  {
    Tape<double> tape;
    x = tape.variable(rnd<double>(3, 3, 3));
    y = remat::exp(x);
    tape.backward(remat::sum(y), true);
  }
  EXPECT_THROW(x.value(), remat::tape_error);
  EXPECT_THROW(y.grad(), remat::tape_error);
  EXPECT_THROW(remat::add(x, y), remat::tape_error);
  Var<double> z = std::move(y);
  z = x;
  z = z;  // self-assignment of a stale handle
}

TEST(VarLifetime, MovedFromAndDefaultVarsThrow) {
  Tape<float> tape;
  auto x = tape.variable(rnd<float>(2, 2, 4));
  Var<float> moved = std::move(x);
  EXPECT_THROW(x.value(), remat::tape_error);  // NOLINT(bugprone-use-after-move)
  EXPECT_THROW(remat::add(x, moved), remat::tape_error);
  EXPECT_THROW(remat::add(moved, x), remat::tape_error);
  Var<float> empty;
  EXPECT_THROW(remat::matmul(empty, moved), remat::tape_error);
  EXPECT_THROW(remat::layer_norm(moved, empty, empty), remat::tape_error);
  EXPECT_THROW(tape.backward(empty), remat::tape_error);
  EXPECT_THROW(tape.gradient(remat::sum(moved), {empty}), remat::tape_error);
  EXPECT_THROW(remat::checkpoint([](Var<float> v) { return v; })(empty), remat::tape_error);
  EXPECT_EQ(tape.size(), 2u) << "failed ops must not leave nodes behind (x and sum(moved) only)";
  EXPECT_NO_THROW(moved.value());
}

TEST(VarLifetime, SelfAssignmentAndSelfMoveKeepTheValue) {
  Tape<float> tape;
  auto x = tape.variable(rnd<float>(2, 2, 5));
  auto y = remat::tanh(x);
  const Matrix<float> before = y.value();
  y = y;
  y = std::move(y);  // NOLINT
  ASSERT_TRUE(y.valid());
  EXPECT_TRUE(same_bits(before, Matrix<float>(y.value())));
  tape.backward(remat::sum(y));
  EXPECT_TRUE(x.grad().allFinite());
}

TEST(VarLifetime, VarsOfDifferentTapesAreRejectedWithoutChangingEitherTape) {
  Tape<float> a, b;
  auto x = a.variable(rnd<float>(2, 2, 6));
  auto y = b.variable(rnd<float>(2, 2, 7));
  EXPECT_THROW(x + y, remat::tape_error);
  EXPECT_THROW(remat::matmul(x, y), remat::tape_error);
  EXPECT_THROW(remat::mse_loss(x, y), remat::tape_error);
  auto w = a.variable(rnd<float>(1, 2, 8));
  EXPECT_THROW(remat::layer_norm(x, w, b.variable(rnd<float>(1, 2, 9))), remat::tape_error);
  EXPECT_THROW(a.backward(remat::sum(y)), remat::tape_error);
  EXPECT_THROW(a.gradient(remat::sum(x), {y}), remat::tape_error);
  // a checkpointed function given Vars of two tapes
  auto f = remat::checkpoint([](Var<float> p, Var<float> q) { return p * q; });
  EXPECT_THROW(f(x, y), remat::tape_error);
  EXPECT_EQ(a.size(), 3u);  // x, w, sum(x): the failed ops left nothing
  EXPECT_EQ(b.size(), 3u);  // y, the rejected bias leaf, sum(y)
  // both tapes still work, and no region was left open on either
  a.backward(remat::sum(remat::square(x)));
  b.backward(remat::sum(remat::square(y)));
  EXPECT_TRUE(same_bits(Matrix<float>(x.grad()), Matrix<float>(2 * x.value().array())));
}

// ---------------------------------------------------------------- backward / gradient misuse

TEST(BackwardMisuse, LossMustBeScalarAndNothingChangesWhenItThrows) {
  Tape<double> tape;
  auto x = tape.variable(rnd<double>(2, 3, 10));
  auto y = remat::sin(x);
  EXPECT_THROW(tape.backward(y), remat::shape_error);
  EXPECT_THROW(tape.gradient(y, {x}), remat::shape_error);
  tape.backward(remat::sum(y));
  EXPECT_TRUE(x.grad().isApprox(x.value().array().cos().matrix()));
}

TEST(BackwardMisuse, SecondBackwardWithoutRetainThrowsFreedValueError) {
  Tape<float> tape;
  auto x = tape.variable(rnd<float>(2, 2, 11));
  auto loss = remat::sum(remat::tanh(x));
  tape.backward(loss);
  const Matrix<float> g = x.grad();
  EXPECT_THROW(tape.backward(loss), remat::freed_value_error);
  EXPECT_THROW(tape.gradient(loss, {x}), remat::freed_value_error);
  EXPECT_TRUE(same_bits(g, Matrix<float>(x.grad()))) << "a refused backward must not touch the gradients";
  // Recording after a backward works; another backward on this tape still refuses (documented), clear() resets.
  auto z = remat::square(x);
  EXPECT_THROW(tape.backward(remat::sum(z)), remat::freed_value_error);
  tape.clear();
  auto x2 = tape.variable(rnd<float>(2, 2, 11));
  tape.backward(remat::sum(remat::tanh(x2)));
  EXPECT_TRUE(same_bits(g, Matrix<float>(x2.grad())));
}

TEST(BackwardMisuse, LossIndependentOfEveryVariable) {
  Tape<float> tape;
  auto x = tape.variable(rnd<float>(2, 2, 12));
  auto c = tape.constant(rnd<float>(2, 2, 13));
  auto loss = remat::sum(remat::exp(c));
  ASSERT_NO_THROW(tape.backward(loss));
  EXPECT_TRUE(x.grad().isZero());
  EXPECT_THROW(c.grad(), remat::tape_error);
  EXPECT_THROW(tape.gradient(loss, {c}), remat::freed_value_error);
}

TEST(BackwardMisuse, LossIsAVariableOrAConstantLeaf) {
  Tape<float> tape;
  auto x = tape.variable(Matrix<float>::Constant(1, 1, 3));
  tape.backward(x, true);
  EXPECT_EQ(x.grad()(0, 0), 1.0f);
  Tape<float> t2;
  auto c = t2.constant(Matrix<float>::Constant(1, 1, 3));
  ASSERT_NO_THROW(t2.backward(c));
  // Exact bytes: only the constant's value (4 B) is live; the seed gradient of a constant must go.
  EXPECT_EQ(t2.memory().live_bytes, sizeof(float));
}

TEST(GradientMisuse, DuplicatesLossItselfAndUnrelatedValues) {
  Tape<double> tape;
  auto x = tape.variable(rnd<double>(2, 3, 14));
  auto u = tape.variable(rnd<double>(2, 3, 15));  // unrelated
  auto h = remat::tanh(x);
  auto loss = remat::sum(h * h);
  auto g = tape.gradient(loss, {loss, x, h, x, loss, u}, true);
  ASSERT_EQ(g.size(), 6u);
  EXPECT_EQ(g[0](0, 0), 1.0);
  EXPECT_TRUE(same_bits(g[1], g[3]));
  EXPECT_EQ(g[4](0, 0), 1.0);
  EXPECT_TRUE(g[5].isZero());
  const Matrix<double> hv = h.value();
  EXPECT_TRUE(g[2].isApprox(Matrix<double>(2 * hv.array())));
  EXPECT_TRUE(g[1].isApprox(Matrix<double>(2 * hv.array() * (1 - hv.array().square()))));
  EXPECT_THROW(h.grad(), remat::tape_error) << "gradient() must not leave interior gradients kept";
  // backward after gradient(..., retain): variables get their gradients, matching gradient()
  tape.backward(loss);
  EXPECT_TRUE(same_bits(g[1], Matrix<double>(x.grad())));
  EXPECT_TRUE(u.grad().isZero());
}

TEST(GradientMisuse, ConstantInWrtThrowsBeforeChangingAnything) {
  Tape<float> tape;
  auto x = tape.variable(rnd<float>(2, 2, 16));
  auto c = tape.constant(rnd<float>(2, 2, 17));
  auto loss = remat::sum(x * c);
  EXPECT_THROW(tape.gradient(loss, {x, c}), remat::tape_error);
  EXPECT_THROW(tape.gradient(loss, {remat::exp(c)}), remat::tape_error);
  auto g = tape.gradient(loss, {x});
  EXPECT_TRUE(same_bits(g[0], Matrix<float>(c.value())));
}

TEST(BackwardMisuse, CalledInsideACheckpointedFunctionThrowsAndRegionStillCloses) {
  Tape<float> tape;
  auto x = tape.variable(rnd<float>(2, 2, 18));
  bool threw_backward = false, threw_clear = false;
  auto y = remat::checkpoint([&](Var<float> v) {
    auto h = remat::sin(v);
    try {
      tape.backward(remat::sum(h));
    } catch (const remat::tape_error&) {
      threw_backward = true;
    }
    try {
      tape.clear();
    } catch (const remat::tape_error&) {
      threw_clear = true;
    }
    return remat::cos(h);
  })(x);
  EXPECT_TRUE(threw_backward);
  EXPECT_TRUE(threw_clear);
  auto loss = remat::sum(y);
  ASSERT_NO_THROW(tape.backward(loss));
  const Matrix<float> xv = x.value();
  EXPECT_TRUE(x.grad().isApprox(Matrix<float>(-xv.array().sin().sin() * xv.array().cos())));
}

// ---------------------------------------------------------------- Parameters

TEST(ParameterMisuse, ModifiedBetweenRetainedBackwardsThrowsStale) {
  Parameter<double> p(rnd<double>(3, 2, 19));
  Tape<double> tape;
  auto x = tape.constant(rnd<double>(4, 3, 20));
  auto w = tape.variable(p);
  // The replay of tanh(x·W) reads W (x is a constant, so nothing else in the backward does).
  auto loss =
      remat::sum(remat::checkpoint([&](Var<double> v) { return remat::sin(remat::tanh(remat::matmul(v, w))); })(x));
  tape.backward(loss, true);
  const Matrix<double> g = w.grad();
  p.mutable_value()(0, 0) += 1;
  EXPECT_THROW(tape.backward(loss, true), remat::stale_value_error);
  EXPECT_TRUE(same_bits(g, Matrix<double>(w.grad()))) << "a failed backward adds nothing";
}

TEST(ParameterMisuse, SameParameterRecordedTwiceGetsEachUsesGradient) {
  Parameter<double> p(rnd<double>(2, 2, 21));
  Tape<double> tape;
  auto a = tape.variable(p);
  auto b = tape.variable(p);
  auto loss = remat::sum(remat::matmul(a, b));
  tape.backward(loss);
  const Matrix<double> P = p.value();
  const Matrix<double> ones = Matrix<double>::Ones(2, 2);
  // d sum(P·P) / dP = 1·Pᵀ + Pᵀ·1: both uses add into the one Parameter gradient.
  EXPECT_TRUE(p.grad().isApprox(ones * P.transpose() + P.transpose() * ones));
  EXPECT_TRUE(same_bits(Matrix<double>(a.grad()), Matrix<double>(p.grad())));
  EXPECT_TRUE(same_bits(Matrix<double>(b.grad()), Matrix<double>(p.grad())));
  EXPECT_EQ(tape.memory().live_bytes, 1 * sizeof(double)) << "the loss value; the gradient is the Parameter's";
}

TEST(ParameterMisuse, ModifiedDuringForwardIsDetectedByBackward) {
  Parameter<float> p(rnd<float>(2, 2, 22));
  Tape<float> tape;
  auto w = tape.variable(p);
  auto y = remat::sin(w);
  p.mutable_value()(1, 1) = 5;  // same storage, new version
  EXPECT_THROW(y * w, remat::stale_value_error) << "recording an op on the modified Parameter";
  auto loss = remat::sum(y);
  EXPECT_THROW(tape.backward(loss), remat::stale_value_error) << "sin's backward reads it";
}

// Regression (read freed memory): resizing a Parameter through mutable_value() frees the buffer the
// tape references; recording an op on (or reading) its Var reads freed memory instead of throwing.
TEST(ParameterMisuse, ResizedAfterRecordingThrowsInsteadOfReadingFreedMemory) {
  Parameter<float> p(Matrix<float>::Ones(2, 2));
  Tape<float> tape;
  auto w = tape.variable(p);
  p.mutable_value() = Matrix<float>::Ones(50, 50);
  EXPECT_THROW(w.value(), remat::stale_value_error);
  EXPECT_THROW(w + w, remat::stale_value_error);
}

// Regression (read freed memory): assigning a new Parameter resets its version to the new object's (0), so the
// tape's version check passes and backward reads the freed old buffer.
TEST(ParameterMisuse, ReassignedParameterIsStale) {
  Parameter<float> p(Matrix<float>::Ones(2, 2));
  Tape<float> tape;
  auto w = tape.variable(p);
  auto loss = remat::sum(remat::square(w));
  p = Parameter<float>(Matrix<float>::Constant(2, 2, 3));
  EXPECT_THROW(tape.backward(loss), remat::stale_value_error);
}
// ---------------------------------------------------------------- memory accounting and threads

TEST(TapeClear, ClearReturnsEveryByteToThePool) {
  Tape<float> tape;
  std::size_t cached_after_first = 0;
  for (int step = 0; step < 3; ++step) {
    auto x = tape.constant(rnd<float>(8, 6, 30));
    auto w = tape.variable(rnd<float>(6, 5, 31));
    auto g = tape.variable(Matrix<float>::Ones(1, 5));
    auto b = tape.variable(Matrix<float>::Zero(1, 5));
    auto h =
        remat::checkpoint([&](Var<float> v) { return remat::layer_norm(remat::gelu(remat::matmul(v, w)), g, b) + 1.0; },
                          remat::policies::dots_saveable)(x);
    auto loss = remat::cross_entropy(h, {0, 1, 2, 3, 4, 0, 1, 2});
    tape.backward(loss);
    (void)w.grad();
    const auto m = tape.memory();
    EXPECT_EQ(m.saved_bytes, 0u) << "nothing is pending after a backward without retain_graph";
    tape.clear();
    EXPECT_EQ(tape.memory().live_bytes, 0u);
    EXPECT_EQ(tape.memory().peak_bytes, 0u);
    if (step == 0)
      cached_after_first = tape.memory().cached_bytes;
    else
      EXPECT_EQ(tape.memory().cached_bytes, cached_after_first) << "a steady loop allocates nothing new";
  }
  tape.release_cached_memory();
  EXPECT_EQ(tape.memory().cached_bytes, 0u);
}

TEST(TapesOnThreads, TwoTapesInTwoThreadsGiveIdenticalCheckpointedGradients) {
  const Matrix<float> X = rnd<float>(16, 8, 40), W = rnd<float>(8, 8, 41);  // std::rand is not thread-safe
  auto work = [&X, &W](Matrix<float>* out) {
    Tape<float> tape(3);
    auto x = tape.constant(X);
    auto w = tape.variable(W);
    Var<float> h = x;
    for (int i = 0; i < 20; ++i)
      h = remat::checkpoint([&](Var<float> v) { return remat::dropout(remat::tanh(remat::matmul(v, w)), 0.1); })(h);
    for (int step = 0; step < 20; ++step) {
      tape.backward(remat::sum(h), true);
    }
    *out = w.grad();
  };
  Matrix<float> a, b, c;
  std::thread t1(work, &a), t2(work, &b);
  t1.join();
  t2.join();
  work(&c);
  EXPECT_TRUE(same_bits(a, c));
  EXPECT_TRUE(same_bits(b, c));
}

}  // namespace misuse_test
