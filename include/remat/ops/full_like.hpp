// full_like, zeros_like, ones_like: a constant of another value's shape, recorded as an op that reads no tensor.
#pragma once

#include <array>

#include "remat/op.hpp"
#include "remat/ops/reshape.hpp"

namespace remat {
namespace detail {

struct FullLikeOp : OpBase {
  static constexpr const char* name = "full_like";
  static constexpr OpKind kind = OpKind::constant;
  struct Params {
    Index rows = 0, cols = 0;
    double value = 0;
  };
  static unsigned reads(GradInputs) { return reads_nothing; }
  static Shape output_shape(const Shape*, const Params& p) { return Shape{p.rows, p.cols}; }
  template <class T>
  static void forward(const ForwardContext<T>& c) {
    c.out().setConstant(static_cast<T>(c.template params<Params>().value));
  }
  template <class T>
  static void backward(const BackwardContext<T>&) {}  // no input: never asked for a gradient
  static double flops(const Shape*, int, const Shape& out) { return static_cast<double>(out.numel()); }
};

}  // namespace detail

/// A value of x's shape (any rank) with every element `value`, like torch.full_like; x's values are not read.
/// It is recorded as an op without inputs, not as a leaf: inside a checkpointed function a policy that
/// drops it drops it, and the replay writes it again from `value` — a constant made inside a checkpointed
/// function is never a residual (JAX's test_constants_not_hoisted: checkpoint(x ↦ zeros_like(x)·x) under
/// nothing_saveable saves nothing). It requires no gradient. For x of rank other than 2 it is the [1, numel]
/// constant viewed as x's shape (reshape: the same buffer, counted once; an op's Params hold two dimensions
/// beside the double `value`). Throws tape_error for an empty or stale Var.
template <class T>
Var<T> full_like(const Var<T>& x, double value) {
  const Shape s = x.shape("full_like");
  if (s.rank() == 2)
    return apply_op_without_inputs<detail::FullLikeOp>(detail::FullLikeOp::Params{s.rows(), s.cols(), value}, x);
  const Var<T> flat = apply_op_without_inputs<detail::FullLikeOp>(detail::FullLikeOp::Params{1, s.numel(), value}, x);
  std::array<Index, Shape::max_rank> dims{};
  for (int d = 0; d < s.rank(); ++d) dims[static_cast<std::size_t>(d)] = s[d];
  return reshape(flat, ArrayRef<Index>(dims.data(), static_cast<std::size_t>(s.rank())));
}

/// Zeros of x's shape (full_like(x, 0)).
template <class T>
Var<T> zeros_like(const Var<T>& x) {
  return full_like(x, 0.0);
}

/// Ones of x's shape (full_like(x, 1)).
template <class T>
Var<T> ones_like(const Var<T>& x) {
  return full_like(x, 1.0);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::FullLikeOp)
