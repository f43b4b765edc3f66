// Exact memory of W2 (bench/workloads.hpp) at reduced size (the rules of docs/design.md §2) with one checkpoint region
// per block: saved bytes after the forward pass, peak bytes, replayed bytes and ops, each against a formula written
// here from the shapes and the residuals each op documents, for nothing_saveable, dots_saveable and
// everything_saveable.
#include <gtest/gtest.h>

#include <functional>
#include <iostream>
#include <vector>

#include "checkpoint_support.hpp"
#include "remat/remat.hpp"

// Named after the file: this directory's test files are compiled as one translation unit (tests/CMakeLists.txt).
namespace memory_test {

using checkpoint_test::BitwiseEqual;
using checkpoint_test::random_matrix;
using remat::Matrix;
using remat::Parameter;
using remat::Tape;
using remat::Var;

// W2 reduced: B blocks h ← h + Linear(F→D)(gelu(Linear(D→F)(layer_norm(h)))) over an M × D input; head
// layer_norm → Linear(D→C) → cross-entropy.
constexpr std::size_t B = 4, M = 64, D = 32, F = 128, C = 10;

enum class Wrap { none, nothing, dots, everything };

struct Measured {
  std::size_t saved_after_forward = 0;
  std::size_t live_after_forward = 0;
  std::size_t peak = 0;
  std::size_t replayed_bytes = 0;
  std::size_t replayed_ops = 0;
  std::size_t saved_after_backward = 0;
  std::size_t live_after_backward = 0;
};

/// The weights are Parameters, referenced by the tape and not counted in its figures, so every counted
/// byte below is an activation, an op's extra buffer or a gradient.
template <class T>
struct W2 {
  struct Block {
    Parameter<T> gain, bias, w1, b1, w2, b2;
  };
  std::vector<Block> blocks;
  Parameter<T> gain, bias, w_out, b_out;
  Matrix<T> input;
  std::vector<int> labels;

  W2() {
    for (std::size_t l = 0; l < B; ++l)
      blocks.push_back(
          {Parameter<T>(Matrix<T>::Ones(1, D)), Parameter<T>(random_matrix<T>(1, D, 10 + l, 0.1)),
           Parameter<T>(random_matrix<T>(D, F, 20 + l, 0.2)), Parameter<T>(random_matrix<T>(1, F, 30 + l, 0.1)),
           Parameter<T>(random_matrix<T>(F, D, 40 + l, 0.1)), Parameter<T>(random_matrix<T>(1, D, 50 + l, 0.1))});
    gain = Parameter<T>(Matrix<T>::Ones(1, D));
    bias = Parameter<T>(Matrix<T>::Zero(1, D));
    w_out = Parameter<T>(random_matrix<T>(D, C, 60, 0.2));
    b_out = Parameter<T>(Matrix<T>::Zero(1, C));
    input = random_matrix<T>(M, D, 70);
    for (std::size_t i = 0; i < M; ++i) labels.push_back(static_cast<int>((i * 7) % C));
  }

  template <class Policy>
  static Var<T> wrap(Wrap w, const Policy& policy, const std::function<Var<T>(Var<T>)>& f, Var<T> h) {
    return w == Wrap::none ? f(h) : remat::checkpoint(f, policy)(h);
  }

  void zero_grad() {
    for (Block& b : blocks)
      for (Parameter<T>* p : {&b.gain, &b.bias, &b.w1, &b.b1, &b.w2, &b.b2}) p->zero_grad();
    for (Parameter<T>* p : {&gain, &bias, &w_out, &b_out}) p->zero_grad();
  }

  Measured run(Wrap w, std::vector<Matrix<T>>* gradients) {
    using namespace remat::policies;
    zero_grad();  // Parameters accumulate gradients across backward passes
    Tape<T> tape;
    std::vector<Var<T>> params;
    auto h = tape.constant(input);
    for (Block& b : blocks) {
      Var<T> g = tape.variable(b.gain), be = tape.variable(b.bias), w1 = tape.variable(b.w1), b1 = tape.variable(b.b1),
             w2 = tape.variable(b.w2), b2 = tape.variable(b.b2);
      for (const auto& p : {g, be, w1, b1, w2, b2}) params.push_back(p);
      const std::function<Var<T>(Var<T>)> block = [&](Var<T> x) {
        return x + remat::linear(remat::gelu(remat::linear(remat::layer_norm(x, g, be), w1, b1)), w2, b2);
      };
      if (w == Wrap::dots)
        h = wrap(w, dots_saveable, block, h);
      else if (w == Wrap::everything)
        h = wrap(w, everything_saveable, block, h);
      else
        h = wrap(w, nothing_saveable, block, h);
    }
    Var<T> g = tape.variable(gain), be = tape.variable(bias), wo = tape.variable(w_out), bo = tape.variable(b_out);
    for (const auto& p : {g, be, wo, bo}) params.push_back(p);
    auto loss = remat::cross_entropy(remat::linear(remat::layer_norm(h, g, be), wo, bo), labels);
    h = Var<T>();  // the user keeps only the loss: what is live now is what backward needs
    Measured m;
    m.saved_after_forward = tape.memory().saved_bytes;
    m.live_after_forward = tape.memory().live_bytes;
    tape.backward(loss);
    m.peak = tape.memory().peak_bytes;
    m.replayed_bytes = tape.memory().replayed_bytes;
    m.replayed_ops = tape.memory().replayed_ops;
    if (gradients)
      for (const auto& p : params) gradients->emplace_back(p.grad());
    m.saved_after_backward = tape.memory().saved_bytes;
    m.live_after_backward = tape.memory().live_bytes;
    return m;
  }
};

template <class T>
class Memory : public ::testing::Test {};
TYPED_TEST_SUITE(Memory, checkpoint_test::Scalars);

TYPED_TEST(Memory, W2PerBlockExactSavedPeakAndReplayedBytes) {
  using T = TypeParam;
  constexpr std::size_t s = sizeof(T);
  // Residuals each op documents: layer_norm reads x and gain, plus its extra [M,2] (row mean, 1/σ);
  // linear reads x and W; gelu reads its input; the residual add reads nothing; cross_entropy keeps the
  // softmax [M,C] as its extra. Gain and W are Parameters (not counted).
  const std::size_t head = (M * D     // head layer_norm input h_B
                            + M * 2   // its row statistics
                            + M * D   // its output, read by the head linear
                            + M * C)  // cross_entropy's softmax
                           * s;
  const std::size_t block_inputs = B * M * D * s;  // h_0 (the input) .. h_{B-1}, each a region input
  // Per block without checkpoint: h_i (layer_norm), its statistics, layer_norm output (linear 1),
  // linear 1 output (gelu), gelu output (linear 2).
  const std::size_t block_plain = (M * D + M * 2 + M * D + M * F + M * F) * s;
  // What a per-block nothing_saveable replay regenerates: layer_norm (output + statistics), linear 1 and
  // gelu; linear 2's output is read by no backward (the add reads nothing), so it is not replayed.
  const std::size_t block_replayed = (M * D + M * 2 + M * F + M * F) * s;
  // The tape computes a Parameter's gradient in a buffer of its own until the sweep reaches the
  // Parameter's node, then hands the buffer over to the Parameter (it leaves the tape's figures).
  const std::size_t parameter_gradients =
      (B * (D + D + D * F + F + F * D + D) + (D + D + D * C + C)) * s;  // every gain, bias and weight
  // Activation gradients alive at once within one block: dh_{i+1}, d(linear 2), d(gelu), d(linear 1),
  // d(layer_norm), dh_i — an upper bound (the sweep frees each after its node), plus the loss value and
  // its gradient ([1,1] each).
  const std::size_t block_gradients = (4 * M * D + 2 * M * F) * s + 2 * s;

  W2<T> model;
  std::vector<Matrix<T>> g_plain, g_nothing, g_dots, g_everything;
  const Measured plain = model.run(Wrap::none, &g_plain);
  const Measured nothing = model.run(Wrap::nothing, &g_nothing);
  const Measured dots = model.run(Wrap::dots, &g_dots);
  const Measured everything = model.run(Wrap::everything, &g_everything);

  // No checkpoint.
  EXPECT_EQ(plain.saved_after_forward, B * block_plain + head);
  EXPECT_EQ(plain.replayed_ops, 0u);

  // nothing_saveable: block inputs plus the head's residuals; each block replays 3 ops.
  EXPECT_EQ(nothing.saved_after_forward, block_inputs + head);
  EXPECT_EQ(nothing.replayed_ops, 3 * B);
  EXPECT_EQ(nothing.replayed_bytes, B * block_replayed);
  // Peak (over forward and backward): at most what is saved, one block's replayed residuals, and the
  // gradients (at most all parameter gradients, plus one block's activation gradients).
  const std::size_t peak_bound = nothing.saved_after_forward + block_replayed + parameter_gradients + block_gradients;
  EXPECT_LE(nothing.peak, peak_bound);
  std::cout << "W2 reduced (B=" << B << ", M=" << M << ", D=" << D << ", F=" << F << ", " << s * 8
            << "-bit): saved after forward: plain " << plain.saved_after_forward << " B, nothing_saveable "
            << nothing.saved_after_forward << " B, dots_saveable " << dots.saved_after_forward << " B; peak: plain "
            << plain.peak << " B, nothing_saveable " << nothing.peak << " B (bound " << peak_bound << " B), dots "
            << dots.peak << " B\n";
  EXPECT_LT(nothing.peak, plain.peak);
  // and not vacuously: when the first block's replay has run, every block input, that block's replayed
  // residuals and the gradient flowing into it are live.
  EXPECT_GE(nothing.peak, block_inputs + block_replayed + M * D * s);

  // dots_saveable: block inputs plus the dot outputs a backward reads (linear 1's, read by gelu; linear 2's
  // output is read by nothing, so it is not kept); each block replays layer_norm and gelu.
  EXPECT_EQ(dots.saved_after_forward, block_inputs + B * M * F * s + head);
  EXPECT_EQ(dots.replayed_ops, 2 * B);
  EXPECT_EQ(dots.replayed_bytes, B * (M * D + M * 2 + M * F) * s);

  // everything_saveable: the same residuals as no checkpoint, nothing replayed.
  EXPECT_EQ(everything.saved_after_forward, plain.saved_after_forward);
  EXPECT_EQ(everything.replayed_ops, 0u);
  EXPECT_EQ(everything.replayed_bytes, 0u);
  EXPECT_EQ(everything.peak, plain.peak);

  // After the backward nothing is held for another one; what stays live is the loss value (the user's
  // handle): the gradients belong to the Parameters.
  for (const Measured* m : {&plain, &nothing, &dots, &everything}) {
    EXPECT_EQ(m->saved_after_backward, 0u);
    EXPECT_EQ(m->live_after_backward, s);
  }

  // And the gradients are the same bits.
  ASSERT_EQ(g_plain.size(), g_nothing.size());
  for (std::size_t k = 0; k < g_plain.size(); ++k) {
    EXPECT_TRUE(BitwiseEqual(g_plain[k], g_nothing[k])) << k;
    EXPECT_TRUE(BitwiseEqual(g_plain[k], g_dots[k])) << k;
    EXPECT_TRUE(BitwiseEqual(g_plain[k], g_everything[k])) << k;
  }
}

// Nested: pairs of blocks in an outer nothing_saveable region, each block in an inner nothing_saveable
// region. After the forward pass only the outer regions' inputs (h_0, h_2) and the head's residuals are
// saved; every inner region input that is not an outer input (h_1, h_3) is regenerated by the outer replay.
TYPED_TEST(Memory, NestedRegionsKeepOnlyOuterInputs) {
  using T = TypeParam;
  constexpr std::size_t s = sizeof(T);
  W2<T> model;
  Tape<T> tape;
  auto h = tape.constant(model.input);
  std::vector<std::function<Var<T>(Var<T>)>> blocks;
  std::vector<Var<T>> keep;
  for (auto& b : model.blocks) {
    Var<T> g = tape.variable(b.gain), be = tape.variable(b.bias), w1 = tape.variable(b.w1), b1 = tape.variable(b.b1),
           w2 = tape.variable(b.w2), b2 = tape.variable(b.b2);
    blocks.push_back(remat::checkpoint([=](Var<T> x) {
      return x + remat::linear(remat::gelu(remat::linear(remat::layer_norm(x, g, be), w1, b1)), w2, b2);
    }));
  }
  for (std::size_t i = 0; i < B; i += 2)
    h = remat::checkpoint([&, i](Var<T> x) { return blocks[i + 1](blocks[i](x)); })(h);
  Var<T> g = tape.variable(model.gain), be = tape.variable(model.bias), wo = tape.variable(model.w_out),
         bo = tape.variable(model.b_out);
  auto loss = remat::cross_entropy(remat::linear(remat::layer_norm(h, g, be), wo, bo), model.labels);
  h = Var<T>();
  const std::size_t head = (M * D + M * 2 + M * D + M * C) * s;
  EXPECT_EQ(tape.memory().saved_bytes, (B / 2) * M * D * s + head);
  tape.backward(loss);
  // Outer replay of a pair: block i's layer_norm, linear 1, gelu (its residuals are not needed at the outer
  // level, only its output h_{i+1}, an input of block i+1's inner region) — so block i's ops needed to
  // compute h_{i+1}: layer_norm, linear 1, gelu, linear 2, add (5 ops, statistics included). Then each
  // inner replay: 3 ops.
  const std::size_t outer = (M * D + M * 2 + M * F + M * F + M * D + M * D) * s;
  const std::size_t inner = (M * D + M * 2 + M * F + M * F) * s;
  EXPECT_EQ(tape.memory().replayed_ops, (B / 2) * 5 + B * 3);
  EXPECT_EQ(tape.memory().replayed_bytes, (B / 2) * outer + B * inner);
}

}  // namespace memory_test