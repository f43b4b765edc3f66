// Nesting levels: the level at which a reader reads a value, and whether a pending reader needs it at a
// level. Free functions over the Graph, apart from node.hpp's records because they are the lifetime rule's
// vocabulary (lifetime.hpp, replay_plan.hpp, the sweep and the diagnostics read them), not the records'.
#pragma once

#include <cstdint>

#include "remat/detail/node.hpp"

namespace remat::detail {

/// Residence level of a drop mask: the deepest dropping depth, 0 when no region drops the value.
inline int level_of(std::uint64_t drop_mask) {
  return drop_mask == 0 ? 0 : 63 - __builtin_clzll(drop_mask);
}

/// The depth of node n's innermost region (0 outside every region).
template <class T>
int depth_of(const Graph<T>& graph, const Node<T>& n) {
  return n.region < 0 ? 0 : graph.region(n.region).depth;
}

/// The depth of the deepest region that encloses both node `value` and node `reader` (recorded later, or
/// `value` itself): a region still open encloses every node recorded since it opened. 0 if none.
template <class T>
int common_depth(const Graph<T>& graph, std::int32_t value, std::int32_t reader) {
  for (std::int32_t r = graph[value].region; r >= 0; r = graph.region(r).parent) {
    const Region& g = graph.region(r);
    if (g.open || reader < g.end) return g.depth;
  }
  return 0;
}

/// The level at which a reader whose deepest region enclosing both it and n is at depth c reads n: the deepest
/// of those regions that drops n (a region that returned n encloses no reader outside it; JAX's rule: a
/// checkpointed function's outputs are its values like any other, and a reader outside it sees them as the
/// enclosing function does).
inline int level_at_depth(std::uint64_t drop_mask, int c) {
  return level_of(drop_mask & ((std::uint64_t{2} << c) - 1));
}

/// Where a hold of `reader` on `value` counts: -1 with the value's own holds (backward_reads, replay_reads) at
/// its level, else the common depth c indexing its tiers (a value split by returning, read from outside at a
/// level below its own).
template <class T>
int tier_of(const Graph<T>& graph, std::int32_t value, std::int32_t reader) {
  const Node<T>& n = graph[value];
  if (n.tiers < 0) return -1;
  const int c = common_depth(graph, value, reader);
  return c < depth_of(graph, n) && level_at_depth(n.drop_mask, c) < n.level ? c : -1;
}

/// The level at which `reader` reads `value`.
template <class T>
int read_level(const Graph<T>& graph, std::int32_t value, std::int32_t reader) {
  const Node<T>& n = graph[value];
  if (n.output_mask == 0) return n.level;  // the common case: read only inside its region
  return level_at_depth(n.drop_mask, common_depth(graph, value, reader));
}

/// The holds of n's readers from outside a region that returned it, by common depth c < depth_of(n).
template <class T>
const std::int32_t* tier_counts(const Graph<T>& graph, const Node<T>& n) {
  return &graph.tier_holds[static_cast<std::size_t>(n.tiers)];
}

/// A pending reader needs n at level `level` or below: one of its own, one from outside a region that
/// returned it, or an op that a region not closed yet may replay (pending: level 0).
template <class T>
bool read_at_or_below(const Graph<T>& graph, const Node<T>& n, int level) {
  if (n.pending || (n.backward_reads + n.replay_reads > 0 && n.level <= level)) return true;
  if (n.tiers < 0) return false;
  const std::int32_t* count = tier_counts(graph, n);
  for (int c = 0, depth = depth_of(graph, n); c < depth; ++c)
    if (count[c] > 0 && level_at_depth(n.drop_mask, c) <= level) return true;
  return false;
}

/// A pending reader reads n at exactly `level`: what the replay of n's region at that depth regenerates.
template <class T>
bool read_at_level(const Graph<T>& graph, const Node<T>& n, int level) {
  if (n.backward_reads + n.replay_reads > 0 && n.level == level) return true;
  if (n.tiers < 0) return false;
  const std::int32_t* count = tier_counts(graph, n);
  for (int c = 0, depth = depth_of(graph, n); c < depth; ++c)
    if (count[c] > 0 && level_at_depth(n.drop_mask, c) == level) return true;
  return false;
}

/// Any pending reader, at any level.
template <class T>
bool read_at_all(const Graph<T>& graph, const Node<T>& n) {
  if (n.holds() > 0) return true;
  if (n.tiers < 0) return false;
  const std::int32_t* count = tier_counts(graph, n);
  for (int c = 0, depth = depth_of(graph, n); c < depth; ++c)
    if (count[c] > 0) return true;
  return false;
}

}  // namespace remat::detail
