// W3 on a remat tape: the docs/gpt.md GPT of examples/gpt (gpt::Model<float>), with the contract's
// deterministic parameters, under one recompute mode and attention kind.
#pragma once

#include <vector>

#include <remat/remat.hpp>

#include "gpt/gpt.hpp"
#include "gpt/memory_formula.hpp"
#include "remat_model.hpp"
#include "workloads.hpp"

namespace bench {

/// No dropout: a step is deterministic, so every mode can be checked bitwise against none.
inline gpt::Config gpt_config(const GptShape& s) {
  return gpt::Config{s.vocabulary, s.width, s.heads, s.seq_len, s.blocks, 0.0};
}

/// The bytes docs/gpt.md's model keeps after the forward pass (examples/gpt/memory_formula.hpp).
inline double gpt_saved_bytes(const GptShape& s, const gpt::Options& options) {
  return gpt::saved_floats(options.recompute, options.attention, gpt::sizes(gpt_config(s), s.batch)) *
         double(sizeof(float));
}

class RematGptModel {
 public:
  RematGptModel(const GptData& data, const GptShape& shape, const gpt::Options& options)
      : data_(data), model_(gpt::Model<float>::deterministic(gpt_config(shape))), options_(options) {}

  /// One step: loss and every parameter's gradient (into the Parameters). `memory`: the tape's saved bytes
  /// after the forward pass, its peak and replayed bytes after the backward.
  float step(StepMemory* memory = nullptr) {
    tape_.clear();
    for (remat::Parameter<float>* p : model_.parameters()) p->zero_grad();
    remat::Var<float> loss = model_.loss(tape_, data_.ids, data_.targets, options_);
    if (memory) memory->saved_bytes = static_cast<double>(tape_.memory().saved_bytes);
    tape_.backward(loss);
    if (memory) {
      const remat::MemoryStats m = tape_.memory();
      memory->peak_bytes = static_cast<double>(m.peak_bytes);
      memory->replayed_bytes = static_cast<double>(m.replayed_bytes);
    }
    return loss.item();
  }

  /// The last step's gradients, in the contract's parameter order.
  std::vector<Matrix<float>> parameter_gradients() {
    std::vector<Matrix<float>> g;
    for (remat::Parameter<float>* p : model_.parameters()) g.emplace_back(p->grad());
    return g;
  }

 private:
  const GptData& data_;
  gpt::Model<float> model_;
  gpt::Options options_;
  remat::Tape<float> tape_;
};

}  // namespace bench
