// A small W2-like transformer-MLP training step (bench/remat_model.hpp's W2 at test size), shared by the
// steady-state allocation test and the fault-injection test:
//
//   block i:  h ← h + linear(dropout(gelu(checkpoint_name(linear(layer_norm(h), W1, b1)))), W2, b2)
//   blocks 0, 1: one nothing_saveable region holding two nested regions (dots_saveable; a name policy)
//   block 2: dots_saveable; block 3: nothing_saveable
//   head: cross_entropy(linear(layer_norm(h), W, b), labels)
//   then Adam zero_grad, backward, Adam step
//
// Every library call goes through `call(what, f)`, which returns f(); the fault-injection test wraps
// each call there (Identity does nothing).
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "random.hpp"
#include "remat/nn/adam.hpp"
#include "remat/remat.hpp"

namespace remat_alloc_test {

using remat::Matrix;
using V = remat::Var<float>;

/// The call wrapper of a plain run.
struct Identity {
  template <class F>
  decltype(auto) operator()(const char*, F&& f) const {
    return f();
  }
};

struct W2Shape {
  int batch = 16, width = 32, hidden = 64, classes = 10;
  static constexpr int blocks = 4;  // the region structure above is written for four blocks
};

class W2Model {
 public:
  explicit W2Model(W2Shape shape = {}, std::uint64_t seed = 7)
      : shape_(shape), names_(remat::policies::save_only_these_names({"w2_block_pre_activation"})) {
    remat_test::Random r(seed);
    auto matrix = [&](int rows, int cols, double scale) {
      Matrix<float> m(rows, cols);
      for (remat::Index i = 0; i < m.size(); ++i) m.data()[i] = static_cast<float>(r.uniform(-scale, scale));
      return m;
    };
    for (int b = 0; b <= shape.blocks; ++b) {  // block b's layer norm; b == blocks: the head's
      params_.emplace_back(matrix(1, shape.width, 0.1) + Matrix<float>::Ones(1, shape.width));  // gain
      params_.emplace_back(matrix(1, shape.width, 0.1));                                        // shift
      if (b == shape.blocks) break;
      params_.emplace_back(matrix(shape.width, shape.hidden, 1 / std::sqrt(double(shape.width))));
      params_.emplace_back(matrix(1, shape.hidden, 0.1));
      params_.emplace_back(matrix(shape.hidden, shape.width, 1 / std::sqrt(double(shape.hidden))));
      params_.emplace_back(matrix(1, shape.width, 0.1));
    }
    params_.emplace_back(matrix(shape.width, shape.classes, 1 / std::sqrt(double(shape.width))));
    params_.emplace_back(matrix(1, shape.classes, 0.1));
    std::vector<remat::Parameter<float>*> pointers;
    for (auto& p : params_) pointers.push_back(&p);
    adam_ = std::make_unique<remat::nn::Adam<float>>(pointers);
    x_ = matrix(shape.batch, shape.width, 1.0);
    for (int i = 0; i < shape.batch; ++i) labels_.push_back((7 * i + 3) % shape.classes);
    vars_.resize(params_.size());
  }

  /// One training step on `tape` (which the step clears at its end). Returns the loss.
  template <class Call>
  float step(remat::Tape<float>& tape, Call& call, std::uint64_t step_number) {
    tape.seed(step_number);
    record(tape, call);
    V loss = forward(tape, call);
    call("zero_grad", [&] { adam_->zero_grad(); });
    call("backward", [&] { tape.backward(loss); });
    // Before the update: under a memory budget the loss may have been evicted, and its regeneration reads the
    // Parameters as they were recorded.
    const float value = loss.item();
    call("adam step", [&] { adam_->step(); });
    loss = V();
    call("clear", [&] { tape.clear(); });
    return value;
  }

  /// Records the parameters and the forward pass up to the loss (for tests that drive backward themselves).
  template <class Call>
  V record_forward(remat::Tape<float>& tape, Call& call) {
    record(tape, call);
    return forward(tape, call);
  }

  std::vector<remat::Parameter<float>>& parameters() { return params_; }
  const std::vector<V>& parameter_vars() const { return vars_; }

 private:
  template <class Call>
  void record(remat::Tape<float>& tape, Call& call) {
    for (std::size_t i = 0; i < params_.size(); ++i)
      vars_[i] = call("variable", [&] { return tape.variable(params_[i]); });
  }

  // Parameter layout: per block 6 (gain, shift, W1, b1, W2, b2), then the head's gain, shift, W, b.
  const V& p(int block, int k) const { return vars_[static_cast<std::size_t>(6 * block + k)]; }

  template <class Call>
  auto block(Call& call, int b) {
    return [this, &call, b](V h) {
      V n = call("layer_norm", [&] { return remat::layer_norm(h, p(b, 0), p(b, 1)); });
      V a = call("linear", [&] { return remat::linear(n, p(b, 2), p(b, 3)); });
      a = call("checkpoint_name", [&] { return remat::checkpoint_name(a, "w2_block_pre_activation"); });
      V g = call("gelu", [&] { return remat::gelu(a); });
      g = call("dropout", [&] { return remat::dropout(g, 0.1); });
      V o = call("linear", [&] { return remat::linear(g, p(b, 4), p(b, 5)); });
      return call("add", [&] { return h + o; });
    };
  }

  template <class Call>
  V forward(remat::Tape<float>& tape, Call& call) {
    V h = call("constant", [&] { return tape.constant(x_); });
    h = call("checkpoint (outer)", [&] {
      return remat::checkpoint(
          [&](V u) {
            u = call("checkpoint (inner, dots)",
                     [&] { return remat::checkpoint(block(call, 0), remat::policies::dots_saveable)(u); });
            u = call("checkpoint (inner, names)", [&] { return remat::checkpoint(block(call, 1), names_)(u); });
            return u;
          },
          remat::policies::nothing_saveable)(h);
    });
    h = call("checkpoint (dots)", [&] { return remat::checkpoint(block(call, 2), remat::policies::dots_saveable)(h); });
    h = call("checkpoint (nothing)",
             [&] { return remat::checkpoint(block(call, 3), remat::policies::nothing_saveable)(h); });
    const int head = shape_.blocks;
    V n = call("layer_norm (head)", [&] { return remat::layer_norm(h, p(head, 0), p(head, 1)); });
    V logits = call("linear (head)", [&] { return remat::linear(n, p(head, 2), p(head, 3)); });
    return call("cross_entropy", [&] { return remat::cross_entropy(logits, labels_); });
  }

  W2Shape shape_;
  remat::policies::NamePolicy names_;
  std::vector<remat::Parameter<float>> params_;
  std::unique_ptr<remat::nn::Adam<float>> adam_;
  Matrix<float> x_;
  std::vector<int> labels_;
  std::vector<V> vars_;
};

}  // namespace remat_alloc_test
