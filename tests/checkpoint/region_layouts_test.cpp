// A small MLP recorded with six region layouts (nested twice, an unused output, identity regions, regions of
// constants only, a tuple partly unused, deep nesting) under every policy, x constant and variable: loss and
// gradients bitwise equal to the plain tape's, also for a retained second backward; the plain tape against
// finite differences in double. Gradient accumulation through the same programs: two tapes adding into one
// Parameter, zero_grad, a cleared tape reused, micro-batches against one big batch, a gradient of a subset.
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

// Named after the file: this directory's test files are compiled as one translation unit (tests/CMakeLists.txt).
namespace region_layouts_test {

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
// Bitwise equality, every policy, every region layout, x constant and x variable.
TEST(RegionLayouts, EveryPolicyEveryShapeBitwise) {
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
TEST(RegionLayouts, RetainTwiceDoublesUnderEveryPolicy) {
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
TEST(RegionLayouts, PlainTapeMatchesFiniteDifferencesDouble) {
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
// Gradient accumulation.
TEST(GradientAccumulation, TwoTapesAddZeroGradClears) {
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
TEST(GradientAccumulation, ClearedTapeReuseKeepsGradientsIndependent) {
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
TEST(GradientAccumulation, MicroBatchesEqualBigBatch) {
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
TEST(GradientAccumulation, GradientSubsetLeavesOthersUnchanged) {
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

}  // namespace region_layouts_test
