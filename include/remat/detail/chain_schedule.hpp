// Chain schedules, the sweep layer that runs a chain region by its schedule (run_schedule, ChainPlan): the
// holds on the layers' activations, and F_i / Fall_i, which recompute one layer. Apart from region replays
// because a schedule decides what to recompute and hold layer by layer (docs/schedules.md).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "remat/detail/levels.hpp"
#include "remat/detail/replay.hpp"
#include "remat/detail/replay_plan.hpp"

namespace remat::detail {

template <class T>
class ChainSchedule : public Replays<T> {
 public:
  using Replays<T>::Replays;

 protected:
  using Replays<T>::graph_, Replays<T>::lifetime_, Replays<T>::evictor_;  // SweepState
  using Replays<T>::members_, Replays<T>::uses_, Replays<T>::computed_inputs_, Replays<T>::replayed_bytes_,
      Replays<T>::replayed_ops_, Replays<T>::replayed_flops_;  // Replays

  // The forward pass kept what the schedule holds at its first backward: the activations in plan.held
  // (schedule holds) and the full tapes of the layers whose ops the region saved. From there the sweep
  // runs the schedule's operations: F_i recomputes layer i keeping only x_i, Fall_i keeps its residuals
  // too, B_i is the ordinary sweep over layer i's nodes, and a free releases x_i. chain_held_[i] says
  // whether this sweep holds x_i: 1 the forward pass's hold, 2 one an operation took.

  void hold_activation(const ChainPlan& plan, int i) noexcept {
    std::uint8_t& held = chain_held_[static_cast<std::size_t>(i)];
    if (held != 0) return;
    for (int k = 0; k < plan.width; ++k) lifetime_.add_schedule_hold(plan.output(i, k));
    held = 2;
  }
  /// The schedule is done with x_i: its hold goes, at level depth − 1, where a value of the chain stays only
  /// for a handle or a running op. With retain_graph the forward pass's hold stays for the next backward.
  void release_activation(const ChainPlan& plan, int i, SweepMode mode, int depth) noexcept {
    std::uint8_t& held = chain_held_[static_cast<std::size_t>(i)];
    if (held == 0) return;
    const bool physical = held == 2 || !mode.retain_graph;
    held = 0;
    if (!physical) return;
    for (int m = 0; m < plan.width; ++m) {
      const std::int32_t id = plan.output(i, m);
      // x_i stays as a residual of its layer's tape if the schedule keeps that (x_i may be an earlier layer's
      // output: a layer may return its input).
      bool residual = false;
      for (int k = i; k >= 1 && !residual; --k)
        if (plan.layer_begin[static_cast<std::size_t>(k - 1)] <= id &&
            id < plan.layer_begin[static_cast<std::size_t>(k)])
          residual = chain_tape_[static_cast<std::size_t>(k)] != 0;
      lifetime_.release_schedule_hold_at(id, residual ? depth : depth - 1);
    }
  }
  /// A chain no gradient reaches: the forward pass's holds go unless retain_graph keeps them.
  void release_forward_holds(const Region& r, SweepMode mode) noexcept {
    if (mode.retain_graph) return;
    const ChainPlan& plan = graph_.chain_plans[static_cast<std::size_t>(r.plan)];
    lifetime_.set_level(r.depth - 1);
    for (int i = 0; i <= plan.length(); ++i)
      if (plan.held[static_cast<std::size_t>(i)])
        for (int k = 0; k < plan.width; ++k) lifetime_.release_schedule_hold(plan.output(i, k));
    lifetime_.set_level(r.depth);
  }

  /// F_i (`all` false: at level depth − 1, so that only x_i, held, stays) or Fall_i (at the chain's level:
  /// the values layer i's backward reads stay too). Runs the layer's ops that what stays needs and that are
  /// not there, freeing each transient after its last use, as a replay does.
  void recompute_layer(const ChainPlan& plan, int i, bool all, int depth) noexcept {
    const std::int32_t begin = plan.layer_begin[static_cast<std::size_t>(i - 1)],
                       end = plan.layer_begin[static_cast<std::size_t>(i)];
    const PresentNow present{depth};
    uses_.assign(static_cast<std::size_t>(end - begin), 0);  // within capacity
    computed_inputs_.assign(static_cast<std::size_t>(end - begin), 0);
    members_.clear();
    auto target = [&](std::int32_t u) {
      const Node<T>& n = graph_[u];
      for (int k = 0; k < plan.width; ++k)
        if (u == plan.output(i, k) && !present.value(graph_, u, u)) return true;
      return all && ((read_at_or_below(graph_, n, depth) && !present.value(graph_, u, u)) ||
                     (n.level <= depth && n.extra_read && !present.extra(n)));
    };
    for (std::int32_t u = end - 1; u >= begin; --u) {
      const Node<T>& n = graph_[u];
      if (n.is_leaf() || (uses_[static_cast<std::size_t>(u - begin)] == 0 && !target(u))) continue;
      members_.push_back(u);
      for (int k = 0; k < n.arity; ++k) {
        const std::int32_t w = n.inputs[k];
        if (present.value(graph_, w, u) || w < begin) continue;  // an absent input outside: regenerated
        ++uses_[static_cast<std::size_t>(w - begin)];
        computed_inputs_[static_cast<std::size_t>(u - begin)] |= static_cast<std::uint8_t>(1u << k);
      }
    }
    std::reverse(members_.begin(), members_.end());
    // F_i: what it computed goes after its last use unless held (below the chain's level, where only
    // handles, running ops and the schedule's holds keep a value). Only layer i's own nodes: an input may be
    // a residual of a tape the schedule keeps (x_{i−1} inside x̄_{i−1}).
    auto done = [&](std::int32_t u) {
      if (!all) lifetime_.settle_at(u, depth - 1);
    };
    for (std::int32_t u : members_) {
      const Node<T>& n = graph_[u];
      evictor_.compute(u, false);
      replayed_bytes_ += (n.is_view() ? 0 : Buffers<T>::bytes(n.shape)) + Buffers<T>::bytes(n.extra_shape);
      replayed_flops_ += n.cost - op_overhead_flops;  // its FLOP estimate (Node::cost)
      ++replayed_ops_;
      const std::uint8_t computed = computed_inputs_[static_cast<std::size_t>(u - begin)];
      for (int k = 0; k < n.arity; ++k) {
        if (!(computed & (1u << k))) continue;  // read as it was there, not as this computes it
        const std::int32_t w = n.inputs[k];
        std::int32_t& left = uses_[static_cast<std::size_t>(w - begin)];
        if (--left == 0) {
          lifetime_.unpin(w);
          done(w);
        }
      }
      if (uses_[static_cast<std::size_t>(u - begin)] > 0) {
        lifetime_.pin(u);
      } else {
        lifetime_.settle(u);
        done(u);
      }
    }
    if (all) chain_tape_[static_cast<std::size_t>(i)] = 1;
  }

  std::vector<std::uint8_t> chain_held_, chain_tape_;  // run_chain's scratch
};

}  // namespace remat::detail
