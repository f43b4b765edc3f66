// CapturedStep<T>: a training step recorded once and run again without recording (a graph capture).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "remat/detail/trace.hpp"
#include "remat/errors.hpp"
#include "remat/tape.hpp"

namespace remat {

/// A training step recorded once and then run again as recorded, for steps that repeat with the same shapes:
/// the way torch.cuda.CUDAGraph captures a step and replays it, or a traced function is run again (JAX's jit,
/// torch.jit.trace). On small tensors most of a recorded step is the tape's own work — recording each op,
/// deciding lifetimes, the pool, the sweep's bookkeeping — and replay() does none of it: it calls the first
/// step's kernels again, in the same order, on the same buffers, checkpoint replays and memory-budget
/// regenerations included (docs/design.md §7; bench/RESULTS.md §1 times it).
///
/// What changes between runs: the Parameters' values (an optimizer updating them in place), the data of the
/// step's constants and variables (set_input()) and the integer data of its ops (set_indices(): class labels,
/// token ids). What does not: the ops, their shapes and attributes, the policies' choices, which values are
/// saved and which replayed (memory() is the captured step's). Each replay() gives bitwise the gradients and loss
/// that recording the same step on a Tape and calling backward() would give with the same values (at the thread
/// count of the capture, for ops that keep the count they were recorded with: conv2d on oneDNN).
///
///     remat::Parameter<float> w(...), b(...);
///     remat::Var<float> x;  // kept to set the next batch
///     std::vector<int> labels(16);
///     remat::CapturedStep<float> step([&](remat::Tape<float>& tape) {
///       x = tape.constant(first_batch);
///       return remat::cross_entropy(remat::linear(x, tape.variable(w), tape.variable(b)), labels);
///     });                                     // the first step: w and b have their gradients
///     optimizer.step(); optimizer.zero_grad();
///     step.set_input(x, next_batch);
///     step.set_indices(step.loss(), next_labels);
///     float loss = step.replay();             // the second step
///
/// Not capturable (the constructor throws tape_error naming the op): random ops in training mode (dropout
/// would draw the same mask at every run; capture in evaluation mode, or record such steps on a Tape),
/// gradient-ready callbacks (Tape::on_gradient_ready), anomaly detection (Tape::set_detect_anomaly: replay()
/// checks nothing, so find a NaN on a Tape and capture the step without it), calls of backward, gradient, clear or
/// release_cached_memory inside the function, reading a value or gradient there (Var::value(), item(),
/// grad(), argmax_rows: the recorded step would depend on the first step's numbers), and an op whose forward
/// throws. The function records; what it computes outside the tape is fixed at the capture: a constant made
/// from a Parameter's value (`tape.constant(w.value().transpose())`) keeps the value it had then, like any
/// constant, until set_input() changes it. After the capture the tape is fixed: a Var recorded by the function
/// may be read (value(), item(), grad() of a tape variable: the last run's; not a value a memory budget evicted)
/// but not recorded on; doing so throws tape_error, as does any Tape call that would change the tape.
///
/// Memory: the buffers of the captured step stay with it (its tape's pool holds them, as a Tape's pool does
/// between cleared steps), plus one buffer per Parameter gradient the step computes and a copy of each
/// constant's and variable's data.
template <class T>
class CapturedStep {
 public:
  /// Runs `step(tape)` on a tape of its own (random seed `seed`): it records the forward pass and returns the
  /// loss Var ([1,1]). Then runs backward(loss): the first step, whose gradients reach the Parameters as with
  /// Tape::backward. Throws what recording and backward throw (shape_error, stale_value_error, ...), tape_error
  /// for what cannot be captured (see the class comment), std::bad_alloc. What it throws before the backward
  /// leaves the Parameters as they were; a std::bad_alloc after it (logging the backward's calls) leaves them
  /// with the first step's gradients added.
  template <class F>
  explicit CapturedStep(F&& step, std::uint64_t seed = 0x5eed) : tape_(std::make_unique<Tape<T>>(seed)) {
    static_assert(std::is_invocable_r_v<Var<T>, F&, Tape<T>&>,
                  "CapturedStep: the step function takes a remat::Tape<T>& and returns the loss Var<T>");
    detail::TapeState<T>& state = tape_state();
    state.begin_capture(&trace_);
    try {
      loss_ = step(*tape_);
      state.end_capture_function();
      if (state.detect_anomaly())
        throw tape_error(
            "CapturedStep: anomaly detection is on (Tape::set_detect_anomaly), and replay() checks no value; find "
            "the NaN or inf by recording the step on a Tape, then capture it with anomaly detection off");
      if (!loss_.valid() || detail::VarAccess::state(loss_) != &state)
        throw tape_error("CapturedStep: the step function must return a Var recorded on the tape it was given");
      check_log();  // before the backward: the Parameters are unchanged if it throws
      last_loss_ = loss_.item();
      tape_->backward(loss_);
      check_log();
      trace_.make_slots();
      finish_capture(state);
      state.freeze();
    } catch (...) {
      state.end_capture();
      throw;
    }
    state.end_capture();
  }
  CapturedStep(const CapturedStep&) = delete;
  CapturedStep& operator=(const CapturedStep&) = delete;

  /// Runs the captured step again: every kernel of the first step, in order, reading the Parameters' current
  /// values and the data given to set_input() and set_indices(); adds each Parameter's gradient into it as
  /// backward() does (it becomes the gradient after Parameter::zero_grad()). Returns the loss. Throws
  /// stale_value_error, before anything runs, for a recorded Parameter assigned to, moved from or resized since
  /// the capture (its storage no longer holds what the step reads: capture the step again), shape_error for a
  /// Parameter whose gradient has another size than its value, std::bad_alloc (a Parameter's gradient buffer);
  /// the Parameters are unchanged then.
  T replay() {
    check_parameters();
    for (const Delivery& d : deliveries_)
      if (!d.storage->grad_defined) d.storage->reserve_grad();  // before anything changes
    detail::Graph<T>& graph = tape_state().captured_graph();
    save_states(graph);
    trace_.run(graph, wanted_.data(), detail::VarAccess::id(loss_), last_loss_);
    restore_states(graph);
    // The loss's buffer, held by loss_, has this run's value; a leaf loss (a Parameter, a constant) has no
    // forward for the run to read it from. Unless a budget evicted it: then the run read it after its forward.
    const detail::Node<T>& loss = graph[detail::VarAccess::id(loss_)];
    if (loss.value) last_loss_ = loss.value[0];
    return last_loss_;
  }

  /// The loss Var the step function returned (for set_indices of the loss op).
  const Var<T>& loss() const { return loss_; }
  /// The loss of the last run (the capture or the last replay()).
  T last_loss() const { return last_loss_; }

  /// Sets the data that constant or variable `leaf` (recorded by the step function with Tape::constant or
  /// Tape::variable from a matrix) holds at the next runs: the next batch. Throws tape_error for a Var not
  /// recorded by this step or not such a leaf, shape_error for another shape than the recorded one.
  template <class Derived>
  void set_input(const Var<T>& leaf, const Eigen::MatrixBase<Derived>& value) {
    Matrix<T>& data = leaf_data("set_input", leaf);
    if (value.rows() != data.rows() || value.cols() != data.cols())
      throw shape_error("set_input: the leaf is " + to_string(Shape{data.rows(), data.cols()}) + " but the value is " +
                        to_string(Shape{value.rows(), value.cols()}) + "; a captured step keeps its shapes");
    data = value.template cast<T>();
  }

  /// set_input() for a leaf recorded from a tensor (Tape::constant/variable of a remat::Tensor or a Shape): the
  /// next batch as a tensor of the recorded shape. Throws as the matrix overload does, shape_error for another
  /// shape than the recorded one.
  template <int Rank>
  void set_input(const Var<T>& leaf, const Tensor<T, Rank>& value) {
    leaf_data("set_input", leaf);
    const Shape recorded = leaf.shape(), given = shape_of(value);
    if (given != recorded)
      throw shape_error("set_input: the leaf is " + to_string(recorded) + " but the value is " + to_string(given) +
                        "; a captured step keeps its shapes");
    set_input(leaf, Eigen::Map<const Matrix<T>>(value.data(), given.rows(), given.cols()));
  }

  /// Sets the integer data of the op whose output is `output` (cross_entropy's labels: `output` is the loss;
  /// embedding's ids) for the next runs. Throws tape_error for a Var not recorded by this step or an op without
  /// integer data (or one that declares no check_indices), shape_error for another count than the recorded
  /// one, and what the op's own check throws (index_error for a label or id out of range); nothing changes then.
  void set_indices(const Var<T>& output, const std::vector<int>& values) {
    const std::int32_t id = own_id("set_indices", output);
    detail::Graph<T>& graph = tape_state().captured_graph();
    const detail::Node<T>& n = graph[id];
    if (n.is_leaf() || n.attributes.indices_count == 0 || !n.op->check_indices)
      throw tape_error("set_indices: node #" + std::to_string(id) + " (" + graph.node_name(id) +
                       ") has no integer data to set");
    if (static_cast<std::int64_t>(values.size()) != n.attributes.indices_count)
      throw shape_error("set_indices: " + std::string(n.op->name) + " was recorded with " +
                        std::to_string(n.attributes.indices_count) + " entries but " + std::to_string(values.size()) +
                        " are given; a captured step keeps its shapes");
    Shape inputs[max_inputs];
    for (int k = 0; k < n.arity; ++k) inputs[k] = graph[n.inputs[k]].shape;
    n.op->check_indices(inputs, n.attributes, values.data(), values.size());
    std::copy(values.begin(), values.end(), graph.indices.begin() + n.attributes.indices_begin);
  }

  /// The captured step's memory figures (Tape::memory() after its backward).
  MemoryStats memory() const { return tape_->memory(); }
  /// Kernel calls (and the tape's few writes outside kernels) that one replay() makes.
  std::size_t calls() const { return trace_.events.size(); }

 private:
  struct RecordedParameter {
    std::shared_ptr<detail::ParameterStorage<T>> storage;
    const T* data;
    Shape shape;
    std::uint64_t assignments;
  };
  struct Delivery {
    detail::ParameterStorage<T>* storage;
  };

  detail::TapeState<T>& tape_state() const { return *tape_->state_; }

  void check_log() const {
    if (trace_.op_threw())
      throw tape_error(
          "CapturedStep: an op's forward threw inside the step function (and the function went on); "
          "a captured step's ops must not throw");
    if (trace_.failed()) throw std::bad_alloc();
  }

  /// What the capture leaves for replay(): the sweep's flags, the recorded Parameters, the leaves' data.
  void finish_capture(detail::TapeState<T>& state) {
    detail::Graph<T>& graph = state.captured_graph();
    wanted_.assign(state.captured_wanted(), state.captured_wanted() + graph.size());
    saved_states_.resize(static_cast<std::size_t>(graph.size()));
    leaf_data_index_.assign(static_cast<std::size_t>(graph.size()), -1);
    for (std::int32_t i = 0; i < graph.size(); ++i) {
      const detail::Node<T>& n = graph[i];
      if (n.parameter)
        parameters_.push_back({n.parameter, n.parameter->value.data(), n.shape, n.parameter_assignments});
    }
    for (const detail::TraceEvent& e : trace_.events) {
      if (e.kind == detail::TraceEvent::leaf_data) leaf_data_index_[static_cast<std::size_t>(e.node)] = e.data;
      if (e.kind == detail::TraceEvent::delivery) deliveries_.push_back({graph[e.node].parameter.get()});
    }
  }

  void check_parameters() const {
    for (const RecordedParameter& p : parameters_) {
      const detail::ParameterStorage<T>& s = *p.storage;
      if (s.assignments != p.assignments || s.value.data() != p.data || s.value.rows() != p.shape.rows() ||
          s.value.cols() != p.shape.cols())
        throw stale_value_error("CapturedStep::replay: a Parameter recorded as " + to_string(p.shape) +
                                " was assigned to, moved from, resized or given new storage since the capture "
                                "(it is " +
                                to_string(Shape{s.value.rows(), s.value.cols()}) +
                                " now); the step would read memory it no longer owns: capture the step again");
      s.check_grad_size("CapturedStep::replay");
    }
  }

  /// The run points the nodes at the buffers each kernel call had; afterwards they point where they did
  /// before it (what the tape's lifetime rule and pool account for: a Var released since the capture has
  /// freed its value, which must stay freed).
  void save_states(const detail::Graph<T>& graph) noexcept {
    for (std::int32_t i = 0; i < graph.size(); ++i)
      saved_states_[static_cast<std::size_t>(i)] = detail::state_of(graph, i);
  }
  void restore_states(detail::Graph<T>& graph) const noexcept {
    for (const detail::TraceNodeState<T>& s : saved_states_) detail::restore_state(graph, s);
  }

  std::int32_t own_id(const char* op, const Var<T>& v) const {
    detail::VarAccess::node(v, op);
    if (detail::VarAccess::state(v) != &tape_state())
      throw tape_error(std::string(op) + ": the Var was not recorded by this step");
    return detail::VarAccess::id(v);
  }
  Matrix<T>& leaf_data(const char* op, const Var<T>& leaf) {
    const std::int32_t id = own_id(op, leaf);
    const std::int32_t k = leaf_data_index_[static_cast<std::size_t>(id)];
    if (k < 0)
      throw tape_error(std::string(op) + ": node #" + std::to_string(id) + " (" +
                       tape_state().captured_graph().node_name(id) +
                       ") is not a constant or variable recorded from a matrix (a Parameter's value is the "
                       "Parameter's: change it there)");
    return trace_.leaf_data[static_cast<std::size_t>(k)];
  }

  std::unique_ptr<Tape<T>> tape_;  // its nodes and buffers are what the trace runs on
  detail::Trace<T> trace_;
  Var<T> loss_;
  T last_loss_ = 0;
  std::vector<std::uint8_t> wanted_;
  std::vector<detail::TraceNodeState<T>> saved_states_;  // the nodes' buffers while a replay runs
  std::vector<RecordedParameter> parameters_;
  std::vector<Delivery> deliveries_;
  std::vector<std::int32_t> leaf_data_index_;  // per node: its Trace::leaf_data entry, -1 for none
};

}  // namespace remat
