// What an op's forward and backward see of the tape: ForwardContext and BackwardContext, the only interface
// between an op (built-in or a user's: remat/op.hpp is the recipe) and the tape, and the counter-based random
// stream of a random op.
#pragma once

#include <cassert>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "remat/detail/direct_gemm.hpp"
#include "remat/detail/node.hpp"

namespace remat {

template <class T>
using AlignedMap = Eigen::Map<Matrix<T>, Eigen::AlignedMax>;
template <class T>
using ConstAlignedMap = Eigen::Map<const Matrix<T>, Eigen::AlignedMax>;

/// dst = e, or dst += e when `accumulate`; for Eigen matrix or array expressions.
template <class D, class E>
void assign_or_add(D&& dst, const E& e, bool accumulate) {
  if (accumulate)
    dst += e;
  else
    dst = e;
}

/// dst = e or dst += e for a matrix product `e` into a block (no aliasing: Eigen's GEMM writes dst
/// directly, with no heap temporary).
template <class D, class E>
void assign_or_add_product(D&& dst, const E& e, bool accumulate) {
  if (accumulate)
    dst.noalias() += e;
  else
    dst.noalias() = e;
}

/// Before dst = a·b into a tape buffer: zeroes dst by row blocks on remat's team when it is above the grain and
/// returns true (the caller then adds the product), else returns false. Defined in detail/parallel.hpp.
namespace detail {
template <class T>
bool zero_for_product(AlignedMap<T> dst);

template <class E>
inline constexpr bool is_product = false;
template <class L, class R, int Option>
inline constexpr bool is_product<Eigen::Product<L, R, Option>> = true;
}  // namespace detail

/// A counter-based random stream: draw k is a pure function of (seed, offset + k), through the SplitMix64
/// finaliser (Steele, Lea & Flood, "Fast splittable pseudorandom number generators", OOPSLA 2014), so a
/// checkpoint replay, another thread count or another split into blocks reproduces every draw bitwise, and
/// nothing but the seed and offset is stored. An op of kind OpKind::random gets one from its contexts
/// (ForwardContext::random()): apply_op takes it from the tape's generator (seeded by Tape(seed) or
/// Tape::seed) at record time and advances the tape's offset by the op's random_draws.
class RandomStream {
 public:
  /// The stream of seed 0 at offset 0.
  RandomStream() = default;
  /// The stream whose draw k is mix(seed ^ mix(offset + k)).
  RandomStream(std::uint64_t seed, std::uint64_t offset) : seed_(seed), offset_(offset) {}
  /// Draw k: 64 random bits.
  std::uint64_t bits(std::uint64_t k) const { return mix(seed_ ^ mix(offset_ + k)); }
  /// Draw k as a uniform double in [0, 1): its top 53 bits times 2^-53.
  double uniform(std::uint64_t k) const { return static_cast<double>(bits(k) >> 11) * 0x1.0p-53; }
  std::uint64_t seed() const { return seed_; }      ///< the tape's seed when the op was recorded
  std::uint64_t offset() const { return offset_; }  ///< the tape's draw count when the op was recorded

  /// The SplitMix64 finaliser: a bijection of 64-bit words whose outputs pass BigCrush for consecutive inputs.
  static std::uint64_t mix(std::uint64_t z) {
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }

 private:
  std::uint64_t seed_ = 0;
  std::uint64_t offset_ = 0;
};

/// Most bytes of the Params of an op of kind OpKind::random: its RandomStream takes the last 16 of the node's
/// max_params_bytes.
constexpr std::size_t max_random_params_bytes = max_params_bytes - sizeof(RandomStream);

namespace detail {
/// A random op's stream is kept in the last bytes of its node's Params storage, which its Params may not use
/// (max_random_params_bytes): no other op pays for the field.
inline void store_random_stream(Attributes& a, const RandomStream& r) {
  std::memcpy(a.params + max_random_params_bytes, &r, sizeof r);
}
template <class T>
RandomStream random_stream_of(const Node<T>& node) {
  assert(node.op && node.op->kind == OpKind::random && "random(): only an op of kind OpKind::random has a stream");
  RandomStream r;
  std::memcpy(&r, node.attributes.params + max_random_params_bytes, sizeof r);
  return r;
}
}  // namespace detail

// The contexts' accessors below are a few loads each, read by every kernel of every op, and always inlined: left to
// the inliner, they were calls from the large kernels (linear's forward and backward), a call and its register saves
// for every input, output and gradient an op reads (bench W0, bench/probes/instructions.sh).

/// What an op's forward sees: its inputs, its output, its extra buffer, its Params and index data.
template <class T>
class ForwardContext {
 public:
  /// Made by the tape for one run of the op's forward (an op never makes one); `recording`: see recording().
  ForwardContext(const detail::Graph<T>& graph, const detail::Node<T>& node, bool recording)
      : graph_(graph), node_(node), recording_(recording) {}

  /// True when this run is the op's record, the one run of its forward each step has: Tape records the op (or a
  /// CapturedStep runs the recorded step again, a new step). False when the forward runs again within the step:
  /// a checkpoint's replay in the backward sweep or a memory budget's regeneration of an evicted value. An op
  /// with an effect outside its buffers (batch_norm's running statistics) has it only when recording(), so the
  /// effect happens once per step whatever the checkpoint policy or budget; its outputs must not depend on it.
  bool recording() const { return recording_; }

  /// Input k's value ([rows, cols] of in_shape(k)).
  [[gnu::always_inline]] ConstAlignedMap<T> in(int k) const {
    const detail::Node<T>& n = graph_[node_.inputs[k]];
    return ConstAlignedMap<T>(n.value, n.shape.rows(), n.shape.cols());
  }
  /// Input k's full shape (in(k) is its matrix view: every dimension but the last folded into rows).
  Shape in_shape(int k) const { return graph_[node_.inputs[k]].shape; }
  /// The output buffer (uninitialised: the forward writes every element).
  [[gnu::always_inline]] AlignedMap<T> out() const {
    return AlignedMap<T>(node_.value, node_.shape.rows(), node_.shape.cols());
  }
  /// The output's full shape (output_shape's answer).
  Shape out_shape() const { return node_.shape; }
  /// The extra buffer (the op's extra_shape; uninitialised), a residual the backward may read.
  [[gnu::always_inline]] AlignedMap<T> extra() const {
    return AlignedMap<T>(node_.extra, node_.extra_shape.rows(), node_.extra_shape.cols());
  }
  /// The op's temporary (its scratch_shape; uninitialised), valid only while this forward runs.
  [[gnu::always_inline]] AlignedMap<T> scratch() const {
    return AlignedMap<T>(node_.scratch, node_.scratch_shape.rows(), node_.scratch_shape.cols());
  }
  /// The Params struct the op was recorded with.
  template <class P>
  P params() const {
    return node_.attributes.template get_params<P>();
  }
  /// The integer data recorded with the op (OpCall::indices): index_count() entries.
  const int* indices() const { return graph_.indices.data() + node_.attributes.indices_begin; }
  /// The number of entries of indices().
  std::int64_t index_count() const { return node_.attributes.indices_count; }
  /// The op's random stream (an op of kind OpKind::random only): the same draws at record and at every replay.
  RandomStream random() const { return detail::random_stream_of(node_); }

 private:
  const detail::Graph<T>& graph_;
  const detail::Node<T>& node_;
  bool recording_;
};

/// An input's gradient buffer to write in full: assign when !accumulate (its first contribution), add
/// otherwise.
template <class T>
struct GradTarget {
  AlignedMap<T> map;  ///< the gradient's buffer, [rows, cols] of the input's matrix view
  bool accumulate;    ///< false for the first contribution (assign every element), true after (add)
};

/// What an op's backward sees: its residuals, the output gradient, and the gradients of its inputs.
/// The sweep has allocated a buffer for every input gradient the op is asked for (wants_grad); the op's
/// backward must write or add every element of each of them (add_grad or grad_target) and may read only
/// the residuals its reads() declared for those gradients.
template <class T>
class BackwardContext {
 public:
  /// Made by the sweep for one run of the op's backward (an op never makes one).
  BackwardContext(detail::Graph<T>& graph, const detail::Node<T>& node, const std::uint8_t* wanted)
      : graph_(graph), node_(node), wanted_(wanted) {}

  /// Input k's value: readable only if reads() declared it (reads_input(k)).
  [[gnu::always_inline]] ConstAlignedMap<T> in(int k) const {
    const detail::Node<T>& n = graph_[node_.inputs[k]];
    return ConstAlignedMap<T>(n.value, n.shape.rows(), n.shape.cols());
  }
  /// Input k's full shape (in(k) is its matrix view: every dimension but the last folded into rows).
  Shape in_shape(int k) const { return graph_[node_.inputs[k]].shape; }
  /// The op's output value: readable only if reads() declared it (reads_output).
  [[gnu::always_inline]] ConstAlignedMap<T> out() const {
    return ConstAlignedMap<T>(node_.value, node_.shape.rows(), node_.shape.cols());
  }
  /// The output's full shape (output_shape's answer).
  Shape out_shape() const { return node_.shape; }
  /// The extra buffer the forward wrote: readable only if reads() declared it (reads_extra).
  [[gnu::always_inline]] ConstAlignedMap<T> extra() const {
    return ConstAlignedMap<T>(node_.extra, node_.extra_shape.rows(), node_.extra_shape.cols());
  }
  /// The op's temporary (its scratch_shape; uninitialised), valid only while this backward runs.
  [[gnu::always_inline]] AlignedMap<T> scratch() const {
    return AlignedMap<T>(node_.scratch, node_.scratch_shape.rows(), node_.scratch_shape.cols());
  }
  /// dL/d(output), of the output's shape.
  [[gnu::always_inline]] ConstAlignedMap<T> grad_out() const {
    return ConstAlignedMap<T>(node_.grad, node_.shape.rows(), node_.shape.cols());
  }
  /// The Params struct the op was recorded with.
  template <class P>
  P params() const {
    return node_.attributes.template get_params<P>();
  }
  /// The integer data recorded with the op (OpCall::indices): index_count() entries.
  const int* indices() const { return graph_.indices.data() + node_.attributes.indices_begin; }
  /// The number of entries of indices().
  std::int64_t index_count() const { return node_.attributes.indices_count; }
  /// The op's random stream, the one its forward drew from (an op of kind OpKind::random only).
  RandomStream random() const { return detail::random_stream_of(node_); }

  /// Whether input k's gradient is asked for (skip computing it otherwise).
  [[gnu::always_inline]] bool wants_grad(int k) const {
    return wanted_[static_cast<std::size_t>(node_.inputs[k])] != 0;
  }

  /// Adds `e` (an Eigen matrix or array expression of input k's shape) to input k's gradient. The first
  /// contribution is assigned, so no zero fill is needed; products accumulate in the GEMM.
  template <class E>
  void add_grad(int k, const E& e) const {
    if (!wants_grad(k)) return;
    GradTarget<T> t = grad_target(k);
    if constexpr (std::is_base_of_v<Eigen::ArrayBase<E>, E>) {
      assign_or_add(t.map.array(), e, t.accumulate);
    } else if constexpr (detail::is_product<E>) {
      if (detail::direct_gemm(t.map, e, t.accumulate)) return;  // below the grain: one ?gemm call
      if (t.accumulate)
        t.map.noalias() += e;
      else if (detail::zero_for_product(t.map))  // Eigen would zero the target on this thread: the team does
        t.map.noalias() += e;
      else
        t.map.noalias() = e;
    } else if (t.accumulate) {
      t.map.noalias() += e;
    } else {
      t.map.noalias() = e;
    }
  }

  /// Input k's gradient buffer, for an op that writes it piecewise (row by row): it must write every
  /// element, assigning when !accumulate. Marks the gradient written.
  [[gnu::always_inline]] GradTarget<T> grad_target(int k) const {
    detail::Node<T>& in = graph_[node_.inputs[k]];
    const bool accumulate = in.grad_assigned;
    in.grad_assigned = true;
    return GradTarget<T>{AlignedMap<T>(in.grad, in.shape.rows(), in.shape.cols()), accumulate};
  }

  /// Input k's gradient after add_grad or grad_target wrote it, for a correction in place.
  [[gnu::always_inline]] AlignedMap<T> grad(int k) const {
    detail::Node<T>& in = graph_[node_.inputs[k]];
    return AlignedMap<T>(in.grad, in.shape.rows(), in.shape.cols());
  }

 private:
  detail::Graph<T>& graph_;
  const detail::Node<T>& node_;
  const std::uint8_t* wanted_;  // per node: its gradient is asked for
};

/// The Params an op was recorded with: `params_of<Op::Params>(c)` in its forward or backward.
template <class P, class Context>
P params_of(const Context& c) {
  return c.template params<P>();
}

}  // namespace remat
