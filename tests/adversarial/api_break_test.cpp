// Adversarial tests of remat's public API: bitwise checkpoint equality for every
// policy on odd region shapes, gradient accumulation, Parameter lifetime, typed errors and memory() figures.
// Oracles: a plain tape without checkpoint, finite differences, and byte counts computed by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "remat/remat.hpp"

namespace api_break_test {

using remat::Matrix;
using remat::Parameter;
using remat::Tape;
using remat::Var;
using Policy = std::function<bool(const remat::OpInfo&)>;

template <class T>
Matrix<T> rnd(remat::Index r, remat::Index c, unsigned seed, double scale = 1.0) {
  std::srand(seed);
  Matrix<T> m = Matrix<T>::Random(r, c);
  return m * static_cast<T>(scale);
}

template <class T>
bool same_bits(const Matrix<T>& a, const Matrix<T>& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() &&
         std::memcmp(a.data(), b.data(), sizeof(T) * static_cast<std::size_t>(a.size())) == 0;
}

inline std::vector<std::pair<std::string, Policy>> all_policies() {
  namespace p = remat::policies;
  int counter = 0;
  return {
      {"nothing", p::nothing_saveable},
      {"everything", p::everything_saveable},
      {"dots", p::dots_saveable},
      {"dots_no_batch", p::dots_with_no_batch_dims_saveable},
      {"only_a", p::save_only_these_names({"a"})},
      {"only_a_b", p::save_only_these_names({"a", "b"})},
      {"any_but_a", p::save_any_names_but_these({"a"})},
      {"except_a", p::save_anything_except_these_names({"a"})},
      {"except_none", p::save_anything_except_these_names(std::vector<std::string>{})},
      {"both_dots_b", p::save_from_both_policies(p::dots_saveable, p::save_only_these_names({"b"}))},
      {"lambda_tanh", [](const remat::OpInfo& op) { return op.name == "tanh"; }},
      {"lambda_big_nonelem",
       [](const remat::OpInfo& op) { return op.bytes >= 256 && op.kind != remat::OpKind::elementwise; }},
      {"lambda_stateful_alternate", [counter](const remat::OpInfo&) mutable { return (counter++ % 2) == 0; }},
      {"lambda_norm_only", [](const remat::OpInfo& op) { return op.kind == remat::OpKind::normalization; }},
  };
}

/// Parameters shared by every program.
template <class T>
struct Params {
  Parameter<T> w1{rnd<T>(16, 16, 11, 0.4)}, b1{rnd<T>(1, 16, 12)}, w2{rnd<T>(16, 16, 13, 0.4)}, b2{rnd<T>(1, 16, 14)},
      g{rnd<T>(1, 16, 15)}, bb{rnd<T>(1, 16, 16)}, w3{rnd<T>(16, 4, 17, 0.4)}, b3{rnd<T>(1, 4, 18)};
  std::vector<Parameter<T>*> all() { return {&w1, &b1, &w2, &b2, &g, &bb, &w3, &b3}; }
  void zero() {
    for (auto* p : all()) p->zero_grad();
  }
  std::vector<Matrix<T>> grads() {
    std::vector<Matrix<T>> r;
    for (auto* p : all()) r.emplace_back(p->grad());
    return r;
  }
};

struct Vars {
  Var<float> w1, b1, w2, b2, g, bb, w3, b3;
};

/// Which region layout a program uses. `wrap(f)` is either f itself (plain) or checkpoint(f, policy).
enum class Shape { nested_twice, unused_output, identity, constants_only, tuple_partly_unused, deep_nested };

/// Records a program on `tape`; `ck` = nullptr for the plain oracle. Returns the loss.
inline Var<float> program(Tape<float>& tape, Params<float>& P, Shape shape, const Policy* ck, const Matrix<float>& X,
                          bool x_variable, Var<float>* x_out) {
  Vars v{tape.variable(P.w1), tape.variable(P.b1), tape.variable(P.w2), tape.variable(P.b2),
         tape.variable(P.g),  tape.variable(P.bb), tape.variable(P.w3), tape.variable(P.b3)};
  Var<float> x = x_variable ? tape.variable(X) : tape.constant(X);
  if (x_out) *x_out = x;
  auto wrap = [&](auto f) {
    return [f, ck](auto&&... a) -> decltype(f(a...)) {
      if (ck) return remat::checkpoint(f, *ck)(a...);
      return f(a...);
    };
  };
  auto layer = wrap([&v](Var<float> h) {
    auto l = remat::checkpoint_name(remat::linear(remat::layer_norm(h, v.g, v.bb), v.w1, v.b1), "a");
    auto t = remat::checkpoint_name(remat::gelu(l), "b");
    return h + remat::tanh(remat::linear(t, v.w2, v.b2)) * 0.5f;
  });
  Var<float> h;
  switch (shape) {
    case Shape::nested_twice: {
      auto outer = wrap([&](Var<float> a) { return layer(layer(a)); });  // shared parameters, called twice
      h = outer(x);
      break;
    }
    case Shape::unused_output: {
      Var<float> unused = layer(x * 2.0f);  // result never reaches the loss
      (void)unused;
      h = layer(x);
      break;
    }
    case Shape::identity: {
      auto id = wrap([](Var<float> a) { return a; });
      auto id2 = wrap([](Var<float> a, Var<float> b) { return std::make_tuple(b, a); });
      Var<float> y = id(layer(id(x)));
      auto [p, q] = id2(y, x);
      h = p + q;
      break;
    }
    case Shape::constants_only: {
      Var<float> c = tape.constant(rnd<float>(8, 16, 77));
      auto consts = wrap([](Var<float> a) { return remat::exp(remat::tanh(a) * 0.3f) + remat::sin(a); });
      h = layer(x) * consts(c);
      break;
    }
    case Shape::tuple_partly_unused: {
      auto two = wrap([&v](Var<float> a) {
        auto l = remat::linear(a, v.w1, v.b1);
        return std::make_tuple(remat::relu(l), remat::sigmoid(l), remat::tanh(l));
      });
      auto [r, s, t] = two(x);
      (void)t;
      h = layer(r * s);
      break;
    }
    case Shape::deep_nested: {
      auto in1 = wrap([&](Var<float> a) { return layer(a); });
      auto in2 = wrap([&](Var<float> a) { return in1(in1(a)) + a; });
      auto in3 = wrap([&](Var<float> a) { return in2(a) * remat::sigmoid(in1(a)); });
      h = in3(x);
      break;
    }
  }
  auto logits = remat::linear(h, v.w3, v.b3);
  std::vector<int> labels{0, 1, 2, 3, 3, 2, 1, 0};
  return remat::cross_entropy(logits, labels);
}

struct RunResult {
  std::vector<Matrix<float>> grads;
  Matrix<float> xgrad;
  float loss;
};

inline RunResult run(Shape shape, const Policy* ck, bool x_variable, bool retain_twice = false) {
  Params<float> P;
  Tape<float> tape(7);
  Var<float> x;
  Matrix<float> X = rnd<float>(8, 16, 3);
  Var<float> loss = program(tape, P, shape, ck, X, x_variable, &x);
  tape.backward(loss, retain_twice);
  if (retain_twice) tape.backward(loss);
  RunResult r{P.grads(), x_variable ? Matrix<float>(x.grad()) : Matrix<float>(), loss.item()};
  return r;
}

const Shape kShapes[] = {Shape::nested_twice,   Shape::unused_output,       Shape::identity,
                         Shape::constants_only, Shape::tuple_partly_unused, Shape::deep_nested};

// ---------------------------------------------------------------------------------------------------------------
// 1. Bitwise equality, every policy, every region layout, x constant and x variable.
TEST(ApiBreakEquality, EveryPolicyEveryShapeBitwise) {
  for (Shape s : kShapes)
    for (bool xv : {false, true}) {
      const RunResult plain = run(s, nullptr, xv);
      for (const auto& [name, pol] : all_policies()) {
        RunResult ck;
        ASSERT_NO_THROW(ck = run(s, &pol, xv)) << "shape " << int(s) << " policy " << name;
        EXPECT_EQ(std::memcmp(&plain.loss, &ck.loss, sizeof(float)), 0) << "shape " << int(s) << " " << name;
        for (std::size_t i = 0; i < plain.grads.size(); ++i)
          EXPECT_TRUE(same_bits(plain.grads[i], ck.grads[i]))
              << "shape " << int(s) << " policy " << name << " xvar " << xv << " param " << i;
        if (xv) {
          EXPECT_TRUE(same_bits(plain.xgrad, ck.xgrad)) << "shape " << int(s) << " policy " << name;
        }
      }
    }
}

// retain_graph twice under each policy: exactly 2 × the single-backward gradient (g + g is exact).
TEST(ApiBreakEquality, RetainTwiceDoublesUnderEveryPolicy) {
  for (Shape s : {Shape::nested_twice, Shape::deep_nested, Shape::tuple_partly_unused}) {
    const RunResult once = run(s, nullptr, true);
    for (const auto& [name, pol] : all_policies()) {
      RunResult twice;
      ASSERT_NO_THROW(twice = run(s, &pol, true, true)) << name;
      for (std::size_t i = 0; i < once.grads.size(); ++i)
        EXPECT_TRUE(same_bits(Matrix<float>(once.grads[i] * 2.0f), twice.grads[i]))
            << "shape " << int(s) << " policy " << name << " param " << i;
      // x is a tape variable with several contributions; its accumulated gradient adds each contribution
      // in turn (Parameters get the summed gradient), so doubling is exact only up to float rounding.
      EXPECT_LE((once.xgrad * 2.0f - twice.xgrad).cwiseAbs().maxCoeff(), 4e-7f * once.xgrad.cwiseAbs().maxCoeff())
          << name;
    }
  }
}

// The plain tape itself against central finite differences (double), so the oracle is not circular.
TEST(ApiBreakEquality, PlainTapeMatchesFiniteDifferencesDouble) {
  Parameter<double> W(rnd<double>(5, 4, 1, 0.5)), b(rnd<double>(1, 4, 2)), g(rnd<double>(1, 5, 3)),
      bb(rnd<double>(1, 5, 4));
  const Matrix<double> X = rnd<double>(6, 5, 5);
  std::vector<int> labels{0, 1, 2, 3, 1, 0};
  auto f = [&](Tape<double>& t, bool ck) {
    auto w = t.variable(W), c = t.variable(b), gg = t.variable(g), bv = t.variable(bb);
    auto body = [&](Var<double> h) { return remat::gelu(remat::linear(remat::layer_norm(h, gg, bv), w, c)); };
    auto x = t.constant(X);
    Var<double> y = ck ? remat::checkpoint(body, remat::policies::dots_saveable)(x) : body(x);
    return remat::cross_entropy(remat::tanh(y) + y, labels);
  };
  Tape<double> tape;
  auto loss = f(tape, true);
  tape.backward(loss);
  const double eps = 1e-6;
  for (Parameter<double>* p : {&W, &b, &g, &bb}) {
    Matrix<double> analytic = p->grad();
    for (remat::Index i = 0; i < p->value().size(); ++i) {
      const double orig = p->value()(i);
      p->mutable_value()(i) = orig + eps;
      Tape<double> t1;
      const double lp = f(t1, false).item();
      p->mutable_value()(i) = orig - eps;
      Tape<double> t2;
      const double lm = f(t2, false).item();
      p->mutable_value()(i) = orig;
      EXPECT_NEAR(analytic(i), (lp - lm) / (2 * eps), 1e-6);
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// 2. Gradient accumulation.
TEST(ApiBreakAccumulate, TwoTapesAddZeroGradClears) {
  const RunResult once = run(Shape::nested_twice, nullptr, false);
  Params<float> P;
  Matrix<float> X = rnd<float>(8, 16, 3);
  const Policy dots = remat::policies::dots_saveable;
  for (int k = 0; k < 2; ++k) {
    Tape<float> tape(7);
    auto loss = program(tape, P, Shape::nested_twice, k == 0 ? nullptr : &dots, X, false, nullptr);
    tape.backward(loss);
  }
  auto g = P.grads();
  for (std::size_t i = 0; i < g.size(); ++i) EXPECT_TRUE(same_bits(Matrix<float>(once.grads[i] * 2.0f), g[i])) << i;
  P.zero();
  for (auto* p : P.all()) {
    EXPECT_FALSE(p->has_grad());
    EXPECT_EQ(Matrix<float>(p->grad()).cwiseAbs().maxCoeff(), 0.0f);
  }
  {
    Tape<float> tape(7);
    auto loss = program(tape, P, Shape::nested_twice, &dots, X, false, nullptr);
    tape.backward(loss);
  }
  g = P.grads();
  for (std::size_t i = 0; i < g.size(); ++i) EXPECT_TRUE(same_bits(once.grads[i], g[i])) << i;
}

// Tape reused via clear(): the buffer hand-over must not alias the Parameter's gradient with a pool buffer.
TEST(ApiBreakAccumulate, ClearedTapeReuseKeepsGradientsIndependent) {
  const RunResult once = run(Shape::deep_nested, nullptr, false);
  Params<float> P;
  Matrix<float> X = rnd<float>(8, 16, 3);
  const Policy nothing = remat::policies::nothing_saveable;
  Tape<float> tape(7);
  for (int k = 0; k < 3; ++k) {
    auto loss = program(tape, P, Shape::deep_nested, &nothing, X, false, nullptr);
    tape.backward(loss);
    tape.clear();
    // Recording something big on the cleared tape must not scribble over a Parameter's gradient.
    auto junk = tape.constant(Matrix<float>::Constant(16, 16, 1e30f));
    auto junk2 = remat::exp(junk) + junk;
    (void)junk2;
    tape.clear();
    auto g = P.grads();
    for (std::size_t i = 0; i < g.size(); ++i)
      EXPECT_TRUE(same_bits(Matrix<float>(once.grads[i] * static_cast<float>(k + 1)), g[i]))
          << "step " << k << " param " << i;
  }
}

// Micro-batches 2×4 rows with loss scaled by 1/2 vs one 8-row batch, then one SGD step.
// Float rounding: each gradient entry is a sum of 8 per-row terms in a different association, so expect
// |diff| <= 1e-5 · (1 + |g|) ; the updated weights after lr = 0.1 then agree to 1e-6.
TEST(ApiBreakAccumulate, MicroBatchesEqualBigBatch) {
  const Matrix<float> X = rnd<float>(8, 16, 3);
  std::vector<int> labels{0, 1, 2, 3, 3, 2, 1, 0};
  Params<float> A, B;
  auto step = [](Tape<float>& tape, Params<float>& P, const Matrix<float>& x, const std::vector<int>& lab, float scale,
                 const Policy& pol) {
    auto w1 = tape.variable(P.w1), b1 = tape.variable(P.b1), w3 = tape.variable(P.w3), b3 = tape.variable(P.b3);
    auto body = remat::checkpoint([&](Var<float> h) { return remat::tanh(remat::linear(h, w1, b1)); }, pol);
    auto loss = remat::cross_entropy(remat::linear(body(tape.constant(x)), w3, b3), lab) * scale;
    tape.backward(loss);
  };
  {
    Tape<float> t;
    step(t, A, X, labels, 1.0f, remat::policies::nothing_saveable);
  }
  Tape<float> t;
  for (int k = 0; k < 2; ++k) {
    std::vector<int> lab(labels.begin() + 4 * k, labels.begin() + 4 * k + 4);
    step(t, B, Matrix<float>(X.middleRows(4 * k, 4)), lab, 0.5f, remat::policies::dots_saveable);
    t.clear();
  }
  const std::vector<Parameter<float>*> pas{&A.w1, &A.b1, &A.w3, &A.b3}, pbs{&B.w1, &B.b1, &B.w3, &B.b3};
  for (std::size_t k = 0; k < pas.size(); ++k) {
    Parameter<float>* pa = pas[k];
    Parameter<float>* pb = pbs[k];
    Matrix<float> ga = pa->grad(), gb = pb->grad();
    EXPECT_GT(ga.cwiseAbs().maxCoeff(), 1e-4f);
    EXPECT_LE((ga - gb).cwiseAbs().maxCoeff(), 1e-5f * (1.0f + ga.cwiseAbs().maxCoeff()));
    pa->mutable_value() -= 0.1f * ga;
    pb->mutable_value() -= 0.1f * gb;
    EXPECT_LE((pa->value() - pb->value()).cwiseAbs().maxCoeff(), 1e-6f);
  }
}

// gradient(loss, {a}) returns the plain gradient and leaves every accumulated gradient as it was.
TEST(ApiBreakAccumulate, GradientSubsetLeavesOthersUnchanged) {
  const RunResult once = run(Shape::deep_nested, nullptr, true);
  for (const auto& [name, pol] : all_policies()) {
    Params<float> P;
    Matrix<float> X = rnd<float>(8, 16, 3);
    // Give every Parameter a known non-zero accumulated gradient first.
    for (auto* p : P.all()) p->mutable_grad().setConstant(3.0f);
    Tape<float> tape(7);
    Var<float> x;
    auto loss = program(tape, P, Shape::deep_nested, &pol, X, true, &x);
    Var<float> w2 = tape.variable(P.w2);  // a second node for the same Parameter, not on the loss path
    (void)w2;
    std::vector<Matrix<float>> g;
    Var<float> w1v = tape.variable(P.w1);  // not on the loss path either: gradient must be zero
    ASSERT_NO_THROW(g = tape.gradient(loss, {x}, true)) << name;
    EXPECT_TRUE(same_bits(g[0], once.xgrad)) << name;
    ASSERT_NO_THROW(g = tape.gradient(loss, {w1v})) << name;
    EXPECT_EQ(g[0].cwiseAbs().maxCoeff(), 0.0f) << name;
    for (auto* p : P.all()) {
      Matrix<float> gp = p->grad();
      EXPECT_TRUE((gp.array() == 3.0f).all()) << name;
    }
    EXPECT_EQ(Matrix<float>(x.grad()).cwiseAbs().maxCoeff(), 0.0f) << name;
  }
}

// ---------------------------------------------------------------------------------------------------------------
// 3. Parameter lifetime.
template <class P, class = void>
struct can_record : std::false_type {};
template <class P>
struct can_record<P, std::void_t<decltype(std::declval<Tape<float>&>().variable(std::declval<P>()))>> : std::true_type {
};
static_assert(can_record<Parameter<float>&>::value, "a named Parameter can be recorded");
static_assert(!can_record<Parameter<float>>::value, "a temporary Parameter must not be recordable");
static_assert(!can_record<Parameter<float>&&>::value, "an xvalue Parameter must not be recordable");
static_assert(!can_record<const Parameter<float>&&>::value, "a const rvalue Parameter must not be recordable");

/// Records x -> checkpoint(tanh(linear(h, W, b))) -> cross_entropy for W, b at params[0], params[1].
// With x_grad, linear's backward reads W (so a changed W is a stale read); without, it reads only x.
inline Var<float> small_program(Tape<float>& tape, Parameter<float>& W, Parameter<float>& b, bool ck,
                                bool x_grad = false) {
  auto w = tape.variable(W), c = tape.variable(b);
  auto body = [w, c](Var<float> h) { return remat::tanh(remat::linear(h, w, c)); };
  auto x = x_grad ? tape.variable(rnd<float>(8, 16, 3)) : tape.constant(rnd<float>(8, 16, 3));
  Var<float> y = ck ? remat::checkpoint(body, remat::policies::nothing_saveable)(x) : body(x);
  return remat::cross_entropy(y, {0, 1, 2, 3, 4, 5, 6, 7});
}

TEST(ApiBreakLifetime, VectorReallocationBetweenForwardAndBackward) {
  Parameter<float> W0(rnd<float>(16, 16, 1, 0.3)), B0(rnd<float>(1, 16, 2));
  Matrix<float> gw, gb;
  {
    Tape<float> t;
    auto l = small_program(t, W0, B0, false);
    t.backward(l);
    gw = W0.grad();
    gb = B0.grad();
  }
  for (bool ck : {false, true}) {
    std::vector<Parameter<float>> v;
    v.reserve(2);
    v.emplace_back(rnd<float>(16, 16, 1, 0.3));
    v.emplace_back(rnd<float>(1, 16, 2));
    Tape<float> t;
    auto l = small_program(t, v[0], v[1], ck);
    const Parameter<float>* before = v.data();
    for (int i = 0; i < 40; ++i) v.emplace_back(Matrix<float>::Ones(3, 3));
    ASSERT_NE(before, v.data());
    ASSERT_NO_THROW(t.backward(l));
    EXPECT_TRUE(same_bits(gw, Matrix<float>(v[0].grad()))) << ck;
    EXPECT_TRUE(same_bits(gb, Matrix<float>(v[1].grad()))) << ck;
  }
}

TEST(ApiBreakLifetime, DestroyedParameterBeforeBackward) {
  for (bool ck : {false, true}) {
    auto W = std::make_unique<Parameter<float>>(rnd<float>(16, 16, 1, 0.3));
    Parameter<float> B(rnd<float>(1, 16, 2));
    Tape<float> t;
    auto l = small_program(t, *W, B, ck);
    W.reset();
    ASSERT_NO_THROW(t.backward(l)) << ck;
    Parameter<float> W0(rnd<float>(16, 16, 1, 0.3)), B0(rnd<float>(1, 16, 2));
    Tape<float> t0;
    auto l0 = small_program(t0, W0, B0, false);
    t0.backward(l0);
    EXPECT_TRUE(same_bits(Matrix<float>(B0.grad()), Matrix<float>(B.grad()))) << ck;
  }
}

TEST(ApiBreakLifetime, MoveConstructedParameterReceivesGradient) {
  Parameter<float> W0(rnd<float>(16, 16, 1, 0.3)), B0(rnd<float>(1, 16, 2));
  Tape<float> t0;
  auto l0 = small_program(t0, W0, B0, false);
  t0.backward(l0);
  for (bool ck : {false, true}) {
    Parameter<float> W(rnd<float>(16, 16, 1, 0.3)), B(rnd<float>(1, 16, 2));
    Tape<float> t;
    auto l = small_program(t, W, B, ck);
    Parameter<float> W2(std::move(W)), B2(std::move(B));
    ASSERT_NO_THROW(t.backward(l));
    EXPECT_TRUE(same_bits(Matrix<float>(W0.grad()), Matrix<float>(W2.grad()))) << ck;
    EXPECT_TRUE(same_bits(Matrix<float>(B0.grad()), Matrix<float>(B2.grad()))) << ck;
  }
}

// Move assignment (what std::swap, vector::erase and std::sort do) of a recorded weight whose value
// backward reads: must throw stale_value_error (typed), never a silent wrong gradient.
TEST(ApiBreakLifetime, MoveAssignedWeightIsStale) {
  for (bool ck : {false, true}) {
    Parameter<float> W(rnd<float>(16, 16, 1, 0.3)), B(rnd<float>(1, 16, 2)), other(rnd<float>(16, 16, 9));
    Tape<float> t;
    auto l = small_program(t, W, B, ck, /*x_grad=*/true);
    other = std::move(W);  // W's storage loses its value
    EXPECT_THROW(t.backward(l), remat::stale_value_error) << ck;
  }
}

// Assignments of recorded Parameters whose values backward never reads (biases; W when x is a constant), between
// forward and backward. Assignment keeps the object's storage (so optimizers keep updating the object), so the
// recorded value's gradient would land in whichever value replaced it, or nowhere. backward must refuse with
// stale_value_error and leave every gradient untouched. (Found by this file: before the fix the gradients were
// lost or silently misrouted.)
TEST(ApiBreakLifetime, SwappedBiasesMakeBackwardThrow) {
  Parameter<float> W(rnd<float>(16, 16, 1, 0.3)), B(rnd<float>(1, 16, 2)), spare(rnd<float>(1, 16, 5));
  Tape<float> t;
  auto l = small_program(t, W, B, false);
  std::swap(B, spare);  // move construct + two move assignments
  EXPECT_THROW(t.backward(l), remat::stale_value_error);
  EXPECT_FALSE(W.has_grad());
  EXPECT_FALSE(B.has_grad());
  EXPECT_FALSE(spare.has_grad());
  std::swap(B, spare);  // the values are back, but in each other's storage: still refused
  EXPECT_THROW(t.backward(l), remat::stale_value_error);
}

TEST(ApiBreakLifetime, MoveAssignedUnreadWeightMakesBackwardThrow) {
  Parameter<float> W(rnd<float>(16, 16, 1, 0.3)), B(rnd<float>(1, 16, 2)), other(rnd<float>(16, 16, 9));
  Tape<float> t;
  auto l = small_program(t, W, B, false);
  other = std::move(W);
  EXPECT_THROW(t.backward(l), remat::stale_value_error);
  EXPECT_FALSE(other.has_grad());
  EXPECT_FALSE(B.has_grad());
  // A fresh forward pass on the parameters as they are now works.
  Tape<float> t2;
  t2.backward(small_program(t2, other, B, false));
  EXPECT_TRUE(other.has_grad());
}

TEST(ApiBreakLifetime, VectorEraseOfRecordedBiasesMakesBackwardThrow) {
  std::vector<Parameter<float>> v;
  for (unsigned i = 0; i < 3; ++i) v.emplace_back(rnd<float>(1, 16, 20 + i));
  Parameter<float> W(rnd<float>(16, 16, 1, 0.3));
  Tape<float> t;
  auto w = t.variable(W);
  auto x = t.constant(rnd<float>(8, 16, 3));
  auto h = remat::tanh(remat::linear(x, w, t.variable(v[0])));
  h = remat::tanh(remat::linear(h * 2.0f, w, t.variable(v[1])));
  h = remat::tanh(remat::linear(h * 3.0f, w, t.variable(v[2])));
  auto l = remat::cross_entropy(h, {0, 1, 2, 3, 4, 5, 6, 7});
  v.erase(v.begin());  // v[0] = move(v[1]), v[1] = move(v[2])
  EXPECT_THROW(t.backward(l), remat::stale_value_error);
  EXPECT_FALSE(W.has_grad());
  for (const auto& b : v) EXPECT_FALSE(b.has_grad());
}

// Reallocation moves by construction: the storages move with the objects, nothing is assigned.
TEST(ApiBreakLifetime, VectorGrowthOfRecordedBiasesKeepsGradients) {
  std::vector<Parameter<float>> v, ref;
  for (unsigned i = 0; i < 2; ++i) v.emplace_back(rnd<float>(1, 16, 20 + i));
  ref = v;
  Parameter<float> W(rnd<float>(16, 16, 1, 0.3)), W0 = W;
  auto build = [](Tape<float>& t, Parameter<float>& W, Parameter<float>& b0, Parameter<float>& b1) {
    auto w = t.variable(W);
    auto h = remat::tanh(remat::linear(t.constant(rnd<float>(8, 16, 3)), w, t.variable(b0)));
    h = remat::tanh(remat::linear(h, w, t.variable(b1)));
    return remat::cross_entropy(h, {0, 1, 2, 3, 4, 5, 6, 7});
  };
  Tape<float> t0;
  t0.backward(build(t0, W0, ref[0], ref[1]));
  Tape<float> t;
  auto l = build(t, W, v[0], v[1]);
  const auto* before = v.data();
  for (int i = 0; i < 64; ++i) v.emplace_back(rnd<float>(1, 16, 99));
  ASSERT_NE(v.data(), before);
  t.backward(l);
  EXPECT_TRUE(same_bits(Matrix<float>(ref[0].grad()), Matrix<float>(v[0].grad())));
  EXPECT_TRUE(same_bits(Matrix<float>(ref[1].grad()), Matrix<float>(v[1].grad())));
  EXPECT_TRUE(same_bits(Matrix<float>(W0.grad()), Matrix<float>(W.grad())));
}

// ---------------------------------------------------------------------------------------------------------------
// 4. Errors are typed, name the op and shapes, and leave the tape usable with unchanged memory().
inline bool same_mem(const remat::MemoryStats& a, const remat::MemoryStats& b) {
  return a.live_bytes == b.live_bytes && a.peak_bytes == b.peak_bytes && a.saved_bytes == b.saved_bytes &&
         a.replayed_bytes == b.replayed_bytes && a.replayed_ops == b.replayed_ops && a.cached_bytes == b.cached_bytes;
}

template <class E, class F>
void expect_error(Tape<float>& tape, F f, std::vector<std::string> must_contain) {
  const auto before = tape.memory();
  const std::size_t n = tape.size();
  bool caught = false;
  try {
    f();
  } catch (const E& e) {
    caught = true;
    const std::string w = e.what();
    for (const auto& s : must_contain) EXPECT_NE(w.find(s), std::string::npos) << "'" << s << "' not in: " << w;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
  }
  EXPECT_TRUE(caught);
  EXPECT_TRUE(same_mem(before, tape.memory())) << must_contain[0];
  EXPECT_EQ(n, tape.size()) << must_contain[0];
}

TEST(ApiBreakErrors, TypedErrorsThenTapeStillWorks) {
  Parameter<float> W(rnd<float>(16, 16, 1, 0.3)), B(rnd<float>(1, 16, 2));
  Parameter<float> W0(rnd<float>(16, 16, 1, 0.3)), B0(rnd<float>(1, 16, 2));
  Tape<float> t0;
  auto l0 = small_program(t0, W0, B0, false);
  t0.backward(l0);

  Tape<float> t;
  auto a = t.variable(rnd<float>(3, 4, 1)), b = t.variable(rnd<float>(5, 2, 2)), w = t.variable(rnd<float>(15, 16, 3));
  auto bias_bad = t.variable(rnd<float>(1, 15, 4)), x = t.constant(rnd<float>(8, 16, 5));
  auto wv = t.variable(W), bv = t.variable(B);
  auto c = t.variable(rnd<float>(2, 4, 6));
  expect_error<remat::shape_error>(t, [&] { remat::matmul(a, b); }, {"matmul", "[3,4]", "[5,2]"});
  expect_error<remat::shape_error>(t, [&] { remat::linear(x, w, bv); }, {"linear", "[8,16]", "[15,16]"});
  expect_error<remat::shape_error>(t, [&] { remat::linear(x, wv, bias_bad); }, {"linear", "[1,15]"});
  expect_error<remat::shape_error>(t, [&] { (void)(a + c); }, {"add", "[3,4]", "[2,4]"});
  expect_error<remat::shape_error>(t, [&] { (void)(a - c); }, {"subtract", "[3,4]", "[2,4]"});
  expect_error<remat::shape_error>(t, [&] { (void)(a * c); }, {"multiply", "[3,4]", "[2,4]"});
  expect_error<remat::shape_error>(t, [&] { remat::cross_entropy(a, {0, 1}); }, {"cross_entropy", "[3,4]", "2"});
  expect_error<remat::index_error>(t, [&] { remat::cross_entropy(a, {0, 1, 4}); }, {"cross_entropy", "4"});
  expect_error<remat::index_error>(t, [&] { remat::cross_entropy(a, {0, -1, 1}); }, {"cross_entropy", "-1"});
  expect_error<remat::shape_error>(t, [&] { remat::mse_loss(a, c); }, {"mse_loss", "[3,4]", "[2,4]"});
  expect_error<remat::shape_error>(t, [&] { t.backward(a); }, {"backward", "[3,4]"});
  expect_error<remat::shape_error>(t, [&] { t.gradient(a, {a}); }, {"gradient", "[3,4]"});
  // Inside a checkpointed function: the error propagates typed.
  auto bad_region = remat::checkpoint([&](Var<float> h) { return remat::matmul(h, b); });
  EXPECT_THROW(bad_region(a), remat::shape_error);

  // The tape still works: a real program on it gives the oracle gradient.
  auto wv2 = t.variable(W), bv2 = t.variable(B);
  auto body = [wv2, bv2](Var<float> h) { return remat::tanh(remat::linear(h, wv2, bv2)); };
  auto loss = remat::cross_entropy(remat::checkpoint(body)(t.constant(rnd<float>(8, 16, 3))), {0, 1, 2, 3, 4, 5, 6, 7});
  t.backward(loss);
  EXPECT_TRUE(same_bits(Matrix<float>(W0.grad()), Matrix<float>(W.grad())));
  EXPECT_TRUE(same_bits(Matrix<float>(B0.grad()), Matrix<float>(B.grad())));
  // Second freeing backward: freed_value_error, gradients and memory untouched.
  const Matrix<float> g1 = W.grad();
  expect_error<remat::freed_value_error>(t, [&] { t.backward(loss); }, {"backward"});
  EXPECT_TRUE(same_bits(g1, Matrix<float>(W.grad())));
  expect_error<remat::freed_value_error>(t, [&] { t.gradient(loss, {wv2}); }, {"gradient"});
}

TEST(ApiBreakErrors, StaleParameterTypedAndNothingChanged) {
  for (bool ck : {false, true}) {
    Parameter<float> W(rnd<float>(16, 16, 1, 0.3)), B(rnd<float>(1, 16, 2));
    Tape<float> t;
    auto l = small_program(t, W, B, ck, /*x_grad=*/true);
    W.mutable_value()(0, 0) += 1.0f;
    expect_error<remat::stale_value_error>(t, [&] { t.backward(l); }, {"[16,16]"});
    EXPECT_FALSE(W.has_grad());
    EXPECT_FALSE(B.has_grad());
  }
}

// ---------------------------------------------------------------------------------------------------------------
// 5. memory() against hand-computed JAX residuals. Every [8,16] float value = 512 B; Parameters count 0.
struct MemCase {
  const char* name;
  int layers;
  int act;  // 0 tanh, 1 relu, 2 gelu
  bool x_variable;
  Policy policy;
  std::size_t saved, ops, replayed;
};

inline Var<float> act(int a, const Var<float>& v) {
  return a == 0 ? remat::tanh(v) : a == 1 ? remat::relu(v) : remat::gelu(v);
}

TEST(ApiBreakMemory, HandComputedResiduals) {
  namespace p = remat::policies;
  const std::vector<MemCase> cases = {
      // The returned activation is read only by its own backward, so a policy that drops it drops it (JAX's
      // rule: a checkpointed function's outputs are its values like any other).
      // Doc example: x, l1, l2 (sources of tanh1's and tanh2's replays). Replay tanh1, tanh2.
      {"2 tanh dots", 2, 0, false, p::dots_saveable, 1536, 2, 1024},
      {"2 tanh nothing", 2, 0, false, p::nothing_saveable, 512, 4, 2048},
      {"2 tanh everything", 2, 0, false, p::everything_saveable, 1536, 0, 0},
      // relu reads its output like tanh: same numbers.
      {"2 relu dots", 2, 1, false, p::dots_saveable, 1536, 2, 1024},
      // x requiring grad: linear1 additionally reads W1 (a Parameter, 0 B); gradients are not "saved".
      {"2 tanh dots xgrad", 2, 0, true, p::dots_saveable, 1536, 2, 1024},
      // 3 layers: x, l1, l2, l3 (sources) = 2048; replay tanh1, tanh2, tanh3 = 1536 B.
      {"3 tanh dots", 3, 0, false, p::dots_saveable, 2048, 3, 1536},
      // 3 layers nothing: x = 512; replay l1 t1 l2 t2 l3 t3 = 6 ops, 3072 B.
      {"3 tanh nothing", 3, 0, false, p::nothing_saveable, 512, 6, 3072},
      // 3 layers everything: x, t1, t2, t3 = 2048.
      {"3 relu everything", 3, 1, false, p::everything_saveable, 2048, 0, 0},
      // gelu reads its input: dots keeps x, l1, l2 (read by gelu1, gelu2's backwards; l1 also a source);
      // t2 (output) is read by nothing (sum reads nothing). Replay gelu1 -> t1 (read by linear2): 1 op.
      {"2 gelu dots", 2, 2, false, p::dots_saveable, 1536, 1, 512},
      // gelu nothing: x only; replay l1, t1, l2 = 3 ops, 1536 B.
      {"2 gelu nothing", 2, 2, false, p::nothing_saveable, 512, 3, 1536},
  };
  for (const MemCase& mc : cases) {
    Parameter<float> W[3] = {Parameter<float>(rnd<float>(16, 16, 1, 0.3)), Parameter<float>(rnd<float>(16, 16, 2, 0.3)),
                             Parameter<float>(rnd<float>(16, 16, 3, 0.3))};
    Parameter<float> Bs[3] = {Parameter<float>(rnd<float>(1, 16, 4)), Parameter<float>(rnd<float>(1, 16, 5)),
                              Parameter<float>(rnd<float>(1, 16, 6))};
    Tape<float> tape;
    std::vector<Var<float>> w, b;
    for (int i = 0; i < mc.layers; ++i) {
      w.push_back(tape.variable(W[i]));
      b.push_back(tape.variable(Bs[i]));
    }
    const Matrix<float> X = rnd<float>(8, 16, 7);
    Var<float> x = mc.x_variable ? tape.variable(X) : tape.constant(X);
    auto f = [&](Var<float> h) {
      for (int i = 0; i < mc.layers; ++i) h = act(mc.act, remat::linear(h, w[i], b[i]));
      return h;
    };
    Var<float> loss = remat::sum(remat::checkpoint(f, mc.policy)(x));
    EXPECT_EQ(tape.memory().saved_bytes, mc.saved) << mc.name;
    tape.backward(loss);
    EXPECT_EQ(tape.memory().replayed_ops, mc.ops) << mc.name;
    EXPECT_EQ(tape.memory().replayed_bytes, mc.replayed) << mc.name;
  }
}

}  // namespace api_break_test
