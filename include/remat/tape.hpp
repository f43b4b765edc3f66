// Tape<T>: records the forward pass and runs the reverse sweep.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <iomanip>
#include <ostream>
#include <string>
#include <vector>

#include "remat/detail/tape_state.hpp"
#include "remat/diagnostics.hpp"
#include "remat/var.hpp"

namespace remat {

template <class T>
class CapturedStep;

/// The tag of a shapes-only tape: `Tape<float> tape(remat::shapes_only)`.
struct ShapesOnly {
  explicit ShapesOnly() = default;
};
/// Makes a Tape shapes-only (see Tape(ShapesOnly, seed)).
inline constexpr ShapesOnly shapes_only{};

namespace detail {
/// A leaf of shape `s` on `state`'s tape holding a copy of `data` (s.numel() elements; not read on a
/// shapes-only tape): a variable (it receives a gradient) or a constant. Throws what Tape::constant throws.
template <class T>
Var<T> record_leaf(TapeState<T>* state, const Shape& s, const T* data, bool variable) {
  const std::int32_t id = state->add_leaf(s, variable);
  if (state->shapes_only()) return VarAccess::adopt(state, id);
  std::copy_n(data, s.numel(), state->leaf_value(id));
  try {
    state->check_leaf_finite(id, variable ? "variable" : "constant");
  } catch (...) {
    state->remove_last_leaf(id);
    throw;
  }
  state->leaf_filled(id);
  return VarAccess::adopt(state, id);
}
}  // namespace detail

/// A constant (a leaf that receives no gradient) on the tape `like` is on, holding a copy of `data` (row-major,
/// shape.numel() elements), as torch's `like.new_tensor(data)`: how an op's public function records a value it
/// computes on the host (batch_norm's running statistics in evaluation) without a Tape. A shapes-only tape reads
/// no data. Throws tape_error for an empty or stale `like`, shape_error for a shape the tape cannot hold,
/// non_finite_error for a non-finite element under anomaly detection, std::bad_alloc.
template <class T>
Var<T> new_tensor(const Var<T>& like, const Shape& shape, const T* data) {
  detail::VarAccess::node(like, "new_tensor");
  return detail::record_leaf(detail::VarAccess::state(like), shape, data, false);
}

/// A reverse-mode tape for scalar type T (float or double). One tape per forward/backward pass; reuse
/// it for the next training step with clear(), which keeps its buffer pool and its scratch space, so a
/// steady training loop allocates nothing after the first step (conditions: docs/design.md §2.5). A
/// tape is not thread-safe; each thread may run its own (but backward passes that add into the same
/// Parameter must not run concurrently).
template <class T>
class Tape {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "remat::Tape<T>: T must be float or double");

 public:
  /// `seed` seeds the tape's random generator (dropout).
  explicit Tape(std::uint64_t seed = 0x5eed) : state_(new detail::TapeState<T>(seed, false)) {}

  /// A shapes-only tape: it records the same nodes, regions and policy decisions as a tape that computes and
  /// runs the same backward sweep, replays included, but no kernel, so every buffer is a placeholder of the
  /// right size and memory() counts exactly the bytes (live, peak, saved, replayed) that the same calls count
  /// on a tape that computes; print_saved_residuals() and diagnostics() work as there. Nothing is read from
  /// the matrices given to constant() and variable() (an Eigen expression such as Matrix<T>::Zero(m, n) is
  /// never evaluated), and no Parameter is changed: backward() writes no gradient and calls no
  /// gradient-ready callback, zero_grad() leaves a Parameter's gradient as it is. Reading a value or a
  /// gradient (Var::value(), item(), grad(), argmax_rows(), gradient()) throws shapes_only_error naming the
  /// node; recording an op whose struct declares `estimable = false` throws shapes_only_error naming the op.
  /// remat::estimate_memory (remat/estimate.hpp) runs a step on one.
  explicit Tape(ShapesOnly, std::uint64_t seed = 0x5eed) : state_(new detail::TapeState<T>(seed, true)) {}
  Tape(const Tape&) = delete;
  Tape& operator=(const Tape&) = delete;
  ~Tape() {
    state_->shut_down();
    state_->drop_ref();
  }

  /// A leaf that receives no gradient; copies `value` [m,n] (a shapes-only tape takes its shape only).
  /// Throws shape_error for an empty matrix or one of more than 2^48 bytes.
  template <class Derived>
  Var<T> constant(const Eigen::MatrixBase<Derived>& value) {
    return leaf(value, false);
  }

  /// A leaf that receives a gradient; copies `value` [m,n] (a shapes-only tape takes its shape only). Its gradient
  /// (Var::grad()) accumulates over the backward passes of this tape. Throws shape_error for an empty matrix or one of
  /// more than 2^48 bytes.
  template <class Derived>
  Var<T> variable(const Eigen::MatrixBase<Derived>& value) {
    return leaf(value, true);
  }

  /// A leaf that receives no gradient; copies the N-D `value` (any rank up to Shape::max_rank, row-major as
  /// remat::Tensor is), e.g. a batch of images [N,C,H,W]. Throws as the matrix overload does.
  template <int Rank>
  Var<T> constant(const Tensor<T, Rank>& value) {
    return leaf(shape_of(value), value.data(), false);
  }

  /// A leaf that receives a gradient; copies the N-D `value` (any rank up to Shape::max_rank). Throws as the
  /// matrix overload does.
  template <int Rank>
  Var<T> variable(const Tensor<T, Rank>& value) {
    return leaf(shape_of(value), value.data(), true);
  }

  /// A leaf that receives no gradient, of `shape`, with its shape.numel() values copied from `data` (row-major).
  /// Throws as the matrix overload does.
  Var<T> constant(const Shape& shape, const T* data) { return leaf(shape, data, false); }
  /// A leaf that receives a gradient, of `shape`, with its shape.numel() values copied from `data` (row-major).
  /// Throws as the matrix overload does.
  Var<T> variable(const Shape& shape, const T* data) { return leaf(shape, data, true); }

  /// A leaf that receives a gradient and references `p` without copying: backward adds d loss / d p into
  /// p's gradient (Parameter::grad()). If `p` is modified (Parameter::mutable_value(), assignment) before
  /// a backward or replay reads it, that throws stale_value_error. The tape shares p's storage, so `p`
  /// may be moved or destroyed before backward. Throws shape_error for an empty parameter or one of more than 2^48
  /// bytes.
  Var<T> variable(Parameter<T>& p) { return detail::VarAccess::adopt(state_, state_->add_parameter(p)); }
  /// A temporary Parameter would take its gradient with it: record a named one.
  Var<T> variable(Parameter<T>&& p) = delete;

  /// Reverse sweep from `loss` ([1,1]; d loss / d loss = 1): adds d loss / d v into the gradient of every
  /// variable v (Var::grad(), Parameter::grad()). Residuals are freed as the sweep passes them unless
  /// `retain_graph`, which allows another backward. Checkpoint regions replay their recorded ops as the
  /// sweep enters them.
  /// Throws shape_error (loss not [1,1]), tape_error (Var of another or cleared tape, inside a
  /// checkpointed function), freed_value_error (another backward after one without retain_graph, until clear()),
  /// stale_value_error (a Parameter changed, assigned to, moved from or resized since it was recorded),
  /// std::bad_alloc. When it throws, the tape and every gradient are exactly as they were. On a shapes-only
  /// tape it only counts: memory() then holds the figures this backward reaches on a tape that computes.
  void backward(const Var<T>& loss, bool retain_graph = false) {
    const std::int32_t id = check_loss("backward", loss, /*to_parameters=*/true);
    state_->report_diagnostics(id);
    state_->backward(id, retain_graph);
  }

  /// Registers `callback`, called by every later backward() of this tape once for each Parameter whose
  /// gradient that backward added to, at the moment the Parameter's gradient is final: after every
  /// contribution of this backward (from every op that read it, however many times it was recorded with
  /// variable(): a parameter shared by several layers; from checkpointed and nested regions, whose replays
  /// run during the sweep). Parameter::grad() then holds the sum over the backward passes since its last
  /// zero_grad(), this one complete. A gradient is complete once the earliest op that reads the Parameter and
  /// receives a gradient has run its backward, and it is delivered to the Parameter then, so the calls come
  /// while the sweep still runs, in reverse order of each Parameter's first use (within one op, in the order
  /// of its inputs), wherever the Parameter was recorded (the order PyTorch's DistributedDataParallel relies on to
  /// start all-reducing gradients while backward goes on; Li et al., "PyTorch Distributed: Experiences on Accelerating
  /// Data Parallel Training", VLDB 2020).
  ///
  /// `callback` receives a Parameter object that shares value, version and gradient with the recorded one
  /// (the tape holds the storage, not your object): compare it with yours by the address of the value
  /// (`&p.value() == &mine.value()`, stable across moves of either). Not called:
  /// for a Parameter no gradient reached in this backward (recorded but used by no op leading to the loss:
  /// its gradient is unchanged), by gradient() (which writes no Parameter gradient), in the backward's dry
  /// run. Callbacks run in registration order, on the thread that called backward.
  ///
  /// A callback may read and write the gradient (grad(), mutable_grad()) and do work of its own (start a
  /// non-blocking all-reduce). It may change the value of the Parameter it receives (mutable_value(), an
  /// assignment, an nn optimizer's step() over it: an optimizer step inside backward), whose value this
  /// backward no longer reads; it must not change the value of a Parameter this tape recorded whose
  /// gradient is not ready yet, since the sweep still reads it: mutable_value(), assignments and nn
  /// optimizers' step() throw tape_error there, changing nothing (so the callback throws, see below). Nor
  /// may it run a backward that adds into one. It must not use this tape: recording, backward, gradient(),
  /// clear(), Var::grad() of a tape variable and remove_gradient_ready() throw tape_error while it runs.
  /// Exceptions: the strong guarantee of backward() covers everything the tape checks before the sweep; a
  /// callback is called during the sweep, which cannot stop half-way. If a callback throws, the sweep
  /// completes (every gradient is written, the residuals are freed as without the callback), no further
  /// callback is called in this backward, and backward() then rethrows the first exception.
  /// Returns a key for remove_gradient_ready(). Throws std::invalid_argument for an empty callback.
  std::size_t on_gradient_ready(std::function<void(Parameter<T>&)> callback) {
    if (!callback) throw std::invalid_argument("on_gradient_ready: the callback is empty");
    state_->check_not_in_callback("on_gradient_ready");
    return state_->add_gradient_ready_callback(std::move(callback));
  }
  /// Unregisters the callback on_gradient_ready() returned `key` for; false if there is none (already
  /// removed). Kept across clear().
  bool remove_gradient_ready(std::size_t key) { return state_->remove_gradient_ready_callback(key); }

  /// d loss / d v for each v in `wrt` (any Vars on this tape, variables or interior values), computed by
  /// one sweep that skips work not leading to them; returns matrices of the shapes of `wrt`. Accumulated
  /// gradients (Var::grad(), Parameter::grad()) are left as they were. Frees residuals unless
  /// `retain_graph`; throws as backward() does, tape_error for a `wrt` value that depends on no variable,
  /// and shapes_only_error on a shapes-only tape.
  std::vector<Matrix<T>> gradient(const Var<T>& loss, std::initializer_list<Var<T>> wrt, bool retain_graph = false) {
    return gradient(loss, std::vector<Var<T>>(wrt), retain_graph);
  }
  /// The same, for a vector of targets.
  std::vector<Matrix<T>> gradient(const Var<T>& loss, const std::vector<Var<T>>& wrt, bool retain_graph = false) {
    const std::int32_t id = check_loss("gradient", loss, /*to_parameters=*/false);
    if (shapes_only())
      throw shapes_only_error(
          "gradient: the tape is shapes-only (remat::estimate_memory): it computes no gradient to return; call "
          "backward(loss) to count the bytes of the backward pass");
    std::vector<std::int32_t> targets;
    std::vector<Matrix<T>> result;
    targets.reserve(wrt.size());
    result.reserve(wrt.size());
    for (const Var<T>& v : wrt) {
      check_own("gradient", v);
      if (!v.requires_grad())
        throw tape_error("gradient: node #" + std::to_string(detail::VarAccess::id(v)) + " (" +
                         state_->node_name(detail::VarAccess::id(v)) + " " + to_string(v.shape()) +
                         ") does not depend on any variable; record it with tape.variable() to differentiate by it");
      targets.push_back(detail::VarAccess::id(v));
      result.emplace_back(v.rows(), v.cols());
    }
    state_->gradient(id, targets, retain_graph, result);
    return result;
  }

  /// Forgets every recorded node for the next step; keeps the buffer pool. Existing Vars become
  /// invalid (using them throws tape_error). Resets peak_bytes to the bytes still live. Parameters keep
  /// their gradients.
  void clear() { state_->clear(); }

  /// Returns the pool's cached buffers to the system.
  void release_cached_memory() { state_->release_cached_memory(); }

  /// Restarts the tape's random generator (dropout) at `seed`: the masks drawn after this call are a
  /// pure function of `seed` and the order of the random ops, so a training loop that seeds each step
  /// (e.g. from its step number) draws the same masks when it is resumed. Existing nodes keep theirs.
  void seed(std::uint64_t seed) { state_->set_random_seed(seed); }

  /// Training mode (true, the default) or evaluation mode (false), like torch.nn.Module.train()/eval():
  /// in evaluation mode dropout records nothing and returns its input. Kept across clear().
  void set_training(bool training) { state_->set_training(training); }
  bool training() const { return state_->training(); }  ///< the mode set_training() set (true by default)

  /// Gradient recording on (true, the default) or off, like torch.set_grad_enabled: while off, every op
  /// recorded computes its value and records nothing to differentiate — its output requires no gradient,
  /// so its backward reads nothing and no residual is kept (a value lives only while a Var refers to it), and
  /// a checkpoint region replays nothing. For evaluation; see NoGradGuard. Leaves are recorded as always
  /// (a variable still receives gradients from ops recorded with gradients on). A backward from a loss
  /// recorded with it off computes no gradient. Kept across clear().
  void set_grad_enabled(bool enabled) { state_->set_grad_enabled(enabled); }
  bool grad_enabled() const { return state_->grad_enabled(); }  ///< the mode set_grad_enabled() set

  /// Anomaly detection (off by default, like torch.autograd.set_detect_anomaly): while on, a leaf whose data
  /// holds a NaN or ±inf (constant(), variable(), a Parameter) is refused, an op whose forward gives one is
  /// not recorded, and both throw remat::anomaly_error naming the node, op, shape, element and whether an input
  /// already held one; a backward whose op writes one into a gradient completes its sweep and then throws
  /// anomaly_error naming the op, its node and the input whose gradient it wrote, and whether the gradient
  /// that op received was already non-finite (the gradients then hold what was computed). Each check reads
  /// every element it checks once (a forward's value, a backward's input gradients); off, the tape tests one
  /// flag per op. Replays and regenerations recompute values already checked. Kept across clear(). If a
  /// gradient-ready callback throws too, backward() rethrows whichever exception came first. A CapturedStep
  /// refuses to capture with it on (its replay() checks nothing).
  void set_detect_anomaly(bool on) { state_->set_detect_anomaly(on); }
  bool detect_anomaly() const { return state_->detect_anomaly(); }  ///< whether anomaly detection is on

  /// Checkpoint regions that save no memory (CheckpointDiagnostic, docs/checkpointing.md §Diagnostics):
  /// regions in which nothing requires a gradient, regions whose policy drops nothing their backward
  /// reads, and the region the backward sweep would replay first when it frees less than it replays (the
  /// region that contains the loss, or the last one before it). `loss` is the value backward() would
  /// start from; without it, the last value recorded. Changes nothing. Throws tape_error for a `loss` of
  /// another tape or an empty Var.
  std::vector<CheckpointDiagnostic> diagnostics() const { return state_->diagnostics(state_->size() - 1); }
  /// The same, for a backward from `loss`.
  std::vector<CheckpointDiagnostic> diagnostics(const Var<T>& loss) const {
    detail::VarAccess::node(loss, "diagnostics");
    if (detail::VarAccess::state(loss) != state_) throw tape_error("diagnostics: the loss belongs to another tape");
    return state_->diagnostics(detail::VarAccess::id(loss));
  }
  /// Writes diagnostics(), one message per line (nothing when there is none).
  void diagnose(std::ostream& os) const {
    for (const CheckpointDiagnostic& d : diagnostics()) os << d.message << '\n';
  }
  /// `handler` receives each finding of diagnostics(loss) at the start of backward(loss), once per region
  /// per recording (again after clear()), before anything else happens: what it throws propagates from
  /// backward() with the tape unchanged (those regions are reported again at the next backward). Route it
  /// to a logger, or to std::cerr: `tape.set_diagnostics_handler([](const auto& d) { std::cerr << d.message
  /// << '\n'; })`. An empty function removes it. gradient() does not report. The handler must not record on,
  /// clear or sweep this tape.
  void set_diagnostics_handler(std::function<void(const CheckpointDiagnostic&)> handler) {
    state_->set_diagnostics_handler(std::move(handler));
  }

  /// A runtime memory budget, in bytes (0: none, the default), by Dynamic Tensor Rematerialization (Kirisame
  /// et al., "Dynamic Tensor Rematerialization", ICLR 2021). Whenever allocating a tape buffer — a leaf, an
  /// op's output, extra or temporary, a gradient, a replayed or regenerated value — would take the tape's live
  /// bytes (what memory().live_bytes counts: every tape buffer) over `bytes`, the tape first evicts resident op
  /// outputs it can regenerate, chosen by `heuristic` (EvictionHeuristic): never leaves, Parameters,
  /// gradients, op extras (layer_norm's statistics, cross_entropy's softmax stay while their backward needs
  /// them) or the values the running op reads. An evicted value that is read again — by a later op, by the
  /// backward (its residuals, a checkpoint replay's sources) or by Var::value() — is regenerated by re-running
  /// its recorded op from its inputs, themselves regenerated if needed (dropout from its stored seed and
  /// offset); a regeneration writes its op's extra again (bitwise the same), or into a temporary buffer when
  /// the extra is not kept. Gradients are bitwise those without a budget. checkpoint() regions drop and replay
  /// by their policies as always; evictions come on top. memory() counts evictions and regenerations.
  ///
  /// So memory().peak_bytes stays ≤ `bytes` from then on (set the budget before recording a step: peak_bytes
  /// counts since the last clear()). When no eviction can make room, the call that allocates (an op,
  /// constant(), variable(), backward(), gradient(), Var::value(), item(), grad()) throws memory_budget_error,
  /// and the tape, its memory() figures and every gradient are as before that call: raise the budget, or
  /// clear(), and go on. Its budget_bytes() is the budget, needed_bytes() the bytes of the allocation that
  /// could not be served, and least_budget_bytes() the live bytes nothing could evict at that moment (leaves,
  /// gradients, extras, the running op's operands, values with nothing to regenerate them from) plus
  /// needed_bytes(): no budget below it can serve that allocation from that state. It is a lower bound for the
  /// call, not a promise for the step: with the budget raised to it, the call gets past that allocation but may
  /// fail at a later one (reporting its own figure). A backward runs its dry run with every eviction and
  /// regeneration first, so it throws before changing anything.
  ///
  /// Costs: choosing a value to evict scans the recorded nodes (O(nodes) per eviction); an allocation that may
  /// evict or regenerate runs once as a trial first (O(nodes)). Under a budget, a view from Var::value() is
  /// valid only until the next call that may evict, and backward() throws stale_value_error for any
  /// recorded Parameter modified since it was recorded whose value the tape still refers to (a regeneration
  /// might read it). Kept across clear(). A shapes-only tape (remat::estimate_memory) under the same budget
  /// makes the same choices and reports the same figures.
  void set_memory_budget(std::size_t bytes, EvictionHeuristic heuristic = EvictionHeuristic::dtr_eq) {
    state_->set_memory_budget(bytes, heuristic);
  }
  /// The budget in bytes, 0 for none.
  std::size_t memory_budget() const { return state_->memory_budget(); }
  /// The heuristic choosing what a budget evicts (set_memory_budget()).
  EvictionHeuristic eviction_heuristic() const { return state_->eviction_heuristic(); }

  /// Exact byte counts of tape-owned buffers; see MemoryStats.
  MemoryStats memory() const { return state_->memory(); }

  /// True for a tape made with Tape(remat::shapes_only): it counts bytes and computes nothing.
  bool shapes_only() const { return state_->shapes_only(); }

  /// Number of recorded nodes (leaves and ops).
  std::size_t size() const { return static_cast<std::size_t>(state_->size()); }

  /// One line per saved residual (like JAX's print_saved_residuals): node id, op, shape, bytes and why
  /// it is held — "region input" (read by the replay of a region it is an input of), "allowed by policy,
  /// read by a replay" (its region's policy saved it and the region's replay recomputes from it), "allowed
  /// by policy" (a backward reads it), "region output, read outside its region" (its region's policy dropped
  /// it, and a later op's backward or a later region's replay reads it), "region output" (its region's policy
  /// saved it), "constant (variable) recorded inside a checkpointed function" (a leaf: its data is kept
  /// whatever the policy), "outside any region" (no region drops it), "checkpoint of a chain schedule",
  /// "read by the regeneration of an evicted value", with ", named 'x'" for a checkpoint_name tag and ", stored as
  /// bf16 (N B as it is)" for a value a policy stores compressed (its row's bytes are the stored ones); an op's
  /// extra buffer is listed as "<op>.extra". Then the total, which equals memory().saved_bytes. Columns are
  /// aligned to the longest entry.
  void print_saved_residuals(std::ostream& os) const {
    struct Row {
      std::string node, op, shape, bytes, why;
    };
    std::vector<Row> rows;
    std::size_t total = 0;
    for (const detail::SavedResidual& r : state_->saved_residuals()) {
      rows.push_back({"#" + std::to_string(r.node), r.op, to_string(r.shape), std::to_string(r.bytes), r.reason});
      total += r.bytes;
    }
    std::size_t w_node = 4, w_op = 2, w_shape = 5, w_bytes = 5;
    for (const Row& r : rows) {
      w_node = std::max(w_node, r.node.size());
      w_op = std::max(w_op, r.op.size());
      w_shape = std::max(w_shape, r.shape.size());
      w_bytes = std::max(w_bytes, r.bytes.size());
    }
    auto line = [&](const std::string& node, const std::string& op, const std::string& shape, const std::string& b,
                    const char* unit, const std::string& why) {
      os << "  " << std::left << std::setw(static_cast<int>(w_node)) << node << "  "
         << std::setw(static_cast<int>(w_op)) << op << "  " << std::setw(static_cast<int>(w_shape)) << shape << "  "
         << std::right << std::setw(static_cast<int>(w_bytes)) << b << unit << why << "\n";
    };
    os << "saved residuals (" << rows.size() << " buffers; tape of " << state_->size() << " nodes):\n";
    line("node", "op", "shape", "bytes", "    ", "reason");
    for (const Row& r : rows) line(r.node, r.op, r.shape, r.bytes, " B  ", r.why);
    os << "  total " << total << " B\n";
  }

 private:
  template <class Derived>
  Var<T> leaf(const Eigen::MatrixBase<Derived>& value, bool variable) {
    const Shape s{value.rows(), value.cols()};
    const std::int32_t id = state_->add_leaf(s, variable);
    if (state_->shapes_only()) return detail::VarAccess::adopt(state_, id);  // a placeholder: nothing to copy
    try {
      AlignedMap<T>(state_->leaf_value(id), s.rows(), s.cols()) = value.template cast<T>();
      state_->check_leaf_finite(id, variable ? "variable" : "constant");  // anomaly detection
    } catch (...) {
      state_->remove_last_leaf(id);  // an expression whose evaluation allocates a temporary threw
      throw;
    }
    state_->leaf_filled(id);
    return detail::VarAccess::adopt(state_, id);
  }

  Var<T> leaf(const Shape& s, const T* data, bool variable) { return detail::record_leaf(state_, s, data, variable); }

  void check_own(const char* op, const Var<T>& v) const {
    detail::VarAccess::node(v, op);
    if (detail::VarAccess::state(v) != state_) throw tape_error(std::string(op) + ": the Var belongs to another tape");
  }

  std::int32_t check_loss(const char* op, const Var<T>& loss, bool to_parameters) const {
    check_own(op, loss);
    if (state_->open_depth() > 0)
      throw tape_error(std::string(op) + ": called inside a checkpointed function; call it after the function returns");
    const Shape s = loss.shape();
    if (s.rows() != 1 || s.cols() != 1)
      throw shape_error(std::string(op) + ": the loss must be [1,1] but is " + to_string(s) +
                        "; reduce it with sum() or mean() first");
    state_->check_sweepable(op, to_parameters, detail::VarAccess::id(loss));
    return detail::VarAccess::id(loss);
  }

  friend class CapturedStep<T>;
  detail::TapeState<T>* state_;
};

/// Records without gradients on `tape` while it lives, like `with torch.no_grad():` — evaluation keeps no
/// residuals — and puts the tape's previous setting back when it goes (nested guards restore in turn).
///
///   { remat::NoGradGuard no_grad(tape); accuracy = evaluate(tape, batch); }
template <class T>
class NoGradGuard {
 public:
  /// Turns gradient recording off on `tape` until the guard is destroyed, which restores the previous mode.
  explicit NoGradGuard(Tape<T>& tape) : tape_(tape), before_(tape.grad_enabled()) { tape_.set_grad_enabled(false); }
  ~NoGradGuard() { tape_.set_grad_enabled(before_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  Tape<T>& tape_;
  bool before_;
};

}  // namespace remat
