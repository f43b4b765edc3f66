// Exact byte counts from Tape::memory() on small graphs, derived by hand in each test from the memory
// rules (docs/design.md §2): a value lives while a handle or a pending backward needs it; each op declares
// which of its inputs/output its backward reads, plus an op-specific extra buffer. float and double.
// Also memory() against the residuals JAX's checkpoint would keep for checkpointed MLPs (ResidualBytes).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "memory.hpp"
#include "random.hpp"
#include "remat/remat.hpp"

// Named after the file: this directory's test files are compiled as one translation unit (tests/CMakeLists.txt).
namespace memory_test {

using remat::Matrix;
using remat::Tape;
using remat::Var;
using remat_test::bytes;
using remat_test::describe;

template <class T>
class MemoryTest : public ::testing::Test {};
using Scalars = ::testing::Types<float, double>;
TYPED_TEST_SUITE(MemoryTest, Scalars);

// m = 4 rows, k = 3 inputs, n = 5 outputs: distinct sizes so that a wrong buffer shows as a wrong sum.
constexpr remat::Index m = 4, k = 3, n = 5;

TYPED_TEST(MemoryTest, TanhLayerOnAConstantInputKeepsInputAndOutputOnly) {
  using T = TypeParam;
  Tape<T> tape;
  const auto x = tape.constant(remat_test::random_matrix<T>(m, k, 1));
  const auto W = tape.variable(remat_test::random_matrix<T>(k, n, 2));
  const auto b = tape.variable(remat_test::random_matrix<T>(1, n, 3));
  EXPECT_EQ(tape.memory().live_bytes, bytes<T>(m, k) + bytes<T>(k, n) + bytes<T>(1, n));
  EXPECT_EQ(tape.memory().saved_bytes, 0u) << "no op recorded yet, so no residual";

  const auto y = remat::tanh(remat::matmul(x, W) + b);
  {
    const auto s = tape.memory();
    SCOPED_TRACE(describe(s));
    // Residuals by need: x (dW = xᵀ·d(x·W) reads it) and tanh's output (its backward reads y). W would be
    // read only for dx, and x is a constant; add reads nothing; the pre-activations x·W and x·W + b lost
    // their handles at the ';'.
    EXPECT_EQ(s.saved_bytes, bytes<T>(m, k) + bytes<T>(m, n));
    // Live: the three leaves and y.
    EXPECT_EQ(s.live_bytes, bytes<T>(m, k) + bytes<T>(k, n) + bytes<T>(1, n) + bytes<T>(m, n));
    // Peak: the leaves and the three [m,n] results, all alive until the end of the expression.
    EXPECT_EQ(s.peak_bytes, bytes<T>(m, k) + bytes<T>(k, n) + bytes<T>(1, n) + 3 * bytes<T>(m, n));
    EXPECT_EQ(s.replayed_bytes, 0u);
    EXPECT_EQ(s.replayed_ops, 0u);
  }
  std::ostringstream report;
  tape.print_saved_residuals(report);
  EXPECT_NE(report.str().find("total " + std::to_string(tape.memory().saved_bytes) + " B"), std::string::npos)
      << report.str();

  const auto loss = remat::sum(y);  // [1,1], reads nothing in backward
  const std::size_t values = bytes<T>(m, k) + bytes<T>(k, n) + bytes<T>(1, n) + bytes<T>(m, n) + bytes<T>(1, 1);
  EXPECT_EQ(tape.memory().live_bytes, values);
  tape.backward(loss);
  {
    const auto s = tape.memory();
    SCOPED_TRACE(describe(s));
    EXPECT_EQ(s.saved_bytes, 0u) << "a freeing backward releases every residual";
    // Live: the values the user holds handles to, plus the gradients of the variables W and b.
    EXPECT_EQ(s.live_bytes, values + bytes<T>(k, n) + bytes<T>(1, n));
    // Peak, walking the sweep (gradients of interior values are freed once their node is swept):
    //  sum:    + dloss [1,1] + dy [m,n]                   then − dloss
    //  tanh:   + d(x·W + b) [m,n]                         then − dy
    //  add:    + d(x·W) [m,n] + db [1,n]                  then − d(x·W + b)   ← values + 2mn + n (+ dy gone)
    //  matmul: + dW [k,n] (x is a constant: no dx)        then − d(x·W)
    // The largest is after add: values + 2·[m,n] + [1,n] = mk + kn + 2n + 3mn + 1 elements, which with
    // m,k,n = 4,3,5 (98 elements) exceeds the forward peak (92) and the matmul step (93).
    const std::size_t backward_peak = values + 2 * bytes<T>(m, n) + bytes<T>(1, n);
    EXPECT_EQ(s.peak_bytes, backward_peak);
  }
  // The values the user holds are intact.
  EXPECT_EQ(y.rows(), m);
  EXPECT_NEAR(static_cast<double>(y.value()(0, 0)),
              std::tanh(static_cast<double>((x.value().row(0) * W.value().col(0))(0, 0) + b.value()(0, 0))), 1e-5);
}

TYPED_TEST(MemoryTest, ElementwiseChainDoesNotKeepIntermediates) {
  using T = TypeParam;
  Tape<T> tape;
  const auto x = tape.variable(remat_test::random_matrix<T>(m, n, 4));
  // sin reads x; exp reads its own output; square reads its input (exp's output); neg reads nothing.
  // So the residuals are x and e = exp(sin(x)); sin(x) and the result of square are not kept.
  const auto y = remat::neg(remat::square(remat::exp(remat::sin(x))));
  const auto s = tape.memory();
  SCOPED_TRACE(describe(s));
  EXPECT_EQ(s.saved_bytes, 2 * bytes<T>(m, n));
  EXPECT_EQ(s.live_bytes, 3 * bytes<T>(m, n)) << "x, e (a residual without a handle) and y";
  EXPECT_EQ(s.peak_bytes, 5 * bytes<T>(m, n)) << "x and four results alive until the end of the expression";
}

TYPED_TEST(MemoryTest, ConstantsOnlyGraphKeepsNothing) {
  using T = TypeParam;
  Tape<T> tape;
  const auto c = tape.constant(remat_test::random_matrix<T>(m, k, 5));
  const auto d = tape.constant(remat_test::random_matrix<T>(k, n, 6));
  const auto y = remat::cross_entropy(remat::tanh(remat::matmul(c, d)), std::vector<int>(m, 1));
  const auto s = tape.memory();
  SCOPED_TRACE(describe(s));
  EXPECT_EQ(s.saved_bytes, 0u) << "no backward will run through values that depend on no variable";
  EXPECT_EQ(s.live_bytes, bytes<T>(m, k) + bytes<T>(k, n) + bytes<T>(1, 1));
}

TYPED_TEST(MemoryTest, MatmulKeepsWhatTheGradientsThatAreWantedRead) {
  using T = TypeParam;
  auto saved = [](bool x_variable, bool w_variable) {
    Tape<T> tape;
    const auto xm = remat_test::random_matrix<T>(m, k, 1), wm = remat_test::random_matrix<T>(k, n, 2);
    const auto x = x_variable ? tape.variable(xm) : tape.constant(xm);
    const auto W = w_variable ? tape.variable(wm) : tape.constant(wm);
    const auto loss = remat::sum(remat::matmul(x, W));  // sum's backward reads nothing
    return tape.memory().saved_bytes;
  };
  EXPECT_EQ(saved(false, true), bytes<T>(m, k)) << "dW = xᵀ·g reads x only";
  EXPECT_EQ(saved(true, false), bytes<T>(k, n)) << "dx = g·Wᵀ reads W only";
  EXPECT_EQ(saved(true, true), bytes<T>(m, k) + bytes<T>(k, n));
  EXPECT_EQ(saved(false, false), 0u) << "no gradient wanted: nothing read";
}

// Fine-tuning the last layers of an MLP: layer 1 frozen (its weights are constants), layers 2 and 3 learn.
// Residuals by need, derived per op (m rows; widths k → n → n → c):
//   layer 1  h1 = tanh(x·W1 + b1): nothing requires a gradient, so nothing is read;
//   layer 2  h2 = tanh(linear(h1, W2, b2)): linear reads h1 (for dW2; dh1 is not wanted, so W2 is not read),
//            tanh reads its output h2;
//   layer 3  logits = linear(h2, W3, b3): reads h2 (dW3) and W3 (dh2, wanted because W2 learns);
//   cross_entropy reads its softmax [m,c].
// The same MLP with every layer learning also keeps x (for dW1) and W2 (for dh1).
TYPED_TEST(MemoryTest, FrozenLayerMlpKeepsOnlyWhatTheLearningLayersRead) {
  using T = TypeParam;
  constexpr remat::Index c = 2;
  auto saved = [](bool frozen) {
    Tape<T> tape;
    auto leaf = [&](const Matrix<T>& v, bool learns) { return learns ? tape.variable(v) : tape.constant(v); };
    const auto x = tape.constant(remat_test::random_matrix<T>(m, k, 30));
    const auto W1 = leaf(remat_test::random_matrix<T>(k, n, 31), !frozen), b1 = leaf(Matrix<T>::Zero(1, n), !frozen);
    const auto W2 = tape.variable(remat_test::random_matrix<T>(n, n, 32)), b2 = tape.variable(Matrix<T>::Zero(1, n));
    const auto W3 = tape.variable(remat_test::random_matrix<T>(n, c, 33)), b3 = tape.variable(Matrix<T>::Zero(1, c));
    const auto h1 = remat::tanh(remat::linear(x, W1, b1));
    const auto h2 = remat::tanh(remat::linear(h1, W2, b2));
    const auto loss = remat::cross_entropy(remat::linear(h2, W3, b3), {0, 1, 0, 1});
    return tape.memory().saved_bytes;
  };
  EXPECT_EQ(saved(true), bytes<T>(m, n) + bytes<T>(m, n) + bytes<T>(n, c) + bytes<T>(m, c)) << "h1, h2, W3, softmax";
  EXPECT_EQ(saved(false),
            bytes<T>(m, k) + bytes<T>(m, n) + bytes<T>(n, n) + bytes<T>(m, n) + bytes<T>(n, c) + bytes<T>(m, c))
      << "x, h1, W2, h2, W3, softmax (W1 is read only for dx, and x is a constant)";
}

TYPED_TEST(MemoryTest, CrossEntropyKeepsItsSoftmaxAsExtra) {
  using T = TypeParam;
  Tape<T> tape;
  const auto x = tape.constant(remat_test::random_matrix<T>(m, k, 7));
  const auto W = tape.variable(remat_test::random_matrix<T>(k, n, 8));
  const auto loss = remat::cross_entropy(remat::matmul(x, W), {0, 1, 2, 3});
  const auto s = tape.memory();
  SCOPED_TRACE(describe(s));
  // x for matmul's dW (x is a constant, so W is not read); the softmax [m,n] as cross_entropy's extra;
  // the logits are not kept.
  EXPECT_EQ(s.saved_bytes, bytes<T>(m, k) + bytes<T>(m, n));
  EXPECT_EQ(s.live_bytes, bytes<T>(m, k) + bytes<T>(k, n) + bytes<T>(m, n) + bytes<T>(1, 1));
  tape.backward(loss);
  EXPECT_EQ(tape.memory().saved_bytes, 0u);
  EXPECT_EQ(tape.memory().live_bytes, bytes<T>(m, k) + 2 * bytes<T>(k, n) + bytes<T>(1, 1))
      << "the extra is freed by the sweep; dW is kept";
}

TYPED_TEST(MemoryTest, LayerNormKeepsInputGainAndStatistics) {
  using T = TypeParam;
  Tape<T> tape;
  const auto x = tape.variable(remat_test::random_matrix<T>(m, n, 9));
  const auto gain = tape.variable(remat_test::random_matrix<T>(1, n, 10));
  const auto bias = tape.variable(remat_test::random_matrix<T>(1, n, 11));
  const auto y = remat::layer_norm(remat::tanh(x), gain, bias);
  const auto s = tape.memory();
  SCOPED_TRACE(describe(s));
  // tanh(x) is read by tanh's backward (its output) and by layer_norm's (its input): kept once.
  // gain is read by layer_norm's backward, bias is not; the statistics (μ, 1/σ) per row are [m,2].
  EXPECT_EQ(s.saved_bytes, bytes<T>(m, n) + bytes<T>(1, n) + bytes<T>(m, 2));
  EXPECT_EQ(s.live_bytes, 3 * bytes<T>(m, n) + 2 * bytes<T>(1, n) + bytes<T>(m, 2)) << "x, tanh(x), y, gain, bias";
}

TYPED_TEST(MemoryTest, RetainGraphKeepsResidualsAndParametersAreNotCounted) {
  using T = TypeParam;
  Tape<T> tape;
  remat::Parameter<T> p(remat_test::random_matrix<T>(k, n, 12));
  const auto x = tape.constant(remat_test::random_matrix<T>(m, k, 13));
  const auto W = tape.variable(p);
  EXPECT_EQ(tape.memory().live_bytes, bytes<T>(m, k)) << "a Parameter is referenced, not copied";
  const auto loss = remat::sum(remat::sigmoid(remat::matmul(x, W)));
  // Residuals: x (W is referenced and not counted) and sigmoid's output.
  const std::size_t saved = bytes<T>(m, k) + bytes<T>(m, n);
  EXPECT_EQ(tape.memory().saved_bytes, saved);
  tape.backward(loss, /*retain_graph=*/true);
  EXPECT_EQ(tape.memory().saved_bytes, saved) << "retain_graph keeps every residual";
  // Live: x, the sigmoid output (no handle, kept as a residual) and the loss; dW is the Parameter's own.
  EXPECT_EQ(tape.memory().live_bytes, bytes<T>(m, k) + bytes<T>(m, n) + bytes<T>(1, 1));
  EXPECT_TRUE(p.has_grad());
  tape.backward(loss);
  EXPECT_EQ(tape.memory().saved_bytes, 0u);
  EXPECT_EQ(tape.memory().live_bytes, bytes<T>(m, k) + bytes<T>(1, 1));
}

TYPED_TEST(MemoryTest, ClearReusesThePoolWithoutNewAllocations) {
  using T = TypeParam;
  Tape<T> tape;
  auto step = [&](std::uint64_t seed) {
    const auto x = tape.constant(remat_test::random_matrix<T>(m, k, seed));
    const auto W = tape.variable(remat_test::random_matrix<T>(k, n, seed + 1));
    const auto b = tape.variable(remat_test::random_matrix<T>(1, n, seed + 2));
    const auto loss = remat::cross_entropy(remat::tanh(remat::linear(x, W, b)), {0, 1, 2, 3});
    tape.backward(loss);
    return Matrix<T>(W.grad());
  };
  // Every buffer the pool ever obtained from the system is either live or cached, so live + cached is
  // the total obtained; a step that allocates nothing new leaves it unchanged.
  auto total = [&] { return tape.memory().live_bytes + tape.memory().cached_bytes; };
  step(100);
  const std::size_t first_peak = tape.memory().peak_bytes;
  tape.clear();
  EXPECT_EQ(tape.memory().live_bytes, 0u);
  EXPECT_EQ(tape.memory().peak_bytes, 0u) << "clear() resets the peak to the live bytes";
  EXPECT_EQ(tape.size(), 0u);
  const std::size_t obtained = tape.memory().cached_bytes;
  EXPECT_GE(obtained, first_peak);
  for (std::uint64_t s = 200; s < 600; s += 100) {
    const Matrix<T> grad = step(s);
    EXPECT_EQ(total(), obtained) << "step " << s << " allocated from the system: " << describe(tape.memory());
    EXPECT_EQ(tape.memory().peak_bytes, first_peak) << "an identical step has an identical peak";
    tape.clear();
    EXPECT_EQ(tape.memory().cached_bytes, obtained);
  }
  tape.release_cached_memory();
  EXPECT_EQ(tape.memory().cached_bytes, 0u);
}

// ================================================================ residual bytes of checkpointed MLPs, by hand
// memory() against residual bytes computed by hand as JAX's checkpoint would save them: MLPs of two or three
// checkpointed layers with tanh, relu or gelu under dots_saveable, nothing_saveable and everything_saveable:
// saved bytes, replayed ops and replayed bytes.

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

// ---------------------------------------------------------------------------------------------------------------
// memory() against hand-computed JAX residuals. Every [8,16] float value = 512 B; Parameters count 0.
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

TEST(ResidualBytes, HandComputedResiduals) {
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

}  // namespace memory_test
