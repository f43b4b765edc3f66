// One op node's backward in the sweep, the sweep layer below the pass (Sweep, sweep.hpp): what the backward reads
// made resident (regenerated if a memory budget evicted it, decoded if a policy stores it compressed) and, under a
// budget, pinned while it runs; the gradient buffers it writes; the backward itself; and, after it, the reads it
// gives back (sweep_op).
#pragma once

#include <cassert>
#include <cstddef>
#include <cstdint>

#include "remat/detail/buffers.hpp"
#include "remat/detail/dry_run_cache.hpp"
#include "remat/detail/node.hpp"
#include "remat/detail/packing.hpp"
#include "remat/detail/trace.hpp"
#include "remat/op_context.hpp"

namespace remat::detail {

template <class T>
class NodeBackward : public DryRunCache<T> {
  using Base = DryRunCache<T>;

 public:
  using Base::Base;
  using Base::wanted, Base::keep;

 protected:
  using Base::deliver_gradients_completed_by;  // GradientDelivery
  using Base::graph_, Base::buffers_, Base::lifetime_, Base::evictor_, Base::simulating, Base::free_grad,
      Base::anomaly_,
      Base::check_finite_backward;  // SweepState

  /// Op node i's backward in the sweep, if its gradient is wanted and reached it, and its reads given back (unless
  /// `mode` retains the graph). Never throws.
  void sweep_op(std::int32_t i, SweepMode mode) noexcept {
    Node<T>& n = graph_[i];
    if (n.grad && wanted[static_cast<std::size_t>(i)]) {
      pin_residuals(i);
      assert(residuals_present(n) && "a residual was freed before its backward ran");
      for (int k = 0; k < n.arity; ++k) {
        Node<T>& in = graph_[n.inputs[k]];
        if (wanted[static_cast<std::size_t>(n.inputs[k])] && !in.grad) {
          const auto count = static_cast<std::size_t>(in.shape.numel());  // once: a loop over the rank
          evictor_.make_room(count * sizeof(T));
          in.grad = buffers_.allocate_elements(count);
        }
      }
      if (n.scratch_shape.numel() > 0) {
        evictor_.make_room(Buffers<T>::bytes(n.scratch_shape));
        n.scratch = buffers_.allocate(n.scratch_shape);
      }
      if (!simulating()) {
        if (graph_.trace) graph_.trace->log_backward(graph_, i);
        n.op->backward(BackwardContext<T>{graph_, n, wanted.data()});
        if (graph_.detect_anomaly && !anomaly_) check_finite_backward(i);
      }
      buffers_.free(n.scratch, n.scratch_shape);
      unpin_residuals(i);
    }
    if (!keep[static_cast<std::size_t>(i)]) free_grad(n);
    if (mode.accumulate) deliver_gradients_completed_by(i, mode);
    if (mode.retain_graph || !n.requires_grad) return;
    for (int k = 0; k < n.arity; ++k)
      if (n.reads & reads_input(k)) lifetime_.release_backward_read(n.inputs[k], i);
    if (n.reads & reads_output) lifetime_.release_backward_read(i, i);
    if (n.extra_read) lifetime_.release_extra_read(i);
  }

  /// The values node i's backward reads, made resident (regenerated if evicted) and, under a memory
  /// budget, pinned while it runs. Without a budget nothing evicts (Evictor::make_room), so nothing can
  /// free a residual while the backward runs: each one is wanted (its pending backward read holds it at
  /// the sweep's level), and unpinning would settle it to what it is now.
  /// Under a budget they are acquired together (Evictor::acquire): one regeneration makes all of them resident,
  /// so that regenerating one cannot evict another the same backward reads.
  void pin_residuals(std::int32_t i) noexcept {
    const Node<T>& n = graph_[i];
    if (!evictor_.active()) {
      for (int k = 0; k < n.arity; ++k)
        if (n.reads & reads_input(k)) ensure_read(i, n.inputs[k]);
      if (n.reads & reads_output) ensure_read(i, i);
      return;
    }
    std::int32_t read[max_inputs + 1];
    int count = 0;
    for (int k = 0; k < n.arity; ++k)
      if (n.reads & reads_input(k)) read[count++] = n.inputs[k];
    if (n.reads & reads_output) read[count++] = i;
    unsigned sign_only = 0;  // packed residuals i reads only through their sign (ensure_read)
    for (int k = 0; k < count; ++k)
      if (!graph_[read[k]].value && graph_[read[k]].packed && only_sign_read(graph_, i, read[k])) sign_only |= 1u << k;
    evictor_.acquire(read, count, sign_only);
  }
  /// Residual `id` of node i's backward made resident: a packed one that i reads only through its sign is decoded as
  /// its sign (Lifetime::unpack, from its exact mask if it has one), any other as ensure() makes it.
  void ensure_read(std::int32_t i, std::int32_t id) noexcept {
    const Node<T>& v = graph_[id];
    if (!v.value && v.packed && only_sign_read(graph_, i, id))
      lifetime_.unpack(id, true);
    else
      evictor_.ensure(id);
  }
  void unpin_residuals(std::int32_t i) noexcept {
    const Node<T>& n = graph_[i];
    if (!evictor_.active()) {                 // a residual decoded for this backward (kept packed) goes again
      if (!graph_.compressed_stored) return;  // no value was ever packed since the tape's last clear()
      for (int k = 0; k < n.arity; ++k)
        if ((n.reads & reads_input(k)) && graph_[n.inputs[k]].packed) lifetime_.settle(n.inputs[k]);
      if ((n.reads & reads_output) && n.packed) lifetime_.settle(i);
      return;
    }
    for (int k = 0; k < n.arity; ++k)
      if (n.reads & reads_input(k)) lifetime_.unpin(n.inputs[k]);
    if (n.reads & reads_output) lifetime_.unpin(i);
  }

  bool residuals_present(const Node<T>& n) const {
    for (int k = 0; k < n.arity; ++k)
      if ((n.reads & reads_input(k)) && !graph_[n.inputs[k]].value) return false;
    if ((n.reads & reads_output) && !n.value) return false;
    return !(n.reads & reads_extra) || n.extra;
  }
};

}  // namespace remat::detail
