// The reference workloads of bench/README.md (W0, W1, W1-small, W2, W3, W5): shapes, data and FLOP counts,
// shared by every implementation in the benchmark so that all of them run exactly the same step.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <type_traits>
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

/// The byte-level GPT of docs/gpt.md: B sequences of S tokens, width H, `heads` heads, L blocks,
/// vocabulary V, no dropout.
struct GptShape {
  Index batch, seq_len, width, heads, blocks, vocabulary;
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

/// The workload where the S×S attention terms dominate activation memory (4 × 512 tokens, H 256,
/// 4 heads, 4 blocks, V 256; float32). The same numbers as bench/peers/gpt_pytorch.py's W3.
struct W3 {
  static constexpr const char* name = "W3";
  static constexpr GptShape shape{4, 512, 256, 4, 4, 256};
};

/// An unrolled LSTM (bench/lstm_step.cpp): `steps` timesteps of the standard cell over inputs x_t [batch, input],
/// gates = x_t·W_ih + b + h·W_hh ([batch, 4·hidden], in PyTorch's order i, f, g, o), i, f, o = σ(…), g = tanh(…),
/// c = f⊙c + i⊙g, h = o⊙tanh(c), from h = c = 0; then Linear(hidden→classes) on the last h and softmax
/// cross-entropy (mean over the batch): a sequence classifier.
struct LstmShape {
  Index batch, steps, input, hidden, classes;
};

/// The recurrent workload of issue 44 (batch 16, 48 steps, input 128, hidden 128, 10 classes; float32).
struct W5 {
  static constexpr const char* name = "W5";
  static constexpr LstmShape shape{16, 48, 128, 128, 10};
};
/// W5-large (bench/README.md: batch 32, 64 steps, hidden 256, input 64), the larger
/// LSTM of issue 44, with W5's classifier head instead of its byte vocabulary.
struct W5Large {
  static constexpr const char* name = "W5-large";
  static constexpr LstmShape shape{32, 64, 64, 256, 10};
};

template <class W>
inline constexpr bool is_gpt = std::is_same_v<std::decay_t<decltype(W::shape)>, GptShape>;

template <class W>
inline constexpr bool is_mlp = std::is_same_v<std::decay_t<decltype(W::shape)>, MlpShape>;

/// Number of checkpoint_sequential segments for a chain of `layers`: round(√layers).
inline int sqrt_segments(Index layers) {
  return static_cast<int>(std::lround(std::sqrt(static_cast<double>(layers))));
}

/// Weights of one affine map x·W + b; W: [in, out], b: [1, out].
struct Affine {
  Matrix<float> weight, bias;
};

/// Everything one step reads: inputs N(0,1), labels uniform, PyTorch-style U(±1/√fan_in) weights,
/// layer-norm gains 1 + U(±0.1) and biases U(±0.1) (not the trivial 1 and 0, so their gradients matter).
struct Data {
  Matrix<float> x;
  std::vector<int> labels;
  std::vector<Affine> affine;  // MLP: layers + 1 (output last); W2: 2 per block, then the head
  std::vector<Affine> norm;    // W2: one (gain, bias) per block, then the head's; MLP: empty
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

/// W3's inputs: fixed ids, not random, so that remat, LibTorch and the PyTorch peer (and
/// tests/gpt/make_reference.py) read the same tokens: ids[r] = (5r + 3) mod V, targets[r] = (5r + 8) mod V,
/// the ids shifted by one position. The parameters are docs/gpt.md's deterministic formula
/// (gpt::Model::deterministic), computed by each implementation.
struct GptData {
  std::vector<int> ids, targets;
};

inline GptData make_data(const GptShape& s) {
  GptData d;
  for (Index r = 0; r < s.batch * s.seq_len; ++r) {
    d.ids.push_back(static_cast<int>((5 * r + 3) % s.vocabulary));
    d.targets.push_back(static_cast<int>((5 * r + 8) % s.vocabulary));
  }
  return d;
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

/// Hand-counted forward FLOPs of W3-like GPTs, multiply-add = 2, N = B·S. Per block: qkv 2·N·H·3H,
/// proj 2·N·H·H, fc 2·N·H·4H, fc_proj 2·N·4H·H, scores 2·B·S·S·H and values 2·B·S·S·H (the whole S×S
/// square: remat's and PyTorch's kernels compute the causally masked half too); head 2·N·H·V. Layer norms,
/// softmax, gelu, embeddings and the loss are not counted. The same formula as
/// bench/peers/gpt_pytorch.py's forward_flops.
inline double forward_flops(const GptShape& s) {
  const double N = double(s.batch) * double(s.seq_len), H = double(s.width), S = double(s.seq_len);
  const double B = double(s.batch), V = double(s.vocabulary);
  const double block =
      2 * N * H * 3 * H + 2 * N * H * H + 2 * N * H * 4 * H + 2 * N * 4 * H * H + 2 * B * S * S * H + 2 * B * S * S * H;
  return double(s.blocks) * block + 2 * N * H * V;
}
/// A step (loss + all gradients) counted as 3 × forward (the PyTorch peer's convention): each product's
/// backward computes both operands' gradients, 2 × its forward — here every one is needed, since even the
/// first block's input leads to the embeddings. Recomputation is not counted: every mode does the same
/// useful work, so GFLOP/s compares the modes' step times.
inline double step_flops(const GptShape& s) {
  return 3 * forward_flops(s);
}

/// W5's data: the inputs x_t N(0,1), labels uniform, PyTorch's LSTM initialisation U(±1/√hidden) for every
/// weight and bias of the cell (one bias: PyTorch's b_ih + b_hh folded into one), U(±1/√hidden) for the head.
struct LstmData {
  std::vector<Matrix<float>> x;  // steps × [batch, input]
  std::vector<int> labels;
  Matrix<float> w_ih, w_hh, bias;  // [input, 4·hidden], [hidden, 4·hidden], [1, 4·hidden]
  Affine head;                     // [hidden, classes], [1, classes]
};

inline LstmData make_data(const LstmShape& s, std::uint32_t seed = 42) {
  std::mt19937 rng(seed);
  LstmData d;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (Index t = 0; t < s.steps; ++t) {
    Matrix<float> x(s.batch, s.input);
    for (Index i = 0; i < x.size(); ++i) x.data()[i] = normal(rng);
    d.x.push_back(std::move(x));
  }
  std::uniform_int_distribution<int> label(0, static_cast<int>(s.classes) - 1);
  d.labels.resize(static_cast<std::size_t>(s.batch));
  for (int& l : d.labels) l = label(rng);
  const float bound = 1.0f / std::sqrt(static_cast<float>(s.hidden));
  std::uniform_real_distribution<float> u(-bound, bound);
  auto uniform = [&](Index rows, Index cols) {
    Matrix<float> m(rows, cols);
    for (Index i = 0; i < m.size(); ++i) m.data()[i] = u(rng);
    return m;
  };
  d.w_ih = uniform(s.input, 4 * s.hidden);
  d.w_hh = uniform(s.hidden, 4 * s.hidden);
  d.bias = uniform(1, 4 * s.hidden);
  d.head = Affine{uniform(s.hidden, s.classes), uniform(1, s.classes)};
  return d;
}

/// GEMM FLOPs of one W5 step without recomputation: per timestep the two gate products (2·B·I·4H, 2·B·H·4H) once
/// forward and twice backward (h_0's gradient and x_t's are not needed: the first step's h·W_hh backward computes
/// only dW_hh, every x_t·W_ih only dW_ih), and the head's product three times. Elementwise work is not counted.
inline double step_flops(const LstmShape& s) {
  auto gemm = [](Index m, Index k, Index n) { return 2.0 * double(m) * double(k) * double(n); };
  const double ih = gemm(s.batch, s.input, 4 * s.hidden), hh = gemm(s.batch, s.hidden, 4 * s.hidden);
  return double(s.steps) * (2 * ih + 3 * hh) - hh + 3 * gemm(s.batch, s.hidden, s.classes);
}

/// Sets the BLAS (and, through the LibTorch driver, intra-op) thread count for the current run.
void set_threads(int threads);

}  // namespace bench
