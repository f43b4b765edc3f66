// Recording: leaves, ops (run forward at once), naming an op's output in place, and anomaly detection's check of a
// forward. Its layers hold the policies' decisions at record time (policy_decisions.hpp) and checkpoint regions:
// opening, closing with the analysis of which values their replay will read, aborting (region_recorder.hpp).
#pragma once

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "remat/detail/buffers.hpp"
#include "remat/detail/eviction.hpp"
#include "remat/detail/levels.hpp"
#include "remat/detail/lifetime.hpp"
#include "remat/detail/node.hpp"
#include "remat/detail/non_finite.hpp"
#include "remat/detail/parameter_check.hpp"
#include "remat/detail/policy_decisions.hpp"
#include "remat/detail/region_recorder.hpp"
#include "remat/detail/replay_plan.hpp"
#include "remat/detail/trace.hpp"
#include "remat/errors.hpp"
#include "remat/op_context.hpp"

namespace remat::detail {

template <class T>
class Recorder : public PolicyDecisions<T> {
 public:
  using PolicyDecisions<T>::PolicyDecisions;
  using PolicyDecisions<T>::op_info;

  /// A leaf with an uninitialised tape-owned value (the caller fills it; if that throws, it calls
  /// remove_last_leaf()). Throws shape_error for an empty shape, std::bad_alloc; the tape is unchanged then.
  std::int32_t add_leaf(const Shape& shape, bool variable) {
    check_leaf_shape(shape, variable ? "variable" : "constant", "matrix");
    if (!graph_.open.empty()) reserve_for_close();
    graph_.reserve_nodes(graph_.nodes.size() + 1);
    buffers_.prepare_simulation(static_cast<std::size_t>(shape.numel()));
    const bool evicts = evictor_.needs_work(nullptr, 0, Buffers<T>::bytes(shape));
    if (evicts) room_by_trial(variable ? "variable" : "constant", nullptr, 0, OpShapes{shape, {}, {}});
    Node<T>& n = new_leaf(shape, variable);
    try {
      leaf_room_ = buffers_.make_room(shape, Shape{});
    } catch (...) {
      graph_.pop_node();
      throw;
    }
    leaf_peak_ = buffers_.peak_bytes();
    if (evicts) evictor_.make_room(Buffers<T>::bytes(shape));  // the trial's evictions
    n.value = buffers_.allocate(shape);                        // cannot throw now
    evictor_.touch(graph_.size() - 1);
    return graph_.size() - 1;
  }

  /// Undoes the add_leaf() that returned `id` (the last node) when filling its value threw (an Eigen
  /// expression that allocates a temporary): the tape, its pool and its figures are as before. Never throws.
  void remove_last_leaf(std::int32_t id) noexcept {
    assert(id == graph_.size() - 1 && graph_[id].is_leaf());
    Node<T>& n = graph_[id];
    buffers_.free(n.value, n.shape);
    buffers_.give_back(leaf_room_);
    buffers_.restore_peak(leaf_peak_);
    graph_.pop_node();
  }

  /// A variable referencing a Parameter's storage (no copy). Throws shape_error for an empty parameter.
  std::int32_t add_parameter(std::shared_ptr<ParameterStorage<T>> storage) {
    const Shape shape = storage->shape();  // once: it compares the N-D dimensions with the matrix's
    check_leaf_shape(shape, "variable", "parameter");
    if (!graph_.open.empty()) reserve_for_close();
    Node<T>& n = new_leaf(shape, true);
    n.value = storage->value.data();
    n.parameter_version = storage->version;
    n.parameter_assignments = storage->assignments;
    n.parameter = std::move(storage);
    return graph_.size() - 1;
  }

  /// Records and runs one op whose inputs are live (the caller holds their handles); `input_shapes` are their
  /// shapes, contiguous as an op's recipe reads them (null for none). On any exception
  /// (bad_alloc, a throwing policy, a stale or escaped input, a throwing forward) the tape is left as it
  /// was, memory() figures included: everything that may throw happens before the first change, and the
  /// forward, which should not throw, is undone exactly if it does.
  std::int32_t record(const OpTable<T>* table, const std::int32_t* inputs, const Shape* input_shapes, int arity,
                      const Attributes& attributes, const OpShapes& shapes, const int* indices,
                      std::size_t index_count) {
    const Shape& shape = shapes.output;
    // The element counts of its value, extra and temporary, each taken once: numel() loops over the rank. A view
    // allocates no value: it is its input 0's buffer.
    const std::size_t counts[3] = {table->view ? std::size_t{0} : static_cast<std::size_t>(shape.numel()),
                                   static_cast<std::size_t>(shapes.extra.numel()),
                                   static_cast<std::size_t>(shapes.scratch.numel())};
    for (int k = 0; k < arity; ++k) check_input(table->name, inputs[k]);
    const double flops = table->flops(input_shapes, arity, shape, attributes);
    const bool in_region = !graph_.open.empty();
    const Answers answers = in_region ? policy_decisions(op_info(table, attributes, shape, flops)) : Answers{};
    if (in_region) {
      reserve_for_close();
      reserve_at_least(graph_.pending, graph_.pending.size() + static_cast<std::size_t>(arity));
    }
    reserve_at_least(graph_.indices, graph_.indices.size() + index_count);
    graph_.reserve_nodes(graph_.nodes.size() + 1);
    for (const std::size_t count : counts)
      if (count > 0) buffers_.prepare_simulation(count);
    const std::size_t need = (counts[0] + counts[1] + counts[2]) * sizeof(T);
    // Under a memory budget, evictions and regenerations of inputs first run as a trial (throws
    // memory_budget_error, stale_value_error, std::bad_alloc with the tape unchanged).
    // The heuristics' cost of regenerating it (node.hpp), a whole number so that every sum of costs is exact
    // whatever its order (the evicted classes' costs are summed as they merge: detail/eviction_classes.hpp).
    const double cost = whole(flops) + op_overhead_flops;
    const bool evicts = evictor_.needs_work(inputs, arity, need);
    if (evicts) room_by_trial(table->name, inputs, arity, shapes);
    graph_.add_node();  // within capacity
    const std::int32_t id = graph_.size() - 1;
    typename Buffers<T>::Room room;
    try {
      if (!evicts) room = buffers_.make_room(counts[0], counts[1], counts[2]);
    } catch (...) {
      graph_.pop_node();
      throw;
    }
    // Nothing below throws, except an op's forward (which should not).
    const std::size_t peak = buffers_.peak_bytes();
    if (evicts) {
      evictor_.acquire(inputs, arity);  // resident and pinned, regenerated together if evicted
      evictor_.make_room(need);
    }
    for (int k = 0; k < arity; ++k) evictor_.touch(inputs[k]);
    Node<T>& n = graph_[id];
    n.op = table;
    n.arity = static_cast<std::int8_t>(arity);
    for (int k = 0; k < arity; ++k) n.inputs[k] = inputs[k];
    n.attributes = attributes;
    n.attributes.indices_begin = static_cast<std::int64_t>(graph_.indices.size());
    n.attributes.indices_count = static_cast<std::int64_t>(index_count);
    graph_.indices.insert(graph_.indices.end(), indices, indices + index_count);  // within capacity
    n.shape = shape;
    if (counts[1] > 0) n.extra_shape = shapes.extra;  // else none, as the node starts
    if (counts[2] > 0) n.scratch_shape = shapes.scratch;
    n.region = in_region ? graph_.open.back() : -1;
    n.drop_mask = answers.drop_mask;
    n.stored = answers.stored_with(answers.drop_mask);
    if (n.stored != 0) graph_.compressed_stored = true;  // only such a value is ever packed (Lifetime::settle)
    if (n.stored_format() == StoredFormat::sign) graph_.sign_stored = true;
    n.cost = cost;
    if (table->view)
      lifetime_.share_view(id);  // its input is resident: evictor_.acquire made it so under a budget
    else
      n.value = buffers_.allocate_elements(counts[0]);
    if (counts[1] > 0) n.extra = buffers_.allocate_elements(counts[1]);
    if (counts[2] > 0) n.scratch = buffers_.allocate_elements(counts[2]);
    try {
      if (!buffers_.shapes_only() && !table->view) {  // placeholders: no kernel; a view computes nothing
        if (graph_.trace) graph_.trace->log_forward(graph_, id, true);
        table->forward(ForwardContext<T>{graph_, n, true});
        if (graph_.detect_anomaly) check_finite_forward(id);  // throws: undone below
      }
      buffers_.free(n.scratch, n.scratch_shape);
    } catch (...) {
      if (graph_.trace) graph_.trace->forward_threw(id);
      buffers_.free(n.scratch, n.scratch_shape);
      buffers_.free(n.value, n.shape);
      buffers_.free(n.extra, n.extra_shape);
      buffers_.give_back(room);
      // Evictions and regenerations made for it stay (values and gradients are the same either way).
      if (!evicts) buffers_.restore_peak(peak);
      graph_.indices.resize(static_cast<std::size_t>(n.attributes.indices_begin));
      graph_.pop_node();
      if (evicts)
        for (int k = 0; k < arity; ++k) lifetime_.unpin(inputs[k]);
      throw;
    }
    evictor_.touch(id);
    commit(id);
    if (evicts)
      for (int k = 0; k < arity; ++k) lifetime_.unpin(inputs[k]);
    return id;
  }

  /// Before an op recorded as `n` nodes (concat_cols of k parts, a tree of two-input records) whose outputs
  /// have the shapes `outputs[0 … n)` and no extra or temporary: room for all of them (nodes, buffers, and
  /// inside regions what closing them needs), so that those records fail only if a policy or a forward
  /// throws. Throws std::bad_alloc with the tape's figures as they were (vector capacities may have grown).
  void reserve_records(const Shape* outputs, std::size_t n) {
    graph_.reserve_nodes(graph_.nodes.size() + n);
    // Covers every reservation the n records make in turn (each reserve_for_close(1) and its pending holds).
    if (!graph_.open.empty()) reserve_for_close(n);
    for (std::size_t i = 0; i < n; ++i) buffers_.prepare_simulation(static_cast<std::size_t>(outputs[i].numel()));
    if (evictor_.active()) evictor_.reserve(static_cast<std::size_t>(graph_.size()) + n);
    buffers_.make_room(outputs, n);
  }

  /// Tags op output `id` with `tag` and asks again the policies of the open regions that enclose it, as they
  /// would have been asked had it been recorded with the tag (TapeState::name_in_place). Regions that have
  /// closed keep their decisions (their replay plans are made). A region that now drops it but saved it
  /// before keeps saving it if an input its replay would start from is gone (a weight only its op read):
  /// nothing could regenerate it. Returns false, changing nothing, when it is a leaf, already read by an op, or
  /// already tagged. Whether it names in place depends on neither regions nor memory, so a program names the
  /// same values in place with checkpoints as without: the same graph, the same gradients to the bit. Throws
  /// a policy's exception or std::bad_alloc with the tape unchanged.
  bool retag(std::int32_t id, std::int32_t tag) {
    Node<T>& n = graph_[id];
    if (n.is_leaf() || n.first_use >= 0 || n.attributes.tag >= 0) return false;
    if (!graph_.open.empty())
      reserve_at_least(graph_.pending, graph_.pending.size() + static_cast<std::size_t>(n.arity));
    n.attributes.tag = tag;
    std::uint64_t open_mask = 0;  // the open regions enclosing n
    Answers answers;              // theirs now
    try {
      answers = policy_decisions(op_info(n), id);
      for (std::int32_t rid : graph_.open) {  // outermost first, as at record time
        const Region& r = graph_.region(rid);
        if (r.begin > id) break;  // opened after n: encloses neither n nor a deeper region
        open_mask |= std::uint64_t{1} << r.depth;
      }
    } catch (...) {
      n.attributes.tag = -1;
      throw;
    }
    const std::uint64_t decided = answers.drop_mask;
    const std::uint64_t before = n.drop_mask;
    std::uint64_t drop_mask = (before & ~open_mask) | decided;
    if (level_of(drop_mask) > 0 && (drop_mask & ~before) != 0)
      for (int k = 0; k < n.arity; ++k) {
        const Node<T>& in = graph_[n.inputs[k]];
        if (read_level(graph_, n.inputs[k], id) == 0 && !in.value && !in.evicted && !in.packed) {
          drop_mask &= before | ~open_mask;  // newly dropped: kept saved
          break;
        }
      }
    n.drop_mask = drop_mask;
    n.level = static_cast<std::int8_t>(level_of(drop_mask));
    // Kept compressed as the open regions answer now, unless a region deeper than the answer drops it or a closed
    // region returned it (a returned value is stored as it is).
    n.stored = n.output_mask == 0 ? answers.stored_with(drop_mask) : 0;
    if (n.stored != 0) graph_.compressed_stored = true;
    if (n.stored_format() == StoredFormat::sign) graph_.sign_stored = true;
    // What commit() does for a value some region may replay: its level-0 inputs wait for the regions' close.
    if (n.level > 0 && !graph_.open.empty())
      for (int k = 0; k < n.arity; ++k)
        if (read_level(graph_, n.inputs[k], id) == 0) lifetime_.hold_pending(n.inputs[k]);
    lifetime_.settle(id);
    return true;
  }

  /// Anomaly detection: throws anomaly_error if op node `id`'s value or extra holds a NaN or ±inf, naming
  /// whether an input already held one (the op propagated it) or the op produced it from finite inputs.
  void check_finite_forward(std::int32_t id) const {
    const Node<T>& n = graph_[id];
    std::string where;
    std::int64_t bad = first_non_finite(n.value, n.shape.rows(), n.shape.cols());
    if (bad >= 0) {
      where = "its value holds " + non_finite_text(n.value, n.shape.cols(), bad);
    } else if (n.extra && (bad = first_non_finite(n.extra, n.extra_shape.rows(), n.extra_shape.cols())) >= 0) {
      where = "its extra " + to_string(n.extra_shape) + " holds " + non_finite_text(n.extra, n.extra_shape.cols(), bad);
    } else {
      return;
    }
    std::string cause = "from finite inputs";
    for (int k = 0; k < n.arity; ++k) {
      const Node<T>& in = graph_[n.inputs[k]];
      const std::int64_t e = in.value ? first_non_finite(in.value, in.shape.rows(), in.shape.cols()) : -1;
      if (e < 0) continue;
      cause = "propagated: its input " + std::to_string(k) + " (node #" + std::to_string(n.inputs[k]) + ", " +
              graph_.node_name(n.inputs[k]) + ") holds " + non_finite_text(in.value, in.shape.cols(), e);
      break;
    }
    throw anomaly_error(std::string(n.op->name) + " (node #" + std::to_string(id) + ", " + to_string(n.shape) +
                            "): its forward gave a non-finite value, " + cause + "; " + where +
                            " (anomaly detection is on: Tape::set_detect_anomaly); the op was not recorded",
                        id);
  }

  /// Throws what record() throws for input `id` of an op named `op`, before changing anything: tape_error
  /// for a value computed inside a checkpointed function that did not return it, stale_value_error for a
  /// Parameter modified since it was recorded. (For an op of several nodes, such as concat_cols, to check
  /// every input before recording the first.)
  void check_input(const char* op, std::int32_t id) const {
    check_not_escaped(op, id);
    check_parameter_current(graph_, id, op);
  }

 private:
  using Base = PolicyDecisions<T>;
  using Base::graph_, Base::buffers_, Base::lifetime_, Base::evictor_, Base::reserve_at_least, Base::reserve_for_close,
      Base::check_not_escaped;  // RegionRecorder

  using Base::policy_decisions;  // PolicyDecisions
  using typename Base::Answers;

  /// Under a memory budget: the trial of recording an op on `inputs` with these buffers (make its inputs
  /// resident, evict for its buffers), then the pool buffers the real run will take. Throws
  /// memory_budget_error, stale_value_error (a modified Parameter a regeneration would read) or std::bad_alloc
  /// with the tape and its pool as they were.
  void room_by_trial(const char* what, const std::int32_t* inputs, int arity, const OpShapes& shapes) {
    evictor_.reserve(static_cast<std::size_t>(graph_.size()));
    evictor_.trial(what, [&] {
      evictor_.acquire(inputs, arity);
      evictor_.make_room(Buffers<T>::bytes(shapes.output) + Buffers<T>::bytes(shapes.extra) +
                         Buffers<T>::bytes(shapes.scratch));
      for (const Shape* s : {&shapes.output, &shapes.extra, &shapes.scratch}) {
        T* p = s->numel() > 0 ? buffers_.allocate(*s) : nullptr;
        (void)p;  // counted only; the trial's end forgets it
      }
    });
    buffers_.reserve_simulated();
  }

  /// `flops` rounded up to a whole number, 0 if negative (a conversion, not a call to ceil: every op records one).
  static double whole(double flops) {
    if (!(flops > 0)) return 0;
    if (flops >= 0x1p53) return flops;  // a double this large is whole
    const auto n = static_cast<std::uint64_t>(flops);
    return static_cast<double>(n) + (static_cast<double>(n) < flops ? 1.0 : 0.0);
  }

  static void check_leaf_shape(const Shape& shape, const char* op, const char* what) {
    if (valid_op_shape(shape, false, sizeof(T))) return;  // one pass over the dimensions in the usual case
    if (std::any_of(shape.begin(), shape.end(), [](Index d) { return d <= 0; }))
      throw shape_error(std::string(op) + ": empty " + what + " " + to_string(shape) +
                        "; every dimension of a tensor must be at least 1");
    throw shape_error(std::string(op) + ": " + what + " " + to_string(shape) +
                      " needs more than the 2^48 bytes a tensor may have");
  }

  Node<T>& new_leaf(const Shape& shape, bool variable) {
    Node<T>& n = graph_.add_node();
    n.shape = shape;
    n.is_variable = n.requires_grad = variable;
    n.region = graph_.open.empty() ? -1 : graph_.open.back();
    n.handles = 1;
    return n;
  }

  /// After a successful forward: what the op's backward will read, and the pending holds. Never throws.
  void commit(std::int32_t id) noexcept {
    Node<T>& n = graph_[id];
    n.level = static_cast<std::int8_t>(level_of(n.drop_mask));
    GradInputs grad_inputs = 0;
    for (int k = 0; k < n.arity; ++k)
      if (graph_[n.inputs[k]].requires_grad) grad_inputs |= 1u << k;
    if (n.op->stops_gradient || !graph_.grad_enabled) grad_inputs = 0;
    n.requires_grad = grad_inputs != 0;
    n.reads = static_cast<std::uint8_t>(n.requires_grad ? n.op->reads(grad_inputs) : 0u);
    for (int k = 0; k < n.arity; ++k)
      if (n.reads & reads_input(k)) lifetime_.add_backward_read(n.inputs[k], id);
    if (n.reads & reads_output) lifetime_.add_backward_read(id, id);
    for (int k = 0; k < n.arity; ++k) {  // the consumer lists the eviction heuristics walk
      Node<T>& in = graph_[n.inputs[k]];
      n.next_use[k] = in.first_use;
      in.first_use = id * max_inputs + k;
    }
    n.extra_read = (n.reads & reads_extra) != 0;
    // A level-0 input of an op some region may replay may become a source of that replay; which ones,
    // the regions say when they close.
    if (n.level > 0)
      for (int k = 0; k < n.arity; ++k)
        if (read_level(graph_, n.inputs[k], id) == 0) lifetime_.hold_pending(n.inputs[k]);
    n.handles = 1;  // so the value stays: only an extra no backward reads may go now
    if (n.extra) lifetime_.settle_extra(id);
  }

  typename Buffers<T>::Room leaf_room_;  // what the last add_leaf() reserved, for remove_last_leaf()
  std::size_t leaf_peak_ = 0;
};

}  // namespace remat::detail
