// Which ops a checkpoint region's replay re-runs: JAX's partial evaluation of the region.
//
// The targets of region r (depth d) are its values of residence level d that a pending reader needs (a
// backward, or the replay of a region nested in r) and the extras of its level-d ops whose backward
// reads them. The replay computes the targets and, walking back from them, every input that is not
// there otherwise (a transient, freed after its last use in the replay). Inputs that are there — values
// of a lower level, leaves, Parameters — are the replay's sources.
//
// The same walk serves twice: when r closes, with "there" meaning "of a level below d" (to learn the
// sources and hold them), and when the sweep enters r, with "there" meaning "currently materialized".
#pragma once

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <vector>

#include "remat/detail/node.hpp"

namespace remat::detail {

/// "There" when a region closes: values and extras of a level below the region's depth.
struct PresentBelowLevel {
  int depth;
  template <class T>
  bool value(const Node<T>& n) const {
    return n.level < depth;
  }
  template <class T>
  bool extra(const Node<T>& n) const {
    return n.level < depth;
  }
};

/// "There" while the sweep runs: currently materialized, or evicted under a memory budget (regenerated from
/// its inputs when read, detail/eviction.hpp).
struct PresentNow {
  template <class T>
  bool value(const Node<T>& n) const {
    return n.value != nullptr || n.evicted;
  }
  template <class T>
  bool extra(const Node<T>& n) const {
    return n.extra != nullptr || n.extra_shape.size() == 0;
  }
};

/// Fills `members` with the nodes r's replay re-runs, in recording order, and `uses[i - r.begin]` with
/// how many members read node i (for freeing transients after their last use). `uses` must hold
/// r.end − r.begin zeros. Never throws if `members` has capacity for r.end − r.begin entries.
template <class T, class Present>
void plan_replay(const Graph<T>& graph, const Region& r, const Present& present, std::vector<std::int32_t>& members,
                 std::vector<std::int32_t>& uses) {
  members.clear();
  auto target = [&](const Node<T>& n) {
    return n.level == r.depth && ((n.holds() > 0 && !present.value(n)) || (n.extra_read && !present.extra(n)));
  };
  for (std::int32_t i = r.end - 1; i >= r.begin; --i) {
    const Node<T>& n = graph[i];
    if (n.is_leaf() || (uses[static_cast<std::size_t>(i - r.begin)] == 0 && !target(n))) continue;
    members.push_back(i);
    for (int k = 0; k < n.arity; ++k) {
      const std::int32_t w = n.inputs[k];
      if (present.value(graph[w])) continue;
      assert(w >= r.begin && "a value a replay needs from outside its region is missing");
      ++uses[static_cast<std::size_t>(w - r.begin)];
    }
  }
  std::reverse(members.begin(), members.end());
}

}  // namespace remat::detail
