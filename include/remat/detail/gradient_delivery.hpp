// Gradient delivery, the sweep layer that hands each Parameter its gradient as soon as it is complete (as
// PyTorch's AccumulateGrad does), calls the gradient-ready callbacks, and sets the variables' accumulated
// gradients aside for gradient(). Apart from the pass because it is the one place the sweep meets
// Parameters and user code.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "remat/detail/sweep_state.hpp"
#include "remat/errors.hpp"
#include "remat/parameter.hpp"

namespace remat::detail {

/// The gradient-ready callbacks of a tape (Tape::on_gradient_ready), by key, in registration order.
template <class T>
using GradientReadyCallbacks = std::vector<std::pair<std::size_t, std::function<void(Parameter<T>&)>>>;

template <class T>
class GradientDelivery : public SweepState<T> {
 public:
  using SweepState<T>::SweepState;

  /// Called, in a backward (mode.accumulate), once for each Parameter whose gradient this sweep added to,
  /// when the gradients of all its leaves have been delivered (every contribution is in). Null or
  /// empty: none. Set by the tape.
  const GradientReadyCallbacks<T>* ready_callbacks = nullptr;

  /// After a run with mode.accumulate == false: frees the kept gradients and puts back the variables'
  /// accumulated gradients set aside for it. Never throws.
  void finish_gradient() noexcept {
    for (std::int32_t i = 0; i < graph_.size(); ++i)
      if (keep[static_cast<std::size_t>(i)]) free_grad(graph_[i]);
    for (const Stashed& s : stash_) {
      Node<T>& n = graph_[s.id];
      n.grad = s.grad;
      n.grad_assigned = s.assigned;
    }
    stash_.clear();
  }

 protected:
  using SweepState<T>::graph_, SweepState<T>::buffers_, SweepState<T>::wanted, SweepState<T>::keep,
      SweepState<T>::simulating, SweepState<T>::simulation_, SweepState<T>::free_grad, SweepState<T>::callback_error_,
      SweepState<T>::anomaly_;  // SweepState

  struct Stashed {
    std::int32_t id;
    T* grad;
    bool assigned;
  };

  /// delivered_by_[w] for a Parameter's leaf w in a backward (mode.accumulate): the op whose backward completes
  /// w's gradient — the earliest op that reads w and receives a gradient (it is the last such op the reverse
  /// sweep reaches; every replay or regeneration re-running one of them comes before it too). The sweep
  /// delivers the gradient to the Parameter right after that op's backward, as PyTorch's AccumulateGrad does,
  /// instead of holding it on the tape until the sweep reaches the leaf: so where a Parameter is recorded (all
  /// before the forward pass, or each where it is used) does not change the peak. -1 for every other node.
  /// Ops that read w but receive no gradient (after the loss, in a branch the loss does not depend on, a
  /// schedule's probe) contribute nothing and do not delay it. Allocates only when the tape grew.
  void prepare_deliveries(std::int32_t loss, SweepMode mode) {
    const auto count = static_cast<std::size_t>(graph_.size());
    delivered_by_.assign(count, -1);
    if (!mode.accumulate) return;
    receives_.assign(count, 0);
    receives_[static_cast<std::size_t>(loss)] = 1;
    for (std::int32_t i = loss; i >= 0; --i) {
      const Node<T>& n = graph_[i];
      if (!receives_[static_cast<std::size_t>(i)] || n.is_leaf() || !wanted[static_cast<std::size_t>(i)]) continue;
      for (int k = 0; k < n.arity; ++k) {
        const auto w = static_cast<std::size_t>(n.inputs[k]);
        if (!wanted[w]) continue;
        receives_[w] = 1;
        if (graph_[n.inputs[k]].parameter) delivered_by_[w] = i;  // the last write is the earliest op
      }
    }
  }

  bool ready_callbacks_active(SweepMode mode) const {
    return mode.accumulate && ready_callbacks != nullptr && !ready_callbacks->empty();
  }

  /// first_leaf_[i]: for a leaf referencing a Parameter, the id of the earliest leaf referencing the same
  /// Parameter, which stands for the Parameter in held_, contributed_ and leaves_left_ (its leaves whose
  /// gradient is not complete yet); -1 otherwise. Allocates only the first time.
  void prepare_ready_callbacks(SweepMode mode) {
    callback_error_ = nullptr;
    anomaly_ = nullptr;
    if (!ready_callbacks_active(mode)) return;
    const auto count = static_cast<std::size_t>(graph_.size());
    first_leaf_.assign(count, -1);
    contributed_.assign(count, 0);
    held_.assign(count, 0);
    leaves_left_.assign(count, 0);
    by_storage_.clear();
    for (std::int32_t i = 0; i < graph_.size(); ++i)
      if (graph_[i].is_leaf() && graph_[i].parameter) by_storage_.push_back({graph_[i].parameter.get(), i});
    std::sort(by_storage_.begin(), by_storage_.end());  // by storage, then by id: each group's first is earliest
    for (std::size_t k = 0; k < by_storage_.size(); ++k) {
      const bool starts = k == 0 || by_storage_[k].first != by_storage_[k - 1].first;
      const std::int32_t first = starts ? by_storage_[k].second : first_leaf_[by_storage_[k - 1].second];
      first_leaf_[static_cast<std::size_t>(by_storage_[k].second)] = first;
      ++leaves_left_[static_cast<std::size_t>(first)];
    }
  }

  /// While a pass calls gradient-ready callbacks (user code inside the sweep), every Parameter it recorded
  /// counts the pass in its sweeps_reading until the gradients of all its leaves are complete, after which
  /// nothing in the pass reads the value: a callback that changes a value still to be read then gets tape_error
  /// from Parameter (and from the optimizers) instead of giving the sweep another value or a freed buffer.
  void hold_parameters() noexcept {
    for (std::size_t k = 0; k < by_storage_.size(); ++k) {
      const std::int32_t first = first_leaf_[static_cast<std::size_t>(by_storage_[k].second)];
      if (held_[static_cast<std::size_t>(first)]) continue;
      held_[static_cast<std::size_t>(first)] = 1;
      graph_[first].parameter->sweeps_reading.fetch_add(1, std::memory_order_relaxed);
    }
  }
  /// Ends the hold of the Parameter whose earliest leaf is `first` (once).
  void release_parameter(std::int32_t first) noexcept {
    if (!std::exchange(held_[static_cast<std::size_t>(first)], std::uint8_t{0})) return;
    graph_[first].parameter->sweeps_reading.fetch_sub(1, std::memory_order_relaxed);
  }
  /// Ends every hold the pass has not ended (leaves it did not reach).
  void release_parameters() noexcept {
    for (const auto& entry : by_storage_) release_parameter(first_leaf_[static_cast<std::size_t>(entry.second)]);
  }

  void set_aside_accumulated_gradients() noexcept {
    for (std::int32_t i = 0; i < graph_.size(); ++i) {
      Node<T>& n = graph_[i];
      if (!n.is_variable || !n.grad) continue;
      stash_.push_back({i, n.grad, n.grad_assigned});  // capacity reserved
      n.grad = nullptr;
      n.grad_assigned = false;
    }
  }

  /// After op i's backward: delivers the gradient of every Parameter leaf it completes (prepare_deliveries).
  void deliver_gradients_completed_by(std::int32_t i, SweepMode mode) noexcept {
    const Node<T>& n = graph_[i];
    for (int k = 0; k < n.arity; ++k) {
      const std::int32_t w = n.inputs[k];
      if (delivered_by_[static_cast<std::size_t>(w)] != i) continue;
      if ((k >= 1 && n.inputs[0] == w) || (k == 2 && n.inputs[1] == w)) continue;  // read twice: once
      complete_leaf(w, mode);
    }
  }

  void finish_leaf(std::int32_t i, SweepMode mode) noexcept {
    if (delivered_by_[static_cast<std::size_t>(i)] < 0) complete_leaf(i, mode);
  }

  /// Leaf i's gradient of this sweep is complete: a Parameter's goes to the Parameter (backward), a kept one
  /// stays, any other goes; the Parameter's gradient-ready callbacks run once all its leaves are complete.
  void complete_leaf(std::int32_t i, SweepMode mode) noexcept {
    Node<T>& n = graph_[i];
    const bool callbacks = ready_callbacks_active(mode) && n.parameter;
    const std::int32_t first = callbacks ? first_leaf_[static_cast<std::size_t>(i)] : -1;
    if (n.grad) {
      if (n.parameter && mode.accumulate) {
        add_to_parameter(n);
        if (callbacks) contributed_[static_cast<std::size_t>(first)] = 1;
      } else if (!keep[static_cast<std::size_t>(i)]) {
        free_grad(n);  // e.g. a constant used as the loss got the seed gradient
      }
    }
    if (callbacks && !simulating() && --leaves_left_[static_cast<std::size_t>(first)] == 0) {
      release_parameter(first);  // before its callbacks: they may change this Parameter
      if (contributed_[static_cast<std::size_t>(first)]) call_ready_callbacks(graph_[first]);
    }
  }

  /// Calls every gradient-ready callback with the Parameter of leaf n. An exception is kept for run()'s
  /// caller (the sweep goes on: it cannot stop half-way); after one, no further callback is called.
  void call_ready_callbacks(Node<T>& n) noexcept {
    if (callback_error_) return;
    Parameter<T> p = ParameterAccess::share(n.parameter);
    try {
      for (const auto& entry : *ready_callbacks) entry.second(p);
    } catch (...) {
      callback_error_ = std::current_exception();
    }
  }

  bool changed_since_recorded(const Node<T>& n) const noexcept {
    const ParameterStorage<T>& s = *n.parameter;
    // Not the version: a value modified after recording but read by no backward keeps its gradient, as
    // PyTorch's version counter allows (backward checked the values it reads before the sweep).
    return s.assignments != n.parameter_assignments || s.value.rows() != n.shape.rows() ||
           s.value.cols() != n.shape.cols();
  }
  /// The stale_value_error backward() rethrows after the sweep, unless an error is kept already.
  void keep_error(const Node<T>& n) noexcept {
    if (callback_error_) return;
    try {
      throw stale_value_error("backward: a Parameter of shape " + to_string(n.shape) +
                              " that this tape recorded was assigned or resized during the backward (by a "
                              "gradient-ready callback?) before its gradient was delivered; that gradient, of the "
                              "recorded value, was not added to it");
    } catch (...) {
      callback_error_ = std::current_exception();
    }
  }

  /// The Parameter's gradient += this node's. The first contribution since zero_grad() hands the tape's
  /// buffer over to the Parameter (no copy) and takes the Parameter's previous buffer into the pool.
  void add_to_parameter(Node<T>& n) noexcept {
    ParameterStorage<T>& s = *n.parameter;
    if (!simulating() && changed_since_recorded(n)) {
      // Only user code inside the sweep could have done it (backward refuses an assigned Parameter before the
      // sweep), and Parameter refuses it while the sweep holds the Parameter (hold_parameters): a defence in
      // depth. The gradient is of the recorded value, and its buffer may not fit. Not delivered; reported.
      keep_error(n);
      free_grad(n);
      return;
    }
    const bool defined = s.grad_defined || (simulating() && s.simulated_sweep == simulation_);
    if (graph_.trace && !simulating())
      graph_.trace->log_delivery(graph_, static_cast<std::int32_t>(&n - graph_.nodes.data()), !defined);
    if (defined) {
      if (!simulating())
        Eigen::Map<Matrix<T>>(s.grad, n.shape.rows(), n.shape.cols()) +=
            ConstAlignedMap<T>(n.grad, n.shape.rows(), n.shape.cols());
      free_grad(n);
      return;
    }
    const Index count = n.shape.numel();  // once: a loop over the rank
    T* previous = s.grad && s.grad_size == count ? s.grad : nullptr;
    if (simulating()) {
      buffers_.hand_over_elements(n.grad, static_cast<std::size_t>(count), previous);
      s.simulated_sweep = simulation_;
    } else {
      if (s.grad && !previous) Eigen::internal::aligned_free(s.grad);
      s.grad = n.grad;
      s.grad_size = count;
      s.grad_defined = true;
      buffers_.hand_over_elements(n.grad, static_cast<std::size_t>(count), previous);
    }
    n.grad_assigned = false;
  }

  std::vector<Stashed> stash_;
  std::vector<std::int32_t> first_leaf_;    // per node, see prepare_ready_callbacks
  std::vector<std::uint8_t> held_;          // per earliest leaf: the pass holds its Parameter (hold_parameters)
  std::vector<std::uint8_t> contributed_;   // per earliest leaf: got a gradient
  std::vector<std::int32_t> leaves_left_;   // per earliest leaf: leaves of its Parameter not yet complete
  std::vector<std::int32_t> delivered_by_;  // per node, see prepare_deliveries
  std::vector<std::uint8_t> receives_;      // per node: receives a gradient in this sweep (scratch)
  std::vector<std::pair<const ParameterStorage<T>*, std::int32_t>> by_storage_;  // scratch
};

}  // namespace remat::detail
