// run_schedule() executes a planned chain schedule as nested checkpoint regions;
// checkpoint_sequential_auto() measures a chain with a probe pass, plans within a byte budget and runs it.
#pragma once

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "remat/checkpoint.hpp"
#include "remat/errors.hpp"
#include "remat/schedule/chain_state.hpp"
#include "remat/schedule/planner.hpp"

namespace remat {
namespace detail {

/// The policy of the regions run_schedule() opens: saves the ops recorded while *flag is set (the layer
/// whose full tape the schedule keeps), nothing else.
struct SaveWhileFlagged {
  const bool* flag;
  bool operator()(const OpInfo&) const { return *flag; }
};

template <class Layers, class S>
S run_plan_node(const Layers& layers, const Schedule& schedule, int index, S x, bool* flag) {
  const PlanNode& n = schedule.nodes[static_cast<std::size_t>(index)];
  auto layer = [&](int i, S v) { return call_layer(layers[static_cast<std::size_t>(i - 1)], std::move(v)); };
  switch (n.kind) {
    case PlanNode::backward: {
      // The layer whose tape the enclosing region keeps: its ops are saved at the enclosing level.
      *flag = true;
      try {
        x = layer(n.last, std::move(x));
      } catch (...) {
        *flag = false;
        throw;
      }
      *flag = false;
      return x;
    }
    case PlanNode::split_tape: {
      if (n.kept == n.source + 1) {
        x = layer(n.kept, std::move(x));  // Fall_kept at this level: its tape is kept here
      } else {
        bool save = false;
        x = checkpoint_state([&](S v) { return run_plan_node(layers, schedule, n.left, std::move(v), &save); },
                             SaveWhileFlagged{&save}, std::move(x));
      }
      if (n.right < 0) return x;
      return run_plan_node(layers, schedule, n.right, std::move(x), flag);
    }
    case PlanNode::split_activation: {
      if (n.right_first != n.kept + 1) break;
      bool save = false;
      x = checkpoint_state([&](S v) { return run_plan_node(layers, schedule, n.left, std::move(v), &save); },
                           SaveWhileFlagged{&save}, std::move(x));
      return run_plan_node(layers, schedule, n.right, std::move(x), flag);
    }
    case PlanNode::advance:
    case PlanNode::advance_tape:
      break;
  }
  assert(false && "run_plan_node: a persistent schedule has no advance and no split with right_first > kept + 1");
  return x;
}

/// checkpoint_sequential_auto plans non-persistent schedules for chains up to this length.
constexpr int non_persistent_layers = 16;

/// Whether nested checkpoint regions can run `schedule`: no checkpoint is freed before its sub-chain is done.
inline bool persistent(const Schedule& schedule) {
  for (const PlanNode& n : schedule.nodes)
    if (n.kind == PlanNode::advance || n.kind == PlanNode::advance_tape ||
        (n.kind == PlanNode::split_activation && n.right_first != n.kept + 1))
      return false;
  return true;
}

/// The chain's plan for the tape (ChainPlan): the operations from the first backward on, what the forward
/// pass must keep for it (held: activations; tapes: layers whose ops it saves). Throws std::bad_alloc.
inline ChainPlan chain_plan_of(const Schedule& schedule, int L, int width) {
  ChainPlan plan;
  plan.width = width;
  plan.layer_begin.assign(static_cast<std::size_t>(L + 1), 0);
  plan.outputs.assign(static_cast<std::size_t>((L + 1) * width), -1);
  plan.held.assign(static_cast<std::size_t>(L + 1), 0);
  plan.tapes.assign(static_cast<std::size_t>(L + 1), 0);
  std::size_t first_backward = 0;
  for (; first_backward < schedule.operations.size(); ++first_backward) {
    const ScheduleOperation& op = schedule.operations[first_backward];
    const auto i = static_cast<std::size_t>(op.layer);
    if (op.kind == ScheduleOperation::backward) break;
    if (op.kind == ScheduleOperation::free_activation) plan.held[i] = 0;
    if (op.kind == ScheduleOperation::forward || op.kind == ScheduleOperation::forward_all) plan.held[i] = 1;
    if (op.kind == ScheduleOperation::forward_all) plan.tapes[i] = 1;
  }
  plan.held[0] = 0;  // x_0 is the caller's
  for (std::size_t k = first_backward; k < schedule.operations.size(); ++k) {
    const ScheduleOperation& op = schedule.operations[k];
    ChainPlan::Operation o{};
    o.layer = op.layer;
    switch (op.kind) {
      case ScheduleOperation::forward:
        o.kind = ChainPlan::Operation::forward;
        break;
      case ScheduleOperation::forward_all:
        o.kind = ChainPlan::Operation::forward_all;
        break;
      case ScheduleOperation::backward:
        o.kind = ChainPlan::Operation::backward;
        break;
      case ScheduleOperation::free_activation:
        o.kind = ChainPlan::Operation::free_activation;
        break;
    }
    plan.operations.push_back(o);
  }
  return plan;
}

/// run_schedule for a non-persistent schedule: the chain is one region whose backward runs the schedule's
/// operations (detail/sweep.hpp, run_chain). Only outside checkpoint regions (an enclosing region's replay
/// would not know the schedule's holds).
template <class Layers, class S>
S run_chain_schedule(const Layers& layers, const Schedule& schedule, S x) {
  using T = typename chain_state<S>::scalar;
  constexpr int width = static_cast<int>(chain_state<S>::width);
  TapeState<T>* state = chain_tape(x, "run_schedule");
  if (state->open_depth() > 0)
    throw domain_error(
        "run_schedule: a non-persistent schedule (one that frees a checkpoint before its sub-chain is done) runs "
        "only outside checkpoint regions; inside one, plan with plan_schedule(chain, budget, /*persistent=*/true)");
  const int L = static_cast<int>(std::size(layers));
  const std::int32_t index = state->add_chain_plan(chain_plan_of(schedule, L, width));
  std::vector<std::int32_t> holds;
  holds.reserve(static_cast<std::size_t>(L * width));
  state->output_scratch().reserve(width);
  bool save = false;
  const SaveWhileFlagged policy{&save};
  const std::uint32_t generation = state->generation();
  const std::int32_t region = state->open_region(&call_policy<SaveWhileFlagged>, &policy, index);
  state->add_ref();  // the state outlives a Tape destroyed inside a layer
  struct Release {
    TapeState<T>* s;
    ~Release() { s->drop_ref(); }
  } release{state};
  try {
    for_each_var(x, [&](std::size_t k, const Var<T>& v) {
      state->chain_plan(index).output(0, static_cast<int>(k)) = detail::VarAccess::id(v);
    });
    for (int i = 1; i <= L; ++i) {
      state->chain_plan(index).layer_begin[static_cast<std::size_t>(i - 1)] = state->size();
      save = state->chain_plan(index).tapes[static_cast<std::size_t>(i)] != 0;
      x = call_layer(layers[static_cast<std::size_t>(i - 1)], std::move(x));
      save = false;
      if (!state->region_is_innermost(region, generation))
        throw tape_error("run_schedule: the tape was cleared or destroyed while a layer ran");
      for_each_var(x, [&](std::size_t, const Var<T>& v) {
        if (detail::VarAccess::state(v) != state)
          throw tape_error("run_schedule: layer " + std::to_string(i) + " returned a Var of another tape");
        detail::VarAccess::node(v, "run_schedule");
      });
      const bool held = state->chain_plan(index).held[static_cast<std::size_t>(i)] != 0;
      for_each_var(x, [&](std::size_t k, const Var<T>& v) {
        state->chain_plan(index).output(i, static_cast<int>(k)) = detail::VarAccess::id(v);
        if (!held) return;
        state->add_schedule_hold(detail::VarAccess::id(v));
        holds.push_back(detail::VarAccess::id(v));  // within capacity
      });
    }
    state->chain_plan(index).layer_begin[static_cast<std::size_t>(L)] = state->size();
    std::vector<std::int32_t>& outputs = state->output_scratch();
    outputs.clear();
    for_each_var(
        x, [&](std::size_t, const Var<T>& v) { outputs.push_back(detail::VarAccess::id(v)); });  // within capacity
    state->close_region(outputs);
    return x;
  } catch (...) {
    save = false;
    if (state->region_is_innermost(region, generation)) {
      for (std::int32_t id : holds) state->release_schedule_hold(id);
      state->abort_region();
    }
    throw;
  }
}

}  // namespace detail

/// Runs `layers` (L callables S → S) on x following `schedule` (from plan_schedule for a chain of
/// the same L) and returns x_L. The state S is a Var<T> or a std::tuple of Var<T> (an LSTM's (h, c)); a layer
/// may take a tuple's Vars unpacked. A persistent schedule runs as nested checkpoint regions: each kept
/// activation a region boundary, each kept full tape a layer whose ops the region saves. Any other one runs
/// as one region carrying the schedule, whose backward performs its operations on the recorded ops
/// (docs/schedules.md, "How a schedule runs on the tape"). Either way layer i's ops are evaluated
/// schedule.forward_counts(L)[i − 1] times in all (first pass included; the layer functions are called once)
/// and gradients are bitwise those of the plain tape. Throws domain_error for an infeasible schedule, one
/// planned for another length, or a non-persistent one inside a checkpoint region (plan with
/// persistent = true there); tape_error for an empty or stale Var in x, Vars of different tapes, and (a
/// non-persistent run) a layer returning a Var of another tape.
template <class Layers, class S>
S run_schedule(const Layers& layers, const Schedule& schedule, S x) {
  detail::check_chain_state<S>();
  detail::chain_tape(x, "run_schedule");
  if (!schedule.feasible || schedule.root < 0) throw domain_error("run_schedule: the schedule is not feasible");
  const auto L = static_cast<int>(std::size(layers));
  if (schedule.nodes[static_cast<std::size_t>(schedule.root)].last != L)
    throw domain_error("run_schedule: the schedule was planned for " +
                       std::to_string(schedule.nodes[static_cast<std::size_t>(schedule.root)].last) + " layers, not " +
                       std::to_string(L));
  if (!detail::persistent(schedule)) return detail::run_chain_schedule(layers, schedule, std::move(x));
  return detail::run_plan_node(layers, schedule, schedule.root, std::move(x), static_cast<bool*>(nullptr));
}

/// What checkpoint_sequential_auto measured and planned.
struct AutoScheduleReport {
  Chain chain;                 ///< measured chain: times in FLOPs, sizes in units of `unit_bytes`
  std::size_t unit_bytes = 0;  ///< sizes and budget were quantised to this many bytes (sizes rounded up)
  /// Held throughout: tape bytes live at the call besides x_0, and 2 × the tape-owned leaves the layers record.
  std::size_t baseline_bytes = 0;
  /// The peak bound after the chain's backward, in bytes: the baseline, x_0, the gradients the chain leaves
  /// and the backward of the ops recorded before the call (detail::after_chain_bytes).
  std::size_t after_chain_bytes = 0;
  Schedule schedule;  ///< the optimal schedule that ran (persistent inside a region or for L > 16)
};

namespace detail {

/// B_i's peak against the model's x̄_i + δ_i + x_{i−1} + δ_{i−1}, found by following the sweep's rules
/// (detail/sweep.hpp) over the layer's recorded nodes [begin, end) in reverse: an input's gradient buffer
/// (δ_{i−1} too) is allocated at its first contribution, an op's temporary while its backward runs, an op's
/// own gradient (δ_i too) is freed after its backward, and a residual of x̄_i once the last backward reading
/// it has run. `overhead` is o_b: B_i's peak minus those four terms — negative when B_i frees δ_i or
/// residuals before it allocates as much (a tanh∘linear layer frees δ_i and tanh's output before the weight
/// gradient is allocated). `left` is g: gradients that stay after B_i — of nodes recorded before the chain
/// that are not Parameters, of tape variables recorded inside the layer (both stay until the sweep passes
/// them, after the chain), and of Parameters whose first consumer is an op before the layer (a weight shared
/// with earlier layers). A Parameter's gradient goes to the Parameter once its first consumer's backward has
/// run (Tape::backward, detail/gradient_delivery.hpp): when that op is in the layer, in o_b, not in g.
/// The layer's output (its value may be held by a handle) and, in a layer with checkpoint regions of its
/// own (whose replays hold values too), every residual are taken to stay until the end of B_i: an upper
/// bound either way.
struct BackwardBytes {
  std::int64_t overhead = 0;
  std::size_t left = 0;
  std::int64_t peak = 0;  ///< the walk's peak: overhead + δ_i + δ_{i−1}
};

/// A chain's state x_i as node ids (a Var's, or a tuple's Vars'): `width` ids from `ids`.
struct StateIds {
  const std::int32_t* ids = nullptr;
  int width = 0;
  bool contains(std::int32_t id) const { return std::find(ids, ids + width, id) != ids + width; }
  bool any_in(std::int32_t begin, std::int32_t end) const {
    return std::any_of(ids, ids + width, [&](std::int32_t id) { return id >= begin && id < end; });
  }
  /// Whether ids[k] is the first of its value in the state (a tuple may hold one Var twice).
  bool first(int k) const { return std::find(ids, ids + k, ids[k]) == ids + k; }
  /// Bytes of its distinct values, or of those in [begin, end).
  template <class T>
  std::size_t bytes(const TapeState<T>& state, std::int32_t begin = 0, std::int32_t end = INT32_MAX) const {
    std::size_t b = 0;
    for (int k = 0; k < width; ++k)
      if (first(k) && ids[k] >= begin && ids[k] < end) b += Buffers<T>::bytes(state.node(ids[k]).shape);
    return b;
  }
};

template <class T>
BackwardBytes backward_bytes(const TapeState<T>& state, std::int32_t begin, std::int32_t end, StateIds input,
                             StateIds output, std::vector<std::int32_t>& work,
                             std::vector<std::int32_t>& outside_with_grad) {
  BackwardBytes r;
  if (!output.any_in(begin, end)) return r;  // the layer returned its input (or outside values)
  // (the model's terms then hold what B_i holds, nothing is allocated: o_b = 0 is an upper bound)
  const auto at = [begin](std::int32_t j) { return static_cast<std::size_t>(j - begin); };
  // work[j − begin]: bit 0 has a gradient; the rest: backward readers of its value still to run.
  work.assign(static_cast<std::size_t>(end - begin), 0);
  // A view's value is its root's buffer (docs/design.md §2.5): a read keeps that buffer, so reads count on the
  // buffer's key — its root when the root is the layer's; the layer's first view of it when the root is outside
  // the layer (x̄_i counts such a buffer once, checkpoint_sequential_auto's probe); none (-1) when the root is a leaf (a
  // Parameter's storage, or a tape-owned leaf, held throughout in the baseline).
  std::vector<std::pair<std::int32_t, std::int32_t>> outside;  // (root outside the layer, its key)
  const auto key = [&](std::int32_t w) {
    const std::int32_t r = state.buffer_of(w);
    if (state.node(r).is_leaf()) return std::int32_t{-1};
    if (r >= begin) return r;
    for (const auto& [root, k] : outside)
      if (root == r) return k;
    outside.emplace_back(r, w);  // w ≥ begin: the views are visited in recording order below
    return w;
  };
  const auto output_buffer = [&](std::int32_t k) {  // k's buffer is x_i's: counted in δ_i's and x_i's terms
    const std::int32_t r = state.buffer_of(k);
    for (int o = 0; o < output.width; ++o)
      if (state.buffer_of(output.ids[o]) == r) return true;
    return false;
  };
  bool nested = false;
  for (std::int32_t j = begin; j < end; ++j) {
    const Node<T>& n = state.node(j);
    nested = nested || n.region != state.node(begin).region;
    if (n.is_leaf()) continue;
    if (n.is_view()) key(j);  // the layer's first view of an outside root is its key
    if (!n.requires_grad) continue;
    for (int k = 0; k < n.arity; ++k)
      if ((n.reads & reads_input(k)) && n.inputs[k] >= begin)
        if (const std::int32_t b = key(n.inputs[k]); b >= 0) work[at(b)] += 2;
    if (n.reads & reads_output)
      if (const std::int32_t b = key(j); b >= 0) work[at(b)] += 2;
  }
  for (int k = 0; k < output.width; ++k)  // δ_i: the state's values made in the layer
    if (output.ids[k] >= begin && output.ids[k] < end) work[at(output.ids[k])] |= 1;
  for (std::int32_t w : outside_with_grad)  // gradients a later B allocated (counted in its g): not again
    if (w >= begin && w < end) work[at(w)] |= 1;
  // The model's δ_i and δ_{i−1} are the whole states' sizes; a value the layer passes through is in both.
  const auto output_bytes = static_cast<std::int64_t>(output.bytes(state));
  const auto input_bytes = static_cast<std::int64_t>(input.bytes(state));
  std::int64_t live = static_cast<std::int64_t>(output.bytes(state, begin, end)), peak = live;  // δ_i, then B_i's
  std::uint64_t input_gradient = 0;  // bit k: δ_{i−1}'s value input.ids[k] allocated (a state has ≤ 64 Vars)
  // A Parameter's gradient goes to the Parameter after the backward of the earliest op that reads it and
  // receives a gradient (detail/gradient_delivery.hpp). Taken here to be its earliest consumer that requires one: no
  // later in the sweep than that op (a probe's op stands for the layer's; an op before the chain may
  // receive no gradient, and then the gradient is taken to stay: an upper bound).
  const auto completed_by = [&](std::int32_t w) {
    std::int32_t first = -1;
    const Node<T>& leaf = state.node(w);
    for (std::int32_t e = leaf.first_use; e >= 0; e = state.node(e / max_inputs).next_use[e % max_inputs])
      if (state.node(e / max_inputs).requires_grad) first = e / max_inputs;  // the list runs latest first
    return first;
  };
  const auto delivered_here = [&](std::int32_t w) {  // backward() hands it to its Parameter in this walk
    if (!state.node(w).is_leaf() || !state.node(w).parameter) return false;
    const std::int32_t c = completed_by(w);
    return c >= begin && c < end;
  };
  for (std::int32_t j = end - 1; j >= begin; --j) {
    const Node<T>& n = state.node(j);
    if (n.is_leaf()) continue;
    if (n.requires_grad && (work[at(j)] & 1)) {
      for (int k = 0; k < n.arity; ++k) {
        const std::int32_t w = n.inputs[k];
        const Node<T>& in = state.node(w);
        if (!in.requires_grad) continue;
        const auto b = static_cast<std::int64_t>(Buffers<T>::bytes(in.shape));
        if (input.contains(w)) {  // δ_{i−1}
          const auto bit = std::uint64_t{1} << (std::find(input.ids, input.ids + input.width, w) - input.ids);
          if (!(input_gradient & bit)) live += b;
          input_gradient |= bit;
        } else if (w >= begin) {
          if (work[at(w)] & 1) continue;
          work[at(w)] |= 1;
          live += b;
          if (in.is_leaf() && !delivered_here(w)) r.left += static_cast<std::size_t>(b);  // it stays
        } else if (std::find(outside_with_grad.begin(), outside_with_grad.end(), w) == outside_with_grad.end()) {
          outside_with_grad.push_back(w);  // its gradient was not allocated by a later layer's B
          live += b;
          if (!delivered_here(w)) r.left += static_cast<std::size_t>(b);
        }
      }
      peak = std::max(peak, live + static_cast<std::int64_t>(Buffers<T>::bytes(n.scratch_shape)));
      live -= static_cast<std::int64_t>(Buffers<T>::bytes(n.shape));  // its gradient goes (δ_i at the output)
    }
    for (int k = 0; k < n.arity; ++k) {  // a Parameter's gradient complete now goes to the Parameter
      const std::int32_t w = n.inputs[k];
      const Node<T>& in = state.node(w);
      if (!in.is_leaf() || !in.parameter || (k >= 1 && n.inputs[0] == w) || (k == 2 && n.inputs[1] == w) ||
          completed_by(w) != j)
        continue;
      const bool allocated =
          w >= begin ? (work[at(w)] & 1) != 0
                     : std::find(outside_with_grad.begin(), outside_with_grad.end(), w) != outside_with_grad.end();
      if (allocated) live -= static_cast<std::int64_t>(Buffers<T>::bytes(in.shape));
    }
    if (!n.requires_grad || nested) continue;
    auto release = [&](std::int32_t w) {  // one backward reader of w's value is done
      // A leaf's value is not in x̄_i (a Parameter's is not the tape's; a tape-owned leaf is in the baseline); the
      // buffer goes once the last reader of it, through any view, has run.
      if (w < begin || state.node(w).is_leaf()) return;
      const std::int32_t b = key(w);
      if (b < 0 || output_buffer(b)) return;
      if ((work[at(b)] -= 2) < 2) live -= static_cast<std::int64_t>(Buffers<T>::bytes(state.node(b).shape));
    };
    for (int k = 0; k < n.arity; ++k)
      if (n.reads & reads_input(k)) release(n.inputs[k]);
    if (n.reads & reads_output) release(j);
    if (n.extra_read) live -= static_cast<std::int64_t>(Buffers<T>::bytes(n.extra_shape));
  }
  r.overhead = peak - output_bytes - input_bytes;
  r.peak = peak;
  return r;
}

/// The peak bound of the sweep after the chain's backward, through the ops recorded before the call
/// ([0, chain_begin)) that computed x_0: `held` (the baseline, x_0 and the gradients the chain leaves) plus
/// their backward's walk by the sweep's rules (backward_bytes from δ_0; gradients the chain's B allocated are
/// not counted again), plus what their checkpoint regions' replays regenerate: the values and extras a
/// backward will read that have no buffer now, summed per outermost region (the sweep replays one at a
/// time and frees what it regenerated when it leaves it), the largest region's; evicted values all at once.
/// An upper bound. `held` alone when x_0 gets no gradient.
template <class T>
std::size_t after_chain_bytes(const TapeState<T>& state, std::int32_t chain_begin, StateIds input, std::size_t held,
                              std::vector<std::int32_t>& work, std::vector<std::int32_t>& outside_with_grad) {
  bool gradient = false;
  for (int k = 0; k < input.width; ++k) gradient = gradient || state.node(input.ids[k]).requires_grad;
  if (!gradient) return held;
  const BackwardBytes tail = backward_bytes(state, 0, chain_begin, StateIds{}, input, work, outside_with_grad);
  // The sweep replays one outermost region at a time and frees what it regenerated when it leaves it: the
  // largest of their dropped bytes (nested regions' included). Evicted values: all at once.
  std::vector<std::size_t> dropped;
  std::size_t evicted = 0;
  for (std::int32_t j = 0; j < chain_begin; ++j) {
    const Node<T>& n = state.node(j);
    if (n.is_leaf()) continue;
    if (n.evicted) {
      evicted += Buffers<T>::bytes(n.shape);
      continue;
    }
    std::size_t b = !n.value && n.level > 0 && state.has_pending_reader(j) ? Buffers<T>::bytes(n.shape) : 0;
    if (!n.extra && n.extra_read) b += Buffers<T>::bytes(n.extra_shape);
    std::int32_t r = n.region;
    if (b == 0 || r < 0) continue;  // outside every region nothing was dropped
    while (state.region(r).parent >= 0) r = state.region(r).parent;
    if (dropped.size() <= static_cast<std::size_t>(r)) dropped.resize(static_cast<std::size_t>(r) + 1, 0);
    dropped[static_cast<std::size_t>(r)] += b;
  }
  const std::size_t replayed = dropped.empty() ? 0 : *std::max_element(dropped.begin(), dropped.end());
  return held + static_cast<std::size_t>(std::max<std::int64_t>(tail.peak, 0)) + replayed + evicted;
}

}  // namespace detail

/// Measures a chain of layers (callables S → S, S a Var<T> or a std::tuple of Var<T>: docs/schedules.md, "A state
/// of several values"; a state's sizes are the sums over its distinct values) with a probe pass, plans the schedule
/// with the fewest recomputed FLOPs whose peak memory stays within `budget_bytes`, and runs it (run_schedule). Returns
/// x_L. Any schedule outside checkpoint regions for L ≤ 16 (detail::non_persistent_layers); a persistent one otherwise.
///
/// **The budget is a bound on tape.memory().peak_bytes** from this call until the backward sweep has passed
/// the chain: every tape buffer counts — the values live on the tape at the call (x_0, tape variables,
/// anything recorded before), the chain's activations and kept tapes, the layers' intermediates while they
/// run, activation and weight gradients, op temporaries (detail/buffers.hpp counts them all). The backward is
/// taken to be Tape::backward; Tape::gradient() keeps its targets' gradients, so a Parameter recorded inside
/// a layer and named as a target holds its gradient to the end, on top. The backward of the ops recorded
/// before the call that computed x runs after the chain's: it is bounded too (its gradients and
/// temporaries by the sweep's rules, and, if some of those ops lie in checkpoint regions, the largest
/// outermost region's dropped values: detail::after_chain_bytes). Not seen: what runs after the chain: make the loss
/// the last layer (a layer h ↦ cross_entropy(head(h), labels) returning the [1,1] loss) for the budget to bound the
/// whole step; otherwise the head's bytes come on top.
///
/// The probe runs every layer once inside a checkpoint region that saves nothing (its values are freed
/// layer by layer and it is never replayed: it receives no gradient) and measures for layer i: the output
/// bytes ω_x; the bytes it holds as a checkpoint ω_c (ω_x and its op's extra buffer when the op's backward
/// reads it); the bytes a kept layer holds ω_x̄ (output + residuals + op extras + values its own ops read,
/// which a region's replay may hold as sources; a view's bytes are its root's buffer's, each buffer counted once:
/// docs/schedules.md, Views); the peak bytes of its forward beyond its input and output
/// (o_f, read from the tape's own peak counter; o_f̄ for Fall from the same counter with the values and extras the probe
/// freed that a backward reads counted as kept); what its backward allocates beyond δ_i and δ_{i−1} (o_b and the weight
/// gradients it leaves, g, from the recorded nodes by the sweep's rules: detail::backward_bytes); and the FLOP
/// estimates of its ops (u_f; u_b = 2·u_f). The bytes already live on the tape at the call (besides x_0) are held
/// throughout. Sizes are quantised to units of 1/resolution of their sum, rounded up, and the budget down, so the plan
/// never exceeds the budget in the model and every budget from the least one up is feasible; the model bounds the tape
/// from above (tests/schedule/auto_peak_property_test.cpp checks peak_bytes ≤ budget on random chains; where the bound
/// is loose: docs/schedules.md, Limits).
///
/// Costs one extra forward pass (the probe) and plan_schedule's time O(L³·resolution) (milliseconds for a
/// dozen layers, seconds for 60). In a training loop whose shapes do not change, plan once: pass `report`
/// and run later steps with run_schedule(layers, report->schedule, x). A layer with dropout
/// draws its mask in the probe and again in the real pass, so the masks differ from a run without probe.
/// Throws memory_budget_error when no schedule fits (the message gives the budget, the bytes the leanest
/// schedule needs and the least budget that fits; the tape stays usable, the probe's nodes stay on it);
/// domain_error for no layers or resolution < 1.
template <class Layers, class S>
S checkpoint_sequential_auto(const Layers& layers, S x, std::size_t budget_bytes, AutoScheduleReport* report = nullptr,
                             int resolution = 500) {
  detail::check_chain_state<S>();
  using T = typename detail::chain_state<S>::scalar;
  constexpr int width = static_cast<int>(detail::chain_state<S>::width);
  static_assert(width <= 64, "checkpoint_sequential_auto: a state of at most 64 Vars");
  const auto L = static_cast<int>(std::size(layers));
  if (L < 1) throw domain_error("checkpoint_sequential_auto: no layers");
  if (resolution < 1) throw domain_error("checkpoint_sequential_auto: resolution must be ≥ 1");
  auto* state = detail::chain_tape(x, "checkpoint_sequential_auto");
  // The state's node ids, x_0's then x_i's after layer i: (L + 1) · width.
  std::vector<std::int32_t> state_ids;
  state_ids.reserve(static_cast<std::size_t>((L + 1) * width));
  const auto push_ids = [&state_ids](const S& v) {
    detail::for_each_var(v, [&](std::size_t, const Var<T>& var) { state_ids.push_back(detail::VarAccess::id(var)); });
  };
  const auto ids_of = [&state_ids](int i) { return detail::StateIds{state_ids.data() + i * width, width}; };
  push_ids(x);
  const std::size_t input_bytes = ids_of(0).bytes(*state);
  const std::size_t live_at_call = state->live_bytes();
  std::size_t owned_input = 0;  // x_0's tape-owned values: x_0 is counted apart from the baseline
  for (int k = 0; k < width; ++k)
    if (ids_of(0).first(k) && state->node(state_ids[static_cast<std::size_t>(k)]).value_owned())
      owned_input += detail::Buffers<T>::bytes(state->node(state_ids[static_cast<std::size_t>(k)]).shape);
  std::size_t baseline = live_at_call - std::min(live_at_call, owned_input);
  const std::int32_t chain_begin = state->size();  // the ops recorded before the call: [0, chain_begin)

  // Measured in bytes, then quantised.
  struct Measured {
    double flops;
    std::size_t output, checkpoint, tape, forward, forward_all;
    std::int64_t backward;  // o_b, may be negative
    std::size_t gradients;
    bool output_read;  // B_i reads x_i
  };
  std::vector<Measured> measured;
  measured.reserve(static_cast<std::size_t>(L));
  std::vector<std::int32_t> work;
  std::vector<std::uint8_t> read_in_layer;
  std::vector<std::uint8_t> counted;          // the layer's buffers counted in ω_x̄
  std::vector<std::int32_t> outside_counted;  // buffers of values before the layer counted in ω_x̄
  std::vector<std::int32_t> out_buffers;      // x_i's buffers
  out_buffers.reserve(static_cast<std::size_t>(width));
  std::vector<std::int32_t> outside_with_grad;
  std::vector<std::pair<std::int32_t, std::int32_t>> spans;  // layer i's nodes [begin, end)
  spans.reserve(static_cast<std::size_t>(L));
  std::size_t owned_leaves = 0;  // bytes of tape-owned leaves (tape.variable(matrix), constants) the layers record
  detail::checkpoint_state(
      [&](S v) {
        const S chain_input = v;
        const std::int32_t probe_region = state->innermost_region();
        state_ids.resize(static_cast<std::size_t>(width));  // x_0 as the region's argument (the same ids)
        for (int i = 0; i < L; ++i) {
          const std::int32_t begin = state->size();
          const std::size_t live_before = state->live_bytes();
          // The real pass keeps x_{i−1} through layer i (a checkpoint, or a value pending for the regions); in
          // the probe its only other handle is the layer's parameter, which the layer may drop before its peak.
          const S layer_input = v;
          const auto saved_measure = state->begin_peak_measure();
          try {
            v = detail::call_layer(layers[static_cast<std::size_t>(i)], std::move(v));
          } catch (...) {
            state->end_peak_measure(saved_measure);
            throw;
          }
          const auto forward_peak = state->end_peak_measure(saved_measure);
          const std::int32_t end = state->size();
          if (detail::chain_tape(v, "checkpoint_sequential_auto") != state)
            throw tape_error("checkpoint_sequential_auto: layer " + std::to_string(i + 1) +
                             " returned a Var of another tape");
          push_ids(v);  // within capacity
          const detail::StateIds out = ids_of(i + 1);
          Measured m{};
          m.output = out.bytes(*state);
          // Kept as a checkpoint, x_i keeps its ops' extra buffers if their backward reads them (layer_norm's
          // statistics).
          m.checkpoint = m.output;
          for (int k = 0; k < width; ++k)
            if (out.first(k) && out.ids[k] >= begin) m.checkpoint += state->cost(out.ids[k]).extra_read_bytes;
          m.tape = m.output;
          // A layer with checkpoint regions of its own: a value of the layer that an op of it reads may be the
          // source of such a region's replay, held until the sweep leaves that region; not modelled op by op,
          // so counted in ω_x̄ (an upper bound). Without regions of its own, all of a layer's ops are saved or
          // dropped together by run_schedule's regions, so no value of a kept layer is a replay source.
          read_in_layer.assign(static_cast<std::size_t>(end - begin), 0);
          for (std::int32_t j = begin; j < end; ++j)
            if (state->node(j).region != probe_region) {  // the probe's own region holds the layer's plain ops
              for (std::int32_t k = begin; k < end; ++k) {
                const detail::Node<T>& n = state->node(k);
                for (int a = 0; a < n.arity; ++a)
                  if (n.inputs[a] >= begin) read_in_layer[static_cast<std::size_t>(n.inputs[a] - begin)] = 1;
              }
              break;
            }
          // A view's value is its root's buffer, which the tape counts once (docs/design.md §2.5): ω_x̄ counts each
          // buffer once, x_i's in ω_x only, a leaf's not at all (a Parameter's storage, or a tape-owned leaf: in the
          // baseline). A buffer of a value before the layer that a view in it keeps (x_{i−1}'s) is counted too: the
          // schedule may free that value while the layer's tape is kept (an upper bound when both are held).
          out_buffers.clear();
          for (int k = 0; k < width; ++k) out_buffers.push_back(state->buffer_of(out.ids[k]));  // within capacity
          counted.assign(static_cast<std::size_t>(end - begin), 0);
          outside_counted.clear();
          for (std::int32_t j = begin; j < end; ++j) {
            const detail::NodeCost c = state->cost(j);
            const detail::Node<T>& n = state->node(j);
            if (c.leaf) {
              if (n.value_owned()) owned_leaves += detail::Buffers<T>::bytes(n.shape);
              continue;
            }
            m.flops += c.flops;
            m.tape += c.extra_read_bytes;
            // ω_x̄: what the backward reads (and, in a layer with regions of its own, what its ops read: above).
            if (!c.value_read && !read_in_layer[static_cast<std::size_t>(j - begin)]) continue;
            const std::int32_t r = c.buffer;
            if (state->node(r).is_leaf() || std::find(out_buffers.begin(), out_buffers.end(), r) != out_buffers.end())
              continue;
            if (r >= begin) {
              if (counted[static_cast<std::size_t>(r - begin)]) continue;
              counted[static_cast<std::size_t>(r - begin)] = 1;
            } else {
              if (std::find(outside_counted.begin(), outside_counted.end(), r) != outside_counted.end()) continue;
              outside_counted.push_back(r);
            }
            m.tape += detail::Buffers<T>::bytes(state->node(r).shape);
          }
          // F_i: the tape's own peak counter, beyond what was live and the output. Fall_i frees what F_i frees
          // except the values and extras a backward reads: the same counter with those counted as kept.
          m.forward = forward_peak.peak - std::min(forward_peak.peak, live_before + m.output);
          const std::size_t fall = forward_peak.retained_peak - std::min(forward_peak.retained_peak, live_before);
          m.forward_all = fall - std::min(fall, m.tape);
          for (int k = 0; k < width; ++k) {  // x_i's buffer: its own, or for a view its root's
            const std::int32_t id = out_buffers[static_cast<std::size_t>(k)];
            m.output_read = m.output_read || (id >= begin && state->node(id).requires_grad &&
                                              (state->node(id).reads & reads_output) != 0);
          }
          spans.emplace_back(begin, end);
          measured.push_back(m);
        }
        // B_i's bytes, walked in the sweep's order (B_L first): the gradient of a value recorded before the chain
        // and read by several layers is allocated by the last of them, and stays.
        for (int i = L - 1; i >= 0; --i) {
          const auto [begin, end] = spans[static_cast<std::size_t>(i)];
          const detail::BackwardBytes back =
              detail::backward_bytes(*state, begin, end, ids_of(i), ids_of(i + 1), work, outside_with_grad);
          measured[static_cast<std::size_t>(i)].backward = back.overhead;
          measured[static_cast<std::size_t>(i)].gradients = back.left;
        }
        // The probe returns its input, not x_L: a region keeps what it returns, and the probe's x_L (with what its
        // backward would read) would stay on the tape for the whole step, though no gradient ever reaches it.
        return chain_input;
      },
      policies::nothing_saveable, x);

  // x_L stays after B_L (the caller holds it; the model would free it with x̄_L): B_L leaves it, like g.
  // Held throughout: twice the tape-owned leaves the layers record — the probe's copies stay until the sweep
  // passes them, at the end of the step, and the real pass's from the layer's forward to its backward (an
  // upper bound).
  measured.back().gradients += measured.back().output;
  baseline += 2 * owned_leaves;
  std::size_t gradients = 0;
  for (const Measured& m : measured) gradients += m.gradients;
  const std::size_t after_chain = detail::after_chain_bytes(
      *state, chain_begin, ids_of(0), baseline + input_bytes + gradients, work, outside_with_grad);

  // The chain in units of `unit` bytes, sizes rounded up. The unit comes from the chain, not the budget
  // (1/resolution of the sum of every measured size), so feasibility is monotone in the budget: every
  // budget from the least one up fits.
  std::size_t total = input_bytes;
  for (const Measured& m : measured)
    total += m.output + m.checkpoint + m.tape + m.forward + m.forward_all +
             static_cast<std::size_t>(std::max<std::int64_t>(m.backward, 0)) + m.gradients;
  const std::size_t unit = std::max<std::size_t>(1, total / static_cast<std::size_t>(resolution));
  auto units = [unit](std::size_t b) { return static_cast<std::int64_t>((b + unit - 1) / unit); };
  auto signed_units = [&](std::int64_t b) {  // rounded up: toward zero below it
    return b >= 0 ? units(static_cast<std::size_t>(b))
                  : -static_cast<std::int64_t>(static_cast<std::size_t>(-b) / unit);
  };
  Chain chain;
  chain.activation_size.push_back(units(input_bytes));
  chain.checkpoint_size.push_back(chain.activation_size[0]);  // x_0's extra, if any, is in the baseline
  std::int64_t all_units = chain.activation_size[0];
  for (const Measured& m : measured) {
    chain.forward_time.push_back(std::max(m.flops, 1.0));
    chain.backward_time.push_back(2 * std::max(m.flops, 1.0));
    chain.activation_size.push_back(units(m.output));
    chain.checkpoint_size.push_back(units(m.checkpoint));
    chain.tape_size.push_back(units(m.tape));
    chain.forward_overhead.push_back(units(m.forward));
    chain.forward_all_overhead.push_back(units(m.forward_all));
    chain.gradient_size.push_back(units(m.gradients));
    chain.output_read.push_back(m.output_read ? 1 : 0);
    // B_i's peak is at least what it leaves (x_{i−1}, δ_{i−1}, g): Chain::validate's bound, kept after rounding.
    chain.backward_overhead.push_back(std::max(
        signed_units(m.backward), chain.gradient_size.back() - chain.tape_size.back() - chain.activation_size.back()));
    all_units += chain.activation_size.back() + chain.checkpoint_size.back() + chain.tape_size.back() +
                 chain.forward_overhead.back() + chain.forward_all_overhead.back() +
                 std::max<std::int64_t>(chain.backward_overhead.back(), 0) + chain.gradient_size.back();
  }
  // Above 2·Σ of every size (which holds every value at once) more budget changes nothing: capped, so that
  // the planner's table stays about 2·resolution units whatever the budget.
  const std::int64_t budget =
      budget_bytes >= baseline
          ? std::min<std::int64_t>(static_cast<std::int64_t>((budget_bytes - baseline) / unit), 2 * all_units)
          : -1;
  // Non-persistent schedules run outside checkpoint regions only (run_schedule); their search is O(L⁵)
  // against O(L³), so long chains plan persistent ones.
  const bool persistent = state->open_depth() > 0 || L > detail::non_persistent_layers;
  Schedule schedule = plan_schedule(chain, budget, persistent);
  if (!schedule.feasible || budget_bytes < after_chain) {
    // The least budget of the chain's schedules (high always fits; low never does), then of the whole step.
    std::int64_t low = schedule.feasible ? -1 : std::max<std::int64_t>(budget, 0);
    std::int64_t high = schedule.feasible ? budget : 2 * all_units;
    while (high - low > 1) {
      const std::int64_t mid = low + (high - low) / 2;
      (plan_schedule(chain, mid, persistent).feasible ? high : low) = mid;
    }
    const std::size_t leanest = baseline + static_cast<std::size_t>(high) * unit;
    const std::size_t least = std::max(leanest, after_chain);
    throw memory_budget_error(
        "checkpoint_sequential_auto: no schedule of these " + std::to_string(L) +
            " layers keeps the peak within the budget of " + std::to_string(budget_bytes) +
            " bytes; the leanest needs " + std::to_string(leanest) + " bytes (" + std::to_string(baseline) +
            " of them held throughout: on the tape at the call, and tape-owned leaves the layers record), and " +
            "the backward of the ops recorded before the call, after the chain's, " + std::to_string(after_chain) +
            " bytes: the least budget that works is " + std::to_string(least) + " bytes",
        budget_bytes, least, least);
  }
  S result = run_schedule(layers, schedule, std::move(x));
  if (report) *report = AutoScheduleReport{std::move(chain), unit, baseline, after_chain, std::move(schedule)};
  return result;
}

}  // namespace remat
