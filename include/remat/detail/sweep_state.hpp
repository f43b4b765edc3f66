// What every layer of the backward sweep shares: the tape's parts, the per-node wanted and keep flags, whether
// a dry run is running, and the errors a pass keeps for run()'s caller. The sweep is a chain of layers, each a
// base of the next (SweepState, GradientDelivery, Replays, ChainSchedule, DryRunCache, NodeBackward, Sweep), so that
// each concern has a file while its code keeps its bodies and inlining, with no indirection on the per-node path.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "remat/detail/buffers.hpp"
#include "remat/detail/eviction.hpp"
#include "remat/detail/lifetime.hpp"
#include "remat/detail/node.hpp"
#include "remat/detail/non_finite.hpp"
#include "remat/errors.hpp"

namespace remat::detail {

/// How a sweep treats what it computes.
struct SweepMode {
  bool retain_graph = false;  ///< keep every residual and hold, so another backward can run
  bool accumulate = true;     ///< add into variables' gradients (backward); false for gradient()
};

template <class T>
class SweepState {
 public:
  SweepState(Graph<T>& graph, Buffers<T>& buffers, Lifetime<T>& lifetime, Evictor<T>& evictor)
      : graph_(graph), buffers_(buffers), lifetime_(lifetime), evictor_(evictor) {}

  /// Per node, filled by the caller before run(): wanted = its gradient is asked for (a gradient flows
  /// into it); keep = its gradient outlives the sweep (gradient() targets; tape variables in backward()).
  std::vector<std::uint8_t> wanted, keep;

  /// The exception the first throwing gradient-ready callback of the last run threw (null if none); clears it.
  std::exception_ptr take_callback_error() noexcept { return std::exchange(callback_error_, nullptr); }
  /// The anomaly_error for the first non-finite gradient the last run found (anomaly detection), or null;
  /// clears it.
  std::exception_ptr take_anomaly() noexcept { return std::exchange(anomaly_, nullptr); }
  /// Of the anomaly and the callback's exception (a stale_value_error included), the one raised first in the
  /// last run, or null; clears both.
  std::exception_ptr take_first_error() noexcept {
    std::exception_ptr anomaly = take_anomaly(), callback = take_callback_error();
    return anomaly && (anomaly_first_ || !callback) ? anomaly : callback;
  }
  /// True while the real pass runs (a gradient-ready callback is being called from inside it).
  bool running() const { return running_; }

 protected:
  static std::uint64_t next_simulation_serial() {
    static std::atomic<std::uint64_t> serial{0};
    return ++serial;
  }
  bool simulating() const { return simulation_ != 0; }

  /// Anomaly detection: after op i's backward, the first gradient it wrote that holds a NaN or ±inf is kept as
  /// an anomaly_error for run()'s caller (the sweep cannot stop half-way). Never throws.
  void check_finite_backward(std::int32_t i) noexcept {
    const Node<T>& n = graph_[i];
    for (int k = 0; k < n.arity; ++k) {
      const std::int32_t w = n.inputs[k];
      const Node<T>& in = graph_[w];
      if (!wanted[static_cast<std::size_t>(w)] || !in.grad) continue;
      const std::int64_t bad = first_non_finite(in.grad, in.shape.rows(), in.shape.cols());
      if (bad < 0) continue;
      const std::int64_t upstream = n.grad ? first_non_finite(n.grad, n.shape.rows(), n.shape.cols()) : -1;
      try {
        throw anomaly_error("backward of " + std::string(n.op->name) + " (node #" + std::to_string(i) + ", " +
                                to_string(n.shape) + ") wrote " + non_finite_text(in.grad, in.shape.cols(), bad) +
                                " into the gradient of its input " + std::to_string(k) + " (node #" +
                                std::to_string(w) + ", " + graph_.node_name(w) + " " + to_string(in.shape) + ")" +
                                (upstream >= 0 ? ", propagated: the gradient it received holds " +
                                                     non_finite_text(n.grad, n.shape.cols(), upstream)
                                               : ", from a finite incoming gradient") +
                                " (anomaly detection is on: Tape::set_detect_anomaly); the sweep completed, so the "
                                "gradients hold the non-finite values",
                            i);
      } catch (...) {
        anomaly_ = std::current_exception();
        anomaly_first_ = !callback_error_;
      }
      return;
    }
  }

  void free_grad(Node<T>& n) noexcept {
    buffers_.free(n.grad, n.shape);
    n.grad_assigned = false;
  }

  Graph<T>& graph_;
  Buffers<T>& buffers_;
  Lifetime<T>& lifetime_;
  Evictor<T>& evictor_;
  std::exception_ptr callback_error_;
  std::exception_ptr anomaly_;  // the first non-finite gradient of the last run (anomaly detection)
  bool anomaly_first_ = false;  // anomaly_ came before callback_error_
  bool running_ = false;
  std::uint64_t simulation_ = 0;  // serial of the running dry run, 0 outside one
};

}  // namespace remat::detail
