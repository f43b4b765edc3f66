// TapeFigures<T>: what a tape reports, over TapeCore's state (detail/tape_core.hpp): memory() and the buffers it counts
// as saved, each with its reason (saved_residuals), the checkpoint diagnostics, and what the schedules measure (the
// live bytes, the peak of a stretch of recording, a node's cost for checkpoint_sequential_auto's planner). A layer
// between TapeSweeps (tape_sweeps.hpp) and TapeState (tape_state.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "remat/detail/buffers.hpp"
#include "remat/detail/eviction.hpp"
#include "remat/detail/node.hpp"
#include "remat/detail/tape_core.hpp"
#include "remat/detail/tape_sweeps.hpp"
#include "remat/diagnostics.hpp"
#include "remat/memory.hpp"

namespace remat::detail {

template <class T>
class TapeFigures : public TapeSweeps<T> {
 public:
  /// Backwards that skipped their dry run as redundant (detail/dry_run_cache.hpp; tests).
  std::size_t dry_runs_skipped() const { return sweep_.dry_runs_skipped(); }

  MemoryStats memory() const {
    MemoryStats m;
    m.live_bytes = buffers_.live_bytes();
    m.peak_bytes = buffers_.reported_peak_bytes();
    for (const Node<T>& n : graph_.nodes) {
      if (lifetime_.saved_value(n)) m.saved_bytes += Buffers<T>::bytes(n.shape);
      if (lifetime_.saved_packed(n)) m.saved_bytes += lifetime_.packed_bytes(n);
      if (lifetime_.saved_extra(n)) m.saved_bytes += Buffers<T>::bytes(n.extra_shape);
    }
    m.replayed_bytes = sweep_.replayed_bytes();
    m.replayed_ops = sweep_.replayed_ops();
    m.replayed_flops = sweep_.replayed_flops();
    m.cached_bytes = buffers_.cached_bytes();
    const typename Evictor<T>::Counters c = evictor_.counters();
    m.evictions = c.evictions;
    m.rematerialized_ops = c.ops;
    m.rematerialized_bytes = c.bytes;
    m.rematerialized_flops = c.flops;
    return m;
  }

  /// The buffers memory().saved_bytes counts, with the reason each is kept (detail/reports.hpp).
  std::vector<SavedResidual> saved_residuals() const { return reports_.saved_residuals(); }
  /// Findings about the closed regions, with node `loss` as the loss (CheckpointDiagnostic). Does not
  /// change the tape.
  std::vector<CheckpointDiagnostic> diagnostics(std::int32_t loss) const { return reports_.diagnostics(loss); }
  /// Sends the findings not reported yet to the diagnostics handler (Reports::report). Before a backward.
  void report_diagnostics(std::int32_t loss) { reports_.report(loss); }
  void set_diagnostics_handler(std::function<void(const CheckpointDiagnostic&)> handler) {
    reports_.set_handler(std::move(handler));
  }

  /// For schedules (checkpoint_sequential_auto's probe): the live bytes now, and the peaks of a stretch of
  /// recording: begin_peak_measure() starts it (peak_bytes drops to live_bytes) and returns what
  /// end_peak_measure(saved) restores (the larger peak stays) after returning the stretch's peak and the
  /// peak it would have had if the values and extras it freed that a backward reads had stayed
  /// (Buffers::Measure). Stretches nest.
  std::size_t live_bytes() const { return buffers_.live_bytes(); }
  typename Buffers<T>::Measure begin_peak_measure() noexcept { return buffers_.begin_measure(); }
  typename Buffers<T>::Measure end_peak_measure(const typename Buffers<T>::Measure& saved) noexcept {
    return buffers_.end_measure(saved);
  }

  /// For schedules: the node whose buffer node `id`'s value is, as recorded: `id`, or for a view (OpBase::view)
  /// its input 0's, followed through views to the buffer's owner (its root, docs/design.md §2.5).
  std::int32_t buffer_of(std::int32_t id) const {
    while (graph_[id].is_view()) id = graph_[id].inputs[0];
    return id;
  }

  /// For schedules: the cost of node `id` as checkpoint_sequential_auto's planner models it.
  NodeCost cost(std::int32_t id) const {
    const Node<T>& n = graph_[id];
    NodeCost c;
    c.leaf = n.is_leaf();
    c.bytes = n.is_view() ? 0 : Buffers<T>::bytes(n.shape);  // a view's buffer is its root's, counted once
    c.buffer = buffer_of(id);
    if (c.leaf) return c;
    c.flops = recorder_.op_info(n).flops;
    c.value_read = n.backward_reads > 0;
    if (n.extra_read) c.extra_read_bytes = Buffers<T>::bytes(n.extra_shape);
    return c;
  }

 protected:
  using Base = TapeSweeps<T>;
  using Base::Base;
  using Base::graph_, Base::buffers_, Base::lifetime_, Base::evictor_, Base::recorder_, Base::sweep_, Base::reports_;
};

}  // namespace remat::detail
