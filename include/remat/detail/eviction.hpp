// A runtime memory budget by Dynamic Tensor Rematerialization (Kirisame et al., "Dynamic Tensor
// Rematerialization", ICLR 2021): when an allocation would take the tape's live bytes over the budget, evict
// resident op outputs (their buffers go; the lifetime rule still wants them) chosen by a heuristic, and
// regenerate an evicted value when it is read again by re-running its recorded op from its inputs, themselves
// regenerated first if evicted: all the values one read needs, each once, in recording order (regenerate()).
//
// How it sits on the lifetime rule (detail/lifetime.hpp): eviction frees a buffer the rule wants and marks
// the node evicted; an evicted node holds a regeneration read on each input, so what it is regenerated from
// is kept (or is evicted in turn); a running op pins what it reads. Every other free is the rule's.
//
// Determinism: every choice depends only on the tape's state (shapes, FLOP estimates, a logical clock), never on
// time or addresses. An allocation that may need evictions or regenerations first runs as a trial, which throws
// memory_budget_error if the budget cannot be met, and the real run then repeats the trial's choices and cannot
// fail (detail/eviction_budget.hpp).
//
// Nothing here recurses: every walk (a regeneration, what is regenerable, what an eviction makes evicted, a
// neighbourhood, a bound) runs on a work list reserved beforehand (reserve()), so that the stack depth does not
// grow with the tape (a recursive regeneration of an LSTM's chain of evicted values would recurse once per value).
//
// Evictor holds the reads: making values resident (ensure, acquire), running an op into its buffers (compute) and
// regenerating what they need. Its bases hold the budget, its failures and trials (EvictorBudget,
// eviction_budget.hpp), and the choice of victims and their eviction (EvictorChoice, eviction_choice.hpp).
#pragma once

#include <algorithm>
#include <cassert>
#include <cstddef>
#include <cstdint>

#include "remat/detail/buffers.hpp"
#include "remat/detail/eviction_budget.hpp"
#include "remat/detail/lifetime.hpp"
#include "remat/detail/node.hpp"
#include "remat/detail/trace.hpp"
#include "remat/op_context.hpp"

namespace remat::detail {

template <class T>
class Evictor : public EvictorBudget<T> {
 public:
  using EvictorBudget<T>::EvictorBudget;
  using EvictorBudget<T>::active, EvictorBudget<T>::invalidate_bounds, EvictorBudget<T>::make_room;

  /// Whether an op reading `inputs` and allocating `bytes` needs evictions or regenerations.
  /// An evicted input needs regenerating even with no budget now: set_memory_budget(0) leaves what was
  /// evicted evicted, and an op reading it would read no buffer. Without evictions every input is resident.
  bool needs_work(const std::int32_t* inputs, int arity, std::size_t bytes) const {
    for (int k = 0; k < arity; ++k)
      if (!graph_[inputs[k]].value) return true;
    return active() && buffers_.current_live_bytes() + bytes > budget_;
  }

  /// One tick of the logical clock: node `id` is read or written now.
  void touch(std::int32_t id) noexcept {
    lifetime_.note(id);
    graph_[id].last_access = ++clock_;
  }

  /// Makes node `id`'s value resident, regenerating it (and what it needs) if it is evicted; a Parameter
  /// leaf's value is its storage again. Never throws: a modified Parameter read here is noted for trial() to
  /// report (a backward checks them all before its dry run).
  void ensure(std::int32_t id) noexcept {
    Node<T>& n = graph_[id];
    if (n.value) {  // the usual case, inlined: resident
      if (n.parameter) check_current(id);
      touch(id);
      return;
    }
    if (n.packed) {  // kept compressed: decoded for the read (freed again when it settles)
      decode(id, false);
      return;
    }
    acquire(&id, 1);
    lifetime_.unpin(id);
  }

  /// Makes the values of nodes `ids[0 … count)` (count ≤ max_inputs + 1) resident, as ensure() does, all of them in
  /// one regeneration, and pins each (once per entry: the caller unpins each entry). A value kept compressed is
  /// decoded, as its sign alone for an entry k whose bit `1 << k` is set in `sign_only` (Lifetime::unpack); the
  /// packed ones are held while they are decoded, so that the room one decode makes takes no other. Never throws.
  void acquire(const std::int32_t* ids, int count, unsigned sign_only = 0) noexcept {
    int packed = 0;  // the first `packed` entries of `order` are the packed ones
    int order[max_inputs + 1];
    for (int k = 0; k < count; ++k)
      if (!graph_[ids[k]].value && graph_[ids[k]].packed) {
        lifetime_.pin(ids[k]);
        order[packed++] = k;
      }
    for (int p = 0; p < packed; ++p)
      if (!graph_[ids[order[p]]].value) decode(ids[order[p]], (sign_only >> order[p]) & 1u);
    acquire_resident(ids, count);
    for (int p = 0; p < packed; ++p) lifetime_.unpin(ids[order[p]]);
  }

  /// Decodes node `id`'s packed value for a read (Lifetime::unpack), after making room for it. Never throws.
  void decode(std::int32_t id, bool sign_only) noexcept {
    make_room(Buffers<T>::bytes(graph_[id].shape));
    lifetime_.unpack(id, sign_only);
    touch(id);
  }

  /// acquire() once no entry is left packed.
  void acquire_resident(const std::int32_t* ids, int count) noexcept {
    bool resident = true;
    for (int k = 0; k < count && resident; ++k) resident = graph_[ids[k]].value != nullptr;
    if (!resident) {
      regenerate(ids, count);
      return;
    }
    for (int k = 0; k < count; ++k) {
      if (graph_[ids[k]].parameter) check_current(ids[k]);
      touch(ids[k]);
      lifetime_.pin(ids[k]);
    }
  }

  /// Runs op node `u`'s forward into its buffers (allocating the value, extra and temporary it lacks), its
  /// inputs made resident (acquire) and pinned meanwhile: a checkpoint replay's member (`rematerialization`
  /// false) or a regeneration (true, counted in memory()). The kernel is skipped in a trial, a dry run and on a
  /// shapes-only tape. An extra the forward writes that the lifetime rule does not want is freed again at once.
  /// Never throws.
  void compute(std::int32_t u, bool rematerialization) noexcept {
    Node<T>& n = graph_[u];
    acquire(n.inputs, n.arity);
    run(u, rematerialization);
    for (int k = 0; k < n.arity; ++k) lifetime_.unpin(n.inputs[k]);
    lifetime_.settle_extra(u);
  }

 private:
  using Base = EvictorBudget<T>;
  using Base::budget_, Base::buffers_, Base::clock_, Base::graph_, Base::lifetime_, Base::members_, Base::regen_stamp_,
      Base::rematerialized_bytes_, Base::rematerialized_flops_, Base::rematerialized_ops_, Base::stale_,
      Base::work_;  // its state
  using Base::next_stamp;

  /// A Parameter read now: noted for trial() to report if it was modified since it was recorded.
  void check_current(std::int32_t id) noexcept {
    const Node<T>& n = graph_[id];
    if (n.parameter->version != n.parameter_version && stale_ < 0) stale_ = id;
  }

  /// Runs op node `u` into the buffers it lacks, its inputs resident and pinned (by the caller); counts it as a
  /// regeneration if `rematerialization`. Never throws.
  void run(std::int32_t u, bool rematerialization) noexcept {
    Node<T>& n = graph_[u];
    lifetime_.note(u);
    invalidate_bounds();  // u becomes resident: a bound through it no longer holds
    n.view_kept = false;  // computed again
    if (n.is_view()) {    // its input's buffer again: nothing to allocate or compute
      if (!n.value) lifetime_.share_view(u);
      touch(n.inputs[0]);
      if (rematerialization) ++rematerialized_ops_;
      touch(u);
      lifetime_.mark_resident(u);
      return;
    }
    std::size_t need = Buffers<T>::bytes(n.scratch_shape);
    if (!n.value) need += Buffers<T>::bytes(n.shape);
    if (n.extra_shape.numel() > 0 && !n.extra) need += Buffers<T>::bytes(n.extra_shape);
    make_room(need);
    const std::size_t written = (n.value ? 0 : Buffers<T>::bytes(n.shape)) +
                                (n.extra_shape.numel() > 0 && !n.extra ? Buffers<T>::bytes(n.extra_shape) : 0);
    if (!n.value) n.value = buffers_.allocate(n.shape);
    if (n.extra_shape.numel() > 0 && !n.extra) n.extra = buffers_.allocate(n.extra_shape);
    if (n.scratch_shape.numel() > 0) n.scratch = buffers_.allocate(n.scratch_shape);
    for (int k = 0; k < n.arity; ++k) touch(n.inputs[k]);
    if (graph_.budget_on) graph_.budget_of(u).decoded = decoded_inputs(n);
    if (!buffers_.simulating() && !buffers_.shapes_only()) {
      if (graph_.trace) graph_.trace->log_forward(graph_, u, false);
      n.op->forward(ForwardContext<T>{graph_, n, false});  // a replay or a regeneration, never the record
    }
    buffers_.free(n.scratch, n.scratch_shape);
    if (rematerialization) {
      ++rematerialized_ops_;
      rematerialized_bytes_ += written;
      rematerialized_flops_ += n.cost - op_overhead_flops;  // its FLOP estimate (Node::cost)
    }
    touch(u);
    lifetime_.mark_resident(u);
  }

  /// Which of n's inputs it reads decoded from a packed buffer (bit k: input k), for
  /// EvictorChoice::inputs_regenerable: only a budget asks.
  std::uint8_t decoded_inputs(const Node<T>& n) const noexcept {
    std::uint8_t decoded = 0;
    for (int k = 0; k < n.arity; ++k)
      if (graph_[n.inputs[k]].packed) decoded |= static_cast<std::uint8_t>(1u << k);
    return decoded;
  }

  /// The regeneration of `ids[0 … count)` (acquire): the absent values they need (evicted, or freed since a
  /// replay's plan counted them as there), found by walking back from them through absent inputs (its members),
  /// run once each in recording order, which is topological. The resident inputs of members (the regeneration's
  /// boundary) are pinned from the start until the last member that reads them has run, and each member from its
  /// run until its last reader in the regeneration has run: no eviction it makes can take a value it will still
  /// read, so no value is regenerated twice in it and it never regenerates inside itself. (Regenerating each input
  /// when its reader ran, recursively, recursed once per evicted value of a chain, and could evict what a pending
  /// reader further up still needed: an LSTM of 48 timesteps under 35 % of its peak ran for minutes.) Its stack
  /// depth does not grow with the tape; its work lists are reserved (reserve()). Never throws.
  void regenerate(const std::int32_t* ids, int count) noexcept {
    assert(graph_.budget_on && "only a budget's evictions leave a value to regenerate (reserve() came first)");
    const std::uint32_t stamp = next_stamp(regen_stamp_, &BudgetFields::regen_mark);
    members_.clear();
    work_.clear();
    auto visit = [&](std::int32_t v) {
      Node<T>& m = graph_[v];
      if (m.parameter) {  // a Parameter's value is its storage
        if (m.parameter->version != m.parameter_version && stale_ < 0) stale_ = v;
        if (!m.value) {
          lifetime_.note(v);
          m.value = m.parameter->value.data();
        }
        return;
      }
      BudgetFields& b = graph_.budget_of(v);
      if (m.value || m.packed || b.regen_mark == stamp) return;  // resident, or decoded once pinned (below)
      // Evicted, or freed since a replay planned to read it (an evicted value whose last holder was regenerated
      // in the meantime stops being evicted): computed all the same, from its inputs.
      assert(!m.is_leaf() && "a leaf's value is needed after it was freed");
      b.regen_mark = stamp;
      b.regen_uses = 0;
      members_.push_back(v);  // within capacity (reserve): each node once
      work_.push_back(v);
    };
    for (int k = 0; k < count; ++k) visit(ids[k]);
    while (!work_.empty()) {
      const std::int32_t v = work_.back();
      work_.pop_back();
      const Node<T>& m = graph_[v];
      for (int k = 0; k < m.arity; ++k) visit(m.inputs[k]);
    }
    std::sort(members_.begin(), members_.end());
    auto member = [&](std::int32_t v) { return graph_.budget_of(v).regen_mark == stamp; };
    for (std::int32_t u : members_) {
      const Node<T>& m = graph_[u];
      for (int k = 0; k < m.arity; ++k)
        if (member(m.inputs[k])) ++graph_.budget_of(m.inputs[k]).regen_uses;
    }
    for (int k = 0; k < count; ++k) {
      if (member(ids[k])) {
        ++graph_.budget_of(ids[k]).regen_uses;  // held until the end, for the caller
      } else {
        touch(ids[k]);
        lifetime_.pin(ids[k]);
      }
    }
    for (std::int32_t u : members_) {
      const Node<T>& m = graph_[u];
      for (int k = 0; k < m.arity; ++k)
        if (!member(m.inputs[k])) lifetime_.pin(m.inputs[k]);
    }
    for (std::int32_t u : members_) {  // a boundary value kept compressed is decoded, held already (acquire)
      const Node<T>& m = graph_[u];
      for (int k = 0; k < m.arity; ++k)
        if (!graph_[m.inputs[k]].value && graph_[m.inputs[k]].packed) decode(m.inputs[k], false);
    }
    for (std::int32_t u : members_) {
      run(u, true);
      const Node<T>& m = graph_[u];
      for (int k = 0; k < m.arity; ++k) {
        const std::int32_t w = m.inputs[k];
        if (!member(w))
          lifetime_.unpin(w);
        else if (--graph_.budget_of(w).regen_uses == 0)
          lifetime_.unpin(w);
      }
      lifetime_.pin(u);  // every member has a reader left: a member or the caller
    }
    for (int k = 0; k < count; ++k) {
      if (!member(ids[k])) continue;
      lifetime_.pin(ids[k]);
      if (--graph_.budget_of(ids[k]).regen_uses == 0) lifetime_.unpin(ids[k]);
    }
  }
};

}  // namespace remat::detail
