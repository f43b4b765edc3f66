// A user-defined op written against the public op recipe only (remat/op.hpp), as docs/design.md
// §4.1 shows it: swiglu(a, b) = silu(a) ⊙ b (Shazeer 2020, "GLU Variants Improve Transformer"). It is
// gradchecked with the public remat::gradcheck, checkpointed under every policy (bitwise equal to no
// checkpoint), and its residuals by need are counted in exact bytes.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "gradcheck.hpp"
#include "nd_gradcheck.hpp"
#include "random.hpp"
#include "remat/remat.hpp"

namespace user_code {  // not remat's namespace: nothing here may use remat::detail

struct SwigluOp : remat::OpBase {
  static constexpr const char* name = "swiglu";
  static constexpr remat::OpKind kind = remat::OpKind::elementwise;
  /// da reads a and b; db reads a.
  static unsigned reads(remat::GradInputs g) {
    return (remat::wants(g, 0) ? remat::reads_input0 | remat::reads_input1 : 0u) |
           (remat::wants(g, 1) ? remat::reads_input0 : 0u);
  }
  static remat::Shape output_shape(const remat::Shape* in, const Params&) {
    if (in[0].rows() != in[1].rows() || in[0].cols() != in[1].cols())
      throw remat::shape_error("swiglu: a is " + remat::to_string(in[0]) + " but b is " + remat::to_string(in[1]));
    return in[0];
  }
  template <class T>
  static void forward(const remat::ForwardContext<T>& c) {
    const auto a = c.in(0).array();
    c.out().array() = a / (T(1) + (-a).exp()) * c.in(1).array();
  }
  template <class T>
  static void backward(const remat::BackwardContext<T>& c) {
    const auto a = c.in(0).array();
    const auto g = c.grad_out().array();
    const auto sigma = T(1) / (T(1) + (-a).exp());
    if (c.wants_grad(0)) c.add_grad(0, g * c.in(1).array() * sigma * (T(1) + a * (T(1) - sigma)));
    if (c.wants_grad(1)) c.add_grad(1, g * a * sigma);
  }
  static double flops(const remat::Shape*, int, const remat::Shape& out) {
    return 6.0 * static_cast<double>(out.numel());
  }
};

template <class T>
remat::Var<T> swiglu(const remat::Var<T>& a, const remat::Var<T>& b) {
  return remat::apply_op<SwigluOp>(a, b);
}

/// RMSNorm over the last dimension of a value of any rank (Zhang & Sennrich 2019, without the gain):
/// y = x / sqrt(mean(x², -1) + eps); dx = (g − y · mean(g ⊙ y, -1)) / sqrt(mean(x², -1) + eps).
/// The contexts' matrix view folds every dimension but the last into rows, so the kernels are row loops.
struct RmsNormOp : remat::OpBase {
  static constexpr const char* name = "rms_norm";
  static constexpr remat::OpKind kind = remat::OpKind::normalization;
  struct Params {
    double eps = 1e-6;
  };
  static unsigned reads(remat::GradInputs) { return remat::reads_input0; }
  static remat::Shape output_shape(const remat::Shape* in, const Params&) { return in[0]; }
  template <class T>
  static T inverse_rms(const remat::ConstAlignedMap<T>& x, remat::Index r, double eps) {
    return T(1) / std::sqrt(x.row(r).squaredNorm() / T(x.cols()) + T(eps));
  }
  template <class T>
  static void forward(const remat::ForwardContext<T>& c) {
    const auto x = c.in(0);  // [rows, n]
    const double eps = remat::params_of<Params>(c).eps;
    for (remat::Index r = 0; r < x.rows(); ++r) c.out().row(r) = x.row(r) * inverse_rms(x, r, eps);
  }
  template <class T>
  static void backward(const remat::BackwardContext<T>& c) {
    if (!c.wants_grad(0)) return;
    const auto x = c.in(0);
    const auto g = c.grad_out();
    const double eps = remat::params_of<Params>(c).eps;
    remat::GradTarget<T> d = c.grad_target(0);
    for (remat::Index r = 0; r < x.rows(); ++r) {
      const T inv = inverse_rms(x, r, eps);
      const T mean_gy = g.row(r).dot(x.row(r)) * inv / T(x.cols());
      if (d.accumulate)
        d.map.row(r) += inv * (g.row(r) - x.row(r) * (inv * mean_gy));
      else
        d.map.row(r) = inv * (g.row(r) - x.row(r) * (inv * mean_gy));
    }
  }
  static double flops(const remat::Shape*, int, const remat::Shape& out) {
    return 3.0 * static_cast<double>(out.numel());
  }
};

template <class T>
remat::Var<T> rms_norm(const remat::Var<T>& x, double eps = 1e-6) {
  return remat::apply_op<RmsNormOp>(RmsNormOp::Params{eps}, x);
}

}  // namespace user_code

namespace custom_op_test {

using remat::Matrix;
using remat::Tape;
using remat::Var;

TEST(CustomOp, SwigluPassesTheFiniteDifferenceGradcheck) {
  for (const remat::Shape& s : {remat::Shape{1, 1}, remat::Shape{3, 4}, remat::Shape{5, 2}}) {
    const auto result = remat::gradcheck(
        [](Tape<double>& tape, const std::vector<Var<double>>& v) {
          const Matrix<double> w = remat_test::random_matrix<double>(v[0].shape(), 7, remat_test::Domain{-1, 1, 0});
          return remat::sum(user_code::swiglu(v[0], v[1]) * tape.constant(w));
        },
        {remat_test::random_matrix<double>(s, 1, remat_test::Domain{-2, 2, 0}),
         remat_test::random_matrix<double>(s, 2, remat_test::Domain{-2, 2, 0})});
    EXPECT_EQ(result.checked, static_cast<std::size_t>(2 * s.numel()));
    EXPECT_TRUE(remat_test::passes(result)) << remat::to_string(s);
  }
}

/// swiglu with a wrong da (the σ' term dropped): remat::gradcheck must catch it.
struct WrongSwigluOp : user_code::SwigluOp {
  static constexpr const char* name = "wrong_swiglu";
  template <class T>
  static void backward(const remat::BackwardContext<T>& c) {
    const auto a = c.in(0).array();
    const auto sigma = T(1) / (T(1) + (-a).exp());
    if (c.wants_grad(0)) c.add_grad(0, c.grad_out().array() * c.in(1).array() * sigma);
    if (c.wants_grad(1)) c.add_grad(1, c.grad_out().array() * a * sigma);
  }
};

TEST(CustomOp, AWrongBackwardFailsTheGradcheck) {
  const auto result = remat::gradcheck(
      [](Tape<double>&, const std::vector<Var<double>>& v) {
        return remat::sum(remat::apply_op<WrongSwigluOp>(v[0], v[1]));
      },
      {remat_test::random_matrix<double>({3, 3}, 3, remat_test::Domain{-2, 2, 0}),
       remat_test::random_matrix<double>({3, 3}, 4, remat_test::Domain{-2, 2, 0})});
  EXPECT_FALSE(remat_test::passes(result));
  EXPECT_EQ(result.input, 0);  // the wrong derivative is da
}

template <class T>
struct Mlp {
  Matrix<T> x, w1, w2, v;
};

/// A SwiGLU feed-forward block: (swiglu(x·W1, x·V))·W2, summed. Returns the loss and fills grads.
template <class T, class Wrap>
T run(const Mlp<T>& m, Wrap wrap, std::vector<Matrix<T>>& grads, remat::MemoryStats* after_forward = nullptr) {
  Tape<T> tape;
  Var<T> x = tape.variable(m.x), w1 = tape.variable(m.w1), w2 = tape.variable(m.w2), v = tape.variable(m.v);
  Var<T> h = wrap(
      [&](const Var<T>& in) {
        return remat::matmul(
            user_code::swiglu(remat::checkpoint_name(remat::matmul(in, w1), "gate"), remat::matmul(in, v)), w2);
      },
      x);
  Var<T> loss = remat::sum(remat::tanh(h));
  if (after_forward) *after_forward = tape.memory();
  tape.backward(loss);
  grads = {x.grad(), w1.grad(), w2.grad(), v.grad()};
  return loss.item();
}

Mlp<float> test_mlp() {
  return {remat_test::random_matrix<float>({6, 5}, 11, remat_test::Domain{-1, 1, 0}),
          remat_test::random_matrix<float>({5, 8}, 12, remat_test::Domain{-1, 1, 0}),
          remat_test::random_matrix<float>({8, 5}, 13, remat_test::Domain{-1, 1, 0}),
          remat_test::random_matrix<float>({5, 8}, 14, remat_test::Domain{-1, 1, 0})};
}

template <class Policy>
void expect_bitwise_equal_under(const char* policy_name, const Policy& policy) {
  SCOPED_TRACE(policy_name);
  const Mlp<float> m = test_mlp();
  std::vector<Matrix<float>> plain, checkpointed;
  const float reference = run(
      m, [](auto f, const Var<float>& x) { return f(x); }, plain);
  remat::MemoryStats stats;
  const float loss = run(
      m,
      [&](auto f, const Var<float>& x) {
        return remat::checkpoint([&](const Var<float>& in) { return f(in); }, policy)(x);
      },
      checkpointed, &stats);
  EXPECT_EQ(loss, reference);
  for (std::size_t k = 0; k < plain.size(); ++k) EXPECT_TRUE(plain[k] == checkpointed[k]) << "gradient " << k;
}

TEST(CustomOp, CheckpointedSwigluGivesBitwiseEqualGradientsUnderEveryPolicy) {
  expect_bitwise_equal_under("nothing_saveable", remat::policies::nothing_saveable);
  expect_bitwise_equal_under("everything_saveable", remat::policies::everything_saveable);
  expect_bitwise_equal_under("dots_saveable", remat::policies::dots_saveable);
  expect_bitwise_equal_under("dots_with_no_batch_dims_saveable", remat::policies::dots_with_no_batch_dims_saveable);
  expect_bitwise_equal_under("save_only_these_names", remat::policies::save_only_these_names({"gate"}));
  expect_bitwise_equal_under("save_anything_except_these_names",
                             remat::policies::save_anything_except_these_names({"gate"}));
}

TEST(CustomOp, ReplayRunsTheUsersForward) {
  // Under nothing_saveable the region's backward needs swiglu's inputs (x·W1, x·V): the replay
  // recomputes both products and the swiglu itself: 6×8 floats each.
  const Mlp<float> m = test_mlp();
  Tape<float> tape;
  Var<float> x = tape.variable(m.x), w1 = tape.variable(m.w1), w2 = tape.variable(m.w2), v = tape.variable(m.v);
  Var<float> h = remat::checkpoint(
      [&](const Var<float>& in) {
        return remat::matmul(user_code::swiglu(remat::matmul(in, w1), remat::matmul(in, v)), w2);
      },
      remat::policies::nothing_saveable)(x);
  Var<float> loss = remat::sum(remat::tanh(h));
  tape.backward(loss);
  EXPECT_EQ(tape.memory().replayed_ops, 3u);
  EXPECT_EQ(tape.memory().replayed_bytes, 3u * 6 * 8 * sizeof(float));
}

TEST(CustomOp, ItsResidualsByNeedAreCountedExactly) {
  // swiglu(a, b) with only b requiring a gradient keeps a alone: 3×4 floats = 48 bytes.
  Tape<float> tape;
  Var<float> a = tape.constant(Matrix<float>::Constant(3, 4, 0.5f));
  Var<float> b = tape.variable(Matrix<float>::Constant(3, 4, 2.0f));
  Var<float> y = user_code::swiglu(a, b);
  Var<float> loss = remat::sum(y);
  y = Var<float>();
  a = Var<float>();
  EXPECT_EQ(tape.memory().saved_bytes, 48u);
  tape.backward(loss);
  const float silu = 0.5f / (1.0f + std::exp(-0.5f));
  EXPECT_EQ(b.grad()(2, 3), silu);
}

TEST(CustomOp, AnNdOpPassesTheGradcheckOnRanks1To4) {
  for (const remat::Shape& s : {remat::Shape{5}, remat::Shape{2, 3, 4}, remat::Shape{2, 1, 3, 2}}) {
    EXPECT_TRUE(remat_test::nd_check(
        [](Tape<double>& tape, const std::vector<Var<double>>& v) {
          return remat_test::weighted_sum(tape, user_code::rms_norm(v[0], 0.1));
        },
        {s}))
        << remat::to_string(s);
  }
}

TEST(CustomOp, AnNdOpEqualsTheSameFormulaWrittenWithBuiltInOps) {
  Tape<double> tape;
  const remat::Shape s{2, 3, 4};
  const Matrix<double> values = remat_test::nd_values(s, 5);
  Var<double> x = tape.constant(s, values.data());
  const Matrix<double> user = user_code::rms_norm(x, 0.1).value();
  const Matrix<double> built_in = (x / remat::sqrt(remat::mean(x * x, {-1}, true) + 0.1)).value();
  EXPECT_EQ(user_code::rms_norm(x).shape(), s);
  EXPECT_LT((user - built_in).cwiseAbs().maxCoeff(), 1e-14);
}

/// dL/dx of sum(tanh(rms_norm(x·W reshaped to [2,3,4]))) ⊙ w), the norm checkpointed under `policy` or not.
template <class Policy>
Matrix<float> nd_block_gradient(bool plain, const Policy& policy) {
  Tape<float> tape;
  Var<float> x = tape.variable(remat_test::random_matrix<float>({6, 5}, 21, remat_test::Domain{-1, 1, 0}));
  Var<float> w = tape.variable(remat_test::random_matrix<float>({5, 4}, 22, remat_test::Domain{-1, 1, 0}));
  auto block = [&](const Var<float>& in) {
    return remat::tanh(user_code::rms_norm(remat::reshape(remat::matmul(in, w), {2, 3, 4})));
  };
  Var<float> y = plain ? block(x) : remat::checkpoint(block, policy)(x);
  const Matrix<float> weights = remat_test::random_matrix<float>({1, 24}, 23, remat_test::Domain{-1, 1, 0});
  tape.backward(remat::sum(y * tape.constant(remat::Shape{2, 3, 4}, weights.data())));
  return x.grad();
}

TEST(CustomOp, ACheckpointedNdOpGivesThePlainGradientsBitwise) {
  const Matrix<float> plain = nd_block_gradient(true, remat::policies::nothing_saveable);
  EXPECT_EQ(nd_block_gradient(false, remat::policies::nothing_saveable), plain);
  EXPECT_EQ(nd_block_gradient(false, remat::policies::everything_saveable), plain);
  EXPECT_EQ(nd_block_gradient(false, remat::policies::dots_saveable), plain);
}

}  // namespace custom_op_test
