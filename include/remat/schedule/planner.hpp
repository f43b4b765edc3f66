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
struct Chain {
  std::vector<double> forward_time;           ///< u_f, L entries
  std::vector<double> backward_time;          ///< u_b, L entries
  std::vector<std::int64_t> activation_size;  ///< ω_x, L + 1 entries: [0] is the chain input x_0
  std::vector<std::int64_t> tape_size;        ///< ω_x̄, L entries, tape_size[i−1] ≥ activation_size[i]

  int length() const { return static_cast<int>(forward_time.size()); }

  /// Throws domain_error unless the vectors have consistent lengths and sizes are non-negative.
  void validate() const {
    const auto L = forward_time.size();
    if (L == 0 || backward_time.size() != L || tape_size.size() != L || activation_size.size() != L + 1)
      throw domain_error(
          "Chain: need L ≥ 1 forward_time, backward_time and tape_size entries and L + 1 "
          "activation_size entries; got " +
          std::to_string(forward_time.size()) + ", " + std::to_string(backward_time.size()) + ", " +
          std::to_string(tape_size.size()) + " and " + std::to_string(activation_size.size()));
    for (std::size_t i = 0; i <= L; ++i)
      if (activation_size[i] < 0) throw domain_error("Chain: activation_size must be non-negative");
    for (std::size_t i = 0; i < L; ++i)
      if (tape_size[i] < activation_size[i + 1])
        throw domain_error("Chain: tape_size[" + std::to_string(i) + "] must be ≥ activation_size[" +
                           std::to_string(i + 1) + "] (the tape contains the layer's output)");
  }
};

/// One operation of a schedule in the Chain cost model.
struct ScheduleOperation {
  enum Kind {
    forward,          ///< F_layer: compute x_layer, keep only it
    forward_all,      ///< Fall_layer: compute the full tape x̄_layer
    backward,         ///< B_layer: δ_{layer−1} from x̄_layer, δ_layer, x_{layer−1}; frees x̄_layer and δ_layer
    free_activation,  ///< free x_layer
  };
  Kind kind;
  int layer;  ///< 1…L for forward, forward_all, backward; 0…L for free_activation
};

namespace detail {

/// One decision of the planner's dynamic program, for the sub-problem "backpropagate layers s…t,
/// holding x_{s−1} and δ_t, and also x̄_t when `tape`".
struct PlanNode {
  enum Kind {
    leaf,              ///< s == t: Fall_s (unless tape) then B_s
    keep_tape,         ///< Fall_s kept while s+1…t runs, then B_s
    split_activation,  ///< F_s…F_{split−1}; keep x_{split−1}; do split…t; then s…split−1
    split_tape,  ///< F_s…F_{split−2}, Fall_{split−1}; keep x̄_{split−1}; do split…t; then s…split−1 with its tape
  };
  Kind kind = leaf;
  int s = 0, t = 0, split = 0;
  bool tape = false;
  int right = -1;  ///< node of the sub-chain after the kept value (keep_tape, split_*), -1 if none
  int left = -1;   ///< node of the sub-chain before it (split_*)
};

}  // namespace detail

/// A schedule for a Chain: the operation sequence, its total time and peak memory in the model, and the
/// decision tree run_schedule() executes on a tape.
struct Schedule {
  bool feasible = false;
  double time = 0;          ///< Σ forward and backward times of all operations (the minimised objective)
  std::int64_t budget = 0;  ///< the memory budget it was planned for
  std::vector<ScheduleOperation> operations;
  std::vector<detail::PlanNode> nodes;  ///< decision tree; nodes[root] is the whole chain
  int root = -1;

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
  Planner(const Chain& chain, std::int64_t budget) : c_(chain), L_(chain.length()), budget_(budget) {}

  Schedule plan() {
    Schedule result;
    result.budget = budget_;
    const double cost = budget_ < 0 ? infinity : solve(1, L_, false, budget_);
    if (cost == infinity) return result;
    result.feasible = true;
    result.time = cost;
    result.root = build(result, 1, L_, false, budget_);
    emit(result, result.root, true);
    return result;
  }

 private:
  static constexpr double infinity = std::numeric_limits<double>::infinity();
  struct Entry {
    double cost;
    int choice;  // 0 leaf, 1 keep_tape, 2 + 2·split + {0 activation, 1 tape}
  };

  std::int64_t x(int i) const { return c_.activation_size[static_cast<std::size_t>(i)]; }
  std::int64_t a(int i) const { return c_.tape_size[static_cast<std::size_t>(i - 1)]; }
  double f(int i) const { return c_.forward_time[static_cast<std::size_t>(i - 1)]; }
  double b(int i) const { return c_.backward_time[static_cast<std::size_t>(i - 1)]; }
  /// δ_t held before B_t starts (δ_L only appears with B_L).
  std::int64_t delta(int t) const { return t < L_ ? x(t) : 0; }

  /// Peak added by F_s … F_e run from a held x_{s−1}, each intermediate freed after its successor exists.
  std::int64_t chain_peak(int s, int e) const {
    std::int64_t peak = 0;
    for (int j = s; j <= e; ++j) peak = std::max(peak, x(j) + (j > s ? x(j - 1) : 0));
    return peak;
  }
  double forward_sum(int s, int e) const {
    double sum = 0;
    for (int j = s; j <= e; ++j) sum += f(j);
    return sum;
  }

  /// Least time to backpropagate layers s…t (producing δ_{s−1}) holding x_{s−1}, δ_t (if t < L) and, when
  /// `tape`, x̄_t, all counted in the budget m.
  double solve(int s, int t, bool tape, std::int64_t m) {
    if (m < 0) return infinity;
    const std::uint64_t key =
        ((static_cast<std::uint64_t>(s) * 64 + static_cast<std::uint64_t>(t)) * 2 + (tape ? 1u : 0u)) *
            (static_cast<std::uint64_t>(budget_) + 1) +
        static_cast<std::uint64_t>(m);
    if (auto it = memo_.find(key); it != memo_.end()) return it->second.cost;
    Entry best{infinity, -1};
    const std::int64_t held = x(s - 1) + delta(t) + (tape ? a(t) : 0);  // before any forward
    const std::int64_t backward_peak = 2 * x(s - 1) + a(s) + x(s);      // during B_s
    if (s == t) {
      if (backward_peak <= m && (tape || held + a(s) <= m)) best = {(tape ? 0 : f(s)) + b(s), 0};
    } else {
      // keep_tape: Fall_s, keep x̄_s (it holds x_s for the rest of the chain), then B_s.
      if (held + a(s) <= m && backward_peak <= m) {
        const double rest = solve(s + 1, t, tape, m - x(s - 1) - a(s) + x(s));
        consider(best, f(s) + rest + b(s), 1);
      }
      for (int split = s + 1; split <= t; ++split) {
        // split_activation: keep x_{split−1}.
        if (held + chain_peak(s, split - 1) <= m) {
          const double right = solve(split, t, tape, m - x(s - 1));
          if (right < infinity)
            consider(best, forward_sum(s, split - 1) + right + solve(s, split - 1, false, m), 2 + 2 * split);
        }
      }
      for (int split = s + 2; split <= t + 1; ++split) {
        // split_tape: keep x̄_{split−1}; x_{split−2} is recomputed when s…split−1 is processed.
        const int kept = split - 1;
        if (tape && kept == t) continue;
        if (held + std::max(chain_peak(s, kept - 1), x(kept - 1) + a(kept)) > m) continue;
        double right = 0;
        if (kept < t) right = solve(split, t, tape, m - x(s - 1) - a(kept) + x(kept));
        if (right < infinity) consider(best, forward_sum(s, kept) + right + solve(s, kept, true, m), 3 + 2 * split);
      }
    }
    memo_[key] = best;
    return best.cost;
  }

  static void consider(Entry& best, double cost, int choice) {
    if (cost < best.cost) best = {cost, choice};
  }

  int build(Schedule& out, int s, int t, bool tape, std::int64_t m) {
    solve(s, t, tape, m);
    const std::uint64_t key =
        ((static_cast<std::uint64_t>(s) * 64 + static_cast<std::uint64_t>(t)) * 2 + (tape ? 1u : 0u)) *
            (static_cast<std::uint64_t>(budget_) + 1) +
        static_cast<std::uint64_t>(m);
    const Entry e = memo_.at(key);
    PlanNode node;
    node.s = s;
    node.t = t;
    node.tape = tape;
    const auto index = static_cast<int>(out.nodes.size());
    out.nodes.push_back(node);
    if (e.choice == 0) return index;
    if (e.choice == 1) {
      out.nodes[static_cast<std::size_t>(index)].kind = PlanNode::keep_tape;
      const int right = build(out, s + 1, t, tape, m - x(s - 1) - a(s) + x(s));
      out.nodes[static_cast<std::size_t>(index)].right = right;
      return index;
    }
    const int split = (e.choice - 2) / 2;
    const bool keeps_tape = (e.choice - 2) % 2 == 1;
    int right = -1, left = -1;
    if (!keeps_tape) {
      right = build(out, split, t, tape, m - x(s - 1));
      left = build(out, s, split - 1, false, m);
    } else {
      const int kept = split - 1;
      if (kept < t) right = build(out, split, t, tape, m - x(s - 1) - a(kept) + x(kept));
      left = build(out, s, kept, true, m);
    }
    PlanNode& n = out.nodes[static_cast<std::size_t>(index)];
    n.kind = keeps_tape ? PlanNode::split_tape : PlanNode::split_activation;
    n.split = split;
    n.right = right;
    n.left = left;
    return index;
  }

  /// Appends the operations of node `index`; `owns_input`: free x_{s−1} after B_s (false when it lives
  /// inside a kept tape x̄_{s−1}).
  void emit(Schedule& out, int index, bool owns_input) const {
    const PlanNode n = out.nodes[static_cast<std::size_t>(index)];
    auto op = [&](ScheduleOperation::Kind k, int layer) { out.operations.push_back({k, layer}); };
    auto finish = [&] {
      op(ScheduleOperation::backward, n.s);
      if (owns_input) op(ScheduleOperation::free_activation, n.s - 1);
    };
    auto run_forward = [&](int e) {  // F_s … F_e from x_{s−1}, freeing intermediates
      for (int j = n.s; j <= e; ++j) {
        op(ScheduleOperation::forward, j);
        if (j > n.s) op(ScheduleOperation::free_activation, j - 1);
      }
    };
    switch (n.kind) {
      case PlanNode::leaf:
        if (!n.tape) op(ScheduleOperation::forward_all, n.s);
        finish();
        break;
      case PlanNode::keep_tape:
        op(ScheduleOperation::forward_all, n.s);
        emit(out, n.right, false);
        finish();
        break;
      case PlanNode::split_activation:
        run_forward(n.split - 1);
        emit(out, n.right, true);
        emit(out, n.left, owns_input);
        break;
      case PlanNode::split_tape:
        run_forward(n.split - 2);
        op(ScheduleOperation::forward_all, n.split - 1);
        op(ScheduleOperation::free_activation, n.split - 2);
        if (n.right >= 0) emit(out, n.right, false);
        emit(out, n.left, owns_input);
        break;
    }
  }

  const Chain& c_;
  int L_;
  std::int64_t budget_;
  std::unordered_map<std::uint64_t, Entry> memo_;
};

}  // namespace detail

/// The schedule with the least total time whose peak memory stays within `budget` (same unit as the
/// chain's sizes), in the Chain cost model.
///
/// Dynamic programming over sub-chains in the manner of Beaumont et al. (2019): for layers s…t with x_{s−1}
/// held, either run Fall_s and keep x̄_s, or run forward to a split point and keep there either the
/// activation x_{split−1} or the full tape x̄_{split−1} (which holds x_{split−1}: the tape itself serves as
/// the checkpoint for the rest of the chain, and x_{split−2} is recomputed when the left part is processed),
/// process the right part, then the left part. Kept values persist until their sub-chain is done.
/// Time O(L³·budget), memory O(L²·budget) table entries in the worst case; quantise byte sizes (as
/// checkpoint_sequential_auto does) to keep the budget to a few hundred units.
///
/// Returns a Schedule with feasible == false when no schedule fits (the minimum is about
/// x_0 + 2·max x + max x̄). Throws domain_error for an inconsistent chain or L > 60.
inline Schedule plan_schedule(const Chain& chain, std::int64_t budget) {
  chain.validate();
  if (chain.length() > 60) throw domain_error("plan_schedule: at most 60 layers; group layers into blocks");
  return detail::Planner(chain, budget).plan();
}

}  // namespace remat
