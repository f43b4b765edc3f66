// A runtime memory budget by Dynamic Tensor Rematerialization (Kirisame et al., "Dynamic Tensor
// Rematerialization", ICLR 2021): when an allocation would take the tape's live bytes over the budget, evict
// resident op outputs (their buffers go; the lifetime rule still wants them) chosen by a heuristic, and
// regenerate an evicted value when it is read again by re-running its recorded op from its inputs,
// recursively regenerated.
//
// How it sits on the lifetime rule (detail/lifetime.hpp): eviction frees a buffer the rule wants and marks
// the node evicted; an evicted node holds a regeneration read on each input, so what it is regenerated from
// is kept (or is evicted in turn); a running op pins what it reads. Every other free is the rule's.
//
// Determinism and exceptions: every choice depends only on the tape's state (shapes, FLOP estimates, a
// logical clock), never on time or addresses. An allocation that may need evictions or regenerations first
// runs as a trial (trial(): the same code with kernels skipped and buffers only counted, then every node put
// back), which throws memory_budget_error if the budget cannot be met, and learns the pool buffers the real
// run will take; the real run then repeats the trial's choices and cannot fail. The backward's dry run is
// such a trial of the whole sweep (detail/sweep.hpp).
#pragma once

#include <algorithm>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "remat/detail/buffers.hpp"
#include "remat/detail/contexts.hpp"
#include "remat/detail/eviction_classes.hpp"
#include "remat/detail/lifetime.hpp"
#include "remat/detail/node.hpp"
#include "remat/detail/parameter_check.hpp"
#include "remat/detail/trace.hpp"
#include "remat/errors.hpp"
#include "remat/memory.hpp"

namespace remat::detail {

/// Every field of a node that a sweep, a regeneration or an eviction changes: what a dry run or a trial
/// puts back.
template <class T>
struct NodeSnapshot {
  T *value, *extra, *grad;
  std::int32_t backward_reads, replay_reads, pins, regen_reads, schedule_holds;
  bool grad_assigned, extra_read, evicted;
  std::uint64_t last_access;
  std::int32_t class_parent, class_size;
  double class_cost;

  static NodeSnapshot of(const Node<T>& n) {
    return {n.value,   n.extra,       n.grad,           n.backward_reads, n.replay_reads,
            n.pins,    n.regen_reads, n.schedule_holds, n.grad_assigned,  n.extra_read,
            n.evicted, n.last_access, n.class_parent,   n.class_size,     n.class_cost};
  }
  void restore(Node<T>& n) const {
    n.value = value;
    n.extra = extra;
    n.grad = grad;
    n.backward_reads = backward_reads;
    n.replay_reads = replay_reads;
    n.pins = pins;
    n.regen_reads = regen_reads;
    n.schedule_holds = schedule_holds;
    n.grad_assigned = grad_assigned;
    n.extra_read = extra_read;
    n.evicted = evicted;
    n.last_access = last_access;
    n.class_parent = class_parent;
    n.class_size = class_size;
    n.class_cost = class_cost;
  }
};

template <class T>
class Evictor {
 public:
  Evictor(Graph<T>& graph, Buffers<T>& buffers, Lifetime<T>& lifetime)
      : graph_(graph), buffers_(buffers), lifetime_(lifetime) {}

  // ---- the budget ----
  /// 0: no budget.
  std::size_t budget() const { return budget_; }
  EvictionHeuristic heuristic() const { return heuristic_; }
  void set_budget(std::size_t bytes, EvictionHeuristic h) {
    budget_ = bytes;
    heuristic_ = h;
  }
  bool active() const { return budget_ != 0; }

  // ---- what it did (memory()) ----
  struct Counters {
    std::size_t evictions = 0, ops = 0, bytes = 0;
    std::uint64_t clock = 0;
  };
  Counters counters() const { return {evictions_, rematerialized_ops_, rematerialized_bytes_, clock_}; }
  void restore(const Counters& c) {
    evictions_ = c.evictions;
    rematerialized_ops_ = c.ops;
    rematerialized_bytes_ = c.bytes;
    clock_ = c.clock;
  }
  void reset_counters() { evictions_ = rematerialized_ops_ = rematerialized_bytes_ = 0; }

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
            "reads, values that cannot be regenerated), so that allocation needs a budget of at least " +
            std::to_string(failed_least_) + " bytes; raise the budget (Tape::set_memory_budget) or clear() the tape",
        budget_, failed_needed_, failed_least_);
  }

  /// Room for the scratch of a trial on a graph of `nodes` nodes. Throws std::bad_alloc, before any change.
  void reserve(std::size_t nodes) {
    if (saved_.capacity() < nodes) saved_.reserve(std::max(nodes, 2 * saved_.capacity()));
    if (walk_.capacity() < nodes) walk_.reserve(std::max(nodes, 2 * walk_.capacity()));
  }

  /// Runs `body` (eviction, regeneration and allocation calls) as a trial: buffers only counted, kernels
  /// skipped, and every node, the clock and the counters put back afterwards; then throws
  /// memory_budget_error naming `what` if the budget could not be met, else leaves in the pool's
  /// simulation the buffers the same body will take (Buffers::reserve_simulated). Call reserve() first.
  template <class Body>
  void trial(const char* what, Body&& body) {
    saved_.clear();
    for (const Node<T>& n : graph_.nodes) saved_.push_back(NodeSnapshot<T>::of(n));  // within capacity
    const Counters before = counters();
    failed_ = false;
    stale_ = -1;
    buffers_.begin_simulation();
    try {
      body();
    } catch (...) {
      end_trial(before);
      throw;
    }
    end_trial(before);
    if (stale_ >= 0) check_parameter_current(graph_, std::exchange(stale_, -1), what);
    if (failed_) throw_failure(what);
  }

  /// Whether an op reading `inputs` and allocating `bytes` needs evictions or regenerations.
  /// An evicted input needs regenerating even with no budget now: set_memory_budget(0) leaves what was
  /// evicted evicted, and an op reading it would read no buffer. Without evictions every input is resident.
  bool needs_work(const std::int32_t* inputs, int arity, std::size_t bytes) const {
    for (int k = 0; k < arity; ++k)
      if (!graph_[inputs[k]].value) return true;
    return active() && buffers_.current_live_bytes() + bytes > budget_;
  }

  /// One tick of the logical clock: node `id` is read or written now.
  void touch(std::int32_t id) { graph_[id].last_access = ++clock_; }

  /// Evicts until `bytes` more fit within the budget. Returns false, noting the failure, if they cannot
  /// (nothing is left to evict); the caller allocates anyway (a trial or a dry run reports it afterwards;
  /// a real run never gets here, its trial having succeeded). Never throws.
  bool make_room(std::size_t bytes) noexcept {
    if (!active()) return true;
    while (buffers_.current_live_bytes() + bytes > budget_) {
      const std::int32_t victim = best_victim();
      if (victim < 0) {
        note_failure(bytes);
        return false;
      }
      evict(victim);
    }
    return true;
  }

  /// Makes node `id`'s value resident, regenerating it (and what it needs) if it is evicted; a Parameter
  /// leaf's value is its storage again. Never throws: a modified Parameter read here is noted for trial() to
  /// report (a backward checks them all before its dry run).
  void ensure(std::int32_t id) noexcept {
    Node<T>& n = graph_[id];
    if (n.value && !n.parameter) {  // the usual case, inlined: resident and tape-owned
      touch(id);
      return;
    }
    ensure_slow(id);
  }

  /// Runs op node `u`'s forward into its buffers (allocating the value, extra and temporary it lacks), its
  /// inputs made resident and pinned meanwhile: a regeneration (`rematerialization`, counted in memory())
  /// or a checkpoint replay's member. The kernel is skipped in a trial, a dry run and on a shapes-only tape.
  /// An extra the forward writes that the lifetime rule does not want is freed again at once. Never throws.
  void compute(std::int32_t u, bool rematerialization) noexcept {
    Node<T>& n = graph_[u];
    for (int k = 0; k < n.arity; ++k) {
      ensure(n.inputs[k]);
      lifetime_.pin(n.inputs[k]);
    }
    std::size_t need = Buffers<T>::bytes(n.scratch_shape);
    if (!n.value) need += Buffers<T>::bytes(n.shape);
    if (n.extra_shape.size() > 0 && !n.extra) need += Buffers<T>::bytes(n.extra_shape);
    make_room(need);
    const std::size_t written = (n.value ? 0 : Buffers<T>::bytes(n.shape)) +
                                (n.extra_shape.size() > 0 && !n.extra ? Buffers<T>::bytes(n.extra_shape) : 0);
    if (!n.value) n.value = buffers_.allocate(n.shape);
    if (n.extra_shape.size() > 0 && !n.extra) n.extra = buffers_.allocate(n.extra_shape);
    if (n.scratch_shape.size() > 0) n.scratch = buffers_.allocate(n.scratch_shape);
    if (!buffers_.simulating() && !buffers_.shapes_only()) {
      if (graph_.trace) graph_.trace->log_forward(graph_, u);
      n.op->forward(ForwardContext<T>{graph_, n});
    }
    buffers_.free(n.scratch, n.scratch_shape);
    if (rematerialization) {
      ++rematerialized_ops_;
      rematerialized_bytes_ += written;
    }
    touch(u);
    lifetime_.mark_resident(u);
    for (int k = 0; k < n.arity; ++k) lifetime_.unpin(n.inputs[k]);
    lifetime_.settle_extra(u);
  }

 private:
  /// ensure() of a value that is evicted or a Parameter's (its version is checked).
  void ensure_slow(std::int32_t id) noexcept {
    Node<T>& n = graph_[id];
    if (n.parameter && n.parameter->version != n.parameter_version && stale_ < 0) stale_ = id;
    if (!n.value) {
      if (n.is_leaf()) {
        assert(n.parameter && "a leaf's value is needed after it was freed");
        n.value = n.parameter->value.data();
      } else {
        compute(id, true);
      }
    }
    touch(id);
  }

  void end_trial(const Counters& before) noexcept {
    buffers_.end_simulation();
    for (std::size_t i = 0; i < saved_.size(); ++i) saved_[i].restore(graph_.nodes[i]);
    restore(before);
  }

  void note_failure(std::size_t bytes) noexcept {
    if (failed_) return;  // the first failure is the one reported
    failed_ = true;
    failed_needed_ = bytes;
    failed_least_ = buffers_.current_live_bytes() + bytes;  // nothing live could be evicted any more
  }

  // ---- choosing ----
  /// A value the budget may evict: an op's tape-owned output, resident, wanted (the rule would keep it),
  /// not read by an op running now, and regenerable from what is there.
  bool evictable(std::int32_t id) {
    const Node<T>& n = graph_[id];
    if (n.is_leaf() || !n.value || !n.value_owned() || n.pins > 0 || !lifetime_.value_wanted(n)) return false;
    for (int k = 0; k < n.arity; ++k)
      if (!regenerable(n.inputs[k])) return false;
    return true;
  }
  /// Resident, evicted (its inputs are held: regenerable by construction), a current Parameter, or an op
  /// whose inputs are regenerable. Memoised per scan.
  bool regenerable(std::int32_t id) {
    Node<T>& n = graph_[id];
    if (n.value || n.evicted) return true;
    if (n.is_leaf()) return n.parameter && n.parameter->version == n.parameter_version;
    if (n.evict_mark == scan_) return n.evict_memo == 1;
    bool ok = true;
    for (int k = 0; k < n.arity && ok; ++k) ok = regenerable(n.inputs[k]);
    n.evict_mark = scan_;
    n.evict_memo = ok ? 1 : 2;
    return ok;
  }

  /// The evictable value of lowest score cost / (bytes · staleness); the lowest id on a tie; -1 if none.
  std::int32_t best_victim() {
    if (++scan_ == 0) ++scan_;
    std::int32_t best = -1;
    double best_score = 0;
    for (std::int32_t i = 0; i < graph_.size(); ++i) {
      if (!evictable(i)) continue;
      const Node<T>& n = graph_[i];
      const double staleness = static_cast<double>(clock_ - n.last_access + 1);
      const double score = cost(i) / (static_cast<double>(Buffers<T>::bytes(n.shape)) * staleness);
      if (best < 0 || score < best_score) {
        best = i;
        best_score = score;
      }
    }
    return best;
  }

  double cost(std::int32_t id) {
    switch (heuristic_) {
      case EvictionHeuristic::local:
        return graph_[id].cost;
      case EvictionHeuristic::dtr_eq:
        return graph_[id].cost + class_neighbourhood(id);
      case EvictionHeuristic::dtr:
        break;
    }
    return graph_[id].cost + exact_neighbourhood(id);
  }

  /// h_DTR^eq's e*(t): the costs of the distinct classes of t's evicted inputs and consumers, and of its
  /// absent inputs that its eviction would make evicted (each alone: their own absent inputs are not walked).
  double class_neighbourhood(std::int32_t id) {
    if (++walk_stamp_ == 0) ++walk_stamp_;
    double sum = 0;
    auto add_class = [&](std::int32_t v) {
      Node<T>& root = graph_[class_root(graph_, v)];
      if (root.class_mark == walk_stamp_) return;
      root.class_mark = walk_stamp_;
      sum += root.class_cost;
    };
    const Node<T>& n = graph_[id];
    for (int k = 0; k < n.arity; ++k) {
      const Node<T>& w = graph_[n.inputs[k]];
      if (w.evicted)
        add_class(n.inputs[k]);
      else if (!w.value && !w.is_leaf())
        sum += w.cost;
    }
    for (std::int32_t e = n.first_use; e >= 0; e = graph_[e / max_inputs].next_use[e % max_inputs])
      if (graph_[e / max_inputs].evicted) add_class(e / max_inputs);
    return sum;
  }

  /// h_DTR's e*(t), walked: from t, through absent op inputs (what regenerating them needs) and evicted
  /// consumers (what needs them), summing each node's cost once.
  double exact_neighbourhood(std::int32_t id) {
    if (++walk_stamp_ == 0) ++walk_stamp_;
    double sum = 0;
    walk_.clear();
    graph_[id].class_mark = walk_stamp_;
    walk_.push_back(id);  // within capacity (reserve): each node enters once
    while (!walk_.empty()) {
      const std::int32_t v = walk_.back();
      walk_.pop_back();
      const Node<T>& n = graph_[v];
      auto visit = [&](std::int32_t w) {
        Node<T>& m = graph_[w];
        if (m.class_mark == walk_stamp_) return;
        m.class_mark = walk_stamp_;
        sum += m.cost;
        walk_.push_back(w);
      };
      for (int k = 0; k < n.arity; ++k) {
        const Node<T>& w = graph_[n.inputs[k]];
        if (!w.value && !w.is_leaf()) visit(n.inputs[k]);
      }
      for (std::int32_t e = n.first_use; e >= 0; e = graph_[e / max_inputs].next_use[e % max_inputs])
        if (graph_[e / max_inputs].evicted) visit(e / max_inputs);
    }
    return sum;
  }

  // ---- evicting ----
  void evict(std::int32_t id) noexcept {
    Node<T>& n = graph_[id];
    buffers_.free(n.value, n.shape);
    hold_inputs(id);
    ++evictions_;
  }
  /// Node `id` just lost its buffer (or never had one back): its absent inputs become evicted in turn (a
  /// Parameter's value is its storage again), and it becomes evicted, holding its inputs.
  void hold_inputs(std::int32_t id) noexcept {
    const Node<T>& n = graph_[id];
    for (int k = 0; k < n.arity; ++k) {
      Node<T>& w = graph_[n.inputs[k]];
      if (w.value || w.evicted) continue;
      if (w.is_leaf())
        w.value = w.parameter->value.data();  // evictable() checked it current
      else
        hold_inputs(n.inputs[k]);
    }
    lifetime_.mark_evicted(id);
  }

  Graph<T>& graph_;
  Buffers<T>& buffers_;
  Lifetime<T>& lifetime_;
  std::size_t budget_ = 0;
  EvictionHeuristic heuristic_ = EvictionHeuristic::dtr_eq;
  std::uint64_t clock_ = 0;
  std::size_t evictions_ = 0, rematerialized_ops_ = 0, rematerialized_bytes_ = 0;
  bool failed_ = false;
  std::size_t failed_needed_ = 0, failed_least_ = 0;
  std::int32_t stale_ = -1;  // a modified Parameter a trial read, reported after it
  std::uint32_t scan_ = 0, walk_stamp_ = 0;
  std::vector<NodeSnapshot<T>> saved_;
  std::vector<std::int32_t> walk_;
};

}  // namespace remat::detail
