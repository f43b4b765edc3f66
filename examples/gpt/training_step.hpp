// The GPT example's training step (docs/gpt.md §Training), shared by main.cpp and by
// tests/alloc/steady_state_test.cpp, which checks that a steady training loop on one tape performs no heap
// allocation in any recompute mode.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include <remat/nn/adamw.hpp>
#include <remat/nn/clip_grad_norm.hpp>
#include <remat/remat.hpp>

#include "gpt.hpp"

namespace gpt {

/// What one step measured.
struct StepResult {
  double loss = 0;              ///< the batch's mean cross-entropy (nats per byte), before the update
  double grad_norm = 0;         ///< the global gradient norm before clipping (non-finite: no update was made)
  std::size_t saved_bytes = 0;  ///< tape.memory().saved_bytes after the forward pass, before backward
  std::size_t peak_bytes = 0;   ///< tape.memory().peak_bytes after backward
};

/// How training_step() runs the backward pass by default: tape.backward(loss).
struct PlainBackward {
  void operator()(remat::Tape<float>& tape, const remat::Var<float>& loss) const { tape.backward(loss); }
};

/// One step on a reused tape: clear it (its pool is kept), seed its dropout stream with `dropout_seed`,
/// record the loss, zero_grad, `backward(tape, loss)` (a data-parallel run also waits there for the averaged
/// gradients: examples::DataParallel::backward), clip the global gradient norm to `clip_norm`, set the
/// learning rate, step. A non-finite gradient norm skips the update (clip_grad_norm leaves such gradients as
/// they are; the caller decides whether to stop).
template <class Backward = PlainBackward>
StepResult training_step(remat::Tape<float>& tape, Model<float>& model,
                         const std::vector<remat::Parameter<float>*>& parameters, remat::nn::AdamW<float>& optimizer,
                         const std::vector<int>& ids, const std::vector<int>& targets, const Options& options,
                         std::uint64_t dropout_seed, double learning_rate, double clip_norm, Backward backward = {}) {
  tape.clear();
  tape.seed(dropout_seed);
  StepResult r;
  remat::Var<float> loss = model.loss(tape, ids, targets, options);
  r.saved_bytes = tape.memory().saved_bytes;
  r.loss = static_cast<double>(loss.item());
  optimizer.zero_grad();
  backward(tape, loss);  // adds into the parameters' gradients
  r.peak_bytes = tape.memory().peak_bytes;
  r.grad_norm = remat::nn::clip_grad_norm(parameters, clip_norm);
  if (!std::isfinite(r.grad_norm)) return r;
  optimizer.set_learning_rate(learning_rate);
  optimizer.step();
  return r;
}

}  // namespace gpt
