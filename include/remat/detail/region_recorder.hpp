// Recording checkpoint regions (detail/recorder.hpp): opening one, closing it (its replay plan and the holds
// on what the replay reads), aborting it, and the room closing needs, as the base of PolicyDecisions and Recorder.
// Apart from recording ops because a region's work happens at its ends, not per op.
#pragma once

#include <algorithm>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "remat/detail/buffers.hpp"
#include "remat/detail/eviction.hpp"
#include "remat/detail/levels.hpp"
#include "remat/detail/lifetime.hpp"
#include "remat/detail/node.hpp"
#include "remat/detail/replay_plan.hpp"
#include "remat/errors.hpp"

namespace remat::detail {

template <class T>
class RegionRecorder {
 public:
  RegionRecorder(Graph<T>& graph, Buffers<T>& buffers, Lifetime<T>& lifetime, Evictor<T>& evictor)
      : graph_(graph), buffers_(buffers), lifetime_(lifetime), evictor_(evictor) {}

  // ---- checkpoint regions ----
  /// `plan`: a chain run by its schedule (Graph::chain_plans), -1 for a checkpoint region.
  std::int32_t open_region(policies::Decision (*policy)(const void*, const OpInfo&), const void* policy_object,
                           std::int32_t plan = -1) {
    if (graph_.open_depth() >= max_region_depth)
      throw tape_error("checkpoint: regions nested deeper than " + std::to_string(max_region_depth) + " levels");
    graph_.open.reserve(graph_.open.size() + 1);
    Region r;
    r.begin = graph_.size();
    r.parent = graph_.open.empty() ? -1 : graph_.open.back();
    r.depth = graph_.open_depth() + 1;
    r.policy = policy;
    r.policy_object = policy_object;
    r.plan = plan;
    graph_.regions.push_back(r);
    graph_.open.push_back(static_cast<std::int32_t>(graph_.regions.size() - 1));
    return graph_.open.back();
  }

  /// Closes the innermost open region; `outputs` are the ids its function returned. Decides what its
  /// replay will read and holds those values (JAX's partial evaluation, detail/replay_plan.hpp). Does not
  /// allocate: every node recorded in an open region made room for closing it (reserve_for_close), so
  /// that a region whose function returned is never lost to a std::bad_alloc (checkpoint() would have to
  /// abort it, leaving its nodes on the tape).
  void close_region(const std::int32_t* outputs, std::size_t count) noexcept {
    Region& r = graph_.region(graph_.open.back());
    const auto length = static_cast<std::size_t>(graph_.size() - r.begin);
    assert(members_.capacity() >= length && uses_.capacity() >= length &&
           graph_.region_sources.capacity() >= graph_.region_sources.size() + max_inputs * length);
    uses_.assign(length, 0);  // within capacity
    computed_inputs_.assign(length, 0);
    const std::uint64_t bit = std::uint64_t{1} << r.depth;
    for (std::size_t o = 0; o < count; ++o) {
      Node<T>& n = graph_[outputs[o]];
      if (outputs[o] < r.begin) continue;  // an input passed through
      n.output_mask |= bit;
      n.stored = 0;  // what a checkpointed function returns is stored as it is (policies::Decision)
      if (r.plan >= 0) {
        // A chain run by its schedule keeps what it returns: the schedule's holds decide when it goes.
        n.drop_mask &= ~bit;
        n.level = static_cast<std::int8_t>(level_of(n.drop_mask));
      } else if (n.tiers < 0 && level_at_depth(n.drop_mask, r.depth - 1) < n.level) {
        // JAX's rule: what a checkpointed function returns is one of its values like any other. If the policy
        // dropped it, the region's own readers read it at its level and its replay regenerates it for them;
        // a reader from outside reads it at the level of the regions enclosing both, counted in its tiers.
        n.tiers = static_cast<std::int32_t>(graph_.tier_holds.size());
        graph_.tier_holds.insert(graph_.tier_holds.end(), static_cast<std::size_t>(depth_of(graph_, n)),
                                 0);  // within capacity
      }
    }
    hold_returned_inputs(r);
    finish(r);
    plan_replay(graph_, r, PresentBelowLevel{r.depth}, members_, uses_, computed_inputs_);
    r.replays = !members_.empty();
    r.replay_bytes = 0;
    for (std::int32_t m : members_)
      r.replay_bytes +=
          (graph_[m].is_view() ? 0 : Buffers<T>::bytes(graph_[m].shape)) + Buffers<T>::bytes(graph_[m].extra_shape);
    if (r.plan >= 0) {
      // A chain run by its schedule may recompute any of its ops: every value they read from outside
      // the chain, and every leaf inside it, is a source (within capacity: members_ holds `length`).
      members_.clear();
      for (std::int32_t i = r.begin; i < graph_.size(); ++i)
        if (!graph_[i].is_leaf()) members_.push_back(i);
    }
    hold_sources(r);
    if (graph_.open.empty()) {
      lifetime_.release_pending();
      settle_sign_stored(r);
    }
  }

  /// Closes the innermost open region after its function threw: it returns nothing and never replays.
  void abort_region() noexcept {
    graph_.region(graph_.open.back()).plan = -1;
    finish(graph_.region(graph_.open.back()));
    if (graph_.open.empty()) lifetime_.release_pending();
  }

 protected:
  /// `v`'s capacity becomes at least `n`, growing geometrically (a reserve per record must not make
  /// recording quadratic). Throws std::bad_alloc with `v` unchanged.
  template <class V>
  static void reserve_at_least(V& v, std::size_t n) {
    if (n > v.capacity()) v.reserve(std::max(n, 2 * v.capacity()));
  }

  /// Inside open regions, before `added` nodes are added: room for everything closing them will need once
  /// they are recorded (close_region's scratch and each region's replay sources, at most max_inputs per node), so
  /// that close_region cannot throw. Throws std::bad_alloc before changing anything.
  void reserve_for_close(std::size_t added = 1) {
    const auto next = static_cast<std::size_t>(graph_.size()) + added;
    const std::size_t outermost = next - static_cast<std::size_t>(graph_.region(graph_.open.front()).begin);
    reserve_at_least(members_, outermost);
    reserve_at_least(uses_, outermost);
    reserve_at_least(computed_inputs_, outermost);
    // Pending holds: commit() adds at most max_inputs; hold_returned_inputs() at most one per node of the
    // outermost region (a returned value, held once until that region closes).
    reserve_at_least(graph_.pending, graph_.pending.size() + max_inputs * added + outermost);
    std::size_t open_nodes = 0;
    for (std::int32_t rid : graph_.open) open_nodes += next - static_cast<std::size_t>(graph_.region(rid).begin);
    reserve_at_least(graph_.region_sources, graph_.region_sources.size() + max_inputs * open_nodes);
    reserve_at_least(graph_.source_readers, graph_.region_sources.size() + max_inputs * open_nodes);
    // Tiers: at most once per value, one count per depth it is nested at.
    reserve_at_least(graph_.tier_holds,
                     graph_.tier_holds.size() + static_cast<std::size_t>(graph_.open_depth()) * outermost);
  }

  /// When r (not the outermost region) closes: returning a value lowered its level, to 0 if no enclosing
  /// region drops it. An op of r that an enclosing region drops read it while it still had r's level, so
  /// commit() did not hold it, yet that region's replay will read it as a source: hold it now as commit()
  /// would have (capacity: reserve_for_close). Never throws.
  void hold_returned_inputs(const Region& r) noexcept {
    if (r.depth == 1) return;  // no enclosing region
    for (std::int32_t i = r.begin; i < graph_.size(); ++i) {
      const Node<T>& n = graph_[i];
      if (n.is_leaf() || n.level == 0 || n.level >= r.depth) continue;  // replayed by no enclosing region
      for (int k = 0; k < n.arity; ++k)
        if (read_level(graph_, n.inputs[k], i) == 0) lifetime_.hold_pending(n.inputs[k]);
    }
  }

  /// When the outermost region r closes: its values a policy stores as sign may be packed now (Lifetime::packable:
  /// no open region may add a reader that needs more than the sign). Never throws.
  void settle_sign_stored(const Region& r) noexcept {
    if (!graph_.sign_stored) return;
    graph_.sign_stored = false;
    for (std::int32_t i = r.begin; i < graph_.size(); ++i)
      if (graph_[i].stored_format() == StoredFormat::sign) lifetime_.settle(i);
  }

  void finish(Region& r) noexcept {
    graph_.open.pop_back();
    r.open = false;
    r.end = graph_.size();
    r.policy = nullptr;
    r.policy_object = nullptr;
    r.replays = false;
    r.replay_bytes = 0;
    r.sources_begin = r.sources_end = static_cast<std::int32_t>(graph_.region_sources.size());
  }

  /// Holds every value the replay of r reads that it does not compute (capacity reserved). Never throws.
  void hold_sources(Region& r) noexcept {
    if (++stamp_ == 0) ++stamp_;
    r.sources_begin = static_cast<std::int32_t>(graph_.region_sources.size());
    for (std::int32_t m : members_) {
      const Node<T>& n = graph_[m];
      for (int k = 0; k < n.arity; ++k) {
        Node<T>& w = graph_[n.inputs[k]];
        if (read_level(graph_, n.inputs[k], m) >= r.depth || w.mark == stamp_) continue;
        // A chain's own values are held by its schedule's operations, not until the sweep leaves it.
        if (r.plan >= 0 && n.inputs[k] >= r.begin && !w.is_leaf()) continue;
        w.mark = stamp_;
        lifetime_.add_replay_read(n.inputs[k], m);
        graph_.region_sources.push_back(n.inputs[k]);
        graph_.source_readers.push_back(m);
      }
    }
    r.sources_end = static_cast<std::int32_t>(graph_.region_sources.size());
  }

  /// A value computed inside a closed region may be used outside it only if the region returned it.
  void check_not_escaped(const char* op, std::int32_t id) const {
    if (graph_[id].region != -1) check_not_escaped_from_regions(op, id);  // inlined: most values are outside
  }
  void check_not_escaped_from_regions(const char* op, std::int32_t id) const {
    const Node<T>& n = graph_[id];
    for (std::int32_t r = n.region; r != -1 && !graph_.region(r).open; r = graph_.region(r).parent) {
      if (!(n.output_mask & (std::uint64_t{1} << graph_.region(r).depth)))
        throw tape_error(std::string(op) + ": its input (node #" + std::to_string(id) + ", " + graph_.node_name(id) +
                         " " + to_string(n.shape) +
                         ") was computed inside a checkpointed function that did not return it; return every "
                         "value used outside the function from it");
    }
  }

  Graph<T>& graph_;
  Buffers<T>& buffers_;
  Lifetime<T>& lifetime_;
  Evictor<T>& evictor_;
  std::vector<std::int32_t> members_, uses_;   // scratch of close_region
  std::vector<std::uint8_t> computed_inputs_;  // scratch of close_region
  std::uint32_t stamp_ = 0;
};

}  // namespace remat::detail
