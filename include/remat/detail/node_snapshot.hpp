// What a memory budget's trial or a backward's dry run puts back when it is undone: every field of a node that a
// sweep, a regeneration or an eviction changes, and the budget's class fields (detail/lifetime_rule.hpp journals them).
#pragma once

#include <cstdint>

#include "remat/detail/node.hpp"

namespace remat::detail {

/// Every field of a node that a sweep, a regeneration or an eviction changes: what a dry run or a trial
/// puts back.
template <class T>
struct NodeSnapshot {
  T *value, *extra, *grad, *packed;
  std::int32_t backward_reads, replay_reads, pins, regen_reads, schedule_holds, view_holds;
  bool grad_assigned, extra_read, evicted, view_kept;
  std::uint64_t last_access;

  static NodeSnapshot of(const Node<T>& n) {
    return {n.value,         n.extra,      n.grad,        n.packed,         n.backward_reads,
            n.replay_reads,  n.pins,       n.regen_reads, n.schedule_holds, n.view_holds,
            n.grad_assigned, n.extra_read, n.evicted,     n.view_kept,      n.last_access};
  }
  void restore(Node<T>& n) const {
    n.value = value;
    n.extra = extra;
    n.grad = grad;
    n.packed = packed;
    n.backward_reads = backward_reads;
    n.replay_reads = replay_reads;
    n.pins = pins;
    n.regen_reads = regen_reads;
    n.schedule_holds = schedule_holds;
    n.view_holds = view_holds;
    n.grad_assigned = grad_assigned;
    n.extra_read = extra_read;
    n.evicted = evicted;
    n.view_kept = view_kept;
    n.last_access = last_access;
  }
};

/// The fields of a node's budget state (BudgetFields) that a trial or a dry run changes and puts back: its
/// class (the others are scratch of stamps, or bounds that Evictor::restore invalidates).
struct BudgetSnapshot {
  std::int32_t class_parent, class_size;
  double class_cost;
  std::uint8_t decoded;

  static BudgetSnapshot of(const BudgetFields& b) { return {b.class_parent, b.class_size, b.class_cost, b.decoded}; }
  void restore(BudgetFields& b) const {
    b.decoded = decoded;
    b.class_parent = class_parent;
    b.class_size = class_size;
    b.class_cost = class_cost;
  }
};

}  // namespace remat::detail
