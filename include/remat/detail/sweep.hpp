// The backward sweep: one reverse pass over the nodes, replaying each checkpoint region as the sweep
// enters it and releasing what it read as it goes. This file holds the pass; its layers hold the rest
// (sweep_state.hpp, gradient_delivery.hpp, replay.hpp, chain_schedule.hpp, dry_run_cache.hpp, node_backward.hpp).
//
// Strong exception safety: before changing anything, the sweep runs once as a dry run (same code, kernels
// skipped, buffers only counted) to learn how many buffers of each size it will need, and makes the pool
// hold them. The real pass then never reaches the system allocator and cannot throw, so a std::bad_alloc
// from a backward leaves the tape exactly as it was. Under a memory budget the dry run also makes every
// eviction and regeneration the real pass will make (detail/eviction.hpp: the same calls, deterministic),
// so a budget the backward cannot meet throws memory_budget_error from it, before anything changed. The
// dry run is skipped when it is redundant (detail/dry_run_cache.hpp).
#pragma once

#include <algorithm>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "remat/detail/buffers.hpp"
#include "remat/detail/dry_run_cache.hpp"
#include "remat/detail/eviction.hpp"
#include "remat/detail/levels.hpp"
#include "remat/detail/lifetime.hpp"
#include "remat/detail/node.hpp"
#include "remat/detail/node_backward.hpp"
#include "remat/detail/trace.hpp"
#include "remat/errors.hpp"
#include "remat/op_context.hpp"

namespace remat::detail {

template <class T>
class Sweep : public NodeBackward<T> {
 public:
  using NodeBackward<T>::NodeBackward;
  using NodeBackward<T>::wanted;
  using NodeBackward<T>::keep;

  /// Sweeps from `loss`. Throws std::bad_alloc (or shape_error for a Parameter gradient of the wrong size)
  /// before changing anything; cannot fail once it starts changing the tape. A gradient-ready callback that
  /// throws does not stop the sweep: the first such exception is kept (later callbacks are not called) and
  /// callback_error() returns it once the sweep has completed. On a shapes-only tape the sweep is the dry
  /// run's pass, counted in the tape's own figures and kept (no callback is called). Under a memory budget
  /// that the sweep cannot meet, throws memory_budget_error naming `what` from the dry run, before any change.
  void run(std::int32_t loss, SweepMode mode, const char* what = "backward") {
    prepare(loss, mode);
    if (buffers_.shapes_only()) {
      if (evictor_.active()) {
        simulate(loss, mode);
        if (evictor_.failed()) {
          evictor_.forget_choices();
          evictor_.throw_failure(what);
        }
        evictor_.repeat_choices();
      }
      count_only(loss, mode);
      evictor_.forget_choices();
      return;
    }
    if (redundant_) {
      ++dry_runs_skipped_;
      predicted_peak_ = buffers_.peak_after_rise(cached_rise_);
      evictor_.clear_failure();
      check_skip(loss, mode);
      pass(loss, mode);
      return;
    }
    simulate(loss, mode);
    if (evictor_.failed()) {
      evictor_.forget_choices();
      evictor_.throw_failure(what);
    }
    remember_dry_run();
    try {
      buffers_.reserve_simulated();
    } catch (...) {
      evictor_.forget_choices();
      throw;
    }
    evictor_.repeat_choices();  // the real pass makes the dry run's choices
    pass(loss, mode);
    evictor_.forget_choices();
    assert(!evictor_.failed() && "the real pass met the budget its dry run met");
  }

  /// The peak live bytes the last run's dry run predicted (equal to what the real pass reached).
  std::size_t predicted_peak_bytes() const { return predicted_peak_; }

 private:
  using Base = NodeBackward<T>;
  // What the layers below hold, by layer (a dependent base's names need a using-declaration).
  using Base::chain_held_, Base::chain_tape_, Base::hold_activation, Base::release_activation,
      Base::release_forward_holds, Base::recompute_layer;  // ChainSchedule
  using Base::graph_, Base::buffers_, Base::lifetime_, Base::evictor_, Base::simulating, Base::simulation_,
      Base::next_simulation_serial, Base::running_;  // SweepState
  using Base::members_, Base::uses_, Base::computed_inputs_, Base::replayed_bytes_, Base::replayed_ops_,
      Base::replayed_flops_, Base::replay;  // Replays
  using Base::ready_callbacks_active, Base::prepare_deliveries, Base::prepare_ready_callbacks, Base::hold_parameters,
      Base::release_parameters, Base::set_aside_accumulated_gradients, Base::finish_leaf,
      Base::stash_;  // GradientDelivery
  using Base::signature_header, Base::signature_words, Base::sign_node, Base::signature_, Base::cached_signature_,
      Base::cached_demand_, Base::cached_rise_, Base::signable_, Base::redundant_, Base::dry_run_redundant,
      Base::remember_dry_run, Base::dry_runs_skipped_, Base::begin_signature,
      Base::end_signature;  // DryRunCache

  using Base::sweep_op;  // NodeBackward

  /// Everything that may allocate or throw, before the tape changes; and the signature.
  void prepare(std::int32_t loss, SweepMode mode) {
    const auto count = static_cast<std::size_t>(graph_.size());
    entering_.clear();
    leaving_.clear();
    entering_.reserve(graph_.regions.size());
    leaving_.reserve(graph_.regions.size());
    std::size_t longest = 0, variables = 0;
    for (std::int32_t r = 0; r < static_cast<std::int32_t>(graph_.regions.size()); ++r) {
      const Region& region = graph_.region(r);
      if (region.end <= region.begin) continue;
      entering_.push_back(r);
      leaving_.push_back(r);
      longest = std::max(longest, static_cast<std::size_t>(region.end - region.begin));
    }
    std::sort(entering_.begin(), entering_.end(), [&](std::int32_t a, std::int32_t b) {
      const Region &ra = graph_.region(a), &rb = graph_.region(b);
      return ra.end != rb.end ? ra.end > rb.end : ra.depth < rb.depth;
    });
    std::sort(leaving_.begin(), leaving_.end(), [&](std::int32_t a, std::int32_t b) {
      const Region &ra = graph_.region(a), &rb = graph_.region(b);
      return ra.begin != rb.begin ? ra.begin > rb.begin : ra.depth > rb.depth;
    });
    members_.reserve(longest);
    uses_.reserve(longest);
    computed_inputs_.reserve(longest);
    std::size_t chain = 0;
    for (const ChainPlan& plan : graph_.chain_plans) chain = std::max(chain, plan.held.size());
    chain_held_.reserve(chain);
    chain_tape_.reserve(chain);
    snapshot_.resize(count);
    tier_snapshot_.reserve(graph_.tier_holds.size());  // simulate() cannot throw
    std::uint64_t* sig = begin_signature(loss, mode);
    bool signable = true;
    const std::uint8_t *wanted_bits = wanted.data(), *keep_bits = keep.data();
    bool evicted = false;
    for (std::int32_t i = 0; i < graph_.size(); ++i) {
      const Node<T>& n = graph_[i];
      if (n.is_variable) ++variables;
      evicted = evicted || n.evicted;
      if (n.parameter && n.parameter->grad_defined && n.parameter->grad_size != n.shape.numel())
        throw shape_error("backward: the gradient of the Parameter recorded as node #" + std::to_string(i) + " has " +
                          std::to_string(n.parameter->grad_size) + " elements but its value is " + to_string(n.shape) +
                          "; call zero_grad() after resizing a parameter");
      signable = sign_node(n, wanted_bits[i], keep_bits[i], sig) && signable;
      sig += signature_words;
    }
    end_signature(sig);
    // The budget's work lists and side table (Graph::budget): for its evictions, for regenerating what it evicted
    // even once it is lifted, and for a chain's schedule, which regenerates an input outside a layer it freed
    // (recompute_layer) with or without a budget.
    if (evictor_.active() || evicted || !graph_.chain_plans.empty()) evictor_.reserve(count);
    budget_snapshot_.resize(graph_.budget.size());  // the side table's classes, if it has started (simulate)
    for (const Region& r : graph_.regions) signable = signable && r.plan < 0;  // a chain's schedule: not signed
    signable_ = signable;
    redundant_ = dry_run_redundant();
    // A redundant dry run's sizes are those of the dry run it repeats, already prepared (and the safety
    // net's dry run, check_skip, finds them there).
    if (!redundant_)
      for (const Node<T>& n : graph_.nodes) {
        buffers_.prepare_simulation(static_cast<std::size_t>(n.shape.numel()));
        if (n.extra_shape.numel() > 0) buffers_.prepare_simulation(static_cast<std::size_t>(n.extra_shape.numel()));
        if (n.scratch_shape.numel() > 0) buffers_.prepare_simulation(static_cast<std::size_t>(n.scratch_shape.numel()));
        if (n.stored != 0) buffers_.prepare_simulation(lifetime_.packed_bytes(n) / sizeof(T));
      }
    if (cached_demand_.capacity() < buffers_.simulated_sizes())  // remember_dry_run cannot throw
      cached_demand_.reserve(2 * buffers_.simulated_sizes());
    stash_.reserve(variables);
    prepare_deliveries(loss, mode);
    prepare_ready_callbacks(mode);
  }

  /// The safety net of a skipped dry run, with assertions on: the dry run runs all the same and must find
  /// exactly what the skip assumed (every test that repeats a backward checks the signature is complete).
  void check_skip([[maybe_unused]] std::int32_t loss, [[maybe_unused]] SweepMode mode) noexcept {
#ifndef NDEBUG
    const std::size_t assumed_peak = predicted_peak_;
    simulate(loss, mode);
    assert(predicted_peak_ == assumed_peak && "a skipped dry run would have predicted another peak");
    assert(buffers_.simulated_rise() == cached_rise_ && "a skipped dry run would have found another rise");
    std::size_t k = 0;
    buffers_.for_each_simulated_demand([&](const typename Buffers<T>::Demand& d) {
      [[maybe_unused]] const bool same =
          k < cached_demand_.size() ? d == cached_demand_[k] : d.high == 0 && d.forced == 0;
      assert(same && "a skipped dry run would have found another demand on the pool");
      assert(buffers_.covers(d) && "a skipped dry run would have reserved buffers");
      ++k;
    });
#endif
  }

  /// The dry run: the same pass with kernels skipped and buffers counted, then everything put back.
  void simulate(std::int32_t loss, SweepMode mode) noexcept {
    evictor_.prepare_classes();
    for (std::int32_t i = 0; i < graph_.size(); ++i)
      snapshot_[static_cast<std::size_t>(i)] = NodeSnapshot<T>::of(graph_[i]);
    for (std::size_t i = 0; i < graph_.budget.size(); ++i) budget_snapshot_[i] = BudgetSnapshot::of(graph_.budget[i]);
    tier_snapshot_.assign(graph_.tier_holds.begin(), graph_.tier_holds.end());  // within capacity
    // The pass counts replayed bytes and ops: keep the last backward's until the real pass, so that a
    // reservation that fails leaves memory() as it was. The same for the evictions' counters and clock.
    const std::size_t replayed_bytes = replayed_bytes_, replayed_ops = replayed_ops_;
    const double replayed_flops = replayed_flops_;
    const typename Evictor<T>::Counters evictions = evictor_.counters();
    evictor_.clear_failure();
    simulation_ = next_simulation_serial();
    buffers_.begin_simulation();
    if (evictor_.active()) evictor_.record_choices();
    pass(loss, mode);
    predicted_peak_ = buffers_.end_simulation();
    simulation_ = 0;
    replayed_bytes_ = replayed_bytes;
    replayed_ops_ = replayed_ops;
    replayed_flops_ = replayed_flops;
    evictor_.restore(evictions);
    for (std::int32_t i = 0; i < graph_.size(); ++i) snapshot_[static_cast<std::size_t>(i)].restore(graph_[i]);
    for (std::size_t i = 0; i < graph_.budget.size(); ++i) budget_snapshot_[i].restore(graph_.budget[i]);
    std::copy(tier_snapshot_.begin(), tier_snapshot_.end(), graph_.tier_holds.begin());
    stash_.clear();
  }

  /// A shapes-only tape's backward: the dry run's pass (kernels skipped, Parameters untouched), not undone.
  /// Its buffers are placeholders counted as the real pass counts them, so memory() after it is what the
  /// same backward on a tape that computes reports.
  void count_only(std::int32_t loss, SweepMode mode) noexcept {
    simulation_ = next_simulation_serial();
    pass(loss, mode);
    predicted_peak_ = buffers_.peak_bytes();
    simulation_ = 0;
    stash_.clear();
  }

  void pass(std::int32_t loss, SweepMode mode) noexcept {
    running_ = !simulating();
    replayed_bytes_ = 0;
    replayed_ops_ = 0;
    replayed_flops_ = 0;
    if (!mode.accumulate) set_aside_accumulated_gradients();
    seed(loss);
    enter_ = entering_.begin();
    leave_ = leaving_.begin();
    lifetime_.set_level(0);
    const bool hold = !simulating() && ready_callbacks_active(mode);
    if (hold) hold_parameters();
    sweep_nodes(graph_.size() - 1, 0, -1, mode);
    if (hold) release_parameters();
    lifetime_.set_level(0);
    running_ = false;
  }

  /// Nodes hi down to lo, entering each region as its last node comes (and replaying it, or running its
  /// chain's schedule) and leaving it after its first, except region `stop` (left by the caller).
  void sweep_nodes(std::int32_t hi, std::int32_t lo, std::int32_t stop, SweepMode mode) noexcept {
    for (std::int32_t i = hi; i >= lo; --i) {
      bool scheduled = false;
      for (; enter_ != entering_.end() && graph_.region(*enter_).end - 1 == i; ++enter_) {
        const Region& r = graph_.region(*enter_);
        lifetime_.set_level(r.depth);
        if (r.plan >= 0) {
          // The regions inside the chain are entered by its layers' backwards.
          const std::int32_t chain = *enter_++;
          if (receives_gradient(r)) {
            run_chain(chain, mode);
          } else {
            sweep_nodes(i, r.begin, chain, mode);
            release_forward_holds(r, mode);
          }
          i = r.begin;
          scheduled = true;
          break;
        }
        if (r.replays && receives_gradient(r)) replay(r);
      }
      if (!scheduled) {
        if (graph_[i].is_leaf())
          finish_leaf(i, mode);
        else
          sweep_op(i, mode);
      }
      for (; leave_ != leaving_.end() && graph_.region(*leave_).begin == i && *leave_ != stop; ++leave_)
        leave_region(*leave_, mode);
    }
  }

  /// A chain region run by its schedule (detail/chain_schedule.hpp).
  void run_chain(std::int32_t rid, SweepMode mode) noexcept {
    const Region& r = graph_.region(rid);
    const ChainPlan& plan = graph_.chain_plans[static_cast<std::size_t>(r.plan)];
    chain_held_.assign(plan.held.begin(), plan.held.end());  // within capacity
    chain_tape_.assign(plan.tapes.begin(), plan.tapes.end());
    for (const ChainPlan::Operation& op : plan.operations) {
      switch (op.kind) {
        case ChainPlan::Operation::forward:
        case ChainPlan::Operation::forward_all:
          hold_activation(plan, op.layer);
          recompute_layer(plan, op.layer, op.kind == ChainPlan::Operation::forward_all, r.depth);
          break;
        case ChainPlan::Operation::backward: {
          const std::int32_t begin = plan.layer_begin[static_cast<std::size_t>(op.layer - 1)],
                             end = plan.layer_begin[static_cast<std::size_t>(op.layer)];
          sweep_nodes(end - 1, begin, rid, mode);
          chain_tape_[static_cast<std::size_t>(op.layer)] = 0;
          release_activation(plan, op.layer, mode, r.depth);
          if (mode.retain_graph) {
            // The residuals' holds stay for the next backward; what this schedule recomputed goes.
            for (std::int32_t i = begin; i < end; ++i)
              if (graph_[i].level >= r.depth) lifetime_.settle_at(i, r.depth - 1);
          }
          break;
        }
        case ChainPlan::Operation::free_activation:
          release_activation(plan, op.layer, mode, r.depth);
          break;
      }
    }
    for (int i = 0; i <= plan.length(); ++i) release_activation(plan, i, mode, r.depth);
  }

  void seed(std::int32_t loss) noexcept {
    Node<T>& l = graph_[loss];
    if (!l.grad) {
      evictor_.make_room(Buffers<T>::bytes(l.shape));
      l.grad = buffers_.allocate(l.shape);
    }
    if (!simulating()) {
      if (graph_.trace) graph_.trace->log_seed(graph_, loss);
      l.grad[0] = l.grad_assigned ? l.grad[0] + T(1) : T(1);
    }
    l.grad_assigned = true;
  }

  bool receives_gradient(const Region& r) const {
    for (std::int32_t i = r.begin; i < r.end; ++i)
      if (graph_[i].grad && wanted[static_cast<std::size_t>(i)]) return true;
    return false;
  }

  void leave_region(std::int32_t rid, SweepMode mode) noexcept {
    const Region& r = graph_.region(rid);
    if (!mode.retain_graph)
      for (std::int32_t k = r.sources_begin; k < r.sources_end; ++k)
        lifetime_.release_replay_read(graph_.region_sources[static_cast<std::size_t>(k)],
                                      graph_.source_readers[static_cast<std::size_t>(k)]);
    lifetime_.set_level(r.depth - 1);
    // With retain_graph the holds stay; what this region's replay regenerated goes now all the same.
    if (mode.retain_graph)
      for (std::int32_t i = r.begin; i < r.end; ++i)
        if (graph_[i].level >= r.depth) lifetime_.settle(i);
  }

  std::vector<std::int32_t> entering_, leaving_;  // regions by the order the sweep enters / leaves them
  typename std::vector<std::int32_t>::const_iterator enter_, leave_;  // the pass's next region to enter / leave
  std::vector<NodeSnapshot<T>> snapshot_;
  std::vector<BudgetSnapshot> budget_snapshot_;  // parallel to Graph::budget
  std::vector<std::int32_t> tier_snapshot_;      // Graph::tier_holds before a dry run
  std::size_t predicted_peak_ = 0;
};

}  // namespace remat::detail
