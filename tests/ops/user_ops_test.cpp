// User-defined ops (remat/op.hpp) through the rest of the library: invalid output and extra shapes, a
// forward that throws at record time, a three-input op with a constant under every policy, random programs of
// user ops estimated by remat::estimate_memory (remat/estimate.hpp) and checkpointed, ops an estimate must refuse,
// a NaN FLOP count under a memory budget, a shapes-only tape under a budget. Oracles are closed forms computed by
// hand in double, the same program without checkpointing (bitwise), and the tape that computes (exact bytes).
// The op-name check (detail::valid_op_name) is tested at compile time at the end: an op named nullptr or "" was
// accepted and crashed or gave messages naming no op.
#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "fma_op.hpp"
#include "random.hpp"
#include "remat/estimate.hpp"
#include "remat/remat.hpp"

// Named after the file: this directory's test files are compiled as one translation unit (tests/CMakeLists.txt).
namespace user_ops_test {

using remat_test::fma;
using remat_test::FmaOp;

using remat::Index;
using remat::Matrix;
using remat::Parameter;
using remat::Shape;
using remat::Tape;
using remat::Var;
using Policy = std::function<bool(const remat::OpInfo&)>;

// ------------------------------------------------------------------------------------------------ user ops

/// An op whose output shape is its Params: for invalid shapes.
struct ShapeProbeOp : remat::OpBase {
  static constexpr const char* name = "shape_probe";
  static constexpr remat::OpKind kind = remat::OpKind::elementwise;
  struct Params {
    Index rows, cols, extra_rows, extra_cols;
  };
  static unsigned reads(remat::GradInputs) { return remat::reads_nothing; }
  static Shape output_shape(const Shape*, const Params& p) { return Shape{p.rows, p.cols}; }
  static Shape extra_shape(const Shape*, const Params& p) { return Shape{p.extra_rows, p.extra_cols}; }
  template <class T>
  static void forward(const remat::ForwardContext<T>& c) {
    c.out().setZero();
  }
  template <class T>
  static void backward(const remat::BackwardContext<T>& c) {
    if (c.wants_grad(0)) c.add_grad(0, Matrix<T>::Zero(c.in_shape(0).rows(), c.in_shape(0).cols()));
  }
  static double flops(const Shape*, int, const Shape&) { return 0; }
};

/// y = 2x; its forward throws while `throw_forward` is set.
inline bool throw_forward = false;
struct DoubleOrThrowOp : remat::OpBase {
  static constexpr const char* name = "double_or_throw";
  static constexpr remat::OpKind kind = remat::OpKind::elementwise;
  static unsigned reads(remat::GradInputs) { return remat::reads_nothing; }
  static Shape output_shape(const Shape* in, const Params&) { return in[0]; }
  template <class T>
  static void forward(const remat::ForwardContext<T>& c) {
    if (throw_forward) throw std::runtime_error("double_or_throw: forward failed on purpose");
    c.out() = T(2) * c.in(0);
  }
  template <class T>
  static void backward(const remat::BackwardContext<T>& c) {
    c.add_grad(0, T(2) * c.grad_out().array());
  }
  static double flops(const Shape*, int, const Shape& out) { return static_cast<double>(out.size()); }
};

/// y = exp(x) · s with exp(x) kept as its extra, and a [1, cols] temporary (the column maxima, unused
/// arithmetic-wise except as a scratch write) in forward and backward.
struct ScaledExpOp : remat::OpBase {
  static constexpr const char* name = "scaled_exp";
  static constexpr remat::OpKind kind = remat::OpKind::elementwise;
  struct Params {
    double s;
  };
  static unsigned reads(remat::GradInputs g) { return remat::wants(g, 0) ? remat::reads_extra : 0u; }
  static Shape output_shape(const Shape* in, const Params&) { return in[0]; }
  static Shape extra_shape(const Shape* in, const Params&) { return in[0]; }
  static Shape scratch_shape(const Shape* in, const Params&) { return Shape{1, in[0].cols()}; }
  template <class T>
  static void forward(const remat::ForwardContext<T>& c) {
    const auto p = remat::params_of<Params>(c);
    c.extra() = c.in(0).array().exp().matrix();
    c.scratch() = c.extra().colwise().maxCoeff();
    c.out() = static_cast<T>(p.s) * c.extra();
  }
  template <class T>
  static void backward(const remat::BackwardContext<T>& c) {
    const auto p = remat::params_of<Params>(c);
    c.scratch().setZero();
    c.add_grad(0, static_cast<T>(p.s) * c.grad_out().array() * c.extra().array());
  }
  static double flops(const Shape*, int, const Shape& out) { return 3.0 * static_cast<double>(out.size()); }
};

/// An op whose program depends on its forward at record time.
struct NotEstimableOp : DoubleOrThrowOp {
  static constexpr const char* name = "not_estimable";
  static constexpr bool estimable = false;
};

/// An op whose FLOP estimate is NaN (the DTR cost under a memory budget).
struct NanFlopsOp : DoubleOrThrowOp {
  static constexpr const char* name = "nan_flops";
  static double flops(const Shape*, int, const Shape&) { return std::numeric_limits<double>::quiet_NaN(); }
};

template <class T>
Var<T> scaled_exp(const Var<T>& x, double s) {
  return remat::apply_op<ScaledExpOp>(ScaledExpOp::Params{s}, x);
}
template <class T>
Var<T> double_or_throw(const Var<T>& x) {
  return remat::apply_op<DoubleOrThrowOp>(x);
}

// ------------------------------------------------------------------------------------------------ helpers

bool same_figures(const remat::MemoryStats& a, const remat::MemoryStats& b) {
  return a.live_bytes == b.live_bytes && a.peak_bytes == b.peak_bytes && a.saved_bytes == b.saved_bytes &&
         a.replayed_bytes == b.replayed_bytes && a.replayed_ops == b.replayed_ops;
}

template <class A, class B>
bool same_bits(const A& a, const B& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() &&
         std::memcmp(a.data(), b.data(), static_cast<std::size_t>(a.size()) * sizeof(*a.data())) == 0;
}

std::vector<std::pair<std::string, Policy>> policies() {
  using namespace remat::policies;
  return {{"nothing_saveable", nothing_saveable},
          {"everything_saveable", everything_saveable},
          {"dots_saveable", dots_saveable},
          {"dots_with_no_batch_dims_saveable", dots_with_no_batch_dims_saveable},
          {"save_only f", save_only_these_names({"f"})},
          {"save_anything_except f", save_anything_except_these_names({"f"})}};
}

TEST(UserOps, InvalidOutputAndExtraShapesThrowShapeErrorNamingTheOpAndTheShapeTapeUnchanged) {
  struct Case {
    ShapeProbeOp::Params p;
    std::string shape;
  };
  const Index big = Index{1} << 40;
  const std::vector<Case> cases = {
      {{-1, 3, 0, 0}, "[-1,3]"},
      {{3, -1, 0, 0}, "[3,-1]"},
      {{0, 0, 0, 0}, "[0,0]"},
      {{0, 5, 0, 0}, "[0,5]"},
      {{big, big, 0, 0}, "[" + std::to_string(big) + "," + std::to_string(big) + "]"},
      {{1, (Index{1} << 46) + 1, 0, 0}, "[1," + std::to_string((Index{1} << 46) + 1) + "]"},  // > 2^48 bytes of float
      {{std::numeric_limits<Index>::max(), std::numeric_limits<Index>::max(), 0, 0}, "[9223372036854775807,"},
      {{2, 2, -3, 1}, "[-3,1]"},
      {{2, 2, 0, 4}, "[0,4]"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.shape);
    Tape<float> tape;
    Var<float> x = tape.variable(Matrix<float>::Ones(2, 2));
    const remat::MemoryStats before = tape.memory();
    remat_test::expect_error_naming<remat::shape_error>([&] { remat::apply_op<ShapeProbeOp>(c.p, x); },
                                                        {"shape_probe", c.shape});
    EXPECT_EQ(tape.size(), 1u);
    EXPECT_TRUE(same_figures(tape.memory(), before));
    // And as the first op inside a checkpoint region: the region is abandoned, the tape goes on.
    remat_test::expect_error_naming<remat::shape_error>(
        [&] { remat::checkpoint([&](Var<float> v) { return remat::apply_op<ShapeProbeOp>(c.p, v); })(x); },
        {"shape_probe"});
    EXPECT_TRUE(same_figures(tape.memory(), before));
    EXPECT_EQ(tape.size(), 1u);
    tape.backward(remat::sum(remat::tanh(x)));
    EXPECT_TRUE(x.grad().isApprox(Matrix<float>::Constant(2, 2, 1 - std::tanh(1.f) * std::tanh(1.f))));
  }
}

TEST(UserOps, ForwardThatThrowsAtRecordLeavesTapeAndFiguresAsTheyWere) {
  for (bool in_region : {false, true}) {
    for (std::size_t budget : {std::size_t{0}, std::size_t{1000}}) {
      SCOPED_TRACE(std::string(in_region ? "in a region" : "outside") + ", budget " + std::to_string(budget));
      Tape<double> tape;
      if (budget) tape.set_memory_budget(budget);
      Parameter<double> W(remat_test::random_matrix<double>(3, 4, 5));
      Var<double> w = tape.variable(W);
      Var<double> h = remat::tanh(w);
      const remat::MemoryStats before = tape.memory();
      const std::size_t size = tape.size();
      throw_forward = true;
      try {
        if (in_region)
          remat::checkpoint([](Var<double> v) { return double_or_throw(v); })(h);
        else
          double_or_throw(h);
        ADD_FAILURE() << "no exception";
      } catch (const std::runtime_error& e) {
        EXPECT_NE(std::string(e.what()).find("on purpose"), std::string::npos);
      }
      throw_forward = false;
      EXPECT_EQ(tape.size(), size);
      if (!budget) {
        EXPECT_TRUE(same_figures(tape.memory(), before));
      }
      // The tape goes on: loss = sum(2 tanh(W)) → dL/dW = 2 (1 − tanh²W).
      tape.backward(remat::sum(remat::checkpoint([](Var<double> v) { return double_or_throw(v); })(h)));
      const Matrix<double> want = 2.0 * (1.0 - W.value().array().tanh().square()).matrix();
      EXPECT_LE((Matrix<double>(W.grad()) - want).cwiseAbs().maxCoeff(), 1e-15);
      EXPECT_FALSE(W.grad().hasNaN());
    }
  }
}

/// f = sum(y²), y = tanh(x) ⊙ W + C (C constant): dL/dW = 2y ⊙ tanh(x), dL/dx = 2y ⊙ W ⊙ (1 − tanh²x), by hand
/// in double; then under every policy, bitwise equal to no checkpoint; and the estimate equals the tape.
TEST(UserOps, ThreeInputOpWithAConstantIsCorrectAndBitwiseEqualUnderEveryPolicy) {
  const Matrix<double> X = remat_test::random_matrix<double>(5, 4, 1, remat_test::Domain{-1, 1, 0});
  const Matrix<double> Wv = remat_test::random_matrix<double>(5, 4, 2, remat_test::Domain{-1, 1, 0});
  const Matrix<double> C = remat_test::random_matrix<double>(5, 4, 3, remat_test::Domain{-1, 1, 0});
  auto run = [&](const Policy* policy, Matrix<double>& gx, Matrix<double>& gw, remat::MemoryStats* after_forward,
                 remat::MemoryStats* after_backward) {
    Tape<double> tape;
    Parameter<double> W(Wv);
    Var<double> x = tape.variable(X);
    auto body = [&](Var<double> v) {
      Var<double> y = remat::checkpoint_name(fma(remat::tanh(v), tape.variable(W), tape.constant(C)), "f");
      return remat::sum(y * y);
    };
    Var<double> loss = policy ? remat::checkpoint(body, *policy)(x) : body(x);
    if (after_forward) *after_forward = tape.memory();
    tape.backward(loss);
    if (after_backward) *after_backward = tape.memory();
    gx = x.grad();
    gw = W.grad();
  };
  Matrix<double> gx0, gw0;
  run(nullptr, gx0, gw0, nullptr, nullptr);
  const Matrix<double> t = X.array().tanh().matrix();
  const Matrix<double> y = (t.array() * Wv.array() + C.array()).matrix();
  EXPECT_LE((gw0 - (2 * y.array() * t.array()).matrix()).cwiseAbs().maxCoeff(), 1e-14);
  EXPECT_LE((gx0 - (2 * y.array() * Wv.array() * (1 - t.array().square())).matrix()).cwiseAbs().maxCoeff(), 1e-14);
  for (const auto& [label, policy] : policies()) {
    SCOPED_TRACE(label);
    Matrix<double> gx, gw;
    remat::MemoryStats fwd, bwd;
    run(&policy, gx, gw, &fwd, &bwd);
    EXPECT_TRUE(same_bits(gx, gx0));
    EXPECT_TRUE(same_bits(gw, gw0));
    Parameter<double> W(Wv);
    const remat::MemoryEstimate e = remat::estimate_memory<double>([&](Tape<double>& tape) {
      Var<double> x = tape.variable(Matrix<double>::Zero(5, 4));
      Var<double> loss = remat::checkpoint(
          [&](Var<double> v) {
            Var<double> y = remat::checkpoint_name(fma(remat::tanh(v), tape.variable(W), tape.constant(C)), "f");
            return remat::sum(y * y);
          },
          policy)(x);
      return std::make_tuple(loss, x);  // the real step holds x (it reads x.grad()): so must the estimate
    });
    EXPECT_EQ(e.saved_bytes, fwd.saved_bytes);
    EXPECT_EQ(e.forward_peak_bytes, fwd.peak_bytes);
    EXPECT_EQ(e.peak_bytes, bwd.peak_bytes);
    EXPECT_EQ(e.replayed_bytes, bwd.replayed_bytes);
    EXPECT_EQ(e.replayed_ops, bwd.replayed_ops);
    EXPECT_FALSE(W.has_grad());
  }
}

/// Random small programs of built-in and user ops (with extras and temporaries) in nested checkpoint regions
/// under random policies: gradients bitwise equal to the same program without regions, and estimate_memory
/// equal to the computing tape's figures byte for byte.
TEST(UserOps, RandomProgramsWithUserOpsEstimateExactlyAndCheckpointBitwise) {
  const std::vector<std::pair<std::string, Policy>> ps = policies();
  for (std::uint32_t seed = 1; seed <= 40; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    const int length = 3 + static_cast<int>(rng() % 6);
    std::vector<int> ops, region_at, policy_at;
    for (int i = 0; i < length; ++i) {
      ops.push_back(static_cast<int>(rng() % 6));
      region_at.push_back(static_cast<int>(rng() % 3));  // 0: no region, 1: one, 2: nested two
      policy_at.push_back(static_cast<int>(rng() % ps.size()));
    }
    const Index rows = 1 + static_cast<Index>(rng() % 4), cols = 1 + static_cast<Index>(rng() % 5);
    const Matrix<float> X = remat_test::random_matrix<float>(rows, cols, seed, remat_test::Domain{-1, 1, 0});
    const Matrix<float> Wv = remat_test::random_matrix<float>(cols, cols, seed + 100, remat_test::Domain{-1, 1, 0});
    auto step = [&](const Var<float>& v, Tape<float>& tape, Parameter<float>& W, int op) -> Var<float> {
      switch (op) {
        case 0:
          return remat::tanh(v);
        case 1:
          return fma(v, remat::sin(v), tape.constant(Matrix<float>::Constant(rows, cols, 0.25f)));
        case 2:
          return scaled_exp(remat::tanh(v), 0.5);
        case 3:
          return remat::matmul(v, tape.variable(W));
        case 4:
          return remat::gelu(v) * v;
        default:
          return remat::checkpoint_name(remat::softmax(v), "f");
      }
    };
    auto program = [&](Tape<float>& tape, Parameter<float>& W, Var<float> x, bool regions) {
      Var<float> v = x;
      for (int i = 0; i < length; ++i) {
        const int op = ops[static_cast<std::size_t>(i)];
        auto one = [&, op](Var<float> u) { return step(u, tape, W, op); };
        const Policy& policy = ps[static_cast<std::size_t>(policy_at[static_cast<std::size_t>(i)])].second;
        const int depth = region_at[static_cast<std::size_t>(i)];
        if (depth == 0 || (depth == 1 && !regions))
          v = one(v);
        else if (depth == 1)
          v = remat::checkpoint(one, policy)(v);
        else if (!regions)
          v = remat::tanh(one(v));
        else
          v = remat::checkpoint([&](Var<float> u) { return remat::tanh(remat::checkpoint(one, policy)(u)); },
                                policy)(v);
      }
      return remat::sum(v * v);
    };
    Matrix<float> gx_plain, gw_plain;
    {
      Tape<float> tape;
      Parameter<float> W(Wv);
      Var<float> x = tape.variable(X);
      tape.backward(program(tape, W, x, false));
      gx_plain = x.grad();
      gw_plain = W.grad();
    }
    Tape<float> tape;
    Parameter<float> W(Wv);
    Var<float> x = tape.variable(X);
    Var<float> loss = program(tape, W, x, true);
    const remat::MemoryStats fwd = tape.memory();
    tape.backward(loss);
    const remat::MemoryStats bwd = tape.memory();
    EXPECT_TRUE(same_bits(Matrix<float>(x.grad()), gx_plain));
    EXPECT_TRUE(same_bits(Matrix<float>(W.grad()), gw_plain));
    Parameter<float> W2(Wv);
    const remat::MemoryEstimate e = remat::estimate_memory<float>([&](Tape<float>& t) {
      Var<float> x0 = t.variable(Matrix<float>::Zero(rows, cols));
      return std::make_tuple(program(t, W2, x0, true), x0);  // x held, as the real step holds it
    });
    EXPECT_EQ(e.saved_bytes, fwd.saved_bytes);
    EXPECT_EQ(e.forward_peak_bytes, fwd.peak_bytes);
    EXPECT_EQ(e.peak_bytes, bwd.peak_bytes);
    EXPECT_EQ(e.replayed_bytes, bwd.replayed_bytes);
    EXPECT_EQ(e.replayed_ops, bwd.replayed_ops);
  }
}

TEST(UserOps, EstimateRefusesNonEstimableOpsAndValueReadsAndPropagatesTheStepsOwnException) {
  Parameter<float> W(Matrix<float>::Constant(2, 3, 0.5f));
  W.mutable_grad() = Matrix<float>::Constant(2, 3, 7.f);
  const std::uint64_t version = W.version();
  remat_test::expect_error_naming<remat::shapes_only_error>(
      [&] {
        remat::estimate_memory<float>(
            [&](Tape<float>& t) { return remat::sum(remat::apply_op<NotEstimableOp>(t.variable(W))); });
      },
      {"not_estimable", "estimable = false"});
  remat_test::expect_error_naming<remat::shapes_only_error>(
      [&] {
        remat::estimate_memory<float>([&](Tape<float>& t) {
          Var<float> h = scaled_exp(t.variable(W), 2.0);
          if (h.value()(0, 0) > 0) return remat::sum(h);
          return remat::mean(h);
        });
      },
      {"scaled_exp", "[2,3]"});
  try {
    remat::estimate_memory<float>([&](Tape<float>& t) -> Var<float> {
      remat::sum(t.variable(W));
      throw std::out_of_range("the step's own error");
    });
    ADD_FAILURE() << "no exception";
  } catch (const std::out_of_range& e) {
    EXPECT_STREQ(e.what(), "the step's own error");
  }
  // Parameters untouched: value, version, gradient.
  EXPECT_EQ(W.version(), version);
  EXPECT_TRUE(W.value().isApproxToConstant(0.5f));
  EXPECT_TRUE(W.grad().isApproxToConstant(7.f));
  // The non-estimable op works on a tape that computes: d sum(2W) / dW = 2, added to the 7.
  Tape<float> tape;
  tape.backward(remat::sum(remat::apply_op<NotEstimableOp>(tape.variable(W))));
  EXPECT_TRUE(W.grad().isApproxToConstant(9.f));
}

/// A user op's NaN FLOP estimate under a memory budget (DTR's cost): no hang, gradients bitwise those without a
/// budget, and the budget kept.
TEST(UserOps, NanFlopsUnderAMemoryBudgetKeepsGradientsAndBudget) {
  auto run = [](std::size_t budget, Matrix<double>& g) {
    Tape<double> tape;
    if (budget) tape.set_memory_budget(budget);
    Var<double> x = tape.variable(remat_test::random_matrix<double>(4, 4, 9, remat_test::Domain{-1, 1, 0}));
    Var<double> v = x;
    for (int i = 0; i < 8; ++i) v = remat::tanh(remat::apply_op<NanFlopsOp>(v));
    tape.backward(remat::sum(v));
    g = x.grad();
    return tape.memory();
  };
  Matrix<double> g0, g1;
  run(0, g0);
  const remat::MemoryStats m = run(700, g1);
  EXPECT_TRUE(same_bits(g0, g1));
  EXPECT_LE(m.peak_bytes, 700u);
  EXPECT_GT(m.evictions, 0u);
}

/// Random programs of user ops (a NaN FLOP estimate among them) and checkpoint regions under a memory budget:
/// a shapes-only tape under the same budget makes the same choices — the same figures, evictions and
/// regenerations, and the same memory_budget_error or none.
TEST(UserOps, ShapesOnlyTapeUnderABudgetMatchesTheComputingTapeWithUserOps) {
  int throws = 0;
  for (std::uint32_t seed = 1; seed <= 60; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    const int length = 3 + static_cast<int>(rng() % 6);
    std::vector<int> ops, reg;
    for (int i = 0; i < length; ++i) {
      ops.push_back(static_cast<int>(rng() % 5));
      reg.push_back(static_cast<int>(rng() % 2));
    }
    const Index rows = 2 + static_cast<Index>(rng() % 4), cols = 2 + static_cast<Index>(rng() % 5);
    const std::size_t budget = 200 + rng() % 800;
    auto program = [&](Var<float> x) {
      Var<float> v = x;
      for (int i = 0; i < length; ++i) {
        auto one = [&, i](Var<float> u) -> Var<float> {
          switch (ops[static_cast<std::size_t>(i)]) {
            case 0:
              return remat::tanh(u);
            case 1:
              return fma(u, remat::sin(u), u);
            case 2:
              return scaled_exp(remat::tanh(u), 0.5);
            case 3:
              return remat::apply_op<NanFlopsOp>(u);
            default:
              return remat::gelu(u) * u;
          }
        };
        v = reg[static_cast<std::size_t>(i)] ? remat::checkpoint(one)(v) : one(v);
      }
      return remat::sum(v * v);
    };
    remat::MemoryStats m[2];
    bool threw[2] = {false, false};
    for (int so = 0; so < 2; ++so) {
      std::unique_ptr<Tape<float>> tape =
          so ? std::make_unique<Tape<float>>(remat::shapes_only) : std::make_unique<Tape<float>>();
      tape->set_memory_budget(budget);
      try {
        Var<float> x = tape->variable(Matrix<float>::Constant(rows, cols, 0.3f));
        tape->backward(program(x));
      } catch (const remat::memory_budget_error&) {
        threw[so] = true;
      }
      m[so] = tape->memory();
    }
    throws += threw[0] ? 1 : 0;
    EXPECT_EQ(threw[0], threw[1]);
    EXPECT_TRUE(same_figures(m[0], m[1]));
    EXPECT_EQ(m[0].evictions, m[1].evictions);
    EXPECT_EQ(m[0].rematerialized_ops, m[1].rematerialized_ops);
    EXPECT_EQ(m[0].rematerialized_bytes, m[1].rematerialized_bytes);
    if (!threw[0]) {
      EXPECT_LE(m[0].peak_bytes, budget);
    }
  }
  EXPECT_GT(throws, 0);  // some budgets are too small: the failure path is compared too
}
// ================================================================================================ op names

// Regression (crash, message), now a compile-time check: an op whose name was nullptr was accepted, and
// recorded inside a checkpoint region its OpInfo::name was std::string_view(nullptr) (strlen(nullptr), a
// segfault); an op named "" gave errors that named no op (": its output_shape is [0,3]; ..."). Now
// detail::op_table_of static_asserts detail::valid_op_name(Op::name): a program recording such an op does
// not compile, so what is tested here is the predicate.
static_assert(!remat::detail::valid_op_name(nullptr), "a null op name must be refused");
static_assert(!remat::detail::valid_op_name(""), "an empty op name must be refused");
static_assert(remat::detail::valid_op_name("x"), "a one-letter op name is a name");

}  // namespace user_ops_test
