// Views (OpBase::view: reshape, view, flatten, squeeze, unsqueeze): the result is its input's buffer read with
// another shape, as PyTorch's views of a contiguous tensor. Nothing is copied, the buffer counts once in memory()
// (docs/design.md §2.5), it stays while the input or any view of it is wanted, and every path that regenerates a
// value (a checkpoint's replay, a memory budget's regeneration, a CapturedStep, a shapes-only estimate) gives the
// same values and figures as the copies did, bytes apart. Byte counts are derived by hand in each test.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "memory.hpp"
#include "random.hpp"
#include "remat/estimate.hpp"
#include "remat/remat.hpp"
#include "take_grads.hpp"

// Named after the file: this directory's test files are compiled as one translation unit (tests/CMakeLists.txt).
namespace views_test {

using remat::Matrix;
using remat::Parameter;
using remat::Tape;
using remat::Var;
using remat_test::bytes;

/// Every view op of x [4, 6] shares x's buffer, and recording them allocates no tensor byte.
TEST(Views, ShareTheInputsBufferAndAllocateNothing) {
  Tape<float> tape;
  const Var<float> x = tape.constant(remat_test::random_matrix<float>(4, 6, 1));
  const std::size_t live = tape.memory().live_bytes, peak = tape.memory().peak_bytes;
  const Var<float> a = remat::reshape(x, {2, 3, 4});
  const Var<float> b = remat::view(a, {1, 24});
  const Var<float> c = remat::squeeze(b, 0);     // [24]
  const Var<float> d = remat::unsqueeze(c, 1);   // [24, 1]
  const Var<float> e = remat::flatten(d);        // [24]
  const Var<float> f = remat::reshape(e, 6, 4);  // the 2-D reshape
  for (const Var<float>* v : {&a, &b, &c, &d, &e, &f}) EXPECT_EQ(v->value().data(), x.value().data());
  EXPECT_EQ(f.shape(), (remat::Shape{6, 4}));
  EXPECT_EQ(tape.memory().live_bytes, live);
  EXPECT_EQ(tape.memory().peak_bytes, peak);
}

/// loss = sum(square(reshape(h))) with h = tanh(x·W): h's buffer is read by tanh's backward (its output) and, as
/// the view r, by square's (its input): kept once. Saved: x (dW reads it) and that buffer, 2 · 24 floats; a copy
/// would have kept a third [24]. The gradient equals the one without the view, bitwise.
TEST(Views, ABufferReadThroughItsViewAndItselfCountsOnce) {
  Parameter<float> W(remat_test::random_matrix<float>(6, 6, 2));
  const Matrix<float> xm = remat_test::random_matrix<float>(4, 6, 3);
  Matrix<float> expected;
  {
    Tape<float> tape;
    const Var<float> h = remat::tanh(remat::matmul(tape.constant(xm), tape.variable(W)));
    tape.backward(remat::sum(remat::square(h)));
    expected = W.grad();
    W.zero_grad();
  }
  Tape<float> tape;
  Var<float> h = remat::tanh(remat::matmul(tape.constant(xm), tape.variable(W)));
  const Var<float> r = remat::reshape(h, {24});
  h = Var<float>();
  const Var<float> loss = remat::sum(remat::square(r));
  EXPECT_EQ(tape.memory().saved_bytes, 2 * bytes<float>(4, 6));
  std::ostringstream report;
  tape.print_saved_residuals(report);
  EXPECT_EQ(report.str().find("reshape"), std::string::npos) << "a view owns no bytes: no row of its own\n"
                                                             << report.str();
  tape.backward(loss);
  EXPECT_TRUE(W.grad() == expected);
}

/// The input of a view read by nothing but the view's readers: matmul's output m (its own backward reads its
/// inputs, not m) viewed as r, read by square. m's handle goes; its buffer stays for r and is reported as
/// r's, then goes with r after the backward.
TEST(Views, AViewKeepsItsInputsBufferAfterTheInputsHandleGoes) {
  Parameter<float> W(remat_test::random_matrix<float>(6, 6, 4));
  const Matrix<float> xm = remat_test::random_matrix<float>(4, 6, 5);
  Tape<float> tape;
  const Var<float> x = tape.constant(xm);
  Var<float> m = remat::matmul(x, tape.variable(W));
  const Matrix<float> m_value = m.value();
  const Var<float> r = remat::flatten(m);
  m = Var<float>();
  const Var<float> loss = remat::sum(remat::square(r));
  EXPECT_EQ(tape.memory().saved_bytes, 2 * bytes<float>(4, 6)) << "x and m's buffer, through r";
  EXPECT_TRUE(Eigen::Map<const Matrix<float>>(r.value().data(), 4, 6) == m_value) << "m's buffer was reused";
  std::ostringstream report;
  tape.print_saved_residuals(report);
  EXPECT_NE(report.str().find("buffer of view"), std::string::npos) << report.str();
  const std::size_t before = tape.memory().live_bytes;
  tape.backward(loss);
  // d loss / dW = xᵀ · 2m.
  const Matrix<float> want = xm.transpose() * (2.0f * m_value);
  EXPECT_TRUE(W.grad().isApprox(want, 1e-5f));
  // After the backward only the leaf x, the loss and r (a handle: m's buffer) remain of the forward's values.
  EXPECT_LE(tape.memory().live_bytes, before);
}

/// A checkpointed block of views and elementwise ops, under each policy: gradients bitwise equal to plain. With
/// nothing_saveable or dots_saveable the region drops tanh's output t; the region's output is a view of t (kept,
/// read by square's backward and by a handle), so t's buffer stays, yet the replay re-runs tanh as the plan made
/// at the region's close says (JAX's partial evaluation; a value there only for its views is not there for a
/// replay), into that buffer: replayed_bytes counts tanh's [4, 6] and nothing for the views.
TEST(Views, ReplayedViewsRegenerateNoBytesAndGiveThePlainGradient) {
  Parameter<double> W(remat_test::random_matrix<double>(6, 6, 6));
  const Matrix<double> xm = remat_test::random_matrix<double>(4, 6, 7);
  auto run = [&](int mode, remat::MemoryStats* stats) {
    Tape<double> tape;
    const Var<double> w = tape.variable(W);
    const Var<double> h = remat::matmul(tape.constant(xm), w);  // [4, 6], saved (the region's input)
    auto f = [](const Var<double>& u) {
      const Var<double> t = remat::tanh(remat::reshape(u, {2, 2, 6}));
      return remat::flatten(remat::unsqueeze(t, 0), 0, 1);  // [1,2,2,6] → [2,2,6]
    };
    Var<double> y;
    if (mode == 0) y = f(h);
    if (mode == 1) y = remat::checkpoint(f, remat::policies::nothing_saveable)(h);
    if (mode == 2) y = remat::checkpoint(f, remat::policies::everything_saveable)(h);
    if (mode == 3) y = remat::checkpoint(f, remat::policies::dots_saveable)(h);
    const Var<double> loss = remat::sum(remat::square(remat::reshape(y, {4, 6})));
    tape.backward(loss);
    if (stats) *stats = tape.memory();
    Matrix<double> g = W.grad();
    W.zero_grad();
    return g;
  };
  const Matrix<double> plain = run(0, nullptr);
  for (int mode = 1; mode <= 3; ++mode) {
    remat::MemoryStats s;
    EXPECT_TRUE(run(mode, &s) == plain) << "mode " << mode;
    if (mode == 1 || mode == 3) {
      // The replay re-runs reshape, tanh, unsqueeze and flatten; square's backward reads flatten's output y
      // (the region's output, kept) and tanh's backward its output: only tanh's buffer is new.
      EXPECT_EQ(s.replayed_bytes, bytes<double>(4, 6)) << "mode " << mode;
      EXPECT_GE(s.replayed_ops, 1u) << "mode " << mode;
    }
  }
}

/// A view of a Parameter reads its storage: a Parameter modified after the record makes the backward throw
/// stale_value_error, as a direct read of it does, rather than give a gradient from the new values.
TEST(Views, AViewOfAModifiedParameterIsStale) {
  Parameter<float> P(remat_test::random_matrix<float>(4, 6, 8));
  Tape<float> tape;
  const Var<float> loss = remat::sum(remat::square(remat::reshape(tape.variable(P), {24})));
  P.mutable_value()(0, 0) += 1.0f;
  EXPECT_THROW(tape.backward(loss), remat::stale_value_error);
}

/// A chain of layers through views under a memory budget of about half the plain peak: the peak stays under
/// it and the gradients equal plain's bitwise; estimate_memory counts the views as the real tape does.
TEST(Views, UnderAMemoryBudgetAndInAnEstimate) {
  constexpr int layers = 12;
  std::vector<Parameter<double>> weights;
  for (int l = 0; l < layers; ++l) weights.emplace_back(remat_test::random_matrix<double>(8, 8, 20 + l) * 0.4);
  const Matrix<double> xm = remat_test::random_matrix<double>(16, 8, 9);
  auto forward = [&](Tape<double>& tape) {
    Var<double> h = tape.constant(xm);
    for (int l = 0; l < layers; ++l) {
      const Var<double> z = remat::matmul(h, tape.variable(weights[static_cast<std::size_t>(l)]));
      h = remat::reshape(remat::tanh(remat::reshape(z, {4, 4, 8})), {16, 8});
    }
    return remat::sum(remat::square(h));
  };
  auto grads = [&] { return remat_test::take_grads(weights); };
  Tape<double> plain;
  plain.backward(forward(plain));
  const std::size_t plain_peak = plain.memory().peak_bytes;
  const std::vector<Matrix<double>> want = grads();
  const remat::MemoryEstimate estimate = remat::estimate_memory<double>(forward);
  EXPECT_EQ(estimate.peak_bytes, plain_peak);

  Tape<double> tape;
  const std::size_t budget = plain_peak / 2;
  tape.set_memory_budget(budget);
  tape.backward(forward(tape));
  EXPECT_LE(tape.memory().peak_bytes, budget);
  EXPECT_GT(tape.memory().evictions, 0u);
  const std::vector<Matrix<double>> got = grads();
  for (int l = 0; l < layers; ++l)
    EXPECT_TRUE(got[static_cast<std::size_t>(l)] == want[static_cast<std::size_t>(l)]) << l;
}

/// A CapturedStep whose step reshapes: its replays give the values of a fresh tape's step.
TEST(Views, CapturedStepReplaysAStepWithViews) {
  Parameter<float> W(remat_test::random_matrix<float>(6, 6, 10));
  const Matrix<float> xm = remat_test::random_matrix<float>(4, 6, 11);
  auto step = [&](Tape<float>& tape) {
    const Var<float> h = remat::tanh(remat::matmul(tape.constant(xm), tape.variable(W)));
    return remat::checkpoint([](const Var<float>& u) { return remat::sum(remat::square(remat::reshape(u, {24}))); },
                             remat::policies::nothing_saveable)(h);
  };
  remat::CapturedStep<float> captured(step);
  for (int s = 0; s < 3; ++s) {
    W.mutable_value() *= 0.9f;
    W.zero_grad();
    const float loss = captured.replay();
    const Matrix<float> got = W.grad();
    W.zero_grad();
    Tape<float> tape;
    const Var<float> fresh = step(tape);
    tape.backward(fresh);
    EXPECT_EQ(loss, fresh.item()) << "replay " << s;
    EXPECT_TRUE(got == W.grad()) << "replay " << s;
    W.zero_grad();
  }
}

}  // namespace views_test
