// Choosing what the memory budget evicts (detail/eviction.hpp) and evicting it: the heuristics' victim scans
// (h_DTR's equivalence classes, cached bounds, neighbourhoods), the eviction of a victim with the absent values
// behind it and the views that are its buffer, and the evictor's state, as the base of EvictorBudget and Evictor.
// Apart from eviction's mechanics (trials, regeneration) because choosing and evicting change only which buffers are
// there.
#pragma once

#include <algorithm>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "remat/detail/buffers.hpp"
#include "remat/detail/eviction_classes.hpp"
#include "remat/detail/lifetime.hpp"
#include "remat/detail/node.hpp"
#include "remat/memory.hpp"

namespace remat::detail {

template <class T>
class EvictorChoice {
 public:
  EvictorChoice(Graph<T>& graph, Buffers<T>& buffers, Lifetime<T>& lifetime)
      : graph_(graph), buffers_(buffers), lifetime_(lifetime) {}

  /// The victim scans' cached bounds no longer hold (a node computed, or nodes put back). Never throws.
  void invalidate_bounds() noexcept {
    if (++bound_epoch_ == 0) {  // after 2^32: no node's epoch may equal one still to come
      for (BudgetFields& b : graph_.budget) b.bound_epoch = 0;
      bound_epoch_ = 1;
    }
  }

 protected:
  // ---- evicting ----
  /// Frees `id`'s buffer; it and the absent inputs behind it (values the rule did not want, freed) become
  /// evicted, each holding its inputs, so that all of them can be regenerated (a Parameter's value is its
  /// storage again). Walked on a work list, not by recursion. Never throws.
  void evict(std::int32_t id) noexcept {
    Node<T>& n = graph_[id];
    lifetime_.note(id);
    const std::size_t views = n.view_holds > 0 ? detach_views(id) : 0;  // they go with the buffer
    buffers_.free(n.value, n.shape);
    ++evictions_;
    const std::uint32_t stamp = next_stamp(walk_stamp_, &BudgetFields::walk_mark);
    held_.clear();
    held_.push_back(id);
    walk_.clear();
    walk_.push_back(id);
    while (!walk_.empty()) {
      const Node<T>& v = graph_[walk_.back()];
      walk_.pop_back();
      for (int k = 0; k < v.arity; ++k) {
        const std::int32_t w = v.inputs[k];
        Node<T>& x = graph_[w];
        BudgetFields& b = graph_.budget_of(w);
        if (x.value || x.packed || x.evicted || b.walk_mark == stamp) continue;
        if (x.is_leaf()) {
          lifetime_.note(w);
          x.value = x.parameter->value.data();  // evictable() checked it current
          continue;
        }
        b.walk_mark = stamp;
        held_.push_back(w);  // within capacity: each node once
        walk_.push_back(w);
      }
    }
    // Inputs first (recording order is topological): each becomes evicted holding inputs that are resident or
    // already evicted.
    std::sort(held_.begin(), held_.end());
    for (std::int32_t v : held_) lifetime_.mark_evicted(v);
    // Then the views that were the buffer, in recording order: each holds its input, evicted before it.
    std::sort(views_.begin(), views_.begin() + static_cast<std::ptrdiff_t>(views));
    for (std::size_t i = 0; i < views; ++i) lifetime_.mark_evicted(views_[i]);
  }

  /// Before `id`'s buffer is evicted: every view whose value it is (its views, theirs, …) loses it and gives back
  /// its hold, without settling (they are evicted with it). Lists them in views_ and returns how many. Never throws.
  std::size_t detach_views(std::int32_t id) noexcept {
    views_.clear();
    std::size_t next = 0;
    std::int32_t base = id;
    for (;;) {
      Node<T>& b = graph_[base];
      for (std::int32_t e = b.first_use; e >= 0; e = graph_[e / max_inputs].next_use[e % max_inputs]) {
        const std::int32_t c = e / max_inputs;
        Node<T>& v = graph_[c];
        if (e % max_inputs != 0 || !v.is_view() || !v.value) continue;
        lifetime_.note(c);
        lifetime_.note(base);
        v.value = nullptr;
        --b.view_holds;
        views_.push_back(c);  // within capacity: each node once
      }
      if (next == views_.size()) return views_.size();
      base = views_[next++];
    }
  }

  /// The next value of a stamp whose marks are `field` of every node; after 2^32 uses every mark is cleared,
  /// so that no old mark equals a new stamp. Never throws.
  std::uint32_t next_stamp(std::uint32_t& stamp, std::uint32_t BudgetFields::*field) noexcept {
    if (++stamp == 0) {
      for (BudgetFields& b : graph_.budget) b.*field = 0;
      stamp = 1;
    }
    return stamp;
  }

  // ---- choosing ----
  /// Whether node `id`, absent or not, could be regenerated from what is there: resident, evicted (its inputs
  /// are held: regenerable by construction), a current Parameter, or an op whose inputs are regenerable; never a
  /// value a policy stores compressed (Node::stored), resident or not. Its readers read it exact until it is packed
  /// and decoded after, so a consumer regenerated from it could differ from the one it replaces; and a consumer's
  /// eviction would hold it (a regeneration read) past the moment the run without a budget packs it, so that its
  /// own readers would read it exact where that run reads it decoded. Memoised per scan; walked on a work list, not
  /// by recursion. Never throws.
  bool regenerable(std::int32_t id) noexcept {
    auto known = [&](std::int32_t v, bool& result) {
      const Node<T>& n = graph_[v];
      const BudgetFields& b = graph_.budget_of(v);
      if (n.stored != 0) return result = false, true;
      if (n.value || n.evicted) return result = true;
      if (n.is_leaf()) return result = n.parameter && n.parameter->version == n.parameter_version, true;
      if (b.evict_mark == scan_ && b.evict_memo != 0) return result = b.evict_memo == 1, true;
      return false;
    };
    auto enter = [&](std::int32_t v) {
      BudgetFields& b = graph_.budget_of(v);
      assert(b.evict_mark != scan_ && "the graph has no cycle");
      b.evict_mark = scan_;
      b.evict_memo = 0;
      stack_.push_back(v);  // within capacity: each node once per scan
    };
    bool result = false;
    if (known(id, result)) return result;
    stack_.clear();
    enter(id);
    while (!stack_.empty()) {
      const std::int32_t v = stack_.back();
      const Node<T>& n = graph_[v];
      bool ok = true, waiting = false;
      for (int k = 0; k < n.arity && ok; ++k) {
        bool r = false;
        if (known(n.inputs[k], r)) {
          ok = r;
          continue;
        }
        enter(n.inputs[k]);
        waiting = true;
        break;
      }
      if (waiting) continue;
      graph_.budget_of(v).evict_memo = ok ? 1 : 2;
      stack_.pop_back();
    }
    return graph_.budget_of(id).evict_memo == 1;
  }

  /// The next victim: from the log when repeating, else best_victim() (logged when recording).
  std::int32_t choose() noexcept {
    if (choices_state_ == ChoicesState::repeating) {
      if (choices_next_ < choices_.size()) {
        const std::int32_t v = choices_[choices_next_++];
        assert(v == best_victim() && "a real run chooses the victims of its trial or dry run");
        return v;
      }
      choices_state_ = ChoicesState::off;  // the log ran out (it outgrew its capacity): scan from here
    }
    const std::int32_t v = best_victim();
    if (choices_state_ == ChoicesState::recording) {
      if (choices_.size() < choices_.capacity()) {
        choices_.push_back(v);
      } else {
        choices_wanted_ = std::max(choices_wanted_, 2 * choices_.size());
        choices_state_ = ChoicesState::off;  // the log keeps the choices so far
      }
    }
    return v;
  }

  /// A lower bound on node `v`'s cost plus e*(v) (neighbourhood()) if v were evicted: v's cost plus the most of
  /// (a) over v's freed inputs (absent op outputs that are not evicted), the costliest path of freed values back
  /// from one, each with the cost of one evicted class it reads, and (b) the cost of the class of one evicted
  /// input or consumer of v. Every node so counted is in e*(v), distinct. It stays a lower bound until a node is
  /// computed (run()), a class loses a member (Lifetime::class_leaves) or nodes are put back: evictions only add
  /// to classes. So it is cached until then (invalidate_bounds): in a forward pass, each node's is computed once.
  /// Walked on a work list. Never throws.
  double bound(std::int32_t v) noexcept {
    auto freed = [](const Node<T>& w) { return !w.value && !w.packed && !w.evicted && !w.is_leaf(); };
    auto class_cost = [&](std::int32_t w) { return graph_.budget_of(class_root(graph_, w)).class_cost; };
    auto bounded = [&](std::int32_t w) { return graph_.budget_of(w).bound_epoch == bound_epoch_; };
    if (bounded(v)) return graph_.budget_of(v).bound;
    stack_.clear();
    stack_.push_back(v);
    while (!stack_.empty()) {
      const std::int32_t id = stack_.back();
      Node<T>& n = graph_[id];
      double most = 0;
      bool waiting = false;
      for (int k = 0; k < n.arity; ++k) {
        const Node<T>& w = graph_[n.inputs[k]];
        if (w.evicted) {
          most = std::max(most, class_cost(n.inputs[k]));
        } else if (freed(w)) {
          if (!bounded(n.inputs[k])) {
            stack_.push_back(n.inputs[k]);  // within capacity: a node is pushed again only once it is bounded
            waiting = true;
            break;
          }
          most = std::max(most, graph_.budget_of(n.inputs[k]).bound);
        }
      }
      if (waiting) continue;
      if (id == v)  // a freed node has no evicted consumer (it would hold it): only v's are looked at
        for (std::int32_t e = n.first_use; e >= 0; e = graph_[e / max_inputs].next_use[e % max_inputs])
          if (graph_[e / max_inputs].evicted) most = std::max(most, class_cost(e / max_inputs));
      graph_.budget_of(id).bound = n.cost + most;
      graph_.budget_of(id).bound_epoch = bound_epoch_;
      stack_.pop_back();
    }
    return graph_.budget_of(v).bound;
  }

  /// The evictable value of lowest score cost / (bytes · staleness); the lowest id on a tie; -1 if none.
  /// Evictable: an op's tape-owned output, resident, wanted (the rule would keep it), not read by an op or a
  /// regeneration running now, not a view (OpBase::view: evicting it would free nothing), not the buffer of a view
  /// that a running op reads (evicting a buffer evicts the views that are it, detail/eviction.hpp), and
  /// regenerable from what is there, and not stored compressed (Node::stored: its packed buffer is what the policy
  /// chose to keep, and a value decoded from it goes when its read is done).
  std::int32_t best_victim() noexcept {
    next_stamp(scan_, &BudgetFields::evict_mark);
    if (heuristic_ == EvictionHeuristic::dtr && classes_exact_at_ != lifetime_.class_leaves()) rebuild_classes();
    if (bounds_leaves_ != lifetime_.class_leaves()) {  // a class lost a member: its cost fell
      invalidate_bounds();
      bounds_leaves_ = lifetime_.class_leaves();
    }
    std::int32_t best = -1;
    double best_score = 0;
    for (std::int32_t i = 0; i < graph_.size(); ++i) {
      const Node<T>& n = graph_[i];
      if (!n.value || n.is_leaf() || n.pins > 0 || n.is_view() || n.stored != 0) continue;  // an op's output
      if (n.view_holds > 0 && view_pinned(i)) continue;
      const double scale =
          static_cast<double>(Buffers<T>::bytes(n.shape)) * static_cast<double>(clock_ - n.last_access + 1);
      // A node whose lower bound already scores no better than the best so far cannot win, and its neighbourhood
      // need not be walked: h_local's cost is the node's own, the others' at least bound().
      if (best >= 0 && (heuristic_ == EvictionHeuristic::local ? n.cost : bound(i)) / scale >= best_score) continue;
      if (!lifetime_.value_wanted(n) || !inputs_regenerable(i)) continue;
      const double score = cost(i) / scale;
      if (best < 0 || score < best_score) {
        best = i;
        best_score = score;
      }
    }
    return best;
  }

  /// Node `id` could be computed again from its inputs as it was: each regenerable (regenerable()), or stored
  /// compressed, packed, and read decoded when id was last computed (a checkpoint replay's source): a regeneration
  /// decodes it the same way. Never throws.
  bool inputs_regenerable(std::int32_t id) noexcept {
    const Node<T>& n = graph_[id];
    for (int k = 0; k < n.arity; ++k) {
      const Node<T>& in = graph_[n.inputs[k]];
      const bool ok = in.stored != 0 ? in.packed && (graph_.budget_of(id).decoded >> k & 1u) : regenerable(n.inputs[k]);
      if (!ok) return false;
    }
    return true;
  }

  /// Some view whose value is node `id`'s buffer (directly or through views of views) is read by an op running now.
  bool view_pinned(std::int32_t id) const noexcept {
    const Node<T>& b = graph_[id];
    for (std::int32_t e = b.first_use; e >= 0; e = graph_[e / max_inputs].next_use[e % max_inputs]) {
      const Node<T>& v = graph_[e / max_inputs];
      if (e % max_inputs != 0 || !v.is_view() || !v.value) continue;
      if (v.pins > 0 || (v.view_holds > 0 && view_pinned(e / max_inputs))) return true;
    }
    return false;
  }

  /// h_DTR's classes made exact (make_classes_exact, detail/eviction_classes.hpp). Never throws.
  void rebuild_classes() noexcept {
    make_classes_exact(graph_, stack_, [this](std::int32_t changed) { lifetime_.note(changed); });
    classes_exact_at_ = lifetime_.class_leaves();
  }

  double cost(std::int32_t id) noexcept {
    switch (heuristic_) {
      case EvictionHeuristic::local:
        return graph_[id].cost;
      case EvictionHeuristic::dtr_eq:
      case EvictionHeuristic::dtr:
        break;
    }
    return graph_[id].cost + neighbourhood(id);
  }

  /// e*(t) (Kirisame et al. 2021, §4): the summed cost of what t's eviction leaves to be regenerated with t —
  /// its absent inputs, which its eviction makes evicted, and theirs, up to resident values and Parameters
  /// (t's "freed closure", walked) — and of the evicted values connected to t or to that closure through
  /// evicted values, each counted once: their classes (rebuild_classes), exact for h_DTR, for h_DTR^eq merged on
  /// eviction and never split. (Counting an absent input's own cost alone, without the inputs behind it, would
  /// make a sigmoid's output whose regeneration re-runs two GEMMs through a slice and an add look as cheap as the
  /// slice.) Never throws.
  double neighbourhood(std::int32_t id) noexcept {
    // Two stamps: a freed node may be the root of a class that still has evicted members (h_DTR^eq's classes
    // never split).
    const std::uint32_t stamp = next_stamp(walk_stamp_, &BudgetFields::walk_mark);
    const std::uint32_t class_stamp = next_stamp(class_stamp_, &BudgetFields::class_mark);
    double sum = 0;
    auto add_evicted = [&](std::int32_t v) {
      BudgetFields& root = graph_.budget_of(class_root(graph_, v));
      if (root.class_mark == class_stamp) return;
      root.class_mark = class_stamp;
      sum += root.class_cost;
    };
    const Node<T>& n = graph_[id];
    for (std::int32_t e = n.first_use; e >= 0; e = graph_[e / max_inputs].next_use[e % max_inputs])
      if (graph_[e / max_inputs].evicted) add_evicted(e / max_inputs);
    // The freed closure. An absent op output that is not evicted has no evicted consumer (an evicted consumer
    // would hold it), so only inputs are walked from it.
    walk_.clear();
    walk_.push_back(id);
    while (!walk_.empty()) {
      const Node<T>& v = graph_[walk_.back()];
      walk_.pop_back();
      for (int k = 0; k < v.arity; ++k) {
        const Node<T>& w = graph_[v.inputs[k]];
        BudgetFields& b = graph_.budget_of(v.inputs[k]);
        if (w.value || w.packed || w.is_leaf()) continue;
        if (w.evicted) {
          add_evicted(v.inputs[k]);
        } else if (b.walk_mark != stamp) {
          b.walk_mark = stamp;
          sum += w.cost;
          walk_.push_back(v.inputs[k]);  // within capacity: each node once per walk
        }
      }
    }
    return sum;
  }

  enum class ChoicesState { off, recording, repeating };

  Graph<T>& graph_;
  Buffers<T>& buffers_;
  Lifetime<T>& lifetime_;
  std::size_t budget_ = 0;
  EvictionHeuristic heuristic_ = EvictionHeuristic::dtr_eq;
  std::uint64_t clock_ = 0;
  std::size_t evictions_ = 0, rematerialized_ops_ = 0, rematerialized_bytes_ = 0;
  double rematerialized_flops_ = 0;
  bool failed_ = false;
  std::size_t failed_needed_ = 0, failed_least_ = 0;
  std::int32_t stale_ = -1;  // a modified Parameter a trial read, reported after it
  std::uint32_t scan_ = 0, walk_stamp_ = 0, class_stamp_ = 0, regen_stamp_ = 0;
  std::uint64_t classes_exact_at_ = 0;        // lifetime_.class_leaves() when the classes were last exact (h_DTR)
  std::uint32_t bound_epoch_ = 1;             // BudgetFields::bound_epoch of the bounds that hold now
  std::uint64_t bounds_leaves_ = 0;           // lifetime_.class_leaves() when they were last checked
  std::vector<std::int32_t> members_, work_;  // a regeneration's members, and its walk
  std::vector<std::int32_t> walk_, stack_;    // the neighbourhood walk, eviction's walk; regenerable's, bound's
  std::vector<std::int32_t> held_;            // an eviction's newly evicted values
  std::vector<std::int32_t> views_;           // an eviction's views of the evicted buffer
  std::vector<std::int32_t> choices_;         // the victims of the last trial or dry run
  std::size_t choices_next_ = 0, choices_wanted_ = 0;
  ChoicesState choices_state_ = ChoicesState::off;
};

}  // namespace remat::detail
