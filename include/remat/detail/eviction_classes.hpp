// The equivalence classes of h_DTR^eq (Kirisame et al., "Dynamic Tensor Rematerialization", ICLR 2021, §4):
// a union-find over evicted values in which adjacent evicted values (one an input of the other's op) share
// a class whose cost is the summed regeneration cost of its members evicted now. The class of an evicted
// neighbour stands for the paper's evicted neighbourhood e*(t) without walking it. As in the paper, a class
// is never split: a member that is regenerated only takes its cost out of it. h_DTR uses the same classes made
// exact again, the connected components of the evicted values, once a value has stopped being evicted
// (make_classes_exact).
//
// Union by size without path compression, so that a trial (the dry run of an allocation, detail/eviction_budget.hpp)
// is undone by restoring the fields it changed: compression would rewrite parents a restore cannot know of. Each
// function calls note(id) before it changes node `id` (Lifetime::note: a trial's journal).
#pragma once

#include <cstdint>
#include <vector>

#include "remat/detail/node.hpp"

namespace remat::detail {

template <class T>
std::int32_t class_root(const Graph<T>& graph, std::int32_t id) {
  while (graph.budget_of(id).class_parent >= 0) id = graph.budget_of(id).class_parent;
  return id;
}

/// Merges the classes of `a` and `b`; the larger class's root (the smaller id on a tie) stays the root.
template <class T, class Note>
void join_classes(Graph<T>& graph, std::int32_t a, std::int32_t b, Note&& note) noexcept {
  a = class_root(graph, a);
  b = class_root(graph, b);
  if (a == b) return;
  note(a);
  note(b);
  BudgetFields &na = graph.budget_of(a), &nb = graph.budget_of(b);
  const bool a_stays = na.class_size != nb.class_size ? na.class_size > nb.class_size : a < b;
  BudgetFields& root = a_stays ? na : nb;
  BudgetFields& child = a_stays ? nb : na;
  child.class_parent = a_stays ? a : b;
  root.class_size += child.class_size;
  root.class_cost += child.class_cost;
  child.class_cost = 0;
}

/// Node `id` was evicted: its cost joins its class, which merges with the class of every evicted neighbour.
template <class T, class Note>
void enter_class(Graph<T>& graph, std::int32_t id, Note&& note) noexcept {
  const std::int32_t root = class_root(graph, id);
  note(root);
  graph.budget_of(root).class_cost += graph[id].cost;
  const Node<T>& n = graph[id];
  for (int k = 0; k < n.arity; ++k)
    if (graph[n.inputs[k]].evicted) join_classes(graph, id, n.inputs[k], note);
  for (std::int32_t e = n.first_use; e >= 0; e = graph[e / max_inputs].next_use[e % max_inputs])
    if (graph[e / max_inputs].evicted) join_classes(graph, id, e / max_inputs, note);
}

/// Node `id` is no longer evicted (regenerated, or no longer wanted): its cost leaves its class.
template <class T, class Note>
void leave_class(Graph<T>& graph, std::int32_t id, Note&& note) noexcept {
  const std::int32_t root = class_root(graph, id);
  note(root);
  graph.budget_of(root).class_cost -= graph[id].cost;
}

/// Makes the union-find classes the exact connected components of the evicted values (through inputs and
/// consumers), each with its members' summed cost: h_DTR's evicted neighbourhoods. Evictions only merge
/// components, which the classes follow as they are (enter_class); a value that stops being evicted may split
/// one, so h_DTR rebuilds them at its next scan after that (h_DTR^eq never does: the paper's approximation).
/// Each component becomes a star (every member's parent is its lowest member), labelled by a walk on a work
/// list (`stack`, with room for every node). Costs are whole numbers, so a sum does not depend on the order it was
/// taken in. O(nodes). Never throws.
template <class T, class Note>
void make_classes_exact(Graph<T>& graph, std::vector<std::int32_t>& stack, Note&& note) noexcept {
  for (std::int32_t i = 0; i < graph.size(); ++i) {
    BudgetFields& b = graph.budget_of(i);
    if (b.class_parent == -1 && b.class_size == 1 && b.class_cost == 0) continue;
    note(i);
    b.class_parent = -1;
    b.class_size = 1;
    b.class_cost = 0;
  }
  // A member is marked by its parent (or, for the root, its size) as soon as it is reached.
  for (std::int32_t root = 0; root < graph.size(); ++root) {
    BudgetFields& r = graph.budget_of(root);
    if (!graph[root].evicted || r.class_parent != -1 || r.class_cost != 0) continue;
    note(root);
    double cost = 0;
    std::int32_t size = 0;
    stack.clear();
    stack.push_back(root);
    r.class_cost = 1;  // reached (set below)
    auto reach = [&](std::int32_t w) {
      if (!graph[w].evicted || w == root || graph.budget_of(w).class_parent != -1) return;
      note(w);
      graph.budget_of(w).class_parent = root;
      stack.push_back(w);  // within capacity: each node once
    };
    while (!stack.empty()) {
      const Node<T>& m = graph[stack.back()];
      stack.pop_back();
      cost += m.cost;
      ++size;
      for (int k = 0; k < m.arity; ++k) reach(m.inputs[k]);
      for (std::int32_t e = m.first_use; e >= 0; e = graph[e / max_inputs].next_use[e % max_inputs])
        reach(e / max_inputs);
    }
    r.class_cost = cost;
    r.class_size = size;
  }
}

}  // namespace remat::detail
