// TapeState<T>: what a Tape and its Vars share. It composes the graph (node.hpp), the buffers
// (buffers.hpp), the lifetime rule (lifetime.hpp), recording (recorder.hpp), the sweep (sweep.hpp) and the
// reports on what is kept (reports.hpp), and offers the narrow interface that Tape, Var, apply<Op>,
// checkpoint() and the schedules use.
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
#include "remat/diagnostics.hpp"
#include "remat/errors.hpp"
#include "remat/memory.hpp"

namespace remat::detail {

/// What a schedule may learn of a recorded node (checkpoint_sequential_auto's probe).
struct NodeCost {
  bool leaf = true;
  double flops = 0;                  ///< forward FLOP estimate
  std::size_t bytes = 0;             ///< output bytes
  bool value_read = false;           ///< a backward reads its value
  std::size_t extra_read_bytes = 0;  ///< bytes of its extra if its backward reads it
};

template <class T>
class TapeState {
 public:
  /// `shapes_only`: the tape records shapes and counts bytes but computes nothing (Tape(remat::shapes_only)).
  TapeState(std::uint64_t seed, bool shapes_only) : buffers_(shapes_only), seed_(seed) {}
  TapeState(const TapeState&) = delete;
  TapeState& operator=(const TapeState&) = delete;
  ~TapeState() { release_all(); }

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
  std::int32_t record(const OpTable<T>* table, const std::int32_t* inputs, int arity, const Attributes& attributes,
                      const OpShapes& shapes, const int* indices, std::size_t index_count) {
    check_not_in_callback(table->name);
    if (graph_.trace && table->kind == OpKind::random)
      throw tape_error(std::string(table->name) +
                       ": a CapturedStep cannot record a random op: running the step again would draw the same "
                       "values every time. Record it on a Tape (cleared each step), or capture the step in "
                       "evaluation mode (tape.set_training(false))");
    return recorder_.record(table, inputs, arity, attributes, shapes, indices, index_count);
  }
  /// checkpoint_name's first choice: tags the op output `id` with `name` itself and asks the open regions
  /// enclosing it again (Recorder::retag). Only for an op's output no op has read yet and not yet tagged: then
  /// nothing decided from its level has happened. Returns false, changing nothing, otherwise (the caller
  /// records an identity op carrying the tag). Throws what a policy throws, or std::bad_alloc, with the tape
  /// unchanged.
  bool name_in_place(std::int32_t id, std::string_view name) {
    check_not_in_callback("checkpoint_name");
    const std::int32_t tag = graph_.intern_tag(name);
    return recorder_.retag(id, tag);
  }
  /// Room for op `op` recorded as `n` nodes with these output shapes (Recorder::reserve_records: concat_cols,
  /// concat and stack, trees of records). Throws std::bad_alloc with the tape's figures unchanged.
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
  std::int32_t open_region(bool (*policy)(const void*, const OpInfo&), const void* policy_object,
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

  // ---- backward ----
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
      // Under a budget, a regeneration may read any Parameter whose value the tape refers to now; a view of a
      // Parameter (reshape of a weight) reads its storage.
      if (read_at_all(graph_, graph_[i]) || graph_[i].view_holds > 0 || (evictor_.active() && graph_[i].value))
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
  /// Throws tape_error naming `op` while a gradient-ready callback runs inside this tape's backward: the
  /// sweep is half-way through the tape's nodes, which nothing may change then.
  void check_not_in_callback(const char* op) const {
    if (frozen_) throw_frozen(op);
    if (sweep_.running())
      throw tape_error(std::string(op) +
                       ": called on the tape from one of its gradient-ready callbacks while its backward sweep runs; "
                       "a callback may read and write the Parameter's gradient, not record on or change the tape");
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

  /// Backwards that skipped their dry run as redundant (detail/dry_run_cache.hpp; tests).
  std::size_t dry_runs_skipped() const { return sweep_.dry_runs_skipped(); }

  MemoryStats memory() const {
    MemoryStats m;
    m.live_bytes = buffers_.live_bytes();
    m.peak_bytes = buffers_.reported_peak_bytes();
    for (const Node<T>& n : graph_.nodes) {
      if (lifetime_.saved_value(n)) m.saved_bytes += Buffers<T>::bytes(n.shape);
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

  /// For schedules: the cost of node `id` as checkpoint_sequential_auto's planner models it.
  NodeCost cost(std::int32_t id) const {
    const Node<T>& n = graph_[id];
    NodeCost c;
    c.leaf = n.is_leaf();
    c.bytes = Buffers<T>::bytes(n.shape);  // a view's too: the planner may count a shared buffer twice, never less
    if (c.leaf) return c;
    c.flops = recorder_.op_info(n).flops;
    c.value_read = n.backward_reads > 0;
    if (n.extra_read) c.extra_read_bytes = Buffers<T>::bytes(n.extra_shape);
    return c;
  }

 private:
  [[noreturn]] static void throw_frozen(const char* op) {
    throw tape_error(std::string(op) +
                     ": the tape belongs to a CapturedStep, whose recorded step is fixed; a Var from it may be read "
                     "(value(), item(), grad()) but not recorded on, swept or changed");
  }
  void free_grad(Node<T>& n) {
    if (!n.parameter) buffers_.free(n.grad, n.shape);
    n.grad_assigned = false;
  }
  void release_all() noexcept {
    for (Node<T>& n : graph_.nodes) {
      lifetime_.free_value(n);
      buffers_.free(n.extra, n.extra_shape);
      if (!n.parameter) buffers_.free(n.grad, n.shape);
    }
  }

  Graph<T> graph_;
  Buffers<T> buffers_;
  Lifetime<T> lifetime_{graph_, buffers_};
  Evictor<T> evictor_{graph_, buffers_, lifetime_};
  Recorder<T> recorder_{graph_, buffers_, lifetime_, evictor_};
  Sweep<T> sweep_{graph_, buffers_, lifetime_, evictor_};
  Reports<T> reports_{graph_, lifetime_};
  std::vector<std::int32_t> outputs_;
  GradientReadyCallbacks<T> ready_callbacks_;
  std::size_t next_callback_key_ = 1;
  std::uint32_t generation_ = 0;
  bool residuals_freed_ = false;       // a sweep without retain_graph ran since the last clear()
  std::int32_t nodes_when_freed_ = 0;  // the nodes recorded then: a loss recorded later is a step without clear()
  const char* freed_by_ = "backward";  // that sweep: "backward" or "gradient()"
  std::uint64_t seed_;
  std::uint64_t random_offset_ = 0;
  bool training_ = true;
  bool frozen_ = false;                    // a CapturedStep's tape after its capture
  std::vector<T> frozen_zeros_;            // then: the gradient of a variable no run reaches
  bool capture_function_running_ = false;  // a CapturedStep's function runs (begin_capture)
  long refs_ = 1;
};

}  // namespace remat::detail
