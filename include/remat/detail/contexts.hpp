// What an op's forward and backward see of the tape: ForwardContext and BackwardContext, the only
// interface between an op header and the tape.
#pragma once

#include <cstdint>
#include <type_traits>

#include "remat/detail/node.hpp"

namespace remat::detail {

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

/// What an op's forward sees: its inputs, its output, its extra buffer and attributes.
template <class T>
struct ForwardContext {
  const Graph<T>& graph;
  const Node<T>& node;

  ConstAlignedMap<T> in(int k) const {
    const Node<T>& n = graph[node.inputs[k]];
    return ConstAlignedMap<T>(n.value, n.shape.rows, n.shape.cols);
  }
  Shape in_shape(int k) const { return graph[node.inputs[k]].shape; }
  AlignedMap<T> out() const { return AlignedMap<T>(node.value, node.shape.rows, node.shape.cols); }
  AlignedMap<T> extra() const { return AlignedMap<T>(node.extra, node.extra_shape.rows, node.extra_shape.cols); }
  const Attributes& attributes() const { return node.attributes; }
  /// cross_entropy: the labels recorded with the op, one per row of input 0.
  const int* labels() const { return graph.labels.data() + node.attributes.labels; }
};

/// An input's gradient buffer to write in full: assign when !accumulate (its first contribution), add
/// otherwise.
template <class T>
struct GradTarget {
  AlignedMap<T> map;
  bool accumulate;
};

/// What an op's backward sees: its residuals, the output gradient, and the gradients of its inputs.
/// The sweep has allocated a buffer for every input gradient the op is asked for (wants_grad); the op's
/// backward must write or add every element of each of them (add_grad or grad_target) and may read only
/// the residuals its reads() declared for those gradients.
template <class T>
struct BackwardContext {
  Graph<T>& graph;
  const Node<T>& node;
  const std::uint8_t* wanted;  // per node: its gradient is asked for

  ConstAlignedMap<T> in(int k) const {
    const Node<T>& n = graph[node.inputs[k]];
    return ConstAlignedMap<T>(n.value, n.shape.rows, n.shape.cols);
  }
  Shape in_shape(int k) const { return graph[node.inputs[k]].shape; }
  ConstAlignedMap<T> out() const { return ConstAlignedMap<T>(node.value, node.shape.rows, node.shape.cols); }
  ConstAlignedMap<T> extra() const {
    return ConstAlignedMap<T>(node.extra, node.extra_shape.rows, node.extra_shape.cols);
  }
  ConstAlignedMap<T> grad_out() const { return ConstAlignedMap<T>(node.grad, node.shape.rows, node.shape.cols); }
  const Attributes& attributes() const { return node.attributes; }
  const int* labels() const { return graph.labels.data() + node.attributes.labels; }

  /// Whether input k's gradient is asked for (skip computing it otherwise).
  bool wants_grad(int k) const { return wanted[static_cast<std::size_t>(node.inputs[k])] != 0; }

  /// Adds `e` (an Eigen matrix or array expression of input k's shape) to input k's gradient. The first
  /// contribution is assigned, so no zero fill is needed; products accumulate in the GEMM.
  template <class E>
  void add_grad(int k, const E& e) const {
    if (!wants_grad(k)) return;
    GradTarget<T> t = grad_target(k);
    if constexpr (std::is_base_of_v<Eigen::ArrayBase<E>, E>) {
      assign_or_add(t.map.array(), e, t.accumulate);
    } else if (t.accumulate) {
      t.map.noalias() += e;
    } else {
      t.map.noalias() = e;
    }
  }

  /// Input k's gradient buffer, for an op that writes it piecewise (row by row): it must write every
  /// element, assigning when !accumulate. Marks the gradient written.
  GradTarget<T> grad_target(int k) const {
    Node<T>& in = graph[node.inputs[k]];
    const bool accumulate = in.grad_assigned;
    in.grad_assigned = true;
    return GradTarget<T>{AlignedMap<T>(in.grad, in.shape.rows, in.shape.cols), accumulate};
  }

  /// Input k's gradient after add_grad or grad_target wrote it, for a correction in place.
  AlignedMap<T> grad(int k) const {
    Node<T>& in = graph[node.inputs[k]];
    return AlignedMap<T>(in.grad, in.shape.rows, in.shape.cols);
  }
};

}  // namespace remat::detail
