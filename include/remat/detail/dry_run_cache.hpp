// The dry-run cache, the sweep layer that lets a backward skip its dry run when it would only learn what
// the last one learned. Apart from the pass because it changes no result: only whether the dry run runs.
//
// Skipping the dry run. A training loop runs the same backward on the same graph every step, and the dry
// run then learns what the last one learned. Without a budget, what the sweep allocates and frees is a
// function of the graph and of its nodes' state alone (which values, extras and gradients are there, the
// lifetime counters, the regions, which gradients are wanted and kept, the Parameters' gradients), never
// of the pool: prepare() writes all of that as a signature, and when it equals the one of the last dry
// run and the pool already holds what that dry run found the sweep needs of it (Buffers::Demand), the
// dry run would reserve nothing and predict the peak its sequence's rise gives: the sweep skips it. The
// real pass then still never reaches the system allocator. With assertions on, the dry run runs anyway
// and must find what the skip assumed, so every test checks the signature is complete.
#pragma once

#include <cassert>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "remat/detail/chain_schedule.hpp"

namespace remat::detail {

template <class T>
class DryRunCache : public ChainSchedule<T> {
 public:
  using ChainSchedule<T>::ChainSchedule;

  /// Backwards whose dry run was skipped as redundant (tests).
  std::size_t dry_runs_skipped() const { return dry_runs_skipped_; }

 protected:
  using ChainSchedule<T>::buffers_, ChainSchedule<T>::evictor_;  // SweepState

  // ---- the signature of a sweep (see the top of this file; written by Sweep::prepare) ----
  static constexpr std::size_t signature_header = 4, signature_words = 7;
  // sign_node copies runs of adjacent fields as bytes (W0 signs 261 nodes a step: each instruction here is
  // one in a thousandth of its bookkeeping). Exact: no padding inside these runs.
  static_assert(std::is_standard_layout_v<Node<T>>);
  static_assert(offsetof(Node<T>, inputs) + 2 * sizeof(std::int32_t) == offsetof(Node<T>, inputs[2]));
  static_assert(offsetof(Node<T>, is_variable) == offsetof(Node<T>, arity) + 1 &&
                offsetof(Node<T>, requires_grad) == offsetof(Node<T>, arity) + 2 &&
                offsetof(Node<T>, reads) == offsetof(Node<T>, arity) + 3);
  static_assert(offsetof(Node<T>, replay_reads) == offsetof(Node<T>, backward_reads) + 4);
  static_assert(offsetof(Node<T>, extra_read) == offsetof(Node<T>, pending) + 1);

  /// Writes node i's signature_words: every field of the node, of its Parameter and of wanted/keep that
  /// the sweep's allocations and frees depend on (not those only its kernels read: values, grad_assigned,
  /// the evictor's clock and costs, which matter only under a budget). A node's view holds follow from which of
  /// its views have a value (signed with them); whether it stayed only for them (view_kept) does not. False if the node
  /// cannot be signed so (then the signature is not used).
  bool sign_node(const Node<T>& n, std::uint8_t wanted_bit, std::uint8_t keep_bit, std::uint64_t* sig) const {
    const auto extra = static_cast<std::uint64_t>(n.extra_shape.numel());
    const auto scratch = static_cast<std::uint64_t>(n.scratch_shape.numel());
    std::uint32_t input2, kind;  // input 2; arity, is_variable, requires_grad, reads
    std::memcpy(&input2, &n.inputs[2], sizeof input2);
    std::memcpy(&kind, &n.arity, sizeof kind);
    std::uint16_t holds;  // pending, extra_read
    std::memcpy(&holds, &n.pending, sizeof holds);
    std::uint64_t state = std::uint64_t(static_cast<std::uint8_t>(n.level)) | std::uint64_t(holds) << 8 |
                          std::uint64_t(n.value != nullptr) << 24 | std::uint64_t(n.extra != nullptr) << 25 |
                          std::uint64_t(n.grad != nullptr) << 26 | std::uint64_t(n.evicted) << 27 |
                          std::uint64_t(n.handles > 0) << 28 | std::uint64_t(wanted_bit != 0) << 29 |
                          std::uint64_t(keep_bit != 0) << 30 | std::uint64_t(n.view_kept) << 34 |
                          std::uint64_t(n.packed != nullptr) << 35 | std::uint64_t(n.stored) << 36;
    const void* identity = n.op;
    if (const ParameterStorage<T>* p = n.parameter.get()) {
      // What add_to_parameter does with a leaf's gradient: add to the Parameter's, or hand it over with
      // or without the Parameter's previous buffer in exchange; and which leaves share a Parameter (the
      // first the sweep reaches hands over, the others add).
      state |= std::uint64_t(1) << 31 | std::uint64_t(p->grad_defined) << 32 |
               std::uint64_t(p->grad != nullptr && p->grad_size == n.shape.numel()) << 33;
      identity = p;
    }
    sig[0] = static_cast<std::uint64_t>(n.shape.numel());
    sig[1] = extra | scratch << 32;
    std::memcpy(&sig[2], &n.inputs[0], 2 * sizeof(std::int32_t));
    sig[3] = input2 | std::uint64_t(kind) << 32;
    std::memcpy(&sig[4], &n.backward_reads, 2 * sizeof(std::int32_t));  // and replay_reads
    sig[5] = state;
    sig[6] = reinterpret_cast<std::uintptr_t>(identity);
    // Pins and regeneration reads are those of a memory budget's evictions (none outside a sweep without
    // evicted values): such a sweep is not signed.
    return (extra | scratch) >> 32 == 0 && (n.pins | n.regen_reads) == 0;
  }

  /// Sizes signature_ for this sweep (and the cache for remember_dry_run(), which cannot throw) and writes its
  /// header: the loss, the mode and the graph's sizes. Returns where prepare() writes the nodes'
  /// (signature_words each, sign_node), then end_signature() the regions'. Throws std::bad_alloc.
  std::uint64_t* begin_signature(std::int32_t loss, SweepMode mode) {
    const Graph<T>& g = this->graph_;
    const std::size_t words = signature_header + signature_words * g.nodes.size() + 3 * g.regions.size() +
                              g.region_sources.size() + g.tier_holds.size();
    signature_.resize(words);
    if (cached_signature_.capacity() < words) cached_signature_.reserve(words);
    std::uint64_t* sig = signature_.data();
    *sig++ = static_cast<std::uint32_t>(loss) | std::uint64_t(mode.retain_graph) << 32 |
             std::uint64_t(mode.accumulate) << 33;
    *sig++ = g.nodes.size();
    *sig++ = g.regions.size();
    *sig++ = g.region_sources.size();
    return sig;
  }
  /// Writes the regions, their replay sources and the tier holds after the nodes' words ending at `sig`. Never
  /// throws.
  void end_signature(std::uint64_t* sig) noexcept {
    const Graph<T>& g = this->graph_;
    for (const Region& r : g.regions) {
      *sig++ = static_cast<std::uint32_t>(r.begin) | std::uint64_t(static_cast<std::uint32_t>(r.end)) << 32;
      *sig++ = static_cast<std::uint32_t>(r.depth) | std::uint64_t(r.replays) << 32;
      *sig++ = static_cast<std::uint32_t>(r.sources_begin) | std::uint64_t(static_cast<std::uint32_t>(r.sources_end))
                                                                 << 32;
    }
    for (std::int32_t source : g.region_sources) *sig++ = static_cast<std::uint32_t>(source);
    for (std::int32_t held : g.tier_holds) *sig++ = static_cast<std::uint32_t>(held);
    assert(sig == signature_.data() + signature_.size());
  }

  /// Whether this sweep's dry run would find what the last one found, and the pool holds all of it.
  bool dry_run_redundant() const {
    if (!cache_valid_ || !signable_ || evictor_.active()) return false;
    if (signature_.size() != cached_signature_.size() ||
        std::memcmp(signature_.data(), cached_signature_.data(), signature_.size() * sizeof(std::uint64_t)) != 0)
      return false;
    for (const typename Buffers<T>::Demand& d : cached_demand_)
      if (!buffers_.covers(d)) return false;
    return true;
  }

  /// After a dry run: what it found, for dry_run_redundant() (not under a budget: that dry run also
  /// evicts). Never throws: prepare() reserved room for all of it.
  void remember_dry_run() noexcept {
    cache_valid_ = false;
    if (evictor_.active() || !signable_) return;
    cached_demand_.clear();
    buffers_.for_each_simulated_demand([&](const typename Buffers<T>::Demand& d) { cached_demand_.push_back(d); });
    cached_rise_ = buffers_.simulated_rise();
    cached_signature_.assign(signature_.begin(), signature_.end());  // within capacity
    cache_valid_ = true;
  }

  std::vector<std::uint64_t> signature_, cached_signature_;          // this sweep's; the last remembered dry run's
  std::vector<typename Buffers<T>::Demand> cached_demand_;           // what that dry run needed of the pool
  std::size_t cached_rise_ = 0;                                      // and how far it raised live bytes
  bool cache_valid_ = false, signable_ = false, redundant_ = false;  // redundant_: this run's, from prepare()
  std::size_t dry_runs_skipped_ = 0;
};

}  // namespace remat::detail
