// TapeSweeps<T>: the backward sweeps of a tape (backward(), gradient()), the checks before one, and the
// gradient-ready callbacks they call, over TapeCore's state (detail/tape_core.hpp). TapeFigures (tape_figures.hpp),
// then TapeState (tape_state.hpp), derive from it.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "remat/detail/tape_core.hpp"

namespace remat::detail {

template <class T>
class TapeSweeps : public TapeCore<T> {
 public:
  using TapeCore<T>::check_not_in_callback;

  /// Checks before a sweep: no sweep after a freeing one, no Parameter a backward or replay will read was
  /// modified, and, if the sweep hands gradients to Parameters (`to_parameters`: backward(), not
  /// gradient()), none of them was assigned to, moved from or resized. Throws freed_value_error, stale_value_error
  /// naming `op` (and the `loss` node's number).
  void check_sweepable(const char* op, bool to_parameters, std::int32_t loss) const {
    check_not_in_callback(op);
    if (graph_.trace && (capture_function_running_ || !to_parameters))
      throw tape_error(std::string(op) +
                       ": called inside a CapturedStep's function; return the loss from it, and the CapturedStep "
                       "runs backward(loss)");
    if (residuals_freed_) throw_residuals_freed(op, loss);
    for (std::int32_t i = 0; i < graph_.size(); ++i) {
      // Under a budget, a regeneration may read any Parameter whose value the tape refers to now. A view of a
      // Parameter (reshape of a weight) that a reader reads is checked through the Parameter (check_parameter_current
      // follows a view to its buffer's owner); one held only by a handle reads nothing in the sweep.
      if (read_at_all(graph_, graph_[i]) || (evictor_.active() && graph_[i].value))
        check_parameter_current(graph_, i, op);
      if (to_parameters) {
        check_parameter_not_reassigned(graph_, i, op);
        check_parameter_same_shape(graph_, i, op);
      }
    }
  }

  /// A sweep after one without retain_graph. The fix depends on when the loss was recorded: before that
  /// sweep (another backward over the same graph: retain_graph), or after it, on the swept tape (the next
  /// step: clear() was missing; telling that user to record the forward pass again would send them round).
  [[noreturn]] void throw_residuals_freed(const char* op, std::int32_t loss) const {
    const std::string by = freed_by_;  // the sweep that freed them
    std::string message = std::string(op) + ": ";
    if (loss >= nodes_when_freed_)
      message += "the loss (node #" + std::to_string(loss) + ") was recorded after a " + by +
                 " without retain_graph, on the same tape without clear() in between: that " + by +
                 " freed the tape's residuals, and the tape runs no other backward until clear(); call clear() "
                 "before recording the next step (and record its leaves again), or pass retain_graph = true to "
                 "that " +
                 by + " to keep them";
    else
      message += "the residuals of the loss's graph (node #" + std::to_string(loss) + ") were freed by the previous " +
                 by + ", which ran without retain_graph; pass retain_graph = true to that " + by +
                 " to run another one over the same graph, or call clear() and record the forward pass again";
    throw freed_value_error(message);
  }
  void mark_residuals_freed(const char* by) noexcept {
    residuals_freed_ = true;
    nodes_when_freed_ = graph_.size();
    freed_by_ = by;
  }

  // ---- gradient-ready callbacks (Tape::on_gradient_ready) ----
  std::size_t add_gradient_ready_callback(std::function<void(Parameter<T>&)> callback) {
    if (graph_.trace || frozen_)
      throw tape_error(
          "on_gradient_ready: a CapturedStep does not call gradient-ready callbacks when it runs "
          "its step again; record a step that needs them on a Tape");
    ready_callbacks_.emplace_back(next_callback_key_, std::move(callback));
    sweep_.ready_callbacks = &ready_callbacks_;
    return next_callback_key_++;
  }
  bool remove_gradient_ready_callback(std::size_t key) {
    check_not_in_callback("remove_gradient_ready");
    for (auto it = ready_callbacks_.begin(); it != ready_callbacks_.end(); ++it)
      if (it->first == key) {
        ready_callbacks_.erase(it);
        return true;
      }
    return false;
  }
  /// backward(): gradients flow into everything that requires grad; variables accumulate them.
  void backward(std::int32_t loss, bool retain_graph) {
    const auto count = static_cast<std::size_t>(graph_.size());
    sweep_.wanted.resize(count);
    sweep_.keep.resize(count);
    for (std::int32_t i = 0; i < graph_.size(); ++i) {
      sweep_.wanted[static_cast<std::size_t>(i)] = graph_[i].requires_grad;
      sweep_.keep[static_cast<std::size_t>(i)] = graph_[i].is_variable && !graph_[i].parameter;
    }
    sweep_.run(loss, SweepMode{retain_graph, true});
    if (!retain_graph) mark_residuals_freed("backward");
    // Anomaly detection found a non-finite gradient, or a gradient-ready callback threw: the sweep completed
    // (every gradient is written), and the backward reports it.
    if (const std::exception_ptr first = sweep_.take_first_error()) std::rethrow_exception(first);
  }

  /// gradient(): d loss / d target for each of `targets`, copied into `out` (matrices of their shapes,
  /// allocated by the caller); accumulated gradients are left as they were.
  void gradient(std::int32_t loss, const std::vector<std::int32_t>& targets, bool retain_graph,
                std::vector<Matrix<T>>& out) {
    const auto count = static_cast<std::size_t>(graph_.size());
    sweep_.wanted.assign(count, 0);
    sweep_.keep.assign(count, 0);
    for (std::int32_t t : targets) sweep_.keep[static_cast<std::size_t>(t)] = 1;
    for (std::int32_t i = 0; i < graph_.size(); ++i) {
      const Node<T>& n = graph_[i];
      bool w = sweep_.keep[static_cast<std::size_t>(i)] != 0;
      // Only along ops whose output requires a gradient: not into a detach (a stops_gradient op), whose
      // backward writes nothing, nor past it (the ops there kept no residuals for a backward).
      for (int k = 0; k < n.arity && !w && n.requires_grad; ++k)
        w = sweep_.wanted[static_cast<std::size_t>(n.inputs[k])] != 0;
      sweep_.wanted[static_cast<std::size_t>(i)] = w;
    }
    sweep_.run(loss, SweepMode{retain_graph, false}, "gradient");
    for (std::size_t k = 0; k < targets.size(); ++k) {
      const Node<T>& n = graph_[targets[k]];
      if (n.grad)
        out[k] = MatrixView<T>(n.grad, n.shape.rows(), n.shape.cols());
      else
        out[k].setZero();
    }
    sweep_.finish_gradient();
    if (!retain_graph) mark_residuals_freed("gradient()");
    if (std::exception_ptr e = sweep_.take_anomaly()) std::rethrow_exception(e);
  }

 protected:
  using Base = TapeCore<T>;
  using Base::Base;
  using Base::free_grad, Base::release_all, Base::throw_frozen;
  using Base::graph_, Base::buffers_, Base::lifetime_, Base::evictor_, Base::recorder_, Base::sweep_, Base::reports_,
      Base::outputs_, Base::ready_callbacks_, Base::next_callback_key_, Base::generation_, Base::residuals_freed_,
      Base::nodes_when_freed_, Base::freed_by_, Base::seed_, Base::random_offset_, Base::training_, Base::frozen_,
      Base::frozen_zeros_, Base::capture_function_running_;
};

}  // namespace remat::detail
