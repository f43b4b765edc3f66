// A user's N-D op that carries a target shape in its Params, written with the public op recipe only (remat/op.hpp
// and remat/shape.hpp's PackedShape, as docs/custom-ops.md shows): "reshape_copy", y = factor · x read as another
// shape, copied (not a view). Its Params are a PackedShape and a float: 40 bytes, max_params_bytes exactly, which
// a Shape (72 bytes) could not be part of. Gradchecked in double on ranks 0 to 4, and checkpointed with gradients
// bitwise equal to plain ones under a policy that recomputes it (and under every library policy).
#include <gtest/gtest.h>

#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "api_checks.hpp"
#include "expect_error.hpp"
#include "nd_gradcheck.hpp"
#include "remat/remat.hpp"

namespace packed_shape_op_user_code {  // what a user writes: public names only

struct ReshapeCopyOp : remat::OpBase {
  static constexpr const char* name = "reshape_copy";
  static constexpr remat::OpKind kind = remat::OpKind::data_movement;
  struct Params {
    remat::PackedShape shape;  // 36 bytes: the target shape
    float factor = 1;          // the 4 bytes left
  };
  static unsigned reads(remat::GradInputs) { return remat::reads_nothing; }
  static remat::Shape output_shape(const remat::Shape* in, const Params& p) {
    const remat::Shape out = p.shape.unpack();
    if (out.numel() != in[0].numel())
      throw remat::shape_error(std::string(name) + ": x " + remat::to_string(in[0]) + " cannot be read as " +
                               remat::to_string(out));
    return out;
  }
  template <class T>
  static void forward(const remat::ForwardContext<T>& c) {
    const Params p = remat::params_of<Params>(c);
    const remat::Index n = c.out_shape().numel();
    const T* x = c.in(0).data();
    T* y = c.out().data();
    for (remat::Index i = 0; i < n; ++i) y[i] = static_cast<T>(p.factor) * x[i];
  }
  template <class T>
  static void backward(const remat::BackwardContext<T>& c) {
    if (!c.wants_grad(0)) return;
    const Params p = remat::params_of<Params>(c);
    remat::GradTarget<T> d = c.grad_target(0);
    const remat::ConstAlignedMap<T> g(c.grad_out().data(), d.map.rows(), d.map.cols());  // dy read as x's shape
    if (d.accumulate)
      d.map += static_cast<T>(p.factor) * g;
    else
      d.map = static_cast<T>(p.factor) * g;
  }
  static double flops(const remat::Shape*, int, const remat::Shape& out) { return static_cast<double>(out.numel()); }
};
static_assert(sizeof(ReshapeCopyOp::Params) == remat::max_params_bytes, "a PackedShape and a float fill the Params");

/// factor · x, read as `shape` (as many elements as x). Throws shape_error for a shape PackedShape cannot hold
/// (a dimension below 1) or of another number of elements.
template <class T>
remat::Var<T> reshape_copy(const remat::Var<T>& x, const remat::Shape& shape, float factor = 1) {
  return remat::apply_op<ReshapeCopyOp>(ReshapeCopyOp::Params{remat::PackedShape(shape), factor}, x);
}

}  // namespace packed_shape_op_user_code

// Named after the file: this directory's test files are compiled as one translation unit (tests/CMakeLists.txt).
namespace packed_shape_op_test {

using packed_shape_op_user_code::reshape_copy;
using remat::Matrix;
using remat::Shape;
using remat::Tape;
using remat::Var;

TEST(PackedShapeOp, ReshapeCopyPassesTheGradcheckOnEveryRank) {
  const std::vector<std::pair<Shape, Shape>> cases{
      {Shape{2, 3, 4}, Shape{4, 6}},  {Shape{2, 3, 4}, Shape{24}},
      {Shape{24}, Shape{2, 1, 3, 4}}, {Shape{2, 1, 3, 2}, Shape{3, 1, 4}},
      {Shape{1}, Shape::scalar()},    {Shape::scalar(), Shape{1, 1, 1}},
      {Shape{5}, Shape{5}},           {Shape{1, 2, 1, 1, 3, 1, 1, 2}, Shape{12}}};
  for (const auto& [from, to] : cases) {
    EXPECT_TRUE(remat_test::nd_check(
        [&](Tape<double>& tape, const std::vector<Var<double>>& v) {
          const Var<double> y = reshape_copy(v[0], to, 1.5f);
          EXPECT_EQ(y.shape(), to);
          return remat_test::weighted_sum(tape, y);
        },
        {from}))
        << remat::to_string(from) << " → " << remat::to_string(to);
  }
}

TEST(PackedShapeOp, ReshapeCopyRefusesAShapeItCannotCarryOrRead) {
  Tape<double> tape;
  const Var<double> x = tape.variable(Matrix<double>::Ones(2, 3));
  remat_test::expect_error_naming<remat::shape_error>(
      [&] {
        reshape_copy(x, Shape{2, 0, 3});
      },
      {"PackedShape", "[2,0,3]"});
  remat_test::expect_error_naming<remat::shape_error>(
      [&] {
        reshape_copy(x, Shape{4, 2});
      },
      {"reshape_copy", "[2,3]", "[4,2]"});
  EXPECT_EQ(tape.size(), 1u);  // nothing recorded
}

/// loss = sum(square(reshape_copy(tanh(x), [2,3,4], 0.5)) ⊙ w): square reads reshape_copy's output, so a policy
/// that does not save it makes the backward recompute it. Returns the loss; grad gets x's gradient.
template <class Checkpoint>
float run(Checkpoint&& checkpoint, Matrix<float>& grad, remat::MemoryStats* stats = nullptr) {
  Tape<float> tape;
  const Var<float> x = tape.variable(remat_test::random_matrix<float>(6, 4, 3, remat_test::Domain{-2, 2, 0}));
  const Shape s{2, 3, 4};
  const Matrix<float> w = remat_test::random_matrix<float>(1, s.numel(), 4, remat_test::Domain{-1, 1, 0});
  const auto f = [&](const Var<float>& in) { return remat::square(reshape_copy(remat::tanh(in), s, 0.5f)); };
  const Var<float> loss = remat::sum(checkpoint(f, x) * tape.constant(s, w.data()));
  tape.backward(loss);
  grad = x.grad();
  if (stats) *stats = tape.memory();
  return loss.value()(0, 0);
}

TEST(PackedShapeOp, CheckpointedReshapeCopyGivesBitwiseEqualGradients) {
  Matrix<float> plain, checkpointed;
  const float reference = run([](const auto& f, const Var<float>& x) { return f(x); }, plain);
  // Saves everything but reshape_copy: the backward replays it alone, from the saved tanh.
  const remat_test::AnyPolicy recompute_it = [](const remat::OpInfo& op) { return op.name != "reshape_copy"; };
  std::vector<std::pair<std::string, remat_test::AnyPolicy>> policies = remat_test::every_policy();
  policies.emplace_back("everything but reshape_copy", recompute_it);
  for (const auto& [name, policy] : policies) {
    SCOPED_TRACE(name);
    remat::MemoryStats stats;
    const float loss =
        run([&](const auto& f, const Var<float>& x) { return remat::checkpoint(f, policy)(x); }, checkpointed, &stats);
    EXPECT_TRUE(remat_test::same_bits(Matrix<float>::Constant(1, 1, loss), Matrix<float>::Constant(1, 1, reference)));
    EXPECT_TRUE(remat_test::same_bits(checkpointed, plain));
    if (name == "everything but reshape_copy") {
      EXPECT_EQ(stats.replayed_ops, 1u);
      EXPECT_EQ(stats.replayed_bytes, 24 * sizeof(float));  // reshape_copy's [2,3,4] output
      EXPECT_EQ(stats.replayed_flops, 24.0);
    }
  }
}

}  // namespace packed_shape_op_test
