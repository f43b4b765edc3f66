// Ops at the edges of their inputs: the same Var as both operands, broadcasting every combination on both
// sides (against finite differences), 1×1 operands everywhere, layer_norm of constant rows, dropout with
// p = 0 and near 1, loss ops' error messages, NaN and inf propagating, pow's zero exponent at zero.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "remat/remat.hpp"

// Named after the file: this directory's test files are compiled as one translation unit (tests/CMakeLists.txt).
namespace edge_values_test {

using remat::Matrix;
using remat::Parameter;
using remat::Tape;
using remat::Var;

template <class T>
Matrix<T> rnd(remat::Index r, remat::Index c, unsigned seed) {
  std::srand(seed);
  return Matrix<T>::Random(r, c);
}

template <class T>
bool same_bits(const Matrix<T>& a, const Matrix<T>& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() &&
         std::memcmp(a.data(), b.data(), sizeof(T) * static_cast<std::size_t>(a.size())) == 0;
}

// ---------------------------------------------------------------- numerics at the edges

TEST(OpEdgeValues, SameVarAsBothInputs) {
  Tape<double> tape;
  auto x = tape.variable(rnd<double>(2, 3, 23));
  const Matrix<double> xv = x.value();
  auto g = tape.gradient(remat::sum(x * x), {x}, true);
  EXPECT_TRUE(g[0].isApprox(Matrix<double>(2 * xv.array())));
  g = tape.gradient(remat::sum(x / x), {x}, true);
  EXPECT_LT(g[0].cwiseAbs().maxCoeff(), 1e-12);
  g = tape.gradient(remat::sum(x - x), {x}, true);
  EXPECT_TRUE(g[0].isZero());
  g = tape.gradient(remat::sum(x + x), {x}, true);
  EXPECT_TRUE(g[0].isApprox(Matrix<double>::Constant(2, 3, 2)));
  auto s = tape.variable(rnd<double>(3, 3, 24));
  g = tape.gradient(remat::sum(remat::matmul(s, s)), {s}, true);
  const Matrix<double> sv = s.value(), ones = Matrix<double>::Ones(3, 3);
  EXPECT_TRUE(g[0].isApprox(ones * sv.transpose() + sv.transpose() * ones));
  g = tape.gradient(remat::mse_loss(x, x), {x});
  EXPECT_TRUE(g[0].isZero());
}

template <class Op>
void check_broadcast(Op op, remat::Index ar, remat::Index ac, remat::Index br, remat::Index bc, unsigned seed) {
  const Matrix<double> A = rnd<double>(ar, ac, seed), B = (rnd<double>(br, bc, seed + 1).array() + 2.0).matrix();
  Tape<double> tape;
  auto a = tape.variable(A), b = tape.variable(B);
  auto y = op(a, b);
  const remat::Index m = std::max(ar, br), n = std::max(ac, bc);
  ASSERT_EQ(y.rows(), m);
  ASSERT_EQ(y.cols(), n);
  auto W = rnd<double>(m, n, seed + 2);
  auto loss = remat::sum(y * tape.constant(W));
  tape.backward(loss);
  // finite differences
  auto f = [&](const Matrix<double>& AA, const Matrix<double>& BB) {
    Tape<double> t;
    return remat::sum(op(t.constant(AA), t.constant(BB)) * t.constant(W)).item();
  };
  for (int which = 0; which < 2; ++which) {
    const Matrix<double>& base = which ? B : A;
    Matrix<double> grad = which ? Matrix<double>(b.grad()) : Matrix<double>(a.grad());
    ASSERT_EQ(grad.rows(), base.rows());
    ASSERT_EQ(grad.cols(), base.cols());
    for (remat::Index e = 0; e < base.size(); ++e) {
      Matrix<double> p = base, q = base;
      p.data()[e] += 1e-6;
      q.data()[e] -= 1e-6;
      const double fd = which ? (f(A, p) - f(A, q)) / 2e-6 : (f(p, B) - f(q, B)) / 2e-6;
      EXPECT_NEAR(grad.data()[e], fd, 1e-6 * (1 + std::abs(fd)))
          << "[" << ar << "," << ac << "] op [" << br << "," << bc << "] input " << which << " element " << e;
    }
  }
}

TEST(OpEdgeValues, BroadcastingEveryCombinationBothSidesMatchesFiniteDifferences) {
  const remat::Index shapes[][2] = {{1, 1}, {3, 1}, {1, 4}, {3, 4}};
  unsigned seed = 100;
  for (auto& sa : shapes)
    for (auto& sb : shapes) {
      const bool ok_rows = sa[0] == sb[0] || sa[0] == 1 || sb[0] == 1;
      const bool ok_cols = sa[1] == sb[1] || sa[1] == 1 || sb[1] == 1;
      if (!ok_rows || !ok_cols) continue;
      check_broadcast([](auto a, auto b) { return a + b; }, sa[0], sa[1], sb[0], sb[1], seed += 3);
      check_broadcast([](auto a, auto b) { return a - b; }, sa[0], sa[1], sb[0], sb[1], seed += 3);
      check_broadcast([](auto a, auto b) { return a * b; }, sa[0], sa[1], sb[0], sb[1], seed += 3);
      check_broadcast([](auto a, auto b) { return a / b; }, sa[0], sa[1], sb[0], sb[1], seed += 3);
    }
  // [m,1] with [1,n], both orders, non-square, and incompatible shapes
  check_broadcast([](auto a, auto b) { return a * b; }, 5, 1, 1, 2, 7);
  check_broadcast([](auto a, auto b) { return a / b; }, 1, 2, 5, 1, 8);
  Tape<float> t;
  EXPECT_THROW(t.variable(rnd<float>(2, 3, 1)) + t.variable(rnd<float>(3, 2, 1)), remat::shape_error);
  EXPECT_THROW(t.variable(rnd<float>(2, 3, 1)) * t.variable(rnd<float>(2, 2, 1)), remat::shape_error);
  EXPECT_THROW(t.variable(rnd<float>(2, 3, 1)) / t.variable(rnd<float>(1, 2, 1)), remat::shape_error);
}

TEST(OpEdgeValues, OneByOneEverything) {
  Tape<double> tape;
  auto x = tape.variable(Matrix<double>::Constant(1, 1, 0.3));
  auto w = tape.variable(Matrix<double>::Constant(1, 1, -0.7));
  auto g = tape.variable(Matrix<double>::Constant(1, 1, 1.5));
  auto b = tape.variable(Matrix<double>::Constant(1, 1, 0.2));
  Var<double> h = remat::linear(x, w, b);
  h = remat::layer_norm(h, g, b);  // one column: zero variance, output = bias
  EXPECT_DOUBLE_EQ(h.item(), 0.2);
  auto s = remat::softmax(x);
  EXPECT_DOUBLE_EQ(s.item(), 1.0);
  auto ls = remat::log_softmax(x);
  EXPECT_DOUBLE_EQ(ls.item(), 0.0);
  auto ce = remat::cross_entropy(x, {0});  // one class: loss 0, gradient 0
  EXPECT_DOUBLE_EQ(ce.item(), 0.0);
  auto loss = remat::sum(h) + remat::mean(s) + ce + remat::sum_rows(ls) + remat::mse_loss(x, w) +
              remat::sum(remat::dropout(x, 0.0));
  tape.backward(loss);
  EXPECT_TRUE(x.grad().allFinite());
  // d/dx: layer_norm term 0, softmax 0, ce 0, log_softmax 0, mse 2(x−w), dropout(p=0) 1
  EXPECT_NEAR(x.grad()(0, 0), 2 * (0.3 + 0.7) + 1, 1e-12);
  EXPECT_NEAR(g.grad()(0, 0), 0.0, 1e-12);
  EXPECT_NEAR(b.grad()(0, 0), 1.0, 1e-12);  // only through the layer_norm bias (linear's b feeds x̂ = 0)
}

TEST(OpEdgeValues, LayerNormOfConstantRowsHasFiniteGradients) {
  Tape<float> tape;
  auto x = tape.variable(Matrix<float>::Constant(3, 5, 7.25f));
  auto g = tape.variable(Matrix<float>::Ones(1, 5));
  auto b = tape.variable(Matrix<float>::Zero(1, 5));
  auto y = remat::layer_norm(x, g, b);
  EXPECT_TRUE(y.value().isZero());
  tape.backward(remat::sum(remat::sin(y + tape.constant(rnd<float>(3, 5, 3)))));
  EXPECT_TRUE(x.grad().allFinite());
  EXPECT_TRUE(g.grad().allFinite());
  EXPECT_THROW(remat::layer_norm(x, g, b, 0.0), remat::domain_error);
  EXPECT_THROW(remat::layer_norm(x, g, b, std::nan("")), remat::domain_error);
  EXPECT_THROW(remat::layer_norm(x, b, tape.variable(Matrix<float>::Zero(1, 4))), remat::shape_error);
}

TEST(OpEdgeValues, DropoutExtremes) {
  Tape<double> tape(7);
  auto x = tape.variable(rnd<double>(20, 20, 25));
  auto y0 = remat::dropout(x, 0.0);
  EXPECT_TRUE(same_bits(Matrix<double>(y0.value()), Matrix<double>(x.value())));
  const double almost = std::nextafter(1.0, 0.0);
  auto y1 = remat::dropout(x, almost);
  EXPECT_TRUE(y1.value().allFinite());
  auto loss = remat::sum(y0) + remat::sum(y1);
  tape.backward(loss);
  EXPECT_TRUE(x.grad().allFinite());
  EXPECT_THROW(remat::dropout(x, 1.0), remat::domain_error);
  EXPECT_THROW(remat::dropout(x, -1e-300), remat::domain_error);
  EXPECT_THROW(remat::dropout(x, std::nan("")), remat::domain_error);
  Tape<float> tf;
  auto xf = tf.variable(rnd<float>(8, 8, 26));
  auto yf = remat::dropout(xf, 1.0 - 1e-7);
  tf.backward(remat::sum(yf));
  EXPECT_TRUE(xf.grad().allFinite());
}

TEST(OpEdgeValues, LossErrorsNameOpAndShapes) {
  Tape<float> tape;
  auto x = tape.variable(rnd<float>(3, 4, 27));
  try {
    remat::mse_loss(x, tape.variable(rnd<float>(4, 3, 28)));
    FAIL();
  } catch (const remat::shape_error& e) {
    EXPECT_NE(std::string(e.what()).find("mse_loss"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("[3,4]"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("[4,3]"), std::string::npos);
  }
  EXPECT_THROW(remat::cross_entropy(x, {0, 1}), remat::shape_error);
  EXPECT_THROW(remat::cross_entropy(x, {0, 1, 4}), remat::index_error);
  EXPECT_THROW(remat::cross_entropy(x, {0, -1, 2}), remat::index_error);
  EXPECT_THROW(remat::checkpoint_name(x, ""), remat::domain_error);
  EXPECT_THROW(x / 0, remat::domain_error);
  EXPECT_THROW(remat::pow(x, INFINITY), remat::domain_error);
  EXPECT_THROW(remat::affine(x, NAN, 0.0), remat::domain_error);
  EXPECT_THROW(tape.variable(Matrix<float>(0, 3)), remat::shape_error);
  EXPECT_EQ(tape.size(), 2u);
  // The tape is intact: a backward still works.
  tape.backward(remat::cross_entropy(x, {3, 0, 1}));
  EXPECT_TRUE(x.grad().allFinite());
}

TEST(OpEdgeValues, NanAndInfPropagateWithoutCrashing) {
  Tape<double> tape;
  Matrix<double> v(2, 3);
  v << std::numeric_limits<double>::quiet_NaN(), 1, 2, INFINITY, -INFINITY, 0;
  auto x = tape.variable(v);
  auto y = remat::softmax(x) + remat::log_softmax(x) +
           remat::layer_norm(x, tape.constant(Matrix<double>::Ones(1, 3)), tape.constant(Matrix<double>::Zero(1, 3)));
  auto loss = remat::sum(y) + remat::cross_entropy(x, {1, 2}) + remat::sum(remat::gelu(x)) + remat::sum(remat::relu(x));
  ASSERT_NO_THROW(tape.backward(loss));
  EXPECT_TRUE(std::isnan(loss.item()));
  // an ordinary finite row is unaffected by a NaN row in row-wise ops
  Tape<double> t2;
  Matrix<double> w(2, 3);
  w << std::numeric_limits<double>::quiet_NaN(), 1, 2, 0.5, -0.5, 0.25;
  auto z = t2.variable(w);
  t2.backward(remat::sum(remat::softmax(z) * t2.constant(rnd<double>(2, 3, 29))));
  EXPECT_TRUE(z.grad().row(1).allFinite());
}

// Regression (NaN gradient): d/dx x^0 is 0, but pow's derivative p·x^(p−1) evaluates 0·0^(−1) = 0·inf = NaN at x = 0.
TEST(OpEdgeValues, PowZeroExponentHasZeroGradientAtZero) {
  Tape<double> tape;
  auto x = tape.variable(Matrix<double>::Zero(1, 2));
  tape.backward(remat::sum(remat::pow(x, 0.0)));
  EXPECT_TRUE(x.grad().isZero());
}

}  // namespace edge_values_test
