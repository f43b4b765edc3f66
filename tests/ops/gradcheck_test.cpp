// Every op of the op list, every shape set: reverse-mode gradient against central finite differences
// (double, max relative error ≤ 1e-6), and the forward value against an independent reference
// computation (double and float). Then the op-specific checks a list entry cannot express.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "gradcheck.hpp"
#include "op_list.hpp"
#include "random.hpp"
#include "remat/remat.hpp"

// Named after the file: this directory's test files are compiled as one translation unit (tests/CMakeLists.txt).
namespace gradcheck_test {

using remat::Index;
using remat::Matrix;
using remat::Tape;
using remat::Var;
using remat_test::OpInstance;

// One test per op (one CTest entry each); it runs every shape set of the op, traced by name
// ("add_3x4_1x4").
class OpListTest : public ::testing::TestWithParam<const remat_test::OpCase*> {
 protected:
  template <class Check>
  void for_each_shape_set(Check check) const {
    for (std::size_t k = 0; k < GetParam()->shape_sets.size(); ++k) {
      const OpInstance instance{GetParam(), k};
      SCOPED_TRACE(instance.name());
      check(instance);
    }
  }
};

std::uint64_t seed_of(const OpInstance& instance) {
  return remat_test::seed_from(instance.name());
}

void check_gradient(const OpInstance& instance) {
  const auto& op = *instance.op;
  const std::uint64_t s = seed_of(instance);
  const auto result = remat_test::gradcheck(
      [&](Tape<double>& tape, const std::vector<Var<double>>& in) {
        return remat_test::scalar_loss(tape, op.build(in), s);
      },
      remat_test::make_inputs<double>(op, instance.shapes(), s),
      remat_test::is_nd(instance.shapes()) ? instance.shapes() : std::vector<remat::Shape>{});
  EXPECT_EQ(result.checked, [&] {
    std::size_t n = 0;
    for (const auto& shape : instance.shapes()) n += static_cast<std::size_t>(shape.numel());
    return n;
  }());
  EXPECT_TRUE(remat_test::passes(result, 1e-6));
}

TEST_P(OpListTest, GradientMatchesCentralDifferences) {
  for_each_shape_set(check_gradient);
}

/// An N-D entry's value against its reference on flat data: the output's shape, then every element.
template <class T>
void expect_nd_value_matches_reference(const OpInstance& instance, std::uint64_t seed, double tolerance) {
  const auto& op = *instance.op;
  const auto inputs = remat_test::make_inputs<double>(op, instance.shapes(), seed);
  std::vector<remat_test::NdArray> arrays;
  for (std::size_t k = 0; k < inputs.size(); ++k)
    arrays.push_back(remat_test::nd_array(inputs[k], instance.shapes()[k]));
  const remat_test::NdArray expected = op.nd_reference(arrays);
  Tape<T> tape;
  std::vector<Var<T>> vars;
  for (std::size_t k = 0; k < inputs.size(); ++k)
    vars.push_back(remat_test::leaf<T>(tape, inputs[k].cast<T>(), instance.shapes()[k]));
  const Var<T> out = op.build(vars);
  ASSERT_EQ(remat::to_string(out.shape()), remat::to_string(expected.shape));
  const auto value = out.value();
  ASSERT_EQ(static_cast<std::size_t>(value.size()), expected.data.size());
  for (std::size_t k = 0; k < expected.data.size(); ++k)
    EXPECT_NEAR(static_cast<double>(value.data()[k]), expected.data[k],
                tolerance * std::max(1.0, std::abs(expected.data[k])))
        << "at element " << k;
}

template <class T>
void expect_value_matches_reference(const OpInstance& instance, std::uint64_t seed, double tolerance) {
  const auto& op = *instance.op;
  if (op.nd_reference) return expect_nd_value_matches_reference<T>(instance, seed, tolerance);
  const auto inputs = remat_test::make_inputs<double>(op, instance.shapes(), seed);
  const Matrix<double> expected = op.reference(inputs);
  Tape<T> tape;
  std::vector<Var<T>> vars;
  for (const auto& m : inputs) vars.push_back(tape.variable(m.cast<T>()));
  const Var<T> out = op.build(vars);
  ASSERT_EQ(out.rows(), expected.rows());
  ASSERT_EQ(out.cols(), expected.cols());
  const auto value = out.value();
  for (remat::Index i = 0; i < expected.rows(); ++i)
    for (remat::Index j = 0; j < expected.cols(); ++j)
      EXPECT_NEAR(static_cast<double>(value(i, j)), expected(i, j), tolerance * std::max(1.0, std::abs(expected(i, j))))
          << "at (" << i << "," << j << ")";
}

// Ops without a reference function (dropout: its mask is a function of the tape's generator) are not
// instantiated here; their dedicated tests below check their values.
class OpValueTest : public OpListTest {};

TEST_P(OpValueTest, MatchesReferenceInDouble) {
  for_each_shape_set([](const OpInstance& i) { expect_value_matches_reference<double>(i, seed_of(i), 1e-12); });
}

TEST_P(OpValueTest, MatchesReferenceInFloat) {
  for_each_shape_set([](const OpInstance& i) { expect_value_matches_reference<float>(i, seed_of(i), 2e-6); });
}

// What a checkpoint policy sees of the op: its name, kind, output shape, bytes and a FLOP estimate.
void check_op_info(const OpInstance& instance) {
  const auto& op = *instance.op;
  struct Seen {
    std::string name;
    remat::OpKind kind;
    bool batch_dims;
    remat::Shape shape;
    std::size_t bytes;
    double flops;
  };
  std::vector<Seen> seen;
  const auto policy = [&seen](const remat::OpInfo& info) {
    seen.push_back({std::string(info.name), info.kind, info.batch_dims, info.shape, info.bytes, info.flops});
    return true;
  };
  Tape<double> tape;
  std::vector<Var<double>> vars;
  const auto inputs = remat_test::make_inputs<double>(op, instance.shapes(), seed_of(instance));
  for (std::size_t k = 0; k < inputs.size(); ++k)
    vars.push_back(remat_test::leaf(tape, inputs[k], instance.shapes()[k]));
  const auto block = remat::checkpoint(
      [&](const Var<double>& first) {
        auto in = vars;
        in[0] = first;
        return op.build(in);
      },
      policy);
  const Var<double> out = block(vars[0]);
  ASSERT_EQ(seen.size(), static_cast<std::size_t>(op.recorded_ops)) << op.name;
  const Seen& info = seen[0];
  static const std::map<std::string, remat::OpKind> kinds = {{"matmul", remat::OpKind::dot},
                                                             {"linear", remat::OpKind::dot},
                                                             {"sum", remat::OpKind::reduction},
                                                             {"mean", remat::OpKind::reduction},
                                                             {"sum_rows", remat::OpKind::reduction},
                                                             {"max", remat::OpKind::reduction},
                                                             {"softmax", remat::OpKind::normalization},
                                                             {"log_softmax", remat::OpKind::normalization},
                                                             {"layer_norm", remat::OpKind::normalization},
                                                             {"cross_entropy", remat::OpKind::loss},
                                                             {"mse_loss", remat::OpKind::loss},
                                                             {"dropout", remat::OpKind::random},
                                                             {"checkpoint_name", remat::OpKind::identity},
                                                             {"embedding", remat::OpKind::data_movement},
                                                             {"slice_cols", remat::OpKind::data_movement},
                                                             {"concat_cols", remat::OpKind::data_movement},
                                                             {"transpose", remat::OpKind::data_movement},
                                                             {"reshape", remat::OpKind::data_movement},
                                                             {"permute", remat::OpKind::data_movement},
                                                             {"flatten", remat::OpKind::data_movement},
                                                             {"squeeze", remat::OpKind::data_movement},
                                                             {"unsqueeze", remat::OpKind::data_movement},
                                                             {"concat", remat::OpKind::data_movement},
                                                             {"stack", remat::OpKind::data_movement},
                                                             {"slice", remat::OpKind::data_movement},
                                                             {"index_select", remat::OpKind::data_movement},
                                                             {"gather", remat::OpKind::data_movement},
                                                             {"conv2d", remat::OpKind::convolution},
                                                             {"max_pool2d", remat::OpKind::reduction},
                                                             {"batch_norm", remat::OpKind::normalization},
                                                             {"avg_pool2d", remat::OpKind::reduction},
                                                             {"adaptive_avg_pool2d", remat::OpKind::reduction},
                                                             {"upsample_nearest2d", remat::OpKind::data_movement},
                                                             {"sum_cols", remat::OpKind::reduction},
                                                             {"mean_cols", remat::OpKind::reduction},
                                                             {"max_rows", remat::OpKind::reduction},
                                                             {"attention_scores", remat::OpKind::dot},
                                                             {"attention_values", remat::OpKind::dot},
                                                             {"scaled_dot_product_attention", remat::OpKind::dot}};
  const auto it = kinds.find(info.name);
  EXPECT_EQ(info.kind, it == kinds.end() ? remat::OpKind::elementwise : it->second)
      << op.name << " recorded as " << info.name << " of kind " << remat::to_string(info.kind);
  // Batch dimensions: the attention products, and torch.matmul with an operand of more than two dims.
  const bool batched_matmul =
      info.name == "matmul" && (instance.shapes()[0].rank() > 2 || instance.shapes()[1].rank() > 2);
  EXPECT_EQ(info.batch_dims,
            info.name.rfind("attention", 0) == 0 || info.name == "scaled_dot_product_attention" || batched_matmul)
      << info.name;
  if (op.recorded_ops == 1) {
    EXPECT_EQ(info.shape, out.shape());
    EXPECT_EQ(info.bytes, static_cast<std::size_t>(out.shape().numel()) * sizeof(double));
  }
  const auto& s = instance.shapes();
  if (info.name == "matmul")  // 2·k per output element (m·n of them per matrix product of the batch)
    EXPECT_EQ(info.flops, 2.0 * static_cast<double>(out.shape().numel() * s[0][s[0].rank() - 1]));
  else if (info.name == "linear")
    EXPECT_EQ(info.flops, 2.0 * static_cast<double>(s[0].rows() * s[0].cols() * s[1].cols()) +
                              static_cast<double>(s[0].rows() * s[1].cols()));
  else if (info.name == "attention_scores" || info.name == "attention_values")  // 2·(B·S)·S·H
    EXPECT_EQ(info.flops, 2.0 * static_cast<double>(instance.shapes()[1].rows() * instance.shapes()[1].cols() *
                                                    remat_test::attention_config(instance.shapes()[1]).seq_len));
  else if (info.kind == remat::OpKind::identity)
    EXPECT_EQ(info.flops, 0.0);
  else
    EXPECT_GT(info.flops, 0.0) << op.name;
}

TEST_P(OpListTest, ReportsNameKindShapeBytesAndFlopsToPolicies) {
  for_each_shape_set(check_op_info);
}

std::vector<const remat_test::OpCase*> all_ops() {
  std::vector<const remat_test::OpCase*> ops;
  for (const auto& op : remat_test::op_list()) ops.push_back(&op);
  return ops;
}

INSTANTIATE_TEST_SUITE_P(AllOps, OpListTest, ::testing::ValuesIn(all_ops()),
                         [](const ::testing::TestParamInfo<const remat_test::OpCase*>& info) {
                           return info.param->name;
                         });

std::vector<const remat_test::OpCase*> ops_with_reference() {
  std::vector<const remat_test::OpCase*> ops;
  for (const remat_test::OpCase* op : all_ops())
    if (op->has_reference()) ops.push_back(op);
  return ops;
}

INSTANTIATE_TEST_SUITE_P(OpsWithReference, OpValueTest, ::testing::ValuesIn(ops_with_reference()),
                         [](const ::testing::TestParamInfo<const remat_test::OpCase*>& info) {
                           return info.param->name;
                         });

// The list covers every public op, each operator form and each broadcasting form.
TEST(OpList, CoversEveryPublicOp) {
  std::set<std::string> names;
  for (const auto& op : remat_test::op_list()) {
    EXPECT_TRUE(names.insert(op.name).second) << "duplicate entry " << op.name;
    EXPECT_EQ(op.domains.size(), static_cast<std::size_t>(op.arity)) << op.name;
    bool has_scalar = false, has_non_square = false;
    for (const auto& set : op.shape_sets) {
      EXPECT_EQ(set.size(), static_cast<std::size_t>(op.arity)) << op.name;
      if (set[0].rows() == 1 && set[0].cols() == 1) has_scalar = true;
      if (set[0].rows() != set[0].cols()) has_non_square = true;
    }
    // batch_norm in training needs two values per channel (PyTorch refuses one): its least set is [1,1,1,2].
    EXPECT_TRUE(has_scalar || op.name == "batch_norm") << op.name << " has no 1x1 shape set";
    EXPECT_TRUE(has_non_square) << op.name << " has no non-square shape set";
  }
  for (const char* op : {"matmul",
                         "linear",
                         "add",
                         "operator_plus",
                         "subtract",
                         "operator_minus",
                         "multiply",
                         "operator_times",
                         "divide",
                         "operator_divide",
                         "var_plus_scalar",
                         "scalar_plus_var",
                         "var_minus_scalar",
                         "scalar_minus_var",
                         "var_times_scalar",
                         "scalar_times_var",
                         "var_over_scalar",
                         "scalar_over_var",
                         "affine",
                         "neg",
                         "operator_negate",
                         "exp",
                         "log",
                         "sin",
                         "cos",
                         "abs",
                         "pow_fractional",
                         "pow_integer",
                         "tanh",
                         "sigmoid",
                         "relu",
                         "gelu",
                         "softplus",
                         "square",
                         "sqrt",
                         "sum",
                         "mean",
                         "sum_rows",
                         "softmax",
                         "log_softmax",
                         "cross_entropy",
                         "mse_loss",
                         "layer_norm",
                         "dropout",
                         "dropout_p0",
                         "checkpoint_name",
                         "embedding",
                         "slice_cols",
                         "concat_cols",
                         "concat_cols_three_parts",
                         "transpose",
                         "reshape",
                         "sum_cols",
                         "mean_cols",
                         "max_rows",
                         "attention_scores",
                         "attention_scores_causal",
                         "attention_values",
                         "scaled_dot_product_attention",
                         "scaled_dot_product_attention_causal"})
    EXPECT_EQ(names.count(op), 1u) << "the op list has no entry " << op;
  // The N-D forms (nd_reference entries: ranks 1, 3 and 4, broadcasting, size-1 dims).
  for (const char* op : {"add_nd",
                         "multiply_nd",
                         "maximum_nd",
                         "where_nd",
                         "clamp_nd",
                         "matmul_nd",
                         "sum_dims_keepdim",
                         "sum_all_dims",
                         "mean_dims",
                         "max_dims_keepdim",
                         "max_dims",
                         "softmax_dim",
                         "log_softmax_dim",
                         "layer_norm_nd",
                         "permute",
                         "transpose_dims",
                         "reshape_nd",
                         "flatten",
                         "squeeze",
                         "unsqueeze",
                         "concat_nd",
                         "stack",
                         "slice",
                         "index_select",
                         "gather"}) {
    EXPECT_EQ(names.count(op), 1u) << "the op list has no entry " << op;
    if (names.count(op)) {
      EXPECT_TRUE(static_cast<bool>(remat_test::find_op(op).nd_reference)) << op;
    }
  }
  // N-D broadcasting: a lower rank on either side, a size-1 dim stretched in either operand.
  for (const char* op : {"add_nd", "multiply_nd", "maximum_nd"}) {
    bool lower[2] = {false, false}, stretched[2] = {false, false};
    for (const auto& s : remat_test::find_op(op).shape_sets)
      for (int k = 0; k < 2; ++k) {
        const remat::Shape &a = s[static_cast<std::size_t>(k)], &b = s[static_cast<std::size_t>(1 - k)];
        lower[k] = lower[k] || a.rank() < b.rank();
        for (int d = 1; d <= std::min(a.rank(), b.rank()); ++d)
          stretched[k] = stretched[k] || (a[a.rank() - d] == 1 && b[b.rank() - d] > 1);
      }
    EXPECT_TRUE(lower[0] && lower[1]) << op << ": a lower rank on each side";
    EXPECT_TRUE(stretched[0] && stretched[1]) << op << ": a size-1 dim stretched on each side";
  }
  // Each broadcasting form, on either side.
  for (const char* op : {"add", "subtract", "multiply", "divide"}) {
    const auto& sets = remat_test::find_op(op).shape_sets;
    auto has = [&](remat::Shape a, remat::Shape b) {
      for (const auto& s : sets)
        if (s[0] == a && s[1] == b) return true;
      return false;
    };
    EXPECT_TRUE(has({3, 4}, {1, 4}) && has({1, 4}, {3, 4})) << op << ": row";
    EXPECT_TRUE(has({3, 4}, {3, 1}) && has({3, 1}, {3, 4})) << op << ": column";
    EXPECT_TRUE(has({3, 4}, {1, 1}) && has({1, 1}, {3, 4})) << op << ": scalar";
  }
}

// ---- the checker itself can fail ----

// tanh with a wrong derivative (1 − y instead of 1 − y²): the gradcheck must reject it.
struct WrongTanhOp : remat::UnaryElementwise<WrongTanhOp> {
  static constexpr const char* name = "wrong_tanh";
  static constexpr unsigned residuals = remat::reads_output;
  static constexpr double flops_per_element = 1;
  template <class X>
  static auto value(const X& x, const Params&) {
    return x.tanh();
  }
  template <class X, class Y, class G>
  static auto derivative(const X&, const Y& y, const G& g, const Params&) {
    using T = typename X::Scalar;
    return g * (T(1) - y);
  }
};

TEST(Gradcheck, RejectsAWrongDerivative) {
  const auto result = remat_test::gradcheck(
      [](Tape<double>&, const std::vector<Var<double>>& v) { return remat::sum(remat::apply_op<WrongTanhOp>(v[0])); },
      {remat_test::random_matrix(2, 3, 5)});
  EXPECT_GT(result.max_error, 1e-2);
  EXPECT_FALSE(remat_test::passes(result));
  EXPECT_EQ(result.checked, 6u);
}

TEST(Gradcheck, AcceptsTheRightDerivativeAndReportsTheMaximum) {
  const auto result = remat_test::gradcheck(
      [](Tape<double>&, const std::vector<Var<double>>& v) { return remat::sum(remat::tanh(v[0])); },
      {remat_test::random_matrix(2, 3, 5)});
  EXPECT_TRUE(remat_test::passes(result));
  EXPECT_GE(result.input, 0);
  EXPECT_LT(result.max_error, 1e-8);
}

// ---- op-specific checks ----

TEST(CrossEntropy, ValueMatchesHandComputation) {
  // Row 0: logits (1, 2, 3), label 2: log(e + e² + e³) − 3. Row 1: (0, 0, 0), label 0: log 3.
  Tape<double> tape;
  Matrix<double> x(2, 3);
  x << 1, 2, 3, 0, 0, 0;
  const auto loss = remat::cross_entropy(tape.variable(x), {2, 0});
  const double row0 = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0)) - 3;
  const double row1 = std::log(3.0);
  EXPECT_NEAR(loss.item(), (row0 + row1) / 2, 1e-15);
}

TEST(CrossEntropy, GradientIsSoftmaxMinusOneHotOverRows) {
  Tape<double> tape;
  Matrix<double> x(2, 3);
  x << 1, 2, 3, 0, 0, 0;
  const auto logits = tape.variable(x);
  tape.backward(remat::cross_entropy(logits, {2, 0}));
  const double z = std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  Matrix<double> expected(2, 3);
  expected << std::exp(1.0) / z, std::exp(2.0) / z, std::exp(3.0) / z - 1, 1.0 / 3 - 1, 1.0 / 3, 1.0 / 3;
  expected /= 2;
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j) EXPECT_NEAR(logits.grad()(i, j), expected(i, j), 1e-15);
}

TEST(CrossEntropy, EachLabelSelectsItsColumn) {
  // Changing one row's label changes the loss by exactly (x_old − x_new)/m.
  Tape<double> tape;
  const Matrix<double> x = remat_test::random_matrix(4, 5, 7);
  const auto logits = tape.constant(x);
  const double a = remat::cross_entropy(logits, {0, 1, 2, 3}).item();
  const double b = remat::cross_entropy(logits, {0, 4, 2, 3}).item();
  EXPECT_NEAR(b - a, (x(1, 1) - x(1, 4)) / 4, 1e-14);
}

TEST(CrossEntropy, StableForHugeLogits) {
  Tape<double> tape;
  Matrix<double> x(1, 2);
  x << 1000, -1000;
  const auto logits = tape.variable(x);
  const auto loss = remat::cross_entropy(logits, {1});
  EXPECT_NEAR(loss.item(), 2000, 1e-9);
  tape.backward(loss);
  EXPECT_NEAR(logits.grad()(0, 0), 1, 1e-15);
  EXPECT_NEAR(logits.grad()(0, 1), -1, 1e-15);
}

TEST(LogSoftmax, StableAtPlusMinusThousand) {
  for (double big : {1000.0, -1000.0}) {
    Tape<double> tape;
    Matrix<double> x(1, 3);
    x << big, big + 1, big - 1;
    const auto v = tape.variable(x);
    const auto y = remat::log_softmax(v);
    // Shift invariance: equals log_softmax(0, 1, −1) computed directly.
    const double lse = std::log(1 + std::exp(1.0) + std::exp(-1.0));
    EXPECT_NEAR(y.value()(0, 0), -lse, 1e-12);
    EXPECT_NEAR(y.value()(0, 1), 1 - lse, 1e-12);
    EXPECT_NEAR(y.value()(0, 2), -1 - lse, 1e-12);
    tape.backward(remat::sum(y));
    // d/dx Σⱼ yⱼ = 1 − n·softmax(x).
    for (int j = 0; j < 3; ++j) {
      const double p = std::exp(y.value()(0, j));
      EXPECT_NEAR(v.grad()(0, j), 1 - 3 * p, 1e-12);
      EXPECT_TRUE(std::isfinite(v.grad()(0, j)));
    }
  }
  // Mixed extremes in one row, in float too.
  Tape<float> tape;
  Matrix<float> x(1, 2);
  x << 1000.f, -1000.f;
  const auto y = remat::log_softmax(tape.constant(x));
  EXPECT_EQ(y.value()(0, 0), 0.f);
  EXPECT_EQ(y.value()(0, 1), -2000.f);
}

TEST(Softmax, StableAtPlusMinusThousand) {
  Tape<double> tape;
  Matrix<double> x(2, 2);
  x << 1000, 1000, -1000, -1000;
  const auto y = remat::softmax(tape.constant(x));
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j) EXPECT_DOUBLE_EQ(y.value()(i, j), 0.5);
}

TEST(Softplus, DoesNotOverflow) {
  Tape<float> tape;
  Matrix<float> x(1, 4);
  x << 100.f, 1000.f, -100.f, -1000.f;
  const auto v = tape.variable(x);
  const auto y = remat::softplus(v);
  EXPECT_FLOAT_EQ(y.value()(0, 0), 100.f);
  EXPECT_FLOAT_EQ(y.value()(0, 1), 1000.f);
  EXPECT_GE(y.value()(0, 2), 0.f);
  EXPECT_LT(y.value()(0, 2), 1e-30f);
  EXPECT_GE(y.value()(0, 3), 0.f);
  EXPECT_LT(y.value()(0, 3), 1e-30f);  // e^−1000 underflows; Eigen's float exp may leave a denormal
  tape.backward(remat::sum(y));
  // dy/dx = sigmoid(x): 1 for large x, 0 for very negative x, never NaN.
  EXPECT_FLOAT_EQ(v.grad()(0, 0), 1.f);
  EXPECT_FLOAT_EQ(v.grad()(0, 1), 1.f);
  EXPECT_NEAR(v.grad()(0, 2), 0.f, 1e-30f);
  EXPECT_EQ(v.grad()(0, 3), 0.f);
}

TEST(LayerNorm, MatchesHandComputedSmallCase) {
  // Row (1, 2, 3): μ = 2, σ² = 2/3. Row (0, 0, 4): μ = 4/3, σ² = 32/9.
  Tape<double> tape;
  Matrix<double> x(2, 3), gain(1, 3), bias(1, 3);
  x << 1, 2, 3, 0, 0, 4;
  gain << 1, 2, -1;
  bias << 0, 0.5, 1;
  const double eps = 1e-3;
  const auto y = remat::layer_norm(tape.constant(x), tape.constant(gain), tape.constant(bias), eps);
  const double r0 = 1 / std::sqrt(2.0 / 3 + eps), r1 = 1 / std::sqrt(32.0 / 9 + eps);
  Matrix<double> expected(2, 3);
  expected << -1 * r0 * 1 + 0, 0 * r0 * 2 + 0.5, 1 * r0 * -1 + 1,  //
      -4.0 / 3 * r1 * 1 + 0, -4.0 / 3 * r1 * 2 + 0.5, 8.0 / 3 * r1 * -1 + 1;
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j) EXPECT_NEAR(y.value()(i, j), expected(i, j), 1e-14) << i << "," << j;
}

TEST(LayerNorm, GradientOfSumOverUnitGainIsZeroForX) {
  // With gain 1, Σⱼ yᵢⱼ = Σⱼ biasⱼ does not depend on x: dx = 0, dbias = m, dgain = Σᵢ x̂ᵢ.
  Tape<double> tape;
  const auto x = tape.variable(remat_test::random_matrix(3, 4, 11));
  const auto gain = tape.variable(Matrix<double>::Ones(1, 4));
  const auto bias = tape.variable(remat_test::random_matrix(1, 4, 12));
  tape.backward(remat::sum(remat::layer_norm(x, gain, bias)));
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j) EXPECT_NEAR(x.grad()(i, j), 0, 1e-12);
  for (int j = 0; j < 4; ++j) EXPECT_DOUBLE_EQ(bias.grad()(0, j), 3);
}

// On shapes above the parallel grain, where the kernels cut their work (gelu's backward into 1024-element
// chunks of each row block, the column sums into row blocks and column chunks), against formulas evaluated
// here: loss = Σ w ⊙ op(x) with a random w, so dx = w ⊙ op'(x) and the parameter gradients are sums over rows.
TEST(Gelu, GradientAboveTheGrainIsWTimesTheReferenceDerivative) {
  Tape<double> tape;
  const Matrix<double> xv = remat_test::random_matrix(300, 130, 21), wv = remat_test::random_matrix(300, 130, 22);
  const auto x = tape.variable(xv);
  tape.backward(remat::sum(remat::gelu(x) * tape.constant(wv)));
  const double h = 1e-5;
  for (Index i = 0; i < xv.rows(); ++i)
    for (Index j = 0; j < xv.cols(); ++j) {
      const double derivative =
          (remat_test::reference::gelu(xv(i, j) + h) - remat_test::reference::gelu(xv(i, j) - h)) / (2 * h);
      ASSERT_NEAR(x.grad()(i, j), wv(i, j) * derivative, 1e-9) << i << "," << j;
    }
}

TEST(LayerNorm, GainAndBiasGradientsAboveTheGrainAreSumsOverRows) {
  Tape<double> tape;
  const Index m = 700, n = 300;  // 16 row blocks of 44 rows (the last of 40), 2 column chunks (256 and 44)
  const Matrix<double> xv = remat_test::random_matrix(m, n, 31), wv = remat_test::random_matrix(m, n, 32);
  const auto x = tape.constant(xv);
  const auto gain = tape.variable(remat_test::random_matrix(1, n, 33));
  const auto bias = tape.variable(remat_test::random_matrix(1, n, 34));
  tape.backward(remat::sum(remat::layer_norm(x, gain, bias) * tape.constant(wv)));
  std::vector<long double> mean(m, 0), rstd(m, 0);
  for (Index i = 0; i < m; ++i) {
    long double variance = 0;
    for (Index k = 0; k < n; ++k) mean[i] += xv(i, k);
    mean[i] /= n;
    for (Index k = 0; k < n; ++k) variance += (xv(i, k) - mean[i]) * (xv(i, k) - mean[i]);
    rstd[i] = 1 / std::sqrt(variance / n + 1e-5L);
  }
  for (Index j = 0; j < n; ++j) {
    long double dgain = 0, dbias = 0;
    for (Index i = 0; i < m; ++i) {
      dgain += wv(i, j) * (xv(i, j) - mean[i]) * rstd[i];
      dbias += wv(i, j);
    }
    ASSERT_NEAR(gain.grad()(0, j), static_cast<double>(dgain), 1e-10) << j;
    ASSERT_NEAR(bias.grad()(0, j), static_cast<double>(dbias), 1e-10) << j;
  }
}

TEST(Dropout, EachElementIsZeroOrScaledInput) {
  const double p = 0.25;
  Tape<double> tape(42);
  const Matrix<double> x = remat_test::random_matrix(20, 30, 3, remat_test::away_from_zero);
  const auto v = tape.variable(x);
  const auto y = remat::dropout(v, p);
  const Matrix<double> weights = remat_test::random_matrix(20, 30, 4);
  tape.backward(remat::sum(y * tape.constant(weights)));
  int kept = 0;
  for (int i = 0; i < 20; ++i)
    for (int j = 0; j < 30; ++j) {
      if (y.value()(i, j) == 0) {
        EXPECT_EQ(v.grad()(i, j), 0) << "a dropped element passes no gradient";
      } else {
        ++kept;
        EXPECT_NEAR(y.value()(i, j), x(i, j) / (1 - p), 1e-15);
        EXPECT_NEAR(v.grad()(i, j), weights(i, j) / (1 - p), 1e-15) << "gradient is mask/(1-p)";
      }
    }
  EXPECT_GT(kept, 0);
  EXPECT_LT(kept, 600);
}

TEST(Dropout, KeepFractionIsOneMinusP) {
  // 100000 Bernoulli(1 − p) draws: the kept fraction's standard deviation is √(p(1−p)/n) ≤ 0.0016;
  // allow 5 of them.
  for (double p : {0.1, 0.5, 0.9}) {
    Tape<float> tape(7);
    const auto y = remat::dropout(tape.constant(Matrix<float>::Ones(100, 1000)), p);
    const auto value = y.value();
    const double kept = static_cast<double>((value.array() != 0.f).count()) / 100000.0;
    EXPECT_NEAR(kept, 1 - p, 5 * std::sqrt(p * (1 - p) / 100000.0)) << "p = " << p;
    // Inverted dropout keeps the mean: E[y] = 1.
    EXPECT_NEAR(value.mean(), 1.0, 5 * std::sqrt(p / (1 - p) / 100000.0)) << "p = " << p;
  }
}

TEST(Dropout, ProbabilityZeroIsIdentity) {
  Tape<double> tape;
  const Matrix<double> x = remat_test::random_matrix(4, 5, 9);
  const auto v = tape.variable(x);
  const auto y = remat::dropout(v, 0.0);
  EXPECT_EQ(Matrix<double>(y.value()), x);
  tape.backward(remat::sum(y));
  EXPECT_EQ(Matrix<double>(v.grad()), Matrix<double>::Ones(4, 5));
}

TEST(Dropout, SameSeedSameMaskNewDrawsDiffer) {
  const Matrix<float> ones = Matrix<float>::Ones(8, 8);
  Tape<float> a(123), b(123), c(124);
  const auto ya = remat::dropout(a.constant(ones), 0.5);
  const auto yb = remat::dropout(b.constant(ones), 0.5);
  const auto yc = remat::dropout(c.constant(ones), 0.5);
  const auto ya2 = remat::dropout(a.constant(ones), 0.5);  // the next draw on the same tape
  EXPECT_EQ(Matrix<float>(ya.value()), Matrix<float>(yb.value()));
  EXPECT_NE(Matrix<float>(ya.value()), Matrix<float>(yc.value()));
  EXPECT_NE(Matrix<float>(ya.value()), Matrix<float>(ya2.value()));
}

TEST(Abs, SubgradientAtZeroIsZero) {
  Tape<double> tape;
  const auto x = tape.variable(Matrix<double>::Zero(1, 2));
  tape.backward(remat::sum(remat::abs(x)));
  EXPECT_EQ(x.grad()(0, 0), 0);
}

TEST(Relu, GradientAtAndBelowZeroIsZero) {
  Tape<double> tape;
  Matrix<double> x(1, 3);
  x << -1, 0, 2;
  const auto v = tape.variable(x);
  tape.backward(remat::sum(remat::relu(v)));
  EXPECT_EQ(v.grad()(0, 0), 0);
  EXPECT_EQ(v.grad()(0, 1), 0);
  EXPECT_EQ(v.grad()(0, 2), 1);
}

TEST(Ops, SameVarOnBothSidesAccumulates) {
  // x·x and x + x: both inputs are one node, so its gradient is the sum of both contributions.
  Tape<double> tape;
  const Matrix<double> x = remat_test::random_matrix(2, 3, 21);
  const auto v = tape.variable(x);
  tape.backward(remat::sum(v * v + v));
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j) EXPECT_NEAR(v.grad()(i, j), 2 * x(i, j) + 1, 1e-15);
}

TEST(Ops, CompositeGraphPassesGradcheck) {
  // A small MLP with shared weights and several consumers per value.
  const auto result = remat_test::gradcheck(
      [](Tape<double>&, const std::vector<Var<double>>& v) {
        const auto h = remat::tanh(remat::linear(v[0], v[1], v[2]));
        const auto h2 = remat::layer_norm(h + remat::gelu(h), v[3], v[4]);
        return remat::cross_entropy(remat::matmul(h2, v[5]), {0, 2, 1}) + remat::mean(remat::square(v[1]));
      },
      {remat_test::random_matrix(3, 4, 1), remat_test::random_matrix(4, 5, 2), remat_test::random_matrix(1, 5, 3),
       remat_test::random_matrix(1, 5, 4), remat_test::random_matrix(1, 5, 5), remat_test::random_matrix(5, 3, 6)});
  EXPECT_TRUE(remat_test::passes(result));
}

}  // namespace gradcheck_test