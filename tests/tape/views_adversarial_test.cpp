// Adversarial cases for views (OpBase::view: reshape, view, flatten, squeeze, unsqueeze share their input's
// buffer, docs/design.md §2.5), through the public API only. The first three tests failed before the fixes that
// came with them: a view of a Parameter read the Parameter's storage without its staleness check (a resized or
// reassigned Parameter's freed buffer, under AddressSanitizer a heap-use-after-free), and a chain schedule whose
// layers return views of their own values kept those values past the schedule's free, over the budget that
// checkpoint_sequential_auto promises. The others are the strongest cases that passed: gradients bitwise equal to
// the plain tape's (or to gradcheck's), memory figures derived by hand or equal to estimate_memory's to the byte,
// and the tape usable after what throws. The last one failed too, before its fix: a view of a modified Parameter held
// only by a handle stopped an unrelated backward.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "memory.hpp"
#include "random.hpp"
#include "remat/estimate.hpp"
#include "remat/remat.hpp"
#include "take_grads.hpp"

// Named after the file: this directory's test files are compiled as one translation unit (tests/CMakeLists.txt).
namespace views_adversarial_test {

using remat::Matrix;
using remat::Parameter;
using remat::Tape;
using remat::Var;
using remat_test::bytes;
using remat_test::describe;

// ---- failed before the fix ----

/// A view of a Parameter is the Parameter's storage. Assigning the Parameter a value of another shape frees that
/// storage (Parameter::operator=), so reading the view — value(), item(), or an op recorded on it — must throw
/// stale_value_error as a read of the Parameter's own node does, not read freed memory. Before the fix value()
/// and item() returned the freed buffer and square(v) read it (AddressSanitizer: heap-use-after-free in
/// SquareOp's forward), because the check looked only at a node that references a Parameter itself.
TEST(ViewsAdversarial, AViewOfAResizedParameterThrowsInsteadOfReadingFreedStorage) {
  Parameter<float> P(remat_test::random_matrix<float>(4, 6, 1));
  Parameter<float> S(remat_test::random_matrix<float>(1, 1, 2));
  Tape<float> tape;
  const Var<float> v = remat::view(remat::reshape(tape.variable(P), {24}), {2, 12});  // a view of a view
  const Var<float> s = remat::reshape(tape.variable(S), 1, 1);
  P = Parameter<float>(remat_test::random_matrix<float>(40, 60, 3));  // another shape: P's old buffer is freed
  S = Parameter<float>(remat_test::random_matrix<float>(40, 60, 4));
  EXPECT_THROW(v.value(), remat::stale_value_error);
  EXPECT_THROW(s.item(), remat::stale_value_error);
  EXPECT_THROW(remat::square(v), remat::stale_value_error);
  // The tape stays usable: cleared, it records the new P and runs a backward.
  tape.clear();
  const Var<float> loss = remat::sum(remat::reshape(tape.variable(P), {2400}));
  tape.backward(loss);
  EXPECT_TRUE(P.grad() == Matrix<float>::Ones(40, 60));
}

/// The same for a Parameter modified in place (mutable_value(), as an optimizer step does): an op recorded on a
/// view of it, and the view's value(), throw stale_value_error exactly as they do on the Parameter's node; before
/// the fix both silently read the new values (a gradient of values the forward pass never saw).
TEST(ViewsAdversarial, AViewOfAModifiedParameterIsStaleForRecordingAndReading) {
  Parameter<float> P(remat_test::random_matrix<float>(4, 6, 5));
  Tape<float> tape;
  const Var<float> p = tape.variable(P);
  const Var<float> v = remat::unsqueeze(remat::flatten(p), 0);
  P.mutable_value()(0, 0) += 1.0f;
  EXPECT_THROW(remat::square(p), remat::stale_value_error);
  EXPECT_THROW(p.value(), remat::stale_value_error);
  EXPECT_THROW(remat::square(v), remat::stale_value_error);
  EXPECT_THROW(v.value(), remat::stale_value_error);
}

/// checkpoint_sequential_auto promises peak_bytes ≤ budget. Eight layers [16,8] → [16,8], each
/// view(tanh(reshape(h·W, [4,4,8])), [16,8]), so the layer's output x_i is a view of its tanh's buffer t_i. A
/// schedule's F_i keeps only x_i, settling t_i a level below the chain's, where nothing but x_i wants it; when the
/// schedule later frees x_i, t_i must go with it. Before the fix t_i was settled at the chain's own level, where
/// its pending backward read kept it until B_i: at 70% of the plain peak (8 248 of 11 784 bytes) the step peaked
/// at 10 760 bytes (and at 65%, 7 659, also at 10 760). The same layers without views keep the promise. Expected:
/// peak ≤ budget; gradients bitwise the plain tape's, and after the backward exactly the plain tape's live bytes,
/// 1 032 (the constant input [16,8] and the loss: nothing of the chain stays).
TEST(ViewsAdversarial, AutoScheduleKeepsItsBudgetWhenLayersReturnViewsOfTheirValues) {
  constexpr int L = 8;
  std::vector<Parameter<double>> weights;
  for (int l = 0; l < L; ++l) weights.emplace_back(remat_test::random_matrix<double>(8, 8, 60 + l) * 0.4);
  const Matrix<double> xm = remat_test::random_matrix<double>(16, 8, 9);
  auto make_layers = [&](Tape<double>& tape) {
    std::vector<std::function<Var<double>(Var<double>)>> layers;
    for (Parameter<double>& weight : weights) {
      const Var<double> w = tape.variable(weight);
      layers.push_back([w](Var<double> h) {
        const Var<double> z = remat::reshape(remat::matmul(h, w), {4, 4, 8});
        return remat::view(remat::tanh(z), {16, 8});
      });
    }
    return layers;
  };
  auto take_grads = [&] { return remat_test::take_grads(weights); };
  Tape<double> plain;
  std::size_t plain_live = 0;
  {
    auto layers = make_layers(plain);
    Var<double> h = plain.constant(xm);
    for (auto& layer : layers) h = layer(h);
    const Var<double> loss = remat::sum(remat::square(h));  // named: square's output goes before the backward
    plain.backward(loss);
    plain_live = plain.memory().live_bytes;
  }
  const std::size_t plain_peak = plain.memory().peak_bytes;
  ASSERT_EQ(plain_peak, 11784u) << describe(plain.memory());
  ASSERT_EQ(plain_live, bytes<double>(16, 8) + bytes<double>(1, 1));
  const std::vector<Matrix<double>> want = take_grads();
  for (const std::size_t budget : {plain_peak * 70 / 100, plain_peak * 65 / 100}) {
    Tape<double> tape;
    auto layers = make_layers(tape);
    const Var<double> h = remat::checkpoint_sequential_auto(layers, tape.constant(xm), budget);
    const Var<double> loss = remat::sum(remat::square(h));
    tape.backward(loss);
    EXPECT_LE(tape.memory().peak_bytes, budget) << describe(tape.memory());
    EXPECT_EQ(tape.memory().live_bytes, plain_live) << describe(tape.memory());
    const std::vector<Matrix<double>> got = take_grads();
    for (int l = 0; l < L; ++l)
      EXPECT_TRUE(got[static_cast<std::size_t>(l)] == want[static_cast<std::size_t>(l)]) << budget << " " << l;
  }
}

/// A view of a Parameter held only by a handle does not stop an unrelated backward once the Parameter is modified,
/// as the Parameter's own node held only by a handle does not (a backward checks the Parameters it or a
/// regeneration may read). Before the fix, the check before a sweep checked every Parameter with view holds, read or
/// not, and the second backward threw "backward: the Parameter [4,6] recorded as node #0 was modified after it was
/// recorded"; loss = Σ Q² reads neither P nor its view.
TEST(ViewsAdversarial, AViewOfAModifiedParameterHeldOnlyByAHandleDoesNotStopABackward) {
  Parameter<float> P(remat_test::random_matrix<float>(4, 6, 1));
  Parameter<float> Q(remat_test::random_matrix<float>(4, 6, 2));
  {
    Tape<float> tape;
    const Var<float> p = tape.variable(P);  // a handle only: nothing reads it
    const Var<float> loss = remat::sum(remat::square(tape.variable(Q)));
    P.mutable_value()(0, 0) += 1.0f;
    EXPECT_NO_THROW(tape.backward(loss)) << "the Parameter's node";
  }
  {
    Tape<float> tape;
    const Var<float> v = remat::reshape(tape.variable(P), {24});  // a handle of a view only
    const Var<float> loss = remat::sum(remat::square(tape.variable(Q)));
    P.mutable_value()(0, 0) += 1.0f;
    EXPECT_NO_THROW(tape.backward(loss)) << "a view of it";
  }
}

// ---- passing: bytes by hand ----

/// A buffer kept for a handle of its view, not for a reader, is not saved. m = x·W [4,6]; v = reshape(m) is held
/// by the test; loss = sum(v), whose backward reads nothing. Saved: x alone (the matmul's backward reads it for
/// dW; W is a Parameter, not tape-owned): 192 bytes, and the report has no matmul or reshape row. dW = xᵀ·1.
TEST(ViewsAdversarial, ABufferKeptOnlyForAHandleOfItsViewIsNotSaved) {
  Parameter<float> W(remat_test::random_matrix<float>(6, 6, 6));
  const Matrix<float> xm = remat_test::random_matrix<float>(4, 6, 7);
  Tape<float> tape;
  const Var<float> v = remat::reshape(remat::matmul(tape.constant(xm), tape.variable(W)), {24});
  const Var<float> loss = remat::sum(v);
  EXPECT_EQ(tape.memory().saved_bytes, bytes<float>(4, 6)) << describe(tape.memory());
  std::ostringstream report;
  tape.print_saved_residuals(report);
  EXPECT_EQ(report.str().find("matmul"), std::string::npos) << report.str();
  tape.backward(loss);
  EXPECT_TRUE(W.grad().isApprox(xm.transpose() * Matrix<float>::Ones(4, 6), 1e-6f));
}

/// Three views of one buffer read by two backwards: v1 = reshape(m), v3 = unsqueeze(view(m)); square reads both
/// (its input). Saved: x and m's buffer once, 2 · 192 bytes (copies would have kept x, v1 and v3: 3 · 192).
/// dW = xᵀ·(2m + 2m).
TEST(ViewsAdversarial, SeveralViewsOfOneBufferCountItOnce) {
  Parameter<double> W(remat_test::random_matrix<double>(6, 6, 8));
  const Matrix<double> xm = remat_test::random_matrix<double>(4, 6, 9);
  Tape<double> tape;
  const Var<double> x = tape.constant(xm);
  Var<double> m = remat::matmul(x, tape.variable(W));
  const Matrix<double> m_value = m.value();
  const Var<double> v1 = remat::reshape(m, {24});
  const Var<double> v3 = remat::unsqueeze(remat::view(m, {2, 12}), 0);
  m = Var<double>();
  const Var<double> loss = remat::sum(remat::square(v1)) + remat::sum(remat::square(v3));
  EXPECT_EQ(tape.memory().saved_bytes, 2 * bytes<double>(4, 6)) << describe(tape.memory());
  tape.backward(loss);
  EXPECT_TRUE(W.grad().isApprox(xm.transpose() * (4.0 * m_value), 1e-12));
}

/// A checkpointed function returning views of its input: outer(u) = (inner(u), reshape(u)), inner(u) =
/// view(reshape(u)) in a nested nothing_saveable region; the outer region under nothing_saveable,
/// everything_saveable and dots_saveable. u = tanh(x·W) (its handle dropped). Saved: x (dW reads it), u's buffer
/// (tanh's backward reads its output; square's reads it through inner's view), exp's output [6,4] (its
/// backward): 3 · 192 bytes under every policy, estimate_memory's too. Gradients of a retain_graph backward and
/// of the one after it equal the plain tape's to 1e-13.
TEST(ViewsAdversarial, RegionsReturningViewsOfTheirInputSaveItsBufferOnce) {
  Parameter<double> W(remat_test::random_matrix<double>(6, 6, 12));
  const Matrix<double> xm = remat_test::random_matrix<double>(4, 6, 13);
  auto program = [&](Tape<double>& tape, int policy) {
    Var<double> u = remat::tanh(remat::matmul(tape.constant(xm), tape.variable(W)));
    auto inner = [](const Var<double>& a) { return remat::view(remat::reshape(a, {24}), {2, 12}); };
    auto outer = [&](const Var<double>& a) {
      return std::make_tuple(remat::checkpoint(inner, remat::policies::nothing_saveable)(a), remat::reshape(a, {6, 4}));
    };
    std::tuple<Var<double>, Var<double>> r;
    if (policy < 0) r = std::make_tuple(inner(u), remat::reshape(u, {6, 4}));
    if (policy == 0) r = remat::checkpoint(outer, remat::policies::nothing_saveable)(u);
    if (policy == 1) r = remat::checkpoint(outer, remat::policies::everything_saveable)(u);
    if (policy == 2) r = remat::checkpoint(outer, remat::policies::dots_saveable)(u);
    u = Var<double>();
    return remat::sum(remat::square(std::get<0>(r))) + remat::sum(remat::exp(std::get<1>(r)));
  };
  Tape<double> plain;
  plain.backward(program(plain, -1));
  const Matrix<double> want = W.grad();
  W.zero_grad();
  for (int policy = 0; policy < 3; ++policy) {
    Tape<double> tape;
    const Var<double> loss = program(tape, policy);
    EXPECT_EQ(tape.memory().saved_bytes, 3 * bytes<double>(4, 6)) << policy << " " << describe(tape.memory());
    const remat::MemoryEstimate e = remat::estimate_memory<double>([&](Tape<double>& t) { return program(t, policy); });
    EXPECT_EQ(e.saved_bytes, 3 * bytes<double>(4, 6)) << policy;
    tape.backward(loss, true);
    EXPECT_TRUE(W.grad().isApprox(want, 1e-13)) << policy;
    W.zero_grad();
    tape.backward(loss);
    EXPECT_TRUE(W.grad().isApprox(want, 1e-13)) << policy;
    W.zero_grad();
  }
}

/// checkpoint_name on views under name policies. f(h) = matmul(ev, W) with tv = reshape(tanh(h)) named "tv" and
/// ev = reshape(exp(tv)) named "ev". Saved after the forward pass, by hand: x (the first matmul's dW), the region
/// output y (square reads it) and the region input h — the replay still re-runs tanh, since tanh's own output was
/// dropped and a value kept only for its views is not there for a replay — plus, per policy, the buffers of the
/// saved views: {"tv"}: tanh's (4 · 192 bytes); {"ev"}: exp's (4 · 192); both: 5 · 192; everything but "tv":
/// exp's (4 · 192). estimate_memory gives the same; gradients equal the plain tape's to 1e-12.
TEST(ViewsAdversarial, NamedViewsUnderNamePoliciesSaveTheirBuffers) {
  Parameter<double> W(remat_test::random_matrix<double>(6, 6, 7));
  const Matrix<double> xm = remat_test::random_matrix<double>(4, 6, 8);
  auto program = [&](Tape<double>& tape, int mode) {
    const Var<double> w = tape.variable(W);
    const Var<double> h = remat::matmul(tape.constant(xm), w);
    auto f = [&](const Var<double>& u) {
      const Var<double> tv = remat::checkpoint_name(remat::reshape(remat::tanh(u), {24}), "tv");
      const Var<double> ev = remat::checkpoint_name(remat::reshape(remat::exp(tv), {4, 6}), "ev");
      return remat::matmul(ev, w);
    };
    Var<double> y;
    if (mode == 0) y = f(h);
    if (mode == 1) y = remat::checkpoint(f, remat::policies::save_only_these_names({"tv"}))(h);
    if (mode == 2) y = remat::checkpoint(f, remat::policies::save_only_these_names({"ev"}))(h);
    if (mode == 3) y = remat::checkpoint(f, remat::policies::save_only_these_names({"tv", "ev"}))(h);
    if (mode == 4) y = remat::checkpoint(f, remat::policies::save_any_names_but_these({"tv"}))(h);
    return remat::sum(remat::square(y));
  };
  Tape<double> plain;
  plain.backward(program(plain, 0));
  const Matrix<double> want = W.grad();
  W.zero_grad();
  const std::size_t saved[5] = {0, 4 * bytes<double>(4, 6), 4 * bytes<double>(4, 6), 5 * bytes<double>(4, 6),
                                4 * bytes<double>(4, 6)};
  for (int mode = 1; mode <= 4; ++mode) {
    Tape<double> tape;
    const Var<double> loss = program(tape, mode);
    EXPECT_EQ(tape.memory().saved_bytes, saved[mode]) << mode << " " << describe(tape.memory());
    const std::size_t forward_peak = tape.memory().peak_bytes;
    tape.backward(loss);
    EXPECT_TRUE(W.grad().isApprox(want, 1e-12)) << mode;
    W.zero_grad();
    const remat::MemoryEstimate e = remat::estimate_memory<double>([&](Tape<double>& t) { return program(t, mode); });
    EXPECT_EQ(e.saved_bytes, saved[mode]) << mode;
    EXPECT_EQ(e.forward_peak_bytes, forward_peak) << mode;
    EXPECT_EQ(e.peak_bytes, tape.memory().peak_bytes) << mode;
    EXPECT_EQ(e.replayed_bytes, tape.memory().replayed_bytes) << mode;
  }
}

// ---- passing: budgets, replays, captures ----

/// A chain that reshapes every layer (z = h·W viewed [4,4,8], tanh, viewed back [16,8]; a variant also reads the
/// view of z again later, another turns the output through unsqueeze and flatten) under budgets of 60% and 45% of
/// the plain peak with each EvictionHeuristic: where the budget can hold the step, its peak stays under it, the
/// gradients equal the plain tape's bitwise, and estimate_memory under the same budget gives the same peak.
TEST(ViewsAdversarial, BudgetsWithEveryHeuristicOnAChainThatReshapesEveryLayer) {
  constexpr int layers = 10;
  std::vector<Parameter<double>> weights;
  for (int l = 0; l < layers; ++l) weights.emplace_back(remat_test::random_matrix<double>(8, 8, 20 + l) * 0.4);
  const Matrix<double> xm = remat_test::random_matrix<double>(16, 8, 9);
  int fits = 0;
  for (int variant = 0; variant < 3; ++variant) {
    auto forward = [&](Tape<double>& tape) {
      Var<double> h = tape.constant(xm);
      for (Parameter<double>& weight : weights) {
        const Var<double> z = remat::reshape(remat::matmul(h, tape.variable(weight)), {4, 4, 8});
        Var<double> a = remat::view(remat::tanh(z), {16, 8});
        if (variant == 1) a = a + remat::reshape(z, {16, 8});
        if (variant == 2) a = remat::flatten(remat::unsqueeze(a, 0), 0, 1);
        h = a;
      }
      return remat::sum(remat::square(remat::reshape(h, {128})));
    };
    Tape<double> plain;
    plain.backward(forward(plain));
    const std::vector<Matrix<double>> want = remat_test::take_grads(weights);
    for (const auto heuristic :
         {remat::EvictionHeuristic::dtr, remat::EvictionHeuristic::dtr_eq, remat::EvictionHeuristic::local}) {
      for (const std::size_t percent : {60u, 45u}) {
        const std::size_t budget = plain.memory().peak_bytes * percent / 100;
        Tape<double> tape;
        tape.set_memory_budget(budget, heuristic);
        try {
          tape.backward(forward(tape));
        } catch (const remat::memory_budget_error&) {
          for (Parameter<double>& w : weights) w.zero_grad();
          continue;
        }
        ++fits;
        EXPECT_LE(tape.memory().peak_bytes, budget) << variant << " " << percent;
        EXPECT_GT(tape.memory().evictions, 0u) << variant << " " << percent;
        for (int l = 0; l < layers; ++l) {
          EXPECT_TRUE(weights[static_cast<std::size_t>(l)].grad() == want[static_cast<std::size_t>(l)])
              << variant << " " << percent << " " << l;
          weights[static_cast<std::size_t>(l)].zero_grad();
        }
        const remat::MemoryEstimate e = remat::estimate_memory<double>([&](Tape<double>& t) {
          t.set_memory_budget(budget, heuristic);
          return forward(t);
        });
        EXPECT_EQ(e.peak_bytes, tape.memory().peak_bytes) << variant << " " << percent;
      }
    }
  }
  EXPECT_EQ(fits, 18);
}

/// Views held by the test whose buffers a budget of six [16,8] values evicts: reading each view's value() (last
/// layer first, then first first, then after the backward) regenerates its buffer and gives the value a plain
/// tape gave, bitwise.
TEST(ViewsAdversarial, ValuesReadThroughViewsOfEvictedBuffers) {
  constexpr int layers = 8;
  std::vector<Parameter<double>> weights;
  for (int l = 0; l < layers; ++l) weights.emplace_back(remat_test::random_matrix<double>(8, 8, 40 + l) * 0.4);
  const Matrix<double> xm = remat_test::random_matrix<double>(16, 8, 9);
  auto record = [&](Tape<double>& tape, std::vector<Var<double>>& views) {
    Var<double> h = tape.constant(xm);
    for (Parameter<double>& weight : weights) {
      h = remat::tanh(remat::matmul(h, tape.variable(weight)));
      views.push_back(remat::unsqueeze(remat::reshape(h, {128}), 0));
    }
    return remat::sum(remat::square(h));
  };
  std::vector<Matrix<double>> want;
  {
    Tape<double> plain;
    std::vector<Var<double>> views;
    record(plain, views);
    for (const Var<double>& v : views) want.push_back(v.value());
  }
  Tape<double> tape;
  tape.set_memory_budget(6 * bytes<double>(16, 8));
  std::vector<Var<double>> views;
  const Var<double> loss = record(tape, views);
  for (int l = layers - 1; l >= 0; --l)
    EXPECT_TRUE(Matrix<double>(views[static_cast<std::size_t>(l)].value()) == want[static_cast<std::size_t>(l)]) << l;
  for (int l = 0; l < layers; ++l)
    EXPECT_TRUE(Matrix<double>(views[static_cast<std::size_t>(l)].value()) == want[static_cast<std::size_t>(l)]) << l;
  EXPECT_GT(tape.memory().evictions, 0u);
  tape.backward(loss);
  for (int l = 0; l < layers; ++l)
    EXPECT_TRUE(Matrix<double>(views[static_cast<std::size_t>(l)].value()) == want[static_cast<std::size_t>(l)]) << l;
  EXPECT_LE(tape.memory().peak_bytes, 6 * bytes<double>(16, 8));
}

/// A CapturedStep under a budget whose step views its input (set_input each replay), views every layer and
/// checkpoints every third through views: each replay gives the loss and gradients of a fresh tape's step,
/// bitwise. In the regions, nothing_saveable drops only the view sin reads, so their replays re-point it and
/// regenerate no bytes: replayed_bytes is 0 over 3 replayed ops.
TEST(ViewsAdversarial, CapturedStepUnderABudgetWithViewsOfItsInput) {
  constexpr int layers = 8;
  std::vector<Parameter<float>> weights;
  for (int l = 0; l < layers; ++l) weights.emplace_back(remat_test::random_matrix<float>(8, 8, 80 + l) * 0.4f);
  Matrix<float> xm = remat_test::random_matrix<float>(16, 8, 9);
  Var<float> input;
  auto step = [&](Tape<float>& tape, std::size_t budget) {
    if (budget) tape.set_memory_budget(budget);
    input = tape.constant(xm);
    Var<float> h = remat::reshape(input, {4, 32});
    for (int l = 0; l < layers; ++l) {
      const Var<float> z = remat::matmul(remat::view(h, {16, 8}), tape.variable(weights[static_cast<std::size_t>(l)]));
      h = remat::reshape(remat::tanh(remat::unsqueeze(z, 0)), {4, 32});
      if (l % 3 == 1)
        h = remat::checkpoint(
            [](const Var<float>& u) {
              return remat::reshape(remat::sin(remat::view(u, {2, 64})), {4, 32});
            },
            remat::policies::nothing_saveable)(h);
    }
    return remat::sum(remat::square(h));
  };
  Tape<float> plain;
  plain.backward(step(plain, 0));
  for (Parameter<float>& w : weights) w.zero_grad();
  for (const std::size_t percent : {70u, 50u}) {
    const std::size_t budget = plain.memory().peak_bytes * percent / 100;
    remat::CapturedStep<float> captured([&](Tape<float>& t) { return step(t, budget); });
    const Var<float> in = input;
    EXPECT_EQ(captured.memory().replayed_bytes, 0u) << describe(captured.memory());
    EXPECT_EQ(captured.memory().replayed_ops, 3u) << describe(captured.memory());
    EXPECT_GT(captured.memory().evictions, 0u) << describe(captured.memory());
    for (Parameter<float>& w : weights) w.zero_grad();
    for (int s = 0; s < 3; ++s) {
      xm = remat_test::random_matrix<float>(16, 8, 200 + static_cast<std::uint64_t>(s));
      captured.set_input(in, xm);
      const float loss = captured.replay();
      const std::vector<Matrix<float>> got = remat_test::take_grads(weights);
      Tape<float> fresh;
      const Var<float> fresh_loss = step(fresh, 0);
      fresh.backward(fresh_loss);
      EXPECT_EQ(loss, fresh_loss.item()) << percent << " " << s;
      for (int l = 0; l < layers; ++l) {
        EXPECT_TRUE(got[static_cast<std::size_t>(l)] == weights[static_cast<std::size_t>(l)].grad())
            << percent << " " << s << " " << l;
        weights[static_cast<std::size_t>(l)].zero_grad();
      }
    }
  }
}

/// A policy that throws when asked about a view op, mid-region: the exception propagates, the tape keeps its
/// figures usable, and the same function checkpointed with nothing_saveable then gives the plain gradient.
TEST(ViewsAdversarial, APolicyThrowingOnAViewLeavesTheTapeUsable) {
  Parameter<double> W(remat_test::random_matrix<double>(6, 6, 14));
  const Matrix<double> xm = remat_test::random_matrix<double>(4, 6, 15);
  auto f = [](const Var<double>& u) { return remat::view(remat::exp(remat::reshape(u, {24})), {4, 6}); };
  Tape<double> plain;
  plain.backward(remat::sum(remat::square(f(remat::tanh(remat::matmul(plain.constant(xm), plain.variable(W)))))));
  const Matrix<double> want = W.grad();
  W.zero_grad();
  Tape<double> tape;
  const Var<double> h = remat::tanh(remat::matmul(tape.constant(xm), tape.variable(W)));
  auto refuses_views = [](const remat::OpInfo& op) -> bool {
    if (std::string(op.name) == "view") throw std::runtime_error("this policy refuses views");
    return false;
  };
  EXPECT_THROW(remat::checkpoint(f, refuses_views)(h), std::runtime_error);
  tape.backward(remat::sum(remat::square(remat::checkpoint(f, remat::policies::nothing_saveable)(h))));
  EXPECT_TRUE(W.grad() == want);
}

/// gradcheck in double of a loss through views of views, a view of a tanh inside unsqueeze, a checkpoint region
/// whose input is a view and whose body reshapes, and a view read twice: the analytic gradient matches central
/// differences (max relative error < 1e-7).
TEST(ViewsAdversarial, GradcheckThroughViewsAndACheckpoint) {
  auto loss = [](Tape<double>&, const std::vector<Var<double>>& in) {
    const Var<double> b = remat::unsqueeze(remat::tanh(remat::reshape(in[0], {2, 3, 4})), 1);
    const Var<double> d = remat::matmul(remat::view(b, {6, 4}), in[1]);
    const Var<double> e = remat::squeeze(remat::unsqueeze(remat::flatten(d), 0), 0);
    const Var<double> f = remat::checkpoint([](const Var<double>& u) {
      return remat::sin(remat::reshape(u, {6, 3}));
    })(e);
    return remat::sum(remat::square(f) * remat::reshape(e, {6, 3}));
  };
  const remat::GradcheckResult r =
      remat::gradcheck(loss, {remat_test::random_matrix<double>(4, 6, 1), remat_test::random_matrix<double>(4, 3, 2)});
  EXPECT_LT(r.max_error, 1e-7) << r.describe();
}

/// Random programs of 30 steps (views of any kind on any of the last values, tanh, sin, sums of two values
/// through a reshape, matmuls, checkpoint_name, values read with value(), and nested checkpoint regions under
/// every kind of policy), each run plain, with its regions, and under budgets of 80% and 70% of the plain peak
/// (dtr_eq with regions; dtr and local without), a third of them with a retain_graph backward and a second one:
/// wherever the budget can hold the step, the gradient and every value read equal the plain run's bitwise, the
/// peak stays under the budget, and estimate_memory gives the same saved, forward-peak, peak and replayed bytes.
namespace random_programs {
struct Step {
  int kind, a, b, c;
};

const std::vector<std::vector<remat::Index>>& shapes() {
  static const std::vector<std::vector<remat::Index>> s = {{4, 6}, {6, 4}, {24}, {2, 3, 4}, {1, 24}, {2, 12}, {3, 8}};
  return s;
}

struct Runner {
  const std::vector<Step>* plan;
  Var<double> w;
  bool regions;
  std::vector<Var<double>> pool;
  std::vector<double>* reads;  // null on a shapes-only tape

  Var<double> pick(int a) const { return pool[pool.size() - 1 - static_cast<std::size_t>(a) % pool.size()]; }

  void run(std::size_t begin, std::size_t end) {
    for (std::size_t i = begin; i < end; ++i) {
      const Step& s = (*plan)[i];
      const auto& shape = shapes()[static_cast<std::size_t>(s.c) % shapes().size()];
      switch (s.kind) {
        case 0: {
          const Var<double> x = pick(s.a);
          const bool leading_one = x.shape().rank() > 1 && x.shape()[0] == 1;
          const int which = s.b % 5;
          pool.push_back(which == 0                   ? remat::reshape(x, shape)
                         : which == 1                 ? remat::view(x, shape)
                         : which == 2                 ? remat::flatten(x)
                         : which == 3 || !leading_one ? remat::unsqueeze(x, 0)
                                                      : remat::squeeze(x, 0));
          break;
        }
        case 1:
          pool.push_back(s.b % 2 ? remat::tanh(pick(s.a)) : remat::sin(pick(s.a)));
          break;
        case 2: {
          const Var<double> x = pick(s.a);
          pool.push_back(x + remat::reshape(pick(s.b), x.shape().dims()));
          break;
        }
        case 3:
          pool.push_back(remat::matmul(remat::reshape(pick(s.a), {4, 6}), w));
          break;
        case 4: {
          const std::size_t stop = std::min(end, i + 1 + static_cast<std::size_t>(s.b));
          const std::size_t mark = pool.size();
          auto f = [this, i, stop, mark](const Var<double>&) {
            run(i + 1, stop);
            Var<double> out = pool.back();
            if (pool.size() == mark) out = remat::tanh(out);  // a region of no op returns a value of its own
            pool.resize(mark);
            return out;
          };
          Var<double> out;
          if (!regions) out = f(pool.back());
          if (regions && s.a == 0) out = remat::checkpoint(f, remat::policies::nothing_saveable)(pool.back());
          if (regions && s.a == 1) out = remat::checkpoint(f, remat::policies::everything_saveable)(pool.back());
          if (regions && s.a == 2) out = remat::checkpoint(f, remat::policies::dots_saveable)(pool.back());
          if (regions && s.a == 3)
            out = remat::checkpoint(f, remat::policies::save_only_these_names({"keep"}))(pool.back());
          pool.push_back(out);
          i = stop - 1;
          break;
        }
        case 5:
          pool.push_back(remat::checkpoint_name(pool.back(), "keep"));
          break;
        case 6:
          if (reads) reads->push_back(Matrix<double>(pick(s.a).value()).sum());
          break;
      }
    }
  }
};

std::vector<Step> make_plan(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<Step> plan;
  for (int i = 0; i < 30; ++i) {
    const int r = static_cast<int>(rng() % 20);
    Step s{};
    s.kind = r < 7 ? 0 : r < 10 ? 1 : r < 12 ? 2 : r < 14 ? 3 : r < 16 ? 4 : r < 18 ? 5 : 6;
    s.a = static_cast<int>(rng() % 4);
    s.b = static_cast<int>(rng() % 7) + (s.kind == 4 ? 2 : 0);
    s.c = static_cast<int>(rng() % 7);
    plan.push_back(s);
  }
  return plan;
}

Var<double> program(Tape<double>& tape, const std::vector<Step>& plan, Parameter<double>& W, const Matrix<double>& xm,
                    bool regions, std::vector<double>* reads) {
  Runner r{&plan, tape.variable(W), regions, {}, reads};
  r.pool.push_back(tape.constant(xm));
  r.pool.push_back(remat::matmul(r.pool.back(), r.w));
  r.run(0, plan.size());
  Var<double> loss = remat::sum(remat::square(r.pool.back()));
  for (std::size_t k = 2; k < r.pool.size(); k += 3) loss = loss + remat::sum(remat::sin(r.pool[k]));
  return loss;
}
}  // namespace random_programs

TEST(ViewsAdversarial, RandomProgramsOfViewsRegionsAndBudgets) {
  using random_programs::Step;
  const Matrix<double> xm = remat_test::random_matrix<double>(4, 6, 1);
  int runs = 0;
  std::size_t evictions = 0, replayed_ops = 0;
  for (std::uint64_t seed = 1; seed <= 200; ++seed) {
    Parameter<double> W(remat_test::random_matrix<double>(6, 6, seed) * 0.5);
    const std::vector<Step> plan = random_programs::make_plan(seed);
    bool reads_values = false;
    for (const Step& s : plan) reads_values |= s.kind == 6;
    std::vector<double> want_reads;
    Tape<double> plain;
    plain.backward(random_programs::program(plain, plan, W, xm, false, &want_reads));
    const Matrix<double> want = W.grad();
    W.zero_grad();
    const bool twice = seed % 3 == 0;
    for (int mode = 1; mode < 5; ++mode) {
      const bool regions = mode != 3;
      const std::size_t budget = mode < 2 ? 0 : plain.memory().peak_bytes * (mode == 4 ? 70 : 80) / 100;
      const remat::EvictionHeuristic heuristic = mode == 3   ? remat::EvictionHeuristic::dtr
                                                 : mode == 4 ? remat::EvictionHeuristic::local
                                                             : remat::EvictionHeuristic::dtr_eq;
      Tape<double> tape;
      if (budget) tape.set_memory_budget(budget, heuristic);
      std::vector<double> reads;
      remat::MemoryStats forward;
      try {
        const Var<double> loss = random_programs::program(tape, plan, W, xm, regions, &reads);
        forward = tape.memory();
        tape.backward(loss, twice);
        if (twice) {
          EXPECT_TRUE(W.grad() == want) << "seed " << seed << " mode " << mode << " (first backward)";
          W.zero_grad();
          tape.backward(loss);
        }
      } catch (const remat::memory_budget_error&) {
        W.zero_grad();
        continue;
      }
      ++runs;
      evictions += tape.memory().evictions;
      replayed_ops += tape.memory().replayed_ops;
      EXPECT_TRUE(W.grad() == want) << "seed " << seed << " mode " << mode;
      W.zero_grad();
      EXPECT_EQ(reads, want_reads) << "seed " << seed << " mode " << mode;
      if (budget) {
        EXPECT_LE(tape.memory().peak_bytes, budget) << "seed " << seed << " mode " << mode;
      }
      if (twice || (budget && reads_values)) continue;  // value() regenerates under a budget; no estimate reads
      const remat::MemoryEstimate e = remat::estimate_memory<double>([&](Tape<double>& t) {
        if (budget) t.set_memory_budget(budget, heuristic);
        return random_programs::program(t, plan, W, xm, regions, nullptr);
      });
      EXPECT_EQ(e.saved_bytes, forward.saved_bytes) << "seed " << seed << " mode " << mode;
      EXPECT_EQ(e.forward_peak_bytes, forward.peak_bytes) << "seed " << seed << " mode " << mode;
      EXPECT_EQ(e.peak_bytes, tape.memory().peak_bytes) << "seed " << seed << " mode " << mode;
      EXPECT_EQ(e.replayed_bytes, tape.memory().replayed_bytes) << "seed " << seed << " mode " << mode;
    }
  }
  // The programs exercise what they are for: most budgets hold, and they evict and replay.
  EXPECT_GT(runs, 600);
  EXPECT_GT(evictions, 1000u);
  EXPECT_GT(replayed_ops, 500u);
}

}  // namespace views_adversarial_test
