// A user-defined op written against the public op recipe only (remat/custom_op.hpp), as docs/design.md
// §4.1 shows it: swiglu(a, b) = silu(a) ⊙ b (Shazeer 2020, "GLU Variants Improve Transformer"). It is
// gradchecked with the public remat::gradcheck, checkpointed under every policy (bitwise equal to no
// checkpoint), and its residuals by need are counted in exact bytes.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "gradcheck.hpp"
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

}  // namespace custom_op_test
