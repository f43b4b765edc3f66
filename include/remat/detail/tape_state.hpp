// TapeState<T>: what a Tape and its Vars share, and the narrow interface that Tape, Var, apply<Op>, checkpoint()
// and the schedules use. Its state and guards are TapeCore's (tape_core.hpp: the graph, buffers, lifetime rule,
// recorder, sweep and reports), its backward sweeps TapeSweeps' (tape_sweeps.hpp), what it reports TapeFigures'
// (tape_figures.hpp: memory(), saved residuals, diagnostics, the schedules' measures); here are recording, regions,
// the memory budget, reading nodes, a CapturedStep's tape and clear().
#pragma once

#include <algorithm>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "remat/detail/buffers.hpp"
#include "remat/detail/eviction.hpp"
#include "remat/detail/levels.hpp"
#include "remat/detail/lifetime.hpp"
#include "remat/detail/node.hpp"
#include "remat/detail/non_finite.hpp"
#include "remat/detail/parameter_check.hpp"
#include "remat/detail/recorder.hpp"
#include "remat/detail/reports.hpp"
#include "remat/detail/sweep.hpp"
#include "remat/detail/tape_figures.hpp"
#include "remat/diagnostics.hpp"
#include "remat/errors.hpp"
#include "remat/memory.hpp"

namespace remat::detail {

template <class T>
class TapeState : public TapeFigures<T> {
  using Base = TapeFigures<T>;

 public:
  /// `shapes_only`: the tape records shapes and counts bytes but computes nothing (Tape(remat::shapes_only)).
  TapeState(std::uint64_t seed, bool shapes_only) : Base(seed, shapes_only) {}
  using Base::check_not_in_callback;

  // ---- ownership: the Tape and every Var hold a reference ----
  void add_ref() { ++refs_; }
  void drop_ref() {
    if (--refs_ == 0) delete this;
  }
  std::uint32_t generation() const { return generation_; }

  // ---- recording ----
  std::int32_t add_leaf(const Shape& shape, bool variable) {
    check_not_in_callback(variable ? "variable" : "constant");
    return recorder_.add_leaf(shape, variable);
  }
  /// Undoes the last add_leaf() (filling its value threw). Never throws.
  void remove_last_leaf(std::int32_t id) noexcept { recorder_.remove_last_leaf(id); }
  T* leaf_value(std::int32_t id) { return graph_[id].value; }
  /// The leaf's value was written (Tape::constant, Tape::variable): a capture logs it.
  void leaf_filled(std::int32_t id) noexcept {
    if (graph_.trace) graph_.trace->log_leaf(graph_, id);
  }
  /// Under anomaly detection, throws anomaly_error if leaf `id`'s data holds a NaN or ±inf (the caller then
  /// removes the leaf).
  void check_leaf_finite(std::int32_t id, const char* op) const {
    const Node<T>& n = graph_[id];
    if (!graph_.detect_anomaly || buffers_.shapes_only()) return;
    const std::int64_t bad = first_non_finite(n.value, n.shape.rows(), n.shape.cols());
    if (bad >= 0)
      throw anomaly_error(std::string(op) + ": the data of " + to_string(n.shape) + " holds " +
                              non_finite_text(n.value, n.shape.cols(), bad) +
                              " (anomaly detection is on: Tape::set_detect_anomaly); the leaf was not recorded",
                          id);
  }
  std::int32_t add_parameter(Parameter<T>& p) {
    check_not_in_callback("variable");
    if (graph_.detect_anomaly && !buffers_.shapes_only() && p.value().size() > 0) {
      const std::int64_t bad = first_non_finite(p.value().data(), p.value().rows(), p.value().cols());
      if (bad >= 0)
        throw anomaly_error("variable: the Parameter " + to_string(Shape{p.value().rows(), p.value().cols()}) +
                                " holds " + non_finite_text(p.value().data(), p.value().cols(), bad) +
                                " (anomaly detection is on: Tape::set_detect_anomaly); it was not recorded",
                            -1);
    }
    return recorder_.add_parameter(ParameterAccess::storage(p));
  }
  bool detect_anomaly() const { return graph_.detect_anomaly; }
  void set_detect_anomaly(bool on) { graph_.detect_anomaly = on; }
  std::int32_t record(const OpTable<T>* table, const std::int32_t* inputs, const Shape* input_shapes, int arity,
                      const Attributes& attributes, const OpShapes& shapes, const int* indices,
                      std::size_t index_count) {
    check_not_in_callback(table->name);
    if (graph_.trace && table->kind == OpKind::random)
      throw tape_error(std::string(table->name) +
                       ": a CapturedStep cannot record a random op: running the step again would draw the same "
                       "values every time. Record it on a Tape (cleared each step), or capture the step in "
                       "evaluation mode (tape.set_training(false))");
    return recorder_.record(table, inputs, input_shapes, arity, attributes, shapes, indices, index_count);
  }
  /// remat::tag_in_place (checkpoint_name's first choice): tags the op output `id` with `name` itself and asks the
  /// open regions enclosing it again (Recorder::retag). Only for an op's output no op has read yet and not yet
  /// tagged: then nothing decided from its level has happened. Returns false, changing nothing, otherwise (the
  /// caller records an identity op carrying the tag). Throws tape_error naming `op` on a frozen tape or from a
  /// gradient-ready callback, what a policy throws, or std::bad_alloc, with the tape unchanged.
  bool name_in_place(const char* op, std::int32_t id, std::string_view name) {
    check_not_in_callback(op);
    const std::int32_t tag = graph_.intern_tag(name);
    return recorder_.retag(id, tag);
  }
  /// Room for op `op` recorded as `n` nodes with these output shapes (Recorder::reserve_records; remat::reserve_records
  /// for concat_cols, concat and stack, trees of records). Throws std::bad_alloc with the tape's figures unchanged.
  void reserve_records(const char* op, const Shape* outputs, std::size_t n) {
    if (frozen_) throw_frozen(op);  // before it changes the pool or the node store
    recorder_.reserve_records(outputs, n);
  }
  /// Throws what record() would throw for input `id` of `op` (an escaped value, a modified Parameter).
  void check_input(const char* op, std::int32_t id) const { recorder_.check_input(op, id); }
  /// Index of a name tag (OpInfo::tag) in the tape's store, adding it the first time.
  std::int32_t intern_tag(std::string_view name) { return graph_.intern_tag(name); }
  std::uint64_t random_seed() const { return seed_; }
  void set_random_seed(std::uint64_t seed) {
    seed_ = seed;
    random_offset_ = 0;
  }
  std::uint64_t random_offset() const { return random_offset_; }
  void advance_random_offset(std::uint64_t count) { random_offset_ += count; }
  /// Training mode (the default): random ops such as dropout draw; in evaluation mode they are identities.
  bool training() const { return training_; }
  void set_training(bool training) { training_ = training; }
  bool grad_enabled() const { return graph_.grad_enabled; }
  void set_grad_enabled(bool enabled) { graph_.grad_enabled = enabled; }

  // ---- checkpoint regions ----
  std::int32_t open_region(policies::Decision (*policy)(const void*, const OpInfo&), const void* policy_object,
                           std::int32_t plan = -1) {
    check_not_in_callback("checkpoint");
    return recorder_.open_region(policy, policy_object, plan);
  }

  // ---- chains run by their schedule (run_schedule) ----
  /// Stores `plan` for a region about to open; returns its index. Throws std::bad_alloc, unchanged.
  std::int32_t add_chain_plan(ChainPlan plan) {
    check_not_in_callback("run_schedule");
    graph_.chain_plans.push_back(std::move(plan));
    return static_cast<std::int32_t>(graph_.chain_plans.size() - 1);
  }
  ChainPlan& chain_plan(std::int32_t index) { return graph_.chain_plans[static_cast<std::size_t>(index)]; }
  /// The forward pass keeps x_i for the schedule's first backward (ChainPlan::held). Never throws.
  void add_schedule_hold(std::int32_t id) noexcept { lifetime_.add_schedule_hold(id); }
  void release_schedule_hold(std::int32_t id) noexcept { lifetime_.release_schedule_hold(id); }
  /// True while `region` is the innermost open region (false once the tape was cleared or destroyed).
  bool region_is_innermost(std::int32_t region, std::uint32_t generation) const {
    return generation == generation_ && !graph_.open.empty() && graph_.open.back() == region;
  }
  /// Never throws (recording inside the region made room for it).
  void close_region(const std::vector<std::int32_t>& outputs) noexcept {
    recorder_.close_region(outputs.data(), outputs.size());
  }
  void abort_region() noexcept { recorder_.abort_region(); }
  /// Scratch for checkpoint() to collect a region's outputs without allocating in a steady loop.
  std::vector<std::int32_t>& output_scratch() { return outputs_; }
  int open_depth() const { return graph_.open_depth(); }
  /// The innermost open region, -1 outside every region.
  std::int32_t innermost_region() const { return graph_.open.empty() ? -1 : graph_.open.back(); }

  // ---- the memory budget (detail/eviction.hpp) ----
  void set_memory_budget(std::size_t bytes, EvictionHeuristic heuristic) {
    check_not_in_callback("set_memory_budget");
    if (bytes != 0) graph_.track_budget(graph_.nodes.size());  // the budget's side table, from now on
    evictor_.set_budget(bytes, heuristic);
  }
  std::size_t memory_budget() const { return evictor_.budget(); }
  EvictionHeuristic eviction_heuristic() const { return evictor_.heuristic(); }

  /// Makes node `id`'s value resident for a read by `op` (Var::value(), item()): regenerates it if it was
  /// evicted. Throws memory_budget_error, stale_value_error, std::bad_alloc with the tape unchanged.
  void materialize(std::int32_t id, const char* op) {
    Node<T>& n = graph_[id];
    if (n.value || !n.evicted) {
      if (n.value) evictor_.touch(id);
      return;
    }
    if (frozen_)
      throw tape_error(std::string(op) + ": node #" + std::to_string(id) + " (" + node_name(id) +
                       ") was evicted by the memory budget, and a CapturedStep's tape regenerates nothing outside "
                       "replay()");
    check_not_in_callback(op);
    evictor_.reserve(static_cast<std::size_t>(graph_.size()));
    try {
      evictor_.trial(op, [&] { evictor_.ensure(id); });
    } catch (const stale_value_error& e) {
      // Typically the loss or the logits read after an optimizer step that followed the backward.
      throw stale_value_error(std::string(op) + ": node #" + std::to_string(id) + " (" + node_name(id) +
                              ") was evicted by the memory budget, and regenerating it would read a Parameter "
                              "modified since it was recorded (" +
                              e.what() +
                              "); under a budget, read the values you need from a step (the loss, the logits) "
                              "before updating its Parameters");
    }
    buffers_.reserve_simulated();
    evictor_.ensure(id);
  }

  // ---- nodes, for Var and Tape ----
  const Node<T>& node(std::int32_t id) const { return graph_[id]; }
  /// Whether a pending reader (a backward, a replay, a region not closed yet) still needs node `id`'s value.
  bool has_pending_reader(std::int32_t id) const { return read_at_all(graph_, graph_[id]); }
  const Region& region(std::int32_t id) const { return graph_.region(id); }
  std::int32_t size() const { return graph_.size(); }
  std::string node_name(std::int32_t id) const { return graph_.node_name(id); }
  void acquire_handle(std::int32_t id) { lifetime_.acquire_handle(id); }
  void release_handle(std::int32_t id) noexcept { lifetime_.release_handle(id); }
  void check_parameter(std::int32_t id, const char* op) const { check_parameter_current(graph_, id, op); }

  /// A shapes-only tape: every buffer is a placeholder, no kernel runs (remat::estimate_memory).
  bool shapes_only() const { return buffers_.shapes_only(); }
  /// Throws shapes_only_error naming `op`, node `id` and `what` (its "value", its "gradient") if this tape is
  /// shapes-only: what would be read was never computed.
  void check_has_numbers(const char* op, std::int32_t id, const char* what) const {
    if (capture_function_running_)
      throw tape_error(std::string(op) + ": node #" + std::to_string(id) + " (" + node_name(id) +
                       ") is read inside a CapturedStep's function: the recorded step would depend on the first "
                       "step's numbers, which replay() does not recompute; read it after the capture (a value or "
                       "gradient of the last run)");
    if (!shapes_only()) return;
    throw shapes_only_error(std::string(op) + ": node #" + std::to_string(id) + " (" + node_name(id) + " " +
                            to_string(graph_[id].shape) + ") has no " + what +
                            ": the tape is shapes-only (remat::estimate_memory), it records shapes and counts bytes "
                            "but computes nothing; read values in a run on a tape that computes");
  }

  /// A variable's gradient (zeros before any backward reached it). Throws std::bad_alloc.
  MatrixView<T> variable_grad(std::int32_t id) {
    check_has_numbers("grad", id, "gradient");
    Node<T>& n = graph_[id];
    if (n.parameter) {
      auto g = n.parameter->grad_matrix();
      return MatrixView<T>(g.data(), g.rows(), g.cols());
    }
    // A CapturedStep's: its gradients may be read; one no run reaches is zero.
    if (frozen_ && !n.grad) return MatrixView<T>(frozen_zeros_.data(), n.shape.rows(), n.shape.cols());
    if (!frozen_) check_not_in_callback("Var::grad");
    if (!n.grad) {
      buffers_.prepare_simulation(static_cast<std::size_t>(n.shape.numel()));
      const std::size_t bytes = Buffers<T>::bytes(n.shape);
      const bool evicts = evictor_.needs_work(nullptr, 0, bytes);
      if (evicts) {
        evictor_.reserve(static_cast<std::size_t>(graph_.size()));
        evictor_.trial("grad", [&] {
          evictor_.make_room(bytes);
          T* p = buffers_.allocate(n.shape);
          (void)p;  // counted only
        });
        buffers_.reserve_simulated();
        evictor_.make_room(bytes);
      }
      n.grad = buffers_.allocate(n.shape);
      std::fill(n.grad, n.grad + n.shape.numel(), T(0));
      n.grad_assigned = false;  // zeros: the next backward may assign
    }
    return MatrixView<T>(n.grad, n.shape.rows(), n.shape.cols());
  }
  /// Clears a variable's accumulated gradient (a Parameter's too; not on a shapes-only tape, which leaves
  /// every Parameter as it is: its backward counts the same bytes whether the gradient was cleared or not).
  void zero_variable_grad(std::int32_t id) {
    Node<T>& n = graph_[id];
    check_not_in_callback("Var::zero_grad");
    if (n.parameter) {
      if (!shapes_only()) n.parameter->grad_defined = false;
    } else {
      free_grad(n);
    }
  }

  // ---- a CapturedStep's tape (remat/captured_step.hpp) ----
  /// From now until end_capture(), the tape logs every kernel call to `trace`, and runs its callers'
  /// function while `function_running`.
  void begin_capture(Trace<T>* trace) noexcept {
    graph_.trace = trace;
    capture_function_running_ = true;
  }
  void end_capture_function() noexcept { capture_function_running_ = false; }
  void end_capture() noexcept {
    graph_.trace = nullptr;
    capture_function_running_ = false;
  }
  /// No recording, sweep, allocation or change of any kind from now on: a CapturedStep runs its trace
  /// on these nodes and buffers.
  /// Throws std::bad_alloc, unchanged.
  void freeze() {
    Index most = 0;  // the zeros that a tape variable no run gives a gradient reads (variable_grad)
    for (const Node<T>& n : graph_.nodes)
      if (n.is_variable && !n.parameter && !n.grad) most = std::max(most, n.shape.numel());
    frozen_zeros_.assign(static_cast<std::size_t>(most), T(0));
    frozen_ = true;
  }
  Graph<T>& captured_graph() { return graph_; }
  const std::uint8_t* captured_wanted() const { return sweep_.wanted.data(); }

  // ---- whole tape ----
  void clear() {
    check_not_in_callback("clear");
    if (graph_.trace) throw tape_error("clear: called inside a CapturedStep's function, which records one step");
    if (!graph_.open.empty())
      throw tape_error("clear: a checkpoint region is still open (clear() called inside a checkpointed function)");
    release_all();
    graph_.nodes.clear();
    graph_.compressed_stored = false;
    graph_.budget.clear();
    if (!evictor_.active()) graph_.untrack_budget();  // nothing is evicted now: a tape without a budget has none
    graph_.regions.clear();
    graph_.region_sources.clear();
    graph_.source_readers.clear();
    graph_.tier_holds.clear();
    graph_.pending.clear();
    graph_.indices.clear();
    graph_.chain_plans.clear();
    ++generation_;
    residuals_freed_ = false;
    evictor_.reset_counters();
    buffers_.reset_peak();
  }
  /// Drops every open region and node (the Tape is being destroyed) and returns cached buffers.
  void shut_down() noexcept {
    graph_.open.clear();
    release_all();
    graph_.nodes.clear();
    graph_.budget.clear();
    graph_.regions.clear();
    graph_.chain_plans.clear();
    ++generation_;
    buffers_.trim();
  }
  /// Not on a CapturedStep's tape: its log names the cached buffers.
  void release_cached_memory() {
    check_not_in_callback("release_cached_memory");
    if (graph_.trace)
      throw tape_error(
          "release_cached_memory: called inside a CapturedStep's function, whose log names the "
          "buffers it would return");
    buffers_.trim();
  }

 private:
  using Base::free_grad, Base::release_all, Base::throw_frozen;
  using Base::graph_, Base::buffers_, Base::lifetime_, Base::evictor_, Base::recorder_, Base::sweep_, Base::reports_,
      Base::outputs_, Base::ready_callbacks_, Base::next_callback_key_, Base::generation_, Base::residuals_freed_,
      Base::nodes_when_freed_, Base::freed_by_, Base::seed_, Base::random_offset_, Base::training_, Base::frozen_,
      Base::frozen_zeros_, Base::capture_function_running_;
  long refs_ = 1;
};

}  // namespace remat::detail
