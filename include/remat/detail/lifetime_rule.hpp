// The lifetime rule's questions (the rule: detail/lifetime.hpp): whether it wants a value or an op's extra now, at
// the current nesting level (value_wanted, extra_wanted), and what memory().saved_bytes and print_saved_residuals
// count as kept for a reader (saved_value, saved_packed, saved_extra); and a trial's journal, which every change to
// a node goes through first (note). The base of Lifetime, through CompressedValues (compressed_values.hpp): these
// questions read the nodes and change nothing, and Lifetime (lifetime.hpp) holds every change.
//
// Every change Lifetime (and the budget's Evictor) makes to a node goes through note(id) first: during a
// trial of an allocation under a memory budget (Evictor::trial) that saves the node's mutable fields once, so
// that the trial is undone in time proportional to the nodes it touched, not to the tape (restoring every node
// after a trial per recorded op would make recording under a budget quadratic in the tape's length).
#pragma once

#include <cstdint>
#include <vector>

#include "remat/detail/buffers.hpp"
#include "remat/detail/levels.hpp"
#include "remat/detail/node.hpp"
#include "remat/detail/node_snapshot.hpp"

namespace remat::detail {

template <class T>
class LifetimeRule {
 public:
  LifetimeRule(Graph<T>& graph, Buffers<T>& buffers) : graph_(graph), buffers_(buffers) {}

  // ---- a trial's undo log ----
  /// From now until end_journal(), the first change to each node saves its mutable fields (within the
  /// capacity Lifetime::reserve() made). Never throws.
  void begin_journal() noexcept {
    journal_.clear();
    if (++journal_stamp_ == 0) {  // after 2^32 trials: no mark may equal a stamp still to come
      for (BudgetFields& b : graph_.budget) b.journal_mark = 0;
      journal_stamp_ = 1;
    }
    journaling_ = true;
  }
  /// Puts back every node changed since begin_journal() and stops logging. Never throws.
  void end_journal() noexcept {
    for (auto it = journal_.rbegin(); it != journal_.rend(); ++it) {
      it->node.restore(graph_[it->id]);
      it->budget.restore(graph_.budget_of(it->id));
    }
    journal_.clear();
    journaling_ = false;
  }
  /// Node `id` is about to change. Never throws. Inlined: outside a trial it is one test on every change the
  /// tape makes to a node.
  void note(std::int32_t id) noexcept {
    if (journaling_) save(id);
  }

  // ---- the rule ----
  bool value_wanted(const Node<T>& n) const { return n.view_holds > 0 || wanted_for_itself(n); }
  /// Wanted by something other than a view of it. A value kept only for its views (Node::view_kept) is absent for
  /// every replay and schedule (replay_plan.hpp, PresentNow), which compute it again before a backward reads it: a
  /// pending reader does not keep it once its last view has gone, whatever the level (a chain schedule marks it at
  /// the level below its own, detail/chain_schedule.hpp, and gives back its views' holds at the chain's level).
  bool wanted_for_itself(const Node<T>& n) const {
    return n.handles > 0 || n.pins > 0 || n.regen_reads > 0 || n.schedule_holds > 0 ||
           (!n.view_kept && read_at_this_level(n));
  }
  bool extra_wanted(const Node<T>& n) const { return n.extra_read && (n.handles > 0 || n.level <= level_); }
  /// A tape-owned buffer kept for a reader (not only for a handle), its own or a view's of it: what
  /// memory().saved_bytes counts (a buffer once, with its owner).
  bool saved_value(const Node<T>& n) const {
    return n.value && !n.packed && n.value_owned() && (held_for_reader(n) || (n.view_holds > 0 && saving_view(n) >= 0));
  }
  /// Its packed buffer is kept for a reader: what memory().saved_bytes counts for it (packed_bytes).
  bool saved_packed(const Node<T>& n) const { return n.packed && held_for_reader(n); }
  /// A reader (not only a handle) keeps n's value: a backward or a replay at this level, a regeneration, a schedule.
  bool held_for_reader(const Node<T>& n) const {
    return n.regen_reads > 0 || n.schedule_holds > 0 || read_at_this_level(n);
  }
  /// A view whose value is n's buffer now (directly or through views of views) and that is held for a reader —
  /// the one recorded last if several are — or -1 if none. Walks n's consumers: only memory() and the reports ask.
  std::int32_t saving_view(const Node<T>& n) const {
    const auto id = static_cast<std::int32_t>(&n - graph_.nodes.data());
    for (std::int32_t e = n.first_use; e >= 0; e = graph_[e / max_inputs].next_use[e % max_inputs]) {
      const Node<T>& v = graph_[e / max_inputs];
      if (e % max_inputs != 0 || !v.is_view() || !v.value || v.inputs[0] != id) continue;
      if (held_for_reader(v) || (v.view_holds > 0 && saving_view(v) >= 0)) return e / max_inputs;
    }
    return -1;
  }
  /// A pending reader needs n at the current level (levels.hpp: read_at_or_below).
  bool read_at_this_level(const Node<T>& n) const { return read_at_or_below(graph_, n, level_); }
  bool saved_extra(const Node<T>& n) const { return n.extra && n.extra_read && n.level <= level_; }

  // ---- the nesting level it reads ----
  int level() const { return level_; }
  void set_level(int level) { level_ = level; }

 protected:
  Graph<T>& graph_;
  Buffers<T>& buffers_;
  int level_ = 0;
  // A trial's changed nodes, as they were. Only a trial journals, and only after Evictor::reserve(), which
  // starts the side table: every node has its budget state then.
  struct Entry {
    std::int32_t id;
    NodeSnapshot<T> node;
    BudgetSnapshot budget;
  };
  std::vector<Entry> journal_;
  std::uint32_t journal_stamp_ = 0;
  bool journaling_ = false;

 private:
  /// note()'s work in a trial: the node's fields, once per trial.
  void save(std::int32_t id) noexcept {
    BudgetFields& b = graph_.budget_of(id);
    if (b.journal_mark == journal_stamp_) return;
    b.journal_mark = journal_stamp_;
    journal_.push_back({id, NodeSnapshot<T>::of(graph_[id]), BudgetSnapshot::of(b)});  // within capacity: once a node
  }
};

}  // namespace remat::detail
