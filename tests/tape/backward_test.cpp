// Backward behaviour of the tape: retain_graph, gradient() for a subset and for interior values,
// reuse with clear() over several steps, Vars outliving their tape, and two threads with their own
// tapes. float and double.
#include <gtest/gtest.h>

#include <cmath>
#include <thread>
#include <vector>

#include "gradcheck.hpp"
#include "random.hpp"
#include "remat/remat.hpp"

// Named after the file: this directory's test files are compiled as one translation unit (tests/CMakeLists.txt).
namespace backward_test {

using remat::Matrix;
using remat::Tape;
using remat::Var;

template <class T>
class BackwardTest : public ::testing::Test {};
using Scalars = ::testing::Types<float, double>;
TYPED_TEST_SUITE(BackwardTest, Scalars);

/// Class labels (2i + 1) mod cols.
std::vector<int> labels_for(remat::Index rows, remat::Index cols) {
  std::vector<int> labels;
  for (remat::Index i = 0; i < rows; ++i) labels.push_back(static_cast<int>((i * 2 + 1) % cols));
  return labels;
}

/// Gradients of a two-layer MLP step, computed by the tape: loss = cross_entropy(linear(tanh(linear(x,
/// W1, b1)), W2, b2), labels) (+ dropout with p = 0.1 between the layers when `dropout`).
template <class T>
struct MlpStep {
  Matrix<T> x, W1, b1, W2, b2;
  std::vector<int> labels;
  explicit MlpStep(std::uint64_t seed)
      : x(remat_test::random_matrix<T>(6, 5, seed)),
        W1(remat_test::random_matrix<T>(5, 8, seed + 1)),
        b1(remat_test::random_matrix<T>(1, 8, seed + 2)),
        W2(remat_test::random_matrix<T>(8, 3, seed + 3)),
        b2(remat_test::random_matrix<T>(1, 3, seed + 4)),
        labels(labels_for(6, 3)) {}

  /// Returns the loss value followed by the gradients of W1, b1, W2, b2 (flattened into one row each).
  std::vector<Matrix<T>> run(Tape<T>& tape, bool dropout) const {
    const auto xv = tape.constant(x);
    const auto w1 = tape.variable(W1), c1 = tape.variable(b1), w2 = tape.variable(W2), c2 = tape.variable(b2);
    auto h = remat::tanh(remat::linear(xv, w1, c1));
    if (dropout) h = remat::dropout(h, 0.1);
    const auto loss = remat::cross_entropy(remat::linear(h, w2, c2), labels);
    tape.backward(loss);
    return {Matrix<T>(loss.value()), Matrix<T>(w1.grad()), Matrix<T>(c1.grad()), Matrix<T>(w2.grad()),
            Matrix<T>(c2.grad())};
  }
};

TYPED_TEST(BackwardTest, RetainedBackwardsAccumulateAndRecomputeBitwise) {
  using T = TypeParam;
  Tape<T> tape;
  const auto x = tape.constant(remat_test::random_matrix<T>(4, 3, 1));
  const auto W = tape.variable(remat_test::random_matrix<T>(3, 5, 2));
  const auto b = tape.variable(remat_test::random_matrix<T>(1, 5, 3));
  const auto loss = remat::mean(remat::softplus(remat::layer_norm(remat::matmul(x, W), b, b)));
  tape.backward(loss, /*retain_graph=*/true);
  const Matrix<T> dW = W.grad(), db = b.grad();
  tape.backward(loss, /*retain_graph=*/true);
  // Variables accumulate (as PyTorch's .grad): the second backward added the same contributions again.
  EXPECT_TRUE(Matrix<T>(W.grad()).isApprox(Matrix<T>(2 * dW)));
  EXPECT_TRUE(Matrix<T>(b.grad()).isApprox(Matrix<T>(2 * db)));
  W.zero_grad();
  b.zero_grad();
  tape.backward(loss);  // the last one may free; after zero_grad it recomputes the same bits
  EXPECT_EQ(Matrix<T>(W.grad()), dW);
  EXPECT_EQ(Matrix<T>(b.grad()), db);
  EXPECT_THROW(tape.backward(loss), remat::freed_value_error);
}

TYPED_TEST(BackwardTest, GradientForASubsetEqualsBackward) {
  using T = TypeParam;
  Tape<T> tape;
  const auto x = tape.constant(remat_test::random_matrix<T>(4, 3, 4));
  const auto W1 = tape.variable(remat_test::random_matrix<T>(3, 5, 5));
  const auto W2 = tape.variable(remat_test::random_matrix<T>(5, 2, 6));
  const auto unused = tape.variable(remat_test::random_matrix<T>(2, 2, 7));
  const auto loss = remat::sum(remat::square(remat::matmul(remat::sigmoid(remat::matmul(x, W1)), W2)));
  tape.backward(loss, true);
  const Matrix<T> dW1 = W1.grad(), dW2 = W2.grad();
  const auto only_W2 = tape.gradient(loss, {W2}, true);
  ASSERT_EQ(only_W2.size(), 1u);
  EXPECT_EQ(only_W2[0], dW2);
  const auto both = tape.gradient(loss, {W1, unused, W2});
  ASSERT_EQ(both.size(), 3u);
  EXPECT_EQ(both[0], dW1);
  EXPECT_EQ(both[1], (Matrix<T>::Zero(2, 2))) << "a variable the loss does not depend on has a zero gradient";
  EXPECT_EQ(both[2], dW2);
}

TYPED_TEST(BackwardTest, GradientForAnInteriorValue) {
  using T = TypeParam;
  Tape<T> tape;
  const auto x = tape.constant(remat_test::random_matrix<T>(3, 4, 8));
  const auto W = tape.variable(remat_test::random_matrix<T>(4, 2, 9));
  const auto h = remat::tanh(remat::matmul(x, W));
  const Matrix<T> c = remat_test::random_matrix<T>(3, 2, 10);
  // loss = Σ (h ⊙ c)² : d loss / d h = 2 h ⊙ c².
  const auto loss = remat::sum(remat::square(h * tape.constant(c)));
  const auto g = tape.gradient(loss, {h, W});
  ASSERT_EQ(g.size(), 2u);
  const Matrix<T> hv = h.value();
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 2; ++j)
      EXPECT_NEAR(static_cast<double>(g[0](i, j)), 2.0 * hv(i, j) * c(i, j) * c(i, j),
                  1e-5 * (1 + std::abs(g[0](i, j))));
  // dW = xᵀ (dh ⊙ (1 − h²)).
  const Matrix<T> expected = x.value().transpose() * (g[0].array() * (T(1) - hv.array().square())).matrix();
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 2; ++j) EXPECT_NEAR(static_cast<double>(g[1](i, j)), static_cast<double>(expected(i, j)), 1e-5);
  EXPECT_THROW(h.grad(), remat::tape_error) << "gradient() does not leave a gradient on an interior value";
}

TYPED_TEST(BackwardTest, GradientForAConstantIsRejected) {
  using T = TypeParam;
  Tape<T> tape;
  const auto x = tape.constant(remat_test::random_matrix<T>(2, 2, 11));
  const auto W = tape.variable(remat_test::random_matrix<T>(2, 2, 12));
  const auto loss = remat::sum(remat::matmul(x, W));
  EXPECT_THROW(tape.gradient(loss, {x}), remat::tape_error);
  EXPECT_EQ(tape.gradient(loss, {W})[0].rows(), 2) << "the tape is usable after the rejection";
}

TYPED_TEST(BackwardTest, ClearReuseOverSeveralStepsMatchesFreshTapes) {
  using T = TypeParam;
  Tape<T> reused(7);
  for (std::uint64_t step = 0; step < 5; ++step) {
    const MlpStep<T> problem(100 * step);
    const auto got = problem.run(reused, false);
    reused.clear();
    Tape<T> fresh(7);
    const auto expected = problem.run(fresh, false);
    ASSERT_EQ(got.size(), expected.size());
    for (std::size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], expected[i]) << "step " << step << " item " << i;
  }
}

TYPED_TEST(BackwardTest, VarsOutlivingTheirTape) {
  using T = TypeParam;
  Var<T> leaf, interior, loss;
  {
    Tape<T> tape;
    leaf = tape.variable(Matrix<T>::Ones(2, 3));
    interior = remat::exp(leaf);
    loss = remat::sum(interior);
    tape.backward(loss);
  }
  for (const Var<T>* v : {&leaf, &interior, &loss}) {
    EXPECT_FALSE(v->valid());
    EXPECT_THROW(v->value(), remat::tape_error);
    EXPECT_THROW(v->shape(), remat::tape_error);
    EXPECT_THROW(remat::tanh(*v), remat::tape_error);
  }
  EXPECT_THROW(leaf.grad(), remat::tape_error);
  EXPECT_THROW(remat::matmul(leaf, interior), remat::tape_error);
  // Copying, assigning and destroying handles of a dead tape is fine (ASan checks no use after free).
  Var<T> copy = interior;
  copy = leaf;
  Var<T> moved = std::move(copy);
  EXPECT_FALSE(moved.valid());
}

TYPED_TEST(BackwardTest, TwoThreadsWithTheirOwnTapesMatchASerialRun) {
  using T = TypeParam;
  constexpr int steps = 20;
  auto run = [](std::uint64_t seed, std::vector<std::vector<Matrix<T>>>& out) {
    Tape<T> tape(seed);
    for (int s = 0; s < steps; ++s) {
      out.push_back(MlpStep<T>(seed + 10 * static_cast<std::uint64_t>(s)).run(tape, true));
      tape.clear();
    }
  };
  std::vector<std::vector<Matrix<T>>> serial_a, serial_b, parallel_a, parallel_b;
  run(1000, serial_a);
  run(2000, serial_b);
  std::thread a([&] { run(1000, parallel_a); });
  std::thread b([&] { run(2000, parallel_b); });
  a.join();
  b.join();
  ASSERT_EQ(parallel_a.size(), static_cast<std::size_t>(steps));
  ASSERT_EQ(parallel_b.size(), static_cast<std::size_t>(steps));
  for (int s = 0; s < steps; ++s)
    for (std::size_t i = 0; i < serial_a[0].size(); ++i) {
      EXPECT_EQ(parallel_a[s][i], serial_a[s][i]) << "thread a, step " << s << " item " << i;
      EXPECT_EQ(parallel_b[s][i], serial_b[s][i]) << "thread b, step " << s << " item " << i;
    }
  EXPECT_NE(serial_a[0][1], serial_b[0][1]) << "the two threads do different work";
}

TEST(Backward, MlpStepPassesGradcheck) {
  // The step used above is differentiated correctly (dropout mask fixed by the tape seed).
  const auto result = remat_test::gradcheck(
      [](Tape<double>& tape, const std::vector<Var<double>>& v) {
        const auto xv = tape.constant(remat_test::random_matrix(6, 5, 1));
        const auto h = remat::dropout(remat::tanh(remat::linear(xv, v[0], v[1])), 0.1);
        return remat::cross_entropy(remat::linear(h, v[2], v[3]), labels_for(6, 3));
      },
      {remat_test::random_matrix(5, 8, 2), remat_test::random_matrix(1, 8, 3), remat_test::random_matrix(8, 3, 4),
       remat_test::random_matrix(1, 3, 5)});
  EXPECT_TRUE(remat_test::passes(result));
}

}  // namespace backward_test