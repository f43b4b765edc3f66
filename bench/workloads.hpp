// The reference workloads of docs/design.md §6 (W0, W1, W1-small, W2): shapes, data and FLOP counts,
// shared by every implementation in the benchmark so that all of them run exactly the same step.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include <remat/matrix.hpp>

namespace bench {

using remat::Index;
template <class T>
using Matrix = remat::Matrix<T>;

/// An MLP: input → `layers` hidden layers tanh(x·W + b) of width `hidden` → linear `output` logits →
/// softmax cross-entropy (mean over the batch). "16 hidden layers" = 16 (linear, tanh) pairs.
struct MlpShape {
  Index input, hidden, layers, output, batch;
};

/// A stack of pre-norm MLP blocks h ← h + Linear(F→D)(gelu(Linear(D→F)(layer_norm(h)))), then
/// layer_norm → Linear(D→classes) → cross-entropy.
struct BlockShape {
  Index model, inner, blocks, classes, batch;
};

struct W0 {
  static constexpr const char* name = "W0";
  static constexpr MlpShape shape{32, 32, 64, 10, 16};
};
struct W1 {
  static constexpr const char* name = "W1";
  static constexpr MlpShape shape{784, 1024, 16, 10, 512};
};
struct W1Small {
  static constexpr const char* name = "W1-small";
  static constexpr MlpShape shape{784, 256, 4, 10, 64};
};
struct W2 {
  static constexpr const char* name = "W2";
  static constexpr BlockShape shape{256, 1024, 8, 10, 2048};
};

template <class W>
inline constexpr bool is_mlp = std::is_same_v<std::decay_t<decltype(W::shape)>, MlpShape>;

/// Number of checkpoint_sequential segments for a chain of `layers`: round(√layers).
inline int sqrt_segments(Index layers) { return static_cast<int>(std::lround(std::sqrt(static_cast<double>(layers)))); }

/// Weights of one affine map x·W + b; W: [in, out], b: [1, out].
struct Affine {
  Matrix<float> weight, bias;
};

/// Everything one step reads: inputs N(0,1), labels uniform, PyTorch-style U(±1/√fan_in) weights,
/// layer-norm gains 1 + U(±0.1) and biases U(±0.1) (not the trivial 1 and 0, so their gradients matter).
struct Data {
  Matrix<float> x;
  std::vector<int> labels;
  std::vector<Affine> affine;         // MLP: layers + 1 (output last); W2: 2 per block, then the head
  std::vector<Affine> norm;           // W2: one (gain, bias) per block, then the head's; MLP: empty
};

inline Affine random_affine(std::mt19937& rng, Index in, Index out) {
  const float bound = 1.0f / std::sqrt(static_cast<float>(in));
  std::uniform_real_distribution<float> u(-bound, bound);
  Affine a{Matrix<float>(in, out), Matrix<float>(1, out)};
  for (Index i = 0; i < a.weight.size(); ++i) a.weight.data()[i] = u(rng);
  for (Index i = 0; i < a.bias.size(); ++i) a.bias.data()[i] = u(rng);
  return a;
}

inline void fill_inputs(std::mt19937& rng, Data& d, Index batch, Index width, Index classes) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> label(0, static_cast<int>(classes) - 1);
  d.x.resize(batch, width);
  for (Index i = 0; i < d.x.size(); ++i) d.x.data()[i] = normal(rng);
  d.labels.resize(static_cast<std::size_t>(batch));
  for (int& l : d.labels) l = label(rng);
}

inline Data make_data(const MlpShape& s, std::uint32_t seed = 42) {
  std::mt19937 rng(seed);
  Data d;
  fill_inputs(rng, d, s.batch, s.input, s.output);
  Index in = s.input;
  for (Index l = 0; l < s.layers; ++l, in = s.hidden) d.affine.push_back(random_affine(rng, in, s.hidden));
  d.affine.push_back(random_affine(rng, s.hidden, s.output));
  return d;
}

inline Data make_data(const BlockShape& s, std::uint32_t seed = 42) {
  std::mt19937 rng(seed);
  Data d;
  fill_inputs(rng, d, s.batch, s.model, s.classes);
  std::uniform_real_distribution<float> u(-0.1f, 0.1f);
  auto norm = [&] {
    Affine a{Matrix<float>(1, s.model), Matrix<float>(1, s.model)};
    for (Index i = 0; i < s.model; ++i) {
      a.weight(0, i) = 1.0f + u(rng);
      a.bias(0, i) = u(rng);
    }
    return a;
  };
  for (Index b = 0; b < s.blocks; ++b) {
    d.norm.push_back(norm());
    d.affine.push_back(random_affine(rng, s.model, s.inner));
    d.affine.push_back(random_affine(rng, s.inner, s.model));
  }
  d.norm.push_back(norm());
  d.affine.push_back(random_affine(rng, s.model, s.classes));
  return d;
}

/// FLOPs of one training step (forward + backward, no recomputation): each GEMM of 2mkn FLOPs runs
/// once forward and twice backward (input and weight gradients; the first layer's input gradient is
/// not needed and not counted). Elementwise work is not counted. The same useful-work figure for every
/// implementation and policy, so GFLOP/s compares like with like.
inline double step_flops(const MlpShape& s) {
  auto gemm = [](Index m, Index k, Index n) { return 2.0 * double(m) * double(k) * double(n); };
  double f = 2 * gemm(s.batch, s.input, s.hidden);
  f += 3 * double(s.layers - 1) * gemm(s.batch, s.hidden, s.hidden);
  f += 3 * gemm(s.batch, s.hidden, s.output);
  return f;
}
inline double step_flops(const BlockShape& s) {
  auto gemm = [](Index m, Index k, Index n) { return 2.0 * double(m) * double(k) * double(n); };
  return 3 * double(s.blocks) * 2 * gemm(s.batch, s.model, s.inner) + 3 * gemm(s.batch, s.model, s.classes);
}

/// Sets the BLAS (and, through the LibTorch driver, intra-op) thread count for the current run.
void set_threads(int threads);

}  // namespace bench
