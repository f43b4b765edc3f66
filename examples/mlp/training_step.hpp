// The MLP example's network and training step (docs/mlp.md), shared by main.cpp and by
// tests/alloc/steady_state_test.cpp, which checks that a steady training loop performs no heap
// allocation: the step keeps its Var vector across steps, and the network is recorded without
// std::function or per-step containers.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <remat/nn/adam.hpp>
#include <remat/nn/linear.hpp>
#include <remat/remat.hpp>

namespace mlp {

using remat::Var;

/// The settings the network and its recording depend on (main.cpp's Options extends them).
struct NetworkOptions {
  std::vector<int> hidden = {512, 512};
  std::string activation = "relu";
  double dropout = 0;
  std::string checkpoint = "none";
};

inline Var<float> activate(const std::string& activation, const Var<float>& z) {
  if (activation == "relu") return remat::relu(z);
  if (activation == "tanh") return remat::tanh(z);
  return remat::gelu(z);
}

/// Layer i of the network recorded on h's tape; `parameters` are W0, b0, W1, b1, …. Hidden layer
/// i < hidden.size() is h ← dropout(activation(h·Wi + bi)) (dropout only in training); layer
/// hidden.size() is the output layer h·W + b.
inline Var<float> layer(const NetworkOptions& o, const std::vector<Var<float>>& parameters, std::size_t i, Var<float> h,
                        bool training) {
  h = remat::linear(h, parameters[2 * i], parameters[2 * i + 1]);
  if (i == o.hidden.size()) return h;
  h = activate(o.activation, h);
  if (training && o.dropout > 0) h = remat::dropout(h, o.dropout);
  return h;
}

/// Records the network on x's tape and returns the logits [m, classes], with the --checkpoint mode in
/// training (evaluation records it plainly).
inline Var<float> forward(const NetworkOptions& o, const std::vector<Var<float>>& parameters, Var<float> x,
                          bool training) {
  const std::size_t hidden = o.hidden.size();
  auto hidden_layer = [&o, &parameters, training](std::size_t i) {
    return [&o, &parameters, training, i](Var<float> h) { return layer(o, parameters, i, h, training); };
  };
  if (!training || o.checkpoint == "none") {
    for (std::size_t i = 0; i <= hidden; ++i) x = layer(o, parameters, i, x, training);
    return x;
  }
  if (o.checkpoint == "layer" || o.checkpoint == "dots") {
    for (std::size_t i = 0; i < hidden; ++i) {
      if (o.checkpoint == "layer")
        x = remat::checkpoint(hidden_layer(i), remat::policies::nothing_saveable)(x);
      else
        x = remat::checkpoint(hidden_layer(i), remat::policies::dots_saveable)(x);
    }
    return layer(o, parameters, hidden, x, training);
  }
  if (o.checkpoint == "bf16" || o.checkpoint == "int8" || o.checkpoint == "sign") {
    // The whole network one region that keeps its residuals compressed (docs/compression.md): every one in bfloat16,
    // or in int8 with a scale per 64 elements; or (sign) the relus' outputs in one bit where only relu's backward
    // reads them (with dropout after them), everything else as it is. The logits, which it returns, as they are.
    auto network = [&o, &parameters, training, hidden](Var<float> h) {
      for (std::size_t i = 0; i <= hidden; ++i) h = layer(o, parameters, i, h, training);
      return h;
    };
    namespace policies = remat::policies;
    if (o.checkpoint == "sign") {
      // Built once: ops_named allocates its list, and a steady training step allocates nothing.
      static const auto relu_signs = policies::save_compressed(
          remat::Compression::sign(), policies::ops_named({"relu"}), policies::everything_saveable);
      return remat::checkpoint(network, relu_signs)(x);
    }
    const remat::Compression c =
        o.checkpoint == "bf16" ? remat::Compression::bf16() : remat::Compression::int8_per_group(64);
    return remat::checkpoint(network, policies::save_compressed(c, policies::everything_saveable))(x);
  }
  // sqrt: the whole network (hidden layers and the output layer, L layers) as one sequence split into
  // round(√L) segments of ⌈L/segments⌉ layers, EVERY segment a nothing_saveable region, so only the
  // segment boundaries stay (Chen et al. 2016). checkpoint_sequential (PyTorch semantics) leaves the
  // last segment unchecked; for 8×1024 that keeps 54% of `none` instead of 32% (docs/mlp.md).
  const std::size_t layers = hidden + 1;
  const auto segments = std::max<std::size_t>(1, std::lround(std::sqrt(static_cast<double>(layers))));
  const std::size_t size = (layers + segments - 1) / segments;
  for (std::size_t begin = 0; begin < layers; begin += size) {
    const std::size_t end = std::min(layers, begin + size);
    auto segment = [&o, &parameters, training, begin, end](Var<float> h) {
      for (std::size_t i = begin; i < end; ++i) h = layer(o, parameters, i, h, training);
      return h;
    };
    x = remat::checkpoint(segment, remat::policies::nothing_saveable)(x);
  }
  return x;
}

/// Rows of `logits` whose largest entry is at the label labels[first + row].
inline int count_correct(const remat::MatrixView<float>& logits, const std::vector<int>& labels, std::size_t first) {
  int correct = 0;
  for (remat::Index i = 0; i < logits.rows(); ++i) {
    remat::Index best;
    logits.row(i).maxCoeff(&best);
    correct += best == labels[first + static_cast<std::size_t>(i)];
  }
  return correct;
}

/// One training step: record the parameters and the network with the --checkpoint mode, cross_entropy,
/// zero_grad, backward, the Adam step. Keeps its Var vector across steps, so that once the tape's pool
/// holds every buffer size (after the first step of each batch shape) a step allocates nothing.
class TrainingStep {
 public:
  struct Result {
    float loss = 0;               ///< the batch's mean cross-entropy
    int correct = 0;              ///< rows classified correctly (before the update)
    std::size_t saved_bytes = 0;  ///< tape.memory().saved_bytes after the forward pass
    std::size_t peak_bytes = 0;   ///< tape.memory().peak_bytes after backward
  };

  /// What record() records: the logits [m, classes] (read after backward for the accuracy) and the loss.
  struct Recorded {
    Var<float> logits, loss;
  };

  /// How run() runs the backward pass by default: tape.backward(loss).
  struct PlainBackward {
    void operator()(remat::Tape<float>& tape, const Var<float>& loss) const { tape.backward(loss); }
  };

  /// Clears `tape`, seeds its dropout stream with `dropout_seed`, records the network on the batch
  /// (x: [m, inputs], labels: m class ids), calls `backward(tape, loss)` (a data-parallel run also waits
  /// there for the averaged gradients: examples::DataParallel::backward), then sets Adam's learning rate
  /// (if given) and steps.
  template <class Derived, class Backward = PlainBackward>
  Result run(remat::Tape<float>& tape, const NetworkOptions& o, std::vector<remat::nn::Linear<float>>& layers,
             remat::nn::Adam<float>& adam, const Eigen::MatrixBase<Derived>& x, const std::vector<int>& labels,
             std::uint64_t dropout_seed, std::optional<double> learning_rate, Backward backward = {}) {
    tape.clear();
    tape.seed(dropout_seed);
    const auto [logits, loss] = record(tape, o, layers, x, labels);
    Result r;
    r.saved_bytes = tape.memory().saved_bytes;
    adam.zero_grad();
    backward(tape, loss);  // adds into the parameters' gradients
    r.peak_bytes = tape.memory().peak_bytes;
    // Read before the update: under a memory budget an evicted value is regenerated from the Parameters.
    r.loss = loss.item();
    r.correct = count_correct(logits.value(), labels, 0);
    if (learning_rate) adam.set_learning_rate(*learning_rate);
    adam.step();
    return r;
  }

  /// The forward pass of run() on `tape`: the parameters (held until the next record), the network in
  /// training mode with the --checkpoint mode, and the loss. On a shapes-only tape this is the step that
  /// `mlp --estimate` counts (remat::estimate_memory); `x` is then never read.
  template <class Derived>
  Recorded record(remat::Tape<float>& tape, const NetworkOptions& o, std::vector<remat::nn::Linear<float>>& layers,
                  const Eigen::MatrixBase<Derived>& x, const std::vector<int>& labels) {
    parameters_.resize(2 * layers.size());
    for (std::size_t i = 0; i < layers.size(); ++i) {
      parameters_[2 * i] = tape.variable(layers[i].weight);
      parameters_[2 * i + 1] = tape.variable(layers[i].bias);
    }
    Var<float> logits = forward(o, parameters_, tape.constant(x), true);
    Var<float> loss = remat::cross_entropy(logits, labels);
    return {std::move(logits), std::move(loss)};
  }

 private:
  std::vector<Var<float>> parameters_;
};

}  // namespace mlp
