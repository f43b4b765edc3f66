// Trace<T>: what a CapturedStep (remat/captured_step.hpp) records while its first step runs, and how it runs
// the step again. Every kernel call of the step — a forward at record, a checkpoint replay's or an eviction's
// regeneration, a backward — and every encode and decode of a value a policy stores compressed (detail/packing.hpp)
// is logged with the buffers its node and inputs had at that moment, together with
// the few writes the tape makes outside kernels (a leaf's data, the loss's seed gradient, a Parameter's
// gradient). Running the log again calls the same kernels on the same buffers in the same order: no
// recording, no lifetime counting, no pool traffic.
#pragma once

#include <Eigen/Core>
#include <cstdint>
#include <unordered_map>
#include <utility>
#include <vector>

#include "remat/detail/node.hpp"
#include "remat/detail/packing.hpp"
#include "remat/matrix.hpp"
#include "remat/op_context.hpp"

namespace remat::detail {

/// The buffers of one node at one moment of the captured step.
template <class T>
struct TraceNodeState {
  std::int32_t id;
  bool grad_assigned;
  T* value;
  T* extra;
  T* scratch;
  T* grad;
  T* packed;
};

/// The buffers of node `id` now.
template <class T>
TraceNodeState<T> state_of(const Graph<T>& g, std::int32_t id) {
  const Node<T>& n = g[id];
  return {id, n.grad_assigned, n.value, n.extra, n.scratch, n.grad, n.packed};
}
/// Points its node at the buffers of `s`.
template <class T>
void restore_state(Graph<T>& g, const TraceNodeState<T>& s) noexcept {
  Node<T>& n = g[s.id];
  n.grad_assigned = s.grad_assigned;
  n.value = s.value;
  n.extra = s.extra;
  n.scratch = s.scratch;
  n.grad = s.grad;
  n.packed = s.packed;
}

struct TraceEvent {
  enum Kind : std::uint8_t {
    leaf_data,  ///< a constant's or variable's data copied in (from Trace::leaf_data[data])
    forward,    ///< an op's forward kernel as the tape records it (ForwardContext::recording())
    rerun,      ///< an op's forward kernel run again: a checkpoint replay or a memory budget's regeneration
    backward,   ///< an op's backward kernel
    seed,       ///< the loss's gradient set to 1 (or 1 added)
    delivery,   ///< a leaf's gradient added to, or handed to, its Parameter
    pack,       ///< a value a policy stores compressed encoded into its packed buffer (detail/packing.hpp)
    unpack,     ///< a packed value decoded for a read (data: 1 for its sign alone)
  } kind;
  std::int32_t node;
  std::int32_t states_begin;  ///< the node's state, then its inputs', in Trace::states
  std::int32_t data;          ///< leaf_data: index into Trace::leaf_data; unpack: 1 for the sign alone
};

template <class T>
class Trace {
 public:
  Trace() = default;
  Trace(const Trace&) = delete;
  Trace& operator=(const Trace&) = delete;
  ~Trace() {
    for (Slot& slot : slots_) Eigen::internal::aligned_free(slot.own);
  }

  // ---- while the captured step runs: the tape's hooks, called where they may not throw ----
  // A hook that cannot allocate marks the trace failed and logs nothing more; CapturedStep then throws
  // std::bad_alloc for the whole capture.
  void log_leaf(const Graph<T>& g, std::int32_t id) noexcept {
    const Node<T>& n = g[id];
    guarded([&] {
      leaf_data.emplace_back(ConstAlignedMap<T>(n.value, n.shape.rows(), n.shape.cols()));
      log(TraceEvent::leaf_data, g, id, false).data = static_cast<std::int32_t>(leaf_data.size() - 1);
    });
  }
  /// Node `id`'s forward runs: as the tape records it (`recording`), or again (a replay or a regeneration).
  void log_forward(const Graph<T>& g, std::int32_t id, bool recording) noexcept {
    guarded([&] { log(recording ? TraceEvent::forward : TraceEvent::rerun, g, id, true); });
  }
  void log_backward(const Graph<T>& g, std::int32_t id) noexcept {
    guarded([&] { log(TraceEvent::backward, g, id, true); });
  }
  void log_seed(const Graph<T>& g, std::int32_t id) noexcept {
    guarded([&] { log(TraceEvent::seed, g, id, false); });
  }
  /// Node `id`'s value is encoded into its packed buffer (Lifetime::settle_packed).
  void log_pack(const Graph<T>& g, std::int32_t id) noexcept {
    guarded([&] { log(TraceEvent::pack, g, id, false); });
  }
  /// Node `id`'s packed value is decoded into its value buffer, as its sign alone if `sign_only` (Lifetime::unpack).
  void log_unpack(const Graph<T>& g, std::int32_t id, bool sign_only) noexcept {
    guarded([&] { log(TraceEvent::unpack, g, id, false).data = sign_only ? 1 : 0; });
  }
  /// Leaf `id` delivers its gradient to its Parameter; `handed_over`: the buffer becomes the Parameter's.
  void log_delivery(const Graph<T>& g, std::int32_t id, bool handed_over) noexcept {
    guarded([&] {
      if (handed_over) handed_over_.push_back({g[id].grad, g[id].shape.numel(), g[id].parameter.get()});
      log(TraceEvent::delivery, g, id, false);
    });
  }
  /// The forward of node `id`, just logged, threw: the recorder returns its buffers, some of which earlier
  /// events may name, so the capture cannot be replayed (CapturedStep throws), even if the function goes on.
  void forward_threw(std::int32_t id) noexcept {
    if (!events.empty() && events.back().kind == TraceEvent::forward && events.back().node == id) {
      states.resize(static_cast<std::size_t>(events.back().states_begin));
      events.pop_back();
    }
    op_threw_ = true;
  }
  /// An op's forward threw during the capture.
  bool op_threw() const { return op_threw_; }
  /// A hook could not allocate: the log is incomplete.
  bool failed() const { return failed_; }

  /// After the step. Every buffer handed to a Parameter as its gradient is the Parameter's now: the logged
  /// states that name it become a slot, pointed at each run either to the Parameter's gradient buffer (when its
  /// gradient is zero, the usual case after zero_grad(): the kernels write the gradient in place, as the
  /// hand-over did) or to a buffer of the trace's own (when it holds a gradient to add to). Throws
  /// std::bad_alloc with the trace unchanged.
  void make_slots() {
    std::unordered_map<T*, std::size_t> slot_of;
    std::vector<Slot> slots;
    try {
      for (const HandedOver& h : handed_over_) {
        if (slot_of.count(h.buffer)) continue;
        slots.push_back({h.storage, nullptr, h.buffer, {}});
        slot_of.emplace(h.buffer, slots.size() - 1);
        slots.back().own =
            static_cast<T*>(Eigen::internal::aligned_malloc(static_cast<std::size_t>(h.size) * sizeof(T)));
      }
      for (std::size_t i = 0; i < states.size(); ++i)
        for (std::uint8_t f = 0; f < 4; ++f) {
          const auto it = slot_of.find(field(states[i], f));
          if (it != slot_of.end()) slots[it->second].uses.emplace_back(static_cast<std::int32_t>(i), f);
        }
    } catch (...) {
      for (Slot& slot : slots) Eigen::internal::aligned_free(slot.own);
      throw;
    }
    slots_ = std::move(slots);
  }

  /// Runs the logged step again on graph `g` (the captured tape) with the sweep's `wanted` flags; `loss_value`
  /// receives node `loss`'s value when its forward has run. Never throws (the kernels do not; every Parameter
  /// gradient it writes has its buffer, CapturedStep::replay).
  void run(Graph<T>& g, const std::uint8_t* wanted, std::int32_t loss, T& loss_value) noexcept {
    point_slots();
    for (const TraceEvent& e : events) {
      restore(g, e);
      Node<T>& n = g[e.node];
      switch (e.kind) {
        case TraceEvent::leaf_data:
          AlignedMap<T>(n.value, n.shape.rows(), n.shape.cols()) = leaf_data[static_cast<std::size_t>(e.data)];
          break;
        case TraceEvent::forward:
        case TraceEvent::rerun:
          n.op->forward(ForwardContext<T>{g, n, e.kind == TraceEvent::forward});
          if (e.node == loss) loss_value = n.value[0];
          break;
        case TraceEvent::backward:
          n.op->backward(BackwardContext<T>{g, n, wanted});
          break;
        case TraceEvent::seed:
          n.grad[0] = n.grad_assigned ? n.grad[0] + T(1) : T(1);
          break;
        case TraceEvent::delivery:
          deliver(n);
          break;
        case TraceEvent::pack:
          encode_packed(g, n);
          break;
        case TraceEvent::unpack:
          decode_packed(g, n, e.data != 0);
          break;
      }
    }
  }

  std::vector<TraceEvent> events;
  std::vector<TraceNodeState<T>> states;
  std::vector<Matrix<T>> leaf_data;

 private:
  TraceEvent& log(TraceEvent::Kind kind, const Graph<T>& g, std::int32_t id, bool with_inputs) {
    const Node<T>& n = g[id];
    TraceEvent e{kind, id, static_cast<std::int32_t>(states.size()), -1};
    push_state(g, id);
    if (with_inputs)
      for (int k = 0; k < n.arity; ++k) push_state(g, n.inputs[k]);
    events.push_back(e);
    return events.back();
  }
  void push_state(const Graph<T>& g, std::int32_t id) { states.push_back(state_of(g, id)); }
  void restore(Graph<T>& g, const TraceEvent& e) const noexcept {
    const Node<T>& head = g[e.node];
    const int count = e.kind == TraceEvent::forward || e.kind == TraceEvent::rerun || e.kind == TraceEvent::backward
                          ? 1 + head.arity
                          : 1;
    for (int k = 0; k < count; ++k) restore_state(g, states[static_cast<std::size_t>(e.states_begin + k)]);
  }
  /// What Sweep::add_to_parameter does with the gradient in n.grad: add it to the Parameter's, or make it the
  /// Parameter's (in place when a slot pointed the kernels at the Parameter's buffer, else copied). The
  /// Parameter's buffer has its size (CapturedStep::replay).
  static void deliver(const Node<T>& n) noexcept {
    ParameterStorage<T>& s = *n.parameter;
    const ConstAlignedMap<T> grad(n.grad, n.shape.rows(), n.shape.cols());
    if (n.grad == s.grad) {
      s.grad_defined = true;
    } else if (s.grad_defined) {
      Eigen::Map<Matrix<T>>(s.grad, n.shape.rows(), n.shape.cols()) += grad;
    } else {
      Eigen::Map<Matrix<T>>(s.grad, n.shape.rows(), n.shape.cols()) = grad;
      s.grad_defined = true;
    }
  }
  /// Each slot to the Parameter's buffer if its gradient is zero, else to the trace's own.
  void point_slots() noexcept {
    for (Slot& slot : slots_) {
      T* target = slot.storage->grad_defined ? slot.own : slot.storage->grad;
      if (target == slot.current) continue;
      for (const auto& [state, f] : slot.uses) field(states[static_cast<std::size_t>(state)], f) = target;
      slot.current = target;
    }
  }
  static T*& field(TraceNodeState<T>& s, std::uint8_t f) {
    switch (f) {
      case 0:
        return s.value;
      case 1:
        return s.extra;
      case 2:
        return s.scratch;
      default:
        return s.grad;
    }
  }
  template <class F>
  void guarded(F&& f) noexcept {
    if (failed_) return;
    try {
      f();
    } catch (...) {  // std::bad_alloc
      failed_ = true;
    }
  }

  struct HandedOver {
    T* buffer;
    Index size;
    ParameterStorage<T>* storage;
  };
  /// A buffer handed to a Parameter during the capture, and where the logged states name it.
  struct Slot {
    ParameterStorage<T>* storage;
    T* own;                                                   // the trace's buffer of its size (freed by the trace)
    T* current;                                               // what the states name now
    std::vector<std::pair<std::int32_t, std::uint8_t>> uses;  // (state, field) pairs
  };
  std::vector<HandedOver> handed_over_;
  std::vector<Slot> slots_;
  bool failed_ = false;
  bool op_threw_ = false;
};

}  // namespace remat::detail
