// Replays, the sweep layer that regenerates a checkpoint region's values by re-running its recorded ops
// (never the user's function) as the sweep enters the region, and counts what replays cost (memory()'s
// replayed_*). Apart from the pass because which ops run is the replay plan's (detail/replay_plan.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "remat/detail/gradient_delivery.hpp"
#include "remat/detail/replay_plan.hpp"

namespace remat::detail {

template <class T>
class Replays : public GradientDelivery<T> {
 public:
  using GradientDelivery<T>::GradientDelivery;

  std::size_t replayed_bytes() const { return replayed_bytes_; }
  std::size_t replayed_ops() const { return replayed_ops_; }
  double replayed_flops() const { return replayed_flops_; }

 protected:
  using GradientDelivery<T>::graph_, GradientDelivery<T>::lifetime_, GradientDelivery<T>::evictor_;  // SweepState

  /// Regenerates the values of region r that are needed at its level and missing, by re-running the
  /// recorded ops (never the user's function); transients go after their last use, pinned until then (so
  /// that an eviction leaves them). An evicted value counts as there: it is regenerated when read.
  void replay(const Region& r) noexcept {
    uses_.assign(static_cast<std::size_t>(r.end - r.begin), 0);  // within capacity
    computed_inputs_.assign(static_cast<std::size_t>(r.end - r.begin), 0);
    plan_replay(graph_, r, PresentNow{r.depth}, members_, uses_, computed_inputs_);
    for (std::int32_t u : members_) {
      const Node<T>& n = graph_[u];
      evictor_.compute(u, false);
      replayed_bytes_ += (n.is_view() ? 0 : Buffers<T>::bytes(n.shape)) + Buffers<T>::bytes(n.extra_shape);
      replayed_flops_ += n.cost - op_overhead_flops;  // its FLOP estimate (Node::cost)
      ++replayed_ops_;
      const std::uint8_t computed = computed_inputs_[static_cast<std::size_t>(u - r.begin)];
      for (int k = 0; k < n.arity; ++k) {
        if (!(computed & (1u << k))) continue;  // read as it was there, not as the replay computes it
        const std::int32_t w = n.inputs[k];
        std::int32_t& left = uses_[static_cast<std::size_t>(w - r.begin)];
        if (--left == 0) lifetime_.unpin(w);
      }
      if (uses_[static_cast<std::size_t>(u - r.begin)] > 0)
        lifetime_.pin(u);
      else
        lifetime_.settle(u);
    }
  }

  std::vector<std::int32_t> members_, uses_;   // replay scratch
  std::vector<std::uint8_t> computed_inputs_;  // replay scratch (plan_replay)
  std::size_t replayed_bytes_ = 0, replayed_ops_ = 0;
  double replayed_flops_ = 0;
};

}  // namespace remat::detail
