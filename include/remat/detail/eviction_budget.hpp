// The memory budget's bookkeeping, a layer of the evictor (detail/eviction.hpp) between the choice of victims
// (EvictorChoice, eviction_choice.hpp) and Evictor: the budget and its heuristic, making room within it by
// evictions (make_room), what the evictions did (memory()), a failure to meet the budget, noted and reported, the
// room every path into eviction or regeneration reserves first, and trials, with the log of their choices.
//
// Trials. Every choice depends only on the tape's state (shapes, FLOP estimates, a logical clock), never on time or
// addresses. An allocation that may need evictions or regenerations first runs as a trial (trial(): the same code
// with kernels skipped and buffers only counted, then every node it changed put back from a journal), which throws
// memory_budget_error if the budget cannot be met, and learns the pool buffers the real run will take; the real run
// then repeats the trial's choices (from its log of victims) and cannot fail. The backward's dry run is such a trial
// of the whole sweep (detail/sweep.hpp).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "remat/detail/buffers.hpp"
#include "remat/detail/eviction_choice.hpp"
#include "remat/detail/lifetime.hpp"
#include "remat/detail/node.hpp"
#include "remat/detail/parameter_check.hpp"
#include "remat/errors.hpp"
#include "remat/memory.hpp"

namespace remat::detail {

template <class T>
class EvictorBudget : public EvictorChoice<T> {
 public:
  using EvictorChoice<T>::EvictorChoice;
  using EvictorChoice<T>::invalidate_bounds;

  // ---- the budget ----
  /// 0: no budget.
  std::size_t budget() const { return budget_; }
  EvictionHeuristic heuristic() const { return heuristic_; }
  void set_budget(std::size_t bytes, EvictionHeuristic h) {
    budget_ = bytes;
    heuristic_ = h;
    lifetime_.set_room_maker(bytes != 0 ? &make_room_for : nullptr, this);
  }
  bool active() const { return budget_ != 0; }

  // ---- what it did (memory()) ----
  /// Its state besides the nodes': what a trial or a dry run puts back.
  struct Counters {
    std::size_t evictions = 0, ops = 0, bytes = 0;
    double flops = 0;
    std::uint64_t clock = 0;
    std::uint64_t class_leaves = 0, classes_exact_at = 0;
  };
  Counters counters() const {
    return {evictions_, rematerialized_ops_,      rematerialized_bytes_, rematerialized_flops_,
            clock_,     lifetime_.class_leaves(), classes_exact_at_};
  }
  void restore(const Counters& c) {
    evictions_ = c.evictions;
    rematerialized_ops_ = c.ops;
    rematerialized_bytes_ = c.bytes;
    rematerialized_flops_ = c.flops;
    clock_ = c.clock;
    lifetime_.set_class_leaves(c.class_leaves);
    classes_exact_at_ = c.classes_exact_at;
    invalidate_bounds();  // the nodes were put back: what was freed since may be resident again
  }
  /// The tape was cleared: nothing is evicted, so the classes are exact (each node its own).
  void reset_counters() {
    evictions_ = rematerialized_ops_ = rematerialized_bytes_ = 0;
    rematerialized_flops_ = 0;
    classes_exact_at_ = lifetime_.class_leaves();
  }
  /// Before a trial or a dry run: h_DTR's classes made exact now, outside it, so that what it puts back is exact
  /// classes (a rebuild inside it would be undone with it, and redone by the next one). Never throws.
  void prepare_classes() noexcept {
    if (active() && heuristic_ == EvictionHeuristic::dtr && classes_exact_at_ != lifetime_.class_leaves())
      rebuild_classes();
  }

  // ---- failures, noted by make_room() and reported after a trial or a dry run ----
  bool failed() const { return failed_; }
  void clear_failure() { failed_ = false; }
  /// Throws memory_budget_error for the failure the last trial or dry run noted; `what` names the call.
  [[noreturn]] void throw_failure(const char* what) const {
    throw memory_budget_error(
        std::string(what) + ": the memory budget of " + std::to_string(budget_) +
            " bytes cannot hold an allocation of " + std::to_string(failed_needed_) +
            " bytes: " + std::to_string(failed_least_ - failed_needed_) +
            " bytes are live that no eviction can free then (leaves, gradients, op extras, the values the running op "
            "or regeneration reads, values that cannot be regenerated), so that allocation needs a budget of at "
            "least " +
            std::to_string(failed_least_) + " bytes; raise the budget (Tape::set_memory_budget) or clear() the tape",
        budget_, failed_needed_, failed_least_);
  }

  /// Room for the scratch of a trial, a regeneration and a victim scan on a graph of `nodes` nodes, and the
  /// side table of the nodes' budget state (Graph::budget), started if need be: every path into eviction or
  /// regeneration comes through here first. Throws std::bad_alloc, before any change.
  void reserve(std::size_t nodes) {
    graph_.track_budget(nodes);
    lifetime_.reserve(nodes);
    for (std::vector<std::int32_t>* v : {&members_, &work_, &walk_, &stack_, &held_, &views_})
      if (v->capacity() < nodes) v->reserve(std::max(nodes, 2 * v->capacity()));
    const std::size_t choices = std::max(nodes, choices_wanted_);
    if (choices_.capacity() < choices) choices_.reserve(std::max(choices, 2 * choices_.capacity()));
  }

  // ---- the choices of a trial or a dry run, repeated by the real run ----
  // The real run after a trial (or a backward's real pass after its dry run) makes the same calls on the same
  // state, so it would choose the same victims: it takes them from this log instead of scanning again (with
  // assertions on, it scans all the same and checks). A log that outgrew its capacity holds the first choices;
  // the real run scans for the rest (and reserve() makes room for them the next time).
  /// From now on each victim chosen is logged (the log restarts). Never throws.
  void record_choices() noexcept {
    choices_.clear();
    choices_next_ = 0;
    choices_state_ = ChoicesState::recording;
  }
  /// The calls that follow repeat the recorded ones: their victims come from the log. Never throws.
  void repeat_choices() noexcept {
    choices_next_ = 0;
    choices_state_ = ChoicesState::repeating;
  }
  /// Stops logging or repeating. Never throws.
  void forget_choices() noexcept {
    choices_.clear();
    choices_state_ = ChoicesState::off;
  }

  /// Runs `body` (eviction, regeneration and allocation calls) as a trial: buffers only counted, kernels
  /// skipped, and every node it changed, the clock and the counters put back afterwards (the nodes from the
  /// journal Lifetime::note keeps: the cost is the nodes the body touched, not the tape); then throws
  /// memory_budget_error naming `what` if the budget could not be met, else leaves in the pool's simulation
  /// the buffers the same body will take (Buffers::reserve_simulated). Call reserve() first.
  template <class Body>
  void trial(const char* what, Body&& body) {
    prepare_classes();
    const Counters before = counters();
    failed_ = false;
    stale_ = -1;
    buffers_.begin_simulation();
    lifetime_.begin_journal();
    record_choices();
    try {
      body();
    } catch (...) {
      end_trial(before);
      forget_choices();
      throw;
    }
    end_trial(before);
    if (stale_ >= 0 || failed_) forget_choices();
    if (stale_ >= 0) check_parameter_current(graph_, std::exchange(stale_, -1), what);
    if (failed_) throw_failure(what);
    repeat_choices();  // the caller's real run comes next (a call that throws before it leaves it to the next trial)
  }

  /// Evicts until `bytes` more fit within the budget. Returns false, noting the failure, if they cannot
  /// (nothing is left to evict); the caller allocates anyway (a trial or a dry run reports it afterwards;
  /// a real run never gets here, its trial having succeeded). Never throws.
  bool make_room(std::size_t bytes) noexcept {
    if (!active() || buffers_.current_live_bytes() + bytes <= budget_) return true;  // inlined: the usual case
    return evict_for(bytes);
  }

 protected:
  using Base = EvictorChoice<T>;
  using Base::budget_, Base::buffers_, Base::choices_, Base::choices_next_, Base::choices_state_, Base::choices_wanted_,
      Base::classes_exact_at_, Base::clock_, Base::evictions_, Base::failed_, Base::failed_least_, Base::failed_needed_,
      Base::graph_, Base::held_, Base::heuristic_, Base::lifetime_, Base::members_, Base::rematerialized_bytes_,
      Base::rematerialized_flops_, Base::rematerialized_ops_, Base::stack_, Base::stale_, Base::views_, Base::walk_,
      Base::work_;  // its state

  using Base::choose, Base::evict, Base::rebuild_classes;  // choosing, evicting
  using typename Base::ChoicesState;

 private:
  /// make_room() for Lifetime, which packs compressed values (Lifetime::set_room_maker).
  static bool make_room_for(void* evictor, std::size_t bytes) noexcept {
    return static_cast<EvictorBudget*>(evictor)->make_room(bytes);
  }

  /// make_room()'s evictions.
  bool evict_for(std::size_t bytes) noexcept {
    while (buffers_.current_live_bytes() + bytes > budget_) {
      const std::int32_t victim = choose();
      if (victim < 0) {
        note_failure(bytes);
        return false;
      }
      evict(victim);
    }
    return true;
  }

  void end_trial(const Counters& before) noexcept {
    buffers_.end_simulation();
    lifetime_.end_journal();
    restore(before);
  }

  void note_failure(std::size_t bytes) noexcept {
    if (failed_) return;  // the first failure is the one reported
    failed_ = true;
    failed_needed_ = bytes;
    failed_least_ = buffers_.current_live_bytes() + bytes;  // nothing live could be evicted any more
  }
};

}  // namespace remat::detail
