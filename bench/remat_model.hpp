// The workloads on a remat tape, one class per workload family, parametrised by the checkpoint variant.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <remat/remat.hpp>
#include <remat/schedule/checkpoint_sequential.hpp>

#include "hand_written.hpp"
#include "workloads.hpp"

namespace bench {

// ---- variants: how the chain of layers (W2: blocks) is recorded ----
struct Plain {
  static constexpr const char* name = "plain";
  template <class Layers, class V>
  static V run(const Layers& layers, V h) {
    for (const auto& layer : layers) h = layer(h);
    return h;
  }
};
/// Each layer (W2: each block) in its own checkpoint region with `Policy`.
template <class Policy>
struct PerLayer {
  static constexpr const char* name = std::is_same_v<Policy, remat::policies::NothingSaveable> ? "nothing_saveable"
                                      : std::is_same_v<Policy, remat::policies::DotsSaveable>  ? "dots_saveable"
                                                                                               : "everything_saveable";
  template <class Layers, class V>
  static V run(const Layers& layers, V h) {
    for (const auto& layer : layers) h = remat::checkpoint(layer, Policy{})(h);
    return h;
  }
};
using NothingSaveable = PerLayer<remat::policies::NothingSaveable>;
using DotsSaveable = PerLayer<remat::policies::DotsSaveable>;
using EverythingSaveable = PerLayer<remat::policies::EverythingSaveable>;
/// checkpoint_sequential with round(√L) segments, nothing_saveable.
struct Sequential {
  static constexpr const char* name = "sequential_sqrt";
  template <class Layers, class V>
  static V run(const Layers& layers, V h) {
    return remat::checkpoint_sequential(layers, sqrt_segments(static_cast<Index>(layers.size())), h);
  }
};

/// checkpoint_sequential with 4 segments of L/4 layers, `Policy` inside each (PyTorch semantics: the last
/// segment is not checkpointed): multi-layer regions, where a policy decides what the replay recomputes.
template <class Policy>
struct Segments4 {
  static constexpr const char* name = std::is_same_v<Policy, remat::policies::NothingSaveable>
                                          ? "segments4_nothing_saveable"
                                          : "segments4_dots_saveable";
  template <class Layers, class V>
  static V run(const Layers& layers, V h) {
    return remat::checkpoint_sequential(layers, 4, h, Policy{});
  }
};
using Segments4NothingSaveable = Segments4<remat::policies::NothingSaveable>;
using Segments4DotsSaveable = Segments4<remat::policies::DotsSaveable>;

/// What an instrumented step measured (tape figures; see remat::MemoryStats).
struct StepMemory {
  double saved_bytes = 0, peak_bytes = 0, replayed_bytes = 0;
};

template <class Workload, class Variant, bool Mlp = is_mlp<Workload>>
class RematModel;

using V = remat::Var<float>;
using remat::Parameter;

/// How a step runs its backward pass by default: tape.backward(loss).
struct PlainBackward {
  void operator()(remat::Tape<float>& tape, const V& loss) const { tape.backward(loss); }
};

/// W0, W1, W1-small on a tape: layer l = tanh(linear(h, W_l, b_l)).
template <class Workload, class Variant>
class RematModel<Workload, Variant, true> {
 public:
  explicit RematModel(const Data& data) : data_(data) {
    for (const Affine& a : data.affine) {
      weight_.emplace_back(a.weight);
      bias_.emplace_back(a.bias);
    }
  }

  /// One step; `backward(tape, loss)` runs the backward pass (bench/distributed_step.cpp: the gradient
  /// reducer's, which also all-reduces the gradients).
  template <class Backward = PlainBackward>
  float step(StepMemory* memory = nullptr, Backward backward = {}) {
    tape_.clear();
    const std::size_t n = weight_.size();
    w_.resize(n);
    b_.resize(n);
    for (std::size_t l = 0; l < n; ++l) {
      w_[l] = tape_.variable(weight_[l]);
      b_[l] = tape_.variable(bias_[l]);
    }
    auto layer = [this](std::size_t l) {
      return [this, l](V h) { return remat::tanh(remat::linear(h, w_[l], b_[l])); };
    };
    std::vector<decltype(layer(0))> layers;
    layers.reserve(n - 1);
    for (std::size_t l = 0; l + 1 < n; ++l) layers.push_back(layer(l));
    V h = Variant::run(layers, tape_.constant(data_.x));
    V loss = remat::cross_entropy(remat::linear(h, w_[n - 1], b_[n - 1]), data_.labels);
    h = V();
    if (memory) memory->saved_bytes = static_cast<double>(tape_.memory().saved_bytes);
    zero_grad();
    backward(tape_, loss);  // adds into the Parameters' gradients
    if (memory) {
      const remat::MemoryStats m = tape_.memory();
      memory->peak_bytes = static_cast<double>(m.peak_bytes);
      memory->replayed_bytes = static_cast<double>(m.replayed_bytes);
    }
    return loss.item();
  }

  Gradients gradients() const {
    Gradients g;
    for (std::size_t l = 0; l < w_.size(); ++l) g.affine.push_back({w_[l].grad(), b_[l].grad()});
    return g;
  }

  /// W_0, b_0, W_1, b_1, …, in the order of the forward pass (a gradient reducer's bucket order).
  std::vector<Parameter<float>*> parameters() {
    std::vector<Parameter<float>*> p;
    for (std::size_t l = 0; l < weight_.size(); ++l) {
      p.push_back(&weight_[l]);
      p.push_back(&bias_[l]);
    }
    return p;
  }
  remat::Tape<float>& tape() { return tape_; }

 private:
  const Data& data_;
  void zero_grad() {
    for (auto* list : {&weight_, &bias_})
      for (Parameter<float>& p : *list) p.zero_grad();
  }

  std::vector<Parameter<float>> weight_, bias_;
  remat::Tape<float> tape_;
  std::vector<V> w_, b_;
};

/// W0, W1, W1-small captured once (remat::CapturedStep) and replayed: the plain step without recording it
/// again (docs/design.md §6).
template <class Workload>
class RematCapturedMlp {
 public:
  explicit RematCapturedMlp(const Data& data) {
    for (const Affine& a : data.affine) {
      weight_.emplace_back(a.weight);
      bias_.emplace_back(a.bias);
    }
    step_ = std::make_unique<remat::CapturedStep<float>>([&](remat::Tape<float>& tape) {
      const std::size_t n = weight_.size();
      V h = tape.constant(data.x);
      for (std::size_t l = 0; l + 1 < n; ++l)
        h = remat::tanh(remat::linear(h, tape.variable(weight_[l]), tape.variable(bias_[l])));
      return remat::cross_entropy(remat::linear(h, tape.variable(weight_[n - 1]), tape.variable(bias_[n - 1])),
                                  data.labels);
    });
  }

  float step(StepMemory* memory = nullptr) {
    for (auto* list : {&weight_, &bias_})
      for (Parameter<float>& p : *list) p.zero_grad();
    const float loss = step_->replay();
    if (memory) {  // the tape's figures are the capture's (its first step), not a replay's: none reported
      memory->saved_bytes = -1;
      memory->peak_bytes = -1;
      memory->replayed_bytes = -1;
    }
    return loss;
  }

  Gradients gradients() const {
    Gradients g;
    for (std::size_t l = 0; l < weight_.size(); ++l) g.affine.push_back({weight_[l].grad(), bias_[l].grad()});
    return g;
  }

 private:
  std::vector<Parameter<float>> weight_, bias_;
  std::unique_ptr<remat::CapturedStep<float>> step_;
};

/// W2 on a tape: block i = h + linear(gelu(linear(layer_norm(h, gain_i, bias_i), W1_i, b1_i)), W2_i, b2_i).
template <class Workload, class Variant>
class RematModel<Workload, Variant, false> {
 public:
  explicit RematModel(const Data& data) : data_(data) {
    for (const Affine& a : data.affine) {
      weight_.emplace_back(a.weight);
      bias_.emplace_back(a.bias);
    }
    for (const Affine& a : data.norm) {
      gain_.emplace_back(a.weight);
      shift_.emplace_back(a.bias);
    }
  }

  float step(StepMemory* memory = nullptr) {
    tape_.clear();
    w_.resize(weight_.size());
    b_.resize(weight_.size());
    g_.resize(gain_.size());
    s_.resize(gain_.size());
    for (std::size_t i = 0; i < weight_.size(); ++i) {
      w_[i] = tape_.variable(weight_[i]);
      b_[i] = tape_.variable(bias_[i]);
    }
    for (std::size_t i = 0; i < gain_.size(); ++i) {
      g_[i] = tape_.variable(gain_[i]);
      s_[i] = tape_.variable(shift_[i]);
    }
    auto block = [this](std::size_t i) {
      return [this, i](V h) {
        V inner = remat::gelu(remat::linear(remat::layer_norm(h, g_[i], s_[i]), w_[2 * i], b_[2 * i]));
        return h + remat::linear(inner, w_[2 * i + 1], b_[2 * i + 1]);
      };
    };
    std::vector<decltype(block(0))> blocks;
    const std::size_t count = gain_.size() - 1;
    blocks.reserve(count);
    for (std::size_t i = 0; i < count; ++i) blocks.push_back(block(i));
    V h = Variant::run(blocks, tape_.constant(data_.x));
    V logits = remat::linear(remat::layer_norm(h, g_.back(), s_.back()), w_.back(), b_.back());
    V loss = remat::cross_entropy(logits, data_.labels);
    h = V();
    logits = V();
    if (memory) memory->saved_bytes = static_cast<double>(tape_.memory().saved_bytes);
    zero_grad();
    tape_.backward(loss);  // adds into the Parameters' gradients
    if (memory) {
      const remat::MemoryStats m = tape_.memory();
      memory->peak_bytes = static_cast<double>(m.peak_bytes);
      memory->replayed_bytes = static_cast<double>(m.replayed_bytes);
    }
    return loss.item();
  }

  Gradients gradients() const {
    Gradients g;
    for (std::size_t i = 0; i < w_.size(); ++i) g.affine.push_back({w_[i].grad(), b_[i].grad()});
    for (std::size_t i = 0; i < g_.size(); ++i) g.norm.push_back({g_[i].grad(), s_[i].grad()});
    return g;
  }

 private:
  const Data& data_;
  void zero_grad() {
    for (auto* list : {&weight_, &bias_, &gain_, &shift_})
      for (Parameter<float>& p : *list) p.zero_grad();
  }

  std::vector<Parameter<float>> weight_, bias_, gain_, shift_;
  remat::Tape<float> tape_;
  std::vector<V> w_, b_, g_, s_;
};

}  // namespace bench
