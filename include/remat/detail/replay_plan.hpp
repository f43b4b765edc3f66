// Which ops a checkpoint region's replay re-runs: JAX's partial evaluation of the region.
//
// The targets of region r (depth d) are its values that a pending reader needs at level d (a backward, or
// the replay of a region nested in r, reading a value of level d; or a reader outside a region nested in r
// that returned the value and dropped it, whose deepest region enclosing both is r or one r drops it in) and
// the extras of its level-d ops whose backward reads them. The replay computes the targets and, walking back from them,
// every input that is not there otherwise (a transient, freed after its last use in the replay). Inputs that are there
// — values of a lower level, leaves, Parameters — are the replay's sources.
//
// The same walk serves twice: when r closes, with "there" meaning "of a level below d" (to learn the
// sources and hold them), and when the sweep enters r, with "there" meaning "currently materialized".
#pragma once

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <vector>

#include "remat/detail/levels.hpp"
#include "remat/detail/node.hpp"

namespace remat::detail {

/// "There" when a region closes, for a member op `reader` of the region: a value read at a level below the
/// region's depth (read_level: its own level, or for a value another region returned and dropped, the level
/// the reader sees it at), and an extra of a level below.
struct PresentBelowLevel {
  int depth;
  template <class T>
  bool value(const Graph<T>& graph, std::int32_t id, std::int32_t reader) const {
    return read_level(graph, id, reader) < depth;
  }
  template <class T>
  bool extra(const Node<T>& n) const {
    return n.level < depth;
  }
};

/// "There" while the sweep runs the replay of a region at `depth`: currently materialized, or evicted under a
/// memory budget (regenerated from its inputs when read, detail/eviction.hpp) — except a value that a region
/// returned and dropped (Node::tiers) and that `reader` reads at the replay's level or deeper, and a value that
/// stayed only because views of it did (Node::view_kept): the replay computes them as JAX's does, though they may
/// still be there for a reader outside (retain_graph, a handle, a kept view), so that what a replay runs does not
/// depend on what another reader kept. (A recomputed value that still has its buffer is written into it: the
/// same bits.)
struct PresentNow {
  int depth;
  template <class T>
  bool value(const Graph<T>& graph, std::int32_t id, std::int32_t reader) const {
    const Node<T>& n = graph[id];
    if (n.tiers >= 0 && read_level(graph, id, reader) >= depth) return false;
    // A packed value is there, decoded when read; stored as sign, only for its own readers (its backward reads), not
    // for a member that computes from it: it is recomputed for that one.
    if (n.packed && n.stored_format() == StoredFormat::sign) return reader == id;
    return (n.value != nullptr && !n.view_kept) || n.evicted || n.packed;
  }
  template <class T>
  bool extra(const Node<T>& n) const {
    return n.extra != nullptr || n.extra_shape.numel() == 0;
  }
};

/// Fills `members` with the nodes r's replay re-runs, in recording order, `uses[i - r.begin]` with how many
/// members read node i as a value it computes (for freeing transients after their last use), and bit k of
/// `computed_inputs[m - r.begin]` for each member m whose input k is such a read (the same value may be
/// there for one reader and computed for another: a value an inner region returned and dropped). `uses` and
/// `computed_inputs` must hold r.end − r.begin zeros. Never throws if `members` has capacity for r.end −
/// r.begin entries.
template <class T, class Present>
void plan_replay(const Graph<T>& graph, const Region& r, const Present& present, std::vector<std::int32_t>& members,
                 std::vector<std::int32_t>& uses, std::vector<std::uint8_t>& computed_inputs) {
  members.clear();
  auto target = [&](std::int32_t i) {
    const Node<T>& n = graph[i];
    return (read_at_level(graph, n, r.depth) && !present.value(graph, i, i)) ||
           (n.level == r.depth && n.extra_read && !present.extra(n));
  };
  for (std::int32_t i = r.end - 1; i >= r.begin; --i) {
    const Node<T>& n = graph[i];
    if (n.is_leaf() || (uses[static_cast<std::size_t>(i - r.begin)] == 0 && !target(i))) continue;
    members.push_back(i);
    for (int k = 0; k < n.arity; ++k) {
      const std::int32_t w = n.inputs[k];
      if (present.value(graph, w, i)) continue;
      assert(w >= r.begin && "a value a replay needs from outside its region is missing");
      ++uses[static_cast<std::size_t>(w - r.begin)];
      computed_inputs[static_cast<std::size_t>(i - r.begin)] |= static_cast<std::uint8_t>(1u << k);
    }
  }
  std::reverse(members.begin(), members.end());
}

}  // namespace remat::detail
