// The backward sweep: one reverse pass over the nodes, replaying each checkpoint region as the sweep
// enters it and releasing what it read as it goes.
//
// Strong exception safety: before changing anything, the sweep runs once as a dry run (same code, kernels
// skipped, buffers only counted) to learn how many buffers of each size it will need, and makes the pool
// hold them. The real pass then never reaches the system allocator and cannot throw, so a std::bad_alloc
// from a backward leaves the tape exactly as it was. Under a memory budget the dry run also makes every
// eviction and regeneration the real pass will make (detail/eviction.hpp: the same calls, deterministic),
// so a budget the backward cannot meet throws memory_budget_error from it, before anything changed.
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

#include <algorithm>
#include <atomic>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <type_traits>
#include <utility>
#include <vector>

#include "remat/detail/buffers.hpp"
#include "remat/detail/contexts.hpp"
#include "remat/detail/eviction.hpp"
#include "remat/detail/levels.hpp"
#include "remat/detail/lifetime.hpp"
#include "remat/detail/node.hpp"
#include "remat/detail/non_finite.hpp"
#include "remat/detail/replay_plan.hpp"
#include "remat/detail/trace.hpp"
#include "remat/errors.hpp"

namespace remat::detail {

/// How a sweep treats what it computes.
struct SweepMode {
  bool retain_graph = false;  ///< keep every residual and hold, so another backward can run
  bool accumulate = true;     ///< add into variables' gradients (backward); false for gradient()
};

/// The gradient-ready callbacks of a tape (Tape::on_gradient_ready), by key, in registration order.
template <class T>
using GradientReadyCallbacks = std::vector<std::pair<std::size_t, std::function<void(Parameter<T>&)>>>;

template <class T>
class Sweep {
 public:
  Sweep(Graph<T>& graph, Buffers<T>& buffers, Lifetime<T>& lifetime, Evictor<T>& evictor)
      : graph_(graph), buffers_(buffers), lifetime_(lifetime), evictor_(evictor) {}

  /// Per node, filled by the caller before run(): wanted = its gradient is asked for (a gradient flows
  /// into it); keep = its gradient outlives the sweep (gradient() targets; tape variables in backward()).
  std::vector<std::uint8_t> wanted, keep;

  /// Called, in a backward (mode.accumulate), once for each Parameter whose gradient this sweep added to,
  /// when the gradients of all its leaves have been delivered (every contribution is in). Null or
  /// empty: none. Set by the tape.
  const GradientReadyCallbacks<T>* ready_callbacks = nullptr;

  /// Sweeps from `loss`. Throws std::bad_alloc (or shape_error for a Parameter gradient of the wrong size)
  /// before changing anything; cannot fail once it starts changing the tape. A gradient-ready callback that
  /// throws does not stop the sweep: the first such exception is kept (later callbacks are not called) and
  /// callback_error() returns it once the sweep has completed. On a shapes-only tape the sweep is the dry
  /// run's pass, counted in the tape's own figures and kept (no callback is called). Under a memory budget
  /// that the sweep cannot meet, throws memory_budget_error naming `what` from the dry run, before any change.
  void run(std::int32_t loss, SweepMode mode, const char* what = "backward") {
    prepare(loss, mode);
    if (buffers_.shapes_only()) {
      if (evictor_.active()) {
        simulate(loss, mode);
        if (evictor_.failed()) {
          evictor_.forget_choices();
          evictor_.throw_failure(what);
        }
        evictor_.repeat_choices();
      }
      count_only(loss, mode);
      evictor_.forget_choices();
      return;
    }
    if (redundant_) {
      ++dry_runs_skipped_;
      predicted_peak_ = buffers_.peak_after_rise(cached_rise_);
      evictor_.clear_failure();
      check_skip(loss, mode);
      pass(loss, mode);
      return;
    }
    simulate(loss, mode);
    if (evictor_.failed()) {
      evictor_.forget_choices();
      evictor_.throw_failure(what);
    }
    remember_dry_run();
    try {
      buffers_.reserve_simulated();
    } catch (...) {
      evictor_.forget_choices();
      throw;
    }
    evictor_.repeat_choices();  // the real pass makes the dry run's choices
    pass(loss, mode);
    evictor_.forget_choices();
    assert(!evictor_.failed() && "the real pass met the budget its dry run met");
  }

  /// Backwards whose dry run was skipped as redundant (tests).
  std::size_t dry_runs_skipped() const { return dry_runs_skipped_; }

  /// The exception the first throwing gradient-ready callback of the last run threw (null if none); clears it.
  std::exception_ptr take_callback_error() noexcept { return std::exchange(callback_error_, nullptr); }
  /// The anomaly_error for the first non-finite gradient the last run found (anomaly detection), or null;
  /// clears it.
  std::exception_ptr take_anomaly() noexcept { return std::exchange(anomaly_, nullptr); }
  /// Of the anomaly and the callback's exception (a stale_value_error included), the one raised first in the
  /// last run, or null; clears both.
  std::exception_ptr take_first_error() noexcept {
    std::exception_ptr anomaly = take_anomaly(), callback = take_callback_error();
    return anomaly && (anomaly_first_ || !callback) ? anomaly : callback;
  }
  /// True while the real pass runs (a gradient-ready callback is being called from inside it).
  bool running() const { return running_; }

  /// After a run with mode.accumulate == false: frees the kept gradients and puts back the variables'
  /// accumulated gradients set aside for it. Never throws.
  void finish_gradient() noexcept {
    for (std::int32_t i = 0; i < graph_.size(); ++i)
      if (keep[static_cast<std::size_t>(i)]) free_grad(graph_[i]);
    for (const Stashed& s : stash_) {
      Node<T>& n = graph_[s.id];
      n.grad = s.grad;
      n.grad_assigned = s.assigned;
    }
    stash_.clear();
  }

  std::size_t replayed_bytes() const { return replayed_bytes_; }
  std::size_t replayed_ops() const { return replayed_ops_; }
  double replayed_flops() const { return replayed_flops_; }
  /// The peak live bytes the last run's dry run predicted (equal to what the real pass reached).
  std::size_t predicted_peak_bytes() const { return predicted_peak_; }

 private:
  struct Stashed {
    std::int32_t id;
    T* grad;
    bool assigned;
  };

  /// Everything that may allocate or throw, before the tape changes; and the signature.
  void prepare(std::int32_t loss, SweepMode mode) {
    const auto count = static_cast<std::size_t>(graph_.size());
    entering_.clear();
    leaving_.clear();
    entering_.reserve(graph_.regions.size());
    leaving_.reserve(graph_.regions.size());
    std::size_t longest = 0, variables = 0;
    for (std::int32_t r = 0; r < static_cast<std::int32_t>(graph_.regions.size()); ++r) {
      const Region& region = graph_.region(r);
      if (region.end <= region.begin) continue;
      entering_.push_back(r);
      leaving_.push_back(r);
      longest = std::max(longest, static_cast<std::size_t>(region.end - region.begin));
    }
    std::sort(entering_.begin(), entering_.end(), [&](std::int32_t a, std::int32_t b) {
      const Region &ra = graph_.region(a), &rb = graph_.region(b);
      return ra.end != rb.end ? ra.end > rb.end : ra.depth < rb.depth;
    });
    std::sort(leaving_.begin(), leaving_.end(), [&](std::int32_t a, std::int32_t b) {
      const Region &ra = graph_.region(a), &rb = graph_.region(b);
      return ra.begin != rb.begin ? ra.begin > rb.begin : ra.depth > rb.depth;
    });
    members_.reserve(longest);
    uses_.reserve(longest);
    computed_inputs_.reserve(longest);
    std::size_t chain = 0;
    for (const ChainPlan& plan : graph_.chain_plans) chain = std::max(chain, plan.held.size());
    chain_held_.reserve(chain);
    chain_tape_.reserve(chain);
    snapshot_.resize(count);
    tier_snapshot_.reserve(graph_.tier_holds.size());  // simulate() cannot throw
    const std::size_t words = signature_header + signature_words * count + 3 * graph_.regions.size() +
                              graph_.region_sources.size() + graph_.tier_holds.size();
    signature_.resize(words);
    if (cached_signature_.capacity() < words) cached_signature_.reserve(words);  // remember_dry_run cannot throw
    std::uint64_t* sig = signature_.data();
    bool signable = true;
    *sig++ = static_cast<std::uint32_t>(loss) | std::uint64_t(mode.retain_graph) << 32 |
             std::uint64_t(mode.accumulate) << 33;
    *sig++ = count;
    *sig++ = graph_.regions.size();
    *sig++ = graph_.region_sources.size();
    const std::uint8_t *wanted_bits = wanted.data(), *keep_bits = keep.data();
    bool evicted = false;
    for (std::int32_t i = 0; i < graph_.size(); ++i) {
      const Node<T>& n = graph_[i];
      if (n.is_variable) ++variables;
      evicted = evicted || n.evicted;
      if (n.parameter && n.parameter->grad_defined && n.parameter->grad_size != n.shape.numel())
        throw shape_error("backward: the gradient of the Parameter recorded as node #" + std::to_string(i) + " has " +
                          std::to_string(n.parameter->grad_size) + " elements but its value is " + to_string(n.shape) +
                          "; call zero_grad() after resizing a parameter");
      signable = sign_node(n, wanted_bits[i], keep_bits[i], sig) && signable;
      sig += signature_words;
    }
    for (const Region& r : graph_.regions) {
      *sig++ = static_cast<std::uint32_t>(r.begin) | std::uint64_t(static_cast<std::uint32_t>(r.end)) << 32;
      *sig++ = static_cast<std::uint32_t>(r.depth) | std::uint64_t(r.replays) << 32;
      *sig++ = static_cast<std::uint32_t>(r.sources_begin) | std::uint64_t(static_cast<std::uint32_t>(r.sources_end))
                                                                 << 32;
    }
    for (std::int32_t source : graph_.region_sources) *sig++ = static_cast<std::uint32_t>(source);
    for (std::int32_t held : graph_.tier_holds) *sig++ = static_cast<std::uint32_t>(held);
    assert(sig == signature_.data() + words);
    // The budget's work lists and side table (Graph::budget): for its evictions, for regenerating what it evicted
    // even once it is lifted, and for a chain's schedule, which regenerates an input outside a layer it freed
    // (recompute_layer) with or without a budget.
    if (evictor_.active() || evicted || !graph_.chain_plans.empty()) evictor_.reserve(count);
    budget_snapshot_.resize(graph_.budget.size());  // the side table's classes, if it has started (simulate)
    for (const Region& r : graph_.regions) signable = signable && r.plan < 0;  // a chain's schedule: not signed
    signable_ = signable;
    redundant_ = dry_run_redundant();
    // A redundant dry run's sizes are those of the dry run it repeats, already prepared (and the safety
    // net's dry run, check_skip, finds them there).
    if (!redundant_)
      for (const Node<T>& n : graph_.nodes) {
        buffers_.prepare_simulation(static_cast<std::size_t>(n.shape.numel()));
        if (n.extra_shape.numel() > 0) buffers_.prepare_simulation(static_cast<std::size_t>(n.extra_shape.numel()));
        if (n.scratch_shape.numel() > 0) buffers_.prepare_simulation(static_cast<std::size_t>(n.scratch_shape.numel()));
      }
    if (cached_demand_.capacity() < buffers_.simulated_sizes())  // remember_dry_run cannot throw
      cached_demand_.reserve(2 * buffers_.simulated_sizes());
    stash_.reserve(variables);
    prepare_deliveries(loss, mode);
    prepare_ready_callbacks(mode);
  }

  /// delivered_by_[w] for a Parameter's leaf w in a backward (mode.accumulate): the op whose backward completes
  /// w's gradient — the earliest op that reads w and receives a gradient (it is the last such op the reverse
  /// sweep reaches; every replay or regeneration re-running one of them comes before it too). The sweep
  /// delivers the gradient to the Parameter right after that op's backward, as PyTorch's AccumulateGrad does,
  /// instead of holding it on the tape until the sweep reaches the leaf: so where a Parameter is recorded (all
  /// before the forward pass, or each where it is used) does not change the peak. -1 for every other node.
  /// Ops that read w but receive no gradient (after the loss, in a branch the loss does not depend on, a
  /// schedule's probe) contribute nothing and do not delay it. Allocates only when the tape grew.
  void prepare_deliveries(std::int32_t loss, SweepMode mode) {
    const auto count = static_cast<std::size_t>(graph_.size());
    delivered_by_.assign(count, -1);
    if (!mode.accumulate) return;
    receives_.assign(count, 0);
    receives_[static_cast<std::size_t>(loss)] = 1;
    for (std::int32_t i = loss; i >= 0; --i) {
      const Node<T>& n = graph_[i];
      if (!receives_[static_cast<std::size_t>(i)] || n.is_leaf() || !wanted[static_cast<std::size_t>(i)]) continue;
      for (int k = 0; k < n.arity; ++k) {
        const auto w = static_cast<std::size_t>(n.inputs[k]);
        if (!wanted[w]) continue;
        receives_[w] = 1;
        if (graph_[n.inputs[k]].parameter) delivered_by_[w] = i;  // the last write is the earliest op
      }
    }
  }

  // ---- the signature of a sweep (see the top of this file) ----
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
  /// the evictor's clock and costs, which matter only under a budget). False if the node cannot be signed
  /// so (then the signature is not used).
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
                          std::uint64_t(keep_bit != 0) << 30;
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

  /// The safety net of a skipped dry run, with assertions on: the dry run runs all the same and must find
  /// exactly what the skip assumed (every test that repeats a backward checks the signature is complete).
  void check_skip([[maybe_unused]] std::int32_t loss, [[maybe_unused]] SweepMode mode) noexcept {
#ifndef NDEBUG
    const std::size_t assumed_peak = predicted_peak_;
    simulate(loss, mode);
    assert(predicted_peak_ == assumed_peak && "a skipped dry run would have predicted another peak");
    assert(buffers_.simulated_rise() == cached_rise_ && "a skipped dry run would have found another rise");
    std::size_t k = 0;
    buffers_.for_each_simulated_demand([&](const typename Buffers<T>::Demand& d) {
      [[maybe_unused]] const bool same =
          k < cached_demand_.size() ? d == cached_demand_[k] : d.high == 0 && d.forced == 0;
      assert(same && "a skipped dry run would have found another demand on the pool");
      assert(buffers_.covers(d) && "a skipped dry run would have reserved buffers");
      ++k;
    });
#endif
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

  bool ready_callbacks_active(SweepMode mode) const {
    return mode.accumulate && ready_callbacks != nullptr && !ready_callbacks->empty();
  }

  /// first_leaf_[i]: for a leaf referencing a Parameter, the id of the earliest leaf referencing the same
  /// Parameter, which stands for the Parameter in held_, contributed_ and leaves_left_ (its leaves whose
  /// gradient is not complete yet); -1 otherwise. Allocates only the first time.
  void prepare_ready_callbacks(SweepMode mode) {
    callback_error_ = nullptr;
    anomaly_ = nullptr;
    if (!ready_callbacks_active(mode)) return;
    const auto count = static_cast<std::size_t>(graph_.size());
    first_leaf_.assign(count, -1);
    contributed_.assign(count, 0);
    held_.assign(count, 0);
    leaves_left_.assign(count, 0);
    by_storage_.clear();
    for (std::int32_t i = 0; i < graph_.size(); ++i)
      if (graph_[i].is_leaf() && graph_[i].parameter) by_storage_.push_back({graph_[i].parameter.get(), i});
    std::sort(by_storage_.begin(), by_storage_.end());  // by storage, then by id: each group's first is earliest
    for (std::size_t k = 0; k < by_storage_.size(); ++k) {
      const bool starts = k == 0 || by_storage_[k].first != by_storage_[k - 1].first;
      const std::int32_t first = starts ? by_storage_[k].second : first_leaf_[by_storage_[k - 1].second];
      first_leaf_[static_cast<std::size_t>(by_storage_[k].second)] = first;
      ++leaves_left_[static_cast<std::size_t>(first)];
    }
  }

  /// While a pass calls gradient-ready callbacks (user code inside the sweep), every Parameter it recorded
  /// counts the pass in its sweeps_reading until the gradients of all its leaves are complete, after which
  /// nothing in the pass reads the value: a callback that changes a value still to be read then gets tape_error
  /// from Parameter (and from the optimizers) instead of giving the sweep another value or a freed buffer.
  void hold_parameters() noexcept {
    for (std::size_t k = 0; k < by_storage_.size(); ++k) {
      const std::int32_t first = first_leaf_[static_cast<std::size_t>(by_storage_[k].second)];
      if (held_[static_cast<std::size_t>(first)]) continue;
      held_[static_cast<std::size_t>(first)] = 1;
      graph_[first].parameter->sweeps_reading.fetch_add(1, std::memory_order_relaxed);
    }
  }
  /// Ends the hold of the Parameter whose earliest leaf is `first` (once).
  void release_parameter(std::int32_t first) noexcept {
    if (!std::exchange(held_[static_cast<std::size_t>(first)], std::uint8_t{0})) return;
    graph_[first].parameter->sweeps_reading.fetch_sub(1, std::memory_order_relaxed);
  }
  /// Ends every hold the pass has not ended (leaves it did not reach).
  void release_parameters() noexcept {
    for (const auto& entry : by_storage_) release_parameter(first_leaf_[static_cast<std::size_t>(entry.second)]);
  }

  /// The dry run: the same pass with kernels skipped and buffers counted, then everything put back.
  void simulate(std::int32_t loss, SweepMode mode) noexcept {
    evictor_.prepare_classes();
    for (std::int32_t i = 0; i < graph_.size(); ++i)
      snapshot_[static_cast<std::size_t>(i)] = NodeSnapshot<T>::of(graph_[i]);
    for (std::size_t i = 0; i < graph_.budget.size(); ++i) budget_snapshot_[i] = BudgetSnapshot::of(graph_.budget[i]);
    tier_snapshot_.assign(graph_.tier_holds.begin(), graph_.tier_holds.end());  // within capacity
    // The pass counts replayed bytes and ops: keep the last backward's until the real pass, so that a
    // reservation that fails leaves memory() as it was. The same for the evictions' counters and clock.
    const std::size_t replayed_bytes = replayed_bytes_, replayed_ops = replayed_ops_;
    const double replayed_flops = replayed_flops_;
    const typename Evictor<T>::Counters evictions = evictor_.counters();
    evictor_.clear_failure();
    simulation_ = next_simulation_serial();
    buffers_.begin_simulation();
    if (evictor_.active()) evictor_.record_choices();
    pass(loss, mode);
    predicted_peak_ = buffers_.end_simulation();
    simulation_ = 0;
    replayed_bytes_ = replayed_bytes;
    replayed_ops_ = replayed_ops;
    replayed_flops_ = replayed_flops;
    evictor_.restore(evictions);
    for (std::int32_t i = 0; i < graph_.size(); ++i) snapshot_[static_cast<std::size_t>(i)].restore(graph_[i]);
    for (std::size_t i = 0; i < graph_.budget.size(); ++i) budget_snapshot_[i].restore(graph_.budget[i]);
    std::copy(tier_snapshot_.begin(), tier_snapshot_.end(), graph_.tier_holds.begin());
    stash_.clear();
  }

  /// A shapes-only tape's backward: the dry run's pass (kernels skipped, Parameters untouched), not undone.
  /// Its buffers are placeholders counted as the real pass counts them, so memory() after it is what the
  /// same backward on a tape that computes reports.
  void count_only(std::int32_t loss, SweepMode mode) noexcept {
    simulation_ = next_simulation_serial();
    pass(loss, mode);
    predicted_peak_ = buffers_.peak_bytes();
    simulation_ = 0;
    stash_.clear();
  }

  static std::uint64_t next_simulation_serial() {
    static std::atomic<std::uint64_t> serial{0};
    return ++serial;
  }
  bool simulating() const {
    return simulation_ != 0;
  }

  void pass(std::int32_t loss, SweepMode mode) noexcept {
    running_ = !simulating();
    replayed_bytes_ = 0;
    replayed_ops_ = 0;
    replayed_flops_ = 0;
    if (!mode.accumulate) set_aside_accumulated_gradients();
    seed(loss);
    enter_ = entering_.begin();
    leave_ = leaving_.begin();
    lifetime_.set_level(0);
    const bool hold = !simulating() && ready_callbacks_active(mode);
    if (hold) hold_parameters();
    sweep_nodes(graph_.size() - 1, 0, -1, mode);
    if (hold) release_parameters();
    lifetime_.set_level(0);
    running_ = false;
  }

  /// Nodes hi down to lo, entering each region as its last node comes (and replaying it, or running its
  /// chain's schedule) and leaving it after its first, except region `stop` (left by the caller).
  void sweep_nodes(std::int32_t hi, std::int32_t lo, std::int32_t stop, SweepMode mode) noexcept {
    for (std::int32_t i = hi; i >= lo; --i) {
      bool scheduled = false;
      for (; enter_ != entering_.end() && graph_.region(*enter_).end - 1 == i; ++enter_) {
        const Region& r = graph_.region(*enter_);
        lifetime_.set_level(r.depth);
        if (r.plan >= 0) {
          // The regions inside the chain are entered by its layers' backwards.
          const std::int32_t chain = *enter_++;
          if (receives_gradient(r)) {
            run_chain(chain, mode);
          } else {
            sweep_nodes(i, r.begin, chain, mode);
            release_forward_holds(r, mode);
          }
          i = r.begin;
          scheduled = true;
          break;
        }
        if (r.replays && receives_gradient(r)) replay(r);
      }
      if (!scheduled) {
        if (graph_[i].is_leaf())
          finish_leaf(i, mode);
        else
          sweep_op(i, mode);
      }
      for (; leave_ != leaving_.end() && graph_.region(*leave_).begin == i && *leave_ != stop; ++leave_)
        leave_region(*leave_, mode);
    }
  }

  // ---- a chain run by its schedule (ChainPlan) ----
  // The forward pass kept what the schedule holds at its first backward: the activations in plan.held
  // (schedule holds) and the full tapes of the layers whose ops the region saved. From there the sweep
  // runs the schedule's operations: F_i recomputes layer i keeping only x_i, Fall_i keeps its residuals
  // too, B_i is the ordinary sweep over layer i's nodes, and a free releases x_i. chain_held_[i] says
  // whether this sweep holds x_i: 1 the forward pass's hold, 2 one an operation took.

  void run_chain(std::int32_t rid, SweepMode mode) noexcept {
    const Region& r = graph_.region(rid);
    const ChainPlan& plan = graph_.chain_plans[static_cast<std::size_t>(r.plan)];
    chain_held_.assign(plan.held.begin(), plan.held.end());  // within capacity
    chain_tape_.assign(plan.tapes.begin(), plan.tapes.end());
    for (const ChainPlan::Operation& op : plan.operations) {
      switch (op.kind) {
        case ChainPlan::Operation::forward:
        case ChainPlan::Operation::forward_all:
          hold_activation(plan, op.layer);
          recompute_layer(plan, op.layer, op.kind == ChainPlan::Operation::forward_all, r.depth);
          break;
        case ChainPlan::Operation::backward: {
          const std::int32_t begin = plan.layer_begin[static_cast<std::size_t>(op.layer - 1)],
                             end = plan.layer_begin[static_cast<std::size_t>(op.layer)];
          sweep_nodes(end - 1, begin, rid, mode);
          chain_tape_[static_cast<std::size_t>(op.layer)] = 0;
          release_activation(plan, op.layer, mode, r.depth);
          if (mode.retain_graph) {
            // The residuals' holds stay for the next backward; what this schedule recomputed goes.
            for (std::int32_t i = begin; i < end; ++i)
              if (graph_[i].level >= r.depth) lifetime_.settle_at(i, r.depth - 1);
          }
          break;
        }
        case ChainPlan::Operation::free_activation:
          release_activation(plan, op.layer, mode, r.depth);
          break;
      }
    }
    for (int i = 0; i <= plan.length(); ++i) release_activation(plan, i, mode, r.depth);
  }

  void hold_activation(const ChainPlan& plan, int i) noexcept {
    std::uint8_t& held = chain_held_[static_cast<std::size_t>(i)];
    if (held != 0) return;
    for (int k = 0; k < plan.width; ++k) lifetime_.add_schedule_hold(plan.output(i, k));
    held = 2;
  }
  /// The schedule is done with x_i: its hold goes, at level depth − 1, where a value of the chain stays only
  /// for a handle or a running op. With retain_graph the forward pass's hold stays for the next backward.
  void release_activation(const ChainPlan& plan, int i, SweepMode mode, int depth) noexcept {
    std::uint8_t& held = chain_held_[static_cast<std::size_t>(i)];
    if (held == 0) return;
    const bool physical = held == 2 || !mode.retain_graph;
    held = 0;
    if (!physical) return;
    for (int m = 0; m < plan.width; ++m) {
      const std::int32_t id = plan.output(i, m);
      // x_i stays as a residual of its layer's tape if the schedule keeps that (x_i may be an earlier layer's
      // output: a layer may return its input).
      bool residual = false;
      for (int k = i; k >= 1 && !residual; --k)
        if (plan.layer_begin[static_cast<std::size_t>(k - 1)] <= id &&
            id < plan.layer_begin[static_cast<std::size_t>(k)])
          residual = chain_tape_[static_cast<std::size_t>(k)] != 0;
      lifetime_.release_schedule_hold_at(id, residual ? depth : depth - 1);
    }
  }
  /// A chain no gradient reaches: the forward pass's holds go unless retain_graph keeps them.
  void release_forward_holds(const Region& r, SweepMode mode) noexcept {
    if (mode.retain_graph) return;
    const ChainPlan& plan = graph_.chain_plans[static_cast<std::size_t>(r.plan)];
    lifetime_.set_level(r.depth - 1);
    for (int i = 0; i <= plan.length(); ++i)
      if (plan.held[static_cast<std::size_t>(i)])
        for (int k = 0; k < plan.width; ++k) lifetime_.release_schedule_hold(plan.output(i, k));
    lifetime_.set_level(r.depth);
  }

  /// F_i (`all` false: at level depth − 1, so that only x_i, held, stays) or Fall_i (at the chain's level:
  /// the values layer i's backward reads stay too). Runs the layer's ops that what stays needs and that are
  /// not there, freeing each transient after its last use, as a replay does.
  void recompute_layer(const ChainPlan& plan, int i, bool all, int depth) noexcept {
    const std::int32_t begin = plan.layer_begin[static_cast<std::size_t>(i - 1)],
                       end = plan.layer_begin[static_cast<std::size_t>(i)];
    const PresentNow present{depth};
    uses_.assign(static_cast<std::size_t>(end - begin), 0);  // within capacity
    computed_inputs_.assign(static_cast<std::size_t>(end - begin), 0);
    members_.clear();
    auto target = [&](std::int32_t u) {
      const Node<T>& n = graph_[u];
      for (int k = 0; k < plan.width; ++k)
        if (u == plan.output(i, k) && !present.value(graph_, u, u)) return true;
      return all && ((read_at_or_below(graph_, n, depth) && !present.value(graph_, u, u)) ||
                     (n.level <= depth && n.extra_read && !present.extra(n)));
    };
    for (std::int32_t u = end - 1; u >= begin; --u) {
      const Node<T>& n = graph_[u];
      if (n.is_leaf() || (uses_[static_cast<std::size_t>(u - begin)] == 0 && !target(u))) continue;
      members_.push_back(u);
      for (int k = 0; k < n.arity; ++k) {
        const std::int32_t w = n.inputs[k];
        if (present.value(graph_, w, u) || w < begin) continue;  // an absent input outside: regenerated
        ++uses_[static_cast<std::size_t>(w - begin)];
        computed_inputs_[static_cast<std::size_t>(u - begin)] |= static_cast<std::uint8_t>(1u << k);
      }
    }
    std::reverse(members_.begin(), members_.end());
    // F_i: what it computed goes after its last use unless held (below the chain's level, where only
    // handles, running ops and the schedule's holds keep a value). Only layer i's own nodes: an input may be
    // a residual of a tape the schedule keeps (x_{i−1} inside x̄_{i−1}).
    auto done = [&](std::int32_t u) {
      if (!all) lifetime_.settle_at(u, depth - 1);
    };
    for (std::int32_t u : members_) {
      const Node<T>& n = graph_[u];
      evictor_.compute(u, false);
      replayed_bytes_ += Buffers<T>::bytes(n.shape) + Buffers<T>::bytes(n.extra_shape);
      replayed_flops_ += n.cost - op_overhead_flops;  // its FLOP estimate (Node::cost)
      ++replayed_ops_;
      const std::uint8_t computed = computed_inputs_[static_cast<std::size_t>(u - begin)];
      for (int k = 0; k < n.arity; ++k) {
        if (!(computed & (1u << k))) continue;  // read as it was there, not as this computes it
        const std::int32_t w = n.inputs[k];
        std::int32_t& left = uses_[static_cast<std::size_t>(w - begin)];
        if (--left == 0) {
          lifetime_.unpin(w);
          done(w);
        }
      }
      if (uses_[static_cast<std::size_t>(u - begin)] > 0) {
        lifetime_.pin(u);
      } else {
        lifetime_.settle(u);
        done(u);
      }
    }
    if (all) chain_tape_[static_cast<std::size_t>(i)] = 1;
  }

  void set_aside_accumulated_gradients() noexcept {
    for (std::int32_t i = 0; i < graph_.size(); ++i) {
      Node<T>& n = graph_[i];
      if (!n.is_variable || !n.grad) continue;
      stash_.push_back({i, n.grad, n.grad_assigned});  // capacity reserved
      n.grad = nullptr;
      n.grad_assigned = false;
    }
  }

  void seed(std::int32_t loss) noexcept {
    Node<T>& l = graph_[loss];
    if (!l.grad) {
      evictor_.make_room(Buffers<T>::bytes(l.shape));
      l.grad = buffers_.allocate(l.shape);
    }
    if (!simulating()) {
      if (graph_.trace) graph_.trace->log_seed(graph_, loss);
      l.grad[0] = l.grad_assigned ? l.grad[0] + T(1) : T(1);
    }
    l.grad_assigned = true;
  }

  bool receives_gradient(const Region& r) const {
    for (std::int32_t i = r.begin; i < r.end; ++i)
      if (graph_[i].grad && wanted[static_cast<std::size_t>(i)]) return true;
    return false;
  }

  /// Regenerates the values of region r that are needed at its level and missing, by re-running the
  /// recorded ops (never the user's function); transients go after their last use, pinned until then (so
  /// that an eviction leaves them). An evicted value counts as there: it is regenerated when read.
  void replay(const Region& r) noexcept {
    uses_.assign(static_cast<std::size_t>(r.end - r.begin), 0);  // within capacity
    computed_inputs_.assign(static_cast<std::size_t>(r.end - r.begin), 0);
    plan_replay(graph_, r, PresentNow{r.depth}, members_, uses_, computed_inputs_);
    for (std::int32_t u : members_) {
      const Node<T>& n = graph_[u];
      evictor_.compute(u, false);
      replayed_bytes_ += Buffers<T>::bytes(n.shape) + Buffers<T>::bytes(n.extra_shape);
      replayed_flops_ += n.cost - op_overhead_flops;  // its FLOP estimate (Node::cost)
      ++replayed_ops_;
      const std::uint8_t computed = computed_inputs_[static_cast<std::size_t>(u - r.begin)];
      for (int k = 0; k < n.arity; ++k) {
        if (!(computed & (1u << k))) continue;  // read as it was there, not as the replay computes it
        const std::int32_t w = n.inputs[k];
        std::int32_t& left = uses_[static_cast<std::size_t>(w - r.begin)];
        if (--left == 0) lifetime_.unpin(w);
      }
      if (uses_[static_cast<std::size_t>(u - r.begin)] > 0)
        lifetime_.pin(u);
      else
        lifetime_.settle(u);
    }
  }

  void sweep_op(std::int32_t i, SweepMode mode) noexcept {
    Node<T>& n = graph_[i];
    if (n.grad && wanted[static_cast<std::size_t>(i)]) {
      pin_residuals(i);
      assert(residuals_present(n) && "a residual was freed before its backward ran");
      for (int k = 0; k < n.arity; ++k) {
        Node<T>& in = graph_[n.inputs[k]];
        if (wanted[static_cast<std::size_t>(n.inputs[k])] && !in.grad) {
          const auto count = static_cast<std::size_t>(in.shape.numel());  // once: a loop over the rank
          evictor_.make_room(count * sizeof(T));
          in.grad = buffers_.allocate_elements(count);
        }
      }
      if (n.scratch_shape.numel() > 0) {
        evictor_.make_room(Buffers<T>::bytes(n.scratch_shape));
        n.scratch = buffers_.allocate(n.scratch_shape);
      }
      if (!simulating()) {
        if (graph_.trace) graph_.trace->log_backward(graph_, i);
        n.op->backward(BackwardContext<T>{graph_, n, wanted.data()});
        if (graph_.detect_anomaly && !anomaly_) check_finite_backward(i);
      }
      buffers_.free(n.scratch, n.scratch_shape);
      unpin_residuals(i);
    }
    if (!keep[static_cast<std::size_t>(i)]) free_grad(n);
    if (mode.accumulate) deliver_gradients_completed_by(i, mode);
    if (mode.retain_graph || !n.requires_grad) return;
    for (int k = 0; k < n.arity; ++k)
      if (n.reads & reads_input(k)) lifetime_.release_backward_read(n.inputs[k], i);
    if (n.reads & reads_output) lifetime_.release_backward_read(i, i);
    if (n.extra_read) lifetime_.release_extra_read(i);
  }

  /// Anomaly detection: after op i's backward, the first gradient it wrote that holds a NaN or ±inf is kept as
  /// an anomaly_error for run()'s caller (the sweep cannot stop half-way). Never throws.
  void check_finite_backward(std::int32_t i) noexcept {
    const Node<T>& n = graph_[i];
    for (int k = 0; k < n.arity; ++k) {
      const std::int32_t w = n.inputs[k];
      const Node<T>& in = graph_[w];
      if (!wanted[static_cast<std::size_t>(w)] || !in.grad) continue;
      const std::int64_t bad = first_non_finite(in.grad, in.shape.rows(), in.shape.cols());
      if (bad < 0) continue;
      const std::int64_t upstream = n.grad ? first_non_finite(n.grad, n.shape.rows(), n.shape.cols()) : -1;
      try {
        throw anomaly_error("backward of " + std::string(n.op->name) + " (node #" + std::to_string(i) + ", " +
                                to_string(n.shape) + ") wrote " + non_finite_text(in.grad, in.shape.cols(), bad) +
                                " into the gradient of its input " + std::to_string(k) + " (node #" +
                                std::to_string(w) + ", " + graph_.node_name(w) + " " + to_string(in.shape) + ")" +
                                (upstream >= 0 ? ", propagated: the gradient it received holds " +
                                                     non_finite_text(n.grad, n.shape.cols(), upstream)
                                               : ", from a finite incoming gradient") +
                                " (anomaly detection is on: Tape::set_detect_anomaly); the sweep completed, so the "
                                "gradients hold the non-finite values",
                            i);
      } catch (...) {
        anomaly_ = std::current_exception();
        anomaly_first_ = !callback_error_;
      }
      return;
    }
  }

  /// The values node i's backward reads, made resident (regenerated if evicted) and, under a memory
  /// budget, pinned while it runs. Without a budget nothing evicts (Evictor::make_room), so nothing can
  /// free a residual while the backward runs: each one is wanted (its pending backward read holds it at
  /// the sweep's level), and unpinning would settle it to what it is now.
  /// Under a budget they are acquired together (Evictor::acquire): one regeneration makes all of them resident,
  /// so that regenerating one cannot evict another the same backward reads.
  void pin_residuals(std::int32_t i) noexcept {
    const Node<T>& n = graph_[i];
    if (!evictor_.active()) {
      for (int k = 0; k < n.arity; ++k)
        if (n.reads & reads_input(k)) evictor_.ensure(n.inputs[k]);
      if (n.reads & reads_output) evictor_.ensure(i);
      return;
    }
    std::int32_t read[max_inputs + 1];
    int count = 0;
    for (int k = 0; k < n.arity; ++k)
      if (n.reads & reads_input(k)) read[count++] = n.inputs[k];
    if (n.reads & reads_output) read[count++] = i;
    evictor_.acquire(read, count);
  }
  void unpin_residuals(std::int32_t i) noexcept {
    if (!evictor_.active()) return;
    const Node<T>& n = graph_[i];
    for (int k = 0; k < n.arity; ++k)
      if (n.reads & reads_input(k)) lifetime_.unpin(n.inputs[k]);
    if (n.reads & reads_output) lifetime_.unpin(i);
  }

  bool residuals_present(const Node<T>& n) const {
    for (int k = 0; k < n.arity; ++k)
      if ((n.reads & reads_input(k)) && !graph_[n.inputs[k]].value) return false;
    if ((n.reads & reads_output) && !n.value) return false;
    return !(n.reads & reads_extra) || n.extra;
  }

  /// After op i's backward: delivers the gradient of every Parameter leaf it completes (prepare_deliveries).
  void deliver_gradients_completed_by(std::int32_t i, SweepMode mode) noexcept {
    const Node<T>& n = graph_[i];
    for (int k = 0; k < n.arity; ++k) {
      const std::int32_t w = n.inputs[k];
      if (delivered_by_[static_cast<std::size_t>(w)] != i) continue;
      if ((k >= 1 && n.inputs[0] == w) || (k == 2 && n.inputs[1] == w)) continue;  // read twice: once
      complete_leaf(w, mode);
    }
  }

  void finish_leaf(std::int32_t i, SweepMode mode) noexcept {
    if (delivered_by_[static_cast<std::size_t>(i)] < 0) complete_leaf(i, mode);
  }

  /// Leaf i's gradient of this sweep is complete: a Parameter's goes to the Parameter (backward), a kept one
  /// stays, any other goes; the Parameter's gradient-ready callbacks run once all its leaves are complete.
  void complete_leaf(std::int32_t i, SweepMode mode) noexcept {
    Node<T>& n = graph_[i];
    const bool callbacks = ready_callbacks_active(mode) && n.parameter;
    const std::int32_t first = callbacks ? first_leaf_[static_cast<std::size_t>(i)] : -1;
    if (n.grad) {
      if (n.parameter && mode.accumulate) {
        add_to_parameter(n);
        if (callbacks) contributed_[static_cast<std::size_t>(first)] = 1;
      } else if (!keep[static_cast<std::size_t>(i)]) {
        free_grad(n);  // e.g. a constant used as the loss got the seed gradient
      }
    }
    if (callbacks && !simulating() && --leaves_left_[static_cast<std::size_t>(first)] == 0) {
      release_parameter(first);  // before its callbacks: they may change this Parameter
      if (contributed_[static_cast<std::size_t>(first)]) call_ready_callbacks(graph_[first]);
    }
  }

  /// Calls every gradient-ready callback with the Parameter of leaf n. An exception is kept for run()'s
  /// caller (the sweep goes on: it cannot stop half-way); after one, no further callback is called.
  void call_ready_callbacks(Node<T>& n) noexcept {
    if (callback_error_) return;
    Parameter<T> p = ParameterAccess::share(n.parameter);
    try {
      for (const auto& entry : *ready_callbacks) entry.second(p);
    } catch (...) {
      callback_error_ = std::current_exception();
    }
  }

  bool changed_since_recorded(const Node<T>& n) const noexcept {
    const ParameterStorage<T>& s = *n.parameter;
    // Not the version: a value modified after recording but read by no backward keeps its gradient, as
    // PyTorch's version counter allows (backward checked the values it reads before the sweep).
    return s.assignments != n.parameter_assignments || s.value.rows() != n.shape.rows() ||
           s.value.cols() != n.shape.cols();
  }
  /// The stale_value_error backward() rethrows after the sweep, unless an error is kept already.
  void keep_error(const Node<T>& n) noexcept {
    if (callback_error_) return;
    try {
      throw stale_value_error("backward: a Parameter of shape " + to_string(n.shape) +
                              " that this tape recorded was assigned or resized during the backward (by a "
                              "gradient-ready callback?) before its gradient was delivered; that gradient, of the "
                              "recorded value, was not added to it");
    } catch (...) {
      callback_error_ = std::current_exception();
    }
  }

  /// The Parameter's gradient += this node's. The first contribution since zero_grad() hands the tape's
  /// buffer over to the Parameter (no copy) and takes the Parameter's previous buffer into the pool.
  void add_to_parameter(Node<T>& n) noexcept {
    ParameterStorage<T>& s = *n.parameter;
    if (!simulating() && changed_since_recorded(n)) {
      // Only user code inside the sweep could have done it (backward refuses an assigned Parameter before the
      // sweep), and Parameter refuses it while the sweep holds the Parameter (hold_parameters): a defence in
      // depth. The gradient is of the recorded value, and its buffer may not fit. Not delivered; reported.
      keep_error(n);
      free_grad(n);
      return;
    }
    const bool defined = s.grad_defined || (simulating() && s.simulated_sweep == simulation_);
    if (graph_.trace && !simulating())
      graph_.trace->log_delivery(graph_, static_cast<std::int32_t>(&n - graph_.nodes.data()), !defined);
    if (defined) {
      if (!simulating())
        Eigen::Map<Matrix<T>>(s.grad, n.shape.rows(), n.shape.cols()) +=
            ConstAlignedMap<T>(n.grad, n.shape.rows(), n.shape.cols());
      free_grad(n);
      return;
    }
    const Index count = n.shape.numel();  // once: a loop over the rank
    T* previous = s.grad && s.grad_size == count ? s.grad : nullptr;
    if (simulating()) {
      buffers_.hand_over_elements(n.grad, static_cast<std::size_t>(count), previous);
      s.simulated_sweep = simulation_;
    } else {
      if (s.grad && !previous) Eigen::internal::aligned_free(s.grad);
      s.grad = n.grad;
      s.grad_size = count;
      s.grad_defined = true;
      buffers_.hand_over_elements(n.grad, static_cast<std::size_t>(count), previous);
    }
    n.grad_assigned = false;
  }

  void leave_region(std::int32_t rid, SweepMode mode) noexcept {
    const Region& r = graph_.region(rid);
    if (!mode.retain_graph)
      for (std::int32_t k = r.sources_begin; k < r.sources_end; ++k)
        lifetime_.release_replay_read(graph_.region_sources[static_cast<std::size_t>(k)],
                                      graph_.source_readers[static_cast<std::size_t>(k)]);
    lifetime_.set_level(r.depth - 1);
    // With retain_graph the holds stay; what this region's replay regenerated goes now all the same.
    if (mode.retain_graph)
      for (std::int32_t i = r.begin; i < r.end; ++i)
        if (graph_[i].level >= r.depth) lifetime_.settle(i);
  }

  void free_grad(Node<T>& n) noexcept {
    buffers_.free(n.grad, n.shape);
    n.grad_assigned = false;
  }

  Graph<T>& graph_;
  Buffers<T>& buffers_;
  Lifetime<T>& lifetime_;
  Evictor<T>& evictor_;
  std::vector<std::int32_t> entering_, leaving_;  // regions by the order the sweep enters / leaves them
  std::vector<std::int32_t> members_, uses_;      // replay scratch
  std::vector<std::uint8_t> computed_inputs_;     // replay scratch (plan_replay)
  typename std::vector<std::int32_t>::const_iterator enter_, leave_;  // the pass's next region to enter / leave
  std::vector<std::uint8_t> chain_held_, chain_tape_;                 // run_chain's scratch
  std::vector<NodeSnapshot<T>> snapshot_;
  std::vector<BudgetSnapshot> budget_snapshot_;  // parallel to Graph::budget
  std::vector<std::int32_t> tier_snapshot_;      // Graph::tier_holds before a dry run
  std::vector<Stashed> stash_;
  std::vector<std::int32_t> first_leaf_;    // per node, see prepare_ready_callbacks
  std::vector<std::uint8_t> held_;          // per earliest leaf: the pass holds its Parameter (hold_parameters)
  std::vector<std::uint8_t> contributed_;   // per earliest leaf: got a gradient
  std::vector<std::int32_t> leaves_left_;   // per earliest leaf: leaves of its Parameter not yet complete
  std::vector<std::int32_t> delivered_by_;  // per node, see prepare_deliveries
  std::vector<std::uint8_t> receives_;      // per node: receives a gradient in this sweep (scratch)
  std::vector<std::pair<const ParameterStorage<T>*, std::int32_t>> by_storage_;  // scratch
  std::exception_ptr callback_error_;
  std::exception_ptr anomaly_;  // the first non-finite gradient of the last run (anomaly detection)
  bool anomaly_first_ = false;  // anomaly_ came before callback_error_
  bool running_ = false;
  std::uint64_t simulation_ = 0;  // serial of the running dry run, 0 outside one
  std::size_t replayed_bytes_ = 0, replayed_ops_ = 0;
  double replayed_flops_ = 0;
  std::size_t predicted_peak_ = 0;
  // Skipping the dry run (see the top of this file).
  std::vector<std::uint64_t> signature_, cached_signature_;          // this sweep's; the last remembered dry run's
  std::vector<typename Buffers<T>::Demand> cached_demand_;           // what that dry run needed of the pool
  std::size_t cached_rise_ = 0;                                      // and how far it raised live bytes
  bool cache_valid_ = false, signable_ = false, redundant_ = false;  // redundant_: this run's, from prepare()
  std::size_t dry_runs_skipped_ = 0;
};

}  // namespace remat::detail
