// Edge cases of checkpoint(): exceptions thrown inside a checkpointed function or by a policy,
// odd return values (no new value, a captured outer Var, an input, duplicates), escaped values, nesting to
// and past the documented depth, empty regions, the loss as a region output, ops with an op-specific
// residual (layer_norm, cross_entropy) followed by ops that read nothing, and a value used by many
// consumers across region boundaries. Gradients are compared bitwise with the un-checkpointed program.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "remat/remat.hpp"

// Named after the file: this directory's test files are compiled as one translation unit (tests/CMakeLists.txt).
namespace region_edge_cases_test {

using remat::Matrix;
using remat::Tape;
using remat::Var;

template <class T>
bool same_bits(const Matrix<T>& a, const Matrix<T>& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() &&
         std::memcmp(a.data(), b.data(), sizeof(T) * static_cast<std::size_t>(a.size())) == 0;
}

template <class T>
Matrix<T> rnd(remat::Index r, remat::Index c, unsigned seed) {
  std::srand(seed);
  return Matrix<T>::Random(r, c);
}

using Policy = std::function<bool(const remat::OpInfo&)>;
std::vector<Policy> all_policies() {
  return {remat::policies::nothing_saveable, remat::policies::everything_saveable, remat::policies::dots_saveable,
          remat::policies::save_only_these_names({"keep"}), remat::policies::save_any_names_but_these({"keep"})};
}

// Runs body(x, g, b) once plain and once through checkpoint(body, policy) for every policy; the loss is
// sum(result); the gradients of x, g, b must be bitwise equal.
template <class T, class Body>
void expect_bitwise(Body body, remat::Index rows = 3, remat::Index cols = 4) {
  const Matrix<T> X = rnd<T>(rows, cols, 1), G = rnd<T>(1, cols, 2), B = rnd<T>(1, cols, 3);
  auto run = [&](const Policy* policy, std::vector<Matrix<T>>& grads) {
    Tape<T> tape(11);
    auto x = tape.variable(X), g = tape.variable(G), b = tape.variable(B);
    auto f = [&](Var<T> v) { return body(v, g, b); };
    Var<T> y = policy ? remat::checkpoint(f, *policy)(x) : f(x);
    auto loss = remat::sum(y);
    tape.backward(loss);
    grads = {Matrix<T>(x.grad()), Matrix<T>(g.grad()), Matrix<T>(b.grad())};
  };
  std::vector<Matrix<T>> plain, ck;
  run(nullptr, plain);
  int p = 0;
  for (const Policy& policy : all_policies()) {
    ASSERT_NO_THROW(run(&policy, ck)) << "policy " << p;
    for (int k = 0; k < 3; ++k) EXPECT_TRUE(same_bits(plain[k], ck[k])) << "policy " << p << " input " << k;
    ++p;
  }
}

// Regression: an op's own residual (layer_norm's statistics, cross_entropy's softmax) was freed when the
// region closed and never regenerated when no later op held the op's output (e.g. a residual add),
// so backward threw freed_value_error.
TEST(RegionOpResiduals, LayerNormFollowedByOpsThatReadNothing) {
  expect_bitwise<float>([](Var<float> x, Var<float> g, Var<float> b) { return remat::layer_norm(x, g, b) + 1.0; });
  expect_bitwise<double>([](Var<double> x, Var<double> g, Var<double> b) {
    return remat::layer_norm(remat::tanh(x), g, b) + x;  // transformer-style residual connection
  });
  expect_bitwise<double>([](Var<double> x, Var<double> g, Var<double> b) {
    return remat::sin(remat::layer_norm(remat::tanh(x), g, b) + b);  // replayed as an input of a replayed op
  });
  expect_bitwise<float>([](Var<float> x, Var<float> g, Var<float> b) {
    return remat::checkpoint_name(remat::layer_norm(x, g, b), "keep") - g;
  });
}

TEST(RegionOpResiduals, CrossEntropyInsideARegion) {
  expect_bitwise<float>([](Var<float> x, Var<float> g, Var<float>) {
    return remat::cross_entropy(x * g, {0, 3, 1}) * 2.0;
  });
  expect_bitwise<double>([](Var<double> x, Var<double> g, Var<double>) {
    return remat::square(remat::cross_entropy(x * g, {0, 3, 1}) + 1.0);
  });
}

TEST(RegionOpResiduals, NestedRegionsWithLayerNorm) {
  expect_bitwise<double>([](Var<double> x, Var<double> g, Var<double> b) {
    auto inner = remat::checkpoint([&](Var<double> v) { return remat::layer_norm(remat::gelu(v), g, b) + v; });
    return remat::checkpoint([&](Var<double> v) { return inner(inner(v) * 0.5) - 1.0; })(x);
  });
}

TEST(RegionExceptions, ThrownInsideCheckpointedFunctionLeavesTapeUsable) {
  for (const Policy& policy : all_policies()) {
    Tape<float> tape;
    auto x = tape.variable(rnd<float>(3, 3, 4));
    auto w = tape.variable(rnd<float>(3, 3, 5));
    Var<float> leaked;
    auto bad = remat::checkpoint(
        [&](Var<float> v) -> Var<float> {
          leaked = remat::tanh(remat::matmul(v, w));
          throw std::runtime_error("user error");
        },
        policy);
    EXPECT_THROW(bad(x), std::runtime_error);
    // The region is closed: backward is allowed (it throws tape_error inside an open region).
    EXPECT_THROW(remat::sin(leaked), remat::tape_error) << "a value of the failed region must not escape";
    auto good = remat::checkpoint([&](Var<float> v) { return remat::sin(remat::matmul(v, w)); }, policy);
    auto loss = remat::sum(good(x));
    ASSERT_NO_THROW(tape.backward(loss));
    Tape<float> ref;
    auto rx = ref.variable(Matrix<float>(x.value())), rw = ref.variable(Matrix<float>(w.value()));
    ref.backward(remat::sum(remat::sin(remat::matmul(rx, rw))));
    EXPECT_TRUE(same_bits(Matrix<float>(w.grad()), Matrix<float>(rw.grad())));
    EXPECT_TRUE(same_bits(Matrix<float>(x.grad()), Matrix<float>(rx.grad())));
    leaked = Var<float>();
    tape.clear();
    EXPECT_EQ(tape.memory().live_bytes, 0u);
  }
}

TEST(RegionExceptions, ThrownByAPolicyInNestedRegions) {
  Tape<double> tape;
  auto x = tape.variable(rnd<double>(2, 2, 6));
  int calls = 0;
  auto throwing = [&](const remat::OpInfo& op) -> bool {
    ++calls;
    if (op.name == std::string("exp")) throw std::logic_error("policy refuses exp");
    return false;
  };
  auto inner = remat::checkpoint([](Var<double> v) { return remat::exp(remat::sin(v)); }, throwing);
  auto outer = remat::checkpoint([&](Var<double> v) { return inner(remat::cos(v)); });
  const std::size_t before = tape.size();
  EXPECT_THROW(outer(x), std::logic_error);
  EXPECT_GT(calls, 0);
  EXPECT_EQ(tape.size(), before + 2) << "cos and sin were recorded, the exp was undone";
  // Both regions were closed: backward and clear work.
  auto y = remat::checkpoint([](Var<double> v) { return remat::exp(remat::sin(v)); })(x);
  ASSERT_NO_THROW(tape.backward(remat::sum(y)));
  const Matrix<double> xv = x.value();
  EXPECT_TRUE(x.grad().isApprox(Matrix<double>((xv.array().sin().exp() * xv.array().cos()))));
  EXPECT_NO_THROW(tape.clear());
}

TEST(RegionReturnValues, NoNewValueCapturedInputDuplicatesAndEmptyRegions) {
  Tape<double> tape;
  auto x = tape.variable(rnd<double>(2, 3, 7));
  auto w = tape.variable(rnd<double>(2, 3, 8));
  auto identity = remat::checkpoint([](Var<double> v) { return v; });
  auto captured = remat::checkpoint([&](Var<double>) { return w; });
  auto dup = remat::checkpoint([&](Var<double> v) {
    auto h = remat::sin(v * w);
    return std::make_tuple(h, h, v, w);
  });
  auto a = identity(x);
  auto b = captured(x);
  auto [h1, h2, v, ww] = dup(a);
  auto loss = remat::sum(h1 + h2 * b + v + ww);
  tape.backward(loss);
  Tape<double> ref;
  auto rx = ref.variable(Matrix<double>(x.value())), rw = ref.variable(Matrix<double>(w.value()));
  auto rh = remat::sin(rx * rw);
  ref.backward(remat::sum(rh + rh * rw + rx + rw));
  EXPECT_TRUE(same_bits(Matrix<double>(x.grad()), Matrix<double>(rx.grad())));
  EXPECT_TRUE(same_bits(Matrix<double>(w.grad()), Matrix<double>(rw.grad())));
}

TEST(RegionReturnValues, ValueUsedOutsideWithoutBeingReturnedThrows) {
  Tape<float> tape;
  auto x = tape.variable(rnd<float>(2, 2, 9));
  Var<float> inside;
  auto y = remat::checkpoint([&](Var<float> v) {
    inside = remat::exp(v);
    return remat::sin(inside);
  })(x);
  try {
    remat::add(y, inside);
    FAIL();
  } catch (const remat::tape_error& e) {
    EXPECT_NE(std::string(e.what()).find("add"), std::string::npos) << e.what();
  }
  EXPECT_THROW(remat::checkpoint([&](Var<float> v) { return v * inside; })(y), remat::tape_error);
  ASSERT_NO_THROW(tape.backward(remat::sum(y)));
  EXPECT_TRUE(x.grad().allFinite());
}

TEST(RegionReturnValues, RegionWhoseOutputIsTheLoss) {
  for (const Policy& policy : all_policies()) {
    Tape<double> tape;
    auto x = tape.variable(rnd<double>(4, 3, 10));
    auto w = tape.variable(rnd<double>(3, 5, 11));
    auto loss = remat::checkpoint(
        [&](Var<double> v) {
          return remat::cross_entropy(remat::tanh(remat::matmul(v, w)), {0, 1, 4, 2});
        },
        policy)(x);
    tape.backward(loss);
    Tape<double> ref;
    auto rx = ref.variable(Matrix<double>(x.value())), rw = ref.variable(Matrix<double>(w.value()));
    ref.backward(remat::cross_entropy(remat::tanh(remat::matmul(rx, rw)), {0, 1, 4, 2}));
    EXPECT_TRUE(same_bits(Matrix<double>(w.grad()), Matrix<double>(rw.grad())));
    EXPECT_TRUE(same_bits(Matrix<double>(x.grad()), Matrix<double>(rx.grad())));
  }
}

TEST(RegionReturnValues, TwoVarArgumentsThatAreTheSameVar) {
  Tape<float> tape;
  auto x = tape.variable(rnd<float>(3, 3, 12));
  auto y = remat::checkpoint([](Var<float> a, Var<float> b) { return remat::tanh(a * b) + a; })(x, x);
  tape.backward(remat::sum(y));
  Tape<float> ref;
  auto rx = ref.variable(Matrix<float>(x.value()));
  ref.backward(remat::sum(remat::tanh(rx * rx) + rx));
  EXPECT_TRUE(same_bits(Matrix<float>(x.grad()), Matrix<float>(rx.grad())));
}

// Nest `levels` regions around tanh; returns the gradient.
Matrix<double> nested(int levels, const Matrix<double>& X, Tape<double>& tape) {
  auto x = tape.variable(X);
  std::function<Var<double>(Var<double>, int)> rec = [&](Var<double> v, int depth) -> Var<double> {
    if (depth == 0) return remat::sin(remat::tanh(v));
    return remat::checkpoint([&, depth](Var<double> u) { return remat::sin(rec(u * 1.5, depth - 1)); })(v);
  };
  auto loss = remat::sum(rec(x, levels));
  tape.backward(loss);
  return x.grad();
}

TEST(RegionNesting, UpToTheLimitBitwiseAndPastItThrowsCleanly) {
  const Matrix<double> X = rnd<double>(2, 2, 13);
  Matrix<double> plain;
  {
    Tape<double> tape;
    auto x = tape.variable(X);
    Var<double> v = x;
    for (int i = 0; i < 62; ++i) v = v * 1.5;
    v = remat::sin(remat::tanh(v));
    for (int i = 0; i < 62; ++i) v = remat::sin(v);
    tape.backward(remat::sum(v));
    plain = x.grad();
  }
  Tape<double> tape;
  Matrix<double> g = nested(62, X, tape);
  EXPECT_TRUE(same_bits(plain, g));
  EXPECT_GT(tape.memory().replayed_ops, 0u);
  tape.clear();
  EXPECT_THROW(nested(63, X, tape), remat::tape_error);
  // every region was closed on the way out: the tape is usable
  EXPECT_NO_THROW(tape.clear());
  EXPECT_TRUE(same_bits(plain, nested(62, X, tape)));
}

TEST(RegionEdgeCases, ZeroOpRegionsAndLeafOnlyRegions) {
  Tape<float> tape;
  auto x = tape.variable(rnd<float>(2, 2, 14));
  auto e1 = remat::checkpoint([](Var<float> v) { return v; })(x);
  auto e2 = remat::checkpoint([&](Var<float>) { return tape.constant(Matrix<float>::Ones(2, 2)); })(x);
  auto loss = remat::sum(e1 * e2);
  ASSERT_NO_THROW(tape.backward(loss));
  EXPECT_TRUE(x.grad().isApprox(Matrix<float>::Ones(2, 2)));
}

TEST(RegionEdgeCases, ValueUsedByManyConsumersAcrossRegionBoundaries) {
  const Matrix<double> X = rnd<double>(3, 3, 15), W = rnd<double>(3, 3, 16);
  auto program = [&](bool ck, const Policy& policy, Matrix<double>& gx, Matrix<double>& gw) {
    Tape<double> tape;
    auto x = tape.variable(X), w = tape.variable(W);
    auto shared = remat::tanh(remat::matmul(x, w));  // outside any region, read by many
    auto maybe = [&](auto f) {
      return [f, ck, &policy](Var<double> v) { return ck ? remat::checkpoint(f, policy)(v) : f(v); };
    };
    auto r1 = maybe([&](Var<double> v) { return remat::sin(v * shared) + shared; });
    auto r2 = maybe([&](Var<double> v) {
      auto inner = maybe([&](Var<double> u) { return remat::exp(u - shared) * shared; });
      return inner(v) + inner(shared);
    });
    auto a = r1(shared);
    auto b = r2(a);
    auto c = r1(b);
    auto loss = remat::sum(a * b + c + shared);
    tape.backward(loss);
    gx = x.grad();
    gw = w.grad();
  };
  Matrix<double> px, pw, cx, cw;
  program(false, all_policies()[0], px, pw);
  for (const Policy& policy : all_policies()) {
    program(true, policy, cx, cw);
    EXPECT_TRUE(same_bits(px, cx));
    EXPECT_TRUE(same_bits(pw, cw));
  }
}

TEST(RegionEdgeCases, RetainGraphReplaysAgainWithTheSameBitsAndDropoutMask) {
  Tape<float> tape(99);
  auto x = tape.variable(rnd<float>(6, 6, 17));
  auto y = remat::checkpoint([](Var<float> v) { return remat::sin(remat::dropout(remat::tanh(v), 0.5)); })(x);
  auto loss = remat::sum(y);
  tape.backward(loss, true);
  const Matrix<float> g1 = x.grad();
  const auto ops1 = tape.memory().replayed_ops;
  x.zero_grad();  // the second backward would add to the first's gradient
  tape.backward(loss, true);
  EXPECT_TRUE(same_bits(g1, Matrix<float>(x.grad())));
  EXPECT_EQ(tape.memory().replayed_ops, ops1);
  auto g = tape.gradient(loss, {x});
  EXPECT_TRUE(same_bits(g1, g[0]));
  EXPECT_EQ(tape.memory().saved_bytes, 0u);
}

TEST(RegionEdgeCases, CheckpointSequentialRejectsBadSegmentCounts) {
  Tape<float> tape;
  auto x = tape.variable(rnd<float>(2, 2, 18));
  std::vector<std::function<Var<float>(Var<float>)>> layers(3, [](Var<float> v) { return remat::tanh(v); });
  EXPECT_THROW(remat::checkpoint_sequential(layers, 0, x), remat::domain_error);
  EXPECT_THROW(remat::checkpoint_sequential(layers, 4, x), remat::domain_error);
  std::vector<std::function<Var<float>(Var<float>)>> none;
  EXPECT_THROW(remat::checkpoint_sequential(none, 1, x), remat::domain_error);
  auto y = remat::checkpoint_sequential(layers, 3, x);
  ASSERT_NO_THROW(tape.backward(remat::sum(y)));
}

// Regression (assert / UB): destroying the Tape inside a checkpointed function leaves close_region() to pop an
// empty stack (assertion failure in debug builds, UB otherwise) when the function returns.
TEST(RegionEdgeCases, TapeDestroyedInsideCheckpointedFunction) {
  auto tape = std::make_unique<Tape<float>>();
  auto x = tape->variable(Matrix<float>::Ones(2, 2));
  EXPECT_THROW(remat::checkpoint([&](Var<float> v) {
                 tape.reset();
                 return v;
               })(x),
               remat::tape_error);
}

}  // namespace region_edge_cases_test
