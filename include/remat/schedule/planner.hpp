// The optimal checkpointing planner for a chain of layers under a memory budget (pure algorithm).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <unordered_map>
#include <vector>

#include "remat/errors.hpp"

namespace remat {

/// Cost model of a chain of L layers, as in Beaumont, Eyraud-Dubois, Herrmann, Joly & Shilova,
/// "Optimal checkpointing for heterogeneous chains: how to train deep neural networks with limited
/// memory" (2019). Layers are numbered 1…L; vectors indexed by layer use index i − 1.
///
/// Layer i maps the activation x_{i−1} to x_i. Its full tape x̄_i (x_i plus every residual its backward
/// reads) has size tape_size[i−1] ≥ activation_size[i] and contains x_i. Operations:
/// - F_i    reads x_{i−1}, allocates x_i; time forward_time[i−1];
/// - Fall_i reads x_{i−1}, allocates x̄_i; time forward_time[i−1];
/// - B_i    reads x̄_i, δ_i and x_{i−1}, allocates δ_{i−1} (size activation_size[i−1]), then frees x̄_i and
///          δ_i; time backward_time[i−1]. δ_L (size activation_size[L]) appears when B_L starts.
/// Anything may be freed at any time. Memory counts everything held (x_0 included) and an operation's
/// output is allocated while its inputs are still held. Sizes are in any unit (bytes, or units of a
/// quantised byte count); times in any unit (FLOPs, seconds).
///
/// Optional per-layer terms (empty = all zero) make the model count what a tape really allocates,
/// so that its peak is the tape's peak (checkpoint_sequential_auto measures them):
/// - forward_overhead o_f: the transient bytes F_i holds at its peak beyond its output (the layer's
///   intermediates while it runs): F_i peaks at held + ω_x + o_f;
/// - forward_all_overhead o_f̄: the same for Fall_i beyond its tape: Fall_i peaks at held + ω_x̄ + o_f̄;
/// - backward_overhead o_b: B_i's peak minus x̄_i, δ_i, x_{i−1} and δ_{i−1}: the gradients of the layer's
///   intermediates, op temporaries and the gradient_size bytes below, less what B_i frees before its peak
///   (δ_i and residuals of x̄_i), so it may be negative, down to g − x̄_i − δ_i (B_i's peak is at least what it
///   leaves);
/// - gradient_size g: bytes B_i leaves allocated until the whole chain is done (gradients of weights
///   recorded before the chain), so every operation after B_i also holds Σ_{j ≥ i} g_j;
/// - output_read: B_i reads x_i (tanh, sigmoid, exp: their backward reads their output). A tape keeps such
///   an x_i, once a checkpoint region returned it, until B_i has run: the planner then counts x_kept as held
///   through the left part of a split at x_kept. (The schedule's operations still free x_kept after the right
///   part, as the model without this term does; its peak in that model is no higher.)
/// - checkpoint_size ω_c ≥ ω_x: the bytes x_i holds while it is kept as a checkpoint — its value and what its
///   op keeps with it for its backward (layer_norm's row statistics: a tape keeps a region output's extra
///   buffer with its value). Used wherever x_i is held; δ_i stays activation_size.
struct Chain {
  std::vector<double> forward_time;                ///< u_f, L entries
  std::vector<double> backward_time;               ///< u_b, L entries
  std::vector<std::int64_t> activation_size;       ///< ω_x, L + 1 entries: [0] is the chain input x_0
  std::vector<std::int64_t> tape_size;             ///< ω_x̄, L entries, tape_size[i−1] ≥ activation_size[i]
  std::vector<std::int64_t> forward_overhead;      ///< o_f, L entries or empty (zeros)
  std::vector<std::int64_t> forward_all_overhead;  ///< o_f̄, L entries or empty (zeros)
  std::vector<std::int64_t> backward_overhead;     ///< o_b, L entries or empty (zeros), o_b ≥ g − ω_x̄ − ω_x
  std::vector<std::int64_t> gradient_size;         ///< g, L entries or empty (zeros)
  std::vector<std::uint8_t> output_read;           ///< L entries or empty (zeros): B_i reads x_i, see above
  std::vector<std::int64_t> checkpoint_size;       ///< ω_c, L + 1 entries or empty (= ω_x), see above

  /// L, the number of layers.
  int length() const { return static_cast<int>(forward_time.size()); }

  /// o_f of layer i (1…L), zero when the vector is empty; the same for the four below.
  std::int64_t forward_overhead_of(int i) const { return term(forward_overhead, i); }
  /// o_f̄ of layer i.
  std::int64_t forward_all_overhead_of(int i) const { return term(forward_all_overhead, i); }
  /// o_b of layer i.
  std::int64_t backward_overhead_of(int i) const { return term(backward_overhead, i); }
  /// g of layer i.
  std::int64_t gradient_size_of(int i) const { return term(gradient_size, i); }
  /// Whether B_i reads x_i (false when the vector is empty).
  bool output_read_of(int i) const { return !output_read.empty() && output_read[static_cast<std::size_t>(i - 1)]; }
  /// ω_c of activation i (0…L): activation_size[i] when checkpoint_size is empty.
  std::int64_t checkpoint_size_of(int i) const {
    return (checkpoint_size.empty() ? activation_size : checkpoint_size)[static_cast<std::size_t>(i)];
  }

  /// Sizes (and backward overheads, which may be negative) larger than this in magnitude are refused: the
  /// planner adds a few dozen of them per layer in int64, and its budget is at most 2^40 units anyway.
  static constexpr std::int64_t max_size = std::int64_t{1} << 40;

  /// Throws domain_error unless the vectors have consistent lengths, sizes are non-negative and at most
  /// max_size (2^40 units), and L ≤ 2^20.
  void validate() const {
    const auto L = forward_time.size();
    if (L == 0 || backward_time.size() != L || tape_size.size() != L || activation_size.size() != L + 1)
      throw domain_error(
          "Chain: need L ≥ 1 forward_time, backward_time and tape_size entries and L + 1 "
          "activation_size entries; got " +
          std::to_string(forward_time.size()) + ", " + std::to_string(backward_time.size()) + ", " +
          std::to_string(tape_size.size()) + " and " + std::to_string(activation_size.size()));
    if (L > (std::size_t{1} << 20))
      throw domain_error("Chain: " + std::to_string(L) + " layers; a Chain has at most 2^20");
    for (const auto* v : {&activation_size, &tape_size, &forward_overhead, &forward_all_overhead, &backward_overhead,
                          &gradient_size, &checkpoint_size})
      for (auto e : *v)
        if (e > max_size || e < -max_size)
          throw domain_error("Chain: a size of " + std::to_string(e) +
                             " units is beyond ±2^40; quantise sizes (e.g. to KiB) first");
    for (std::size_t i = 0; i <= L; ++i)
      if (activation_size[i] < 0) throw domain_error("Chain: activation_size must be non-negative");
    for (std::size_t i = 0; i < L; ++i)
      if (tape_size[i] < activation_size[i + 1])
        throw domain_error("Chain: tape_size[" + std::to_string(i) + "] must be ≥ activation_size[" +
                           std::to_string(i + 1) + "] (the tape contains the layer's output)");
    if (!output_read.empty() && output_read.size() != L) throw domain_error("Chain: output_read needs 0 or L entries");
    if (!checkpoint_size.empty()) {
      if (checkpoint_size.size() != L + 1) throw domain_error("Chain: checkpoint_size needs 0 or L + 1 entries");
      for (std::size_t i = 0; i <= L; ++i)
        if (checkpoint_size[i] < activation_size[i] || (i > 0 && tape_size[i - 1] < checkpoint_size[i]))
          throw domain_error("Chain: checkpoint_size[" + std::to_string(i) + "] must be ≥ activation_size[" +
                             std::to_string(i) + "] and ≤ tape_size[" + std::to_string(i) + " − 1]");
    }
    for (const auto* v : {&forward_overhead, &forward_all_overhead, &backward_overhead, &gradient_size}) {
      if (!v->empty() && v->size() != L)
        throw domain_error(
            "Chain: forward_overhead, forward_all_overhead, backward_overhead and gradient_size need 0 or L "
            "entries");
      if (v != &backward_overhead)
        for (auto e : *v)
          if (e < 0) throw domain_error("Chain: forward overheads and gradient sizes must be non-negative");
    }
    for (int i = 1; i <= static_cast<int>(L); ++i)
      if (backward_overhead_of(i) < gradient_size_of(i) - tape_size[static_cast<std::size_t>(i - 1)] -
                                        activation_size[static_cast<std::size_t>(i)])
        throw domain_error("Chain: backward_overhead[" + std::to_string(i - 1) + "] must be ≥ gradient_size[" +
                           std::to_string(i - 1) + "] − tape_size[" + std::to_string(i - 1) + "] − activation_size[" +
                           std::to_string(i) + "] (B_i's peak holds at least the gradients it leaves)");
  }

 private:
  static std::int64_t term(const std::vector<std::int64_t>& v, int i) {
    return v.empty() ? 0 : v[static_cast<std::size_t>(i - 1)];
  }
};

/// One operation of a schedule in the Chain cost model.
struct ScheduleOperation {
  /// What the operation does to layer `layer`.
  enum Kind {
    forward,          ///< F_layer: compute x_layer, keep only it
    forward_all,      ///< Fall_layer: compute the full tape x̄_layer
    backward,         ///< B_layer: δ_{layer−1} from x̄_layer, δ_layer, x_{layer−1}; frees x̄_layer and δ_layer
    free_activation,  ///< free x_layer
  };
  Kind kind;  ///< see Kind
  int layer;  ///< 1…L for forward, forward_all, backward; 0…L for free_activation
};

namespace detail {

/// One decision of the planner's dynamic program, for the sub-problem D(source, first, last, tape, handover):
/// "holding the source activation x_source (source < first), δ_last and, when `tape`, x̄_last, backpropagate
/// layers first…last (producing δ_{first−1}); the source may be freed after its last use; when `handover`,
/// also leave x̄_{first−1} computed for the part of the chain left of `first`".
struct PlanNode {
  enum Kind {
    backward,          ///< tape, source = last − 1, first = last: B_last
    advance,           ///< F_{source+1}…F_kept, free the source, continue from x_kept (kept < first)
    advance_tape,      ///< handover: F_{source+1}…F_{first−2}, Fall_{first−1}, free the source, continue from
                       ///< x_{first−1} inside x̄_{first−1}, which stays for the left part
    split_activation,  ///< F_{source+1}…F_kept, keep x_kept; right: D(kept, right_first, last); left:
                       ///< D(source, first, right_first − 1), with x̄_{right_first−1} if the right part hands it over
    split_tape,  ///< F_{source+1}…F_{kept−1}, Fall_kept; right: D(kept, kept + 1, last) if kept < last;
                 ///< left: D(source, first, kept, tape)
  };
  Kind kind = backward;
  int source = 0, first = 0, last = 0;
  bool tape = false;
  bool handover = false;
  int kept = 0;         ///< advance, split_*: the layer whose output (or tape) is kept
  int right_first = 0;  ///< split_activation: first layer the right part backpropagates
  int right = -1;       ///< child node done first (advance: the continuation), -1 if none
  int left = -1;        ///< child node done after `right`, -1 if none
};

}  // namespace detail

/// A schedule for a Chain: the operation sequence, its total time and peak memory in the model, and the
/// decision tree run_schedule() executes on a tape.
struct Schedule {
  bool feasible = false;    ///< whether a schedule within the budget exists (else the rest is empty)
  double time = 0;          ///< Σ forward and backward times of all operations (the minimised objective)
  std::int64_t budget = 0;  ///< the memory budget it was planned for
  std::vector<ScheduleOperation> operations;  ///< the operations in the order they run
  std::vector<detail::PlanNode> nodes;        ///< decision tree; nodes[root] is the whole chain
  int root = -1;                              ///< index of the whole chain's node, -1 when not feasible

  /// Number of forward evaluations (F or Fall) of each layer, 1-based in the model: entry i − 1 for layer i.
  std::vector<int> forward_counts(int length) const {
    std::vector<int> counts(static_cast<std::size_t>(length), 0);
    for (const auto& op : operations)
      if (op.kind == ScheduleOperation::forward || op.kind == ScheduleOperation::forward_all)
        ++counts[static_cast<std::size_t>(op.layer - 1)];
    return counts;
  }
};

namespace detail {

class Planner {
 public:
  Planner(const Chain& chain, std::int64_t budget, bool persistent)
      : c_(chain), L_(chain.length()), budget_(budget), persistent_(persistent) {
    gradients_after_.assign(static_cast<std::size_t>(L_ + 1), 0);
    for (int i = L_; i >= 1; --i)
      gradients_after_[static_cast<std::size_t>(i - 1)] =
          gradients_after_[static_cast<std::size_t>(i)] + c_.gradient_size_of(i);
  }

  Schedule plan() {
    Schedule result;
    result.budget = budget_;
    const double cost = budget_ < 0 ? infinity : solve({0, 1, L_, false, false}, budget_);
    if (cost == infinity) return result;
    result.feasible = true;
    result.time = cost;
    result.root = build(result, {0, 1, L_, false, false}, budget_);
    emit(result, result.root, true);
    return result;
  }

 private:
  static constexpr double infinity = std::numeric_limits<double>::infinity();
  struct Sub {
    int source, first, last;
    bool tape, handover;
  };
  struct Entry {  // 16 bytes
    double cost = infinity;
    std::int16_t kept = 0;
    std::int16_t right_first = 0;
    std::uint8_t kind = PlanNode::backward;
    bool right_handover = false;
    bool solved = false;
  };

  /// x_i held (as a checkpoint, a source, the activation a forward reads): ω_c. Gradient sizes: delta().
  std::int64_t x(int i) const { return c_.checkpoint_size_of(i); }
  std::int64_t activation(int i) const { return c_.activation_size[static_cast<std::size_t>(i)]; }
  std::int64_t a(int i) const { return c_.tape_size[static_cast<std::size_t>(i - 1)]; }
  double f(int i) const { return c_.forward_time[static_cast<std::size_t>(i - 1)]; }
  double b(int i) const { return c_.backward_time[static_cast<std::size_t>(i - 1)]; }
  std::int64_t fo(int i) const { return c_.forward_overhead_of(i); }
  /// F_i's peak beyond what was held: its output and intermediates while it runs, then its checkpoint.
  std::int64_t forward_peak(int i) const { return std::max(x(i), activation(i) + fo(i)); }
  std::int64_t fao(int i) const { return c_.forward_all_overhead_of(i); }
  std::int64_t bo(int i) const { return c_.backward_overhead_of(i); }
  /// What a persistent split at x_kept leaves held for its left part: x_kept itself when B_kept reads it
  /// (Chain::output_read), since a tape keeps a region's output for the backward that reads it.
  std::int64_t kept_held(int kept, int right_first) const {
    return right_first == kept + 1 && c_.output_read_of(kept) ? x(kept) : 0;
  }
  /// δ_t held before B_t starts (δ_L only appears with B_L).
  std::int64_t delta(int t) const { return t < L_ ? activation(t) : 0; }
  /// Σ_{j > t} g_j: the gradients B_{t+1} … B_L left, held by every operation of a sub-problem ending at t.
  std::int64_t gradients_after(int t) const { return gradients_after_[static_cast<std::size_t>(t)]; }

  /// The memo entry of a sub-problem: a table over m per sub-problem, made on first use, for budgets up to
  /// dense_limit units; a hash map above.
  static constexpr std::int64_t dense_limit = 1 << 16;
  Entry& entry(const Sub& d, std::int64_t m) {
    const auto n = static_cast<std::size_t>(L_ + 1);
    const std::size_t sub = (((static_cast<std::size_t>(d.source) * n + static_cast<std::size_t>(d.first)) * n +
                              static_cast<std::size_t>(d.last)) *
                                 2 +
                             (d.tape ? 1u : 0u)) *
                                2 +
                            (d.handover ? 1u : 0u);
    if (budget_ > dense_limit)
      return sparse_[sub * (static_cast<std::size_t>(budget_) + 1) + static_cast<std::size_t>(m)];
    if (memo_.empty()) memo_.resize(n * n * n * 4);
    auto& table = memo_[sub];
    if (table.empty()) table.resize(static_cast<std::size_t>(budget_) + 1);
    return table[static_cast<std::size_t>(m)];
  }

  /// Least time of sub-problem d within the budget m, which counts x_source, δ_last, x̄_last (when tape) and
  /// everything the sub-problem allocates, x̄_{first−1} included when it hands it over.
  double solve(const Sub& d, std::int64_t m) {
    if (m < 0 || (d.handover && d.source > d.first - 2)) return infinity;
    if (const Entry& known = entry(d, m); known.solved) return known.cost;
    const int source = d.source, first = d.first, last = d.last;
    const bool tape = d.tape;
    Entry best;
    auto consider = [&](double cost, PlanNode::Kind kind, int kept, int right_first, bool right_handover) {
      if (cost < best.cost)
        best = {cost, static_cast<std::int16_t>(kept), static_cast<std::int16_t>(right_first),
                static_cast<std::uint8_t>(kind), right_handover};
    };
    const std::int64_t held = x(source) + delta(last) + (tape ? a(last) : 0) + gradients_after(last);
    if (tape && source == last - 1) {
      // first == last here: B_last reads x̄_last, δ_last, x_{last−1} and allocates δ_{last−1}.
      // o_b(last) on top: the gradients of its intermediates, op temporaries, the weight gradients it leaves.
      if (!d.handover &&
          x(last - 1) + activation(last - 1) + a(last) + activation(last) + bo(last) + gradients_after(last) <= m)
        consider(b(last), PlanNode::backward, 0, 0, false);
    } else {
      // Running F_{source+1} … F_kept: `peak` is what it adds at most, `forward` its time.
      std::int64_t peak = 0;
      double forward = 0;
      for (int kept = source + 1; kept <= last - 1; ++kept) {
        peak = std::max(peak, forward_peak(kept) + (kept > source + 1 ? x(kept - 1) : 0));
        forward += f(kept);
        if (held + peak > m) break;
        if (kept < first) {
          if (!d.handover || kept <= first - 2)
            consider(forward + solve({kept, first, last, tape, d.handover}, m), PlanNode::advance, kept, 0, false);
          continue;
        }
        const int span_end = persistent_ ? kept + 1 : last;
        for (int right_first = kept + 1; right_first <= span_end; ++right_first)
          for (bool right_handover : {false, true}) {
            if (right_handover && right_first < kept + 2) continue;  // x̄_{right_first−1} needs x_{right_first−2}
            const double right = solve({kept, right_first, last, tape, right_handover}, m - x(source));
            if (right == infinity) continue;
            consider(forward + right +
                         solve({source, first, right_first - 1, right_handover, d.handover},
                               m - kept_held(kept, right_first)),
                     PlanNode::split_activation, kept, right_first, right_handover);
          }
      }
      if (d.handover) {
        // Fall_{first−1} from the source, then continue from the activation inside that tape.
        const int kept = first - 1;
        peak = 0;
        for (int j = source + 1; j <= kept - 1; ++j)
          peak = std::max(peak, forward_peak(j) + (j > source + 1 ? x(j - 1) : 0));
        peak = std::max(peak, (kept - 1 > source ? x(kept - 1) : 0) + a(kept) + fao(kept));
        if (held + peak <= m) {
          double run = 0;
          for (int j = source + 1; j <= kept; ++j) run += f(j);
          consider(run + solve({kept, first, last, tape, false}, m - a(kept) + x(kept)), PlanNode::advance_tape, kept,
                   0, false);
        }
      }
      // Running F_{source+1} … F_{kept−1} then Fall_kept.
      peak = 0;
      forward = 0;
      for (int kept = source + 1; kept <= last; ++kept) {
        if (kept > source + 1)
          peak = std::max(peak, forward_peak(kept - 1) + (kept - 1 > source + 1 ? x(kept - 2) : 0));
        forward += f(kept);
        if (held + peak > m || (tape && kept == last)) break;
        if (kept < first) continue;
        if (held + (kept - 1 > source ? x(kept - 1) : 0) + a(kept) + fao(kept) > m) continue;
        double right = 0;
        if (kept < last) right = solve({kept, kept + 1, last, tape, false}, m - x(source) - a(kept) + x(kept));
        if (right == infinity) continue;
        consider(forward + right + solve({source, first, kept, true, d.handover}, m), PlanNode::split_tape, kept, 0,
                 false);
      }
    }
    best.solved = true;
    entry(d, m) = best;
    return best.cost;
  }

  int build(Schedule& out, const Sub& d, std::int64_t m) {
    solve(d, m);
    const Entry e = entry(d, m);
    PlanNode node;
    node.kind = static_cast<PlanNode::Kind>(e.kind);
    node.source = d.source;
    node.first = d.first;
    node.last = d.last;
    node.tape = d.tape;
    node.handover = d.handover;
    node.kept = e.kept;
    node.right_first = e.right_first;
    const auto index = static_cast<std::size_t>(out.nodes.size());
    out.nodes.push_back(node);
    int right = -1, left = -1;
    switch (node.kind) {
      case PlanNode::backward:
        break;
      case PlanNode::advance:
        right = build(out, {e.kept, d.first, d.last, d.tape, d.handover}, m);
        break;
      case PlanNode::advance_tape:
        right = build(out, {e.kept, d.first, d.last, d.tape, false}, m - a(e.kept) + x(e.kept));
        break;
      case PlanNode::split_activation:
        right = build(out, {e.kept, e.right_first, d.last, d.tape, e.right_handover}, m - x(d.source));
        left = build(out, {d.source, d.first, e.right_first - 1, e.right_handover, d.handover},
                     m - kept_held(e.kept, e.right_first));
        break;
      case PlanNode::split_tape:
        if (e.kept < d.last)
          right = build(out, {e.kept, e.kept + 1, d.last, d.tape, false}, m - x(d.source) - a(e.kept) + x(e.kept));
        left = build(out, {d.source, d.first, e.kept, true, d.handover}, m);
        break;
    }
    out.nodes[index].right = right;
    out.nodes[index].left = left;
    return static_cast<int>(index);
  }

  /// Appends the operations of node `index`. `owns_source`: free x_source after its last use (false when
  /// it lives inside a kept tape x̄_source).
  void emit(Schedule& out, int index, bool owns_source) const {
    const PlanNode n = out.nodes[static_cast<std::size_t>(index)];
    auto op = [&](ScheduleOperation::Kind k, int layer) { out.operations.push_back({k, layer}); };
    auto run_forward = [&](int e) {  // F_{source+1} … F_e, freeing intermediates
      for (int j = n.source + 1; j <= e; ++j) {
        op(ScheduleOperation::forward, j);
        if (j - 1 > n.source) op(ScheduleOperation::free_activation, j - 1);
      }
    };
    switch (n.kind) {
      case PlanNode::backward:
        op(ScheduleOperation::backward, n.last);
        if (owns_source) op(ScheduleOperation::free_activation, n.source);
        break;
      case PlanNode::advance:
        run_forward(n.kept);
        if (owns_source) op(ScheduleOperation::free_activation, n.source);
        emit(out, n.right, true);
        break;
      case PlanNode::advance_tape:
        run_forward(n.kept - 1);
        op(ScheduleOperation::forward_all, n.kept);
        if (n.kept - 1 > n.source) op(ScheduleOperation::free_activation, n.kept - 1);
        if (owns_source) op(ScheduleOperation::free_activation, n.source);
        emit(out, n.right, false);
        break;
      case PlanNode::split_activation:
        run_forward(n.kept);
        emit(out, n.right, true);
        emit(out, n.left, owns_source);
        break;
      case PlanNode::split_tape:
        run_forward(n.kept - 1);
        op(ScheduleOperation::forward_all, n.kept);
        if (n.kept - 1 > n.source) op(ScheduleOperation::free_activation, n.kept - 1);
        if (n.right >= 0) emit(out, n.right, false);
        emit(out, n.left, owns_source);
        break;
    }
  }

  const Chain& c_;
  int L_;
  std::int64_t budget_;
  bool persistent_;
  std::vector<std::vector<Entry>> memo_;
  std::unordered_map<std::size_t, Entry> sparse_;
  std::vector<std::int64_t> gradients_after_;  // [t] = Σ_{j > t} g_j
};

}  // namespace detail

/// The schedule with the least total time whose peak memory stays within `budget` (same unit as the
/// chain's sizes), in the Chain cost model.
///
/// Dynamic programming over sub-chains in the manner of Beaumont et al. (2019), generalised. A sub-problem
/// D(source, first, last) holds an activation x_source and must backpropagate layers first…last. From the
/// source it runs forward to a layer `kept` and keeps either the activation x_kept or the full tape x̄_kept
/// (the tape holds x_kept, so it serves as the checkpoint for the rest of the chain and x_{kept−1} is
/// recomputed later), solves the part right of the kept value, then the part left of it from the source
/// again. Beyond Beaumont et al.'s persistent schedules (every checkpoint kept until its whole sub-chain is
/// done), the right part may stop early (at right_first > kept + 1) and hand the layers kept+1…right_first−1
/// back to the left part, so a checkpoint is freed after its last use and recomputed from an earlier one;
/// and a part may hand over the full tape x̄_{first−1} it computed on the way (Fall instead of F) to the part
/// left of it. Against an exhaustive search over all schedules of random heterogeneous chains of ≤ 7 layers
/// this is exactly optimal in 10798 of 10800 cases (worst gap 4.0%), and on every uniform chain tested
/// (tests/schedule/planner_test.cpp; persistent only: 96.6%, worst gap 20%).
///
/// `persistent` restricts the search to persistent schedules, which nested checkpoint regions can execute
/// (a region keeps its input until the backward sweep leaves it); run_schedule() runs the others as one
/// region carrying the schedule, outside checkpoint regions only, so plan with it inside one. Time O(L³·budget)
/// persistent, O(L⁵·budget) otherwise, memory O(L²·budget) resp. O(L³·budget) table entries of 16 bytes at worst;
/// measured here: L = 20, budget 150 units: 15 ms persistent, 0.2 s otherwise; L = 60, budget 200: 2 s persistent.
/// Quantise byte sizes (as checkpoint_sequential_auto does) to keep the budget to a few hundred units.
///
/// Returns a Schedule with feasible == false when no schedule fits (the minimum is about
/// x_0 + 2·max x + max x̄, plus the overhead terms). Throws domain_error for an inconsistent chain, L > 60
/// or budget > 2^40.
inline Schedule plan_schedule(const Chain& chain, std::int64_t budget, bool persistent = false) {
  chain.validate();
  if (chain.length() > 60) throw domain_error("plan_schedule: at most 60 layers; group layers into blocks");
  if (budget > (std::int64_t{1} << 40))
    throw domain_error("plan_schedule: budget " + std::to_string(budget) +
                       " is above 2^40 units; quantise sizes (e.g. to KiB) first");
  return detail::Planner(chain, budget, persistent).plan();
}

}  // namespace remat
