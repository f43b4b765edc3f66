// estimate_memory(): the memory figures of a training step from its shapes alone, before running it.
#pragma once

#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>

#include "remat/tape.hpp"
#include "remat/var.hpp"

namespace remat {

/// What estimate_memory() counted: tape.memory() figures, in bytes, of the same step on a tape that computes.
struct MemoryEstimate {
  std::size_t saved_bytes = 0;         ///< memory().saved_bytes after the forward pass (before backward)
  std::size_t forward_peak_bytes = 0;  ///< memory().peak_bytes after the forward pass
  std::size_t peak_bytes = 0;          ///< memory().peak_bytes after backward: the step's peak, forward + backward
  std::size_t replayed_bytes = 0;      ///< memory().replayed_bytes after backward: what the replays regenerated
  std::size_t replayed_ops = 0;        ///< memory().replayed_ops after backward
};

namespace detail {

template <class T>
const Var<T>& estimated_loss(const Var<T>& loss) {
  return loss;
}
template <class T, class... Held>
const Var<T>& estimated_loss(const std::tuple<Var<T>, Held...>& result) {
  return std::get<0>(result);
}

}  // namespace detail

/// Records a step with `build` on a shapes-only tape (Tape(remat::shapes_only)), runs its backward, and
/// returns its memory figures: equal, byte for byte, to tape.memory() of the same step on a tape that
/// computes (saved_bytes after the forward pass, peak_bytes after backward; every tape buffer counts, op
/// temporaries included). No kernel runs and no tensor buffer is allocated, so this costs the recording and
/// the sweep's bookkeeping, not the arithmetic or the memory.
///
/// `build(Tape<T>&)` records the forward pass on the tape it is given and returns the loss ([1,1] Var<T>),
/// or a std::tuple of Vars whose first is the loss: the others are held until backward has run, as a step
/// that reads them after backward holds them (the logits, for the accuracy). The model code of a real step
/// serves unchanged: its checkpoint regions and policies, schedules (checkpoint_sequential, revolve,
/// checkpoint_sequential_auto), dropout, embedding ids and cross_entropy labels need shapes only. Inputs are matrices
/// or Eigen expressions of the batch's shape, never read (`tape.constant(Matrix<T>::Zero(batch, inputs))`); Parameters
/// are referenced and left untouched (values, gradients, versions). One call estimates one configuration:
/// call it once per policy to compare them.
///
/// Throws what the recording or backward() throws (shape_error, tape_error, ...), and shapes_only_error
/// when `build` reads a value (Var::value(), item(), grad(), argmax_rows()) — the message names the node —
/// or records an op that cannot be estimated (a custom op declaring estimable = false) — it names the op.
template <class T = float, class Build>
MemoryEstimate estimate_memory(Build&& build) {
  static_assert(std::is_invocable_v<Build&&, Tape<T>&>,
                "estimate_memory<T>(build): build must be callable with a remat::Tape<T>&");
  Tape<T> tape(shapes_only);
  const auto result = std::forward<Build>(build)(tape);  // held until backward has run
  const Var<T>& loss = detail::estimated_loss<T>(result);
  MemoryEstimate e;
  const MemoryStats forward = tape.memory();
  e.saved_bytes = forward.saved_bytes;
  e.forward_peak_bytes = forward.peak_bytes;
  tape.backward(loss);
  const MemoryStats step = tape.memory();
  e.peak_bytes = step.peak_bytes;
  e.replayed_bytes = step.replayed_bytes;
  e.replayed_ops = step.replayed_ops;
  return e;
}

}  // namespace remat
